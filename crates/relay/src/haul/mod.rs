//! The long-haul protocol between a pair of relays, as one state machine
//! per relay ([`Link`]) that does no I/O and reads no clock: datagrams and
//! the time come in, datagrams and events go out.
//!
//! ```text
//!  local conn ─write──► Link ──poll_transmit(now)──► UDP ═══► peer's Link
//!  local conn ◄─readable/consume── Link ◄──handle(now, datagram)── UDP
//!                                   └─ next_timeout / on_timeout(now)
//! ```
//!
//! - **Credit per flow**: the receiving relay grants each flow room in its
//!   buffer (its share of the whole) and returns more as the local side
//!   takes bytes, so one slow receiver stalls only its own flow, and the far
//!   side's slowness reaches the sender as back-pressure, never as loss.
//! - **A window sized to the bandwidth-delay product**, measured (minimum
//!   round trip and delivery rate, as BBR does) or set, and **pacing** at
//!   the measured rate.
//! - **Selective acks**: every packet has a number never reused; acks list
//!   ranges of numbers, so a lost packet costs one resend of its bytes.
//! - A peer silent for `dead_after` is lost: every flow is reset.
//!
//! Call order: [`Link::handle`] for each datagram; then [`Link::poll_transmit`]
//! until `None`, [`Link::poll_event`] until `None`; sleep until
//! [`Link::next_timeout`] or the next datagram, then [`Link::on_timeout`].

mod flow;
mod model;
mod pns;

use macrolink_wire::haul::{
    Ack, Body, HaulError, Packet, DATAGRAM_OVERHEAD, DATA_OVERHEAD, MAX_CREDITS, MAX_HAUL_PAYLOAD,
};
use std::collections::{BTreeMap, VecDeque};

use flow::{Piece, RecvHalf, SendHalf};
use model::{Model, Sample};
use pns::Received;

/// Nanoseconds on the caller's clock.
pub type Nanos = u64;

/// Credit every flow starts with, both ways, before any ack.
pub const INITIAL_CREDIT: u64 = 256 << 10;
/// Ack-eliciting packets received before an ack goes at once.
const ACK_EVERY: u32 = 2;
/// Longest an ack waits.
const MAX_ACK_DELAY: Nanos = 1_000_000;
/// Times the probe timeout doubles while probes go unanswered.
const MAX_PTO_DOUBLINGS: u32 = 2;
/// Packets acked after a packet that make it lost.
const PACKET_THRESHOLD: u64 = 3;
/// Datagrams waiting each way, at most; more are dropped, as a switch
/// drops what its queue cannot hold.
pub const DATAGRAM_QUEUE: usize = 256;

/// How a relay's end of the long link behaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    /// Largest packet, in bytes, before the relay's hash.
    pub packet: usize,
    /// Pace at this rate (bytes/s) instead of the measured one.
    pub rate: Option<u64>,
    /// Keep this many bytes in flight instead of twice the measured
    /// bandwidth-delay product.
    pub window: Option<u64>,
    /// Bytes this side may hold for the peer's flows, all together.
    pub receive_buffer: u64,
    /// Bytes this side holds of its own flows until acked, all together.
    pub send_buffer: u64,
    /// Flows at once.
    pub max_flows: usize,
    /// Silence after which the peer is lost.
    pub dead_after: Nanos,
    /// Idle time after which a ping goes.
    pub keepalive: Nanos,
    /// Which of the pair this is: flow ids of the two sides differ in
    /// their lowest bit.
    pub high: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            packet: 1400,
            rate: None,
            window: None,
            receive_buffer: 64 << 20,
            send_buffer: 64 << 20,
            max_flows: 1024,
            dead_after: 5_000_000_000,
            keepalive: 500_000_000,
            high: false,
        }
    }
}

impl Config {
    /// Bytes of payload in a full data packet.
    pub fn payload(&self) -> usize {
        self.packet
            .saturating_sub(DATA_OVERHEAD)
            .clamp(1, MAX_HAUL_PAYLOAD)
    }

