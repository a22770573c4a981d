//! The bulk data path: one transfer's chunks, dealt round-robin over
//! streams; each stream is an endpoint pair on the fabric.
//!
//! ```text
//!  sender (reads the file)                 receiver (writes the file)
//!  ───────────────────────                 ──────────────────────────
//!  put_from(slot k % slots) ──────────────► region [slot] (shm: in place)
//!      pread straight into the slot          PutPlaced{offset} → pwrite
//!  waits when every slot is full ◄──────── credit (1 slot free), reliable
//! ```
//!
//! Chunk `s + k·n` travels as the `k`-th chunk of stream `s` of `n`; puts on
//! one connection arrive in order, so the receiver knows each chunk's place
//! in the file without a header. Both ends hash every chunk.

use macrolink_fabric::{
    Addr, Completion, Endpoint, EndpointConfig, IoBuf, Mode, Node, RecvKind, RegionKey, Target,
    Transport,
};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::credit::{slot_offset, Window};
use crate::ops::{code_of, Failure};
use crate::proto::{Code, Shape, StreamEnd};
use crate::sums::{self, Collector, Digest};
use std::thread;

/// How often a waiting stream looks at the abort flag.
const TICK: Duration = Duration::from_millis(100);
/// A peer that sends nothing for this long is taken for gone.
const SILENCE: Duration = Duration::from_secs(30);

/// Why a stream stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// Reading or writing the file failed.
    #[error("{0}")]
    File(#[source] io::Error),
    /// The fabric failed (the peer went away).
    #[error("data stream: {0}")]
    Fabric(#[from] macrolink_fabric::Error),
    /// The peer broke the data protocol.
    #[error("data stream: {0}")]
    Protocol(String),
    /// Another stream of the transfer failed, or the transfer was cancelled.
    #[error("cancelled")]
    Aborted,
    /// The peer sent nothing for too long.
    #[error("data stream: no traffic for {0:?}")]
    Silent(Duration),
}

/// Where received chunks go.
pub trait Sink: Sync {
    /// Writes `data` at `offset`.
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
}

impl Sink for File {
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, data, offset)
    }
}

/// A sink that keeps nothing: reads measured for their own sake.
#[derive(Clone, Copy, Debug, Default)]
pub struct Discard;

impl Sink for Discard {
    fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
        Ok(())
    }
}

/// A source of bytes that need no reading: the 8-byte word at offset
/// `8·w` holds `w` (little-endian), so a reader can check any byte.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pattern;

impl Pattern {
    /// The byte at `offset`.
    pub fn byte(offset: u64) -> u8 {
        ((offset / 8) >> ((offset % 8) * 8)) as u8
    }

    /// Fills `buf` with the bytes from `offset`.
    pub fn fill(buf: &mut [u8], offset: u64) {
        let total = buf.len();
        let head = ((8 - offset % 8) % 8).min(total as u64) as usize;
        let (first, rest) = buf.split_at_mut(head);
        for (i, b) in first.iter_mut().enumerate() {
            *b = Pattern::byte(offset + i as u64);
        }
        let start = offset + head as u64;
        let mut words = rest.chunks_exact_mut(8);
        for (w, out) in (start / 8..).zip(&mut words) {
            out.copy_from_slice(&w.to_le_bytes());
        }
        let tail = words.into_remainder();
        let tail_off = offset + (total - tail.len()) as u64;
        for (i, b) in tail.iter_mut().enumerate() {
            *b = Pattern::byte(tail_off + i as u64);
        }
    }
}

impl Source for Pattern {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        Pattern::fill(buf, offset);
        Ok(())
    }
}

