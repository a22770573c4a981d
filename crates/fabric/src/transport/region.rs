//! Registered regions (targets of puts) and the initiator's table of puts in
//! flight.

use macrolink_wire::Refusal;

use memmap2::MmapRaw;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::transport::memfd;
use crate::types::{Addr, RegionKey};

/// Bytes before a region's data: a page whose first word says whether the
/// region is still registered, so that initiators on this host that map it
/// refuse puts after `deregister`, as a remote target would.
const HEAD: usize = 4096;

/// A region another endpoint may write into with a put. Its memory is a
/// sealed memfd, which initiators on the same host are sent and map to
/// write into it themselves.
#[derive(Debug)]
struct Region {
    key: u64,
    len: usize,
    file: File,
    map: MmapRaw,
}

fn revoked_flag(map: &MmapRaw) -> &AtomicU32 {
    // SAFETY: every region mapping is at least HEAD bytes and page aligned,
    // so its first four bytes are an aligned u32 that lives as long as the
    // mapping; both processes touch it only atomically.
    unsafe { &*(map.as_ptr() as *const AtomicU32) }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Initiators that mapped it keep their pages, and see this.
        revoked_flag(&self.map).store(1, Ordering::Release);
    }
}

/// The regions of one endpoint.
#[derive(Debug, Default)]
pub(crate) struct Regions {
    list: Vec<Region>,
}

fn random_u64() -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(u64::from_le_bytes(b))
}

fn map_len(len: usize) -> std::io::Result<usize> {
    len.checked_add(HEAD)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "region too large"))
}

impl Regions {
    pub(crate) fn new() -> Regions {
        Regions::default()
    }

    pub(crate) fn register(&mut self, len: usize) -> std::io::Result<RegionKey> {
        let key = loop {
            let k = random_u64()?;
            if k != 0 && self.index(k).is_none() {
                break k;
            }
        };
        let file = memfd::sealed("macrolink-region", map_len(len)?)?;
        let map = MmapRaw::map_raw(&file)?;
        self.list.push(Region {
            key,
            len,
            file,
            map,
        });
        Ok(RegionKey(key))
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
            Some(end) if end <= self.list[i].len as u64 => Ok(i),
            _ => Err(Refusal::OutOfBounds),
        }
    }

    /// Length and memory (to send to an initiator) of the region with `key`.
    pub(crate) fn backing(&self, key: u64) -> Option<(usize, &File)> {
        self.index(key)
            .map(|i| (self.list[i].len, &self.list[i].file))
    }

    /// Peers on this host may write into a region at any time: that is put
    /// mode's contract, as with RDMA; the application reads a range only
    /// after the put that wrote it was notified.
    fn slice(&self, i: usize) -> &[u8] {
        let r = &self.list[i];
        // SAFETY: the mapping is HEAD + len bytes and lives as long as the
        // region; concurrent peer writes are the contract above.
        unsafe { std::slice::from_raw_parts(r.map.as_ptr().add(HEAD), r.len) }
    }

    pub(crate) fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        let r = &mut self.list[i];
        // SAFETY: as in `slice`; `&mut self` keeps this process to one
        // writer.
        unsafe { std::slice::from_raw_parts_mut(r.map.as_mut_ptr().add(HEAD), r.len) }
    }

    pub(crate) fn get(&self, key: RegionKey) -> Option<&[u8]> {
        self.index(key.0).map(|i| self.slice(i))
    }

    pub(crate) fn get_mut(&mut self, key: RegionKey) -> Option<&mut [u8]> {
        self.index(key.0).map(|i| self.slot_mut(i))
    }
}

/// A target's region mapped into this process for one-sided puts.
#[derive(Debug)]
pub(crate) struct RemoteRegion {
    pub(crate) key: u64,
    pub(crate) len: usize,
    map: MmapRaw,
}

impl RemoteRegion {
    /// Maps the memory a target sent for region `key` of `len` bytes, after
    /// checking that it is sealed and of that size.
    pub(crate) fn map(key: u64, len: usize, fd: OwnedFd) -> std::io::Result<Self> {
        let file = memfd::check_sealed(fd, map_len(len)?)?;
        let map = MmapRaw::map_raw(&file)?;
        Ok(RemoteRegion { key, len, map })
    }

    /// Whether the target has deregistered the region.
    pub(crate) fn revoked(&self) -> bool {
        revoked_flag(&self.map).load(Ordering::Acquire) != 0
    }

    /// Copies `data` to `offset`; the caller has checked the bounds.
    #[cfg(test)]
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> Result<(), Refusal> {
        if self.revoked() {
            return Err(Refusal::BadKey);
        }
        self.fill(offset, data.len(), |dst| {
            dst.copy_from_slice(data);
            Ok(())
        })
        .map_err(|_| Refusal::Malformed)
    }

    /// Lets `fill` write the `len` bytes at `offset` in place; the caller
    /// has checked the bounds and that the region is not revoked.
    pub(crate) fn fill(
        &self,
        offset: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        assert!(offset + len <= self.len, "bounds checked by the caller");
        // The target process may read these bytes concurrently, which put
        // mode leaves to the application (it reads after notification).
        // SAFETY: in bounds (asserted) of the HEAD + len bytes mapped; the
        // mapping lives as long as self; `&mut` use of the endpoint keeps
        // other slices of it away while `fill` runs.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(HEAD + offset), len)
        };
        fill(dst)
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
    fn whole_put_is_checked_before_writing_and_a_revoked_region_takes_none() {
        let mut r = Regions::new();
        let k = r.register(100).unwrap();
        assert!(r.check(k.0, 0, 100).is_ok());
        assert_eq!(r.check(k.0, 1, 100), Err(Refusal::OutOfBounds));
        assert_eq!(r.check(k.0, u64::MAX, 2), Err(Refusal::OutOfBounds));
        assert_eq!(r.check(k.0 ^ 1, 0, 1), Err(Refusal::BadKey));
        let (len, file) = r.backing(k.0).unwrap();
        let fd = OwnedFd::from(file.try_clone().unwrap());
        assert!(RemoteRegion::map(k.0, len + 1, fd.try_clone().unwrap()).is_err());
        let remote = RemoteRegion::map(k.0, len, fd).unwrap();
        remote.write(10, b"direct").unwrap();
        assert_eq!(&r.get(k).unwrap()[10..16], b"direct");
        assert!(r.deregister(k));
        assert_eq!(remote.write(10, b"late"), Err(Refusal::BadKey));
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
