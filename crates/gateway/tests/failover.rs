//! Health, Striper and Assembler driven together over a simulated network:
//! a virtual clock, 1 Gbit/s per gateway, per-path latency with jitter (so
//! chunks arrive out of order), random loss from a seeded generator, and a
//! gateway that dies mid-transfer and later comes back.

use macrolink_gateway::assemble::Assembler;
use macrolink_gateway::health::{Health, HealthConfig, HealthEvent};
use macrolink_gateway::stripe::{Chunk, StripeConfig, Striper};
use macrolink_gateway::{Gw, Nanos};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const MS: Nanos = 1_000_000;
const STEP: Nanos = 100_000;
/// 1 Gbit/s: 125 bytes per microsecond.
const BYTES_PER_NS: f64 = 0.125;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Chunk {
        gw: Gw,
        seq: u64,
        offset: u64,
        len: u64,
    },
    Ack {
        gw: Gw,
        seq: u64,
    },
    Probe {
        gw: Gw,
        seq: u64,
    },
    Reply {
        gw: Gw,
        seq: u64,
    },
}

struct Sim {
    rng: StdRng,
    loss: f64,
    jitter: Nanos,
    /// Gateway `dead.0` drops everything from `dead.1` until `dead.2`.
    dead: Option<(Gw, Nanos, Nanos)>,
    busy_until: Vec<Nanos>,
    queue: BinaryHeap<Reverse<(Nanos, u64, Ev)>>,
    order: u64,
}

impl Sim {
    fn alive(&self, gw: Gw, at: Nanos) -> bool {
        !matches!(self.dead, Some((g, from, until)) if g == gw && at >= from && at < until)
    }

    fn send(&mut self, now: Nanos, gw: Gw, bytes: u64, ev: Ev) {
        if self.rng.random::<f64>() < self.loss {
            return;
        }
        let start = now.max(self.busy_until[gw]);
        let wire = (bytes as f64 / BYTES_PER_NS) as Nanos;
        self.busy_until[gw] = start + wire;
        let at = start + wire + 50_000 + self.rng.random_range(0..=self.jitter);
        self.order += 1;
        self.queue.push(Reverse((at, self.order, ev)));
    }
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
    let mut sim = Sim {
        rng: StdRng::seed_from_u64(seed),
        loss,
        jitter,
        dead,
        busy_until: vec![0; gateways],
        queue: BinaryHeap::new(),
        order: 0,
    };
    let mut down = vec![false; gateways];
    let (mut now, mut last_progress, mut longest_stall, mut sent_while_down) = (0, 0, 0, 0);
    while !(striper.is_complete() && asm.is_complete()) {
        assert!(now < 60_000 * MS, "transfer never finished (seed {seed})");
        let mut events = Vec::new();
        while sim
            .queue
            .peek()
            .is_some_and(|Reverse((at, _, _))| *at <= now)
        {
            let Some(Reverse((_, _, ev))) = sim.queue.pop() else {
                break;
            };
            match ev {
                Ev::Chunk {
                    gw,
                    seq,
                    offset,
                    len,
                } if sim.alive(gw, now) => {
                    let c = Chunk { seq, offset, len };
                    let slice = &data[offset as usize..(offset + len) as usize];
                    if asm.place(c, slice, &mut out).unwrap() {
                        longest_stall = longest_stall.max(now - last_progress);
                        last_progress = now;
                    }
                    sim.send(now, gw, 64, Ev::Ack { gw, seq });
                }
                Ev::Ack { gw, seq } if sim.alive(gw, now) => striper.on_ack(seq, now),
                Ev::Probe { gw, seq } if sim.alive(gw, now) => {
                    sim.send(now, gw, 64, Ev::Reply { gw, seq })
                }
                Ev::Reply { gw, seq } => health.on_reply(gw, seq, &mut events),
                _ => {} // through a dead gateway: lost
            }
        }
        health.poll(now, &mut events);
        for e in events {
            match e {
                HealthEvent::Probe { gw, seq } => sim.send(now, gw, 64, Ev::Probe { gw, seq }),
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
            let c = t.chunk;
            sim.send(
                now,
                t.gw,
                c.len,
                Ev::Chunk {
                    gw: t.gw,
                    seq: c.seq,
                    offset: c.offset,
                    len: c.len,
                },
            );
        }
        now += STEP;
    }
    Outcome {
        finished: now,
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
        // round trip; with the defaults, well under a second.
        assert!(
            o.longest_stall <= cfg.detection_bound() + 50 * MS,
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
