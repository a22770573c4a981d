//! How endpoints of different nodes meet: dialling a peer's node over TCP
//! or its unix socket, the hello handshake, and the acceptor threads that
//! hand an accepted connection to the endpoint it names.
//!
//! ```text
//!  initiator endpoint                 node of the target
//!  ─────────────────                  ──────────────────
//!  connect(tcp | unix socket) ───────► acceptor thread
//!  Hello{src, dst_ep[, segment]} ────► handshake thread: endpoint open?
//!                      ◄───────────── HelloOk / HelloRefused
//!                                      stream handed to the endpoint's inbox,
//!                                      eventfd rung; the endpoint adopts it
//!                                      on its next progress call
//! ```
//!
//! [`NodeShared`] is what a node's endpoints and acceptors share; the
//! `Node` that owns it ([`crate::node`]) only starts and stops them.

use macrolink_wire::{Flags, FrameKind, Header, Refusal, HEADER_LEN};
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::sys::{self, EventFd};
use crate::transport::shm::{ShmStream, Side};
use crate::transport::Stream;
use crate::types::{Addr, Transport};

/// How long a handshake, from either side, may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A rail (see `Endpoint::target_at`) whose sent data stays unacknowledged
/// this long is taken for dead, by both ends.
pub const RAIL_USER_TIMEOUT_MS: u32 = 2000;

/// A connection the node accepted for one of its endpoints.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub(crate) peer: Addr,
    pub(crate) stream: Stream,
}

/// Where the node's acceptors leave new connections of one endpoint.
#[derive(Debug)]
pub(crate) struct Inbox {
    pending: Mutex<Vec<Incoming>>,
    flag: AtomicBool,
    pub(crate) wake: EventFd,
    pub(crate) udp_port: u16,
}

impl Inbox {
    pub(crate) fn new(udp_port: u16) -> io::Result<Inbox> {
        Ok(Inbox {
            pending: Mutex::new(Vec::new()),
            flag: AtomicBool::new(false),
            wake: EventFd::new()?,
            udp_port,
        })
    }

    fn push(&self, inc: Incoming) {
        lock(&self.pending).push(inc);
        self.flag.store(true, Ordering::Release);
        self.wake.notify();
    }

