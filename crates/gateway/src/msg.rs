//! Messages between compute hosts, gateways and storage hosts, carried in
//! reliable macrolink messages: fixed little-endian fields, chunk data last.
//! Decoding rejects anything malformed with a typed error, never a panic.

use crate::stripe::Chunk;

/// An endpoint address as the messages carry it (node id, endpoint id).
pub type Addr = (u32, u32);

/// A gateway-layer message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg<'a> {
    /// Heartbeat to a gateway, answered by `Pong` with the same sequence.
    Ping { seq: u64 },
    /// Heartbeat answer.
    Pong { seq: u64 },
    /// Part of transfer `transfer` from `from` to `to`, relayed by a gateway.
    Chunk {
        transfer: u64,
        total: u64,
        chunk: Chunk,
        from: Addr,
        to: Addr,
        data: &'a [u8],
    },
    /// The storage host placed chunk `seq`; relayed back to `to`.
    Ack { transfer: u64, seq: u64, to: Addr },
    /// Every chunk is acknowledged: the whole transfer hashes to `hash`.
    Done {
        transfer: u64,
        hash: u64,
        from: Addr,
        to: Addr,
    },
    /// The storage host's verdict on the hash.
    Verdict { transfer: u64, ok: bool, to: Addr },
    /// Relayed to `to` and dropped there: it makes the gateway open its
    /// connection to `to`, which `to` then sends back through (a storage
    /// host sends to compute hosts only over connections gateways opened).
    Hello { from: Addr, to: Addr },
}

/// Why bytes are not a gateway message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MsgError {
    /// Shorter than its kind needs.
    Truncated,
    /// Unknown kind.
    UnknownKind(u8),
    /// Chunk whose data length differs from its header.
    BadLength,
}

const PING: u8 = 1;
const PONG: u8 = 2;
const CHUNK: u8 = 3;
const ACK: u8 = 4;
const DONE: u8 = 5;
const VERDICT: u8 = 6;
const HELLO: u8 = 7;

/// Bytes of a chunk message before its data.
pub const CHUNK_HEADER: usize = 1 + 8 * 5 + 16;

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MsgError> {
        if self.0.len() < n {
            return Err(MsgError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u64(&mut self) -> Result<u64, MsgError> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(w))
    }
    fn u32(&mut self) -> Result<u32, MsgError> {
        let mut w = [0u8; 4];
        w.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(w))
    }
    fn addr(&mut self) -> Result<Addr, MsgError> {
        Ok((self.u32()?, self.u32()?))
    }
}

fn put_addr(out: &mut Vec<u8>, a: Addr) {
    out.extend_from_slice(&a.0.to_le_bytes());
    out.extend_from_slice(&a.1.to_le_bytes());
}

/// Appends a chunk message without its data: `chunk.len` bytes of data are
/// to follow (so a sender can read them straight into place).
pub fn encode_chunk_head(
    transfer: u64,
    total: u64,
    chunk: Chunk,
    from: Addr,
    to: Addr,
    out: &mut Vec<u8>,
) {
    out.push(CHUNK);
    for v in [transfer, total, chunk.seq, chunk.offset, chunk.len] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    put_addr(out, from);
    put_addr(out, to);
}

impl<'a> Msg<'a> {
    /// Appends the wire form to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let u = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
        match self {
            Msg::Ping { seq } => {
                out.push(PING);
                u(out, *seq);
            }
            Msg::Pong { seq } => {
                out.push(PONG);
                u(out, *seq);
            }
            Msg::Chunk {
                transfer,
                total,
                chunk,
                from,
                to,
                data,
            } => {
                encode_chunk_head(*transfer, *total, *chunk, *from, *to, out);
                out.extend_from_slice(data);
            }
            Msg::Ack { transfer, seq, to } => {
                out.push(ACK);
                u(out, *transfer);
                u(out, *seq);
                put_addr(out, *to);
            }
            Msg::Done {
                transfer,
                hash,
                from,
                to,
            } => {
                out.push(DONE);
                u(out, *transfer);
                u(out, *hash);
                put_addr(out, *from);
                put_addr(out, *to);
            }
            Msg::Verdict { transfer, ok, to } => {
                out.push(VERDICT);
                u(out, *transfer);
                out.push(u8::from(*ok));
                put_addr(out, *to);
            }
            Msg::Hello { from, to } => {
                out.push(HELLO);
                put_addr(out, *from);
                put_addr(out, *to);
            }
        }
    }

    /// Reads a message; a chunk's data borrows from `b`.
    pub fn decode(b: &'a [u8]) -> Result<Msg<'a>, MsgError> {
        let mut r = Reader(b);
        let kind = r.take(1)?[0];
        Ok(match kind {
            PING => Msg::Ping { seq: r.u64()? },
            PONG => Msg::Pong { seq: r.u64()? },
            CHUNK => {
                let (transfer, total, seq, offset, len) =
                    (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
                let (from, to) = (r.addr()?, r.addr()?);
                if r.0.len() as u64 != len {
                    return Err(MsgError::BadLength);
                }
                Msg::Chunk {
                    transfer,
                    total,
                    chunk: Chunk { seq, offset, len },
                    from,
                    to,
                    data: r.0,
                }
            }
            ACK => Msg::Ack {
                transfer: r.u64()?,
                seq: r.u64()?,
                to: r.addr()?,
            },
            DONE => Msg::Done {
                transfer: r.u64()?,
                hash: r.u64()?,
                from: r.addr()?,
                to: r.addr()?,
            },
            VERDICT => Msg::Verdict {
                transfer: r.u64()?,
                ok: r.take(1)?[0] != 0,
                to: r.addr()?,
            },
            HELLO => Msg::Hello {
                from: r.addr()?,
                to: r.addr()?,
            },
            k => return Err(MsgError::UnknownKind(k)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_kind_round_trips() {
        let data = [9u8; 10];
        let msgs = [
            Msg::Ping { seq: 3 },
            Msg::Pong { seq: 4 },
            Msg::Chunk {
                transfer: 1,
                total: 100,
                chunk: Chunk {
                    seq: 2,
                    offset: 20,
                    len: 10,
                },
                from: (1, 2),
                to: (3, 4),
                data: &data,
            },
            Msg::Ack {
                transfer: 1,
                seq: 2,
                to: (1, 2),
            },
            Msg::Done {
                transfer: 1,
                hash: 77,
                from: (1, 2),
                to: (3, 4),
            },
            Msg::Verdict {
                transfer: 1,
                ok: true,
                to: (1, 2),
            },
            Msg::Hello {
                from: (1, 2),
                to: (3, 4),
            },
        ];
        for m in msgs {
            let mut b = Vec::new();
            m.encode(&mut b);
            assert_eq!(Msg::decode(&b), Ok(m.clone()));
            for cut in 0..b.len() {
                assert!(Msg::decode(&b[..cut]).is_err(), "{m:?} cut at {cut}");
            }
        }
        assert_eq!(Msg::decode(&[99]), Err(MsgError::UnknownKind(99)));
    }

    proptest! {
        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Msg::decode(&b);
        }
    }
}
