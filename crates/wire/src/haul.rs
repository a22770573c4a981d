//! Packets of the long-haul protocol between a pair of range-extension
//! relays, one UDP datagram each. Every packet names the sending relay's
//! session and carries a packet number that is never reused; a keyed hash
//! (added by the relay, not here) follows the encoded bytes.
//!
//! ```text
//!  "LH" ver kind │ session u64 │ pn u64 │ body
//!  Data   flow u32, node u32, offset u64, fin u8, len u16, bytes
//!  Reset  flow u32, node u32
//!  Ping   (nothing)
//!  Ack    delay_us u32, n u16, n × (first pn, last pn) newest first,
//!         m u16, m × (flow u32, credit limit u64)
//! ```

/// First bytes of every packet.
pub const HAUL_MAGIC: [u8; 2] = *b"LH";
/// Version of the long-haul protocol.
pub const HAUL_VERSION: u8 = 1;
/// Bytes before the body.
pub const HAUL_HEADER_LEN: usize = 4 + 8 + 8;
/// Bytes of a data packet before its payload.
pub const DATA_OVERHEAD: usize = HAUL_HEADER_LEN + 4 + 4 + 8 + 1 + 2;
/// Largest payload of one data packet.
pub const MAX_HAUL_PAYLOAD: usize = 65_000;
/// Most ranges one ack carries.
pub const MAX_ACK_RANGES: usize = 64;
/// Most credit limits one ack carries.
pub const MAX_CREDITS: usize = 128;

/// What is wrong with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HaulError {
    /// It ends before its fields do.
    #[error("truncated long-haul packet")]
    Truncated,
    /// Not a long-haul packet.
    #[error("not a long-haul packet")]
    BadMagic,
    /// A version this side does not speak.
    #[error("long-haul version {0}, this side speaks {HAUL_VERSION}")]
    BadVersion(u8),
    /// An unknown kind of packet.
    #[error("unknown long-haul packet kind {0}")]
    UnknownKind(u8),
    /// More than the limit of ranges, credits or payload.
    #[error("long-haul packet over a limit")]
    Oversize,
    /// Bytes after the body, a fin that is not 0 or 1, or ack ranges that
    /// are not newest first and apart.
    #[error("malformed long-haul packet")]
    Malformed,
}

/// What a packet carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    /// Bytes of one flow at `offset`; `fin` if they end it.
    Data {
        /// Flow id.
        flow: u32,
        /// Node the flow is for, on the receiving relay's segment.
        node: u32,
        /// Offset of the first byte in the flow.
        offset: u64,
        /// The flow ends after these bytes.
        fin: bool,
        /// The bytes.
        data: &'a [u8],
    },
    /// The flow is over, abruptly.
    Reset {
        /// Flow id.
        flow: u32,
        /// Node the flow is for.
        node: u32,
    },
    /// Asks for an ack (probe, keep-alive).
    Ping,
    /// One datagram of the fabric's datagram mode, for `node` on the
    /// receiving relay's segment: never resent, dropped when no room.
    Datagram {
        /// Node the datagram is for.
        node: u32,
        /// The fabric datagram, its header included.
        data: &'a [u8],
    },
    /// Packets received, and how far each flow may send.
    Ack(Ack),
}

/// Acknowledgement and credit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ack {
    /// How long the receiver held the newest packet before acking it.
    pub delay_us: u32,
    /// Inclusive ranges of packet numbers received, newest first.
    pub ranges: Vec<(u64, u64)>,
    /// Per flow, the offset up to which the sender may send.
    pub credits: Vec<(u32, u64)>,
}

/// One packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    /// The sending relay's session.
    pub session: u64,
    /// Packet number.
    pub pn: u64,
    /// What it carries.
    pub body: Body<'a>,
}

const DATA: u8 = 1;
const RESET: u8 = 2;
const PING: u8 = 3;
const ACK: u8 = 4;
const DATAGRAM: u8 = 5;
/// Bytes a datagram packet adds to the datagram it carries.
pub const DATAGRAM_OVERHEAD: usize = HAUL_HEADER_LEN + 4 + 2;

