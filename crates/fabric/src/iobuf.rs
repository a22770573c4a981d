//! Page-aligned buffers for data the kernel copies in (socket and file
//! reads, and a sender's cross-memory copy of a placed message).
//!
//! The kernel copies into user memory with `rep movsb`. On some processors
//! (AMD EPYC here) that copy runs four to five times slower when the
//! destination sits a few bytes past a page boundary while the source is
//! page-aligned, as page-cache pages and many socket buffers are: the two
//! alias within 4 KiB. `malloc` puts every large block exactly there (16
//! bytes into a fresh mapping). A buffer that starts on a page does not.
//!
//! A buffer may also be laid on transparent huge pages ([`Pages::Huge`]).
//! A sender of ours that places a large message into a sleeping reader's
//! buffer over shared memory copies with `process_vm_writev`, which takes
//! and maps the reader's pages one at a time: measured here, 1 MB into
//! 4 KiB pages 12.8-13.1 GB/s, into huge pages 24.4-27.6 (a user-space
//! copy 46). Where the system gives no huge pages the buffer is an
//! ordinary one.

use memmap2::{Advice, MmapMut};
use std::fmt;
use std::io;
use std::ops::{Deref, DerefMut};

use crate::types::Pages;

/// The huge page size this asks for (x86-64's and arm64's usual one).
const HUGE_PAGE: usize = 2 << 20;

/// A zeroed, page-aligned byte buffer of fixed length.
pub struct IoBuf {
    map: MmapMut,
    /// Where the buffer starts in `map`.
    start: usize,
    len: usize,
    pages: Pages,
}

impl IoBuf {
    /// `len` zero bytes starting on a page.
    pub fn new(len: usize) -> io::Result<IoBuf> {
        IoBuf::on(len, Pages::Base)
    }

    /// `len` zero bytes on `pages`.
    pub fn on(len: usize, pages: Pages) -> io::Result<IoBuf> {
        match pages {
            Pages::Base => Ok(IoBuf {
                // A mapping cannot be empty; an empty buffer keeps one page.
                map: MmapMut::map_anon(len.max(1))?,
                start: 0,
                len,
                pages,
            }),
            Pages::Huge => {
                // Whole huge pages from a huge page boundary: a mapping one
                // huge page longer always holds them. What lies before the
                // boundary is never touched, so never backed.
                let too_large = || io::Error::other("buffer too large");
                let whole = len
                    .max(1)
                    .checked_next_multiple_of(HUGE_PAGE)
                    .ok_or_else(too_large)?;
                let map = MmapMut::map_anon(whole.checked_add(HUGE_PAGE).ok_or_else(too_large)?)?;
                let start =
                    (map.as_ptr() as usize).next_multiple_of(HUGE_PAGE) - map.as_ptr() as usize;
                // Advice, not a promise: without huge pages the buffer is
                // an ordinary one.
                let _ = map.advise_range(Advice::HugePage, start, whole);
                Ok(IoBuf {
                    map,
                    start,
                    len,
                    pages,
                })
            }
        }
    }

    /// The pages it was asked to lie on.
    pub fn pages(&self) -> Pages {
        self.pages
    }

    /// Makes the buffer at least `len` bytes long and on `pages` (a new,
    /// zeroed one, no shorter than it was, when it is shorter or on other
    /// pages; the contents are not kept).
    pub fn ensure_on(&mut self, len: usize, pages: Pages) -> io::Result<()> {
        if len > self.len || pages != self.pages {
            *self = IoBuf::on(len.max(self.len), pages)?;
        }
        Ok(())
    }

    /// Makes the buffer at least `len` bytes long (a new, zeroed one when
    /// it is shorter; the contents are not kept).
    pub fn ensure(&mut self, len: usize) -> io::Result<()> {
        self.ensure_on(len, self.pages)
    }
}

impl Deref for IoBuf {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

impl DerefMut for IoBuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map[self.start..self.start + self.len]
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.len)
            .field("pages", &self.pages)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_page_and_grows_on_demand() {
        let mut b = IoBuf::new(100_000).unwrap();
        assert_eq!(b.len(), 100_000);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(b.iter().all(|&x| x == 0));
        b[99_999] = 7;
        b.ensure(50).unwrap();
        assert_eq!((b.len(), b[99_999]), (100_000, 7), "long enough: kept");
        b.ensure(200_000).unwrap();
        assert_eq!(b.len(), 200_000);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(IoBuf::new(0).unwrap().is_empty());
    }

    /// The huge pages the kernel gave the mapping that holds `b`, in KiB
    /// (its `AnonHugePages` in /proc/self/smaps).
    fn huge_kib(b: &IoBuf) -> u64 {
        let at = b.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = range.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = lo <= at && at < hi;
                    continue;
                }
            }
            if let Some(kib) = line.strip_prefix("AnonHugePages:").filter(|_| inside) {
                return kib.trim().trim_end_matches("kB").trim().parse().unwrap();
            }
        }
        0
    }

    #[test]
    fn a_buffer_on_huge_pages_starts_on_one_and_is_backed_by_them_where_the_system_has_them() {
        let mut b = IoBuf::on(3_000_000, Pages::Huge).unwrap();
        assert_eq!((b.len(), b.pages()), (3_000_000, Pages::Huge));
        assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
        assert!(b.iter().all(|&x| x == 0));
        b.fill(1);
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if thp.contains("[always]") || thp.contains("[madvise]") {
            // Two whole huge pages in the buffer, a third part-used.
            assert!(huge_kib(&b) >= 4096, "{} KiB on huge pages", huge_kib(&b));
        }
        // Growing keeps the kind; asking for the other kind changes it.
        b.ensure(5_000_000).unwrap();
        assert_eq!((b.len(), b.pages()), (5_000_000, Pages::Huge));
        assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
        b.ensure_on(10, Pages::Base).unwrap();
        assert_eq!((b.len(), b.pages()), (5_000_000, Pages::Base));
        assert!(IoBuf::on(0, Pages::Huge).unwrap().is_empty());
        assert!(IoBuf::on(usize::MAX - HUGE_PAGE, Pages::Huge).is_err());
    }
}
