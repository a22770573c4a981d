//! A pair of relays on loopback carries fabric traffic between a near node
//! and a far one: reliable messages and puts arrive whole, the far side's
//! replies come back, a dead relay fails the flows instead of hanging them,
//! strangers get nothing across, and one near address cannot take every
//! flow.

use macrolink_fabric::{
    Addr, Completion, EndpointConfig, Key, Mode, Node, NodeConfig, RecvKind, Transport,
};
use macrolink_relay::haul;
use macrolink_relaynet::{Config, Relay, Report};
use macrolink_testbed::data::pattern;
use macrolink_wire::haul::DATAGRAM_OVERHEAD;
use macrolink_wire::{Flags, FrameKind, Header, HEADER_LEN};
use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SECRET: &[u8] = b"a relay pair's cluster secret....";

/// The bytes of a registered region, copied out.
fn region_bytes(
    ep: &macrolink_fabric::Endpoint,
    key: macrolink_fabric::RegionKey,
) -> Option<Vec<u8>> {
    let mut b = vec![0; ep.region_len(key)?];
    ep.read_region(key, 0, &mut b).ok()?;
    Some(b)
}

fn key() -> Key {
    Key::from_secret(SECRET).unwrap()
}

fn free_udp() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<std::io::Result<Report>>>,
    listening: Vec<(u32, SocketAddr)>,
}

impl Running {
    fn start(cfg: Config) -> Running {
        let relay = Relay::bind(cfg).unwrap();
        let listening = relay.listening();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = Some(std::thread::spawn(move || relay.run(&s)));
        Running {
            stop,
            thread,
            listening,
        }
    }

    fn addr_of(&self, node: u32) -> SocketAddr {
        self.listening.iter().find(|l| l.0 == node).unwrap().1
    }

    fn stop(&mut self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop();
        }
    }
}

/// Relay A serves near hosts that dial far node `far`; relay B dials it.
fn pair(
    far: u32,
    far_addr: SocketAddr,
    haul: haul::Config,
    per_source: usize,
) -> (Running, Running) {
    let (la, lb) = (free_udp(), free_udp());
    let a = Running::start(Config {
        long_local: la,
        long_peer: lb,
        key: key(),
        listen: vec![(far, "127.0.0.1:0".parse().unwrap())],
        near: BTreeMap::new(),
        near_files: BTreeMap::new(),
        haul,
        per_source,
    });
    let b = Running::start(Config {
        long_local: lb,
        long_peer: la,
        key: key(),
        listen: Vec::new(),
        near: BTreeMap::from([(far, far_addr)]),
        near_files: BTreeMap::new(),
        haul: haul::Config { high: true, ..haul },
        per_source,
    });
    (a, b)
}

/// Relays that carry datagrams both ways: A serves near node `near` and
/// hosts that dial far node `far`; B the other way round.
fn pair_both(far: u32, far_addr: SocketAddr, near: u32) -> (Running, Running) {
    let (la, lb) = (free_udp(), free_udp());
    let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
    // Near nodes are dialled only for flows the peer opens; none here.
    let unused: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let a = Running::start(Config {
        long_local: la,
        long_peer: lb,
        key: key(),
        listen: vec![(far, lo)],
        near: BTreeMap::from([(near, unused)]),
        near_files: BTreeMap::new(),
        haul: haul::Config::default(),
        per_source: 64,
    });
    let b = Running::start(Config {
        long_local: lb,
        long_peer: la,
        key: key(),
        listen: vec![(near, lo)],
        near: BTreeMap::from([(far, far_addr)]),
        near_files: BTreeMap::new(),
        haul: haul::Config {
            high: true,
            ..haul::Config::default()
        },
        per_source: 64,
    });
    (a, b)
}

/// Relays to far node `far` and node 3, where far node `far` has a file
/// service at `files` and node 3 none.
fn pair_files(far: u32, far_addr: SocketAddr, files: SocketAddr) -> (Running, Running) {
    let (la, lb) = (free_udp(), free_udp());
    let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = Running::start(Config {
        long_local: la,
        long_peer: lb,
        key: key(),
        listen: vec![(far, lo), (3, lo)],
        near: BTreeMap::new(),
        near_files: BTreeMap::new(),
        haul: haul::Config::default(),
        per_source: 64,
    });
    let b = Running::start(Config {
        long_local: lb,
        long_peer: la,
        key: key(),
        listen: Vec::new(),
        near: BTreeMap::from([(far, far_addr), (3, far_addr)]),
        near_files: BTreeMap::from([(far, files)]),
        haul: haul::Config {
            high: true,
            ..haul::Config::default()
        },
        per_source: 64,
    });
    (a, b)
}

