//! What one transport does that the others do not, with two nodes in one
//! process: shared memory's puts without the target, tcp's rails. What
//! every transport does is `conformance.rs`.

mod common;

use common::{busy_read, nodes, Flood};
use macrolink_fabric::{
    Addr, Completion, EndpointConfig, Error, Mode, Node, NodeConfig, RecvKind, Refusal, Transport,
};
use macrolink_testbed::data::pattern;
use std::thread;
use std::time::Duration;

/// The bytes of a registered region, copied out.
fn region_of(ep: &macrolink_fabric::Endpoint, key: macrolink_fabric::RegionKey) -> Option<Vec<u8>> {
    let mut b = vec![0; ep.region_len(key)?];
    ep.read_region(key, 0, &mut b).ok()?;
    Some(b)
}

fn wait_cfg() -> EndpointConfig {
    EndpointConfig {
        completion: Completion::Wait,
        ..EndpointConfig::default()
    }
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
        assert_eq!(
            &region_of(&target, key).unwrap()[4096..4096 + 65536],
            &data[..]
        );
    }
    assert!(matches!(
        init.put_wait(t, &[0u8; 2], (1 << 20) - 1, key, false),
        Err(Error::PutRefused(Refusal::OutOfBounds))
    ));
    assert_eq!(&region_of(&target, key).unwrap()[..5], b"first");
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

/// A tcp connection is its endpoint's by the time its dialler hears it was
/// taken: told over another connection, the endpoint replies over it at
/// once, though its node could not dial the dialler's (it does not know
/// where it is).
#[test]
fn a_dialled_connection_is_the_endpoints_before_the_dialler_hears_so() {
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(NodeConfig::local(1, dir.path())).unwrap();
    let b = Node::start(NodeConfig::local(2, dir.path())).unwrap();
    a.add_peer(2, b.tcp_addr().unwrap());
    let mut a_ctl = a.open(1, EndpointConfig::default()).unwrap();
    let mut b_ctl = b.open(1, EndpointConfig::default()).unwrap();
    let tell = a_ctl
        .target_via(Addr::new(2, 1), Mode::Reliable, Transport::Tcp)
        .unwrap();
    let mut buf = [0u8; 8];
    for i in 0..200u32 {
        let ep = 100 + i;
        let mut a_data = a.open(ep, EndpointConfig::default()).unwrap();
        let mut b_data = b.open(ep, EndpointConfig::default()).unwrap();
        // Dialled: the handshake is over when this returns.
        a_data
            .target_via(Addr::new(2, ep), Mode::Reliable, Transport::Tcp)
            .unwrap();
        a_ctl.write(tell, &ep.to_le_bytes()).unwrap();
        b_ctl.read(&mut buf).unwrap();
        let back = b_data
            .target_via(Addr::new(1, ep), Mode::Reliable, Transport::Tcp)
            .unwrap_or_else(|e| panic!("round {i}: no way back: {e}"));
        b_data.write(back, b"back").unwrap();
        let r = a_data.read(&mut buf).unwrap();
        assert_eq!(&buf[..r.len], b"back");
    }
}

