//! Registered regions: the memory of an endpoint that peers write into with
//! puts, and, for shared memory, a target's region mapped by an initiator
//! on the same host.
//!
//! A region's memory is written by peers at any time: that is put mode's
//! contract, as with RDMA. The application therefore never gets a Rust
//! reference to it: it copies bytes in and out ([`Regions::read`],
//! [`Regions::write`]), which at worst sees a mix of old and new bytes when
//! it reads a range a put is writing, and reads a range only after the put
//! that wrote it was notified. A C program gets the raw pointer, under the
//! same contract.

use macrolink_wire::Refusal;

use memmap2::MmapRaw;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::transport::memfd;
use crate::transport::ucx;
use crate::types::RegionKey;

/// Bytes before a region's data: a page whose first word says whether the
/// region is still registered, so that initiators on this host that map it
/// refuse puts after `deregister`, as a remote target would.
const HEAD: usize = 4096;

/// A region another endpoint may write into with a put. Its memory is a
/// sealed memfd, which initiators on the same host are sent and map to
/// write into it themselves, and which UCX registers for its peers.
#[derive(Debug)]
struct Region {
    key: u64,
    len: usize,
    /// Its registration with UCX, made when a UCX peer first asks for it;
    /// dropped (unregistered) before the memory it names.
    ucx: Option<ucx::MemReg>,
    /// Connections (slot, generation) of UCX peers that hold its remote
    /// key: they may write into it until they have taken back the key.
    holders: Vec<(u32, u32)>,
    file: File,
    map: MmapRaw,
}

fn revoked_flag(map: &MmapRaw) -> &AtomicU32 {
    // SAFETY: every region mapping is at least HEAD bytes and page aligned,
    // so its first four bytes are an aligned u32 that lives as long as the
    // mapping; both processes touch it only atomically.
    unsafe { &*(map.as_ptr() as *const AtomicU32) }
}

impl Region {
    fn data(&self) -> *mut u8 {
        // SAFETY: the mapping is HEAD + len bytes long.
        unsafe { self.map.as_mut_ptr().add(HEAD) }
    }
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
    /// Deregistered regions that UCX peers may still write into: kept,
    /// memory and registration, until each holder has taken back the key
    /// (or its connection is gone), so that a late put lands in memory
    /// nobody uses instead of memory given back to the system.
    retired: Vec<Region>,
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
            if k != 0 && self.index(k).is_none() && !self.retired.iter().any(|r| r.key == k) {
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
            ucx: None,
            holders: Vec::new(),
        });
        Ok(RegionKey(key))
    }

    /// Removes a region; `None` when there is none with `key`, else the
    /// UCX peers (connection slot and generation) to tell that the key is
    /// no longer good.
    pub(crate) fn deregister(&mut self, key: RegionKey) -> Option<Vec<(u32, u32)>> {
        let i = self.index(key.0)?;
        let r = self.list.swap_remove(i);
        let holders = r.holders.clone();
        if !holders.is_empty() {
            self.retired.push(r);
        }
        Some(holders)
    }

    /// A UCX peer took back the key of a deregistered region, or its
    /// connection (`slot`, `gen`) is gone: when no holder is left, the
    /// memory goes.
    pub(crate) fn released(&mut self, key: Option<u64>, slot: u32, gen: u32) {
        for r in self.list.iter_mut().chain(self.retired.iter_mut()) {
            if key.is_none_or(|k| k == r.key) {
                r.holders.retain(|h| *h != (slot, gen));
            }
        }
        self.retired.retain(|r| !r.holders.is_empty());
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

    /// The length of the region with `key`.
    pub(crate) fn len(&self, key: RegionKey) -> Option<usize> {
        self.index(key.0).map(|i| self.list[i].len)
    }

    /// The region with `key` as UCX exports it to the holder on connection
    /// (`slot`, `gen`): its length, its address and its packed remote key,
    /// registering it the first time.
    pub(crate) fn export_ucx(
        &mut self,
        key: u64,
        ctx: &std::sync::Arc<ucx::Context>,
        holder: (u32, u32),
    ) -> Result<(usize, u64, &[u8]), Refusal> {
        let i = self.index(key).ok_or(Refusal::BadKey)?;
        let r = &mut self.list[i];
        if r.ucx.is_none() {
            // The head page goes too, so that a region of 0 bytes can be
            // registered; puts are checked against `len` past it.
            let reg = ucx::MemReg::new(ctx, r.map.as_mut_ptr(), r.len + HEAD).map_err(|e| {
                tracing::warn!("cannot register a region with UCX: {e}");
                Refusal::Malformed
            })?;
            r.ucx = Some(reg);
        }
        if !r.holders.contains(&holder) {
            r.holders.push(holder);
        }
        let base = r.data() as u64;
        let reg = r.ucx.as_ref().ok_or(Refusal::Malformed)?;
        Ok((r.len, base, reg.rkey()))
    }

    /// Copies `dst.len()` bytes at `offset` of the region with `key` out.
    /// A range a put is writing meanwhile may come out as a mix of old and
    /// new bytes.
    pub(crate) fn read(&self, key: RegionKey, offset: usize, dst: &mut [u8]) -> Option<()> {
        let r = &self.list[self.index(key.0)?];
        let end = offset.checked_add(dst.len())?;
        if end > r.len {
            return None;
        }
        // No reference to the shared bytes is made, so a peer writing them
        // meanwhile breaks no rule of this process: it only mixes the bytes.
        // SAFETY: `offset..end` lies inside the region's `len` bytes after
        // its head, mapped as long as `r` lives.
        unsafe { std::ptr::copy_nonoverlapping(r.data().add(offset), dst.as_mut_ptr(), dst.len()) };
        Some(())
    }

    /// Copies `src` into the region with `key` at `offset`.
    pub(crate) fn write(&mut self, key: RegionKey, offset: usize, src: &[u8]) -> Option<()> {
        let r = &self.list[self.index(key.0)?];
        let end = offset.checked_add(src.len())?;
        if end > r.len {
            return None;
        }
        // SAFETY: as in `read`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), r.data().add(offset), src.len()) };
        Some(())
    }

    /// The region's first byte and length, for a C program (which reads
    /// and writes it under put mode's contract, as with RDMA).
    pub(crate) fn raw(&self, key: RegionKey) -> Option<(*mut u8, usize)> {
        self.index(key.0)
            .map(|i| (self.list[i].data(), self.list[i].len))
    }

    /// The region at index `i` (from [`check`](Self::check)), for the
    /// receive path to read a put's bytes into while it holds the
    /// endpoint: a slice that lives only for that read.
    pub(crate) fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        let r = &mut self.list[i];
        // The slice is only written into (by a read from the peer's
        // connection) before it is dropped.
        // SAFETY: the mapping is HEAD + len bytes and lives as long as the
        // region; `&mut self` keeps this process to one user of it.
        unsafe { std::slice::from_raw_parts_mut(r.data(), r.len) }
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
        let mut got = [0u8; 6];
        r.read(k, 10, &mut got).unwrap();
        assert_eq!(&got, b"direct");
        assert!(r.read(k, 95, &mut got).is_none(), "past the end");
        assert_eq!(r.deregister(k), Some(Vec::new()));
        assert_eq!(r.deregister(k), None);
        assert_eq!(remote.write(10, b"late"), Err(Refusal::BadKey));
    }
}
