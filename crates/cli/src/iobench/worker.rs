//! One iobench worker: a process that runs the phases its coordinator
//! names, against a local directory or an `ml://` export, and answers with
//! the time each phase's create/open, transfer and close took.
//!
//! ```text
//!  coordinator ── "write n-1 XFER SIZE\n" ──► worker
//!              ◄── "done OPEN_NS XFER_NS CLOSE_NS BYTES\n" (or "error …")
//! ```

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use macrolink_files::copy::Location;
use macrolink_files::data::{self, Discard, Pattern};
use macrolink_files::proto::{Landing, Shape};
use macrolink_files::{Client, Moved};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::files::ClientArgs;

/// Arguments of `macrolink iobench-worker`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// This worker's rank, 0..workers.
    #[arg(long)]
    pub rank: u64,
    /// Directory or ml://host[:port]/dir.
    pub target: String,
    /// Skip fsync before close.
    #[arg(long)]
    pub no_fsync: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// The operations of a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Sequential write.
    Write,
    /// Sequential read.
    Read,
    /// Writes of `xfer`-byte blocks at random offsets (IOzone's random write).
    RandWrite,
}

impl Op {
    /// Its name in phase lines and tables.
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::RandWrite => "randwrite",
        }
    }
}

/// Who touches which file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// A file per worker.
    #[value(name = "n-n")]
    NToN,
    /// One shared file, a region per worker.
    #[value(name = "n-1")]
    NTo1,
}

impl Layout {
    /// Its name in phase lines and tables.
    pub fn name(self) -> &'static str {
        match self {
            Layout::NToN => "n-n",
            Layout::NTo1 => "n-1",
        }
    }

    /// The file and offset of worker `rank` for `size` bytes each.
    pub fn place(self, rank: u64, size: u64) -> (String, u64) {
        match self {
            Layout::NToN => (format!("iobench.{rank}"), 0),
            Layout::NTo1 => ("iobench.shared".into(), rank * size),
        }
    }
}

/// One phase's times.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Times {
    /// Create and open.
    pub open: Duration,
    /// The data.
    pub transfer: Duration,
    /// fsync and close.
    pub close: Duration,
    /// Bytes moved.
    pub bytes: u64,
}

impl Times {
    /// The line a worker answers with.
    pub fn line(&self) -> String {
        format!(
            "done {} {} {} {}",
            self.open.as_nanos(),
            self.transfer.as_nanos(),
            self.close.as_nanos(),
            self.bytes
        )
    }

    /// Parses a worker's answer.
    pub fn parse(line: &str) -> anyhow::Result<Times> {
        let mut w = line.split_whitespace();
        match w.next() {
            Some("done") => {}
            Some("error") => bail!("{}", line.trim_start_matches("error").trim()),
            _ => bail!("worker said {line:?}"),
        }
        let mut num = || -> anyhow::Result<u64> { Ok(w.next().context("short answer")?.parse()?) };
        Ok(Times {
            open: Duration::from_nanos(num()?),
            transfer: Duration::from_nanos(num()?),
            close: Duration::from_nanos(num()?),
            bytes: num()?,
        })
    }

    fn from_moved(m: Moved) -> Times {
        Times {
            open: m.open,
            transfer: m.transfer,
            close: m.close,
            bytes: m.bytes,
        }
    }
}

/// What a worker works on: a directory, or a directory of an export.
#[derive(Debug)]
pub enum Target {
    /// A local (or shared) directory.
    Local(PathBuf),
    /// A directory under an export.
    Remote {
        /// Connection to the server.
        client: Box<Client>,
        /// The directory.
        dir: String,
    },
}

impl Target {
    /// Opens `target` (a directory or ml://host/dir).
    pub fn open(target: &str, client: &ClientArgs) -> anyhow::Result<Target> {
        Ok(match target.parse::<Location>()? {
            Location::Local(p) => Target::Local(p),
            Location::Remote { server, path } => {
                let c = Client::connect(&server, &client.secret.load()?, &client.options()?)?;
                Target::Remote {
                    client: Box::new(c),
                    dir: path,
                }
            }
            Location::Striped { .. } => bail!("iobench runs against one server"),
        })
    }
}