impl Packet<'_> {
    /// Bytes of the encoded packet.
    pub fn len(&self) -> usize {
        HAUL_HEADER_LEN
            + match &self.body {
                Body::Data { data, .. } => DATA_OVERHEAD - HAUL_HEADER_LEN + data.len(),
                Body::Reset { .. } => 8,
                Body::Ping => 0,
                Body::Datagram { data, .. } => DATAGRAM_OVERHEAD - HAUL_HEADER_LEN + data.len(),
                Body::Ack(a) => 4 + 2 + 16 * a.ranges.len() + 2 + 12 * a.credits.len(),
            }
    }

    /// Never empty: the header alone has bytes.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the packet into `out`, returning its length, or `None` if
    /// `out` is too small or a limit is passed.
    pub fn encode(&self, out: &mut [u8]) -> Option<usize> {
        let n = self.len();
        let out = out.get_mut(..n)?;
        let mut w = Writer { b: out, at: 0 };
        w.put(&HAUL_MAGIC);
        w.put(&[HAUL_VERSION]);
        let kind = match self.body {
            Body::Data { .. } => DATA,
            Body::Reset { .. } => RESET,
            Body::Ping => PING,
            Body::Datagram { .. } => DATAGRAM,
            Body::Ack(_) => ACK,
        };
        w.put(&[kind]);
        w.put(&self.session.to_le_bytes());
        w.put(&self.pn.to_le_bytes());
        match &self.body {
            Body::Data {
                flow,
                node,
                offset,
                fin,
                data,
            } => {
                if data.len() > MAX_HAUL_PAYLOAD {
                    return None;
                }
                w.put(&flow.to_le_bytes());
                w.put(&node.to_le_bytes());
                w.put(&offset.to_le_bytes());
                w.put(&[u8::from(*fin)]);
                w.put(&(data.len() as u16).to_le_bytes());
                w.put(data);
            }
            Body::Reset { flow, node } => {
                w.put(&flow.to_le_bytes());
                w.put(&node.to_le_bytes());
            }
            Body::Ping => {}
            Body::Datagram { node, data } => {
                if data.len() > MAX_HAUL_PAYLOAD {
                    return None;
                }
                w.put(&node.to_le_bytes());
                w.put(&(data.len() as u16).to_le_bytes());
                w.put(data);
            }
            Body::Ack(a) => {
                if a.ranges.len() > MAX_ACK_RANGES || a.credits.len() > MAX_CREDITS {
                    return None;
                }
                w.put(&a.delay_us.to_le_bytes());
                w.put(&(a.ranges.len() as u16).to_le_bytes());
                for (lo, hi) in &a.ranges {
                    w.put(&lo.to_le_bytes());
                    w.put(&hi.to_le_bytes());
                }
                w.put(&(a.credits.len() as u16).to_le_bytes());
                for (flow, limit) in &a.credits {
                    w.put(&flow.to_le_bytes());
                    w.put(&limit.to_le_bytes());
                }
            }
        }
        Some(n)
    }
}

impl<'a> Packet<'a> {
    /// Reads one whole packet; anything left over is an error.
    pub fn decode(b: &'a [u8]) -> Result<Packet<'a>, HaulError> {
        let mut r = Reader { b, at: 0 };
        if r.take(2)? != HAUL_MAGIC {
            return Err(HaulError::BadMagic);
        }
        let version = r.u8()?;
        if version != HAUL_VERSION {
            return Err(HaulError::BadVersion(version));
        }
        let kind = r.u8()?;
        let session = r.u64()?;
        let pn = r.u64()?;
        let body = match kind {
            DATA => {
                let flow = r.u32()?;
                let node = r.u32()?;
                let offset = r.u64()?;
                let fin = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(HaulError::Malformed),
                };
                let len = usize::from(r.u16()?);
                if len > MAX_HAUL_PAYLOAD {
                    return Err(HaulError::Oversize);
                }
                let data = r.take(len)?;
                if offset.checked_add(len as u64).is_none() {
                    return Err(HaulError::Malformed);
                }
                Body::Data {
                    flow,
                    node,
                    offset,
                    fin,
                    data,
                }
            }
            RESET => Body::Reset {
                flow: r.u32()?,
                node: r.u32()?,
            },
            PING => Body::Ping,
            DATAGRAM => {
                let node = r.u32()?;
                let len = usize::from(r.u16()?);
                if len > MAX_HAUL_PAYLOAD {
                    return Err(HaulError::Oversize);
                }
                Body::Datagram {
                    node,
                    data: r.take(len)?,
                }
            }
            ACK => {
                let delay_us = r.u32()?;
                let n = usize::from(r.u16()?);
                if n > MAX_ACK_RANGES {
                    return Err(HaulError::Oversize);
                }
                let mut ranges = Vec::with_capacity(n);
                for _ in 0..n {
                    let (lo, hi) = (r.u64()?, r.u64()?);
                    let apart = ranges
                        .last()
                        .is_none_or(|&(prev, _): &(u64, u64)| hi < prev);
                    if lo > hi || !apart {
                        return Err(HaulError::Malformed);
                    }
                    ranges.push((lo, hi));
                }
                let m = usize::from(r.u16()?);
                if m > MAX_CREDITS {
                    return Err(HaulError::Oversize);
                }
                let mut credits = Vec::with_capacity(m);
                for _ in 0..m {
                    credits.push((r.u32()?, r.u64()?));
                }
                Body::Ack(Ack {
                    delay_us,
                    ranges,
                    credits,
                })
            }
            k => return Err(HaulError::UnknownKind(k)),
        };
        if r.at != b.len() {
            return Err(HaulError::Malformed);
        }
        Ok(Packet { session, pn, body })
    }
}

