//! Writes that leave no page cache behind them, for the bulk of a large
//! copy: the bytes go through the page cache as ever (a reader of the
//! file sees them at once), but each write starts its own writeback and
//! its pages are freed as soon as they are on the device (`RWF_DONTCACHE`,
//! Linux 6.14). A copy then reuses a few pages over and over instead of
//! taking a fresh one for every 4 KiB of the file, and leaves the page
//! cache of the host as it found it, for what else runs there.
//!
//! ```text
//!  write_at(data, offset)
//!    ├─ offset below HEAD, or the flag refused ──► pwrite: cached, written back later
//!    └─ offset at or past HEAD ──────────────────► pwritev2(RWF_DONTCACHE): written back now, then freed
//! ```
//!
//! The first [`HEAD`] bytes of a file are written as ever and stay cached:
//! a file no larger is copied exactly as before. Where the kernel or the
//! file system does not take the flag (`EOPNOTSUPP`), the first refusal
//! sends that write and every later one through the page cache.
//!
//! What it buys: fresh page-cache pages are the dear part of a buffered
//! write where the kernel must find them first, most of all on a virtual
//! machine whose host takes freed memory back and faults every new page in
//! again. There, 1 GiB written in 1 MiB writes into a new file on ext4 ran
//! at 0.8 GB/s through the page cache and 3.1-3.2 GB/s uncached.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::io::ReadWriteFlags;

use crate::data::Sink;
use crate::direct::DirectFile;

/// Bytes at the start of a file written through the page cache and kept
/// there: files up to this size are written as the kernel writes any.
pub const HEAD: u64 = 64 << 20;

/// A file whose bytes past [`HEAD`] are written uncached.
#[derive(Debug)]
pub struct Uncached<'a> {
    file: &'a File,
    head: u64,
    refused: AtomicBool,
}

impl<'a> Uncached<'a> {
    /// `file`, written uncached from [`HEAD`] on.
    pub fn new(file: &'a File) -> Self {
        Self::from(file, HEAD)
    }

    /// `file`, written uncached from byte `head` on.
    pub fn from(file: &'a File, head: u64) -> Self {
        Uncached {
            file,
            head,
            refused: AtomicBool::new(false),
        }
    }

    /// Whether the kernel or the file system refused uncached writes, so
    /// that every byte went through the page cache.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// One `pwritev2` with `RWF_DONTCACHE`: the bytes written.
    fn write_once(&self, data: &[u8], offset: u64) -> io::Result<usize> {
        let flags = ReadWriteFlags::from_bits_retain(libc::RWF_DONTCACHE as u32);
        Ok(rustix::io::pwritev2(
            self.file,
            &[io::IoSlice::new(data)],
            offset,
            flags,
        )?)
    }
}

/// Whether an error of `pwritev2` says the flag is not taken here: by a
/// kernel before 6.14 (an unknown flag) or by a file system without it.
fn not_taken(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL))
}

