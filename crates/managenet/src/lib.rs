//! Macro-cluster management as processes. Every managed host runs one
//! station on its `manage` address (one UDP socket): its agent, which
//! answers probes (with its health check's last word) and probes on a
//! manager's behalf; the local manager or fallback of each group it holds
//! that role in; and the central manager if it is that host. Every
//! datagram is sealed with a key derived from the cluster's secret, so
//! only hosts that hold it take part.
//!
//! ```text
//!  manager ── Ping ──► agent ── Ack (health) ──► manager ── Report(epoch) ──► central
//!     │ PingReq ─► helper agent ── Ping ──► agent ─ Ack ─► helper ─ Ack ─► manager
//!     └── Beat(epoch) ──► fallback            central ── Refused(epoch) ──► old manager
//!  operator ── Order / Status ──► central ── Reply ──► operator
//! ```
//!
//! One thread runs a station: it reads the clock, then every datagram
//! already queued (each stamped with when it came, so that silence is
//! judged by arrival, not by reading: the `arrival` module), lets its state
//! machines act on that time, and waits for a datagram or their next
//! deadline, whichever comes first.
#![deny(unsafe_code)]

mod arrival;
pub mod central;
pub mod health;
pub mod local;
pub mod status;
pub mod web;

use macrolink_cluster::Cluster;
use macrolink_fabric::seal::{Seal, TAG_LEN};
use macrolink_manage::detect::DetectConfig;
use macrolink_manage::lease::LeaseConfig;
use macrolink_manage::policy::PolicyConfig;
use macrolink_manage::{Nanos, MS, SEC};
use macrolink_wire::manage::{Body, Message, Nodes, OrderKind};
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use central::{Central, Commands};
use health::Checker;
use local::{send, Local, Send};

/// What the cluster key is turned into for management datagrams.
pub const SEAL_CONTEXT: &str = "macrolink manage 2026-11 datagram key";

/// Time between refreshes of the central manager's window (groups and
/// epochs change without a decision).
const SHOW_EVERY: Nanos = 500 * MS;

/// Oldest (or furthest ahead) an operator's request may be, by its sender's
/// clock.
const REQUEST_AGE: Nanos = 10 * SEC;

/// Longest a station sleeps, so that a stop request is seen.
const MAX_SLEEP: Duration = Duration::from_millis(50);
/// Datagrams read at most between two looks of the state machines at the
/// clock (a flood cannot hold back this station's own beats).
const QUEUED: usize = 256;
/// The receive buffer asked for, bytes.
const RECV_BUFFER: usize = 4 << 20;

/// Why a station cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StationError {
    /// The host is not in the file, or has no `manage` address.
    #[error("{0}")]
    NotManaged(String),
    /// The socket or the state directory.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// What the cluster file's `[manage]` table asks for, with defaults.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The failure detector.
    pub detect: DetectConfig,
    /// The lease between a group's manager and its fallback.
    pub lease: LeaseConfig,
    /// The central manager's policy.
    pub policy: PolicyConfig,
    /// The hosts' health check.
    pub health_command: Option<String>,
    /// Time between health checks.
    pub health_every: Duration,
    /// The central manager's commands.
    pub commands: Commands,
}

impl Settings {
    /// The settings of cluster file `c`.
    pub fn of(c: &Cluster) -> Settings {
        let m = &c.manage;
        let mut detect = DetectConfig::default();
        if let Some(p) = m.probe_ms {
            detect.interval = p.max(1) * MS;
            detect.ack_timeout = detect.interval / 2;
            detect.indirect_timeout = detect.interval;
        }
        if let Some(s) = m.suspicion_ms {
            detect.suspicion = s * MS;
        }
        let mut lease = LeaseConfig::default();
        if let Some(l) = m.lease_ms {
            lease.lease = l.max(1) * MS;
            lease.beat = (lease.lease / 5).max(MS);
        }
        let mut policy = PolicyConfig::default();
        if let Some(s) = m.come_back_s {
            policy.come_back = s * SEC;
        }
        if let Some(s) = m.again_within_s {
            policy.again_within = s * SEC;
        }
        if let Some(s) = m.dark_share {
            policy.dark_share = s;
        }
        if let Some(n) = m.resets_per_minute {
            policy.resets_per_window = n;
        }
        if let Some(n) = m.exclusions_per_minute {
            policy.exclusions_per_window = n;
        }
        Settings {
            detect,
            lease,
            policy,
            health_command: m.health_command.clone(),
            health_every: Duration::from_millis(m.health_ms.unwrap_or(5000).max(10)),
            commands: Commands {
                reset: m.reset_command.clone(),
                exclude: m.exclude_command.clone(),
                include: m.include_command.clone(),
            },
        }
    }
}

