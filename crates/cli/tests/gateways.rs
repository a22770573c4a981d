//! Striped transfers through gateway processes, and a gateway killed with
//! SIGKILL mid-transfer: the transfer completes with every byte in place and
//! the storage host's hash check passes.

use macrolink_fabric::{Addr, Endpoint, Node, NodeConfig};
use macrolink_gateway::health::HealthConfig;
use macrolink_gateway::stripe::StripeConfig;
use macrolink_gwnet::client::{send, SendConfig};
use macrolink_testbed::data::pattern;
use macrolink_testbed::Peer;
use std::path::Path;

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");

struct Lane {
    sink: Peer,
    gateways: Vec<Peer>,
    node: Node,
    dir: tempfile::TempDir,
}

fn lane(n: u32) -> Lane {
    let dir = tempfile::tempdir().unwrap();
    let sink = Peer::spawn_role(Path::new(EXE), "sink", 10, dir.path(), &[]).unwrap();
    let sink_peer = format!("10={}", sink.tcp);
    let gateways: Vec<Peer> = (0..n)
        .map(|i| {
            Peer::spawn_role(
                Path::new(EXE),
                "gateway",
                21 + i,
                dir.path(),
                &["--peer", &sink_peer],
            )
            .unwrap()
        })
        .collect();
    let mut cfg = NodeConfig::local(1, dir.path());
    for (i, g) in gateways.iter().enumerate() {
        cfg.peers.insert(21 + i as u32, g.tcp);
    }
    let node = Node::start(cfg).unwrap();
    Lane {
        sink,
        gateways,
        node,
        dir,
    }
}

impl Lane {
    /// The compute host's endpoint.
    fn endpoint(&self) -> Endpoint {
        self.node
            .open(1, macrolink_gwnet::endpoint_config())
            .unwrap()
    }
}

fn cfg() -> SendConfig {
    SendConfig {
        stripe: StripeConfig {
            chunk: 1 << 20,
            window: 4,
            rto: 500_000_000,
        },
        ..SendConfig::default()
    }
}

/// As `cfg`, with a gateway down only after 1.25 s without an answer (not
/// 0.4 s): for the tests that count on no gateway being taken for dead
/// while every process of the test binary competes for two cores.
fn patient() -> SendConfig {
    SendConfig {
        health: HealthConfig {
            interval: 250_000_000,
            misses: 4,
        },
        ..cfg()
    }
}

#[test]
fn a_transfer_striped_over_two_gateways_arrives_whole() {
    let lane = lane(2);
    let mut ep = lane.endpoint();
    let gws = [Addr::new(21, 1), Addr::new(22, 1)];
    let bytes = pattern(24 << 20, 0);
    let r = send(
        &mut ep,
        &gws,
        Addr::new(10, 1),
        1,
        &bytes,
        patient(),
        &mut |_, _| {},
    )
    .unwrap();
    eprintln!("two gateways on loopback: {r:?}");
    assert!(r.verified, "{r:?}");
    assert_eq!(r.bytes, 24 << 20);
    assert_eq!(r.failovers, 0);
    // A second transfer on the same lane.
    let r = send(
        &mut ep,
        &gws,
        Addr::new(10, 1),
        2,
        &bytes[..5_000_001],
        patient(),
        &mut |_, _| {},
    )
    .unwrap();
    assert!(r.verified, "{r:?}");
}

#[test]
fn killing_a_gateway_mid_transfer_loses_nothing() {
    let mut lane = lane(2);
    let mut ep = lane.endpoint();
    let gws = [Addr::new(21, 1), Addr::new(22, 1)];
    let bytes = pattern(48 << 20, 0);
    let mut victim = Some(lane.gateways.remove(0));
    let r = send(
        &mut ep,
        &gws,
        Addr::new(10, 1),
        7,
        &bytes,
        cfg(),
        &mut |acked, total| {
            if acked * 3 >= total {
                if let Some(mut g) = victim.take() {
                    g.kill();
                }
            }
        },
    )
    .unwrap();
    eprintln!("after a gateway was killed: {r:?}");
    assert!(victim.is_none(), "the gateway was killed");
    assert!(r.verified, "the storage host's hash check failed: {r:?}");
    assert!(r.failovers >= 1, "{r:?}");
    assert!(r.longest_stall < 5.0, "{r:?}");
}