/// A reader kept busy by a tcp connection, a message always waiting on it,
/// still hears a datagram, polling or waiting, datagrams in use before or
/// not: a busy reader never sleeps, and what a sleep would have seen on
/// the UDP socket must be looked for all the same.
#[test]
fn a_busy_reader_still_hears_a_datagram() {
    // A UDP socket is looked at on every pass by a polling endpoint that
    // uses datagrams; else when a sleep saw it stir, and when the clock,
    // read every 1,024 passes, says 250 us have gone since the last look
    // made so. The passes here take some 50 us each, so that is every
    // 1,024 passes. A reader that never looked heard it after the whole
    // flood. Two looks' worth: on a loaded host the datagram may reach its
    // socket just after the first look that follows its send.
    const HEARD_WITHIN: u64 = 2 * 1_024 + 100;
    let (a, b, _d) = nodes();
    for (round, (c, warm)) in [
        (Completion::Poll, false),
        (Completion::Poll, true),
        (Completion::Wait, false),
        (Completion::Wait, true),
    ]
    .into_iter()
    .enumerate()
    {
        let ep = 10 + round as u32 * 10;
        let cfg = EndpointConfig {
            completion: c,
            ..EndpointConfig::default()
        };
        let mut rx = b.open(ep, cfg).unwrap();
        let mut busy = a.open(ep + 1, EndpointConfig::default()).unwrap();
        let mut dg = a.open(ep + 2, EndpointConfig::default()).unwrap();
        let bt = busy
            .target_via(Addr::new(2, ep), Mode::Reliable, Transport::Tcp)
            .unwrap();
        let dt = dg
            .target_via(Addr::new(2, ep), Mode::Datagram, Transport::Udp)
            .unwrap();
        let mut buf = [0u8; 8];
        busy.write(bt, b"first").unwrap();
        assert_eq!(rx.read(&mut buf).unwrap().from.ep, ep + 1);
        if warm {
            dg.write(dt, b"warm").unwrap();
            let r = rx.read_timeout(&mut buf, Duration::from_secs(5)).unwrap();
            assert_eq!(
                r.map(|r| r.from.ep),
                Some(ep + 2),
                "{c}: no warm-up datagram"
            );
        }
        let flood = Flood::start(busy, move |e| e.write(bt, &[0xEE; 200]).unwrap());
        let heard = busy_read(
            &mut rx,
            || dg.write(dt, b"dgram").unwrap(),
            || true,
            |r, b| r.from.ep == ep + 2 && b == b"dgram",
        );
        let (_, sent) = flood.end(&mut rx);
        let heard =
            heard.unwrap_or_else(|| panic!("{c}, warm {warm}: the datagram was never heard"));
        assert!(
            heard < HEARD_WITHIN,
            "{c}, warm {warm}: the datagram was heard after {heard} of the busy one's messages, \
             read after it was sent ({sent} written)"
        );
    }
}

/// A waiting endpoint sleeps in its wait set (one `epoll_wait`) until it
/// uses datagrams, then in one `poll`; a polling one set to wait sleeps in
/// the set again. However it sleeps, a message over each transport wakes
/// it, the first of each over a connection it did not have yet (its inbox
/// wakes it), and none waits for the sleep's nap (200 ms) to end.
#[test]
fn a_waiting_reader_is_woken_by_every_source_wherever_it_sleeps() {
    let _watch = common::watchdog(120, "a waiting reader's wake-ups");
    let (a, b, _d) = nodes();
    let tx = a.open(7, EndpointConfig::default()).unwrap();
    // The writer writes once asked, 5 ms later, when the reader sleeps.
    let (ask, asked) = std::sync::mpsc::channel::<(u32, Transport)>();
    let writer = thread::spawn(move || {
        let mut tx = tx;
        for (ep, transport) in asked {
            let mode = match transport {
                Transport::Udp => Mode::Datagram,
                _ => Mode::Reliable,
            };
            let t = tx.target_via(Addr::new(2, ep), mode, transport).unwrap();
            thread::sleep(Duration::from_millis(5));
            tx.write(t, transport.to_string().as_bytes()).unwrap();
        }
    });
    // Ten messages over each transport, each read by a sleeping reader:
    // one woken by the nap instead of the message takes 195 ms more.
    let hear = |rx: &mut macrolink_fabric::Endpoint, transports: &[Transport], how: &str| {
        let ep = rx.addr().ep;
        for &transport in transports {
            let mut late = 0;
            for _ in 0..10 {
                ask.send((ep, transport)).unwrap();
                let t0 = std::time::Instant::now();
                let mut buf = [0u8; 16];
                let r = rx.read_timeout(&mut buf, Duration::from_secs(5)).unwrap();
                let r = r.unwrap_or_else(|| panic!("{how}: nothing over {transport} in 5 s"));
                assert_eq!(r.from, Addr::new(1, 7), "{how}");
                assert_eq!(&buf[..r.len], transport.to_string().as_bytes(), "{how}");
                late += usize::from(t0.elapsed() >= Duration::from_millis(100));
            }
            assert!(
                late <= 1,
                "{how}: {late} of 10 messages over {transport} waited for the nap"
            );
        }
    };
    // Waiting from the start: asleep in the set.
    let mut rx = b.open(5, wait_cfg()).unwrap();
    hear(&mut rx, &[Transport::Shm, Transport::Tcp], "in the set");
    // Datagrams in use (it sends one): asleep in poll.
    let mut back = rx
        .target_via(Addr::new(1, 7), Mode::Datagram, Transport::Udp)
        .unwrap();
    rx.write(back, b"dgram").unwrap();
    let all = [Transport::Udp, Transport::Shm, Transport::Tcp];
    hear(&mut rx, &all, "in poll");
    rx.set_completion(Completion::Poll);
    rx.set_completion(Completion::Wait);
    hear(&mut rx, &all, "in poll, after polling");
    // Polling first, then waiting: asleep in the set, and again after a
    // spell of polling.
    let mut rx = b.open(6, EndpointConfig::default()).unwrap();
    hear(&mut rx, &[Transport::Shm, Transport::Tcp], "polling");
    rx.set_completion(Completion::Wait);
    hear(
        &mut rx,
        &[Transport::Shm, Transport::Tcp],
        "in the set, after polling",
    );
    rx.set_completion(Completion::Poll);
    rx.set_completion(Completion::Wait);
    hear(
        &mut rx,
        &[Transport::Tcp, Transport::Shm],
        "in the set again",
    );
    back = rx
        .target_via(Addr::new(1, 7), Mode::Datagram, Transport::Udp)
        .unwrap();
    rx.write(back, b"dgram").unwrap();
    hear(&mut rx, &all, "in poll, after the set");
    drop(ask);
    writer.join().unwrap();
}

