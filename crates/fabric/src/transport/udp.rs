//! Datagram mode over UDP: one socket per endpoint, one frame per datagram.

use macrolink_wire::{FrameKind, Header, HEADER_LEN};
use rustix::io::Errno;
use rustix::net::{self, RecvFlags, SendFlags};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use super::contact::Inbox;
use crate::error::Result;
use crate::rx::{Body, Core, Ready, Step};
use crate::types::{Addr, Mode, Recv, RecvKind, Transport};

/// An endpoint's UDP socket and what it has learned of its peers.
#[derive(Debug)]
pub(crate) struct Udp {
    sock: UdpSocket,
    scratch: Box<[u8]>,
    learned: HashMap<Addr, SocketAddr>,
    /// The sender of the last datagram taken, whose place `learned` holds:
    /// a stream from one peer costs no hashing per datagram.
    last_from: Option<Addr>,
    /// What datagrams of this fabric carry (see `NodeShared::datagram_token`).
    token: u64,
}

impl Udp {
    pub(crate) fn bind(ip: IpAddr, mtu: usize, token: u64) -> io::Result<Udp> {
        let sock = UdpSocket::bind(SocketAddr::new(ip, 0))?;
        sock.set_nonblocking(true)?;
        Ok(Udp {
            sock,
            scratch: vec![0u8; HEADER_LEN + mtu.max(macrolink_wire::MAX_DATAGRAM as usize)]
                .into_boxed_slice(),
            learned: HashMap::new(),
            last_from: None,
            token,
        })
    }

    pub(crate) fn port(&self) -> u16 {
        self.sock.local_addr().map_or(0, |a| a.port())
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Whether a member's datagram has come: junk, datagrams without the
    /// fabric's token and those of peers not admitted do not count.
    pub(crate) fn heard_member(&self) -> bool {
        self.last_from.is_some()
    }

    /// What this fabric's datagrams carry.
    #[cfg(test)]
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    pub(crate) fn learned(&self, a: Addr) -> Option<SocketAddr> {
        self.learned.get(&a).copied()
    }

    pub(crate) fn learn(&mut self, a: Addr, sa: SocketAddr) {
        self.learned.insert(a, sa);
    }

    pub(crate) fn send(&mut self, h: &Header, data: &[u8], to: SocketAddr) -> Result<()> {
        let n = HEADER_LEN + data.len();
        self.scratch[..HEADER_LEN].copy_from_slice(&h.encode());
        self.scratch[HEADER_LEN..n].copy_from_slice(data);
        for _ in 0..1000 {
            match net::sendto(&self.sock, &self.scratch[..n], SendFlags::empty(), &to) {
                Ok(_) => return Ok(()),
                Err(Errno::AGAIN) => {
                    super::sys::wait_fd(
                        self.sock.as_raw_fd(),
                        super::sys::Interest::Write,
                        std::time::Duration::from_millis(10),
                    )?;
                }
                // An ICMP error from an earlier datagram: datagrams are unreliable.
                Err(Errno::CONNREFUSED) => return Ok(()),
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        Ok(())
    }

    /// Receives waiting datagrams; delivers the first straight into `user`
    /// when it fits and nothing is queued, stages the rest.
    pub(crate) fn progress(
        &mut self,
        core: &mut Core,
        inbox: &Inbox,
        mut user: Option<&mut [u8]>,
    ) -> Result<Step> {
        let mut moved = false;
        // A sender that floods the socket (junk, or datagrams for another
        // endpoint) does not keep the pass here: the rest waits for the
        // next look, and the connections are read meanwhile.
        for _ in 0..LOOK_MAX {
            // A system call of its own, not libc's (a cancellation point
            // with `errno`): this look runs on every pass of a polling read.
            let (n, src) =
                match net::recvfrom(&self.sock, &mut self.scratch[..], RecvFlags::empty()) {
                    Ok((n, _, Some(src))) => match SocketAddr::try_from(src) {
                        Ok(src) => (n, src),
                        Err(_) => continue,
                    },
                    Ok((_, _, None)) => continue,
                    Err(Errno::AGAIN) => break,
                    Err(Errno::CONNREFUSED) => continue,
                    Err(e) => return Err(io::Error::from(e).into()),
                };
            moved = true;
            let h = match Header::decode(&self.scratch[..n]) {
                Ok(h)
                    if h.kind == FrameKind::Datagram
                        && h.len as usize == n - HEADER_LEN
                        && h.dst_ep == core.id =>
                {
                    h
                }
                Ok(_) => {
                    core.stats.bad_frames += 1;
                    if loud(core.stats.bad_frames) {
                        tracing::warn!(%src, bad = core.stats.bad_frames, "dropped a datagram that is not for this endpoint");
                    }
                    continue;
                }
                Err(e) => {
                    core.stats.bad_frames += 1;
                    if loud(core.stats.bad_frames) {
                        tracing::warn!(%src, bad = core.stats.bad_frames, "dropped a malformed datagram: {e}");
                    }
                    continue;
                }
            };
            core.header_seen();
            let from = Addr::new(h.src_node, h.src_ep);
            if h.key != self.token {
                inbox
                    .strangers
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(%src, "dropped a datagram without the fabric's token");
                continue;
            }
            if !inbox.admits(from, None) {
                continue;
            }
            if self.last_from != Some(from) {
                self.learned.entry(from).or_insert(src);
                self.last_from = Some(from);
            }
            let data = &self.scratch[HEADER_LEN..n];
            if let Some(buf) = user.as_deref_mut() {
                if core.ready.is_empty() && buf.len() >= data.len() {
                    buf[..data.len()].copy_from_slice(data);
                    core.stats.messages_in += 1;
                    core.stats.bytes_in += data.len() as u64;
                    return Ok(core.deliver(Recv {
                        from,
                        len: data.len(),
                        kind: RecvKind::Message(Mode::Datagram),
                        transport: Transport::Udp,
                        via: None,
                    }));
                }
            }
            match core.stage(data) {
                Some(chain) => core.ready.push_back(Ready::Msg {
                    from,
                    mode: Mode::Datagram,
                    transport: Transport::Udp,
                    len: data.len(),
                    body: Body::Staged(chain),
                    via: None,
                }),
                None => core.stats.dropped_datagrams += 1,
            }
        }
        Ok(Step::or_moved(moved))
    }
}

/// Datagrams one look takes off the socket at most.
const LOOK_MAX: usize = 256;

/// Whether the `n`-th bad datagram is said aloud: the 1st, 2nd, 4th, 8th
/// and so on, so that a flood of them does not flood the log.
fn loud(n: u64) -> bool {
    n.is_power_of_two()
}
