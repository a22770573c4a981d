//! ucx_perftest: UCX's own latency and bandwidth test, over the UCX
//! transports that `UCX_TLS` names.

use anyhow::Context;
use std::process::Command;
use std::time::Duration;

use super::{free_port, output, Server, Tool};

/// The tool.
pub const TOOL: Tool = Tool {
    program: "ucx_perftest",
    package: "ucx-utils",
};

/// What one run measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures {
    /// Median latency, microseconds.
    pub median_us: f64,
    /// Bandwidth over the whole run, 10^6 bytes per second.
    pub mb_per_s: f64,
}

/// Runs test `test` (`tag_lat`, `ucp_put_bw`, ...) of `size`-byte messages
/// for `iters` iterations over the UCX transports `tls`, server and client
/// on loopback, both busy polling.
pub fn run(tls: &str, test: &str, size: usize, iters: u64) -> anyhow::Result<Figures> {
    run_with(tls, test, size, iters, &[])
}

/// As [`run`], both sides sleeping after posting their requests (`-E
/// sleep`): UCX's event-driven mode, beside a waiting endpoint of ours.
pub fn run_sleeping(tls: &str, test: &str, size: usize, iters: u64) -> anyhow::Result<Figures> {
    run_with(tls, test, size, iters, &["-E", "sleep"])
}

fn run_with(
    tls: &str,
    test: &str,
    size: usize,
    iters: u64,
    extra: &[&str],
) -> anyhow::Result<Figures> {
    let port = free_port()?.to_string();
    let _server = Server::start(
        Command::new(TOOL.program)
            .args(["-p", &port])
            .args(extra)
            .env("UCX_TLS", tls),
        Duration::from_millis(400),
    )?;
    let out = output(
        Command::new(TOOL.program)
            .args(["127.0.0.1", "-p", &port, "-t", test])
            .args([
                "-s",
                &size.to_string(),
                "-n",
                &iters.to_string(),
                "-f",
                "-v",
            ])
            .args(extra)
            .env("UCX_TLS", tls),
        Duration::from_secs(120),
    )?;
    parse(&out).with_context(|| format!("ucx_perftest said: {out}"))
}

/// The figures line of `ucx_perftest -f -v`: iterations, median latency,
/// average latency, overall latency, average bandwidth, overall bandwidth
/// (MiB/s), ... Its "average" is of the last report interval only, which
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
    Some(Figures {
        median_us: f[1],
        mb_per_s: f[5] * 1.048_576,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_figures_line_is_read() {
        let u = "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n10000,0.141,10221.110,808.816,93.30,1179.10,98,1236\n";
        let f = super::parse(u).unwrap();
        assert_eq!(f.median_us, 0.141);
        assert!(
            (f.mb_per_s - 1179.10 * 1.048_576).abs() < 1e-9,
            "the whole run's"
        );
        assert_eq!(super::parse("a,b\n"), None);
    }
}
