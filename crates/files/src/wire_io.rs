//! Reading and writing control messages on a stream.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

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
