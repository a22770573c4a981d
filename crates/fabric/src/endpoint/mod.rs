//! Endpoints: DP-II's open / target / write / read, with datagram, reliable
//! and put modes and polled or waited completion.
//!
//! An endpoint is driven by the thread that owns it, as a verbs queue pair or
//! a UCX worker is: every `read`, `write`, `put` or `wait_put` call also moves
//! the endpoint's incoming traffic along. Over shared memory a put is placed
//! by the target's progress as well; a target that never calls in holds puts
//! back until it does.

mod onesided;
mod waits;

use macrolink_wire::{FrameKind, Header};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::pool::TokenPool;
use crate::rx::{Body, Core, Ready, Step, NAP, SPINS_PER_CHECK};
use crate::transport::contact::{Dialled, Inbox, Incoming, NodeShared, RAIL_USER_TIMEOUT_MS};
use crate::transport::offer::PLACE_MIN;
use crate::transport::tcp::COLD_EVERY;
use crate::transport::udp::Udp;
use crate::transport::{sys, ucx, Connection, SendState};
use crate::types::{
    Addr, Completion, EndpointConfig, Mode, Recv, RecvKind, Stats, Target, Timings, Transport,
};

/// How a target's traffic leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Conn { slot: u32, gen: u32 },
    Udp(std::net::SocketAddr),
}

#[derive(Clone, Copy, Debug)]
struct TargetEntry {
    peer: Addr,
    mode: Mode,
    route: Route,
}

/// One connection of the endpoint and what the endpoint keeps of it.
#[derive(Debug)]
struct Conn {
    peer: Addr,
    /// The remote address this side dialled, for a rail made by `target_at`.
    rail: Option<std::net::SocketAddr>,
    /// Number of the next reliable message sent.
    tx_seq: u64,
    link: Box<dyn Connection>,
}

