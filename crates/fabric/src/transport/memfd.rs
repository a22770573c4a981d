//! Memory shared with another process that it cannot shrink: anonymous
//! files (`memfd`) sealed against resizing, passed over a unix socket. A
//! peer that truncated a file we map would kill us with SIGBUS on the next
//! access; a sealed memfd cannot be truncated by anyone, and it has no name
//! to follow or to leave behind.

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// A new sealed memfd of `len` zero bytes.
pub(crate) fn sealed(name: &str, len: usize) -> io::Result<File> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, len as u64)?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(File::from(fd))
}

/// Takes a descriptor a peer sent as the memory it promised: a memfd sealed
/// against shrinking, of exactly `len` bytes.
pub(crate) fn check_sealed(fd: OwnedFd, len: usize) -> io::Result<File> {
    let refuse = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let seals = rustix::fs::fcntl_get_seals(&fd)
        .map_err(|_| refuse("shared memory from the peer is not a sealed memfd"))?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err(refuse("shared memory from the peer can be shrunk"));
    }
    let size = rustix::fs::fstat(&fd)?.st_size;
    if u64::try_from(size).ok() != Some(len as u64) {
        return Err(refuse("shared memory from the peer has the wrong size"));
    }
    Ok(File::from(fd))
}

/// Sends `bytes` with `fd` attached; the whole of `bytes` or an error.
pub(crate) fn send_with_fd(sock: impl AsFd, bytes: &[u8], fd: impl AsFd) -> io::Result<()> {
    send_with_fds(sock, bytes, &[fd.as_fd()])
}

/// Most descriptors sent or taken with one message.
pub(crate) const MAX_FDS: usize = 4;

/// Sends `bytes` with `fds` (at most [`MAX_FDS`]) attached; the whole of
/// `bytes` or an error.
pub(crate) fn send_with_fds(
    sock: impl AsFd,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS || !cmsg.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("no room for a descriptor"));
    }
    let n = rustix::net::sendmsg(
        &sock,
        &[IoSlice::new(bytes)],
        &mut cmsg,
        SendFlags::NOSIGNAL,
    )?;
    if n != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "descriptor sent with part of its message",
        ));
    }
    Ok(())
}

/// Receives into `buf`, and the descriptors that came with those bytes
/// (any beyond the first are closed). `Ok(None)` when a non-blocking socket
/// has nothing; `Ok(Some((0, _)))` at end of stream.
pub(crate) fn recv_with_fd(
    sock: impl AsFd,
    buf: &mut [u8],
) -> io::Result<Option<(usize, Option<OwnedFd>)>> {
    let mut first = None;
    let got = recv_with_fds(sock, buf, |fd| {
        if first.is_none() {
            first = Some(fd);
        }
    })?;
    Ok(got.map(|n| (n, first)))
}

/// Receives into `buf`, and hands each descriptor that came with those
/// bytes (at most [`MAX_FDS`]; the kernel closes any beyond) to `take`.
/// `Ok(None)` when a non-blocking socket has nothing; `Ok(Some(0))` at end
/// of stream.
pub(crate) fn recv_with_fds(
    sock: impl AsFd,
    buf: &mut [u8],
    mut take: impl FnMut(OwnedFd),
) -> io::Result<Option<usize>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let got = match rustix::net::recvmsg(
        &sock,
        &mut [IoSliceMut::new(buf)],
        &mut cmsg,
        RecvFlags::CMSG_CLOEXEC,
    ) {
        Ok(r) => r,
        Err(rustix::io::Errno::AGAIN) => return Ok(None),
        Err(rustix::io::Errno::INTR) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            fds.for_each(&mut take);
        }
    }
    Ok(Some(got.bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_sealed_memfd_crosses_a_socket_and_cannot_shrink() {
        let f = sealed("test", 8192).unwrap();
        assert!(f.set_len(4096).is_err(), "sealed against shrinking");
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fd(&a, b"x", &f).unwrap();
        let mut buf = [0u8; 4];
        let (n, fd) = recv_with_fd(&b, &mut buf).unwrap().unwrap();
        assert_eq!(n, 1);
        let fd = fd.expect("a descriptor came along");
        assert!(check_sealed(fd.try_clone().unwrap(), 4096).is_err());
        let got = check_sealed(fd, 8192).unwrap();
        assert!(got.set_len(0).is_err());

        // A plain file, or an unsealed memfd, is refused.
        let plain = tempfile::tempfile().unwrap();
        plain.set_len(8192).unwrap();
        assert!(check_sealed(OwnedFd::from(plain), 8192).is_err());
        let loose = rustix::fs::memfd_create("loose", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&loose, 8192).unwrap();
        assert!(check_sealed(loose, 8192).is_err());
    }
}
