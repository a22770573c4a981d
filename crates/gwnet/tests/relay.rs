//! The gateway protocol's I/O in one process: a storage node receiving
//! (`sink`), gateway nodes relaying (`relay`), and a compute node striping
//! a transfer over them (`client::send`), on loopback TCP.

use macrolink_fabric::{Addr, Endpoint, Mode, Node, NodeConfig, Transport};
use macrolink_gateway::health::HealthConfig;
use macrolink_gateway::heard::Heard;
use macrolink_gateway::msg::Msg;
use macrolink_gateway::stripe::{Chunk, StripeConfig};
use macrolink_gwnet::client::{send, stripe, SendConfig, SendReport};
use macrolink_gwnet::{endpoint_config, relay, sink};
use macrolink_testbed::data::pattern;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SINK: u32 = 10;

/// A node with tcp on `listen` and no shared memory, so that every message
/// crosses a socket.
fn node(id: u32, listen: &str, peers: &[(u32, SocketAddr)]) -> Node {
    let mut cfg = NodeConfig::local(id, "/nonexistent");
    cfg.shm_dir = None;
    cfg.tcp = Some(listen.parse().unwrap());
    cfg.peers = peers.iter().copied().collect();
    Node::start(cfg).unwrap()
}

/// Starts a sink on a node of its own; its address.
fn start_sink(listen: &str) -> SocketAddr {
    let n = node(SINK, listen, &[]);
    let addr = n.tcp_addr().unwrap();
    let ep = n.open(1, endpoint_config()).unwrap();
    std::thread::spawn(move || {
        let _node = n;
        sink::run(ep, None)
    });
    addr
}

/// Starts a relay, node `id`, forwarding to the sink over `rails` (its
/// node knows them as its peers, as `macrolink gateway --peer` sets up);
/// its address.
fn start_relay(id: u32, rails: &[(u32, SocketAddr)]) -> SocketAddr {
    start_metered(id, rails, relay::Meter::default())
}

/// [`start_relay`], counting in `meter`.
fn start_metered(id: u32, rails: &[(u32, SocketAddr)], meter: relay::Meter) -> SocketAddr {
    let n = node(id, "127.0.0.1:0", rails);
    let addr = n.tcp_addr().unwrap();
    let ep = n.open(1, endpoint_config()).unwrap();
    let rails = rails.to_vec();
    std::thread::spawn(move || {
        let _node = n;
        relay::run(ep, &rails, &meter)
    });
    addr
}

fn cfg() -> SendConfig {
    SendConfig {
        stripe: StripeConfig {
            chunk: 256 << 10,
            window: 4,
            rto: 500_000_000,
        },
        patience: 20_000_000_000,
        ..SendConfig::default()
    }
}

#[test]
fn a_transfer_striped_over_two_relays_arrives_whole() {
    let sink = start_sink("127.0.0.1:0");
    let meters = [relay::Meter::default(), relay::Meter::default()];
    let relays: Vec<_> = [21, 22]
        .iter()
        .zip(&meters)
        .map(|(&id, m)| (id, start_metered(id, &[(SINK, sink)], m.clone())))
        .collect();
    let compute = node(1, "127.0.0.1:0", &relays);
    let mut ep = compute.open(1, endpoint_config()).unwrap();
    let gws: Vec<Addr> = relays.iter().map(|(id, _)| Addr::new(*id, 1)).collect();
    let data = pattern(8 << 20, 1);
    let mut acked = 0;
    let r = send(
        &mut ep,
        &gws,
        Addr::new(SINK, 1),
        7,
        &data,
        cfg(),
        &mut |a, _| acked = a,
    )
    .unwrap();
    assert!(r.verified, "{r:?}");
    assert_eq!((r.bytes, acked), (8 << 20, 32));
    assert!(r.per_gateway.iter().all(|&n| n > 0), "{r:?}");
    assert_eq!(r.per_gateway.iter().sum::<u64>(), 32 + r.resent);
    // What each gateway counted: the chunks it carried, their acks, bytes.
    for (m, sent) in meters.iter().zip(&r.per_gateway) {
        let kind = |k: &str| {
            m.relayed
                .get_or_create(&relay::KindLabels { kind: k.into() })
                .get()
        };
        assert_eq!(kind("chunk"), *sent, "{r:?}");
        assert!(kind("ack") >= 1 && m.bytes.get() >= *sent * (256 << 10));
        assert!(m.heartbeats.get() >= 1);
    }
}