fn node(id: u32, dir: &std::path::Path, peers: &[(u32, SocketAddr)]) -> Node {
    let mut cfg = NodeConfig::local(id, dir);
    cfg.shm_dir = None;
    cfg.key = Some(key());
    cfg.peers = peers.iter().copied().collect();
    Node::start(cfg).unwrap()
}

fn ep_cfg() -> EndpointConfig {
    EndpointConfig {
        completion: Completion::Wait,
        send_timeout: Some(Duration::from_secs(20)),
        ..EndpointConfig::default()
    }
}

#[test]
fn reliable_messages_and_puts_cross_the_relay_pair_whole_and_replies_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let far = node(2, dir.path(), &[]);
    let (mut a, mut b) = pair(2, far.tcp_addr().unwrap(), haul::Config::default(), 64);
    let near = node(1, dir.path(), &[(2, a.addr_of(2))]);
    let mut fep = far.open(1, ep_cfg()).unwrap();
    let region = fep.register(4 << 20).unwrap();
    let mut nep = near.open(1, ep_cfg()).unwrap();
    const MSG: usize = 1 << 20;
    const COUNT: usize = 64;
    let receiver = std::thread::spawn(move || {
        let mut buf = vec![0u8; MSG];
        let mut h = blake3::Hasher::new();
        let mut from = None;
        for _ in 0..COUNT {
            let r = fep
                .read_timeout(&mut buf, Duration::from_secs(30))
                .unwrap()
                .expect("a message");
            assert_eq!(r.len, MSG);
            h.update(&buf[..r.len]);
            from = Some(r);
        }
        let reply = fep.reply_target(&from.unwrap(), Mode::Reliable).unwrap();
        fep.write(reply, h.finalize().as_bytes()).unwrap();
        // Then the put, announced by its notification.
        let r = fep
            .read_timeout(&mut buf, Duration::from_secs(30))
            .unwrap()
            .expect("a put notification");
        assert_eq!(r.len, 4 << 20);
        let placed = blake3::hash(&region_bytes(&fep, region).unwrap());
        (fep, placed)
    });
    let t = nep.target(Addr::new(2, 1), Mode::Reliable).unwrap();
    let mut sent = blake3::Hasher::new();
    for i in 0..COUNT {
        let m = pattern(MSG, i as u64);
        sent.update(&m);
        nep.write(t, &m).unwrap();
    }
    let mut buf = [0u8; 64];
    let r = nep
        .read_timeout(&mut buf, Duration::from_secs(30))
        .unwrap()
        .expect("the far side's hash");
    assert_eq!(
        &buf[..r.len],
        sent.finalize().as_bytes(),
        "64 MiB, hashed at both ends"
    );
    let p = nep.target(Addr::new(2, 1), Mode::Put).unwrap();
    let data = pattern(4 << 20, 99);
    nep.put_wait(p, &data, 0, region, true).unwrap();
    let (_fep, placed) = receiver.join().unwrap();
    assert_eq!(placed, blake3::hash(&data));
    drop(nep);
    drop(near);
    let (ra, rb) = (a.stop(), b.stop());
    assert!(
        ra.flows_out >= 1 && rb.flows_in == ra.flows_out,
        "{ra:?} {rb:?}"
    );
    assert_eq!((ra.bad_tags, rb.bad_tags, ra.bad_packets), (0, 0, 0));
    assert!(ra.bytes_sent >= (COUNT * MSG + (4 << 20)) as u64);
}

#[test]
fn a_relay_that_dies_fails_the_flow_instead_of_hanging_it() {
    let dir = tempfile::tempdir().unwrap();
    let far = node(2, dir.path(), &[]);
    let haul = haul::Config {
        dead_after: 1_000_000_000,
        keepalive: 200_000_000,
        ..haul::Config::default()
    };
    let (_a, mut b) = pair(2, far.tcp_addr().unwrap(), haul, 64);
    let near = node(1, dir.path(), &[(2, _a.addr_of(2))]);
    let mut fep = far.open(1, ep_cfg()).unwrap();
    let mut nep = near.open(1, ep_cfg()).unwrap();
    let t = nep.target(Addr::new(2, 1), Mode::Reliable).unwrap();
    nep.write(t, b"before").unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let r = fep
        .read_timeout(&mut buf, Duration::from_secs(10))
        .unwrap()
        .expect("the first message");
    assert_eq!(&buf[..r.len], b"before");
    b.stop();
    let start = Instant::now();
    let msg = vec![1u8; 1 << 20];
    let err = loop {
        if let Err(e) = nep.write(t, &msg) {
            break e;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "still writing");
    };
    eprintln!("after {:?}: {err}", start.elapsed());
    assert!(
        matches!(err, macrolink_fabric::Error::PeerLost { .. }),
        "{err:?}"
    );
    // The far node saw its connection end too.
    let r = fep.read_timeout(&mut buf, Duration::from_secs(10));
    assert!(r.is_err() || r.unwrap().is_none());
}

