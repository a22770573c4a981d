//! Transports ("providers"): how messages and puts get from one endpoint to
//! another. Every `unsafe` block of the fabric is in here.
//!
//! ```text
//!              Endpoint (targets, modes, the send and read loops)
//!                 │ Box<dyn Connection>: one per peer endpoint
//!     ┌───────────┼──────────────────────┬───────────────────┐
//!  Framed<ShmStream>   Framed<TcpStream>      ucx::Conn       udp::Udp (a socket
//!  (frames over a byte stream: framed.rs)  (UCP tag messages,   per endpoint, no
//!     │ one-sided: a mapped region        active messages,    connection)
//!     │                                   puts into rkeys)
//!  contact.rs: dialling, the hello handshake, acceptors
//! ```
//!
//! A [`Connection`] carries frames (a message, a put, a control answer)
//! and receives into the endpoint's [`Core`]; what it can do is its
//! [`Caps`]. Transports whose puts need no work from the target reach the
//! target's regions through [`OneSided`]. Byte-stream transports implement
//! [`ByteStream`] and get framing from [`framed::Framed`].

pub(crate) mod contact;
pub(crate) mod framed;
pub(crate) mod memfd;
pub(crate) mod offer;
pub(crate) mod porter;
pub(crate) mod region;
pub(crate) mod shm;
pub(crate) mod sys;
pub(crate) mod tcp;
pub(crate) mod ucx;
pub(crate) mod udp;

use macrolink_wire::{Header, Refusal};
use std::collections::VecDeque;
use std::fmt;
use std::io::{self, IoSlice};
use std::os::fd::{OwnedFd, RawFd};

use crate::iobuf::IoBuf;
use crate::pool::TokenPool;
use crate::rx::{Core, Step};
use crate::types::{Mode, Transport};
use sys::Interest;

/// What a transport can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Caps {
    /// Delivers every byte or reports the peer lost.
    pub reliable: bool,
    /// Delivers in the order sent.
    pub ordered: bool,
    /// Carries reliable and put modes: a connection per pair of endpoints.
    pub connected: bool,
    /// Largest message it carries (`None`: any size, up to what the
    /// receiving endpoint accepts). Datagrams are one MTU on every
    /// transport.
    pub max_message: Option<usize>,
    /// Places puts without the target's processor, once the initiator has
    /// the region (shared memory; RDMA).
    pub one_sided_put: bool,
    /// A put is placed only while the target's endpoint makes progress.
    pub put_needs_target: bool,
    /// A reader waiting on a message whose sender stalls half-way sets it
    /// aside after a short while and goes on with other peers (byte
    /// streams); otherwise the read waits for that sender, as a posted
    /// receive does.
    pub sets_stalled_aside: bool,
    /// A write may wait until the peer's endpoint makes progress (UCX: the
    /// first message of a connection, a full socket, a large message sent
    /// by rendezvous), as `MPI_Send` may; elsewhere the transport buffers
    /// what the peer has not read yet, up to its ring or socket buffer.
    pub sends_wait_for_peer: bool,
}

impl Transport {
    /// What this transport can do.
    pub fn caps(self) -> Caps {
        let connected = Caps {
            reliable: true,
            ordered: true,
            connected: true,
            max_message: None,
            one_sided_put: false,
            put_needs_target: true,
            sets_stalled_aside: true,
            sends_wait_for_peer: false,
        };
        match self {
            Transport::Shm => Caps {
                one_sided_put: true,
                put_needs_target: false,
                ..connected
            },
            Transport::Tcp => connected,
            Transport::Udp => Caps {
                reliable: false,
                ordered: false,
                connected: false,
                max_message: Some(macrolink_wire::MAX_DATAGRAM as usize),
                one_sided_put: false,
                put_needs_target: true,
                sets_stalled_aside: false,
                sends_wait_for_peer: false,
            },
            // Over UCX's tcp transport the target's worker places puts;
            // over shared memory and RDMA it does not.
            Transport::Ucx => Caps {
                one_sided_put: true,
                sets_stalled_aside: false,
                sends_wait_for_peer: true,
                ..connected
            },
        }
    }
}

