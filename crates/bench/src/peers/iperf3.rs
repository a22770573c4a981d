//! iperf3: TCP throughput, one flow or several, on loopback or between
//! network namespaces.

use anyhow::Context;
use std::time::Duration;

use super::{command, output, Server, Tool};

/// The tool.
pub const TOOL: Tool = Tool {
    program: "iperf3",
    package: "iperf3",
};

/// The largest write iperf3 takes (`-l`).
pub const MAX_LEN: usize = 1 << 20;

/// One iperf3 run.
#[derive(Clone, Debug)]
pub struct Run<'a> {
    /// Namespace of the server (`None`: here).
    pub server_ns: Option<&'a str>,
    /// Namespace of the client.
    pub client_ns: Option<&'a str>,
    /// Address the server binds and the client connects to.
    pub addr: &'a str,
    /// TCP port.
    pub port: u16,
    /// Parallel flows (`-P`).
    pub flows: u32,
    /// Seconds (`-t`).
    pub secs: u32,
    /// Congestion control (`-C`), if not the kernel's default.
    pub congestion: Option<&'a str>,
    /// Bytes a write (`-l`), if not iperf3's default (128 KiB).
    pub len: Option<usize>,
}

impl Run<'_> {
    /// Runs it; the received rate in 10^6 bytes per second.
    pub fn mb_per_s(&self) -> anyhow::Result<f64> {
        let port = self.port.to_string();
        let _server = Server::start(
            command(self.server_ns, TOOL.program).args(["-s", "-1", "-B", self.addr, "-p", &port]),
            Duration::from_millis(300),
        )?;
        let out = output(
            command(self.client_ns, TOOL.program)
                .args(["-c", self.addr, "-p", &port, "-J"])
                .args(["-t", &self.secs.max(1).to_string()])
                .args(["-P", &self.flows.max(1).to_string()])
                .args(self.congestion.iter().flat_map(|c| ["-C", c]))
                .args(
                    self.len
                        .iter()
                        .flat_map(|l| ["-l".to_string(), l.to_string()]),
                ),
            Duration::from_secs(u64::from(self.secs) + 60),
        )?;
        parse(&out).with_context(|| format!("iperf3 said: {out}"))
    }
}

/// The received rate of iperf3's JSON report (`-J`), 10^6 bytes per second.
pub fn parse(json: &str) -> Option<f64> {
    // The JSON document, and whatever iperf3 printed after it.
    let start = json.find('{')?;
    let v: serde_json::Value = serde_json::Deserializer::from_str(&json[start..])
        .into_iter()
        .next()?
        .ok()?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 8e6)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_received_rate_is_read() {
        let j = r#"{"end":{"sum_received":{"bits_per_second":8000000000.0}}}"#;
        assert_eq!(super::parse(j), Some(1000.0));
        assert_eq!(super::parse(&format!("{j}\niperf3: done\n")), Some(1000.0));
        assert_eq!(super::parse("{}"), None);
        assert_eq!(super::parse("iperf3: error"), None);
    }
}
