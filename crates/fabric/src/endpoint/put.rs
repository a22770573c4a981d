//! Registered regions (targets of puts) and the initiator's table of puts in
//! flight.

use macrolink_wire::Refusal;

use crate::types::{Addr, RegionKey};

/// A region another endpoint may write into with a put.
#[derive(Debug)]
struct Region {
    key: u64,
    mem: Box<[u8]>,
}

/// The regions of one endpoint.
#[derive(Debug, Default)]
pub(crate) struct Regions {
    list: Vec<Region>,
}

impl Regions {
    pub(crate) fn register(&mut self, len: usize) -> std::io::Result<RegionKey> {
        loop {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
            let key = u64::from_le_bytes(b);
            if key != 0 && self.index(key).is_none() {
                self.list.push(Region {
                    key,
                    mem: vec![0u8; len].into_boxed_slice(),
                });
                return Ok(RegionKey(key));
            }
        }
    }

    pub(crate) fn deregister(&mut self, key: RegionKey) -> bool {
        let before = self.list.len();
        self.list.retain(|r| r.key != key.0);
        self.list.len() != before
    }

    fn index(&self, key: u64) -> Option<usize> {
        self.list.iter().position(|r| r.key == key)
    }

    /// Checks a whole put before any byte of it is written.
    pub(crate) fn check(&self, key: u64, offset: u64, len: u64) -> Result<usize, Refusal> {
        let i = self.index(key).ok_or(Refusal::BadKey)?;
        match offset.checked_add(len) {
            Some(end) if end <= self.list[i].mem.len() as u64 => Ok(i),
            _ => Err(Refusal::OutOfBounds),
        }
    }

    pub(crate) fn get(&self, key: RegionKey) -> Option<&[u8]> {
        self.index(key.0).map(|i| &*self.list[i].mem)
    }

    pub(crate) fn get_mut(&mut self, key: RegionKey) -> Option<&mut [u8]> {
        self.index(key.0).map(|i| &mut *self.list[i].mem)
    }

    pub(crate) fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.list[i].mem
    }
}

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
    fn whole_put_is_checked_before_writing() {
        let mut r = Regions::default();
        let k = r.register(100).unwrap();
        assert!(r.check(k.0, 0, 100).is_ok());
        assert_eq!(r.check(k.0, 1, 100), Err(Refusal::OutOfBounds));
        assert_eq!(r.check(k.0, u64::MAX, 2), Err(Refusal::OutOfBounds));
        assert_eq!(r.check(k.0 ^ 1, 0, 1), Err(Refusal::BadKey));
    }

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
}
