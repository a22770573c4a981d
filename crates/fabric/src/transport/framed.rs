//! Frames over a byte stream: a connection of a transport that carries
//! bytes (shared-memory rings, a TCP socket) cuts them into frames, each a
//! header and its payload, on the way out and on the way in.
//!
//! Sending fragments a message or a put into frames of at most
//! [`MAX_FRAME`] bytes and writes header and payload together, without a
//! copy (vectored), as far as the stream takes them.
//!
//! Receiving places each frame's payload where it belongs. A message goes
//! straight into the reader's buffer when a read is waiting with room for
//! it and nothing is queued before it (one copy, out of the socket or
//! ring). Otherwise it is staged in the token pool and copied out when
//! read. A staged message that outgrows the pool moves into the reader's
//! buffer as soon as one large enough is offered, so a bounded pool still
//! carries messages of any size. Put payload goes straight into the
//! registered region after the whole put has been checked ([`puts`]).
//!
//! A message placed straight into the reader's buffer holds that buffer
//! until it is whole. When its sender stops mid-way for [`HOLD`] (a hung
//! process, a lost segment waiting for retransmission), the part that came
//! is moved into a buffer of the connection's own and the rest goes there
//! as it comes, so one stalled peer never keeps an endpoint from the others.

use macrolink_wire::{FrameKind, Header, Refusal, WireError, HEADER_LEN, MAX_FRAME};
use std::io::{self, IoSlice};
use std::os::fd::RawFd;
use std::time::Instant;

mod puts;

use super::offer::PLACE_MIN;
use super::region::RemoteRegion;
use super::sys::{self, Interest};
use super::{ByteStream, Connection, Control, OneSided, SendState};
use crate::pool::{Chain, TokenPool};
use crate::puts::PutStatus;
use crate::rx::{give_way, Body, Core, Ready, Step, HOLD, SPINS_PER_CHECK};
use crate::types::{Addr, Completion, Mode, Transport};

/// Answers (put acknowledgements, region answers) a connection holds
/// before they go. At this many it reads no further frame that would add
/// one until they have gone: a peer that asks and does not read the
/// answers is held back by its own full stream, not by our memory. As
/// many as a put initiator keeps the results of (`puts::CAP`): ordinary
/// traffic does not meet it.
const CTRL_CAP: usize = 1024;

/// Messages of this many bytes or more make the reader read the next
/// frame split (`ByteStream::try_read_split`): below, a frame's header and
/// payload come in one read ahead.
const SPLIT_FROM: usize = 4096;

/// Where the message or put being received on a connection stands.
#[derive(Debug)]
enum Asm {
    Idle,
    Staged {
        mode: Mode,
        total: u64,
        got: u64,
        chain: Chain,
    },
    Direct {
        mode: Mode,
        total: u64,
        got: u64,
    },
    /// A direct message moved out of the reader's buffer (see [`HOLD`]).
    Held {
        mode: Mode,
        total: u64,
        got: u64,
        buf: Vec<u8>,
    },
    Put {
        seq: u64,
        key: u64,
        start: u64,
        total: u64,
        got: u64,
        region: Result<usize, Refusal>,
        notify: bool,
    },
}

/// A connection over a byte stream.
#[derive(Debug)]
pub(crate) struct Framed<S> {
    peer: Addr,
    /// This connection's place in its endpoint (slot, generation).
    id: (u32, u32),
    stream: S,
    rx: FrameReader,
    asm: Asm,
    /// Since when a direct message has waited for more bytes.
    stalled: Option<Instant>,
    /// Polling looks for the rest of a direct message since the peer's
    /// liveness was last checked.
    awaits: u32,
    /// The last message the short path took was of `SPLIT_FROM` bytes or
    /// more.
    big: bool,
    rx_seq: u64,
    /// The current frame passed its checks and is being read.
    frame_started: bool,
    control: Control,
    /// Target regions mapped for one-sided puts (shared memory only).
    remote: Vec<RemoteRegion>,
}

impl<S: ByteStream> Framed<S> {
    /// The connection to `peer` over `stream`, at `id` (slot, generation)
    /// of its endpoint.
    pub(crate) fn new(peer: Addr, id: (u32, u32), stream: S) -> Framed<S> {
        Framed {
            peer,
            id,
            stream,
            rx: FrameReader::new(),
            asm: Asm::Idle,
            stalled: None,
            awaits: 0,
            big: false,
            rx_seq: 0,
            frame_started: false,
            control: Control::default(),
            remote: Vec::new(),
        }
    }

    fn violation(&self, core: &mut Core, what: &str) -> Step {
        core.stats.bad_frames += 1;
        tracing::warn!(peer = %self.peer, "protocol violation: {what}; closing the connection");
        core.broken(format!("protocol violation: {what}"))
    }

    /// Reads what has arrived. `user` is the buffer of a waiting read, if any.
    fn receive(&mut self, core: &mut Core, user: Option<&mut [u8]>) -> Step {
        let step = self.receive_pass(core, user);
        // After a delivery the application reads again, and that pass (or
        // a wait) publishes the room: in a stream of small messages the
        // writer hears of it once in many, not after each.
        if !matches!(step, Step::Delivered | Step::Message { .. }) {
            self.stream.read_done();
            core.cold |= self.stream.cold();
        }
        step
    }