    /// The most this side holds at once: both buffers plus one packet per
    /// flow's resend bookkeeping.
    pub fn memory_bound(&self) -> u64 {
        self.receive_buffer + self.send_buffer + (self.max_flows * self.packet) as u64
    }
}

/// What happened that the relay's I/O must act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The peer opened a flow to `node` on this side's segment.
    Opened {
        /// Flow id.
        flow: u32,
        /// The node it is for.
        node: u32,
    },
    /// A flow ended abruptly (reset by the peer, or the peer was lost).
    Reset {
        /// Flow id.
        flow: u32,
    },
    /// The peer was silent for `dead_after`, or restarted.
    PeerLost,
}

/// Counters of one side.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    /// Packets sent, acks included.
    pub packets_sent: u64,
    /// Packets taken.
    pub packets_received: u64,
    /// Payload bytes sent, resent ones included.
    pub bytes_sent: u64,
    /// Payload bytes resent.
    pub bytes_resent: u64,
    /// Packets declared lost.
    pub lost: u64,
    /// Probe timeouts.
    pub probes: u64,
    /// Pieces dropped for passing the credit granted.
    pub over_credit: u64,
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// Datagrams taken from the peer.
    pub datagrams_received: u64,
    /// Datagrams dropped: a queue full, or too large for a packet.
    pub datagrams_dropped: u64,
    /// Packets of another session while the peer spoke (replays).
    pub stale: u64,
    /// Bytes the local side took from the peer's flows.
    pub bytes_delivered: u64,
    /// Bytes held for the peer's flows: in order, and ahead of a hole.
    pub held: u64,
    /// Smoothed round trip.
    pub srtt: Nanos,
    /// Smallest round trip.
    pub min_rtt: Nanos,
    /// Delivery rate measured, bytes/s.
    pub bottleneck: f64,
    /// Bytes that may be in flight.
    pub window: u64,
    /// Bytes in flight.
    pub in_flight: u64,
}

#[derive(Clone, Copy, Debug)]
enum What {
    Data(u32, Piece),
    Reset(u32, u32),
    Ping,
    Datagram,
}

#[derive(Clone, Copy, Debug)]
struct Sent {
    what: What,
    time: Nanos,
    size: u64,
    delivered: u64,
    delivered_time: Nanos,
    first_sent_time: Nanos,
    app_limited: bool,
}

#[derive(Debug, Default)]
struct Flow {
    node: u32,
    send: SendHalf,
    recv: RecvHalf,
}

/// One relay's end of the long link.
#[derive(Debug)]
pub struct Link {
    cfg: Config,
    session: u64,
    peer_session: Option<u64>,
    model: Model,
    flows: BTreeMap<u32, Flow>,
    next_flow: u32,
    /// Flow ids the peer has used: they never come back as new flows.
    peer_seen: Seen,
    cursor: u32,
    resets: VecDeque<(u32, u32)>,
    events: VecDeque<Event>,
    /// Datagrams to send, and datagrams taken, by node.
    datagrams_out: VecDeque<(u32, Vec<u8>)>,
    datagrams_in: VecDeque<(u32, Vec<u8>)>,
    datagram_turn: bool,
    // Sending.
    next_pn: u64,
    in_flight: BTreeMap<u64, Sent>,
    bytes_in_flight: u64,
    largest_acked: Option<u64>,
    next_send: Nanos,
    last_eliciting: Nanos,
    pto_count: u32,
    probe: bool,
    loss_time: Option<Nanos>,
    // Delivery-rate estimation.
    delivered: u64,
    delivered_time: Nanos,
    first_sent_time: Nanos,
    app_limited: u64,
    next_round: u64,
    // Receiving.
    received: Received,
    last_heard: Nanos,
    window_update: bool,
    stats: Stats,
}

