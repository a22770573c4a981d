//! ucx_perftest: UCX's own latency and bandwidth test, over the UCX
//! transports that `UCX_TLS` names.

use anyhow::Context;
use macrolink_fabric::Pages;
use std::process::Command;
use std::time::Duration;

use super::written::Written;
use super::{free_port, output, Latency, Server, Tool};

/// The tool.
pub const TOOL: Tool = Tool {
    program: "ucx_perftest",
    package: "ucx-utils",
};

/// How many sends `ucx_perftest` keeps outstanding in its bandwidth tests
/// (`tag_bw`, `ucp_put_bw`) unless told otherwise (`-O`): the window of
/// its table of tests. Its receiver keeps as many receives posted.
pub const DEFAULT_WINDOW: u32 = 32;

/// The iterations whose times `ucx_perftest` keeps (`TIMING_QUEUE_SIZE`):
/// its percentiles are of the last this many, not of the whole run.
pub const WINDOW: u64 = 2048;

/// What one run measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures {
    /// Latency at the percentile `rank` (the median unless asked
    /// otherwise), microseconds: of the last [`WINDOW`] iterations.
    pub latency_us: f64,
    /// The percentile that `latency_us` is, as its column's name says
    /// (`None` where the output had no names).
    pub rank: Option<f64>,
    /// Bandwidth over the whole run, 10^6 bytes per second.
    pub mb_per_s: f64,
    /// The whole run's time as the client timed it, seconds.
    pub secs: f64,
    /// The server's CPU time over its life (start-up and ending too): the
    /// receiving side's of a `tag_bw` run. Read for sleeping runs only;
    /// `None` where it was not or could not be.
    pub server_cpu: Option<Duration>,
    /// The client's CPU time over its life: the sending side's of a
    /// `tag_bw` run. Read for sleeping runs only.
    pub client_cpu: Option<Duration>,
}

impl Figures {
    /// The server's CPU use during the run, %: its CPU time beyond that of
    /// `short`, a run of a few iterations made the same way (UCX's
    /// start-up, its connection and its ending, which take some tenths of
    /// a second of CPU time), over this run's time.
    pub fn server_cpu_pct(&self, short: &Figures) -> Option<f64> {
        self.pct_beyond(self.server_cpu?, short.server_cpu?, short)
    }

    /// The same for the client.
    pub fn client_cpu_pct(&self, short: &Figures) -> Option<f64> {
        self.pct_beyond(self.client_cpu?, short.client_cpu?, short)
    }

    fn pct_beyond(&self, cpu: Duration, short_cpu: Duration, short: &Figures) -> Option<f64> {
        let extra = cpu.as_secs_f64() - short_cpu.as_secs_f64();
        (self.secs > short.secs).then(|| 100.0 * extra.max(0.0) / (self.secs - short.secs))
    }
}

/// Runs test `test` (`tag_lat`, `ucp_put_bw`, ...) of `size`-byte messages
/// for `iters` iterations over the UCX transports `tls`, server and client
/// on loopback, both busy polling, with at most `outstanding` sends not yet
/// complete (`-O`; [`DEFAULT_WINDOW`] is its own).
pub fn run(
    tls: &str,
    test: &str,
    size: usize,
    iters: u64,
    outstanding: u32,
) -> anyhow::Result<Figures> {
    let how = How {
        outstanding: Some(outstanding),
        ..How::default()
    };
    run_with(tls, test, size, iters, how)
}

/// `tag_lat` of `size`-byte messages for `iters` iterations over `tls`,
/// both sides busy polling: the median of one run and the 99th percentile
/// of another (it reports one percentile a run, `-R`), each of its last
/// [`WINDOW`] iterations.
pub fn latency(tls: &str, size: usize, iters: u64) -> anyhow::Result<Latency> {
    let at = |rank: f64| -> anyhow::Result<f64> {
        let how = How {
            rank,
            ..How::default()
        };
        let f = run_with(tls, "tag_lat", size, iters, how)?;
        match f.rank {
            Some(r) if r == rank => Ok(f.latency_us),
            r => anyhow::bail!("ucx_perftest -R {rank} reported the percentile {r:?}"),
        }
    };
    Ok(Latency {
        median: at(MEDIAN)?,
        p99: at(99.0)?,
    })
}

/// `ucx_perftest`'s default percentile.
const MEDIAN: f64 = 50.0;

/// As [`run`], both sides sleeping after posting their requests (`-E
/// sleep`): UCX's event-driven mode, beside a waiting endpoint of ours,
/// its buffers on the same pages as ours ([`alloc_prio`]) and, unless
/// `buffers` says otherwise, holding data as ours do, at most
/// `outstanding` sends (and so receives) in flight.
/// The client's CPU time is that of the children of this process that end
/// during its run: no other may end meanwhile.
pub fn run_sleeping(
    tls: &str,
    test: &str,
    size: usize,
    iters: u64,
    pages: Pages,
    outstanding: u32,
    buffers: Buffers,
) -> anyhow::Result<Figures> {
    let how = How {
        outstanding: Some(outstanding),
        sleeping: Some(pages),
        buffers,
        ..How::default()
    };
    run_with(tls, test, size, iters, how)
}

