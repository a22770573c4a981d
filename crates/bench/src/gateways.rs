//! `macrolink bench gateways`: one compute host to storage through 1..N
//! gateways on shaped storage-side links, macrolink's striping beside the
//! kernel's own equal-cost multipath (iperf3 with one and with many flows);
//! and the stall when a gateway is killed mid-transfer.

use anyhow::bail;
use macrolink_testbed::data::pattern;
use macrolink_testbed::netns::{Testbed, ECMP_ADDR};
use macrolink_testbed::require;
use serde::Serialize;
use std::path::{Path, PathBuf};

use crate::peers::iperf3;

mod held;
mod lane;
mod striped;
mod table;

use held::{median_rate, timeouts_over, Beside};
pub use held::{Held, Run};
pub use lane::{files_through, LaneCopy};
pub use striped::{send_config, striped, Fault, Striped};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Largest number of gateways.
    pub max: usize,
    /// MiB per transfer (the failover case too).
    pub mib: usize,
    /// Rate of each storage-side link (tc syntax).
    pub rate: String,
    /// Seconds per iperf3 run.
    pub seconds: u32,
    /// Chunks in flight per gateway.
    pub window: usize,
    /// Runs of each kind (one striped transfer, eight, each cp column) per
    /// number of gateways: the tables give their median and their range.
    pub runs: usize,
    /// Milliseconds between heartbeats to each gateway.
    pub heartbeat_ms: u64,
    /// Unanswered heartbeats in a row that take a gateway out of use.
    pub misses: u32,
    /// Write the rows as JSON.
    pub json: Option<PathBuf>,
    /// Draw bandwidth against gateways as a PNG.
    pub plot: Option<PathBuf>,
    /// Where the cp columns' files live (the system's temporary directory
    /// when `None`): on the file system whose part is to be measured.
    pub dir: Option<PathBuf>,
}

/// One row: N gateways.
#[derive(Debug, Default, Serialize)]
pub struct Row {
    /// Gateways in the lane.
    pub gateways: usize,
    /// macrolink, one striped transfer, MB/s: the median of the runs.
    pub macrolink: f64,
    /// Each run of one striped transfer, in the order run.
    pub macrolink_runs: Vec<Run>,
    /// macrolink / (N x its one-gateway figure).
    pub ratio_to_n_links: f64,
    /// macrolink, eight striped transfers at once, MB/s: the median of
    /// the runs.
    pub macrolink_8_flows: f64,
    /// Each run of eight striped transfers, in the order run.
    pub macrolink_8_flows_runs: Vec<Run>,
    /// Eight flows / (N x the one-gateway figure).
    pub ratio_8_flows: f64,
    /// What held the striped transfers back: one transfer, then eight.
    pub held: [Held; 2],
    /// Kernel ECMP, iperf3 one flow, MB/s.
    pub kernel_1_flow: Option<f64>,
    /// Kernel ECMP, iperf3 eight flows, MB/s.
    pub kernel_8_flows: Option<f64>,
    /// `macrolink cp` of the same bytes up through the lane, MB/s.
    pub cp_up: f64,
    /// `macrolink cp` back down through the lane, MB/s.
    pub cp_down: f64,
    /// cp up / (N x the one-gateway striped figure).
    pub ratio_cp_up: f64,
    /// `macrolink cp --direct` up: past the server's page cache, MB/s.
    pub cp_up_direct: f64,
    /// cp up with direct I/O / (N x the one-gateway striped figure).
    pub ratio_cp_up_direct: f64,
    /// cp down / (N x the one-gateway striped figure).
    pub ratio_cp_down: f64,
    /// `macrolink cp --cache` down: every page kept cached, MB/s.
    pub cp_down_cached: f64,
    /// cp down keeping every page / (N x the one-gateway striped figure).
    pub ratio_cp_down_cached: f64,
    /// `macrolink cp --direct` down: past the page cache, MB/s.
    pub cp_down_direct: f64,
    /// cp down with direct I/O / (N x the one-gateway striped figure).
    pub ratio_cp_down_direct: f64,
    /// `macrolink cp` down into `/dev/null`: no file system, MB/s.
    pub cp_down_null: f64,
    /// cp down to `/dev/null` / (N x the one-gateway striped figure).
    pub ratio_cp_down_null: f64,
    /// The same bytes written to a file beside cp's, from memory in 1 MiB
    /// writes, after the copies: what the file system takes alone through
    /// the page cache, MB/s.
    pub fs_write: f64,
    /// The same, written as cp writes by default (uncached past the
    /// file's head), MB/s.
    pub fs_write_uncached: f64,
    /// What held each cp column back, as cp printed it (up, up --direct,
    /// down, down --cache, down --direct, down to /dev/null).
    pub cp_held: [String; 6],
    /// Retransmission timeouts of the testbed's kernels during each cp
    /// column's copy.
    pub cp_tcp_timeouts: [u64; 6],
    /// The machine during each cp column's copy.
    pub cp_machine: [crate::stalls::Stalled; 6],
    /// Each cp column's runs, MB/s, in the order run; the figures above
    /// are of the median run of each.
    pub cp_runs: [Vec<f64>; 6],
}

/// iperf3 from compute to storage over the kernel's multipath routes, MB/s.
fn kernel(tb: &Testbed, flows: u32, secs: u32) -> anyhow::Result<f64> {
    iperf3::Run {
        server_ns: Some(&tb.storage()),
        client_ns: Some(&tb.compute()),
        addr: ECMP_ADDR,
        port: 5201,
        flows,
        secs,
        congestion: None,
        len: None,
        omit: 0,
    }
    .mb_per_s()
}