impl Link {
    /// One end; `session` must grow each time a relay starts (the start
    /// time in its high bits, say): the peer takes a later one as this
    /// relay started again, an earlier one as a replay.
    pub fn new(cfg: Config, session: u64, now: Nanos) -> Link {
        let model = Model::new(cfg.payload() as u64, cfg.rate.map(|r| r as f64), cfg.window);
        Link {
            cfg,
            session,
            peer_session: None,
            model,
            flows: BTreeMap::new(),
            next_flow: 1,
            peer_seen: Seen::new(!cfg.high),
            cursor: 0,
            resets: VecDeque::new(),
            events: VecDeque::new(),
            datagrams_out: VecDeque::new(),
            datagrams_in: VecDeque::new(),
            datagram_turn: false,
            next_pn: 0,
            in_flight: BTreeMap::new(),
            bytes_in_flight: 0,
            largest_acked: None,
            next_send: now,
            last_eliciting: now,
            pto_count: 0,
            probe: false,
            loss_time: None,
            delivered: 0,
            delivered_time: now,
            first_sent_time: now,
            app_limited: 0,
            next_round: 0,
            received: Received::default(),
            last_heard: now,
            window_update: false,
            stats: Stats::default(),
        }
    }

    /// What it was made with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Opens a flow to `node` on the peer's segment; `None` at the limit.
    pub fn open(&mut self, node: u32) -> Option<u32> {
        if self.flows.len() >= self.cfg.max_flows {
            return None;
        }
        let id = (self.next_flow << 1) | u32::from(self.cfg.high);
        self.next_flow = self.next_flow.checked_add(1)?;
        let mut f = Flow::new(node);
        f.send.announce = true;
        self.flows.insert(id, f);
        Some(id)
    }

    /// Whether the flow is open.
    pub fn has(&self, flow: u32) -> bool {
        self.flows.contains_key(&flow)
    }

    /// Flows open.
    pub fn flows(&self) -> usize {
        self.flows.len()
    }

    fn share(&self, total: u64) -> u64 {
        (total / self.flows.len().max(1) as u64).max(INITIAL_CREDIT)
    }

    /// Bytes the flow's send buffer takes now.
    pub fn writable(&self, flow: u32) -> usize {
        let share = self.share(self.cfg.send_buffer);
        self.flows.get(&flow).map_or(0, |f| {
            if f.send.finished {
                0
            } else {
                (share as usize).saturating_sub(f.send.buffered())
            }
        })
    }

    /// Queues bytes of a flow; returns how many were taken (see
    /// [`writable`](Self::writable)).
    pub fn write(&mut self, flow: u32, data: &[u8]) -> usize {
        let n = data.len().min(self.writable(flow));
        if let Some(f) = self.flows.get_mut(&flow) {
            f.send.write(&data[..n]);
        }
        n
    }

    /// The local side has no more to send on the flow.
    pub fn finish(&mut self, flow: u32) {
        if let Some(f) = self.flows.get_mut(&flow) {
            f.send.finished = true;
        }
        self.reap(flow);
    }

    /// Ends a flow abruptly; the peer hears of it.
    pub fn reset(&mut self, flow: u32) {
        if let Some(f) = self.flows.remove(&flow) {
            self.resets.push_back((flow, f.node));
        }
    }

    /// Bytes of the flow that arrived in order and wait for the local side.
    pub fn readable(&self, flow: u32) -> (&[u8], &[u8]) {
        self.flows
            .get(&flow)
            .map_or((&[], &[]), |f| f.recv.readable())
    }

    /// The local side took `n` readable bytes: room for the peer to send more.
    pub fn consume(&mut self, flow: u32, n: usize) {
        let share = self.share(self.cfg.receive_buffer);
        if let Some(f) = self.flows.get_mut(&flow) {
            f.recv.consume(n);
            self.stats.bytes_delivered += n as u64;
            f.recv.granted = f.recv.granted.max(f.recv.read() + share);
            if f.recv.granted - f.recv.advertised >= share / 4 {
                self.window_update = true;
            }
        }
        self.reap(flow);
    }

