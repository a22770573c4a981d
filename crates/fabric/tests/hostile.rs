//! Peers that mean harm: strangers without the fabric key, slow handshakes
//! that would hold every slot, frames from outside an endpoint's session,
//! shared-memory peers that write nonsense into the rings or hand over
//! memory they could shrink, and puts into a region already deregistered.
//! Each is refused or survived, and good peers are served meanwhile.

use macrolink_fabric::{
    gate, Addr, Completion, Endpoint, EndpointConfig, Error, Key, Mode, Node, NodeConfig, Refusal,
    Transport,
};
use macrolink_wire::{FrameKind, Header, HEADER_LEN};
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

mod common;

fn key(s: &str) -> Key {
    Key::from_secret(s.as_bytes()).unwrap()
}

fn node(id: u32, dir: &std::path::Path, k: &Key) -> Node {
    let mut cfg = NodeConfig::local(id, dir);
    cfg.key = Some(k.clone());
    Node::start(cfg).unwrap()
}

fn wait_cfg() -> EndpointConfig {
    EndpointConfig {
        completion: Completion::Wait,
        ..EndpointConfig::default()
    }
}

/// `from` sends to `to` over `transport` and `to` gets it.
fn passes(from: &mut Endpoint, to: &mut Endpoint, transport: Transport) {
    let t = from
        .target_via(to.addr(), Mode::Reliable, transport)
        .unwrap();
    from.write(t, b"in session").unwrap();
    let mut buf = [0u8; 64];
    let r = to
        .read_timeout(&mut buf, Duration::from_secs(5))
        .unwrap()
        .expect("delivered");
    assert_eq!(&buf[..r.len], b"in session");
    assert_eq!(r.from, from.addr());
}

#[test]
fn a_node_without_the_key_reaches_no_endpoint_either_way() {
    let _watch = common::watchdog(60, "key test");
    let dir = tempfile::tempdir().unwrap();
    let k = key("the cluster's secret, 32 bytes..");
    let a = node(1, dir.path(), &k);
    let b = node(2, dir.path(), &key("another cluster's secret bytes.."));
    let open = Node::start(NodeConfig::local(3, dir.path())).unwrap();
    for n in [&b, &open] {
        n.add_peer(1, a.tcp_addr().unwrap());
    }
    a.add_peer(3, open.tcp_addr().unwrap());
    let mut rx = a.open(5, wait_cfg()).unwrap();
    let _open_rx = open.open(5, wait_cfg()).unwrap();
    for t in [Transport::Tcp, Transport::Shm] {
        let mut stranger = b.open(9, wait_cfg()).unwrap();
        let err = stranger
            .target_via(rx.addr(), Mode::Reliable, t)
            .unwrap_err();
        assert!(matches!(err, Error::Unauthenticated { .. }), "{t}: {err}");
        drop(stranger);
        let mut opener = open.open(9, wait_cfg()).unwrap();
        let err = opener.target_via(rx.addr(), Mode::Reliable, t).unwrap_err();
        assert!(matches!(err, Error::Unauthenticated { .. }), "{t}: {err}");
        drop(opener);
        // Nor does the keyed node take an open one for a member.
        let mut member = a.open(6, wait_cfg()).unwrap();
        let err = member
            .target_via(Addr::new(3, 5), Mode::Reliable, t)
            .unwrap_err();
        assert!(matches!(err, Error::Unauthenticated { .. }), "{t}: {err}");
    }
    // A raw peer that guesses gets refused before any endpoint is named.
    let mut s = TcpStream::connect(a.tcp_addr().unwrap()).unwrap();
    let mut h = Header::new(FrameKind::Hello);
    h.dst_ep = 5;
    let ans = common::hello(&mut s, &Key::open(), h, |s, m| s.write_all(m));
    assert_eq!(ans.kind, FrameKind::HelloRefused);
    assert_eq!(Refusal::from_code(ans.offset), Refusal::Unauthenticated);
    // Members still meet.
    let c = node(4, dir.path(), &k);
    c.add_peer(1, a.tcp_addr().unwrap());
    let mut member = c.open(9, wait_cfg()).unwrap();
    passes(&mut member, &mut rx, Transport::Tcp);
    passes(&mut member, &mut rx, Transport::Shm);
}

