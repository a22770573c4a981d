//! What can go wrong with an endpoint operation.

use macrolink_wire::{Refusal, WireError};
use std::io;
use thiserror::Error;

use crate::types::{Addr, Mode, Transport};

/// An endpoint operation failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A datagram longer than one MTU.
    #[error("datagram of {len} bytes exceeds the MTU of {mtu} bytes")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// Largest datagram.
        mtu: usize,
    },
    /// The read buffer cannot hold the next message; it stays queued.
    #[error("next message has {needed} bytes; the read buffer holds {have}")]
    BufferTooSmall {
        /// Bytes of the message.
        needed: usize,
        /// Bytes of the buffer.
        have: usize,
    },
    /// The endpoint id is already open on this node.
    #[error("endpoint {0} is already open on this node")]
    EndpointInUse(u32),
    /// The remote node has no such endpoint open.
    #[error("no endpoint {0} is open")]
    NoSuchEndpoint(Addr),
    /// No way is known to reach the node.
    #[error("node {node} is not reachable over {transport}")]
    Unreachable {
        /// Node asked for.
        node: u32,
        /// Transport asked for.
        transport: Transport,
    },
    /// The transport does not carry the mode.
    #[error("{transport} does not carry {mode} mode")]
    Unsupported {
        /// Transport asked for.
        transport: Transport,
        /// Mode asked for.
        mode: Mode,
    },
    /// The call does not fit the target's mode (write on a put target, ...).
    #[error("the target is in {0} mode")]
    WrongMode(Mode),
    /// The target handle does not belong to this endpoint.
    #[error("unknown target")]
    BadTarget,
    /// The peer process died or the connection broke; its targets are dead.
    #[error("lost the connection to {peer}: {reason}")]
    PeerLost {
        /// Remote endpoint.
        peer: Addr,
        /// What happened.
        reason: String,
    },
    /// The target refused a put; its region is unchanged.
    #[error("put refused by the target: {0}")]
    PutRefused(Refusal),
    /// The peer's node refused the connection.
    #[error("{peer} refused the connection: {why}")]
    Refused {
        /// Endpoint that was dialled.
        peer: Addr,
        /// Why.
        why: Refusal,
    },
    /// The peer could not prove the fabric key.
    #[error("{peer} did not prove the fabric key: it is not of this cluster (check MACROLINK_SECRET or MACROLINK_SECRET_FILE on both)")]
    Unauthenticated {
        /// Endpoint that was dialled.
        peer: Addr,
    },
    /// The region key is not registered on this endpoint.
    #[error("no region with that key")]
    NoSuchRegion,
    /// A copy in or out of a region would reach past its end.
    #[error("{len} bytes at {offset} reach outside the region of {region} bytes")]
    OutsideRegion {
        /// First byte asked for.
        offset: usize,
        /// Bytes asked for.
        len: usize,
        /// Bytes of the region.
        region: usize,
    },
    /// The peer sent something that is not macrolink.
    #[error("protocol error from {peer}: {source}")]
    Protocol {
        /// Remote side.
        peer: String,
        /// Decoder's word.
        #[source]
        source: WireError,
    },
    /// UCX was asked for on a node started without it.
    #[error("this node was started without UCX: enable it (NodeConfig::ucx, or --transport ucx on the command line) on both sides")]
    NoUcx,
    /// UCX is not installed, or could not start.
    #[error(transparent)]
    UcxMissing(#[from] crate::transport::ucx::Missing),
    /// A wait ran out of time.
    #[error("timed out")]
    Timeout,
    /// An operating-system call failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::Io(e) => e.kind(),
            Error::TooLarge { .. } | Error::BufferTooSmall { .. } => io::ErrorKind::InvalidInput,
            Error::PeerLost { .. } => io::ErrorKind::ConnectionAborted,
            Error::NoSuchEndpoint(_) | Error::PutRefused(_) => io::ErrorKind::ConnectionRefused,
            Error::Timeout => io::ErrorKind::TimedOut,
            Error::Protocol { .. } => io::ErrorKind::InvalidData,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// Result of an endpoint operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;
