//! The range-extension relay as a process: one at each end of a long link,
//! each also on its own segment. A host that dials a node of the far
//! segment dials its own relay instead (the cluster file gives it one port
//! per far node); the relay carries the connection's bytes over the
//! long-haul protocol to the relay at the other end, which dials the node.
//! Each relay checks the fabric's handshake on its own side: the near host
//! proves the cluster key to its relay before anything of its connection
//! crosses the long link, and the far relay proves it to the node, with the
//! near host's hello (see `greet`); the relays prove it to each other by a
//! keyed hash on every datagram. Datagrams of the fabric's datagram mode
//! cross too, once each (see `dgram`).
//!
//! ```text
//!  host ──tcp──► relay A ══ UDP: haul::Link ⇄ haul::Link ══► relay B ──tcp──► node
//!       ◄─ TCP window ─┘   ◄──── per-flow credit, acks ────┘  ◄─ TCP window ─┘
//! ```
//!
//! Three credit loops in series, as the paper has them: the near host's TCP
//! window, the long link's per-flow credit, the far node's TCP window. A
//! relay reads from a local connection only while the long link's send
//! buffer has room for that flow, so a slow far node slows its sender and
//! nothing else.
//!
//! One thread drives everything: `poll` on the sockets with the link's next
//! timeout, then every socket is served without blocking.

mod conn;
mod dgram;
mod greet;
pub mod meter;
mod opening;
pub mod plan;

pub use macrolink_fabric::seal::{Seal, TAG_LEN};

/// What the cluster key is turned into for the long link.
pub const SEAL_CONTEXT: &str = "macrolink relay 2026-11 long-haul packet key";

use macrolink_relay::haul::{self, Event, Link};
use rustix::event::{PollFd, PollFlags};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use conn::{Conn, Served};
use dgram::Datagrams;
use greet::{Done, Greeter};
use macrolink_fabric::Key;
use macrolink_wire::{Flags, FrameKind};
use opening::{Opening, Step};

/// Longest the loop sleeps, so that a stop request is seen.
const MAX_SLEEP_NS: u64 = 50_000_000;
/// Bytes of each long-link socket buffer asked for.
const UDP_BUFFER: usize = 2 << 20;
/// Datagrams taken in one turn of the loop.
const RECV_BURST: usize = 1024;

/// What a relay needs to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// UDP address of this relay on the long link.
    pub long_local: SocketAddr,
    /// UDP address of the peer relay.
    pub long_peer: SocketAddr,
    /// The cluster's key: near hosts prove it to the relay before their
    /// connection crosses the long link, and the long link's datagrams
    /// are sealed with a key derived from it.
    pub key: Key,
    /// For each node of the far segment, where near hosts dial it.
    pub listen: Vec<(u32, SocketAddr)>,
    /// Where the nodes of this segment are, for flows the peer opens.
    pub near: BTreeMap<u32, SocketAddr>,
    /// Where the storage hosts of this segment take file service
    /// contacts, by node.
    pub near_files: BTreeMap<u32, SocketAddr>,
    /// The long-haul protocol's settings.
    pub haul: haul::Config,
    /// Connections one near address may hold at once.
    pub per_source: usize,
}

/// What a relay did.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Report {
    /// Flows opened by near hosts.
    pub flows_out: u64,
    /// Flows opened by the peer.
    pub flows_in: u64,
    /// Flows ended abruptly.
    pub resets: u64,
    /// Near connections refused at a limit.
    pub refused: u64,
    /// Datagrams whose tag was wrong.
    pub bad_tags: u64,
    /// Datagrams with a good tag that did not decode.
    pub bad_packets: u64,
    /// Times the peer was lost.
    pub peer_lost: u64,
    /// Packets sent on the long link.
    pub packets_sent: u64,
    /// Packets taken from it.
    pub packets_received: u64,
    /// Payload bytes sent, resends included.
    pub bytes_sent: u64,
    /// Payload bytes resent.
    pub bytes_resent: u64,
    /// Smallest round trip seen, µs.
    pub min_rtt_us: f64,
    /// Delivery rate measured, MB/s.
    pub measured_mb_s: f64,
    /// Datagrams from near hosts sent on the long link.
    pub datagrams_out: u64,
    /// Datagrams from the long link delivered to near hosts.
    pub datagrams_in: u64,
    /// Datagrams dropped: a queue full, too large, or for an endpoint not
    /// known here.
    pub datagrams_dropped: u64,
    /// Datagrams refused: not of this fabric, or not from this segment.
    pub bad_datagrams: u64,
}

