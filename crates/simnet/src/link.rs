//! One-way links: what a message meets between two nodes.
//!
//! ```text
//!  send ──► loss? ──► queue (tail drop past its limit) ──► wire (bytes / rate)
//!                                  ──► delay + jitter ──► (in order, unless reorder) ──► delivery
//! ```

use crate::Nanos;

/// How much a link's queue holds before it drops new messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueLimit {
    /// Bytes waiting to go on the wire.
    Bytes(u64),
    /// Time the last message would wait before it goes on the wire.
    Time(Nanos),
}

/// What a link does to messages.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkSpec {
    /// One-way propagation delay.
    pub delay: Nanos,
    /// Extra delay drawn uniformly from `0..=jitter` for each message.
    pub jitter: Nanos,
    /// Bytes per second on the wire (`None`: no serialisation).
    pub rate: Option<u64>,
    /// The queue in front of the wire (`None`: unbounded).
    pub queue: Option<QueueLimit>,
    /// Probability that a message is lost.
    pub loss: f64,
    /// Whether jitter may deliver a message before one sent earlier.
    pub reorder: bool,
}

impl LinkSpec {
    /// A link of `delay`, no rate limit, no jitter, no loss, in order.
    pub fn new(delay: Nanos) -> LinkSpec {
        LinkSpec {
            delay,
            jitter: 0,
            rate: None,
            queue: None,
            loss: 0.0,
            reorder: false,
        }
    }

    /// With a rate, in bytes per second.
    pub fn rate(self, bytes_per_sec: u64) -> LinkSpec {
        LinkSpec {
            rate: Some(bytes_per_sec.max(1)),
            ..self
        }
    }

    /// With a rate, in bits per second.
    pub fn bits_per_sec(self, bits: u64) -> LinkSpec {
        self.rate(bits / 8)
    }

    /// With jitter up to `jitter`.
    pub fn jitter(self, jitter: Nanos) -> LinkSpec {
        LinkSpec { jitter, ..self }
    }

    /// With a queue limit.
    pub fn queue(self, limit: QueueLimit) -> LinkSpec {
        LinkSpec {
            queue: Some(limit),
            ..self
        }
    }

    /// With loss probability `p`.
    pub fn loss(self, p: f64) -> LinkSpec {
        LinkSpec {
            loss: p.clamp(0.0, 1.0),
            ..self
        }
    }

    /// Whether jitter may reorder.
    pub fn reorder(self, reorder: bool) -> LinkSpec {
        LinkSpec { reorder, ..self }
    }

    /// Time `bytes` take on the wire.
    pub fn wire_time(&self, bytes: u64) -> Nanos {
        match self.rate {
            Some(r) => ((bytes as u128 * 1_000_000_000) / r as u128) as Nanos,
            None => 0,
        }
    }
}

/// What a link did with the messages sent over it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Messages sent.
    pub sent: u64,
    /// Messages delivered.
    pub delivered: u64,
    /// Bytes delivered.
    pub bytes: u64,
    /// Lost to the loss probability.
    pub lost: u64,
    /// Dropped because the queue was full.
    pub queue_drops: u64,
    /// Dropped because a node at either end was dead or the link was cut.
    pub dropped_down: u64,
    /// Delivered later than a message sent after them.
    pub reordered: u64,
}

/// A link in use.
#[derive(Clone, Debug)]
pub(crate) struct Link {
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) spec: LinkSpec,
    /// When the wire is free.
    pub(crate) busy_until: Nanos,
    /// The latest arrival scheduled so far.
    pub(crate) last_arrival: Nanos,
    /// The sending order of the last message delivered.
    pub(crate) last_delivered: u64,
    /// Spells in which the link carries nothing.
    pub(crate) cuts: Vec<(Nanos, Nanos)>,
    pub(crate) stats: LinkStats,
}

impl Link {
    pub(crate) fn new(from: usize, to: usize, spec: LinkSpec) -> Link {
        Link {
            from,
            to,
            spec,
            busy_until: 0,
            last_arrival: 0,
            last_delivered: 0,
            cuts: Vec::new(),
            stats: LinkStats::default(),
        }
    }

    pub(crate) fn is_cut(&self, at: Nanos) -> bool {
        self.cuts.iter().any(|&(f, u)| f <= at && at < u)
    }

    /// Whether a message of `bytes` sent at `now` finds room in the queue.
    pub(crate) fn has_room(&self, now: Nanos, bytes: u64) -> bool {
        let wait = self.busy_until.saturating_sub(now);
        match self.spec.queue {
            None => true,
            Some(QueueLimit::Time(t)) => wait <= t,
            Some(QueueLimit::Bytes(b)) => {
                let queued = match self.spec.rate {
                    Some(r) => (wait as u128 * r as u128 / 1_000_000_000) as u64,
                    None => 0,
                };
                queued + bytes <= b
            }
        }
    }
}
