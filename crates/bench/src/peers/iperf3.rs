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
    /// Seconds sent before `secs` and left out of the figure (`-O`).
    pub omit: u32,
}

/// What one run measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures {
    /// Received rate, 10^6 bytes per second.
    pub mb_per_s: f64,
    /// The receiving server's CPU, % of one core, as iperf3 reports it.
    pub receiver_cpu: Option<f64>,
}

impl Run<'_> {
    /// Runs it; the received rate in 10^6 bytes per second.
    pub fn mb_per_s(&self) -> anyhow::Result<f64> {
        self.figures().map(|f| f.mb_per_s)
    }

    /// Runs it; the received rate and the receiver's CPU.
    pub fn figures(&self) -> anyhow::Result<Figures> {
        let port = self.port.to_string();
        let _server = Server::start(
            command(self.server_ns, TOOL.program).args(["-s", "-1", "-B", self.addr, "-p", &port]),
            Duration::from_millis(300),
        )?;
        let out = output(
            command(self.client_ns, TOOL.program)
                .args(["-c", self.addr, "-p", &port, "-J"])
                .args(["-t", &self.secs.max(1).to_string()])
                .args(["-O", &self.omit.to_string()])
                .args(["-P", &self.flows.max(1).to_string()])
                .args(self.congestion.iter().flat_map(|c| ["-C", c]))
                .args(
                    self.len
                        .iter()
                        .flat_map(|l| ["-l".to_string(), l.to_string()]),
                ),
            Duration::from_secs(u64::from(self.secs) + u64::from(self.omit) + 60),
        )?;
        let figures = parse(&out).map(|mb_per_s| Figures {
            mb_per_s,
            receiver_cpu: receiver_cpu(&out),
        });
        figures.with_context(|| format!("iperf3 said: {out}"))
    }
}

/// The JSON document of iperf3's report (`-J`), without whatever iperf3
/// printed after it.
fn report(json: &str) -> Option<serde_json::Value> {
    let start = json.find('{')?;
    serde_json::Deserializer::from_str(&json[start..])
        .into_iter()
        .next()?
        .ok()
}

/// The received rate of iperf3's JSON report (`-J`), 10^6 bytes per second.
pub fn parse(json: &str) -> Option<f64> {
    report(json)?["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 8e6)
}

/// The receiving server's CPU in iperf3's JSON report of a client that
/// sent (% of one core, user and system).
pub fn receiver_cpu(json: &str) -> Option<f64> {
    report(json)?["end"]["cpu_utilization_percent"]["remote_total"].as_f64()
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
        let c = r#"{"end":{"cpu_utilization_percent":{"host_total":91.5,"remote_total":71.2}}}"#;
        assert_eq!(super::receiver_cpu(c), Some(71.2));
        assert_eq!(super::receiver_cpu(j), None);
    }
}
