//! What a link did: counters, as text and JSON.

use serde::Serialize;

/// Counters of one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Packets offered.
    pub offered: u64,
    /// Bytes offered.
    pub bytes_offered: u64,
    /// Packets carried (duplicates count twice).
    pub carried: u64,
    /// Dropped because the queue was full.
    pub queue_drops: u64,
    /// Lost to the loss model.
    pub lost: u64,
    /// Held back by the delay or the rate limit.
    pub delayed: u64,
    /// Sent ahead of packets offered earlier and still on the line.
    pub reordered: u64,
    /// Carried twice.
    pub duplicated: u64,
    /// Carried with a bit flipped.
    pub corrupted: u64,
    /// On the line, not yet due.
    pub in_flight: u64,
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "offered {} ({} bytes), carried {}, queue drops {}, lost {}, delayed {}, reordered {}, duplicated {}, corrupted {}, in flight {}",
            self.offered,
            self.bytes_offered,
            self.carried,
            self.queue_drops,
            self.lost,
            self.delayed,
            self.reordered,
            self.duplicated,
            self.corrupted,
            self.in_flight
        )
    }
}