/// The UDP port of endpoint `ep` of `node`, asked as a member asks it.
fn udp_port(node: &Node, k: &Key, ep: u32) -> u16 {
    let mut s = TcpStream::connect(node.tcp_addr().unwrap()).unwrap();
    let mut h = Header::new(FrameKind::Hello);
    h.flags = macrolink_wire::Flags::RESOLVE_UDP;
    h.dst_ep = ep;
    common::hello(&mut s, k, h, |s, m| s.write_all(m)).offset as u16
}

#[test]
fn datagrams_without_the_fabric_token_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let k = key("the cluster's secret, 32 bytes..");
    let a = node(1, dir.path(), &k);
    let mut rx = a.open(5, wait_cfg()).unwrap();
    let port = udp_port(&a, &k, 5);
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut d = Header::new(FrameKind::Datagram);
    d.src_node = 7;
    d.src_ep = 7;
    d.dst_ep = 5;
    d.len = 4;
    d.total = 4;
    for token in [0, Key::open().datagram_token(), k.datagram_token()] {
        d.key = token;
        let mut b = d.encode().to_vec();
        b.extend_from_slice(b"ping");
        u.send_to(&b, ("127.0.0.1", port)).unwrap();
    }
    let mut buf = [0u8; 64];
    let r = rx
        .read_timeout(&mut buf, Duration::from_secs(5))
        .unwrap()
        .expect("the member's datagram");
    assert_eq!((&buf[..r.len], r.from), (&b"ping"[..], Addr::new(7, 7)));
    assert_eq!(
        rx.read_timeout(&mut buf, Duration::from_millis(200))
            .unwrap(),
        None
    );
    assert_eq!(rx.stats().strangers, 2);
}

/// A sender that floods an endpoint's UDP port with junk as fast as it
/// can does not keep the endpoint's passes on that socket: a member's
/// message over tcp still gets through, in each mode of completion.
#[test]
fn a_flood_of_junk_datagrams_does_not_hold_the_reader() {
    let _watch = common::watchdog(120, "a flood of datagrams");
    let dir = tempfile::tempdir().unwrap();
    let k = key("the cluster's secret, 32 bytes..");
    let a = node(1, dir.path(), &k);
    let b = node(2, dir.path(), &k);
    b.add_peer(1, a.tcp_addr().unwrap());
    let mut tx = b.open(9, wait_cfg()).unwrap();
    for (ep, completion) in [(5, Completion::Wait), (6, Completion::Poll)] {
        let mut rx = a
            .open(
                ep,
                EndpointConfig {
                    completion,
                    ..EndpointConfig::default()
                },
            )
            .unwrap();
        let port = udp_port(&a, &k, ep);
        passes(&mut tx, &mut rx, Transport::Tcp);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flooders: Vec<_> = (0..2)
            .map(|i| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
                    let junk = [i as u8; 100];
                    let t0 = Instant::now();
                    let mut sent = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed)
                        && t0.elapsed() < Duration::from_secs(20)
                    {
                        sent += u64::from(u.send_to(&junk, ("127.0.0.1", port)).is_ok());
                    }
                    sent
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        for _ in 0..5 {
            passes(&mut tx, &mut rx, Transport::Tcp);
        }
        // Nothing of the junk is delivered, and the read ends at its
        // deadline although every pass finds datagrams.
        let mut buf = [0u8; 256];
        let t0 = Instant::now();
        let r = rx
            .read_timeout(&mut buf, Duration::from_millis(200))
            .unwrap();
        let took = t0.elapsed();
        assert!(r.is_none(), "{completion:?}: {r:?}");
        assert!(
            took < Duration::from_secs(1),
            "{completion:?}: a read of 200 ms took {took:?}"
        );
        let t0 = Instant::now();
        assert!(rx.try_read(&mut buf).unwrap().is_none(), "{completion:?}");
        let took = t0.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "{completion:?}: a read that does not wait took {took:?}"
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let sent: u64 = flooders.into_iter().map(|f| f.join().unwrap()).sum();
        assert!(sent > 1000, "{completion:?}: the flood sent {sent}");
        assert!(
            rx.stats().bad_frames > 0,
            "{completion:?}: the flood was read"
        );
    }
}

