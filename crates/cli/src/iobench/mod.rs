//! `macrolink iobench`: PaScal's parallel I/O benchmark. N worker processes
//! write, then read, in the N-to-N pattern (a file each) and the N-to-1
//! pattern (one shared file, a region each), at each transfer size; then an
//! IOzone-like random write per block size. Reported: the paper's
//! effective bandwidth (all bytes over the slowest worker's create + open +
//! transfer + close) and the plain transfer bandwidth, optionally beside
//! fio running the matching job.

pub mod fio;
pub mod ranks;
pub mod worker;

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use indicatif::{ProgressBar, ProgressStyle};
use macrolink_bench::report;
use macrolink_files::copy::Location;
use macrolink_files::Client;
use serde::Serialize;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use crate::files::ClientArgs;
use worker::{phase_line, Layout, Op, Times};

fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::parse_size(s).map_err(|e| e.to_string())
}

/// Arguments of `macrolink iobench`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Directory or ml://host[:port]/dir to test in (default: a new
    /// directory under the current one, removed afterwards).
    target: Option<String>,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: u64,
    /// Patterns.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "n-n,n-1")]
    patterns: Vec<Layout>,
    /// Transfer sizes.
    #[arg(long, value_delimiter = ',', value_parser = parse_size,
          default_value = "512KiB,2MiB,8MiB,32MiB,64MiB")]
    sizes: Vec<u64>,
    /// Bytes each worker writes and reads in each test.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    file_size: u64,
    /// Block sizes of the random-write test (local directories; "" skips it).
    #[arg(long, value_delimiter = ',', value_parser = parse_size,
          default_value = "4KiB,64KiB,1MiB")]
    random_blocks: Vec<u64>,
    /// Do not fsync written files before closing them.
    #[arg(long)]
    no_fsync: bool,
    /// Run fio with the matching job beside each test (local directories).
    #[arg(long)]
    fio: bool,
    /// Write the rows as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the rows as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw effective bandwidth over transfer size as a PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Under a launcher (srun, mpirun): where the ranks meet, a directory
    /// all of them see (default: the target directory).
    #[arg(long)]
    sync_dir: Option<PathBuf>,
    #[command(flatten)]
    client: ClientArgs,
}

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

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(rank: u64, target: &str, a: &Args) -> anyhow::Result<Worker> {
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.args(["iobench-worker", "--rank", &rank.to_string(), target])
            .args(a.client.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if a.no_fsync {
            cmd.arg("--no-fsync");
        }
        let mut child = cmd.spawn().context("starting a worker")?;
        let stdin = child.stdin.take().context("worker stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("worker stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = child.kill();
            bail!("worker {rank} did not start: {line:?}");
        }
        Ok(Worker {
            child,
            stdin,
            stdout,
        })
    }

    fn answer(&mut self) -> anyhow::Result<Times> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("a worker exited");
        }
        Times::parse(line.trim())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one phase on every worker at once.
fn phase(workers: &mut [Worker], line: &str) -> anyhow::Result<Vec<Times>> {
    for w in workers.iter_mut() {
        writeln!(w.stdin, "{line}")?;
        w.stdin.flush()?;
    }
    workers.iter_mut().map(Worker::answer).collect()
}

/// Who does the work: worker processes of this one, or the ranks of a
/// launch, this process among them.
enum Crew {
    Processes(Vec<Worker>),
    Ranks {
        target: Box<worker::Target>,
        barrier: ranks::Barrier,
        rank: u64,
        fsync: bool,
    },
}

impl Crew {
    fn size(&self) -> u64 {
        match self {
            Crew::Processes(w) => w.len() as u64,
            Crew::Ranks { barrier, .. } => barrier.size(),
        }
    }

    fn reports(&self) -> bool {
        match self {
            Crew::Processes(_) => true,
            Crew::Ranks { rank, .. } => *rank == 0,
        }
    }

    /// Runs phase `step`; the answers of every worker, on the process that
    /// reports.
    fn phase(&mut self, step: usize, line: &str) -> anyhow::Result<Option<Vec<Times>>> {
        match self {
            Crew::Processes(w) => phase(w, line).map(Some),
            Crew::Ranks {
                target,
                barrier,
                rank,
                fsync,
            } => {
                barrier.arrive(step)?;
                let t = worker::phase(target, *rank, *fsync, line)?;
                barrier.answer(step, &t)
            }
        }
    }

