//! Receive side of one connection: reads frames off its stream and places
//! their payload where it belongs.
//!
//! A message goes straight into the reader's buffer when a read is waiting
//! with room for it and nothing is queued before it (one copy, out of the
//! socket or ring). Otherwise it is staged in the token pool and copied out
//! when read. A staged message that outgrows the pool moves into the
//! reader's buffer as soon as one large enough is offered, so a bounded pool
//! still carries messages of any size. Put payload goes straight into the
//! registered region after the whole put has been checked.
//!
//! A message placed straight into the reader's buffer holds that buffer
//! until it is whole. When its sender stops mid-way for [`HOLD`] (a hung
//! process, a lost segment waiting for retransmission), the part that came
//! is moved into a buffer of the connection's own and the rest goes there
//! as it comes, so one stalled peer never keeps an endpoint from the others.

use macrolink_wire::{FrameKind, Header, Refusal};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::put::{PutStatus, PutTable, Regions, RemoteRegion};
use crate::framing::{FrameReader, RxError};
use crate::pool::{Chain, TokenPool};
use crate::sys;
use crate::transport::Stream;
use crate::types::{Addr, Completion, Mode, RecvKind, RegionKey, Stats, Transport};

/// Where a waiting message's bytes are.
#[derive(Debug)]
pub(crate) enum Body {
    /// Tokens of the pool.
    Staged(Chain),
    /// A buffer of its own: the message stalled while placed in a reader's
    /// buffer and was finished aside.
    Held(Vec<u8>),
}

/// Something waiting for the application in arrival order.
#[derive(Debug)]
pub(crate) enum Ready {
    Msg {
        from: Addr,
        mode: Mode,
        transport: Transport,
        len: usize,
        body: Body,
        via: Option<(u32, u32)>,
    },
    Placed {
        from: Addr,
        transport: Transport,
        via: Option<(u32, u32)>,
        key: RegionKey,
        offset: u64,
        len: usize,
    },
    Lost {
        peer: Addr,
        reason: String,
    },
}

/// Endpoint state the receive path writes into.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) id: u32,
    pub(crate) completion: Completion,
    pub(crate) max_message: u64,
    pub(crate) pool: TokenPool,
    pub(crate) ready: VecDeque<Ready>,
    pub(crate) ready_cap: usize,
    pub(crate) regions: Regions,
    pub(crate) puts: PutTable,
    pub(crate) stats: Stats,
    /// Probe on: record the stages of each message in `timings`.
    pub(crate) probe: bool,
    pub(crate) timings: crate::types::Timings,
}

impl Core {
    /// Copies `data` into a new chain; `None` (nothing kept) when the pool or
    /// the queue is full.
    pub(crate) fn stage(&mut self, data: &[u8]) -> Option<Chain> {
        if self.ready.len() >= self.ready_cap {
            return None;
        }
        let mut chain = Chain::EMPTY;
        let mut rest = data;
        while !rest.is_empty() {
            let Some(space) = self.pool.tail_space(&mut chain) else {
                self.pool.release(chain);
                return None;
            };
            let n = space.len().min(rest.len());
            space[..n].copy_from_slice(&rest[..n]);
            self.pool.commit(&chain, n);
            rest = &rest[n..];
        }
        Some(chain)
    }
}

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

/// One connection of an endpoint.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) peer: Addr,
    /// This connection's place in its endpoint (slot, generation).
    pub(crate) id: (u32, u32),
    /// The remote address this side dialled, for a rail made by `target_at`.
    pub(crate) rail: Option<std::net::SocketAddr>,
    pub(crate) stream: Stream,
    rx: FrameReader,
    asm: Asm,
    /// Since when a direct message has waited for more bytes.
    stalled: Option<Instant>,
    rx_seq: u64,
    /// The current frame passed its checks and is being read.
    frame_started: bool,
    pub(crate) tx_seq: u64,
    /// Control frames (put answers, region answers) waiting to be sent
    /// between messages, with their payload.
    pub(crate) ctrl_out: VecDeque<(Header, Vec<u8>)>,
    /// Payload of a control frame being read.
    /// The target's answer to our last region query: (key, length, file).
    pub(crate) region_reply: Option<Result<(u64, usize, std::os::fd::OwnedFd), Refusal>>,
    /// Target regions mapped for one-sided puts (shared memory only).
    pub(crate) remote: Vec<RemoteRegion>,
}

