//! Shared-memory transport: two single-producer single-consumer byte rings in
//! one mapping, plus a unix socket for wake-ups and liveness.
//!
//! ```text
//!  segment file (tmpfs), mapped by both processes
//!  ┌──────────┬──────────┬─────────── … ──┬─────────── … ──┐
//!  │ ctrl 0   │ ctrl 1   │ ring 0 data    │ ring 1 data    │
//!  │ (→acc.)  │ (→init.) │ initiator ─►   │ ◄─ acceptor    │
//!  └──────────┴──────────┴─────────── … ──┴─────────── … ──┘
//!  unix socket: 1-byte doorbells to a side that sleeps; EOF = peer gone
//! ```
//!
//! The polling path is a relaxed/acquire/release dance on two counters: no
//! lock, no allocation and no system call. A side that wants to sleep raises
//! its flag, re-checks the ring, and waits on the socket; the other side
//! rings the doorbell only when it sees that flag.

use crossbeam_utils::CachePadded;
use memmap2::MmapRaw;
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::sys;

/// Bytes before the first ring: the two control blocks, page aligned.
const DATA_START: usize = 4096;

/// One ring's shared counters. `tail` is written by the producer only,
/// `head` by the consumer only; each sits on its own cache line so the two
/// sides do not bounce one line between cores.
#[repr(C)]
struct RingCtrl {
    tail: CachePadded<AtomicU64>,
    head: CachePadded<AtomicU64>,
    reader_sleeping: CachePadded<AtomicU32>,
    writer_waiting: CachePadded<AtomicU32>,
}

const _: () = assert!(2 * std::mem::size_of::<RingCtrl>() <= DATA_START);

/// Total bytes of a segment whose rings hold `cap` bytes each.
pub(crate) fn segment_len(cap: usize) -> usize {
    DATA_START + 2 * cap
}

/// Which end of the segment this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Initiator,
    Acceptor,
}

/// One process's view of a shared-memory connection.
#[derive(Debug)]
pub(crate) struct ShmStream {
    _map: MmapRaw,
    tx: *const RingCtrl,
    tx_data: *mut u8,
    rx: *const RingCtrl,
    rx_data: *const u8,
    cap: u64,
    /// Producer's own copy of its tail, and the last head it read.
    tx_tail: u64,
    tx_head_seen: u64,
    /// Consumer's own copy of its head, and the last tail it read.
    rx_head: u64,
    rx_tail_seen: u64,
    sock: UnixStream,
    peer_gone: bool,
}

// SAFETY: the raw pointers point into `_map`, which the stream owns and which
// stays mapped until the stream is dropped. Only the owning thread touches the
// producer side of `tx` and the consumer side of `rx`; the peer process
// touches the other sides, synchronised through the atomics.
unsafe impl Send for ShmStream {}

impl ShmStream {
    /// Creates a new segment file at `path` with rings of `cap` bytes (a power
    /// of two) and maps it. The caller sends the path to the peer and removes
    /// the file once the peer has mapped it.
    pub(crate) fn create(path: &Path, cap: usize) -> io::Result<(File, MmapRaw)> {
        if !cap.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ring size must be a power of two",
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        file.set_len(segment_len(cap) as u64)?;
        let map = MmapRaw::map_raw(&file)?;
        Ok((file, map))
    }