    fn receive_pass(&mut self, core: &mut Core, mut user: Option<&mut [u8]>) -> Step {
        if let Some(step) = self.whole_message(core, user.as_deref_mut()) {
            return step;
        }
        let mut moved = false;
        loop {
            let h = match self.rx.header(&mut self.stream) {
                Ok(Some(h)) => {
                    self.stalled = None;
                    h
                }
                Ok(None) if matches!(self.asm, Asm::Direct { .. }) => {
                    // Between fragments of a message the reader's buffer holds.
                    match self.await_direct(core, user.as_deref()) {
                        None => continue,
                        Some(step) => return step,
                    }
                }
                Ok(None) => return Step::or_moved(moved),
                Err(RxError::Io(e)) => return core.broken(e.to_string()),
                Err(RxError::Wire(e)) => {
                    return self.violation(core, &format!("malformed frame: {e}"));
                }
            };
            if h.dst_ep != core.id || Addr::new(h.src_node, h.src_ep) != self.peer {
                return self.violation(core, "frame addressed to another endpoint");
            }
            let step = match h.kind {
                FrameKind::Datagram | FrameKind::Data => self.message(core, h, user.as_deref_mut()),
                FrameKind::Put => self.put(core, h),
                FrameKind::PutAck | FrameKind::PutNack => {
                    let status = if h.kind == FrameKind::PutAck {
                        PutStatus::Done
                    } else {
                        PutStatus::Refused(Refusal::from_code(h.offset))
                    };
                    self.rx.finish();
                    self.frame_started = false;
                    if !core.puts.complete(h.seq, status) {
                        return self.violation(core, "answer to no pending put");
                    }
                    Step::Moved
                }
                FrameKind::RegionQuery => self.region_query(core, h),
                FrameKind::RegionInfo => self.region_info(core, h),
                FrameKind::PutDone => self.put_done(core, h),
                FrameKind::Hello | FrameKind::HelloOk | FrameKind::HelloRefused => {
                    return self.violation(core, "handshake frame on an open connection")
                }
                FrameKind::Placed => self.placed(core, h, user.is_some()),
                FrameKind::Revoke | FrameKind::Revoked | FrameKind::Credit => {
                    return self.violation(core, "UCX control frame on a byte stream")
                }
            };
            match step {
                Step::Moved => moved = true,
                Step::Idle => return Step::or_moved(moved),
                done => return done,
            }
        }
    }

    /// The common case, taken without the general path's states: a
    /// message of one frame for a reader waiting with room for it, nothing
    /// queued before it. `None`: the general path goes on from where this
    /// left the frame (not such a reader; the header read and the frame
    /// not such a message; part of its payload placed, the message then a
    /// direct one).
    #[inline]
    fn whole_message(&mut self, core: &mut Core, user: Option<&mut [u8]>) -> Option<Step> {
        let buf = user?;
        if !self.rx.is_idle() || !matches!(self.asm, Asm::Idle) || !core.ready.is_empty() {
            return None;
        }
        // A polling reader whose last message was larger than a read ahead
        // takes (a small one's header and payload come in one read
        // already) may read the next frame's header and what follows it,
        // straight into its buffer, in one read (see `tcp`): `early` bytes
        // of `buf` came so. Not a waiting one: the gateways' relays wait,
        // and with split reads there eight flows through four gateways
        // moved 0.89-0.92 of the links, against 0.94-0.95 without (three
        // runs each of `bench gateways`; the bytes put back are copied).
        let mut early = 0;
        let split = if self.big && core.completion == Completion::Poll {
            self.stream.try_read_split(&mut self.rx.buf, buf)
        } else {
            None
        };
        match split {
            None => {}
            Some(Ok(0)) => return Some(Step::Idle),
            Some(Ok(n)) => early = self.rx.split(n),
            Some(Err(e)) => return Some(core.broken(e.to_string())),
        }
        // What the general path would do with a header that is not whole
        // or not sound, done here: a stream is not read twice in a pass.
        let h = match self.rx.header(&mut self.stream) {
            Ok(Some(h)) => h,
            Ok(None) => return Some(Step::Idle),
            Err(RxError::Io(e)) => return Some(core.broken(e.to_string())),
            Err(RxError::Wire(e)) => {
                return Some(self.violation(core, &format!("malformed frame: {e}")))
            }
        };
        self.stalled = None;
        let mode = match h.kind {
            FrameKind::Data => Some(Mode::Reliable),
            FrameKind::Datagram => Some(Mode::Datagram),
            _ => None,
        };
        let len = h.len as usize;
        let Some(mode) = mode.filter(|&mode| {
            h.offset == 0
                && h.total == u64::from(h.len)
                && h.total <= core.max_message
                && len <= buf.len()
                && (mode != Mode::Reliable || h.seq == self.rx_seq)
                && h.dst_ep == core.id
                && Addr::new(h.src_node, h.src_ep) == self.peer
                && !core.probe
        }) else {
            // Not such a message: what a split read put in `buf` goes back
            // to the stream, for the general path.
            if early > 0 {
                self.stream.unread(&buf[..early]);
            }
            return None;
        };
        self.big = len >= SPLIT_FROM;
        // Bytes read beyond this frame belong to the next.
        let early = if early > len {
            self.stream.unread(&buf[len..early]);
            len
        } else {
            early
        };
        self.rx.took(early);
        let n = match self.rx.payload(&mut self.stream, &mut buf[early..len]) {
            Ok(n) => early + n,
            Err(e) => return Some(core.broken(e.to_string())),
        };
        if mode == Mode::Reliable {
            self.rx_seq += 1;
        }
        if n < len {
            self.asm = Asm::Direct {
                mode,
                total: h.total,
                got: n as u64,
            };
            self.frame_started = true;
            return None;
        }
        self.rx.finish();
        core.count_in(len);
        Some(Step::Message { len, mode })
    }

