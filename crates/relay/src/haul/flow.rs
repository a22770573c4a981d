//! One flow through the relay pair, both ways: the bytes this relay sends
//! (kept until acked, resent where lost) and the bytes it receives (put in
//! order, held until the local side takes them, credit granted for room).

use rangemap::RangeSet;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;

/// What goes out: bytes from `base` on, kept until acked.
#[derive(Debug, Default)]
pub(crate) struct SendHalf {
    /// Offset of `buf[0]`.
    base: u64,
    buf: VecDeque<u8>,
    /// Next offset never sent.
    next: u64,
    /// The peer's credit: offsets below may be sent.
    pub limit: u64,
    /// The local side has no more to write.
    pub finished: bool,
    fin_sent: bool,
    fin_acked: bool,
    acked: RangeSet<u64>,
    lost: RangeSet<u64>,
    /// The fin went out and was lost (resend it).
    fin_lost: bool,
    /// The peer must hear of the flow even before it has bytes.
    pub announce: bool,
    /// The peer has acked a piece of it (its announcement included).
    answered: bool,
}

/// A piece of a flow to put in a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub offset: u64,
    pub len: usize,
    pub fin: bool,
    pub resent: bool,
}

impl SendHalf {
    /// Bytes written and not yet acked.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    pub fn write(&mut self, data: &[u8]) {
        debug_assert!(!self.finished);
        self.buf.extend(data);
    }

    /// Offset after the last byte written.
    fn end(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    /// The next piece to send, of at most `max` bytes: a lost one first,
    /// then new bytes within credit, then a lone fin.
    pub fn next_piece(&self, max: usize) -> Option<Piece> {
        if let Some(r) = self.lost.iter().next() {
            let len = ((r.end - r.start) as usize).min(max);
            let fin = self.finished && r.start + len as u64 == self.end();
            return Some(Piece {
                offset: r.start,
                len,
                fin,
                resent: true,
            });
        }
        let room = self.limit.saturating_sub(self.next);
        let len = ((self.end() - self.next).min(room) as usize).min(max);
        let fin = self.finished && !self.fin_sent && self.next + len as u64 == self.end();
        if len > 0 || fin {
            return Some(Piece {
                offset: self.next,
                len,
                fin,
                resent: false,
            });
        }
        if self.announce {
            return Some(Piece {
                offset: 0,
                len: 0,
                fin: false,
                resent: false,
            });
        }
        if self.fin_lost {
            return Some(Piece {
                offset: self.end(),
                len: 0,
                fin: true,
                resent: true,
            });
        }
        None
    }

    /// Whether new bytes wait for credit.
    pub fn blocked(&self) -> bool {
        self.lost.is_empty() && self.next < self.end() && self.next >= self.limit
    }

    /// The bytes of a piece (two slices: the ring may wrap).
    pub fn bytes(&self, p: &Piece) -> (&[u8], &[u8]) {
        let start = (p.offset - self.base) as usize;
        let (a, b) = self.buf.as_slices();
        let end = start + p.len;
        if end <= a.len() {
            (&a[start..end], &[])
        } else if start >= a.len() {
            (&b[start - a.len()..end - a.len()], &[])
        } else {
            (&a[start..], &b[..end - a.len()])
        }
    }

    /// The piece went out.
    pub fn sent(&mut self, p: &Piece) {
        self.announce = false;
        let r = p.offset..p.offset + p.len as u64;
        if p.len > 0 {
            self.lost.remove(r.clone());
        }
        self.next = self.next.max(r.end);
        if p.fin {
            self.fin_sent = true;
            self.fin_lost = false;
        }
    }

    /// The piece was acked; drops what is acked from the front.
    pub fn acked(&mut self, r: Range<u64>, fin: bool) {
        self.answered = true;
        if fin {
            self.fin_acked = true;
            self.fin_lost = false;
        }
        if r.end <= self.base {
            return;
        }
        let r = r.start.max(self.base)..r.end;
        if r.start < r.end {
            self.lost.remove(r.clone());
            self.acked.insert(r);
        }
        if let Some(first) = self.acked.iter().next().cloned() {
            if first.start <= self.base {
                let n = (first.end - self.base) as usize;
                self.buf.drain(..n.min(self.buf.len()));
                self.base = first.end;
                self.acked.remove(first);
            }
        }
    }

    /// The piece was lost; it goes again unless acked meanwhile.
    pub fn lost(&mut self, r: Range<u64>, fin: bool) {
        if fin && !self.fin_acked {
            self.fin_lost = true;
        }
        if r.start == 0 && r.end == 0 && !fin && self.base == 0 && self.acked.is_empty() {
            self.announce = true;
        }
        let r = r.start.max(self.base)..r.end;
        if r.start >= r.end {
            return;
        }
        self.lost.insert(r.clone());
        for a in self.acked.overlapping(&r) {
            self.lost.remove(a.clone());
        }
    }

    /// Nothing of it has been acked, not even its announcement.
    pub fn nothing_acked(&self) -> bool {
        !self.answered
    }

    /// Everything written, the fin included, is acked.
    pub fn done(&self) -> bool {
        self.finished && self.fin_acked && self.buf.is_empty()
    }
}

