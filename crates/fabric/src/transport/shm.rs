//! Shared-memory transport: two single-producer single-consumer byte rings in
//! one mapping, a pipe each way for wake-ups and liveness, and a unix
//! socket for descriptors.
//!
//! ```text
//!  segment file (tmpfs), mapped by both processes
//!  ┌──────────┬──────────┬─────────── … ──┬─────────── … ──┐
//!  │ ctrl 0   │ ctrl 1   │ ring 0 data    │ ring 1 data    │
//!  │ (→acc.)  │ (→init.) │ initiator ─►   │ ◄─ acceptor    │
//!  └──────────┴──────────┴─────────── … ──┴─────────── … ──┘
//!  pipes: 1-byte doorbells to a side that sleeps; EOF = peer gone
//!  unix socket: the segment and the pipes' ends at the hello, then regions
//! ```
//!
//! The segment is a sealed memfd the initiator creates and sends over the
//! socket (see [`super::memfd`]): neither side can shrink it under the
//! other. Every counter the peer writes is checked before use (`tail - head`
//! within the ring on both sides); a peer that breaks that is taken as gone.
//!
//! The polling path is a relaxed/acquire/release dance on two counters: no
//! lock, no allocation and no system call. A side that wants to sleep raises
//! its flag, re-checks the ring, and waits on its pipe; the other side
//! rings the doorbell only when it sees that flag (see [`bell`]).
//!
//! Beside each ring's counters sits its offer block: a reader asleep on a
//! large message offers its buffer there, and the sender copies the message
//! straight into it (see [`super::offer`] for its states, [`rendezvous`]
//! for both sides' steps).

use crossbeam_utils::CachePadded;
use memmap2::MmapRaw;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

mod bell;
mod rendezvous;

pub(crate) use bell::Bells;

use super::memfd;
use super::offer::{OfferCtrl, Offers};
use super::sys::{self, Interest};
use super::ByteStream;
use crate::types::Transport;

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

/// Where the offer blocks start: after both rings' counters.
const OFFERS_AT: usize = 2 * std::mem::size_of::<RingCtrl>();

const _: () = assert!(OFFERS_AT + 2 * std::mem::size_of::<OfferCtrl>() <= DATA_START);

/// Smallest ring.
pub(crate) const MIN_RING: usize = 4096;
/// Largest ring.
pub(crate) const MAX_RING: usize = 1 << 30;

/// Total bytes of a segment whose rings hold `cap` bytes each; `None` for a
/// ring size that is not a power of two in `MIN_RING..=MAX_RING`.
pub(crate) fn segment_len(cap: usize) -> Option<usize> {
    if !cap.is_power_of_two() || !(MIN_RING..=MAX_RING).contains(&cap) {
        return None;
    }
    cap.checked_mul(2)?.checked_add(DATA_START)
}

fn bad_ring() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("ring size must be a power of two in {MIN_RING}..={MAX_RING}"),
    )
}

/// The peer wrote counters that no correct peer writes.
fn broken(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("shared-memory peer broke the ring: {what}"),
    )
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
    /// Bytes of each ring: a power of two (checked in `new`), so a place
    /// in the ring is a mask, not a division.
    cap: u64,
    /// Producer's own copy of its tail, and the last head it read.
    tx_tail: u64,
    tx_head_seen: u64,
    /// Consumer's own copy of its head, and the last tail it read.
    rx_head: u64,
    rx_tail_seen: u64,
    /// The head as the producer last saw it published.
    rx_published: u64,
    /// Offers for the outgoing ring (the peer's, taken here) and the
    /// incoming one (ours).
    tx_offer: *const OfferCtrl,
    rx_offer: *const OfferCtrl,
    offers: Offers,
    sock: UnixStream,
    bells: Bells,
    peer_gone: bool,
    /// The sleep's `poll` found nothing on the pipe: the end of the sleep
    /// need not read it.
    bell_quiet: bool,
    /// The kernel reports every ring into a pipe watched edge-triggered
    /// (see [`bell::edge_hears_every_ring`]): the endpoint's wait set
    /// watches ours so.
    edge: bool,
    /// The sleep was in the wait set, which reported the pipe, watched
    /// edge-triggered, rung (cleared as a sleep is readied: a look
    /// outside a sleep says nothing of the next one).
    rang: bool,
    /// Rings the wait set reported, in sleeps or in looks outside them,
    /// left unread since the pipe was last read.
    unheard: u32,
    /// Descriptors the peer sent (regions it lets us map), oldest first.
    fds: VecDeque<OwnedFd>,
}

/// Descriptors kept until asked for; older ones are closed.
const MAX_FDS: usize = 4;

/// Reads of the socket a look for descriptors makes at most.
const TAKE_READS: usize = 64;
/// Bytes read since the head was last published, at least, for a reader
/// that caught up with the writer to publish it.
const PUBLISH_CAUGHT_UP: u64 = 4096;

/// Reported rings left in the pipe before the pipe is read: at two bytes
/// a report at most, what one read of the pipe takes (see `bell`).
const UNHEARD_MAX: u32 = 32;

// SAFETY: the raw pointers point into `_map`, which the stream owns and which
// stays mapped until the stream is dropped. Only the owning thread touches the
// producer side of `tx` and the consumer side of `rx`; the peer process
// touches the other sides, synchronised through the atomics.
unsafe impl Send for ShmStream {}

