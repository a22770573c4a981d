//! The doorbells of a shared-memory connection: a pipe each way. A side
//! sleeps on the read end of its own pipe and rings the peer by writing a
//! byte into the peer's; the read end also hears the peer go, as the end of
//! the pipe, when the peer's process closes its write end or dies.
//!
//! ```text
//!  initiator                                   acceptor
//!   hears ◄── pipe I ◄── rings (write end sent; and a read end, kept)
//!   rings ──► pipe A ──► hears (read end sent)
//!  both pipes made by the initiator; the acceptor's three ends go with the hello
//! ```
//!
//! A byte in a pipe is cheaper to send and to take than one over the unix
//! socket (no buffer is allocated for it, none freed): measured here in a
//! bare pair of threads, the woken side's CPU a wake-up came down by about
//! 1 µs, the waker's call by about 0.6 µs. The socket still carries the
//! descriptors of regions.
//!
//! A write into a pipe that has no reader left raises `SIGPIPE`, which
//! ends a process that has not set it aside (a C program using the
//! library): each side also holds the read end of the pipe it rings, so a
//! ring into the pipe of a peer that died fills a buffer instead.
//!
//! Both ends came from, or went to, another process that can change their
//! flags (a file's status flags belong to it, not to a descriptor): every
//! read and write here asks not to wait for itself (`RWF_NOWAIT`), so a
//! peer that made its pipe blocking, or filled it, cannot hold us up.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::transport::sys::Epoll;

/// Whether this kernel reports every byte written into a pipe that an
/// epoll set watches edge-triggered, even into a pipe not read since the
/// last: then a sleep in such a set wakes at each ring with the rings
/// left unread, and the reader reads its pipe only now and then (one
/// system call a wake-up less). Kernels from 5.5 until the fix (made in
/// 5.14 and taken into the stable ones) reported a write only into an
/// empty pipe, where a ring left unread would let the next sleep miss
/// the next ring; asked once, by a pipe of its own.
pub(crate) fn edge_hears_every_ring() -> bool {
    static EVERY: OnceLock<bool> = OnceLock::new();
    *EVERY.get_or_init(|| {
        edge_probe().unwrap_or_else(|e| {
            tracing::debug!("cannot ask how epoll reports a pipe: {e}; reading every ring");
            false
        })
    })
}

fn edge_probe() -> io::Result<bool> {
    let flags = rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK;
    let (r, w) = rustix::pipe::pipe_with(flags)?;
    let set = Epoll::new()?;
    set.add(r.as_raw_fd(), 0, true)?;
    let mut ev = [libc::epoll_event { events: 0, u64: 0 }];
    // The writer's wake-up puts the event in the set before `write`
    // returns: a look without waiting sees it.
    for _ in 0..3 {
        rustix::io::write(&w, &[1])?;
        if set.wait(&mut ev, Duration::ZERO)? != 1 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// How a look at the pipe went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Nothing was rung.
    Quiet,
    /// The peer rang (once or more).
    Rung,
    /// The peer's write end is closed: the peer is gone.
    Gone,
}

/// One side's doorbells: the read end it sleeps on and the write end of
/// the peer's.
#[derive(Debug)]
pub(crate) struct Bells {
    hear: OwnedFd,
    ring: OwnedFd,
    /// A read end of the pipe `ring` writes into, never read: the pipe
    /// keeps a reader after the peer is gone.
    _keep: OwnedFd,
}

/// The acceptor's ends, as the initiator sends them: the read end of its
/// own pipe, then the write end of the initiator's and a read end of it
/// to keep.
pub(crate) type PeerEnds = [OwnedFd; 3];

impl Bells {
    /// The initiator's doorbells and the ends that go to the acceptor.
    pub(crate) fn pair() -> io::Result<(Bells, PeerEnds)> {
        let flags = rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK;
        let (i_read, i_write) = rustix::pipe::pipe_with(flags)?;
        let (a_read, a_write) = rustix::pipe::pipe_with(flags)?;
        let ours = Bells {
            _keep: a_read.try_clone()?,
            hear: i_read.try_clone()?,
            ring: a_write,
        };
        Ok((ours, [a_read, i_write, i_read]))
    }

    /// The acceptor's doorbells, from the ends the initiator sent, after
    /// checking that they are the read end and the write end of pipes,
    /// and that the end to keep reads the pipe it rings.
    /// The ends again, as [`Bells::from_peer`] takes them.
    pub(crate) fn into_ends(self) -> PeerEnds {
        [self.hear, self.ring, self._keep]
    }

    pub(crate) fn from_peer([hear, ring, keep]: PeerEnds) -> io::Result<Bells> {
        check_end(&hear, rustix::fs::OFlags::RDONLY, "read")?;
        let rung = check_end(&ring, rustix::fs::OFlags::WRONLY, "write")?;
        // For a kernel that reads and writes pipes only as their flags say.
        for end in [&hear, &ring] {
            let flags = rustix::fs::fcntl_getfl(end)?;
            rustix::fs::fcntl_setfl(end, flags | rustix::fs::OFlags::NONBLOCK)?;
        }
        if check_end(&keep, rustix::fs::OFlags::RDONLY, "read")? != rung {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer's doorbell came without a read end of its pipe",
            ));
        }
        Ok(Bells {
            hear,
            ring,
            _keep: keep,
        })
    }

    /// The descriptor to sleep on.
    pub(crate) fn fd(&self) -> RawFd {
        self.hear.as_raw_fd()
    }

    /// Rings the peer. A full pipe already holds a wake-up; a write end
    /// whose reader is gone fails, which the next look at ours hears.
    pub(crate) fn ring(&self) {
        let _ = nowait(&self.ring, Op::Write(&[1]));
    }

    /// Takes what was rung, and hears whether the peer is gone.
    pub(crate) fn hear(&self) -> Heard {
        let mut buf = [0u8; 64];
        let mut heard = Heard::Quiet;
        // A peer rings at most once a flag it sees raised: a few reads
        // empty the pipe; a bound keeps a peer that rings without end
        // from holding this one here.
        for _ in 0..64 {
            match nowait(&self.hear, Op::Read(&mut buf)) {
                Ok(0) => return Heard::Gone,
                Ok(n) => {
                    heard = Heard::Rung;
                    if n < buf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Heard::Gone,
            }
        }
        heard
    }
}

