//! Two nodes in one process, one thread each: the core's semantics without
//! a second process (the multi-process suite lives with the CLI).

use macrolink_fabric::{
    Addr, Completion, EndpointConfig, Error, Mode, Node, NodeConfig, Recv, RecvKind, Refusal,
    Transport,
};
use macrolink_testbed::data::pattern;
use std::thread;
use std::time::Duration;

fn nodes() -> (Node, Node, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(NodeConfig::local(1, dir.path())).unwrap();
    let b = Node::start(NodeConfig::local(2, dir.path())).unwrap();
    a.add_peer(2, b.tcp_addr().unwrap());
    b.add_peer(1, a.tcp_addr().unwrap());
    (a, b, dir)
}

fn wait_cfg() -> EndpointConfig {
    EndpointConfig {
        completion: Completion::Wait,
        ..EndpointConfig::default()
    }
}

/// Echoes `count` messages back to their sender over the same transport.
fn echo(node: &Node, ep: u32, count: usize) -> thread::JoinHandle<()> {
    let mut e = node.open(ep, wait_cfg()).unwrap();
    thread::spawn(move || {
        let mut buf = vec![0u8; 8 << 20];
        for _ in 0..count {
            let r = e.read(&mut buf).unwrap();
            let RecvKind::Message(mode) = r.kind else {
                panic!("unexpected {r:?}")
            };
            let t = e.target_via(r.from, mode, r.transport).unwrap();
            e.write(t, &buf[..r.len]).unwrap();
        }
    })
}

#[test]
fn reliable_round_trips_over_shm_and_tcp() {
    let (a, b, _d) = nodes();
    let sizes = [0usize, 1, 10, 1000, 4096, 65536, 1 << 20, 4 << 20];
    for transport in [Transport::Shm, Transport::Tcp] {
        let h = echo(&b, 5, sizes.len());
        let mut e = a.open(7, wait_cfg()).unwrap();
        let t = e
            .target_via(Addr::new(2, 5), Mode::Reliable, transport)
            .unwrap();
        let mut buf = vec![0u8; 4 << 20];
        for (i, &n) in sizes.iter().enumerate() {
            let msg = pattern(n, i as u64);
            e.write(t, &msg).unwrap();
            let r = e.read(&mut buf).unwrap();
            assert_eq!(r.len, n, "{transport}");
            assert_eq!(r.transport, transport);
            assert!(buf[..n] == msg[..], "{transport} {n}");
        }
        h.join().unwrap();
    }
}

#[test]
fn staged_messages_larger_than_the_pool_still_arrive() {
    let (a, b, _d) = nodes();
    let small = EndpointConfig {
        completion: Completion::Wait,
        tokens: 4,
        token_size: 4096,
        ..EndpointConfig::default()
    };
    let mut rx = b.open(5, small).unwrap();
    let mut tx = a.open(7, wait_cfg()).unwrap();
    let t = tx
        .target_via(Addr::new(2, 5), Mode::Reliable, Transport::Shm)
        .unwrap();
    let msgs: Vec<Vec<u8>> = (0..3).map(|i| pattern(300_000, i)).collect();
    let sender = {
        let msgs = msgs.clone();
        thread::spawn(move || {
            for m in &msgs {
                tx.write(t, m).unwrap();
            }
            tx
        })
    };
    // A small buffer first: refused, the message stays.
    let mut tiny = [0u8; 10];
    let err = rx
        .read(&mut tiny)
        .expect_err("a 10-byte buffer cannot hold it");
    assert!(
        matches!(
            err,
            Error::BufferTooSmall {
                needed: 300_000,
                ..
            }
        ),
        "{err}"
    );
    let mut buf = vec![0u8; 300_000];
    for m in &msgs {
        let r = rx.read(&mut buf).unwrap();
        assert_eq!(r.len, m.len());
        assert!(buf == *m);
    }
    drop(sender.join().unwrap());
}

#[test]
fn messages_over_the_endpoint_limit_close_the_connection() {
    let (a, b, _d) = nodes();
    let limited = EndpointConfig {
        max_message: 1000,
        ..wait_cfg()
    };
    let mut rx = b.open(5, limited).unwrap();
    let mut tx = a.open(7, wait_cfg()).unwrap();
    let t = tx
        .target_via(Addr::new(2, 5), Mode::Reliable, Transport::Tcp)
        .unwrap();
    tx.write(t, &[1u8; 1000]).unwrap();
    tx.write(t, &[2u8; 1001]).unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(rx.read(&mut buf).unwrap().len, 1000);
    let err = rx.read(&mut buf).unwrap_err();
    assert!(
        matches!(&err, Error::PeerLost { reason, .. } if reason.contains("larger")),
        "{err}"
    );
    assert_eq!(rx.stats().bad_frames, 1);
}

