//! The floor under a busy-polling ping-pong on this machine: its system
//! calls and nothing else, no transport of ours in it.
//!
//! ```text
//!  a timing thread                              an echoing thread
//!   t0 ─► send ─────── loopback (tcp or udp) ─────► spin on recv, send
//!   spin on recv ◄─────────────────────────────────
//!   (t - t0) / 2: a half round trip
//! ```
//!
//! Each side does what sockperf's do with `--nonblocked`: a receive that
//! does not block, again until a message has come, then a send; over udp
//! on sockets not connected (`sendto`, `recvfrom` with the sender's
//! address), as sockperf's are, or sending from a second socket of each
//! side's, connected to the other's, as our endpoints do to a peer that
//! answered ([`Sockets::UdpSendingConnected`]). And each side runs as
//! a process of one thread does: on a table of descriptors of its own (a
//! table shared between threads costs every system call on a descriptor a
//! reference taken and dropped) and with system calls of its own, not
//! libc's (which switch cancellation on and off around each call in a
//! process of several threads). The polling rows' peer beside this row,
//! in the same minute, says how far the peer is above the floor; our
//! polling row beside it, how far ours is.

use anyhow::{bail, Context};
use rustix::io::Errno;
use rustix::net::{self, RecvFlags, SendFlags};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use crate::peers::Latency;
use crate::sleeps::accept_own;
use crate::stats::Summary;

/// Longest a side waits for one message, and for the other side to take
/// what it sends.
const PATIENCE: Duration = Duration::from_secs(2);

/// Round trips made before the timed ones.
const WARM_UP: u64 = 500;

/// Spins between reads of the clock for [`PATIENCE`].
const CLOCK_EVERY: u32 = 1024;

/// What the two sides of a ping-pong send and receive on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sockets {
    /// A tcp connection.
    Tcp,
    /// A udp socket each, not connected: `sendto` and `recvfrom`.
    Udp,
    /// A udp socket each to receive on, not connected, and another to
    /// send from, connected to the other side's first (`send`): the kernel
    /// keeps the route of a connected socket rather than look it up on
    /// every send.
    UdpSendingConnected,
}

/// One side's socket: udp (see [`Udp`]), or a tcp stream.
enum End {
    Udp(Udp),
    Tcp(TcpStream),
}

/// One side's udp socket, where it sends, where the other side's
/// datagrams come from, and the socket it sends from where that is
/// another, connected.
struct Udp {
    sock: UdpSocket,
    to: SocketAddr,
    from: SocketAddr,
    sender: Option<UdpSocket>,
}

impl End {
    /// Two ends over loopback, not blocking.
    fn pair(sockets: Sockets) -> anyhow::Result<(End, End)> {
        let (a, b) = if sockets != Sockets::Tcp {
            let a = UdpSocket::bind("127.0.0.1:0")?;
            let b = UdpSocket::bind("127.0.0.1:0")?;
            let (to_b, to_a) = (b.local_addr()?, a.local_addr()?);
            let sender = |to| -> anyhow::Result<Option<UdpSocket>> {
                if sockets != Sockets::UdpSendingConnected {
                    return Ok(None);
                }
                let s = UdpSocket::bind("127.0.0.1:0")?;
                s.connect(to)?;
                s.set_nonblocking(true)?;
                Ok(Some(s))
            };
            let (a_sends, b_sends) = (sender(to_b)?, sender(to_a)?);
            let from = |sends: &Option<UdpSocket>, at| match sends {
                Some(s) => s.local_addr(),
                None => Ok(at),
            };
            let (from_a, from_b) = (from(&a_sends, to_a)?, from(&b_sends, to_b)?);
            let end = |sock, to, from, sender| {
                End::Udp(Udp {
                    sock,
                    to,
                    from,
                    sender,
                })
            };
            (end(a, to_b, from_b, a_sends), end(b, to_a, from_a, b_sends))
        } else {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let a = TcpStream::connect(l.local_addr()?)?;
            let b = accept_own(&l, a.local_addr()?, PATIENCE)?;
            a.set_nodelay(true)?;
            b.set_nodelay(true)?;
            (End::Tcp(a), End::Tcp(b))
        };
        for e in [&a, &b] {
            match e {
                End::Udp(u) => u.sock.set_nonblocking(true)?,
                End::Tcp(s) => s.set_nonblocking(true)?,
            }
        }
        Ok((a, b))
    }