/// What one pass over a connection did.
#[derive(Debug)]
pub(crate) enum Step {
    Idle,
    Moved,
    Delivered(crate::types::Recv),
    /// A message fills the pool and the waiting reader's buffer is smaller.
    TooSmall(u64),
    Lost(String),
}

/// Longest a sleeping wait lasts before looking around again.
pub(crate) const NAP: Duration = Duration::from_millis(200);
/// How long a message placed straight into a reader's buffer may wait for
/// its next bytes before it is held aside (and the read looks at the other
/// connections, and at its deadline). Far longer than the gap between the
/// segments of a flowing message.
pub(crate) const HOLD: Duration = Duration::from_millis(20);

/// Idle polls between liveness checks of shared-memory peers.
pub(crate) const SPINS_PER_CHECK: u32 = 1 << 12;

impl Conn {
    pub(crate) fn new(peer: Addr, stream: Stream) -> Conn {
        Conn {
            peer,
            id: (u32::MAX, 0),
            rail: None,
            stream,
            rx: FrameReader::new(),
            asm: Asm::Idle,
            stalled: None,
            rx_seq: 0,
            frame_started: false,
            tx_seq: 0,
            ctrl_out: VecDeque::with_capacity(16),
            region_reply: None,
            remote: Vec::new(),
        }
    }

    /// Gives tokens of a half-staged message back (the connection is gone).
    pub(crate) fn release(&mut self, pool: &mut TokenPool) {
        if let Asm::Staged { chain, .. } = std::mem::replace(&mut self.asm, Asm::Idle) {
            pool.release(chain);
        }
    }

    fn violation(&self, core: &mut Core, what: &str) -> Step {
        core.stats.bad_frames += 1;
        tracing::warn!(peer = %self.peer, "protocol violation: {what}; closing the connection");
        Step::Lost(format!("protocol violation: {what}"))
    }