/// A connected byte stream (shared-memory rings, a TCP socket), which
/// [`framed::Framed`] cuts into frames.
pub(crate) trait ByteStream: fmt::Debug + Send {
    /// Which transport this is.
    fn transport(&self) -> Transport;
    /// Takes as many bytes of `bufs` as it can without blocking.
    fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Whether [`try_write`](Self::try_write) would take `len` bytes now:
    /// the stream holds nothing yet, or has room for them. True where the
    /// transport cannot tell.
    fn can_take(&self, _len: usize) -> bool {
        true
    }
    /// Reads what is there without blocking; `Ok(0)` means nothing now, end
    /// of stream is an error. The room the bytes read leave reaches the
    /// writer at [`read_done`](Self::read_done) at the latest.
    fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize>;
    /// Reads a frame's header into `head` and, in the same read, what
    /// follows it straight into `body` (the reader's buffer), where the
    /// stream can and a read now would ask the kernel: `Some` of the bytes
    /// read, `head` filled first, as [`try_read`](Self::try_read) counts
    /// them. Bytes of `body` beyond the frame go back with
    /// [`unread`](Self::unread). `None`: the caller reads as usual.
    fn try_read_split(&mut self, _head: &mut [u8], _body: &mut [u8]) -> Option<io::Result<usize>> {
        None
    }
    /// Puts back `bytes`, the last that [`try_read_split`](Self::try_read_split)
    /// read: the next reads give them first.
    fn unread(&mut self, bytes: &[u8]) {
        debug_assert!(
            bytes.is_empty(),
            "a stream that reads no split gets nothing back"
        );
    }
    /// Ends a pass of reads (a frame's header and payload are two): the
    /// writer sees the room they left. Called before any wait.
    fn read_done(&mut self) {}
    /// The descriptor to poll while sleeping on this stream.
    fn raw_fd(&self) -> RawFd;
    /// What to poll `raw_fd` for while waiting for room to write.
    fn write_interest(&self) -> Interest;
    /// Prepares to sleep until readable; false when data is already there.
    fn arm_read(&mut self) -> bool {
        true
    }
    /// Prepares to sleep until `need` bytes can be written; false when they can.
    fn arm_write(&mut self, _need: usize) -> bool {
        true
    }
    /// Ends a sleep.
    fn disarm(&mut self) {}
    /// Notices a peer that has gone while we poll without sleeping.
    fn check_alive(&mut self) {}
    /// Sleeps in the stream's own read until bytes come or a short while
    /// goes by (see `tcp`), and keeps what came for the next
    /// [`try_read`](Self::try_read): true when something came (or the
    /// stream ended or failed, which that read says), false when nothing
    /// did. `None` where the stream cannot, or holds bytes read ahead.
    fn sleep_read(&mut self) -> Option<bool> {
        None
    }
    /// Whether [`sleep_read`](Self::sleep_read) may sleep at all: false
    /// where the stream has no such sleep, or its socket cannot block.
    fn can_sleep_read(&self) -> bool {
        false
    }
    /// Forgets that the last read emptied the stream: the next read looks
    /// (a look that must not miss what is there, as `try_read`'s).
    fn look_again(&mut self) {}
    /// A `poll` of `raw_fd` just found nothing to read: what would read
    /// it next (a tcp read, the end of a shared-memory sleep) may skip its
    /// system call.
    fn quiet(&mut self) {}
    /// Whether a wait set may watch `raw_fd` edge-triggered (see
    /// [`rang`](Self::rang)).
    fn edge(&self) -> bool {
        false
    }
    /// A wait set that watches `raw_fd` edge-triggered reported it,
    /// written into or hung up (`gone`), in a sleep or in a look outside
    /// one: said once, it is taken now, and the sleep's end need not read
    /// it.
    fn rang(&mut self, _gone: bool) {}
    /// Reads nothing until [`look_again`](Self::look_again): its
    /// endpoint's wait set says when.
    fn cold(&self) -> bool {
        false
    }
    /// Its endpoint's wait set watches it (or no longer does).
    fn watched(&mut self, _on: bool) {}
    /// Sends a descriptor to the peer (shared memory only).
    fn send_fd(&self, _fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    /// The oldest descriptor the peer sent (shared memory only).
    fn take_fd(&mut self) -> Option<OwnedFd> {
        None
    }
    /// Reader: offers `buf` to the sender for the next message (shared
    /// memory only, see [`offer`]); `buf` stays untouched until
    /// [`withdraw`](Self::withdraw).
    fn offer(&mut self, _buf: &mut [u8]) -> bool {
        false
    }
    /// Reader: takes the offer back; true when a message was placed in it.
    fn withdraw(&mut self) -> bool {
        false
    }
    /// Reader: whether a `Placed` frame for offer `gen` of `total` bytes
    /// is due.
    fn take_placed(&mut self, _gen: u64, _total: u64) -> bool {
        false
    }
    /// Sender: places `payload` in the buffer the reader offers, if any;
    /// `Some(gen)` when it did.
    fn place(&mut self, _payload: &[u8]) -> io::Result<Option<u64>> {
        Ok(None)
    }
    /// Sender: the `Placed` frame of offer `gen` has been written.
    fn placed(&mut self, _gen: u64) {}
}

/// How far a connection has got with the frame it is sending.
#[derive(Debug, Default)]
pub(crate) struct SendState {
    /// Payload bytes of earlier fragments, all taken.
    pub(crate) done: usize,
    /// Bytes of the current fragment, its header first, taken.
    pub(crate) sent: usize,
    /// The transport holds the frame and reports when it is done (UCX).
    pub(crate) posted: bool,
}

/// A peer's answer to a region query, before the connection maps it.
#[derive(Debug)]
pub(crate) enum RegionAnswer {
    /// Shared memory: the memory itself.
    Mapped { key: u64, len: usize, fd: OwnedFd },
    /// UCX: the region's address in the target and its packed remote key.
    Ucx {
        key: u64,
        len: usize,
        base: u64,
        rkey: Vec<u8>,
    },
}

/// What a connection's receive side leaves for the endpoint besides
/// messages: answers to send between messages, and the peer's answer to a
/// region query.
#[derive(Debug, Default)]
pub(crate) struct Control {
    /// Frames (put answers, region answers) waiting to go, with payload.
    pub(crate) out: VecDeque<(Header, Vec<u8>)>,
    /// The peer's answer to our last region query.
    pub(crate) region_reply: Option<Result<RegionAnswer, Refusal>>,
}

/// One connection of an endpoint to one peer endpoint.
pub(crate) trait Connection: fmt::Debug + Send {
    /// Which transport carries it.
    fn transport(&self) -> Transport;
    /// What it can do.
    fn caps(&self) -> Caps {
        self.transport().caps()
    }
    /// Takes what it can of the frame `h` carrying `payload` (a whole
    /// message, put or control frame) without blocking, going on from
    /// `st`; true once all of it is taken and `payload` may be reused.
    fn send(&mut self, h: &Header, payload: &[u8], st: &mut SendState) -> io::Result<bool>;
    /// Whether a message of `len` bytes in `mode` would be taken now
    /// without waiting for what the connection already holds to leave
    /// (see [`Endpoint::can_take`](crate::Endpoint::can_take)).
    fn can_take(&self, _len: usize, _mode: Mode) -> bool {
        true
    }
    /// Reads what has arrived for it into `core`, or straight into `user`,
    /// the buffer of a waiting read.
    fn progress(&mut self, core: &mut Core, user: Option<&mut [u8]>) -> Step;
    /// Gives back what it holds of the endpoint's pool (it is going away).
    fn release(&mut self, _pool: &mut TokenPool) {}
    /// Prepares to sleep until it has something to read; false when it has.
    fn arm_read(&mut self) -> bool;
    /// Prepares to sleep until `need` bytes may be sent; false when they may.
    fn arm_write(&mut self, need: usize) -> bool;
    /// Ends a sleep.
    fn disarm(&mut self);
    /// The descriptor to poll while sleeping until it has something to read.
    fn read_fd(&self) -> RawFd;
    /// The descriptor, and what for, to poll while waiting to send.
    fn write_wait(&self) -> (RawFd, Interest);
    /// Longest sleep on [`write_wait`](Self::write_wait) before looking
    /// again without being woken.
    fn write_nap(&self) -> std::time::Duration {
        crate::rx::NAP
    }
    /// Notices a peer that has gone while the endpoint polls.
    fn check_alive(&mut self);
    /// Sleeps in its stream's own read (see
    /// [`ByteStream::sleep_read`]): whether something came, or `None`.
    fn sleep_read(&mut self) -> Option<bool> {
        None
    }
    /// Whether its stream may sleep in its own read (see
    /// [`ByteStream::can_sleep_read`]).
    fn can_sleep_read(&self) -> bool {
        false
    }
    /// The next pass looks for what has arrived, whatever the last said.
    fn look_again(&mut self) {}
    /// The sleep's `poll` found nothing on [`read_fd`](Self::read_fd).
    fn quiet(&mut self) {}
    /// Whether a wait set may watch [`read_fd`](Self::read_fd)
    /// edge-triggered.
    fn read_edge(&self) -> bool {
        false
    }
    /// A wait set that watches [`read_fd`](Self::read_fd) edge-triggered
    /// reported it, written into or hung up (`gone`), in a sleep or in a
    /// look outside one.
    fn rang(&mut self, _gone: bool) {}
    /// Its endpoint's wait set watches it (or no longer does): cold, it
    /// reads nothing until told to look again (see `tcp`).
    fn watched(&mut self, _on: bool) {}
    /// Answers and replies its receive side left.
    fn control(&mut self) -> &mut Control;
    /// Its one-sided access to the peer's regions, if the transport has it.
    fn one_sided(&mut self) -> Option<&mut dyn OneSided> {
        None
    }
    /// Offers `buf`, the buffer of a read about to sleep, for the next
    /// message to be written straight into (shared memory); `buf` stays
    /// untouched until [`withdraw`](Self::withdraw).
    fn offer(&mut self, _buf: &mut [u8]) -> bool {
        false
    }
    /// Takes the offer back; true when a message was placed in the buffer
    /// and the next [`progress`](Self::progress) with it delivers it.
    fn withdraw(&mut self) -> bool {
        false
    }
    /// The UCX connection under it, for the endpoint's UCX worker to hand
    /// what it receives to.
    fn ucx(&mut self) -> Option<&mut ucx::Conn> {
        None
    }
}

/// Puts into the peer's regions without the peer's processor.
pub(crate) trait OneSided {
    /// Index of the peer's region `key` among those reached, if reached.
    fn find(&self, key: u64) -> Option<usize>;
    /// Reaches the region the peer's answer describes; returns its index.
    fn adopt(&mut self, answer: RegionAnswer) -> io::Result<usize>;
    /// Bytes of region `i`.
    fn len(&self, i: usize) -> usize;
    /// Whether the peer has deregistered region `i`.
    fn revoked(&self, i: usize) -> bool;
    /// Forgets region `i`.
    fn forget(&mut self, i: usize);
    /// Writes `data` at `offset` of region `i` (the caller checked the
    /// bounds); `data` may be reused once this returns.
    fn write(&mut self, i: usize, offset: usize, data: &[u8]) -> io::Result<()>;
    /// Writes `len` bytes, which `fill` produces, at `offset` of region
    /// `i` (the caller checked the bounds): in place where the transport
    /// maps the region (it overrides this), else through `scratch`.
    fn fill(
        &mut self,
        i: usize,
        offset: usize,
        len: usize,
        scratch: &mut IoBuf,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        scratch.ensure(len)?;
        fill(&mut scratch[..len])?;
        self.write(i, offset, &scratch[..len])
    }
    /// Moves the puts made so far towards the target's memory; true once
    /// every one of them is there.
    fn flush(&mut self) -> io::Result<bool> {
        Ok(true)
    }
}
