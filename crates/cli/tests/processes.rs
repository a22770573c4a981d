//! Two processes: this test and `macrolink echo` children. Every transport in
//! every mode it carries, sizes from 0 to 4 MiB checked by hash, order over
//! 10,000 messages, 64 endpoints apart, and a peer killed mid-run.

use macrolink_fabric::{
    Addr, Completion, Endpoint, EndpointConfig, Error, Mode, Node, NodeConfig, RecvKind, RegionKey,
    Transport,
};
use macrolink_testbed::data::pattern as data;
use macrolink_testbed::Peer;
use std::path::Path;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");
const SIZES: [usize; 8] = [0, 1, 10, 1000, 4096, 65536, 1 << 20, 4 << 20];
const ANSWER: Duration = Duration::from_secs(20);

fn wait_cfg() -> EndpointConfig {
    EndpointConfig {
        completion: Completion::Wait,
        ..EndpointConfig::default()
    }
}

fn peer(node: u32, dir: &Path, eps: &str) -> Peer {
    Peer::spawn(Path::new(EXE), node, dir, &["--eps", eps]).expect("peer starts")
}

fn local_node(id: u32, dir: &Path, peers: &[(u32, &Peer)]) -> Node {
    let mut cfg = NodeConfig::local(id, dir);
    for (n, p) in peers {
        cfg.peers.insert(*n, p.tcp);
    }
    Node::start(cfg).unwrap()
}

fn answer(ep: &mut Endpoint, buf: &mut [u8]) -> macrolink_fabric::Recv {
    ep.read_timeout(buf, ANSWER)
        .expect("read")
        .expect("an answer within the time limit")
}

#[test]
fn every_transport_and_mode_carries_every_size_intact() {
    let dir = tempfile::tempdir().unwrap();
    let p = peer(2, dir.path(), "1");
    let key = RegionKey(p.keys[0].1);
    let node = local_node(1, dir.path(), &[(2, &p)]);
    let mut ep = node.open(1, wait_cfg()).unwrap();
    let to = Addr::new(2, 1);
    let mtu = node.datagram_mtu();
    let mut buf = vec![0u8; 4 << 20];
    let mut checked = 0;
    for (transport, modes) in [
        (
            Transport::Shm,
            &[Mode::Datagram, Mode::Reliable, Mode::Put][..],
        ),
        (
            Transport::Tcp,
            &[Mode::Datagram, Mode::Reliable, Mode::Put][..],
        ),
        (Transport::Udp, &[Mode::Datagram][..]),
    ] {
        for &mode in modes {
            let t = ep.target_via(to, mode, transport).unwrap();
            for (i, &n) in SIZES.iter().enumerate() {
                let msg = data(n, i as u64 + 1);
                let what = format!("{transport} {mode} {n} bytes");
                match mode {
                    Mode::Datagram if n > mtu => {
                        let err = ep.write(t, &msg).unwrap_err();
                        assert!(
                            matches!(err, Error::TooLarge { len, mtu: m } if len == n && m == mtu),
                            "{what}: {err}"
                        );
                        continue;
                    }
                    Mode::Put => ep.put_wait(t, &msg, 0, key, true).unwrap(),
                    _ => ep.write(t, &msg).unwrap(),
                }
                let r = answer(&mut ep, &mut buf);
                let expect_mode = if mode == Mode::Datagram {
                    Mode::Datagram
                } else {
                    Mode::Reliable
                };
                assert_eq!(r.kind, RecvKind::Message(expect_mode), "{what}");
                assert_eq!(r.transport, transport, "{what}");
                assert_eq!(r.from, to, "{what}");
                assert_eq!(r.len, n, "{what}");
                assert_eq!(blake3::hash(&buf[..n]), blake3::hash(&msg), "{what}");
                checked += 1;
            }
        }
    }
    // 3 datagram transports x 4 sizes within the MTU, 2 x (reliable + put) x 8.
    assert_eq!(checked, 3 * 4 + 2 * 2 * 8);
}