impl Conn {
    /// What a read returns for a message of `len` bytes in `mode` that
    /// came over this connection, at `slot` and `gen`.
    #[inline]
    fn recv(&self, slot: usize, gen: u32, len: usize, mode: Mode) -> Recv {
        Recv {
            from: self.peer,
            len,
            kind: RecvKind::Message(mode),
            transport: self.link.transport(),
            via: Some((slot as u32, gen)),
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    gen: u32,
    conn: Option<Conn>,
}

impl ucx::Conns for Vec<Slot> {
    fn get(&mut self, slot: u32, gen: u32) -> Option<&mut ucx::Conn> {
        self.get_mut(slot as usize)
            .filter(|s| s.gen == gen)
            .and_then(|s| s.conn.as_mut())
            .and_then(|c| c.link.ucx())
    }
}

/// Passes between looks at an endpoint's datagram socket while no
/// datagram has come yet.
const UDP_LOOK_EVERY: u32 = 1024;

/// Idle passes after traffic that spin without pausing.
const HOT_SPINS: u32 = 1024;

/// How long a blocking call may go on.
#[derive(Clone, Copy, Debug)]
enum Deadline {
    Now,
    At(Instant),
    Never,
}

/// An open endpoint (DP-II's `dp_open` result).
///
/// ```text
///  write/put ─► frames ─► stream (shm ring | tcp socket) or udp datagram
///  read ◄─ reader's buffer ◄─┬─ placed directly while a read waits
///                            └─ token pool (staged) ◄─ progress passes
/// ```
#[derive(Debug)]
pub struct Endpoint {
    node: Arc<NodeShared>,
    id: u32,
    /// The header of a message from this endpoint, but for its receiver,
    /// length and number: a send copies it whole rather than building it
    /// field by field (a header built in pieces is read back in other
    /// pieces by the transport, and the processor stalls on that).
    data_header: Header,
    inbox: Arc<Inbox>,
    slots: Vec<Slot>,
    targets: Vec<TargetEntry>,
    target_index: HashMap<(Addr, Mode, Transport), Target>,
    rail_index: HashMap<(Addr, Mode, std::net::SocketAddr), Target>,
    reply_index: HashMap<(u32, u32, Mode), Target>,
    core: Core,
    udp: Option<Udp>,
    /// The endpoint's UCX worker, when its node has UCX.
    ucx: Option<ucx::Port>,
    incoming: Vec<Incoming>,
    /// What a sleep polls: the inbox, the UDP socket, the UCX worker, and
    /// the connections or the set watching them. Made to its largest at
    /// once, so that an endpoint's first sleep, which may come long after
    /// its first message, allocates nothing.
    pollfds: Vec<libc::pollfd>,
    /// The connections, watched by one epoll set when there are many.
    waits: Box<waits::Waits>,
    /// The set watches (as `waits` says; kept here, beside what a pass
    /// reads, since a pass asks).
    watching: bool,
    next_slot: usize,
    /// The connection that last delivered a large reliable message: a
    /// waiting read offers it its buffer (see `transport::offer`).
    offer_to: Option<usize>,
    idle_spins: u32,
    /// Datagrams are in use: look at the UDP socket on every pass.
    udp_hot: bool,
    /// Passes, busy or idle, until the next look at the UDP socket while
    /// it is not in use.
    udp_countdown: u32,
    /// Passes until the next look at the wait set for what the dozing
    /// connections have (while it watches).
    cold_countdown: u32,
    /// The UDP socket may hold datagrams not looked for yet. A waiting
    /// endpoint looks at it only then: its sleep polls the socket and says
    /// when something came.
    udp_woke: bool,
    in_send: bool,
    send_timeout: Option<Duration>,
}

impl Endpoint {
    pub(crate) fn open(node: Arc<NodeShared>, id: u32, cfg: EndpointConfig) -> Result<Endpoint> {
        let udp = node
            .udp_ip
            .map(|ip| Udp::bind(ip, node.mtu, node.datagram_token))
            .transpose()?;
        let ucx = node
            .ucx
            .as_ref()
            .map(|c| ucx::Port::open(c, node.mtu))
            .transpose()?;
        let inbox = Arc::new(Inbox::new(
            udp.as_ref().map_or(0, |u| u.port()),
            ucx.as_ref().map(|p| p.contact_card()),
        )?);
        let waits = Box::new(waits::Waits::new()?);
        let token_size = cfg.token_size.max(node.mtu).max(4096);
        let tokens = cfg.tokens.max(1);
        let pool = TokenPool::new(tokens, token_size)?;
        node.register(id, inbox.clone())?;
        Ok(Endpoint {
            id,
            inbox,
            slots: Vec::new(),
            targets: Vec::new(),
            target_index: HashMap::new(),
            rail_index: HashMap::new(),
            reply_index: HashMap::new(),
            core: Core::new(id, cfg.completion, cfg.max_message, pool, tokens * 2),
            udp,
            ucx,
            incoming: Vec::new(),
            pollfds: Vec::with_capacity(3 + waits::WATCH_OVER),
            waits,
            watching: false,
            next_slot: 0,
            data_header: {
                let mut h = Header::new(FrameKind::Data);
                h.src_node = node.id;
                h.src_ep = id;
                h
            },
            offer_to: None,
            idle_spins: 0,
            udp_hot: false,
            udp_countdown: 1,
            cold_countdown: COLD_EVERY,
            udp_woke: true,
            in_send: false,
            send_timeout: cfg.send_timeout,
            node,
        })
    }

    /// This endpoint's address.
    pub fn addr(&self) -> Addr {
        Addr::new(self.node.id, self.id)
    }

    /// Counters since open.
    pub fn stats(&self) -> Stats {
        Stats {
            strangers: self
                .inbox
                .strangers
                .load(std::sync::atomic::Ordering::Relaxed),
            ..self.core.stats
        }
    }

    /// Makes the endpoint serve one session, as a queue pair is connected to
    /// one peer: from now on it hears only endpoints of node `peer`, over
    /// connections whose hello carries `token` (which its own hellos carry
    /// too; a random number only the two ends know). Connections of anyone
    /// else, open ones included, are closed before any of their frames is
    /// delivered, and datagrams of other nodes dropped; both are counted in
    /// [`Stats::strangers`] and neither fails the session.
    pub fn bind_session(&mut self, peer: u32, token: u64) {
        self.inbox.bind(peer, token);
        self.adopt_incoming();
        for i in 0..self.slots.len() {
            if self.slots[i]
                .conn
                .as_ref()
                .is_some_and(|c| c.peer.node != peer)
            {
                if let Some(mut c) = self.slots[i].conn.take() {
                    if self.waits.remove(i, c.link.read_fd()) {
                        self.rewatch();
                    }
                    c.link.release(&mut self.core.pool);
                    self.inbox.admits(c.peer, None);
                    self.forget_conn(i as u32, self.slots[i].gen);
                }
            }
        }
    }

    /// Largest datagram payload.
    pub fn datagram_mtu(&self) -> usize {
        self.node.mtu
    }

    /// Polling or waiting completion.
    pub fn completion(&self) -> Completion {
        self.core.completion
    }

    /// Switches between polling and waiting completion.
    pub fn set_completion(&mut self, c: Completion) {
        self.core.completion = c;
    }

    /// Turns the latency probe on or off (see [`Timings`]).
    pub fn set_probe(&mut self, on: bool) {
        self.core.probe = on;
    }

    /// Stages of the last message written and read while the probe was on.
    pub fn timings(&self) -> Timings {
        self.core.timings
    }

    /// Bytes the receive pool holds.
    pub fn pool_bytes(&self) -> usize {
        self.core.pool.capacity()
    }

    /// Makes a target for endpoint `to` in `mode` (DP-II's `dp_target`),
    /// choosing the transport: shared memory when `to`'s node is on this host,
    /// else tcp.
    pub fn target(&mut self, to: Addr, mode: Mode) -> Result<Target> {
        let transport = if self.node.shm_reaches(to.node) {
            Transport::Shm
        } else if self.node.tcp_peer(to.node).is_some() {
            Transport::Tcp
        } else if mode == Mode::Datagram && self.udp.is_some() {
            Transport::Udp
        } else {
            return Err(Error::Unreachable {
                node: to.node,
                transport: Transport::Tcp,
            });
        };
        self.target_via(to, mode, transport)
    }

    /// Makes a target for endpoint `to` in `mode` over `transport`.
    pub fn target_via(&mut self, to: Addr, mode: Mode, transport: Transport) -> Result<Target> {
        if let Some(t) = self.target_index.get(&(to, mode, transport)) {
            if self.route_alive(self.targets[t.0 as usize].route) {
                return Ok(*t);
            }
        }
        if transport == Transport::Udp && mode != Mode::Datagram {
            return Err(Error::Unsupported { transport, mode });
        }
        let route = match transport {
            Transport::Udp => {
                let me = self.addr();
                let udp = self.udp.as_mut().ok_or(Error::Unreachable {
                    node: to.node,
                    transport,
                })?;
                let route = match udp.learned(to) {
                    Some(sa) => Route::Udp(sa),
                    None => {
                        let sa = self.node.resolve_udp(me, to)?;
                        udp.learn(to, sa);
                        Route::Udp(sa)
                    }
                };
                self.udp_hot = true;
                route
            }
            Transport::Shm | Transport::Tcp | Transport::Ucx => {
                self.adopt_incoming();
                match self.find_conn(to, transport) {
                    Some(r) => r,
                    None => {
                        let link = self.node.connect(
                            self.addr(),
                            to,
                            transport,
                            self.inbox.token(),
                            self.ucx.as_ref().map(|p| p.contact_card()),
                        )?;
                        self.insert_conn(to, link, None)?
                    }
                }
            }
        };
        let t = self.add_target(to, mode, route);
        self.target_index.insert((to, mode, transport), t);
        Ok(t)
    }

    fn add_target(&mut self, peer: Addr, mode: Mode, route: Route) -> Target {
        let t = Target(self.targets.len() as u32);
        self.targets.push(TargetEntry { peer, mode, route });
        t
    }

    /// A target for `to` in `mode` over a connection this endpoint already
    /// has to it, of whatever transport, if any: to answer a peer the way
    /// it came.
    pub fn connected_target(&mut self, to: Addr, mode: Mode) -> Option<Target> {
        self.adopt_incoming();
        let (transport, route) = self.slots.iter().enumerate().find_map(|(i, s)| {
            let c = s
                .conn
                .as_ref()
                .filter(|c| c.peer == to && c.rail.is_none())?;
            let route = Route::Conn {
                slot: i as u32,
                gen: s.gen,
            };
            Some((c.link.transport(), route))
        })?;
        if let Some(t) = self.target_index.get(&(to, mode, transport)) {
            if self.targets[t.0 as usize].route == route {
                return Some(*t);
            }
        }
        let t = self.add_target(to, mode, route);
        self.target_index.insert((to, mode, transport), t);
        Some(t)
    }

    /// A target that answers `r` over the connection it came in on (the
    /// same rail, when a peer reaches this endpoint over several); falls
    /// back to [`target_via`](Self::target_via) once that connection is gone.
    pub fn reply_target(&mut self, r: &Recv, mode: Mode) -> Result<Target> {
        if let Some((slot, gen)) = r.via.filter(|_| mode != Mode::Datagram) {
            let route = Route::Conn { slot, gen };
            if self.route_alive(route) {
                if let Some(t) = self.reply_index.get(&(slot, gen, mode)) {
                    return Ok(*t);
                }
                let t = self.add_target(r.from, mode, route);
                self.reply_index.insert((slot, gen, mode), t);
                return Ok(t);
            }
        }
        self.target_via(r.from, mode, r.transport)
    }

    /// Makes a TCP target for `to` through the remote address `addr`: one
    /// rail of several links to the same peer (link aggregation). Each
    /// address gets a connection of its own, which fails with
    /// [`Error::PeerLost`] when its link stays dark for
    /// [`RAIL_USER_TIMEOUT_MS`].
    pub fn target_at(
        &mut self,
        to: Addr,
        mode: Mode,
        addr: std::net::SocketAddr,
    ) -> Result<Target> {
        if mode == Mode::Datagram {
            return Err(Error::Unsupported {
                transport: Transport::Tcp,
                mode,
            });
        }
        if let Some(t) = self.rail_index.get(&(to, mode, addr)) {
            if self.route_alive(self.targets[t.0 as usize].route) {
                return Ok(*t);
            }
        }
        let found = self.slots.iter().enumerate().find_map(|(i, s)| {
            s.conn
                .as_ref()
                .filter(|c| c.peer == to && c.rail == Some(addr))
                .map(|_| Route::Conn {
                    slot: i as u32,
                    gen: s.gen,
                })
        });
        let route = match found {
            Some(r) => r,
            None => {
                // A rail whose link is dark must fail soon, so that its
                // traffic moves to the others: short dial, user timeout.
                let dial = Duration::from_millis(u64::from(RAIL_USER_TIMEOUT_MS) / 4);
                let rail = Some(RAIL_USER_TIMEOUT_MS);
                let link = self.node.connect_tcp_within(
                    self.addr(),
                    to,
                    addr,
                    dial,
                    rail,
                    self.inbox.token(),
                )?;
                self.insert_conn(to, link, Some(addr))?
            }
        };
        let t = self.add_target(to, mode, route);
        self.rail_index.insert((to, mode, addr), t);
        Ok(t)
    }

    fn route_alive(&self, r: Route) -> bool {
        match r {
            Route::Udp(_) => true,
            Route::Conn { slot, gen } => {
                let s = &self.slots[slot as usize];
                s.gen == gen && s.conn.is_some()
            }
        }
    }

    fn find_conn(&self, to: Addr, transport: Transport) -> Option<Route> {
        self.slots.iter().enumerate().find_map(|(i, s)| {
            s.conn
                .as_ref()
                .filter(|c| c.peer == to && c.link.transport() == transport)
                .map(|_| Route::Conn {
                    slot: i as u32,
                    gen: s.gen,
                })
        })
    }

    /// Makes a connection of `link` to `peer` in a free slot.
    fn insert_conn(
        &mut self,
        peer: Addr,
        link: Dialled,
        rail: Option<std::net::SocketAddr>,
    ) -> Result<Route> {
        let i = match self.slots.iter().position(|s| s.conn.is_none()) {
            Some(i) => i,
            None => {
                self.slots.push(Slot::default());
                self.slots.len() - 1
            }
        };
        let gen = self.slots[i].gen.wrapping_add(1);
        let mut link = link.connect(peer, (i as u32, gen), self.ucx.as_mut())?;
        let started = self.waits.add(i, link.read_fd())?;
        link.watched(self.waits.watching());
        let s = &mut self.slots[i];
        s.gen = gen;
        s.conn = Some(Conn {
            peer,
            rail,
            tx_seq: 0,
            link,
        });
        if started {
            self.rewatch();
        }
        Ok(Route::Conn {
            slot: i as u32,
            gen,
        })
    }

    #[inline]
    fn adopt_incoming(&mut self) {
        if self.inbox.stirred() {
            self.adopt();
        }
    }

    fn adopt(&mut self) {
        self.inbox.take(&mut self.incoming);
        while let Some(inc) = self.incoming.pop() {
            // Accepted before the endpoint was bound to a session?
            if self.inbox.admits(inc.peer, None) {
                if let Err(e) = self.insert_conn(inc.peer, inc.link, None) {
                    tracing::warn!(peer = %inc.peer, "cannot take a connection: {e}");
                }
            }
        }
    }

    /// What is kept for a connection that is gone: regions it may write
    /// into, and its place in the UCX worker.
    fn forget_conn(&mut self, slot: u32, gen: u32) {
        self.core.regions.released(None, slot, gen);
        if let Some(p) = self.ucx.as_mut() {
            p.forget(slot, gen);
        }
    }

    fn entry(&self, t: Target) -> Result<TargetEntry> {
        // Not `ok_or`: an error made and dropped on every send.
        match self.targets.get(t.0 as usize) {
            Some(e) => Ok(*e),
            None => Err(Error::BadTarget),
        }
    }

    fn conn_mut(&mut self, peer: Addr, slot: u32, gen: u32) -> Result<&mut Conn> {
        match self.slots.get_mut(slot as usize) {
            Some(s) if s.gen == gen => s.conn.as_mut().ok_or_else(|| lost(peer)),
            _ => Err(lost(peer)),
        }
    }

    /// Sends `data` to the target (DP-II's `dp_write`). Reliable messages may
    /// have any size; datagrams at most one MTU. Returns once the transport has
    /// taken every byte.
    pub fn write(&mut self, t: Target, data: &[u8]) -> Result<()> {
        if self.core.probe {
            self.core.timings.write_enter = sys::clock_ns();
        }
        let e = self.entry(t)?;
        let mut h = self.data_header;
        h.dst_ep = e.peer.ep;
        h.total = data.len() as u64;
        if self.core.probe {
            self.core.timings.write_framed = sys::clock_ns();
        }
        match e.mode {
            Mode::Put => return Err(Error::WrongMode(Mode::Put)),
            Mode::Datagram => {
                if data.len() > self.node.mtu {
                    return Err(Error::TooLarge {
                        len: data.len(),
                        mtu: self.node.mtu,
                    });
                }
                h.kind = FrameKind::Datagram;
                h.key = self.node.datagram_token;
                match e.route {
                    Route::Udp(sa) => {
                        h.len = data.len() as u32;
                        let udp = self.udp.as_mut().ok_or(Error::BadTarget)?;
                        udp.send(&h, data, sa)?;
                    }
                    Route::Conn { slot, gen } => self.send_frame(e.peer, slot, gen, &h, data)?,
                }
            }
            Mode::Reliable => {
                let Route::Conn { slot, gen } = e.route else {
                    return Err(Error::BadTarget);
                };
                let conn = self.conn_mut(e.peer, slot, gen)?;
                h.seq = conn.tx_seq;
                conn.tx_seq += 1;
                self.send_frame(e.peer, slot, gen, &h, data)?;
            }
        }
        if self.core.probe {
            self.core.timings.write_sent = sys::clock_ns();
        }
        self.core.stats.messages_out += 1;
        self.core.stats.bytes_out += data.len() as u64;
        self.flush_ctrl();
        Ok(())
    }

    /// Whether a message of `len` bytes to `t` would be taken now without
    /// waiting for what its connection already holds to leave: the
    /// connection holds nothing yet, or its transport has room for the
    /// message. A sender with several peers (chunks striped over gateways)
    /// gives the next message to one that can take it, rather than wait on
    /// a full connection while the others run dry. True where the transport
    /// cannot tell (shared memory, UCX, udp).
    pub fn can_take(&mut self, t: Target, len: usize) -> Result<bool> {
        let e = self.entry(t)?;
        match e.route {
            Route::Conn { slot, gen } => Ok(self.conn_mut(e.peer, slot, gen)?.link.can_take(len)),
            Route::Udp(_) => Ok(true),
        }
    }

    /// Hands one frame (a whole message, put or control frame) to the
    /// connection, moving incoming traffic along while the transport is
    /// full so that two endpoints writing to each other cannot stall. With a
    /// send timeout, a peer that takes nothing for that long is given up.
    fn send_frame(
        &mut self,
        peer: Addr,
        slot: u32,
        gen: u32,
        h: &Header,
        payload: &[u8],
    ) -> Result<()> {
        let mut st = SendState::default();
        // Most frames go at the first try: no more than that on their way.
        match self
            .conn_mut(peer, slot, gen)?
            .link
            .send(h, payload, &mut st)
        {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => {
                let reason = e.to_string();
                self.lose(slot as usize, reason.clone());
                return Err(Error::PeerLost { peer, reason });
            }
        }
        let mut stalled: Option<(Instant, usize, usize)> = None;
        let was_in_send = std::mem::replace(&mut self.in_send, true);
        let result = loop {
            let conn = match self.conn_mut(peer, slot, gen) {
                Ok(c) => c,
                Err(e) => break Err(e),
            };
            match conn.link.send(h, payload, &mut st) {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(e) => {
                    let reason = e.to_string();
                    self.lose(slot as usize, reason.clone());
                    break Err(Error::PeerLost { peer, reason });
                }
            }
            if let Some(limit) = self.send_timeout {
                let at = (st.done, st.sent);
                match stalled {
                    Some((since, d, s)) if (d, s) == at => {
                        if since.elapsed() >= limit {
                            // Part of the frame may be out: the stream cannot go on.
                            let reason = format!("took nothing for {limit:?}");
                            tracing::info!(%peer, "giving up a write: the peer {reason}");
                            self.lose(slot as usize, reason.clone());
                            break Err(Error::PeerLost { peer, reason });
                        }
                    }
                    _ => stalled = Some((Instant::now(), at.0, at.1)),
                }
            }
            if let Err(e) = self.progress_all(None) {
                break Err(e);
            }
            let completion = self.core.completion;
            let mut spins = self.idle_spins;
            let need = payload.len().saturating_sub(st.done).min(64 * 1024) + 64;
            if let Ok(conn) = self.conn_mut(peer, slot, gen) {
                wait_writable(conn.link.as_mut(), completion, need, &mut spins);
            }
            self.idle_spins = spins;
        };
        self.in_send = was_in_send;
        result
    }

    /// Sends queued control answers, between messages.
    #[inline(always)]
    fn flush_ctrl(&mut self) {
        if !self.in_send && self.core.ctrl_queued != 0 {
            self.send_ctrl();
        }
    }

    #[cold]
    #[inline(never)]
    fn send_ctrl(&mut self) {
        self.core.ctrl_queued = 0;
        for i in 0..self.slots.len() {
            let gen = self.slots[i].gen;
            while let Some(conn) = self.slots[i].conn.as_mut() {
                let Some((mut h, payload)) = conn.link.control().out.pop_front() else {
                    break;
                };
                let peer = conn.peer;
                h.src_node = self.node.id;
                h.src_ep = self.id;
                h.dst_ep = peer.ep;
                if self.send_frame(peer, i as u32, gen, &h, &payload).is_err() {
                    break;
                }
            }
        }
    }

    /// Receives the next message or put notification (DP-II's `dp_read`),
    /// blocking until there is one. A message is copied to the front of `buf`;
    /// a buffer too small for it gets [`Error::BufferTooSmall`] and the message
    /// stays queued. A peer that died surfaces here as [`Error::PeerLost`].
    pub fn read(&mut self, buf: &mut [u8]) -> Result<Recv> {
        match self.read_until(buf, Deadline::Never)? {
            Some(r) => Ok(r),
            None => Err(Error::Timeout),
        }
    }

    /// As [`read`](Self::read), but returns `None` at once when nothing is there.
    pub fn try_read(&mut self, buf: &mut [u8]) -> Result<Option<Recv>> {
        self.read_until(buf, Deadline::Now)
    }

    /// As [`read`](Self::read), giving up with `None` after `timeout`.
    pub fn read_timeout(&mut self, buf: &mut [u8], timeout: Duration) -> Result<Option<Recv>> {
        self.read_until(buf, Deadline::At(Instant::now() + timeout))
    }

    /// As [`read`](Self::read), giving up with `None` at `deadline`: for a
    /// loop of reads under one deadline, without a clock read per call.
    pub fn read_by(&mut self, buf: &mut [u8], deadline: Instant) -> Result<Option<Recv>> {
        self.read_until(buf, Deadline::At(deadline))
    }

    /// Moves incoming traffic along without reading: places puts, stages
    /// messages, answers. Returns whether anything moved.
    pub fn progress(&mut self) -> Result<bool> {
        self.look_again();
        let moved = self.progress_all(None)?;
        self.flush_ctrl();
        if moved {
            self.idle_spins = 0;
        }
        Ok(moved)
    }

    fn read_until(&mut self, buf: &mut [u8], deadline: Deadline) -> Result<Option<Recv>> {
        if matches!(deadline, Deadline::Now) {
            self.look_again();
        }
        loop {
            if let Some(r) = self.pop_ready(buf)? {
                self.delivered();
                return Ok(Some(r));
            }
            let moved = match self.progress_with(Some(&mut *buf)) {
                Ok((Some(r), _)) => {
                    self.delivered();
                    self.flush_ctrl();
                    return Ok(Some(r));
                }
                Ok((None, moved)) => moved,
                Err(e) => return Err(e),
            };
            self.flush_ctrl();
            if moved || !self.core.ready.is_empty() {
                self.idle_spins = 0;
                continue;
            }
            // Reading the clock costs as much as a pass: while polling, look
            // at it every 256 idle passes only.
            let polling = self.core.completion == Completion::Poll;
            match deadline {
                Deadline::Now => return Ok(None),
                Deadline::At(t)
                    if (!polling || (self.idle_spins + 1).is_multiple_of(256))
                        && Instant::now() >= t =>
                {
                    return Ok(None)
                }
                _ => {}
            }
            if let Some(r) = self.idle(deadline, Some(&mut *buf))? {
                self.delivered();
                self.flush_ctrl();
                return Ok(Some(r));
            }
        }
    }

    /// The next pass looks at every connection and the UDP socket, for a
    /// caller that will not sleep: what a waiting read leaves to its
    /// sleep's `poll` (a socket an earlier read emptied, the UDP socket
    /// while datagrams are not in use) is looked for now.
    fn look_again(&mut self) {
        self.udp_woke = true;
        self.look_at_conns();
    }

    /// The next pass reads every connection that has something: a few
    /// are read whatever they have, many are asked about first.
    fn look_at_conns(&mut self) {
        if self.waits.watching() {
            self.look_at_set();
        } else {
            self.look_at_each();
        }
    }

    /// Tells every connection whether the wait set watches it (it does
    /// while there are more than a few; see `transport::tcp`).
    fn rewatch(&mut self) {
        let on = self.waits.watching();
        self.watching = on;
        for c in self.slots.iter_mut().filter_map(|s| s.conn.as_mut()) {
            c.link.watched(on);
        }
    }

    fn look_at_each(&mut self) {
        self.waits.wake_all();
        for s in &mut self.slots {
            if let Some(c) = s.conn.as_mut() {
                c.link.look_again();
            }
        }
    }

    /// A pass of an endpoint whose wait set watches: on one in COLD_EVERY,
    /// the set says which dozing connections have something. Out of line:
    /// an endpoint of a few connections never comes here, and its pass
    /// stays small.
    #[cold]
    #[inline(never)]
    fn count_to_look(&mut self) {
        self.cold_countdown -= 1;
        if self.cold_countdown == 0 {
            self.cold_countdown = COLD_EVERY;
            self.look_at_set();
        }
    }

    /// Asks the wait set which connections have something, and has the
    /// next pass read those.
    fn look_at_set(&mut self) {
        if let Err(e) = self.waits.look() {
            tracing::debug!("a look at the wait set failed: {e}; looking at each connection");
            return self.look_at_each();
        }
        for i in self.waits.stirred_slots() {
            if let Some(c) = self.slots.get_mut(i).and_then(|s| s.conn.as_mut()) {
                c.link.look_again();
            }
        }
    }

    /// A read returns a message: the next idle passes spin flat out again.
    fn delivered(&mut self) {
        self.idle_spins = 0;
        if self.core.probe {
            self.core.timings.read_delivered = sys::clock_ns();
        }
    }

    fn pop_ready(&mut self, buf: &mut [u8]) -> Result<Option<Recv>> {
        match self.core.ready.front() {
            None => return Ok(None),
            Some(Ready::Msg { len, .. }) if *len > buf.len() => {
                return Err(Error::BufferTooSmall {
                    needed: *len,
                    have: buf.len(),
                })
            }
            Some(_) => {}
        }
        Ok(match self.core.ready.pop_front() {
            Some(Ready::Msg {
                from,
                mode,
                transport,
                len,
                body,
                via,
            }) => {
                match body {
                    Body::Staged(chain) => {
                        self.core.pool.drain_into(chain, buf);
                    }
                    Body::Held(data) => buf[..len].copy_from_slice(&data),
                    Body::Pending(m) => {
                        let port = self.ucx.as_mut().ok_or(Error::BadTarget)?;
                        if let Err(reason) = port.receive(m, &mut buf[..len]) {
                            return Err(Error::PeerLost { peer: from, reason });
                        }
                    }
                }
                self.core.stats.messages_in += 1;
                self.core.stats.bytes_in += len as u64;
                Some(Recv {
                    from,
                    len,
                    kind: RecvKind::Message(mode),
                    transport,
                    via,
                })
            }
            Some(Ready::Placed {
                from,
                transport,
                via,
                key,
                offset,
                len,
            }) => Some(Recv {
                from,
                len,
                kind: RecvKind::PutPlaced { key, offset },
                transport,
                via,
            }),
            Some(Ready::Lost { peer, reason }) => return Err(Error::PeerLost { peer, reason }),
            None => None,
        })
    }

    fn progress_all(&mut self, user: Option<&mut [u8]>) -> Result<bool> {
        self.progress_with(user).map(|(_, moved)| moved)
    }

    /// One pass over every connection and the datagram socket.
    #[inline(always)]
    fn progress_with(&mut self, mut user: Option<&mut [u8]>) -> Result<(Option<Recv>, bool)> {
        self.adopt_incoming();
        // Cold connections doze (a pass skips them) while the wait set
        // watches: on one pass in COLD_EVERY the set says which have
        // something (one system call for all of them). Asked here, not at
        // the end of a pass: a pass that delivers ends early, and a reader
        // kept busy by one connection (polling, or waiting and so never
        // asleep) would never ask.
        let watching = self.watching;
        if watching {
            self.count_to_look();
        }
        let mut moved = false;
        // UCX first: what its worker holds for a connection goes ahead of
        // the loss a pass over the connections may find for it.
        if let Some(port) = self.ucx.as_mut() {
            match port.progress(&mut self.core, user.as_deref_mut(), &mut self.slots) {
                Step::Delivered => return Ok((self.core.got.take(), true)),
                Step::TooSmall(needed) => {
                    return Err(Error::BufferTooSmall {
                        needed: needed as usize,
                        have: user.map_or(0, |b| b.len()),
                    })
                }
                Step::Moved => moved = true,
                // The port's messages come as `Delivered`.
                Step::Idle | Step::Lost | Step::Message { .. } => {}
            }
        }
        // The datagram socket costs a system call per look: while polling,
        // look every pass only once datagrams are in use, else once every
        // so many passes, busy or idle (a message arriving during that
        // system call waits for it; a steady stream on other connections
        // does not keep a datagram waiting: the look comes before the
        // connections, since a pass that delivers from one ends there).
        // While waiting, look when the sleep saw the socket stir or when
        // asked without a sleep, datagrams in use or not (a look that finds
        // nothing is a system call the sleep's `poll` makes anyway), and
        // once every so many passes (a busy reader does not sleep).
        self.udp_countdown = self.udp_countdown.saturating_sub(1);
        let look = self.udp_countdown == 0
            || match self.core.completion {
                Completion::Poll => self.udp_hot,
                Completion::Wait => self.udp_woke,
            };
        if self.udp_countdown == 0 {
            self.udp_countdown = UDP_LOOK_EVERY;
        }
        if look {
            self.udp_woke = false;
        }
        if let Some(udp) = self.udp.as_mut().filter(|_| look) {
            match udp.progress(&mut self.core, &self.inbox, user.as_deref_mut())? {
                Step::Delivered => {
                    self.udp_hot = true;
                    return Ok((self.core.got.take(), true));
                }
                Step::Moved => {
                    self.udp_hot = true;
                    moved = true;
                }
                _ => {}
            }
        }
        let n = self.slots.len();
        // One connection's part of a pass, `idle` done when it had nothing:
        // a macro, not a function, since the loop of a few connections
        // measured 5 ns a message slower (shm, 8 B) with a function.
        macro_rules! visit {
            ($i:expr, $idle:block) => {{
                let i = $i;
                let gen = self.slots[i].gen;
                let Some(conn) = self.slots[i].conn.as_mut() else {
                    continue;
                };
                let r = match conn.link.progress(&mut self.core, user.as_deref_mut()) {
                    Step::Idle => {
                        $idle
                        continue;
                    }
                    Step::Moved => {
                        moved = true;
                        continue;
                    }
                    Step::Message { len, mode } => conn.recv(i, gen, len, mode),
                    Step::Delivered => match self.core.got.take() {
                        Some(r) => r,
                        None => {
                            debug_assert!(false, "a pass delivered nothing");
                            moved = true;
                            continue;
                        }
                    },
                    Step::TooSmall(needed) => {
                        return Err(Error::BufferTooSmall {
                            needed: needed as usize,
                            have: user.map_or(0, |b| b.len()),
                        })
                    }
                    Step::Lost => {
                        let reason = std::mem::take(&mut self.core.lost);
                        self.lose(i, reason);
                        moved = true;
                        continue;
                    }
                };
                self.next_slot = if i + 1 == n { 0 } else { i + 1 };
                if r.len >= PLACE_MIN && r.kind == RecvKind::Message(Mode::Reliable) {
                    self.offer_to = Some(i);
                }
                return Ok((Some(r), true));
            }};
        }
        // From where the last delivery left off, round to it (no division
        // per slot: a pass is a few tens of nanoseconds).
        let start = self.next_slot.min(n);
        if !watching {
            for i in (start..n).chain(0..start) {
                visit!(i, {});
            }
            return Ok((None, moved));
        }
        // Many connections: those awake, by their bits, from `start` round
        // to it (its word's bits from `start`, the other words, its word's
        // bits before `start`). One that goes cold dozes.
        let words = n.div_ceil(64);
        let (sw, sb) = (start / 64, start % 64);
        for k in 0..=words {
            let w = (sw + k) % words;
            let mask = match k {
                0 => u64::MAX << sb,
                k if k == words => (1u64 << sb) - 1,
                _ => u64::MAX,
            };
            let mut bits = self.waits.awake(w) & mask;
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if i >= n {
                    break;
                }
                self.core.cold = false;
                visit!(i, {
                    if self.core.cold {
                        self.waits.doze(i);
                    }
                });
            }
        }
        Ok((None, moved))
    }

    /// The slot of the endpoint's one connection, when it has one only.
    fn only_conn(&self) -> Option<usize> {
        let mut live = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.conn.is_some());
        match (live.next(), live.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        }
    }

