//! What every transport must do, in one suite: each case runs over shm,
//! tcp, udp and UCX (over UCX's own tcp, and over its shared memory), and
//! asks of each what its [`Caps`] promise: a connected transport carries
//! reliable messages of any size in order and puts; a datagram transport
//! carries one MTU, and refuses the rest by name.
//!
//! The UCX runs need libucp (Debian: `libucx0`); where it is missing they
//! say so and pass, unless `MACROLINK_REQUIRE_UCX=1` (CI), where they fail.

mod common;

use common::{busy_read, Flood};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use macrolink_fabric::{
    Addr, Caps, Completion, Endpoint, EndpointConfig, Error, Mode, Node, NodeConfig, RecvKind,
    Refusal, RegionKey, Target, Transport, UcxOptions,
};
use macrolink_testbed::data::pattern;
use macrolink_testbed::ready::Line;
use macrolink_testbed::{require, Peer};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

/// A transport as the suite runs it.
#[derive(Clone, Copy, Debug)]
struct Kind {
    transport: Transport,
    /// UCX's transports, for UCX.
    tls: Option<&'static str>,
}

impl Kind {
    const fn plain(transport: Transport) -> Kind {
        Kind {
            transport,
            tls: None,
        }
    }

    const fn ucx(tls: &'static str) -> Kind {
        Kind {
            transport: Transport::Ucx,
            tls: Some(tls),
        }
    }

    fn caps(self) -> Caps {
        self.transport.caps()
    }

    /// The mode messages go in: reliable where the transport connects.
    fn mode(self) -> Mode {
        if self.caps().connected {
            Mode::Reliable
        } else {
            Mode::Datagram
        }
    }

    fn config(self, id: u32, dir: &std::path::Path) -> NodeConfig {
        let mut c = NodeConfig::local(id, dir);
        c.ucx = self.tls.map(|tls| UcxOptions {
            tls: Some(tls.into()),
            devices: None,
        });
        c
    }

    /// A node of this kind, or `None` where UCX is missing (and need not
    /// be there).
    fn node(self, id: u32, dir: &std::path::Path) -> Option<Node> {
        self.node_with(id, dir, |_| {})
    }

    /// As [`node`](Self::node), its configuration changed by `f` first.
    fn node_with(
        self,
        id: u32,
        dir: &std::path::Path,
        f: impl FnOnce(&mut NodeConfig),
    ) -> Option<Node> {
        let mut c = self.config(id, dir);
        f(&mut c);
        let started = Node::start(c);
        if self.tls.is_some() {
            require::ucx(started)
        } else {
            Some(started.unwrap())
        }
    }
}

/// Two nodes of one kind that know each other: 1 and 2.
struct Pair {
    kind: Kind,
    a: Node,
    b: Node,
    _dir: tempfile::TempDir,
}

impl Pair {
    fn new(kind: Kind) -> Option<Pair> {
        Pair::with(kind, |_| {})
    }

    /// As [`new`](Self::new), both nodes configured by `f`.
    fn with(kind: Kind, f: impl Fn(&mut NodeConfig)) -> Option<Pair> {
        let dir = tempfile::tempdir().unwrap();
        let a = kind.node_with(1, dir.path(), &f)?;
        let b = kind.node_with(2, dir.path(), &f)?;
        a.add_peer(2, b.tcp_addr().unwrap());
        b.add_peer(1, a.tcp_addr().unwrap());
        Some(Pair {
            kind,
            a,
            b,
            _dir: dir,
        })
    }

    fn target(&self, ep: &mut Endpoint, to: Addr, mode: Mode) -> Target {
        ep.target_via(to, mode, self.kind.transport)
            .unwrap_or_else(|e| panic!("{}: target {to} in {mode} mode: {e}", self.kind.transport))
    }
}

fn cfg(completion: Completion) -> EndpointConfig {
    EndpointConfig {
        completion,
        ..EndpointConfig::default()
    }
}

/// Answers every message with itself, over the connection it came on,
/// until `count` are answered.
fn echo(mut e: Endpoint, count: usize) -> thread::JoinHandle<Endpoint> {
    thread::spawn(move || {
        let mut buf = vec![0u8; 5 << 20];
        for _ in 0..count {
            let r = e.read(&mut buf).unwrap();
            let RecvKind::Message(mode) = r.kind else {
                panic!("unexpected {r:?}")
            };
            let t = e.reply_target(&r, mode).unwrap();
            e.write(t, &buf[..r.len]).unwrap();
        }
        e
    })
}

/// Reads one message within `limit` (a datagram may never come).
fn read_within(e: &mut Endpoint, buf: &mut [u8], limit: Duration) -> Option<usize> {
    e.read_timeout(buf, limit).unwrap().map(|r| r.len)
}

fn sizes(kind: Kind) {
    let Some(p) = Pair::new(kind) else { return };
    let caps = kind.caps();
    let sizes: Vec<usize> = if caps.connected {
        vec![
            0,
            1,
            7,
            64,
            1000,
            4096,
            65536,
            1 << 20,
            (1 << 20) + 1,
            4 << 20,
        ]
    } else {
        vec![0, 1, 7, 64, 1000, p.a.datagram_mtu()]
    };
    let h = echo(p.b.open(5, cfg(Completion::Wait)).unwrap(), sizes.len());
    let mut e = p.a.open(7, cfg(Completion::Wait)).unwrap();
    let t = p.target(&mut e, Addr::new(2, 5), kind.mode());
    let mut buf = vec![0u8; 4 << 20];
    for (i, &n) in sizes.iter().enumerate() {
        let msg = pattern(n, i as u64);
        e.write(t, &msg).unwrap();
        let got = read_within(&mut e, &mut buf, Duration::from_secs(20)).expect("an answer");
        assert_eq!(got, n, "{}: {n} bytes", kind.transport);
        assert_eq!(
            blake3::hash(&buf[..n]),
            blake3::hash(&msg),
            "{}: {n} bytes",
            kind.transport
        );
    }
    h.join().unwrap();
}

