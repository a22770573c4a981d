//! Test data: bytes that are cheap to make, differ from seed to seed, and
//! catch a misplaced or repeated block (no period shorter than the data).

/// `n` bytes of the xorshift64 stream started from `seed`.
pub fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = vec![0u8; n];
    for w in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_repeat_per_seed_and_differ_between_seeds() {
        assert_eq!(pattern(1000, 7), pattern(1000, 7));
        assert_ne!(pattern(1000, 7), pattern(1000, 8));
        assert_eq!(pattern(13, 7)[..], pattern(1000, 7)[..13]);
        let p = pattern(1 << 20, 1);
        // No block of 4 KiB repeats at a 4 KiB stride.
        assert!(p
            .chunks(4096)
            .zip(p.chunks(4096).skip(1))
            .all(|(a, b)| a != b));
        assert!(pattern(0, 1).is_empty());
    }
}
