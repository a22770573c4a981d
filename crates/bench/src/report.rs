//! Result rows and how they are shown: aligned tables, JSON, CSV.

use serde::Serialize;
use std::fmt::Write as _;
use std::io;
use std::path::Path;

use crate::stats::Summary;

/// One row of a bandwidth sweep.
#[derive(Clone, Debug, Serialize)]
pub struct BwRow {
    /// Transport.
    pub transport: String,
    /// Mode.
    pub mode: String,
    /// Completion of both sides.
    pub completion: String,
    /// Bytes per message.
    pub size: u64,
    /// Messages sent.
    pub sent: u64,
    /// Messages the target received (puts: placed).
    pub delivered: u64,
    /// Payload bytes the target received.
    pub bytes: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// When the measured run began, its first message sent: the host's
    /// monotonic clock, in nanoseconds (`CLOCK_MONOTONIC`, one clock for
    /// every process of a host, as [`BwRow::arrivals`]). A datagram
    /// stream's `seconds` are timed by its target, from its first arrival.
    pub started_ns: u64,
    /// 10^6 bytes per second; `None` where the mode cannot carry the size.
    pub mb_per_s: Option<f64>,
    /// Messages per second.
    pub msgs_per_s: Option<f64>,
    /// CPU % of the initiator (100 = one core).
    pub cpu_initiator: Option<f64>,
    /// CPU % of the target.
    pub cpu_target: Option<f64>,
    /// The pages both sides' buffers lay on (`base`, `huge`).
    pub pages: String,
    /// When the target's messages arrived, a reliable run's when asked
    /// for: [the host's monotonic clock in nanoseconds, messages so far],
    /// for every message or, past [`crate::server::MAX_ARRIVALS`], at even
    /// steps and the last. Runs made at once are counted from them over
    /// the span all of them ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub arrivals: Vec<[u64; 2]>,
}

/// One row of a latency test.
#[derive(Clone, Debug, Serialize)]
pub struct LatRow {
    /// PingPong, PingPing, SendRecv or Exchange.
    pub test: String,
    /// Transport.
    pub transport: String,
    /// Mode.
    pub mode: String,
    /// Completion.
    pub completion: String,
    /// Bytes per message.
    pub size: u64,
    /// Iterations.
    pub iterations: u64,
    /// Microseconds: half round trip (PingPong) or one iteration (others).
    pub usec: Summary,
    /// 10^6 bytes per second in each direction, from the median.
    pub mb_per_s_each_way: f64,
    /// Sum of both directions.
    pub mb_per_s_both: f64,
    /// CPU % of the initiator.
    pub cpu_initiator: f64,
    /// CPU % of the target.
    pub cpu_target: f64,
}

/// One-way latency with a clock offset estimate.
#[derive(Clone, Debug, Serialize)]
pub struct OneWayRow {
    /// Transport.
    pub transport: String,
    /// Bytes per message.
    pub size: u64,
    /// Messages.
    pub iterations: u64,
    /// Target clock minus initiator clock, microseconds.
    pub offset_usec: f64,
    /// Half the smallest round trip of the clock exchange: the offset's error bound.
    pub error_usec: f64,
    /// One-way latency, microseconds.
    pub usec: Summary,
}

/// DP-II latency breakdown L = T_startup + T_send + T_net + T_delivery.
#[derive(Clone, Debug, Serialize)]
pub struct BreakdownRow {
    /// Transport.
    pub transport: String,
    /// Bytes per message.
    pub size: u64,
    /// Messages.
    pub iterations: u64,
    /// Median microseconds of each stage.
    pub startup: f64,
    /// Building frames to the transport taking the last byte.
    pub send: f64,
    /// Transport taken to the receiver seeing the header.
    pub net: f64,
    /// Header seen to the message handed to the application.
    pub delivery: f64,
    /// Sum of the four.
    pub total: f64,
    /// Error bound of the clock offset (0 on one host).
    pub error_usec: f64,
}

/// Formats an optional figure, "n.a." when absent, as the papers print it.
pub fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "n.a.".to_owned(), |x| format!("{x:.prec$}"))
}