#[test]
fn datagrams_over_udp_and_the_mtu_limit() {
    let (a, b, _d) = nodes();
    let h = echo(&b, 5, 4);
    let mut e = a.open(7, wait_cfg()).unwrap();
    let t = e
        .target_via(Addr::new(2, 5), Mode::Datagram, Transport::Udp)
        .unwrap();
    let mut buf = vec![0u8; 4096];
    for n in [0usize, 1, 10, 2048] {
        let msg = pattern(n, 3);
        e.write(t, &msg).unwrap();
        let r = e
            .read_timeout(&mut buf, Duration::from_secs(10))
            .unwrap()
            .expect("echo");
        assert_eq!(r.kind, RecvKind::Message(Mode::Datagram));
        assert_eq!(&buf[..r.len], &msg[..]);
    }
    let err = e.write(t, &[0u8; 2049]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                len: 2049,
                mtu: 2048
            }
        ),
        "{err}"
    );
    h.join().unwrap();
}

#[test]
fn puts_land_in_place_and_bad_ones_change_nothing() {
    let (a, b, _d) = nodes();
    for transport in [Transport::Shm, Transport::Tcp] {
        let mut target = b.open(5, wait_cfg()).unwrap();
        let key = target.register(8192).unwrap();
        target.region_mut(key).unwrap().fill(0xee);
        let mut init = a.open(7, wait_cfg()).unwrap();
        let t = init
            .target_via(Addr::new(2, 5), Mode::Put, transport)
            .unwrap();
        let h = thread::spawn(move || {
            let mut buf = [0u8; 16];
            let r: Recv = target.read(&mut buf).unwrap();
            (target, r)
        });
        let data = pattern(4096, 9);
        // Refused: wrong key, past the end, overflowing offset.
        let bad_key = macrolink_fabric::RegionKey(key.0 ^ 0x55);
        assert!(matches!(
            init.put_wait(t, &data, 0, bad_key, true),
            Err(Error::PutRefused(Refusal::BadKey))
        ));
        assert!(matches!(
            init.put_wait(t, &data, 8192 - 4095, key, true),
            Err(Error::PutRefused(Refusal::OutOfBounds))
        ));
        assert!(matches!(
            init.put_wait(t, &data, u64::MAX - 10, key, true),
            Err(Error::PutRefused(Refusal::OutOfBounds))
        ));
        // Accepted, with notification.
        init.put_wait(t, &data, 100, key, true).unwrap();
        let (target, r) = h.join().unwrap();
        assert_eq!(r.kind, RecvKind::PutPlaced { key, offset: 100 });
        assert_eq!(r.len, 4096);
        let region = target.region(key).unwrap();
        assert!(region[..100].iter().all(|&b| b == 0xee));
        assert_eq!(&region[100..4196], &data[..]);
        assert!(region[4196..].iter().all(|&b| b == 0xee));
        // The overflowing one is refused before it leaves the initiator; over
        // shm the initiator also checks bounds itself, on the mapped region.
        let expected = if transport == Transport::Tcp { 2 } else { 1 };
        assert_eq!(target.stats().puts_refused, expected);
        // Writes on a put target are refused.
        assert!(matches!(
            init.write(t, b"x"),
            Err(Error::WrongMode(Mode::Put))
        ));
    }
}

#[test]
fn unknown_endpoint_is_refused_at_target() {
    let (a, _b, _d) = nodes();
    let mut e = a.open(7, wait_cfg()).unwrap();
    for transport in [Transport::Shm, Transport::Tcp, Transport::Udp] {
        let mode = if transport == Transport::Udp {
            Mode::Datagram
        } else {
            Mode::Reliable
        };
        let err = e.target_via(Addr::new(2, 99), mode, transport).unwrap_err();
        assert!(
            matches!(err, Error::NoSuchEndpoint(_)),
            "{transport}: {err}"
        );
    }
    assert!(matches!(
        a.open(7, wait_cfg()),
        Err(Error::EndpointInUse(7))
    ));
}

#[test]
fn polling_completion_round_trips() {
    let (a, b, _d) = nodes();
    let mut rx = b.open(5, EndpointConfig::default()).unwrap();
    let h = thread::spawn(move || {
        let mut buf = vec![0u8; 1024];
        for _ in 0..1000 {
            let r = rx.read(&mut buf).unwrap();
            let t = rx.target_via(r.from, Mode::Reliable, r.transport).unwrap();
            rx.write(t, &buf[..r.len]).unwrap();
        }
    });
    let mut e = a.open(7, EndpointConfig::default()).unwrap();
    let t = e
        .target_via(Addr::new(2, 5), Mode::Reliable, Transport::Shm)
        .unwrap();
    let mut buf = [0u8; 8];
    for i in 0..1000u64 {
        e.write(t, &i.to_le_bytes()).unwrap();
        let r = e.read(&mut buf).unwrap();
        assert_eq!(r.len, 8);
        assert_eq!(u64::from_le_bytes(buf), i);
    }
    h.join().unwrap();
}