/// Transfers of one process that share a [`Heard`] table share each
/// gateway's window through it: each tells the table its chunks in flight
/// there as it goes, and it and they leave the counts when it ends, so
/// that a transfer started later is not held back by earlier ones.
#[test]
fn transfers_sharing_a_table_count_their_chunks_in_flight_there_until_they_end() {
    let sink = start_sink("127.0.0.1:0");
    let relays: Vec<_> = [41, 42]
        .iter()
        .map(|&id| (id, start_relay(id, &[(SINK, sink)])))
        .collect();
    let compute = node(1, "127.0.0.1:0", &relays);
    let gws: Vec<Addr> = relays.iter().map(|(id, _)| Addr::new(*id, 1)).collect();
    let heard = Heard::new();
    let observer = heard.watch(&[(41, 1), (42, 1)]);
    let most = [AtomicUsize::new(0), AtomicUsize::new(0)];
    let reports: Vec<SendReport> = std::thread::scope(|s| {
        let flows: Vec<_> = (0..3u32)
            .map(|f| {
                let (compute, gws, heard, observer, most) =
                    (&compute, &gws, &heard, &observer, &most);
                s.spawn(move || {
                    let mut ep = compute.open(1 + f, endpoint_config()).unwrap();
                    let data = pattern(4 << 20, u64::from(f));
                    let cfg = SendConfig {
                        heard: Some(heard.clone()),
                        ..cfg()
                    };
                    let mut seen = |_: u64, _: u64| {
                        for (gw, m) in most.iter().enumerate() {
                            m.fetch_max(observer.others(gw).chunks, Ordering::Relaxed);
                        }
                    };
                    let to = Addr::new(SINK, 1);
                    send(&mut ep, gws, to, 30 + u64::from(f), &data, cfg, &mut seen).unwrap()
                })
            })
            .collect();
        flows.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &reports {
        assert!(r.verified && r.bytes == 4 << 20, "{r:?}");
    }
    let most = most.map(|m| m.into_inner());
    assert!(
        most.iter().all(|&m| m >= 1),
        "counted while in flight: {most:?}"
    );
    let left = (observer.others(0), observer.others(1));
    assert_eq!(left, Default::default(), "none once all have ended");
}

/// PaScal's two levels: compute to gateways over UCX (here forced onto
/// UCX's tcp transport), gateways to storage over tcp. The chunks go out
/// and the acknowledgements come back over UCX, the verdict too.
#[test]
fn a_transfer_over_ucx_to_the_gateways_and_tcp_beyond_arrives_whole() {
    let ucx = || {
        Some(macrolink_fabric::UcxOptions {
            tls: Some("tcp".into()),
            devices: None,
        })
    };
    let ucx_node = |id: u32, peers: &[(u32, SocketAddr)]| {
        let mut cfg = NodeConfig::local(id, "/nonexistent");
        cfg.shm_dir = None;
        cfg.peers = peers.iter().copied().collect();
        cfg.ucx = ucx();
        Node::start(cfg)
    };
    let Some(compute) = macrolink_testbed::require::ucx(ucx_node(1, &[])) else {
        return;
    };
    let sink = start_sink("127.0.0.1:0");
    let mut relays = Vec::new();
    for id in [21, 22] {
        let n = ucx_node(id, &[(SINK, sink)]).unwrap();
        let addr = n.tcp_addr().unwrap();
        let ep = n.open(1, endpoint_config()).unwrap();
        std::thread::spawn(move || {
            let _node = n;
            relay::run(ep, &[(SINK, sink)], &relay::Meter::default())
        });
        compute.add_peer(id, addr);
        relays.push(Addr::new(id, 1));
    }
    let mut ep = compute.open(1, endpoint_config()).unwrap();
    let data = pattern(6 << 20, 3);
    let cfg = SendConfig {
        transport: Transport::Ucx,
        ..cfg()
    };
    let r = send(
        &mut ep,
        &relays,
        Addr::new(SINK, 1),
        9,
        &data,
        cfg,
        &mut |_, _| {},
    )
    .unwrap();
    assert!(r.verified, "{r:?}");
    assert_eq!(r.bytes, 6 << 20);
    assert!(r.per_gateway.iter().all(|&n| n > 0), "{r:?}");
}

#[test]
fn a_relay_spreads_over_its_rails_and_gives_up_a_dead_one() {
    // One sink reached over two loopback addresses (two rails) and one
    // address where nothing listens.
    let sink = start_sink("0.0.0.0:0");
    let port = sink.port();
    let (_hold, dead_addr) = macrolink_testbed::refusing::refusing_addr().unwrap();
    let rails = [
        (SINK, dead_addr),
        (SINK, SocketAddr::from(([127, 0, 0, 1], port))),
        (SINK, SocketAddr::from(([127, 0, 0, 2], port))),
    ];
    let relay = start_relay(21, &rails);
    let compute = node(1, "127.0.0.1:0", &[(21, relay)]);
    let mut ep = compute.open(1, endpoint_config()).unwrap();
    let data = pattern(4 << 20, 2);
    let r = send(
        &mut ep,
        &[Addr::new(21, 1)],
        Addr::new(SINK, 1),
        1,
        &data,
        cfg(),
        &mut |_, _| {},
    )
    .unwrap();
    assert!(r.verified, "{r:?}");
    // The second live rail carried too: a connection to the sink's port
    // over 127.0.0.2 (`ss`, iproute2).
    let o = std::process::Command::new("ss")
        .args(["-Htn", "state", "established", "dst", "127.0.0.2"])
        .output()
        .expect("ss runs");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("127.0.0.2:{port}")),
        "no connection over the second rail: {text}"
    );
}