impl Sink for Uncached<'_> {
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if offset < self.head || self.refused() {
            return self.file.write_all_at(data, offset);
        }
        let mut done = 0;
        while done < data.len() {
            let at = offset + done as u64;
            match self.write_once(&data[done..], at) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if not_taken(&e) => {
                    if !self.refused.swap(true, Ordering::Relaxed) {
                        tracing::debug!(
                            "uncached writes not taken here ({e}): through the page cache"
                        );
                    }
                    return self.file.write_all_at(&data[done..], at);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// How a copy writes a file it receives: past the page cache when asked
/// and the file system can, else uncached past its head unless the page
/// cache is to keep it all.
#[derive(Debug)]
pub enum Writes<'a> {
    /// `O_DIRECT` where the bytes line up (`--direct`).
    Direct(DirectFile),
    /// Uncached past [`HEAD`] (the default).
    Uncached(Uncached<'a>),
    /// Through the page cache, kept there (`--cache`, and devices).
    Cached(&'a File),
}

impl<'a> Writes<'a> {
    /// The way to write `file` (named `name` in warnings): `direct` asks
    /// for direct I/O, `cache` for every page kept; `device` for a file
    /// that is not a regular one (`/dev/null`), written as it is.
    pub fn choose(
        file: &'a File,
        direct: bool,
        cache: bool,
        device: bool,
        name: &dyn std::fmt::Display,
    ) -> Writes<'a> {
        if device {
            return Writes::Cached(file);
        }
        if let Some(d) = direct.then(|| DirectFile::wanted(file, name)).flatten() {
            return Writes::Direct(d);
        }
        if cache {
            Writes::Cached(file)
        } else {
            Writes::Uncached(Uncached::new(file))
        }
    }

    /// The sink to hand the streams.
    pub fn sink(&self) -> &dyn Sink {
        match self {
            Writes::Direct(d) => d,
            Writes::Uncached(u) => u,
            Writes::Cached(f) => *f,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Pattern;
    use macrolink_testbed::pages::{cached_bytes, cached_bytes_within};
    use std::path::PathBuf;
    use std::time::Duration;

    const MIB: usize = 1 << 20;

    /// A new file, readable and writable, in a directory of its own.
    fn new_file() -> (tempfile::TempDir, PathBuf, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        (dir, path, file)
    }

    #[test]
    fn every_byte_lands_whatever_the_offsets_and_the_head() {
        let (_dir, _, file) = new_file();
        let mut want = vec![0u8; 5 * MIB + 777];
        Pattern::fill(&mut want, 0);
        let w = Uncached::from(&file, 2 * MIB as u64);
        // Chunks out of order, one straddling the head, the tail short.
        for (from, to) in [
            (3 * MIB, 4 * MIB),
            (0, MIB),
            (MIB + MIB / 2, 3 * MIB),
            (5 * MIB, want.len()),
            (MIB, MIB + MIB / 2),
            (4 * MIB, 5 * MIB),
        ] {
            w.write_at(&want[from..to], from as u64).unwrap();
        }
        let mut got = vec![0u8; want.len()];
        file.read_exact_at(&mut got, 0).unwrap();
        assert!(got == want, "the file differs from what was written");
    }

    #[test]
    fn pages_past_the_head_leave_the_cache_where_the_kernel_takes_the_flag() {
        let (_dir, path, file) = new_file();
        let (head, len) = (4 * MIB as u64, 16 * MIB as u64);
        let w = Uncached::from(&file, head);
        let mut want = vec![0u8; len as usize];
        Pattern::fill(&mut want, 0);
        for (i, chunk) in want.chunks(MIB).enumerate() {
            w.write_at(chunk, (i * MIB) as u64).unwrap();
        }
        file.sync_all().unwrap();
        if w.refused() {
            // Not taken here: every page went through the page cache.
            assert_eq!(cached_bytes(&path).unwrap(), len);
            return;
        }
        // The head was written as ever and stays; the rest is freed once
        // written back, which the sync waited for.
        let at_most = head + (len - head) / 10;
        let kept = cached_bytes_within(&path, at_most, Duration::from_secs(5)).unwrap();
        assert!(
            kept >= head,
            "{kept} bytes cached, fewer than the head's {head}"
        );
        assert!(kept <= at_most, "{kept} bytes of {len} still cached");
        let mut got = vec![0u8; len as usize];
        file.read_exact_at(&mut got, 0).unwrap();
        assert!(got == want, "the bytes read back differ");
    }

    #[test]
    fn direct_is_taken_when_asked_cache_keeps_pages_and_devices_are_written_as_they_are() {
        let (_dir, _, file) = new_file();
        let kind = |w: &Writes| match w {
            Writes::Direct(_) => "direct",
            Writes::Uncached(_) => "uncached",
            Writes::Cached(_) => "cached",
        };
        // (direct, cache, device): the way taken where the file system
        // does direct I/O, and where it does not (tmpfs before 6.6).
        for (asked, with, without) in [
            ((false, false, false), "uncached", "uncached"),
            ((false, true, false), "cached", "cached"),
            ((false, false, true), "cached", "cached"),
            ((true, true, true), "cached", "cached"),
            ((true, false, false), "direct", "uncached"),
            ((true, true, false), "direct", "cached"),
        ] {
            let (direct, cache, device) = asked;
            let got = kind(&Writes::choose(&file, direct, cache, device, &"f"));
            assert!(got == with || got == without, "{asked:?}: {got}");
        }
    }
}