    /// Spins on a receive that does not block until `buf` is full (one
    /// datagram of its length, or that many bytes of the stream), for
    /// [`PATIENCE`] at most.
    fn take(&self, buf: &mut [u8]) -> anyhow::Result<()> {
        let mut got = 0;
        let mut spins = 0u32;
        let mut until = None;
        while got < buf.len() {
            let r = match self {
                // A datagram from anyone but the peer is passed over.
                End::Udp(u) => match net::recvfrom(&u.sock, &mut buf[..], RecvFlags::DONTWAIT) {
                    Ok((n, _, from)) => {
                        if from.and_then(|f| SocketAddr::try_from(f).ok()) == Some(u.from) {
                            Ok(n)
                        } else {
                            // As if nothing came: a flood of them is
                            // bounded by the patience as silence is.
                            Err(Errno::AGAIN)
                        }
                    }
                    Err(e) => Err(e),
                },
                End::Tcp(s) => net::recv(s, &mut buf[got..], RecvFlags::DONTWAIT).map(|r| r.0),
            };
            match r {
                Ok(0) if matches!(self, End::Tcp(_)) => bail!("the other side closed"),
                Ok(n) if matches!(self, End::Udp(..)) && n != buf.len() => {
                    bail!("a datagram of {n} bytes, not {}", buf.len())
                }
                Ok(n) => got += n,
                Err(Errno::AGAIN) => {
                    spins += 1;
                    if spins.is_multiple_of(CLOCK_EVERY) {
                        let now = Instant::now();
                        if now >= *until.get_or_insert(now + PATIENCE) {
                            bail!("no message in {PATIENCE:?}");
                        }
                    }
                }
                Err(e) => return Err(e).context("a receive"),
            }
        }
        Ok(())
    }

    /// Sends `buf` whole, for [`PATIENCE`] at most.
    fn send(&self, buf: &[u8]) -> anyhow::Result<()> {
        let mut sent = 0;
        let until = Instant::now() + PATIENCE;
        while sent < buf.len() {
            let r = match self {
                End::Udp(u) => match &u.sender {
                    Some(s) => net::send(s, buf, SendFlags::DONTWAIT),
                    None => net::sendto(&u.sock, buf, SendFlags::DONTWAIT, &u.to),
                },
                End::Tcp(s) => {
                    net::send(s, &buf[sent..], SendFlags::DONTWAIT | SendFlags::NOSIGNAL)
                }
            };
            match r {
                Ok(n) if matches!(self, End::Udp(..)) && n != buf.len() => {
                    bail!("{n} bytes of a datagram of {} sent", buf.len())
                }
                Ok(n) => sent += n,
                Err(Errno::AGAIN) if Instant::now() < until => std::thread::yield_now(),
                Err(e) => return Err(e).context("a send"),
            }
        }
        Ok(())
    }
}

/// Makes the calling thread's table of descriptors its own, as a process
/// of one thread has: a copy of the process's, in which this thread's
/// system calls take no reference to a file. The thread closes nothing in
/// it (the sockets it borrows are closed by their owner, in the
/// process's table, and the copy goes with the thread).
fn own_table() -> anyhow::Result<()> {
    // Unsharing the table leaves every descriptor open in both tables;
    // this thread uses only the sockets it borrows (present in its copy
    // under the same numbers) and closes none, so nothing the process's
    // other threads hold changes under them.
    // SAFETY: as just said.
    let unshared = unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FILES) };
    unshared.context("a table of descriptors of the thread's own")
}