    /// The peer ended its side of the flow and every byte was read.
    pub fn peer_finished(&self, flow: u32) -> bool {
        self.flows.get(&flow).is_some_and(|f| f.recv.done())
    }

    fn reap(&mut self, flow: u32) {
        if self
            .flows
            .get(&flow)
            .is_some_and(|f| f.send.done() && f.recv.done())
        {
            self.flows.remove(&flow);
        }
    }

    /// Queues a datagram for `node` on the peer's segment: sent once,
    /// paced with the flows' bytes, never resent. False if it was dropped
    /// (the queue is full, or it does not fit in a packet).
    pub fn send_datagram(&mut self, node: u32, data: &[u8]) -> bool {
        let fits = DATAGRAM_OVERHEAD + data.len() <= self.cfg.packet;
        if !fits || self.datagrams_out.len() >= DATAGRAM_QUEUE {
            self.stats.datagrams_dropped += 1;
            return false;
        }
        self.datagrams_out.push_back((node, data.to_vec()));
        true
    }

    /// The next datagram from the peer: the node it is for, and its bytes.
    pub fn poll_datagram(&mut self) -> Option<(u32, Vec<u8>)> {
        self.datagrams_in.pop_front()
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        Stats {
            srtt: self.model.srtt(),
            min_rtt: self.model.min_rtt(),
            bottleneck: self.model.bottleneck(),
            window: self.model.window(),
            in_flight: self.bytes_in_flight,
            held: self.flows.values().map(|f| f.recv.held() as u64).sum(),
            ..self.stats
        }
    }

    /// Takes one datagram from the peer.
    pub fn handle(&mut self, now: Nanos, datagram: &[u8]) -> Result<(), HaulError> {
        let p = Packet::decode(datagram)?;
        if let Some(old) = self.peer_session.filter(|&s| s != p.session) {
            // A later session is the peer, started again (sessions grow
            // with the time a relay starts); an earlier one while the peer
            // speaks is a replay, or the packets of a run that ended still
            // on the link; after a silence it is the peer, restarted with
            // a clock set back.
            let silent = now.saturating_sub(self.last_heard) >= 2 * self.cfg.keepalive;
            if p.session < old && !silent {
                self.stats.stale += 1;
                return Ok(());
            }
            self.peer_restarted();
        }
        self.peer_session = Some(p.session);
        self.last_heard = now;
        self.stats.packets_received += 1;
        let eliciting = match p.body {
            Body::Ack(ref a) => {
                self.on_ack(now, a);
                false
            }
            Body::Ping => true,
            Body::Datagram { node, data } => {
                if self.received.has(p.pn) {
                    // A duplicate the network made: a datagram arrives once.
                } else if self.datagrams_in.len() < DATAGRAM_QUEUE {
                    self.stats.datagrams_received += 1;
                    self.datagrams_in.push_back((node, data.to_vec()));
                } else {
                    self.stats.datagrams_dropped += 1;
                }
                true
            }
            Body::Reset { flow, .. } => {
                if self.flows.remove(&flow).is_some() {
                    self.events.push_back(Event::Reset { flow });
                }
                self.note_peer_flow(flow);
                true
            }
            Body::Data {
                flow,
                node,
                offset,
                fin,
                data,
            } => {
                if !self.on_data(flow, node, offset, fin, data) {
                    self.stats.over_credit += 1;
                    return Ok(());
                }
                true
            }
        };
        self.received.insert(p.pn, now, eliciting);
        Ok(())
    }

    fn note_peer_flow(&mut self, flow: u32) {
        if self.is_peers(flow) {
            self.peer_seen.insert(flow);
        }
    }

    fn is_peers(&self, flow: u32) -> bool {
        (flow & 1 == 1) != self.cfg.high
    }

