//! A peer that stops in the middle of a message (a hung process: its
//! connection stays open and says nothing) must not keep the endpoint from
//! its other peers, and its message still arrives whole when it goes on.

use macrolink_fabric::{
    Addr, Completion, Endpoint, EndpointConfig, Error, Mode, Node, NodeConfig, Recv, Transport,
};
use macrolink_wire::{FrameKind, Header};
use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::{raw_conn, watchdog};

/// The header of the one frame of a `len`-byte reliable message, the first
/// on its connection.
fn message_header(src: Addr, len: usize) -> Header {
    let mut h = Header::new(FrameKind::Data);
    h.src_node = src.node;
    h.src_ep = src.ep;
    h.dst_ep = 5;
    h.total = len as u64;
    h.len = len as u32;
    h
}

fn read_one(rx: &mut Endpoint, buf: &mut [u8]) -> Recv {
    loop {
        match rx.read_timeout(buf, Duration::from_secs(20)) {
            Ok(Some(r)) => return r,
            Ok(None) => panic!("nothing arrived in 20 s"),
            Err(Error::PeerLost { .. }) => continue,
            Err(e) => panic!("{e}"),
        }
    }
}

fn stalled_sender_does_not_hold_the_endpoint(completion: Completion) {
    // A read held by the stalled message would never return: fail, not hang.
    let _watch = watchdog(120, "a read behind a stalled message");
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(NodeConfig::local(1, dir.path())).unwrap();
    let b = Node::start(NodeConfig::local(2, dir.path())).unwrap();
    b.add_peer(1, a.tcp_addr().unwrap());
    let cfg = EndpointConfig {
        completion,
        ..EndpointConfig::default()
    };
    let mut rx = a.open(5, cfg).unwrap();
    let mut good = b.open(9, cfg).unwrap();

    // The hung peer sends the head of a 256 KiB message and stops.
    let hung = Addr::new(7, 7);
    let body: Vec<u8> = (0..256u32 << 10).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut s = raw_conn(&a, hung);
    s.write_all(&message_header(hung, body.len()).encode())
        .unwrap();
    s.write_all(&body[..100_000]).unwrap();

    // The good peer writes a little later, while the read sits in the
    // hung peer's message.
    let writer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        let t = good
            .target_via(Addr::new(1, 5), Mode::Reliable, Transport::Tcp)
            .unwrap();
        good.write(t, b"from the good peer").unwrap();
        good
    });

    // A buffer large enough for the hung peer's message: it is placed
    // there directly, then held aside when its sender stalls.
    let mut buf = vec![0u8; 1 << 20];
    let start = Instant::now();
    let r = read_one(&mut rx, &mut buf);
    assert_eq!(
        r.from,
        Addr::new(2, 9),
        "the good peer's message comes first"
    );
    assert_eq!(&buf[..r.len], b"from the good peer");
    assert_eq!(rx.stats().messages_held, 1, "{:?}", rx.stats());
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the good peer waited {:?}",
        start.elapsed()
    );
    let _good = writer.join().unwrap();

    // The hung peer goes on: its message arrives whole, in a buffer that
    // must be large enough for it.
    s.write_all(&body[100_000..]).unwrap();
    let mut small = [0u8; 1000];
    match rx.read_timeout(&mut small, Duration::from_secs(20)) {
        Err(Error::BufferTooSmall { needed, .. }) => assert_eq!(needed, body.len()),
        other => panic!("expected BufferTooSmall, got {other:?}"),
    }
    let r = read_one(&mut rx, &mut buf);
    assert_eq!(r.from, hung);
    assert_eq!(r.len, body.len());
    assert!(buf[..r.len] == body[..], "the held message arrived changed");
    assert_eq!(rx.stats().bad_frames, 0);
}

#[test]
fn a_stalled_sender_does_not_hold_a_waiting_endpoint() {
    stalled_sender_does_not_hold_the_endpoint(Completion::Wait);
}

#[test]
fn a_stalled_sender_does_not_hold_a_polling_endpoint() {
    stalled_sender_does_not_hold_the_endpoint(Completion::Poll);
}

