//! Receiver side of a striped transfer: places each chunk once, whatever
//! order and however many times it arrives.

use crate::stripe::Chunk;

/// Why a chunk was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AssembleError {
    /// Sequence number past the end.
    OutOfRange(u64),
    /// Offset or length that does not match its sequence number.
    Misshapen(u64),
}

/// Places chunks of a transfer of known size and chunk size.
#[derive(Clone, Debug)]
pub struct Assembler {
    total: u64,
    chunk: u64,
    have: Vec<bool>,
    count: u64,
    /// Chunks that arrived again and were dropped.
    pub duplicates: u64,
}

impl Assembler {
    /// A transfer of `total` bytes in chunks of `chunk`.
    pub fn new(total: u64, chunk: u64) -> Assembler {
        let chunk = chunk.max(1);
        Assembler {
            total,
            chunk,
            have: vec![false; total.div_ceil(chunk) as usize],
            count: 0,
            duplicates: 0,
        }
    }

    /// Places `data` (chunk `c`) into `out`, which holds the whole transfer.
    /// Returns whether it was new; either way the sender may be acknowledged.
    pub fn place(&mut self, c: Chunk, data: &[u8], out: &mut [u8]) -> Result<bool, AssembleError> {
        if out.len() as u64 != self.total {
            return Err(AssembleError::Misshapen(c.seq));
        }
        let new = self.accept(c, data.len())?;
        if new {
            out[c.offset as usize..(c.offset + c.len) as usize].copy_from_slice(data);
        }
        Ok(new)
    }

    /// Counts chunk `c`, carrying `len` bytes, as placed, for a receiver
    /// that writes it elsewhere (a file). Returns whether it was new: only
    /// a new chunk is to be written.
    pub fn accept(&mut self, c: Chunk, len: usize) -> Result<bool, AssembleError> {
        let slot = self
            .have
            .get_mut(c.seq as usize)
            .ok_or(AssembleError::OutOfRange(c.seq))?;
        let offset = c.seq * self.chunk;
        let want = self.chunk.min(self.total - offset);
        if c.offset != offset || c.len != want || len as u64 != want {
            return Err(AssembleError::Misshapen(c.seq));
        }
        if *slot {
            self.duplicates += 1;
            return Ok(false);
        }
        *slot = true;
        self.count += 1;
        Ok(true)
    }

    /// Chunks placed so far.
    pub fn placed(&self) -> u64 {
        self.count
    }

    /// Whether every chunk is in place.
    pub fn is_complete(&self) -> bool {
        self.count == self.have.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_land_once_in_any_order() {
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut a = Assembler::new(1000, 300);
        let mut out = vec![0u8; 1000];
        for seq in [3u64, 1, 1, 0, 2, 3] {
            let off = seq * 300;
            let len = 300.min(1000 - off);
            let c = Chunk {
                seq,
                offset: off,
                len,
            };
            a.place(c, &data[off as usize..(off + len) as usize], &mut out)
                .unwrap();
        }
        assert!(a.is_complete());
        assert_eq!(a.duplicates, 2);
        assert_eq!(out, data);
        let bad = Chunk {
            seq: 1,
            offset: 0,
            len: 300,
        };
        assert_eq!(
            a.place(bad, &data[..300], &mut out),
            Err(AssembleError::Misshapen(1))
        );
        let far = Chunk {
            seq: 9,
            offset: 2700,
            len: 1,
        };
        assert_eq!(
            a.place(far, &data[..1], &mut out),
            Err(AssembleError::OutOfRange(9))
        );
    }
}
