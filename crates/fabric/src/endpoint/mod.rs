//! Endpoints: DP-II's open / target / write / read, with datagram, reliable
//! and put modes and polled or waited completion.
//!
//! An endpoint is driven by the thread that owns it, as a verbs queue pair or
//! a UCX worker is: every `read`, `write`, `put` or `wait_put` call also moves
//! the endpoint's incoming traffic along. Over shared memory a put is placed
//! by the target's progress as well; a target that never calls in holds puts
//! back until it does.
//!
//! Here the endpoint and its sends; [`targets`] names peers and holds the
//! connections, [`pass`] moves incoming traffic and loops a read over
//! passes, [`sleep`] spins or sleeps when a pass moved nothing,
//! [`onesided`] holds the put mode, [`waits`] the epoll set of an
//! endpoint of many connections or one that waits, [`recv_sleep`] when a
//! waiting endpoint of one tcp connection, or of datagrams alone, sleeps
//! in that socket's receive, and
//! [`udp_look`] when a pass looks at the datagram socket.

mod alone;
mod onesided;
mod pass;
mod recv_sleep;
mod sleep;
mod targets;
mod udp_look;
mod waits;

use macrolink_wire::{FrameKind, Header};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::pool::TokenPool;
use crate::rx::{give_way, Core, SPINS_PER_CHECK};
use crate::transport::contact::{Inbox, Incoming, NodeShared, Parcel};
use crate::transport::porter::Dock;
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
    /// Where connections the node's acceptors take come in, when they run
    /// on a table of descriptors of their own.
    dock: Option<Arc<Dock<Parcel>>>,
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
    /// The connections, watched by one epoll set when there are many or
    /// the endpoint waits (it then sleeps in the set).
    waits: Box<waits::Waits>,
    /// The set watches (as `waits` says; kept here, beside what a pass
    /// reads, since a pass asks).
    watching: bool,
    next_slot: usize,
    /// The connection that last delivered a large reliable message: a
    /// waiting read offers it its buffer (see `transport::offer`).
    offer_to: Option<usize>,
    idle_spins: u32,
    /// When a pass looks at the UDP socket.
    udp_look: udp_look::UdpLook,
    /// Whether a sleep is in the `recv` of the one tcp connection or of
    /// the UDP socket.
    recv_sleep: recv_sleep::RecvSleep,
    /// Passes until the next look at the wait set for what the dozing
    /// connections have (while it watches).
    cold_countdown: u32,
    in_send: bool,
    send_timeout: Option<Duration>,
}

impl Endpoint {
    pub(crate) fn open(
        node: Arc<NodeShared>,
        dock: Option<Arc<Dock<Parcel>>>,
        id: u32,
        cfg: EndpointConfig,
    ) -> Result<Endpoint> {
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
        // The acceptors hear of the endpoint before they can find it.
        if let Some(d) = &dock {
            d.bell(id, inbox.serial, Some(inbox.wake.fd()));
        }
        if let Err(e) = node.register(id, inbox.clone()) {
            if let Some(d) = &dock {
                d.bell(id, inbox.serial, None);
            }
            return Err(e);
        }
        let mut ep = Endpoint {
            dock,
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
            udp_look: udp_look::UdpLook::new(),
            recv_sleep: recv_sleep::RecvSleep::default(),
            cold_countdown: COLD_EVERY,
            in_send: false,
            send_timeout: cfg.send_timeout,
            node,
        };
        ep.sleep_where();
        Ok(ep)
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
        self.sleep_where();
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
                        // Not `ok_or`: an error made and dropped on every send.
                        let Some(udp) = self.udp.as_mut() else {
                            return Err(Error::BadTarget);
                        };
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
    /// a full connection while the others run dry. Over UCX, whether the
    /// peer has given credit for another reliable message; true where the
    /// transport cannot tell (shared memory, udp). It moves nothing: room
    /// and credit come back through the endpoint's reads and writes, so a
    /// caller that finds none reads (or writes elsewhere) before it asks
    /// again.
    pub fn can_take(&mut self, t: Target, len: usize) -> Result<bool> {
        let e = self.entry(t)?;
        match e.route {
            Route::Conn { slot, gen } => {
                Ok(self.conn_mut(e.peer, slot, gen)?.link.can_take(len, e.mode))
            }
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

    /// Sends queued control answers, between messages; whether there were
    /// any (a connection that stopped reading for want of room for them
    /// reads on at the next pass).
    #[inline(always)]
    fn flush_ctrl(&mut self) -> bool {
        if !self.in_send && self.core.ctrl_queued != 0 {
            self.send_ctrl();
            return true;
        }
        false
    }

    #[cold]
    #[inline(never)]
    fn send_ctrl(&mut self) {
        self.core.ctrl_queued = 0;
        for i in 0..self.slots.len() {
            let gen = self.slots[i].gen;
            // What the connection held when the flush began: answers its
            // peer asks for meanwhile wait for the next one (`ctrl_queued`
            // counts them), so a peer that keeps asking while it reads
            // holds no flush for good.
            let held = match self.slots[i].conn.as_mut() {
                Some(conn) => conn.link.control().out.len(),
                None => 0,
            };
            for _ in 0..held {
                let Some(conn) = self.slots[i].conn.as_mut() else {
                    break;
                };
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
        let moved = self.flush_ctrl() || moved;
        if moved {
            self.idle_spins = 0;
        }
        Ok(moved)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Unanswered puts are not flushed: a peer that does not read would
        // hold the close up, and closing the connections tells it anyway.
        // Connections go before the UCX worker they were made on.
        self.slots.clear();
        self.node.unregister(self.id);
        if let Some(d) = &self.dock {
            d.bell(self.id, self.inbox.serial, None);
        }
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
            give_way(*spins);
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

/// Two nodes of this machine that know each other's contact address, in
/// `dir`, and an endpoint configuration of `completion`: what the
/// endpoint's unit tests start from.
#[cfg(test)]
pub(crate) fn test_nodes(
    dir: &std::path::Path,
    completion: Completion,
) -> (crate::Node, crate::Node, EndpointConfig) {
    let a = crate::Node::start(crate::NodeConfig::local(1, dir)).unwrap();
    let b = crate::Node::start(crate::NodeConfig::local(2, dir)).unwrap();
    a.add_peer(2, b.tcp_addr().unwrap());
    b.add_peer(1, a.tcp_addr().unwrap());
    let cfg = EndpointConfig {
        completion,
        ..EndpointConfig::default()
    };
    (a, b, cfg)
}