    fn message(&mut self, core: &mut Core, h: Header, user: Option<&mut [u8]>) -> Step {
        let mode = if h.kind == FrameKind::Datagram {
            Mode::Datagram
        } else {
            Mode::Reliable
        };
        if !self.frame_started {
            match &self.asm {
                Asm::Idle => {
                    if h.offset != 0 {
                        return self.violation(core, "message starts mid-way");
                    }
                    if h.total > core.max_message {
                        return self.violation(core, "message larger than the endpoint accepts");
                    }
                    if mode == Mode::Reliable && h.seq != self.rx_seq {
                        return self.violation(core, "reliable message out of order");
                    }
                    if core.probe {
                        core.timings.read_header = crate::clock_ns();
                    }
                    let fits = user.as_ref().is_some_and(|b| b.len() as u64 >= h.total);
                    self.asm = if fits && core.ready.is_empty() {
                        Asm::Direct {
                            mode,
                            total: h.total,
                            got: 0,
                        }
                    } else if core.ready.len() < core.ready_cap {
                        Asm::Staged {
                            mode,
                            total: h.total,
                            got: 0,
                            chain: Chain::EMPTY,
                        }
                    } else {
                        return Step::Idle;
                    };
                    if mode == Mode::Reliable {
                        self.rx_seq += 1;
                    }
                }
                Asm::Staged { total, got, .. }
                | Asm::Direct { total, got, .. }
                | Asm::Held { total, got, .. } => {
                    if h.kind != FrameKind::Data || h.total != *total || h.offset != *got {
                        return self.violation(core, "fragment does not continue its message");
                    }
                }
                Asm::Put { .. } => return self.violation(core, "message inside a put"),
            }
            self.frame_started = true;
        }
        let mut user = user;
        let mut moved = false;
        while self.rx.left() > 0 {
            let n = match &mut self.asm {
                Asm::Direct { got, .. } => {
                    let Some(buf) = user.as_deref_mut() else {
                        unreachable!("direct placement without a reader")
                    };
                    let at = *got as usize;
                    let left = self.rx.left();
                    match self.rx.payload(&mut self.stream, &mut buf[at..at + left]) {
                        Ok(0) => {
                            // The rest of this message is on its way: wait for
                            // it here, the reader's buffer holds its head.
                            match self.await_direct(core, user.as_deref()) {
                                None => continue,
                                Some(step) => return step,
                            }
                        }
                        Ok(n) => {
                            self.stalled = None;
                            n
                        }
                        Err(e) => return core.broken(e.to_string()),
                    }
                }
                Asm::Held { buf, got, .. } => {
                    let at = *got as usize;
                    let left = self.rx.left();
                    match self.rx.payload(&mut self.stream, &mut buf[at..at + left]) {
                        Ok(0) => return Step::or_moved(moved),
                        Ok(n) => n,
                        Err(e) => return core.broken(e.to_string()),
                    }
                }
                Asm::Staged {
                    chain,
                    total,
                    got,
                    mode,
                } => match core.pool.tail_space(chain) {
                    Some(space) => match self.rx.payload(&mut self.stream, space) {
                        Ok(0) => return Step::or_moved(moved),
                        Ok(n) => {
                            core.pool.commit(chain, n);
                            n
                        }
                        Err(e) => return core.broken(e.to_string()),
                    },
                    None => {
                        // Pool exhausted: move into the reader's buffer if one
                        // large enough waits, else hold back.
                        if !core.ready.is_empty() {
                            return Step::or_moved(moved);
                        }
                        let fits = user.as_ref().is_some_and(|b| b.len() as u64 >= *total);
                        let Some(buf) = user.as_deref_mut().filter(|_| fits) else {
                            if user.is_some() && !moved {
                                return Step::TooSmall(*total);
                            }
                            return Step::or_moved(moved);
                        };
                        core.pool.drain_into(*chain, buf);
                        self.asm = Asm::Direct {
                            mode: *mode,
                            total: *total,
                            got: *got,
                        };
                        continue;
                    }
                },
                _ => unreachable!("message state"),
            };
            moved = true;
            match &mut self.asm {
                Asm::Direct { got, .. } | Asm::Staged { got, .. } | Asm::Held { got, .. } => {
                    *got += n as u64
                }
                _ => unreachable!("message state"),
            }
        }
        self.rx.finish();
        self.frame_started = false;
        match std::mem::replace(&mut self.asm, Asm::Idle) {
            Asm::Direct { mode, total, got } if got == total => {
                core.stats.messages_in += 1;
                core.stats.bytes_in += total;
                Step::Message {
                    len: total as usize,
                    mode,
                }
            }
            Asm::Held {
                mode,
                total,
                got,
                buf,
            } if got == total => self.ready(core, mode, total, Body::Held(buf)),
            Asm::Staged {
                mode,
                total,
                got,
                chain,
            } if got == total => self.ready(core, mode, total, Body::Staged(chain)),
            partial => {
                self.asm = partial;
                Step::Moved
            }
        }
    }

