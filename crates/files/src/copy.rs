//! What `macrolink cp` does: copies between a local path and an `ml://`
//! URL, files or (with `recursive`) directories, verified end to end,
//! written under a temporary name and renamed into place once complete.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::auth::Secret;
use crate::client::{Client, ClientOptions};
use crate::confine::partial_name;
use crate::data;
use crate::error::{Error, Result};
use crate::proto::{Code, Kind, Landing, Shape};
use crate::sums;

/// Contact port of a server when a URL names none.
pub const DEFAULT_PORT: u16 = 7130;
/// URL scheme of the file service.
pub const SCHEME: &str = "ml://";

/// One side of a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A path on this host.
    Local(PathBuf),
    /// A path under a server's export.
    Remote {
        /// `host:port` of the server.
        server: String,
        /// Path under the export root (no leading slash).
        path: String,
    },
}

impl FromStr for Location {
    type Err = Error;

    /// `ml://host[:port]/path` or a local path. The path of a URL is
    /// relative to the export root: `ml://h/a/b` names `a/b` there.
    fn from_str(s: &str) -> Result<Location> {
        let Some(rest) = s.strip_prefix(SCHEME) else {
            return Ok(Location::Local(PathBuf::from(s)));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(Error::Usage(format!("{s}: no host in the URL")));
        }
        let has_port = match authority.rfind(':') {
            Some(i) => !authority[i..].contains(']'),
            None => false,
        };
        let server = if has_port {
            authority.to_string()
        } else {
            format!("{authority}:{DEFAULT_PORT}")
        };
        Ok(Location::Remote {
            server,
            path: path.to_string(),
        })
    }
}

/// How to copy.
#[derive(Clone, Debug)]
pub struct CopyOptions {
    /// Parallel data streams per file.
    pub streams: u32,
    /// Chunk size.
    pub chunk: u32,
    /// Chunks in flight per stream.
    pub slots: u32,
    /// Continue from a partial copy left by an interrupted one.
    pub resume: bool,
    /// Make the data durable before the copy counts as done.
    pub sync: bool,
    /// Copy directories with everything in them.
    pub recursive: bool,
    /// Bytes per second a file's streams may move together, if limited.
    pub limit_rate: Option<u64>,
    /// Client settings.
    pub client: ClientOptions,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            streams: 1,
            chunk: 1 << 20,
            slots: 8,
            resume: false,
            sync: false,
            recursive: false,
            limit_rate: None,
            client: ClientOptions::default(),
        }
    }
}

/// Progress for a person: bytes done and bytes known to come.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes moved.
    pub done: Arc<AtomicU64>,
    /// Bytes of the files started so far.
    pub total: AtomicU64,
    /// The file being copied.
    pub current: Mutex<String>,
}

/// What a copy did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CopyReport {
    /// Files copied.
    pub files: u64,
    /// Bytes moved (not counting resumed prefixes).
    pub bytes: u64,
    /// Bytes skipped because a partial copy already held them.
    pub resumed: u64,
    /// Wall time, seconds.
    pub secs: f64,
}

/// Copies with one set of options, keeping one connection per server.
#[derive(Debug)]
pub struct Copier {
    secret: Secret,
    opts: CopyOptions,
    clients: HashMap<String, Client>,
    /// Progress, for a bar.
    pub progress: Arc<Progress>,
    report: CopyReport,
}

