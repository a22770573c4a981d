//! `macrolink serve`, `cp`, `ls`, `stat`, `rm`, `mkdir`: the file service
//! on the command line. Client commands exit with the codes of
//! [`macrolink_files::exit`], so scripts can tell a missing file from a
//! refused one from a broken connection.

use clap::Args as ClapArgs;
use indicatif::{ProgressBar, ProgressStyle};
use macrolink_files::auth::Secret;
use macrolink_files::copy::{Copier, CopyOptions, Location, DEFAULT_PORT};
use macrolink_files::proto::Kind;
use macrolink_files::setup::load_secret;
use macrolink_files::{exit, Client, ClientSetup, Error, Limits, ServeConfig, Server};
use macrolink_testbed::ready::Line;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::args::parse_size;

/// Where the shared secret comes from.
#[derive(Debug, Clone, ClapArgs)]
pub struct SecretArgs {
    /// File holding the shared secret (at least 16 bytes). Also
    /// MACROLINK_SECRET_FILE; MACROLINK_SECRET may hold the secret itself.
    #[arg(long, env = "MACROLINK_SECRET_FILE")]
    pub secret_file: Option<PathBuf>,
}

impl SecretArgs {
    /// The secret, from the file or the environment.
    pub fn load(&self) -> Result<Secret, Error> {
        load_secret(self.secret_file.as_deref())
    }
}

/// `macrolink serve`.
#[derive(Debug, ClapArgs)]
pub struct ServeArgs {
    /// Directory to export.
    root: PathBuf,
    /// Contact address (port 0 picks one; the first line of output names it).
    #[arg(long, default_value_t = SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)))]
    listen: SocketAddr,
    /// Refuse every write.
    #[arg(long)]
    read_only: bool,
    /// Keep every page of an uploaded file in the page cache. By default
    /// the bytes past a file's first 64 MiB are written uncached
    /// (RWF_DONTCACHE, Linux 6.14), as `cp` writes a download.
    #[arg(long)]
    cache: bool,
    /// Connections in all.
    #[arg(long, default_value_t = Limits::default().connections)]
    max_connections: usize,
    /// Connections from one client address.
    #[arg(long, default_value_t = Limits::default().connections_per_client)]
    max_per_client: usize,
    /// Files one client address may have open at once.
    #[arg(long, default_value_t = Limits::default().open_files_per_client)]
    max_open_per_client: usize,
    /// Directory where fabric nodes of this host meet.
    #[arg(long)]
    shm_dir: Option<PathBuf>,
    /// Fabric node id of this storage host, as the cluster file names it
    /// (gateways relay file data to it there).
    #[arg(long, requires = "fabric")]
    node: Option<u32>,
    /// TCP address of the fabric node (the host's storage-side address in
    /// the cluster file).
    #[arg(long, requires = "node")]
    fabric: Option<SocketAddr>,
    /// Also receive striped transfers on endpoint 1 (what `macrolink sink`
    /// does), so that one process is the whole storage host.
    #[arg(long, requires = "node")]
    sink: bool,
    /// Cluster file whose central manager this server obeys: while it
    /// excludes this host (the node `--node` names), no new file is opened.
    #[arg(long, requires = "node")]
    cluster: Option<PathBuf>,
    #[command(flatten)]
    secret: SecretArgs,
    #[command(flatten)]
    metrics: crate::args::MetricsArgs,
    #[command(flatten)]
    child: crate::args::ChildArgs,
    #[command(flatten)]
    ucx: crate::args::UcxArgs,
}

