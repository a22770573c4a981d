//! A process's presence in the fabric: its node id, its listeners (tcp and
//! the unix socket of shared memory) and their acceptor threads (on a
//! table of descriptors of their own, see [`crate::transport::porter`]),
//! and the endpoints it opens. How connections are dialled and accepted is
//! [`crate::transport::contact`].

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::gate::{self, Gate};
use crate::key::Key;
use crate::transport::contact::{accept_loop, sweep_stale, Accepted, NodeShared, Parcel};
use crate::transport::porter::{self, Dock, Pairs, Porter};
use crate::transport::sys;
use crate::transport::ucx;
use crate::types::EndpointConfig;

/// Default datagram MTU: payload bytes, as InfiniBand UD's 2048.
pub const DEFAULT_MTU: usize = 2048;
/// Default bytes of each shared-memory ring.
pub const DEFAULT_RING: usize = 4 << 20;

/// Settings of one node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Node id, unique in the cluster.
    pub id: u32,
    /// Directory where nodes of this host meet for shared memory
    /// (`node-<id>.sock`). `None` disables shm.
    pub shm_dir: Option<PathBuf>,
    /// TCP listen address (port 0 picks one). `None` disables tcp.
    pub tcp: Option<SocketAddr>,
    /// Address to bind endpoints' UDP sockets on. `None` disables udp.
    pub udp: Option<IpAddr>,
    /// TCP addresses of other nodes.
    pub peers: BTreeMap<u32, SocketAddr>,
    /// Largest datagram payload.
    pub datagram_mtu: usize,
    /// Bytes of each shared-memory ring (a power of two).
    pub shm_ring: usize,
    /// The key peers must prove; `None` takes it from the environment
    /// ([`Key::from_env`]), and without one there the fabric is open.
    pub key: Option<Key>,
    /// Unproven peers the listeners bear.
    pub handshakes: gate::Limits,
    /// Starts UCX (loaded at run time: `libucp.so.0`), so that endpoints
    /// can make targets over [`Transport::Ucx`](crate::Transport::Ucx);
    /// the node fails to start, naming the package to install, when UCX
    /// is missing. UCX picks its transports from its environment
    /// (`UCX_TLS`, `UCX_NET_DEVICES`), which the options override.
    pub ucx: Option<ucx::UcxOptions>,
}

impl NodeConfig {
    /// A node on loopback with tcp on a free port, udp, and shm in `shm_dir`.
    pub fn local(id: u32, shm_dir: impl Into<PathBuf>) -> NodeConfig {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        NodeConfig {
            id,
            shm_dir: Some(shm_dir.into()),
            tcp: Some(SocketAddr::new(lo, 0)),
            udp: Some(lo),
            peers: BTreeMap::new(),
            datagram_mtu: DEFAULT_MTU,
            shm_ring: DEFAULT_RING,
            key: None,
            handshakes: gate::Limits::default(),
            ucx: None,
        }
    }
}

/// The default directory where nodes of this host meet.
pub fn default_shm_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("macrolink"),
        None => {
            std::env::temp_dir().join(format!("macrolink-{}", rustix::process::getuid().as_raw()))
        }
    }
}

/// Socket files of this process's live nodes, for [`remove_sockets`].
static SOCKETS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Removes the socket files of this process's live nodes from their meeting
/// directories. For a process about to exit without dropping its nodes (on
/// a signal, or from another thread), so that it leaves nothing behind.
pub fn remove_sockets() {
    let paths = SOCKETS.lock().unwrap_or_else(PoisonError::into_inner);
    for p in paths.iter() {
        let _ = std::fs::remove_file(p);
    }
}

/// One process's node: listeners for tcp and shm, and the endpoints it opens.
#[derive(Debug)]
pub struct Node {
    shared: Arc<NodeShared>,
    /// The listeners, as the endpoints' table holds them (shut down to
    /// stop their acceptors).
    listeners: Vec<OwnedFd>,
    acceptors: Vec<JoinHandle<()>>,
    /// Where what the acceptors take comes in, when they run on a table
    /// of descriptors of their own.
    dock: Option<Arc<Dock<Parcel>>>,
    sock_path: Option<PathBuf>,
}

