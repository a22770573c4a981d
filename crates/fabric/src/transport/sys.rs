//! Thin wrappers over the few system calls the transports need.
//!
//! Most calls go through `syscall!`, which turns a `-1` return into the
//! `io::Error` of `errno`; the two a polling endpoint makes on every pass
//! ([`send_vectored`], [`recv`]) go through rustix's direct system calls.

use rustix::io::Errno;
use rustix::net;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

macro_rules! syscall {
    ($fn:ident ( $($arg:expr),* $(,)? )) => {{
        // SAFETY: every caller passes arguments that satisfy the documented
        // contract of the libc function named here (valid fds, pointers to live
        // buffers of the stated length).
        let res = unsafe { libc::$fn($($arg),*) };
        if res == -1 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(res)
        }
    }};
}

/// Sends the slices in order without blocking and without raising SIGPIPE.
/// Returns the bytes taken (0 when the socket buffer is full).
///
/// This and [`recv`] run on every pass of a polling endpoint: they make
/// their system call directly (rustix), not through libc's wrappers, which
/// are cancellation points and go through `errno`.
pub(crate) fn send_vectored(fd: RawFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: callers pass the descriptor of a socket they own, open for the
    // length of this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let flags = net::SendFlags::DONTWAIT | net::SendFlags::NOSIGNAL;
    match net::sendmsg(fd, bufs, &mut net::SendAncillaryBuffer::default(), flags) {
        Ok(n) => Ok(n),
        Err(Errno::AGAIN | Errno::INTR) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// Sends one buffer without blocking and without raising SIGPIPE: as
/// [`send_vectored`] of one slice, without the kernel's vector import.
pub(crate) fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: as in `send_vectored`.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let flags = net::SendFlags::DONTWAIT | net::SendFlags::NOSIGNAL;
    match net::send(fd, buf, flags) {
        Ok(n) => Ok(n),
        Err(Errno::AGAIN | Errno::INTR) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// Receives without blocking. `Ok(None)`: nothing there now. `Ok(Some(0))`:
/// the peer closed the stream (only for a non-empty `dst`).
pub(crate) fn recv(fd: RawFd, dst: &mut [u8], peek: bool) -> io::Result<Option<usize>> {
    // SAFETY: as in `send_vectored`.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut flags = net::RecvFlags::DONTWAIT;
    if peek {
        flags |= net::RecvFlags::PEEK;
    }
    match net::recv(fd, dst, flags) {
        Ok((n, _)) => Ok(Some(n)),
        Err(Errno::AGAIN | Errno::INTR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Receives without blocking into `head`, then `body`, in one call. As
/// [`recv`]: `Ok(None)`, nothing there now; `Ok(Some(0))`, the peer closed
/// the stream.
pub(crate) fn recv_split(fd: RawFd, head: &mut [u8], body: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: as in `send_vectored`.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut iov = [IoSliceMut::new(head), IoSliceMut::new(body)];
    let mut control = net::RecvAncillaryBuffer::default();
    match net::recvmsg(fd, &mut iov, &mut control, net::RecvFlags::DONTWAIT) {
        Ok(r) => Ok(Some(r.bytes)),
        Err(Errno::AGAIN | Errno::INTR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Receives, sleeping in the call until something comes or the socket's
/// receive timeout (`SO_RCVTIMEO`) goes by, on a socket left blocking.
/// `Ok(None)`: the timeout went by, or a signal came, with nothing there.
/// `Ok(Some(0))`: the peer closed the stream.
pub(crate) fn recv_sleeping(fd: RawFd, dst: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: as in `send_vectored`.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    match net::recv(fd, dst, net::RecvFlags::empty()) {
        Ok((n, _)) => Ok(Some(n)),
        Err(Errno::AGAIN | Errno::INTR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether a connected stream socket would take `len` more bytes now
/// without waiting: it holds nothing (sent and unacknowledged, or unsent),
/// or its send buffer has room for them. The buffer's accounting counts
/// some overhead per packet on top of the bytes, taken here as 1/16.
pub(crate) fn send_room(fd: RawFd, len: usize) -> io::Result<bool> {
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ on a socket) writes one int through the
    // pointer, which points at `queued`, alive for the call.
    syscall!(ioctl(fd, libc::TIOCOUTQ, &mut queued as *mut libc::c_int))?;
    if queued <= 0 {
        return Ok(true);
    }
    // SAFETY: as in `send_vectored`.
    let sock = unsafe { BorrowedFd::borrow_raw(fd) };
    let buffer = net::sockopt::socket_send_buffer_size(sock)?;
    let need = (queued as usize + len).saturating_mul(17) / 16;
    Ok(need <= buffer)
}

/// What `poll` waits for on one descriptor.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Interest {
    Read,
    Write,
}

/// Blocks until one of `fds` is ready or `timeout` passes. Returns the
/// number of ready descriptors; hang-ups count as ready.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let ms = timeout.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
    match syscall!(poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms)) {
        Ok(n) => Ok(n as usize),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

pub(crate) fn pollfd(fd: RawFd, interest: Interest) -> libc::pollfd {
    let events = match interest {
        Interest::Read => libc::POLLIN,
        Interest::Write => libc::POLLOUT | libc::POLLIN,
    };
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// Waits on one descriptor.
pub(crate) fn wait_fd(fd: RawFd, interest: Interest, timeout: Duration) -> io::Result<()> {
    let mut p = [pollfd(fd, interest)];
    poll(&mut p, Some(timeout)).map(drop)
}

/// An eventfd: a counter another thread bumps to wake a sleeping endpoint.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        let fd = syscall!(eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK))?;
        // SAFETY: eventfd just returned this descriptor; nothing else owns it.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub(crate) fn notify(&self) {
        let one: u64 = 1;
        // A full counter (EAGAIN) still leaves the fd readable: nothing to do.
        let _ = syscall!(write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8));
    }

    pub(crate) fn drain(&self) {
        let mut v: u64 = 0;
        let _ = syscall!(read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8));
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// The descriptor, no longer closed when this is dropped.
    pub(crate) fn into_raw(self) -> RawFd {
        std::os::fd::IntoRawFd::into_raw_fd(self.0)
    }

    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.0)
    }
}

/// An epoll set of descriptors waited on for reading, each level-triggered
/// (reported while readable) or edge-triggered (reported once each time
/// something comes).
#[derive(Debug)]
pub(crate) struct Epoll(OwnedFd);

impl Epoll {
    pub(crate) fn new() -> io::Result<Epoll> {
        let fd = syscall!(epoll_create1(libc::EPOLL_CLOEXEC))?;
        // SAFETY: epoll_create1 just returned this descriptor; nothing else
        // owns it.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds `fd`, reported with `data` while it is readable, or with
    /// `edge` each time it becomes (or, for a pipe on most kernels, stays)
    /// readable by something written.
    pub(crate) fn add(&self, fd: RawFd, data: u64, edge: bool) -> io::Result<()> {
        let trigger = if edge { libc::EPOLLET } else { 0 };
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | trigger) as u32,
            u64: data,
        };
        syscall!(epoll_ctl(
            self.0.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd,
            &mut ev
        ))
        .map(drop)
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Takes `fd` out.
    pub(crate) fn delete(&self, fd: RawFd) -> io::Result<()> {
        let null = std::ptr::null_mut();
        syscall!(epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, null)).map(drop)
    }

    /// Waits until a descriptor in the set is ready or `timeout` passes
    /// (zero: not at all; else at least a millisecond, as [`poll`]'s);
    /// fills the front of `events` and returns how many. A signal ends it
    /// early, as nothing ready.
    pub(crate) fn wait(
        &self,
        events: &mut [libc::epoll_event],
        timeout: Duration,
    ) -> io::Result<usize> {
        let ms = if timeout.is_zero() {
            0
        } else {
            timeout.as_millis().clamp(1, i32::MAX as u128) as i32
        };
        let max = events.len().min(i32::MAX as usize) as i32;
        match syscall!(epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), max, ms)) {
            Ok(n) => Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }
}

/// Unblocks a thread sitting in `accept` on `fd`.
pub(crate) fn shutdown(fd: RawFd) {
    let _ = syscall!(shutdown(fd, libc::SHUT_RDWR));
}

/// Nanoseconds on the system-wide monotonic clock: comparable between
/// processes of one host.
pub fn clock_ns() -> u64 {
    // SAFETY: timespec is plain data; zeroed is valid.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn set_opt(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    syscall!(setsockopt(
        fd,
        level,
        name,
        (&v as *const libc::c_int).cast(),
        std::mem::size_of::<libc::c_int>() as libc::socklen_t
    ))
    .map(drop)
}

/// Makes the kernel abort a TCP connection within about `ms` milliseconds
/// of its link going dark: sent data unacknowledged that long
/// (TCP_USER_TIMEOUT), or, with nothing to send, keepalive probes every
/// second unanswered that long.
pub(crate) fn fail_fast(fd: RawFd, ms: u32) -> io::Result<()> {
    let ms = ms.min(i32::MAX as u32) as libc::c_int;
    set_opt(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms)?;
    set_opt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set_opt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 1)?;
    set_opt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1)?;
    set_opt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, (ms / 1000).max(1))
}

