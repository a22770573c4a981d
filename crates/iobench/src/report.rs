//! The benchmark's rows, as a table and as a plot.

use serde::Serialize;
use std::time::Duration;

use macrolink_bench::stats::median_run;

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
    /// effective figure, includes the final fsync): the median of its runs.
    pub fio_mb_s: Option<f64>,
    /// Runs of the phase (and of fio's job, alternated with them): the
    /// figures above are of the median run by effective bandwidth.
    pub runs: u64,
    /// The lowest effective bandwidth of the runs.
    pub effective_low_mb_s: f64,
    /// The highest effective bandwidth of the runs.
    pub effective_high_mb_s: f64,
    /// The lowest of fio's runs.
    pub fio_low_mb_s: Option<f64>,
    /// The highest of fio's runs.
    pub fio_high_mb_s: Option<f64>,
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
        let effective = bytes as f64 / whole.max(1e-9) / 1e6;
        IoRow {
            pattern: layout.name().into(),
            op: op.name().into(),
            xfer,
            workers: times.len() as u64,
            bytes,
            effective_mb_s: effective,
            transfer_mb_s: bytes as f64 / transfer.max(1e-9) / 1e6,
            open_ms: slowest(&|t| t.open) * 1e3,
            close_ms: slowest(&|t| t.close) * 1e3,
            fio_mb_s: None,
            runs: 1,
            effective_low_mb_s: effective,
            effective_high_mb_s: effective,
            fio_low_mb_s: None,
            fio_high_mb_s: None,
        }
    }

    /// The row of a phase run several times: the median run of `ours` by
    /// effective bandwidth (of an even number, the slower of the middle
    /// two: a run that was, whose open and close times go with it), the
    /// range of them all, and the median and range of fio's runs of the
    /// same job. `None` without a run of ours.
    pub fn of_runs(ours: Vec<IoRow>, fio: &[f64]) -> Option<IoRow> {
        let eff: Vec<f64> = ours.iter().map(|r| r.effective_mb_s).collect();
        let m = median_run(&eff)?;
        let mut row = ours.into_iter().nth(m)?;
        row.runs = eff.len() as u64;
        (row.effective_low_mb_s, row.effective_high_mb_s) = range(&eff)?;
        row.fio_mb_s = median_run(fio).map(|k| fio[k]);
        row.fio_low_mb_s = range(fio).map(|r| r.0);
        row.fio_high_mb_s = range(fio).map(|r| r.1);
        Some(row)
    }
}

/// The lowest and highest of `v`; `None` when empty.
fn range(v: &[f64]) -> Option<(f64, f64)> {
    let lo = v.iter().copied().min_by(f64::total_cmp)?;
    let hi = v.iter().copied().max_by(f64::total_cmp)?;
    Some((lo, hi))
}

/// The table; with rows of several runs, the range of each side's runs
/// after its median.
pub fn table(rows: &[IoRow]) -> String {
    let ranges = rows.iter().any(|r| r.runs > 1);
    let range = |lo: Option<f64>, hi: Option<f64>| match (lo, hi) {
        (Some(lo), Some(hi)) => format!("{lo:.0}-{hi:.0}"),
        _ => "-".into(),
    };
    let mut s = format!(
        "{:<4} {:<9} {:>9} {:>3} {:>12} {:>10} {:>10} {:>8} {:>8} {:>9} {:>6}",
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
    if ranges {
        s += &format!(" {:>13} {:>13}", "eff range", "fio range");
    }
    s.push('\n');
    for r in rows {
        let (fio, ratio) = match r.fio_mb_s {
            Some(f) => (
                format!("{f:.1}"),
                format!("{:.2}", r.effective_mb_s / f.max(1e-9)),
            ),
            None => ("-".into(), "-".into()),
        };
        s += &format!(
            "{:<4} {:<9} {:>9} {:>3} {:>12} {:>10.1} {:>10.1} {:>8.1} {:>8.1} {:>9} {:>6}",
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
        if ranges {
            s += &format!(
                " {:>13} {:>13}",
                range(Some(r.effective_low_mb_s), Some(r.effective_high_mb_s)),
                range(r.fio_low_mb_s, r.fio_high_mb_s)
            );
        }
        s.push('\n');
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

    #[test]
    fn a_row_of_runs_is_its_median_run_beside_each_sides_range() {
        let ms = Duration::from_millis;
        let run = |transfer, close| {
            let t = Times {
                open: ms(0),
                transfer: ms(transfer),
                close: ms(close),
                bytes: 100_000_000,
            };
            IoRow::from_times(Op::Write, Layout::NToN, 1 << 20, &[t])
        };
        // Effective: 100, 200 and 50 MB/s; the median run closed in 100 ms.
        let three = vec![run(900, 100), run(300, 200), run(1800, 200)];
        let r = IoRow::of_runs(three, &[80.0, 120.0, 100.0]).unwrap();
        assert_eq!(r.runs, 3);
        assert!((r.effective_mb_s - 100.0).abs() < 1e-6, "{r:?}");
        assert!((r.close_ms - 100.0).abs() < 1e-9, "that run's close: {r:?}");
        assert!((r.effective_low_mb_s - 50.0).abs() < 1e-6, "{r:?}");
        assert!((r.effective_high_mb_s - 200.0).abs() < 1e-6, "{r:?}");
        assert_eq!(r.fio_mb_s, Some(100.0));
        assert_eq!((r.fio_low_mb_s, r.fio_high_mb_s), (Some(80.0), Some(120.0)));
        // Of two runs the slower; no fio, no fio figures.
        let two = IoRow::of_runs(vec![run(300, 200), run(900, 100)], &[]).unwrap();
        assert!((two.effective_mb_s - 100.0).abs() < 1e-6, "{two:?}");
        assert_eq!((two.fio_mb_s, two.fio_low_mb_s), (None, None));
        assert!(IoRow::of_runs(Vec::new(), &[1.0]).is_none());
        let t = table(&[r, two]);
        assert!(t.contains("eff range") && t.contains("fio range"), "{t}");
        assert!(t.contains(" 50-200 ") && t.contains(" 80-120\n"), "{t}");
        assert!(t.contains("  100-200             -\n"), "{t}");
        // One run a row: no range columns.
        let one = IoRow::of_runs(vec![run(900, 100)], &[]).unwrap();
        assert!(!table(&[one]).contains("range"));
    }
}