impl Node {
    /// Starts the node's listeners.
    pub fn start(cfg: NodeConfig) -> Result<Node> {
        if cfg.datagram_mtu == 0 || cfg.datagram_mtu > macrolink_wire::MAX_DATAGRAM as usize {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("datagram MTU must be 1..={}", macrolink_wire::MAX_DATAGRAM),
            )));
        }
        let key = match cfg.key.clone() {
            Some(k) => k,
            None => Key::from_env()?.unwrap_or_else(|| {
                tracing::debug!("node {}: no secret given: the fabric is open", cfg.id);
                Key::open()
            }),
        };
        let ucx = cfg.ucx.as_ref().map(ucx::Context::new).transpose()?;
        let tcp = cfg.tcp.map(TcpListener::bind).transpose()?;
        let tcp_addr = tcp.as_ref().map(|l| l.local_addr()).transpose()?;
        let mut sock_path = None;
        let unix = match &cfg.shm_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                sweep_stale(dir);
                let path = dir.join(format!("node-{}.sock", cfg.id));
                // A socket file left by a dead node of the same id.
                if UnixStream::connect(&path).is_err() {
                    let _ = std::fs::remove_file(&path);
                }
                let l = UnixListener::bind(&path)?;
                SOCKETS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(path.clone());
                sock_path = Some(path);
                Some(l)
            }
            None => None,
        };
        let shared = Arc::new(NodeShared::new(
            cfg.id,
            cfg.datagram_mtu,
            cfg.shm_ring,
            cfg.shm_dir.clone(),
            tcp_addr,
            cfg.udp,
            cfg.peers.clone(),
            key,
            Gate::new(cfg.handshakes),
            ucx,
        ));
        let Acceptors {
            handles: acceptors,
            dock,
        } = start_acceptors(&shared, tcp.as_ref(), unix.as_ref())?;
        let listeners = [tcp.map(OwnedFd::from), unix.map(OwnedFd::from)]
            .into_iter()
            .flatten()
            .collect();
        Ok(Node {
            shared,
            listeners,
            acceptors,
            dock,
            sock_path,
        })
    }

    /// This node's id.
    pub fn id(&self) -> u32 {
        self.shared.id
    }

    /// The TCP address the node listens on, if tcp is enabled.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.shared.tcp_addr
    }

    /// Largest datagram payload.
    pub fn datagram_mtu(&self) -> usize {
        self.shared.mtu
    }

    /// Records the TCP address of another node.
    pub fn add_peer(&self, node: u32, addr: SocketAddr) {
        self.shared.add_peer(node, addr);
    }

    /// Opens endpoint `ep` on this node (DP-II's `dp_open`).
    pub fn open(&self, ep: u32, cfg: EndpointConfig) -> Result<Endpoint> {
        Endpoint::open(self.shared.clone(), self.dock.clone(), ep, cfg)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shared.stop();
        for l in &self.listeners {
            sys::shutdown(l.as_raw_fd());
        }
        for h in self.acceptors.drain(..) {
            let _ = h.join();
        }
        porter::close_orphans();
        if let Some(p) = &self.sock_path {
            let _ = std::fs::remove_file(p);
            let mut live = SOCKETS.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(i) = live.iter().position(|q| q == p) {
                live.swap_remove(i);
            }
        }
    }
}

