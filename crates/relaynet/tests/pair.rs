//! A pair of relays on loopback carries fabric traffic between a near node
//! and a far one: reliable messages and puts arrive whole, the far side's
//! replies come back, a dead relay fails the flows instead of hanging them,
//! and one near address cannot take every flow.

use macrolink_fabric::{Addr, Completion, EndpointConfig, Key, Mode, Node, NodeConfig};
use macrolink_relay::haul;
use macrolink_relaynet::{Config, Relay, Report, Seal};
use macrolink_testbed::data::pattern;
use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SECRET: &[u8] = b"a relay pair's cluster secret....";

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
    let seal = Seal::new(key().derive(macrolink_relaynet::SEAL_CONTEXT));
    let a = Running::start(Config {
        long_local: la,
        long_peer: lb,
        seal: seal.clone(),
        listen: vec![(far, "127.0.0.1:0".parse().unwrap())],
        near: BTreeMap::new(),
        haul,
        per_source,
    });
    let b = Running::start(Config {
        long_local: lb,
        long_peer: la,
        seal,
        listen: Vec::new(),
        near: BTreeMap::from([(far, far_addr)]),
        haul: haul::Config { high: true, ..haul },
        per_source,
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
        let placed = blake3::hash(fep.region(region).unwrap());
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
fn one_near_address_holds_at_most_its_share_of_flows() {
    let dir = tempfile::tempdir().unwrap();
    let far = node(2, dir.path(), &[]);
    let (a, _b) = pair(2, far.tcp_addr().unwrap(), haul::Config::default(), 4);
    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(a.addr_of(2)).unwrap())
        .collect();
    // Each reaches the far node, whose handshake challenge comes back.
    for mut s in &held {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 8];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b[..4], b"MLch");
    }
    let mut extra = TcpStream::connect(a.addr_of(2)).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut b = [0u8; 8];
    assert!(
        matches!(extra.read(&mut b), Ok(0) | Err(_)),
        "the fifth is closed at once"
    );
}