    /// Ends the run; true on the process that reports.
    fn finish(self, steps: usize) -> anyhow::Result<bool> {
        match self {
            Crew::Processes(w) => {
                drop(w);
                Ok(true)
            }
            Crew::Ranks { barrier, rank, .. } => {
                barrier.finish(steps)?;
                Ok(rank == 0)
            }
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

fn human(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        b => b.to_string(),
    }
}

/// Runs the benchmark.
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.workers == 0 || a.file_size == 0 {
        bail!("workers and file size must be positive");
    }
    let (target, scratch) = match &a.target {
        Some(t) => (t.clone(), None),
        None => {
            let d = tempfile::Builder::new()
                .prefix("iobench-")
                .tempdir_in(".")
                .context("making a directory to test in")?;
            (d.path().display().to_string(), Some(d))
        }
    };
    let location: Location = target.parse()?;
    let local_dir = match &location {
        Location::Local(p) => {
            if !p.is_dir() {
                bail!("{}: not a directory", p.display());
            }
            Some(p.clone())
        }
        Location::Remote { .. } => None,
        Location::Striped { .. } => bail!("iobench runs against one server"),
    };
    if a.fio && local_dir.is_none() {
        bail!("--fio runs against local directories");
    }
    let random: Vec<u64> = if local_dir.is_some() {
        a.random_blocks.clone()
    } else {
        Vec::new()
    };
    let mut crew = match ranks::from_env() {
        Some((rank, size)) => {
            let base = match (&a.sync_dir, &local_dir) {
                (Some(d), _) => d.clone(),
                (None, Some(d)) => d.clone(),
                (None, None) => bail!("under a launcher, name a shared --sync-dir"),
            };
            Crew::Ranks {
                target: Box::new(worker::Target::open(&target, &a.client)?),
                barrier: ranks::Barrier::new(base, rank, size)?,
                rank,
                fsync: !a.no_fsync,
            }
        }
        None => Crew::Processes(
            (0..a.workers)
                .map(|r| Worker::spawn(r, &target, &a))
                .collect::<anyhow::Result<Vec<_>>>()?,
        ),
    };
    let workers = crew.size();
    let phases = a.patterns.len() * a.sizes.len() * 2 + random.len();
    let pb = if std::io::stderr().is_terminal() && crew.reports() {
        ProgressBar::new(phases as u64)
    } else {
        ProgressBar::hidden()
    };
    pb.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut rows = Vec::new();
    let mut jobs = Vec::new();
    for &layout in &a.patterns {
        for &xfer in &a.sizes {
            for op in [Op::Write, Op::Read] {
                jobs.push((op, layout, xfer, a.file_size));
            }
        }
    }
    for &block in &random {
        jobs.push((Op::RandWrite, Layout::NToN, block, a.file_size));
    }
    let steps = jobs.len();
    for (step, (op, layout, xfer, size)) in jobs.into_iter().enumerate() {
        pb.set_message(format!("{} {} {}", layout.name(), op.name(), human(xfer)));
        let Some(times) = crew.phase(step, &phase_line(op, layout, xfer, size))? else {
            continue;
        };
        let mut row = IoRow::from_times(op, layout, xfer, &times);
        if let (true, Some(dir)) = (a.fio, &local_dir) {
            let job = fio::Job {
                op,
                layout,
                xfer,
                size,
                workers,
                fsync: !a.no_fsync,
            };
            row.fio_mb_s = Some(fio::run(dir, &job)?);
        }
        rows.push(row);
        pb.inc(1);
    }
    pb.finish_and_clear();
    let lead = crew.finish(steps)?;
    if !lead {
        return Ok(());
    }
    cleanup(&location, workers, &a, &a.patterns)?;
    if let Some(d) = scratch {
        d.close()?;
    }
    print!("{}", table(&rows));
    println!(
        "effective = all bytes / slowest worker's (create + open + transfer + close); \
         ratio = effective / fio; {} workers, {} each{}",
        workers,
        human(a.file_size),
        if a.no_fsync {
            ""
        } else {
            "; writes fsync'd before close"
        }
    );
    if let Some(p) = &a.json {
        report::write_json(p, &rows).with_context(|| p.display().to_string())?;
    }
    if let Some(p) = &a.csv {
        report::write_csv(p, &rows).with_context(|| p.display().to_string())?;
    }
    if let Some(p) = &a.plot {
        plot(p, &rows)?;
    }
    Ok(())
}

/// Removes the files the workers made.
fn cleanup(location: &Location, workers: u64, a: &Args, layouts: &[Layout]) -> anyhow::Result<()> {
    let mut names: Vec<String> = (0..workers)
        .flat_map(|r| layouts.iter().map(move |l| l.place(r, 0).0))
        .collect();
    names.extend((0..workers).map(|r| Layout::NToN.place(r, 0).0));
    names.sort();
    names.dedup();
    match location {
        Location::Local(dir) => {
            for n in names {
                let _ = std::fs::remove_file(dir.join(n));
            }
        }
        Location::Remote { server, path } => {
            let mut c = Client::connect(server, &a.client.secret.load()?, &a.client.options()?)?;
            for n in names {
                let p = if path.is_empty() {
                    n
                } else {
                    format!("{}/{n}", path.trim_end_matches('/'))
                };
                let _ = c.remove(&p, false);
            }
        }
        Location::Striped { .. } => {}
    }
    Ok(())
}

fn plot(path: &std::path::Path, rows: &[IoRow]) -> anyhow::Result<()> {
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
    }

    #[test]
    fn answers_parse_and_errors_come_through() {
        let t = Times {
            open: Duration::from_nanos(1),
            transfer: Duration::from_nanos(2),
            close: Duration::from_nanos(3),
            bytes: 4,
        };
        assert_eq!(Times::parse(&t.line()).unwrap(), t);
        let e = Times::parse("error disk full").unwrap_err();
        assert_eq!(e.to_string(), "disk full");
        assert!(Times::parse("done 1 2").is_err());
    }
}
