//! What two endpoints tell each other to speak over UCX, and the tags their
//! UCX messages carry.
//!
//! After the fabric's hello handshake on a TCP socket (both sides proved
//! the cluster key), each side sends a [`Card`]: its UCX worker's address,
//! and the index and token under which the other side must send to it.
//! Every UCX message carries a 64-bit tag:
//!
//! ```text
//!   63      60 59              44 43                                0
//!  ┌──────────┬──────────────────┬───────────────────────────────────┐
//!  │   kind   │ receiver's index │ receiver's token (44 random bits) │
//!  └──────────┴──────────────────┴───────────────────────────────────┘
//! ```
//!
//! The index names the connection at the receiver; the token, which only
//! the two ends know, keeps others who have the worker's address from
//! speaking on it.

use thiserror::Error;

/// Largest worker address carried: UCX's addresses are a few hundred
/// bytes; one listing many InfiniBand ports stays far below this.
pub const MAX_ADDRESS: usize = 4096;
/// Bytes of a card besides the address.
pub const CARD_FIXED: usize = 4 + 2 + 8 + 4;

/// Bits of the token in a tag.
pub const TOKEN_BITS: u32 = 44;
const INDEX_SHIFT: u32 = TOKEN_BITS;
const KIND_SHIFT: u32 = 60;
/// The token's bits.
pub const TOKEN_MASK: u64 = (1 << TOKEN_BITS) - 1;

/// What a UCX message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TagKind {
    /// A reliable message: the payload is the message.
    Data = 1,
    /// A control message: the payload is a fabric [`Header`](crate::Header)
    /// and what that header's kind carries.
    Control = 2,
    /// A datagram (the header of an active message).
    Datagram = 3,
}

/// A tag's parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    /// What the message is.
    pub kind: TagKind,
    /// The connection at the receiver.
    pub index: u16,
    /// The connection's token at the receiver.
    pub token: u64,
}

impl Tag {
    /// The 64 bits on the wire.
    pub fn encode(self) -> u64 {
        (u64::from(self.kind as u8) << KIND_SHIFT)
            | (u64::from(self.index) << INDEX_SHIFT)
            | (self.token & TOKEN_MASK)
    }

    /// The parts of a tag; `None` for a kind that does not exist.
    pub fn decode(t: u64) -> Option<Tag> {
        let kind = match t >> KIND_SHIFT {
            1 => TagKind::Data,
            2 => TagKind::Control,
            3 => TagKind::Datagram,
            _ => return None,
        };
        Some(Tag {
            kind,
            index: (t >> INDEX_SHIFT) as u16,
            token: t & TOKEN_MASK,
        })
    }
}

/// One side's contact card.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Card {
    /// The UCX worker's address (`ucp_worker_get_address`).
    pub address: Vec<u8>,
    /// The index the other side's messages must carry.
    pub index: u16,
    /// The token they must carry (44 bits).
    pub token: u64,
    /// Reliable messages the other side may send before it hears of more.
    pub credits: u32,
}

/// A card that is not one.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum CardError {
    /// Fewer bytes than the card says it has.
    #[error("truncated UCX card: {have} of {need} bytes")]
    Truncated {
        /// Bytes present.
        have: usize,
        /// Bytes the card needs.
        need: usize,
    },
    /// An address longer than any UCX worker has.
    #[error("UCX address of {0} bytes exceeds the limit of {MAX_ADDRESS}")]
    Oversize(usize),
    /// An empty address, a token wider than 44 bits, or no credit.
    #[error("malformed UCX card: {0}")]
    Malformed(&'static str),
}

impl Card {
    /// The bytes on the wire: address length, address, index, token,
    /// credits (little endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CARD_FIXED + self.address.len());
        b.extend_from_slice(&(self.address.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.address);
        b.extend_from_slice(&self.index.to_le_bytes());
        b.extend_from_slice(&self.token.to_le_bytes());
        b.extend_from_slice(&self.credits.to_le_bytes());
        b
    }