    /// A reliable message the sender wrote straight into the buffer this
    /// read offered (see [`super::offer`]).
    fn placed(&mut self, core: &mut Core, h: Header, reading: bool) -> Step {
        self.rx.finish();
        self.frame_started = false;
        if !matches!(self.asm, Asm::Idle) {
            return self.violation(core, "placed message inside another");
        }
        if h.seq != self.rx_seq {
            return self.violation(core, "reliable message out of order");
        }
        if !reading || !self.stream.take_placed(h.key, h.total) {
            return self.violation(core, "placed message in no buffer offered");
        }
        self.rx_seq += 1;
        core.stats.messages_in += 1;
        core.stats.messages_placed += 1;
        core.stats.bytes_in += h.total;
        Step::Message {
            len: h.total as usize,
            mode: Mode::Reliable,
        }
    }

    /// Queues a whole message for the application.
    fn ready(&self, core: &mut Core, mode: Mode, len: u64, body: Body) -> Step {
        core.ready.push_back(Ready::Msg {
            from: self.peer,
            mode,
            transport: self.stream.transport(),
            len: len as usize,
            body,
            via: Some(self.id),
        });
        Step::Moved
    }

    /// Sleeps or spins until more bytes of the direct message may have
    /// arrived (`None`: read on); once it has waited [`HOLD`], moves it out
    /// of the reader's buffer `user` (see [`hold`](Self::hold)). Otherwise
    /// the step to return.
    fn await_direct(&mut self, core: &mut Core, user: Option<&[u8]>) -> Option<Step> {
        // The writer may wait for the room this pass's reads left.
        self.stream.read_done();
        let now = Instant::now();
        let since = *self.stalled.get_or_insert(now);
        let Some(left) = HOLD.checked_sub(now - since).filter(|d| !d.is_zero()) else {
            if self.hold(user) {
                core.stats.messages_held += 1;
            }
            return Some(Step::Moved);
        };
        match core.completion {
            Completion::Poll => {
                // The rest of a message that flows comes microseconds after
                // its last part (the next segment of a socket, the next
                // fill of a ring): a polling reader looks again at once, as
                // for a message, offers its processor now and then (a
                // writer on the same processor may be what it awaits:
                // `give_way`) and checks the peer's liveness once in
                // `SPINS_PER_CHECK` looks. (A pause of `SPINS_PER_CHECK`
                // spins before each look was some 90 us on an EPYC: every
                // tcp message that came in two reads or more waited it.)
                std::hint::spin_loop();
                self.awaits += 1;
                give_way(self.awaits);
                if self.awaits >= SPINS_PER_CHECK {
                    self.awaits = 0;
                    self.stream.check_alive();
                }
            }
            Completion::Wait => {
                if self.stream.arm_read() {
                    let r = sys::wait_fd(self.stream.raw_fd(), sys::Interest::Read, left);
                    self.stream.disarm();
                    if let Err(e) = r {
                        return Some(core.broken(e.to_string()));
                    }
                } else {
                    self.stream.disarm();
                }
            }
        }
        // The rest of a message is awaited: read the stream, cold or not.
        self.stream.look_again();
        None
    }

    /// Moves a stalled direct message out of the reader's buffer `user`
    /// into one of its own, so that the read can go on without it. False
    /// when there was none.
    fn hold(&mut self, user: Option<&[u8]>) -> bool {
        self.stalled = None;
        let Asm::Direct { mode, total, got } = self.asm else {
            return false;
        };
        let Some(head) = user.and_then(|u| u.get(..got as usize)) else {
            unreachable!("direct placement without a reader")
        };
        let mut buf = Vec::with_capacity(total as usize);
        buf.extend_from_slice(head);
        buf.resize(total as usize, 0);
        tracing::debug!(
            peer = %self.peer,
            "message stalled after {got} of {total} bytes; held aside"
        );
        self.asm = Asm::Held {
            mode,
            total,
            got,
            buf,
        };
        true
    }
}

impl<S: ByteStream> Connection for Framed<S> {
    fn transport(&self) -> Transport {
        self.stream.transport()
    }

    fn can_take(&self, len: usize, _mode: Mode) -> bool {
        let frames = len.div_ceil(MAX_FRAME as usize).max(1);
        self.stream.can_take(len + frames * HEADER_LEN)
    }

    fn send(&mut self, h: &Header, payload: &[u8], st: &mut SendState) -> io::Result<bool> {
        let fresh = st.done == 0 && st.sent == 0;
        if h.kind == FrameKind::Data && payload.len() >= PLACE_MIN && fresh {
            if let Some(gen) = self.stream.place(payload)? {
                let mut f = *h;
                f.kind = FrameKind::Placed;
                f.key = gen;
                f.len = 0;
                f.offset = 0;
                // Everything sent before has been read: the ring is empty.
                if self.stream.try_write(&[IoSlice::new(&f.encode())])? != HEADER_LEN {
                    return Err(io::Error::other("the ring took part of a placement"));
                }
                self.stream.placed(gen);
                st.done = payload.len();
                return Ok(true);
            }
        }
        loop {
            let n = (payload.len() - st.done).min(MAX_FRAME as usize);
            // A put's fragments name where in the region they go; a
            // message's, where in the message. Other frames are one piece
            // whose `offset` says what their kind makes it say.
            let offset = match h.kind {
                FrameKind::Put => h.offset + st.done as u64,
                FrameKind::Data => st.done as u64,
                _ => h.offset,
            };
            let hdr = h.encode_part(n as u32, offset);
            let body = &payload[st.done..st.done + n];
            let bufs = [
                IoSlice::new(&hdr[st.sent.min(HEADER_LEN)..]),
                IoSlice::new(&body[st.sent.saturating_sub(HEADER_LEN)..]),
            ];
            let w = self.stream.try_write(&bufs)?;
            if w == 0 {
                return Ok(false);
            }
            st.sent += w;
            if st.sent == HEADER_LEN + n {
                st.done += n;
                st.sent = 0;
                if st.done == payload.len() {
                    return Ok(true);
                }
            }
        }
    }

