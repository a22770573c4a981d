//! One writer per name: a file being written under its temporary name is
//! locked (`flock`, exclusive) by the transfer that writes it, from before
//! its first byte until it is renamed into place or removed. A second
//! transfer to the same name finds the lock taken and is refused as busy;
//! it never truncates, writes or removes what the first one owns.
//!
//! ```text
//!  open .NAME.ml-part (create, no truncate) ─► try_lock ─► taken: Busy
//!                                                └─► ours: still the file of that name?
//!                                                      no (renamed away meanwhile): again
//!                                                      yes: truncate unless resuming or empty; write; rename; unlock
//! ```

use std::fs::{File, TryLockError};
use std::io;
use std::os::unix::fs::MetadataExt;

/// Why a temporary file could not be claimed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    /// Another transfer is writing it.
    #[error("another transfer is writing this name")]
    Busy,
    /// Opening or locking it failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Device and inode of a file.
pub type Identity = (u64, u64);

/// Opens (with `open`, which creates it and must not truncate it) and
/// locks the temporary file; `named` tells which file the temporary name
/// holds now. Truncated to nothing unless `keep` (a resume) or it is
/// empty already.
pub fn claim(
    open: &dyn Fn() -> io::Result<File>,
    named: &dyn Fn() -> io::Result<Identity>,
    keep: bool,
) -> Result<File, ClaimError> {
    for _ in 0..8 {
        let f = open()?;
        match f.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(ClaimError::Busy),
            Err(TryLockError::Error(e)) => return Err(ClaimError::Io(e)),
        }
        let m = f.metadata()?;
        // The one who held it may have renamed it into place between our
        // open and our lock: then it is a final file now, not ours.
        if named().ok() == Some((m.dev(), m.ino())) {
            // A file that is empty already is left alone: a truncation,
            // even to the size it has, marks it on ext4 to be flushed when
            // closed (`auto_da_alloc`), and the close of 1 GiB written
            // after it then took 0.4 s of the copy.
            if !keep && m.len() > 0 {
                f.set_len(0)?;
            }
            return Ok(f);
        }
    }
    Err(ClaimError::Io(io::Error::other(
        "the temporary file kept being replaced",
    )))
}

/// Device and inode of the file at `path`, not following a final link.
pub fn identity(path: &std::path::Path) -> io::Result<Identity> {
    let m = std::fs::symlink_metadata(path)?;
    Ok((m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::io::Write;

    fn open(p: &std::path::Path) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .read(true)
            .create(true)
            .truncate(false)
            .open(p)
    }

    #[test]
    fn a_second_writer_is_busy_and_touches_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(".f.ml-part");
        let mut first = claim(&|| open(&p), &|| identity(&p), false).unwrap();
        first.write_all(b"first writer's bytes").unwrap();
        assert!(matches!(
            claim(&|| open(&p), &|| identity(&p), false),
            Err(ClaimError::Busy)
        ));
        assert_eq!(
            std::fs::read(&p).unwrap(),
            b"first writer's bytes",
            "not truncated"
        );
        // Renamed into place and closed: the name is free for the next.
        std::fs::rename(&p, d.path().join("f")).unwrap();
        drop(first);
        let next = claim(&|| open(&p), &|| identity(&p), false).unwrap();
        assert_eq!(next.metadata().unwrap().len(), 0);
        assert_eq!(
            std::fs::read(d.path().join("f")).unwrap(),
            b"first writer's bytes"
        );
    }

    #[test]
    fn a_file_renamed_away_before_the_lock_is_not_taken_for_ours() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(".g.ml-part");
        std::fs::write(&p, b"landed").unwrap();
        let moved = d.path().join("g");
        // The first open finds the old file, which then moves into place.
        let opens = std::cell::Cell::new(0);
        let f = claim(
            &|| {
                let f = open(&p)?;
                if opens.replace(opens.get() + 1) == 0 {
                    std::fs::rename(&p, &moved)?;
                }
                Ok(f)
            },
            &|| identity(&p),
            false,
        )
        .unwrap();
        assert_eq!(opens.get(), 2);
        assert_eq!(
            std::fs::read(&moved).unwrap(),
            b"landed",
            "the landed file is untouched"
        );
        assert_eq!(f.metadata().unwrap().ino(), identity(&p).unwrap().1);
        // Resuming keeps what a file holds.
        drop(f);
        std::fs::write(&p, b"partial").unwrap();
        let r = claim(&|| open(&p), &|| identity(&p), true).unwrap();
        assert_eq!(r.metadata().unwrap().len(), 7);
    }

    #[test]
    fn a_leftover_is_emptied_and_an_empty_file_is_not_truncated_again() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(".h.ml-part");
        std::fs::write(&p, b"left by a copy that died").unwrap();
        let f = claim(&|| open(&p), &|| identity(&p), false).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 0, "a leftover is emptied");
        drop(f);
        // A truncation sets the time of last change even when the size
        // stays: an empty file's time from an hour ago tells none came.
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        open(&p).unwrap().set_modified(hour_ago).unwrap();
        let f = claim(&|| open(&p), &|| identity(&p), false).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 0);
        assert_eq!(
            f.metadata().unwrap().modified().unwrap(),
            hour_ago,
            "an empty file was truncated"
        );
    }
}