    /// Maps an existing segment that the initiator created with rings of `cap`
    /// bytes, after checking its size.
    pub(crate) fn open(path: &Path, cap: usize) -> io::Result<MmapRaw> {
        if !cap.is_power_of_two() || cap < 4096 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "bad ring size"));
        }
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        if file.metadata()?.len() != segment_len(cap) as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "segment size does not match its rings",
            ));
        }
        MmapRaw::map_raw(&file)
    }

    /// Wraps a mapped segment and the connected socket into a stream.
    pub(crate) fn new(map: MmapRaw, cap: usize, side: Side, sock: UnixStream) -> io::Result<Self> {
        if map.len() != segment_len(cap) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "bad segment"));
        }
        sock.set_nonblocking(true)?;
        let base = map.as_mut_ptr();
        let ctrl = |i: usize| {
            // SAFETY: both control blocks lie inside the first DATA_START bytes
            // of the mapping (checked by the const assertion above); the
            // mapping is page aligned, which satisfies RingCtrl's alignment.
            unsafe { base.add(i * std::mem::size_of::<RingCtrl>()) as *const RingCtrl }
        };
        let data = |i: usize| {
            // SAFETY: ring i spans DATA_START + i*cap .. DATA_START + (i+1)*cap,
            // inside a mapping of segment_len(cap) bytes (checked above).
            unsafe { base.add(DATA_START + i * cap) }
        };
        let (t, r) = match side {
            Side::Initiator => (0, 1),
            Side::Acceptor => (1, 0),
        };
        let tx = ctrl(t);
        let rx = ctrl(r);
        // SAFETY: tx and rx point to initialised (zero or peer-written) atomics
        // inside the live mapping.
        let (tx_tail, tx_head_seen, rx_head, rx_tail_seen) = unsafe {
            (
                (*tx).tail.load(Ordering::Relaxed),
                (*tx).head.load(Ordering::Acquire),
                (*rx).head.load(Ordering::Relaxed),
                (*rx).tail.load(Ordering::Acquire),
            )
        };
        Ok(ShmStream {
            tx,
            tx_data: data(t),
            rx,
            rx_data: data(r),
            cap: cap as u64,
            tx_tail,
            tx_head_seen,
            rx_head,
            rx_tail_seen,
            sock,
            peer_gone: false,
            _map: map,
        })
    }

    fn tx(&self) -> &RingCtrl {
        // SAFETY: see `unsafe impl Send`: the pointer stays valid while self lives.
        unsafe { &*self.tx }
    }

    fn rx(&self) -> &RingCtrl {
        // SAFETY: as for `tx`.
        unsafe { &*self.rx }
    }

    /// Copies as much of `bufs` as fits into the outgoing ring. Returns the
    /// bytes taken; 0 when the ring is full.
    pub(crate) fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.peer_gone {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        let mut free = self.cap - (self.tx_tail - self.tx_head_seen);
        if (free as usize) < want {
            // SYNC POINT: acquire pairs with the consumer's release of `head`:
            // the bytes it has read out are no longer in use.
            self.tx_head_seen = self.tx().head.load(Ordering::Acquire);
            free = self.cap - (self.tx_tail - self.tx_head_seen);
        }
        let mut n = (free as usize).min(want);
        if n == 0 {
            return Ok(0);
        }
        let mut pos = self.tx_tail;
        for b in bufs {
            if n == 0 {
                break;
            }
            let take = b.len().min(n);
            self.copy_in(pos, &b[..take]);
            pos += take as u64;
            n -= take;
        }
        let written = (pos - self.tx_tail) as usize;
        self.tx_tail = pos;
        // SYNC POINT: release pairs with the consumer's acquire of `tail`: the
        // bytes copied above are visible before the new tail is.
        self.tx().tail.store(pos, Ordering::Release);
        // Dekker fence with the consumer's `reader_sleeping` store + tail load.
        fence(Ordering::SeqCst);
        if self.tx().reader_sleeping.load(Ordering::Relaxed) != 0 {
            self.ring_doorbell(&self.tx().reader_sleeping);
        }
        Ok(written)
    }

    fn copy_in(&mut self, pos: u64, src: &[u8]) {
        let at = (pos % self.cap) as usize;
        let first = src.len().min(self.cap as usize - at);
        // SAFETY: at + first <= cap and src.len() - first <= at, so both copies
        // stay inside ring data of `cap` bytes; the consumer does not read these
        // bytes until the release store of the new tail.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.tx_data.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.tx_data, src.len() - first);
        }
    }

    /// Copies available bytes from the incoming ring into `dst`. `Ok(0)`:
    /// nothing there now. An error once the ring is empty and the peer is gone.
    pub(crate) fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let mut avail = self.rx_tail_seen - self.rx_head;
        if avail == 0 {
            // SYNC POINT: acquire pairs with the producer's release of `tail`.
            self.rx_tail_seen = self.rx().tail.load(Ordering::Acquire);
            avail = self.rx_tail_seen - self.rx_head;
            if avail == 0 {
                if self.peer_gone {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                return Ok(0);
            }
        }
        let n = (avail as usize).min(dst.len());
        let at = (self.rx_head % self.cap) as usize;
        let first = n.min(self.cap as usize - at);
        // SAFETY: the bytes rx_head..rx_head+n were published by the producer's
        // release of tail (acquired above) and lie inside the ring, split at the
        // wrap point; dst holds at least n bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.rx_data.add(at), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(self.rx_data, dst.as_mut_ptr().add(first), n - first);
        }
        self.rx_head += n as u64;
        // SYNC POINT: release pairs with the producer's acquire of `head`: we
        // are done reading these bytes before it may overwrite them.
        self.rx().head.store(self.rx_head, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.rx().writer_waiting.load(Ordering::Relaxed) != 0 {
            self.ring_doorbell(&self.rx().writer_waiting);
        }
        Ok(n)
    }

    fn ring_doorbell(&self, flag: &AtomicU32) {
        if flag.swap(0, Ordering::AcqRel) != 0 {
            // A full socket buffer already holds a wake-up; errors show up as
            // EOF on the next drain.
            let _ = sys::send_vectored(self.sock.as_raw_fd(), &[IoSlice::new(&[1])]);
        }
    }

    /// Readies a sleep until data arrives. Returns false when there is data
    /// already (do not sleep).
    pub(crate) fn arm_read(&mut self) -> bool {
        self.rx().reader_sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let empty = self.rx().tail.load(Ordering::Acquire) == self.rx_head;
        if !empty {
            self.rx().reader_sleeping.store(0, Ordering::Relaxed);
        }
        empty && !self.peer_gone
    }

    /// Readies a sleep until `need` bytes are free in the outgoing ring.
    /// Returns false when they are free already.
    pub(crate) fn arm_write(&mut self, need: usize) -> bool {
        self.tx().writer_waiting.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let used = self.tx_tail - self.tx().head.load(Ordering::Acquire);
        let full = (self.cap - used) < need.min(self.cap as usize) as u64;
        if !full {
            self.tx().writer_waiting.store(0, Ordering::Relaxed);
        }
        full && !self.peer_gone
    }

    /// Ends a sleep: lowers the flags and reads pending doorbells, which also
    /// notices a peer that has gone.
    pub(crate) fn disarm(&mut self) {
        self.rx().reader_sleeping.store(0, Ordering::Relaxed);
        self.tx().writer_waiting.store(0, Ordering::Relaxed);
        self.check_alive();
    }

    /// Reads doorbells off the socket; EOF or reset marks the peer gone.
    pub(crate) fn check_alive(&mut self) {
        let mut buf = [0u8; 64];
        loop {
            match sys::recv(self.sock.as_raw_fd(), &mut buf, false) {
                Ok(Some(0)) | Err(_) => {
                    self.peer_gone = true;
                    return;
                }
                Ok(Some(_)) => continue,
                Ok(None) => return,
            }
        }
    }

    /// The socket to poll while sleeping.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cap: usize) -> (ShmStream, ShmStream, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        let (_f, map_a) = ShmStream::create(&path, cap).unwrap();
        let map_b = ShmStream::open(&path, cap).unwrap();
        let (sa, sb) = UnixStream::pair().unwrap();
        let a = ShmStream::new(map_a, cap, Side::Initiator, sa).unwrap();
        let b = ShmStream::new(map_b, cap, Side::Acceptor, sb).unwrap();
        (a, b, dir)
    }

    #[test]
    fn bytes_cross_the_wrap_point_intact() {
        let (mut a, mut b, _d) = pair(4096);
        let mut expect = Vec::new();
        let mut got = Vec::new();
        let mut buf = [0u8; 777];
        for round in 0..200u32 {
            let chunk: Vec<u8> = (0..(round % 900 + 1)).map(|i| (i ^ round) as u8).collect();
            let mut off = 0;
            while off < chunk.len() {
                off += a.try_write(&[IoSlice::new(&chunk[off..])]).unwrap();
                let n = b.try_read(&mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            expect.extend_from_slice(&chunk);
        }
        loop {
            let n = b.try_read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, expect);
    }

    #[test]
    fn full_ring_takes_nothing_more() {
        let (mut a, mut b, _d) = pair(4096);
        assert_eq!(a.try_write(&[IoSlice::new(&[1u8; 5000])]).unwrap(), 4096);
        assert_eq!(a.try_write(&[IoSlice::new(&[1u8; 1])]).unwrap(), 0);
        let mut buf = [0u8; 100];
        assert_eq!(b.try_read(&mut buf).unwrap(), 100);
        assert_eq!(a.try_write(&[IoSlice::new(&[2u8; 500])]).unwrap(), 100);
    }

    #[test]
    fn sleeping_reader_gets_a_doorbell_and_a_dead_peer_is_seen() {
        let (mut a, mut b, _d) = pair(4096);
        assert!(b.arm_read());
        a.try_write(&[IoSlice::new(b"x")]).unwrap();
        sys::wait_fd(
            b.raw_fd(),
            sys::Interest::Read,
            std::time::Duration::from_secs(5),
        )
        .unwrap();
        b.disarm();
        let mut buf = [0u8; 4];
        assert_eq!(b.try_read(&mut buf).unwrap(), 1);
        drop(a);
        b.check_alive();
        assert!(b.try_read(&mut buf).is_err());
    }
}
