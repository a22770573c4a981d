//! One near connection of a flow: bytes from it go into the long link
//! while the flow's send buffer has room, bytes of the flow go out to it as
//! fast as it takes them.

use macrolink_relay::haul::Link;
use rustix::event::PollFlags;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

/// A near connection.
#[derive(Debug)]
pub(crate) struct Conn {
    sock: TcpStream,
    /// The near address that dialled us (`None`: we dialled).
    source: Option<IpAddr>,
    /// The near side sent its last byte.
    eof: bool,
    /// We sent the near side our last byte.
    shut: bool,
}

/// What became of a connection after serving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Served {
    /// Still carrying bytes.
    Open,
    /// Both ways ended cleanly, or the flow was reset from afar.
    Done,
    /// It failed here; the flow is reset.
    Failed,
}

impl Conn {
    /// A connection whose handshake is over: one a near host made (from
    /// `source`), or one this relay made to a node of its segment.
    pub fn new(sock: TcpStream, source: Option<IpAddr>) -> io::Result<Conn> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        Ok(Conn {
            sock,
            source,
            eof: false,
            shut: false,
        })
    }

    pub fn source(&self) -> Option<IpAddr> {
        self.source
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Closes with a reset, so the near side sees the flow fail rather
    /// than end.
    pub fn abort(self) {
        let _ = rustix::net::sockopt::set_socket_linger(&self.sock, Some(Duration::ZERO));
    }

    /// What to wait for.
    pub fn interest(&self, link: &Link, flow: u32) -> PollFlags {
        let mut f = PollFlags::empty();
        if !self.eof && link.writable(flow) > 0 {
            f |= PollFlags::IN;
        }
        if !link.readable(flow).0.is_empty() {
            f |= PollFlags::OUT;
        }
        f
    }

    fn fail(&mut self, link: &mut Link, flow: u32, e: &io::Error) -> Served {
        tracing::info!("flow {flow}: near connection failed: {e}");
        link.reset(flow);
        Served::Failed
    }

    /// Moves what can move without blocking, both ways.
    pub fn serve(&mut self, link: &mut Link, flow: u32, scratch: &mut [u8]) -> Served {
        if !link.has(flow) {
            return Served::Done;
        }
        loop {
            let (a, _) = link.readable(flow);
            if a.is_empty() {
                break;
            }
            match self.sock.write(a) {
                Ok(n) => link.consume(flow, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.fail(link, flow, &e),
            }
            if !link.has(flow) {
                break;
            }
        }
        if link.peer_finished(flow) && !self.shut {
            let _ = self.sock.shutdown(Shutdown::Write);
            self.shut = true;
        }
        while !self.eof && link.has(flow) {
            let room = link.writable(flow).min(scratch.len());
            if room == 0 {
                break;
            }
            match self.sock.read(&mut scratch[..room]) {
                Ok(0) => {
                    self.eof = true;
                    link.finish(flow);
                }
                Ok(n) => {
                    link.write(flow, &scratch[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.fail(link, flow, &e),
            }
        }
        if link.has(flow) {
            Served::Open
        } else {
            Served::Done
        }
    }
}
