//! How endpoints of different nodes meet: dialling a peer's node over TCP
//! or its unix socket, the hello handshake, and the acceptor threads that
//! hand an accepted connection to the endpoint it names.
//!
//! ```text
//!  initiator endpoint                 node of the target
//!  ─────────────────                  ──────────────────
//!  connect(tcp | unix socket) ───────► acceptor thread ─► gate (deadline, caps)
//!                      ◄───────────── Challenge{nonce}
//!  Hello{src, dst_ep, session}
//!   + Proof (+ segment memfd) ───────► handshake thread: key proven? endpoint
//!                                      open? of its session?
//!                      ◄───────────── HelloOk + proof / HelloRefused
//!                                      stream handed to the endpoint's inbox,
//!                                      eventfd rung; the endpoint adopts it
//!                                      on its next progress call
//! ```
//!
//! The acceptors and their handshake threads run on a table of
//! descriptors of their own where the kernel allows it: the stream then
//! crosses to the endpoints' table through the node's porter
//! ([`super::porter`]) rather than straight into the inbox.
//!
//! Both sides prove the fabric key ([`crate::Key`]); a peer that cannot is
//! refused before it reaches any endpoint. The whole handshake has one
//! deadline, and the node's [`Gate`] caps how many are pending.
//!
//! [`NodeShared`] is what a node's endpoints and acceptors share; the
//! `Node` that owns it ([`crate::node`]) only starts and stops them.

use macrolink_wire::{
    Challenge, Flags, FrameKind, Header, Proof, Refusal, CHALLENGE_LEN, HEADER_LEN, MAC_LEN,
    NONCE_LEN, PROOF_LEN,
};
use memmap2::MmapRaw;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::mem::ManuallyDrop;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::framed::Framed;
use super::memfd;
use super::porter::{self, Dock, Porter};
use super::shm::{Bells, ShmStream, Side};
use super::tcp::Tcp;
use super::ucx;
use super::Connection;
use crate::error::{Error, Result};
use crate::gate::{Gate, Source, Timed};
use crate::key::{self, Key};
use crate::transport::sys::{self, EventFd};
use crate::types::{Addr, Transport};

/// How long a handshake, from either side, may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A rail (see `Endpoint::target_at`) whose sent data stays unacknowledged
/// this long is taken for dead, by both ends.
pub const RAIL_USER_TIMEOUT_MS: u32 = 2000;

/// The transport half of a connection, dialled or accepted, before its
/// endpoint takes it.
#[derive(Debug)]
pub(crate) enum Dialled {
    Tcp(TcpStream),
    /// Boxed: a stream's rings and offers outweigh the other kinds.
    Shm(Box<ShmStream>),
    Ucx(ucx::Contact),
}

impl Dialled {
    /// The connection to `peer` at `id` (slot, generation) of its
    /// endpoint, whose UCX worker is `ucx`.
    pub(crate) fn connect(
        self,
        peer: Addr,
        id: (u32, u32),
        ucx: Option<&mut ucx::Port>,
    ) -> Result<Box<dyn Connection>> {
        Ok(match self {
            Dialled::Tcp(s) => Box::new(Framed::new(peer, id, Tcp::new(s))),
            Dialled::Shm(s) => Box::new(Framed::new(peer, id, *s)),
            Dialled::Ucx(c) => {
                let port = ucx.ok_or(Error::Unreachable {
                    node: peer.node,
                    transport: Transport::Ucx,
                })?;
                Box::new(port.connect(c, peer, id)?)
            }
        })
    }
}

/// A connection the node accepted for one of its endpoints.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub(crate) peer: Addr,
    pub(crate) link: Dialled,
}

/// `Inbox::session_node` of an endpoint bound to no session (node ids are
/// `u32`).
const UNBOUND: u64 = u64::MAX;

/// Where the node's acceptors leave new connections of one endpoint.
#[derive(Debug)]
pub(crate) struct Inbox {
    pending: Mutex<Vec<Incoming>>,
    flag: AtomicBool,
    /// Rung by whoever hands the endpoint a connection from its table
    /// (the acceptors from theirs ring a copy, see [`super::porter`]).
    pub(crate) wake: ManuallyDrop<EventFd>,
    pub(crate) udp_port: u16,
    /// The endpoint's UCX worker, as its acceptors need it.
    pub(crate) ucx: Option<Arc<ucx::Shared>>,
    /// The one peer node (and the session token) the endpoint hears, if
    /// bound.
    session: Mutex<Option<(u32, u64)>>,
    /// The node of `session` (`UNBOUND` when none): what a datagram is
    /// checked against, one atomic load rather than a lock per datagram.
    session_node: AtomicU64,
    /// Connections and frames refused because they were of another session.
    pub(crate) strangers: AtomicU64,
    /// This inbox among all of the process's, as an endpoint's id may be
    /// opened again.
    pub(crate) serial: u64,
}

/// The serial of the next inbox.
static INBOXES: AtomicU64 = AtomicU64::new(0);