/// The bandwidth table a person reads.
pub fn bw_table(rows: &[BwRow]) -> String {
    let mut s = format!(
        "{:<5} {:<9} {:<5} {:>9} {:>10} {:>12} {:>8} {:>8}\n",
        "via", "mode", "comp", "bytes", "MB/s", "msgs/s", "CPU ini", "CPU tgt"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<5} {:<9} {:<5} {:>9} {:>10} {:>12} {:>8} {:>8}",
            r.transport,
            r.mode,
            r.completion,
            r.size,
            opt(r.mb_per_s, 1),
            opt(r.msgs_per_s, 0),
            opt(r.cpu_initiator, 0),
            opt(r.cpu_target, 0)
        );
    }
    s
}

/// The latency table a person reads.
pub fn lat_table(rows: &[LatRow]) -> String {
    let mut s = format!(
        "{:<9} {:<5} {:<9} {:>9} {:>9} {:>9} {:>9} {:>11} {:>11}\n",
        "test", "via", "mode", "bytes", "min us", "med us", "p99 us", "MB/s each", "MB/s both"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<9} {:<5} {:<9} {:>9} {:>9.2} {:>9.2} {:>9.2} {:>11.1} {:>11.1}",
            r.test,
            r.transport,
            r.mode,
            r.size,
            r.usec.min,
            r.usec.median,
            r.usec.p99,
            r.mb_per_s_each_way,
            r.mb_per_s_both
        );
    }
    s
}

/// The one-way table.
pub fn oneway_table(rows: &[OneWayRow]) -> String {
    let mut s = format!(
        "{:<5} {:>9} {:>9} {:>9} {:>9} {:>12}\n",
        "via", "bytes", "min us", "med us", "p99 us", "offset us"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<5} {:>9} {:>9.2} {:>9.2} {:>9.2} {:>6.2} ±{:.2}",
            r.transport, r.size, r.usec.min, r.usec.median, r.usec.p99, r.offset_usec, r.error_usec
        );
    }
    s
}

/// The breakdown, in the paper's terms.
pub fn breakdown_table(rows: &[BreakdownRow]) -> String {
    let mut s = format!(
        "{:<5} {:>7} {:>10} {:>8} {:>8} {:>11} {:>9}\n",
        "via", "bytes", "T_startup", "T_send", "T_net", "T_delivery", "L (us)"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<5} {:>7} {:>10.2} {:>8.2} {:>8.2} {:>11.2} {:>9.2}",
            r.transport, r.size, r.startup, r.send, r.net, r.delivery, r.total
        );
    }
    s
}

/// Writes rows as a JSON array.
pub fn write_json<T: Serialize>(path: &Path, rows: &[T]) -> io::Result<()> {
    let f = std::fs::File::create(path)?;
    serde_json::to_writer_pretty(f, rows).map_err(io::Error::other)
}

/// Writes rows where asked: as JSON to `json`, as CSV to `csv`; an error
/// names the file.
pub fn save<T: Serialize>(json: Option<&Path>, csv: Option<&Path>, rows: &[T]) -> io::Result<()> {
    fn named(p: &Path) -> impl FnOnce(io::Error) -> io::Error + '_ {
        move |e| io::Error::new(e.kind(), format!("{}: {e}", p.display()))
    }
    if let Some(p) = json {
        write_json(p, rows).map_err(named(p))?;
    }
    if let Some(p) = csv {
        write_csv(p, rows).map_err(named(p))?;
    }
    Ok(())
}

/// Writes rows as CSV with a header line (nested summaries flattened).
pub fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> io::Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    for (i, r) in rows.iter().enumerate() {
        let flat = flatten(&serde_json::to_value(r).map_err(io::Error::other)?);
        if i == 0 {
            w.write_record(flat.iter().map(|(k, _)| k))?;
        }
        w.write_record(flat.iter().map(|(_, v)| v))?;
    }
    w.flush()
}

fn flatten(v: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let serde_json::Value::Object(m) = v {
        for (k, v) in m {
            match v {
                serde_json::Value::Object(_) => {
                    for (k2, v2) in flatten(v) {
                        out.push((format!("{k}_{k2}"), v2));
                    }
                }
                serde_json::Value::Null => out.push((k.clone(), "n.a.".into())),
                serde_json::Value::String(s) => out.push((k.clone(), s.clone())),
                other => out.push((k.clone(), other.to_string())),
            }
        }
    }
    out
}