struct Writer<'a> {
    b: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, s: &[u8]) {
        self.b[self.at..self.at + s.len()].copy_from_slice(s);
        self.at += s.len();
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HaulError> {
        let end = self.at.checked_add(n).ok_or(HaulError::Truncated)?;
        let s = self.b.get(self.at..end).ok_or(HaulError::Truncated)?;
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, HaulError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, HaulError> {
        let mut w = [0u8; 2];
        w.copy_from_slice(self.take(2)?);
        Ok(u16::from_le_bytes(w))
    }

    fn u32(&mut self) -> Result<u32, HaulError> {
        let mut w = [0u8; 4];
        w.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(w))
    }

    fn u64(&mut self) -> Result<u64, HaulError> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(p: &Packet<'_>) {
        let mut buf = vec![0u8; p.len()];
        assert_eq!(p.encode(&mut buf), Some(p.len()));
        assert_eq!(&Packet::decode(&buf).unwrap(), p);
        for cut in 0..buf.len() {
            assert!(Packet::decode(&buf[..cut]).is_err(), "cut at {cut}");
        }
        assert!(p.encode(&mut buf[..p.len() - 1]).is_none());
    }

    #[test]
    fn every_kind_round_trips_and_every_truncation_is_refused() {
        let data = [7u8; 100];
        for body in [
            Body::Data {
                flow: 3,
                node: 9,
                offset: 1 << 40,
                fin: true,
                data: &data,
            },
            Body::Reset { flow: 4, node: 2 },
            Body::Ping,
            Body::Datagram {
                node: 5,
                data: &data[..64],
            },
            Body::Ack(Ack {
                delay_us: 250,
                ranges: vec![(10, 12), (3, 8)],
                credits: vec![(1, 1 << 20), (3, 5)],
            }),
        ] {
            round_trip(&Packet {
                session: 0xfeed,
                pn: 77,
                body,
            });
        }
    }

    #[test]
    fn overlapping_or_unordered_ranges_and_bad_fins_are_refused() {
        let mut buf = [0u8; 128];
        let p = Packet {
            session: 1,
            pn: 1,
            body: Body::Ack(Ack {
                delay_us: 0,
                ranges: vec![(3, 8), (8, 9)],
                credits: vec![],
            }),
        };
        let n = p.encode(&mut buf).unwrap();
        assert_eq!(Packet::decode(&buf[..n]), Err(HaulError::Malformed));
        let p = Packet {
            session: 1,
            pn: 1,
            body: Body::Data {
                flow: 1,
                node: 1,
                offset: 0,
                fin: false,
                data: b"x",
            },
        };
        let n = p.encode(&mut buf).unwrap();
        buf[HAUL_HEADER_LEN + 16] = 2;
        assert_eq!(Packet::decode(&buf[..n]), Err(HaulError::Malformed));
        buf[HAUL_HEADER_LEN + 16] = 0;
        assert!(Packet::decode(&buf[..n + 1]).is_err(), "a byte too many");
        buf[2] = 9;
        assert_eq!(Packet::decode(&buf[..n]), Err(HaulError::BadVersion(9)));
    }

    proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Packet::decode(&b);
            let mut b = b;
            if b.len() >= 4 {
                b[..2].copy_from_slice(&HAUL_MAGIC);
                b[2] = HAUL_VERSION;
                b[3] %= 5;
                let _ = Packet::decode(&b);
            }
        }
    }
}