/// A waiting endpoint whose one connection is tcp sleeps in that
/// connection's `recv` while its peer answers quickly, and one that hears
/// datagrams alone in its UDP socket's `recvfrom` (see the fabric's
/// `endpoint::recv_sleep`), and that call hears nothing else. What comes
/// once the peer falls quiet is heard all the same, after the call's nap
/// at most (a clock tick or two, 20 ms at most), none after the sleep's
/// (200 ms): the peer's next message after a pause, a message over a new
/// connection, a datagram of another endpoint.
#[test]
fn a_reader_asleep_in_a_recv_hears_what_else_comes() {
    let _watch = common::watchdog(120, "a reader asleep in a recv");
    let (a, b, _d) = nodes();
    let mut ep = 60;
    let cases = [
        (Mode::Reliable, Transport::Tcp),
        (Mode::Datagram, Transport::Udp),
    ];
    for ((talk, over), what) in cases
        .into_iter()
        .flat_map(|c| ["the peer", "a new connection", "a datagram"].map(|w| (c, w)))
    {
        let mut late = 0;
        for _ in 0..3 {
            ep += 3;
            let mut rx = b.open(ep, wait_cfg()).unwrap();
            let mut peer = a.open(ep + 1, wait_cfg()).unwrap();
            let mut other = a.open(ep + 2, EndpointConfig::default()).unwrap();
            let to_rx = peer.target_via(rx.addr(), talk, over).unwrap();
            let (mode, transport) = match what {
                "a datagram" => (Mode::Datagram, Transport::Udp),
                _ => (Mode::Reliable, Transport::Tcp),
            };
            let to = rx.addr();
            // Quick round trips, then, 5 ms after the last, the message.
            let pinger = thread::spawn(move || {
                let mut buf = [0u8; 16];
                for _ in 0..300 {
                    peer.write(to_rx, b"ping").unwrap();
                    let r = peer.read_timeout(&mut buf, Duration::from_secs(5));
                    assert!(r.unwrap().is_some(), "no answer in 5 s");
                }
                thread::sleep(Duration::from_millis(5));
                if what == "the peer" {
                    peer.write(to_rx, b"late").unwrap();
                } else {
                    let t = other.target_via(to, mode, transport).unwrap();
                    other.write(t, b"late").unwrap();
                }
                (peer, other)
            });
            let mut buf = [0u8; 16];
            for _ in 0..300 {
                let r = rx.read_timeout(&mut buf, Duration::from_secs(5)).unwrap();
                let r = r.unwrap_or_else(|| panic!("{over} {what}: no ping in 5 s"));
                let back = rx.reply_target(&r, talk).unwrap();
                rx.write(back, b"pong").unwrap();
            }
            let t0 = std::time::Instant::now();
            let r = rx.read_timeout(&mut buf, Duration::from_secs(5)).unwrap();
            let r = r.unwrap_or_else(|| panic!("{over} {what}: nothing in 5 s"));
            late += usize::from(t0.elapsed() >= Duration::from_millis(100));
            let from = if what == "the peer" { ep + 1 } else { ep + 2 };
            let got = (r.from.ep, &buf[..r.len]);
            assert_eq!(got, (from, &b"late"[..]), "{over} {what}");
            let _ends = pinger.join().unwrap();
        }
        assert!(late <= 1, "{over} {what}: {late} of 3 waited for the nap");
    }
}

