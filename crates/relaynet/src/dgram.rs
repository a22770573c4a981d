//! The fabric's datagram mode through the relays. For each far node a
//! relay has a UDP socket at the address where near hosts dial that node
//! (same port, UDP): a near host that resolves a far endpoint's datagram
//! address through the relay is given this socket's port, and its
//! datagrams go from there over the long link, once, never resent. The
//! relay at the other end sends them on from its socket for the sending
//! node, so replies come back the same way.
//!
//! ```text
//!  near host ──udp──► relay A: socket of far node F ══ Datagram{F} ══► relay B: socket of
//!  (node N, ep e)                                                       node N ──udp──► F's ep
//! ```
//!
//! Where an endpoint of this segment takes datagrams is learned from the
//! resolves this relay makes for the peer and from the sources of the
//! datagrams near hosts send; a datagram for an endpoint not yet known is
//! dropped, as datagrams may be.

use macrolink_relay::haul::Link;
use macrolink_wire::{FrameKind, Header, HEADER_LEN};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};

/// Endpoints whose datagram address is remembered, at most.
const MAX_LEARNED: usize = 65_536;
/// Datagrams taken from one socket in one turn of the loop.
const BURST: usize = 64;

/// What the datagram path counted.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    /// From near hosts onto the long link.
    pub out: u64,
    /// From the long link to near hosts.
    pub delivered: u64,
    /// Refused: not a datagram of this fabric, or not from this segment.
    pub bad: u64,
    /// For an endpoint whose address is not known, or the socket was full.
    pub undeliverable: u64,
}

/// The relay's datagram sockets and what it learned.
#[derive(Debug)]
pub(crate) struct Datagrams {
    socks: Vec<(u32, UdpSocket)>,
    ports: HashMap<(u32, u32), SocketAddr>,
    token: u64,
    buf: Vec<u8>,
    pub counts: Counts,
}

impl Datagrams {
    /// One socket per far node, at its listener's address (any port of the
    /// same address if that one is taken).
    pub fn bind(listeners: &[(u32, TcpListener)], token: u64) -> io::Result<Datagrams> {
        let mut socks = Vec::new();
        for (node, l) in listeners {
            let at = l.local_addr()?;
            let s = UdpSocket::bind(at).or_else(|_| UdpSocket::bind(SocketAddr::new(at.ip(), 0)));
            let s = s.map_err(|e| {
                io::Error::new(e.kind(), format!("datagrams of node {node} at {at}: {e}"))
            })?;
            s.set_nonblocking(true)?;
            socks.push((*node, s));
        }
        Ok(Datagrams {
            socks,
            ports: HashMap::new(),
            token,
            buf: vec![0u8; 65_536],
            counts: Counts::default(),
        })
    }

    /// The port near hosts send far node `node`'s datagrams to.
    pub fn port(&self, node: u32) -> Option<u16> {
        let (_, s) = self.socks.iter().find(|(n, _)| *n == node)?;
        s.local_addr().ok().map(|a| a.port())
    }

    /// The sockets, for the loop's poll.
    pub fn sockets(&self) -> impl Iterator<Item = &UdpSocket> {
        self.socks.iter().map(|(_, s)| s)
    }

    /// Endpoint `ep` of node `node` of this segment takes datagrams at
    /// `addr` (the node said so, in a resolve).
    pub fn resolved(&mut self, node: u32, ep: u32, addr: SocketAddr) {
        if self.ports.len() < MAX_LEARNED || self.ports.contains_key(&(node, ep)) {
            self.ports.insert((node, ep), addr);
        }
    }

    /// Takes what near hosts sent and queues it on the long link.
    pub fn take_near(&mut self, link: &mut Link, near: &BTreeMap<u32, SocketAddr>) {
        for (node, s) in &self.socks {
            for _ in 0..BURST {
                let (n, src) = match s.recv_from(&mut self.buf) {
                    Ok(r) => r,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => continue,
                };
                let d = &self.buf[..n];
                let ok = Header::decode(d).ok().filter(|h| {
                    h.kind == FrameKind::Datagram
                        && h.len as usize == n - HEADER_LEN
                        && h.key == self.token
                        && near.contains_key(&h.src_node)
                });
                let Some(h) = ok else {
                    self.counts.bad += 1;
                    continue;
                };
                let k = (h.src_node, h.src_ep);
                if self.ports.len() < MAX_LEARNED {
                    self.ports.entry(k).or_insert(src);
                }
                if link.send_datagram(*node, d) {
                    self.counts.out += 1;
                }
            }
        }
    }

    /// Sends what came over the long link on to the near endpoints.
    pub fn deliver(&mut self, link: &mut Link) {
        while let Some((node, d)) = link.poll_datagram() {
            let Ok(h) = Header::decode(&d) else {
                self.counts.bad += 1;
                continue;
            };
            let from = self.socks.iter().find(|(n, _)| *n == h.src_node);
            let to = self.ports.get(&(node, h.dst_ep));
            match (from, to) {
                (Some((_, s)), Some(to)) if s.send_to(&d, *to).is_ok() => {
                    self.counts.delivered += 1;
                }
                _ => self.counts.undeliverable += 1,
            }
        }
    }
}
