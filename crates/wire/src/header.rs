//! The one frame header every transport carries.

use thiserror::Error;

/// Bytes of an encoded [`Header`].
pub const HEADER_LEN: usize = 56;
/// First two bytes of every frame: "ML".
pub const MAGIC: u16 = 0x4c4d;
/// Wire version this crate speaks.
pub const VERSION: u8 = 2;
/// Largest payload of one frame. Larger reliable messages are fragmented.
pub const MAX_FRAME: u32 = 1 << 20;
/// Largest payload a datagram may carry on any transport (fits one UDP datagram
/// with its header).
pub const MAX_DATAGRAM: u32 = 65_000;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Connection request: `src_*` asks to reach endpoint `dst_ep`. The payload,
    /// if any, names the shared-memory segment of an shm connection.
    Hello = 1,
    /// Connection accepted. `offset` carries the endpoint's UDP port (0 = none).
    HelloOk = 2,
    /// Connection refused; `offset` holds a [`Refusal`] code.
    HelloRefused = 3,
    /// One unreliable message of at most one MTU; `total == len`, `offset == 0`.
    Datagram = 4,
    /// One fragment of a reliable message: bytes `offset..offset+len` of a
    /// message of `total` bytes. `seq` numbers messages on a connection.
    Data = 5,
    /// One fragment of a one-sided write: `len` bytes to place at region
    /// offset `offset` of the region named by `key`; the whole put covers
    /// `total` bytes. `seq` names the put.
    Put = 6,
    /// The put `seq` has been placed.
    PutAck = 7,
    /// The put `seq` was refused; `offset` holds a [`Refusal`] code.
    PutNack = 8,
    /// Shared memory: asks for direct access to the region named by `key`.
    RegionQuery = 9,
    /// Answer to a region query: `offset` holds 0 or a [`Refusal`] code;
    /// when 0, `total` is the region's length and the payload names the
    /// segment that backs it.
    RegionInfo = 10,
    /// Shared memory: the initiator placed `total` bytes at `offset` of region
    /// `key` itself (one-sided); sent only when the target asked to be told
    /// (`NOTIFY`).
    PutDone = 11,
    /// UCX: the target deregistered the region named by `key`; the
    /// initiator forgets its remote key and answers `Revoked`.
    Revoke = 12,
    /// UCX: the initiator no longer holds the remote key of region `key`.
    Revoked = 13,
    /// UCX: the receiver took `offset` more reliable messages off the
    /// connection; the sender may send that many more.
    Credit = 14,
    /// Shared memory: the sender wrote the whole reliable message of
    /// `total` bytes, numbered `seq` as a `Data` message would be, straight
    /// into the buffer the reader offered under `key`; no payload follows.
    Placed = 15,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Hello,
            2 => Self::HelloOk,
            3 => Self::HelloRefused,
            4 => Self::Datagram,
            5 => Self::Data,
            6 => Self::Put,
            7 => Self::PutAck,
            8 => Self::PutNack,
            9 => Self::RegionQuery,
            10 => Self::RegionInfo,
            11 => Self::PutDone,
            12 => Self::Revoke,
            13 => Self::Revoked,
            14 => Self::Credit,
            15 => Self::Placed,
            _ => return None,
        })
    }
}

/// Flag bits of a frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(pub u8);

impl Flags {
    /// Put: the target asks to be told when this put has been placed.
    pub const NOTIFY: Flags = Flags(1);
    /// Hello: asks only for the endpoint's UDP port; no connection follows.
    pub const RESOLVE_UDP: Flags = Flags(2);
    /// Hello: the connection is one rail of several to one peer; both ends
    /// give it up soon when its link goes dark, so traffic moves to the
    /// others.
    pub const RAIL: Flags = Flags(4);
    /// Hello, to a relay: the connection is for the far host's file
    /// service (its contact address), not its fabric node; the relay that
    /// heard the hello carries it there once the host proved the key.
    pub const CONTACT: Flags = Flags(8);
    /// Hello: the connection's data goes over UCX; once the node has
    /// answered, each side sends the other its UCX worker's address and the
    /// tag under which to send to it (see `macrolink_fabric`'s UCX
    /// transport), and the socket stays open to tell when the peer is gone.
    pub const UCX: Flags = Flags(16);
    const ALL: u8 = 0b1_1111;

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        Flags(self.0 | rhs.0)
    }
}

