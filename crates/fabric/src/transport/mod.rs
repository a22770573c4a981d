//! Transports ("providers"): how bytes get from one endpoint to another.
//!
//! Connected transports (`shm`, `tcp`) carry an ordered byte stream that the
//! [`framing`](crate::framing) layer cuts into frames; `udp` carries one
//! frame per datagram and is handled by the endpoint's datagram path.

pub(crate) mod memfd;
pub(crate) mod shm;

use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

use crate::sys;
use crate::types::Transport;
use shm::ShmStream;

/// What a transport can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Delivers every byte or reports the peer lost.
    pub reliable: bool,
    /// Delivers in the order sent.
    pub ordered: bool,
    /// Carries reliable and put modes.
    pub connected: bool,
}

impl Transport {
    /// What this transport can do.
    pub fn caps(self) -> Caps {
        match self {
            Transport::Shm | Transport::Tcp => Caps {
                reliable: true,
                ordered: true,
                connected: true,
            },
            Transport::Udp => Caps {
                reliable: false,
                ordered: false,
                connected: false,
            },
        }
    }
}

/// A connected byte stream.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Shm(Box<ShmStream>),
}

impl Stream {
    pub(crate) fn transport(&self) -> Transport {
        match self {
            Stream::Tcp(_) => Transport::Tcp,
            Stream::Shm(_) => Transport::Shm,
        }
    }

    /// Takes as many bytes of `bufs` as it can without blocking.
    pub(crate) fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => sys::send_vectored(s.as_raw_fd(), bufs),
            Stream::Shm(s) => s.try_write(bufs),
        }
    }

    /// Reads what is there without blocking; `Ok(0)` means nothing now, end
    /// of stream is an error.
    pub(crate) fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => match sys::recv(s.as_raw_fd(), dst, false)? {
                None => Ok(0),
                Some(0) if !dst.is_empty() => Err(io::ErrorKind::UnexpectedEof.into()),
                Some(n) => Ok(n),
            },
            Stream::Shm(s) => s.try_read(dst),
        }
    }

    /// The descriptor to poll while sleeping on this stream.
    pub(crate) fn raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Shm(s) => s.raw_fd(),
        }
    }

    /// Prepares to sleep until readable; false when data is already there.
    pub(crate) fn arm_read(&mut self) -> bool {
        match self {
            Stream::Tcp(_) => true,
            Stream::Shm(s) => s.arm_read(),
        }
    }

    /// Prepares to sleep until `need` bytes can be written; false when they can.
    pub(crate) fn arm_write(&mut self, need: usize) -> bool {
        match self {
            Stream::Tcp(_) => true,
            Stream::Shm(s) => s.arm_write(need),
        }
    }

    /// Ends a sleep.
    pub(crate) fn disarm(&mut self) {
        if let Stream::Shm(s) = self {
            s.disarm()
        }
    }

    /// Sends a descriptor to the peer (shared memory only).
    pub(crate) fn send_fd(&self, fd: impl std::os::fd::AsFd) -> io::Result<()> {
        match self {
            Stream::Shm(s) => s.send_fd(fd),
            Stream::Tcp(_) => Err(io::ErrorKind::Unsupported.into()),
        }
    }

    /// The oldest descriptor the peer sent (shared memory only).
    pub(crate) fn take_fd(&mut self) -> Option<std::os::fd::OwnedFd> {
        match self {
            Stream::Shm(s) => s.take_fd(),
            Stream::Tcp(_) => None,
        }
    }

    /// Notices a peer that has gone while we poll without sleeping.
    pub(crate) fn check_alive(&mut self) {
        if let Stream::Shm(s) = self {
            s.check_alive()
        }
    }
}
