//! One large transfer striped in chunks over every live gateway, so that one
//! client gets the sum of their links; chunks in flight through a gateway
//! that dies, or that time out, are sent again through another.
//!
//! The timeout adapts as TCP's does (RFC 6298): it follows the smoothed
//! round trip of chunks acknowledged on their first sending (Karn's rule)
//! plus four times its variation, never below the configured value, and
//! doubles after an expiry when no answer at all came since the last one
//! (a silent path, not a lost chunk among answered ones). Queues that grow
//! with the window (many flows through one gateway) therefore lengthen the
//! timeout instead of setting off a storm of needless resends.
//!
//! Transfers of one process through the same gateways (a file server's
//! downloads, a benchmark's flows) share the window: each is told how
//! many the others are and what they have in flight through each gateway
//! ([`Striper::set_others`]). Its fair part of the window, at least one
//! chunk, it may always have in flight there; beyond that, what the others
//! leave. Eight transfers with a window each queued eight windows at every
//! gateway: a chunk waited some 280 ms there at 1 Gbit/s.

use std::collections::{BTreeMap, VecDeque};

use crate::paths::Paths;
use crate::{Gw, Nanos};

/// Striping settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeConfig {
    /// Bytes per chunk.
    pub chunk: u64,
    /// Chunks in flight per gateway (shared by the transfers that share
    /// it, see [`Striper::set_others`]).
    pub window: usize,
    /// Time after which an unanswered chunk is sent again, before any round
    /// trip has been measured; also the least the timeout ever is.
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

/// The other transfers that share a gateway with this one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Others {
    /// How many they are.
    pub transfers: usize,
    /// Their chunks in flight through it.
    pub chunks: usize,
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
    /// The other transfers through each gateway.
    others: Vec<Others>,
    acked: Vec<bool>,
    acked_count: u64,
    next_path: usize,
    retried: Vec<bool>,
    srtt: Option<Nanos>,
    rttvar: Nanos,
    rto: Nanos,
    answered: bool,
    /// Chunks sent again (path lost or timed out).
    pub resent: u64,
}