/// Why a connection or a put was refused, as carried on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// No endpoint with that id is open on the node.
    NoSuchEndpoint,
    /// The access key names no region of the target endpoint.
    BadKey,
    /// The write would reach outside the region.
    OutOfBounds,
    /// The request was malformed.
    Malformed,
    /// The peer did not prove the fabric's key.
    Unauthenticated,
    /// The endpoint serves one session, and the peer is not of it.
    OtherSession,
    /// Too many handshakes are pending; try again.
    Busy,
    /// The node does not carry the transport the hello asks for.
    Unsupported,
    /// The endpoint still holds answers that earlier connections of the
    /// peer's node never took (UCX's own sends): no new one until they go.
    Held,
    /// A code this version does not know.
    Other(u64),
}

impl Refusal {
    /// Code carried in a header's `offset` field.
    pub fn code(self) -> u64 {
        match self {
            Refusal::NoSuchEndpoint => 1,
            Refusal::BadKey => 2,
            Refusal::OutOfBounds => 3,
            Refusal::Malformed => 4,
            Refusal::Unauthenticated => 5,
            Refusal::OtherSession => 6,
            Refusal::Busy => 7,
            Refusal::Unsupported => 8,
            Refusal::Held => 9,
            Refusal::Other(c) => c,
        }
    }

    /// The refusal a code stands for.
    pub fn from_code(c: u64) -> Refusal {
        match c {
            1 => Refusal::NoSuchEndpoint,
            2 => Refusal::BadKey,
            3 => Refusal::OutOfBounds,
            4 => Refusal::Malformed,
            5 => Refusal::Unauthenticated,
            6 => Refusal::OtherSession,
            7 => Refusal::Busy,
            8 => Refusal::Unsupported,
            9 => Refusal::Held,
            c => Refusal::Other(c),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NoSuchEndpoint => f.write_str("no such endpoint"),
            Refusal::BadKey => f.write_str("wrong access key"),
            Refusal::OutOfBounds => f.write_str("outside the registered region"),
            Refusal::Malformed => f.write_str("malformed request"),
            Refusal::Unauthenticated => f.write_str("the fabric key was not proven"),
            Refusal::OtherSession => f.write_str("the endpoint serves another session"),
            Refusal::Busy => f.write_str("too many handshakes pending"),
            Refusal::Unsupported => f.write_str("the node does not carry that transport"),
            Refusal::Held => f.write_str(
                "answers to earlier connections of this node, never taken, are still held there",
            ),
            Refusal::Other(c) => write!(f, "refusal code {c}"),
        }
    }
}

/// Why bytes are not a valid frame header.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than a header.
    #[error("truncated header: {have} of {HEADER_LEN} bytes")]
    Truncated {
        /// Bytes present.
        have: usize,
    },
    /// The frame does not start with [`MAGIC`].
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// A wire version this crate does not speak.
    #[error("unsupported wire version {0}")]
    BadVersion(u8),
    /// An unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Flag bits that are not defined.
    #[error("undefined flag bits {0:#04x}")]
    BadFlags(u8),
    /// Reserved bytes not zero.
    #[error("reserved bytes set")]
    Reserved,
    /// A payload larger than the kind allows.
    #[error("{kind:?} payload of {len} bytes exceeds the limit of {max}")]
    Oversize {
        /// Frame kind.
        kind: FrameKind,
        /// Payload length announced.
        len: u64,
        /// Largest allowed.
        max: u64,
    },
    /// Fields that contradict each other (fragment outside its message, ...).
    #[error("inconsistent {kind:?} frame: {what}")]
    Inconsistent {
        /// Frame kind.
        kind: FrameKind,
        /// Which rule was broken.
        what: &'static str,
    },
    /// A UCX contact card that is not one.
    #[error(transparent)]
    Card(#[from] crate::ucx::CardError),
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// What the frame is.
    pub kind: FrameKind,
    /// Flag bits.
    pub flags: Flags,
    /// Node of the sending endpoint.
    pub src_node: u32,
    /// Sending endpoint.
    pub src_ep: u32,
    /// Receiving endpoint (on the node the frame is sent to).
    pub dst_ep: u32,
    /// Payload bytes that follow this header.
    pub len: u32,
    /// Message or put sequence number.
    pub seq: u64,
    /// Whole message or put length.
    pub total: u64,
    /// Fragment offset (Data), region offset (Put), code (HelloOk, refusals).
    pub offset: u64,
    /// Region access key (Put).
    pub key: u64,
}

