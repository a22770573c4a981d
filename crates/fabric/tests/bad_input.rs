//! Malformed input from a peer: counted, reported, dropped; never a panic,
//! and nothing else disturbed.

use macrolink_fabric::{
    Addr, Completion, Endpoint, EndpointConfig, Error, Key, Mode, Node, NodeConfig, Transport,
};
use macrolink_wire::{Flags, FrameKind, Header, CHALLENGE_LEN};
use proptest::prelude::*;
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn wait_cfg() -> EndpointConfig {
    EndpointConfig {
        completion: Completion::Wait,
        ..EndpointConfig::default()
    }
}

mod common;
use common::raw_conn;

/// A well-behaved second node and endpoint that keep talking to `rx`.
fn check_still_serving(rx: &mut Endpoint, good: &mut Endpoint) {
    let t = good
        .target_via(Addr::new(1, 5), Mode::Reliable, Transport::Tcp)
        .unwrap();
    good.write(t, b"still here").unwrap();
    let mut buf = [0u8; 64];
    let r = loop {
        match rx.read_timeout(&mut buf, Duration::from_secs(10)) {
            Ok(Some(r)) => break r,
            Ok(None) => panic!("the good peer's message never came"),
            Err(Error::PeerLost { .. }) => continue,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(&buf[..r.len], b"still here");
    assert_eq!(r.from, good.addr());
}

fn setup() -> (Node, Node, Endpoint, Endpoint, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(NodeConfig::local(1, dir.path())).unwrap();
    let b = Node::start(NodeConfig::local(2, dir.path())).unwrap();
    b.add_peer(1, a.tcp_addr().unwrap());
    let rx = a.open(5, wait_cfg()).unwrap();
    let good = b.open(9, wait_cfg()).unwrap();
    (a, b, rx, good, dir)
}

#[test]
fn garbage_on_a_connection_is_counted_and_reported() {
    let (a, _b, mut rx, mut good, _d) = setup();
    let mut s = raw_conn(&a, Addr::new(7, 7));
    s.write_all(&[0xffu8; 200]).unwrap();
    let mut buf = [0u8; 64];
    let err = rx
        .read_timeout(&mut buf, Duration::from_secs(10))
        .expect_err("the broken connection is reported");
    assert!(
        matches!(&err, Error::PeerLost { peer, reason } if *peer == Addr::new(7, 7) && reason.contains("malformed")),
        "{err}"
    );
    assert_eq!(rx.stats().bad_frames, 1);
    check_still_serving(&mut rx, &mut good);
}

#[test]
fn frames_that_break_the_protocol_are_refused() {
    let (a, _b, mut rx, mut good, _d) = setup();
    let cases: Vec<(&str, Header)> = vec![
        ("to another endpoint", {
            let mut h = Header::new(FrameKind::Datagram);
            h.src_node = 7;
            h.src_ep = 7;
            h.dst_ep = 6;
            h
        }),
        ("forged source", {
            let mut h = Header::new(FrameKind::Datagram);
            h.src_node = 8;
            h.src_ep = 7;
            h.dst_ep = 5;
            h
        }),
        ("message starting mid-way", {
            let mut h = Header::new(FrameKind::Data);
            h.src_node = 7;
            h.src_ep = 7;
            h.dst_ep = 5;
            h.total = 100;
            h.offset = 50;
            h.len = 10;
            h
        }),
        ("out-of-order sequence", {
            let mut h = Header::new(FrameKind::Data);
            h.src_node = 7;
            h.src_ep = 7;
            h.dst_ep = 5;
            h.seq = 3;
            h
        }),
        ("answer to no put", {
            let mut h = Header::new(FrameKind::PutAck);
            h.src_node = 7;
            h.src_ep = 7;
            h.dst_ep = 5;
            h.seq = 42;
            h
        }),
        ("a message placed in no buffer offered", {
            let mut h = Header::new(FrameKind::Placed);
            h.src_node = 7;
            h.src_ep = 7;
            h.dst_ep = 5;
            h.total = 1 << 20;
            h
        }),
        ("handshake again", {
            let mut h = Header::new(FrameKind::Hello);
            h.src_node = 7;
            h.src_ep = 7;
            h.dst_ep = 5;
            h
        }),
    ];
    let mut buf = [0u8; 256];
    for (i, (what, h)) in cases.iter().enumerate() {
        let mut s = raw_conn(&a, Addr::new(7, 7));
        s.write_all(&h.encode()).unwrap();
        s.write_all(&vec![0u8; h.len as usize]).unwrap();
        let err = rx
            .read_timeout(&mut buf, Duration::from_secs(10))
            .expect_err(what);
        assert!(matches!(err, Error::PeerLost { .. }), "{what}: {err}");
        assert_eq!(rx.stats().bad_frames, i as u64 + 1, "{what}");
    }
    check_still_serving(&mut rx, &mut good);
}

#[test]
fn garbage_datagrams_are_dropped() {
    let (a, _b, mut rx, mut good, _d) = setup();
    // Learn endpoint 5's UDP port the way a peer does.
    let mut s = TcpStream::connect(a.tcp_addr().unwrap()).unwrap();
    let mut h = Header::new(FrameKind::Hello);
    h.flags = Flags::RESOLVE_UDP;
    h.dst_ep = 5;
    let port = common::hello(&mut s, &Key::open(), h, |s, m| s.write_all(m)).offset as u16;
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    u.send_to(b"not a frame", ("127.0.0.1", port)).unwrap();
    let mut short = Header::new(FrameKind::Datagram);
    short.dst_ep = 5;
    short.len = 100;
    short.total = 100;
    u.send_to(&short.encode(), ("127.0.0.1", port)).unwrap(); // payload missing
    check_still_serving(&mut rx, &mut good);
    assert_eq!(rx.try_read(&mut [0u8; 64]).unwrap(), None);
    assert_eq!(rx.stats().bad_frames, 2);
}

#[test]
fn malformed_handshakes_leave_the_node_serving() {
    let (a, _b, mut rx, mut good, dir) = setup();
    // Garbage instead of a hello.
    let mut s = TcpStream::connect(a.tcp_addr().unwrap()).unwrap();
    s.write_all(&[1u8; 200]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = Vec::new();
    let _ = s.read_to_end(&mut b);
    assert!(b.len() >= CHALLENGE_LEN, "challenged first");
    let answer = Header::decode(&b[CHALLENGE_LEN..]).unwrap();
    assert_eq!(answer.kind, FrameKind::HelloRefused, "then refused");
    // A shared-memory hello naming a file (the old way), and one without
    // its segment.
    let mut u = UnixStream::connect(dir.path().join("node-1.sock")).unwrap();
    let mut h = Header::new(FrameKind::Hello);
    h.dst_ep = 5;
    h.len = 11;
    h.total = 4096;
    let ans = common::hello(&mut u, &Key::open(), h, |s, m| s.write_all(m));
    assert_eq!(ans.kind, FrameKind::HelloRefused);
    let mut u = UnixStream::connect(dir.path().join("node-1.sock")).unwrap();
    h.len = 0;
    let ans = common::hello(&mut u, &Key::open(), h, |s, m| s.write_all(m));
    assert_eq!(ans.kind, FrameKind::HelloRefused);
    check_still_serving(&mut rx, &mut good);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Arbitrary bytes after a valid handshake never panic the endpoint.
    #[test]
    fn arbitrary_stream_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 1..600)) {
        let dir = tempfile::tempdir().unwrap();
        let a = Node::start(NodeConfig::local(1, dir.path())).unwrap();
        let mut rx = a.open(5, wait_cfg()).unwrap();
        let mut s = raw_conn(&a, Addr::new(7, 7));
        s.write_all(&bytes).unwrap();
        drop(s);
        let mut buf = vec![0u8; 1 << 16];
        // Whatever came is delivered or refused; the stream ends in PeerLost.
        let mut lost = false;
        for _ in 0..64 {
            match rx.read_timeout(&mut buf, Duration::from_secs(5)) {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(Error::PeerLost { .. }) => { lost = true; break; }
                Err(Error::BufferTooSmall { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        prop_assert!(lost || rx.stats().bad_frames > 0 || rx.stats().messages_in > 0);
    }
}
