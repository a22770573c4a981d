//! `macrolink serve`: accepts contact connections, authenticates them, and
//! runs each as a session thread over one export.

use macrolink_fabric::gate::{self, Gate, Source, Timed};
use macrolink_fabric::{Node, NodeConfig};
use macrolink_gateway::heard::Heard;
use macrolink_manage::excluded::Excluded;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::auth::{self, Secret};
use crate::ops::{Export, Failure};
use crate::proto::{self, Code, FabricInfo, Reply, Request};
use crate::wire_io;

pub(crate) mod session;

/// Limits that keep one client from taking the server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Authenticated connections in all.
    pub connections: usize,
    /// Authenticated connections from one client address.
    pub connections_per_client: usize,
    /// Files one client address may have open at once.
    pub open_files_per_client: usize,
    /// Connections still authenticating, in all; past it the oldest is
    /// dropped.
    pub handshakes: usize,
    /// Connections still authenticating from one address; past it that
    /// address's oldest is dropped.
    pub handshakes_per_client: usize,
    /// Time from accepting a connection to its proof, all of it.
    pub handshake_time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 256,
            connections_per_client: 32,
            open_files_per_client: 64,
            handshakes: 64,
            handshakes_per_client: 8,
            handshake_time: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Display for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} connections ({} per client address), {} open files per client address, \
             {} handshakes pending ({} per address) of {:?} each, requests up to {} KiB",
            self.connections,
            self.connections_per_client,
            self.open_files_per_client,
            self.handshakes,
            self.handshakes_per_client,
            self.handshake_time,
            proto::MAX_REQUEST >> 10
        )
    }
}

/// Settings of a server.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Directory exported.
    pub root: PathBuf,
    /// Contact address.
    pub listen: SocketAddr,
    /// Shared secret clients must prove.
    pub secret: Secret,
    /// Refuse every write.
    pub read_only: bool,
    /// Limits.
    pub limits: Limits,
    /// Directory where fabric nodes of this host meet (shared memory).
    pub shm_dir: PathBuf,
    /// The fabric node's id and TCP address, when the cluster names them
    /// (gateways reach the server there); a random id and any port else.
    pub fabric: Option<(u32, SocketAddr)>,
    /// Hosts the cluster's central manager has excluded: while this host
    /// (its fabric node) is among them, no new file is opened; gateways
    /// among them carry none of its data.
    pub excluded: Option<Excluded>,
    /// What the server counts (registered by whoever serves the metrics).
    pub meter: crate::meter::Meter,
    /// UCX on the server's node: clients that speak it too move file data
    /// over it.
    pub ucx: Option<macrolink_fabric::UcxOptions>,
    /// Keep every page of an uploaded file in the page cache; else the
    /// bytes past the first [`HEAD`](crate::uncached::HEAD) are written
    /// uncached (see [`uncached`](crate::uncached)).
    pub cache: bool,
}

impl ServeConfig {
    /// The file service of storage host `h` of a cluster file: its export,
    /// its contact address, and the host's own fabric node.
    pub fn for_host(
        h: &macrolink_cluster::Host,
        shm_dir: &std::path::Path,
        secret: Secret,
    ) -> Result<ServeConfig, crate::Error> {
        let missing = |what: &str| crate::Error::Usage(format!("host {:?} has no {what}", h.name));
        Ok(ServeConfig {
            root: h.export.clone().ok_or_else(|| {
                crate::Error::Usage(format!(
                    "host {:?} has `files` but no `export`: add export = \"/path/to/dir\" \
                     (the directory its file service serves) to its [[host]] entry",
                    h.name
                ))
            })?,
            listen: h.files.ok_or_else(|| missing("`files` address"))?,
            secret,
            read_only: false,
            limits: Limits::default(),
            shm_dir: shm_dir.to_path_buf(),
            fabric: Some((
                h.node,
                h.listen().ok_or_else(|| missing("storage address"))?,
            )),
            excluded: None,
            meter: crate::meter::Meter::default(),
            ucx: None,
            cache: false,
        })
    }
}

/// Endpoint ids below this are left to roles sharing the server's node
/// (the striped-transfer sink takes 1).
const FIRST_SESSION_EP: u32 = 16;

/// What every session shares.
#[derive(Debug)]
struct Shared {
    export: Export,
    secret: Secret,
    limits: Limits,
    node: Node,
    host: String,
    shm_dir: PathBuf,
    next_ep: AtomicU32,
    clients: Mutex<HashMap<IpAddr, Usage>>,
    handshakes: Gate,
    excluded: Option<Excluded>,
    /// What the downloads hear of the gateways, shared among them.
    heard: Heard,
    meter: crate::meter::Meter,
    /// The node speaks UCX.
    ucx: bool,
    /// Uploads keep every page cached.
    cache: bool,
}