    /// New connections, if any; one atomic load when there are none.
    pub(crate) fn take(&self, into: &mut Vec<Incoming>) {
        if self.flag.load(Ordering::Acquire) && self.flag.swap(false, Ordering::AcqRel) {
            into.append(&mut lock(&self.pending));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// State shared by a node's endpoints and acceptor threads.
#[derive(Debug)]
pub(crate) struct NodeShared {
    pub(crate) id: u32,
    pub(crate) mtu: usize,
    pub(crate) ring: usize,
    pub(crate) shm_dir: Option<PathBuf>,
    pub(crate) seg_dir: PathBuf,
    pub(crate) tcp_addr: Option<SocketAddr>,
    pub(crate) udp_ip: Option<IpAddr>,
    peers: Mutex<BTreeMap<u32, SocketAddr>>,
    registry: Mutex<HashMap<u32, Arc<Inbox>>>,
    seg_counter: AtomicU64,
    stopping: AtomicBool,
}

impl NodeShared {
    /// The shared state of a node that has not started any listener yet.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u32,
        mtu: usize,
        ring: usize,
        shm_dir: Option<PathBuf>,
        seg_dir: PathBuf,
        tcp_addr: Option<SocketAddr>,
        udp_ip: Option<IpAddr>,
        peers: BTreeMap<u32, SocketAddr>,
    ) -> NodeShared {
        NodeShared {
            id,
            mtu,
            ring,
            shm_dir,
            seg_dir,
            tcp_addr,
            udp_ip,
            peers: Mutex::new(peers),
            registry: Mutex::new(HashMap::new()),
            seg_counter: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        }
    }

    /// Records the TCP address of another node.
    pub(crate) fn add_peer(&self, node: u32, addr: SocketAddr) {
        lock(&self.peers).insert(node, addr);
    }

    /// Tells the acceptors to stop at their next wake-up.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    pub(crate) fn register(&self, ep: u32, inbox: Arc<Inbox>) -> Result<()> {
        let mut reg = lock(&self.registry);
        if reg.contains_key(&ep) {
            return Err(Error::EndpointInUse(ep));
        }
        reg.insert(ep, inbox);
        Ok(())
    }

    pub(crate) fn unregister(&self, ep: u32) {
        lock(&self.registry).remove(&ep);
    }

    fn inbox(&self, ep: u32) -> Option<Arc<Inbox>> {
        lock(&self.registry).get(&ep).cloned()
    }

    fn sock_path(&self, node: u32) -> Option<PathBuf> {
        self.shm_dir
            .as_ref()
            .map(|d| d.join(format!("node-{node}.sock")))
    }

    /// Whether `node` can be reached over shared memory from here.
    pub(crate) fn shm_reaches(&self, node: u32) -> bool {
        self.sock_path(node).is_some_and(|p| p.exists())
    }

    pub(crate) fn tcp_peer(&self, node: u32) -> Option<SocketAddr> {
        if node == self.id {
            return self.tcp_addr;
        }
        lock(&self.peers).get(&node).copied()
    }

    /// Opens a connection from endpoint `from` to `to`.
    pub(crate) fn connect(&self, from: Addr, to: Addr, transport: Transport) -> Result<Stream> {
        let unreachable = Error::Unreachable {
            node: to.node,
            transport,
        };
        let mut hello = Header::new(FrameKind::Hello);
        hello.src_node = from.node;
        hello.src_ep = from.ep;
        hello.dst_ep = to.ep;
        match transport {
            Transport::Tcp => {
                let addr = self.tcp_peer(to.node).ok_or(unreachable)?;
                self.connect_tcp(from, to, addr)
            }
            Transport::Shm => {
                let path = self.sock_path(to.node).ok_or(unreachable)?;
                let mut s = UnixStream::connect(&path).map_err(|e| match e.kind() {
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
                        Error::Unreachable {
                            node: to.node,
                            transport,
                        }
                    }
                    _ => e.into(),
                })?;
                s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
                // Unique on the host even for two nodes of one id in a process.
                let mut salt = [0u8; 8];
                getrandom::fill(&mut salt).map_err(|e| io::Error::other(e.to_string()))?;
                let seg = self.seg_dir.join(format!(
                    "macrolink-{}-{}-{}-{}-{:016x}",
                    std::process::id(),
                    from.node,
                    from.ep,
                    self.seg_counter.fetch_add(1, Ordering::Relaxed),
                    u64::from_le_bytes(salt)
                ));
                let (_file, map) = ShmStream::create(&seg, self.ring)?;
                let name = seg.as_os_str().as_encoded_bytes();
                hello.len = name.len() as u32;
                hello.total = self.ring as u64;
                let sent = s
                    .write_all(&hello.encode())
                    .and_then(|()| s.write_all(name))
                    .map_err(Error::from)
                    .and_then(|()| expect_ok(&mut s, to));
                // Both sides have it mapped (or the peer refused): the name
                // is no longer needed.
                let _ = std::fs::remove_file(&seg);
                sent?;
                s.set_read_timeout(None)?;
                Ok(Stream::Shm(Box::new(ShmStream::new(
                    map,
                    self.ring,
                    Side::Initiator,
                    s,
                )?)))
            }
            Transport::Udp => Err(Error::Unsupported {
                transport,
                mode: crate::types::Mode::Reliable,
            }),
        }
    }

    /// Opens a TCP connection from endpoint `from` to `to` at `addr`.
    pub(crate) fn connect_tcp(&self, from: Addr, to: Addr, addr: SocketAddr) -> Result<Stream> {
        self.connect_tcp_within(from, to, addr, HANDSHAKE_TIMEOUT, None)
    }

