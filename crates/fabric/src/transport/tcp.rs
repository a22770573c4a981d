//! TCP: one connection per pair of endpoints, `TCP_NODELAY`, vectored
//! sends (a small frame's pieces joined into one buffer, one `send`). A
//! put is a frame the target places.
//!
//! Reads smaller than [`READ_AHEAD`] (a frame's header, a small payload)
//! are served from one `recv` of up to that many bytes, so that a small
//! message costs the receiver one system call, not one for its header and
//! one for its payload. Larger reads go straight into the caller's buffer.
//! A polling reader that takes one message at a time (its last look
//! found the socket empty, or its last `recv` emptied it: a request and
//! its answer), whose last message was of 4 KiB or more and whose buffer is
//! larger than a read ahead, reads the next frame's header and payload in
//! one `recvmsg` too: the header into the frame reader, what follows it
//! straight into the reader's buffer (a split read,
//! [`ByteStream::try_read_split`]), where a header read ahead would cost
//! a second `recv` and a copy of the read ahead for any message larger
//! than [`READ_AHEAD`] (at 64 KiB a sixth of the time here). What was
//! read beyond the frame is put back ([`ByteStream::unread`]), into a
//! read-ahead buffer grown for it, up to [`SPLIT_MOST`].
//! A `recv` that gave less than asked emptied the socket, and so did a
//! `poll` that found nothing on it: the read after either answers
//! "nothing" without asking the kernel again (a waiting reader then sleeps
//! in `poll`, which sees what came since). A waiting endpoint with many
//! connections so reads only those its `poll` found readable.
//!
//! A polling endpoint looks at every connection on every pass, and a look
//! at a socket is a system call: a connection whose last [`COLD_AFTER`]
//! looks found nothing is cold, and is looked at on one pass in
//! [`COLD_EVERY`] only, until something comes, so that idle connections do
//! not slow a busy one (or the UDP socket) down. A look that must not miss
//! anything (`look_again`: a read that will not wait, a wait that found
//! the socket readable) ends that. An endpoint of more than a few
//! connections has its wait set watch them (`watched`): a cold one then
//! reads nothing until told to look again (the endpoint's passes skip
//! it: it dozes), and on one pass in [`COLD_EVERY`] the endpoint asks the
//! set which have something: one system call for all of them, where a
//! thousand idle connections each looked at on one pass in eight cost a
//! polling endpoint 125 system calls a pass. A deeper stage, one look in 64 after some 500 idle passes, slowed
//! the gateways: a relay's connection froze between two bursts of chunks,
//! and eight striped transfers through one to four gateways fell from
//! 0.93-1.00 to 0.73-0.85 of the links. So did a set asked only by a
//! polling endpoint and only at the end of a pass that delivered nothing:
//! a gateway, waiting but busy with some flows' chunks, left the others'
//! cold connections unread until it slept (0.60-0.89 of the links).
//!
//! Every call above passes `MSG_DONTWAIT`, so the socket may block: from
//! the first [`ByteStream::sleep_read`] on it does, with a receive timeout
//! of [`RECV_NAP`], and that call alone sleeps in a `recv`, for a waiting
//! endpoint whose one connection this is (see `endpoint::recv_sleep`): one
//! system call a message where a sleep in the wait set and then a `recv`
//! are two. (Not before: the handshake's answer may still be on its way
//! out through a plain write when the endpoint takes the connection.)

use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use super::sys::{self, Interest};
use super::ByteStream;
use crate::types::Transport;

/// Bytes read ahead of the frame reader.
const READ_AHEAD: usize = 4096;

/// The most a split read takes into the reader's buffer, and so the most
/// it may put back: the read-ahead buffer grows to this at most.
const SPLIT_MOST: usize = 64 << 10;

/// Frames up to this many bytes (header and payload) are copied into one
/// buffer and sent by one `send`, not a vectored `sendmsg`: the copy costs
/// less than the kernel's import of the vector.
const COALESCE: usize = 512;

/// The sleep in the socket's own `recv` asked for (its `SO_RCVTIMEO`). The
/// kernel counts it in clock ticks, rounded up, and ends it on a tick: 8 ms
/// with 250 ticks a second (measured), [`RECV_NAP_MOST`] at most with 100.
pub(crate) const RECV_NAP: Duration = Duration::from_micros(250);

