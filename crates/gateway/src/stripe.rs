//! One large transfer striped in chunks over every live gateway, so that one
//! client gets the sum of their links; chunks in flight through a gateway
//! that dies, or that time out, are sent again through another.

use std::collections::{BTreeMap, VecDeque};

use crate::paths::Paths;
use crate::{Gw, Nanos};

/// Striping settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeConfig {
    /// Bytes per chunk.
    pub chunk: u64,
    /// Chunks in flight per gateway.
    pub window: usize,
    /// Time after which an unanswered chunk is sent again.
    pub rto: Nanos,
}

impl Default for StripeConfig {
    fn default() -> Self {
        StripeConfig {
            chunk: 1 << 20,
            window: 8,
            rto: 500_000_000,
        }
    }
}

/// One chunk: end-to-end sequence number and the bytes it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Sequence number, 0-based.
    pub seq: u64,
    /// Offset in the transfer.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// Send `chunk` through gateway `gw`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Gateway to send through.
    pub gw: Gw,
    /// What to send.
    pub chunk: Chunk,
}

/// Sender side of a striped transfer.
#[derive(Clone, Debug)]
pub struct Striper {
    cfg: StripeConfig,
    total: u64,
    paths: Paths,
    queue: VecDeque<u64>,
    inflight: BTreeMap<u64, (Gw, Nanos)>,
    per_path: Vec<usize>,
    acked: Vec<bool>,
    acked_count: u64,
    next_path: usize,
    /// Chunks sent again (path lost or timed out).
    pub resent: u64,
}

impl Striper {
    /// A transfer of `total` bytes over `gateways` paths.
    pub fn new(total: u64, gateways: usize, cfg: StripeConfig) -> Striper {
        let chunk = cfg.chunk.max(1);
        let n = total.div_ceil(chunk);
        Striper {
            cfg: StripeConfig { chunk, ..cfg },
            total,
            paths: Paths::new(gateways),
            queue: (0..n).collect(),
            inflight: BTreeMap::new(),
            per_path: vec![0; gateways],
            acked: vec![false; n as usize],
            acked_count: 0,
            next_path: 0,
            resent: 0,
        }
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u64 {
        self.acked.len() as u64
    }

    fn chunk(&self, seq: u64) -> Chunk {
        let offset = seq * self.cfg.chunk;
        Chunk {
            seq,
            offset,
            len: self.cfg.chunk.min(self.total - offset),
        }
    }

    fn requeue(&mut self, seq: u64) {
        if let Some((gw, _)) = self.inflight.remove(&seq) {
            self.per_path[gw] -= 1;
            self.resent += 1;
            self.queue.push_front(seq);
        }
    }

    /// A gateway died: its chunks in flight go again through the others.
    pub fn on_path_down(&mut self, gw: Gw) {
        self.paths.set_alive(gw, false);
        let lost: Vec<u64> = self
            .inflight
            .iter()
            .filter(|(_, (g, _))| *g == gw)
            .map(|(s, _)| *s)
            .collect();
        for seq in lost.into_iter().rev() {
            self.requeue(seq);
        }
    }

    /// A gateway is back.
    pub fn on_path_up(&mut self, gw: Gw) {
        self.paths.set_alive(gw, true);
    }

    /// The receiver has chunk `seq` (repeats are harmless).
    pub fn on_ack(&mut self, seq: u64) {
        if let Some((gw, _)) = self.inflight.remove(&seq) {
            self.per_path[gw] -= 1;
        }
        if let Some(a) = self.acked.get_mut(seq as usize) {
            if !*a {
                *a = true;
                self.acked_count += 1;
            }
        }
    }

    /// The next chunk to send and where, if a live gateway has room.
    pub fn poll_transmit(&mut self, now: Nanos) -> Option<Transmit> {
        let expired: Vec<u64> = self
            .inflight
            .iter()
            .filter(|(_, (_, at))| at + self.cfg.rto <= now)
            .map(|(s, _)| *s)
            .collect();
        for seq in expired.into_iter().rev() {
            self.requeue(seq);
        }
        while self.queue.front().is_some_and(|&s| self.acked[s as usize]) {
            self.queue.pop_front();
        }
        self.queue.front()?;
        let n = self.per_path.len();
        let gw = (0..n)
            .map(|k| (self.next_path + k) % n)
            .find(|&g| self.paths.is_alive(g) && self.per_path[g] < self.cfg.window)?;
        let seq = self.queue.pop_front()?;
        self.next_path = (gw + 1) % n;
        self.per_path[gw] += 1;
        self.inflight.insert(seq, (gw, now));
        Some(Transmit {
            gw,
            chunk: self.chunk(seq),
        })
    }

    /// When a chunk in flight next times out.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.inflight
            .values()
            .map(|(_, at)| at + self.cfg.rto)
            .min()
    }

    /// Whether every chunk has been acknowledged.
    pub fn is_complete(&self) -> bool {
        self.acked_count == self.chunks()
    }
}