/// The management roles of one host, on its socket.
#[derive(Debug)]
pub struct Station {
    me: u32,
    sock: UdpSocket,
    seal: Seal,
    addrs: HashMap<u32, SocketAddr>,
    checker: Checker,
    locals: Vec<Local>,
    central: Option<Central>,
    start: Instant,
    /// When a read last found the socket empty (this station's clock): a
    /// datagram read since came after it.
    empty_at: Nanos,
    /// Datagrams the socket had dropped at the last look.
    drops: u32,
    /// When drops were last told in the log.
    warned: Nanos,
}

/// Wall-clock nanoseconds, the central manager's time (its state file
/// outlives the process).
fn wall() -> Nanos {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as Nanos)
}

/// What one read of the socket found.
enum Read {
    /// A datagram, which came at this time (the station's clock).
    Datagram(Nanos),
    /// None queued (or none before the timeout).
    Nothing,
    /// A signal, an ICMP error: no datagram, but maybe more behind.
    Else,
}

impl Station {
    /// Binds host `host`'s station; the central manager keeps its log and
    /// state in `state_dir`.
    pub fn bind(
        c: &Cluster,
        host: &str,
        seal: Seal,
        state_dir: PathBuf,
    ) -> Result<Station, StationError> {
        let h = c
            .host(host)
            .ok_or_else(|| StationError::NotManaged(format!("no host named {host:?}")))?;
        let at = h.manage.ok_or_else(|| {
            StationError::NotManaged(format!("host {host:?} has no `manage` address"))
        })?;
        let sock = UdpSocket::bind(at)?;
        arrival::enable(&sock);
        // Room for the datagrams of a stall (beyond the system's cap only
        // with the right to raise it); whatever is dropped all the same is
        // counted and excuses the silence it may have hidden.
        if rustix::net::sockopt::set_socket_recv_buffer_size_force(&sock, RECV_BUFFER).is_err() {
            let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&sock, RECV_BUFFER);
        }
        let drops = arrival::drops(&sock).unwrap_or(0);
        let settings = Settings::of(c);
        let addrs: HashMap<u32, SocketAddr> = c
            .hosts
            .iter()
            .filter_map(|h| Some((h.node, h.manage?)))
            .collect();
        let node = |n: &str| c.host(n).map(|h| h.node);
        let central = c.manage.central.as_deref().and_then(node);
        let mut locals = Vec::new();
        for (i, m) in c.macros.iter().enumerate() {
            let (Some(manager), Some(fallback), Some(central)) =
                (node(&m.manager), node(&m.fallback), central)
            else {
                continue;
            };
            let members: Vec<u32> = m.hosts.iter().filter_map(|n| node(n)).collect();
            let other = match h.node {
                n if n == manager => fallback,
                n if n == fallback => manager,
                _ => continue,
            };
            locals.push(Local::new(
                h.node,
                i as u16,
                m.name.clone(),
                members,
                other,
                central,
                h.node == manager,
                settings.detect,
                settings.lease,
                0,
            ));
        }
        let central = match central {
            Some(n) if n == h.node => {
                let groups = c
                    .macros
                    .iter()
                    .map(|m| {
                        let hosts = m
                            .hosts
                            .iter()
                            .filter_map(|n| Some((node(n)?, n.clone())))
                            .collect();
                        (m.name.clone(), hosts)
                    })
                    .collect();
                let mut c = Central::new(
                    h.node,
                    groups,
                    settings.policy,
                    settings.commands.clone(),
                    &state_dir,
                    wall(),
                )?;
                c.keep_managers_for(settings.lease.lease);
                Some(c)
            }
            _ => None,
        };
        let roles: Vec<String> = locals
            .iter()
            .map(|l| format!("manager or fallback of group {}", l.group))
            .chain(central.as_ref().map(|_| "central manager".to_string()))
            .collect();
        tracing::info!(
            "{host}: management agent at {at}; {}",
            if roles.is_empty() {
                "no manager role".into()
            } else {
                roles.join(", ")
            }
        );
        Ok(Station {
            me: h.node,
            sock,
            seal,
            addrs,
            checker: Checker::new(
                settings.health_command,
                settings.health_every,
                (settings.health_every * 2).max(Duration::from_secs(1)),
            ),
            locals,
            central,
            start: Instant::now(),
            empty_at: 0,
            drops,
            warned: 0,
        })
    }

    /// Serves the central manager's metrics and status page on
    /// `listener` (see [`web`]); an error on a host that is not the
    /// central manager.
    pub fn serve_web(&mut self, listener: std::net::TcpListener) -> io::Result<()> {
        let c = self
            .central
            .as_mut()
            .ok_or_else(|| io::Error::other("--metrics: this host is not the central manager"))?;
        let w = web::Window::new();
        c.show_in(w.clone());
        w.serve(listener)
    }

    /// On the central manager: resets hosts with `cmd` when the cluster
    /// file sets no reset command.
    pub fn reset_by_default(&mut self, cmd: String) {
        if let Some(c) = &mut self.central {
            c.reset_by_default(cmd);
        }
    }

    /// The address the station listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    fn clock(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    /// Runs until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) -> io::Result<()> {
        let mut buf = vec![0u8; 65_536];
        let mut shown = 0;
        // The time the state machines last judged by: never back.
        let mut judged = 0;
        while !stop.load(Ordering::Relaxed) {
            // The clock first, then what is queued: every datagram that
            // came before `now` is read before the state machines judge
            // silence by it (after a stall of this station, stopped or
            // starved, the queue holds the other side's beats of the whole
            // stall). Cut off at QUEUED (a flood), they judge only up to
            // the last one read.
            let mut now = self.clock();
            let mut last = None;
            let mut emptied = false;
            for _ in 0..QUEUED {
                match self.receive(&mut buf, false)? {
                    Read::Nothing => {
                        emptied = true;
                        break;
                    }
                    Read::Datagram(came) => last = Some(came),
                    Read::Else => {}
                }
            }
            if !emptied {
                now = now.min(last.unwrap_or(judged));
            }
            now = now.max(judged);
            judged = now;
            if let Some(d) = arrival::drops(&self.sock).filter(|d| *d != self.drops) {
                if now >= self.warned + SHOW_EVERY {
                    self.warned = now;
                    tracing::warn!("{} datagrams dropped unread", d.wrapping_sub(self.drops));
                }
                self.drops = d;
                for l in &mut self.locals {
                    l.excuse(now);
                }
                if let Some(c) = &mut self.central {
                    c.excuse(now);
                }
            }
            self.checker.poll();
            let mut out = Vec::new();
            for l in &mut self.locals {
                out.extend(l.poll(now));
            }
            if let Some(c) = &mut self.central {
                c.poll(wall());
                if now >= shown + SHOW_EVERY {
                    shown = now;
                    c.refresh();
                }
            }
            self.flush(out);
            let next = self
                .locals
                .iter()
                .map(Local::next_deadline)
                .min()
                .map_or(MAX_SLEEP, |t| {
                    Duration::from_nanos(t.saturating_sub(self.clock()))
                })
                .clamp(Duration::from_millis(1), MAX_SLEEP);
            self.sock.set_read_timeout(Some(next))?;
            // Wait up to the next deadline for one.
            self.receive(&mut buf, true)?;
        }
        Ok(())
    }

    /// Reads one datagram and handles it, waiting up to the socket's
    /// timeout if `wait`. A signal (a stop and continue among them) or an
    /// ICMP refusal of something sent earlier is no datagram but may have
    /// more behind it.
    fn receive(&mut self, buf: &mut [u8], wait: bool) -> io::Result<Read> {
        let asked = self.clock();
        let got = if wait {
            self.sock.recv_from(buf)
        } else {
            rustix::net::recvfrom(&self.sock, &mut *buf, rustix::net::RecvFlags::DONTWAIT)
                .map_err(io::Error::from)
                .map(|(n, _, src)| (n, src.and_then(|a| SocketAddr::try_from(a).ok())))
                .and_then(|(n, src)| src.map(|s| (n, s)).ok_or(io::ErrorKind::Other.into()))
        };
        match got {
            Ok((n, src)) => {
                // When it came, on this station's clock: the kernel's
                // stamp. One from before the socket was last found empty
                // cannot be (the wall clock stepped between arrival and
                // reading): then when it is read.
                let now = self.clock();
                let late = arrival::last(&self.sock).map_or(0, |t| wall().saturating_sub(t));
                let came = Some(now.saturating_sub(late))
                    .filter(|c| *c >= self.empty_at)
                    .unwrap_or(now);
                self.on_datagram(&buf[..n], src, came);
                Ok(Read::Datagram(came))
            }
            Err(e) => match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    self.empty_at = asked;
                    Ok(Read::Nothing)
                }
                io::ErrorKind::Interrupted
                | io::ErrorKind::ConnectionRefused
                | io::ErrorKind::Other => Ok(Read::Else),
                _ => Err(e),
            },
        }
    }

    fn flush(&self, out: Vec<Send>) {
        for (to, msg) in out {
            if let Some(&addr) = self.addrs.get(&to) {
                self.send_to(msg, addr);
            }
        }
    }

    fn send_to(&self, mut msg: Vec<u8>, addr: SocketAddr) {
        let n = msg.len();
        msg.resize(n + TAG_LEN, 0);
        let n = self.seal.close(&mut msg, n);
        if let Err(e) = self.sock.send_to(&msg[..n], addr) {
            tracing::debug!("to {addr}: {e}");
        }
    }

    fn reply(&self, body: Body<'_>, to: SocketAddr) {
        let mut out = Vec::new();
        send(self.me, 0, body, &mut out);
        for (_, m) in out {
            self.send_to(m, to);
        }
    }

    fn on_datagram(&mut self, d: &[u8], src: SocketAddr, came: Nanos) {
        let Some(packet) = self.seal.open(d) else {
            tracing::debug!("{src}: a datagram without the cluster's seal; dropped");
            return;
        };
        let Ok(m) = Message::decode(packet) else {
            tracing::debug!("{src}: not a management message; dropped");
            return;
        };
        let now = self.clock();
        let me = self.me;
        match m.body {
            // Answered at the sender's address in the file, never at the
            // datagram's source (which a replay can forge).
            Body::Ping { seq, origin } => {
                let (health, text) = self.checker.last();
                let ack = Body::Ack {
                    seq,
                    member: me,
                    origin,
                    health,
                    text,
                };
                let mut out = Vec::new();
                send(me, m.from, ack, &mut out);
                self.flush(out);
            }
            Body::PingReq { seq, member } => {
                let mut out = Vec::new();
                send(
                    me,
                    member,
                    Body::Ping {
                        seq,
                        origin: m.from,
                    },
                    &mut out,
                );
                self.flush(out);
            }
            Body::Ack {
                seq,
                member,
                origin,
                health,
                text,
            } => {
                if origin == me {
                    let mut out = Vec::new();
                    for l in &mut self.locals {
                        out.extend(l.on_ack(member, seq, health, text));
                    }
                    self.flush(out);
                } else if self.addrs.get(&member) == Some(&src) {
                    // A helper passes the answer on to the manager that
                    // asked; only an answer from the member itself.
                    if let Some(&to) = self.addrs.get(&origin) {
                        self.send_to(packet.to_vec(), to);
                    }
                }
            }
            Body::Beat { group, epoch, n } => {
                // A beat of this host's own (it is also the central
                // manager) is no word from the other side.
                let local = self.locals.iter_mut().find(|l| l.group == group);
                if let (Some(l), true) = (local, m.from != me) {
                    l.on_beat(epoch, n, came, now);
                }
                if let Some(c) = &mut self.central {
                    let out = c.on_beat(m.from, group, epoch, came);
                    self.flush(out);
                }
            }
            Body::Refused {
                group,
                epoch,
                holder,
            } => {
                if let Some(l) = self.locals.iter_mut().find(|l| l.group == group) {
                    l.on_refused(epoch, holder, now);
                }
            }
            Body::Report {
                group,
                epoch,
                n,
                host,
                seen,
                text,
            } => {
                if let Some(c) = &mut self.central {
                    let now = wall();
                    let out = c.on_report(m.from, group, epoch, n, host, seen, text, came, now);
                    self.flush(out);
                }
            }
            // Requests from operators come from anywhere: only recent ones
            // are answered, so that a replay cannot turn the station into
            // an amplifier for long.
            Body::Order { sent_ms, .. }
            | Body::Status { sent_ms, .. }
            | Body::Fenced { sent_ms, .. }
                if wall().abs_diff(sent_ms.saturating_mul(1_000_000)) > REQUEST_AGE =>
            {
                tracing::debug!("{src}: a request sent too long ago; dropped");
            }
            Body::Order {
                nonce,
                host,
                order,
                text,
                ..
            } => {
                let (ok, said) = match &mut self.central {
                    Some(c) => c.on_order(nonce, host, order, text, wall()),
                    None => (false, "this host is not the central manager".into()),
                };
                self.reply(
                    Body::Reply {
                        nonce,
                        ok,
                        text: &said,
                    },
                    src,
                );
            }
            Body::Status { nonce, .. } => {
                let (ok, text) = match self.central.as_ref().map(Central::status_json) {
                    Some(Some(json)) => (true, json),
                    Some(None) => (false, "the state does not fit one datagram".into()),
                    None => (false, "this host is not the central manager".into()),
                };
                self.reply(
                    Body::Reply {
                        nonce,
                        ok,
                        text: &text,
                    },
                    src,
                );
            }
            Body::Fenced { nonce, .. } => {
                // Not the central manager: no answer (the asker tries
                // again; a watcher keeps what it knew).
                if let Some(c) = &self.central {
                    let packed = Nodes::pack(c.excluded_nodes());
                    if let Some(nodes) = Nodes::new(&packed) {
                        self.reply(Body::Excluded { nonce, nodes }, src);
                    }
                }
            }
            Body::Reply { .. } | Body::Excluded { .. } => {}
        }
    }
}

