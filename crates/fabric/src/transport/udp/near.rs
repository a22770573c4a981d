//! Sockets connected to the peers that answer, for sending to them.
//!
//! A datagram sent from a socket that is not connected makes the kernel
//! look up its route on every send; a connected socket keeps the route it
//! found at `connect`. Over loopback on the machine these sockets were
//! measured on, a busy-polling ping-pong of 64-byte datagrams took 0.88 of
//! the time when both sides sent on connected sockets (2.33 against 2.65
//! us a half round trip), and the same whether they also received on them.
//!
//! So an endpoint still takes every datagram on its one socket, and sends
//! to a peer from a socket of its own, connected to where that peer takes
//! datagrams, on another port of the same address:
//!
//! ```text
//!  endpoint A                                    endpoint B
//!   socket (port a) ◄── every datagram to A ───── near socket of B for A
//!   near socket of A for B ── datagrams to B ──► socket (port b)
//! ```
//!
//! A peer learns where to send from the first datagram it takes from an
//! endpoint, or from its node, and keeps that place (see `Udp::arrived`).
//! A near socket is therefore made only once a datagram of the peer came:
//! by then the peer has heard from this endpoint's own socket or asked
//! its node, and a datagram from another port no longer teaches it a
//! wrong place. Nothing is sent to a near socket's port; were anything
//! sent there (only datagrams from the peer's own place can reach a
//! connected socket), it waits in a receive buffer made as small as the
//! kernel allows, and is never read.
//!
//! There are at most [`NEAR_MAX`] of them an endpoint, one descriptor
//! each: the first peers that answer have one, the others are sent to
//! from the endpoint's socket, as before.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};

/// Near sockets of one endpoint, at most.
pub(super) const NEAR_MAX: usize = 8;

/// An endpoint's near sockets.
#[derive(Debug, Default)]
pub(super) struct Near {
    socks: Vec<(SocketAddr, UdpSocket)>,
    /// Where the last send found its socket: a stream of datagrams to one
    /// peer compares one address a send.
    last: usize,
}

impl Near {
    /// The socket connected to `to`, if there is one.
    #[inline]
    pub(super) fn get(&mut self, to: SocketAddr) -> Option<&UdpSocket> {
        if let Some((at, s)) = self.socks.get(self.last) {
            if *at == to {
                return Some(s);
            }
        }
        let i = self.socks.iter().position(|(at, _)| *at == to)?;
        self.last = i;
        Some(&self.socks[i].1)
    }

    /// Makes a socket on `ip`, connected to `to`, for the peer there that
    /// sent a datagram: unless one is there already or there are
    /// [`NEAR_MAX`]. Where the kernel refuses one, the peer is sent to
    /// from the endpoint's socket.
    pub(super) fn answered(&mut self, ip: IpAddr, to: SocketAddr) {
        if self.socks.len() >= NEAR_MAX || self.socks.iter().any(|(at, _)| *at == to) {
            return;
        }
        match connect(ip, to) {
            Ok(s) => self.socks.push((to, s)),
            Err(e) => tracing::debug!(%to, "no connected socket for sending to {to}: {e}"),
        }
    }

    /// Where the near sockets send to.
    #[cfg(test)]
    pub(super) fn peers(&self) -> Vec<SocketAddr> {
        self.socks.iter().map(|(at, _)| *at).collect()
    }
}

fn connect(ip: IpAddr, to: SocketAddr) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(SocketAddr::new(ip, 0))?;
    s.connect(to)?;
    s.set_nonblocking(true)?;
    // The kernel makes it its least: nothing is meant to come.
    rustix::net::sockopt::set_socket_recv_buffer_size(&s, 0)?;
    Ok(s)
}