    /// Drops a broken connection, and tells the application once it was
    /// the last to its peer. Two endpoints that both write to each other
    /// have a connection each way: when one closes, the connection it only
    /// read on ends at once, while messages it wrote before closing may
    /// still wait in the other, and are read before the loss is told.
    fn lose(&mut self, i: usize, reason: String) {
        let gen = self.slots[i].gen;
        if let Some(mut conn) = self.slots[i].conn.take() {
            if self.waits.remove(i, conn.link.read_fd()) {
                self.rewatch();
            }
            conn.link.release(&mut self.core.pool);
            self.core.puts.lose(i as u32, gen, conn.peer);
            self.forget_conn(i as u32, gen);
            tracing::debug!(peer = %conn.peer, "connection lost: {reason}");
            let peer = conn.peer;
            let another = self
                .slots
                .iter()
                .any(|s| s.conn.as_ref().is_some_and(|c| c.peer == peer));
            if !another {
                self.core.ready.push_back(Ready::Lost { peer, reason });
            }
        }
    }

    /// Nothing moved: spin or sleep. `user`, the buffer of a waiting read,
    /// may receive a message during the sleep, which is then returned.
    fn idle(&mut self, deadline: Deadline, user: Option<&mut [u8]>) -> Result<Option<Recv>> {
        match self.core.completion {
            Completion::Poll => {
                // Soon after traffic, spin flat out, as a busy-polling peer
                // does (a pause costs some tens of nanoseconds on current
                // processors, which a message then waits); after a while
                // of nothing, pause between looks.
                if self.idle_spins >= HOT_SPINS {
                    std::hint::spin_loop();
                }
                self.idle_spins += 1;
                if self.idle_spins >= SPINS_PER_CHECK {
                    self.idle_spins = HOT_SPINS;
                    for s in &mut self.slots {
                        if let Some(c) = s.conn.as_mut() {
                            c.link.check_alive();
                        }
                    }
                }
                Ok(None)
            }
            Completion::Wait => self.sleep(deadline, user),
        }
    }