impl Header {
    /// A header of `kind` with every other field zero.
    pub fn new(kind: FrameKind) -> Header {
        Header {
            kind,
            flags: Flags::default(),
            src_node: 0,
            src_ep: 0,
            dst_ep: 0,
            len: 0,
            seq: 0,
            total: 0,
            offset: 0,
            key: 0,
        }
    }

    /// Writes the header into its 56-byte wire form.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        self.encode_part(self.len, self.offset)
    }

    /// Encodes the header of one piece of this frame: with `len` and
    /// `offset` in place of its own (no copy of the header to change them,
    /// which costs a small message's send a stalled load).
    #[inline]
    pub fn encode_part(&self, len: u32, offset: u64) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = self.kind as u8;
        b[4] = self.flags.0;
        // b[5..8] reserved, zero.
        b[8..12].copy_from_slice(&self.src_node.to_le_bytes());
        b[12..16].copy_from_slice(&self.src_ep.to_le_bytes());
        b[16..20].copy_from_slice(&self.dst_ep.to_le_bytes());
        b[20..24].copy_from_slice(&len.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.total.to_le_bytes());
        b[40..48].copy_from_slice(&offset.to_le_bytes());
        b[48..56].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    /// Reads a header from the first [`HEADER_LEN`] bytes of `b` and checks
    /// that its fields are consistent. Bytes after the header are ignored.
    pub fn decode(b: &[u8]) -> Result<Header, WireError> {
        let b: &[u8; HEADER_LEN] = b
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Truncated { have: b.len() })?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let magic = u16_at(0);
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if b[2] != VERSION {
            return Err(WireError::BadVersion(b[2]));
        }
        let kind = FrameKind::from_u8(b[3]).ok_or(WireError::UnknownKind(b[3]))?;
        if b[4] & !Flags::ALL != 0 {
            return Err(WireError::BadFlags(b[4]));
        }
        if b[5..8] != [0, 0, 0] {
            return Err(WireError::Reserved);
        }
        let h = Header {
            kind,
            flags: Flags(b[4]),
            src_node: u32_at(8),
            src_ep: u32_at(12),
            dst_ep: u32_at(16),
            len: u32_at(20),
            seq: u64_at(24),
            total: u64_at(32),
            offset: u64_at(40),
            key: u64_at(48),
        };
        h.validate()?;
        Ok(h)
    }

    /// Checks the rules that tie the fields of one kind together.
    pub fn validate(&self) -> Result<(), WireError> {
        let kind = self.kind;
        let len = u64::from(self.len);
        let oversize = |max: u32| {
            if self.len > max {
                Err(WireError::Oversize {
                    kind,
                    len,
                    max: u64::from(max),
                })
            } else {
                Ok(())
            }
        };
        let bad = |what| Err(WireError::Inconsistent { kind, what });
        match kind {
            FrameKind::Hello | FrameKind::RegionInfo => oversize(4096),
            FrameKind::PutDone => {
                if self.len != 0 {
                    return bad("control frame with payload");
                }
                if self.offset.checked_add(self.total).is_none() {
                    return bad("put range overflows");
                }
                Ok(())
            }
            FrameKind::HelloOk
            | FrameKind::HelloRefused
            | FrameKind::PutAck
            | FrameKind::PutNack
            | FrameKind::RegionQuery
            | FrameKind::Revoke
            | FrameKind::Revoked
            | FrameKind::Credit
            | FrameKind::Placed => {
                if self.len != 0 {
                    return bad("control frame with payload");
                }
                Ok(())
            }
            FrameKind::Datagram => {
                oversize(MAX_DATAGRAM)?;
                if self.total != len || self.offset != 0 {
                    return bad("datagram must be one whole fragment");
                }
                Ok(())
            }
            FrameKind::Data => {
                oversize(MAX_FRAME)?;
                match self.offset.checked_add(len) {
                    Some(end) if end <= self.total => {}
                    _ => return bad("fragment reaches past the message"),
                }
                if self.len == 0 && self.total != 0 {
                    return bad("empty fragment of a non-empty message");
                }
                Ok(())
            }
            FrameKind::Put => {
                oversize(MAX_FRAME)?;
                if self.offset.checked_add(self.total).is_none() {
                    return bad("put range overflows");
                }
                if len > self.total {
                    return bad("fragment longer than the put");
                }
                if self.len == 0 && self.total != 0 {
                    return bad("empty fragment of a non-empty put");
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kinds() -> impl Strategy<Value = FrameKind> {
        (1u8..=15).prop_map(|k| FrameKind::from_u8(k).unwrap())
    }

    prop_compose! {
        fn any_header()(kind in kinds(), flags in 0u8..32, src_node: u32, src_ep: u32, dst_ep: u32,
                        len: u32, seq: u64, total: u64, offset: u64, key: u64) -> Header {
            Header { kind, flags: Flags(flags), src_node, src_ep, dst_ep, len, seq, total, offset, key }
        }
    }

    proptest! {
        #[test]
        fn valid_headers_round_trip(h in any_header()) {
            let bytes = h.encode();
            match h.validate() {
                Ok(()) => prop_assert_eq!(Header::decode(&bytes), Ok(h)),
                Err(e) => prop_assert_eq!(Header::decode(&bytes), Err(e)),
            }
        }

        #[test]
        fn data_fragments_round_trip(total in 1u64..1 << 40, off_frac in 0.0f64..1.0, len in 1u32..=MAX_FRAME,
                                     seq: u64, src: u32, dst: u32) {
            let offset = ((total - 1) as f64 * off_frac) as u64;
            let len = len.min(u32::try_from(total - offset).unwrap_or(u32::MAX));
            let mut h = Header::new(FrameKind::Data);
            h.src_ep = src; h.dst_ep = dst; h.seq = seq; h.total = total; h.offset = offset; h.len = len;
            prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = Header::decode(&bytes);
        }

        #[test]
        fn single_byte_corruption_never_panics(h in any_header(), at in 0usize..HEADER_LEN, v: u8) {
            let mut b = h.encode();
            b[at] = v;
            let _ = Header::decode(&b);
        }
    }

    #[test]
    fn truncated_is_reported() {
        let h = Header::new(FrameKind::PutAck).encode();
        assert_eq!(
            Header::decode(&h[..10]),
            Err(WireError::Truncated { have: 10 })
        );
    }

    #[test]
    fn malformed_fields_are_refused() {
        let mut b = Header::new(FrameKind::PutAck).encode();
        b[0] = 0;
        assert!(matches!(Header::decode(&b), Err(WireError::BadMagic(_))));
        let mut b = Header::new(FrameKind::PutAck).encode();
        b[2] = 9;
        assert_eq!(Header::decode(&b), Err(WireError::BadVersion(9)));
        let mut b = Header::new(FrameKind::PutAck).encode();
        b[3] = 99;
        assert_eq!(Header::decode(&b), Err(WireError::UnknownKind(99)));
        let mut b = Header::new(FrameKind::PutAck).encode();
        b[4] = 0x80;
        assert_eq!(Header::decode(&b), Err(WireError::BadFlags(0x80)));
        let mut b = Header::new(FrameKind::PutAck).encode();
        b[6] = 1;
        assert_eq!(Header::decode(&b), Err(WireError::Reserved));
    }

    #[test]
    fn oversize_datagram_is_refused() {
        let mut h = Header::new(FrameKind::Datagram);
        h.len = MAX_DATAGRAM + 1;
        h.total = u64::from(h.len);
        assert!(matches!(
            Header::decode(&h.encode()),
            Err(WireError::Oversize { .. })
        ));
    }

    #[test]
    fn fragment_past_its_message_is_refused() {
        let mut h = Header::new(FrameKind::Data);
        h.total = 100;
        h.offset = 90;
        h.len = 20;
        assert!(matches!(
            Header::decode(&h.encode()),
            Err(WireError::Inconsistent { .. })
        ));
        h.offset = u64::MAX;
        assert!(Header::decode(&h.encode()).is_err());
    }

    #[test]
    fn refusal_codes_round_trip() {
        for r in [
            Refusal::NoSuchEndpoint,
            Refusal::BadKey,
            Refusal::OutOfBounds,
            Refusal::Malformed,
            Refusal::Unauthenticated,
            Refusal::OtherSession,
            Refusal::Busy,
            Refusal::Unsupported,
            Refusal::Held,
            Refusal::Other(77),
        ] {
            assert_eq!(Refusal::from_code(r.code()), r);
        }
    }
}
