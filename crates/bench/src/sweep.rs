//! The papers' tables as sweeps over the cross product of what is asked:
//! transports × modes × completions × sizes for bandwidth, tests ×
//! transports × sizes for latency; one row each, with a progress bar.

use anyhow::bail;
use macrolink_fabric::{Completion, Mode, Pages, Transport};

use crate::client::{BwSpec, Client};
use crate::progress::bar;
use crate::proto::Test;
use crate::report::{BreakdownRow, BwRow, LatRow, OneWayRow};

/// A bandwidth sweep.
#[derive(Clone, Debug)]
pub struct Bandwidth {
    /// Transports.
    pub transports: Vec<Transport>,
    /// Modes.
    pub modes: Vec<Mode>,
    /// Completion of both sides.
    pub completions: Vec<Completion>,
    /// Message sizes (empty: the papers' sizes).
    pub sizes: Vec<usize>,
    /// Puts in flight.
    pub window: usize,
    /// Seconds per size (the count is picked from a warm-up run).
    pub seconds: f64,
    /// Messages per size instead of a duration.
    pub count: Option<u64>,
    /// Messages per size at the least, where the count is picked from a
    /// duration: a peer slow to reach its pace is given that many, and a
    /// run of ours beside it moves as many.
    pub least: u64,
    /// Messages a second at most (`None`: as fast as they go).
    pub pace: Option<f64>,
    /// Seconds of untimed traffic before each size's run, about (a
    /// long link's congestion window opened, as iperf3's `--omit` leaves
    /// out its first seconds); `None`: only what picking the count takes.
    pub warm: Option<f64>,
    /// The counted runs bring back when their messages arrived.
    pub arrivals: bool,
    /// The pages both sides' buffers lie on.
    pub pages: Pages,
}

/// Puts in flight in a run of [`Bandwidth::one`] (and `bench bw`'s
/// default).
pub const PUT_WINDOW: usize = 16;

impl Bandwidth {
    /// One transport, mode, completion and size, run for `seconds`.
    pub fn one(t: Transport, m: Mode, c: Completion, size: usize, seconds: f64) -> Bandwidth {
        Bandwidth {
            transports: vec![t],
            modes: vec![m],
            completions: vec![c],
            sizes: vec![size],
            window: PUT_WINDOW,
            seconds,
            count: None,
            least: 0,
            pace: None,
            warm: None,
            arrivals: false,
            pages: Pages::Base,
        }
    }

    /// Runs it; a row per point.
    pub fn run(&self, client: &mut Client) -> anyhow::Result<Vec<BwRow>> {
        let sizes = if self.sizes.is_empty() {
            crate::PAPER_SIZES.to_vec()
        } else {
            self.sizes.clone()
        };
        let mut plan = Vec::new();
        for &t in &self.transports {
            for &m in &self.modes {
                if t == Transport::Udp && m != Mode::Datagram {
                    bail!("udp carries datagram mode only");
                }
                for &c in &self.completions {
                    for &size in &sizes {
                        plan.push((t, m, c, size));
                    }
                }
            }
        }
        let pb = bar(plan.len() as u64);
        let mut rows = Vec::new();
        for (transport, mode, completion, size) in plan {
            pb.set_message(format!("{transport} {mode} {size} B"));
            let mut spec = BwSpec {
                transport,
                mode,
                completion,
                size,
                count: 0,
                window: self.window,
                pace: self.pace,
                arrivals: false,
                pages: self.pages,
            };
            if let Some(w) = self.warm {
                client.warm(spec, w)?;
            }
            spec.count = messages(self.count, self.least, || {
                Ok(client.calibrate(spec, self.seconds)?)
            })?;
            rows.push(client.bandwidth(BwSpec {
                arrivals: self.arrivals,
                ..spec
            })?);
            pb.inc(1);
        }
        pb.finish_and_clear();
        Ok(rows)
    }
}

/// The messages of a size's counted run: `count` where one is asked
/// for, else those `calibrate` picks for the duration, and `least` at the
/// least.
fn messages(
    count: Option<u64>,
    least: u64,
    calibrate: impl FnOnce() -> anyhow::Result<u64>,
) -> anyhow::Result<u64> {
    match count {
        Some(c) => Ok(c),
        None => Ok(calibrate()?.max(least)),
    }
}

/// A latency sweep (IMB's patterns).
#[derive(Clone, Debug)]
pub struct Latency {
    /// PingPong, PingPing, SendRecv, Exchange.
    pub tests: Vec<Test>,
    /// Transports.
    pub transports: Vec<Transport>,
    /// Datagram or reliable.
    pub mode: Mode,
    /// Completion of both sides.
    pub completion: Completion,
    /// Message sizes.
    pub sizes: Vec<usize>,
    /// Iterations per size.
    pub count: u64,
}

impl Latency {
    /// Runs it; a row per point.
    pub fn run(&self, client: &mut Client) -> anyhow::Result<Vec<LatRow>> {
        let pb = bar((self.tests.len() * self.transports.len() * self.sizes.len()) as u64);
        let mut rows = Vec::new();
        for &test in &self.tests {
            for &t in &self.transports {
                for &size in &self.sizes {
                    pb.set_message(format!("{test:?} {t} {size} B"));
                    rows.push(client.latency(
                        test,
                        t,
                        self.mode,
                        self.completion,
                        size,
                        self.count,
                    )?);
                    pb.inc(1);
                }
            }
        }
        pb.finish_and_clear();
        Ok(rows)
    }
}

/// A row of `run` for each transport and size.
fn each<R>(
    transports: &[Transport],
    sizes: &[usize],
    mut run: impl FnMut(Transport, usize) -> macrolink_fabric::Result<R>,
) -> anyhow::Result<Vec<R>> {
    let mut rows = Vec::new();
    for &t in transports {
        for &size in sizes {
            rows.push(run(t, size)?);
        }
    }
    Ok(rows)
}

/// One-way latency of each transport and size.
pub fn oneway(
    client: &mut Client,
    transports: &[Transport],
    sizes: &[usize],
    count: u64,
) -> anyhow::Result<Vec<OneWayRow>> {
    each(transports, sizes, |t, size| client.oneway(t, size, count))
}

/// DP-II's latency breakdown of each transport and size.
pub fn breakdown(
    client: &mut Client,
    transports: &[Transport],
    sizes: &[usize],
    count: u64,
) -> anyhow::Result<Vec<BreakdownRow>> {
    each(transports, sizes, |t, size| {
        client.breakdown(t, size, count)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_run_moves_its_least_and_a_counted_one_its_count() {
        // A second moved 1,200 messages: fewer than the least.
        assert_eq!(messages(None, 10_000, || Ok(1_200)).unwrap(), 10_000);
        assert_eq!(messages(None, 100, || Ok(1_200)).unwrap(), 1_200);
        // A count asked for is kept, and nothing is calibrated.
        let n = messages(Some(5), 10_000, || panic!("calibrated")).unwrap();
        assert_eq!(n, 5);
        assert!(messages(None, 1, || anyhow::bail!("no run")).is_err());
    }
}
