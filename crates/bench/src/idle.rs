//! What quiet connections cost a busy one: the half round trip of a
//! ping-pong between two endpoints, while the measuring one also holds
//! `N` connections that carry nothing (a server with many idle clients).
//!
//! ```text
//!  this process: node 1                     node 2
//!   measuring endpoint ══ ping-pong ══════► echo endpoint (a thread)
//!        ├── quiet connection ────────────► quiet endpoint 1
//!        ├── …                              …
//!        └── quiet connection ────────────► quiet endpoint N
//! ```
//!
//! Both sides poll or both wait. No peer tool has this shape; each row is
//! set beside the first row, measured in the same run. The rows are
//! measured in turn [`ROUNDS`] times, and each reports its middle round:
//! this machine's latency shifts from minute to minute.

use anyhow::Context;
use macrolink_fabric::{Addr, Completion, EndpointConfig, Mode, Node, NodeConfig, Transport};
use std::time::{Duration, Instant};

use crate::stats;

/// One run's shape.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Numbers of quiet connections, one row each.
    pub quiet: Vec<u32>,
    /// The ping-pong's transport; the quiet connections are tcp.
    pub transport: Transport,
    pub completion: Completion,
    /// Message bytes.
    pub size: usize,
    /// Round trips timed per row (a tenth more warm up first).
    pub count: usize,
}

/// One row.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub quiet: u32,
    pub median_us: f64,
    pub p99_us: f64,
}

/// Endpoint ids: the measuring and echo endpoints, then the quiet ones.
const PING: u32 = 10;
const ECHO: u32 = 11;
const QUIET: u32 = 100;

/// Times each row is measured, in turn with the others.
pub const ROUNDS: usize = 3;

/// Longest wait for any one message.
const PATIENCE: Duration = Duration::from_secs(10);

impl Plan {
    /// Runs every row [`ROUNDS`] times, in turn, each run on nodes of its
    /// own; `each` hears of every run done. Each row is its round of the
    /// middle median.
    pub fn run(&self, mut each: impl FnMut(&Row)) -> anyhow::Result<Vec<Row>> {
        let mut runs: Vec<Vec<Row>> = vec![Vec::new(); self.quiet.len()];
        for _ in 0..ROUNDS {
            for (i, &n) in self.quiet.iter().enumerate() {
                let row = self.row(n)?;
                each(&row);
                runs[i].push(row);
            }
        }
        Ok(runs
            .into_iter()
            .map(|mut r| {
                r.sort_by(|a, b| a.median_us.total_cmp(&b.median_us));
                r.swap_remove(r.len() / 2)
            })
            .collect())
    }

    fn row(&self, quiet: u32) -> anyhow::Result<Row> {
        let dir = tempfile::tempdir()?;
        let a = Node::start(NodeConfig::local(1, dir.path()))?;
        let b = Node::start(NodeConfig::local(2, dir.path()))?;
        a.add_peer(2, b.tcp_addr().context("node 2 has no tcp address")?);
        b.add_peer(1, a.tcp_addr().context("node 1 has no tcp address")?);
        let cfg = || EndpointConfig {
            completion: self.completion,
            ..EndpointConfig::default()
        };
        let mut ping = a.open(PING, cfg())?;
        let mut echo = b.open(ECHO, cfg())?;
        let mut buf = vec![0u8; self.size.max(64)];
        // Each quiet endpoint is heard once, then nothing.
        let mut quiets = Vec::with_capacity(quiet as usize);
        for i in 0..quiet {
            let mut q = b.open(QUIET + i, EndpointConfig::default())?;
            let t = ping.target_via(Addr::new(2, QUIET + i), Mode::Reliable, Transport::Tcp)?;
            ping.write(t, b"hello")?;
            q.read_timeout(&mut buf, PATIENCE)?
                .with_context(|| format!("quiet endpoint {i} heard nothing"))?;
            quiets.push(q);
        }
        let mode = match self.transport {
            Transport::Udp => Mode::Datagram,
            _ => Mode::Reliable,
        };
        let to_echo = ping.target_via(Addr::new(2, ECHO), mode, self.transport)?;
        let back = echo.target_via(Addr::new(1, PING), mode, self.transport)?;
        let rounds = self.count + self.count / 10;
        let echoing = std::thread::spawn(move || -> anyhow::Result<()> {
            let mut buf = vec![0u8; 1 << 16];
            for _ in 0..rounds {
                let r = echo
                    .read_timeout(&mut buf, PATIENCE)?
                    .context("the echo heard nothing")?;
                echo.write(back, &buf[..r.len])?;
            }
            Ok(())
        });
        let msg = vec![7u8; self.size];
        let mut half = Vec::with_capacity(self.count);
        let mut run = || -> anyhow::Result<()> {
            for i in 0..rounds {
                let t = Instant::now();
                ping.write(to_echo, &msg)?;
                ping.read_timeout(&mut buf, PATIENCE)?
                    .context("no answer from the echo")?;
                if i >= rounds - self.count {
                    half.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
            }
            Ok(())
        };
        let ran = run();
        // A failed run drops the measuring endpoint first: the echo's read
        // then ends (a lost peer or its patience) and the thread with it.
        drop(ping);
        let echoed = echoing
            .join()
            .map_err(|_| anyhow::anyhow!("the echo panicked"))?;
        ran?;
        echoed?;
        drop(quiets);
        let s = stats::Summary::of(&mut half);
        Ok(Row {
            quiet,
            median_us: s.median,
            p99_us: s.p99,
        })
    }
}

/// The rows as a table, each beside the first row (the fewest quiet
/// connections).
pub fn table(plan: &Plan, rows: &[Row]) -> String {
    let mut out = format!(
        "{} {} B ping-pong, half round trip, both sides {}; quiet connections over tcp\n",
        plan.transport, plan.size, plan.completion
    );
    out += "quiet conns  median us   p99 us  median / first row\n";
    let base = rows.first().map_or(f64::NAN, |r| r.median_us);
    for r in rows {
        out += &format!(
            "{:>11} {:>10.2} {:>8.2} {:>19.2}\n",
            r.quiet,
            r.median_us,
            r.p99_us,
            r.median_us / base
        );
    }
    out
}