#[test]
fn reliable_mode_keeps_order_over_ten_thousand_messages() {
    let dir = tempfile::tempdir().unwrap();
    let p = peer(2, dir.path(), "1");
    let node = local_node(1, dir.path(), &[(2, &p)]);
    for transport in [Transport::Shm, Transport::Tcp] {
        let mut ep = node.open(1, wait_cfg()).unwrap();
        let t = ep
            .target_via(Addr::new(2, 1), Mode::Reliable, transport)
            .unwrap();
        let mut buf = [0u8; 64];
        let mut next = 0u64;
        // Windows of 500 in flight: sends overtake nothing, answers come in order.
        for base in (0..10_000u64).step_by(500) {
            for i in base..base + 500 {
                let mut m = [0u8; 24];
                m[..8].copy_from_slice(&i.to_le_bytes());
                m[8..].copy_from_slice(&data(16, i)[..]);
                ep.write(t, &m[..8 + (i % 17) as usize]).unwrap();
            }
            for _ in 0..500 {
                let r = answer(&mut ep, &mut buf);
                assert_eq!(r.len, 8 + (next % 17) as usize);
                assert_eq!(
                    u64::from_le_bytes(buf[..8].try_into().unwrap()),
                    next,
                    "{transport}"
                );
                assert_eq!(&buf[8..r.len], &data(16, next)[..r.len - 8]);
                next += 1;
            }
        }
        assert_eq!(next, 10_000);
    }
}

#[test]
fn sixty_four_endpoints_each_get_only_their_own_messages() {
    let dir = tempfile::tempdir().unwrap();
    let p = peer(2, dir.path(), "1-64");
    let node = local_node(1, dir.path(), &[(2, &p)]);
    for transport in [Transport::Shm, Transport::Tcp, Transport::Udp] {
        let mode = if transport == Transport::Udp {
            Mode::Datagram
        } else {
            Mode::Reliable
        };
        let mut eps: Vec<(Endpoint, _)> = (1..=64u32)
            .map(|i| {
                let mut e = node.open(100 + i, wait_cfg()).unwrap();
                let t = e.target_via(Addr::new(2, i), mode, transport).unwrap();
                (e, t)
            })
            .collect();
        for round in 0..3u64 {
            for (i, (e, t)) in eps.iter_mut().enumerate() {
                let msg = data(100 + i, round * 1000 + i as u64);
                e.write(*t, &msg).unwrap();
            }
            for (i, (e, _)) in eps.iter_mut().enumerate() {
                let mut buf = [0u8; 512];
                let r = answer(e, &mut buf);
                assert_eq!(r.from, Addr::new(2, i as u32 + 1), "{transport}");
                assert_eq!(&buf[..r.len], &data(100 + i, round * 1000 + i as u64)[..]);
            }
        }
        for (e, _) in &mut eps {
            assert_eq!(
                e.try_read(&mut [0u8; 512]).unwrap(),
                None,
                "nothing extra arrived"
            );
        }
    }
}

