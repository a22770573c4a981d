//! End-to-end digests. Each chunk of a transfer is hashed where it is read
//! and where it is written (XXH3-128, with the widest vector unit the CPU has, in cache right
//! after the copy); the
//! transfer's digest is the hash of its chunk digests in file order, so
//! streams may deliver chunks in any order. Resuming compares chunk digests
//! of the partial copy with those of the source.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use twox_hash::XxHash3_128;

fn xxh3_128(data: &[u8]) -> u128 {
    XxHash3_128::oneshot(data)
}

/// Digest of a chunk or a transfer.
pub type Digest = [u8; 16];

/// Digest of one chunk.
pub fn chunk(data: &[u8]) -> Digest {
    xxh3_128(data).to_le_bytes()
}

/// Digest of a transfer from its chunk digests in file order.
pub fn combine(chunks: &[Digest]) -> Digest {
    xxh3_128(chunks.as_flattened()).to_le_bytes()
}

/// Collects chunk digests by chunk index, in any order.
#[derive(Debug, Default)]
pub struct Collector {
    digests: Vec<Option<Digest>>,
}

impl Collector {
    /// A collector for `chunks` chunks.
    pub fn new(chunks: usize) -> Collector {
        Collector {
            digests: vec![None; chunks],
        }
    }

    /// Records chunk `index`; false if it is out of range or came before.
    pub fn add(&mut self, index: usize, d: Digest) -> bool {
        match self.digests.get_mut(index) {
            Some(slot @ None) => {
                *slot = Some(d);
                true
            }
            _ => false,
        }
    }

    /// The transfer's digest, or the index of the first missing chunk.
    pub fn finish(&self) -> Result<Digest, usize> {
        let mut all = Vec::with_capacity(self.digests.len());
        for (i, d) in self.digests.iter().enumerate() {
            all.push(d.ok_or(i)?);
        }
        Ok(combine(&all))
    }
}

/// Size of `file` and the digests of its chunks of `chunk` bytes.
pub fn file_chunks(file: &File, chunk_size: u32) -> io::Result<(u64, Vec<Digest>)> {
    let size = file.metadata()?.len();
    let mut buf = macrolink_fabric::IoBuf::new(chunk_size as usize)?;
    let mut out = Vec::new();
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(chunk_size as u64) as usize;
        file.read_exact_at(&mut buf[..n], off)?;
        out.push(chunk(&buf[..n]));
        off += n as u64;
    }
    Ok((size, out))
}

/// Bytes from the start that two files share, counted in whole chunks of
/// `chunk_size` (the last chunk of the source counts when it matches too).
pub fn common_prefix(ours: &[Digest], theirs: &[Digest], chunk_size: u32, size: u64) -> u64 {
    let same = ours.iter().zip(theirs).take_while(|(a, b)| a == b).count() as u64;
    (same * chunk_size as u64).min(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_independent_of_arrival_order_but_not_of_content() {
        let parts: Vec<Digest> = [b"ab".as_slice(), b"cd", b"e"].map(chunk).to_vec();
        let mut c = Collector::new(3);
        assert!(c.add(2, parts[2]));
        assert!(c.add(0, parts[0]));
        assert_eq!(c.finish(), Err(1));
        assert!(c.add(1, parts[1]));
        assert!(!c.add(1, parts[1]), "twice");
        assert!(!c.add(3, parts[1]), "out of range");
        assert_eq!(c.finish().unwrap(), combine(&parts));
        let swapped = [parts[1], parts[0], parts[2]];
        assert_ne!(combine(&swapped), combine(&parts));
    }

    #[test]
    fn file_chunks_and_common_prefix() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        let (size, sums) = file_chunks(&File::open(&p).unwrap(), 4).unwrap();
        assert_eq!(size, 10);
        assert_eq!(sums, vec![chunk(b"0123"), chunk(b"4567"), chunk(b"89")]);
        std::fs::write(&p, b"0123xxxx").unwrap();
        let (_, partial) = file_chunks(&File::open(&p).unwrap(), 4).unwrap();
        assert_eq!(common_prefix(&partial, &sums, 4, 10), 4);
        assert_eq!(common_prefix(&sums, &sums, 4, 10), 10);
        assert_eq!(common_prefix(&[], &sums, 4, 10), 0);
    }
}

#[cfg(test)]
mod reference {
    /// XXH3-128 of known inputs (the reference implementation's values).
    #[test]
    fn digests_are_standard_xxh3_128() {
        assert_eq!(super::xxh3_128(b""), 0x99aa06d3014798d86001c324468d497f);
        assert_eq!(
            super::xxh3_128(&[7u8; 1000]),
            xxhash_rust::xxh3::xxh3_128(&[7u8; 1000])
        );
    }
}