/// The longest the timeout grows by backing off.
const MAX_RTO: Nanos = 60_000_000_000;

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
            others: vec![Others::default(); gateways],
            acked: vec![false; n as usize],
            acked_count: 0,
            next_path: 0,
            retried: vec![false; n as usize],
            srtt: None,
            rttvar: 0,
            rto: cfg.rto,
            answered: false,
            resent: 0,
        }
    }

    /// The current timeout.
    pub fn rto(&self) -> Nanos {
        self.rto
    }

    /// Takes a round-trip sample.
    fn sample(&mut self, rtt: Nanos) {
        let (srtt, rttvar) = match self.srtt {
            None => (rtt, rtt / 2),
            Some(s) => (
                s - s / 8 + rtt / 8,
                self.rttvar - self.rttvar / 4 + s.abs_diff(rtt) / 4,
            ),
        };
        self.srtt = Some(srtt);
        self.rttvar = rttvar;
        self.rto = (srtt + 4 * rttvar).clamp(self.cfg.rto, MAX_RTO);
    }

    /// Chunks of this transfer in flight through `gw`.
    pub fn in_flight(&self, gw: Gw) -> usize {
        self.per_path.get(gw).copied().unwrap_or(0)
    }

    /// The other transfers through `gw` now: this one sends there while
    /// it has less than its fair part of the window in flight (the window
    /// over all of them, at least one chunk), or while its chunks and
    /// theirs together are fewer than the window.
    pub fn set_others(&mut self, gw: Gw, others: Others) {
        if let Some(o) = self.others.get_mut(gw) {
            *o = others;
        }
    }

    /// Whether the window of `gw` has room for a chunk of this transfer.
    fn has_room(&self, gw: Gw) -> bool {
        let (mine, o, window) = (self.per_path[gw], self.others[gw], self.cfg.window);
        let fair = (window / (o.transfers + 1)).max(1);
        mine < window && (mine < fair || mine + o.chunks < window)
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
            self.retried[seq as usize] = true;
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

    /// The gateway chunk `seq` was last sent through, while it waits for
    /// its acknowledgement.
    pub fn path_of(&self, seq: u64) -> Option<Gw> {
        self.inflight.get(&seq).map(|&(gw, _)| gw)
    }

    /// As [`path_of`](Self::path_of), with when it went.
    pub fn sent_via(&self, seq: u64) -> Option<(Gw, Nanos)> {
        self.inflight.get(&seq).copied()
    }

    /// The receiver has chunk `seq` (repeats are harmless); `now` times
    /// the round trip of a chunk sent once.
    pub fn on_ack(&mut self, seq: u64, now: Nanos) {
        self.answered = true;
        if let Some((gw, at)) = self.inflight.remove(&seq) {
            self.per_path[gw] -= 1;
            if !self.retried[seq as usize] {
                self.sample(now.saturating_sub(at));
            }
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
        self.poll_transmit_to(now, &mut |_| true)
    }

    /// As [`poll_transmit`](Self::poll_transmit), among the gateways whose
    /// path `ready` says takes a chunk now (it is asked only of live ones
    /// with room in the window, in turn): a sender whose connection to one
    /// gateway is full gives the chunk to the next rather than wait there
    /// while the others run dry.
    pub fn poll_transmit_to(
        &mut self,
        now: Nanos,
        ready: &mut dyn FnMut(Gw) -> bool,
    ) -> Option<Transmit> {
        let expired: Vec<u64> = self
            .inflight
            .iter()
            .filter(|(_, (_, at))| at + self.rto <= now)
            .map(|(s, _)| *s)
            .collect();
        if !expired.is_empty() {
            if !self.answered {
                self.rto = (self.rto * 2).min(MAX_RTO);
            }
            self.answered = false;
        }
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
            .find(|&g| self.paths.is_alive(g) && self.has_room(g) && ready(g))?;
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
        self.inflight.values().map(|(_, at)| at + self.rto).min()
    }

    /// Whether every chunk has been acknowledged.
    pub fn is_complete(&self) -> bool {
        self.acked_count == self.chunks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn one_gateway(window: usize) -> Striper {
        Striper::new(
            1 << 30,
            1,
            StripeConfig {
                chunk: 1 << 20,
                window,
                rto: 500 * MS,
            },
        )
    }

    #[test]
    fn the_timeout_follows_round_trips_longer_than_the_configured_one() {
        let mut s = one_gateway(1);
        let mut now = 0;
        // Round trips grow from 400 ms to 1.2 s (a queue filling up): the
        // timeout keeps ahead and nothing is sent twice.
        for rtt in [400, 600, 800, 1000, 1200, 1200, 1200, 1200].map(|m| m * MS) {
            let t = s.poll_transmit(now).expect("room");
            // Look in just before the answer: not expired.
            assert!(s.poll_transmit(now + rtt - MS).is_none(), "rto {}", s.rto());
            now += rtt;
            s.on_ack(t.chunk.seq, now);
        }
        assert_eq!(s.resent, 0);
        assert!(s.rto() >= 1200 * MS, "rto {}", s.rto());
        // Short round trips bring it back down, never below the configured.
        for _ in 0..200 {
            let t = s.poll_transmit(now).expect("room");
            now += 10 * MS;
            s.on_ack(t.chunk.seq, now);
        }
        assert_eq!(s.rto(), 500 * MS);
    }

    #[test]
    fn a_gateway_whose_path_cannot_take_a_chunk_is_passed_over_until_it_can() {
        let cfg = StripeConfig {
            chunk: 1 << 20,
            window: 4,
            rto: 500 * MS,
        };
        let mut s = Striper::new(16 << 20, 3, cfg);
        let mut full = [false, true, false];
        let mut asked = Vec::new();
        let mut sent = Vec::new();
        for _ in 0..4 {
            let t = s
                .poll_transmit_to(0, &mut |g| {
                    asked.push(g);
                    !full[g]
                })
                .expect("gateways 0 and 2 take chunks");
            sent.push((t.gw, t.chunk.seq));
        }
        assert_eq!(sent, [(0, 0), (2, 1), (0, 2), (2, 3)]);
        assert_eq!(
            asked,
            [0, 1, 2, 0, 1, 2],
            "asked in turn, full one each time"
        );
        // None can take one: nothing goes, and the next chunk waits its turn.
        full = [true; 3];
        assert!(s.poll_transmit_to(0, &mut |g| !full[g]).is_none());
        full[1] = false;
        let t = s.poll_transmit_to(0, &mut |g| !full[g]).unwrap();
        assert_eq!((t.gw, t.chunk.seq), (1, 4));
        // Only gateway 1 can take more: it does until its window is full,
        // and is then not asked at all.
        for seq in 5..8 {
            let t = s.poll_transmit_to(0, &mut |g| g == 1).unwrap();
            assert_eq!((t.gw, t.chunk.seq), (1, seq));
        }
        let mut asked = Vec::new();
        let none = s.poll_transmit_to(0, &mut |g| {
            asked.push(g);
            g == 1
        });
        assert!(none.is_none());
        assert_eq!(asked, [2, 0]);
    }

    #[test]
    fn a_lost_chunk_among_answered_ones_does_not_back_off() {
        let mut s = one_gateway(2);
        let lost = s.poll_transmit(0).unwrap();
        let fine = s.poll_transmit(0).unwrap();
        s.on_ack(fine.chunk.seq, 100 * MS);
        let again = s.poll_transmit(500 * MS).unwrap();
        assert_eq!(again.chunk.seq, lost.chunk.seq);
        assert_eq!(s.rto(), 500 * MS);
    }

    #[test]
    fn expiries_back_off_and_resent_chunks_give_no_samples() {
        let mut s = one_gateway(1);
        let t = s.poll_transmit(0).unwrap();
        assert_eq!(s.next_deadline(), Some(500 * MS));
        // Expires at 500 ms: sent again, timeout doubled.
        let again = s.poll_transmit(500 * MS).unwrap();
        assert_eq!(again.chunk.seq, t.chunk.seq);
        assert_eq!(s.rto(), 1000 * MS);
        assert_eq!(s.next_deadline(), Some(1500 * MS));
        let third = s.poll_transmit(1500 * MS).unwrap();
        assert_eq!(third.chunk.seq, t.chunk.seq);
        assert_eq!(s.rto(), 2000 * MS);
        // Its answer is ambiguous (which sending?): no sample, no change.
        s.on_ack(t.chunk.seq, 1600 * MS);
        assert_eq!(s.rto(), 2000 * MS);
        assert_eq!(s.resent, 2);
        // A chunk sent once gives a sample again.
        let u = s.poll_transmit(1600 * MS).unwrap();
        s.on_ack(u.chunk.seq, 1700 * MS);
        assert_eq!(s.rto(), 500 * MS, "100 ms + 4 x 50 ms, raised to the least");
    }

    #[test]
    fn transfers_sharing_gateways_share_the_window_each_with_its_fair_part() {
        let cfg = StripeConfig {
            chunk: 1 << 20,
            window: 4,
            rto: 500 * MS,
        };
        let mut s = Striper::new(64 << 20, 2, cfg);
        let sent = |s: &mut Striper| {
            let mut per = [0; 2];
            while let Some(t) = s.poll_transmit(0) {
                per[t.gw] += 1;
            }
            per
        };
        let others = |transfers, chunks| Others { transfers, chunks };
        // Seven others fill gateway 0 and more: one chunk of its own there.
        // One other with 3 in flight at gateway 1: its fair part, 2.
        s.set_others(0, others(7, 9));
        s.set_others(1, others(1, 3));
        assert_eq!(sent(&mut s), [1, 2], "its part where the others fill it");
        assert_eq!((s.in_flight(0), s.in_flight(1)), (1, 2));
        // The others' chunks are answered: it takes what they leave, up to
        // the window of its own.
        s.set_others(0, others(7, 1));
        s.set_others(1, others(1, 0));
        assert_eq!(sent(&mut s), [2, 2]);
        assert_eq!((s.in_flight(0), s.in_flight(1)), (3, 4));
        s.set_others(0, others(0, 0));
        assert_eq!(sent(&mut s), [1, 0], "never more than the window");
        // An answer frees a place only while the others leave it free.
        assert_eq!(s.path_of(0), Some(0));
        s.set_others(0, others(1, 3));
        s.on_ack(0, MS);
        assert_eq!(sent(&mut s), [0, 0], "3 of its own and 3 of the other's");
        assert_eq!(s.resent, 0);
    }
}