fn order(kind: Kind) {
    const N: u64 = 10_000;
    let Some(p) = Pair::new(kind) else { return };
    let mut rx = p.b.open(5, cfg(Completion::Wait)).unwrap();
    let mut tx = p.a.open(7, cfg(Completion::Poll)).unwrap();
    let t = p.target(&mut tx, Addr::new(2, 5), kind.mode());
    let reader = thread::spawn(move || {
        let mut buf = [0u8; 256];
        let mut seen = Vec::new();
        while let Some(n) = read_within(&mut rx, &mut buf, Duration::from_secs(2)) {
            let i = u64::from_le_bytes(buf[..8].try_into().unwrap());
            assert_eq!(&buf[8..n], &pattern(n - 8, i)[..], "message {i} intact");
            seen.push(i);
            if i == N - 1 && seen.len() as u64 == N {
                break;
            }
        }
        seen
    });
    for i in 0..N {
        let mut m = i.to_le_bytes().to_vec();
        m.extend_from_slice(&pattern((i % 57) as usize, i));
        tx.write(t, &m).unwrap();
    }
    let seen = reader.join().unwrap();
    if kind.caps().ordered && kind.caps().reliable {
        assert_eq!(seen, (0..N).collect::<Vec<_>>(), "{}", kind.transport);
    } else {
        // Unreliable: some may be lost, none twice, none made up.
        let mut s = seen.clone();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), seen.len(), "a datagram arrived twice");
        assert!(!seen.is_empty() && s.iter().all(|&i| i < N));
    }
}

/// Two endpoints write to each other at once through the smallest rings,
/// each reading what has come between its writes: writers wait for room
/// while the other side's reads free it, and every message arrives, in
/// order and intact, both ways.
fn both_ways(kind: Kind, completion: Completion) {
    const N: u64 = 20_000;
    if !kind.caps().reliable {
        return;
    }
    let Some(p) = Pair::with(kind, |c| c.shm_ring = 4096) else {
        return;
    };
    let mut a = p.a.open(5, cfg(completion)).unwrap();
    let mut b = p.b.open(5, cfg(completion)).unwrap();
    let ta = p.target(&mut a, Addr::new(2, 5), Mode::Reliable);
    let tb = p.target(&mut b, Addr::new(1, 5), Mode::Reliable);
    let side = |mut e: Endpoint, t: Target, me: u64| {
        thread::spawn(move || {
            let msg = |i: u64, from: u64| {
                let mut m = i.to_le_bytes().to_vec();
                m.extend_from_slice(&pattern((i * 37 % 900) as usize, i ^ from << 32));
                m
            };
            let mut buf = vec![0u8; 4096];
            let mut next = 0u64;
            let check = |n: usize, buf: &[u8], next: &mut u64| {
                assert_eq!(&buf[..n], &msg(*next, 1 - me)[..], "message {next} intact");
                *next += 1;
            };
            for i in 0..N {
                e.write(t, &msg(i, me)).unwrap();
                while let Some(r) = e.try_read(&mut buf).unwrap() {
                    check(r.len, &buf, &mut next);
                }
            }
            while next < N {
                let n = read_within(&mut e, &mut buf, Duration::from_secs(20))
                    .unwrap_or_else(|| panic!("message {next} of {N} never came"));
                check(n, &buf, &mut next);
            }
            e
        })
    };
    let ha = side(a, ta, 0);
    let hb = side(b, tb, 1);
    // Each side's endpoint lives until both are done: one dropped while the
    // other still reads would rightly be reported to it as the peer lost.
    let _a = ha.join().unwrap();
    hb.join().unwrap();
}

fn many(kind: Kind) {
    const ENDPOINTS: u32 = 64;
    let Some(p) = Pair::new(kind) else { return };
    let h = echo(
        p.b.open(5, cfg(Completion::Wait)).unwrap(),
        ENDPOINTS as usize,
    );
    let mut eps: Vec<(Endpoint, Target)> = (0..ENDPOINTS)
        .map(|i| {
            let mut e = p.a.open(100 + i, cfg(Completion::Wait)).unwrap();
            let t = p.target(&mut e, Addr::new(2, 5), kind.mode());
            (e, t)
        })
        .collect();
    for (i, (e, t)) in eps.iter_mut().enumerate() {
        e.write(*t, &pattern(100, i as u64)).unwrap();
    }
    let mut buf = [0u8; 256];
    for (i, (e, _)) in eps.iter_mut().enumerate() {
        let n = read_within(e, &mut buf, Duration::from_secs(20)).expect("an answer");
        assert_eq!(&buf[..n], &pattern(100, i as u64)[..], "endpoint {i}");
    }
    h.join().unwrap();
}