    /// As `connect_tcp`, giving up on the connection after `dial`; with
    /// `rail`, a rail that both ends fail within that many milliseconds of
    /// its link going dark.
    pub(crate) fn connect_tcp_within(
        &self,
        from: Addr,
        to: Addr,
        addr: SocketAddr,
        dial: Duration,
        rail: Option<u32>,
    ) -> Result<Stream> {
        let mut hello = Header::new(FrameKind::Hello);
        hello.src_node = from.node;
        hello.src_ep = from.ep;
        hello.dst_ep = to.ep;
        let mut s = TcpStream::connect_timeout(&addr, dial)?;
        if let Some(ms) = rail {
            hello.flags = Flags::RAIL;
            sys::fail_fast(s.as_raw_fd(), ms)?;
        }
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        s.write_all(&hello.encode())?;
        expect_ok(&mut s, to)?;
        s.set_read_timeout(None)?;
        s.set_nonblocking(true)?;
        Ok(Stream::Tcp(s))
    }

    /// Asks the node of `to` for the UDP address of endpoint `to.ep`.
    pub(crate) fn resolve_udp(&self, from: Addr, to: Addr) -> Result<SocketAddr> {
        let addr = self.tcp_peer(to.node).ok_or(Error::Unreachable {
            node: to.node,
            transport: Transport::Udp,
        })?;
        let mut s = TcpStream::connect_timeout(&addr, HANDSHAKE_TIMEOUT)?;
        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let mut hello = Header::new(FrameKind::Hello);
        hello.flags = Flags::RESOLVE_UDP;
        hello.src_node = from.node;
        hello.src_ep = from.ep;
        hello.dst_ep = to.ep;
        s.write_all(&hello.encode())?;
        let port = expect_ok(&mut s, to)?;
        if port == 0 || port > u64::from(u16::MAX) {
            return Err(Error::Unreachable {
                node: to.node,
                transport: Transport::Udp,
            });
        }
        Ok(SocketAddr::new(addr.ip(), port as u16))
    }
}

/// Reads the handshake answer; returns its `offset` field.
fn expect_ok(s: &mut impl Read, to: Addr) -> Result<u64> {
    let mut b = [0u8; HEADER_LEN];
    s.read_exact(&mut b)?;
    let h = Header::decode(&b).map_err(|source| Error::Protocol {
        peer: to.to_string(),
        source,
    })?;
    match h.kind {
        FrameKind::HelloOk => Ok(h.offset),
        FrameKind::HelloRefused => match Refusal::from_code(h.offset) {
            Refusal::NoSuchEndpoint => Err(Error::NoSuchEndpoint(to)),
            r => Err(Error::Io(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                r.to_string(),
            ))),
        },
        _ => Err(Error::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            "unexpected handshake answer",
        ))),
    }
}

/// A socket an acceptor took.
pub(crate) enum Accepted {
    /// From the TCP listener.
    Tcp(TcpStream),
    /// From the unix socket of shared memory.
    Unix(UnixStream),
}

