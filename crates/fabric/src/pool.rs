//! The token buffer pool: an endpoint's receive buffers, allocated once.
//!
//! As in DP-II, arriving data that the application has not yet asked for is
//! kept in fixed-size tokens. A message longer than one token occupies a
//! chain of them, linked through `next`. Allocation and release are a push
//! and a pop on a free stack sized at open: the receive path never allocates.

use crate::iobuf::IoBuf;

/// Index of no token.
const NIL: u32 = u32::MAX;

/// A chain of tokens holding one message, first to last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chain {
    head: u32,
    tail: u32,
}

impl Chain {
    pub(crate) const EMPTY: Chain = Chain {
        head: NIL,
        tail: NIL,
    };
}

/// Fixed set of equal tokens.
#[derive(Debug)]
pub(crate) struct TokenPool {
    mem: IoBuf,
    token: usize,
    used: Box<[u32]>,
    next: Box<[u32]>,
    free: Vec<u32>,
}

impl TokenPool {
    pub(crate) fn new(tokens: usize, token_size: usize) -> std::io::Result<TokenPool> {
        let tokens = tokens.clamp(1, NIL as usize - 1);
        Ok(TokenPool {
            // Page-aligned, so that socket reads into tokens run at full speed.
            mem: IoBuf::new(tokens * token_size)?,
            token: token_size,
            used: vec![0; tokens].into_boxed_slice(),
            next: vec![NIL; tokens].into_boxed_slice(),
            free: (0..tokens as u32).rev().collect(),
        })
    }

    /// Free tokens left.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.free.len()
    }

    /// Takes tokens for `len` bytes at once, counted as written, and puts
    /// where each part goes, in order, into `spaces` (cleared first), for a
    /// transport that writes them itself; `None`, taking nothing, when too
    /// few tokens are free.
    pub(crate) fn reserve(
        &mut self,
        len: usize,
        spaces: &mut Vec<(*mut u8, usize)>,
    ) -> Option<Chain> {
        spaces.clear();
        if len.div_ceil(self.token) > self.free.len() {
            return None;
        }
        let mut chain = Chain::EMPTY;
        let mut left = len;
        while left > 0 {
            let space = self.tail_space(&mut chain)?;
            let n = space.len().min(left);
            spaces.push((space.as_mut_ptr(), n));
            self.commit(&chain, n);
            left -= n;
        }
        Some(chain)
    }

    /// Bytes the pool holds when full.
    pub(crate) fn capacity(&self) -> usize {
        self.mem.len()
    }

    /// Writable space at the end of `chain`, taking a new token when the last
    /// one is full. `None` when the pool is exhausted.
    pub(crate) fn tail_space(&mut self, chain: &mut Chain) -> Option<&mut [u8]> {
        if chain.tail == NIL || self.used[chain.tail as usize] as usize == self.token {
            let t = self.free.pop()?;
            self.used[t as usize] = 0;
            self.next[t as usize] = NIL;
            if chain.tail == NIL {
                chain.head = t;
            } else {
                self.next[chain.tail as usize] = t;
            }
            chain.tail = t;
        }
        let t = chain.tail as usize;
        let start = t * self.token + self.used[t] as usize;
        let end = (t + 1) * self.token;
        Some(&mut self.mem[start..end])
    }

    /// Records that `n` bytes were written into the space `tail_space` gave.
    pub(crate) fn commit(&mut self, chain: &Chain, n: usize) {
        self.used[chain.tail as usize] += n as u32;
    }

    /// Copies the chain's bytes into `dst` (which must be long enough) and
    /// returns its tokens to the pool. Returns the bytes copied.
    pub(crate) fn drain_into(&mut self, chain: Chain, dst: &mut [u8]) -> usize {
        let mut at = 0;
        let mut t = chain.head;
        while t != NIL {
            let i = t as usize;
            let n = self.used[i] as usize;
            dst[at..at + n].copy_from_slice(&self.mem[i * self.token..i * self.token + n]);
            at += n;
            t = self.next[i];
            self.free.push(i as u32);
        }
        at
    }

    /// Returns the chain's tokens to the pool, dropping their bytes.
    pub(crate) fn release(&mut self, chain: Chain) {
        let mut t = chain.head;
        while t != NIL {
            self.free.push(t);
            t = self.next[t as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(pool: &mut TokenPool, chain: &mut Chain, mut data: &[u8]) -> bool {
        while !data.is_empty() {
            let Some(space) = pool.tail_space(chain) else {
                return false;
            };
            let n = space.len().min(data.len());
            space[..n].copy_from_slice(&data[..n]);
            pool.commit(chain, n);
            data = &data[n..];
        }
        true
    }

    #[test]
    fn chains_span_tokens_and_come_back() {
        let mut pool = TokenPool::new(4, 10).unwrap();
        let msg: Vec<u8> = (0..35).collect();
        let mut c = Chain::EMPTY;
        assert!(fill(&mut pool, &mut c, &msg));
        assert_eq!(pool.available(), 0);
        let mut out = vec![0; 35];
        assert_eq!(pool.drain_into(c, &mut out), 35);
        assert_eq!(out, msg);
        assert_eq!(pool.available(), 4);
    }

    #[test]
    fn a_reservation_takes_whole_tokens_or_nothing() {
        let mut pool = TokenPool::new(4, 10).unwrap();
        let mut spaces = Vec::new();
        assert!(pool.reserve(41, &mut spaces).is_none());
        assert_eq!(pool.available(), 4);
        let c = pool.reserve(25, &mut spaces).unwrap();
        assert_eq!(spaces.iter().map(|s| s.1).collect::<Vec<_>>(), [10, 10, 5]);
        assert_eq!(pool.available(), 1);
        let mut out = vec![0; 25];
        assert_eq!(pool.drain_into(c, &mut out), 25);
        assert_eq!(pool.available(), 4);
    }

    #[test]
    fn exhaustion_is_reported_not_grown() {
        let mut pool = TokenPool::new(2, 8).unwrap();
        let mut c = Chain::EMPTY;
        assert!(!fill(&mut pool, &mut c, &[7u8; 17]));
        assert_eq!(pool.available(), 0);
        pool.release(c);
        assert_eq!(pool.available(), 2);
        assert_eq!(pool.capacity(), 16);
    }
}