#[test]
fn a_relay_answers_heartbeats_and_outlives_an_unreachable_storage_host() {
    let relay = start_relay(21, &[(SINK, "127.0.0.1:9".parse().unwrap())]);
    let compute = node(1, "127.0.0.1:0", &[(21, relay)]);
    let mut ep = compute.open(1, endpoint_config()).unwrap();
    let t = ep
        .target_via(Addr::new(21, 1), Mode::Reliable, Transport::Tcp)
        .unwrap();
    let mut out = Vec::new();
    // A message for a storage host the relay cannot reach...
    Msg::Done {
        transfer: 1,
        hash: 0,
        from: (1, 1),
        to: (SINK, 1),
    }
    .encode(&mut out);
    ep.write(t, &out).unwrap();
    // ... and heartbeats after it are still answered.
    let mut buf = vec![0u8; 4096];
    for seq in 1..=3 {
        out.clear();
        Msg::Ping { seq }.encode(&mut out);
        ep.write(t, &out).unwrap();
        let r = ep
            .read_timeout(&mut buf, Duration::from_secs(10))
            .unwrap()
            .expect("an answer");
        assert_eq!(Msg::decode(&buf[..r.len]).unwrap(), Msg::Pong { seq });
    }
}

#[test]
fn a_sink_keeps_account_of_a_bounded_number_of_transfers() {
    use macrolink_gateway::stripe::Chunk;
    let addr = start_sink("127.0.0.1:0");
    let n = node(30, "127.0.0.1:0", &[(SINK, addr)]);
    let mut ep = n.open(1, endpoint_config()).unwrap();
    let t = ep
        .target_via(Addr::new(SINK, 1), Mode::Reliable, Transport::Tcp)
        .unwrap();
    let (me, to) = (sink::pair(ep.addr()), (SINK, 1));
    // Each transfer announces 4 GiB in chunks of 4 KiB and sends one.
    let data = vec![5u8; 4096];
    let chunk = Chunk {
        seq: 0,
        offset: 0,
        len: 4096,
    };
    let first_chunk_of = |transfer| {
        let mut out = Vec::new();
        Msg::Chunk {
            transfer,
            total: 4096 << 20,
            chunk,
            from: me,
            to,
            data: &data,
        }
        .encode(&mut out);
        out
    };
    let extra = 6;
    for transfer in 0..(sink::MAX_TRANSFERS + extra) as u64 {
        ep.write(t, &first_chunk_of(transfer)).unwrap();
    }
    // Read until the cap's worth is acknowledged (a busy host may pause
    // the sink for a while), then half a second more: nothing past it.
    let mut acked = std::collections::BTreeSet::new();
    let mut buf = vec![0u8; 1 << 16];
    let start = std::time::Instant::now();
    loop {
        let enough = acked.len() >= sink::MAX_TRANSFERS;
        if !enough && start.elapsed() > Duration::from_secs(30) {
            break;
        }
        let wait = Duration::from_millis(if enough { 500 } else { 100 });
        match ep.read_timeout(&mut buf, wait).unwrap() {
            Some(r) => {
                if let Ok(Msg::Ack { transfer, .. }) = Msg::decode(&buf[..r.len]) {
                    acked.insert(transfer);
                }
            }
            None if enough => break,
            None => {}
        }
    }
    assert_eq!(acked.len(), sink::MAX_TRANSFERS, "past the cap, none");
    assert!(acked.iter().all(|t| *t < sink::MAX_TRANSFERS as u64));
    // One ends (its verdict: incomplete), and a new one gets in.
    let mut out = Vec::new();
    Msg::Done {
        transfer: 0,
        hash: 0,
        from: me,
        to,
    }
    .encode(&mut out);
    ep.write(t, &out).unwrap();
    let late = sink::MAX_TRANSFERS as u64 + extra as u64 - 1;
    ep.write(t, &first_chunk_of(late)).unwrap();
    let mut got = (false, false);
    let start = std::time::Instant::now();
    while got != (true, true) && start.elapsed() < Duration::from_secs(30) {
        let Some(r) = ep
            .read_timeout(&mut buf, Duration::from_millis(100))
            .unwrap()
        else {
            continue;
        };
        match Msg::decode(&buf[..r.len]) {
            Ok(Msg::Verdict {
                transfer: 0, ok, ..
            }) => got.0 = !ok,
            Ok(Msg::Ack { transfer, .. }) if transfer == late => got.1 = true,
            _ => {}
        }
    }
    assert_eq!(got, (true, true));
}