/// How `ucx_perftest` is told to allocate its buffers (`UCX_ALLOC_PRIO`)
/// to lie on `pages`, as a buffer of ours ([`macrolink_fabric::IoBuf`]);
/// by default it puts them in SysV shared memory. Base pages: anonymous
/// memory from `mmap`, page-aligned, as ours. (Where its buffers are
/// written before the run, [`Buffers::Written`], the two copy alike: 1 MB
/// `tag_bw -O 1 -E sleep` over posix,cma, four alternations on a 2-core
/// Xeon VM, 7.8-10.8 GB/s from SysV and 8.3-10.2 from `mmap`. Never
/// written, `mmap`'s pages are the zero page and gave 12.7-14.5, SysV's
/// are not and gave 7.5-10.1.) Huge: transparent huge pages, which UCX takes only where rounding
/// a buffer up to whole huge pages less than doubles it (more than 1 MiB
/// of 2 MiB pages), falling back to `mmap`.
pub fn alloc_prio(pages: Pages) -> &'static str {
    match pages {
        Pages::Base => "mmap,heap",
        Pages::Huge => "thp,mmap,heap",
    }
}

/// How a run is made beyond its test, size and length.
#[derive(Clone, Copy, Debug)]
struct How {
    /// At most this many sends outstanding (`-O`); the tool's default
    /// where `None`.
    outstanding: Option<u32>,
    /// Both sides sleeping (`-E sleep`), their buffers on these pages;
    /// busy polling where `None`.
    sleeping: Option<Pages>,
    /// The percentile its latency column gives (`-R`).
    rank: f64,
    buffers: Buffers,
}

impl Default for How {
    fn default() -> How {
        How {
            outstanding: None,
            sleeping: None,
            rank: MEDIAN,
            buffers: Buffers::Written,
        }
    }
}

fn run_with(tls: &str, test: &str, size: usize, iters: u64, how: How) -> anyhow::Result<Figures> {
    let How {
        outstanding,
        sleeping,
        rank,
        buffers,
    } = how;
    let extra = mode_args(outstanding, sleeping.is_some());
    // Its default allocation where no pages are asked for.
    let alloc = sleeping.map(|p| ("UCX_ALLOC_PRIO", alloc_prio(p)));
    let written = match buffers {
        Buffers::Written => Some(Written::new()?),
        Buffers::AsTheToolLeavesThem => None,
    };
    let preload = |cmd: &mut Command| {
        if let Some(w) = &written {
            w.preload(cmd);
        }
    };
    let port = free_port()?.to_string();
    let mut server = Command::new(TOOL.program);
    server
        .args(["-p", &port])
        .args(&extra)
        .envs(alloc)
        .env("UCX_TLS", tls);
    preload(&mut server);
    let server = Server::start(&mut server, Duration::from_millis(400))?;
    // The client is the one child that ends and is waited for meanwhile.
    let children = crate::clock::children_cpu_ns();
    let mut client = Command::new(TOOL.program);
    client
        .args(["127.0.0.1", "-p", &port, "-t", test])
        .args([
            "-s",
            &size.to_string(),
            "-n",
            &iters.to_string(),
            "-f",
            "-v",
            "-R",
            &rank.to_string(),
        ])
        .args(&extra)
        .envs(alloc)
        .env("UCX_TLS", tls);
    preload(&mut client);
    let out = output(&mut client, Duration::from_secs(120))?;
    let client = crate::clock::children_cpu_ns().saturating_sub(children);
    let mut f = parse(&out).with_context(|| format!("ucx_perftest said: {out}"))?;
    if let Some(w) = &written {
        w.check(size)?;
    }
    // The server ends by itself after one run; its CPU time is what an
    // event-driven receiver costs (a busy one's is all of a core).
    if sleeping.is_some() {
        f.server_cpu = server.cpu_at_exit(Duration::from_secs(10));
        f.client_cpu = Some(Duration::from_nanos(client));
    }
    Ok(f)
}

/// The buffers `ucx_perftest` moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffers {
    /// Written once before its run, as an application's data would be
    /// ([`Written`]): as ours are. Every run beside ours.
    Written,
    /// As the tool leaves them: the one it sends from never written, so a
    /// copy out of it reads the kernel's zero page. Shown, not judged.
    AsTheToolLeavesThem,
}

/// The options both sides are given: `-E sleep` for a sleeping run, `-O
/// n` for at most `n` sends outstanding.
fn mode_args(outstanding: Option<u32>, sleeping: bool) -> Vec<String> {
    let mut args = Vec::new();
    if sleeping {
        args.extend(["-E".into(), "sleep".into()]);
    }
    if let Some(n) = outstanding {
        args.extend(["-O".into(), n.to_string()]);
    }
    args
}