#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    connections: usize,
    open_files: usize,
}

impl Shared {
    fn ep_id(&self) -> u32 {
        self.next_ep.fetch_add(1, Ordering::Relaxed)
    }

    fn usage(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Usage>> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a connection from `ip`, unless a limit is reached.
    fn admit(&self, ip: IpAddr) -> Result<(), Failure> {
        let mut u = self.usage();
        let total: usize = u.values().map(|c| c.connections).sum();
        let mine = u.entry(ip).or_default();
        if total >= self.limits.connections
            || mine.connections >= self.limits.connections_per_client
        {
            return Err(Failure::new(
                Code::Busy,
                format!(
                    "too many connections ({total} in all, {} from {ip})",
                    mine.connections
                ),
            ));
        }
        mine.connections += 1;
        self.meter.connections.inc();
        Ok(())
    }

    fn leave(&self, ip: IpAddr) {
        let mut u = self.usage();
        if let Some(c) = u.get_mut(&ip) {
            self.meter.connections.dec();
            c.connections -= 1;
            if c.connections == 0 && c.open_files == 0 {
                u.remove(&ip);
            }
        }
    }

    /// Counts an open file of `ip`; the guard gives it back. Refused while
    /// the central manager excludes this host.
    fn open_file(self: &Arc<Self>, ip: IpAddr) -> Result<OpenFile, Failure> {
        let me = self.node.id();
        if self.excluded.as_ref().is_some_and(|x| x.contains(me)) {
            return Err(Failure::new(
                Code::Excluded,
                format!(
                    "this storage host (node {me}) is excluded by the cluster's central \
                     manager and takes no new work; `macrolink manage status` says why, \
                     `macrolink manage include HOST` takes it back"
                ),
            ));
        }
        let mut u = self.usage();
        let mine = u.entry(ip).or_default();
        if mine.open_files >= self.limits.open_files_per_client {
            return Err(Failure::new(
                Code::Busy,
                format!("{ip} has {} files open, the limit", mine.open_files),
            ));
        }
        mine.open_files += 1;
        Ok(OpenFile {
            shared: self.clone(),
            ip,
        })
    }
}

/// One open file counted against its client.
#[derive(Debug)]
struct OpenFile {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if let Some(c) = self.shared.usage().get_mut(&self.ip) {
            c.open_files -= 1;
        }
    }
}

/// A bound server.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

/// The kernel's boot id: processes that share it share memory.
pub fn host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A random id for a fabric node that is nobody's rank.
pub fn random_node_id() -> io::Result<u32> {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(u32::from_le_bytes(b) | 0x8000_0000)
}

impl Server {
    /// Opens the export and binds the contact address and the fabric node.
    pub fn bind(cfg: ServeConfig) -> io::Result<Server> {
        let export = Export::open(&cfg.root, cfg.read_only)
            .map_err(|e| io::Error::new(e.kind(), format!("export {}: {e}", cfg.root.display())))?;
        let listener = TcpListener::bind(cfg.listen)?;
        let (id, tcp) = match cfg.fabric {
            Some(f) => f,
            None => (random_node_id()?, SocketAddr::new(cfg.listen.ip(), 0)),
        };
        let mut node_cfg = NodeConfig::local(id, &cfg.shm_dir);
        node_cfg.tcp = Some(tcp);
        node_cfg.udp = None;
        node_cfg.key = Some(cfg.secret.fabric_key());
        node_cfg.ucx = cfg.ucx.clone();
        let ucx = cfg.ucx.is_some();
        let node = Node::start(node_cfg).map_err(io::Error::other)?;
        Ok(Server {
            listener,
            shared: Arc::new(Shared {
                export,
                secret: cfg.secret,
                limits: cfg.limits,
                node,
                host: host_id(),
                shm_dir: cfg.shm_dir,
                next_ep: AtomicU32::new(FIRST_SESSION_EP),
                clients: Mutex::new(HashMap::new()),
                handshakes: Gate::new(gate::Limits {
                    total: cfg.limits.handshakes,
                    per_source: cfg.limits.handshakes_per_client,
                    time: cfg.limits.handshake_time,
                }),
                excluded: cfg.excluded,
                heard: Heard::new(),
                meter: cfg.meter,
                ucx,
                cache: cfg.cache,
            }),
        })
    }

    /// Receives striped transfers (`macrolink sink`'s work) on endpoint 1
    /// of the server's node, on a thread of its own.
    pub fn start_sink(&self) -> io::Result<()> {
        let ep = self
            .shared
            .node
            .open(1, macrolink_gwnet::endpoint_config())
            .map_err(io::Error::other)?;
        std::thread::spawn(move || {
            if let Err(e) = macrolink_gwnet::sink::run(ep, None) {
                tracing::error!("sink: {e}");
            }
        });
        Ok(())
    }