/// Runs a server until killed.
pub fn serve(a: ServeArgs) -> anyhow::Result<()> {
    a.child.apply();
    let limits = Limits {
        connections: a.max_connections,
        connections_per_client: a.max_per_client,
        open_files_per_client: a.max_open_per_client,
        ..Limits::default()
    };
    eprintln!("serve: limits: {limits}");
    let secret = a.secret.load()?;
    let excluded = match &a.cluster {
        Some(p) => {
            let c = macrolink_cluster::Cluster::load(p)
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            let x = macrolink_files::setup::watch_excluded(&c, &secret);
            anyhow::ensure!(
                x.is_some(),
                "{}: names no central manager to obey",
                p.display()
            );
            x
        }
        None => None,
    };
    let meter = macrolink_files::meter::Meter::default();
    let server = Server::bind(ServeConfig {
        root: a.root.clone(),
        listen: a.listen,
        secret,
        read_only: a.read_only,
        limits,
        shm_dir: a.shm_dir.unwrap_or_else(macrolink_fabric::default_shm_dir),
        fabric: a.node.zip(a.fabric),
        excluded,
        meter: meter.clone(),
        ucx: a.ucx.options(),
        cache: a.cache,
    })?;
    a.metrics.serve("macrolink_files", |r| meter.register(r))?;
    if a.sink {
        server.start_sink()?;
    }
    crate::roles::exit_on_signals(|| {})?;
    let addr = server.local_addr()?;
    Line::ready()
        .with("tcp", addr)
        .with("url", format!("ml://{addr}/"))
        .with("root", a.root.display())
        .flag("read-only", a.read_only)
        .with_some("fabric", a.node.and(server.node().tcp_addr()))
        .print()?;
    server.run()?;
    Ok(())
}

/// Options every client command takes.
#[derive(Debug, Clone, ClapArgs)]
pub struct ClientArgs {
    #[command(flatten)]
    pub secret: SecretArgs,
    /// Move data over TCP even when the server shares this host's memory.
    #[arg(long)]
    pub no_shm: bool,
    /// Directory where fabric nodes of this host meet.
    #[arg(long)]
    pub shm_dir: Option<PathBuf>,
    /// Cluster file: storage hosts may be named in URLs (ml://store0/path),
    /// and file data goes through the gateways of their lane.
    #[arg(long, env = "MACROLINK_CLUSTER")]
    pub cluster: Option<PathBuf>,
    /// This host's name in the cluster file (default: from the launcher's
    /// rank): across a relay pair, the other segment's storage and
    /// gateways are reached through this host's relay.
    #[arg(long = "host", env = "MACROLINK_HOST")]
    pub host: Option<String>,
    #[command(flatten)]
    pub ucx: crate::args::UcxArgs,
}

impl ClientArgs {
    /// The client settings these arguments make.
    pub fn setup(&self) -> ClientSetup {
        ClientSetup {
            secret_file: self.secret.secret_file.clone(),
            no_shm: self.no_shm,
            shm_dir: self.shm_dir.clone(),
            cluster: self.cluster.clone(),
            host: self.host.clone(),
            ucx: self.ucx.ucx,
            ucx_tls: self.ucx.ucx_tls.clone(),
        }
    }
}

fn parse_chunk(s: &str) -> Result<u32, String> {
    u32::try_from(parse_size(s)?).map_err(|_| format!("{s}: too large"))
}

/// `macrolink cp`.
#[derive(Debug, ClapArgs)]
pub struct CpArgs {
    /// Source: a local path or ml://host[:port]/path.
    src: String,
    /// Destination: a local path or ml://host[:port]/path (an existing
    /// directory receives the source under its own name).
    dst: String,
    /// Copy directories with everything in them.
    #[arg(short, long)]
    recursive: bool,
    /// Parallel data streams per file.
    #[arg(long, default_value_t = 2)]
    streams: u32,
    /// Chunk size (e.g. 1MiB).
    #[arg(long, default_value = "1MiB", value_parser = parse_chunk)]
    chunk: u32,
    /// Chunks in flight per stream. Few keep each stream's receiving region
    /// in the processor's cache when both ends share a host; raise it for a
    /// link whose bandwidth-delay product exceeds streams x slots x chunk.
    #[arg(long, default_value_t = 4)]
    slots: u32,
    /// Continue an interrupted copy from its partial file; a failed copy
    /// keeps its partial file for the next try.
    #[arg(long)]
    resume: bool,
    /// Count the copy done only once the data is on stable storage (fsync).
    #[arg(long)]
    sync: bool,
    /// Write the copy with direct I/O (O_DIRECT), past the page cache: a
    /// download here, an upload on the server. For files larger than
    /// memory, or hosts whose page cache fills slower than their disks
    /// write. A file system without direct I/O gets ordinary writes, with
    /// a warning (in the server's log for an upload).
    #[arg(long)]
    direct: bool,
    /// Keep every page of a downloaded file in the page cache, as an
    /// ordinary write does. By default the bytes past a file's first 64
    /// MiB are written uncached (RWF_DONTCACHE, Linux 6.14): written back
    /// at once and their pages freed, so a large copy neither waits for
    /// fresh pages nor evicts what else the host keeps cached. Where the
    /// kernel or file system lacks it, every write is an ordinary one.
    #[arg(long, conflicts_with = "direct")]
    cache: bool,
    /// Skip the end-to-end checksum (no chunk is hashed on either side).
    #[arg(long)]
    no_verify: bool,
    /// Move at most this many bytes per second (e.g. 100MB).
    #[arg(long, value_parser = parse_size)]
    limit_rate: Option<u64>,
    /// No progress bar, no summary.
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten)]
    client: ClientArgs,
}