/// The child process of [`killed`]: a node 2 with an echo on endpoint 5,
/// of the kind its environment names; it prints its ready line and serves
/// until it is killed. A test of its own that does nothing without that
/// environment.
#[test]
fn peer_process() {
    let Ok(kind) = std::env::var("ML_CONFORMANCE_PEER") else {
        return;
    };
    let kind = match kind.as_str() {
        "shm" => Kind::plain(Transport::Shm),
        "tcp" => Kind::plain(Transport::Tcp),
        "udp" => Kind::plain(Transport::Udp),
        k => Kind::ucx(Box::leak(
            k.trim_start_matches("ucx:").to_string().into_boxed_str(),
        )),
    };
    // Gone with the test that started it, whatever becomes of that.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)).unwrap();
    let dir = std::env::var("ML_CONFORMANCE_DIR").unwrap();
    let node = kind.node(2, dir.as_ref()).expect("the parent checked");
    let e = node.open(5, cfg(Completion::Wait)).unwrap();
    // The test harness has begun a line ("test peer_process ... ").
    println!();
    Line::node(2, node.tcp_addr()).print().unwrap();
    let _ = echo(e, usize::MAX).join();
}

fn killed(kind: Kind) {
    let _watch = common::watchdog(60, "a killed peer");
    let dir = tempfile::tempdir().unwrap();
    let Some(a) = kind.node(1, dir.path()) else {
        return;
    };
    let name = match kind.tls {
        Some(tls) => format!("ucx:{tls}"),
        None => kind.transport.to_string(),
    };
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["peer_process", "--exact", "--nocapture", "--test-threads=1"])
        .env("ML_CONFORMANCE_PEER", name)
        .env("ML_CONFORMANCE_DIR", dir.path());
    let mut peer = Peer::spawn_cmd(cmd).unwrap();
    a.add_peer(2, peer.tcp);
    let mut e = a.open(7, cfg(Completion::Wait)).unwrap();
    let t = e
        .target_via(Addr::new(2, 5), kind.mode(), kind.transport)
        .unwrap();
    let mut buf = [0u8; 64];
    e.write(t, b"before").unwrap();
    let n = read_within(&mut e, &mut buf, Duration::from_secs(20)).expect("an answer");
    assert_eq!(&buf[..n], b"before");
    peer.kill();
    if !kind.caps().connected {
        // Datagrams have no connection to lose: they are just not answered.
        let _ = e.write(t, b"after");
        assert_eq!(
            read_within(&mut e, &mut buf, Duration::from_millis(300)),
            None
        );
        return;
    }
    // The loss shows on the next write or read, as a loss, never a hang.
    let err = match e.write(t, b"after") {
        Err(err) => err,
        Ok(()) => e.read(&mut buf).expect_err("no answer from a dead peer"),
    };
    assert!(
        matches!(err, Error::PeerLost { peer, .. } if peer == Addr::new(2, 5)),
        "{}: {err}",
        kind.transport
    );
}