/// `iters` timed round trips of `size`-byte messages over loopback TCP (or
/// UDP), both sides busy polling as sockperf's do with `--nonblocked`;
/// their half round trips' median and 99th percentile, µs.
pub fn ping_pong(sockets: Sockets, size: usize, iters: u64) -> anyhow::Result<Latency> {
    let udp = sockets != Sockets::Tcp;
    if size == 0 || iters == 0 {
        bail!("a ping-pong needs a message of some bytes and an iteration");
    }
    if udp && size > 65_000 {
        bail!("a datagram of {size} bytes does not fit");
    }
    let (me, echo) = End::pair(sockets)?;
    let total = WARM_UP + iters;
    let mut half = std::thread::scope(|s| -> anyhow::Result<Vec<f64>> {
        let echo = &echo;
        let echoing = s.spawn(move || -> anyhow::Result<()> {
            own_table()?;
            let mut buf = vec![0u8; size];
            for _ in 0..total {
                echo.take(&mut buf)?;
                echo.send(&buf)?;
            }
            Ok(())
        });
        let me = &me;
        let timing = s.spawn(move || -> anyhow::Result<Vec<f64>> {
            own_table()?;
            let mut buf = vec![1u8; size];
            let mut half = Vec::with_capacity(iters as usize);
            for i in 0..total {
                let t0 = Instant::now();
                me.send(&buf)?;
                me.take(&mut buf)?;
                if i >= WARM_UP {
                    half.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
            }
            Ok(half)
        });
        // On a failure of one side the other gives up within PATIENCE.
        let mine = timing
            .join()
            .map_err(|_| anyhow::anyhow!("the timing thread panicked"))?;
        let theirs = echoing
            .join()
            .map_err(|_| anyhow::anyhow!("the echoing thread panicked"))?;
        theirs.and(mine)
    })?;
    Ok(Latency::from(Summary::of(&mut half)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_sockets_times_every_round_trip() {
        for s in [Sockets::Tcp, Sockets::Udp, Sockets::UdpSendingConnected] {
            let l = ping_pong(s, 64, 300).unwrap();
            assert!(l.median > 0.0 && l.median.is_finite(), "{s:?}: {l:?}");
            assert!(l.p99 >= l.median && l.p99.is_finite(), "{s:?}: {l:?}");
        }
    }

    #[test]
    fn sending_connected_sends_from_the_second_socket_and_its_peer_takes_only_that() {
        let (me, echo) = End::pair(Sockets::UdpSendingConnected).unwrap();
        let (End::Udp(m), End::Udp(e)) = (&me, &echo) else {
            unreachable!("a udp pair")
        };
        let sender = m.sender.as_ref().expect("a connected socket to send from");
        assert_eq!(sender.peer_addr().unwrap(), e.sock.local_addr().unwrap());
        assert_eq!(e.from, sender.local_addr().unwrap());
        assert_ne!(e.from, m.sock.local_addr().unwrap());
        // From the side's own socket, not the one it sends from: passed over.
        m.sock
            .send_to(&[5u8; 64], e.sock.local_addr().unwrap())
            .unwrap();
        me.send(&[3u8; 64]).unwrap();
        let mut buf = [0u8; 64];
        echo.take(&mut buf).unwrap();
        assert_eq!(buf, [3u8; 64]);
    }

    #[test]
    fn a_stream_message_larger_than_one_read_is_taken_whole() {
        // 1 MB over tcp: many reads a message, many sends a reply.
        let l = ping_pong(Sockets::Tcp, 1 << 20, 20).unwrap();
        assert!(l.median > 0.0 && l.median.is_finite(), "{l:?}");
    }

    #[test]
    fn a_stranger_s_datagrams_are_passed_over_and_a_short_one_of_the_peer_refused() {
        let (me, echo) = End::pair(Sockets::Udp).unwrap();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        let End::Udp(e) = &echo else {
            unreachable!("a udp pair")
        };
        let to = e.sock.local_addr().unwrap();
        // Of the message's length and not: neither is taken for the echo.
        stranger.send_to(&[7u8; 64], to).unwrap();
        stranger.send_to(&[7u8; 10], to).unwrap();
        me.send(&[3u8; 64]).unwrap();
        let mut buf = [0u8; 64];
        echo.take(&mut buf).unwrap();
        assert_eq!(buf, [3u8; 64]);
        // The peer's datagram of another length ends the run.
        let End::Udp(m) = &me else {
            unreachable!("a udp pair")
        };
        m.sock.send_to(&[3u8; 10], to).unwrap();
        let e = echo.take(&mut buf).unwrap_err();
        assert!(
            e.to_string().contains("a datagram of 10 bytes, not 64"),
            "{e:#}"
        );
    }

    #[test]
    fn nothing_to_send_and_a_datagram_too_large_are_refused() {
        assert!(ping_pong(Sockets::Tcp, 0, 10).is_err());
        assert!(ping_pong(Sockets::Udp, 64, 0).is_err());
        assert!(ping_pong(Sockets::UdpSendingConnected, 70_000, 10).is_err());
    }

    #[test]
    fn a_silent_peer_is_given_up_within_patience() {
        let (_me, echo) = End::pair(Sockets::Udp).unwrap();
        let t0 = Instant::now();
        let e = echo.take(&mut [0u8; 64]).unwrap_err();
        assert!(e.to_string().contains("no message"), "{e:#}");
        let took = t0.elapsed();
        assert!(took >= PATIENCE && took < PATIENCE * 3, "{took:?}");
    }
}
