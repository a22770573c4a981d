//! The records that authenticate a fabric handshake. Every node of one
//! fabric holds the same 32-byte key; neither side sends it, each proves it
//! by a keyed hash over the other side's fresh nonce and the handshake's
//! frames (the hashing is the fabric's; these are only the bytes).
//!
//! ```text
//!  initiator                                   acceptor
//!  connect ──────────────────────────────────► (accept)
//!          ◄────────────── Challenge{nonce_a}   sent at once
//!  Hello header [+ segment name] + Proof{nonce_i, mac_i} ──►
//!          ◄──── HelloOk header + mac_a   or   HelloRefused header
//! ```

use crate::header::WireError;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a keyed hash.
pub const MAC_LEN: usize = 32;
/// Bytes of an encoded [`Challenge`].
pub const CHALLENGE_LEN: usize = 8 + NONCE_LEN;
/// Bytes of an encoded [`Proof`].
pub const PROOF_LEN: usize = NONCE_LEN + MAC_LEN;
const CHALLENGE_MAGIC: [u8; 4] = *b"MLch";

/// What an acceptor sends first: a nonce the initiator must hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// Fresh random bytes of the acceptor.
    pub nonce: [u8; NONCE_LEN],
}

impl Challenge {
    /// The record's wire form: "MLch", the wire version, three zero bytes,
    /// the nonce.
    pub fn encode(&self) -> [u8; CHALLENGE_LEN] {
        let mut b = [0u8; CHALLENGE_LEN];
        b[..4].copy_from_slice(&CHALLENGE_MAGIC);
        b[4] = crate::VERSION;
        b[8..].copy_from_slice(&self.nonce);
        b
    }

    /// Reads a challenge from the first [`CHALLENGE_LEN`] bytes of `b`.
    pub fn decode(b: &[u8]) -> Result<Challenge, WireError> {
        let b = b
            .get(..CHALLENGE_LEN)
            .ok_or(WireError::Truncated { have: b.len() })?;
        if b[..4] != CHALLENGE_MAGIC {
            return Err(WireError::BadMagic(u16::from_le_bytes([b[0], b[1]])));
        }
        if b[4] != crate::VERSION {
            return Err(WireError::BadVersion(b[4]));
        }
        if b[5..8] != [0, 0, 0] {
            return Err(WireError::Reserved);
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[8..]);
        Ok(Challenge { nonce })
    }
}

/// What follows an initiator's hello: its own nonce and its keyed hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proof {
    /// Fresh random bytes of the initiator, for the acceptor's answer.
    pub nonce: [u8; NONCE_LEN],
    /// Keyed hash over the acceptor's nonce and the hello.
    pub mac: [u8; MAC_LEN],
}

impl Proof {
    /// The record's wire form: nonce, then hash.
    pub fn encode(&self) -> [u8; PROOF_LEN] {
        let mut b = [0u8; PROOF_LEN];
        b[..NONCE_LEN].copy_from_slice(&self.nonce);
        b[NONCE_LEN..].copy_from_slice(&self.mac);
        b
    }

    /// Reads a proof from the first [`PROOF_LEN`] bytes of `b`.
    pub fn decode(b: &[u8]) -> Result<Proof, WireError> {
        let b = b
            .get(..PROOF_LEN)
            .ok_or(WireError::Truncated { have: b.len() })?;
        let mut p = Proof {
            nonce: [0; NONCE_LEN],
            mac: [0; MAC_LEN],
        };
        p.nonce.copy_from_slice(&b[..NONCE_LEN]);
        p.mac.copy_from_slice(&b[NONCE_LEN..]);
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_strangers_are_refused() {
        let c = Challenge { nonce: [7; 32] };
        assert_eq!(Challenge::decode(&c.encode()), Ok(c));
        let mut bad = c.encode();
        bad[0] = b'X';
        assert!(matches!(
            Challenge::decode(&bad),
            Err(WireError::BadMagic(_))
        ));
        bad = c.encode();
        bad[4] = 99;
        assert_eq!(Challenge::decode(&bad), Err(WireError::BadVersion(99)));
        bad = c.encode();
        bad[6] = 1;
        assert_eq!(Challenge::decode(&bad), Err(WireError::Reserved));
        assert_eq!(
            Challenge::decode(&c.encode()[..10]),
            Err(WireError::Truncated { have: 10 })
        );
        let p = Proof {
            nonce: [1; 32],
            mac: [2; 32],
        };
        assert_eq!(Proof::decode(&p.encode()), Ok(p));
        assert!(Proof::decode(&[0; 63]).is_err());
    }
}
