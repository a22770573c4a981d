//! The fabric key: what the nodes of one cluster (or one job) prove to each
//! other when they connect, as InfiniBand's partition keys fence traffic.
//! The key never crosses the wire; each side hashes the other's fresh nonce
//! with it (see [`macrolink_wire::Challenge`]).

use macrolink_wire::{MAC_LEN, NONCE_LEN};
use std::fmt;
use std::io;
use std::path::PathBuf;

/// Context string that turns a secret into the fabric's hash key.
const CONTEXT: &str = "macrolink fabric 2026-11 handshake key";
/// Environment variable that may hold the secret itself.
pub const SECRET_VAR: &str = "MACROLINK_SECRET";
/// Environment variable that may name a file holding the secret.
pub const SECRET_FILE_VAR: &str = "MACROLINK_SECRET_FILE";
/// Shortest secret accepted.
pub const MIN_SECRET: usize = 16;

/// The key of one fabric.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; 32]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if *self == Key::open() {
            "Key(open)"
        } else {
            "Key(..)"
        })
    }
}

/// Why a secret was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the secret has {0} bytes; at least {MIN_SECRET} are needed")]
pub struct ShortSecret(pub usize);

impl Key {
    /// The key of a secret; a trailing newline (as in a file written by
    /// `echo`) is not part of it.
    pub fn from_secret(bytes: &[u8]) -> Result<Key, ShortSecret> {
        let bytes = trim(bytes);
        if bytes.len() < MIN_SECRET {
            return Err(ShortSecret(bytes.len()));
        }
        Ok(Key(blake3::derive_key(CONTEXT, bytes)))
    }

    /// The key of nodes that were given no secret: anyone can prove it.
    pub fn open() -> Key {
        Key(blake3::derive_key(CONTEXT, b""))
    }

    /// The key of the secret the environment names: the file in
    /// `MACROLINK_SECRET_FILE`, else `MACROLINK_SECRET` itself; `None` when
    /// neither is set.
    pub fn from_env() -> io::Result<Option<Key>> {
        let bytes = match (
            std::env::var_os(SECRET_FILE_VAR).map(PathBuf::from),
            std::env::var_os(SECRET_VAR),
        ) {
            (Some(p), _) => std::fs::read(&p)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?,
            (None, Some(s)) => s.into_encoded_bytes(),
            (None, None) => return Ok(None),
        };
        Key::from_secret(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    }

    /// A key for another use of the same secret (`context` names it), so
    /// that no two uses share a key.
    pub fn derive(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.0)
    }

    /// What datagrams of this fabric carry to be heard (InfiniBand's
    /// Q_Key): stops strangers who do not know the key, not an eavesdropper.
    pub fn datagram_token(&self) -> u64 {
        let h = blake3::keyed_hash(&self.0, b"datagram");
        let mut b = [0u8; 8];
        b.copy_from_slice(&h.as_bytes()[..8]);
        u64::from_le_bytes(b)
    }

    /// The initiator's hash: over the acceptor's challenge, the hello as
    /// sent (header and payload) and its own nonce.
    pub fn initiator_mac(
        &self,
        challenge: &[u8; NONCE_LEN],
        hello: &[&[u8]],
        nonce: &[u8; NONCE_LEN],
    ) -> [u8; MAC_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(b"initiator");
        h.update(challenge);
        for part in hello {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(nonce);
        *h.finalize().as_bytes()
    }

    /// The acceptor's hash: over both nonces and its answer.
    pub fn acceptor_mac(
        &self,
        nonce: &[u8; NONCE_LEN],
        challenge: &[u8; NONCE_LEN],
        answer: &[u8],
    ) -> [u8; MAC_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(b"acceptor");
        h.update(nonce);
        h.update(challenge);
        h.update(answer);
        *h.finalize().as_bytes()
    }
}

fn trim(b: &[u8]) -> &[u8] {
    let b = b.strip_suffix(b"\n").unwrap_or(b);
    b.strip_suffix(b"\r").unwrap_or(b)
}

/// Compares two hashes in constant time.
pub fn macs_match(a: &[u8; MAC_LEN], b: &[u8; MAC_LEN]) -> bool {
    blake3::Hash::from_bytes(*a) == blake3::Hash::from_bytes(*b)
}

/// Fresh random bytes.
pub fn nonce() -> io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_depend_on_key_role_nonces_and_frames() {
        let a = Key::from_secret(b"a secret of enough bytes\n").unwrap();
        let same = Key::from_secret(b"a secret of enough bytes").unwrap();
        let b = Key::from_secret(b"another secret of enough bytes").unwrap();
        assert_eq!(a, same);
        assert_ne!(a, Key::open());
        let (n, m) = (nonce().unwrap(), nonce().unwrap());
        let mac = a.initiator_mac(&n, &[b"hello", b""], &m);
        assert!(macs_match(
            &mac,
            &same.initiator_mac(&n, &[b"hello", b""], &m)
        ));
        assert!(!macs_match(
            &mac,
            &b.initiator_mac(&n, &[b"hello", b""], &m)
        ));
        assert!(!macs_match(
            &mac,
            &a.initiator_mac(&m, &[b"hello", b""], &n)
        ));
        assert!(!macs_match(
            &mac,
            &a.initiator_mac(&n, &[b"hell", b"o"], &m)
        ));
        assert!(!macs_match(&mac, &a.acceptor_mac(&n, &m, b"hello")));
        assert_eq!(Key::from_secret(b"short").unwrap_err(), ShortSecret(5));
        assert_eq!(format!("{a:?}"), "Key(..)");
        assert_eq!(format!("{:?}", Key::open()), "Key(open)");
    }
}