    /// A data piece; false if it must not be acked (over credit).
    fn on_data(&mut self, flow: u32, node: u32, offset: u64, fin: bool, data: &[u8]) -> bool {
        if !self.flows.contains_key(&flow) {
            let new = self.is_peers(flow) && !self.peer_seen.contains(flow);
            if !new {
                return true;
            }
            self.note_peer_flow(flow);
            if self.flows.len() >= self.cfg.max_flows {
                self.resets.push_back((flow, node));
                return true;
            }
            self.flows.insert(flow, Flow::new(node));
            self.events.push_back(Event::Opened { flow, node });
            let share = self.share(self.cfg.receive_buffer);
            if let Some(f) = self.flows.get_mut(&flow) {
                f.recv.granted = f.recv.granted.max(share);
            }
            self.window_update = true;
        }
        let Some(f) = self.flows.get_mut(&flow) else {
            return true;
        };
        f.recv.take(offset, data, fin)
    }

    fn on_ack(&mut self, now: Nanos, a: &Ack) {
        for &(flow, limit) in &a.credits {
            if let Some(f) = self.flows.get_mut(&flow) {
                f.send.limit = f.send.limit.max(limit);
            }
        }
        let Some(&(_, largest)) = a.ranges.first() else {
            return;
        };
        let mut newly = Vec::new();
        for &(lo, hi) in &a.ranges {
            newly.extend(self.in_flight.range(lo..=hi).map(|(&pn, _)| pn));
        }
        if newly.is_empty() {
            return;
        }
        self.largest_acked = Some(self.largest_acked.map_or(largest, |l| l.max(largest)));
        let mut acked = 0;
        let mut rs: Option<Sent> = None;
        for pn in newly {
            let Some(s) = self.in_flight.remove(&pn) else {
                continue;
            };
            self.bytes_in_flight -= s.size;
            acked += s.size;
            self.delivered += s.size;
            self.delivered_time = now;
            if pn == largest {
                let delay = u64::from(a.delay_us) * 1000;
                self.model
                    .rtt_sample(now, now.saturating_sub(s.time), delay);
            }
            if rs.is_none_or(|r| s.delivered >= r.delivered) {
                rs = Some(s);
                self.first_sent_time = s.time;
            }
            if let What::Data(flow, p) = s.what {
                if let Some(f) = self.flows.get_mut(&flow) {
                    f.send.acked(p.offset..p.offset + p.len as u64, p.fin);
                }
                self.reap(flow);
            }
        }
        self.pto_count = 0;
        if self.app_limited != 0 && self.delivered > self.app_limited {
            self.app_limited = 0;
        }
        let sample = rs.and_then(|s| {
            let interval = (s.time - s.first_sent_time).max(now - s.delivered_time);
            (interval > 0 && interval >= self.model.min_rtt() / 2).then(|| Sample {
                rate: (self.delivered - s.delivered) as f64 * 1e9 / interval as f64,
                app_limited: s.app_limited,
            })
        });
        if rs.is_some_and(|s| s.delivered >= self.next_round) {
            self.next_round = self.delivered;
            self.model.new_round(now);
        }
        self.model
            .delivered(sample, acked, self.bytes_in_flight, now);
        self.detect_losses(now);
    }

    fn loss_delay(&self) -> Nanos {
        (self.model.srtt() * 9 / 8).max(1_000_000)
    }

    fn detect_losses(&mut self, now: Nanos) {
        self.loss_time = None;
        let Some(largest) = self.largest_acked else {
            return;
        };
        let delay = self.loss_delay();
        let mut lost = Vec::new();
        for (&pn, s) in self.in_flight.range(..largest) {
            if pn + PACKET_THRESHOLD <= largest || s.time + delay <= now {
                lost.push(pn);
            } else {
                let t = s.time + delay;
                self.loss_time = Some(self.loss_time.map_or(t, |l| l.min(t)));
            }
        }
        for pn in lost {
            self.declare_lost(pn);
        }
    }