/// What a call of [`nowait`] does.
enum Op<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// The kernel refused `RWF_NOWAIT` on a pipe once: it will again.
static NOWAIT_REFUSED: AtomicBool = AtomicBool::new(false);

/// One read or write of a pipe that does not wait whatever the pipe's
/// flags (`RWF_NOWAIT`); where the kernel does not take that flag for a
/// pipe, a plain call, on a pipe made non-blocking when it was made or
/// taken (see [`Bells::from_peer`]).
fn nowait(fd: &OwnedFd, op: Op<'_>) -> io::Result<usize> {
    if NOWAIT_REFUSED.load(Ordering::Relaxed) {
        return plain(fd, op);
    }
    let raw = fd.as_raw_fd();
    let n = match &op {
        Op::Read(buf) => {
            let iov = libc::iovec {
                iov_base: buf.as_ptr() as *mut libc::c_void,
                iov_len: buf.len(),
            };
            // SAFETY: `iov` names `buf`, writable and alive for the call;
            // offset -1 is the file's own position, as a pipe needs.
            unsafe { libc::preadv2(raw, &iov, 1, -1, libc::RWF_NOWAIT) }
        }
        Op::Write(buf) => {
            let iov = libc::iovec {
                iov_base: buf.as_ptr() as *mut libc::c_void,
                iov_len: buf.len(),
            };
            // SAFETY: `iov` names `buf`, alive for the call, which only
            // reads it; offset -1 as above.
            unsafe { libc::pwritev2(raw, &iov, 1, -1, libc::RWF_NOWAIT) }
        }
    };
    if n >= 0 {
        return Ok(n as usize);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(e);
    }
    NOWAIT_REFUSED.store(true, Ordering::Relaxed);
    plain(fd, op)
}

/// A plain read or write (an older kernel): the pipe's own flag keeps it
/// from waiting.
fn plain(fd: &OwnedFd, op: Op<'_>) -> io::Result<usize> {
    match op {
        Op::Read(buf) => Ok(rustix::io::read(fd, buf)?),
        Op::Write(buf) => Ok(rustix::io::write(fd, buf)?),
    }
}

