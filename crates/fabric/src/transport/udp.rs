//! Datagram mode over UDP: one socket per endpoint, one frame per datagram.
//!
//! Every call on the socket passes `MSG_DONTWAIT`, so the socket may block:
//! from the first [`Udp::sleep_read`] on it does, with a receive timeout of
//! [`RECV_NAP`], and that call alone sleeps in a `recvfrom`, for a waiting
//! endpoint that hears datagrams alone (see `endpoint::recv_sleep`): one
//! system call a datagram where a sleep in `poll` and then a `recvfrom`
//! are two. The datagram the sleep took waits in the receive buffer for
//! the next look, which takes it first; a send has a buffer of its own.
//!
//! A peer that answered is sent to from a socket connected to it (see
//! [`near`]), whose route the kernel keeps.

mod near;

use macrolink_wire::{FrameKind, Header, WireError, HEADER_LEN};
use rustix::io::Errno;
use rustix::net::{self, RecvFlags, SendFlags, SocketAddrAny};
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use super::tcp::RECV_NAP;

use super::contact::Inbox;
use crate::error::Result;
use crate::rx::{Body, Core, Ready, Step};
use crate::types::{Addr, Mode, Recv, RecvKind, Transport};

/// An endpoint's UDP socket and what it has learned of its peers.
#[derive(Debug)]
pub(crate) struct Udp {
    sock: UdpSocket,
    /// The address `sock` is bound to, which near sockets share.
    ip: IpAddr,
    /// Sockets connected to the peers that answered, to send to them.
    near: near::Near,
    /// Where datagrams are received.
    scratch: Box<[u8]>,
    /// Where a datagram to send is put together (it grows to the largest
    /// this endpoint sent, a datagram at most).
    out: Vec<u8>,
    /// The length and sender of a datagram a sleep took into `scratch`,
    /// for the next look.
    slept: Option<(usize, SocketAddr)>,
    /// Whether the socket may be slept in (it blocks, with a receive
    /// timeout), once the first sleep asked: `None` until then.
    sleeps: Option<bool>,
    learned: HashMap<Addr, SocketAddr>,
    /// The sender of the last datagram taken, whose place `learned` holds:
    /// a stream from one peer costs no hashing per datagram.
    last_from: Option<Addr>,
    /// What datagrams of this fabric carry (see `NodeShared::datagram_token`).
    token: u64,
}

impl Udp {
    pub(crate) fn bind(ip: IpAddr, mtu: usize, token: u64) -> io::Result<Udp> {
        let sock = UdpSocket::bind(SocketAddr::new(ip, 0))?;
        sock.set_nonblocking(true)?;
        Ok(Udp {
            sock,
            ip,
            near: near::Near::default(),
            scratch: vec![0u8; HEADER_LEN + mtu.max(macrolink_wire::MAX_DATAGRAM as usize)]
                .into_boxed_slice(),
            out: Vec::new(),
            slept: None,
            sleeps: None,
            learned: HashMap::new(),
            last_from: None,
            token,
        })
    }

