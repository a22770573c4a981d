//! Cuts a byte stream into frames: a header first, then its payload, which
//! the caller places wherever it wants (user buffer, token, region) without an
//! intermediate copy.

use macrolink_wire::{Header, WireError, HEADER_LEN};
use std::io;

use crate::transport::Stream;

/// Why the next frame could not be read.
#[derive(Debug)]
pub(crate) enum RxError {
    Io(io::Error),
    Wire(WireError),
}

/// Receive state of one stream.
#[derive(Debug)]
pub(crate) struct FrameReader {
    buf: [u8; HEADER_LEN],
    have: usize,
    cur: Option<Header>,
    left: usize,
}

impl FrameReader {
    pub(crate) fn new() -> Self {
        FrameReader {
            buf: [0; HEADER_LEN],
            have: 0,
            cur: None,
            left: 0,
        }
    }

    /// The header of the frame being read, reading it in if needed.
    /// `Ok(None)`: not all of it has arrived yet.
    pub(crate) fn header(&mut self, s: &mut Stream) -> Result<Option<Header>, RxError> {
        if let Some(h) = self.cur {
            return Ok(Some(h));
        }
        while self.have < HEADER_LEN {
            let n = s
                .try_read(&mut self.buf[self.have..])
                .map_err(RxError::Io)?;
            if n == 0 {
                return Ok(None);
            }
            self.have += n;
        }
        let h = Header::decode(&self.buf).map_err(RxError::Wire)?;
        self.cur = Some(h);
        self.left = h.len as usize;
        Ok(Some(h))
    }

    /// Payload bytes of the current frame not yet read.
    pub(crate) fn left(&self) -> usize {
        self.left
    }

    /// Reads up to `dst.len()` (at most `left()`) payload bytes; 0 = none now.
    pub(crate) fn payload(&mut self, s: &mut Stream, dst: &mut [u8]) -> io::Result<usize> {
        let want = dst.len().min(self.left);
        if want == 0 {
            return Ok(0);
        }
        let n = s.try_read(&mut dst[..want])?;
        self.left -= n;
        Ok(n)
    }

    /// Reads and drops up to 4 KiB of the payload; returns the bytes dropped.
    pub(crate) fn discard(&mut self, s: &mut Stream) -> io::Result<usize> {
        let mut scratch = [0u8; 4096];
        let want = self.left.min(scratch.len());
        let n = s.try_read(&mut scratch[..want])?;
        self.left -= n;
        Ok(n)
    }

    /// Ends the current frame once its payload has been read.
    pub(crate) fn finish(&mut self) {
        debug_assert_eq!(self.left, 0);
        self.cur = None;
        self.have = 0;
    }
}
