//! One file striped over several storage hosts, as PanFS lays a file over
//! object storage devices: stripes of a fixed size dealt round-robin, so
//! object `k` of `K` holds stripes `k, k+K, k+2K, ...` back to back. Each
//! object moves as an ordinary transfer of its own (verified end to end),
//! all at once; a small layout record beside each object says how to put
//! the file back together.
//!
//! ```text
//!  file:     | s0 | s1 | s2 | s3 | s4 |
//!  object 0: | s0 | s2 | s4 |          (host 0)
//!  object 1: | s1 | s3 |               (host 1)
//! ```

use std::fs::File;
use std::io;
use std::sync::Mutex;

use crate::data::{Sink, Source};

/// How a file lies over its objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of the whole file.
    pub size: u64,
    /// Stripe size.
    pub stripe: u64,
    /// Number of objects (hosts).
    pub objects: u32,
}

impl Layout {
    /// Bytes object `k` holds.
    pub fn object_len(&self, k: u32) -> u64 {
        let (stripe, n) = (self.stripe, self.objects as u64);
        let full = self.size / stripe;
        let tail = self.size % stripe;
        let k = k as u64;
        let mut len = (full / n) * stripe;
        if k < full % n {
            len += stripe;
        } else if k == full % n {
            len += tail;
        }
        len
    }

    /// Where byte `offset` of object `k` lies in the file.
    pub fn file_offset(&self, k: u32, offset: u64) -> u64 {
        let j = offset / self.stripe;
        (j * self.objects as u64 + k as u64) * self.stripe + offset % self.stripe
    }

    /// Calls `f(file_offset, range of the buffer)` for each piece of the
    /// `len` bytes from `offset` of object `k` (a piece ends at a stripe).
    fn pieces(
        &self,
        k: u32,
        offset: u64,
        len: usize,
        mut f: impl FnMut(u64, std::ops::Range<usize>),
    ) {
        let mut done = 0usize;
        while done < len {
            let at = offset + done as u64;
            let room = (self.stripe - at % self.stripe) as usize;
            let n = room.min(len - done);
            f(self.file_offset(k, at), done..done + n);
            done += n;
        }
    }

    /// The record kept beside object `index`.
    pub fn record(&self, index: u32) -> String {
        format!(
            "macrolink-stripe v1 size={} stripe={} objects={} index={index}\n",
            self.size, self.stripe, self.objects
        )
    }

    /// Reads a record; returns the layout and the object's index.
    pub fn parse(record: &str) -> Result<(Layout, u32), String> {
        let mut w = record.split_whitespace();
        if (w.next(), w.next()) != (Some("macrolink-stripe"), Some("v1")) {
            return Err("not a stripe layout record".into());
        }
        let mut field = |name: &str| -> Result<u64, String> {
            w.next()
                .and_then(|x| x.strip_prefix(name))
                .and_then(|v| v.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("layout record without {name}"))
        };
        let (size, stripe, objects, index) = (
            field("size")?,
            field("stripe")?,
            field("objects")?,
            field("index")?,
        );
        if stripe == 0 || objects == 0 || index >= objects || objects > u32::MAX as u64 {
            return Err("layout record out of range".into());
        }
        let layout = Layout {
            size,
            stripe,
            objects: objects as u32,
        };
        Ok((layout, index as u32))
    }
}

/// Name of the layout record of `path` (a hidden sibling).
pub fn record_name(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((dir, name)) => format!("{dir}/.{name}.ml-stripe"),
        None => format!(".{path}.ml-stripe"),
    }
}

/// Object `k` of a striped file, seen through the file: read from a
/// [`File`], written to one or to how a received file is written (a
/// [`Sink`] such as [`crate::uncached::Uncached`]).
#[derive(Debug)]
pub struct Object<'a, F: ?Sized = File> {
    /// The whole file.
    pub file: &'a F,
    /// Its layout.
    pub layout: Layout,
    /// Which object.
    pub k: u32,
}

impl<F: Sink + ?Sized> Sink for Object<'_, F> {
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut r = Ok(());
        self.layout.pieces(self.k, offset, data.len(), |at, range| {
            if r.is_ok() {
                r = Sink::write_at(self.file, &data[range], at);
            }
        });
        r
    }
}

impl Source for Object<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut r = Ok(());
        let len = buf.len();
        self.layout.pieces(self.k, offset, len, |at, range| {
            if r.is_ok() {
                r = Source::read_at(self.file, &mut buf[range], at);
            }
        });
        r
    }
}

/// Bytes in memory, as a source (a layout record).
impl Source for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let src = self
            .get(start..start + buf.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "past the end"))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// A sink that keeps what it gets in memory (a layout record).
#[derive(Debug, Default)]
pub struct Memory(pub Mutex<Vec<u8>>);

impl Sink for Memory {
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        if v.len() < start + data.len() {
            v.resize(start + data.len(), 0);
        }
        v[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_hold_every_stripe_once() {
        for (size, stripe, objects) in [
            (0u64, 4u64, 2u32),
            (9, 4, 2),
            (17, 4, 3),
            (12, 4, 3),
            (5, 8, 4),
        ] {
            let l = Layout {
                size,
                stripe,
                objects,
            };
            let total: u64 = (0..objects).map(|k| l.object_len(k)).sum();
            assert_eq!(total, size, "{l:?}");
            let mut seen = vec![0u8; size as usize];
            for k in 0..objects {
                for o in 0..l.object_len(k) {
                    seen[l.file_offset(k, o) as usize] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{l:?}: {seen:?}");
        }
    }

    #[test]
    fn objects_read_and_write_through_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let data: Vec<u8> = (0..23u8).collect();
        std::fs::write(&p, &data).unwrap();
        let f = File::open(&p).unwrap();
        let layout = Layout {
            size: 23,
            stripe: 4,
            objects: 2,
        };
        let o1 = Object {
            file: &f,
            layout,
            k: 1,
        };
        let mut buf = vec![0u8; layout.object_len(1) as usize];
        o1.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22]);
        let out = File::create(d.path().join("g")).unwrap();
        let w = Object {
            file: &out,
            layout,
            k: 1,
        };
        w.write_at(&buf[2..7], 2).unwrap();
        let got = std::fs::read(d.path().join("g")).unwrap();
        assert_eq!(&got[6..8], &[6, 7]);
        assert_eq!(&got[12..15], &[12, 13, 14]);
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let l = Layout {
            size: 10,
            stripe: 4,
            objects: 3,
        };
        assert_eq!(Layout::parse(&l.record(2)).unwrap(), (l, 2));
        assert!(Layout::parse("macrolink-stripe v1 size=1 stripe=0 objects=1 index=0").is_err());
        assert!(Layout::parse("macrolink-stripe v1 size=1 stripe=4 objects=1 index=1").is_err());
        assert!(Layout::parse("hello").is_err());
        assert_eq!(record_name("a/b"), "a/.b.ml-stripe");
        assert_eq!(record_name("b"), ".b.ml-stripe");
    }
}
