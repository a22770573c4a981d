//! When a datagram reached this host: the kernel's receive time of the
//! last datagram read from a socket (`SIOCGSTAMPNS`, the wall clock), so
//! that the central manager judges a manager's silence by when its words
//! arrived, not by when a busy or stalled station got round to reading
//! them (a challenger's beat read first after a stall would otherwise
//! find the holder silent while the holder's own beats wait behind it).
#![allow(unsafe_code)]

use macrolink_manage::Nanos;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;

/// `SIOCGSTAMPNS` of `asm-generic/sockios.h`: the receive time of the
/// last datagram passed to the user, as a `timespec`.
const SIOCGSTAMPNS: u32 = 0x8907;

/// Turns the kernel's receive stamps on for `sock`: the first ask does
/// (and finds none yet).
pub fn enable(sock: &UdpSocket) {
    let _ = last(sock);
}

/// The receive time of the last datagram read from `sock`, in wall-clock
/// nanoseconds; none if the kernel kept none.
pub fn last(sock: &UdpSocket) -> Option<Nanos> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: SIOCGSTAMPNS writes one `timespec` to the pointer it is
    // given, which points at `ts`, alive and writable for the call; the
    // descriptor is `sock`'s, open while it is borrowed.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCGSTAMPNS as _, &mut ts) };
    if r != 0 || ts.tv_sec < 0 {
        return None;
    }
    Some(ts.tv_sec as Nanos * 1_000_000_000 + ts.tv_nsec as Nanos)
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
}