    /// Reads what has arrived. `user` is the buffer of a waiting read, if any.
    pub(crate) fn progress(&mut self, core: &mut Core, mut user: Option<&mut [u8]>) -> Step {
        let mut moved = false;
        loop {
            let h = match self.rx.header(&mut self.stream) {
                Ok(Some(h)) => {
                    self.stalled = None;
                    h
                }
                Ok(None) if matches!(self.asm, Asm::Direct { .. }) => {
                    // Between fragments of a message the reader's buffer holds.
                    match self.await_direct(core.completion, user.as_deref()) {
                        None => continue,
                        Some(step) => return step,
                    }
                }
                Ok(None) => return if moved { Step::Moved } else { Step::Idle },
                Err(RxError::Io(e)) => return Step::Lost(e.to_string()),
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
                FrameKind::RegionQuery => {
                    self.rx.finish();
                    let mut answer = Header::new(FrameKind::RegionInfo);
                    answer.key = h.key;
                    // The memory goes over the socket first; the answer that
                    // names it follows in the ring.
                    match core.regions.backing(h.key) {
                        Some((len, file)) => match self.stream.send_fd(file) {
                            Ok(()) => answer.total = len as u64,
                            Err(e) => {
                                tracing::warn!(peer = %self.peer, "cannot send a region: {e}");
                                answer.offset = Refusal::Malformed.code();
                            }
                        },
                        None => {
                            core.stats.puts_refused += 1;
                            answer.offset = Refusal::BadKey.code();
                        }
                    }
                    self.ctrl_out.push_back((answer, Vec::new()));
                    Step::Moved
                }
                FrameKind::RegionInfo => self.region_info(core, h),
                FrameKind::PutDone => {
                    self.rx.finish();
                    match core.regions.check(h.key, h.offset, h.total) {
                        Ok(_) => {
                            core.stats.bytes_in += h.total;
                            if h.flags.contains(macrolink_wire::Flags::NOTIFY) {
                                core.ready.push_back(Ready::Placed {
                                    from: self.peer,
                                    transport: self.stream.transport(),
                                    via: Some(self.id),
                                    key: RegionKey(h.key),
                                    offset: h.offset,
                                    len: h.total as usize,
                                });
                            }
                        }
                        Err(r) => {
                            core.stats.bad_frames += 1;
                            tracing::warn!(peer = %self.peer, "put notice for no region: {r}");
                        }
                    }
                    Step::Moved
                }
                FrameKind::Hello | FrameKind::HelloOk | FrameKind::HelloRefused => {
                    return self.violation(core, "handshake frame on an open connection")
                }
            };
            match step {
                Step::Moved => moved = true,
                Step::Idle => return if moved { Step::Moved } else { Step::Idle },
                done => return done,
            }
        }
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
                        core.timings.read_header = crate::sys::clock_ns();
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
                            match self.await_direct(core.completion, user.as_deref()) {
                                None => continue,
                                Some(step) => return step,
                            }
                        }
                        Ok(n) => {
                            self.stalled = None;
                            n
                        }
                        Err(e) => return Step::Lost(e.to_string()),
                    }
                }
                Asm::Held { buf, got, .. } => {
                    let at = *got as usize;
                    let left = self.rx.left();
                    match self.rx.payload(&mut self.stream, &mut buf[at..at + left]) {
                        Ok(0) => return if moved { Step::Moved } else { Step::Idle },
                        Ok(n) => n,
                        Err(e) => return Step::Lost(e.to_string()),
                    }
                }
                Asm::Staged {
                    chain,
                    total,
                    got,
                    mode,
                } => match core.pool.tail_space(chain) {
                    Some(space) => match self.rx.payload(&mut self.stream, space) {
                        Ok(0) => return if moved { Step::Moved } else { Step::Idle },
                        Ok(n) => {
                            core.pool.commit(chain, n);
                            n
                        }
                        Err(e) => return Step::Lost(e.to_string()),
                    },
                    None => {
                        // Pool exhausted: move into the reader's buffer if one
                        // large enough waits, else hold back.
                        if !core.ready.is_empty() {
                            return if moved { Step::Moved } else { Step::Idle };
                        }
                        let fits = user.as_ref().is_some_and(|b| b.len() as u64 >= *total);
                        let Some(buf) = user.as_deref_mut().filter(|_| fits) else {
                            if user.is_some() && !moved {
                                return Step::TooSmall(*total);
                            }
                            return if moved { Step::Moved } else { Step::Idle };
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
        let transport = self.stream.transport();
        match std::mem::replace(&mut self.asm, Asm::Idle) {
            Asm::Direct { mode, total, got } if got == total => {
                core.stats.messages_in += 1;
                core.stats.bytes_in += total;
                Step::Delivered(crate::types::Recv {
                    from: self.peer,
                    len: total as usize,
                    kind: RecvKind::Message(mode),
                    transport,
                    via: Some(self.id),
                })
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

    fn region_info(&mut self, core: &mut Core, h: Header) -> Step {
        if h.len != 0 {
            return self.violation(core, "region answer with a payload");
        }
        self.rx.finish();
        self.frame_started = false;
        self.region_reply = Some(if h.offset != 0 {
            Err(Refusal::from_code(h.offset))
        } else {
            match self.stream.take_fd() {
                Some(fd) => Ok((h.key, h.total as usize, fd)),
                None => return self.violation(core, "region answer without its memory"),
            }
        });
        Step::Moved
    }

    /// Sleeps or spins until more bytes of the direct message may have
    /// arrived (`None`: read on); once it has waited [`HOLD`], moves it out
    /// of the reader's buffer `user` (see [`hold`](Self::hold)). Otherwise
    /// the step to return.
    fn await_direct(&mut self, completion: Completion, user: Option<&[u8]>) -> Option<Step> {
        let now = Instant::now();
        let since = *self.stalled.get_or_insert(now);
        let Some(left) = HOLD.checked_sub(now - since).filter(|d| !d.is_zero()) else {
            self.hold(user);
            return Some(Step::Moved);
        };
        match completion {
            Completion::Poll => {
                for _ in 0..SPINS_PER_CHECK {
                    std::hint::spin_loop();
                }
                self.stream.check_alive();
            }
            Completion::Wait => {
                if self.stream.arm_read() {
                    let r = sys::wait_fd(self.stream.raw_fd(), sys::Interest::Read, left);
                    self.stream.disarm();
                    if let Err(e) = r {
                        return Some(Step::Lost(e.to_string()));
                    }
                } else {
                    self.stream.disarm();
                }
            }
        }
        None
    }

    /// Moves a stalled direct message out of the reader's buffer `user`
    /// into one of its own, so that the read can go on without it.
    fn hold(&mut self, user: Option<&[u8]>) {
        self.stalled = None;
        let Asm::Direct { mode, total, got } = self.asm else {
            return;
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
    }

    fn put(&mut self, core: &mut Core, h: Header) -> Step {
        if !self.frame_started {
            match &self.asm {
                Asm::Idle => {
                    self.asm = Asm::Put {
                        seq: h.seq,
                        key: h.key,
                        start: h.offset,
                        total: h.total,
                        got: 0,
                        region: core.regions.check(h.key, h.offset, h.total),
                        notify: h.flags.contains(macrolink_wire::Flags::NOTIFY),
                    };
                }
                Asm::Put {
                    seq,
                    key,
                    start,
                    total,
                    got,
                    ..
                } => {
                    if h.seq != *seq
                        || h.key != *key
                        || h.total != *total
                        || h.offset != start + got
                        || got + u64::from(h.len) > *total
                    {
                        return self.violation(core, "put fragment does not continue its put");
                    }
                }
                _ => return self.violation(core, "put inside a message"),
            }
            self.frame_started = true;
        }
        let Asm::Put { region, got, .. } = &mut self.asm else {
            unreachable!("put state")
        };
        let end = h.offset as usize + h.len as usize;
        let mut moved = false;
        while self.rx.left() > 0 {
            let r = match region {
                Ok(i) => {
                    let at = end - self.rx.left();
                    let mem = core.regions.slot_mut(*i);
                    self.rx.payload(&mut self.stream, &mut mem[at..end])
                }
                Err(_) => self.rx.discard(&mut self.stream),
            };
            match r {
                Ok(0) => return if moved { Step::Moved } else { Step::Idle },
                Ok(_) => moved = true,
                Err(e) => return Step::Lost(e.to_string()),
            }
        }
        self.rx.finish();
        self.frame_started = false;
        *got += u64::from(h.len);
        let Asm::Put {
            seq,
            key,
            start,
            total,
            got,
            region,
            notify,
        } = &self.asm
        else {
            unreachable!("put state")
        };
        if got < total {
            return Step::Moved;
        }
        let mut answer = Header::new(FrameKind::PutAck);
        answer.seq = *seq;
        match region {
            Ok(_) => {
                core.stats.bytes_in += total;
                if *notify {
                    core.ready.push_back(Ready::Placed {
                        from: self.peer,
                        transport: self.stream.transport(),
                        via: Some(self.id),
                        key: RegionKey(*key),
                        offset: *start,
                        len: *total as usize,
                    });
                }
            }
            Err(r) => {
                core.stats.puts_refused += 1;
                answer.kind = FrameKind::PutNack;
                answer.offset = r.code();
                tracing::debug!(peer = %self.peer, "put refused: {r}");
            }
        }
        self.ctrl_out.push_back((answer, Vec::new()));
        self.asm = Asm::Idle;
        Step::Moved
    }
}
