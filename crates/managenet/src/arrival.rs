//! What the kernel knows of the datagrams a station reads: when the last
//! one read reached this host (`SIOCGSTAMPNS`, the wall clock), so that
//! silence is judged by when words arrived, not by when a busy or stalled
//! station got round to reading them; and how many its socket dropped for
//! want of room (`SO_MEMINFO`), since words lost are no silence either.
//!
//! Nothing else may set `SO_TIMESTAMP` or `SO_TIMESTAMPNS` on a socket
//! read here: with either set, the kernel keeps the stamp for those
//! options only and the one read here goes stale.

use macrolink_manage::Nanos;
use std::net::UdpSocket;

/// Turns the kernel's receive stamps on for `sock`: the first ask does
/// (and finds none yet; the kernel switches stamping on a moment later,
/// and a datagram read before then is stamped when it is read).
pub fn enable(sock: &UdpSocket) {
    let _ = last(sock);
}

/// The receive time of the last datagram read from `sock`, in wall-clock
/// nanoseconds; none before the first read (and where the kernel's
/// `timespec` is not two 64-bit words).
#[cfg(target_pointer_width = "64")]
#[allow(unsafe_code)]
pub fn last(sock: &UdpSocket) -> Option<Nanos> {
    use std::os::fd::AsRawFd;
    /// `SIOCGSTAMPNS` of `asm-generic/sockios.h` (`SIOCGSTAMPNS_OLD`),
    /// which on 64-bit targets writes a `timespec` of two 64-bit words.
    const SIOCGSTAMPNS: u32 = 0x8907;
    const _: () = assert!(std::mem::size_of::<libc::timespec>() == 16);
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // The kernel writes 16 bytes here, two 64-bit words (seconds,
    // nanoseconds); `ts` is that size (asserted above).
    // SAFETY: the pointer is to `ts`, alive and writable for the call, of
    // the size the kernel writes; the descriptor is `sock`'s, open while
    // borrowed.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCGSTAMPNS as _, &mut ts) };
    if r != 0 || !(0..1 << 33).contains(&ts.tv_sec) || !(0..1_000_000_000).contains(&ts.tv_nsec) {
        return None;
    }
    Some(ts.tv_sec as Nanos * 1_000_000_000 + ts.tv_nsec as Nanos)
}

/// [`last`] where the layout is not known: none.
#[cfg(not(target_pointer_width = "64"))]
pub fn last(_: &UdpSocket) -> Option<Nanos> {
    None
}

/// Datagrams `sock` has dropped since it was made (its receive buffer
/// full, among others); none where not known.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
#[allow(unsafe_code)]
pub fn drops(sock: &UdpSocket) -> Option<u32> {
    use std::os::fd::AsRawFd;
    /// `SO_MEMINFO` of `asm-generic/socket.h`.
    const SO_MEMINFO: libc::c_int = 55;
    let mut info = [0u32; 9];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes (the size of `info`)
    // to the pointer it is given, which points at `info`, alive and
    // writable for the call, and writes back in `len` how many it wrote.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    let i = libc::SK_MEMINFO_DROPS as usize;
    (r == 0 && len as usize >= (i + 1) * 4).then(|| info[i])
}

/// [`drops`] where the option's number is not known: none.
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
pub fn drops(_: &UdpSocket) -> Option<u32> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    fn wall() -> Nanos {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as Nanos
    }

    #[test]
    fn a_datagram_read_late_is_stamped_with_when_it_came() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        enable(&rx);
        // The kernel turns stamping on a moment later (deferred work);
        // until then a read is stamped when it is read. Wait for it, 2 s
        // at most.
        let mut buf = [0u8; 16];
        for _ in 0..100 {
            tx.send_to(b"prime", rx.local_addr().unwrap()).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            rx.recv_from(&mut buf).unwrap();
            if last(&rx).is_some_and(|at| wall() - at >= 10_000_000) {
                break;
            }
        }
        let before = wall();
        tx.send_to(b"beat", rx.local_addr().unwrap()).unwrap();
        let sent = wall();
        // Read a while after it came, as a stalled station would.
        std::thread::sleep(Duration::from_millis(300));
        let (n, _) = rx.recv_from(&mut buf).unwrap();
        let read = wall();
        assert_eq!(&buf[..n], b"beat");
        let at = last(&rx).expect("a receive stamp");
        assert!(before <= at && at <= read, "{before} <= {at} <= {read}");
        assert!(
            read - at >= 300_000_000,
            "read {} ms after it came, sent {} ms before the read",
            (read - at) / 1_000_000,
            (read - sent) / 1_000_000
        );
    }

    #[test]
    fn a_socket_that_has_read_nothing_has_no_stamp() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        enable(&rx);
        assert_eq!(last(&rx), None);
    }

    #[test]
    fn datagrams_a_full_socket_drops_are_counted() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(drops(&rx), Some(0));
        rustix::net::sockopt::set_socket_recv_buffer_size(&rx, 4096).unwrap();
        for _ in 0..200 {
            tx.send_to(&[7u8; 512], rx.local_addr().unwrap()).unwrap();
        }
        let lost = drops(&rx).unwrap();
        let mut buf = [0u8; 1024];
        rx.set_nonblocking(true).unwrap();
        let mut read = 0;
        while rx.recv_from(&mut buf).is_ok() {
            read += 1;
        }
        assert!(lost > 0, "none dropped, {read} read");
        assert_eq!(read + lost, 200, "{read} read, {lost} dropped");
    }
}
