//! What held the striped runs back, and the figures of a cell: the median
//! run and the range of runs.

use macrolink_gwnet::client::SendReport;
use macrolink_testbed::netns::Testbed;
use serde::Serialize;

use crate::stalls::{Probe, Stalled};

/// What held the striped runs of one kind back: chunks sent again (their
/// path lost or their timeout passed), gateways taken out of use, and the
/// longest time without a new chunk acknowledged. The first two are summed
/// over the runs and, of eight transfers, over the transfers (one gateway
/// lost counts once for each transfer that took it out of use); the stall
/// is the longest of any. Beside them, the retransmission timeouts the
/// testbed's kernels had meanwhile, summed: a stall with none is not the
/// kernel's loss recovery; and what a probe saw of the machine during the
/// transfers: a processor held from the machine holds up whatever was to
/// run on it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Held {
    /// Chunks sent again.
    pub resent: u64,
    /// Gateways taken out of use.
    pub failovers: u64,
    /// The longest stall, ms.
    pub longest_stall_ms: f64,
    /// Retransmission timeouts of the testbed's kernels during the runs.
    pub tcp_timeouts: u64,
    /// The machine during the runs: the most a probe's sleep overran, the
    /// processor time the host took.
    pub machine: Stalled,
}

/// What went on beside a run.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Beside {
    /// Retransmission timeouts of the testbed's kernels.
    pub tcp_timeouts: u64,
    /// What a probe saw of the machine.
    pub machine: Stalled,
}

impl Held {
    /// What held one run back.
    pub(super) fn of(r: &SendReport, beside: Beside) -> Held {
        Held {
            resent: r.resent,
            failovers: r.failovers,
            longest_stall_ms: r.longest_stall * 1e3,
            tcp_timeouts: beside.tcp_timeouts,
            machine: beside.machine,
        }
    }

    /// What held `runs` back together: counts summed, the longest stall,
    /// the machine over all.
    pub(super) fn over(runs: &[Run]) -> Held {
        let held = runs.iter().fold(Held::default(), |a, r| Held {
            resent: a.resent + r.held.resent,
            failovers: a.failovers + r.held.failovers,
            longest_stall_ms: a.longest_stall_ms.max(r.held.longest_stall_ms),
            tcp_timeouts: a.tcp_timeouts + r.held.tcp_timeouts,
            machine: Stalled::default(),
        });
        Held {
            machine: Stalled::over(runs.iter().map(|r| r.held.machine)),
            ..held
        }
    }
}

/// One striped run: its rate and what held it back.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    /// MB/s.
    pub mb_per_s: f64,
    /// What held it back.
    pub held: Held,
}

impl Run {
    pub(super) fn of(r: &SendReport, beside: Beside) -> Run {
        Run {
            mb_per_s: r.bytes as f64 / r.secs / 1e6,
            held: Held::of(r, beside),
        }
    }
}

/// The lowest of `runs`' MB/s; `None` for none.
pub(super) fn lowest_rate(runs: &[Run]) -> Option<f64> {
    runs.iter().map(|r| r.mb_per_s).reduce(f64::min)
}

/// The median of `runs`' MB/s (of an even number of runs, the mean of
/// the middle two); 0 for none.
pub(super) fn median_rate(runs: &[Run]) -> f64 {
    crate::stats::median(runs.iter().map(|r| r.mb_per_s).collect()).unwrap_or(0.0)
}

/// Runs `f`; what it returned, and the retransmission timeouts the
/// testbed's kernels had meanwhile.
pub(super) fn timeouts_over<T>(
    tb: &Testbed,
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, u64)> {
    let before = tb.tcp_timeouts()?;
    let t = f()?;
    Ok((t, tb.tcp_timeouts()?.saturating_sub(before)))
}

/// Runs `f`; what it returned, and what went on beside it: the
/// retransmission timeouts the testbed's kernels had and what a probe saw
/// of the machine.
pub(super) fn watched<T>(
    tb: &Testbed,
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, Beside)> {
    let probe = Probe::start()?;
    let (t, tcp_timeouts) = timeouts_over(tb, f)?;
    Ok((
        t,
        Beside {
            tcp_timeouts,
            machine: probe.finish(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_its_median_run_and_holds_what_held_any_run() {
        let run = |bytes: u64, secs: f64, resent: u64, stall: f64, tcp_timeouts: u64| {
            let r = SendReport {
                bytes,
                secs,
                resent,
                failovers: resent / 2,
                longest_stall: stall,
                ..SendReport::default()
            };
            let machine = Stalled {
                late_ms: stall * 1e3 - 10.0,
                held_ms: stall * 1e3,
                steal_ms: Some(tcp_timeouts as f64),
            };
            Run::of(
                &r,
                Beside {
                    tcp_timeouts,
                    machine,
                },
            )
        };
        // A run that dips, with a stall and chunks sent again, among two
        // that do not.
        let runs = [
            run(300_000_000, 1.0, 0, 0.020, 0),
            run(300_000_000, 1.5, 4, 0.400, 3),
            run(310_000_000, 1.0, 0, 0.010, 1),
        ];
        assert_eq!(runs.each_ref().map(|r| r.mb_per_s), [300.0, 200.0, 310.0]);
        assert_eq!(median_rate(&runs), 300.0);
        assert_eq!(lowest_rate(&runs), Some(200.0));
        // The dip keeps what held it back in its own run...
        assert_eq!(runs[1].held.resent, 4);
        assert_eq!(runs[1].held.longest_stall_ms, 400.0);
        // ... and the cell says it too.
        let h = Held::over(&runs);
        assert_eq!((h.resent, h.failovers, h.tcp_timeouts), (4, 2, 4));
        assert_eq!(h.longest_stall_ms, 400.0);
        // The machine: the latest wake-up of any run, the steal of all.
        assert_eq!(h.machine.late_ms, 390.0);
        assert_eq!(h.machine.held_ms, 400.0);
        assert_eq!(h.machine.steal_ms, Some(4.0));
        // Of two, the mean of both; of none, nothing.
        assert_eq!(median_rate(&runs[..2]), 250.0);
        assert_eq!((median_rate(&[]), lowest_rate(&[])), (0.0, None));
    }
}