fn join_remote(dir: &str, name: &str) -> String {
    let dir = dir.trim_end_matches('/');
    if dir.is_empty() || dir == "." {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn local_name(p: &Path) -> Result<String> {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::Usage(format!("{}: names no file", p.display())))
}

impl Copier {
    /// A copier authenticating with `secret`.
    pub fn new(secret: Secret, opts: CopyOptions) -> Copier {
        Copier {
            secret,
            opts,
            clients: HashMap::new(),
            progress: Arc::new(Progress::default()),
            report: CopyReport::default(),
        }
    }

    /// The connection to `server`, made on first use.
    pub fn client(&mut self, server: &str) -> Result<&mut Client> {
        if !self.clients.contains_key(server) {
            let c = Client::connect(server, &self.secret, &self.opts.client)?;
            self.clients.insert(server.to_string(), c);
        }
        Ok(self.clients.get_mut(server).expect("inserted above"))
    }

    /// Copies `src` to `dst`.
    pub fn copy(&mut self, src: &Location, dst: &Location) -> Result<CopyReport> {
        let start = Instant::now();
        self.report = CopyReport::default();
        match (src, dst) {
            (Location::Remote { server, path }, Location::Local(to)) => {
                self.download(server, path, to)?
            }
            (Location::Local(from), Location::Remote { server, path }) => {
                self.upload(from, server, path)?
            }
            _ => {
                return Err(Error::Usage(
                    "one side of a copy must be local and the other an ml:// URL".into(),
                ))
            }
        }
        self.report.secs = start.elapsed().as_secs_f64();
        Ok(self.report)
    }

    fn shape(&self, offset: u64, len: u64) -> Shape {
        Shape {
            offset,
            len,
            chunk: self.opts.chunk,
            slots: self.opts.slots,
        }
    }

    fn started(&self, name: &str, bytes: u64) {
        self.progress.total.fetch_add(bytes, Ordering::Relaxed);
        *self
            .progress
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = name.to_string();
    }

    fn download(&mut self, server: &str, path: &str, to: &Path) -> Result<()> {
        let meta = self.client(server)?.stat(path)?;
        let to = if to.is_dir() {
            to.join(&meta.name)
        } else {
            to.to_path_buf()
        };
        match meta.kind {
            Kind::File => self.download_file(server, path, &to),
            Kind::Dir if self.opts.recursive => self.download_dir(server, path, &to),
            Kind::Dir => Err(Error::Usage(format!("{path}: is a directory (use -r)"))),
            Kind::Other => Err(Error::Usage(format!("{path}: not a regular file"))),
        }
    }

    fn download_dir(&mut self, server: &str, path: &str, to: &Path) -> Result<()> {
        match fs::create_dir(to) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(Error::local(to.display(), e))
            }
            _ => {}
        }
        for entry in self.client(server)?.list(path)? {
            let from = join_remote(path, &entry.name);
            let dest = to.join(&entry.name);
            match entry.kind {
                Kind::File => self.download_file(server, &from, &dest)?,
                Kind::Dir => self.download_dir(server, &from, &dest)?,
                Kind::Other => tracing::warn!("{from}: not a file or directory; skipped"),
            }
        }
        Ok(())
    }

    fn download_file(&mut self, server: &str, path: &str, to: &Path) -> Result<()> {
        // A device (/dev/null) is written as it is; a file is written
        // under its partial name and renamed once verified.
        let device = fs::metadata(to).is_ok_and(|m| !m.is_file() && !m.is_dir());
        let part = if device {
            to.to_path_buf()
        } else {
            partial_name(to).ok_or_else(|| Error::Usage(format!("{}: no name", to.display())))?
        };
        let (opts, progress) = (self.opts.clone(), self.progress.clone());
        let mut start = 0;
        if opts.resume && !device && part.exists() {
            let (_, theirs) = self.client(server)?.sums(path, opts.chunk, false)?;
            let f = File::open(&part).map_err(|e| Error::local(part.display(), e))?;
            let (size, ours) =
                sums::file_chunks(&f, opts.chunk).map_err(|e| Error::local(part.display(), e))?;
            start = sums::common_prefix(&ours, &theirs, opts.chunk, size);
        }
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(start == 0 && !device)
            .open(&part)
            .map_err(|e| Error::local(part.display(), e))?;
        let shape = self.shape(start, u64::MAX - start);
        let shared = data::Shared::counting(progress.done.clone(), opts.limit_rate);
        let mut size = 0;
        self.started(path, 0);
        let got =
            self.client(server)?
                .get(path, shape, opts.streams, &file, &shared, &mut |s, len| {
                    size = s;
                    progress.total.fetch_add(len, Ordering::Relaxed);
                    Ok(())
                });
        let finish = got.and_then(|moved| {
            let fail = |e| Error::local(to.display(), e);
            if !device {
                file.set_len(size).map_err(fail)?;
            }
            if opts.sync {
                file.sync_all().map_err(fail)?;
            }
            if !device {
                fs::rename(&part, to).map_err(fail)?;
                if opts.sync {
                    sync_parent(to).map_err(fail)?;
                }
            }
            Ok(moved.bytes)
        });
        match finish {
            Ok(bytes) => {
                self.report.files += 1;
                self.report.bytes += bytes;
                self.report.resumed += start;
                Ok(())
            }
            Err(e) => {
                let keep = opts.resume && !matches!(e, Error::Mismatch(_));
                if !device && !keep {
                    let _ = fs::remove_file(&part);
                }
                Err(e)
            }
        }
    }

    fn upload(&mut self, from: &Path, server: &str, path: &str) -> Result<()> {
        let meta = fs::metadata(from).map_err(|e| Error::local(from.display(), e))?;
        let name = local_name(from)?;
        let target = match self.client(server)?.stat(path) {
            Ok(m) if m.kind == Kind::Dir => join_remote(path, &name),
            Ok(_) => path.to_string(),
            Err(Error::Remote {
                code: Code::NotFound,
                ..
            }) => path.to_string(),
            Err(e) => return Err(e),
        };
        if meta.is_dir() {
            if !self.opts.recursive {
                return Err(Error::Usage(format!(
                    "{}: is a directory (use -r)",
                    from.display()
                )));
            }
            return self.upload_dir(from, server, &target);
        }
        self.upload_file(from, server, &target)
    }

    fn upload_dir(&mut self, from: &Path, server: &str, path: &str) -> Result<()> {
        self.client(server)?.mkdir(path, true)?;
        for entry in walkdir::WalkDir::new(from).min_depth(1).sort_by_file_name() {
            let entry = entry.map_err(|e| {
                let p = e
                    .path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                Error::local(p, e.into())
            })?;
            let rel = entry.path().strip_prefix(from).expect("walked under from");
            let rel = rel.to_string_lossy();
            let to = join_remote(path, &rel);
            if entry.file_type().is_dir() {
                self.client(server)?.mkdir(&to, true)?;
            } else if entry.file_type().is_file() {
                self.upload_file(entry.path(), server, &to)?;
            } else {
                tracing::warn!(
                    "{}: not a file or directory; skipped",
                    entry.path().display()
                );
            }
        }
        Ok(())
    }

    fn upload_file(&mut self, from: &Path, server: &str, path: &str) -> Result<()> {
        let file = File::open(from).map_err(|e| Error::local(from.display(), e))?;
        let size = file
            .metadata()
            .map_err(|e| Error::local(from.display(), e))?
            .len();
        let (opts, progress) = (self.opts.clone(), self.progress.clone());
        let mut start = 0;
        if opts.resume {
            match self.client(server)?.sums(path, opts.chunk, true) {
                Ok((_, theirs)) => {
                    let (_, ours) = sums::file_chunks(&file, opts.chunk)
                        .map_err(|e| Error::local(from.display(), e))?;
                    start = sums::common_prefix(&ours, &theirs, opts.chunk, size);
                }
                Err(Error::Remote {
                    code: Code::NotFound,
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        self.started(path, size - start);
        let shape = self.shape(start, size - start);
        let shared = data::Shared::counting(progress.done.clone(), opts.limit_rate);
        let landing = Landing::Replace {
            keep_partial: opts.resume,
        };
        self.client(server)?.put(
            path,
            size,
            shape,
            opts.streams,
            opts.sync,
            landing,
            &file,
            &shared,
        )?;
        self.report.files += 1;
        self.report.bytes += size - start;
        self.report.resumed += start;
        Ok(())
    }
}

/// Makes a rename in `path`'s directory durable.
fn sync_parent(path: &Path) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths() {
        let r = |server: &str, path: &str| Location::Remote {
            server: server.into(),
            path: path.into(),
        };
        assert_eq!("ml://h:9/a/b".parse::<Location>().unwrap(), r("h:9", "a/b"));
        assert_eq!(
            "ml://h/".parse::<Location>().unwrap(),
            r(&format!("h:{DEFAULT_PORT}"), "")
        );
        assert_eq!(
            "ml://[::1]:5/x".parse::<Location>().unwrap(),
            r("[::1]:5", "x")
        );
        assert_eq!(
            "ml://[::1]/x".parse::<Location>().unwrap(),
            r(&format!("[::1]:{DEFAULT_PORT}"), "x")
        );
        assert_eq!(
            "ml://h//etc/passwd".parse::<Location>().unwrap(),
            r(&format!("h:{DEFAULT_PORT}"), "/etc/passwd")
        );
        assert!("ml:///x".parse::<Location>().is_err());
        assert_eq!(
            "/tmp/x".parse::<Location>().unwrap(),
            Location::Local("/tmp/x".into())
        );
        assert_eq!(join_remote("", "f"), "f");
        assert_eq!(join_remote("d/", "f"), "d/f");
    }
}
