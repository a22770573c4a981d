//! The names the messaging API speaks in.

use std::fmt;

/// An endpoint's address: (node id, endpoint id), as in DP-II's (NID, DPID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    /// Node id.
    pub node: u32,
    /// Endpoint id on that node.
    pub ep: u32,
}

impl Addr {
    /// The address of endpoint `ep` on node `node`.
    pub const fn new(node: u32, ep: u32) -> Addr {
        Addr { node, ep }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.node, self.ep)
    }
}

/// Transfer mode of a target, after the InfiniBand transport types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Unreliable, unordered, at most one MTU per message (like UD).
    Datagram,
    /// Connected, ordered, any size (like RC).
    Reliable,
    /// One-sided write into a registered region of the target (like RDMA write).
    Put,
}

/// Names the values of a kind go by on command lines and in tables, and
/// their parsing: `Transport::NAMES`, `"tcp".parse::<Transport>()`.
macro_rules! named {
    ($t:ty, $($v:path => $n:literal),+) => {
        impl $t {
            /// Every value's name.
            pub const NAMES: &'static [&'static str] = &[$($n),+];

            /// Its name.
            pub fn name(self) -> &'static str {
                match self {
                    $($v => $n),+
                }
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $t {
            type Err = UnknownName;
            fn from_str(s: &str) -> std::result::Result<$t, UnknownName> {
                match s {
                    $($n => Ok($v),)+
                    _ => Err(UnknownName {
                        name: s.to_string(),
                        known: Self::NAMES,
                    }),
                }
            }
        }
    };
}

/// A name that is not one of a kind's values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} is not one of {known:?}")]
pub struct UnknownName {
    /// The name given.
    pub name: String,
    /// The names there are.
    pub known: &'static [&'static str],
}

named!(Mode, Mode::Datagram => "datagram", Mode::Reliable => "reliable", Mode::Put => "put");

/// How bytes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Same host: rings in shared memory.
    Shm,
    /// TCP, one connection per pair of endpoints.
    Tcp,
    /// UDP, datagram mode only.
    Udp,
    /// UCX (the library under Open MPI and MPICH): InfiniBand, RoCE,
    /// shared memory or TCP, whichever UCX finds; all modes.
    Ucx,
}

named!(Transport, Transport::Shm => "shm", Transport::Tcp => "tcp", Transport::Udp => "udp", Transport::Ucx => "ucx");

/// How an endpoint waits for completions (the papers' "polling" and "event
/// driven" columns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Completion {
    /// Spin on the queues: lowest latency, one core busy.
    #[default]
    Poll,
    /// Sleep in the kernel until something arrives: no core burnt.
    Wait,
}

named!(Completion, Completion::Poll => "poll", Completion::Wait => "wait");

/// The pages a buffer lies on ([`IoBuf::on`](crate::IoBuf::on)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pages {
    /// Whatever the system gives an anonymous mapping (on most, 4 KiB).
    #[default]
    Base,
    /// Transparent huge pages: the buffer starts on a huge page and the
    /// kernel is asked to back it with them (`MADV_HUGEPAGE`).
    Huge,
}

named!(Pages, Pages::Base => "base", Pages::Huge => "huge");

/// A target made by [`Endpoint::target`](crate::Endpoint::target).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target(pub(crate) u32);

impl Target {
    /// Its number on the endpoint: targets are numbered 0, 1, 2, ...
    pub fn index(self) -> u32 {
        self.0
    }

    /// The target with that number; an endpoint refuses numbers it did not
    /// hand out with [`Error::BadTarget`](crate::Error::BadTarget).
    pub fn from_index(i: u32) -> Target {
        Target(i)
    }
}

/// Access key of a registered region; a put must present it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionKey(pub u64);

/// A posted put, to wait on with [`Endpoint::wait_put`](crate::Endpoint::wait_put).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PutHandle(pub(crate) u64);

/// What a read returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recv {
    /// Sending endpoint.
    pub from: Addr,
    /// Bytes of the message (copied to the front of the buffer), or bytes
    /// placed by a put.
    pub len: usize,
    /// Message or put notification.
    pub kind: RecvKind,
    /// Transport it came over.
    pub transport: Transport,
    /// The connection it came over (slot, generation), for
    /// [`Endpoint::reply_target`](crate::Endpoint::reply_target).
    pub(crate) via: Option<(u32, u32)>,
}