    pub(crate) fn port(&self) -> u16 {
        self.sock.local_addr().map_or(0, |a| a.port())
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Whether a member's datagram has come: junk, datagrams without the
    /// fabric's token and those of peers not admitted do not count.
    pub(crate) fn heard_member(&self) -> bool {
        self.last_from.is_some()
    }

    /// What this fabric's datagrams carry.
    #[cfg(test)]
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    pub(crate) fn learned(&self, a: Addr) -> Option<SocketAddr> {
        self.learned.get(&a).copied()
    }

    pub(crate) fn learn(&mut self, a: Addr, sa: SocketAddr) {
        self.learned.insert(a, sa);
    }

    pub(crate) fn send(&mut self, h: &Header, data: &[u8], to: SocketAddr) -> Result<()> {
        self.out.clear();
        self.out.extend_from_slice(&h.encode());
        self.out.extend_from_slice(data);
        let near = self.near.get(to);
        let sock = near.unwrap_or(&self.sock);
        let mut refused = false;
        for _ in 0..1000 {
            let sent = match near {
                Some(s) => net::send(s, &self.out, SendFlags::DONTWAIT),
                None => net::sendto(&self.sock, &self.out, SendFlags::DONTWAIT, &to),
            };
            match sent {
                Ok(_) => return Ok(()),
                Err(Errno::AGAIN) => {
                    super::sys::wait_fd(
                        sock.as_raw_fd(),
                        super::sys::Interest::Write,
                        std::time::Duration::from_millis(10),
                    )?;
                }
                // An ICMP error of an earlier datagram, which a connected
                // socket reports on the next send instead of sending it:
                // sent once more (that took the error). Datagrams being
                // unreliable, the error itself is not reported.
                Err(Errno::CONNREFUSED) if near.is_some() && !refused => refused = true,
                Err(Errno::CONNREFUSED) => return Ok(()),
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        Ok(())
    }

    /// Receives waiting datagrams; delivers the first straight into `user`
    /// when it fits and nothing is queued, stages the rest.
    pub(crate) fn progress(
        &mut self,
        core: &mut Core,
        inbox: &Inbox,
        mut user: Option<&mut [u8]>,
    ) -> Result<Step> {
        let mut moved = false;
        // A sender that floods the socket (junk, or datagrams for another
        // endpoint) does not keep the pass here: the rest waits for the
        // next look, and the connections are read meanwhile.
        for _ in 0..LOOK_MAX {
            match self.look(core, inbox, user.as_deref_mut())? {
                Step::Idle => break,
                Step::Delivered => return Ok(Step::Delivered),
                _ => moved = true,
            }
        }
        Ok(Step::or_moved(moved))
    }

    /// Takes one datagram off the socket, if one waits: `Idle` when none
    /// did, `Delivered` when it went straight into `user`, `Moved` when it
    /// was staged or passed over. A look that finds nothing is the system
    /// call and a few instructions: a polling endpoint with nothing else
    /// to look at makes one after another. Inlined into the loop that
    /// makes it: after a system call the processor's return predictions
    /// are the kernel's, and a return from here would miss.
    #[inline(always)]
    pub(crate) fn look(
        &mut self,
        core: &mut Core,
        inbox: &Inbox,
        user: Option<&mut [u8]>,
    ) -> Result<Step> {
        let (n, src) = match self.slept.take() {
            Some((n, src)) => (n, Sender::Known(src)),
            None => match net::recvfrom(&self.sock, &mut self.scratch[..], RecvFlags::DONTWAIT) {
                Ok((n, _, Some(src))) => (n, Sender::Raw(src)),
                // Not a datagram of an IP peer, or an ICMP error of an
                // earlier send (datagrams, being unreliable, do not report
                // it): passed over.
                Ok((_, _, None)) | Err(Errno::CONNREFUSED) => return Ok(Step::Moved),
                Err(Errno::AGAIN) => return Ok(Step::Idle),
                Err(e) => return Err(io::Error::from(e).into()),
            },
        };
        self.arrived(core, inbox, user, n, src)
    }

    /// What a look does with the datagram of `n` bytes it took from `src`.
    #[inline]
    fn arrived(
        &mut self,
        core: &mut Core,
        inbox: &Inbox,
        user: Option<&mut [u8]>,
        n: usize,
        src: Sender,
    ) -> Result<Step> {
        let h = match Header::decode(&self.scratch[..n]) {
            Ok(h)
                if h.kind == FrameKind::Datagram
                    && h.len as usize == n - HEADER_LEN
                    && h.dst_ep == core.id =>
            {
                h
            }
            other => return Ok(bad(core, src, other.err())),
        };
        core.header_seen();
        let from = Addr::new(h.src_node, h.src_ep);
        if h.key != self.token {
            return Ok(tokenless(inbox, src));
        }
        if !inbox.admits(from, None) {
            return Ok(Step::Moved);
        }
        if self.last_from != Some(from) {
            // A sender whose address is not an IP one (which an IP socket
            // does not see) is not learned: its datagram is passed over.
            let Some(sa) = src.addr() else {
                return Ok(Step::Moved);
            };
            // Where the peer takes datagrams: the first place learned, not
            // necessarily where this one came from (its near socket).
            let at = *self.learned.entry(from).or_insert(sa);
            self.near.answered(self.ip, at);
            self.last_from = Some(from);
        }
        let data = &self.scratch[HEADER_LEN..n];
        if let Some(buf) = user {
            if core.ready.is_empty() && buf.len() >= data.len() {
                buf[..data.len()].copy_from_slice(data);
                core.stats.messages_in += 1;
                core.stats.bytes_in += data.len() as u64;
                return Ok(core.deliver(Recv {
                    from,
                    len: data.len(),
                    kind: RecvKind::Message(Mode::Datagram),
                    transport: Transport::Udp,
                    via: None,
                }));
            }
        }
        match core.stage(data) {
            Some(chain) => core.ready.push_back(Ready::Msg {
                from,
                mode: Mode::Datagram,
                transport: Transport::Udp,
                len: data.len(),
                body: Body::Staged(chain),
                via: None,
            }),
            None => core.stats.dropped_datagrams += 1,
        }
        Ok(Step::Moved)
    }
}

/// Who sent a datagram: as the kernel wrote it, made a [`SocketAddr`]
/// only where it is needed (a sender not heard before, a log line), not
/// for each datagram.
enum Sender {
    Raw(SocketAddrAny),
    Known(SocketAddr),
}

impl Sender {
    fn addr(&self) -> Option<SocketAddr> {
        match self {
            Sender::Raw(a) => SocketAddr::try_from(a.clone()).ok(),
            Sender::Known(a) => Some(*a),
        }
    }
}

impl fmt::Display for Sender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr() {
            Some(a) => a.fmt(f),
            None => f.write_str("a sender that is not an IP address"),
        }
    }
}

/// A datagram not for this endpoint (`None`) or malformed: counted, and
/// said aloud now and then. Out of line: a look's common path stays small.
#[cold]
#[inline(never)]
fn bad(core: &mut Core, src: Sender, e: Option<WireError>) -> Step {
    core.stats.bad_frames += 1;
    if loud(core.stats.bad_frames) {
        let bad = core.stats.bad_frames;
        match e {
            None => {
                tracing::warn!(%src, bad, "dropped a datagram that is not for this endpoint")
            }
            Some(e) => tracing::warn!(%src, bad, "dropped a malformed datagram: {e}"),
        }
    }
    Step::Moved
}

/// A datagram without the fabric's token: counted as a stranger's.
#[cold]
#[inline(never)]
fn tokenless(inbox: &Inbox, src: Sender) -> Step {
    inbox
        .strangers
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::debug!(%src, "dropped a datagram without the fabric's token");
    Step::Moved
}

impl Udp {
    /// Whether the socket may be slept in: the first time asked, it is
    /// made to block with a receive timeout (the timeout first: a socket
    /// that blocks without one is not left).
    fn may_sleep(&mut self) -> bool {
        *self.sleeps.get_or_insert_with(|| {
            self.sock.set_read_timeout(Some(RECV_NAP)).is_ok()
                && self.sock.set_nonblocking(false).is_ok()
        })
    }

