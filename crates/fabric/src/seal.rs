//! Datagrams that end in a keyed hash (BLAKE3) of the rest, so that a
//! receiver takes them only from a sender that holds the cluster's secret:
//! the long-haul packets between relays, the management messages. Each use
//! has a key of its own ([`Key::derive`](crate::Key::derive)).

/// Bytes of the hash at the end of a datagram.
pub const TAG_LEN: usize = 16;

/// Seals and opens datagrams with one key.
#[derive(Clone)]
pub struct Seal {
    key: [u8; 32],
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seal(..)")
    }
}

impl Seal {
    /// A seal with a 32-byte key.
    pub fn new(key: [u8; 32]) -> Seal {
        Seal { key }
    }

    fn tag(&self, packet: &[u8]) -> [u8; TAG_LEN] {
        let h = blake3::keyed_hash(&self.key, packet);
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&h.as_bytes()[..TAG_LEN]);
        t
    }

    /// Appends the tag of `buf[..n]` after it; returns the datagram's length.
    pub fn close(&self, buf: &mut [u8], n: usize) -> usize {
        let t = self.tag(&buf[..n]);
        buf[n..n + TAG_LEN].copy_from_slice(&t);
        n + TAG_LEN
    }

    /// The packet inside a datagram, if its tag is right.
    pub fn open<'a>(&self, datagram: &'a [u8]) -> Option<&'a [u8]> {
        let split = datagram.len().checked_sub(TAG_LEN)?;
        let (packet, tag) = datagram.split_at(split);
        let want = self.tag(packet);
        // Constant-time comparison, as blake3's Hash equality is.
        let mut a = [0u8; 32];
        let mut b = [0u8; 32];
        a[..TAG_LEN].copy_from_slice(&want);
        b[..TAG_LEN].copy_from_slice(tag);
        (blake3::Hash::from_bytes(a) == blake3::Hash::from_bytes(b)).then_some(packet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_opens_with_its_key_only_and_any_changed_byte_fails() {
        let s = Seal::new([1; 32]);
        let mut buf = [0u8; 64];
        buf[..5].copy_from_slice(b"hello");
        let n = s.close(&mut buf, 5);
        assert_eq!(s.open(&buf[..n]), Some(&b"hello"[..]));
        assert_eq!(Seal::new([2; 32]).open(&buf[..n]), None);
        for i in 0..n {
            let mut c = buf;
            c[i] ^= 1;
            assert_eq!(s.open(&c[..n]), None, "byte {i}");
        }
        assert_eq!(s.open(&buf[..3]), None);
    }
}