/// Takes connections from `accept` and hands each to a handshake thread,
/// until the node stops.
pub(crate) fn accept_loop(shared: Arc<NodeShared>, accept: impl Fn() -> io::Result<Accepted>) {
    loop {
        let acc = accept();
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        match acc {
            Ok(a) => {
                let sh = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("ml-handshake".into())
                    .spawn(move || {
                        if let Err(e) = handshake(&sh, a) {
                            tracing::debug!("handshake failed: {e}");
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!("cannot start a handshake: {e}");
                }
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn reply(s: &mut impl Write, kind: FrameKind, code: u64) -> io::Result<()> {
    let mut h = Header::new(kind);
    h.offset = code;
    s.write_all(&h.encode())
}

fn read_hello(s: &mut impl Read) -> io::Result<Header> {
    let mut b = [0u8; HEADER_LEN];
    s.read_exact(&mut b)?;
    match Header::decode(&b) {
        Ok(h) if h.kind == FrameKind::Hello => Ok(h),
        Ok(_) => Err(io::Error::new(io::ErrorKind::InvalidData, "expected hello")),
        Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e)),
    }
}

fn handshake(shared: &NodeShared, acc: Accepted) -> io::Result<()> {
    match acc {
        Accepted::Tcp(mut s) => {
            s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
            s.set_nodelay(true)?;
            let h = read_hello(&mut s)?;
            if h.len != 0 {
                return reply(&mut s, FrameKind::HelloRefused, Refusal::Malformed.code());
            }
            let Some(inbox) = shared.inbox(h.dst_ep) else {
                return reply(
                    &mut s,
                    FrameKind::HelloRefused,
                    Refusal::NoSuchEndpoint.code(),
                );
            };
            if h.flags.contains(Flags::RESOLVE_UDP) {
                return reply(&mut s, FrameKind::HelloOk, u64::from(inbox.udp_port));
            }
            if h.flags.contains(Flags::RAIL) {
                // This end too must not wait on a dark link: a reader in
                // the middle of a message from it, or a writer of answers
                // into it, would hold the endpoint up.
                sys::fail_fast(s.as_raw_fd(), RAIL_USER_TIMEOUT_MS)?;
            }
            reply(&mut s, FrameKind::HelloOk, 0)?;
            s.set_read_timeout(None)?;
            s.set_nonblocking(true)?;
            inbox.push(Incoming {
                peer: Addr::new(h.src_node, h.src_ep),
                stream: Stream::Tcp(s),
            });
            Ok(())
        }
        Accepted::Unix(mut s) => {
            s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
            let h = read_hello(&mut s)?;
            let mut name = vec![0u8; h.len as usize];
            s.read_exact(&mut name)?;
            let Some(inbox) = shared.inbox(h.dst_ep) else {
                return reply(
                    &mut s,
                    FrameKind::HelloRefused,
                    Refusal::NoSuchEndpoint.code(),
                );
            };
            let map = match segment_path(shared, &name)
                .and_then(|p| ShmStream::open(&p, h.total as usize))
            {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!("refusing shm connection: {e}");
                    return reply(&mut s, FrameKind::HelloRefused, Refusal::Malformed.code());
                }
            };
            reply(&mut s, FrameKind::HelloOk, 0)?;
            s.set_read_timeout(None)?;
            let stream = ShmStream::new(map, h.total as usize, Side::Acceptor, s)?;
            inbox.push(Incoming {
                peer: Addr::new(h.src_node, h.src_ep),
                stream: Stream::Shm(Box::new(stream)),
            });
            Ok(())
        }
    }
}

/// The segment a peer names must be one of ours: in the segment directory,
/// with our prefix.
fn segment_path(shared: &NodeShared, name: &[u8]) -> io::Result<PathBuf> {
    let p = PathBuf::from(
        std::str::from_utf8(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "segment name not UTF-8"))?,
    );
    let ok = p.parent() == Some(shared.seg_dir.as_path())
        && p.file_name()
            .and_then(|f| f.to_str())
            .is_some_and(|f| f.starts_with("macrolink-") && !f.contains('/'));
    if ok {
        Ok(p)
    } else {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "segment outside the segment directory",
        ))
    }
}

/// Removes segment and region files whose creating process is gone (it was
/// killed before it could remove them).
pub(crate) fn sweep_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("macrolink-")) else {
            continue;
        };
        let rest = rest.strip_prefix("region-").unwrap_or(rest);
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks that the process exists.
        let gone = unsafe { libc::kill(pid, 0) } == -1
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_of_dead_processes_are_swept_and_live_ones_kept() {
        let d = tempfile::tempdir().unwrap();
        let dead = d.path().join("macrolink-region-2147483646-00ff");
        let dead_seg = d.path().join("macrolink-2147483646-1-1-0-00ff");
        let live = d
            .path()
            .join(format!("macrolink-region-{}-00ff", std::process::id()));
        let other = d.path().join("unrelated-2147483646");
        for p in [&dead, &dead_seg, &live, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        sweep_stale(d.path());
        assert!(!dead.exists() && !dead_seg.exists());
        assert!(live.exists() && other.exists());
    }
}
