//! `macrolink iobench`: PaScal's parallel I/O benchmark. N worker processes
//! write, then read, in the N-to-N pattern (a file each) and the N-to-1
//! pattern (one shared file, a region each), at each transfer size; then an
//! IOzone-like random write per block size. Reported: the paper's
//! effective bandwidth (all bytes over the slowest worker's create + open +
//! transfer + close) and the plain transfer bandwidth, optionally beside
//! fio running the matching job.
//!
//! ```text
//!   run(options) ──► Crew: worker processes (setup + phase lines on stdin)
//!        │                 or the ranks of a launch (files in a shared dir)
//!        ├── for each phase: every worker at once ──► Times ──► IoRow
//!        │                   fio, the same job (--fio) ─────────► ratio
//!        └── table, JSON, CSV, plot (on rank 0 under a launcher)
//! ```

pub mod crew;
pub mod phase;
pub mod ranks;
pub mod report;
pub mod worker;

use anyhow::{bail, Context};
use macrolink_bench::peers::fio;
use macrolink_bench::progress;
use macrolink_files::copy::Location;
use macrolink_files::ClientSetup;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::Command;

use crew::{Crew, Worker};
use phase::{Layout, Op, Phase};
use report::{human, IoRow};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Directory or `ml://host[:port]/dir` to test in (default: a new
    /// directory under the current one, removed afterwards).
    pub target: Option<String>,
    /// Worker processes.
    pub workers: u64,
    /// Patterns.
    pub patterns: Vec<Layout>,
    /// Transfer sizes.
    pub sizes: Vec<u64>,
    /// Bytes each worker writes and reads in each test.
    pub file_size: u64,
    /// Block sizes of the random-write test (local directories).
    pub random_blocks: Vec<u64>,
    /// fsync written files before closing them.
    pub fsync: bool,
    /// Run fio with the matching job beside each test (local directories).
    pub fio: bool,
    /// Runs of each phase (alternated with fio's job, with `fio`): each
    /// row is the median run, beside the range of them all.
    pub runs: usize,
    /// Write the rows as JSON.
    pub json: Option<PathBuf>,
    /// Write the rows as CSV.
    pub csv: Option<PathBuf>,
    /// Draw effective bandwidth over transfer size as a PNG.
    pub plot: Option<PathBuf>,
    /// Under a launcher: where the ranks meet, a directory all of them see
    /// (default: the target directory).
    pub sync_dir: Option<PathBuf>,
    /// How workers reach a server.
    pub client: ClientSetup,
}

/// fio's job for a phase of `workers` workers.
fn fio_job(p: Phase, workers: u64, fsync: bool) -> fio::Job {
    fio::Job {
        rw: match p.op {
            Op::Write => fio::Rw::Write,
            Op::Read => fio::Rw::Read,
            Op::RandWrite => fio::Rw::RandWrite,
        },
        shared_file: p.layout == Layout::NTo1,
        bs: p.xfer,
        size: p.size,
        numjobs: workers,
        end_fsync: fsync,
    }
}