#[test]
fn datagrams_cross_the_relay_pair_both_ways_and_strangers_datagrams_stop_at_the_relay() {
    let dir = tempfile::tempdir().unwrap();
    let far = node(2, dir.path(), &[]);
    let (mut a, mut b) = pair_both(2, far.tcp_addr().unwrap(), 1);
    let near = node(1, dir.path(), &[(2, a.addr_of(2))]);
    let mut fep = far.open(5, ep_cfg()).unwrap();
    const COUNT: usize = 200;
    let echo = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        let mut n = 0;
        while let Ok(Some(r)) = fep.read_timeout(&mut buf, Duration::from_secs(3)) {
            assert_eq!(r.kind, RecvKind::Message(Mode::Datagram));
            let t = fep.reply_target(&r, Mode::Datagram).unwrap();
            fep.write(t, &buf[..r.len]).unwrap();
            n += 1;
        }
        n
    });
    let mut nep = near.open(7, ep_cfg()).unwrap();
    let t = nep
        .target_via(Addr::new(2, 5), Mode::Datagram, Transport::Udp)
        .unwrap();
    // Strangers at the relay's datagram socket for node 2: garbage, and a
    // well-formed datagram without the fabric's token.
    let relay_udp = a.addr_of(2);
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    stranger.send_to(&[0x5A; 300], relay_udp).unwrap();
    let mut h = Header::new(FrameKind::Datagram);
    h.src_node = 1;
    h.src_ep = 9;
    h.dst_ep = 5;
    h.key = 0xdead_beef;
    h.len = 4;
    let mut d = h.encode().to_vec();
    d.extend_from_slice(b"evil");
    stranger.send_to(&d, relay_udp).unwrap();
    // The largest datagram one packet of the long link carries.
    let largest = haul::Config::default().packet - DATAGRAM_OVERHEAD - HEADER_LEN;
    let mut buf = vec![0u8; 4096];
    // One too large for the long link: dropped at the relay, and counted.
    nep.write(t, &vec![1u8; largest + 1]).unwrap();
    let mut echoed = 0;
    for i in 0..COUNT {
        let msg = pattern((i * 97) % (largest + 1), i as u64);
        nep.write(t, &msg).unwrap();
        if let Some(r) = nep.read_timeout(&mut buf, Duration::from_secs(2)).unwrap() {
            assert_eq!(r.from, Addr::new(2, 5));
            assert_eq!(&buf[..r.len], &msg[..], "datagram {i} came back whole");
            echoed += 1;
        }
    }
    assert!(echoed >= COUNT * 9 / 10, "{echoed} of {COUNT} came back");
    let served = echo.join().unwrap();
    assert_eq!(served, echoed, "the far endpoint heard only ours");
    let (ra, rb) = (a.stop(), b.stop());
    eprintln!("{ra:?}\n{rb:?}");
    assert!(ra.datagrams_out >= echoed as u64 && rb.datagrams_in >= echoed as u64);
    assert!(rb.datagrams_out >= echoed as u64 && ra.datagrams_in >= echoed as u64);
    assert_eq!(ra.bad_datagrams, 2, "both strangers' datagrams refused");
    assert_eq!(ra.datagrams_dropped, 1, "the one too large");
    assert_eq!((ra.flows_out, rb.flows_in), (1, 1), "one flow: the resolve");
}

#[test]
fn a_file_service_contact_crosses_for_proven_hosts_only() {
    // A stand-in for node 2's file service: greets, then echoes.
    let files = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let files_addr = files.local_addr().unwrap();
    let served = std::thread::spawn(move || {
        let (mut c, _) = files.accept().unwrap();
        std::io::Write::write_all(&mut c, b"challenge").unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).unwrap();
        std::io::Write::write_all(&mut c, &b).unwrap();
        files.set_nonblocking(true).unwrap();
        // No other connection reached it.
        std::thread::sleep(Duration::from_millis(300));
        files.accept().is_err()
    });
    let dir = tempfile::tempdir().unwrap();
    let far = node(2, dir.path(), &[]);
    let (a, _b) = pair_files(2, far.tcp_addr().unwrap(), files_addr);
    let contact = |k: &Key, node_port: SocketAddr| {
        let mut s = TcpStream::connect(node_port).unwrap();
        let mut h = Header::new(FrameKind::Hello);
        h.flags = Flags::CONTACT;
        let r = macrolink_fabric::handshake(&mut s, k, h);
        (s, r)
    };
    let wrong = Key::from_secret(b"not the cluster's secret at all").unwrap();
    let (_s, r) = contact(&wrong, a.addr_of(2));
    assert!(
        matches!(r, Err(macrolink_fabric::Error::Unauthenticated { .. })),
        "{r:?}"
    );
    let (mut s, r) = contact(&key(), a.addr_of(2));
    r.expect("the contact crossed");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 9];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"challenge");
    std::io::Write::write_all(&mut s, b"hello").unwrap();
    let mut e = [0u8; 5];
    s.read_exact(&mut e).unwrap();
    assert_eq!(&e, b"hello");
    assert!(
        served.join().unwrap(),
        "the stranger never reached the file service"
    );
    // A node with no file service: refused, by name.
    let (_s, r) = contact(&key(), a.addr_of(3));
    assert!(
        matches!(r, Err(macrolink_fabric::Error::NoSuchEndpoint(_))),
        "{r:?}"
    );
}

