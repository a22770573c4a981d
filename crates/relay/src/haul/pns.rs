//! Packet numbers received, and when an ack is due.

use macrolink_wire::haul::MAX_ACK_RANGES;
use rangemap::RangeInclusiveSet;

use super::Nanos;

/// What the receiving side knows of the peer's packet numbers.
#[derive(Debug, Default)]
pub(crate) struct Received {
    pns: RangeInclusiveSet<u64>,
    largest: Option<(u64, Nanos)>,
    /// Ack-eliciting packets since the last ack.
    unacked: u32,
    /// When the oldest of them arrived.
    since: Option<Nanos>,
    /// A packet arrived out of order: ack at once.
    gap: bool,
}

impl Received {
    pub fn insert(&mut self, pn: u64, now: Nanos, eliciting: bool) {
        let in_order = self.largest.is_none_or(|(l, _)| pn == l + 1);
        if !in_order && eliciting {
            self.gap = true;
        }
        if self.largest.is_none_or(|(l, _)| pn > l) {
            self.largest = Some((pn, now));
        }
        self.pns.insert(pn..=pn);
        while self.pns.iter().count() > MAX_ACK_RANGES {
            let first = self.pns.iter().next().cloned();
            if let Some(r) = first {
                self.pns.remove(r);
            }
        }
        if eliciting {
            self.unacked += 1;
            self.since.get_or_insert(now);
        }
    }

    /// Whether packet `pn` came before (as far as the ranges kept go back).
    pub fn has(&self, pn: u64) -> bool {
        self.pns.contains(&pn)
    }

    /// When an ack must go at the latest.
    pub fn ack_due(&self, max_delay: Nanos) -> Option<Nanos> {
        self.since.map(|t| t + max_delay)
    }

    pub fn ack_needed(&self, now: Nanos, every: u32, max_delay: Nanos) -> bool {
        self.unacked > 0
            && (self.gap
                || self.unacked >= every
                || self.ack_due(max_delay).is_some_and(|t| t <= now))
    }

    /// Time since the newest packet arrived.
    pub fn delay(&self, now: Nanos) -> Nanos {
        self.largest.map_or(0, |(_, t)| now.saturating_sub(t))
    }

    /// Ranges received, newest first.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.pns
            .iter()
            .rev()
            .map(|r| (*r.start(), *r.end()))
            .collect()
    }

    /// An ack went.
    pub fn acked(&mut self) {
        self.unacked = 0;
        self.since = None;
        self.gap = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_asks_for_an_ack_at_once_and_old_ranges_are_dropped_past_the_limit() {
        let mut r = Received::default();
        r.insert(0, 0, true);
        assert!(!r.ack_needed(0, 2, 1000));
        assert!(r.ack_needed(1000, 2, 1000), "the delay ran out");
        r.acked();
        r.insert(2, 5, true);
        assert!(r.ack_needed(5, 2, 1000), "1 is missing");
        assert_eq!(r.ranges(), [(2, 2), (0, 0)]);
        r.acked();
        r.insert(3, 6, false);
        assert!(!r.ack_needed(10_000, 2, 1000), "acks are not acked");
        for pn in (10..10 + 2 * MAX_ACK_RANGES as u64 + 10).step_by(2) {
            r.insert(pn, 7, true);
        }
        let ranges = r.ranges();
        assert_eq!(ranges.len(), MAX_ACK_RANGES);
        assert_eq!(ranges[0].0, 10 + 2 * MAX_ACK_RANGES as u64 + 8);
    }
}