#[test]
fn a_write_to_a_peer_that_takes_nothing_gives_up_after_the_send_timeout() {
    let _watch = watchdog(120, "a write to a peer that takes nothing");
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(NodeConfig::local(1, dir.path())).unwrap();
    let b = Node::start(NodeConfig::local(2, dir.path())).unwrap();
    b.add_peer(1, a.tcp_addr().unwrap());
    a.add_peer(2, b.tcp_addr().unwrap());
    let cfg = EndpointConfig {
        completion: Completion::Wait,
        send_timeout: Some(Duration::from_millis(300)),
        ..EndpointConfig::default()
    };
    let mut tx = a.open(5, cfg).unwrap();
    let mut good = b.open(9, cfg).unwrap();

    // A hung peer: it says hello, then never reads.
    let hung = Addr::new(7, 7);
    let mut s = raw_conn(&a, hung);
    s.write_all(&message_header(hung, 5).encode()).unwrap();
    s.write_all(b"hello").unwrap();
    let mut buf = [0u8; 64];
    let r = read_one(&mut tx, &mut buf);
    assert_eq!((r.from, &buf[..r.len]), (hung, &b"hello"[..]));
    let t = tx.reply_target(&r, Mode::Reliable).unwrap();
    let big = vec![1u8; 64 << 20];
    let start = Instant::now();
    let err = tx.write(t, &big).expect_err("nobody reads it");
    assert!(
        matches!(&err, Error::PeerLost { peer, reason } if *peer == hung && reason.contains("took nothing")),
        "{err}"
    );
    eprintln!("gave up after {:?}", start.elapsed());
    // The endpoint goes on with its other peers.
    let t = tx
        .target_via(Addr::new(2, 9), Mode::Reliable, Transport::Tcp)
        .unwrap();
    tx.write(t, b"still here").unwrap();
    let r = read_one(&mut good, &mut buf);
    assert_eq!(&buf[..r.len], b"still here");
}

/// A peer that keeps asking (region queries, each answered) and never
/// reads the answers: once they fill the way back and the connection's
/// queue of them, the endpoint reads that peer no further, so the peer's
/// own writes stop, where before the endpoint's queue grew at the peer's
/// rate. The send timeout then ends the connection, and the endpoint
/// serves its other peers.
#[test]
fn a_peer_that_asks_and_never_reads_the_answers_is_held_back() {
    let _watch = watchdog(120, "a peer that asks and never reads");
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(NodeConfig::local(1, dir.path())).unwrap();
    let b = Node::start(NodeConfig::local(2, dir.path())).unwrap();
    b.add_peer(1, a.tcp_addr().unwrap());
    let timeout = Duration::from_secs(5);
    let cfg = EndpointConfig {
        completion: Completion::Poll,
        send_timeout: Some(timeout),
        ..EndpointConfig::default()
    };
    let mut rx = a.open(5, cfg).unwrap();
    let mut good = b.open(9, cfg).unwrap();
    // The reader reads until it has lost the asker and heard the good peer.
    let reader = thread::spawn(move || {
        let mut buf = [0u8; 64];
        let (mut got, mut lost) = (Vec::new(), Vec::new());
        let t0 = Instant::now();
        while (got.is_empty() || lost.is_empty()) && t0.elapsed().as_secs() < 60 {
            match rx.read_timeout(&mut buf, Duration::from_millis(100)) {
                Ok(Some(r)) => got.push((r.from, buf[..r.len].to_vec())),
                Ok(None) => {}
                Err(Error::PeerLost { peer, reason }) => lost.push((peer, reason)),
                Err(e) => panic!("{e}"),
            }
        }
        (rx, got, lost)
    });

    let asker = Addr::new(7, 7);
    let mut s = raw_conn(&a, asker);
    s.set_nonblocking(true).unwrap();
    let mut q = Header::new(FrameKind::RegionQuery);
    (q.src_node, q.src_ep, q.dst_ep, q.key) = (asker.node, asker.ep, 5, 0x5eed);
    let queries = q.encode().repeat(1024);
    let (mut written, mut at) = (0u64, 0);
    let start = Instant::now();
    let mut last = Instant::now();
    let held = loop {
        match std::io::Write::write(&mut s, &queries[at..]) {
            Ok(n) => {
                written += n as u64;
                at = (at + n) % queries.len();
                last = Instant::now();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if last.elapsed() >= Duration::from_secs(1) {
                    break true;
                }
                thread::sleep(Duration::from_millis(1));
            }
            // The connection ended before its writes were held.
            Err(_) => break false,
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never held back");
    };
    let took = last - start;
    eprintln!("{written} bytes of queries went in {took:?}; held back: {held}");
    assert!(
        held,
        "the send timeout ended the asker before it was held back"
    );
    assert!(took < timeout, "held back only after {took:?}");

    // Its connection ends by the send timeout; the endpoint serves others.
    let t = good
        .target_via(Addr::new(1, 5), Mode::Reliable, Transport::Tcp)
        .unwrap();
    good.write(t, b"from the good peer").unwrap();
    let (rx, got, lost) = reader.join().unwrap();
    assert_eq!(
        got,
        vec![(Addr::new(2, 9), b"from the good peer".to_vec())],
        "lost: {lost:?}"
    );
    assert!(
        lost.iter()
            .any(|(peer, why)| *peer == asker && why.contains("took nothing")),
        "{lost:?}"
    );
    assert!(rx.stats().puts_refused > 0, "queries were answered");
}