/// Checks that a descriptor the peer sent is the `what` end of a pipe;
/// returns which pipe (its device and inode, shared by its ends).
fn check_end(fd: &OwnedFd, mode: rustix::fs::OFlags, what: &str) -> io::Result<(u64, u64)> {
    let refuse = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the peer's doorbell is not the {what} end of a pipe"),
        )
    };
    let st = rustix::fs::fstat(fd)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Fifo {
        return Err(refuse());
    }
    let flags = rustix::fs::fcntl_getfl(fd)?;
    if flags & rustix::fs::OFlags::RWMODE != mode {
        return Err(refuse());
    }
    Ok((st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_is_heard_once_and_a_closed_end_as_the_peer_gone() {
        let (a, ends) = Bells::pair().unwrap();
        let b = Bells::from_peer(ends).unwrap();
        assert_eq!(a.hear(), Heard::Quiet);
        assert_eq!(b.hear(), Heard::Quiet);
        a.ring();
        a.ring();
        assert_eq!(b.hear(), Heard::Rung, "two rings, one wake-up");
        assert_eq!(b.hear(), Heard::Quiet);
        assert_eq!(a.hear(), Heard::Quiet, "each side rings the other");
        b.ring();
        assert_eq!(a.hear(), Heard::Rung);
        drop(a);
        assert_eq!(b.hear(), Heard::Gone);
        // The pipe of the peer gone keeps a reader: a ring into it is
        // written, not refused with `SIGPIPE` and `EPIPE`.
        assert_eq!(nowait(&b.ring, Op::Write(&[1])).unwrap(), 1);
        let (a, ends) = Bells::pair().unwrap();
        drop(Bells::from_peer(ends).unwrap());
        assert_eq!(nowait(&a.ring, Op::Write(&[1])).unwrap(), 1);
    }

    #[test]
    fn the_kernel_is_asked_rightly_whether_a_set_hears_rings_left_unread() {
        let (a, ends) = Bells::pair().unwrap();
        let b = Bells::from_peer(ends).unwrap();
        let set = Epoll::new().unwrap();
        set.add(b.fd(), 1, true).unwrap();
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }];
        let mut heard = 0;
        for _ in 0..20 {
            a.ring();
            heard += set.wait(&mut ev, Duration::from_millis(50)).unwrap();
        }
        // The first ring into an empty pipe is heard by every kernel; the
        // others, left unread, only where the answer is yes.
        let every = edge_hears_every_ring();
        assert_eq!(heard, if every { 20 } else { 1 }, "the answer: {every}");
        assert_eq!(b.hear(), Heard::Rung);
        a.ring();
        assert_eq!(set.wait(&mut ev, Duration::from_millis(50)).unwrap(), 1);
    }

    #[test]
    fn a_full_pipe_made_blocking_by_the_peer_does_not_hold_the_ringer() {
        let (a, [hear, ring, keep]) = Bells::pair().unwrap();
        // The peer clears the flag on the file both share, and never reads.
        rustix::fs::fcntl_setfl(&hear, rustix::fs::OFlags::empty()).unwrap();
        rustix::fs::fcntl_setfl(&a.ring, rustix::fs::OFlags::empty()).unwrap();
        let t = std::time::Instant::now();
        for _ in 0..100_000 {
            a.ring();
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(20));
        let b = Bells::from_peer([hear, ring, keep]).unwrap();
        // A read end the peer made blocking after it was taken is read
        // without waiting too.
        rustix::fs::fcntl_setfl(&b.hear, rustix::fs::OFlags::empty()).unwrap();
        assert_eq!(b.hear(), Heard::Rung);
        let mut rest = 0;
        while b.hear() == Heard::Rung {
            rest += 1;
            assert!(rest < 10_000, "the pipe drains");
        }
    }

    #[test]
    fn ends_that_are_not_pipe_ends_are_refused() {
        let (_a, [hear, ring, keep]) = Bells::pair().unwrap();
        let file = OwnedFd::from(tempfile::tempfile().unwrap());
        let e = Bells::from_peer([file, ring, keep]).unwrap_err();
        assert!(e.to_string().contains("read end"), "{e}");
        // The ends swapped: a write end where the read end goes.
        let (_b, [hear2, ring2, keep2]) = Bells::pair().unwrap();
        assert!(Bells::from_peer([ring2, hear2, keep2]).is_err());
        // A read end to keep of another pipe than the one rung.
        let (_c, [hear3, ring3, _]) = Bells::pair().unwrap();
        let e = Bells::from_peer([hear3, ring3, hear]).unwrap_err();
        assert!(e.to_string().contains("without a read end"), "{e}");
    }
}