    /// Bytes of the whole card that starts with these four, if they can
    /// start one: to read a card off a stream in two steps without
    /// allocating what the peer announces beyond the limit.
    pub fn len_from_prefix(prefix: [u8; 4]) -> Result<usize, CardError> {
        let n = u32::from_le_bytes(prefix) as usize;
        if n > MAX_ADDRESS {
            return Err(CardError::Oversize(n));
        }
        Ok(CARD_FIXED + n)
    }

    /// A card from its bytes; all of them must be used.
    pub fn decode(b: &[u8]) -> Result<Card, CardError> {
        let prefix: [u8; 4] =
            b.get(..4)
                .and_then(|p| p.try_into().ok())
                .ok_or(CardError::Truncated {
                    have: b.len(),
                    need: CARD_FIXED,
                })?;
        let need = Card::len_from_prefix(prefix)?;
        if b.len() != need {
            return Err(CardError::Truncated {
                have: b.len(),
                need,
            });
        }
        let n = need - CARD_FIXED;
        if n == 0 {
            return Err(CardError::Malformed("empty address"));
        }
        let rest = &b[4 + n..];
        let index = u16::from_le_bytes([rest[0], rest[1]]);
        let mut t = [0u8; 8];
        t.copy_from_slice(&rest[2..10]);
        let token = u64::from_le_bytes(t);
        let mut c = [0u8; 4];
        c.copy_from_slice(&rest[10..14]);
        let credits = u32::from_le_bytes(c);
        if token & !TOKEN_MASK != 0 {
            return Err(CardError::Malformed("token wider than 44 bits"));
        }
        if credits == 0 {
            return Err(CardError::Malformed("no credit"));
        }
        Ok(Card {
            address: b[4..4 + n].to_vec(),
            index,
            token,
            credits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn tags_take_their_parts_apart() {
        let t = Tag {
            kind: TagKind::Control,
            index: 0xbeef,
            token: 0xabc_dead_beef,
        };
        assert_eq!(Tag::decode(t.encode()), Some(t));
        assert_eq!(Tag::decode(0), None, "kind 0");
        assert_eq!(Tag::decode(u64::MAX), None, "kind 15");
        // A token wider than 44 bits is cut, never spilled into the index.
        let wide = Tag {
            token: u64::MAX,
            ..t
        };
        assert_eq!(Tag::decode(wide.encode()).unwrap().index, 0xbeef);
    }

    #[test]
    fn cards_round_trip_and_bad_ones_are_named() {
        let c = Card {
            address: vec![7; 300],
            index: 3,
            token: 12345,
            credits: 64,
        };
        let b = c.encode();
        assert_eq!(b.len(), CARD_FIXED + 300);
        assert_eq!(
            Card::len_from_prefix(b[..4].try_into().unwrap()),
            Ok(b.len())
        );
        assert_eq!(Card::decode(&b), Ok(c.clone()));
        assert!(matches!(
            Card::decode(&b[..b.len() - 1]),
            Err(CardError::Truncated { .. })
        ));
        let mut huge = b.clone();
        huge[..4].copy_from_slice(&(MAX_ADDRESS as u32 + 1).to_le_bytes());
        assert_eq!(
            Card::decode(&huge),
            Err(CardError::Oversize(MAX_ADDRESS + 1))
        );
        let empty = Card {
            address: Vec::new(),
            ..c.clone()
        };
        assert!(matches!(
            Card::decode(&empty.encode()),
            Err(CardError::Malformed(_))
        ));
        let wide = Card {
            token: 1 << 50,
            ..c.clone()
        };
        assert!(matches!(
            Card::decode(&wide.encode()),
            Err(CardError::Malformed(_))
        ));
        let none = Card { credits: 0, ..c };
        assert!(matches!(
            Card::decode(&none.encode()),
            Err(CardError::Malformed(_))
        ));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_cleanly(b in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Card::decode(&b);
        }

        #[test]
        fn any_tag_decodes_or_fails_cleanly(t: u64) {
            if let Some(tag) = Tag::decode(t) {
                prop_assert_eq!(tag.encode(), t);
            }
        }
    }
}