/// The figures line of `ucx_perftest -f -v`: iterations, latency at the
/// percentile its column names (`50.0_percentile_lat`), average latency, overall latency (µs an iteration over the whole run),
/// average bandwidth, overall bandwidth (MiB/s), ... Its "average" is of the last report interval only, which
/// swings by an order of magnitude from run to run over a busy machine's
/// tcp; the whole run's bandwidth is "overall".
pub fn parse(out: &str) -> Option<Figures> {
    let line = out.lines().rev().find(|l| {
        l.split(',').count() >= 6 && l.split(',').all(|f| f.trim().parse::<f64>().is_ok())
    })?;
    let f: Vec<f64> = line
        .split(',')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    let rank = out
        .lines()
        .find_map(|l| l.split(',').nth(1)?.trim().strip_suffix("_percentile_lat"))
        .and_then(|r| r.parse().ok());
    Some(Figures {
        latency_us: f[1],
        rank,
        mb_per_s: f[5] * 1.048_576,
        secs: f[0] * f[3] / 1e6,
        server_cpu: None,
        client_cpu: None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_figures_line_is_read() {
        let u = "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n10000,0.141,10221.110,808.816,93.30,1179.10,98,1236\n";
        let f = super::parse(u).unwrap();
        assert_eq!((f.latency_us, f.rank), (0.141, Some(50.0)));
        assert!(
            (f.mb_per_s - 1179.10 * 1.048_576).abs() < 1e-9,
            "the whole run's"
        );
        assert!((f.secs - 10000.0 * 808.816e-6).abs() < 1e-9);
        assert_eq!(super::parse("a,b\n"), None);
        // The column says which percentile; without it, none is known.
        let p99 = u.replace("50.0_percentile", "99.0_percentile");
        assert_eq!(super::parse(&p99).unwrap().rank, Some(99.0));
        let bare = u.lines().nth(1).unwrap();
        assert_eq!(super::parse(bare).unwrap().rank, None);
    }

    /// UCX's tools are installed wherever the tests run (`.ci/run`).
    #[test]
    fn latency_is_the_median_of_one_run_and_the_p99_of_another() {
        let l = super::latency("posix,self", 8, 2 * super::WINDOW).unwrap();
        assert!(l.median > 0.0 && l.median.is_finite(), "{l:?}");
        assert!(l.p99 > 0.0 && l.p99.is_finite(), "{l:?}");
    }

    #[test]
    fn a_bandwidth_run_is_told_how_many_sends_to_keep_in_flight() {
        assert_eq!(super::mode_args(Some(1), true), ["-E", "sleep", "-O", "1"]);
        assert_eq!(super::mode_args(Some(32), false), ["-O", "32"]);
        assert!(super::mode_args(None, false).is_empty());
        // The tool takes it, both sides sleeping, one message in flight
        // and its own window, its buffers written or as it leaves them.
        let pages = macrolink_fabric::Pages::Base;
        let runs = [
            (1, super::Buffers::Written),
            (super::DEFAULT_WINDOW, super::Buffers::Written),
            (1, super::Buffers::AsTheToolLeavesThem),
        ];
        for (window, buffers) in runs {
            let tls = "posix,cma,self";
            let f =
                super::run_sleeping(tls, "tag_bw", 1 << 20, 200, pages, window, buffers).unwrap();
            assert!(f.mb_per_s > 0.0 && f.mb_per_s.is_finite(), "{f:?}");
            assert!(f.server_cpu.is_some() && f.client_cpu.is_some(), "{f:?}");
        }
    }

    #[test]
    fn each_sides_cpu_during_a_run_leaves_its_start_up_out() {
        let run = |secs: f64, cpu: Option<f64>| super::Figures {
            latency_us: 1.0,
            rank: Some(50.0),
            mb_per_s: 1.0,
            secs,
            server_cpu: cpu.map(std::time::Duration::from_secs_f64),
            client_cpu: cpu.map(|c| std::time::Duration::from_secs_f64(c / 2.0)),
        };
        let short = run(0.001, Some(0.16));
        let pct = run(2.001, Some(1.16)).server_cpu_pct(&short).unwrap();
        assert!((pct - 50.0).abs() < 1e-6, "{pct}");
        // The client's is read the same way, from its own figures.
        let pct = run(2.001, Some(1.16)).client_cpu_pct(&short).unwrap();
        assert!((pct - 25.0).abs() < 1e-6, "{pct}");
        assert_eq!(run(2.0, None).server_cpu_pct(&short), None);
        assert_eq!(run(2.0, None).client_cpu_pct(&short), None);
        assert_eq!(run(0.001, Some(1.0)).server_cpu_pct(&short), None);
    }
}
