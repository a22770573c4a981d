//! One direction of a link: packets go in with `offer`, come out with
//! `pop_due` once their time has come.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::bucket::Bucket;
use crate::jitter::JitterState;
use crate::loss::LossState;
use crate::spec::Spec;
use crate::stats::Stats;
use crate::Nanos;

/// What became of an offered packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// On the line, due at this time (and again, if duplicated).
    Due(Nanos),
    /// Dropped: the queue in front of the rate limit was full.
    QueueFull,
    /// Lost to the loss model.
    Lost,
}

/// A packet whose time has come.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery<P> {
    /// The packet.
    pub packet: P,
    /// When it was due.
    pub due: Nanos,
    /// A bit to flip (counted from the first byte's lowest bit), if the
    /// packet is to arrive corrupted.
    pub flip_bit: Option<u64>,
}

/// One direction of a link.
#[derive(Debug)]
pub struct Pipe<P> {
    spec: Spec,
    rng: StdRng,
    bucket: Option<Bucket>,
    loss: LossState,
    jitter: JitterState,
    /// Packets on the line by (due, order).
    line: BinaryHeap<Reverse<(Nanos, u64)>>,
    packets: std::collections::HashMap<u64, (P, Option<u64>)>,
    order: u64,
    /// The latest due time of a packet that keeps its order.
    last_due: Nanos,
    stats: Stats,
}

impl<P: Clone> Pipe<P> {
    /// A pipe doing what `spec` says (see [`Spec::check`]).
    pub fn new(spec: Spec) -> Pipe<P> {
        Pipe {
            rng: StdRng::seed_from_u64(spec.seed),
            bucket: spec.rate.map(Bucket::new),
            loss: LossState::default(),
            jitter: JitterState::default(),
            line: BinaryHeap::new(),
            packets: std::collections::HashMap::new(),
            order: 0,
            last_due: 0,
            stats: Stats::default(),
            spec,
        }
    }

    /// What it was asked to do.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        Stats {
            in_flight: self.line.len() as u64,
            ..self.stats
        }
    }

    /// Packets on the line.
    pub fn in_flight(&self) -> usize {
        self.line.len()
    }

    /// Takes a packet of `len` bytes at `now`.
    pub fn offer(&mut self, now: Nanos, len: usize, packet: P) -> Fate {
        self.stats.offered += 1;
        self.stats.bytes_offered += len as u64;
        if self.loss.lose(&self.spec.loss, &mut self.rng) {
            self.stats.lost += 1;
            return Fate::Lost;
        }
        let leave = match self.bucket.as_mut() {
            Some(b) => match b.admit(now, len as u64) {
                Some(t) => t,
                None => {
                    self.stats.queue_drops += 1;
                    return Fate::QueueFull;
                }
            },
            None => now,
        };
        let reorder = self.spec.reorder > 0.0 && self.rng.random::<f64>() < self.spec.reorder;
        let due = if reorder {
            // Skips the delay, as netem's reordering does: it overtakes
            // whatever is on the line.
            if self.last_due > leave {
                self.stats.reordered += 1;
            }
            leave
        } else {
            let vary = match &self.spec.jitter {
                Some(j) => self.jitter.next(j, &mut self.rng),
                None => 0.0,
            };
            let d = (self.spec.delay as f64 + vary).max(0.0) as Nanos;
            // Jitter alone never reorders.
            let due = (leave + d).max(self.last_due);
            self.last_due = due;
            due
        };
        if due > now {
            self.stats.delayed += 1;
        }
        let copies = if self.spec.duplicate > 0.0 && self.rng.random::<f64>() < self.spec.duplicate
        {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let flip = if self.spec.corrupt > 0.0
                && len > 0
                && self.rng.random::<f64>() < self.spec.corrupt
            {
                self.stats.corrupted += 1;
                Some(self.rng.random_range(0..len as u64 * 8))
            } else {
                None
            };
            self.order += 1;
            self.line.push(Reverse((due, self.order)));
            self.packets.insert(self.order, (packet.clone(), flip));
        }
        Fate::Due(due)
    }

    /// When the next packet is due.
    pub fn next_due(&self) -> Option<Nanos> {
        self.line.peek().map(|Reverse((t, _))| *t)
    }

    /// The next packet due at or before `now`.
    pub fn pop_due(&mut self, now: Nanos) -> Option<Delivery<P>> {
        let &Reverse((due, order)) = self.line.peek()?;
        if due > now {
            return None;
        }
        self.line.pop();
        let (packet, flip_bit) = self.packets.remove(&order)?;
        self.stats.carried += 1;
        Some(Delivery {
            packet,
            due,
            flip_bit,
        })
    }
}

/// Flips bit `bit` of `data` (what corruption does to a packet's bytes).
pub fn flip(data: &mut [u8], bit: u64) {
    if let Some(b) = data.get_mut((bit / 8) as usize) {
        *b ^= 1 << (bit % 8);
    }
}