/// Starts the acceptors of the listeners `tcp` and `unix`: on a table of
/// descriptors of their own where the kernel lets them (see
/// [`crate::transport::porter`]), with the dock their connections come
/// in at; else on this one, as the endpoints. Either way they hold
/// listeners of their own, and these stay the node's.
fn start_acceptors(
    shared: &Arc<NodeShared>,
    tcp: Option<&TcpListener>,
    unix: Option<&UnixListener>,
) -> io::Result<Acceptors> {
    if tcp.is_none() && unix.is_none() {
        return Ok(Acceptors {
            handles: Vec::new(),
            dock: None,
        });
    }
    let pairs = Pairs::<Parcel>::new()?;
    let (tcp_fd, unix_fd) = (tcp.map(AsRawFd::as_raw_fd), unix.map(AsRawFd::as_raw_fd));
    let keep: Vec<RawFd> = [
        tcp_fd,
        unix_fd,
        Some(pairs.parcels_tx.as_raw_fd()),
        Some(pairs.bells_rx.as_raw_fd()),
    ]
    .into_iter()
    .flatten()
    .collect();
    let porter = pairs.dock.porter().clone();
    let sh = shared.clone();
    let id = shared.id;
    let try_own = !share_table();
    let (tx, rx) = std::sync::mpsc::channel();
    let parent = std::thread::Builder::new()
        .name(format!("ml-accept-{id}"))
        .spawn(move || {
            let owned = if try_own {
                porter::own_table(&keep)
            } else {
                Err(io::Error::other("asked to share"))
            };
            let porter = match owned {
                Ok(()) => {
                    porter::mark();
                    Some(porter)
                }
                Err(e) => {
                    tracing::debug!("node {id}: the acceptors share the endpoints' table: {e}");
                    None
                }
            };
            let own = porter.is_some();
            // This table's listener of descriptor `fd`: its own copy, or
            // one of its own on the shared table.
            let take = |fd: RawFd| -> io::Result<OwnedFd> {
                if own {
                    // SAFETY: `fd` is a listener kept open in this table,
                    // which no one else closes here.
                    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
                } else {
                    // SAFETY: the node's listener, open while it starts.
                    unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()
                }
            };
            let started = (|| -> io::Result<Vec<JoinHandle<()>>> {
                let mut handles = Vec::new();
                if let Some(fd) = tcp_fd {
                    let l = TcpListener::from(take(fd)?);
                    handles.push(spawn_acceptor("tcp", &sh, &porter, move || {
                        l.accept().map(|(s, _)| Accepted::Tcp(s))
                    })?);
                }
                if let Some(fd) = unix_fd {
                    let l = UnixListener::from(take(fd)?);
                    handles.push(spawn_acceptor("shm", &sh, &porter, move || {
                        l.accept().map(|(s, _)| Accepted::Unix(s))
                    })?);
                }
                if let Some(p) = porter.clone() {
                    // Until the endpoints' side is gone, which may be after
                    // the node: not joined.
                    std::thread::Builder::new()
                        .name(format!("ml-bells-{id}"))
                        .spawn(move || p.listen_to_bells())?;
                }
                Ok(handles)
            })();
            let _ = tx.send((own, started));
        })?;
    let answer = rx.recv();
    let _ = parent.join();
    let (own, started) = answer.map_err(|_| io::Error::other("the acceptors did not start"))?;
    let handles = started?;
    // The acceptors' ends are theirs now (or unused): closed here.
    let Pairs { dock, .. } = pairs;
    Ok(Acceptors {
        handles,
        dock: own.then(|| Arc::new(dock)),
    })
}