    fn progress(&mut self, core: &mut Core, user: Option<&mut [u8]>) -> Step {
        self.receive(core, user)
    }

    fn release(&mut self, pool: &mut TokenPool) {
        if let Asm::Staged { chain, .. } = std::mem::replace(&mut self.asm, Asm::Idle) {
            pool.release(chain);
        }
    }

    fn arm_read(&mut self) -> bool {
        self.stream.arm_read()
    }

    fn arm_write(&mut self, need: usize) -> bool {
        self.stream.arm_write(need)
    }

    fn disarm(&mut self) {
        self.stream.disarm()
    }

    fn read_fd(&self) -> RawFd {
        self.stream.raw_fd()
    }

    fn write_wait(&self) -> (RawFd, Interest) {
        (self.stream.raw_fd(), self.stream.write_interest())
    }

    fn check_alive(&mut self) {
        self.stream.check_alive()
    }

    fn offer(&mut self, buf: &mut [u8]) -> bool {
        let idle = matches!(self.asm, Asm::Idle) && !self.frame_started && self.rx.is_idle();
        idle && buf.len() >= PLACE_MIN && self.stream.offer(buf)
    }

    fn withdraw(&mut self) -> bool {
        self.stream.withdraw()
    }

    fn sleep_read(&mut self) -> Option<bool> {
        self.stream.sleep_read()
    }

    fn can_sleep_read(&self) -> bool {
        self.stream.can_sleep_read()
    }

    fn look_again(&mut self) {
        self.stream.look_again()
    }

    fn quiet(&mut self) {
        self.stream.quiet()
    }

    fn read_edge(&self) -> bool {
        self.stream.edge()
    }

    fn rang(&mut self, gone: bool) {
        self.stream.rang(gone)
    }

    fn watched(&mut self, on: bool) {
        self.stream.watched(on)
    }

    fn control(&mut self) -> &mut Control {
        &mut self.control
    }

    fn one_sided(&mut self) -> Option<&mut dyn OneSided> {
        if self.caps().one_sided_put {
            Some(self)
        } else {
            None
        }
    }
}

/// Why the next frame could not be read.
#[derive(Debug)]
enum RxError {
    Io(io::Error),
    Wire(WireError),
}

/// Receive state of one stream.
#[derive(Debug)]
struct FrameReader {
    buf: [u8; HEADER_LEN],
    have: usize,
    cur: Option<Header>,
    left: usize,
}

impl FrameReader {
    fn new() -> Self {
        FrameReader {
            buf: [0; HEADER_LEN],
            have: 0,
            cur: None,
            left: 0,
        }
    }

    /// The header of the frame being read, reading it in if needed.
    /// `Ok(None)`: not all of it has arrived yet.
    #[inline(always)]
    fn header(&mut self, s: &mut impl ByteStream) -> Result<Option<Header>, RxError> {
        if let Some(h) = self.cur {
            return Ok(Some(h));
        }
        while self.have < HEADER_LEN {
            let n = s
                .try_read(&mut self.buf[self.have..])
                .map_err(RxError::Io)?;
            if n == 0 {
                return Ok(None);
            }
            self.have += n;
        }
        let h = Header::decode(&self.buf).map_err(RxError::Wire)?;
        self.cur = Some(h);
        self.left = h.len as usize;
        Ok(Some(h))
    }

    /// A split read gave `n` bytes, `buf` filled first: the bytes that
    /// came beyond the header, which went to the reader's buffer.
    fn split(&mut self, n: usize) -> usize {
        debug_assert!(self.is_idle());
        self.have = n.min(HEADER_LEN);
        n - self.have
    }

    /// `n` bytes of the current frame's payload came with its header.
    fn took(&mut self, n: usize) {
        debug_assert!(n <= self.left);
        self.left -= n;
    }

    /// No part of a frame read.
    fn is_idle(&self) -> bool {
        self.cur.is_none() && self.have == 0
    }

    /// Payload bytes of the current frame not yet read.
    fn left(&self) -> usize {
        self.left
    }

    /// Reads up to `dst.len()` (at most `left()`) payload bytes; 0 = none now.
    fn payload(&mut self, s: &mut impl ByteStream, dst: &mut [u8]) -> io::Result<usize> {
        let want = dst.len().min(self.left);
        if want == 0 {
            return Ok(0);
        }
        let n = s.try_read(&mut dst[..want])?;
        self.left -= n;
        Ok(n)
    }

    /// Reads and drops up to 4 KiB of the payload; returns the bytes dropped.
    /// Not inlined: its scratch would make every pass of the receive loop
    /// set up a stack frame of more than a page.
    #[inline(never)]
    fn discard(&mut self, s: &mut impl ByteStream) -> io::Result<usize> {
        let mut scratch = [0u8; 4096];
        let want = self.left.min(scratch.len());
        let n = s.try_read(&mut scratch[..want])?;
        self.left -= n;
        Ok(n)
    }