#[test]
fn shm_puts_are_one_sided_once_the_region_is_mapped() {
    let (a, b, _d) = nodes();
    let mut target = b.open(5, wait_cfg()).unwrap();
    let key = target.register(1 << 20).unwrap();
    let mut init = a.open(7, wait_cfg()).unwrap();
    let t = init
        .target_via(Addr::new(2, 5), Mode::Put, Transport::Shm)
        .unwrap();
    // The first put asks the target for its region: the target answers.
    let h = thread::spawn(move || {
        let r = target.read(&mut [0u8; 8]).unwrap();
        (target, r)
    });
    init.put_wait(t, b"first", 0, key, true).unwrap();
    let (target, r) = h.join().unwrap();
    assert_eq!(r.kind, RecvKind::PutPlaced { key, offset: 0 });
    // From now on the target does nothing at all, and puts still complete.
    for i in 0..100u64 {
        let data = pattern(65536, i);
        init.put_wait(t, &data, 4096, key, false).unwrap();
        assert_eq!(&target.region(key).unwrap()[4096..4096 + 65536], &data[..]);
    }
    assert!(matches!(
        init.put_wait(t, &[0u8; 2], (1 << 20) - 1, key, false),
        Err(Error::PutRefused(Refusal::OutOfBounds))
    ));
    assert_eq!(&target.region(key).unwrap()[..5], b"first");
}

#[test]
fn rails_to_one_peer_are_separate_connections() {
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(NodeConfig::local(1, dir.path())).unwrap();
    let mut cfg = NodeConfig::local(2, dir.path());
    cfg.tcp = Some("0.0.0.0:0".parse().unwrap());
    let b = Node::start(cfg).unwrap();
    let port = b.tcp_addr().unwrap().port();
    let mut rx = b.open(5, wait_cfg()).unwrap();
    let mut tx = a.open(7, wait_cfg()).unwrap();
    let to = Addr::new(2, 5);
    let r1 = tx
        .target_at(to, Mode::Reliable, ([127, 0, 0, 1], port).into())
        .unwrap();
    let r2 = tx
        .target_at(to, Mode::Reliable, ([127, 0, 0, 2], port).into())
        .unwrap();
    assert_ne!(r1, r2);
    assert_eq!(
        tx.target_at(to, Mode::Reliable, ([127, 0, 0, 1], port).into())
            .unwrap(),
        r1
    );
    assert!(matches!(
        tx.target_at(to, Mode::Datagram, ([127, 0, 0, 1], port).into()),
        Err(Error::Unsupported { .. })
    ));
    tx.write(r1, b"one").unwrap();
    tx.write(r2, b"two").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8];
    for _ in 0..2 {
        let r = rx.read(&mut buf).unwrap();
        assert_eq!(r.from, Addr::new(1, 7));
        got.push(buf[..r.len].to_vec());
    }
    got.sort();
    assert_eq!(got, [b"one".to_vec(), b"two".to_vec()]);
}

#[test]
fn put_from_fills_the_region_and_a_failing_fill_posts_nothing() {
    let (a, b, _d) = nodes();
    for transport in [Transport::Shm, Transport::Tcp] {
        let mut target = b.open(11, wait_cfg()).unwrap();
        let key = target.register(1 << 16).unwrap();
        let mut init = a.open(12, wait_cfg()).unwrap();
        let t = init
            .target_via(Addr::new(2, 11), Mode::Put, transport)
            .unwrap();
        let h = thread::spawn(move || {
            let mut buf = [0u8; 16];
            let r = target.read(&mut buf).unwrap();
            (target, r)
        });
        let data = pattern(5000, 3);
        let mut scratch = macrolink_fabric::IoBuf::new(0).unwrap();
        let failed = init.put_from(t, 5000, 0, key, true, &mut scratch, |_| {
            Err(std::io::Error::other("disk went away"))
        });
        assert!(matches!(failed, Err(Error::Io(_))), "{failed:?}");
        let p = init
            .put_from(t, 5000, 64, key, true, &mut scratch, |dst| {
                dst.copy_from_slice(&data);
                Ok(())
            })
            .unwrap();
        init.wait_put(p).unwrap();
        let (target, r) = h.join().unwrap();
        assert_eq!(r.kind, RecvKind::PutPlaced { key, offset: 64 });
        assert_eq!(r.len, 5000, "only the good put is reported");
        assert_eq!(&target.region(key).unwrap()[64..5064], &data[..]);
    }
}