/// Where sent chunks come from.
pub trait Source: Sync {
    /// Fills `buf` from `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl Source for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

/// What one transfer's streams share: progress, and a flag any of them
/// raises to stop the others.
#[derive(Debug, Default)]
pub struct Shared {
    /// Bytes moved so far (a counter several transfers may share).
    pub bytes: std::sync::Arc<AtomicU64>,
    /// Set to stop every stream.
    pub abort: AtomicBool,
    /// Bytes per second the streams together may move, if limited.
    pub limit: Option<Pace>,
    /// Hash nothing (the transfer is not verified end to end).
    pub no_digests: bool,
}

/// A rate limit shared by a transfer's streams.
#[derive(Debug)]
pub struct Pace {
    /// When the first bytes were counted: the time a transfer takes to set
    /// up (connecting, opening, resuming) is not a credit it may later
    /// spend in a burst above the rate.
    start: std::sync::OnceLock<std::time::Instant>,
    rate: u64,
    moved: AtomicU64,
}

impl Pace {
    /// At most `rate` bytes per second from the first bytes on.
    pub fn new(rate: u64) -> Pace {
        Pace {
            start: std::sync::OnceLock::new(),
            rate: rate.max(1),
            moved: AtomicU64::new(0),
        }
    }

    /// Counts `n` bytes about to move and sleeps until they may.
    fn take(&self, n: u64, shared: &Shared) -> Result<(), DataError> {
        let start = *self.start.get_or_init(std::time::Instant::now);
        let moved = self.moved.fetch_add(n, Ordering::Relaxed) + n;
        let due = Duration::from_secs_f64(moved as f64 / self.rate as f64);
        while let Some(wait) = due.checked_sub(start.elapsed()) {
            shared.check()?;
            std::thread::sleep(wait.min(TICK));
        }
        Ok(())
    }
}

impl Shared {
    /// A transfer that counts its bytes on `bytes`.
    pub fn counting(bytes: std::sync::Arc<AtomicU64>, limit: Option<u64>) -> Shared {
        Shared {
            bytes,
            abort: AtomicBool::new(false),
            limit: limit.map(Pace::new),
            no_digests: false,
        }
    }

    /// The same, hashing nothing when `skip` (no end-to-end check).
    pub fn skipping_digests(self, skip: bool) -> Shared {
        Shared {
            no_digests: skip,
            ..self
        }
    }

    pub(crate) fn digest(&self, data: &[u8]) -> Digest {
        if self.no_digests {
            [0; 16]
        } else {
            sums::chunk(data)
        }
    }

    /// Passes a stream's result on; a failure stops the other streams.
    pub(crate) fn stop_others_on_error<T>(&self, r: Result<T, DataError>) -> Result<T, DataError> {
        if r.is_err() {
            self.abort.store(true, Ordering::Relaxed);
        }
        r
    }

    pub(crate) fn pace(&self, n: usize) -> Result<(), DataError> {
        match &self.limit {
            Some(p) => p.take(n as u64, self),
            None => Ok(()),
        }
    }

    fn check(&self) -> Result<(), DataError> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(DataError::Aborted);
        }
        Ok(())
    }
}

/// Settings of data endpoints: waiting completion, so a stream that waits
/// on the disk or the peer burns no core.
pub fn endpoint_config() -> EndpointConfig {
    EndpointConfig {
        completion: Completion::Wait,
        tokens: 16,
        token_size: 4096,
        ..EndpointConfig::default()
    }
}

/// A stream's receiving end: an endpoint with a registered region.
#[derive(Debug)]
pub struct Receiver {
    ep: Endpoint,
    key: RegionKey,
}

impl Receiver {
    /// Opens endpoint `id` of `node` with a region for `shape`, to hear
    /// only the sender on node `peer` that knows the region's key (which
    /// goes to the sender over the authenticated contact connection).
    pub fn open(
        node: &Node,
        id: u32,
        peer: u32,
        shape: &Shape,
    ) -> macrolink_fabric::Result<Receiver> {
        let mut ep = node.open(id, endpoint_config())?;
        let key = ep.register(shape.region_len())?;
        ep.bind_session(peer, key.0);
        Ok(Receiver { ep, key })
    }

    /// What the sender needs to reach it.
    pub fn end(&self) -> StreamEnd {
        StreamEnd {
            ep: self.ep.addr().ep,
            key: self.key.0,
        }
    }

    /// Receives stream `s` of `n` of `shape` into `sink`; returns the
    /// digests of its chunks by chunk index.
    pub fn run(
        mut self,
        shape: &Shape,
        s: u32,
        n: u32,
        sink: &dyn Sink,
        shared: &Shared,
    ) -> Result<Vec<(u64, Digest)>, DataError> {
        shared.stop_others_on_error(self.receive(shape, s, n, sink, shared))
    }

