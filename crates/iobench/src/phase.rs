//! What one phase of the benchmark is, as the coordinator names it to its
//! workers, and what a worker answers: plain lines, parsed here.
//!
//! ```text
//!  coordinator ── "write n-1 XFER SIZE" ──► worker
//!              ◄── "done OPEN_NS XFER_NS CLOSE_NS BYTES" (or "error …")
//! ```

use anyhow::{bail, Context};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

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

impl FromStr for Op {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Op> {
        Ok(match s {
            "write" => Op::Write,
            "read" => Op::Read,
            "randwrite" => Op::RandWrite,
            _ => bail!("unknown operation {s:?}"),
        })
    }
}

/// Who touches which file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// A file per worker.
    NToN,
    /// One shared file, a region per worker.
    NTo1,
}

impl Layout {
    /// Its name in phase lines, tables and on the command line.
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

impl FromStr for Layout {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Layout> {
        Ok(match s {
            "n-n" => Layout::NToN,
            "n-1" => Layout::NTo1,
            _ => bail!("unknown pattern {s:?} (n-n or n-1)"),
        })
    }
}

/// One phase: every worker does `op` in `layout` on `size` bytes in
/// transfers of `xfer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phase {
    /// What each worker does.
    pub op: Op,
    /// Which files.
    pub layout: Layout,
    /// Transfer (or block) size.
    pub xfer: u64,
    /// Bytes per worker.
    pub size: u64,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Phase {
            op,
            layout,
            xfer,
            size,
        } = self;
        write!(f, "{} {} {xfer} {size}", op.name(), layout.name())
    }
}

impl FromStr for Phase {
    type Err = anyhow::Error;
    fn from_str(line: &str) -> anyhow::Result<Phase> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let [op, layout, xfer, size] = w[..] else {
            bail!("bad phase line {line:?}");
        };
        let p = Phase {
            op: op.parse()?,
            layout: layout.parse()?,
            xfer: xfer.parse()?,
            size: size.parse()?,
        };
        if p.xfer == 0 {
            bail!("zero transfer size");
        }
        Ok(p)
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
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn phases_print_and_parse_back() {
        let p = Phase {
            op: Op::RandWrite,
            layout: Layout::NTo1,
            xfer: 4096,
            size: 1 << 20,
        };
        assert_eq!(p.to_string(), "randwrite n-1 4096 1048576");
        assert_eq!(p.to_string().parse::<Phase>().unwrap(), p);
        for bad in [
            "write n-n 0 10",
            "copy n-n 1 1",
            "write n-2 1 1",
            "write n-n 1",
        ] {
            assert!(bad.parse::<Phase>().is_err(), "{bad}");
        }
        assert_eq!(Layout::NTo1.place(3, 100), ("iobench.shared".into(), 300));
        assert_eq!(Layout::NToN.place(3, 100), ("iobench.3".into(), 0));
    }
}