/// Runs the benchmark and prints its table; `worker` makes the command
/// line of a worker process (`macrolink iobench-worker`).
pub fn run(a: &Options, worker: &dyn Fn() -> Command) -> anyhow::Result<()> {
    if a.workers == 0 || a.file_size == 0 || a.runs == 0 {
        bail!("workers, file size and runs must be positive");
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
                fsync: a.fsync,
            }
        }
        None => Crew::Processes(
            (0..a.workers)
                .map(|rank| {
                    let setup = worker::Setup {
                        rank,
                        target: target.clone(),
                        fsync: a.fsync,
                        client: a.client.clone(),
                    };
                    Worker::spawn(worker(), &setup)
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
        ),
    };
    let workers = crew.size();
    let phases = (a.patterns.len() * a.sizes.len() * 2 + random.len()) * a.runs;
    let pb = if std::io::stderr().is_terminal() && crew.reports() {
        progress::bar(phases as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut rows = Vec::new();
    let mut jobs = Vec::new();
    let size = a.file_size;
    for &layout in &a.patterns {
        for &xfer in &a.sizes {
            for op in [Op::Write, Op::Read] {
                jobs.push(Phase {
                    op,
                    layout,
                    xfer,
                    size,
                });
            }
        }
    }
    for &xfer in &random {
        jobs.push(Phase {
            op: Op::RandWrite,
            layout: Layout::NToN,
            xfer,
            size,
        });
    }
    let steps = jobs.len() * a.runs;
    let mut step = 0;
    for p in jobs {
        pb.set_message(format!(
            "{} {} {}",
            p.layout.name(),
            p.op.name(),
            human(p.xfer)
        ));
        // Each run of ours, then one of fio's: a minute that is slow for
        // the machine (its host, its supply of new pages) falls on both.
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for _ in 0..a.runs {
            step += 1;
            // Each write run, ours and fio's, writes new files, with the
            // file system idle: fio's are removed before it writes, and
            // writing over ours, left in the page cache by the run before,
            // copied into pages already there (fio's writes made new ones).
            let writes = p.op != Op::Read;
            if writes && crew.reports() {
                if let Err(e) = cleanup(&location, workers, a) {
                    eprintln!("iobench: the files of the run before stay ({e:#}): written over");
                }
                rustix::fs::sync();
            }
            let Some(times) = crew.phase(step - 1, &p.to_string())? else {
                continue;
            };
            ours.push(IoRow::from_times(p.op, p.layout, p.xfer, &times));
            if let (true, Some(dir)) = (a.fio, &local_dir) {
                if writes {
                    rustix::fs::sync();
                }
                theirs.push(fio::run(dir, &fio_job(p, workers, a.fsync))?);
            }
            pb.inc(1);
        }
        // fio's files stay from its write runs through its read runs (a
        // read job without them would lay out files of its own first).
        let lead = crew.reports();
        if let (true, true, Some(dir), false) = (a.fio, lead, &local_dir, p.op == Op::Write) {
            fio::remove_files(dir, &fio_job(p, workers, a.fsync))?;
        }
        rows.extend(IoRow::of_runs(ours, &theirs));
    }
    pb.finish_and_clear();
    let lead = crew.finish(steps)?;
    if !lead {
        return Ok(());
    }
    cleanup(&location, workers, a)?;
    if let Some(d) = scratch {
        d.close()?;
    }
    print!("{}", report::table(&rows));
    println!(
        "effective = all bytes / slowest worker's (create + open + transfer + close); \
         ratio = effective / fio; {} workers, {} each{}",
        workers,
        human(a.file_size),
        if a.fsync {
            "; writes fsync'd before close"
        } else {
            ""
        }
    );
    if a.runs > 1 {
        println!("{}", runs_note(a.runs, a.fio));
    }
    if a.fio && local_dir.is_some() {
        println!("{}", fio_note(workers, a.fsync));
    }
    if let Some(p) = &a.json {
        macrolink_bench::report::write_json(p, &rows).with_context(|| p.display().to_string())?;
    }
    if let Some(p) = &a.csv {
        macrolink_bench::report::write_csv(p, &rows).with_context(|| p.display().to_string())?;
    }
    if let Some(p) = &a.plot {
        report::plot(p, &rows)?;
    }
    Ok(())
}

/// What a row of several runs gives.
fn runs_note(runs: usize, fio: bool) -> String {
    let mut s = format!(
        "each row: the median run of {runs} by effective bandwidth (of an even number, the \
         slower of the middle two), its open and close times that run's; eff range: the \
         lowest and highest run"
    );
    if fio {
        s += &format!(
            "; fio MB/s: the median of fio's {runs} runs, fio range: their lowest and highest"
        );
    }
    s
}

/// The regime of fio's runs beside ours.
fn fio_note(workers: u64, fsync: bool) -> String {
    format!(
        "fio: the same job in the same directory, run after each run of ours: \
         --ioengine=psync (a blocking pwrite or pread a block at a time, as each worker of \
         ours), --numjobs={workers} processes, the same block size and bytes a worker, \
         page-aligned buffers (--iomem_align=4096), reads from the page cache \
         (--invalidate=0), files grown as they are written (--fallocate=none), new files for \
         each write run{}; fio's time leaves out opening its files, which ours counts",
        if fsync {
            ", --end_fsync=1 (its fsync's time counted, as our close's is)"
        } else {
            ""
        }
    )
}

/// Removes the files the workers made.
fn cleanup(location: &Location, workers: u64, a: &Options) -> anyhow::Result<()> {
    let mut names: Vec<String> = (0..workers)
        .flat_map(|r| a.patterns.iter().map(move |l| l.place(r, 0).0))
        .collect();
    names.extend((0..workers).map(|r| Layout::NToN.place(r, 0).0));
    names.sort();
    names.dedup();
    match location {
        Location::Local(dir) => {
            for n in names {
                match std::fs::remove_file(dir.join(&n)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        eprintln!("iobench: {n} stays: {e}");
                    }
                    _ => {}
                }
            }
        }
        Location::Remote { server, path } => {
            let mut c = a.client.connect(server)?;
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