/// Runs a worker: phases from stdin until it closes.
pub fn run(a: Args) -> anyhow::Result<()> {
    let mut target = Target::open(&a.target, &a.client)?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    for line in stdin.lock().lines() {
        let line = line?;
        let answer = match phase(&mut target, a.rank, !a.no_fsync, &line) {
            Ok(t) => t.line(),
            Err(e) => format!("error {e:#}"),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

/// A phase line: `OP PATTERN XFER SIZE`.
pub fn phase_line(op: Op, pattern: Layout, xfer: u64, size: u64) -> String {
    format!("{} {} {xfer} {size}", op.name(), pattern.name())
}

/// Runs the phase a phase line names, as worker `rank`.
pub fn phase(target: &mut Target, rank: u64, fsync: bool, line: &str) -> anyhow::Result<Times> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let [op, pattern, xfer, size] = w[..] else {
        bail!("bad phase line {line:?}");
    };
    let op = match op {
        "write" => Op::Write,
        "read" => Op::Read,
        "randwrite" => Op::RandWrite,
        _ => bail!("unknown operation {op}"),
    };
    let pattern = match pattern {
        "n-n" => Layout::NToN,
        "n-1" => Layout::NTo1,
        _ => bail!("unknown pattern {pattern}"),
    };
    let (xfer, size): (u64, u64) = (xfer.parse()?, size.parse()?);
    if xfer == 0 {
        bail!("zero transfer size");
    }
    let (name, offset) = pattern.place(rank, size);
    match target {
        Target::Local(dir) => local(op, &dir.join(name), offset, xfer, size, fsync, rank),
        Target::Remote { client, dir } => {
            let path = if dir.is_empty() {
                name
            } else {
                format!("{}/{name}", dir.trim_end_matches('/'))
            };
            remote(client, op, &path, offset, xfer, size, fsync)
        }
    }
}

fn local(
    op: Op,
    path: &std::path::Path,
    offset: u64,
    xfer: u64,
    size: u64,
    fsync: bool,
    rank: u64,
) -> anyhow::Result<Times> {
    // The buffer is ready before the clock starts, as an application's data
    // is (and fio's buffers are): page-aligned (see `IoBuf`), its pages
    // touched now, not faulted in by the first transfer.
    let mut buf = macrolink_fabric::IoBuf::new(xfer as usize)?;
    buf.fill(0xa5);
    let t0 = Instant::now();
    let f: File = match op {
        Op::Write | Op::RandWrite => OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path),
        Op::Read => File::open(path),
    }
    .with_context(|| path.display().to_string())?;
    let t1 = Instant::now();
    let pieces: Vec<u64> = match op {
        Op::RandWrite => {
            let mut v: Vec<u64> = (0..size / xfer).map(|i| i * xfer).collect();
            v.shuffle(&mut rand::rngs::StdRng::seed_from_u64(rank));
            v
        }
        _ => (0..size.div_ceil(xfer)).map(|i| i * xfer).collect(),
    };
    let mut bytes = 0;
    for rel in pieces {
        let n = xfer.min(size - rel) as usize;
        let at = offset + rel;
        if op == Op::Read {
            f.read_exact_at(&mut buf[..n], at)
                .with_context(|| format!("{}: read at {at}", path.display()))?;
        } else {
            Pattern::fill(&mut buf[..n], at);
            f.write_all_at(&buf[..n], at)
                .with_context(|| format!("{}: write at {at}", path.display()))?;
        }
        bytes += n as u64;
    }
    let t2 = Instant::now();
    if fsync && op != Op::Read {
        f.sync_data()?;
    }
    drop(f);
    Ok(Times {
        open: t1 - t0,
        transfer: t2 - t1,
        close: t2.elapsed(),
        bytes,
    })
}

fn remote(
    c: &mut Client,
    op: Op,
    path: &str,
    offset: u64,
    xfer: u64,
    size: u64,
    fsync: bool,
) -> anyhow::Result<Times> {
    let chunk = u32::try_from(xfer).context("transfer size over 4 GiB")?;
    let shape = Shape {
        offset,
        len: size,
        chunk,
        slots: (64 << 20) / chunk.max(1),
    };
    let shape = Shape {
        slots: shape.slots.clamp(2, 8),
        ..shape
    };
    let shared = data::Shared::default();
    let moved = match op {
        Op::Write => c.put(
            path,
            offset + size,
            shape,
            1,
            fsync,
            Landing::InPlace,
            &Pattern,
            &shared,
        )?,
        Op::Read => c.get(path, shape, 1, &Discard, &shared, &mut |_, _| Ok(()))?,
        Op::RandWrite => bail!("random writes run against local directories only"),
    };
    Ok(Times::from_moved(moved))
}