/// A socket to the central manager of a cluster, for requests.
#[derive(Debug)]
struct Asker {
    sock: UdpSocket,
    central: SocketAddr,
    seal: Seal,
}

impl Asker {
    fn new(c: &Cluster, seal: Seal) -> io::Result<Asker> {
        let central = c
            .manage
            .central
            .as_deref()
            .and_then(|n| c.host(n))
            .and_then(|h| h.manage)
            .ok_or_else(|| {
                io::Error::other(
                    "the cluster file names no central manager with a `manage` address",
                )
            })?;
        let bind: SocketAddr = if central.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        }
        .parse()
        .map_err(io::Error::other)?;
        Ok(Asker {
            sock: UdpSocket::bind(bind)?,
            central,
            seal,
        })
    }

    /// Sends `body(nonce, sent_ms)` now and then until `take` accepts an
    /// answer carrying the nonce, for at most `wait`.
    fn ask<'a, T>(
        &self,
        body: impl Fn(u64, u64) -> Body<'a>,
        take: impl Fn(u64, Body<'_>) -> Option<T>,
        wait: Duration,
    ) -> io::Result<T> {
        let nonce: u64 = rand::random();
        let sent_ms = wall() / 1_000_000;
        let mut msg = Message {
            from: 0,
            body: body(nonce, sent_ms),
        }
        .encode()
        .ok_or_else(|| io::Error::other("the request is over a limit"))?;
        let n = msg.len();
        msg.resize(n + TAG_LEN, 0);
        let n = self.seal.close(&mut msg, n);
        let until = Instant::now() + wait;
        let mut buf = vec![0u8; 65_536];
        while Instant::now() < until {
            self.sock.send_to(&msg[..n], self.central)?;
            let again = (Instant::now() + Duration::from_millis(300)).min(until);
            while let Some(left) = again.checked_duration_since(Instant::now()) {
                self.sock
                    .set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
                let Ok((len, _)) = self.sock.recv_from(&mut buf) else {
                    break;
                };
                let Some(p) = self.seal.open(&buf[..len]) else {
                    continue;
                };
                if let Some(t) = Message::decode(p).ok().and_then(|m| take(nonce, m.body)) {
                    return Ok(t);
                }
            }
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no answer from the central manager at {} within {wait:?}",
                self.central
            ),
        ))
    }
}