#[test]
fn a_killed_peer_fails_its_endpoints_and_leaves_the_others_working() {
    for transport in [Transport::Shm, Transport::Tcp] {
        let dir = tempfile::tempdir().unwrap();
        let mut doomed = peer(2, dir.path(), "1");
        let survivor = peer(3, dir.path(), "1");
        let node = local_node(1, dir.path(), &[(2, &doomed), (3, &survivor)]);
        let mut a = node.open(1, wait_cfg()).unwrap();
        let mut b = node.open(2, wait_cfg()).unwrap();
        let ta = a
            .target_via(Addr::new(2, 1), Mode::Reliable, transport)
            .unwrap();
        let tb = b
            .target_via(Addr::new(3, 1), Mode::Reliable, transport)
            .unwrap();
        let tp = a.target_via(Addr::new(2, 1), Mode::Put, transport).unwrap();
        let key = RegionKey(doomed.keys[0].1);
        a.put_wait(tp, b"placed", 0, key, false).unwrap();
        let mut buf = vec![0u8; 1 << 16];
        for e in [(&mut a, ta), (&mut b, tb)] {
            e.0.write(e.1, b"before").unwrap();
            assert_eq!(answer(e.0, &mut buf).len, 6);
        }
        doomed.kill();
        // The dead peer's endpoint reports it, through write or read.
        let deadline = Instant::now() + ANSWER;
        let err = loop {
            assert!(
                Instant::now() < deadline,
                "{transport}: loss never reported"
            );
            if let Err(e) = a.write(ta, &buf[..4096]) {
                break e;
            }
            match a.read_timeout(&mut buf, Duration::from_millis(100)) {
                Err(e) => break e,
                Ok(Some(r)) => panic!("{transport}: answer from a dead peer: {r:?}"),
                Ok(None) => {}
            }
        };
        assert!(
            matches!(err, Error::PeerLost { peer, .. } if peer == Addr::new(2, 1)),
            "{err}"
        );
        assert!(matches!(a.write(ta, b"x"), Err(Error::PeerLost { .. })));
        assert!(matches!(
            a.put_wait(tp, b"x", 0, key, false),
            Err(Error::PeerLost { .. })
        ));
        // The other pair is undisturbed.
        for i in 0..100u64 {
            let msg = data(1000, i);
            b.write(tb, &msg).unwrap();
            let r = answer(&mut b, &mut buf);
            assert_eq!(&buf[..r.len], &msg[..], "{transport}");
        }
        assert_eq!(b.stats().bad_frames, 0);
    }
}

#[test]
fn polling_endpoints_exchange_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let p = Peer::spawn(
        Path::new(EXE),
        2,
        dir.path(),
        &["--eps", "1", "--completion", "poll"],
    )
    .unwrap();
    let node = local_node(1, dir.path(), &[(2, &p)]);
    let mut ep = node.open(1, EndpointConfig::default()).unwrap();
    let t = ep
        .target_via(Addr::new(2, 1), Mode::Reliable, Transport::Shm)
        .unwrap();
    let mut buf = [0u8; 8];
    for i in 0..2000u64 {
        ep.write(t, &i.to_le_bytes()).unwrap();
        let r = answer(&mut ep, &mut buf);
        assert_eq!((r.len, u64::from_le_bytes(buf)), (8, i));
    }
}

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb << 10
}

#[test]
fn a_peer_announcing_a_2_gib_message_costs_the_echo_no_memory() {
    use macrolink_wire::{FrameKind, Header};
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let p = peer(2, dir.path(), "1");
    let before = rss(p.pid());
    // A peer sends the start of a 2 GiB message: 6 MiB of it, more than the
    // echo's receive pool holds, then nothing.
    let mut s = std::net::TcpStream::connect(p.tcp).unwrap();
    let mut h = Header::new(FrameKind::Hello);
    (h.src_node, h.src_ep, h.dst_ep) = (66, 1, 1);
    macrolink_fabric::handshake(&mut s, &macrolink_fabric::Key::open(), h).unwrap();
    let total = 2u64 << 30;
    let chunk = vec![7u8; 1 << 20];
    for i in 0..6u64 {
        let mut d = Header::new(FrameKind::Data);
        (d.src_node, d.src_ep, d.dst_ep) = (66, 1, 1);
        (d.total, d.offset, d.len) = (total, i << 20, 1 << 20);
        if s.write_all(&d.encode()).is_err() || s.write_all(&chunk).is_err() {
            break; // the echo closed the connection: fine
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = rss(p.pid());
    eprintln!("echo resident memory: {before} bytes before, {after} after");
    assert!(
        after < before + (128 << 20),
        "the echo grew from {before} to {after} bytes"
    );
    // And it answers a good peer at once.
    let node = local_node(1, dir.path(), &[(2, &p)]);
    let mut ep = node.open(1, wait_cfg()).unwrap();
    let t = ep
        .target_via(Addr::new(2, 1), Mode::Reliable, Transport::Tcp)
        .unwrap();
    ep.write(t, b"still there").unwrap();
    let mut buf = [0u8; 64];
    let r = answer(&mut ep, &mut buf);
    assert_eq!(&buf[..r.len], b"still there");
}