/// Runs the benchmark with gateway processes started from `exe`, and
/// prints its tables.
pub fn run(exe: &Path, a: &Options) -> anyhow::Result<()> {
    if !require::is_root() {
        bail!("the gateway testbed needs root (network namespaces)");
    }
    let iperf = iperf3::TOOL.installed();
    if !iperf {
        eprintln!(
            "iperf3 missing (apt-get install {}): the kernel ECMP columns show n.a.",
            iperf3::TOOL.package
        );
    }
    let exe = exe.to_path_buf();
    let payload = pattern(a.mib << 20, 0);
    let cfg = send_config(a.window, a.heartbeat_ms, a.misses);
    let mut rows: Vec<Row> = Vec::new();
    let mut one = 0.0;
    for n in 1..=a.max {
        eprintln!("{n} gateway(s) ...");
        let tb = Testbed::new(n, &a.rate).map_err(anyhow::Error::msg)?;
        // One transfer and eight, alternated, so that both kinds share
        // whatever else the machine does meanwhile: one run of either
        // moves with it, the median of a few much less.
        let (mut one_flow, mut eight) = (Vec::new(), Vec::new());
        for _ in 0..a.runs.max(1) {
            for (flows, runs) in [(1, &mut one_flow), (8, &mut eight)] {
                let (r, tcp_timeouts) =
                    timeouts_over(&tb, || striped(&exe, &tb, n, &payload, &cfg, None, flows))?;
                let beside = Beside {
                    tcp_timeouts,
                    machine: r.machine,
                };
                runs.push(Run::of(&r.report, beside));
            }
        }
        let (mbs, many) = (median_rate(&one_flow), median_rate(&eight));
        if n == 1 {
            one = mbs;
        }
        let (k1, k8) = if iperf {
            tb.kernel_ecmp().map_err(anyhow::Error::msg)?;
            (
                kernel(&tb, 1, a.seconds).ok(),
                kernel(&tb, 8, a.seconds).ok(),
            )
        } else {
            (None, None)
        };
        let cp = files_through(&exe, &tb, n, a.mib, a.runs, a.dir.as_deref())?;
        rows.push(Row {
            gateways: n,
            macrolink: mbs,
            ratio_to_n_links: mbs / (n as f64 * one),
            macrolink_8_flows: many,
            ratio_8_flows: many / (n as f64 * one),
            held: [Held::over(&one_flow), Held::over(&eight)],
            macrolink_runs: one_flow,
            macrolink_8_flows_runs: eight,
            kernel_1_flow: k1,
            kernel_8_flows: k8,
            cp_up: cp.up,
            cp_down: cp.down,
            ratio_cp_up: cp.up / (n as f64 * one),
            cp_up_direct: cp.up_direct,
            ratio_cp_up_direct: cp.up_direct / (n as f64 * one),
            ratio_cp_down: cp.down / (n as f64 * one),
            cp_down_cached: cp.down_cached,
            ratio_cp_down_cached: cp.down_cached / (n as f64 * one),
            cp_down_direct: cp.down_direct,
            ratio_cp_down_direct: cp.down_direct / (n as f64 * one),
            cp_down_null: cp.down_null,
            ratio_cp_down_null: cp.down_null / (n as f64 * one),
            fs_write: cp.fs_write,
            fs_write_uncached: cp.fs_write_uncached,
            cp_held: cp.held.clone(),
            cp_tcp_timeouts: cp.tcp_timeouts,
            cp_machine: cp.machine,
            cp_runs: cp.runs,
        });
    }
    table::print(&rows, one, a);
    eprintln!("bonding ...");
    println!(
        "bonding: one gateway with 1 and with 2 storage-side links of {} each",
        a.rate
    );
    let mut single = 0.0;
    for links in 1..=2 {
        let tb = Testbed::with_links(1, links, &a.rate).map_err(anyhow::Error::msg)?;
        let r = striped(&exe, &tb, 1, &payload, &cfg, None, 1)?.report;
        let mbs = r.bytes as f64 / r.secs / 1e6;
        if links == 1 {
            single = mbs;
        }
        println!(
            "  {links} link(s): {mbs:>7.1} MB/s  ({:.0}% of one link)",
            100.0 * mbs / single
        );
    }
    eprintln!("failover ...");
    let faults = [
        ("killed (SIGKILL)", Fault::KillGateway(0.5)),
        ("frozen (SIGSTOP)", Fault::FreezeGateway(0.5)),
    ];
    for (what, fault) in faults {
        let tb = Testbed::new(2, &a.rate).map_err(anyhow::Error::msg)?;
        let run = striped(&exe, &tb, 2, &payload, &cfg, Some(fault), 1)?;
        let r = &run.report;
        let found = run
            .found_after(0)
            .map_or("never".to_string(), |s| format!("after {:.0} ms", s * 1e3));
        println!(
            "failover: 2 gateways, one {what} halfway: {:.1} MB/s overall, \
             taken out of use {found}, longest stall {:.1} ms, {} chunks sent again, hash verified",
            r.bytes as f64 / r.secs / 1e6,
            r.longest_stall * 1e3,
            r.resent
        );
    }
    if let Some(p) = &a.json {
        crate::report::write_json(p, &rows)?;
    }
    if let Some(p) = &a.plot {
        table::plot(p, &rows, one, &a.rate)?;
    }
    Ok(())
}