/// Messages written just before the writer closes its endpoint all
/// arrive, in order, before the reader hears that the writer is gone (over
/// UCX the contact socket's end travels apart from the data and may
/// overtake it).
fn last_words(kind: Kind) {
    if !kind.caps().connected {
        return;
    }
    let _watch = common::watchdog(60, "last words");
    let Some(p) = Pair::new(kind) else { return };
    const COUNT: u32 = 20;
    for round in 0..10u32 {
        let mut reader = p.b.open(100 + round, cfg(Completion::Poll)).unwrap();
        let mut writer = p.a.open(100 + round, cfg(Completion::Poll)).unwrap();
        let t = p.target(&mut writer, Addr::new(2, 100 + round), kind.mode());
        let w = thread::spawn(move || {
            for i in 0..COUNT {
                writer.write(t, &i.to_le_bytes()).unwrap();
            }
            // Closed as soon as the last write returns.
            drop(writer);
        });
        let mut buf = [0u8; 64];
        for i in 0..COUNT {
            let r = reader
                .read_timeout(&mut buf, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{}: message {i} of round {round}: {e}", kind.transport))
                .unwrap_or_else(|| panic!("message {i} of round {round} never came"));
            assert_eq!(&buf[..r.len], &i.to_le_bytes(), "round {round}");
        }
        w.join().unwrap();
        // Then the writer's end shows as a loss or as silence, never data.
        match reader.read_timeout(&mut buf, Duration::from_millis(300)) {
            Ok(None) | Err(Error::PeerLost { .. }) => {}
            other => panic!("{}: after the last message: {other:?}", kind.transport),
        }
    }
}

/// Last words when both ends wrote to each other before either had taken
/// the other's connection, so that a connection runs each way: the
/// reader's own connection to the writer (only it wrote on it) ends when
/// the writer goes, and what the writer wrote on the other still all
/// arrives before the loss is told. The reader reads only once the writer
/// is gone. Over UCX, whose first send waits for the other worker to
/// answer, the writer runs in a thread of its own and the reader makes
/// progress meanwhile (taking the connection on the way). Not over UCX's
/// tcp: there the writer's last messages were lost in 3 runs of 20 (the
/// reader's UCX endpoint timed out), which is not mended yet.
fn last_words_both_ways(kind: Kind) {
    if !kind.caps().connected || kind.tls.is_some_and(|t| !t.starts_with("sm")) {
        return;
    }
    let _watch = common::watchdog(60, "last words both ways");
    let Some(p) = Pair::new(kind) else { return };
    const COUNT: u32 = 20;
    for completion in [Completion::Poll, Completion::Wait] {
        let ep = 200 + completion as u32;
        let mut reader = p.b.open(ep, cfg(completion)).unwrap();
        let mut writer = p.a.open(ep, cfg(completion)).unwrap();
        let t = p.target(&mut writer, Addr::new(2, ep), kind.mode());
        let back = p.target(&mut reader, Addr::new(1, ep), kind.mode());
        let write_all = move |mut writer: Endpoint| {
            for i in 0..COUNT {
                writer.write(t, &i.to_le_bytes()).unwrap();
            }
            drop(writer);
        };
        if kind.tls.is_some() {
            let w = thread::spawn(move || write_all(writer));
            reader.write(back, b"hello").unwrap();
            // A loss told here (the writer gone) ends the progress; what
            // came before it is still read below.
            while !w.is_finished() && reader.progress().is_ok() {
                thread::sleep(Duration::from_millis(1));
            }
            w.join().unwrap();
        } else {
            reader.write(back, b"hello").unwrap();
            write_all(writer);
        }
        // The reader's own connection has surely ended by now.
        thread::sleep(Duration::from_millis(100));
        let mut buf = [0u8; 64];
        for i in 0..COUNT {
            let r = reader
                .read_timeout(&mut buf, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{} {completion:?}: message {i}: {e}", kind.transport))
                .unwrap_or_else(|| {
                    panic!("{} {completion:?}: message {i} never came", kind.transport)
                });
            assert_eq!(&buf[..r.len], &i.to_le_bytes());
        }
        match reader.read_timeout(&mut buf, Duration::from_millis(300)) {
            Ok(None) | Err(Error::PeerLost { .. }) => {}
            other => panic!("{}: after the last message: {other:?}", kind.transport),
        }
    }
}

/// A writer that writes and is gone (its endpoint dropped, with whatever
/// its transport keeps of it) before the reader's endpoint has taken the
/// connection: what it wrote still arrives, whole and in order, then the
/// loss or silence. Over UCX's shared memory the reader cannot even make an
/// endpoint back to the gone writer. (Over UCX's tcp a writer cannot get
/// that far: its first send waits for the reader's worker to answer.)
fn gone_before_taken(kind: Kind) {
    if !kind.caps().connected || kind.tls.is_some_and(|t| !t.starts_with("sm")) {
        return;
    }
    let _watch = common::watchdog(60, "gone before taken");
    let Some(p) = Pair::new(kind) else { return };
    const COUNT: u32 = 20;
    let mut reader = p.b.open(200, cfg(Completion::Poll)).unwrap();
    {
        let mut writer = p.a.open(200, cfg(Completion::Poll)).unwrap();
        let t = p.target(&mut writer, Addr::new(2, 200), kind.mode());
        for i in 0..COUNT {
            writer.write(t, &i.to_le_bytes()).unwrap();
        }
    }
    let mut buf = [0u8; 64];
    for i in 0..COUNT {
        let r = reader
            .read_timeout(&mut buf, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{}: message {i}: {e}", kind.transport))
            .unwrap_or_else(|| panic!("{}: message {i} never came", kind.transport));
        assert_eq!(&buf[..r.len], &i.to_le_bytes());
    }
    match reader.read_timeout(&mut buf, Duration::from_millis(300)) {
        Ok(None) | Err(Error::PeerLost { .. }) => {}
        other => panic!("{}: after the last message: {other:?}", kind.transport),
    }
}

/// The bytes of a registered region, copied out.
fn region(e: &Endpoint, key: RegionKey) -> Vec<u8> {
    let mut b = vec![0u8; e.region_len(key).unwrap()];
    e.read_region(key, 0, &mut b).unwrap();
    b
}

fn puts(kind: Kind) {
    let Some(p) = Pair::new(kind) else { return };
    let mut init = p.a.open(7, cfg(Completion::Wait)).unwrap();
    if !kind.caps().connected {
        assert!(matches!(
            init.target_via(Addr::new(2, 5), Mode::Put, kind.transport),
            Err(Error::Unsupported { .. })
        ));
        return;
    }
    let mut target = p.b.open(5, cfg(Completion::Wait)).unwrap();
    let key = target.register(16384).unwrap();
    target.write_region(key, 0, &[0xee; 16384]).unwrap();
    let before = blake3::hash(&region(&target, key));
    let t = p.target(&mut init, Addr::new(2, 5), Mode::Put);
    // The target reads: it answers what needs an answer, and is told of
    // the puts that ask for it.
    let serve = thread::spawn(move || {
        let mut buf = [0u8; 16];
        let mut placed = Vec::new();
        while placed.len() < 2 {
            let r = target.read(&mut buf).unwrap();
            if let RecvKind::PutPlaced { key, offset } = r.kind {
                let mut got = vec![0u8; r.len];
                target.read_region(key, offset as usize, &mut got).unwrap();
                placed.push((offset, got));
            }
        }
        (target, placed)
    });
    let data = pattern(4096, 9);
    let refusals = [
        (RegionKey(key.0 ^ 0x55), 0, Refusal::BadKey),
        (key, 16384 - 4095, Refusal::OutOfBounds),
        (key, u64::MAX - 10, Refusal::OutOfBounds),
    ];
    for (k, offset, why) in refusals {
        match init.put_wait(t, &data, offset, k, true) {
            Err(Error::PutRefused(r)) => assert_eq!(r, why, "{}", kind.transport),
            other => panic!("{}: {other:?}", kind.transport),
        }
    }
    let mut scratch = macrolink_fabric::IoBuf::new(0).unwrap();
    let failed = init.put_from(t, 5000, 0, key, true, &mut scratch, |_| {
        Err(std::io::Error::other("disk went away"))
    });
    assert!(matches!(failed, Err(Error::Io(_))), "{failed:?}");
    // Accepted, with notification: a plain put and one filled in place.
    init.put_wait(t, &data, 100, key, true).unwrap();
    let filled = pattern(5000, 3);
    let h = init
        .put_from(t, 5000, 4300, key, true, &mut scratch, |dst| {
            dst.copy_from_slice(&filled);
            Ok(())
        })
        .unwrap();
    init.wait_put(h).unwrap();
    let (mut target, placed) = serve.join().unwrap();
    assert_eq!(placed, [(100, data.clone()), (4300, filled.clone())]);
    let r = region(&target, key);
    assert_eq!(&r[100..4196], &data[..]);
    assert_eq!(&r[4300..9300], &filled[..]);
    assert!(target.stats().puts_refused >= 1);
    // The refusals changed nothing: only the two puts did.
    let mut expect = vec![0xee; 16384];
    expect[100..4196].copy_from_slice(&data);
    expect[4300..9300].copy_from_slice(&filled);
    assert_ne!(blake3::hash(&expect), before);
    assert_eq!(blake3::hash(&r), blake3::hash(&expect));
    assert!(matches!(
        init.write(t, b"x"),
        Err(Error::WrongMode(Mode::Put))
    ));
    // After deregister, a put is refused (over UCX once the target has
    // told the initiator, which it does at once).
    let serve = thread::spawn(move || {
        target.deregister(key).unwrap();
        let mut buf = [0u8; 16];
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            let _ = target.read_timeout(&mut buf, Duration::from_millis(20));
        }
        target
    });
    let deadline = Instant::now() + Duration::from_secs(3);
    let refused = loop {
        match init.put_wait(t, b"late", 100, key, false) {
            Err(Error::PutRefused(r)) => break r,
            Ok(()) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            other => panic!("{}: {other:?}", kind.transport),
        }
    };
    assert_eq!(refused, Refusal::BadKey, "{}", kind.transport);
    let target = serve.join().unwrap();
    assert!(target.region_len(key).is_none());
}

fn datagrams(kind: Kind) {
    let Some(p) = Pair::new(kind) else { return };
    let mtu = p.a.datagram_mtu();
    let h = echo(p.b.open(5, cfg(Completion::Wait)).unwrap(), 2);
    let mut e = p.a.open(7, cfg(Completion::Wait)).unwrap();
    let t = p.target(&mut e, Addr::new(2, 5), Mode::Datagram);
    let mut buf = vec![0u8; mtu + 1];
    for n in [mtu, 1] {
        let msg = pattern(n, 4);
        e.write(t, &msg).unwrap();
        let r = e
            .read_timeout(&mut buf, Duration::from_secs(10))
            .unwrap()
            .expect("an answer");
        assert_eq!(r.kind, RecvKind::Message(Mode::Datagram));
        assert_eq!(r.transport, kind.transport);
        assert_eq!(&buf[..r.len], &msg[..]);
    }
    let err = e.write(t, &vec![0u8; mtu + 1]).unwrap_err();
    assert!(
        matches!(err, Error::TooLarge { len, mtu: m } if len == mtu + 1 && m == mtu),
        "{err}"
    );
    h.join().unwrap();
}

fn completions(kind: Kind) {
    let Some(p) = Pair::new(kind) else { return };
    let both = [Completion::Poll, Completion::Wait];
    for (i, (ca, cb)) in both
        .iter()
        .flat_map(|a| both.iter().map(move |b| (*a, *b)))
        .enumerate()
    {
        let h = echo(p.b.open(10 + i as u32, cfg(cb)).unwrap(), 300);
        let mut e = p.a.open(20 + i as u32, cfg(ca)).unwrap();
        let t = p.target(&mut e, Addr::new(2, 10 + i as u32), kind.mode());
        let mut buf = [0u8; 8];
        let mut answered = 0;
        for n in 0..300u64 {
            e.write(t, &n.to_le_bytes()).unwrap();
            if read_within(&mut e, &mut buf, Duration::from_secs(5)) == Some(8) {
                assert_eq!(u64::from_le_bytes(buf), n, "{ca} beside {cb}");
                answered += 1;
            }
        }
        if kind.caps().reliable {
            assert_eq!(answered, 300, "{ca} beside {cb}");
            h.join().unwrap();
        } else {
            assert!(answered > 0, "{ca} beside {cb}");
        }
    }
}

fn small_pool(kind: Kind) {
    let Some(p) = Pair::new(kind) else { return };
    if !kind.caps().connected {
        return;
    }
    let small = EndpointConfig {
        completion: Completion::Wait,
        tokens: 4,
        token_size: 4096,
        ..EndpointConfig::default()
    };
    let mut rx = p.b.open(5, small).unwrap();
    let mut tx = p.a.open(7, cfg(Completion::Wait)).unwrap();
    let t = p.target(&mut tx, Addr::new(2, 5), Mode::Reliable);
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
    // A small buffer first: refused, and the message stays.
    let err = rx
        .read(&mut [0u8; 10])
        .expect_err("10 bytes cannot hold it");
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

fn over_limit(kind: Kind) {
    let Some(p) = Pair::new(kind) else { return };
    if !kind.caps().connected {
        return;
    }
    let limited = EndpointConfig {
        max_message: 1000,
        ..cfg(Completion::Wait)
    };
    let mut rx = p.b.open(5, limited).unwrap();
    let mut tx = p.a.open(7, cfg(Completion::Wait)).unwrap();
    let t = p.target(&mut tx, Addr::new(2, 5), Mode::Reliable);
    let send = move |mut tx: Endpoint| {
        tx.write(t, &[1u8; 1000]).unwrap();
        tx.write(t, &[2u8; 1001]).unwrap();
        tx
    };
    // Where a write waits for the peer's progress, the reader must be
    // reading meanwhile; elsewhere both writes return before it reads.
    let writer = if kind.caps().sends_wait_for_peer {
        Some(thread::spawn(move || send(tx)))
    } else {
        drop(send(tx));
        None
    };
    let mut buf = vec![0u8; 4096];
    assert_eq!(rx.read(&mut buf).unwrap().len, 1000);
    let err = rx.read(&mut buf).unwrap_err();
    assert!(
        matches!(&err, Error::PeerLost { reason, .. } if reason.contains("larger")),
        "{err}"
    );
    assert_eq!(rx.stats().bad_frames, 1);
    if let Some(w) = writer {
        drop(w.join().unwrap());
    }
}

fn unknown(kind: Kind) {
    let Some(p) = Pair::new(kind) else { return };
    let mut e = p.a.open(7, cfg(Completion::Wait)).unwrap();
    let err = e
        .target_via(Addr::new(2, 99), kind.mode(), kind.transport)
        .unwrap_err();
    assert!(matches!(err, Error::NoSuchEndpoint(_)), "{err}");
    if !kind.caps().connected {
        assert!(matches!(
            e.target_via(Addr::new(2, 5), Mode::Reliable, kind.transport),
            Err(Error::Unsupported { .. })
        ));
    }
}

/// A look without waiting (`try_read`) sees what has come, polling or
/// waiting, also after a blocking read emptied the connection (a waiting
/// read leaves the next look to its sleep) and on a UDP socket the reader
/// has not sent from (a waiting endpoint looks at it when its sleep says).
fn look(kind: Kind) {
    let Some(p) = Pair::new(kind) else { return };
    for (i, c) in [Completion::Poll, Completion::Wait].into_iter().enumerate() {
        let mut rx = p.b.open(30 + i as u32, cfg(c)).unwrap();
        let mut e = p.a.open(40 + i as u32, cfg(c)).unwrap();
        let t = p.target(&mut e, Addr::new(2, 30 + i as u32), kind.mode());
        // The writer has its own thread: a send may wait for the reader's
        // progress (UCX).
        let (tell, told) = std::sync::mpsc::channel::<u64>();
        let (wrote, written) = std::sync::mpsc::channel::<u64>();
        let writer = thread::spawn(move || {
            for n in told {
                e.write(t, &n.to_le_bytes()).unwrap();
                wrote.send(n).unwrap();
            }
            e
        });
        let mut buf = [0u8; 64];
        assert!(rx.try_read(&mut buf).unwrap().is_none(), "nothing sent yet");
        let value = |buf: &[u8]| u64::from_le_bytes(buf[..8].try_into().unwrap());
        for n in 0..20u64 {
            tell.send(n).unwrap();
            // Every other message, from the second, is read by a blocking
            // read, which leaves the connection emptied; the first is
            // looked for after a look that found nothing.
            if n % 2 == 1 {
                let r = rx.read_timeout(&mut buf, Duration::from_secs(5)).unwrap();
                let r = r.unwrap_or_else(|| panic!("{c}: message {n} did not come"));
                assert_eq!((r.len, value(&buf)), (8, n));
                assert_eq!(written.recv_timeout(Duration::from_secs(10)), Ok(n));
                continue;
            }
            let r = if kind.tls.is_some() {
                // A UCX send may wait for the reader's progress, and UCX may
                // hold what was sent for passes of its worker: look until
                // it comes.
                let until = Instant::now() + Duration::from_secs(5);
                loop {
                    if let Some(r) = rx.try_read(&mut buf).unwrap() {
                        break r;
                    }
                    assert!(Instant::now() < until, "{c}: message {n} did not come");
                }
            } else {
                // Written: on loopback it is then in the reader's socket or
                // ring, and one look finds it.
                assert_eq!(written.recv_timeout(Duration::from_secs(10)), Ok(n));
                thread::sleep(Duration::from_millis(10));
                // A polling endpoint looks at a UDP socket it does not use
                // only at a read of the clock, every 1,024 passes, once 250
                // us have gone since its last such look (a system call
                // each): after the sleep above, the first read of the clock.
                let looks = if kind.caps().connected || c == Completion::Wait {
                    1
                } else {
                    1024
                };
                let r = (0..looks).find_map(|_| rx.try_read(&mut buf).unwrap());
                r.unwrap_or_else(|| panic!("{c}: message {n} came but a look missed it"))
            };
            assert_eq!((r.len, value(&buf)), (8, n));
            if kind.tls.is_some() {
                assert_eq!(written.recv_timeout(Duration::from_secs(10)), Ok(n));
            }
        }
        drop(tell);
        writer.join().unwrap();
    }
}

/// A waiting reader with many connections hears each of them, whichever
/// its sleep finds readable: eight writers, each in its own thread, write
/// in turns with pauses, and every message arrives in its writer's order.
fn many_writers_one_waiting_reader(kind: Kind) {
    if !kind.caps().connected {
        return;
    }
    let Some(p) = Pair::new(kind) else { return };
    const WRITERS: u32 = 8;
    const EACH: u64 = 100;
    let mut rx = p.b.open(50, cfg(Completion::Wait)).unwrap();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let mut e = p.a.open(60 + w, cfg(Completion::Wait)).unwrap();
            let t = p.target(&mut e, Addr::new(2, 50), kind.mode());
            thread::spawn(move || {
                for n in 0..EACH {
                    e.write(t, &n.to_le_bytes()).unwrap();
                    if (n + u64::from(w)) % 7 == 0 {
                        thread::sleep(Duration::from_millis(2));
                    }
                }
                e
            })
        })
        .collect();
    let mut next = vec![0u64; WRITERS as usize];
    let mut buf = [0u8; 64];
    let until = Instant::now() + Duration::from_secs(60);
    for _ in 0..u64::from(WRITERS) * EACH {
        let left = until.saturating_duration_since(Instant::now());
        let r = rx.read_timeout(&mut buf, left).unwrap();
        let r = r.unwrap_or_else(|| panic!("only {next:?} came"));
        let w = (r.from.ep - 60) as usize;
        assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), next[w]);
        next[w] += 1;
    }
    assert!(next.iter().all(|&n| n == EACH), "{next:?}");
    for h in writers {
        h.join().unwrap();
    }
}