#[test]
fn slow_handshakes_are_cut_and_good_peers_get_in_while_they_hold_the_maximum() {
    let _watch = common::watchdog(60, "slow handshakes");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = NodeConfig::local(1, dir.path());
    cfg.handshakes = gate::Limits {
        total: 8,
        per_source: 4,
        time: Duration::from_secs(2),
    };
    let a = Node::start(cfg).unwrap();
    let b = Node::start(NodeConfig::local(2, dir.path())).unwrap();
    b.add_peer(1, a.tcp_addr().unwrap());
    let mut rx = a.open(5, wait_cfg()).unwrap();
    let mut good = b.open(9, wait_cfg()).unwrap();
    // Drippers: each sends one byte every 300 ms, for ever if let.
    let start = Instant::now();
    let mut drips: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(a.tcp_addr().unwrap()).unwrap())
        .collect();
    let mut unix: Vec<UnixStream> = (0..16)
        .map(|_| UnixStream::connect(dir.path().join("node-1.sock")).unwrap())
        .collect();
    // Let their handshakes all start (each has a thread of its own).
    std::thread::sleep(Duration::from_millis(300));
    // A good peer is served while they hold every slot.
    for t in [Transport::Tcp, Transport::Shm] {
        let began = Instant::now();
        passes(&mut good, &mut rx, t);
        assert!(began.elapsed() < Duration::from_secs(5), "{t}: served");
    }
    // And every dripper is cut by the deadline of its whole handshake,
    // though it never stops sending.
    let mut cut = vec![false; drips.len() + unix.len()];
    while cut.iter().any(|c| !c) && start.elapsed() < Duration::from_secs(15) {
        for (i, s) in drips.iter_mut().enumerate() {
            cut[i] |= s.write_all(&[1]).is_err() || closed(s);
        }
        for (i, s) in unix.iter_mut().enumerate() {
            cut[16 + i] |= s.write_all(&[1]).is_err() || closed(s);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(cut.iter().all(|c| *c), "cut: {cut:?}");
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
}

/// Whether the node closed the socket (its challenge, if any, read first).
fn closed(s: &mut (impl Read + std::os::fd::AsRawFd)) -> bool {
    let mut b = [0u8; 256];
    // SAFETY: MSG_DONTWAIT on a socket this test owns; `b` is writable.
    let n = unsafe {
        libc::recv(
            s.as_raw_fd(),
            b.as_mut_ptr().cast(),
            b.len(),
            libc::MSG_DONTWAIT,
        )
    };
    n == 0
}

#[test]
fn a_bound_endpoint_hears_only_its_session() {
    let _watch = common::watchdog(60, "session");
    let dir = tempfile::tempdir().unwrap();
    let k = key("the cluster's secret, 32 bytes..");
    let server = node(1, dir.path(), &k);
    let client = node(2, dir.path(), &k);
    let other = node(3, dir.path(), &k);
    for n in [&client, &other] {
        n.add_peer(1, server.tcp_addr().unwrap());
    }
    server.add_peer(2, client.tcp_addr().unwrap());
    let mut srv = server.open(16, wait_cfg()).unwrap();
    let mut cli = client.open(7, wait_cfg()).unwrap();
    // A stranger's connection made before the session is bound.
    let mut early = other.open(7, wait_cfg()).unwrap();
    let t = early
        .target_via(srv.addr(), Mode::Reliable, Transport::Tcp)
        .unwrap();
    early.write(t, b"early").unwrap();
    let token = 0x5eed_5eed_5eed_5eed;
    srv.bind_session(cli.addr().node, token);
    cli.bind_session(srv.addr().node, token);
    for t in [Transport::Tcp, Transport::Shm] {
        passes(&mut cli, &mut srv, t);
        passes(&mut srv, &mut cli, t);
    }
    // Strangers: another member, a member that claims the client's address
    // (without the token), and datagrams.
    for t in [Transport::Tcp, Transport::Shm] {
        let mut stranger = other.open(8, wait_cfg()).unwrap();
        let err = stranger
            .target_via(srv.addr(), Mode::Reliable, t)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Refused {
                    why: Refusal::OtherSession,
                    ..
                }
            ),
            "{t}: {err}"
        );
    }
    // A member that takes the client's node id and endpoint, elsewhere.
    let elsewhere = tempfile::tempdir().unwrap();
    let fake = node(2, elsewhere.path(), &k);
    fake.add_peer(1, server.tcp_addr().unwrap());
    let mut liar = fake.open(7, wait_cfg()).unwrap();
    let err = liar
        .target_via(srv.addr(), Mode::Reliable, Transport::Tcp)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Refused {
                why: Refusal::OtherSession,
                ..
            }
        ),
        "{err}"
    );
    let mut dg = other.open(9, wait_cfg()).unwrap();
    let t = dg
        .target_via(srv.addr(), Mode::Datagram, Transport::Udp)
        .unwrap();
    dg.write(t, b"x").unwrap();
    // The session goes on, and hears nothing of them.
    passes(&mut cli, &mut srv, Transport::Tcp);
    let mut buf = [0u8; 64];
    assert_eq!(
        srv.read_timeout(&mut buf, Duration::from_millis(300))
            .unwrap(),
        None
    );
    assert!(srv.stats().strangers >= 5, "{:?}", srv.stats());
    assert_eq!(srv.stats().bad_frames, 0);
    // The session's own datagrams are heard, before and after a stranger's.
    let mine = cli
        .target_via(srv.addr(), Mode::Datagram, Transport::Udp)
        .unwrap();
    let strangers = srv.stats().strangers;
    for (i, m) in [&b"first"[..], b"second"].into_iter().enumerate() {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        let got = loop {
            cli.write(mine, m).unwrap();
            if i == 1 {
                dg.write(t, b"y").unwrap();
            }
            assert!(
                std::time::Instant::now() < until,
                "no datagram of the session"
            );
            if let Some(r) = srv
                .read_timeout(&mut buf, Duration::from_millis(100))
                .unwrap()
            {
                break r;
            }
        };
        assert_eq!((got.from, &buf[..got.len]), (cli.addr(), m));
        // Later copies (a datagram may have been sent twice) are drained.
        while srv
            .read_timeout(&mut buf, Duration::from_millis(50))
            .unwrap()
            .is_some()
        {}
    }
    assert!(srv.stats().strangers > strangers, "{:?}", srv.stats());
}

