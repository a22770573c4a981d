//! Credit flow control of one data stream: the receiver's region has
//! `slots` chunk-sized slots, the `k`-th chunk of the stream goes into slot
//! `k % slots`, and the sender may have at most `slots` chunks unanswered;
//! the receiver grants a credit for each chunk it has taken out of its slot.
//!
//! ```text
//!   sender                           receiver
//!   may_send()? ── chunk k → slot k % slots ──►  take, then grant 1
//!   granted(n)  ◄───────── credit n ───────────
//! ```
//!
//! A grant of more credit than chunks in flight is a broken peer, not a gift.

/// The sender's view of one stream's slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    slots: u32,
    in_flight: u32,
}

/// A peer granted credit for chunks that were never sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the receiver granted {granted} credits with {in_flight} chunks in flight")]
pub struct Overgrant {
    /// Credits granted.
    pub granted: u32,
    /// Chunks that were in flight.
    pub in_flight: u32,
}

impl Window {
    /// A stream with `slots` slots (at least one).
    pub fn new(slots: u32) -> Window {
        Window {
            slots: slots.max(1),
            in_flight: 0,
        }
    }

    /// Whether a chunk may be sent now.
    pub fn may_send(&self) -> bool {
        self.in_flight < self.slots
    }

    /// A chunk was sent.
    pub fn sent(&mut self) {
        debug_assert!(self.may_send());
        self.in_flight += 1;
    }

    /// The receiver freed `n` slots.
    pub fn granted(&mut self, n: u32) -> Result<(), Overgrant> {
        if n > self.in_flight {
            return Err(Overgrant {
                granted: n,
                in_flight: self.in_flight,
            });
        }
        self.in_flight -= n;
        Ok(())
    }

    /// Chunks sent and not yet answered.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }
}

/// Byte offset in the receiver's region of the `k`-th chunk of a stream
/// with `slots` slots of `chunk` bytes.
pub fn slot_offset(k: u64, slots: u32, chunk: u32) -> u64 {
    (k % u64::from(slots.max(1))) * u64::from(chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_stops_at_the_slots_and_goes_on_with_credit() {
        let mut w = Window::new(3);
        for _ in 0..3 {
            assert!(w.may_send());
            w.sent();
        }
        assert!(!w.may_send());
        w.granted(1).unwrap();
        assert!(w.may_send());
        w.sent();
        w.granted(3).unwrap();
        assert_eq!(w.in_flight(), 0);
        assert_eq!(
            w.granted(1),
            Err(Overgrant {
                granted: 1,
                in_flight: 0
            })
        );
        assert!(Window::new(0).may_send(), "at least one slot");
    }

    #[test]
    fn chunks_take_the_slots_in_turn() {
        let offs: Vec<u64> = (0..5).map(|k| slot_offset(k, 2, 100)).collect();
        assert_eq!(offs, [0, 100, 0, 100, 0]);
        assert_eq!(slot_offset(7, 0, 10), 0);
    }
}