/// A write from a thread of its own: a UCX send may wait for the reader's
/// progress.
fn write_apart(
    (mut e, t): (Endpoint, Target),
    bytes: Vec<u8>,
) -> thread::JoinHandle<(Endpoint, Target)> {
    thread::spawn(move || {
        e.write(t, &bytes).unwrap();
        (e, t)
    })
}

/// `count` writers to `rx` (endpoint `base` of node 2), from endpoints
/// `base + 1..` of node 1, each heard once by `rx`.
fn writers_heard(
    p: &Pair,
    kind: Kind,
    rx: &mut Endpoint,
    base: u32,
    count: u32,
) -> Vec<Option<(Endpoint, Target)>> {
    let c = rx.completion();
    let firsts: Vec<_> = (0..count)
        .map(|w| {
            let mut e = p.a.open(base + 1 + w, cfg(Completion::Poll)).unwrap();
            let t = p.target(&mut e, Addr::new(2, base), kind.mode());
            write_apart((e, t), vec![w as u8])
        })
        .collect();
    let mut buf = [0u8; 64];
    for _ in 0..count {
        let r = rx.read_timeout(&mut buf, Duration::from_secs(10)).unwrap();
        assert!(r.is_some(), "{c}: a first message did not come");
    }
    firsts
        .into_iter()
        .map(|h| Some(h.join().unwrap()))
        .collect()
}