const SLOW: u32 = 21;
const QUICK: u32 = 22;
/// Transfer B's endpoint on the compute node.
const B: u32 = 2;
/// How long the slow gateway holds B's chunks back.
const HELD: Duration = Duration::from_millis(1500);

/// A gateway that acknowledges every chunk itself: at once, or, when
/// `slow`, B's only after [`HELD`] and no heartbeat at all. Runs until
/// `stop` or 30 s.
fn stand_in(id: u32, slow: bool, stop: Arc<AtomicBool>) -> SocketAddr {
    let n = node(id, "127.0.0.1:0", &[]);
    let addr = n.tcp_addr().unwrap();
    let mut ep = n.open(1, endpoint_config()).unwrap();
    std::thread::spawn(move || {
        let _node = n;
        let end = Instant::now() + Duration::from_secs(30);
        let mut buf = vec![0u8; 1 << 20];
        let mut held: Vec<(Instant, Addr, Vec<u8>)> = Vec::new();
        while !stop.load(Ordering::Relaxed) && Instant::now() < end {
            let now = Instant::now();
            for (_, to, ack) in held.iter().filter(|h| h.0 <= now) {
                let _ = answer(&mut ep, *to, ack);
            }
            held.retain(|h| h.0 > now);
            let Ok(Some(r)) = ep.read_timeout(&mut buf, Duration::from_millis(5)) else {
                continue;
            };
            let mut out = Vec::new();
            let late = slow && r.from.ep == B;
            match Msg::decode(&buf[..r.len]) {
                Ok(Msg::Ping { seq }) if !slow => Msg::Pong { seq }.encode(&mut out),
                Ok(Msg::Chunk {
                    transfer,
                    chunk,
                    from,
                    ..
                }) => Msg::Ack {
                    transfer,
                    seq: chunk.seq,
                    to: from,
                }
                .encode(&mut out),
                _ => continue,
            }
            if late {
                held.push((now + HELD, r.from, out));
            } else {
                let _ = answer(&mut ep, r.from, &out);
            }
        }
    });
    addr
}

/// Writes `msg` back over the connection `to` came by.
fn answer(ep: &mut Endpoint, to: Addr, msg: &[u8]) -> macrolink_fabric::Result<()> {
    match ep.connected_target(to, Mode::Reliable) {
        Some(t) => ep.write(t, msg),
        None => Err(macrolink_fabric::Error::BadTarget),
    }
}

/// [`cfg`] in 64 KiB chunks, sharing `heard`; heartbeats every 250 ms, so
/// that a gateway is out of use after about 0.75 s unheard: well before
/// the slow gateway answers, well after any pause of a loaded machine.
fn shared_cfg(heard: Option<Heard>) -> SendConfig {
    let c = cfg();
    SendConfig {
        health: HealthConfig {
            interval: 250_000_000,
            misses: 3,
        },
        stripe: StripeConfig {
            chunk: 64 << 10,
            // Longer than the slow gateway holds a chunk: nothing is sent
            // again, only heartbeats judge.
            rto: 5_000_000_000,
            ..c.stripe
        },
        heard,
        ..c
    }
}

