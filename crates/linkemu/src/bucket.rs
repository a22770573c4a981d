//! A token bucket with a bounded queue in front of it: when each packet
//! leaves, or that it is dropped.

use std::collections::VecDeque;

use crate::spec::{QueueLimit, Rate};
use crate::Nanos;

const NS: u128 = 1_000_000_000;

/// The bucket's state after the packets accepted so far.
#[derive(Debug)]
pub(crate) struct Bucket {
    rate: Rate,
    /// Tokens (bytes) left when the last accepted packet left.
    tokens: u64,
    /// When the last accepted packet leaves.
    last: Nanos,
    /// Packets not gone yet: when each leaves, and its bytes.
    waiting: VecDeque<(Nanos, u64)>,
    waiting_bytes: u64,
}

impl Bucket {
    pub(crate) fn new(rate: Rate) -> Bucket {
        Bucket {
            tokens: rate.burst,
            rate,
            last: 0,
            waiting: VecDeque::new(),
            waiting_bytes: 0,
        }
    }

    /// When a packet of `len` bytes offered at `now` leaves the bucket, or
    /// `None` when the queue has no room for it (it is dropped).
    pub(crate) fn admit(&mut self, now: Nanos, len: u64) -> Option<Nanos> {
        while self.waiting.front().is_some_and(|&(t, _)| t <= now) {
            if let Some((_, b)) = self.waiting.pop_front() {
                self.waiting_bytes -= b;
            }
        }
        let r = u128::from(self.rate.bytes_per_sec.max(1));
        // A bucket smaller than the packet would never send it.
        let burst = self.rate.burst.max(len);
        let start = now.max(self.last);
        let earned = (u128::from(start - self.last) * r / NS).min(u128::from(burst)) as u64;
        let tokens = (self.tokens + earned).min(burst);
        let (leave, left) = if tokens >= len {
            (start, tokens - len)
        } else {
            let wait = (u128::from(len - tokens) * NS).div_ceil(r) as Nanos;
            (start + wait, 0)
        };
        let fits = match self.rate.queue {
            QueueLimit::Time(t) => leave - now <= t,
            QueueLimit::Bytes(b) => leave == now || self.waiting_bytes + len <= b,
        };
        if !fits {
            return None;
        }
        if leave > now {
            self.waiting.push_back((leave, len));
            self.waiting_bytes += len;
        }
        self.tokens = left;
        self.last = leave;
        Some(leave)
    }
}