/// A hand-made shared-memory connection to endpoint 5 of the node whose
/// socket is in `dir`: `segment` is what the hostile peer sends as memory.
/// A hello over the node's unix socket, by hand, with `fds` attached.
fn raw_hello(dir: &std::path::Path, ring: u64, fds: &[BorrowedFd<'_>]) -> (UnixStream, Header) {
    let mut u = UnixStream::connect(dir.join("node-1.sock")).unwrap();
    let mut h = Header::new(FrameKind::Hello);
    h.src_node = 66;
    h.src_ep = 66;
    h.dst_ep = 5;
    h.total = ring;
    let ans = common::hello(&mut u, &Key::open(), h, |s, m| {
        common::send_with_fds(s, m, fds)
    });
    (u, ans)
}

/// The doorbells of a shared-memory hello made by hand: the ends this
/// side keeps (the read end of its own pipe, the write end of the node's)
/// and the two that go with the hello.
struct RawBells {
    ring: OwnedFd,
    _hear: OwnedFd,
    theirs: [OwnedFd; 3],
}

fn raw_bells() -> RawBells {
    let (hear, i_write) = rustix::pipe::pipe().unwrap();
    let (a_read, ring) = rustix::pipe::pipe().unwrap();
    RawBells {
        ring,
        theirs: [a_read, i_write, hear.try_clone().unwrap()],
        _hear: hear,
    }
}

/// A shared-memory hello by hand with `segment` and pipes for doorbells.
fn raw_shm(dir: &std::path::Path, ring: u64, segment: impl AsFd) -> (UnixStream, Header, RawBells) {
    let bells = raw_bells();
    let [a, b, c] = &bells.theirs;
    let fds = [segment.as_fd(), a.as_fd(), b.as_fd(), c.as_fd()];
    let (u, ans) = raw_hello(dir, ring, &fds);
    (u, ans, bells)
}

#[test]
fn a_hostile_shared_memory_peer_is_refused_or_dropped_and_the_node_lives() {
    let _watch = common::watchdog(60, "hostile shm");
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(NodeConfig::local(1, dir.path())).unwrap();
    let b = Node::start(NodeConfig::local(2, dir.path())).unwrap();
    let mut rx = a.open(5, wait_cfg()).unwrap();
    let mut good = b.open(9, wait_cfg()).unwrap();
    let ring = 4096u64;
    let seg_len = 4096 + 2 * ring;

    // Memory the peer could shrink: a plain file, an unsealed memfd.
    let plain = tempfile::tempfile().unwrap();
    plain.set_len(seg_len).unwrap();
    assert_eq!(
        raw_shm(dir.path(), ring, &plain).1.kind,
        FrameKind::HelloRefused
    );
    let loose = common::memfd(seg_len, false);
    assert_eq!(
        raw_shm(dir.path(), ring, &loose).1.kind,
        FrameKind::HelloRefused
    );
    // A ring size that would wrap the segment's length, or not match it.
    let sealed = common::memfd(seg_len, true);
    for bad in [1u64 << 63, (1 << 63) + 2048, 8192, 3000] {
        assert_eq!(
            raw_shm(dir.path(), bad, &sealed).1.kind,
            FrameKind::HelloRefused,
            "ring {bad}"
        );
    }

    // A sealed segment without doorbells, or with ends that are not the
    // read and the write end of pipes.
    assert_eq!(
        raw_hello(dir.path(), ring, &[sealed.as_fd()]).1.kind,
        FrameKind::HelloRefused
    );
    let RawBells {
        ring: w,
        theirs: [r, iw, ir],
        ..
    } = raw_bells();
    for doorbells in [
        [w.as_fd(), iw.as_fd(), ir.as_fd()],
        [sealed.as_fd(), iw.as_fd(), ir.as_fd()],
        // The read end to keep is not of the pipe rung.
        [r.as_fd(), iw.as_fd(), r.as_fd()],
    ] {
        let fds = [sealed.as_fd(), doorbells[0], doorbells[1], doorbells[2]];
        assert_eq!(
            raw_hello(dir.path(), ring, &fds).1.kind,
            FrameKind::HelloRefused
        );
    }

    // A sealed segment, then counters past the ring: the tail of the ring
    // towards the node says a frame of 1 MiB is there, in a 4 KiB ring.
    let seg = common::memfd(seg_len, true);
    let (_u, ans, bells) = raw_shm(dir.path(), ring, &seg);
    assert_eq!(ans.kind, FrameKind::HelloOk);
    assert!(seg.set_len(0).is_err(), "the peer cannot shrink it either");
    let mut head = Header::new(FrameKind::Data);
    head.src_node = 66;
    head.src_ep = 66;
    head.dst_ep = 5;
    head.len = 1 << 20;
    head.total = 1 << 20;
    use std::os::unix::fs::FileExt;
    seg.write_all_at(&head.encode(), 4096).unwrap();
    let tail = (HEADER_LEN as u64 + (1 << 20)).to_le_bytes();
    seg.write_all_at(&tail, 0).unwrap(); // ring 0's tail: first word
    rustix::io::write(&bells.ring, &[1]).unwrap(); // a doorbell, if the node sleeps
    let mut buf = vec![0u8; 2 << 20];
    let got = rx.read_timeout(&mut buf, Duration::from_secs(5));
    assert!(
        matches!(got, Err(Error::PeerLost { .. })),
        "the broken ring ends that connection: {got:?}"
    );
    // The node and its endpoint serve on.
    b.add_peer(1, a.tcp_addr().unwrap());
    for t in [Transport::Shm, Transport::Tcp] {
        passes(&mut good, &mut rx, t);
    }
}