/// Kind of a [`Recv`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvKind {
    /// A message, sent in the given mode.
    Message(Mode),
    /// A put the initiator asked to notify: `len` bytes now stand at `offset`
    /// of the region with `key`. Nothing is copied into the read buffer.
    PutPlaced {
        /// Region written.
        key: RegionKey,
        /// Offset of the first byte written.
        offset: u64,
    },
}

/// Settings of one endpoint.
#[derive(Clone, Copy, Debug)]
pub struct EndpointConfig {
    /// Polling or waiting completion.
    pub completion: Completion,
    /// Tokens in the receive pool.
    pub tokens: usize,
    /// Bytes per token.
    pub token_size: usize,
    /// Largest message accepted (256 MiB by default); a peer announcing a
    /// larger one breaks the protocol and its connection is closed. An
    /// application that grows its buffer to what
    /// [`Error::BufferTooSmall`](crate::Error::BufferTooSmall) asks for
    /// grows it at most to this.
    pub max_message: u64,
    /// A write whose peer takes nothing for this long fails with
    /// [`Error::PeerLost`](crate::Error::PeerLost) and closes the
    /// connection (`None`: it waits as long as it takes, as a blocking send
    /// does). For endpoints that serve many peers, such as a gateway's, so
    /// that one that hangs cannot hold the others up.
    pub send_timeout: Option<std::time::Duration>,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            completion: Completion::Poll,
            tokens: 64,
            token_size: 64 * 1024,
            max_message: 256 << 20,
            send_timeout: None,
        }
    }
}

/// Counters of one endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Messages delivered to the application.
    pub messages_in: u64,
    /// Messages sent.
    pub messages_out: u64,
    /// Of the messages delivered, those the sender wrote straight into
    /// the buffer of a waiting read (shared memory, large reliable
    /// messages).
    pub messages_placed: u64,
    /// Messages whose sender stalled partway through one being read
    /// straight into a reader's buffer: each was moved into a buffer of its
    /// own (one allocation) so that the read could go on without it.
    pub messages_held: u64,
    /// Payload bytes delivered (messages and placed puts).
    pub bytes_in: u64,
    /// Payload bytes sent.
    pub bytes_out: u64,
    /// Frames that failed to decode or broke the protocol, and were dropped.
    pub bad_frames: u64,
    /// Datagrams dropped because no token was free.
    pub dropped_datagrams: u64,
    /// Puts refused (bad key, out of bounds, deregistered).
    pub puts_refused: u64,
    /// Connections and datagrams refused because they came from outside
    /// the fabric or the endpoint's session (see `Endpoint::bind_session`).
    pub strangers: u64,
}

/// Timestamps (from [`clock_ns`](crate::clock_ns)) of the last message
/// written and the last one read, when the endpoint's probe is on: the
/// stages of DP-II's latency breakdown
/// L = T_startup + T_send + T_net + T_delivery.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timings {
    /// `write` was called.
    pub write_enter: u64,
    /// The first frame header was built (end of T_startup).
    pub write_framed: u64,
    /// The transport had taken every byte (end of T_send).
    pub write_sent: u64,
    /// The receiver saw the header of the message (end of T_net).
    pub read_header: u64,
    /// The message was handed to the application (end of T_delivery).
    pub read_delivered: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_strangers_are_named() {
        for t in [
            Transport::Shm,
            Transport::Tcp,
            Transport::Udp,
            Transport::Ucx,
        ] {
            assert_eq!(t.to_string().parse::<Transport>(), Ok(t));
        }
        for m in [Mode::Datagram, Mode::Reliable, Mode::Put] {
            assert_eq!(m.name().parse::<Mode>(), Ok(m));
        }
        assert_eq!("wait".parse::<Completion>(), Ok(Completion::Wait));
        assert_eq!(Completion::NAMES, ["poll", "wait"]);
        let e = "ib".parse::<Transport>().unwrap_err();
        assert_eq!(
            e.to_string(),
            r#""ib" is not one of ["shm", "tcp", "udp", "ucx"]"#
        );
    }
}