/// A waiting reader `ep` on `b` and its waiting peer `ep + 1` on `a`,
/// connected over tcp, after quick round trips (the reader's sleeps move
/// into the connection's `recv`) and then reads that did not wait and
/// found nothing; and the peer's target of the reader.
fn quick_then_quiet(
    a: &Node,
    b: &Node,
    ep: u32,
) -> (
    macrolink_fabric::Endpoint,
    macrolink_fabric::Endpoint,
    macrolink_fabric::Target,
) {
    let mut rx = b.open(ep, wait_cfg()).unwrap();
    let mut peer = a.open(ep + 1, wait_cfg()).unwrap();
    let to_rx = peer
        .target_via(rx.addr(), Mode::Reliable, Transport::Tcp)
        .unwrap();
    let mut buf = [0u8; 16];
    for _ in 0..200 {
        peer.write(to_rx, b"ping").unwrap();
        let r = rx.read(&mut buf).unwrap();
        let back = rx.reply_target(&r, Mode::Reliable).unwrap();
        rx.write(back, b"pong").unwrap();
        peer.read(&mut buf).unwrap();
    }
    for _ in 0..200 {
        assert!(rx.try_read(&mut buf).unwrap().is_none());
    }
    (rx, peer, to_rx)
}

/// Reads that do not wait, each finding nothing, leave a connection cold
/// (passes look at it now and then only, and skip it while a wait set
/// watches it). A sleep in its `recv` that then takes a message has the
/// next pass read what the sleep took.
#[test]
fn a_cold_connection_slept_in_is_read_once_its_recv_takes_a_message() {
    let _watch = common::watchdog(60, "a cold connection slept in");
    let (a, b, _d) = nodes();
    let (mut rx, mut peer, to_rx) = quick_then_quiet(&a, &b, 90);
    let mut buf = [0u8; 16];
    let late = thread::spawn(move || {
        thread::sleep(Duration::from_millis(2));
        peer.write(to_rx, b"late").unwrap();
        peer
    });
    let r = rx.read_timeout(&mut buf, Duration::from_secs(5)).unwrap();
    assert_eq!(
        r.map(|r| (r.from.ep, r.len)),
        Some((91, 4)),
        "the message the sleep took was never read"
    );
    let _peer = late.join().unwrap();
}

