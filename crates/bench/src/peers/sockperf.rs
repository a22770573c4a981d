//! sockperf: ping-pong latency over TCP or UDP sockets.

use anyhow::Context;
use std::process::Command;
use std::time::Duration;

use super::{free_port, output, Server, Tool};

/// The tool.
pub const TOOL: Tool = Tool {
    program: "sockperf",
    package: "sockperf",
};

/// Median ping-pong latency (half round trip) of `size`-byte messages over
/// UDP or TCP on loopback, for `secs` seconds; microseconds.
pub fn ping_pong(udp: bool, size: usize, secs: f64) -> anyhow::Result<f64> {
    let port = free_port()?.to_string();
    let proto: &[&str] = if udp { &[] } else { &["--tcp"] };
    let _server = Server::start(
        Command::new(TOOL.program)
            .arg("sr")
            .args(proto)
            .args(["-i", "127.0.0.1", "-p", &port]),
        Duration::from_millis(400),
    )?;
    let out = output(
        Command::new(TOOL.program)
            .arg("pp")
            .args(proto)
            .args(["-i", "127.0.0.1", "-p", &port, "-m", &size.to_string()])
            .args(["-t", &format!("{}", secs.ceil().max(1.0))]),
        Duration::from_secs(60),
    )?;
    parse_median(&out).with_context(|| format!("sockperf said: {out}"))
}

/// The 50th percentile line of sockperf's report.
pub fn parse_median(out: &str) -> Option<f64> {
    out.lines()
        .find(|l| l.contains("percentile 50.000"))
        .and_then(|l| l.rsplit('=').next())
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_median_is_read() {
        let s = "sockperf: ---> percentile 75.000 =   11.276\nsockperf: ---> percentile 50.000 =   10.313\n";
        assert_eq!(super::parse_median(s), Some(10.313));
        assert_eq!(super::parse_median("nothing"), None);
    }
}