/// Transfer B (through both gateways) beside transfer A (through the slow
/// one only, on until B is done); B's report.
fn b_beside_a(share: bool) -> SendReport {
    let stop = Arc::new(AtomicBool::new(false));
    let gws = [
        (SLOW, stand_in(SLOW, true, stop.clone())),
        (QUICK, stand_in(QUICK, false, stop.clone())),
    ];
    let compute = node(1, "127.0.0.1:0", &gws);
    let heard = share.then(Heard::new);
    let b_done = AtomicBool::new(false);
    let to = Addr::new(99, 1);
    let r = std::thread::scope(|s| {
        let a = s.spawn(|| {
            let mut ep = compute.open(1, endpoint_config()).unwrap();
            let mut read = |_: Chunk, _: &mut [u8]| -> std::io::Result<()> {
                std::thread::sleep(Duration::from_millis(5));
                Ok(())
            };
            stripe(
                &mut ep,
                &[Addr::new(SLOW, 1)],
                to,
                1,
                40 << 20,
                &mut read,
                shared_cfg(heard.clone()),
                &mut |_, _| !b_done.load(Ordering::Relaxed),
            )
        });
        let mut ep = compute.open(B, endpoint_config()).unwrap();
        let r = stripe(
            &mut ep,
            &[Addr::new(SLOW, 1), Addr::new(QUICK, 1)],
            to,
            2,
            2 << 20,
            &mut |_: Chunk, _: &mut [u8]| -> std::io::Result<()> { Ok(()) },
            shared_cfg(heard.clone()),
            &mut |_, _| true,
        );
        b_done.store(true, Ordering::Relaxed);
        let a = a.join().unwrap();
        assert!(a.is_err(), "A runs until B is done and is cancelled then");
        r.unwrap()
    });
    stop.store(true, Ordering::Relaxed);
    r
}

/// Transfers of one process that share what they hear of their gateways
/// (`SendConfig::heard`): a gateway one transfer hears from stays in use
/// for another that hears nothing from it itself. Two stand-in gateways
/// acknowledge chunks themselves (no storage host behind). The slow one
/// answers no heartbeat and holds transfer B's chunks back for a while,
/// as a gateway whose queue is deep does; it acknowledges transfer A's at
/// once. B, alone, takes it out of use; sharing A's hearing, it keeps it.
#[test]
fn a_gateway_another_transfer_hears_stays_in_use() {
    let alone = b_beside_a(false);
    assert!(
        alone.failovers >= 1 && alone.down_at[0] != 0,
        "alone, B hears nothing from the slow gateway for {HELD:?} and takes it out of use: {alone:?}"
    );
    let shared = b_beside_a(true);
    assert_eq!(
        (shared.failovers, shared.resent),
        (0, 0),
        "sharing A's hearing: {shared:?}"
    );
    assert!(shared.secs >= HELD.as_secs_f64(), "{shared:?}");
    assert!(shared.per_gateway[0] > 0, "{shared:?}");
}

/// A gateway that could not be reached when a transfer started is taken
/// into use once it answers a heartbeat, also while another transfer of
/// the process hears from it all along (news of others does not stand in
/// for this transfer's own answer, nor hold off the one that brings it
/// back).
#[test]
fn a_gateway_unreachable_at_the_start_is_taken_into_use_once_it_answers() {
    let sink = start_sink("127.0.0.1:0");
    let first = start_relay(21, &[(SINK, sink)]);
    let (hold, later) = macrolink_testbed::refusing::refusing_addr().unwrap();
    let compute = node(1, "127.0.0.1:0", &[(21, first), (22, later)]);
    let mut ep = compute.open(1, endpoint_config()).unwrap();
    let heard = Heard::new();
    let mut other = heard.watch(&[(22, 1)]);
    let mut hold = Some(hold);
    let chunks = 600u64;
    let mut read = |_: Chunk, _: &mut [u8]| -> std::io::Result<()> {
        std::thread::sleep(Duration::from_millis(5));
        Ok(())
    };
    let r = stripe(
        &mut ep,
        &[Addr::new(21, 1), Addr::new(22, 1)],
        Addr::new(SINK, 1),
        3,
        chunks * (64 << 10),
        &mut read,
        SendConfig {
            stripe: StripeConfig {
                chunk: 64 << 10,
                ..cfg().stripe
            },
            heard: Some(heard.clone()),
            ..cfg()
        },
        &mut |acked, _| {
            other.hear(0, macrolink_fabric::clock_ns());
            if acked >= chunks / 10 {
                if let Some(h) = hold.take() {
                    drop(h);
                    let n = node(22, &later.to_string(), &[(SINK, sink)]);
                    let ep = n.open(1, endpoint_config()).unwrap();
                    std::thread::spawn(move || {
                        let _node = n;
                        relay::run(ep, &[(SINK, sink)], &relay::Meter::default())
                    });
                }
            }
            true
        },
    )
    .unwrap();
    assert!(hold.is_none(), "the second gateway was started");
    assert!(r.per_gateway[1] > 0, "{r:?}");
    assert!(!r.down[1], "{r:?}");
}