/// A hello from node 1's endpoint `ep` to endpoint 1, proven under `key`
/// by hand through relay `a`.
fn hand_hello(a: &Running, ep: u32, key: &Key) -> (TcpStream, macrolink_fabric::Result<u64>) {
    let mut s = TcpStream::connect(a.addr_of(2)).unwrap();
    let mut h = Header::new(FrameKind::Hello);
    h.src_node = 1;
    h.src_ep = ep;
    h.dst_ep = 1;
    let r = macrolink_fabric::handshake(&mut s, key, h);
    (s, r)
}

#[test]
fn strangers_get_no_flow_and_a_proven_host_gets_through_while_they_wait() {
    let dir = tempfile::tempdir().unwrap();
    let far = node(2, dir.path(), &[]);
    let (mut a, mut b) = pair(2, far.tcp_addr().unwrap(), haul::Config::default(), 4);
    let mut fep = far.open(1, ep_cfg()).unwrap();
    // Silent connections from one source: the relay's challenge, then
    // nothing; past the cap the oldest are cut.
    let silent: Vec<TcpStream> = (0..6)
        .map(|_| TcpStream::connect(a.addr_of(2)).unwrap())
        .collect();
    // Each is heard on a thread of its own, which enters the relay's gate
    // in whatever order the threads run: wait until each has its challenge
    // (or is cut already), so that all six are older than what follows.
    for s in &silent {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 64];
        let mut s: &TcpStream = s;
        let _ = s.read(&mut b);
    }
    let wrong = Key::from_secret(b"not the cluster's secret at all").unwrap();
    let (_s, r) = hand_hello(&a, 7, &wrong);
    assert!(
        matches!(r, Err(macrolink_fabric::Error::Unauthenticated { .. })),
        "{r:?}"
    );
    // Garbage instead of a hello.
    let mut g = TcpStream::connect(a.addr_of(2)).unwrap();
    g.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut c = [0u8; 64];
    g.read_exact(&mut c[..8]).unwrap();
    std::io::Write::write_all(&mut g, &[0xA5; 200]).unwrap();
    let mut rest = Vec::new();
    let _ = g.read_to_end(&mut rest);
    // A node with the key gets through all the same.
    let near = node(1, dir.path(), &[(2, a.addr_of(2))]);
    let mut nep = near.open(1, ep_cfg()).unwrap();
    let t = nep.target(Addr::new(2, 1), Mode::Reliable).unwrap();
    nep.write(t, b"through").unwrap();
    let mut buf = [0u8; 64];
    let r = fep
        .read_timeout(&mut buf, Duration::from_secs(10))
        .unwrap()
        .expect("the message");
    assert_eq!(&buf[..r.len], b"through");
    let cut = silent
        .iter()
        .filter(|s| {
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let mut b = [0u8; 64];
            let mut s: &TcpStream = s;
            match s.read(&mut b) {
                Ok(0) => true,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                Ok(_) => false,
            }
        })
        .count();
    assert!(
        (2..6).contains(&cut),
        "past the cap of 4 the oldest silent ones were cut, and only they ({cut} of 6)"
    );
    drop((nep, near, silent));
    let (ra, rb) = (a.stop(), b.stop());
    assert_eq!(
        (ra.flows_out, rb.flows_in),
        (1, 1),
        "only the proven host's connection crossed: {ra:?}"
    );
}

#[test]
fn one_near_address_holds_at_most_its_share_of_flows() {
    let dir = tempfile::tempdir().unwrap();
    let far = node(2, dir.path(), &[]);
    let (a, _b) = pair(2, far.tcp_addr().unwrap(), haul::Config::default(), 4);
    let _fep = far.open(1, ep_cfg()).unwrap();
    let held: Vec<TcpStream> = (0..4)
        .map(|i| {
            let (s, r) = hand_hello(&a, 10 + i, &key());
            r.expect("the far node took it");
            s
        })
        .collect();
    let mut extra = TcpStream::connect(a.addr_of(2)).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut b = [0u8; 8];
    assert!(
        matches!(extra.read(&mut b), Ok(0) | Err(_)),
        "the fifth is closed at once"
    );
    drop(held);
}