/// The process at the other end of a unix socket, as the kernel recorded
/// it when the socket was connected; `None` for a process of another user
/// (or one this process cannot name).
pub(crate) fn peer_pid(fd: RawFd) -> Option<libc::pid_t> {
    // SAFETY: ucred is plain data; zeroed is valid.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    syscall!(getsockopt(
        fd,
        libc::SOL_SOCKET,
        libc::SO_PEERCRED,
        (&mut c as *mut libc::ucred).cast(),
        &mut len
    ))
    .ok()?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    (c.pid > 0 && c.uid == uid).then_some(c.pid)
}

/// Copies `src` into process `pid`'s memory at `addr` (cross-memory
/// attach), going on where a partial copy stopped.
pub(crate) fn write_into(pid: libc::pid_t, src: &[u8], addr: u64) -> io::Result<()> {
    let mut done = 0usize;
    while done < src.len() {
        let local = libc::iovec {
            iov_base: src[done..].as_ptr() as *mut libc::c_void,
            iov_len: src.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (addr as usize).wrapping_add(done) as *mut libc::c_void,
            iov_len: src.len() - done,
        };
        // The kernel checks the remote range against the other process's
        // mappings (EFAULT); this process's side is `src`.
        let n = syscall!(process_vm_writev(pid, &local, 1, &remote, 1, 0))?;
        if n <= 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        done += n as usize;
    }
    Ok(())
}