/// A reader of more connections than an endpoint reads each of on every
/// look hears the one that speaks after a quiet spell long enough for all
/// of them to go cold, polling or waiting, by a read that waits and by a
/// look that does not.
fn many_quiet(kind: Kind) {
    if !kind.caps().connected {
        return;
    }
    let Some(p) = Pair::new(kind) else { return };
    for (round, c) in [Completion::Poll, Completion::Wait].into_iter().enumerate() {
        let base = 100 + round as u32 * 50;
        let mut rx = p.b.open(base, cfg(c)).unwrap();
        let mut writers = writers_heard(&p, kind, &mut rx, base, 12);
        let mut buf = [0u8; 64];
        for (i, w) in [7usize, 3, 11].into_iter().enumerate() {
            // Quiet: a polling read goes through many passes meanwhile.
            let r = rx
                .read_timeout(&mut buf, Duration::from_millis(30))
                .unwrap();
            assert!(r.is_none(), "{c}: nothing was sent");
            let h = write_apart(writers[w].take().unwrap(), vec![100 + w as u8]);
            let r = if i == 1 && kind.tls.is_none() {
                // Written, it is in the reader's socket or ring (loopback),
                // and one look finds it.
                writers[w] = Some(h.join().unwrap());
                thread::sleep(Duration::from_millis(10));
                let r = rx.try_read(&mut buf).unwrap();
                r.unwrap_or_else(|| panic!("{c}: writer {w} spoke and a look missed it"))
            } else {
                let r = rx.read_timeout(&mut buf, Duration::from_secs(10)).unwrap();
                writers[w] = Some(h.join().unwrap());
                r.unwrap_or_else(|| panic!("{c}: writer {w} spoke and was not heard"))
            };
            let from = base + 1 + w as u32;
            assert_eq!((r.len, buf[0], r.from.ep), (1, 100 + w as u8, from));
        }
    }
}