    /// Ends the current frame once its payload has been read.
    fn finish(&mut self) {
        debug_assert_eq!(self.left, 0);
        self.cur = None;
        self.have = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream whose bytes arrive at most `step` at a time.
    #[derive(Debug)]
    struct Trickle {
        bytes: Vec<u8>,
        at: usize,
        step: usize,
        reads: usize,
        /// Descriptors sent over it find the socket full.
        fds_full: bool,
        /// Reads that find nothing once `at` reaches `dry.0`: `dry.1`.
        dry: (usize, usize),
        /// Liveness checks.
        checks: usize,
        /// It reads split (as a socket does for a reader that takes a
        /// message at a time): the reads so, and the puts back.
        split: bool,
        splits: usize,
        unreads: usize,
    }

    impl ByteStream for Trickle {
        fn transport(&self) -> Transport {
            Transport::Tcp
        }
        fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            Ok(bufs.iter().map(|b| b.len()).sum())
        }
        fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
            self.reads += 1;
            if self.at >= self.dry.0 && self.dry.1 > 0 {
                self.dry.1 -= 1;
                return Ok(0);
            }
            let n = dst.len().min(self.step).min(self.bytes.len() - self.at);
            dst[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
        fn try_read_split(
            &mut self,
            head: &mut [u8],
            body: &mut [u8],
        ) -> Option<io::Result<usize>> {
            if !self.split {
                return None;
            }
            self.splits += 1;
            let n = self
                .step
                .min(self.bytes.len() - self.at)
                .min(head.len() + body.len());
            let h = n.min(head.len());
            head[..h].copy_from_slice(&self.bytes[self.at..self.at + h]);
            body[..n - h].copy_from_slice(&self.bytes[self.at + h..self.at + n]);
            self.at += n;
            Some(Ok(n))
        }
        fn unread(&mut self, bytes: &[u8]) {
            assert_eq!(bytes, &self.bytes[self.at - bytes.len()..self.at]);
            self.at -= bytes.len();
            self.unreads += 1;
        }
        fn raw_fd(&self) -> RawFd {
            -1
        }
        fn write_interest(&self) -> Interest {
            Interest::Write
        }
        fn check_alive(&mut self) {
            self.checks += 1;
        }
        fn send_fd(&self, _fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
            if self.fds_full {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(())
            }
        }
    }

    /// A connection from endpoint 1:7 reading `bytes`, `step` at a time.
    fn framed(bytes: Vec<u8>, step: usize) -> Framed<Trickle> {
        let stream = Trickle {
            bytes,
            at: 0,
            step,
            reads: 0,
            fds_full: false,
            dry: (usize::MAX, 0),
            checks: 0,
            split: false,
            splits: 0,
            unreads: 0,
        };
        Framed::new(Addr::new(1, 7), (0, 0), stream)
    }

    fn core() -> Core {
        Core::new(
            5,
            Completion::Poll,
            1 << 20,
            TokenPool::new(64, 4096).unwrap(),
            64,
        )
    }

    /// Reads `msgs` (kind, bytes) off `f` in order, each whole: byte `j`
    /// of message `i` is `byte(i, j)`. `step` names the run.
    fn read_in_order(
        f: &mut Framed<Trickle>,
        core: &mut Core,
        buf: &mut [u8],
        msgs: &[(FrameKind, usize)],
        byte: impl Fn(usize, usize) -> u8,
        step: usize,
    ) {
        for (i, &(kind, n)) in msgs.iter().enumerate() {
            let mut passes = 0;
            let (len, mode) = loop {
                passes += 1;
                assert!(passes < 100_000, "step {step}: message {i} never came");
                match f.progress(core, Some(&mut *buf)) {
                    Step::Message { len, mode } => break (len, mode),
                    Step::Idle | Step::Moved => {}
                    other => panic!("step {step}: message {i}: {other:?} {}", core.lost),
                }
            };
            let want = if kind == FrameKind::Data {
                Mode::Reliable
            } else {
                Mode::Datagram
            };
            assert_eq!((len, mode), (n, want), "step {step}: message {i}");
            assert!(
                buf[..n].iter().enumerate().all(|(j, &b)| b == byte(i, j)),
                "step {step}: message {i} garbled"
            );
        }
    }

    /// Whole frames and frames cut anywhere (in the header, in the
    /// payload) reach the reader's buffer intact and in order, by the
    /// common case's short path or the general one.
    #[test]
    fn messages_cut_anywhere_are_read_whole() {
        let msgs: Vec<(FrameKind, usize)> = [0usize, 1, 8, 55, 56, 57, 200, 3000]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let kind = if i % 3 == 2 {
                    FrameKind::Datagram
                } else {
                    FrameKind::Data
                };
                (kind, n)
            })
            .collect();
        let mut bytes = Vec::new();
        let mut seq = 0;
        for (i, &(kind, n)) in msgs.iter().enumerate() {
            let mut h = Header::new(kind);
            (h.src_node, h.src_ep, h.dst_ep) = (1, 7, 5);
            if kind == FrameKind::Data {
                h.seq = seq;
                seq += 1;
            }
            h.total = n as u64;
            h.len = n as u32;
            bytes.extend_from_slice(&h.encode());
            bytes.extend((0..n).map(|j| (j + i) as u8));
        }
        for step in [1, 3, 8, 56, 57, 64, usize::MAX] {
            let mut f = framed(bytes.clone(), step);
            let mut core = core();
            let mut buf = vec![0u8; 4096];
            read_in_order(
                &mut f,
                &mut core,
                &mut buf,
                &msgs,
                |i, j| (j + i) as u8,
                step,
            );
            assert_eq!(core.stats.messages_in, msgs.len() as u64);
            assert!(core.ready.is_empty());
        }
    }

    /// A reader that reads split (a header and what follows it straight
    /// into its buffer) gets every message whole and in order, however the
    /// stream cuts them: what came beyond a frame, a frame the short path
    /// leaves to the general one (a message in two fragments), all go back
    /// to the stream and are read again.
    #[test]
    fn split_reads_give_every_message_whole_and_in_order() {
        // (kind, payload bytes, fragments)
        let msgs = [
            (FrameKind::Data, 5000, 1),
            (FrameKind::Data, 8, 1),
            (FrameKind::Data, 20_000, 1),
            (FrameKind::Datagram, 3000, 1),
            (FrameKind::Data, 0, 1),
            (FrameKind::Data, 4096, 1),
            (FrameKind::Data, 9000, 2),
            (FrameKind::Datagram, 12, 1),
            (FrameKind::Data, 30_000, 1),
            (FrameKind::Data, 6000, 2),
            (FrameKind::Data, 7, 1),
        ];
        let mut bytes = Vec::new();
        let mut seq = 0;
        for (i, &(kind, n, parts)) in msgs.iter().enumerate() {
            let payload: Vec<u8> = (0..n).map(|j| (j * 7 + i) as u8).collect();
            let cut = if parts == 1 { n } else { n / parts };
            for (offset, piece) in [(0, &payload[..cut]), (cut, &payload[cut..])]
                .into_iter()
                .take(parts)
            {
                let mut h = Header::new(kind);
                (h.src_node, h.src_ep, h.dst_ep) = (1, 7, 5);
                (h.seq, h.total, h.offset) = (seq, n as u64, offset as u64);
                h.len = piece.len() as u32;
                bytes.extend_from_slice(&h.encode());
                bytes.extend_from_slice(piece);
            }
            if kind == FrameKind::Data {
                seq += 1;
            }
        }
        for step in [1, 57, 4152, 5056, 30_000, usize::MAX] {
            let mut f = framed(bytes.clone(), step);
            f.stream.split = true;
            let mut core = core();
            let mut buf = vec![0u8; 40_000];
            let kinds: Vec<_> = msgs.iter().map(|&(kind, n, _)| (kind, n)).collect();
            let byte = |i, j| (j * 7 + i) as u8;
            read_in_order(&mut f, &mut core, &mut buf, &kinds, byte, step);
            assert_eq!(f.stream.at, bytes.len(), "step {step}: all read");
            assert_eq!(core.stats.messages_in, msgs.len() as u64);
            assert!(core.ready.is_empty());
            assert!(f.stream.splits > 0, "step {step}: no split read");
            if step >= 30_000 {
                assert!(f.stream.unreads > 0, "step {step}: nothing put back");
            }
        }
    }

    /// A frame the short path may not take (out of order, for another
    /// endpoint, not a header at all) is refused as by the general path.
    #[test]
    fn the_short_path_refuses_what_the_general_one_does() {
        let cases = [
            (1, 5, 0, "out of order"),
            (0, 6, 0, "another endpoint"),
            (0, 5, 0xff, "malformed frame"),
        ];
        for (seq, dst, spoil, what) in cases {
            let mut h = Header::new(FrameKind::Data);
            (h.src_node, h.src_ep, h.dst_ep, h.seq) = (1, 7, dst, seq);
            (h.total, h.len) = (8, 8);
            let mut bytes = h.encode().to_vec();
            bytes[0] ^= spoil;
            bytes.extend_from_slice(&[9; 8]);
            let mut f = framed(bytes, usize::MAX);
            let mut core = core();
            let mut buf = [0u8; 64];
            assert_eq!(f.progress(&mut core, Some(&mut buf)), Step::Lost, "{what}");
            assert!(core.lost.contains(what), "{what}: {}", core.lost);
            assert_eq!(core.stats.bad_frames, 1);
        }
    }

    /// A pass that finds nothing for a waiting reader looks at the stream
    /// once (a look at a socket is a system call).
    #[test]
    fn an_idle_pass_reads_the_stream_once() {
        let mut f = framed(Vec::new(), usize::MAX);
        let mut core = core();
        let mut buf = [0u8; 64];
        assert_eq!(f.progress(&mut core, Some(&mut buf)), Step::Idle);
        assert_eq!(f.stream.reads, 1);
    }

    /// A polling reader whose message came in part looks for the rest on
    /// every pass, and checks the peer's liveness once in
    /// `SPINS_PER_CHECK` looks, not before each look; the message is then
    /// whole and in order.
    #[test]
    fn a_polling_reader_awaiting_the_rest_of_a_message_looks_on_every_pass() {
        let n = 3000;
        let mut h = Header::new(FrameKind::Data);
        (h.src_node, h.src_ep, h.dst_ep) = (1, 7, 5);
        (h.total, h.len) = (n as u64, n as u32);
        let mut bytes = h.encode().to_vec();
        bytes.extend((0..n).map(|j| j as u8));
        let mut f = framed(bytes, usize::MAX);
        // The header and 1000 bytes, then nothing for many looks.
        let empty = 2 * SPINS_PER_CHECK as usize + 10;
        f.stream.step = HEADER_LEN + 1000;
        f.stream.dry = (HEADER_LEN + 1000, empty);
        let mut core = core();
        let mut buf = vec![0u8; 4096];
        // Passes: held aside, one read a pass, the message takes as many.
        let mut whole = None;
        for _ in 0..empty + 100 {
            match f.progress(&mut core, Some(&mut buf)) {
                Step::Message { len, .. } => {
                    whole = Some(len);
                    break;
                }
                // Held aside and queued whole: a pass outlasted HOLD (a
                // loaded machine).
                Step::Moved | Step::Idle if !core.ready.is_empty() => break,
                Step::Moved | Step::Idle => {}
                other => panic!("{other:?}: {}", core.lost),
            }
        }
        assert!(
            whole.is_some() || !core.ready.is_empty(),
            "the message never came"
        );
        if let Some(len) = whole {
            assert_eq!(len, n);
            assert!(buf[..n].iter().enumerate().all(|(j, &b)| b == j as u8));
        }
        assert_eq!(f.stream.dry.1, 0, "every empty look was made");
        assert!(f.stream.reads > empty, "{} reads", f.stream.reads);
        assert!(
            f.stream.checks <= empty / SPINS_PER_CHECK as usize + 1,
            "{} liveness checks in {empty} looks",
            f.stream.checks
        );
    }

    /// The frame `kind` from endpoint 1:7 to 5 about region `key`, with
    /// `payload` (a put's bytes at offset 0; a notice's length).
    fn about(kind: FrameKind, key: u64, payload: &[u8], flags: macrolink_wire::Flags) -> Vec<u8> {
        let mut h = Header::new(kind);
        (h.src_node, h.src_ep, h.dst_ep) = (1, 7, 5);
        (h.key, h.flags) = (key, flags);
        h.total = payload.len() as u64;
        if kind == FrameKind::Put {
            h.len = payload.len() as u32;
        }
        let mut b = h.encode().to_vec();
        if kind == FrameKind::Put {
            b.extend_from_slice(payload);
        }
        b
    }

    /// Passes until one moves nothing.
    fn settle(f: &mut Framed<Trickle>, core: &mut Core) {
        for _ in 0..100_000 {
            match f.progress(core, None) {
                Step::Moved => {}
                Step::Idle => return,
                other => panic!("{other:?}: {}", core.lost),
            }
        }
        panic!("the connection never settled");
    }

    /// A peer that asks and does not take the answers: at `CTRL_CAP`
    /// queued answers its connection is read no further, and reads on as
    /// they go.
    #[test]
    fn answers_a_peer_does_not_take_hold_its_connection_at_the_cap() {
        let extra = 10;
        let one = about(FrameKind::RegionQuery, 99, &[], Default::default());
        let bytes = one.repeat(CTRL_CAP + extra);
        let mut f = framed(bytes.clone(), usize::MAX);
        let mut core = core();
        settle(&mut f, &mut core);
        assert_eq!(f.control.out.len(), CTRL_CAP);
        assert_eq!(core.stats.puts_refused, CTRL_CAP as u64);
        let unread = bytes.len() - f.stream.at;
        assert!(
            unread >= (extra - 1) * one.len(),
            "{unread} bytes left unread"
        );
        // The answers go; the rest is read.
        f.control.out.clear();
        settle(&mut f, &mut core);
        assert_eq!(f.control.out.len(), extra);
        assert_eq!(f.stream.at, bytes.len());
        assert!(f
            .control
            .out
            .iter()
            .all(|(h, _)| h.kind == FrameKind::RegionInfo && h.offset == Refusal::BadKey.code()));
    }

    /// Put notices wait for room in the application's queue: a notice
    /// and a put the queue is full for stay unread, nothing is lost, and
    /// they come as the application reads.
    #[test]
    fn put_notices_wait_for_room_in_the_ready_queue() {
        let mut core = core();
        let key = core.regions.register(4096).unwrap().0;
        let notify = macrolink_wire::Flags::NOTIFY;
        let notices = core.ready_cap + 6;
        let mut bytes = about(FrameKind::PutDone, key, &[0; 8], notify).repeat(notices);
        bytes.extend(about(FrameKind::Put, key, b"put into", notify));
        let mut f = framed(bytes.clone(), usize::MAX);
        settle(&mut f, &mut core);
        assert_eq!(core.ready.len(), core.ready_cap, "the queue holds its cap");
        let mut taken = 0;
        while f.stream.at < bytes.len() || !core.ready.is_empty() {
            assert!(core.ready.len() <= core.ready_cap);
            assert!(core.ready.pop_front().is_some(), "a notice was lost");
            taken += 1;
            settle(&mut f, &mut core);
        }
        assert_eq!(taken, notices + 1);
        assert_eq!(f.control.out.len(), 1, "the put's answer");
        assert_eq!(f.control.out[0].0.kind, FrameKind::PutAck);
        let mut placed = [0u8; 8];
        assert!(core
            .regions
            .read(crate::types::RegionKey(key), 0, &mut placed)
            .is_some());
        assert_eq!(&placed, b"put into");
    }

    /// A peer whose descriptor socket is full has asked for regions and
    /// not taken them (one at a time is all an initiator asks): its
    /// connection ends at once, not after a wait for room.
    #[test]
    fn region_queries_whose_memory_is_not_taken_end_the_connection() {
        let mut core = core();
        let key = core.regions.register(4096).unwrap().0;
        let mut f = framed(
            about(FrameKind::RegionQuery, key, &[], Default::default()),
            64,
        );
        f.stream.fds_full = true;
        assert_eq!(f.progress(&mut core, None), Step::Lost);
        assert!(
            core.lost.contains("answers it does not take"),
            "{}",
            core.lost
        );
        // With room, the same query is answered with the region.
        let mut f = framed(
            about(FrameKind::RegionQuery, key, &[], Default::default()),
            64,
        );
        settle(&mut f, &mut core);
        let (answer, _) = f.control.out.pop_front().expect("an answer");
        assert_eq!(
            (answer.kind, answer.offset, answer.total),
            (FrameKind::RegionInfo, 0, 4096)
        );
    }
}
