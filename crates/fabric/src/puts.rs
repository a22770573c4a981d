//! The initiator's table of puts in flight: which are placed, refused,
//! lost, or still waiting for their answer.

use macrolink_wire::Refusal;

use crate::types::Addr;

/// Where a posted put stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PutStatus {
    Pending { slot: u32, gen: u32 },
    Done,
    Refused(Refusal),
    Lost(Addr),
}

/// Puts in flight, by sequence number, in a fixed ring: posting never
/// allocates. A result is kept until `CAP` later puts have been posted.
#[derive(Debug)]
pub(crate) struct PutTable {
    entries: Box<[(u64, PutStatus)]>,
    next: u64,
}

const CAP: usize = 1024;

impl PutTable {
    pub(crate) fn new() -> Self {
        PutTable {
            entries: vec![(u64::MAX, PutStatus::Done); CAP].into_boxed_slice(),
            next: 0,
        }
    }

    /// The sequence number the next put will take, and whether its slot is
    /// still busy with an older put.
    pub(crate) fn next_busy(&self) -> bool {
        matches!(
            self.entries[self.next as usize % CAP].1,
            PutStatus::Pending { .. }
        )
    }

    /// The put still pending in the slot the next put will take, if any.
    pub(crate) fn oldest_busy(&self) -> Option<u64> {
        let e = self.entries[self.next as usize % CAP];
        matches!(e.1, PutStatus::Pending { .. }).then_some(e.0)
    }

    pub(crate) fn post(&mut self, slot: u32, gen: u32) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.entries[seq as usize % CAP] = (seq, PutStatus::Pending { slot, gen });
        seq
    }

    /// Records the answer to put `seq`; false if no such put is pending.
    pub(crate) fn complete(&mut self, seq: u64, status: PutStatus) -> bool {
        let e = &mut self.entries[seq as usize % CAP];
        if e.0 == seq && matches!(e.1, PutStatus::Pending { .. }) {
            e.1 = status;
            true
        } else {
            false
        }
    }

    /// Status of put `seq`; `Done` when it is too old to be kept.
    pub(crate) fn status(&self, seq: u64) -> PutStatus {
        let e = self.entries[seq as usize % CAP];
        if e.0 == seq {
            e.1
        } else {
            PutStatus::Done
        }
    }

    /// Marks every put pending on connection (`slot`, `gen`) and posted up
    /// to `last` as placed: a flush of that connection has completed them.
    pub(crate) fn flushed(&mut self, slot: u32, gen: u32, last: u64) {
        for e in self.entries.iter_mut() {
            if e.0 <= last && e.1 == (PutStatus::Pending { slot, gen }) {
                e.1 = PutStatus::Done;
            }
        }
    }

    /// The sequence number of the last put posted, if any.
    #[cfg(test)]
    pub(crate) fn last(&self) -> Option<u64> {
        self.next.checked_sub(1)
    }

    /// Marks every put pending on a lost connection (to `peer`) as lost.
    pub(crate) fn lose(&mut self, slot: u32, gen: u32, peer: Addr) {
        for e in self.entries.iter_mut() {
            if e.1 == (PutStatus::Pending { slot, gen }) {
                e.1 = PutStatus::Lost(peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_table_tracks_answers_and_losses() {
        let mut t = PutTable::new();
        let a = t.post(3, 1);
        let b = t.post(4, 1);
        assert!(t.complete(a, PutStatus::Done));
        assert!(!t.complete(a, PutStatus::Done), "answered twice");
        t.lose(4, 1, Addr::new(2, 2));
        assert_eq!(t.status(b), PutStatus::Lost(Addr::new(2, 2)));
        assert_eq!(t.status(a), PutStatus::Done);
    }

    #[test]
    fn a_flush_completes_what_its_connection_posted_before_it() {
        let mut t = PutTable::new();
        let a = t.post(1, 1);
        let other = t.post(2, 1);
        let b = t.post(1, 1);
        let last = t.last().unwrap();
        let c = t.post(1, 1);
        t.flushed(1, 1, last);
        assert_eq!(t.status(a), PutStatus::Done);
        assert_eq!(t.status(b), PutStatus::Done);
        assert_eq!(t.status(c), PutStatus::Pending { slot: 1, gen: 1 });
        assert_eq!(t.status(other), PutStatus::Pending { slot: 2, gen: 1 });
    }
}