/// A reader kept busy by one connection, a message always waiting on it,
/// still hears another of its many connections that speaks after a quiet
/// spell, polling or waiting: a busy reader never sleeps, and what a sleep
/// would have seen must be looked for all the same.
fn busy_and_quiet(kind: Kind) {
    // A cold connection is looked at on one pass in 8 of those that met
    // one: some tens of messages at most, where it was some hundreds
    // (waiting) or thousands (polling).
    const HEARD_WITHIN: u64 = 100;
    if !kind.caps().connected {
        return;
    }
    let Some(p) = Pair::new(kind) else { return };
    const BUSY: usize = 0;
    const QUIET: usize = 7;
    for (round, c) in [Completion::Poll, Completion::Wait].into_iter().enumerate() {
        let base = 300 + round as u32 * 50;
        let mut rx = p.b.open(base, cfg(c)).unwrap();
        let mut writers = writers_heard(&p, kind, &mut rx, base, 12);
        // Quiet long enough for every connection to go cold.
        let r = rx.read_timeout(&mut [0u8; 8], Duration::from_millis(30));
        assert!(r.unwrap().is_none(), "{c}: nothing was sent");
        let flood = Flood::start(writers[BUSY].take().unwrap(), |(e, t)| {
            e.write(*t, &[0xEE; 200]).unwrap()
        });
        let mut quiet = None;
        let written = Arc::new(AtomicBool::new(false));
        let from = base + 1 + QUIET as u32;
        let heard = busy_read(
            &mut rx,
            || {
                let (mut e, t) = writers[QUIET].take().unwrap();
                let written = written.clone();
                quiet = Some(thread::spawn(move || {
                    e.write(t, &[0x77]).unwrap();
                    written.store(true, Ordering::Release);
                    (e, t)
                }));
            },
            || written.load(Ordering::Acquire),
            |r, b| r.from.ep == from && b == [0x77],
        );
        let (busy, sent) = flood.end(&mut rx);
        writers[BUSY] = Some(busy);
        writers[QUIET] = quiet.map(|h| h.join().unwrap());
        let heard = heard.unwrap_or_else(|| panic!("{c}: the quiet writer was never heard"));
        assert!(
            heard < HEARD_WITHIN,
            "{c}: the quiet writer was heard after {heard} of the busy one's messages, read \
             after its write ({sent} written)"
        );
    }
}