#[cfg(test)]
thread_local! {
    /// The nodes this thread starts keep their acceptors on its table, as
    /// where the kernel refuses them one of their own.
    static SHARE_TABLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
fn share_table() -> bool {
    SHARE_TABLE.with(std::cell::Cell::get)
}

#[cfg(not(test))]
fn share_table() -> bool {
    false
}

/// Starts the acceptor `ml-{kind}-accept-{id}` of the node `sh`.
fn spawn_acceptor(
    kind: &str,
    sh: &Arc<NodeShared>,
    porter: &Option<Arc<Porter<Parcel>>>,
    accept: impl Fn() -> io::Result<Accepted> + Send + 'static,
) -> io::Result<JoinHandle<()>> {
    let (sh, p) = (sh.clone(), porter.clone());
    std::thread::Builder::new()
        .name(format!("ml-{kind}-accept-{}", sh.id))
        .spawn(move || accept_loop(sh, p, accept))
}

/// A node's acceptor threads, and the dock their connections come in at
/// when they run on a table of their own.
struct Acceptors {
    handles: Vec<JoinHandle<()>>,
    dock: Option<Arc<Dock<Parcel>>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::porter::tests::{same_table, soon, threads_named};
    use crate::types::{Addr, Completion, Mode, Transport};

    /// The signals thread `tid` of this process blocks (`SigBlk`), as a
    /// mask of bit `n - 1` for signal `n`.
    fn blocked(tid: i32) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("SigBlk:")).unwrap();
        u64::from_str_radix(line["SigBlk:".len()..].trim(), 16).unwrap()
    }

    #[test]
    fn threads_on_the_acceptors_table_take_no_signal_sent_to_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(NodeConfig::local(4413, dir.path())).unwrap();
        assert!(
            node.dock.is_some(),
            "the acceptors have a table of their own"
        );
        let bit = |sig: i32| 1u64 << (sig - 1);
        let process = [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGCHLD,
            libc::SIGPIPE,
            libc::SIGALRM,
            libc::SIGRTMIN() + 2,
        ];
        let me = rustix::thread::gettid().as_raw_nonzero().get();
        // This node's bells, and the threads on their table (its two
        // acceptors; a thread's name is cut at 15 bytes, too short for
        // theirs).
        let bells = soon(|| threads_named("ml-bells-4413"), |t| t.len() == 1)[0];
        assert_eq!(same_table(me, bells), Some(false), "a table of their own");
        let theirs = soon(
            || {
                threads_named("ml-")
                    .into_iter()
                    .filter(|&t| same_table(bells, t) == Some(true))
                    .collect::<Vec<_>>()
            },
            |t| t.len() == 3,
        );
        assert_eq!(theirs.len(), 3, "two acceptors and the bells");
        for t in theirs {
            let mask = blocked(t);
            for sig in process {
                assert_ne!(mask & bit(sig), 0, "thread {t} blocks signal {sig}");
            }
            // A fault of its own still reaches it.
            assert_eq!(mask & bit(libc::SIGSEGV), 0, "thread {t} takes its SIGSEGV");
        }
        // The thread that started the node is as it was.
        assert_eq!(blocked(me) & bit(libc::SIGTERM), 0);
    }

    #[test]
    fn acceptors_on_the_endpoints_table_where_refused_their_own_still_hand_connections_over() {
        let dir = tempfile::tempdir().unwrap();
        SHARE_TABLE.with(|s| s.set(true));
        let shared = Node::start(NodeConfig::local(4411, dir.path())).unwrap();
        SHARE_TABLE.with(|s| s.set(false));
        let own = Node::start(NodeConfig::local(4412, dir.path())).unwrap();
        shared.add_peer(4412, own.tcp_addr().unwrap());
        own.add_peer(4411, shared.tcp_addr().unwrap());
        assert!(shared.dock.is_none() && own.dock.is_some());
        // The shared node's acceptors are on this thread's table.
        let me = rustix::thread::gettid().as_raw_nonzero().get();
        let on_mine = soon(
            || {
                threads_named("ml-tcp-accept-")
                    .into_iter()
                    .filter(|&t| same_table(me, t) == Some(true))
                    .count()
            },
            |&n| n >= 1,
        );
        assert!(on_mine >= 1, "an acceptor on this thread's table");
        let cfg = EndpointConfig {
            completion: Completion::Wait,
            ..EndpointConfig::default()
        };
        // Endpoint 1 of each node dials endpoint 2 of the other, over both
        // transports: the shared node's acceptors hand what they take
        // straight over, the other's across its porter.
        let (mut a1, mut a2) = (shared.open(1, cfg).unwrap(), shared.open(2, cfg).unwrap());
        let (mut b1, mut b2) = (own.open(1, cfg).unwrap(), own.open(2, cfg).unwrap());
        let mut buf = [0u8; 16];
        for t in [Transport::Tcp, Transport::Shm] {
            for (from, to, node) in [(&mut a1, &mut b2, 4412), (&mut b1, &mut a2, 4411)] {
                let target = from
                    .target_via(Addr::new(node, 2), Mode::Reliable, t)
                    .unwrap();
                from.write(target, b"over").unwrap();
                let got = to.read(&mut buf).unwrap();
                assert_eq!(&buf[..got.len], b"over", "{t:?} to node {node}");
            }
        }
    }
}