    /// Sleeps in the socket's `recvfrom` until a datagram comes or its
    /// receive timeout goes by (a nap, see [`RECV_NAP`]), and keeps the
    /// datagram for the next look ([`Udp::look`]): whether something
    /// came (a datagram, or an error the next look meets again), false
    /// when nothing did. `None` where the socket cannot block, or holds a
    /// datagram taken already.
    pub(crate) fn sleep_read(&mut self) -> Option<bool> {
        if self.slept.is_some() || !self.may_sleep() {
            return None;
        }
        Some(
            match take(&self.sock, &mut self.scratch, RecvFlags::empty()) {
                Ok(Some(d)) => {
                    self.slept = Some(d);
                    true
                }
                Err(Errno::AGAIN | Errno::INTR) => false,
                // Something not a datagram of an IP peer, or an ICMP error of
                // an earlier send: nothing to keep, and something heard.
                Ok(None) => true,
                // Something heard: the next look asks again, and reports
                // a lasting error (a socket's pending one is cleared once
                // reported, here, as a send's ICMP error is passed over).
                Err(_) => true,
            },
        )
    }
}

/// Takes one datagram off the socket into `buf`, for a sleep: its length
/// and sender. `Ok(None)`: something to pass over (a sender that is not
/// an IP address; an ICMP error of an earlier datagram, which datagrams,
/// being unreliable, do not report). A system call of its own, not
/// libc's (a cancellation point with `errno`), as [`Udp::look`]'s.
fn take(
    sock: &UdpSocket,
    buf: &mut [u8],
    flags: RecvFlags,
) -> std::result::Result<Option<(usize, SocketAddr)>, Errno> {
    match net::recvfrom(sock, buf, flags) {
        Ok((n, _, Some(src))) => Ok(SocketAddr::try_from(src).ok().map(|s| (n, s))),
        Ok((_, _, None)) | Err(Errno::CONNREFUSED) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Datagrams one look takes off the socket at most.
const LOOK_MAX: usize = 256;

/// Whether the `n`-th bad datagram is said aloud: the 1st, 2nd, 4th, 8th
/// and so on, so that a flood of them does not flood the log.
fn loud(n: u64) -> bool {
    n.is_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::near::NEAR_MAX;
    use super::*;
    use crate::pool::TokenPool;
    use crate::types::Completion;
    use std::net::Ipv4Addr;
    use std::time::{Duration, Instant};

    const TOKEN: u64 = 0x5eed;

    fn bind() -> Udp {
        Udp::bind(Ipv4Addr::LOCALHOST.into(), 1500, TOKEN).unwrap()
    }

    fn to(u: &Udp) -> SocketAddr {
        SocketAddr::new(Ipv4Addr::LOCALHOST.into(), u.port())
    }

    /// A datagram of `data` from endpoint 1:7 to endpoint 5.
    fn header(data: &[u8]) -> Header {
        let mut h = Header::new(FrameKind::Datagram);
        (h.src_node, h.src_ep, h.dst_ep) = (1, 7, 5);
        h.len = data.len() as u32;
        h.total = data.len() as u64;
        h.key = TOKEN;
        h
    }

    fn reader() -> Core {
        let pool = TokenPool::new(64, 4096).unwrap();
        Core::new(5, Completion::Wait, 1 << 20, pool, 64)
    }

    /// What the next look delivers into a reader's buffer.
    fn read_one(u: &mut Udp, rx: &mut Core, inbox: &Inbox) -> Option<Vec<u8>> {
        let mut buf = [0u8; 64];
        match u.progress(rx, inbox, Some(&mut buf)).unwrap() {
            Step::Delivered => Some(buf[..rx.got.take().unwrap().len].to_vec()),
            _ => None,
        }
    }

    #[test]
    fn a_sleep_in_the_recvfrom_keeps_the_datagram_for_the_next_look_and_ends_with_its_nap() {
        let (mut a, mut b) = (bind(), bind());
        let (mut rx, inbox) = (reader(), Inbox::new(b.port(), None).unwrap());
        // Nothing comes: the nap ends it.
        let t0 = Instant::now();
        assert_eq!(b.sleep_read(), Some(false));
        assert!(t0.elapsed() >= RECV_NAP, "it slept ({:?})", t0.elapsed());
        assert!(t0.elapsed() < Duration::from_secs(5), "a nap, not for good");
        // A datagram sent after the sleep began wakes it.
        let b_at = to(&b);
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            a.send(&header(b"first"), b"first", b_at).unwrap();
            a
        });
        let mut got = false;
        for _ in 0..200 {
            match b.sleep_read() {
                Some(true) => {
                    got = true;
                    break;
                }
                Some(false) => {}
                None => panic!("a UDP socket can be slept in"),
            }
        }
        assert!(got, "the datagram woke no sleep");
        let mut a = sender.join().unwrap();
        assert_eq!(b.sleep_read(), None, "a datagram is kept: no sleep");
        // A send meanwhile leaves the kept datagram as it was; one more
        // comes after it.
        b.send(&header(&[9; 900]), &[9; 900], to(&a)).unwrap();
        a.send(&header(b"second"), b"second", b_at).unwrap();
        assert_eq!(
            read_one(&mut b, &mut rx, &inbox).as_deref(),
            Some(&b"first"[..])
        );
        assert_eq!(
            read_one(&mut b, &mut rx, &inbox).as_deref(),
            Some(&b"second"[..])
        );
        assert_eq!(read_one(&mut b, &mut rx, &inbox), None, "nothing more");
        // And the 900 bytes reached `a` whole.
        let (mut at_a, inbox_a) = (reader(), Inbox::new(a.port(), None).unwrap());
        let mut big = vec![0u8; 1000];
        for _ in 0..100 {
            let step = a.progress(&mut at_a, &inbox_a, Some(&mut big)).unwrap();
            if let Step::Delivered = step {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let r = at_a.got.take().expect("the send arrived");
        assert_eq!(&big[..r.len], &[9; 900][..]);
    }

    /// A datagram of `data` from endpoint 1:`ep` to endpoint 5, as bytes.
    fn datagram(ep: u32, data: &[u8]) -> Vec<u8> {
        let mut h = header(data);
        h.src_ep = ep;
        [&h.encode()[..], data].concat()
    }

    /// Where a datagram `u` sends to `at` comes from, as `at` sees it.
    fn sent_from(u: &mut Udp, at: &UdpSocket) -> SocketAddr {
        u.send(&header(b"back"), b"back", at.local_addr().unwrap())
            .unwrap();
        at.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 256];
        let (n, from) = at.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[HEADER_LEN..n], b"back");
        from
    }

    #[test]
    fn a_peer_that_answered_is_sent_to_from_a_socket_connected_to_it() {
        let mut b = bind();
        let (mut rx, inbox) = (reader(), Inbox::new(b.port(), None).unwrap());
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let other = UdpSocket::bind("127.0.0.1:0").unwrap();
        // Before the peer said anything: from the endpoint's socket.
        assert_eq!(sent_from(&mut b, &peer), to(&b));
        peer.send_to(&datagram(7, b"hi"), to(&b)).unwrap();
        let mut got = None;
        for _ in 0..500 {
            got = read_one(&mut b, &mut rx, &inbox);
            if got.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got.as_deref(), Some(&b"hi"[..]));
        assert_eq!(b.near.peers(), [peer.local_addr().unwrap()]);
        // Now from another port of the same address, every time; to
        // anyone else from the endpoint's socket, as before.
        for _ in 0..3 {
            let from = sent_from(&mut b, &peer);
            assert_eq!(from.ip(), to(&b).ip());
            assert_ne!(from.port(), b.port());
            assert_eq!(sent_from(&mut b, &other), to(&b));
        }
    }

    #[test]
    fn a_peer_keeps_the_place_it_learned_first_when_answers_come_from_a_near_socket() {
        let (mut a, mut b) = (bind(), bind());
        let (mut rx_a, inbox_a) = (reader(), Inbox::new(a.port(), None).unwrap());
        let (mut rx_b, inbox_b) = (reader(), Inbox::new(b.port(), None).unwrap());
        // A knows where B takes datagrams, as an endpoint's target does
        // (its node told it), and sends first.
        let b_is = Addr::new(1, 7);
        a.learn(b_is, to(&b));
        let deliver = |u: &mut Udp, rx: &mut Core, inbox: &Inbox| {
            for _ in 0..500 {
                if let Some(d) = read_one(u, rx, inbox) {
                    return d;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            panic!("nothing came");
        };
        for round in 0..3u8 {
            a.send(&header(&[round]), &[round], to(&b)).unwrap();
            assert_eq!(deliver(&mut b, &mut rx_b, &inbox_b), [round]);
            b.send(&header(&[round + 10]), &[round + 10], to(&a))
                .unwrap();
            assert_eq!(deliver(&mut a, &mut rx_a, &inbox_a), [round + 10]);
        }
        // Both send from near sockets now; each still sends to where the
        // other takes datagrams.
        assert_eq!(b.near.peers(), [to(&a)]);
        assert_eq!(a.near.peers(), [to(&b)]);
        assert_eq!(a.learned(b_is), Some(to(&b)));
    }

    #[test]
    fn a_send_after_the_peer_s_socket_was_gone_a_while_is_not_lost() {
        let mut b = bind();
        let (mut rx, inbox) = (reader(), Inbox::new(b.port(), None).unwrap());
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let at = peer.local_addr().unwrap();
        peer.send_to(&datagram(7, b"hi"), to(&b)).unwrap();
        for _ in 0..500 {
            if read_one(&mut b, &mut rx, &inbox).is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(b.near.peers(), [at]);
        // Sent while nobody is there: the kernel's ICMP error comes back
        // to the connected socket, which reports it on its next send.
        drop(peer);
        b.send(&header(b"lost"), b"lost", at).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        // The peer is back at the same place: that next send reaches it.
        let again = UdpSocket::bind(at).expect("the port it had is free again");
        assert_ne!(sent_from(&mut b, &again), to(&b));
    }

    #[test]
    fn near_sockets_are_few_and_strangers_get_none() {
        let mut b = bind();
        let (mut rx, inbox) = (reader(), Inbox::new(b.port(), None).unwrap());
        // Without the fabric's token, and malformed: no near socket.
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut tokenless = datagram(9, b"x");
        tokenless[48..56].copy_from_slice(&0u64.to_le_bytes());
        stranger.send_to(&tokenless, to(&b)).unwrap();
        stranger.send_to(b"junk", to(&b)).unwrap();
        let peers: Vec<UdpSocket> = (0..NEAR_MAX + 2)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        for (i, p) in peers.iter().enumerate() {
            p.send_to(&datagram(10 + i as u32, b"hi"), to(&b)).unwrap();
        }
        let mut delivered = 0;
        for _ in 0..500 {
            if read_one(&mut b, &mut rx, &inbox).is_some() {
                delivered += 1;
            }
            if delivered == peers.len() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(delivered, peers.len());
        let near = b.near.peers();
        assert_eq!(near.len(), NEAR_MAX);
        assert!(!near.contains(&stranger.local_addr().unwrap()));
        // The first peers have one; the last are sent to as before.
        assert_ne!(sent_from(&mut b, &peers[0]), to(&b));
        assert_eq!(sent_from(&mut b, &peers[NEAR_MAX + 1]), to(&b));
    }

    #[test]
    fn every_other_call_on_the_blocking_socket_still_returns_at_once() {
        let (a, mut b) = (bind(), bind());
        let (mut rx, inbox) = (reader(), Inbox::new(b.port(), None).unwrap());
        assert_eq!(b.sleep_read(), Some(false), "now it blocks");
        // A call that blocked would sleep this long.
        b.sock
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let t0 = Instant::now();
        for _ in 0..100 {
            assert_eq!(read_one(&mut b, &mut rx, &inbox), None);
        }
        for i in 0..100u8 {
            b.send(&header(&[i]), &[i], to(&a)).unwrap();
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "a call blocked");
    }
}
