//! Reading and writing control messages on a stream.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use crate::proto::{self, ProtoError};

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The stream failed or closed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The bytes were not a message.
    #[error(transparent)]
    Proto(#[from] ProtoError),
}

/// Writes one message.
pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    w.write_all(&proto::encode(msg))
}

/// Reads one message of at most `limit` bytes.
pub fn recv<T: for<'a> Deserialize<'a>>(r: &mut impl Read, limit: usize) -> Result<T, ReadError> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix)?;
    let len = proto::frame_len(prefix, limit)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(proto::decode(&body)?)
}

/// A stream read against one deadline for a whole exchange: each read may
/// wait only for what is left of it, so a peer that trickles bytes cannot
/// stretch the exchange.
#[derive(Debug)]
pub struct ByDeadline<'a> {
    /// The stream.
    pub stream: &'a TcpStream,
    /// When the exchange must be over.
    pub until: Instant,
}

impl Read for ByDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the exchange took too long",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut s = self.stream;
        s.read(buf)
    }
}
