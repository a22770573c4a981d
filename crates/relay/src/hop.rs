//! A relay's buffer between its upstream link (whose sender it grants
//! credit) and its downstream link (whose credit it spends).
//!
//! ```text
//!  upstream ─ arrived(len) ─► [ buffer: holds at most `size` bytes ] ─ forward() ─► downstream
//!           ◄─ returns credit as bytes leave ──┘       └── spends downstream Credit
//! ```

use std::collections::VecDeque;

use crate::credit::{Credit, Overreturn};

/// The upstream sender sent more than the buffer had room for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{len} bytes arrived with {free} bytes of room")]
pub struct Overrun {
    /// Bytes that arrived.
    pub len: u64,
    /// Room there was.
    pub free: u64,
}

/// One relay hop.
#[derive(Debug)]
pub struct Hop {
    size: u64,
    held: VecDeque<u64>,
    held_bytes: u64,
    down: Credit,
    /// Credit owed upstream, not yet returned.
    owed: u64,
}

impl Hop {
    /// A hop with a buffer of `size` bytes (the credit it grants upstream)
    /// in front of a downstream link whose receiver holds `down` bytes.
    pub fn new(size: u64, down: u64) -> Hop {
        Hop {
            size,
            held: VecDeque::new(),
            held_bytes: 0,
            down: Credit::new(down),
            owed: 0,
        }
    }

    /// The credit this hop grants its upstream sender.
    pub fn grants(&self) -> u64 {
        self.size
    }

    /// A packet of `len` bytes came from upstream.
    pub fn arrived(&mut self, len: u64) -> Result<(), Overrun> {
        let free = self.size - self.held_bytes;
        if len > free && self.held_bytes > 0 {
            return Err(Overrun { len, free });
        }
        self.held.push_back(len);
        self.held_bytes += len;
        Ok(())
    }

    /// The next packet to send downstream, if one is held and the
    /// downstream link has credit for it; it leaves the buffer, and its
    /// bytes are owed upstream as credit.
    pub fn forward(&mut self) -> Option<u64> {
        let &len = self.held.front()?;
        if !self.down.may_send(len) {
            return None;
        }
        self.held.pop_front();
        self.held_bytes -= len;
        self.down.sent(len);
        self.owed += len;
        Some(len)
    }

    /// Credit to return upstream now (all that is owed once it reaches
    /// `batch` bytes, so credits do not cost a message per packet).
    pub fn credit_due(&mut self, batch: u64) -> Option<u64> {
        if self.owed >= batch.max(1) || (self.owed > 0 && self.held.is_empty()) {
            Some(std::mem::take(&mut self.owed))
        } else {
            None
        }
    }

    /// The downstream receiver made room for `n` bytes.
    pub fn downstream_returned(&mut self, n: u64) -> Result<(), Overreturn> {
        self.down.returned(n)
    }

    /// Bytes held.
    pub fn held(&self) -> u64 {
        self.held_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hop_forwards_in_order_within_both_credits_and_refuses_overruns() {
        let mut h = Hop::new(4096, 2048);
        h.arrived(1024).unwrap();
        h.arrived(1024).unwrap();
        h.arrived(2048).unwrap();
        assert_eq!(h.arrived(1), Err(Overrun { len: 1, free: 0 }));
        assert_eq!(
            (h.forward(), h.forward(), h.forward()),
            (Some(1024), Some(1024), None)
        );
        // Credit owed upstream once a batch has left (or nothing waits).
        assert_eq!(h.credit_due(4096), None);
        assert_eq!(h.held(), 2048);
        h.downstream_returned(1024).unwrap();
        assert_eq!(h.forward(), None, "1024 of room for 2048");
        h.downstream_returned(1024).unwrap();
        assert_eq!(h.forward(), Some(2048));
        assert_eq!(h.credit_due(4096), Some(4096));
        assert_eq!(h.credit_due(1), None);
        assert!(h.downstream_returned(4096).is_err(), "more than in flight");
        // A packet larger than the whole window goes when nothing else is
        // in flight.
        let mut c = Credit::new(1000);
        assert!(c.may_send(4096));
        c.sent(4096);
        assert!(!c.may_send(1));
        assert_eq!(
            c.returned(5000),
            Err(Overreturn {
                returned: 5000,
                in_flight: 4096
            })
        );
        c.returned(4096).unwrap();
        assert_eq!((c.in_flight(), c.limit()), (0, 1000));
    }
}