impl ShmStream {
    /// Creates a new segment with rings of `cap` bytes and maps it. The
    /// caller sends the file to the peer.
    pub(crate) fn create(cap: usize) -> io::Result<(File, MmapRaw)> {
        let len = segment_len(cap).ok_or_else(bad_ring)?;
        let file = memfd::sealed("macrolink-segment", len)?;
        let map = MmapRaw::map_raw(&file)?;
        Ok((file, map))
    }

    /// Maps the segment a peer sent for rings of `cap` bytes, after checking
    /// that it is sealed and of the size those rings need.
    pub(crate) fn open(fd: OwnedFd, cap: usize) -> io::Result<MmapRaw> {
        let len = segment_len(cap).ok_or_else(bad_ring)?;
        let file = memfd::check_sealed(fd, len)?;
        MmapRaw::map_raw(&file)
    }

    /// Wraps a mapped segment, the connected socket and the doorbells into
    /// a stream.
    pub(crate) fn new(
        map: MmapRaw,
        cap: usize,
        side: Side,
        sock: UnixStream,
        bells: Bells,
    ) -> io::Result<Self> {
        if segment_len(cap) != Some(map.len()) {
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
        let offer_at = |i: usize| {
            // SAFETY: both offer blocks lie between OFFERS_AT and DATA_START
            // (the const assertion above); OFFERS_AT and the block size are
            // multiples of the cache line, OfferCtrl's alignment.
            unsafe {
                base.add(OFFERS_AT + i * std::mem::size_of::<OfferCtrl>()) as *const OfferCtrl
            }
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
        // Counters start at zero in a new segment; what the peer may have
        // written there since is read, and checked, when it is used.
        let (tx, rx) = (ctrl(t), ctrl(r));
        let offers = Offers {
            peer_pid: sys::peer_pid(sock.as_raw_fd()),
            ..Offers::default()
        };
        Ok(ShmStream {
            tx_offer: offer_at(t),
            rx_offer: offer_at(r),
            offers,
            tx,
            tx_data: data(t),
            rx,
            rx_data: data(r),
            cap: cap as u64,
            tx_tail: 0,
            tx_head_seen: 0,
            rx_head: 0,
            rx_tail_seen: 0,
            rx_published: 0,
            sock,
            bells,
            peer_gone: false,
            bell_quiet: false,
            edge: bell::edge_hears_every_ring(),
            rang: false,
            unheard: 0,
            fds: VecDeque::new(),
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
    #[inline]
    pub(crate) fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.peer_gone {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        let mut free = self.cap - (self.tx_tail - self.tx_head_seen);
        if (free as usize) < want {
            // SYNC POINT: acquire pairs with the consumer's release of `head`:
            // the bytes it has read out are no longer in use.
            let head = self.tx().head.load(Ordering::Acquire);
            free = self.free_after(head)?;
            self.tx_head_seen = head;
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

    /// Free bytes of the outgoing ring if the consumer's head is `head`:
    /// it may only have moved forward, and never past our tail.
    fn free_after(&mut self, head: u64) -> io::Result<u64> {
        let read = head.wrapping_sub(self.tx_head_seen);
        let used = self.tx_tail.wrapping_sub(head);
        if read > self.cap || used > self.cap {
            self.peer_gone = true;
            return Err(broken("head outside the ring"));
        }
        Ok(self.cap - used)
    }

    fn copy_in(&mut self, pos: u64, src: &[u8]) {
        let at = (pos & (self.cap - 1)) as usize;
        let first = src.len().min(self.cap as usize - at);
        // SAFETY: at + first <= cap and src.len() - first <= at, so both copies
        // stay inside ring data of `cap` bytes; the consumer does not read these
        // bytes until the release store of the new tail.
        unsafe {
            copy_bytes(src.as_ptr(), self.tx_data.add(at), first);
        }
        // Most copies do not wrap: no second call (a call to `memcpy` costs
        // as much as a small message's copy).
        if first < src.len() {
            // SAFETY: as above.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr().add(first),
                    self.tx_data,
                    src.len() - first,
                );
            }
        }
    }

    /// Copies available bytes from the incoming ring into `dst`. `Ok(0)`:
    /// nothing there now. An error once the ring is empty and the peer is gone.
    #[inline]
    pub(crate) fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let mut avail = self.rx_tail_seen - self.rx_head;
        if avail == 0 {
            // SYNC POINT: acquire pairs with the producer's release of `tail`.
            let tail = self.rx().tail.load(Ordering::Acquire);
            avail = tail.wrapping_sub(self.rx_head);
            if avail > self.cap {
                self.peer_gone = true;
                return Err(broken("tail outside the ring"));
            }
            self.rx_tail_seen = tail;
            if avail == 0 {
                if self.peer_gone {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                self.prefetch_next();
                return Ok(0);
            }
        }
        let n = (avail as usize).min(dst.len());
        let at = (self.rx_head & (self.cap - 1)) as usize;
        let first = n.min(self.cap as usize - at);
        // SAFETY: the bytes rx_head..rx_head+n were published by the producer's
        // release of tail (acquired above) and lie inside the ring, split at the
        // wrap point; dst holds at least n bytes.
        unsafe {
            copy_bytes(self.rx_data.add(at), dst.as_mut_ptr(), first);
        }
        if first < n {
            // SAFETY: as above, the part after the wrap point.
            unsafe {
                std::ptr::copy_nonoverlapping(self.rx_data, dst.as_mut_ptr().add(first), n - first);
            }
        }
        self.rx_head += n as u64;
        // A frame's header and payload are two reads, and a stream of small
        // frames many: the head is published when the reader has caught up
        // with the tail it saw after a page or more since it last did, or
        // has read a quarter of the ring, and at the latest when a pass of
        // reads is done (`read_done`) or before the reader waits. Not after
        // each small message: its fence would stand between the message
        // and the application's answer.
        let unpublished = self.rx_head - self.rx_published;
        if (self.rx_head == self.rx_tail_seen && unpublished >= PUBLISH_CAUGHT_UP)
            || unpublished >= self.cap / 4
        {
            self.publish_head();
        }
        Ok(n)
    }

    /// Asks for the line the next frame will be written to while the ring
    /// is empty, so that the data comes with the tail that announces it.
    #[inline(always)]
    fn prefetch_next(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            let at = (self.rx_head & (self.cap - 1)) as usize;
            // SAFETY: at < cap: the address lies inside the ring's data; a
            // prefetch reads nothing the program sees.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    self.rx_data.add(at).cast(),
                );
            }
        }
    }

    /// Reader: tells the writer how far it has read, and wakes it if it
    /// waits for room. Nothing when nothing was read since it last did.
    pub(crate) fn publish_head(&mut self) {
        if self.rx_published == self.rx_head {
            return;
        }
        self.rx_published = self.rx_head;
        // SYNC POINT: release pairs with the producer's acquire of `head`: we
        // are done reading these bytes before it may overwrite them.
        self.rx().head.store(self.rx_head, Ordering::Release);
        // Dekker fence with the producer's `writer_waiting` store + head load.
        fence(Ordering::SeqCst);
        if self.rx().writer_waiting.load(Ordering::Relaxed) != 0 {
            self.ring_doorbell(&self.rx().writer_waiting);
        }
    }

    fn ring_doorbell(&self, flag: &AtomicU32) {
        if flag.swap(0, Ordering::AcqRel) != 0 {
            self.bells.ring();
        }
    }

    /// Readies a sleep until data arrives. Returns false when there is data
    /// already (do not sleep).
    pub(crate) fn arm_read(&mut self) -> bool {
        // A ring a look outside a sleep took is counted, and says nothing
        // of this sleep.
        self.rang = false;
        self.publish_head();
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
        self.rang = false;
        self.tx().writer_waiting.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let head = self.tx().head.load(Ordering::Acquire);
        let used = self.tx_tail.wrapping_sub(head).min(self.cap);
        let full = (self.cap - used) < need.min(self.cap as usize) as u64;
        if !full {
            self.tx().writer_waiting.store(0, Ordering::Relaxed);
        }
        full && !self.peer_gone
    }

    /// Ends a sleep: lowers the flags and takes pending doorbells, which
    /// also notices a peer that has gone. No system call when the sleep's
    /// `poll` found the pipe quiet (a peer that goes makes it readable), or
    /// when a wait set that watches the pipe edge-triggered said it was
    /// rung, and not hung up: the ring is left in the pipe, which is read,
    /// whatever the sleep found, once [`UNHEARD_MAX`] rings were reported
    /// so, in sleeps or in looks outside them (a peer rings at most once a
    /// flag raised, two a sleep, so the pipe never holds more than a read
    /// takes).
    pub(crate) fn disarm(&mut self) {
        self.rx().reader_sleeping.store(0, Ordering::Relaxed);
        self.tx().writer_waiting.store(0, Ordering::Relaxed);
        let quiet = std::mem::take(&mut self.bell_quiet);
        let rang = std::mem::take(&mut self.rang);
        if self.unheard >= UNHEARD_MAX {
            self.check_alive();
        } else if rang {
            self.publish_head();
        } else if !quiet {
            self.check_alive();
        }
    }

    /// A look at the wait set, which watches the pipe edge-triggered,
    /// found it rung, or hung up (`gone`), in a sleep or in a look without
    /// one. A ring is left in the pipe and counted (see
    /// [`disarm`](Self::disarm)). A hang-up is said once: it is heard at
    /// once (every write end of the pipe is closed, and rings left unread
    /// may stand before the end a read would see).
    pub(crate) fn rang(&mut self, gone: bool) {
        if gone {
            self.check_alive();
            self.peer_gone = true;
        } else {
            self.rang = true;
            self.unheard = self.unheard.saturating_add(1);
        }
    }

    /// Whether the pipe may be watched edge-triggered.
    pub(crate) fn edge(&self) -> bool {
        self.edge
    }

    /// The sleep's `poll` found nothing on the pipe.
    pub(crate) fn quiet(&mut self) {
        self.bell_quiet = true;
    }

    /// Takes doorbells off the pipe; its end marks the peer gone.
    pub(crate) fn check_alive(&mut self) {
        self.publish_head();
        self.unheard = 0;
        if self.bells.hear() == bell::Heard::Gone {
            self.peer_gone = true;
        }
    }

    /// Reads the descriptors the peer sent off the socket; EOF or reset
    /// marks the peer gone.
    fn take_fds(&mut self) {
        let mut buf = [0u8; 64];
        // A peer sends a byte with each descriptor; one that floods the
        // socket with bytes alone is read at most this far a call.
        for _ in 0..TAKE_READS {
            match memfd::recv_with_fd(&self.sock, &mut buf) {
                Ok(Some((0, _))) | Err(_) => {
                    self.peer_gone = true;
                    return;
                }
                Ok(Some((n, fd))) => {
                    let Some(fd) = fd else {
                        // A stream socket's read takes all that is there
                        // (it stops early only after descriptors): a short
                        // one emptied it, without a system call to hear so.
                        if n < buf.len() {
                            return;
                        }
                        continue;
                    };
                    if self.fds.len() == MAX_FDS {
                        self.fds.pop_front();
                    }
                    self.fds.push_back(fd);
                }
                Ok(None) => return,
            }
        }
    }

    /// Sends a descriptor to the peer (ahead of the frame that names it),
    /// without waiting: `WouldBlock` when its socket is full, which a
    /// peer that takes what it asked for never lets it be.
    pub(crate) fn send_fd(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        memfd::send_with_fd(&self.sock, &[0], fd)
    }

    /// The oldest descriptor the peer sent and we have not taken yet.
    pub(crate) fn take_fd(&mut self) -> Option<OwnedFd> {
        self.take_fds();
        self.fds.pop_front()
    }

    /// The pipe to poll while sleeping.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.bells.fd()
    }
}

impl ByteStream for ShmStream {
    fn transport(&self) -> Transport {
        Transport::Shm
    }

    fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        ShmStream::try_write(self, bufs)
    }

    fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        ShmStream::try_read(self, dst)
    }

    fn read_done(&mut self) {
        self.publish_head()
    }

    fn raw_fd(&self) -> RawFd {
        ShmStream::raw_fd(self)
    }

    /// A writer waiting for room sleeps until the reader rings.
    fn write_interest(&self) -> Interest {
        Interest::Read
    }

    fn arm_read(&mut self) -> bool {
        ShmStream::arm_read(self)
    }

    fn arm_write(&mut self, need: usize) -> bool {
        ShmStream::arm_write(self, need)
    }

    fn disarm(&mut self) {
        ShmStream::disarm(self)
    }

    fn check_alive(&mut self) {
        ShmStream::check_alive(self)
    }

    fn quiet(&mut self) {
        ShmStream::quiet(self)
    }

    fn rang(&mut self, gone: bool) {
        ShmStream::rang(self, gone)
    }

    fn edge(&self) -> bool {
        ShmStream::edge(self)
    }

    fn send_fd(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        ShmStream::send_fd(self, fd)
    }

    fn take_fd(&mut self) -> Option<OwnedFd> {
        ShmStream::take_fd(self)
    }

    fn offer(&mut self, buf: &mut [u8]) -> bool {
        ShmStream::offer(self, buf)
    }

    fn withdraw(&mut self) -> bool {
        ShmStream::withdraw(self)
    }

    fn take_placed(&mut self, gen: u64, total: u64) -> bool {
        ShmStream::take_placed(self, gen, total)
    }

    fn place(&mut self, payload: &[u8]) -> io::Result<Option<u64>> {
        ShmStream::place(self, payload)
    }

    fn placed(&mut self, gen: u64) {
        ShmStream::placed(self, gen)
    }
}