/// Asks the central manager of `c` for something (a status, an order);
/// its reply's (ok, text). Waits at most `wait`, asking again now and
/// then (datagrams get lost).
pub fn ask<'a>(
    c: &Cluster,
    seal: &Seal,
    body: impl Fn(u64, u64) -> Body<'a>,
    wait: Duration,
) -> io::Result<(bool, String)> {
    Asker::new(c, seal.clone())?.ask(
        body,
        |nonce, b| match b {
            Body::Reply {
                nonce: got,
                ok,
                text,
            } if got == nonce => Some((ok, text.to_string())),
            _ => None,
        },
        wait,
    )
}

/// Keeps a set of the hosts the central manager of `c` has excluded,
/// asking it every `every` on a thread of its own (an answer lost or late
/// leaves the set as it was). Returns once the first answer is in, or after
/// four times `every` without one (the set then empty until one comes), so
/// that a transfer started at once does not pick a host excluded long ago.
/// `None` when the file names no central manager.
pub fn watch_excluded(
    c: &Cluster,
    seal: Seal,
    every: Duration,
) -> io::Result<Option<macrolink_manage::excluded::Excluded>> {
    if c.manage.central.is_none() {
        return Ok(None);
    }
    let asker = Asker::new(c, seal)?;
    let set = macrolink_manage::excluded::Excluded::new();
    let keep = set.clone();
    let (first, heard) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("ml-excluded".into())
        .spawn(move || loop {
            let began = Instant::now();
            let got = asker.ask(
                |nonce, sent_ms| Body::Fenced { nonce, sent_ms },
                |nonce, b| match b {
                    Body::Excluded { nonce: got, nodes } if got == nonce => {
                        Some(nodes.iter().collect())
                    }
                    _ => None,
                },
                every,
            );
            match got {
                Ok(nodes) => {
                    if keep.replace(nodes) {
                        tracing::info!("excluded by the central manager: {:?}", keep.nodes());
                    }
                    // Only the first is waited for; later ones find it full
                    // or gone.
                    let _ = first.try_send(());
                }
                Err(e) => tracing::debug!("{e}"),
            }
            std::thread::sleep(every.saturating_sub(began.elapsed()));
        })?;
    let _ = heard.recv_timeout(every * 4);
    Ok(Some(set))
}

/// The order kinds by name, for the command line.
pub fn order_kind(name: &str) -> Option<OrderKind> {
    match name {
        "reset" => Some(OrderKind::Reset),
        "exclude" => Some(OrderKind::Exclude),
        "include" => Some(OrderKind::Include),
        _ => None,
    }
}

/// Where the central manager keeps its decision log and state unless told:
/// `/var/lib/macrolink/manage` for root, else under `$XDG_STATE_HOME` (or
/// `~/.local/state`).
pub fn default_state_dir() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/lib/macrolink/manage");
    }
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("macrolink/manage")
}

/// Whether host `h` of `c` takes part in management.
pub fn is_managed(c: &Cluster, h: &str) -> bool {
    c.host(h).is_some_and(|h| h.manage.is_some())
}