/// A first datagram to an endpoint asleep in its one connection's `recv`
/// is heard while that connection's peer keeps it busy, not only once the
/// peer falls quiet: a sleep that took a message has the UDP socket looked
/// at once 5 ms have gone since the last such look.
#[test]
fn a_datagram_reaches_a_reader_asleep_in_a_talking_connections_recv() {
    let _watch = common::watchdog(120, "a datagram beside a talking peer");
    let (a, b, _d) = nodes();
    let mut rx = b.open(95, wait_cfg()).unwrap();
    let mut peer = a.open(96, wait_cfg()).unwrap();
    let mut other = a.open(97, EndpointConfig::default()).unwrap();
    let to_rx = peer
        .target_via(rx.addr(), Mode::Reliable, Transport::Tcp)
        .unwrap();
    let dt = other
        .target_via(rx.addr(), Mode::Datagram, Transport::Udp)
        .unwrap();
    // 300 quick round trips, then 200 more 2 ms apart (within the `recv`'s
    // nap, so that the reader stays asleep in it); the datagram goes with
    // the 20th of those.
    let pinger = thread::spawn(move || {
        let mut buf = [0u8; 16];
        for n in 0u32..500 {
            if n >= 300 {
                thread::sleep(Duration::from_millis(2));
            }
            if n == 320 {
                other.write(dt, b"dgram").unwrap();
            }
            peer.write(to_rx, &n.to_le_bytes()).unwrap();
            let r = peer.read_timeout(&mut buf, Duration::from_secs(5));
            assert!(r.unwrap().is_some(), "no answer in 5 s");
        }
        (peer, other)
    });
    let mut buf = [0u8; 16];
    let mut heard_at = None;
    let mut last = 0;
    while last < 499 {
        let r = rx.read_timeout(&mut buf, Duration::from_secs(5)).unwrap();
        let r = r.expect("nothing in 5 s");
        if r.from.ep == 97 {
            assert_eq!(&buf[..r.len], b"dgram");
            heard_at = Some(last);
            continue;
        }
        last = u32::from_le_bytes(buf[..4].try_into().unwrap());
        let back = rx.reply_target(&r, Mode::Reliable).unwrap();
        rx.write(back, b"pong").unwrap();
    }
    let _ends = pinger.join().unwrap();
    let at = heard_at.expect("the datagram was not heard while the peer talked");
    // A look a gap after the last: the next message or two after it came.
    assert!(
        at < 320 + 20,
        "the datagram, sent before message 320, was heard after message {at}"
    );
}

/// A peer that closes while the reader sleeps in its connection's `recv`
/// (after reads that did not wait and found nothing) is heard gone: the
/// `recv` takes the end of the stream, and the next read looks for it
/// (cold or not) rather than sleeping again at once, for good.
#[test]
fn a_peers_end_taken_by_the_recv_is_heard() {
    let _watch = common::watchdog(60, "a cold connection's end");
    let (a, b, _d) = nodes();
    let (mut rx, peer, _) = quick_then_quiet(&a, &b, 98);
    let mut buf = [0u8; 16];
    let gone = thread::spawn(move || {
        thread::sleep(Duration::from_millis(2));
        drop(peer);
    });
    let r = rx.read_timeout(&mut buf, Duration::from_secs(5));
    gone.join().unwrap();
    match r {
        Err(Error::PeerLost { peer, .. }) => assert_eq!(peer.ep, 99),
        other => panic!("the peer's end was not heard: {other:?}"),
    }
}

/// A shm peer that sends its last message and goes is heard gone by a
/// waiting reader whose read that does not sleep took the hang-up: where
/// the doorbell is watched edge-triggered the set says a hang-up once, and
/// a sleep after that look hears nothing more of it.
#[test]
fn a_hang_up_taken_by_a_read_that_does_not_sleep_is_heard_by_the_next_sleep() {
    let (a, b, _d) = nodes();
    let mut rx = b.open(5, wait_cfg()).unwrap();
    let mut tx = a.open(7, wait_cfg()).unwrap();
    let to = tx
        .target_via(Addr::new(2, 5), Mode::Reliable, Transport::Shm)
        .unwrap();
    let mut buf = [0u8; 16];
    // A sleep with nothing to read: the reader now sleeps in its wait set,
    // which watches the connection (the node hands it over meanwhile).
    assert!(rx
        .read_timeout(&mut buf, Duration::from_millis(100))
        .unwrap()
        .is_none());
    tx.write(to, b"last").unwrap();
    drop(tx);
    // The hang-up is in the set before the look below: the write end of
    // the doorbell closed with the endpoint.
    let r = rx.try_read(&mut buf).unwrap().expect("the last message");
    assert_eq!((r.from, &buf[..r.len]), (Addr::new(1, 7), &b"last"[..]));
    let lost = rx.read_timeout(&mut buf, Duration::from_secs(5));
    assert!(
        matches!(&lost, Err(Error::PeerLost { peer, .. }) if *peer == Addr::new(1, 7)),
        "{lost:?}"
    );
}
