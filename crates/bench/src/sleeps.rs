//! What sleeping on more than one descriptor costs a waiting ping-pong on
//! this machine, with no transport of ours in it.
//!
//! ```text
//!  this thread                                  an echoing thread
//!   t0 ─► send ─────── loopback (tcp or udp) ─────► sleep, read
//!   sleep, read ◄──────────────────────────────── send
//!   (t - t0) / 2: a half round trip
//! ```
//!
//! Both threads sleep one of three ways: in a blocking `recv` on the one
//! socket, as sockperf's do; in one `poll` of what a waiting endpoint of
//! ours sleeps on (its inbox's eventfd, its datagram socket, the
//! connection) and then a `recv`, a system call more a message each side;
//! or in `epoll_wait` on a set of the same three and then a `recv`. The
//! ratio of the second to the first, in the same minute, is what the
//! second way costs over the first: a floor under a waiting endpoint's
//! latency beside sockperf's blocking one; the third says how much of it
//! a set kept in the kernel would save.

use anyhow::{bail, Context};
use rustix::event::{epoll, eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::peers::Latency;
use crate::stats::Summary;

/// How each side waits for the next message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sleep {
    /// A blocking `recv` on the socket.
    Recv,
    /// `poll` of an eventfd, an idle UDP socket and the socket, then a
    /// `recv` that does not block.
    Poll,
    /// `epoll_wait` on a set of the same three, then a `recv` that does
    /// not block.
    Epoll,
}

/// Longest a side waits for one message.
const PATIENCE: Duration = Duration::from_secs(2);

/// Round trips made before the timed ones.
const WARM_UP: u64 = 500;

/// The connected pair's one end.
enum Pipe {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

impl Pipe {
    /// Two ends connected over loopback.
    fn pair(udp: bool) -> io::Result<(Pipe, Pipe)> {
        if udp {
            let a = UdpSocket::bind("127.0.0.1:0")?;
            let b = UdpSocket::bind("127.0.0.1:0")?;
            a.connect(b.local_addr()?)?;
            b.connect(a.local_addr()?)?;
            return Ok((Pipe::Udp(a), Pipe::Udp(b)));
        }
        let l = TcpListener::bind("127.0.0.1:0")?;
        let a = TcpStream::connect(l.local_addr()?)?;
        let b = accept_own(&l, a.local_addr()?, PATIENCE)?;
        b.set_nonblocking(false)?;
        a.set_nodelay(true)?;
        b.set_nodelay(true)?;
        Ok((Pipe::Tcp(a), Pipe::Tcp(b)))
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Pipe::Tcp(s) => s.as_fd(),
            Pipe::Udp(s) => s.as_fd(),
        }
    }

    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Pipe::Tcp(s) => s.set_nonblocking(on),
            Pipe::Udp(s) => s.set_nonblocking(on),
        }
    }

    fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        match self {
            Pipe::Tcp(s) => s.set_read_timeout(Some(t)),
            Pipe::Udp(s) => s.set_read_timeout(Some(t)),
        }
    }

    /// Reads what is there, up to `buf`'s length: a datagram, or a TCP
    /// stream's next bytes (0: the other end closed).
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Pipe::Tcp(s) => s.read(buf),
            Pipe::Udp(s) => s.recv(buf),
        }
    }

    fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Pipe::Tcp(s) => s.write_all(buf),
            Pipe::Udp(s) => s.send(buf).map(drop),
        }
    }
}

/// The connection from `own` on `l`, within `patience`: another local
/// process may connect first, and what it connects is closed at once (no
/// stranger is kept waiting or read from).
pub(crate) fn accept_own(
    l: &TcpListener,
    own: SocketAddr,
    patience: Duration,
) -> io::Result<TcpStream> {
    l.set_nonblocking(true)?;
    let until = Instant::now() + patience;
    loop {
        match l.accept() {
            Ok((b, from)) if from == own => return Ok(b),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= until {
                    let why = "our own connection was not accepted in time";
                    return Err(io::Error::new(io::ErrorKind::TimedOut, why));
                }
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => return Err(e),
        }
    }
}

/// One side: its end of the pair and, when it polls, the descriptors it
/// polls beside it.
struct Side {
    pipe: Pipe,
    sleep: Sleep,
    /// An eventfd nobody bumps and a UDP socket nobody sends to, as a
    /// waiting endpoint's inbox wake-up and datagram socket are between
    /// the messages of a connection.
    idle: (OwnedFd, UdpSocket),
    /// An epoll set of the three (for [`Sleep::Epoll`]).
    set: OwnedFd,
}

impl Side {
    fn new(pipe: Pipe, sleep: Sleep) -> anyhow::Result<Side> {
        pipe.set_nonblocking(sleep != Sleep::Recv)?;
        pipe.set_read_timeout(PATIENCE)?;
        let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let udp = UdpSocket::bind("127.0.0.1:0")?;
        let set = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        for (i, fd) in [efd.as_fd(), udp.as_fd(), pipe.fd()]
            .into_iter()
            .enumerate()
        {
            let data = epoll::EventData::new_u64(i as u64);
            epoll::add(&set, fd, data, epoll::EventFlags::IN)?;
        }
        Ok(Side {
            pipe,
            sleep,
            idle: (efd, udp),
            set,
        })
    }

