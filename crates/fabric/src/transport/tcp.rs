//! TCP: one connection per pair of endpoints, `TCP_NODELAY`, vectored
//! sends. A put is a frame the target places.

use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

use super::sys::{self, Interest};
use super::ByteStream;
use crate::types::Transport;

/// A connected, non-blocking TCP socket.
#[derive(Debug)]
pub(crate) struct Tcp(pub(crate) TcpStream);

impl ByteStream for Tcp {
    fn transport(&self) -> Transport {
        Transport::Tcp
    }

    fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        sys::send_vectored(self.0.as_raw_fd(), bufs)
    }

    fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        match sys::recv(self.0.as_raw_fd(), dst, false)? {
            None => Ok(0),
            Some(0) if !dst.is_empty() => Err(io::ErrorKind::UnexpectedEof.into()),
            Some(n) => Ok(n),
        }
    }

    fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    fn write_interest(&self) -> Interest {
        Interest::Write
    }
}