/// Copies `n` bytes from `src` to `dst`; up to 64 (a small message's
/// header and payload) in two overlapping moves of a fixed size, without
/// the call to `memcpy` and its dispatch on the size, which cost as much
/// as the copy.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable
/// for `n` bytes, the two apart.
#[inline(always)]
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, n: usize) {
    /// Moves a `T` from `src + a` and one from `src + b` to the same
    /// places of `dst`, both read before either is written.
    ///
    /// # Safety
    /// Both ranges of `size_of::<T>()` bytes lie inside the copy.
    #[inline(always)]
    unsafe fn two<T: Copy>(src: *const u8, dst: *mut u8, a: usize, b: usize) {
        // SAFETY: the caller keeps both ranges inside `src` and `dst`;
        // unaligned reads and writes of plain bytes.
        unsafe {
            let x = src.add(a).cast::<T>().read_unaligned();
            let y = src.add(b).cast::<T>().read_unaligned();
            dst.add(a).cast::<T>().write_unaligned(x);
            dst.add(b).cast::<T>().write_unaligned(y);
        }
    }
    // SAFETY: each arm reads and writes only inside the first `n` bytes
    // (its two moves cover 0..n, overlapping in the middle).
    unsafe {
        match n {
            0 => {}
            1..=3 => {
                two::<u8>(src, dst, 0, n - 1);
                two::<u8>(src, dst, n / 2, n / 2);
            }
            4..=7 => two::<u32>(src, dst, 0, n - 4),
            8..=16 => two::<u64>(src, dst, 0, n - 8),
            17..=32 => two::<u128>(src, dst, 0, n - 16),
            33..=64 => two::<[u128; 2]>(src, dst, 0, n - 32),
            _ => std::ptr::copy_nonoverlapping(src, dst, n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::offer::{self, Phase};

    fn pair(cap: usize) -> (ShmStream, ShmStream, ()) {
        let (f, map_a) = ShmStream::create(cap).unwrap();
        let map_b = ShmStream::open(OwnedFd::from(f), cap).unwrap();
        let (sa, sb) = UnixStream::pair().unwrap();
        let (bells_a, ends) = Bells::pair().unwrap();
        let bells_b = Bells::from_peer(ends).unwrap();
        let a = ShmStream::new(map_a, cap, Side::Initiator, sa, bells_a).unwrap();
        let b = ShmStream::new(map_b, cap, Side::Acceptor, sb, bells_b).unwrap();
        (a, b, ())
    }

    #[test]
    fn small_copies_move_exactly_their_bytes() {
        let src: Vec<u8> = (0..200u32).map(|i| (i * 7 + 1) as u8).collect();
        for n in 0..=130 {
            let mut dst = [0xeeu8; 200];
            // SAFETY: both buffers hold 200 bytes, more than n, apart.
            unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), n) };
            assert_eq!(dst[..n], src[..n], "{n} bytes");
            assert!(
                dst[n..].iter().all(|&b| b == 0xee),
                "{n} bytes: wrote past them"
            );
        }
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
                b.read_done();
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
    fn counters_a_peer_breaks_end_the_stream_not_the_process() {
        // A tail past the ring: the reader refuses it before copying.
        let (mut a, mut b, _d) = pair(4096);
        a.try_write(&[IoSlice::new(b"ok")]).unwrap();
        a.tx().tail.store(2 + (1 << 20), Ordering::Release);
        let mut buf = vec![0u8; 2 << 20];
        assert_eq!(
            b.try_read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert!(b.try_read(&mut buf).is_err(), "and the peer is gone");
        // A tail behind the head (it would wrap to a huge amount).
        let (mut a, mut b, _d) = pair(4096);
        a.try_write(&[IoSlice::new(b"ok")]).unwrap();
        assert_eq!(b.try_read(&mut buf).unwrap(), 2);
        a.tx().tail.store(1, Ordering::Release);
        assert!(b.try_read(&mut buf).is_err());
        // A head ahead of the tail: the writer would see more room than
        // the ring has, and write past it.
        let (mut a, b, _d) = pair(4096);
        assert_eq!(a.try_write(&[IoSlice::new(&[7u8; 4096])]).unwrap(), 4096);
        b.rx().head.store(1 << 40, Ordering::Release);
        assert_eq!(
            a.try_write(&[IoSlice::new(&[7u8; 10])]).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        // A segment length that would wrap is refused.
        assert_eq!(segment_len(1 << 63), None);
        assert_eq!(segment_len(3000), None);
        assert_eq!(segment_len(MAX_RING * 2), None);
        assert_eq!(segment_len(4096), Some(4096 * 3));
    }

    #[test]
    fn full_ring_takes_nothing_more() {
        let (mut a, mut b, _d) = pair(4096);
        assert_eq!(a.try_write(&[IoSlice::new(&[1u8; 5000])]).unwrap(), 4096);
        assert_eq!(a.try_write(&[IoSlice::new(&[1u8; 1])]).unwrap(), 0);
        let mut buf = [0u8; 100];
        assert_eq!(b.try_read(&mut buf).unwrap(), 100);
        assert_eq!(
            a.try_write(&[IoSlice::new(&[2u8; 500])]).unwrap(),
            0,
            "the room a pass of reads leaves shows when the pass is done"
        );
        b.read_done();
        assert_eq!(a.try_write(&[IoSlice::new(&[2u8; 500])]).unwrap(), 100);
        // Within a long pass the room shows every quarter of the ring.
        let mut quarter = [0u8; 1024];
        assert_eq!(b.try_read(&mut quarter).unwrap(), 1024);
        assert_eq!(a.try_write(&[IoSlice::new(&[3u8; 2000])]).unwrap(), 1024);
    }

    #[test]
    fn a_writer_waiting_for_room_is_woken_when_the_pass_is_done() {
        let (mut a, mut b, _d) = pair(4096);
        assert_eq!(a.try_write(&[IoSlice::new(&[1u8; 4096])]).unwrap(), 4096);
        assert!(a.arm_write(100), "no room: the writer may sleep");
        let mut buf = [0u8; 200];
        assert_eq!(b.try_read(&mut buf).unwrap(), 200);
        b.read_done();
        sys::wait_fd(
            a.raw_fd(),
            sys::Interest::Read,
            std::time::Duration::from_secs(5),
        )
        .unwrap();
        a.disarm();
        assert_eq!(a.try_write(&[IoSlice::new(&[2u8; 300])]).unwrap(), 200);
    }

    #[test]
    fn an_offered_buffer_takes_the_message_once_and_only_while_offered() {
        let (mut a, mut b, _d) = pair(4096);
        let msg: Vec<u8> = (0..100_000u32).map(|i| (i * 13) as u8).collect();
        // Nothing offered: the sender goes through the ring.
        assert_eq!(a.place(&msg).unwrap(), None);
        let mut buf = vec![0u8; 200_000];
        assert!(b.offer(&mut buf));
        assert!(!b.offer(&mut buf), "one offer at a time");
        let gen = a.place(&msg).unwrap().expect("placed");
        a.placed(gen);
        assert!(b.withdraw());
        assert!(!b.take_placed(gen, 200_001), "longer than the buffer");
        assert!(!b.withdraw(), "withdrawn once");
        assert_eq!(&buf[..msg.len()], &msg[..]);
        assert!(buf[msg.len()..].iter().all(|&x| x == 0));
        // A withdrawn offer is not taken.
        let mut buf2 = vec![0u8; 200_000];
        assert!(b.offer(&mut buf2));
        assert!(!b.withdraw());
        assert_eq!(a.place(&msg).unwrap(), None);
        assert!(buf2.iter().all(|&x| x == 0));
        // An offer too small for the message stays out, untouched, and a
        // reader asleep on it while the sender looked is woken.
        let mut small = vec![0u8; 1000];
        assert!(b.offer(&mut small));
        assert!(!rung(b.raw_fd()));
        b.rx().reader_sleeping.store(1, Ordering::Relaxed);
        assert_eq!(a.place(&msg).unwrap(), None);
        assert!(rung(b.raw_fd()), "the reader is not woken");
        b.rx().reader_sleeping.store(0, Ordering::Relaxed);
        assert!(!b.withdraw());
        assert!(small.iter().all(|&x| x == 0));
    }

    /// Whether a doorbell waits on the pipe `fd`.
    fn rung(fd: RawFd) -> bool {
        let mut p = [sys::pollfd(fd, sys::Interest::Read)];
        let short = std::time::Duration::from_millis(100);
        sys::poll(&mut p, Some(short)).unwrap() == 1
    }

    #[test]
    fn a_sleep_that_found_the_pipe_quiet_ends_without_reading_it() {
        let (mut a, mut b, _d) = pair(4096);
        assert!(b.arm_read());
        a.try_write(&[IoSlice::new(b"x")]).unwrap();
        // The doorbell came after the sleep's `poll` looked.
        b.quiet();
        b.disarm();
        assert!(rung(b.raw_fd()), "left for the next sleep");
        b.disarm();
        assert!(!rung(b.raw_fd()), "read at the end of a sleep that saw it");
        let mut buf = [0u8; 4];
        assert_eq!(b.try_read(&mut buf).unwrap(), 1);
    }

    /// Bytes waiting in the pipe `fd`.
    fn in_pipe(fd: RawFd) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int through the pointer, alive here.
        assert_eq!(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) }, 0);
        n as usize
    }

    #[test]
    fn sleeps_in_a_set_that_watches_the_pipe_by_its_edges_hear_every_ring_and_the_peer_go() {
        let (mut a, mut b, _d) = pair(4096);
        assert_eq!(b.edge(), bell::edge_hears_every_ring());
        let set = sys::Epoll::new().unwrap();
        set.add(b.raw_fd(), 7, b.edge()).unwrap();
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }];
        let long = std::time::Duration::from_secs(5);
        let mut buf = [0u8; 8];
        let mut most = 0;
        for i in 0..5 * UNHEARD_MAX as usize {
            assert!(b.arm_read(), "{i}: nothing to read, the reader sleeps");
            a.try_write(&[IoSlice::new(&[i as u8])]).unwrap();
            assert_eq!(set.wait(&mut ev, long).unwrap(), 1, "{i}: the ring woke it");
            if b.edge() {
                b.rang(ev[0].events & libc::EPOLLHUP as u32 != 0);
            }
            b.disarm();
            most = most.max(in_pipe(b.raw_fd()));
            assert_eq!(b.try_read(&mut buf).unwrap(), 1);
            assert_eq!(buf[0], i as u8);
        }
        // Rings left unread are read now and then, before the pipe holds
        // more than one read takes.
        assert!(most <= 2 * UNHEARD_MAX as usize, "{most} bytes in the pipe");
        assert!(!b.edge() || most > 0, "rings were left unread");
        // The peer goes after a last message and a ring: the sleep that
        // hears both ends with the message read and the peer seen gone.
        assert!(b.arm_read());
        a.try_write(&[IoSlice::new(b"last")]).unwrap();
        drop(a);
        assert_eq!(set.wait(&mut ev, long).unwrap(), 1);
        if b.edge() {
            assert!(ev[0].events & libc::EPOLLHUP as u32 != 0);
            // Said once, here taken by a look outside a sleep; the sleep
            // after it finds the pipe quiet.
            b.rang(true);
            b.quiet();
        }
        b.disarm();
        assert!(!b.arm_read(), "the message waits, the peer is gone");
        b.disarm();
        assert_eq!(b.try_read(&mut buf).unwrap(), 4);
        assert!(b.try_read(&mut buf).is_err(), "then the end");
    }

    #[test]
    fn rings_taken_by_looks_outside_sleeps_are_counted_and_read_in_time() {
        let (mut a, mut b, _d) = pair(4096);
        if !b.edge() {
            // Watched level-triggered, the pipe is never left rung.
            return;
        }
        let set = sys::Epoll::new().unwrap();
        set.add(b.raw_fd(), 7, true).unwrap();
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }];
        let mut buf = [0u8; 8];
        let (mut most, mut reads) = (0, 0);
        for i in 0..5 * UNHEARD_MAX as usize {
            // A sleep ends by something else, its look having found the
            // pipe quiet; the peer writes and rings before the flag is
            // lowered; a look at the set outside a sleep takes the ring,
            // unless the sleep's end read the pipe.
            assert!(b.arm_read(), "{i}: nothing to read, the reader sleeps");
            b.quiet();
            a.try_write(&[IoSlice::new(&[i as u8])]).unwrap();
            b.disarm();
            let zero = std::time::Duration::ZERO;
            if set.wait(&mut ev, zero).unwrap() == 1 {
                assert_eq!(ev[0].events & libc::EPOLLHUP as u32, 0, "{i}");
                b.rang(false);
            } else {
                assert_eq!(in_pipe(b.raw_fd()), 0, "{i}: read, so not rung");
                reads += 1;
            }
            most = most.max(in_pipe(b.raw_fd()));
            assert_eq!(b.try_read(&mut buf).unwrap(), 1);
            assert_eq!(buf[0], i as u8);
        }
        assert!(most <= 2 * UNHEARD_MAX as usize, "{most} bytes in the pipe");
        assert!(reads >= 4, "the pipe was read {reads} times");
        // The last ring a look took says nothing of the next sleep: one
        // ended by a `poll` that found the pipe rung reads it.
        assert!(in_pipe(b.raw_fd()) > 0, "rings left from the looks");
        assert!(b.arm_read());
        a.try_write(&[IoSlice::new(b"x")]).unwrap();
        b.disarm();
        assert_eq!(in_pipe(b.raw_fd()), 0, "read at the end of the sleep");
        assert_eq!(b.try_read(&mut buf).unwrap(), 1);
        // The peer goes: the sleep in the set hears it gone.
        assert!(b.arm_read());
        drop(a);
        let long = std::time::Duration::from_secs(5);
        assert_eq!(set.wait(&mut ev, long).unwrap(), 1);
        assert!(ev[0].events & libc::EPOLLHUP as u32 != 0);
        b.rang(true);
        b.disarm();
        assert!(b.try_read(&mut buf).is_err(), "the peer is gone");
    }

    #[test]
    fn a_sleeping_reader_is_rung_ahead_of_the_copys_end_by_a_lead_its_wake_ups_set() {
        let (mut a, mut b, _d) = pair(4096);
        let msg: Vec<u8> = (0..3 * offer::LEAD_STEP as u32)
            .map(|i| (i * 7) as u8)
            .collect();
        // Places `msg` into a sleeping reader's buffer: whether the reader
        // was rung before the copy's `Placed`.
        let send = |a: &mut ShmStream, b: &mut ShmStream| {
            let mut buf = vec![0u8; msg.len()];
            assert!(b.arm_read());
            assert!(b.offer(&mut buf));
            let gen = a.place(&msg).unwrap().expect("placed");
            let early = rung(b.raw_fd());
            b.disarm();
            a.placed(gen);
            assert!(!rung(b.raw_fd()), "rung once");
            // The reader finds the copy done: it woke late.
            assert!(b.withdraw());
            assert!(b.take_placed(gen, msg.len() as u64));
            assert_eq!(buf, msg);
            early
        };
        assert!(!send(&mut a, &mut b), "no lead yet: rung as the copy ends");
        assert!(send(&mut a, &mut b), "a late reader: rung ahead");
        assert_eq!(a.offers.lead, offer::LEAD_STEP);
        send(&mut a, &mut b);
        // A reader that waits on the copy says how long: the sender is
        // inside the copy (BUSY) until a thread ends it 5 ms on.
        let mut buf = vec![0u8; msg.len()];
        assert!(b.offer(&mut buf));
        let gen = b.offers.gen;
        let words = &a.tx_offer().words;
        let busy = offer::state(gen, offer::Phase::Busy);
        words.state.store(busy, Ordering::Release);
        let waited = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(5));
                words
                    .state
                    .store(offer::state(gen, offer::Phase::Placed), Ordering::Release);
            });
            assert!(b.withdraw());
            let word = b.rx_offer().words.waited.load(Ordering::Relaxed);
            offer::waited_on(word, gen).expect("a word about this offer")
        });
        assert!(waited >= std::time::Duration::from_millis(5), "{waited:?}");
        let word = b.rx_offer().words.waited.load(Ordering::Relaxed);
        a.offers.untold = Some(gen);
        let long = a.offers.lead_after(word);
        assert_eq!(long, offer::next_lead(2 * offer::LEAD_STEP, waited));
        assert!(
            long < 2 * offer::LEAD_STEP,
            "a reader that waited long: a shorter lead"
        );
    }

    #[test]
    fn offers_wait_for_an_empty_ring_and_a_drained_one() {
        let (mut a, mut b, _d) = pair(4096);
        a.try_write(&[IoSlice::new(b"unread")]).unwrap();
        let mut buf = vec![0u8; 100_000];
        assert!(!b.offer(&mut buf), "bytes wait in the ring");
        let mut six = [0u8; 6];
        assert_eq!(b.try_read(&mut six).unwrap(), 6);
        assert!(b.offer(&mut buf));
        // The sender wrote after the offer: not drained, not placed.
        a.try_write(&[IoSlice::new(b"x")]).unwrap();
        assert_eq!(a.place(&[1u8; 70_000]).unwrap(), None);
        assert!(!b.withdraw());
        assert!(buf.iter().all(|&x| x == 0));
    }

    #[test]
    fn an_offer_state_no_sender_writes_is_taken_as_declined() {
        let (_a, mut b, _d) = pair(4096);
        let mut buf = vec![0u8; 100_000];
        for garbage in [u64::MAX, 0, offer::state(99, Phase::Placed)] {
            assert!(b.offer(&mut buf));
            b.rx_offer().words.state.store(garbage, Ordering::Release);
            assert!(!b.withdraw(), "{garbage:#x}");
            assert!(!b.take_placed(99, 10));
        }
    }

    /// A sender that took the offer and stays inside its copy (stopped,
    /// hung, or one that wrote BUSY and nothing more) holds the reader's
    /// withdrawal no longer than the bound: the connection is then broken,
    /// and a sender that goes on writes nothing more into the buffer.
    #[test]
    fn a_sender_that_stays_busy_breaks_the_connection_after_a_bound() {
        let (a, mut b, _d) = pair(4096);
        let mut buf = vec![0u8; 100_000];
        assert!(b.offer(&mut buf));
        let gen = offer::parse(a.tx_offer().words.state.load(Ordering::Acquire)).0;
        // What `place` does before its copy, and then nothing.
        let busy = offer::state(gen, Phase::Busy);
        a.tx_offer().words.state.store(busy, Ordering::Release);
        let t0 = std::time::Instant::now();
        assert!(!b.withdraw(), "nothing was placed");
        let held = t0.elapsed();
        assert!(
            held >= std::time::Duration::from_millis(200)
                && held < std::time::Duration::from_secs(5),
            "withdrawn after {held:?}"
        );
        let mut small = [0u8; 8];
        assert!(b.try_read(&mut small).is_err(), "the connection is broken");
        assert!(!b.offer(&mut buf), "no offer on a broken connection");
        // The offer is taken back: a sender that finds it so copies nothing.
        assert_ne!(a.tx_offer().words.state.load(Ordering::Acquire), busy);
        assert!(buf.iter().all(|&x| x == 0));
    }

    /// A sender that places the message in the instant the reader gives
    /// up waiting for it: the take-back finds it placed, and the message
    /// is the reader's, the connection kept.
    #[test]
    fn a_message_placed_as_the_reader_gives_up_is_kept() {
        let (mut a, mut b, _d) = pair(4096);
        let msg = vec![9u8; 70_000];
        let mut buf = vec![0u8; 100_000];
        assert!(b.offer(&mut buf));
        let gen = a.place(&msg).unwrap().expect("placed");
        a.placed(gen);
        let busy = offer::state(gen, Phase::Busy);
        let held = std::time::Duration::from_secs(11);
        assert!(b.give_up_offer(busy, gen, buf.len() as u64, held));
        assert!(b.take_placed(gen, msg.len() as u64));
        assert!(!b.peer_gone, "the connection is kept");
        assert_eq!(&buf[..msg.len()], &msg[..]);
    }

    /// A peer that floods the socket beside the ring with bytes and no
    /// descriptor does not hold a look for descriptors.
    #[test]
    fn a_look_for_descriptors_is_bounded_under_a_flood_of_bytes() {
        let (a, mut b, _d) = pair(4096);
        let mut flood = a.sock.try_clone().unwrap();
        flood.set_nonblocking(true).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let chunk = [b'z'; 65536];
            let t0 = std::time::Instant::now();
            while !stopped.load(Ordering::Relaxed) && t0.elapsed().as_secs() < 10 {
                let _ = flood.write(&chunk);
            }
        });
        // The socket is full before the look.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let t0 = std::time::Instant::now();
        assert!(b.take_fd().is_none());
        let took = t0.elapsed();
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(
            took < std::time::Duration::from_secs(1),
            "the look took {took:?}"
        );
        assert!(!b.peer_gone, "bytes alone do not end the connection");
    }

    /// A reader that caught up with a small message does not publish its
    /// head at once (the fence would delay its answer); a pass's end, a
    /// page caught up with or a sleep does.
    #[test]
    fn the_head_goes_out_after_a_page_or_a_pass_not_each_small_message() {
        let (mut a, mut b, _d) = pair(1 << 16);
        let head = |a: &ShmStream| a.tx().head.load(Ordering::Acquire);
        let mut buf = [0u8; 64];
        a.try_write(&[IoSlice::new(&[1u8; 64])]).unwrap();
        assert_eq!(b.try_read(&mut buf).unwrap(), 64);
        assert_eq!(head(&a), 0, "published after one small message");
        b.read_done();
        assert_eq!(head(&a), 64, "a pass's end publishes");
        for _ in 0..PUBLISH_CAUGHT_UP / 64 {
            a.try_write(&[IoSlice::new(&[2u8; 64])]).unwrap();
            assert_eq!(b.try_read(&mut buf).unwrap(), 64);
        }
        assert_eq!(head(&a), 64 + PUBLISH_CAUGHT_UP, "a page caught up with");
        a.try_write(&[IoSlice::new(&[3u8; 64])]).unwrap();
        assert_eq!(b.try_read(&mut buf).unwrap(), 64);
        assert!(b.arm_read(), "nothing more to read");
        assert_eq!(head(&a), 128 + PUBLISH_CAUGHT_UP, "a sleep publishes");
        b.disarm();
    }

    /// A peer that takes none of the descriptors sent to it fills its
    /// socket: the send that finds it full says so at once, without
    /// waiting for room that such a peer never makes.
    #[test]
    fn a_descriptor_send_to_a_full_socket_does_not_wait() {
        let (a, _b, _d) = pair(4096);
        let memory = memfd::sealed("region", 4096).unwrap();
        let t0 = std::time::Instant::now();
        let mut sent = 0;
        let err = loop {
            match a.send_fd(std::os::fd::AsFd::as_fd(&memory)) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent < 100_000, "the socket never filled");
        };
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
        assert!(sent > 0);
        let took = t0.elapsed();
        assert!(
            took < std::time::Duration::from_secs(2),
            "{sent} descriptors and a full socket took {took:?}"
        );
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
