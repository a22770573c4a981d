//! Writes past the page cache (`O_DIRECT`), for `cp --direct`: the bytes
//! go from a buffer of ours to the device, not into page-cache pages that
//! the kernel must find, fill and later write back. Worth it for files
//! larger than memory, or where filling fresh page-cache pages is slower
//! than the device (a virtual machine whose host takes freed memory back).
//!
//! ```text
//!  write_at(data, offset)
//!    ├─ the aligned whole blocks ──► copied into an aligned buffer ──► pwrite, O_DIRECT
//!    └─ a part out of line (the file's last bytes) ──────────────────► pwrite, page cache
//! ```
//!
//! Direct writes need the buffer's address, the offset and the length to
//! be multiples of the device's block; [`ALIGN`] (4 KiB) is one for every
//! common device. Chunks start at multiples of the chunk size, so only a
//! file's tail goes through the page cache. The buffers are kept and
//! reused, one per concurrent writer.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::Mutex;

use crate::data::Sink;

/// The alignment of direct writes: address, offset and length.
pub const ALIGN: usize = 4096;

/// A file written with direct I/O where the bytes line up, through the
/// page cache where they do not.
#[derive(Debug)]
pub struct DirectFile {
    direct: File,
    buffered: File,
    /// Aligned buffers not in use (a `Vec` a block longer than needed,
    /// used from its first aligned byte).
    spare: Mutex<Vec<Vec<u8>>>,
}

impl DirectFile {
    /// Opens `file` a second time, for direct writes (through
    /// `/proc/self/fd`: the same file, whatever its name now, with no path
    /// to resolve again), beside the ordinary one, which the parts out of
    /// line go through. `Ok(None)` when the file system does not do direct
    /// I/O (tmpfs before Linux 6.6, some FUSE ones).
    pub fn open(file: &File) -> io::Result<Option<DirectFile>> {
        let again = format!("/proc/self/fd/{}", file.as_raw_fd());
        match OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(again)
        {
            Ok(direct) => Ok(Some(DirectFile {
                direct,
                buffered: file.try_clone()?,
                spare: Mutex::new(Vec::new()),
            })),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`open`](Self::open) for a copy that asked for direct writes:
    /// where the file system does not do them, or the second descriptor
    /// cannot be had, says so and gives `None`, and the copy goes on
    /// through the page cache.
    pub fn wanted(file: &File, name: &dyn std::fmt::Display) -> Option<DirectFile> {
        let d = DirectFile::open(file).unwrap_or_else(|e| {
            tracing::warn!("{name}: direct I/O failed ({e})");
            None
        });
        if d.is_none() {
            tracing::warn!("{name}: written through the page cache, not past it");
        }
        d
    }

    fn write_direct(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let spare = self.spare.lock().map(|mut s| s.pop());
        let mut buf = spare.ok().flatten().unwrap_or_default();
        if buf.len() < data.len() + ALIGN {
            buf = vec![0u8; data.len() + ALIGN];
        }
        let at = buf.as_ptr().align_offset(ALIGN);
        let aligned = &mut buf[at..at + data.len()];
        aligned.copy_from_slice(data);
        let r = self.direct.write_all_at(aligned, offset);
        if let Ok(mut s) = self.spare.lock() {
            s.push(buf);
        }
        r
    }
}

impl Sink for DirectFile {
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let whole = if offset.is_multiple_of(ALIGN as u64) {
            data.len() / ALIGN * ALIGN
        } else {
            0
        };
        let (lined, rest) = data.split_at(whole);
        if !lined.is_empty() {
            self.write_direct(lined, offset)?;
        }
        if !rest.is_empty() {
            self.buffered.write_all_at(rest, offset + whole as u64)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Pattern;

    #[test]
    fn aligned_chunks_and_a_ragged_tail_land_where_they_belong() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let path = dir.path().join("f");
        let buffered = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let f = DirectFile::open(&buffered)
            .unwrap()
            .unwrap_or_else(|| panic!("{}: no direct I/O here", path.display()));
        // 1 MiB chunks of a file of 3 MiB and 1,000 bytes, out of order,
        // and a piece that starts out of line.
        let len = (3 << 20) + 1000;
        let mut want = vec![0u8; len];
        Pattern::fill(&mut want, 0);
        for (at, n) in [(2 << 20, 1 << 20), (3 << 20, 1000), (0, 1 << 20)] {
            f.write_at(&want[at..at + n], at as u64).unwrap();
        }
        let odd = (1 << 20) + 100;
        f.write_at(&want[(1 << 20)..odd], 1 << 20).unwrap();
        f.write_at(&want[odd..2 << 20], odd as u64).unwrap();
        let mut got = vec![0u8; len];
        buffered.read_exact_at(&mut got, 0).unwrap();
        assert!(got == want, "the file differs from what was written");
        assert_eq!(buffered.metadata().unwrap().len(), len as u64);
        // The buffers were given back for the next writes.
        assert!(!f.spare.lock().unwrap().is_empty());
    }
}