    fn declare_lost(&mut self, pn: u64) {
        let Some(s) = self.in_flight.remove(&pn) else {
            return;
        };
        self.bytes_in_flight -= s.size;
        self.stats.lost += 1;
        self.model.lost(s.size);
        match s.what {
            What::Data(flow, p) => {
                if let Some(f) = self.flows.get_mut(&flow) {
                    f.send.lost(p.offset..p.offset + p.len as u64, p.fin);
                }
            }
            What::Reset(flow, node) => self.resets.push_back((flow, node)),
            What::Ping | What::Datagram => {}
        }
    }

    /// The peer started again: what its last run held is gone. The
    /// flows it took part in (its own, and ours it acked or sent bytes
    /// on) are reset; ours it never answered go on with the new run, all
    /// they sent going again. The peer counts as lost only when something
    /// of it was lost: a run that never answered (its packets were still
    /// on the link when this relay started) is passed over quietly.
    fn peer_restarted(&mut self) {
        let answered = self.largest_acked.is_some();
        let mut kept = BTreeMap::new();
        let mut lost_any = false;
        for (id, f) in std::mem::take(&mut self.flows) {
            if !self.is_peers(id) && f.send.nothing_acked() && f.recv.nothing_received() {
                kept.insert(id, f);
            } else {
                self.events.push_back(Event::Reset { flow: id });
                lost_any = true;
            }
        }
        for s in std::mem::take(&mut self.in_flight).into_values() {
            if let What::Data(flow, p) = s.what {
                if let Some(f) = kept.get_mut(&flow) {
                    f.send.lost(p.offset..p.offset + p.len as u64, p.fin);
                }
            }
        }
        if answered || lost_any {
            self.events.push_back(Event::PeerLost);
        }
        self.flows = kept;
        self.forget_peer();
    }

    fn lose_peer(&mut self) {
        for (&flow, _) in std::mem::take(&mut self.flows).iter() {
            self.events.push_back(Event::Reset { flow });
        }
        self.events.push_back(Event::PeerLost);
        self.datagrams_out.clear();
        self.forget_peer();
    }

    /// Forgets what was known of the peer's run and of packets in flight.
    fn forget_peer(&mut self) {
        self.resets.clear();
        self.received = Received::default();
        self.peer_seen = Seen::new(!self.cfg.high);
        self.in_flight.clear();
        self.bytes_in_flight = 0;
        self.largest_acked = None;
        self.loss_time = None;
        self.pto_count = 0;
    }

    /// The probe timeout: a round trip and its spread, doubled for each
    /// probe unanswered, four times at most. A probe is a ping of a few
    /// bytes, which loads no link: what backing off further would spare
    /// is nothing, and under bursts of loss that take the probes too it
    /// cost most of a run (doubling to 64 times left a short link idle
    /// for 189 ms after six lost probes).
    fn pto(&self) -> Nanos {
        let base = self.model.srtt() + (4 * self.model.rttvar()).max(1_000_000) + MAX_ACK_DELAY;
        base << self.pto_count.min(MAX_PTO_DOUBLINGS)
    }

    /// When [`on_timeout`](Self::on_timeout) should next be called.
    pub fn next_timeout(&self) -> Option<Nanos> {
        let mut t = self.last_heard + self.cfg.dead_after;
        t = t.min(self.last_eliciting + self.cfg.keepalive);
        if let Some(a) = self.received.ack_due(MAX_ACK_DELAY) {
            t = t.min(a);
        }
        if let Some(l) = self.loss_time {
            t = t.min(l);
        }
        if !self.in_flight.is_empty() || self.credit_blocked() {
            t = t.min(self.last_eliciting + self.pto());
        }
        if self.has_pending() {
            t = t.min(self.next_send);
        }
        Some(t)
    }

    fn credit_blocked(&self) -> bool {
        self.flows.values().any(|f| f.send.blocked())
    }

    fn has_pending(&self) -> bool {
        !self.resets.is_empty()
            || !self.datagrams_out.is_empty()
            || self.flows.values().any(|f| f.send.next_piece(1).is_some())
    }

