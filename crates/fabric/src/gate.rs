//! The gate of a listener: peers that have not proven themselves yet get
//! one deadline for their whole handshake, and only so many may be pending
//! at once, from one source and in all; past either cap the oldest pending
//! one is cut, so that slow or silent peers cannot keep good ones out.
//!
//! ```text
//!  accept ─► Gate::enter(source, socket) ─► Pass { until } ─► handshake by
//!            (cuts the oldest of the        dropped when    Timed { until }
//!             source, then of all)          it is over
//! ```

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::transport::sys;

/// How many unproven peers a listener bears, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Handshakes pending at once, in all.
    pub total: usize,
    /// Handshakes pending at once from one source.
    pub per_source: usize,
    /// Time from accepting a connection to the end of its handshake.
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            total: 64,
            per_source: 8,
            time: Duration::from_secs(5),
        }
    }
}

impl std::fmt::Display for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} handshakes pending ({} per source), {:?} each",
            self.total, self.per_source, self.time
        )
    }
}

/// Where a connection comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A network address.
    Ip(IpAddr),
    /// A process of this host, by user id.
    Uid(u32),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Ip(ip) => write!(f, "{ip}"),
            Source::Uid(u) => write!(f, "uid {u}"),
        }
    }
}

#[derive(Debug, Default)]
struct Pending {
    next: u64,
    open: VecDeque<(u64, Source, OwnedFd)>,
}

/// The handshakes pending at one listener.
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    pending: Mutex<Pending>,
}

/// One handshake let in; it leaves the gate when dropped.
#[derive(Debug)]
pub struct Pass<'a> {
    gate: &'a Gate,
    id: u64,
    /// When the handshake must be over.
    pub until: Instant,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.gate.lock().open.retain(|(n, _, _)| *n != self.id);
    }
}

impl Gate {
    /// A gate with `limits` (a cap of 0 is taken as 1).
    pub fn new(limits: Limits) -> Gate {
        Gate {
            limits,
            pending: Mutex::new(Pending::default()),
        }
    }

    /// The limits it keeps.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets a connection from `from` in, cutting the oldest pending one of
    /// that source, then of all, when a cap is reached.
    pub fn enter(&self, from: Source, socket: impl AsFd) -> io::Result<Pass<'_>> {
        let cut = socket.as_fd().try_clone_to_owned()?;
        let mut p = self.lock();
        let mine = p.open.iter().filter(|(_, s, _)| *s == from).count();
        if mine >= self.limits.per_source.max(1) {
            shed(&mut p, |s| *s == from);
        }
        if p.open.len() >= self.limits.total.max(1) {
            shed(&mut p, |_| true);
        }
        p.next += 1;
        let id = p.next;
        p.open.push_back((id, from, cut));
        Ok(Pass {
            gate: self,
            id,
            until: Instant::now() + self.limits.time,
        })
    }

    /// Handshakes pending now.
    pub fn pending(&self) -> usize {
        self.lock().open.len()
    }
}

/// Cuts the oldest pending connection that `which` picks: its handshake's
/// next read or write fails.
fn shed(p: &mut Pending, which: impl Fn(&Source) -> bool) {
    if let Some(i) = p.open.iter().position(|(_, s, _)| which(s)) {
        if let Some((_, s, fd)) = p.open.remove(i) {
            tracing::info!("{s}: handshake cut: too many pending");
            sys::shutdown(fd.as_raw_fd());
        }
    }
}

/// A blocking socket whose reads and writes all end by one instant.
#[derive(Debug)]
pub struct Timed<'a, S> {
    /// The socket.
    pub stream: &'a mut S,
    /// When the exchange must be over.
    pub until: Instant,
}

impl<S: AsRawFd> Timed<'_, S> {
    pub(crate) fn ready(&self, interest: sys::Interest) -> io::Result<()> {
        loop {
            let left = self.until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the handshake took too long",
                ));
            }
            let mut p = [sys::pollfd(self.stream.as_raw_fd(), interest)];
            // None ready: the time ran out, or a signal came (poll again).
            if sys::poll(&mut p, Some(left))? > 0 {
                return Ok(());
            }
        }
    }
}

impl<S: Read + AsRawFd> Read for Timed<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.ready(sys::Interest::Read)?;
        self.stream.read(buf)
    }
}

impl<S: Write + AsRawFd> Write for Timed<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.ready(sys::Interest::Write)?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_oldest_of_a_source_then_of_all_is_cut() {
        let gate = Gate::new(Limits {
            total: 3,
            per_source: 2,
            time: Duration::from_secs(1),
        });
        let a = Source::Ip("10.0.0.1".parse().unwrap());
        let b = Source::Ip("10.0.0.2".parse().unwrap());
        let socks: Vec<(UnixStream, UnixStream)> =
            (0..4).map(|_| UnixStream::pair().unwrap()).collect();
        for (s, _) in &socks {
            s.set_nonblocking(true).unwrap();
        }
        let cut = |i: usize| {
            let mut x = [0u8; 1];
            let mut s = &socks[i].0;
            matches!(s.read(&mut x), Ok(0))
        };
        let p0 = gate.enter(a, &socks[0].0).unwrap();
        let _p1 = gate.enter(a, &socks[1].0).unwrap();
        let _p2 = gate.enter(a, &socks[2].0).unwrap();
        assert!(cut(0), "a's third cuts a's oldest");
        assert_eq!(gate.pending(), 2);
        drop(p0);
        let _p3 = gate.enter(b, &socks[3].0).unwrap();
        assert_eq!(gate.pending(), 3);
        let _p4 = gate.enter(b, &socks[0].1).unwrap();
        assert!(cut(1), "the total cap cuts the oldest of all");
        assert_eq!(gate.pending(), 3);
    }

    #[test]
    fn a_timed_read_ends_at_the_deadline_however_the_bytes_drip() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let start = Instant::now();
        let until = start + Duration::from_millis(300);
        let drip = std::thread::spawn(move || {
            for _ in 0..10 {
                if b.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let mut buf = [0u8; 64];
        let got = Timed {
            stream: &mut a,
            until,
        }
        .read_exact(&mut buf);
        assert_eq!(got.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() < Duration::from_millis(900));
        drop(a);
        drip.join().unwrap();
    }
}