/// The longest a sleep in the socket's `recv` may last: two ticks of the
/// slowest clock a kernel is built with (100 Hz). What else may stir a
/// waiting endpoint sleeping there (a new connection, a first datagram)
/// waits this long at most.
pub(crate) const RECV_NAP_MOST: Duration = Duration::from_millis(20);

/// Looks in a row that found nothing, after which a connection is cold.
pub(crate) const COLD_AFTER: u32 = 64;
/// An endpoint whose wait set watches asks the set which of its dozing
/// connections have something on one pass in this many, polling or
/// waiting (a busy waiting endpoint does not sleep, and so does not ask
/// the set there).
pub(crate) const COLD_EVERY: u32 = 8;

/// A connected TCP socket and the bytes read ahead from it.
#[derive(Debug)]
pub(crate) struct Tcp {
    sock: TcpStream,
    ahead: Box<[u8]>,
    /// Where a small frame's pieces are joined for one `send`.
    joined: Box<[u8; COALESCE]>,
    /// `ahead[at..end]` came from the socket and has not been read yet.
    at: usize,
    end: usize,
    /// The last `recv` emptied the socket.
    drained: bool,
    /// The last look found nothing, or the last `recv` emptied the socket:
    /// its reader takes a message at a time.
    sparse: bool,
    /// Looks in a row that found nothing (up to `COLD_AFTER`).
    empty: u32,
    /// Passes since a cold connection's last look.
    skipped: u32,
    /// Its endpoint's wait set watches it: cold, it reads nothing until
    /// told to look again.
    watched: bool,
    /// Whether the socket may be slept in (it blocks, with a receive
    /// timeout), once the first sleep asked: `None` until then.
    sleeps: Option<bool>,
    /// What a sleep in the socket's `recv` failed with, for the next read.
    failed: Option<io::Error>,
}

impl Tcp {
    pub(crate) fn new(sock: TcpStream) -> Tcp {
        Tcp {
            sock,
            ahead: vec![0; READ_AHEAD].into_boxed_slice(),
            joined: Box::new([0; COALESCE]),
            at: 0,
            end: 0,
            drained: false,
            sparse: false,
            empty: 0,
            skipped: 0,
            watched: false,
            sleeps: None,
            failed: None,
        }
    }

    /// Whether the socket may be slept in: the first time asked, it is
    /// made to block with a receive timeout (the timeout first: a socket
    /// that blocks without one is not left).
    fn may_sleep(&mut self) -> bool {
        *self.sleeps.get_or_insert_with(|| {
            self.sock.set_read_timeout(Some(RECV_NAP)).is_ok()
                && self.sock.set_nonblocking(false).is_ok()
        })
    }

    /// Counts a look that gave `n` bytes of the `asked`.
    fn looked(&mut self, n: usize, asked: usize) {
        self.empty = if n == 0 {
            (self.empty + 1).min(COLD_AFTER)
        } else {
            0
        };
        self.sparse = n < asked;
    }

    /// Moves read-ahead bytes into `dst`.
    fn take_ahead(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.end - self.at);
        dst[..n].copy_from_slice(&self.ahead[self.at..self.at + n]);
        self.at += n;
        n
    }
}

/// One `recv` into `dst`: `Ok(0)` when nothing is there, end of stream an
/// error. Inlined, as is `Tcp`'s `try_read`, into the frame reader that
/// makes it: after a system call the processor's return predictions are
/// the kernel's, and each return on the way back to the reader would miss.
#[inline(always)]
fn recv(fd: RawFd, dst: &mut [u8]) -> io::Result<usize> {
    match sys::recv(fd, dst, false)? {
        None => Ok(0),
        Some(0) => Err(io::ErrorKind::UnexpectedEof.into()),
        Some(n) => Ok(n),
    }
}

impl ByteStream for Tcp {
    fn transport(&self) -> Transport {
        Transport::Tcp
    }

    fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let fd = self.sock.as_raw_fd();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if bufs.len() < 2 || total > COALESCE {
            return sys::send_vectored(fd, bufs);
        }
        let mut at = 0;
        for b in bufs {
            self.joined[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        sys::send(fd, &self.joined[..at])
    }

    fn can_take(&self, len: usize) -> bool {
        // A socket that cannot say is taken as able: the write then waits
        // as it would have.
        sys::send_room(self.sock.as_raw_fd(), len).unwrap_or(true)
    }

    #[inline(always)]
    fn try_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if dst.is_empty() {
            return Ok(0);
        }
        if self.at < self.end {
            return Ok(self.take_ahead(dst));
        }
        if std::mem::take(&mut self.drained) {
            return Ok(0);
        }
        if self.empty >= COLD_AFTER {
            if self.watched {
                return Ok(0);
            }
            self.skipped += 1;
            if self.skipped < COLD_EVERY {
                return Ok(0);
            }
            self.skipped = 0;
        }
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let fd = self.sock.as_raw_fd();
        if dst.len() >= READ_AHEAD {
            let n = recv(fd, dst)?;
            self.looked(n, dst.len());
            self.drained = n > 0 && n < dst.len();
            return Ok(n);
        }
        let n = recv(fd, &mut self.ahead)?;
        self.looked(n, self.ahead.len());
        self.drained = n > 0 && n < self.ahead.len();
        (self.at, self.end) = (0, n);
        Ok(self.take_ahead(dst))
    }

    #[inline(always)]
    fn try_read_split(&mut self, head: &mut [u8], body: &mut [u8]) -> Option<io::Result<usize>> {
        // Only a read that would ask the kernel now, of a reader that takes
        // a message at a time, with room for more than a read ahead takes;
        // anything else reads as usual.
        if !self.sparse
            || body.len() < READ_AHEAD
            || self.at < self.end
            || self.drained
            || self.empty >= COLD_AFTER
            || self.failed.is_some()
        {
            return None;
        }
        let most = body.len().min(SPLIT_MOST);
        let body = &mut body[..most];
        let asked = head.len() + body.len();
        let n = match sys::recv_split(self.sock.as_raw_fd(), head, body) {
            Ok(None) => 0,
            Ok(Some(0)) => return Some(Err(io::ErrorKind::UnexpectedEof.into())),
            Ok(Some(n)) => n,
            Err(e) => return Some(Err(e)),
        };
        self.looked(n, asked);
        self.drained = n > 0 && n < asked;
        Some(Ok(n))
    }

    fn unread(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        debug_assert_eq!(self.at, self.end, "put back before a read");
        debug_assert!(bytes.len() <= SPLIT_MOST);
        if bytes.len() > self.ahead.len() {
            self.ahead = vec![0; bytes.len().next_power_of_two()].into_boxed_slice();
        }
        self.ahead[..bytes.len()].copy_from_slice(bytes);
        (self.at, self.end) = (0, bytes.len());
    }

    fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn write_interest(&self) -> Interest {
        Interest::Write
    }

    /// No sleep while bytes read ahead wait: the socket would not wake us
    /// for them.
    fn arm_read(&mut self) -> bool {
        self.at == self.end
    }

    fn can_sleep_read(&self) -> bool {
        self.sleeps != Some(false)
    }

    fn sleep_read(&mut self) -> Option<bool> {
        if self.at < self.end || !self.may_sleep() {
            return None;
        }
        match sys::recv_sleeping(self.sock.as_raw_fd(), &mut self.ahead) {
            Ok(None) => {
                // Nothing came: the sleep after the next pass sees what
                // comes since.
                self.drained = true;
                Some(false)
            }
            Ok(Some(0)) => {
                // The end of the stream: the next read looks, cold or
                // not, and finds it.
                self.look_again();
                Some(true)
            }
            Ok(Some(n)) => {
                self.looked(n, self.ahead.len());
                self.drained = n < self.ahead.len();
                (self.at, self.end) = (0, n);
                Some(true)
            }
            Err(e) => {
                self.failed = Some(e);
                self.look_again();
                Some(true)
            }
        }
    }

    fn look_again(&mut self) {
        self.drained = false;
        self.empty = 0;
    }

    fn quiet(&mut self) {
        self.drained = true;
    }

    fn cold(&self) -> bool {
        self.watched && self.empty >= COLD_AFTER
    }

    fn watched(&mut self, on: bool) {
        self.watched = on;
    }
}

