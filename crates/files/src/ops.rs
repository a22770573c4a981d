//! File operations on an export, every path resolved beneath the root's
//! directory handle: nothing here can reach outside the root, whatever the
//! client names or a symbolic link points at.

use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt};
use std::io;
use std::path::Path;

use crate::confine::{self, Refused};
use crate::partial::{self, ClaimError};
use crate::proto::{Code, Kind, Meta};

/// A refusal to send back: the code and words for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Why.
    pub code: Code,
    /// For a person.
    pub message: String,
}

impl Failure {
    /// A failure with `code`.
    pub fn new(code: Code, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// The failure an I/O error on `path` means.
    pub fn io(path: &str, e: &io::Error) -> Failure {
        Failure::new(code_of(e), format!("{path}: {}", describe(e)))
    }
}

impl From<Refused> for Failure {
    fn from(r: Refused) -> Failure {
        Failure::new(Code::Escape, r.to_string())
    }
}

/// cap-std reports a path that resolves outside the root as permission
/// denied, with these words.
fn is_escape(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied && e.to_string().contains("outside of the")
}

fn describe(e: &io::Error) -> String {
    if is_escape(e) {
        "leads outside the export root".into()
    } else {
        e.to_string()
    }
}

/// The protocol code for an I/O error.
pub fn code_of(e: &io::Error) -> Code {
    use io::ErrorKind as K;
    if is_escape(e) {
        return Code::Escape;
    }
    match e.kind() {
        K::NotFound => Code::NotFound,
        K::PermissionDenied => Code::Denied,
        K::AlreadyExists => Code::Exists,
        K::DirectoryNotEmpty => Code::NotEmpty,
        K::NotADirectory | K::IsADirectory => Code::WrongKind,
        K::StorageFull | K::QuotaExceeded | K::FileTooLarge => Code::NoSpace,
        _ => Code::Io,
    }
}

/// An export: its root directory and whether it takes writes.
#[derive(Debug)]
pub struct Export {
    root: Dir,
    read_only: bool,
}

/// Result of an operation on the export.
pub type OpResult<T> = Result<T, Failure>;

fn meta_of(name: String, m: &cap_std::fs::Metadata) -> Meta {
    let kind = if m.is_file() {
        Kind::File
    } else if m.is_dir() {
        Kind::Dir
    } else {
        Kind::Other
    };
    Meta {
        name,
        kind,
        size: m.len(),
        mtime: m.mtime(),
        mode: m.mode() & 0o7777,
    }
}

fn name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| ".".into())
}

impl Export {
    /// Opens the export at `root`.
    pub fn open(root: &Path, read_only: bool) -> io::Result<Export> {
        let root = Dir::open_ambient_dir(root, cap_std::ambient_authority())?;
        Ok(Export { root, read_only })
    }

    /// Whether the export refuses writes.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Refuses when the export is read-only.
    pub fn writable(&self, path: &str) -> OpResult<()> {
        if self.read_only {
            return Err(Failure::new(
                Code::ReadOnly,
                format!("{path}: the export is read-only"),
            ));
        }
        Ok(())
    }

    /// Metadata of `path` (symbolic links followed, inside the root).
    pub fn stat(&self, path: &str) -> OpResult<Meta> {
        let rel = confine::relative(path)?;
        let m = self
            .root
            .metadata(&rel)
            .map_err(|e| Failure::io(path, &e))?;
        Ok(meta_of(name_of(&rel), &m))
    }

