//! Health, Striper and Assembler driven together over the simulated network
//! of `macrolink-simnet`: a virtual clock, 1 Gbit/s each way per gateway,
//! per-path latency with jitter (so chunks arrive out of order), random
//! loss from a seeded generator, and a gateway that dies mid-transfer and
//! later comes back.

use macrolink_gateway::assemble::Assembler;
use macrolink_gateway::health::{Health, HealthConfig, HealthEvent};
use macrolink_gateway::stripe::{Chunk, StripeConfig, Striper};
use macrolink_gateway::{Gw, Nanos};
use macrolink_simnet::{LinkId, LinkSpec, Net, NodeId, MS, US};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const STEP: Nanos = 100 * US;
/// 1 Gbit/s.
const GBIT: u64 = 1_000_000_000;

#[derive(Clone, Copy, Debug)]
enum Ev {
    Chunk(Chunk),
    Ack(u64),
    Probe(u64),
    Reply(u64),
}

/// The compute host's side of gateway `gw`'s path: chunks and heartbeats
/// out to the gateway (which hands chunks on to storage), acks and
/// answers back.
struct Path {
    gw: NodeId,
    out: LinkId,
    back: LinkId,
}

struct Outcome {
    finished: Nanos,
    longest_stall: Nanos,
    placed_once: bool,
    duplicates: u64,
    resent: u64,
    sent_while_down: u64,
}

fn transfer(
    seed: u64,
    gateways: usize,
    total: u64,
    loss: f64,
    dead: Option<(Gw, Nanos, Nanos)>,
) -> Outcome {
    transfer_with(seed, gateways, total, loss, 2 * MS, dead)
}

/// One transfer of `total` bytes from a compute host over `gateways`
/// paths of 1 Gbit/s each way, 50 us plus up to `jitter` (which reorders),
/// `loss` on every message; gateway `dead.0` dies at `dead.1` and comes
/// back at `dead.2`.
fn transfer_with(
    seed: u64,
    gateways: usize,
    total: u64,
    loss: f64,
    jitter: Nanos,
    dead: Option<(Gw, Nanos, Nanos)>,
) -> Outcome {
    let mut data = vec![0u8; total as usize];
    StdRng::seed_from_u64(seed ^ 0xdada).fill(&mut data[..]);
    let cfg = StripeConfig {
        chunk: 256 * 1024,
        window: 4,
        rto: 500 * MS,
    };
    let mut striper = Striper::new(total, gateways, cfg);
    let mut health = Health::new(gateways, HealthConfig::default(), 0);
    let mut asm = Assembler::new(total, cfg.chunk);
    let mut out = vec![0u8; total as usize];
    let mut net = Net::new(seed);
    let compute = net.add_node();
    let spec = LinkSpec::new(50 * US)
        .bits_per_sec(GBIT)
        .jitter(jitter)
        .loss(loss)
        .reorder(true);
    let paths: Vec<Path> = (0..gateways)
        .map(|_| {
            let gw = net.add_node();
            let (out, back) = net.add_pair(compute, gw, spec);
            Path { gw, out, back }
        })
        .collect();
    if let Some((gw, dies, revives)) = dead {
        net.kill(paths[gw].gw, dies);
        net.revive(paths[gw].gw, revives);
    }
    let path_of = |link: LinkId| paths.iter().position(|p| p.out == link || p.back == link);
    let mut down = vec![false; gateways];
    let (mut last_progress, mut longest_stall, mut sent_while_down) = (0, 0, 0);
    while !(striper.is_complete() && asm.is_complete()) {
        let now = net.now();
        assert!(now < 60_000 * MS, "transfer never finished (seed {seed})");
        let mut events = Vec::new();
        while let Some(d) = net.poll() {
            let gw = path_of(d.link).expect("a path's link");
            match d.msg {
                Ev::Chunk(c) => {
                    let slice = &data[c.offset as usize..(c.offset + c.len) as usize];
                    if asm.place(c, slice, &mut out).unwrap() {
                        longest_stall = longest_stall.max(now - last_progress);
                        last_progress = now;
                    }
                    net.send(paths[gw].back, 64, Ev::Ack(c.seq));
                }
                Ev::Probe(seq) => net.send(paths[gw].back, 64, Ev::Reply(seq)),
                Ev::Ack(seq) => striper.on_ack(seq, now),
                Ev::Reply(seq) => health.on_reply(gw, seq, &mut events),
            }
        }
        health.poll(now, &mut events);
        for e in events {
            match e {
                HealthEvent::Probe { gw, seq } => net.send(paths[gw].out, 64, Ev::Probe(seq)),
                HealthEvent::Down(gw) => {
                    down[gw] = true;
                    striper.on_path_down(gw);
                }
                HealthEvent::Up(gw) => {
                    down[gw] = false;
                    striper.on_path_up(gw);
                }
            }
        }
        while let Some(t) = striper.poll_transmit(now) {
            if down[t.gw] {
                sent_while_down += 1;
            }
            net.send(paths[t.gw].out, t.chunk.len, Ev::Chunk(t.chunk));
        }
        net.step(STEP);
    }
    Outcome {
        finished: net.now(),
        longest_stall,
        placed_once: out == data,
        duplicates: asm.duplicates,
        resent: striper.resent,
        sent_while_down,
    }
}

#[test]
fn one_transfer_gets_the_sum_of_the_links() {
    // 48 chunks: an even share for 1, 2, 3 and 4 gateways.
    let total = 48 * 256 * 1024;
    let one = transfer_with(1, 1, total, 0.0, 100_000, None).finished as f64;
    for n in 2..=4 {
        let t = transfer_with(1, n, total, 0.0, 100_000, None).finished as f64;
        let speedup = one / t;
        assert!(speedup >= 0.9 * n as f64, "{n} gateways: {speedup:.2}x");
    }
}

#[test]
fn a_gateway_dying_mid_transfer_loses_and_duplicates_nothing() {
    let cfg = HealthConfig::default();
    for seed in 0..16 {
        // 8 MiB take about 25 ms over three gateways: gateway 1 dies at 5 ms.
        let o = transfer(seed, 3, 8 << 20, 0.02, Some((1, 5 * MS, 2_000 * MS)));
        assert!(o.placed_once, "seed {seed}: bytes differ");
        assert!(o.resent > 0, "seed {seed}: nothing was sent again");
        assert_eq!(
            o.sent_while_down, 0,
            "seed {seed}: used a gateway known dead"
        );
        // The stall is detection (at most interval x (misses + 1)) plus a
        // round trip, or, where a chunk sent again is itself lost, one
        // retransmission timeout; with the defaults, well under a second.
        let rto = StripeConfig::default().rto;
        assert!(
            o.longest_stall <= cfg.detection_bound().max(rto) + 50 * MS,
            "seed {seed}: stall {} ms",
            o.longest_stall / MS
        );
        assert!(o.longest_stall < 1_000 * MS);
        let _ = o.duplicates; // counted and dropped, never placed twice
    }
}

#[test]
fn a_gateway_that_comes_back_carries_traffic_again() {
    // Dead for 0.3 s early in a 0.5 s transfer: detected, then taken back.
    let o = transfer(7, 2, 64 << 20, 0.0, Some((0, 10 * MS, 310 * MS)));
    assert!(o.placed_once);
    let alone = transfer(7, 1, 64 << 20, 0.0, None).finished;
    // With the gateway back after 0.3 s the transfer beats one gateway alone.
    assert!(o.finished < alone, "{} vs {}", o.finished / MS, alone / MS);
}