    fn receive(
        &mut self,
        shape: &Shape,
        s: u32,
        n: u32,
        sink: &dyn Sink,
        shared: &Shared,
    ) -> Result<Vec<(u64, Digest)>, DataError> {
        let mut out = Vec::new();
        let mut buf = [0u8; 64];
        let mut chunk = Vec::with_capacity(shape.chunk as usize);
        let mut credit: Option<Target> = None;
        for (k, index) in (s as u64..shape.chunks()).step_by(n as usize).enumerate() {
            let (file_off, len) = shape.chunk_at(index);
            let slot_off = slot_offset(k as u64, shape.slots, shape.chunk);
            let r = wait(&mut self.ep, &mut buf, shared)?;
            match r.kind {
                RecvKind::PutPlaced { key, offset }
                    if key == self.key && offset == slot_off && r.len == len => {}
                other => {
                    return Err(DataError::Protocol(format!(
                        "expected chunk {index} ({len} bytes at slot offset {slot_off}), \
                         got {other:?} of {} bytes",
                        r.len
                    )))
                }
            }
            shared.pace(len)?;
            // Out of the region, which the sender writes into: the slot is
            // the receiver's until it grants the credit below.
            chunk.resize(len, 0);
            self.ep
                .read_region(self.key, slot_off as usize, &mut chunk)?;
            out.push((index, shared.digest(&chunk)));
            sink.write_at(&chunk, file_off).map_err(DataError::File)?;
            shared.bytes.fetch_add(len as u64, Ordering::Relaxed);
            let t = match credit {
                Some(t) => t,
                None => *credit.insert(self.ep.reply_target(&r, Mode::Reliable)?),
            };
            self.ep.write(t, &1u32.to_le_bytes())?;
        }
        Ok(out)
    }
}

/// Waits for the next completion, looking at the abort flag every tick.
fn wait(
    ep: &mut Endpoint,
    buf: &mut [u8],
    shared: &Shared,
) -> Result<macrolink_fabric::Recv, DataError> {
    let start = std::time::Instant::now();
    loop {
        shared.check()?;
        if let Some(r) = ep.read_timeout(buf, TICK)? {
            return Ok(r);
        }
        if start.elapsed() >= SILENCE {
            return Err(DataError::Silent(SILENCE));
        }
    }
}

/// A stream's sending end.
#[derive(Debug)]
pub struct Sender {
    ep: Endpoint,
    peer: Addr,
    transport: Transport,
    key: RegionKey,
}

impl Sender {
    /// Opens endpoint `id` of `node` for the receiving end `end` of node
    /// `peer`, over `transport`; it connects with its first chunk (a
    /// stream with none never does: its receiver may be gone already).
    pub fn open(
        node: &Node,
        id: u32,
        peer: u32,
        end: StreamEnd,
        transport: Transport,
    ) -> macrolink_fabric::Result<Sender> {
        let mut ep = node.open(id, endpoint_config())?;
        ep.bind_session(peer, end.key);
        Ok(Sender {
            ep,
            peer: Addr::new(peer, end.ep),
            transport,
            key: RegionKey(end.key),
        })
    }

    /// Sends stream `s` of `n` of `shape` from `source`; returns the digests
    /// of its chunks by chunk index once the receiver has taken them all.
    pub fn run(
        mut self,
        shape: &Shape,
        s: u32,
        n: u32,
        source: &dyn Source,
        shared: &Shared,
    ) -> Result<Vec<(u64, Digest)>, DataError> {
        shared.stop_others_on_error(self.send(shape, s, n, source, shared))
    }