    /// Entries of directory `path`, sorted by name.
    pub fn list(&self, path: &str) -> OpResult<Vec<Meta>> {
        let rel = confine::relative(path)?;
        let fail = |e: io::Error| Failure::io(path, &e);
        let mut out = Vec::new();
        for entry in self.root.read_dir(&rel).map_err(fail)? {
            let entry = entry.map_err(fail)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let m = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(fail(e)),
            };
            out.push(meta_of(name, &m));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Makes directory `path`.
    pub fn mkdir(&self, path: &str, parents: bool) -> OpResult<()> {
        self.writable(path)?;
        let rel = confine::relative(path)?;
        let r = if parents {
            self.root.create_dir_all(&rel)
        } else {
            self.root.create_dir(&rel)
        };
        r.map_err(|e| Failure::io(path, &e))
    }

    /// Removes `path`: a file, an empty directory, or with `recursive` any
    /// directory.
    pub fn remove(&self, path: &str, recursive: bool) -> OpResult<()> {
        self.writable(path)?;
        let rel = confine::relative(path)?;
        if rel == Path::new(".") {
            return Err(Failure::new(
                Code::Denied,
                "the export root cannot be removed",
            ));
        }
        let fail = |e: io::Error| Failure::io(path, &e);
        let m = self.root.symlink_metadata(&rel).map_err(fail)?;
        let r = if !m.is_dir() {
            self.root.remove_file(&rel)
        } else if recursive {
            self.root.remove_dir_all(&rel)
        } else {
            self.root.remove_dir(&rel)
        };
        r.map_err(fail)
    }

    /// Opens file `path` to read.
    pub fn open_read(&self, path: &str) -> OpResult<std::fs::File> {
        let mut o = OpenOptions::new();
        o.read(true);
        self.open_regular(path, o)
    }

    /// Opens `path` with `o`, if it is a regular file: only regular files
    /// and directories are served. The open itself does not wait (a FIFO
    /// would wait for a writer for ever, holding the session).
    fn open_regular(&self, path: &str, mut o: OpenOptions) -> OpResult<std::fs::File> {
        let rel = confine::relative(path)?;
        let fail = |e: io::Error| Failure::io(path, &e);
        o.custom_flags(libc::O_NONBLOCK);
        let f = self.root.open_with(&rel, &o).map_err(fail)?;
        if !f.metadata().map_err(fail)?.is_file() {
            return Err(Failure::new(
                Code::WrongKind,
                format!("{path}: not a regular file (only files and directories are served)"),
            ));
        }
        // Reads and writes of a regular file do not heed O_NONBLOCK.
        Ok(f.into_std())
    }

    /// The partial (temporary) name of file `path`, under the root.
    pub fn partial_of(&self, path: &str) -> OpResult<std::path::PathBuf> {
        let rel = confine::relative(path)?;
        confine::partial_name(&rel)
            .ok_or_else(|| Failure::new(Code::WrongKind, format!("{path}: not a file name")))
    }

    /// Opens the partial file of `path` to write: truncated unless
    /// `resume`. The final name must not be a directory.
    pub fn open_partial(&self, path: &str, resume: bool) -> OpResult<std::fs::File> {
        self.writable(path)?;
        let rel = confine::relative(path)?;
        if let Ok(m) = self.root.metadata(&rel) {
            if m.is_dir() {
                return Err(Failure::new(
                    Code::WrongKind,
                    format!("{path}: is a directory"),
                ));
            }
        }
        let part = self.partial_of(path)?;
        let mut o = OpenOptions::new();
        o.write(true).read(true).create(true).truncate(false);
        let open = || Ok(self.root.open_with(&part, &o)?.into_std());
        let named = || {
            let m = self.root.symlink_metadata(&part)?;
            Ok((m.dev(), m.ino()))
        };
        partial::claim(&open, &named, resume).map_err(|e| match e {
            ClaimError::Busy => Failure::new(
                Code::Busy,
                format!(
                    "{path}: another upload to this name is in progress; try again when it ends"
                ),
            ),
            ClaimError::Io(e) => Failure::io(path, &e),
        })
    }

    /// Opens file `path` to write in place, creating it if missing.
    pub fn open_in_place(&self, path: &str) -> OpResult<std::fs::File> {
        self.writable(path)?;
        let mut o = OpenOptions::new();
        o.write(true).read(true).create(true);
        self.open_regular(path, o)
    }

    /// Renames the partial file of `path` over `path`; with `sync`, makes
    /// the rename durable too.
    pub fn commit_partial(&self, path: &str, sync: bool) -> OpResult<()> {
        let rel = confine::relative(path)?;
        let part = self.partial_of(path)?;
        let fail = |e: io::Error| Failure::io(path, &e);
        self.root.rename(&part, &self.root, &rel).map_err(fail)?;
        if sync {
            let parent = rel.parent().filter(|p| !p.as_os_str().is_empty());
            let dir = match parent {
                Some(p) => self.root.open_dir(p).map_err(fail)?,
                None => self.root.try_clone().map_err(fail)?,
            };
            dir.into_std_file().sync_all().map_err(fail)?;
        }
        Ok(())
    }

    /// Removes the partial file of `path`, if any.
    pub fn drop_partial(&self, path: &str) {
        if let Ok(part) = self.partial_of(path) {
            let _ = self.root.remove_file(part);
        }
    }

    /// Opens the partial file of `path` to read, for its digests.
    pub fn open_partial_read(&self, path: &str) -> OpResult<std::fs::File> {
        let part = self.partial_of(path)?;
        let f = self.root.open(&part).map_err(|e| Failure::io(path, &e))?;
        Ok(f.into_std())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_out_of_the_root_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(d.path().join("secret"), b"outside").unwrap();
        std::fs::write(root.join("inside"), b"in").unwrap();
        std::os::unix::fs::symlink("../secret", root.join("out")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
        std::os::unix::fs::symlink("inside", root.join("ok")).unwrap();
        let x = Export::open(&root, false).unwrap();
        assert_eq!(x.open_read("out").unwrap_err().code, Code::Escape);
        assert_eq!(x.stat("etc/passwd").unwrap_err().code, Code::Escape);
        assert_eq!(x.list("etc").unwrap_err().code, Code::Escape);
        assert_eq!(x.open_in_place("etc/evil").unwrap_err().code, Code::Escape);
        assert_eq!(x.stat("../secret").unwrap_err().code, Code::Escape);
        assert_eq!(x.stat("/etc").unwrap_err().code, Code::Escape);
        assert_eq!(x.stat("ok").unwrap().size, 2);
        assert_eq!(x.stat("missing").unwrap_err().code, Code::NotFound);
        assert!(!Path::new("/etc/evil").exists());
    }

    #[test]
    fn read_only_exports_refuse_writes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        let x = Export::open(d.path(), true).unwrap();
        assert_eq!(x.mkdir("d", false).unwrap_err().code, Code::ReadOnly);
        assert_eq!(x.remove("f", false).unwrap_err().code, Code::ReadOnly);
        assert_eq!(x.open_partial("g", false).unwrap_err().code, Code::ReadOnly);
        assert_eq!(x.open_in_place("g").unwrap_err().code, Code::ReadOnly);
        assert!(d.path().join("f").exists());
        assert_eq!(x.list(".").unwrap().len(), 1);
    }
}