/// What comes in: bytes in order from `read` on, and pieces ahead of them.
#[derive(Debug, Default)]
pub(crate) struct RecvHalf {
    /// Bytes the local side took.
    read: u64,
    ready: VecDeque<u8>,
    ahead: BTreeMap<u64, Vec<u8>>,
    ahead_bytes: usize,
    final_size: Option<u64>,
    /// Credit granted so far: the sender may send below this.
    pub granted: u64,
    /// Granted value last put in an ack.
    pub advertised: u64,
}

impl RecvHalf {
    /// Offset after the bytes in order.
    fn next(&self) -> u64 {
        self.read + self.ready.len() as u64
    }

    /// Takes a piece at `offset`; false if it passes the credit granted.
    pub fn take(&mut self, offset: u64, data: &[u8], fin: bool) -> bool {
        let end = offset + data.len() as u64;
        if end > self.granted || self.final_size.is_some_and(|f| end > f) {
            return false;
        }
        if fin {
            if self.final_size.is_some_and(|f| f != end) || end < self.next() {
                return false;
            }
            self.final_size = Some(end);
        }
        let next = self.next();
        if end <= next {
            return true;
        }
        if offset <= next {
            self.ready.extend(&data[(next - offset) as usize..]);
            self.drain_ahead();
        } else if self.ahead.get(&offset).is_none_or(|d| d.len() < data.len()) {
            if let Some(old) = self.ahead.insert(offset, data.to_vec()) {
                self.ahead_bytes -= old.len();
            }
            self.ahead_bytes += data.len();
        }
        true
    }

    fn drain_ahead(&mut self) {
        while let Some((&offset, _)) = self.ahead.first_key_value() {
            let next = self.next();
            if offset > next {
                break;
            }
            let Some(data) = self.ahead.remove(&offset) else {
                break;
            };
            self.ahead_bytes -= data.len();
            let end = offset + data.len() as u64;
            if end > next {
                self.ready.extend(&data[(next - offset) as usize..]);
            }
        }
    }

    /// Bytes in order, not yet taken.
    pub fn readable(&self) -> (&[u8], &[u8]) {
        self.ready.as_slices()
    }

    /// The local side took `n` bytes.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.ready.len());
        self.ready.drain(..n);
        self.read += n as u64;
    }

    /// Bytes taken by the local side so far.
    pub fn read(&self) -> u64 {
        self.read
    }

    /// Bytes held: in order, and ahead of a hole.
    pub fn held(&self) -> usize {
        self.ready.len() + self.ahead_bytes
    }

    /// The peer's fin arrived and every byte before it was taken.
    pub fn done(&self) -> bool {
        self.final_size == Some(self.read)
    }

    /// Nothing of the peer's has arrived.
    pub fn nothing_received(&self) -> bool {
        self.next() == 0 && self.ahead.is_empty() && self.final_size.is_none()
    }

    /// Every byte up to the fin arrived (some may not be taken yet).
    pub fn complete(&self) -> bool {
        self.final_size == Some(self.next())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_pieces_go_first_and_acked_bytes_leave_the_buffer() {
        let mut s = SendHalf {
            limit: 10,
            ..SendHalf::default()
        };
        s.write(b"abcdefghijklmnop");
        let p = s.next_piece(4).unwrap();
        assert_eq!((p.offset, p.len, p.fin), (0, 4, false));
        s.sent(&p);
        let q = s.next_piece(100).unwrap();
        assert_eq!((q.offset, q.len), (4, 6), "credit ends at 10");
        s.sent(&q);
        assert!(s.next_piece(100).is_none() && s.blocked());
        s.lost(0..4, false);
        let r = s.next_piece(100).unwrap();
        assert_eq!((r.offset, r.len, r.resent), (0, 4, true));
        assert_eq!(s.bytes(&r).0, b"abcd");
        s.acked(4..10, false);
        assert_eq!(s.buffered(), 16, "a hole at the front keeps everything");
        s.acked(0..4, false);
        assert_eq!(s.buffered(), 6);
        assert!(
            s.next_piece(100).is_none(),
            "acked while waiting: not resent"
        );
        s.limit = 100;
        s.finished = true;
        let t = s.next_piece(100).unwrap();
        assert_eq!((t.offset, t.len, t.fin), (10, 6, true));
        s.sent(&t);
        s.acked(10..16, true);
        assert!(s.done());
    }

    #[test]
    fn pieces_out_of_order_and_twice_come_out_once_in_order() {
        let mut r = RecvHalf {
            granted: 12,
            ..RecvHalf::default()
        };
        assert!(r.take(4, b"efgh", false));
        assert!(r.take(8, b"ijkl", true));
        assert_eq!(r.readable().0.len(), 0);
        assert!(r.take(0, b"abcdef", false));
        assert!(r.take(2, b"cd", false));
        let (a, b) = r.readable();
        assert_eq!([a, b].concat(), b"abcdefghijkl");
        assert!(r.complete() && !r.done());
        r.consume(12);
        assert!(r.done());
        assert!(!r.take(12, b"m", false), "past the fin");
    }

    #[test]
    fn a_piece_past_the_credit_is_refused() {
        let mut r = RecvHalf {
            granted: 4,
            ..RecvHalf::default()
        };
        assert!(!r.take(2, b"abc", false));
        assert!(r.readable().0.is_empty() && r.ahead.is_empty());
    }
}