    fn send(
        &mut self,
        shape: &Shape,
        s: u32,
        n: u32,
        source: &dyn Source,
        shared: &Shared,
    ) -> Result<Vec<(u64, Digest)>, DataError> {
        let mut out = Vec::new();
        let mut scratch = IoBuf::new(0).map_err(DataError::File)?;
        let mut buf = [0u8; 64];
        let mut window = Window::new(shape.slots);
        let mut target = None;
        for (k, index) in (s as u64..shape.chunks()).step_by(n as usize).enumerate() {
            let t = match target {
                Some(t) => t,
                None => *target.insert(self.ep.target_via(self.peer, Mode::Put, self.transport)?),
            };
            while !window.may_send() {
                self.credits(&mut window, &mut buf, shared)?;
            }
            let (file_off, len) = shape.chunk_at(index);
            shared.pace(len)?;
            let slot_off = slot_offset(k as u64, shape.slots, shape.chunk);
            let mut digest = [0u8; 16];
            let mut read_error = None;
            let posted = self
                .ep
                .put_from(t, len, slot_off, self.key, true, &mut scratch, |dst| {
                    let r = source.read_at(dst, file_off);
                    if r.is_ok() {
                        digest = shared.digest(dst);
                    }
                    r.inspect_err(|e| read_error = Some(io::Error::new(e.kind(), e.to_string())))
                });
            if let Some(e) = read_error {
                return Err(DataError::File(e));
            }
            posted?;
            out.push((index, digest));
            window.sent();
            shared.bytes.fetch_add(len as u64, Ordering::Relaxed);
        }
        while window.in_flight() > 0 {
            self.credits(&mut window, &mut buf, shared)?;
        }
        Ok(out)
    }

    /// Waits for a credit and gives it to the window.
    fn credits(
        &mut self,
        window: &mut Window,
        buf: &mut [u8],
        shared: &Shared,
    ) -> Result<(), DataError> {
        let r = wait(&mut self.ep, buf, shared)?;
        match (r.kind, r.len) {
            (RecvKind::Message(Mode::Reliable), 4) => {
                let n = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
                window
                    .granted(n)
                    .map_err(|e| DataError::Protocol(e.to_string()))
            }
            (kind, len) => Err(DataError::Protocol(format!(
                "expected a credit, got {kind:?} of {len} bytes"
            ))),
        }
    }
}

/// Waits for a stream thread; a panic there is a failed stream.
pub(crate) fn join<T>(
    h: thread::ScopedJoinHandle<'_, Result<T, DataError>>,
) -> Result<T, DataError> {
    h.join()
        .unwrap_or_else(|_| Err(DataError::Protocol("a stream thread panicked".into())))
}

/// The transfer's digest from its streams' results, or the failure that
/// explains it best (a file error before a broken stream).
pub fn gather(
    shape: &Shape,
    results: Vec<Result<Vec<(u64, Digest)>, DataError>>,
) -> Result<Digest, Failure> {
    let mut c = Collector::new(shape.chunks() as usize);
    let mut first: Option<Failure> = None;
    for r in results {
        match r {
            Ok(list) => {
                for (i, d) in list {
                    c.add(i as usize, d);
                }
            }
            Err(DataError::File(e)) => {
                first = Some(Failure::new(code_of(&e), e.to_string()));
            }
            Err(DataError::Aborted) => {}
            Err(e) => {
                if first.is_none() {
                    first = Some(Failure::new(Code::Lost, e.to_string()));
                }
            }
        }
    }
    if let Some(f) = first {
        return Err(f);
    }
    c.finish().map_err(|i| {
        Failure::new(
            Code::Lost,
            format!("chunk {i} never arrived; the transfer was cut short"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_fill_agrees_with_byte_at_any_alignment() {
        for off in [0u64, 1, 7, 8, 13, 4096 + 3] {
            for len in [0usize, 1, 5, 8, 9, 100] {
                let mut b = vec![0u8; len];
                Pattern::fill(&mut b, off);
                let want: Vec<u8> = (0..len as u64).map(|i| Pattern::byte(off + i)).collect();
                assert_eq!(b, want, "offset {off} len {len}");
            }
        }
        assert_eq!(Pattern::byte(8), 1);
        assert_eq!(Pattern::byte(8 * 256 + 1), 1);
    }

    #[test]
    fn a_pace_counts_from_its_first_bytes_not_from_when_it_was_made() {
        let shared = Shared::counting(Default::default(), Some(1_000));
        let pace = shared.limit.as_ref().unwrap();
        // A transfer that took a while to set up...
        std::thread::sleep(Duration::from_millis(300));
        // ...still moves its first 200 bytes at 1,000 a second, not at
        // once on the credit of the set-up's 300 ms.
        let t = std::time::Instant::now();
        pace.take(100, &shared).unwrap();
        pace.take(100, &shared).unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(190),
            "{:?}",
            t.elapsed()
        );
    }
}