impl Inbox {
    pub(crate) fn new(udp_port: u16, ucx: Option<Arc<ucx::Shared>>) -> io::Result<Inbox> {
        Ok(Inbox {
            pending: Mutex::new(Vec::new()),
            flag: AtomicBool::new(false),
            wake: ManuallyDrop::new(EventFd::new()?),
            udp_port,
            ucx,
            session: Mutex::new(None),
            session_node: AtomicU64::new(UNBOUND),
            strangers: AtomicU64::new(0),
            serial: INBOXES.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Binds the endpoint to one peer node and session token.
    pub(crate) fn bind(&self, node: u32, token: u64) {
        let mut session = lock(&self.session);
        *session = Some((node, token));
        self.session_node.store(u64::from(node), Ordering::Release);
    }

    /// The session token outgoing hellos carry (0 when unbound).
    pub(crate) fn token(&self) -> u64 {
        lock(&self.session).map_or(0, |(_, t)| t)
    }

    /// Whether a connection from `peer` with `token` (or a datagram from
    /// `peer`, with `None`) is of the endpoint's session (always, when it is
    /// not bound); counts the ones that are not.
    pub(crate) fn admits(&self, peer: Addr, token: Option<u64>) -> bool {
        let ok = match token {
            None => match self.session_node.load(Ordering::Acquire) {
                UNBOUND => true,
                n => n == u64::from(peer.node),
            },
            Some(x) => match *lock(&self.session) {
                None => true,
                Some((n, t)) => n == peer.node && x == t,
            },
        };
        if !ok {
            self.strangers.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    pub(crate) fn push(&self, inc: Incoming) {
        lock(&self.pending).push(inc);
        self.flag.store(true, Ordering::Release);
        self.wake.notify();
    }

    /// Has the endpoint look for new connections without waking it: they
    /// wait with the node's porter (see [`super::porter`]).
    pub(crate) fn stir(&self) {
        self.flag.store(true, Ordering::Release);
    }

    /// Whether new connections may be waiting: one atomic load.
    #[inline]
    pub(crate) fn stirred(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// New connections, if any; one atomic load when there are none.
    pub(crate) fn take(&self, into: &mut Vec<Incoming>) {
        if self.flag.load(Ordering::Acquire) && self.flag.swap(false, Ordering::AcqRel) {
            into.append(&mut lock(&self.pending));
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and not used after.
        let wake = unsafe { ManuallyDrop::take(&mut self.wake) };
        if porter::on_acceptors_table() {
            // The last holder was a handshake on the acceptors' table,
            // where the doorbell's number is not the doorbell.
            porter::orphan(wake.into_raw());
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
    pub(crate) tcp_addr: Option<SocketAddr>,
    pub(crate) udp_ip: Option<IpAddr>,
    peers: Mutex<BTreeMap<u32, SocketAddr>>,
    registry: Mutex<HashMap<u32, Arc<Inbox>>>,
    key: Key,
    /// What every datagram of this fabric carries in its `key` field, as
    /// InfiniBand's Q_Key: derived from the fabric key.
    pub(crate) datagram_token: u64,
    pub(crate) gate: Gate,
    /// The node's UCX context, when it has UCX.
    pub(crate) ucx: Option<Arc<ucx::Context>>,
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
        tcp_addr: Option<SocketAddr>,
        udp_ip: Option<IpAddr>,
        peers: BTreeMap<u32, SocketAddr>,
        key: Key,
        gate: Gate,
        ucx: Option<Arc<ucx::Context>>,
    ) -> NodeShared {
        NodeShared {
            id,
            mtu,
            ring,
            shm_dir,
            tcp_addr,
            udp_ip,
            peers: Mutex::new(peers),
            registry: Mutex::new(HashMap::new()),
            datagram_token: key.datagram_token(),
            key,
            gate,
            ucx,
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

    pub(crate) fn inbox(&self, ep: u32) -> Option<Arc<Inbox>> {
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

    /// Opens a connection from endpoint `from` (whose UCX worker, if it
    /// has one, is `ucx`) to `to`; the hello carries `session` (0: none).
    pub(crate) fn connect(
        &self,
        from: Addr,
        to: Addr,
        transport: Transport,
        session: u64,
        ucx: Option<Arc<ucx::Shared>>,
    ) -> Result<Dialled> {
        let unreachable = Error::Unreachable {
            node: to.node,
            transport,
        };
        let mut hello = Header::new(FrameKind::Hello);
        hello.src_node = from.node;
        hello.src_ep = from.ep;
        hello.dst_ep = to.ep;
        hello.key = session;
        match transport {
            Transport::Tcp => {
                let addr = self.tcp_peer(to.node).ok_or(unreachable)?;
                self.connect_tcp_within(from, to, addr, HANDSHAKE_TIMEOUT, None, session)
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
                let (segment, map) = ShmStream::create(self.ring)?;
                let (bells, [hear, ring, keep]) = Bells::pair()?;
                hello.total = self.ring as u64;
                // The acceptor's ends of the doorbells go with the segment,
                // and this side keeps no copy of them: a pipe's end is the
                // peer gone only when no one else holds its other end.
                let fds = [segment.as_fd(), hear.as_fd(), ring.as_fd(), keep.as_fd()];
                self.hello(&mut s, hello, &fds, to)?;
                drop((hear, ring, keep));
                Ok(Dialled::Shm(Box::new(ShmStream::new(
                    map,
                    self.ring,
                    Side::Initiator,
                    s,
                    bells,
                )?)))
            }
            Transport::Udp => Err(Error::Unsupported {
                transport,
                mode: crate::types::Mode::Reliable,
            }),
            Transport::Ucx => {
                let addr = self.tcp_peer(to.node).ok_or(unreachable)?;
                let side = ucx.ok_or(Error::NoUcx)?;
                hello.flags = Flags::UCX;
                self.connect_ucx(addr, hello, to, side)
            }
        }
    }

    /// Dials `to`'s node at `addr` with `hello`, then trades UCX cards with
    /// it under the handshake's deadline.
    fn connect_ucx(
        &self,
        addr: SocketAddr,
        hello: Header,
        to: Addr,
        side: Arc<ucx::Shared>,
    ) -> Result<Dialled> {
        let until = Instant::now() + HANDSHAKE_TIMEOUT;
        let (index, token) = side.allocate()?.ok_or(Error::Refused {
            peer: to,
            why: Refusal::Busy,
        })?;
        let traded = (|| -> Result<Dialled> {
            let mut s = TcpStream::connect_timeout(&addr, HANDSHAKE_TIMEOUT)?;
            s.set_nodelay(true)?;
            self.hello(&mut s, hello, &[], to)?;
            let mut t = Timed {
                stream: &mut s,
                until,
            };
            t.write_all(&side.card(index, token).encode())?;
            let peer = read_card(&mut t).map_err(|source| Error::Protocol {
                peer: to.to_string(),
                source,
            })?;
            Ok(Dialled::Ucx(ucx::Contact::new(
                s,
                index,
                token,
                peer,
                side.clone(),
            )))
        })();
        if traded.is_err() {
            side.free(index);
        }
        traded
    }

    /// Opens a TCP connection from endpoint `from` to `to` at `addr`,
    /// giving up on the connection after `dial`; with `rail`, a rail that
    /// both ends fail within that many milliseconds of its link going dark.
    pub(crate) fn connect_tcp_within(
        &self,
        from: Addr,
        to: Addr,
        addr: SocketAddr,
        dial: Duration,
        rail: Option<u32>,
        session: u64,
    ) -> Result<Dialled> {
        let mut hello = Header::new(FrameKind::Hello);
        hello.src_node = from.node;
        hello.src_ep = from.ep;
        hello.dst_ep = to.ep;
        hello.key = session;
        let mut s = TcpStream::connect_timeout(&addr, dial)?;
        if let Some(ms) = rail {
            hello.flags = Flags::RAIL;
            sys::fail_fast(s.as_raw_fd(), ms)?;
        }
        s.set_nodelay(true)?;
        self.hello(&mut s, hello, &[], to)?;
        s.set_nonblocking(true)?;
        Ok(Dialled::Tcp(s))
    }

    /// Asks the node of `to` for the UDP address of endpoint `to.ep`.
    pub(crate) fn resolve_udp(&self, from: Addr, to: Addr) -> Result<SocketAddr> {
        let addr = self.tcp_peer(to.node).ok_or(Error::Unreachable {
            node: to.node,
            transport: Transport::Udp,
        })?;
        let mut s = TcpStream::connect_timeout(&addr, HANDSHAKE_TIMEOUT)?;
        let mut hello = Header::new(FrameKind::Hello);
        hello.flags = Flags::RESOLVE_UDP;
        hello.src_node = from.node;
        hello.src_ep = from.ep;
        hello.dst_ep = to.ep;
        let port = self.hello(&mut s, hello, &[], to)?;
        if port == 0 || port > u64::from(u16::MAX) {
            return Err(Error::Unreachable {
                node: to.node,
                transport: Transport::Udp,
            });
        }
        Ok(SocketAddr::new(addr.ip(), port as u16))
    }

    /// The initiator's side of the handshake (see [`handshake`]).
    fn hello<S>(&self, s: &mut S, hello: Header, fds: &[BorrowedFd<'_>], to: Addr) -> Result<u64>
    where
        S: Read + Write + AsRawFd + AsFd,
    {
        initiate(s, &self.key, hello, fds, to)
    }
}

/// The initiator's side of the handshake on a connected socket, all of it
/// within five seconds: answers the node's challenge with `hello` and its
/// proof under `key`, and checks the node's proof. Returns the answer's
/// `offset` field (the endpoint's UDP port for a resolve). For tools and
/// tests that speak the fabric's wire by hand; endpoints dial by
/// themselves.
pub fn handshake(s: &mut TcpStream, key: &Key, hello: Header) -> Result<u64> {
    let to = Addr::new(0, hello.dst_ep);
    initiate(s, key, hello, &[], to)
}

fn initiate<S>(s: &mut S, key: &Key, hello: Header, fds: &[BorrowedFd<'_>], to: Addr) -> Result<u64>
where
    S: Read + Write + AsRawFd + AsFd,
{
    let protocol = |source| Error::Protocol {
        peer: to.to_string(),
        source,
    };
    let mut t = Timed {
        stream: s,
        until: Instant::now() + HANDSHAKE_TIMEOUT,
    };
    let mut c = [0u8; CHALLENGE_LEN];
    t.read_exact(&mut c)?;
    let challenge = Challenge::decode(&c).map_err(protocol)?;
    let nonce = key::nonce()?;
    let hb = hello.encode();
    let proof = Proof {
        nonce,
        mac: key.initiator_mac(&challenge.nonce, &[&hb], &nonce),
    };
    let mut msg = [0u8; HEADER_LEN + PROOF_LEN];
    msg[..HEADER_LEN].copy_from_slice(&hb);
    msg[HEADER_LEN..].copy_from_slice(&proof.encode());
    if fds.is_empty() {
        t.write_all(&msg)?;
    } else {
        t.ready(sys::Interest::Write)?;
        memfd::send_with_fds(&*t.stream, &msg, fds)?;
    }
    let mut a = [0u8; HEADER_LEN];
    t.read_exact(&mut a)?;
    let h = Header::decode(&a).map_err(protocol)?;
    match h.kind {
        FrameKind::HelloOk => {
            let mut mac = [0u8; MAC_LEN];
            t.read_exact(&mut mac)?;
            let want = key.acceptor_mac(&nonce, &challenge.nonce, &a);
            if !key::macs_match(&want, &mac) {
                return Err(Error::Unauthenticated { peer: to });
            }
            Ok(h.offset)
        }
        FrameKind::HelloRefused => match Refusal::from_code(h.offset) {
            Refusal::NoSuchEndpoint => Err(Error::NoSuchEndpoint(to)),
            Refusal::Unauthenticated => Err(Error::Unauthenticated { peer: to }),
            why => Err(Error::Refused { peer: to, why }),
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
/// `porter`: the acceptors run on a table of descriptors of their own
/// (see [`super::porter`]), and what they take crosses to the endpoints'
/// through it; `None`, on the endpoints' table.
pub(crate) fn accept_loop(
    shared: Arc<NodeShared>,
    porter: Option<Arc<Porter<Parcel>>>,
    accept: impl Fn() -> io::Result<Accepted>,
) {
    if porter.is_some() {
        porter::mark();
    }
    loop {
        let acc = accept();
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        match acc {
            Ok(a) => {
                let sh = shared.clone();
                let porter = porter.clone();
                let spawned = std::thread::Builder::new()
                    .name("ml-handshake".into())
                    .spawn(move || {
                        if porter.is_some() {
                            porter::mark();
                        }
                        if let Err(e) = accept_one(&sh, porter.as_deref(), a) {
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

fn refuse(s: &mut impl Write, why: Refusal) -> io::Result<()> {
    let mut h = Header::new(FrameKind::HelloRefused);
    h.offset = why.code();
    s.write_all(&h.encode())
}

fn accept_one(
    shared: &NodeShared,
    porter: Option<&Porter<Parcel>>,
    acc: Accepted,
) -> io::Result<()> {
    let to = To { shared, porter };
    match acc {
        Accepted::Tcp(mut s) => {
            let from = Source::Ip(s.peer_addr()?.ip());
            let pass = shared.gate.enter(from, &s)?;
            s.set_nodelay(true)?;
            let sock = s.try_clone()?;
            greet(to, &mut s, pass.until, false, move |h, _| {
                if h.flags.contains(Flags::RAIL) {
                    // This end too must not wait on a dark link: a reader in
                    // the middle of a message from it, or a writer of answers
                    // into it, would hold the endpoint up.
                    sys::fail_fast(sock.as_raw_fd(), RAIL_USER_TIMEOUT_MS)?;
                }
                sock.set_nonblocking(true)?;
                Ok(Taken::Tcp(sock))
            })
        }
        Accepted::Unix(mut s) => {
            let uid =
                rustix::net::sockopt::socket_peercred(&s).map_or(u32::MAX, |c| c.uid.as_raw());
            let pass = shared.gate.enter(Source::Uid(uid), &s)?;
            let sock = s.try_clone()?;
            greet(to, &mut s, pass.until, true, move |h, fds| {
                let [Some(segment), Some(hear), Some(ring), Some(keep)] = fds else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "no segment and doorbells came with the hello",
                    ));
                };
                let cap = h.total as usize;
                let map = ShmStream::open(segment, cap)?;
                let bells = Bells::from_peer([hear, ring, keep])?;
                Ok(Taken::Shm {
                    map,
                    cap,
                    sock,
                    bells,
                })
            })
        }
    }
}

/// The acceptor's side of the handshake, all of it by `until`: challenge,
/// hello and proof, the checks, then `make` builds the stream, which goes
/// to its endpoint before the answer goes out.
fn greet<S>(
    to: To<'_>,
    s: &mut S,
    until: Instant,
    unix: bool,
    make: impl FnOnce(&Header, HelloFds) -> io::Result<Taken>,
) -> io::Result<()>
where
    S: Read + Write + AsRawFd + AsFd,
{
    let shared = to.shared;
    let mut t = Timed { stream: s, until };
    let (heard, inbox, fds) = match hear_hello(shared, &mut t, unix)? {
        Some(h) => h,
        None => return Ok(()),
    };
    let h = heard.hello;
    let peer = Addr::new(h.src_node, h.src_ep);
    let answer = |t: &mut Timed<'_, S>| -> io::Result<()> {
        t.write_all(
            heard
                .answer(&shared.key, &Header::new(FrameKind::HelloOk))
                .as_slice(),
        )
    };
    let ucx = h.flags.contains(Flags::UCX);
    let side = match (ucx, &inbox.ucx) {
        (false, _) => None,
        (true, Some(side)) if !unix => Some(side.clone()),
        (true, _) => return refuse(&mut t, Refusal::Unsupported),
    };
    let stream = match make(&h, fds) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("refusing a connection from {peer}: {e}");
            return refuse(&mut t, Refusal::Malformed);
        }
    };
    let (Some(side), Taken::Tcp(sock)) = (side, &stream) else {
        // The connection is the endpoint's before the answer goes: the
        // initiator, answered, may tell the endpoint over another
        // connection to reply over this one, and the endpoint must then
        // find it. An answer that fails leaves it to find the connection
        // closed.
        if let Err(e) = to.deliver(h.dst_ep, &inbox, peer, stream) {
            tracing::warn!("refusing a connection from {peer}: {e}");
            // The porter's parcels full, or the stream not built here.
            let why = match to.porter {
                Some(_) => Refusal::Busy,
                None => Refusal::Malformed,
            };
            return refuse(&mut t, why);
        }
        answer(&mut t)?;
        return Ok(());
    };
    // UCX: the cards follow the answer; the connection is the endpoint's
    // before this side's card goes, so that the peer's first message finds
    // it.
    if side.refuses(peer.node) {
        return refuse(&mut t, Refusal::Held);
    }
    let Some((index, token)) = side.allocate()? else {
        return refuse(&mut t, Refusal::Busy);
    };
    answer(&mut t)?;
    let card = read_card(&mut t).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let contact = ucx::Contact::new(sock.try_clone()?, index, token, card, side.clone()).accepted();
    to.deliver(h.dst_ep, &inbox, peer, Taken::Ucx(contact))?;
    t.write_all(&side.card(index, token).encode())
}

/// Where a handshake's connection goes: straight to its endpoint's inbox,
/// or, from an acceptors' table of their own, through the porter.
#[derive(Clone, Copy)]
struct To<'a> {
    shared: &'a NodeShared,
    porter: Option<&'a Porter<Parcel>>,
}

impl To<'_> {
    fn deliver(&self, ep: u32, inbox: &Inbox, peer: Addr, taken: Taken) -> io::Result<()> {
        match self.porter {
            Some(p) => {
                let (shape, fds) = taken.split();
                let serial = inbox.serial;
                p.carry(
                    Parcel {
                        ep,
                        serial,
                        peer,
                        shape,
                    },
                    fds,
                )?;
                inbox.stir();
                p.ring(ep, serial);
                Ok(())
            }
            None => {
                inbox.push(Incoming {
                    peer,
                    link: taken.into_dialled()?,
                });
                Ok(())
            }
        }
    }
}

/// Reads a peer's UCX card, all of it within the handshake's deadline.
fn read_card<S: Read + AsRawFd>(
    t: &mut Timed<'_, S>,
) -> std::result::Result<macrolink_wire::ucx::Card, macrolink_wire::WireError> {
    use macrolink_wire::ucx::Card;
    let bad = |e: macrolink_wire::ucx::CardError| macrolink_wire::WireError::Card(e);
    let mut prefix = [0u8; 4];
    t.read_exact(&mut prefix)
        .map_err(|_| bad(macrolink_wire::ucx::CardError::Truncated { have: 0, need: 4 }))?;
    let n = Card::len_from_prefix(prefix).map_err(bad)?;
    let mut b = vec![0u8; n];
    b[..4].copy_from_slice(&prefix);
    t.read_exact(&mut b[4..])
        .map_err(|_| bad(macrolink_wire::ucx::CardError::Truncated { have: 4, need: n }))?;
    Card::decode(&b).map_err(bad)
}

/// The acceptor's side of the handshake up to its answer: challenge, hello
/// and proof, the checks. A resolve is answered here. `None`: nothing is
/// left to do (answered, or refused).
#[allow(clippy::type_complexity)]
fn hear_hello<S>(
    shared: &NodeShared,
    t: &mut Timed<'_, S>,
    unix: bool,
) -> io::Result<Option<(Heard, Arc<Inbox>, HelloFds)>>
where
    S: Read + Write + AsRawFd + AsFd,
{
    let challenge = Challenge {
        nonce: key::nonce()?,
    };
    t.write_all(&challenge.encode())?;
    let (msg, fds) = read_hello(t, unix)?;
    let heard = match check(&shared.key, &challenge.nonce, &msg) {
        Ok(h) => h,
        Err(why) => return refuse(t, why).map(|()| None),
    };
    let h = heard.hello;
    let Some(inbox) = shared.inbox(h.dst_ep) else {
        return refuse(t, Refusal::NoSuchEndpoint).map(|()| None);
    };
    let peer = Addr::new(h.src_node, h.src_ep);
    if h.flags.contains(Flags::CONTACT) {
        // For a relay: a node has no file service contact to give.
        return refuse(t, Refusal::Malformed).map(|()| None);
    }
    if h.flags.contains(Flags::RESOLVE_UDP) {
        let mut a = Header::new(FrameKind::HelloOk);
        a.offset = u64::from(inbox.udp_port);
        t.write_all(heard.answer(&shared.key, &a).as_slice())?;
        return Ok(None);
    }
    if !inbox.admits(peer, Some(h.key)) {
        tracing::info!("endpoint {}: refused {peer}: not of its session", h.dst_ep);
        return refuse(t, Refusal::OtherSession).map(|()| None);
    }
    Ok(Some((heard, inbox, fds)))
}

/// A hello whose proof was checked, waiting for its answer.
#[derive(Clone, Debug)]
pub struct Heard {
    /// The hello as the initiator sent it.
    pub hello: Header,
    challenge: [u8; NONCE_LEN],
    nonce: [u8; NONCE_LEN],
}

/// The bytes of a handshake's answer.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    bytes: [u8; HEADER_LEN + MAC_LEN],
    len: usize,
}

impl Answer {
    /// What goes on the wire.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl Heard {
    /// The answer `a` (`HelloOk`, with this side's proof under `key`, or
    /// `HelloRefused`) to the hello.
    pub fn answer(&self, key: &Key, a: &Header) -> Answer {
        let ab = a.encode();
        let mut bytes = [0u8; HEADER_LEN + MAC_LEN];
        bytes[..HEADER_LEN].copy_from_slice(&ab);
        if a.kind != FrameKind::HelloOk {
            return Answer {
                bytes,
                len: HEADER_LEN,
            };
        }
        let mac = key.acceptor_mac(&self.nonce, &self.challenge, &ab);
        bytes[HEADER_LEN..].copy_from_slice(&mac);
        Answer {
            bytes,
            len: HEADER_LEN + MAC_LEN,
        }
    }
}

/// Checks a hello and its proof of `key` against the `challenge` sent.
fn check(
    key: &Key,
    challenge: &[u8; NONCE_LEN],
    msg: &HelloMsg,
) -> std::result::Result<Heard, Refusal> {
    let hello = match Header::decode(msg) {
        Ok(h) if h.kind == FrameKind::Hello && h.len == 0 => h,
        _ => return Err(Refusal::Malformed),
    };
    let proof = Proof::decode(&msg[HEADER_LEN..]).map_err(|_| Refusal::Malformed)?;
    let want = key.initiator_mac(challenge, &[&msg[..HEADER_LEN]], &proof.nonce);
    if !key::macs_match(&want, &proof.mac) {
        tracing::warn!(
            "refused node {} (endpoint {}): it did not prove the fabric key",
            hello.src_node,
            hello.src_ep
        );
        return Err(Refusal::Unauthenticated);
    }
    Ok(Heard {
        hello,
        challenge: *challenge,
        nonce: proof.nonce,
    })
}

/// The acceptor's side of the handshake up to its answer, all of it by
/// `until`, for a process that answers on a node's behalf (a relay, which
/// answers once the node has): sends a challenge, reads the hello and its
/// proof, and checks the proof under `key`. A hello that fails is refused
/// here and its reason returned.
pub fn hear(
    s: &mut TcpStream,
    key: &Key,
    until: Instant,
) -> io::Result<std::result::Result<Heard, Refusal>> {
    let challenge = Challenge {
        nonce: key::nonce()?,
    };
    let mut t = Timed { stream: s, until };
    t.write_all(&challenge.encode())?;
    let (msg, _) = read_hello(&mut t, false)?;
    match check(key, &challenge.nonce, &msg) {
        Ok(h) => Ok(Ok(h)),
        Err(why) => {
            refuse(&mut t, why)?;
            Ok(Err(why))
        }
    }
}

/// Reads a hello and its proof, and over a unix socket the descriptors
/// that came with them.
fn read_hello<S>(t: &mut Timed<'_, S>, unix: bool) -> io::Result<(HelloMsg, HelloFds)>
where
    S: Read + Write + AsRawFd + AsFd,
{
    let mut msg = [0u8; HEADER_LEN + PROOF_LEN];
    let mut fds = HelloFds::default();
    if !unix {
        t.read_exact(&mut msg)?;
        return Ok((msg, fds));
    }
    let mut got = 0;
    let mut kept = 0;
    while got < msg.len() {
        t.ready(sys::Interest::Read)?;
        // The first descriptors that come are kept, in order; any more
        // are closed.
        let take = |fd| {
            if let Some(slot) = fds.get_mut(kept) {
                *slot = Some(fd);
                kept += 1;
            }
        };
        match memfd::recv_with_fds(&*t.stream, &mut msg[got..], take)? {
            Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Some(n) => got += n,
            None => {}
        }
    }
    Ok((msg, fds))
}

/// The descriptors a hello over a unix socket brings: the segment, then
/// the acceptor's ends of the doorbells (see [`Bells::pair`]).
type HelloFds = [Option<OwnedFd>; 4];

/// A hello header and its proof, as they arrived.
type HelloMsg = [u8; HEADER_LEN + PROOF_LEN];

/// Removes the sockets of nodes that died without removing them (nothing
/// listens there any more). A socket younger than a second is left alone:
/// its node may be between `bind` and `listen`.
pub(crate) fn sweep_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let ours = name
            .to_str()
            .is_some_and(|n| n.starts_with("node-") && n.ends_with(".sock"));
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(1));
        if ours && old {
            if let Err(err) = UnixStream::connect(e.path()) {
                if err.kind() == io::ErrorKind::ConnectionRefused {
                    tracing::debug!("removed the socket of a dead node: {}", e.path().display());
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

/// A connection an acceptor took and proved, before it is a stream.
pub(crate) enum Taken {
    Tcp(TcpStream),
    /// The segment mapped (a mapping is the process's, not a table's), the
    /// socket and the doorbells the initiator sent.
    Shm {
        map: MmapRaw,
        cap: usize,
        sock: UnixStream,
        bells: Bells,
    },
    Ucx(ucx::Contact),
}

impl Taken {
    /// The stream, in the table the descriptors are in.
    pub(crate) fn into_dialled(self) -> io::Result<Dialled> {
        Ok(match self {
            Taken::Tcp(s) => Dialled::Tcp(s),
            Taken::Shm {
                map,
                cap,
                sock,
                bells,
            } => Dialled::Shm(Box::new(ShmStream::new(
                map,
                cap,
                Side::Acceptor,
                sock,
                bells,
            )?)),
            Taken::Ucx(c) => Dialled::Ucx(c),
        })
    }

    /// Its descriptors, and the rest.
    fn split(self) -> (Shape, Vec<OwnedFd>) {
        match self {
            Taken::Tcp(s) => (Shape::Tcp, vec![s.into()]),
            Taken::Shm {
                map,
                cap,
                sock,
                bells,
            } => {
                let [hear, ring, keep] = bells.into_ends();
                (Shape::Shm { map, cap }, vec![sock.into(), hear, ring, keep])
            }
            Taken::Ucx(c) => {
                let ucx::Contact {
                    sock,
                    index,
                    token,
                    peer,
                    guard,
                    accepted,
                } = c;
                let shape = Shape::Ucx {
                    index,
                    token,
                    peer,
                    guard,
                    accepted,
                };
                (shape, vec![sock.into()])
            }
        }
    }
}

/// A taken connection without its descriptors.
pub(crate) enum Shape {
    Tcp,
    Shm {
        map: MmapRaw,
        cap: usize,
    },
    Ucx {
        index: u16,
        token: u64,
        peer: macrolink_wire::ucx::Card,
        guard: ucx::IndexGuard,
        accepted: bool,
    },
}

impl Shape {
    /// The connection again, with `fds` (of the table this runs in).
    fn join(self, fds: Vec<OwnedFd>) -> io::Result<Taken> {
        let mut fds = fds.into_iter();
        let mut next = || {
            fds.next().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a parcel came short of a descriptor",
                )
            })
        };
        Ok(match self {
            Shape::Tcp => Taken::Tcp(TcpStream::from(next()?)),
            Shape::Shm { map, cap } => {
                let sock = UnixStream::from(next()?);
                let ends = [next()?, next()?, next()?];
                Taken::Shm {
                    map,
                    cap,
                    sock,
                    bells: Bells::from_peer(ends)?,
                }
            }
            Shape::Ucx {
                index,
                token,
                peer,
                guard,
                accepted,
            } => Taken::Ucx(ucx::Contact {
                sock: TcpStream::from(next()?),
                index,
                token,
                peer,
                guard,
                accepted,
            }),
        })
    }
}

/// What a parcel of the porter is: the endpoint its connection is for
/// (by id and by the serial of its inbox, as an id may be opened again),
/// the peer, and the connection but for its descriptors.
pub(crate) struct Parcel {
    ep: u32,
    serial: u64,
    peer: Addr,
    shape: Shape,
}

/// From the endpoints' table: takes what the acceptors carried, builds
/// the streams and gives each to its endpoint: to `into` when it is
/// endpoint `ep` (inbox `serial`), else to its inbox. One whose endpoint
/// has closed is dropped.
pub(crate) fn collect(
    dock: &Dock<Parcel>,
    node: &NodeShared,
    ep: u32,
    serial: u64,
    into: &mut Vec<Incoming>,
) {
    dock.take(|p, fds| {
        let link = match p.shape.join(fds).and_then(Taken::into_dialled) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("a connection from {} could not be taken: {e}", p.peer);
                return;
            }
        };
        let inc = Incoming { peer: p.peer, link };
        if p.ep == ep && p.serial == serial {
            into.push(inc);
        } else if let Some(inbox) = node.inbox(p.ep).filter(|i| i.serial == p.serial) {
            inbox.push(inc);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::Limits;
    use crate::transport::porter::Pairs;

    /// A handshake's way to its endpoint through `porter`.
    fn carrier<'a>(node: &'a NodeShared, porter: &'a Porter<Parcel>) -> To<'a> {
        To {
            shared: node,
            porter: Some(porter),
        }
    }

    /// A loopback TCP pair.
    fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn reads_one(efd: &EventFd) -> bool {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64.
        let n = unsafe { libc::read(efd.raw(), (&mut v as *mut u64).cast(), 8) };
        n == 8 && v >= 1
    }

    #[test]
    fn a_carried_connection_arrives_at_its_endpoint_and_wakes_it() {
        // Both sides in one table here: the numbers each side keeps are
        // valid in it, which the crossing does not rely on.
        let pairs = Pairs::<Parcel>::new().unwrap();
        let (dock, porter) = (&pairs.dock, pairs.dock.porter().clone());
        let node = shared();
        let inbox = Arc::new(Inbox::new(0, None).unwrap());
        node.register(3, inbox.clone()).unwrap();
        dock.bell(3, inbox.serial, Some(inbox.wake.fd()));
        let (ours, mut theirs) = tcp_pair();
        let peer = Addr::new(9, 1);
        carrier(&node, &porter)
            .deliver(3, &inbox, peer, Taken::Tcp(ours))
            .unwrap();
        assert!(inbox.stirred(), "the endpoint looks");
        assert!(reads_one(&inbox.wake), "the endpoint woke");
        let mut got = Vec::new();
        collect(dock, &node, 3, inbox.serial, &mut got);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].peer, peer);
        let Dialled::Tcp(mut s) = got.pop().unwrap().link else {
            panic!("a tcp stream");
        };
        s.write_all(b"over").unwrap();
        let mut buf = [0u8; 4];
        theirs.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"over");
        let mut again = Vec::new();
        collect(dock, &node, 3, inbox.serial, &mut again);
        assert!(again.is_empty(), "taken once");
    }

    #[test]
    fn a_connection_for_another_endpoint_goes_to_its_inbox_and_one_for_a_closed_one_is_closed() {
        let pairs = Pairs::<Parcel>::new().unwrap();
        let (dock, porter) = (&pairs.dock, pairs.dock.porter().clone());
        let node = shared();
        let (me, other) = (
            Arc::new(Inbox::new(0, None).unwrap()),
            Arc::new(Inbox::new(0, None).unwrap()),
        );
        node.register(1, me.clone()).unwrap();
        node.register(2, other.clone()).unwrap();
        let (to_other, _keep) = tcp_pair();
        carrier(&node, &porter)
            .deliver(2, &other, Addr::new(9, 2), Taken::Tcp(to_other))
            .unwrap();
        // Endpoint 2 closes, and 2 opens again: the one for the closed
        // one is not the new one's.
        let (to_closed, mut closed_peer) = tcp_pair();
        let gone = Inbox::new(0, None).unwrap();
        carrier(&node, &porter)
            .deliver(2, &gone, Addr::new(9, 3), Taken::Tcp(to_closed))
            .unwrap();
        let mut got = Vec::new();
        collect(dock, &node, 1, me.serial, &mut got);
        assert!(got.is_empty(), "none was endpoint 1's");
        let mut theirs = Vec::new();
        other.take(&mut theirs);
        assert_eq!(theirs.len(), 1);
        assert_eq!(theirs[0].peer, Addr::new(9, 2));
        closed_peer
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(closed_peer.read(&mut buf).unwrap(), 0, "closed");
    }

    fn shared() -> NodeShared {
        NodeShared::new(
            7,
            2048,
            4096,
            None,
            None,
            None,
            BTreeMap::new(),
            Key::open(),
            Gate::new(Limits::default()),
            None,
        )
    }

    #[test]
    fn sockets_of_dead_nodes_are_swept_and_live_ones_kept() {
        let d = tempfile::tempdir().unwrap();
        let dead = d.path().join("node-7.sock");
        drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
        let live = d.path().join("node-8.sock");
        let _l = std::os::unix::net::UnixListener::bind(&live).unwrap();
        let other = d.path().join("unrelated.sock");
        drop(std::os::unix::net::UnixListener::bind(&other).unwrap());
        let young = d.path().join("node-9.sock");
        std::thread::sleep(Duration::from_millis(1100));
        drop(std::os::unix::net::UnixListener::bind(&young).unwrap());
        sweep_stale(d.path());
        assert!(!dead.exists());
        assert!(live.exists() && other.exists() && young.exists());
    }
}