    /// The contact address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The server's fabric node (endpoints below 16 are free for other
    /// roles of the host).
    pub fn node(&self) -> &Node {
        &self.shared.node
    }

    /// Serves until the listener fails.
    pub fn run(self) -> io::Result<()> {
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                    tracing::warn!("accept: {e}; waiting");
                    thread::sleep(Duration::from_millis(100));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let shared = self.shared.clone();
            thread::spawn(move || serve_connection(shared, stream, peer));
        }
    }
}

fn refuse(stream: &mut TcpStream, f: Failure) {
    let _ = wire_io::send(
        stream,
        &Reply::Error {
            code: f.code,
            message: f.message,
        },
    );
}

fn serve_connection(shared: Arc<Shared>, mut stream: TcpStream, peer: SocketAddr) {
    let ip = peer.ip();
    let _ = stream.set_nodelay(true);
    let Ok(pass) = shared.handshakes.enter(Source::Ip(ip), &stream) else {
        return;
    };
    let proven = authenticate(&shared, &mut stream, pass.until);
    drop(pass);
    let (client, nonce) = match proven {
        Ok(x) => x,
        Err(f) => {
            tracing::warn!("{peer}: not authenticated: {}", f.message);
            refuse(&mut stream, f);
            return;
        }
    };
    if let Err(f) = shared.admit(ip) {
        tracing::info!("{peer}: refused: {}", f.message);
        refuse(&mut stream, f);
        return;
    }
    match welcome(&shared, &mut stream, &nonce) {
        Ok(()) => {
            tracing::info!("{peer}: authenticated");
            if let Ok(addr) = client.tcp.parse() {
                shared.node.add_peer(client.node, addr);
            }
            if let Err(e) = session::Session::new(shared.clone(), stream, ip, client).run() {
                tracing::info!("{peer}: session ended: {e}");
            }
        }
        Err(f) => tracing::info!("{peer}: {}", f.message),
    }
    shared.leave(ip);
}

fn io_fail(e: &dyn std::fmt::Display) -> Failure {
    Failure::new(Code::Auth, format!("handshake: {e}"))
}

/// Runs the challenge, all of it by `until`; returns the client's fabric
/// node and its nonce, for the server's proof.
fn authenticate(
    shared: &Shared,
    stream: &mut TcpStream,
    until: Instant,
) -> Result<(FabricInfo, [u8; 32]), Failure> {
    let nonce = auth::nonce().map_err(|e| io_fail(&e))?;
    wire_io::send(
        stream,
        &Reply::Challenge {
            version: proto::VERSION,
            nonce,
        },
    )
    .map_err(|e| io_fail(&e))?;
    let mut by = Timed { stream, until };
    let req: Request = wire_io::recv(&mut by, proto::MAX_REQUEST).map_err(|e| io_fail(&e))?;
    let Request::Auth {
        version,
        proof,
        nonce: client_nonce,
        fabric,
    } = req
    else {
        return Err(Failure::new(Code::Auth, "authenticate first"));
    };
    if version != proto::VERSION {
        return Err(Failure::new(
            Code::BadRequest,
            format!(
                "client speaks protocol version {version}, this server {}",
                proto::VERSION
            ),
        ));
    }
    if !auth::proof_matches(&shared.secret.client_proof(&nonce), &proof) {
        return Err(Failure::new(
            Code::Auth,
            "authentication failed: wrong secret",
        ));
    }
    Ok((fabric, client_nonce))
}

/// Proves the server knows the secret too, and names its fabric node.
fn welcome(
    shared: &Shared,
    stream: &mut TcpStream,
    client_nonce: &[u8; 32],
) -> Result<(), Failure> {
    let local = stream.local_addr().map_err(|e| io_fail(&e))?;
    let tcp = match shared.node.tcp_addr() {
        Some(a) if !a.ip().is_unspecified() => a,
        a => SocketAddr::new(local.ip(), a.map_or(0, |a| a.port())),
    };
    let mine = FabricInfo {
        node: shared.node.id(),
        host: shared.host.clone(),
        shm_dir: shared.shm_dir.display().to_string(),
        tcp: tcp.to_string(),
        shm: true,
        ucx: shared.ucx,
    };
    wire_io::send(
        stream,
        &Reply::Welcome {
            proof: shared.secret.server_proof(client_nonce),
            fabric: mine,
        },
    )
    .map_err(|e| io_fail(&e))?;
    stream.set_read_timeout(None).map_err(|e| io_fail(&e))?;
    Ok(())
}