/// Runs a client command; returns the exit code after printing any error.
pub fn finish(r: Result<(), Error>) -> i32 {
    match r {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("macrolink: {e}");
            e.exit_code()
        }
    }
}

fn bar(progress: &macrolink_files::copy::Progress) -> ProgressBar {
    let pb = ProgressBar::new(progress.total.load(Ordering::Relaxed));
    pb.set_style(
        ProgressStyle::with_template(
            "{msg:20!} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// Copies SRC to DST.
pub fn cp(a: CpArgs) -> Result<(), Error> {
    let src: Location = a.src.parse()?;
    let dst: Location = a.dst.parse()?;
    let opts = CopyOptions {
        streams: a.streams,
        chunk: a.chunk,
        slots: a.slots,
        resume: a.resume,
        sync: a.sync,
        direct: a.direct,
        cache: a.cache,
        recursive: a.recursive,
        limit_rate: a.limit_rate,
        verify: !a.no_verify,
        client: a.client.setup().options()?,
    };
    let mut copier = Copier::new(a.client.setup().secret()?, opts);
    let progress = copier.progress.clone();
    let show = !a.quiet && std::io::stderr().is_terminal();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let ticker = show.then(|| {
        std::thread::spawn(move || {
            let pb = bar(&progress);
            loop {
                pb.set_length(progress.total.load(Ordering::Relaxed));
                pb.set_position(progress.done.load(Ordering::Relaxed));
                if let Ok(name) = progress.current.lock() {
                    pb.set_message(name.clone());
                }
                if stop_rx.recv_timeout(Duration::from_millis(100)).is_ok() {
                    break;
                }
            }
            pb.finish_and_clear();
        })
    });
    let r = copier.copy(&src, &dst);
    drop(stop_tx);
    if let Some(t) = ticker {
        let _ = t.join();
    }
    let r = r?;
    if !a.quiet {
        eprintln!("{r}");
    }
    Ok(())
}

/// `macrolink ls`, `stat`, `rm`, `mkdir`.
#[derive(Debug, ClapArgs)]
pub struct PathArgs {
    /// ml://host[:port]/path
    url: String,
    /// ls: this path's own entry; rm: directories with their contents;
    /// mkdir: missing parents too.
    #[arg(short = 'r', long, alias = "parents", short_alias = 'p')]
    recursive: bool,
    #[command(flatten)]
    client: ClientArgs,
}

fn remote(a: &PathArgs) -> Result<(Client, String), Error> {
    a.client.setup().connect_url(&a.url)
}

/// Lists a directory (or shows a file's entry).
pub fn ls(a: PathArgs) -> Result<(), Error> {
    let (mut c, path) = remote(&a)?;
    let m = c.stat(&path)?;
    let lines = match m.kind {
        Kind::Dir => c.list(&path)?.iter().map(|e| e.ls_line() + "\n").collect(),
        _ => m.ls_line() + "\n",
    };
    exit::print(&lines)
}

/// Shows one path's metadata.
pub fn stat(a: PathArgs) -> Result<(), Error> {
    let (mut c, path) = remote(&a)?;
    exit::print(&c.stat(&path)?.details())
}

/// Removes a path.
pub fn rm(a: PathArgs) -> Result<(), Error> {
    let (mut c, path) = remote(&a)?;
    c.remove(&path, a.recursive)
}

/// Makes a directory.
pub fn mkdir(a: PathArgs) -> Result<(), Error> {
    let (mut c, path) = remote(&a)?;
    c.mkdir(&path, a.recursive)
}
