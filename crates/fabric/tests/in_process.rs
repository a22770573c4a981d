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
    // A UDP socket not in use is looked at on one pass in 1,024; one in
    // use, on every pass (polling) or when a sleep saw it stir and on one
    // pass in 1,024 (waiting). A reader that never looked heard it after
    // the whole flood. Two looks' worth: on a loaded host the datagram may
    // reach its socket just after the first look that follows its send.
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
