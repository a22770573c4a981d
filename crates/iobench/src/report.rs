//! The benchmark's rows, as a table and as a plot.

use serde::Serialize;
use std::time::Duration;

use crate::phase::{Layout, Op, Times};

/// One row of the table.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct IoRow {
    /// n-n or n-1.
    pub pattern: String,
    /// write, read or randwrite.
    pub op: String,
    /// Transfer (or block) size, bytes.
    pub xfer: u64,
    /// Workers.
    pub workers: u64,
    /// Bytes moved by all workers.
    pub bytes: u64,
    /// All bytes over the slowest worker's create + open + transfer + close.
    pub effective_mb_s: f64,
    /// All bytes over the slowest worker's transfer.
    pub transfer_mb_s: f64,
    /// Slowest create + open, ms.
    pub open_ms: f64,
    /// Slowest fsync + close, ms.
    pub close_ms: f64,
    /// fio's bandwidth for the matching job, if run (its time, like the
    /// effective figure, includes the final fsync).
    pub fio_mb_s: Option<f64>,
}

impl IoRow {
    /// The row for one phase's answers.
    pub fn from_times(op: Op, layout: Layout, xfer: u64, times: &[Times]) -> IoRow {
        let bytes: u64 = times.iter().map(|t| t.bytes).sum();
        let slowest = |f: &dyn Fn(&Times) -> Duration| {
            times.iter().map(f).max().unwrap_or_default().as_secs_f64()
        };
        let whole = slowest(&|t| t.open + t.transfer + t.close);
        let transfer = slowest(&|t| t.transfer);
        IoRow {
            pattern: layout.name().into(),
            op: op.name().into(),
            xfer,
            workers: times.len() as u64,
            bytes,
            effective_mb_s: bytes as f64 / whole.max(1e-9) / 1e6,
            transfer_mb_s: bytes as f64 / transfer.max(1e-9) / 1e6,
            open_ms: slowest(&|t| t.open) * 1e3,
            close_ms: slowest(&|t| t.close) * 1e3,
            fio_mb_s: None,
        }
    }
}

/// The table.
pub fn table(rows: &[IoRow]) -> String {
    let mut s = format!(
        "{:<4} {:<9} {:>9} {:>3} {:>12} {:>10} {:>10} {:>8} {:>8} {:>9} {:>6}\n",
        "pat",
        "op",
        "xfer",
        "N",
        "bytes",
        "eff MB/s",
        "xfer MB/s",
        "open ms",
        "close ms",
        "fio MB/s",
        "ratio"
    );
    for r in rows {
        let (fio, ratio) = match r.fio_mb_s {
            Some(f) => (
                format!("{f:.1}"),
                format!("{:.2}", r.effective_mb_s / f.max(1e-9)),
            ),
            None => ("-".into(), "-".into()),
        };
        s += &format!(
            "{:<4} {:<9} {:>9} {:>3} {:>12} {:>10.1} {:>10.1} {:>8.1} {:>8.1} {:>9} {:>6}\n",
            r.pattern,
            r.op,
            human(r.xfer),
            r.workers,
            r.bytes,
            r.effective_mb_s,
            r.transfer_mb_s,
            r.open_ms,
            r.close_ms,
            fio,
            ratio
        );
    }
    s
}

/// A size as the table shows it: 512KiB, 2MiB, ...
pub fn human(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        b => b.to_string(),
    }
}

/// Effective bandwidth over transfer size, a line per pattern and
/// operation, as a PNG.
pub fn plot(path: &std::path::Path, rows: &[IoRow]) -> anyhow::Result<()> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let name = format!("{} {}", r.pattern, r.op);
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push((r.xfer as f64, r.effective_mb_s)),
            None => series.push((name, vec![(r.xfer as f64, r.effective_mb_s)])),
        }
    }
    macrolink_bench::plot::lines_png(
        path,
        "iobench: effective bandwidth",
        ("transfer size (bytes)", "MB/s (10^6 bytes/s)"),
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_bandwidth_counts_the_slowest_worker_whole() {
        let ms = Duration::from_millis;
        let t = |open, transfer, close| Times {
            open: ms(open),
            transfer: ms(transfer),
            close: ms(close),
            bytes: 100_000_000,
        };
        let row = IoRow::from_times(
            Op::Write,
            Layout::NTo1,
            1 << 20,
            &[t(10, 500, 100), t(0, 900, 0)],
        );
        assert_eq!(row.bytes, 200_000_000);
        // Slowest whole: 610 ms vs 900 ms -> 900 ms; slowest transfer 900 ms.
        assert!((row.effective_mb_s - 200.0 / 0.9).abs() < 1e-6);
        assert!((row.transfer_mb_s - 200.0 / 0.9).abs() < 1e-6);
        assert!((row.close_ms - 100.0).abs() < 1e-9);
        let row = IoRow::from_times(Op::Read, Layout::NToN, 1, &[t(300, 500, 300)]);
        assert!((row.effective_mb_s - 100.0 / 1.1).abs() < 1e-6);
        assert!((row.transfer_mb_s - 100.0 / 0.5).abs() < 1e-6);
        assert_eq!(human(512 << 10), "512KiB");
        assert_eq!(human(3 << 30), "3GiB");
        assert_eq!(human(1000), "1000");
    }
}