/// A relay with its sockets bound.
#[derive(Debug)]
pub struct Relay {
    meter: meter::Meter,
    cfg: Config,
    seal: Seal,
    udp: UdpSocket,
    listeners: Vec<(u32, TcpListener)>,
}

impl Relay {
    /// Binds the long-link socket and one listener per far node.
    pub fn bind(cfg: Config) -> io::Result<Relay> {
        let udp = UdpSocket::bind(cfg.long_local)?;
        udp.connect(cfg.long_peer)?;
        udp.set_nonblocking(true)?;
        socket_buffers(&udp);
        let mut listeners = Vec::new();
        for &(node, addr) in &cfg.listen {
            let l = TcpListener::bind(addr).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("listening for node {node} on {addr}: {e}"),
                )
            })?;
            l.set_nonblocking(true)?;
            listeners.push((node, l));
        }
        Ok(Relay {
            meter: meter::Meter::default(),
            seal: Seal::new(cfg.key.derive(SEAL_CONTEXT)),
            cfg,
            udp,
            listeners,
        })
    }

    /// The address near hosts dial for each far node (ports picked if 0).
    pub fn listening(&self) -> Vec<(u32, SocketAddr)> {
        self.listeners
            .iter()
            .filter_map(|(n, l)| Some((*n, l.local_addr().ok()?)))
            .collect()
    }

    /// What the relay counts while it runs (for `--metrics`).
    pub fn meter(&self) -> meter::Meter {
        self.meter.clone()
    }

    /// The long-link address.
    pub fn long_addr(&self) -> io::Result<SocketAddr> {
        self.udp.local_addr()
    }

    /// Runs until SIGINT or SIGTERM.
    pub fn run_until_signal(self) -> io::Result<Report> {
        let stop = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(sig, stop.clone())?;
        }
        self.run(&stop)
    }

    /// Runs until `stop` is set.
    pub fn run(self, stop: &AtomicBool) -> io::Result<Report> {
        let start = Instant::now();
        let clock = || start.elapsed().as_nanos() as u64;
        let session = session_number(std::time::SystemTime::now(), rand::random());
        let mut st = State {
            link: Link::new(self.cfg.haul, session, clock()),
            conns: HashMap::new(),
            opening: HashMap::new(),
            greeter: Greeter::new(self.cfg.key.clone(), self.cfg.per_source)?,
            dgrams: Datagrams::bind(&self.listeners, self.cfg.key.datagram_token())?,
            report: Report::default(),
        };
        let packet = self.cfg.haul.packet;
        let mut rbuf = vec![0u8; 65_536];
        let mut tbuf = vec![0u8; packet + TAG_LEN];
        let mut scratch = vec![0u8; 256 << 10];
        let mut pending: Option<Vec<u8>> = None;
        let mut shown = 0;
        while !stop.load(Ordering::Relaxed) {
            let now = clock();
            if now >= shown + 1_000_000_000 {
                shown = now;
                tracing::debug!("{:?}", st.link.stats());
                st.fill();
                self.meter.update(&st.report, st.conns.len());
            }
            for _ in 0..RECV_BURST {
                match self.udp.recv(&mut rbuf) {
                    Ok(n) => match self.seal.open(&rbuf[..n]) {
                        Some(p) => {
                            if st.link.handle(now, p).is_err() {
                                st.report.bad_packets += 1;
                            }
                        }
                        None => st.report.bad_tags += 1,
                    },
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // The peer is not up yet (an ICMP port unreachable).
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                    Err(e) => return Err(e),
                }
            }
            st.events(&self.cfg);
            self.accept(&mut st);
            let done: Vec<Done> = st.greeter.take().collect();
            for d in done {
                st.on_done(d, &self.cfg);
            }
            st.openings(&self.cfg);
            st.dgrams.deliver(&mut st.link);
            st.dgrams.take_near(&mut st.link, &self.cfg.near);
            let (link, report) = (&mut st.link, &mut st.report);
            st.conns
                .retain(|&flow, c| match c.serve(link, flow, &mut scratch) {
                    Served::Open => true,
                    Served::Done => false,
                    Served::Failed => {
                        report.resets += 1;
                        false
                    }
                });
            st.link.on_timeout(now);
            let now = clock();
            if let Some(p) = pending.take() {
                if !send(&self.udp, &p)? {
                    pending = Some(p);
                }
            }
            while pending.is_none() {
                let Some(n) = st.link.poll_transmit(now, &mut tbuf[..packet]) else {
                    break;
                };
                let n = self.seal.close(&mut tbuf, n);
                if !send(&self.udp, &tbuf[..n])? {
                    pending = Some(tbuf[..n].to_vec());
                }
            }
            self.sleep(&st, pending.is_some(), clock())?;
        }
        st.fill();
        self.meter.update(&st.report, 0);
        Ok(st.report)
    }

    /// Connections near hosts made: each goes to a handshake thread, as
    /// long as its source holds less than its share.
    fn accept(&self, st: &mut State) {
        for (node, l) in &self.listeners {
            while let Ok((sock, from)) = l.accept() {
                let held = st.conns.values().map(Conn::source);
                let held = held.chain(st.opening.values().map(Opening::source));
                let from_here = held.filter(|s| *s == Some(from.ip())).count();
                if from_here >= self.cfg.per_source {
                    st.report.refused += 1;
                    tracing::info!("refused {from}: {from_here} connections from it already");
                    continue;
                }
                if sock.set_nonblocking(false).is_ok() {
                    st.greeter.hear(*node, sock, from);
                }
            }
        }
    }

    /// Waits for a socket or the link's next timeout.
    fn sleep(&self, st: &State, blocked: bool, now: u64) -> io::Result<()> {
        let wait = st
            .link
            .next_timeout()
            .map_or(MAX_SLEEP_NS, |t| t.saturating_sub(now))
            .min(MAX_SLEEP_NS);
        if wait == 0 {
            return Ok(());
        }
        let mut udp = PollFlags::IN;
        if blocked {
            udp |= PollFlags::OUT;
        }
        let mut fds = vec![
            PollFd::new(&self.udp, udp),
            PollFd::from_borrowed_fd(st.greeter.wake_fd(), PollFlags::IN),
        ];
        for (_, l) in &self.listeners {
            fds.push(PollFd::new(l, PollFlags::IN));
        }
        for d in st.dgrams.sockets() {
            fds.push(PollFd::new(d, PollFlags::IN));
        }
        for (&flow, c) in &st.conns {
            let flags = c.interest(&st.link, flow);
            if !flags.is_empty() {
                fds.push(PollFd::from_borrowed_fd(c.as_fd(), flags));
            }
        }
        let t = rustix::time::Timespec {
            tv_sec: (wait / 1_000_000_000) as i64,
            tv_nsec: (wait % 1_000_000_000) as i64,
        };
        match rustix::event::poll(&mut fds, Some(&t)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// What a running relay holds: the long link, the flows' connections and
/// handshakes, the datagram path, and its counts.
struct State {
    link: Link,
    conns: HashMap<u32, Conn>,
    opening: HashMap<u32, Opening>,
    greeter: Greeter,
    dgrams: Datagrams,
    report: Report,
}

impl State {
    /// Puts the figures so far in the report.
    fn fill(&mut self) {
        let r = &mut self.report;
        let s = self.link.stats();
        r.packets_sent = s.packets_sent;
        r.packets_received = s.packets_received;
        r.bytes_sent = s.bytes_sent;
        r.bytes_resent = s.bytes_resent;
        r.min_rtt_us = s.min_rtt as f64 / 1e3;
        r.measured_mb_s = s.bottleneck / 1e6;
        let d = self.dgrams.counts;
        r.datagrams_out = d.out;
        r.datagrams_in = d.delivered;
        r.datagrams_dropped = s.datagrams_dropped + d.undeliverable;
        r.bad_datagrams = d.bad;
    }

    /// The long link's events: flows the peer opened or reset, the peer
    /// lost.
    fn events(&mut self, cfg: &Config) {
        while let Some(ev) = self.link.poll_event() {
            match ev {
                Event::Opened { flow, node } => {
                    self.report.flows_in += 1;
                    let got = Default::default();
                    self.opening.insert(flow, Opening::Hello { node, got });
                }
                Event::Reset { flow } => {
                    self.report.resets += 1;
                    if let Some(c) = self.conns.remove(&flow) {
                        c.abort();
                    }
                    self.opening.remove(&flow);
                }
                Event::PeerLost => {
                    self.report.peer_lost += 1;
                    tracing::warn!("the peer relay at {} is lost", cfg.long_peer);
                }
            }
        }
    }

    /// A handshake thread ended.
    fn on_done(&mut self, done: Done, cfg: &Config) {
        let link = &mut self.link;
        match done {
            Done::Heard {
                node,
                sock,
                from,
                heard,
            } => {
                let Some(flow) = link.open(node) else {
                    self.report.refused += 1;
                    tracing::info!("refused {from}: {} flows already", link.flows());
                    return;
                };
                self.report.flows_out += 1;
                link.write(flow, &heard.hello.encode());
                let o = Opening::Answer {
                    node,
                    sock,
                    source: from.ip(),
                    heard,
                    got: Default::default(),
                };
                self.opening.insert(flow, o);
            }
            Done::Dialled { flow, answer, sock } => {
                let Some(Opening::Dialling { node, hello }) = self.opening.remove(&flow) else {
                    return;
                };
                if !link.has(flow) {
                    return;
                }
                link.write(flow, &answer.encode());
                let resolve = hello.flags.contains(Flags::RESOLVE_UDP);
                let at = cfg.near.get(&node);
                if let (true, FrameKind::HelloOk, Some(at)) = (resolve, answer.kind, at) {
                    if let Ok(port) = u16::try_from(answer.offset) {
                        let addr = SocketAddr::new(at.ip(), port);
                        self.dgrams.resolved(node, hello.dst_ep, addr);
                    }
                }
                match sock {
                    Some(s) if answer.kind == FrameKind::HelloOk && !resolve => {
                        match Conn::new(s, None) {
                            Ok(c) => {
                                self.conns.insert(flow, c);
                            }
                            Err(_) => link.reset(flow),
                        }
                    }
                    _ => link.finish(flow),
                }
            }
            Done::Failed { flow, why } => {
                if self.opening.remove(&flow).is_some() {
                    tracing::warn!("flow {flow}: {why}");
                    self.report.resets += 1;
                    link.reset(flow);
                }
            }
        }
    }

    /// Moves every flow's handshake on.
    fn openings(&mut self, cfg: &Config) {
        let mut opening = std::mem::take(&mut self.opening);
        opening.retain(|&flow, o| {
            let dgrams = &self.dgrams;
            let step = o.step(&mut self.link, flow, self.greeter.key(), |n| dgrams.port(n));
            self.on_step(step, flow, cfg)
        });
        self.opening = opening;
    }

    /// Acts on a step of a flow's handshake; whether it is still opening.
    fn on_step(&mut self, step: Step, flow: u32, cfg: &Config) -> bool {
        let link = &mut self.link;
        match step {
            Step::Wait => return link.has(flow),
            Step::Dial { node, hello } if hello.flags.contains(Flags::CONTACT) => {
                // Unknown here: the host hears a refusal, not a reset.
                let addr = cfg.near_files.get(&node).copied();
                self.greeter.contact(flow, addr);
                return true;
            }
            Step::Dial { node, hello } => match cfg.near.get(&node) {
                Some(addr) => {
                    self.greeter.dial(flow, *addr, hello);
                    return true;
                }
                None => {
                    tracing::warn!("flow {flow}: node {node} is not on this segment");
                    self.report.resets += 1;
                    link.reset(flow);
                }
            },
            Step::Open { sock, source } => match Conn::new(sock, Some(source)) {
                Ok(c) => {
                    self.conns.insert(flow, c);
                }
                Err(_) => link.reset(flow),
            },
            Step::Ended => link.finish(flow),
            Step::Failed(why) => {
                tracing::warn!("flow {flow}: {why}");
                self.report.resets += 1;
                link.reset(flow);
            }
        }
        false
    }
}

/// Socket buffers of the long link: a burst of the peer's packets must
/// wait in the kernel while the relay serves its connections, not be
/// dropped there. Past the system's limit only root may go (the `force`
/// calls); elsewhere the limit stands.
fn socket_buffers(udp: &UdpSocket) {
    use rustix::net::sockopt;
    if sockopt::set_socket_recv_buffer_size_force(udp, UDP_BUFFER).is_err() {
        let _ = sockopt::set_socket_recv_buffer_size(udp, UDP_BUFFER);
    }
    if sockopt::set_socket_send_buffer_size_force(udp, UDP_BUFFER).is_err() {
        let _ = sockopt::set_socket_send_buffer_size(udp, UDP_BUFFER);
    }
}

/// This run's session on the long link: the start time in milliseconds
/// since 1970 in the high 48 bits, so that a relay started later has a
/// later session (the peer takes it as a restart, not a replay), and 16
/// random bits below.
fn session_number(start: std::time::SystemTime, random: u16) -> u64 {
    let ms = start
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    (ms << 16) | u64::from(random)
}

/// Sends one datagram; false if the socket is full.
fn send(udp: &UdpSocket, d: &[u8]) -> io::Result<bool> {
    match udp.send(d) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        // The peer is not up yet; the protocol resends.
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(true),
        Err(e) => Err(e),
    }
}

impl fmt::Display for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = &self.cfg.haul;
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        write!(
            f,
            "relay: long link {} <-> {}; {} far nodes dialled here, {} near nodes; \
             window {}, rate {}; holds at most {:.0} MiB",
            self.long_addr()
                .map_or_else(|_| "?".into(), |a| a.to_string()),
            self.cfg.long_peer,
            self.listeners.len(),
            self.cfg.near.len(),
            h.window
                .map_or("2 x measured BDP".into(), |w| format!("{:.1} MiB", mib(w))),
            h.rate.map_or("measured".into(), |r| format!(
                "{:.0} Mbit/s",
                r as f64 * 8e-6
            )),
            mib(h.memory_bound()),
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "flows: {} out, {} in, {} reset, {} refused",
            self.flows_out, self.flows_in, self.resets, self.refused
        )?;
        writeln!(
            f,
            "long link: {} packets sent, {} received; {} payload bytes sent, {} resent",
            self.packets_sent, self.packets_received, self.bytes_sent, self.bytes_resent
        )?;
        writeln!(
            f,
            "measured: min round trip {:.0} us, delivery rate {:.1} MB/s",
            self.min_rtt_us, self.measured_mb_s
        )?;
        writeln!(
            f,
            "datagrams: {} out, {} in, {} dropped, {} refused",
            self.datagrams_out, self.datagrams_in, self.datagrams_dropped, self.bad_datagrams
        )?;
        write!(
            f,
            "refused long-link datagrams: {} bad tags, {} malformed; peer lost {} times",
            self.bad_tags, self.bad_packets, self.peer_lost
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn a_relay_started_later_has_a_later_session_whatever_its_random_bits() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let first = session_number(t, u16::MAX);
        let later = session_number(t + Duration::from_millis(1), 0);
        assert!(later > first);
        assert_ne!(session_number(t, 1), session_number(t, 2));
    }
}