    /// Acts on the time: losses, probes, the peer's silence.
    pub fn on_timeout(&mut self, now: Nanos) {
        if now >= self.last_heard + self.cfg.dead_after {
            if !self.flows.is_empty() || self.peer_session.is_some() {
                self.lose_peer();
                self.peer_session = None;
            }
            self.last_heard = now;
        }
        if self.loss_time.is_some_and(|t| t <= now) {
            self.detect_losses(now);
        }
        let outstanding = !self.in_flight.is_empty() || self.credit_blocked();
        if outstanding && now >= self.last_eliciting + self.pto() {
            self.pto_count += 1;
            self.stats.probes += 1;
            // A probe, not a resend: its ack shows which packets are lost
            // (a slow ack is not a loss, and resending would only say so
            // twice).
            self.probe = true;
        }
        if now >= self.last_eliciting + self.cfg.keepalive {
            self.probe = true;
        }
    }

    /// Writes the next datagram to send into `out`; `None` if nothing may
    /// go now.
    pub fn poll_transmit(&mut self, now: Nanos, out: &mut [u8]) -> Option<usize> {
        if self.received.ack_needed(now, ACK_EVERY, MAX_ACK_DELAY) || self.window_update {
            return self.send_ack(now, out);
        }
        if let Some((flow, node)) = self.resets.pop_front() {
            return self.send(now, What::Reset(flow, node), out);
        }
        let window = self.model.window();
        let room =
            self.bytes_in_flight == 0 || self.bytes_in_flight + self.cfg.packet as u64 <= window;
        if !self.probe && (now < self.next_send || !room) {
            return None;
        }
        // Datagrams and the flows take turns, so neither starves the other.
        self.datagram_turn = !self.datagram_turn;
        let piece = if self.datagram_turn && !self.datagrams_out.is_empty() {
            None
        } else {
            self.pick()
        };
        if let Some((flow, piece)) = piece {
            return self.send(now, What::Data(flow, piece), out);
        }
        if let Some((node, d)) = self.datagrams_out.pop_front() {
            let n = Packet {
                session: self.session,
                pn: self.next_pn,
                body: Body::Datagram { node, data: &d },
            }
            .encode(out)?;
            self.stats.datagrams_sent += 1;
            self.finish_send(now, What::Datagram, self.next_pn, n);
            return Some(n);
        }
        if self.bytes_in_flight < window && self.app_limited == 0 {
            self.app_limited = (self.delivered + self.bytes_in_flight).max(1);
        }
        if self.probe {
            return self.send(now, What::Ping, out);
        }
        None
    }

    /// The next flow, round robin after the last one served, with a piece.
    fn pick(&mut self) -> Option<(u32, Piece)> {
        let max = self.cfg.payload();
        let after = self.flows.range(self.cursor.saturating_add(1)..);
        let before = self.flows.range(..=self.cursor);
        let found = after
            .chain(before)
            .find_map(|(&id, f)| f.send.next_piece(max).map(|p| (id, p)));
        if let Some((id, _)) = found {
            self.cursor = id;
        }
        found
    }

    fn send(&mut self, now: Nanos, what: What, out: &mut [u8]) -> Option<usize> {
        let pn = self.next_pn;
        let body = match what {
            What::Data(flow, p) => {
                let f = self.flows.get(&flow)?;
                let (a, b) = f.send.bytes(&p);
                let joined;
                let data = if b.is_empty() {
                    a
                } else {
                    joined = [a, b].concat();
                    &joined[..]
                };
                let packet = Packet {
                    session: self.session,
                    pn,
                    body: Body::Data {
                        flow,
                        node: f.node,
                        offset: p.offset,
                        fin: p.fin,
                        data,
                    },
                };
                let n = packet.encode(out)?;
                self.finish_send(now, what, pn, n);
                return Some(n);
            }
            What::Reset(flow, node) => Body::Reset { flow, node },
            What::Ping | What::Datagram => Body::Ping,
        };
        let n = Packet {
            session: self.session,
            pn,
            body,
        }
        .encode(out)?;
        self.finish_send(now, what, pn, n);
        Some(n)
    }