    /// Waits for the next message of `buf.len()` bytes and reads it.
    fn take(&mut self, buf: &mut [u8]) -> anyhow::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            match self.pipe.recv(&mut buf[got..]) {
                Ok(0) => bail!("the other side closed"),
                Ok(n) if matches!(self.pipe, Pipe::Udp(_)) && n != buf.len() => {
                    bail!("a datagram of {n} bytes, not {}", buf.len())
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.sleep != Sleep::Recv => {
                    self.nap()?
                }
                Err(e) => return Err(e).context("no message in time"),
            }
        }
        Ok(())
    }

    /// One `poll` (or `epoll_wait`) of the three descriptors, until the
    /// pipe's has something.
    fn nap(&self) -> anyhow::Result<()> {
        let t = Timespec::try_from(PATIENCE)?;
        let n = match self.sleep {
            Sleep::Epoll => {
                let mut events = [const { MaybeUninit::<epoll::Event>::uninit() }; 4];
                epoll::wait(&self.set, &mut events, Some(&t))?.0.len()
            }
            _ => {
                let mut fds = [
                    PollFd::new(&self.idle.0, PollFlags::IN),
                    PollFd::new(&self.idle.1, PollFlags::IN),
                    PollFd::from_borrowed_fd(self.pipe.fd(), PollFlags::IN),
                ];
                poll(&mut fds, Some(&t))?
            }
        };
        if n == 0 {
            bail!("no message in {PATIENCE:?}");
        }
        Ok(())
    }
}

/// `iters` timed round trips of `size`-byte messages over loopback TCP
/// (or UDP), both sides sleeping as `sleep` says; their half round trips'
/// median and 99th percentile, µs.
pub fn ping_pong(udp: bool, size: usize, iters: u64, sleep: Sleep) -> anyhow::Result<Latency> {
    if size == 0 || iters == 0 {
        bail!("a ping-pong needs a message of some bytes and an iteration");
    }
    let (a, b) = Pipe::pair(udp)?;
    let mut me = Side::new(a, sleep)?;
    let mut echo = Side::new(b, sleep)?;
    let total = WARM_UP + iters;
    let mut half = Vec::with_capacity(iters as usize);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let echoing = s.spawn(move || -> anyhow::Result<()> {
            let mut buf = vec![0u8; size];
            for _ in 0..total {
                echo.take(&mut buf)?;
                echo.pipe.send(&buf)?;
            }
            Ok(())
        });
        let mut buf = vec![1u8; size];
        let mine = (|| -> anyhow::Result<()> {
            for i in 0..total {
                let t0 = Instant::now();
                me.pipe.send(&buf)?;
                me.take(&mut buf)?;
                if i >= WARM_UP {
                    half.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
            }
            Ok(())
        })();
        // On a failure here the echoing side gives up within PATIENCE.
        let theirs = echoing
            .join()
            .map_err(|_| anyhow::anyhow!("the echoing thread panicked"))?;
        mine.and(theirs)
    })?;
    Ok(Latency::from(Summary::of(&mut half)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sleeps_time_every_round_trip_over_both_protocols() {
        for udp in [false, true] {
            for sleep in [Sleep::Recv, Sleep::Poll, Sleep::Epoll] {
                let l = ping_pong(udp, 64, 200, sleep).unwrap();
                assert!(
                    l.median > 0.0 && l.median.is_finite(),
                    "{udp} {sleep:?}: {l:?}"
                );
                assert!(
                    l.p99 >= l.median && l.p99.is_finite(),
                    "{udp} {sleep:?}: {l:?}"
                );
            }
        }
    }

    #[test]
    fn a_stranger_connecting_first_is_turned_away_and_none_is_waited_for_past_patience() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut strangers: Vec<_> = (0..3)
            .map(|_| TcpStream::connect(l.local_addr().unwrap()).unwrap())
            .collect();
        let own = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let b = accept_own(&l, own.local_addr().unwrap(), PATIENCE).unwrap();
        assert_eq!(b.peer_addr().unwrap(), own.local_addr().unwrap());
        // The strangers' connections were closed, not kept.
        for s in &mut strangers {
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            match s.read(&mut [0u8; 8]) {
                Ok(0) => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
                r => panic!("a stranger's connection was kept: {r:?}"),
            }
        }
        // A stranger alone: an error once the patience is spent.
        let _stranger = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let t0 = Instant::now();
        let gone = "127.0.0.1:9".parse().unwrap();
        let e = accept_own(&l, gone, Duration::from_millis(100)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() < PATIENCE, "{:?}", t0.elapsed());
    }

    #[test]
    fn nothing_to_send_is_refused() {
        assert!(ping_pong(false, 0, 10, Sleep::Recv).is_err());
        assert!(ping_pong(true, 64, 0, Sleep::Poll).is_err());
    }
}