/// Over UCX a reader gives its writer credit for what it has taken once
/// it has taken half a window (32 of the 64 messages a writer may have
/// unread), on its next pass: after the reply it writes to the message
/// that made the half, so that a ping-pong does not carry the credit on
/// its way. A writer sees its credit in `can_take`.
fn credit_after_the_reply(kind: Kind) {
    let Some(p) = Pair::new(kind) else { return };
    let a = p.a.open(40, cfg(Completion::Poll)).unwrap();
    // A write that finds no room fails rather than hangs the test.
    let writer = EndpointConfig {
        send_timeout: Some(Duration::from_secs(5)),
        ..cfg(Completion::Poll)
    };
    let mut b = p.b.open(41, writer).unwrap();
    let to_a = p.target(&mut b, a.addr(), Mode::Reliable);
    let mut buf = [0u8; 64];
    // The first round with the reader on a thread of its own: over UCX's
    // tcp a connection is made while both sides move.
    let answer = echo(a, 1);
    b.write(to_a, &[0]).unwrap();
    assert_eq!(b.read(&mut buf).unwrap().len, 1);
    let mut a = answer.join().unwrap();
    let mut to_b = None;
    for i in 1..32u8 {
        b.write(to_a, &[i]).unwrap();
        let r = a.read(&mut buf).unwrap();
        let t = *to_b.get_or_insert_with(|| a.reply_target(&r, Mode::Reliable).unwrap());
        a.write(t, &[i]).unwrap();
        let r = b.read(&mut buf).unwrap();
        assert_eq!(&buf[..r.len], [i]);
    }
    // The reader has made no pass since its last reply: the writer has
    // the other half of its window and no more.
    let mut more = 0;
    while more <= 32 && b.can_take(to_a, 1).unwrap() {
        b.write(to_a, &[0xAB]).unwrap();
        more += 1;
    }
    assert_eq!(
        more, 32,
        "messages the writer could send after half a window"
    );
    // The reader's next pass gives the credit back; the writer's own
    // passes hear it.
    assert!(a.read_timeout(&mut buf, Duration::ZERO).unwrap().is_some());
    let until = Instant::now() + Duration::from_secs(10);
    while !b.can_take(to_a, 1).unwrap() {
        assert!(Instant::now() < until, "the reader's credit never came");
        assert!(b
            .read_timeout(&mut buf, Duration::from_millis(1))
            .unwrap()
            .is_none());
    }
}

#[test]
fn ucx_sm_credit_goes_back_after_the_reply() {
    credit_after_the_reply(Kind::ucx("sm,self"))
}

#[test]
fn ucx_tcp_credit_goes_back_after_the_reply() {
    credit_after_the_reply(Kind::ucx("tcp"))
}

macro_rules! suite {
    ($($name:ident = $kind:expr;)*) => {$(
        mod $name {
            use super::*;
            const KIND: Kind = $kind;

            #[test]
            fn sizes_0_b_to_4_mib_arrive_whole() {
                sizes(KIND)
            }

            #[test]
            fn order_holds_over_10000_messages() {
                order(KIND)
            }

            #[test]
            fn both_ways_at_once_polling() {
                both_ways(KIND, Completion::Poll)
            }

            #[test]
            fn both_ways_at_once_waiting() {
                both_ways(KIND, Completion::Wait)
            }

            #[test]
            fn sixty_four_endpoints_at_once() {
                many(KIND)
            }

            #[test]
            fn a_killed_peer_is_a_loss_not_a_hang() {
                killed(KIND)
            }

            #[test]
            fn puts_land_and_refusals_change_nothing() {
                puts(KIND)
            }

            #[test]
            fn datagrams_are_one_mtu_at_most() {
                datagrams(KIND)
            }

            #[test]
            fn polling_and_waiting_completion() {
                completions(KIND)
            }

            #[test]
            fn a_small_pool_still_carries_large_messages() {
                small_pool(KIND)
            }

            #[test]
            fn a_message_over_the_limit_ends_the_connection() {
                over_limit(KIND)
            }

            #[test]
            fn an_unknown_endpoint_is_refused() {
                unknown(KIND)
            }

            #[test]
            fn messages_written_before_a_close_all_arrive() {
                last_words(KIND)
            }

            #[test]
            fn messages_written_before_a_close_all_arrive_with_a_connection_each_way() {
                last_words_both_ways(KIND)
            }

            #[test]
            fn a_writer_gone_before_its_connection_was_taken_is_still_heard() {
                gone_before_taken(KIND)
            }

            #[test]
            fn a_look_without_waiting_sees_what_has_come() {
                look(KIND)
            }

            #[test]
            fn a_waiting_reader_hears_many_writers() {
                many_writers_one_waiting_reader(KIND)
            }

            #[test]
            fn a_reader_of_many_quiet_connections_hears_the_one_that_speaks() {
                many_quiet(KIND)
            }

            #[test]
            fn a_busy_reader_of_many_connections_still_hears_a_quiet_one() {
                busy_and_quiet(KIND)
            }
        }
    )*};
}

suite! {
    shm = Kind::plain(Transport::Shm);
    tcp = Kind::plain(Transport::Tcp);
    udp = Kind::plain(Transport::Udp);
    ucx_tcp = Kind::ucx("tcp");
    ucx_sm = Kind::ucx("sm,self");
}