    fn finish_send(&mut self, now: Nanos, what: What, pn: u64, n: usize) {
        self.next_pn += 1;
        self.stats.packets_sent += 1;
        if let What::Data(flow, p) = what {
            if let Some(f) = self.flows.get_mut(&flow) {
                f.send.sent(&p);
            }
            self.stats.bytes_sent += p.len as u64;
            if p.resent {
                self.stats.bytes_resent += p.len as u64;
            }
        }
        if self.bytes_in_flight == 0 {
            self.first_sent_time = now;
            self.delivered_time = now;
        }
        let size = n as u64;
        // Nothing more waits and the window is not full: what this packet
        // measures is the sender, not the link.
        if !self.has_pending() && self.bytes_in_flight + size < self.model.window() {
            self.app_limited = (self.delivered + self.bytes_in_flight + size).max(1);
        }
        self.in_flight.insert(
            pn,
            Sent {
                what,
                time: now,
                size,
                delivered: self.delivered,
                delivered_time: self.delivered_time,
                first_sent_time: self.first_sent_time,
                app_limited: self.app_limited != 0,
            },
        );
        self.bytes_in_flight += size;
        self.last_eliciting = now;
        self.probe = false;
        let rate = self.model.pacing_rate().max(1.0);
        let quantum = ((rate * 5e-4) as u64).max(2 * self.cfg.packet as u64);
        let slack = (quantum as f64 * 1e9 / rate) as Nanos;
        self.next_send =
            self.next_send.max(now.saturating_sub(slack)) + (size as f64 * 1e9 / rate) as Nanos;
    }

    fn send_ack(&mut self, now: Nanos, out: &mut [u8]) -> Option<usize> {
        self.window_update = false;
        let mut credits = Vec::new();
        let changed = |f: &Flow| f.recv.granted > f.recv.advertised;
        for pass_changed in [true, false] {
            for (&id, f) in self.flows.iter_mut() {
                if credits.len() == MAX_CREDITS {
                    break;
                }
                if !f.recv.complete() && changed(f) == pass_changed {
                    credits.push((id, f.recv.granted));
                    f.recv.advertised = f.recv.granted;
                }
            }
        }
        let ack = Ack {
            delay_us: (self.received.delay(now) / 1000).min(u64::from(u32::MAX)) as u32,
            ranges: self.received.ranges(),
            credits,
        };
        self.received.acked();
        let n = Packet {
            session: self.session,
            pn: self.next_pn,
            body: Body::Ack(ack),
        }
        .encode(out)?;
        self.next_pn += 1;
        self.stats.packets_sent += 1;
        Some(n)
    }
}

/// A set of the flow ids of one side (2, 4, 6, … or 3, 5, 7, …), kept
/// small: every id up to `below` is in it, and the few above that arrived
/// out of order.
#[derive(Debug)]
struct Seen {
    below: u32,
    above: std::collections::BTreeSet<u32>,
}

impl Seen {
    /// None yet of the side whose ids are odd if `odd`.
    fn new(odd: bool) -> Seen {
        Seen {
            below: u32::from(odd),
            above: std::collections::BTreeSet::new(),
        }
    }

    fn contains(&self, id: u32) -> bool {
        id <= self.below || self.above.contains(&id)
    }

    fn insert(&mut self, id: u32) {
        if id > self.below {
            self.above.insert(id);
        }
        while self.above.remove(&(self.below + 2)) {
            self.below += 2;
        }
    }
}

impl Flow {
    fn new(node: u32) -> Flow {
        let mut f = Flow {
            node,
            ..Flow::default()
        };
        f.send.limit = INITIAL_CREDIT;
        f.recv.granted = INITIAL_CREDIT;
        f.recv.advertised = INITIAL_CREDIT;
        f
    }
}