/// Closing a socket with bytes the peer sent still unread makes the kernel
/// reset the connection instead of ending it, and a reset throws away what
/// this side wrote that the peer has not read yet: its last messages. What
/// waits is read off first (at most 1 MiB, without waiting for more).
impl Drop for Tcp {
    fn drop(&mut self) {
        let fd = self.sock.as_raw_fd();
        for _ in 0..(1 << 20) / self.ahead.len() {
            match sys::recv(fd, &mut self.ahead, false) {
                Ok(Some(n)) if n > 0 => {}
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, Tcp) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (r, _) = l.accept().unwrap();
        r.set_nonblocking(true).unwrap();
        (w, Tcp::new(r))
    }

    /// A split read is made only for a reader that found the socket empty
    /// (it takes a message at a time) and has room beyond a read ahead; it
    /// fills the header, then the body, in one call; what the frame reader
    /// puts back, more than a read ahead holds, comes out first and whole.
    #[test]
    fn a_split_read_fills_the_header_then_the_body_and_takes_back_the_rest() {
        let (mut w, mut t) = pair();
        let mut head = [0u8; 56];
        let mut body = vec![0u8; 20_000];
        assert!(
            t.try_read_split(&mut head, &mut body).is_none(),
            "no look has found the socket empty yet"
        );
        let mut small = [0u8; 100];
        assert_eq!(t.try_read(&mut small).unwrap(), 0, "nothing sent yet");
        assert!(
            t.try_read_split(&mut head, &mut body[..READ_AHEAD - 1])
                .is_none(),
            "no room beyond a read ahead"
        );
        // A header, its 10,000-byte payload and 8,000 bytes of what follows.
        let frame: Vec<u8> = (0..56 + 10_000 + 8_000).map(|i| (i % 251) as u8).collect();
        w.write_all(&frame).unwrap();
        let mut n = 0;
        for _ in 0..1000 {
            match t.try_read_split(&mut head, &mut body) {
                Some(Ok(0)) => std::thread::sleep(Duration::from_millis(1)),
                Some(Ok(got)) => {
                    n = got;
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(n > 56, "the frame never came");
        assert_eq!(&head[..], &frame[..56]);
        assert_eq!(&body[..n - 56], &frame[56..n]);
        // The rest of a frame that came in parts is read as usual.
        let mut got = body[..n - 56].to_vec();
        while got.len() < frame.len() - 56 {
            let mut more = vec![0u8; frame.len() - 56 - got.len()];
            let k = t.try_read(&mut more).unwrap();
            got.extend_from_slice(&more[..k]);
        }
        assert_eq!(&got[..], &frame[56..]);
        // The frame ended at 10,000: the 8,000 bytes after it go back, and
        // are read first, from a read-ahead buffer grown to hold them.
        t.unread(&got[10_000..]);
        assert!(t.ahead.len() >= 8_000);
        assert!(
            t.try_read_split(&mut head, &mut body).is_none(),
            "bytes put back wait ahead"
        );
        let mut back = Vec::new();
        loop {
            let k = t.try_read(&mut small).unwrap();
            if k == 0 {
                break;
            }
            back.extend_from_slice(&small[..k]);
        }
        assert_eq!(&back[..], &frame[56 + 10_000..]);
    }

    #[test]
    fn a_sleep_in_the_recv_keeps_what_came_and_ends_with_its_nap() {
        let (mut w, mut t) = pair();
        // Nothing comes: the nap ends it, the socket left to the next sleep.
        let t0 = std::time::Instant::now();
        assert_eq!(t.sleep_read(), Some(false));
        assert!(t0.elapsed() >= RECV_NAP, "it slept ({:?})", t0.elapsed());
        assert!(t0.elapsed() < Duration::from_secs(5), "a nap, not for good");
        let mut buf = [0u8; 16];
        assert_eq!(t.try_read(&mut buf).unwrap(), 0, "left to the sleep");
        // A writer on another thread, after the sleep began: it wakes it,
        // and what came waits for the next reads without a call.
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            w.write_all(b"twelve bytes").unwrap();
            w
        });
        let mut got = None;
        for _ in 0..200 {
            match t.sleep_read() {
                Some(true) => {
                    got = Some(());
                    break;
                }
                Some(false) => {}
                None => panic!("a tcp socket can be slept in"),
            }
        }
        assert!(got.is_some(), "the bytes woke no sleep");
        let mut w = writer.join().unwrap();
        assert_eq!(t.sleep_read(), None, "bytes wait ahead: no sleep");
        assert_eq!(t.try_read(&mut buf[..6]).unwrap(), 6);
        assert_eq!(t.try_read(&mut buf[6..]).unwrap(), 6);
        assert_eq!(&buf[..12], b"twelve bytes");
        // The end of the stream, taken by a sleep, is said by the next read.
        w.flush().unwrap();
        drop(w);
        assert_eq!(t.sleep_read(), Some(true));
        let end = t.try_read(&mut buf).unwrap_err();
        assert_eq!(end.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn every_other_call_on_the_blocking_socket_still_returns_at_once() {
        let (_w, mut t) = pair();
        assert_eq!(t.sleep_read(), Some(false), "now it blocks");
        // A call that blocked would sleep this long.
        t.sock
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let t0 = std::time::Instant::now();
        let mut buf = [0u8; 16];
        for _ in 0..100 {
            t.look_again();
            assert_eq!(t.try_read(&mut buf).unwrap(), 0);
        }
        let mut big = vec![0u8; 64 << 10];
        assert_eq!(
            t.try_read(&mut big).unwrap(),
            0,
            "a read past the read-ahead"
        );
        // Writes until the socket is full: the last takes nothing rather
        // than blocking (the peer never reads).
        let piece = vec![7u8; 1 << 16];
        let mut last = 1;
        for _ in 0..10_000 {
            last = t.try_write(&[IoSlice::new(&piece)]).unwrap();
            if last == 0 {
                break;
            }
        }
        assert_eq!(last, 0, "the socket never filled");
        assert!(t0.elapsed() < Duration::from_secs(5), "a call blocked");
    }

    /// Reads until `want` bytes came, in reads of `step` bytes, within 5 s.
    fn read_all(t: &mut Tcp, want: usize, step: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut buf = vec![0u8; step];
        while got.len() < want {
            assert!(
                std::time::Instant::now() < until,
                "only {} of {want}",
                got.len()
            );
            let n = t.try_read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    #[test]
    fn a_full_socket_cannot_take_a_chunk_and_an_emptied_one_can() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut r, _) = l.accept().unwrap();
        w.set_nonblocking(true).unwrap();
        let mut t = Tcp::new(w);
        const CHUNK: usize = 1 << 20;
        assert!(
            t.can_take(8 * CHUNK),
            "a socket that holds nothing takes any size"
        );
        // Fill it: the reader reads nothing.
        let piece = vec![7u8; 64 * 1024];
        let mut queued = 0;
        for _ in 0..10_000 {
            match t.try_write(&[IoSlice::new(&piece)]).unwrap() {
                0 => break,
                n => queued += n,
            }
        }
        assert!(queued > 0 && t.try_write(&[IoSlice::new(&piece)]).unwrap() == 0);
        assert!(!t.can_take(CHUNK), "{queued} bytes wait in a full socket");
        // The reader takes everything; once acknowledged, room again.
        r.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut read = 0;
        while read < queued {
            let n = std::io::Read::read(&mut r, &mut buf).unwrap();
            assert!(n > 0, "the writer's bytes end early");
            read += n;
        }
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !t.can_take(CHUNK) {
            assert!(
                std::time::Instant::now() < until,
                "never room after the reads"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn an_idle_connection_is_looked_at_less_often_and_if_watched_not_until_a_look_is_asked() {
        let (mut w, mut t) = pair();
        let fd = t.raw_fd();
        let mut buf = [0u8; 8];
        // Reads until cold: COLD_AFTER looks (the first read after one that
        // emptied the socket does not look).
        let cool = |t: &mut Tcp| {
            let mut reads = 0;
            while t.empty < COLD_AFTER {
                assert!(reads <= COLD_AFTER, "never cold");
                assert_eq!(t.try_read(&mut [0u8; 8]).unwrap(), 0);
                reads += 1;
            }
        };
        // Cold: what comes is found on the COLD_EVERY-th pass, not before.
        cool(&mut t);
        w.write_all(b"12345678").unwrap();
        sys::wait_fd(fd, Interest::Read, std::time::Duration::from_secs(5)).unwrap();
        for _ in 1..COLD_EVERY {
            assert_eq!(t.try_read(&mut buf).unwrap(), 0, "a skipped pass");
        }
        assert_eq!(t.try_read(&mut buf).unwrap(), 8);
        // Watched by a wait set and cold: what comes waits for a look to
        // be asked.
        t.watched(true);
        cool(&mut t);
        assert!(t.cold());
        w.write_all(b"12345678").unwrap();
        sys::wait_fd(fd, Interest::Read, std::time::Duration::from_secs(5)).unwrap();
        for _ in 0..4 * COLD_EVERY {
            assert_eq!(t.try_read(&mut buf).unwrap(), 0, "a cold pass");
        }
        t.look_again();
        assert!(!t.cold());
        assert_eq!(t.try_read(&mut buf).unwrap(), 8);
        // Hot again: the next bytes are found on the second pass (the
        // first trusts that the last `recv` emptied the socket).
        w.write_all(b"abcdefgh").unwrap();
        sys::wait_fd(fd, Interest::Read, std::time::Duration::from_secs(5)).unwrap();
        assert_eq!(t.try_read(&mut buf).unwrap(), 0);
        assert_eq!(t.try_read(&mut buf).unwrap(), 8);
        assert_eq!(&buf, b"abcdefgh");
        // Cold, and a look is asked: found at once.
        cool(&mut t);
        w.write_all(b"ABCDEFGH").unwrap();
        sys::wait_fd(fd, Interest::Read, std::time::Duration::from_secs(5)).unwrap();
        t.look_again();
        assert_eq!(t.try_read(&mut buf).unwrap(), 8);
        assert_eq!(&buf, b"ABCDEFGH");
    }

    #[test]
    fn small_and_large_reads_see_the_bytes_in_order_and_ahead_bytes_keep_us_awake() {
        let (mut w, mut t) = pair();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        w.write_all(&data).unwrap();
        // A small read takes more than it gives: the rest waits ahead,
        // and a sleep would miss it.
        let head = read_all(&mut t, 56, 56);
        assert!(t.end - t.at > 0, "read ahead");
        assert!(!t.arm_read(), "bytes wait ahead");
        // A large read gives the bytes read ahead first, then the socket's.
        let mut rest = read_all(&mut t, data.len() - 56, 65536);
        rest.truncate(data.len() - 56);
        assert_eq!([head, rest].concat(), data);
        assert!(t.arm_read(), "nothing ahead");
        drop(w);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut buf = [0u8; 8];
        loop {
            assert!(std::time::Instant::now() < until, "no end of stream");
            match t.try_read(&mut buf) {
                Ok(0) => std::thread::yield_now(),
                Ok(n) => panic!("{n} bytes after the end"),
                Err(e) => break assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            }
        }
    }

    #[test]
    fn a_frame_in_pieces_arrives_whole_and_in_order_joined_or_not() {
        let (w, mut r) = pair();
        w.set_nonblocking(true).unwrap();
        let mut t = Tcp::new(w);
        let mut sent = Vec::new();
        let mut n = 0u32;
        // Frames just under, at and over the size joined into one `send`,
        // cut into one, two and three pieces anywhere.
        for total in [1, 56, 57, 120, COALESCE - 1, COALESCE, COALESCE + 1, 4000] {
            for cut in [0, 1, total / 2, total - 1] {
                let frame: Vec<u8> = (0..total)
                    .map(|_| {
                        n = n.wrapping_add(1);
                        (n % 251) as u8
                    })
                    .collect();
                let (a, rest) = frame.split_at(cut);
                let (b, c) = rest.split_at(rest.len() / 2);
                let pieces = [IoSlice::new(a), IoSlice::new(b), IoSlice::new(c)];
                // What the socket takes is counted across the pieces, as
                // a caller resumes a frame after a partial send.
                let mut taken = t.try_write(&pieces).unwrap();
                let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
                while taken < total {
                    assert!(
                        std::time::Instant::now() < until,
                        "the socket takes nothing"
                    );
                    taken += t.try_write(&[IoSlice::new(&frame[taken..])]).unwrap();
                }
                sent.extend_from_slice(&frame);
            }
        }
        assert_eq!(read_all(&mut r, sent.len(), 65536), sent);
    }
}
