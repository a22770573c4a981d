//! One iobench worker: a process that runs the phases its coordinator
//! names, against a local directory or an `ml://` export, and answers with
//! the time each phase's create/open, transfer and close took.
//!
//! ```text
//!  coordinator ── setup (JSON: rank, target, client) ──► worker
//!              ◄── "ready"
//!  coordinator ── "write n-1 XFER SIZE\n" ──► worker
//!              ◄── "done OPEN_NS XFER_NS CLOSE_NS BYTES\n" (or "error …")
//! ```

use anyhow::{bail, Context};
use macrolink_files::copy::Location;
use macrolink_files::data::{self, Discard, Pattern};
use macrolink_files::proto::{Landing, Shape};
use macrolink_files::{Client, ClientSetup, Moved};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use crate::phase::{Op, Phase, Times};

/// What a worker process is told first, as one JSON line on its standard
/// input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setup {
    /// This worker's rank, 0..workers.
    pub rank: u64,
    /// Directory or `ml://host[:port]/dir`.
    pub target: String,
    /// fsync written files before closing them.
    pub fsync: bool,
    /// How to reach a server.
    pub client: ClientSetup,
}

fn times(m: Moved) -> Times {
    Times {
        open: m.open,
        transfer: m.transfer,
        close: m.close,
        bytes: m.bytes,
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
    pub fn open(target: &str, client: &ClientSetup) -> anyhow::Result<Target> {
        Ok(match target.parse::<Location>()? {
            Location::Local(p) => Target::Local(p),
            Location::Remote { server, path } => {
                let c = client.connect(&server)?;
                Target::Remote {
                    client: Box::new(c),
                    dir: path,
                }
            }
            Location::Striped { .. } => bail!("iobench runs against one server"),
        })
    }
}

/// Runs a worker process: its [`Setup`] from the first line of standard
/// input, then phases, one a line, until it closes; an answer a line.
pub fn serve() -> anyhow::Result<()> {
    let mut lines = std::io::stdin().lock().lines();
    let first = lines.next().context("no setup line")??;
    let setup: Setup = serde_json::from_str(&first).context("the setup line")?;
    let mut target = Target::open(&setup.target, &setup.client)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    for line in lines {
        let answer = match phase(&mut target, setup.rank, setup.fsync, &line?) {
            Ok(t) => t.line(),
            Err(e) => format!("error {e:#}"),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

/// Runs the phase a phase line names, as worker `rank`.
pub fn phase(target: &mut Target, rank: u64, fsync: bool, line: &str) -> anyhow::Result<Times> {
    let Phase {
        op,
        layout,
        xfer,
        size,
    } = line.parse()?;
    let (name, offset) = layout.place(rank, size);
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
    // Page-aligned (see `IoBuf`). A write's buffer is ready before the
    // clock starts, as an application's data is (and fio fills its write
    // buffers before it starts); a read's is faulted in by the first
    // reads, as fio's is (fio's first 32 MiB read into a fresh buffer took
    // 5-14 ms, its later ones 1.2-1.7).
    let mut buf = macrolink_fabric::IoBuf::new(xfer as usize)?;
    if op != Op::Read {
        buf.fill(0xa5);
    }
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
    Ok(times(moved))
}