#[test]
fn pinned_flows_keep_one_gateway_spread_and_move_when_it_dies() {
    let mut lane = lane(2);
    let mut ep = lane.endpoint();
    let gws = [Addr::new(21, 1), Addr::new(22, 1)];
    let bytes = pattern(8 << 20, 0);
    let pinned = SendConfig {
        pinned: true,
        ..patient()
    };
    // Each flow stays on one gateway; different flows land on both.
    let mut used = [0u64; 2];
    for transfer in 1..=12 {
        let r = send(
            &mut ep,
            &gws,
            Addr::new(10, 1),
            transfer,
            &bytes,
            pinned.clone(),
            &mut |_, _| {},
        )
        .unwrap();
        assert!(r.verified);
        let on: Vec<usize> = (0..2).filter(|&g| r.per_gateway[g] > 0).collect();
        assert_eq!(on.len(), 1, "flow {transfer} used {:?}", r.per_gateway);
        used[on[0]] += 1;
    }
    assert!(
        used[0] > 0 && used[1] > 0,
        "12 flows all hashed to one gateway: {used:?}"
    );
    // Kill the gateway a flow is on: the flow moves to the other and completes.
    let first = send(
        &mut ep,
        &gws,
        Addr::new(10, 1),
        99,
        &bytes[..1 << 20],
        pinned.clone(),
        &mut |_, _| {},
    )
    .unwrap();
    let on = (0..2).find(|&g| first.per_gateway[g] > 0).unwrap();
    let mut victim = Some(lane.gateways.remove(on));
    let big = pattern(32 << 20, 0);
    let r = send(
        &mut ep,
        &gws,
        Addr::new(10, 1),
        99,
        &big,
        pinned.clone(),
        &mut |acked, total| {
            if acked * 4 >= total {
                if let Some(mut g) = victim.take() {
                    g.kill();
                }
            }
        },
    )
    .unwrap();
    assert!(r.verified, "{r:?}");
    assert!(r.per_gateway[on] > 0 && r.per_gateway[1 - on] > 0, "{r:?}");
}

#[test]
fn a_gateway_that_comes_back_is_taken_into_use_again() {
    let mut lane = lane(2);
    let mut ep = lane.endpoint();
    let gws = [Addr::new(21, 1), Addr::new(22, 1)];
    let bytes = pattern(128 << 20, 0);
    let mut first = Some(lane.gateways.remove(0));
    let addr = first.as_ref().unwrap().tcp.to_string();
    let sink = format!("10={}", lane.sink.tcp);
    let dir = lane.dir.path().to_path_buf();
    let mut back = None;
    let mut sent_before = 0;
    let r = send(
        &mut ep,
        &gws,
        Addr::new(10, 1),
        5,
        &bytes,
        cfg(),
        &mut |acked, total| {
            if acked * 10 >= total {
                if let Some(mut g) = first.take() {
                    g.kill();
                    sent_before = acked;
                    // The same gateway, restarted at once on the same address.
                    back = Some(
                        Peer::spawn_role(
                            Path::new(EXE),
                            "gateway",
                            21,
                            &dir,
                            &["--tcp", &addr, "--peer", &sink],
                        )
                        .unwrap(),
                    );
                }
            }
        },
    )
    .unwrap();
    eprintln!("gateway restarted: {r:?}");
    assert!(back.is_some() && sent_before > 0);
    assert!(r.verified, "{r:?}");
    assert!(r.failovers >= 1, "{r:?}");
    // Gateway 0 was taken back into use: chunks went through it after its
    // return.
    assert!(r.after_return > 0, "{r:?}");
}

/// A compute host that hangs with its connection open: it sends the gateway
/// heartbeats and never reads the answers.
fn hung_client(gateway: std::net::SocketAddr, pings: u64) -> std::net::TcpStream {
    use macrolink_gateway::msg::Msg;
    use macrolink_wire::{FrameKind, Header};
    use std::io::Write;
    let me = Addr::new(99, 1);
    let mut s = std::net::TcpStream::connect(gateway).unwrap();
    let mut h = Header::new(FrameKind::Hello);
    (h.src_node, h.src_ep, h.dst_ep) = (me.node, me.ep, 1);
    let key = macrolink_fabric::Key::from_env().unwrap();
    macrolink_fabric::handshake(&mut s, &key.unwrap_or_else(macrolink_fabric::Key::open), h)
        .unwrap();
    let mut w = s.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        for seq in 0..pings {
            let mut body = Vec::new();
            Msg::Ping { seq }.encode(&mut body);
            let mut h = Header::new(FrameKind::Data);
            (h.src_node, h.src_ep, h.dst_ep) = (me.node, me.ep, 1);
            (h.seq, h.total, h.len) = (seq, body.len() as u64, body.len() as u32);
            out.extend_from_slice(&h.encode());
            out.extend_from_slice(&body);
            if out.len() > 1 << 16 {
                // Fails once the gateway gives this client up: done.
                if w.write_all(&out).is_err() {
                    return;
                }
                out.clear();
            }
        }
    });
    s
}

#[test]
fn a_compute_host_that_hangs_does_not_hold_up_the_gateway() {
    // Without a send timeout the gateway would sit for good in a write of
    // heartbeat answers that nobody reads, and relay nothing for anyone.
    let lane = lane(1);
    let hung = hung_client(lane.gateways[0].tcp, 400_000);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut ep = lane.endpoint();
    let bytes = pattern(16 << 20, 0);
    let patient = SendConfig {
        patience: 60_000_000_000,
        ..cfg()
    };
    let r = send(
        &mut ep,
        &[Addr::new(21, 1)],
        Addr::new(10, 1),
        3,
        &bytes,
        patient,
        &mut |_, _| {},
    )
    .expect("the transfer gets through the gateway");
    eprintln!("through a gateway with a hung client: {r:?}");
    assert!(r.verified, "{r:?}");
    let _ = hung.shutdown(std::net::Shutdown::Both);
}
