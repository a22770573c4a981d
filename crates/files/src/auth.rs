//! Challenge-response authentication with a shared secret. The secret never
//! crosses the wire: each side proves it knows it by a keyed hash of a fresh
//! nonce chosen by the other side. The same secret keys the fabric the
//! data moves over ([`macrolink_fabric::Key`]).

use macrolink_fabric::Key;
use std::fmt;

pub use macrolink_fabric::key::{ShortSecret, MIN_SECRET};

/// Context string that turns a secret of any length into a hash key.
const KEY_CONTEXT: &str = "macrolink file service 2026-11 challenge key";

/// A shared secret, kept only as the keys derived from it.
#[derive(Clone)]
pub struct Secret {
    key: [u8; 32],
    fabric: Key,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret from its bytes; a trailing newline (as in a file written by
    /// `echo`) is not part of it.
    pub fn new(bytes: &[u8]) -> Result<Secret, ShortSecret> {
        let fabric = Key::from_secret(bytes)?;
        let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        Ok(Secret {
            key: blake3::derive_key(KEY_CONTEXT, bytes),
            fabric,
        })
    }

    /// The key of the fabric that nodes knowing this secret share.
    pub fn fabric_key(&self) -> Key {
        self.fabric.clone()
    }

    /// The client's proof for the server's `nonce`.
    pub fn client_proof(&self, nonce: &[u8; 32]) -> [u8; 32] {
        self.proof(b"client", nonce)
    }

    /// The server's proof for the client's `nonce`.
    pub fn server_proof(&self, nonce: &[u8; 32]) -> [u8; 32] {
        self.proof(b"server", nonce)
    }

    fn proof(&self, role: &[u8], nonce: &[u8; 32]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(role);
        h.update(nonce);
        *h.finalize().as_bytes()
    }
}

/// Compares a received proof with the expected one in constant time.
pub fn proof_matches(expected: &[u8; 32], got: &[u8; 32]) -> bool {
    blake3::Hash::from_bytes(*expected) == blake3::Hash::from_bytes(*got)
}

pub use macrolink_fabric::key::nonce;

/// A random 64-bit key (a transfer id only its two ends know).
pub fn random_key() -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_secret_role_and_nonce() {
        let a = Secret::new(b"a secret of enough bytes\n").unwrap();
        let same = Secret::new(b"a secret of enough bytes").unwrap();
        let b = Secret::new(b"another secret of enough bytes").unwrap();
        let n = nonce().unwrap();
        let m = nonce().unwrap();
        assert_ne!(n, m);
        assert!(proof_matches(&a.client_proof(&n), &same.client_proof(&n)));
        assert!(!proof_matches(&a.client_proof(&n), &b.client_proof(&n)));
        assert!(!proof_matches(&a.client_proof(&n), &a.client_proof(&m)));
        assert!(!proof_matches(&a.client_proof(&n), &a.server_proof(&n)));
        assert_eq!(Secret::new(b"short").unwrap_err(), ShortSecret(5));
        assert!(!format!("{a:?}").contains("secret of"));
    }
}
