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
use crate::stripe;
use crate::sums;
use crate::uncached::Writes;

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
    /// A file striped over several servers (`ml://h1,h2,.../path`): one
    /// object of it under `path` on each.
    Striped {
        /// `host:port` of each server, in stripe order.
        servers: Vec<String>,
        /// Path under each export root.
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
        let mut servers = Vec::new();
        for host in authority.split(',') {
            if host.is_empty() {
                return Err(Error::Usage(format!("{s}: empty host in the URL")));
            }
            let has_port = match host.rfind(':') {
                Some(i) => !host[i..].contains(']'),
                None => false,
            };
            servers.push(if has_port {
                host.to_string()
            } else {
                format!("{host}:{DEFAULT_PORT}")
            });
        }
        let path = path.to_string();
        Ok(if servers.len() == 1 {
            Location::Remote {
                server: servers.remove(0),
                path,
            }
        } else {
            Location::Striped { servers, path }
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
    /// Write files past the page cache (`O_DIRECT`, see
    /// [`direct`](crate::direct)): downloads here, uploads on the server.
    pub direct: bool,
    /// Keep every page of a received file in the page cache, as the
    /// kernel's own writes do; else the bytes past the first
    /// [`uncached::HEAD`](crate::uncached::HEAD) are written uncached (see
    /// [`uncached`](crate::uncached)): downloads here, uploads on the
    /// server as it is set.
    pub cache: bool,
    /// Copy directories with everything in them.
    pub recursive: bool,
    /// Bytes per second a file's streams may move together, if limited.
    pub limit_rate: Option<u64>,
    /// Check every file end to end (chunk digests on both sides).
    pub verify: bool,
    /// Client settings.
    pub client: ClientOptions,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            streams: 1,
            chunk: 1 << 20,
            slots: 4,
            resume: false,
            sync: false,
            direct: false,
            cache: false,
            recursive: false,
            limit_rate: None,
            verify: true,
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
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CopyReport {
    /// Files copied.
    pub files: u64,
    /// Bytes moved (not counting resumed prefixes).
    pub bytes: u64,
    /// Bytes skipped because a partial copy already held them.
    pub resumed: u64,
    /// Wall time, seconds.
    pub secs: f64,
    /// Chunks carried by each I/O gateway (by node), when data went
    /// through gateways.
    pub through: Vec<(u32, u64)>,
    /// What held the transfers through gateways back, as this side saw
    /// it: counts summed over them, the longest stall of any (its
    /// `per_gateway` empty: that is `through`).
    pub held: Option<crate::lane::Carried>,
}

impl std::fmt::Display for CopyReport {
    /// What `cp` prints at the end: files, bytes, time and rate, what was
    /// resumed, and through gateways a line with the chunks each carried
    /// and one with what held the copy back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = if self.files == 1 { "" } else { "s" };
        write!(
            f,
            "{} file{plural}, {} bytes in {:.2} s ({:.1} MB/s)",
            self.files,
            self.bytes,
            self.secs,
            self.bytes as f64 / self.secs.max(1e-9) / 1e6,
        )?;
        if self.resumed > 0 {
            write!(f, ", {} bytes resumed", self.resumed)?;
        }
        if !self.through.is_empty() {
            let per: Vec<String> = self
                .through
                .iter()
                .map(|(gw, n)| format!("node {gw}: {n}"))
                .collect();
            write!(f, "\nchunks through gateways: {}", per.join(", "))?;
        }
        if let Some(h) = &self.held {
            write!(f, "\nheld back by: {h}")?;
        }
        Ok(())
    }
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
            let mut c = Client::connect(server, &self.secret, &self.opts.client)?;
            c.set_direct(self.opts.direct);
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
            (Location::Striped { servers, path }, Location::Local(to)) => {
                self.download_striped(servers, path, to)?
            }
            (Location::Local(from), Location::Striped { servers, path }) => {
                self.upload_striped(from, servers, path)?
            }
            _ => {
                return Err(Error::Usage(
                    "one side of a copy must be local and the other an ml:// URL".into(),
                ))
            }
        }
        self.report.secs = start.elapsed().as_secs_f64();
        Ok(std::mem::take(&mut self.report))
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
        let file = if device {
            OpenOptions::new()
                .write(true)
                .open(&part)
                .map_err(|e| Error::local(part.display(), e))?
        } else {
            claim_local(&part, start > 0)?
        };
        let writes = Writes::choose(&file, opts.direct, opts.cache, device, &to.display());
        let sink = writes.sink();
        let shape = self.shape(start, u64::MAX - start);
        let shared = data::Shared::counting(progress.done.clone(), opts.limit_rate)
            .skipping_digests(!opts.verify);
        let mut size = 0;
        self.started(path, 0);
        let got =
            self.client(server)?
                .get(path, shape, opts.streams, sink, &shared, &mut |s, len| {
                    size = s;
                    progress.total.fetch_add(len, Ordering::Relaxed);
                    Ok(())
                });
        if let Ok(m) = &got {
            self.count_through(m);
        }
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

    fn count_through(&mut self, moved: &crate::Moved) {
        for (gw, n) in moved.carried.iter().flat_map(|c| &c.per_gateway) {
            match self.report.through.iter_mut().find(|(g, _)| g == gw) {
                Some((_, total)) => *total += n,
                None => self.report.through.push((*gw, *n)),
            }
        }
        self.report.through.sort_unstable();
        if let Some(c) = &moved.carried {
            let h = self
                .report
                .held
                .get_or_insert_with(|| crate::lane::Carried {
                    sender: c.sender,
                    ..Default::default()
                });
            h.resent += c.resent;
            h.duplicates += c.duplicates;
            h.failovers += c.failovers;
            h.longest_stall = h.longest_stall.max(c.longest_stall);
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
        let shared = data::Shared::counting(progress.done.clone(), opts.limit_rate)
            .skipping_digests(!opts.verify);
        let landing = Landing::Replace {
            keep_partial: opts.resume,
        };
        let moved = self.client(server)?.put(
            path,
            size,
            shape,
            opts.streams,
            opts.sync,
            landing,
            &file,
            &shared,
        )?;
        self.count_through(&moved);
        self.report.files += 1;
        self.report.bytes += size - start;
        self.report.resumed += start;
        Ok(())
    }
}

impl Copier {
    /// Runs `f(k, client)` for each server at once, each on a connection of
    /// its own; the first error wins.
    fn each_server<T: Send>(
        &self,
        servers: &[String],
        f: impl Fn(u32, &mut Client) -> Result<T> + Sync,
    ) -> Result<Vec<T>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = servers
                .iter()
                .enumerate()
                .map(|(k, server)| {
                    let f = &f;
                    s.spawn(move || {
                        let mut c = Client::connect(server, &self.secret, &self.opts.client)?;
                        f(k as u32, &mut c)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Usage("a transfer thread panicked".into())))
                })
                .collect()
        })
    }

    /// Stripes local file `from` over `servers` as `path`: an object on
    /// each, then the layout record beside each object.
    fn upload_striped(&mut self, from: &Path, servers: &[String], path: &str) -> Result<()> {
        let file = File::open(from).map_err(|e| Error::local(from.display(), e))?;
        let size = file
            .metadata()
            .map_err(|e| Error::local(from.display(), e))?
            .len();
        let layout = stripe::Layout {
            size,
            stripe: self.opts.chunk as u64,
            objects: servers.len() as u32,
        };
        self.started(path, size);
        let done = self.progress.done.clone();
        let opts = self.opts.clone();
        self.each_server(servers, |k, c| {
            let len = layout.object_len(k);
            let shape = Shape {
                offset: 0,
                len,
                chunk: opts.chunk,
                slots: opts.slots,
            };
            let object = stripe::Object {
                file: &file,
                layout,
                k,
            };
            let shared = data::Shared::counting(done.clone(), opts.limit_rate)
                .skipping_digests(!opts.verify);
            let replace = Landing::Replace {
                keep_partial: false,
            };
            c.put(
                path,
                len,
                shape,
                opts.streams,
                opts.sync,
                replace,
                &object,
                &shared,
            )?;
            let record = layout.record(k).into_bytes();
            let rshape = Shape {
                len: record.len() as u64,
                chunk: 4096,
                slots: 1,
                ..shape
            };
            let quiet = data::Shared::default();
            let name = stripe::record_name(path);
            let n = record.len() as u64;
            c.put(&name, n, rshape, 1, opts.sync, replace, &record, &quiet)?;
            Ok(())
        })?;
        self.report.files += 1;
        self.report.bytes += size;
        Ok(())
    }

    /// Puts a striped file back together from its objects on `servers`.
    fn download_striped(&mut self, servers: &[String], path: &str, to: &Path) -> Result<()> {
        let to = if to.is_dir() {
            to.join(path.rsplit('/').next().unwrap_or(path))
        } else {
            to.to_path_buf()
        };
        let part =
            partial_name(&to).ok_or_else(|| Error::Usage(format!("{}: no name", to.display())))?;
        let file = claim_local(&part, false)?;
        self.started(path, 0);
        let (opts, progress) = (self.opts.clone(), self.progress.clone());
        let writes = Writes::choose(&file, opts.direct, opts.cache, false, &to.display());
        let n = servers.len() as u32;
        let got = self.each_server(servers, |k, c| {
            let record = stripe::Memory::default();
            let rshape = Shape {
                offset: 0,
                len: 4096,
                chunk: 4096,
                slots: 1,
            };
            let quiet = data::Shared::default();
            c.get(&stripe::record_name(path), rshape, 1, &record, &quiet, &mut |_, _| Ok(()))?;
            let text = String::from_utf8_lossy(&record.0.lock().unwrap_or_else(|p| p.into_inner()))
                .into_owned();
            let (layout, index) = stripe::Layout::parse(&text)
                .map_err(|m| Error::Usage(format!("{path} on server {k}: {m}")))?;
            if index != k || layout.objects != n {
                return Err(Error::Usage(format!(
                    "{path}: server {k} holds object {index} of {}; name the servers in stripe order",
                    layout.objects
                )));
            }
            let object = stripe::Object {
                file: writes.sink(),
                layout,
                k,
            };
            let shape = Shape {
                offset: 0,
                len: u64::MAX,
                chunk: opts.chunk,
                slots: opts.slots,
            };
            let shared = data::Shared::counting(progress.done.clone(), opts.limit_rate).skipping_digests(!opts.verify);
            let moved = c.get(path, shape, opts.streams, &object, &shared, &mut |_, len| {
                progress.total.fetch_add(len, Ordering::Relaxed);
                if len != layout.object_len(k) {
                    return Err(Error::Usage(format!(
                        "{path} on server {k}: {len} bytes where the layout says {}",
                        layout.object_len(k)
                    )));
                }
                Ok(())
            })?;
            Ok((layout, moved.bytes))
        });
        let finish = got.and_then(|parts| {
            let size = parts.first().map_or(0, |(l, _)| l.size);
            if parts.iter().any(|(l, _)| l.size != size) {
                return Err(Error::Usage(format!(
                    "{path}: the objects disagree on the size"
                )));
            }
            let fail = |e| Error::local(to.display(), e);
            file.set_len(size).map_err(fail)?;
            if opts.sync {
                file.sync_all().map_err(fail)?;
            }
            fs::rename(&part, &to).map_err(fail)?;
            Ok(size)
        });
        match finish {
            Ok(size) => {
                self.report.files += 1;
                self.report.bytes += size;
                Ok(())
            }
            Err(e) => {
                let _ = fs::remove_file(&part);
                Err(e)
            }
        }
    }
}

/// Opens and locks local temporary file `part` for this copy alone
/// (see [`partial`](crate::partial)); kept as it is when `resume`.
fn claim_local(part: &Path, resume: bool) -> Result<File> {
    let open = || {
        OpenOptions::new()
            .write(true)
            .read(true)
            .create(true)
            .truncate(false)
            .open(part)
    };
    crate::partial::claim(&open, &|| crate::partial::identity(part), resume).map_err(|e| match e {
        crate::partial::ClaimError::Busy => Error::Busy(part.display().to_string()),
        crate::partial::ClaimError::Io(e) => Error::local(part.display(), e),
    })
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
            "ml://a:1,b/x".parse::<Location>().unwrap(),
            Location::Striped {
                servers: vec!["a:1".into(), format!("b:{DEFAULT_PORT}")],
                path: "x".into()
            }
        );
        assert!("ml://a,,b/x".parse::<Location>().is_err());
        assert_eq!(
            "/tmp/x".parse::<Location>().unwrap(),
            Location::Local("/tmp/x".into())
        );
        assert_eq!(join_remote("", "f"), "f");
        assert_eq!(join_remote("d/", "f"), "d/f");
    }
}