    /// Blocks until a connection, the datagram socket, the UCX worker or
    /// the inbox stirs. With `user`, the buffer of a waiting read, offers
    /// it to the connection that sent the last large message, and returns
    /// the message placed in it, if one was.
    fn sleep(&mut self, deadline: Deadline, mut user: Option<&mut [u8]>) -> Result<Option<Recv>> {
        let mut armed = true;
        for s in &mut self.slots {
            if let Some(c) = s.conn.as_mut() {
                armed &= c.link.arm_read();
            }
        }
        if let Some(p) = self.ucx.as_mut() {
            armed &= p.arm();
        }
        let mut offered = None;
        let to = self.offer_to.or_else(|| self.only_conn());
        if let (true, Some(i), Some(buf)) = (armed, to, user.as_deref_mut()) {
            let conn = self.slots.get_mut(i).and_then(|s| s.conn.as_mut());
            if conn.is_some_and(|c| c.link.offer(buf)) {
                offered = Some(i);
            }
        }
        // A failed `poll` is reported after the offer is withdrawn.
        let mut polled = Ok(0);
        // Many connections are polled through the wait set's descriptor.
        let watching = self.waits.watching();
        if armed {
            self.pollfds.clear();
            self.pollfds
                .push(sys::pollfd(self.inbox.wake.raw(), sys::Interest::Read));
            if let Some(u) = &self.udp {
                self.pollfds
                    .push(sys::pollfd(u.raw_fd(), sys::Interest::Read));
            }
            if let Some(p) = &self.ucx {
                self.pollfds
                    .push(sys::pollfd(p.raw_fd(), sys::Interest::Read));
            }
            if watching {
                self.pollfds
                    .push(sys::pollfd(self.waits.fd(), sys::Interest::Read));
            } else {
                for s in &self.slots {
                    if let Some(c) = &s.conn {
                        self.pollfds
                            .push(sys::pollfd(c.link.read_fd(), sys::Interest::Read));
                    }
                }
            }
            let timeout = match deadline {
                Deadline::At(t) => t.saturating_duration_since(Instant::now()).min(NAP),
                _ => NAP,
            };
            polled = sys::poll(&mut self.pollfds, Some(timeout));
        }
        if armed && polled.is_ok() {
            // The inbox's wake-up and the UDP socket come first; a system
            // call each only when they stirred.
            if self.pollfds[0].revents != 0 {
                self.inbox.wake.drain();
            }
            if self.udp.is_some() && self.pollfds[1].revents != 0 {
                self.udp_woke = true;
            }
            // Connections whose socket had nothing are not read on the next
            // pass (a system call each, over tcp); those that stirred are.
            let first = 1 + usize::from(self.udp.is_some()) + usize::from(self.ucx.is_some());
            if watching {
                // The set stirred: it says which did (or, failing, all are
                // read).
                let set_stirred = self.pollfds[first].revents != 0;
                // The sleep asked the set: the count of passes starts over.
                self.cold_countdown = COLD_EVERY;
                let all = set_stirred && self.waits.look().is_err();
                if all {
                    self.waits.wake_all();
                }
                let stirred = |i| all || (set_stirred && self.waits.stirred(i));
                for (i, s) in self.slots.iter_mut().enumerate() {
                    if let Some(c) = s.conn.as_mut() {
                        if stirred(i) {
                            c.link.look_again();
                        } else {
                            c.link.quiet();
                        }
                    }
                }
            } else {
                let conns = self.slots.iter_mut().filter_map(|s| s.conn.as_mut());
                for (c, p) in conns.zip(&self.pollfds[first..]) {
                    if p.revents == 0 {
                        c.link.quiet();
                    } else {
                        c.link.look_again();
                    }
                }
            }
        }
        for s in &mut self.slots {
            if let Some(c) = s.conn.as_mut() {
                c.link.disarm();
            }
        }
        let placed = offered.filter(|&i| {
            let conn = self.slots[i].conn.as_mut();
            conn.is_some_and(|c| c.link.withdraw())
        });
        if let Some(i) = placed {
            // The message is in the buffer and its notice next on the
            // connection: nothing else may be read into the buffer first.
            let gen = self.slots[i].gen;
            let conn = self.slots[i].conn.as_mut().expect("withdrawn above");
            match conn.link.progress(&mut self.core, user) {
                Step::Message { len, mode } => return Ok(Some(conn.recv(i, gen, len, mode))),
                Step::Delivered => return Ok(self.core.got.take()),
                Step::Lost => {
                    let reason = std::mem::take(&mut self.core.lost);
                    self.lose(i, reason);
                }
                _ => self.lose(i, "a message placed without its notice".into()),
            }
        }
        polled?;
        Ok(None)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Unanswered puts are not flushed: a peer that does not read would
        // hold the close up, and closing the connections tells it anyway.
        // Connections go before the UCX worker they were made on.
        self.slots.clear();
        self.node.unregister(self.id);
    }
}

fn lost(peer: Addr) -> Error {
    Error::PeerLost {
        peer,
        reason: "connection closed".into(),
    }
}

/// Waits until a connection may take `need` more bytes.
fn wait_writable(conn: &mut dyn Connection, completion: Completion, need: usize, spins: &mut u32) {
    match completion {
        Completion::Poll => {
            std::hint::spin_loop();
            *spins += 1;
            if *spins >= SPINS_PER_CHECK {
                *spins = 0;
                conn.check_alive();
            }
        }
        Completion::Wait => {
            if conn.arm_write(need) {
                let (fd, interest) = conn.write_wait();
                let _ = sys::wait_fd(fd, interest, conn.write_nap());
            }
            conn.disarm();
        }
    }
}
