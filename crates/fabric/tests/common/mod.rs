//! Helpers shared by the fabric's test suites (each uses some of them).
#![allow(dead_code)]

use macrolink_fabric::{
    key, Addr, Completion, Endpoint, EndpointConfig, Key, Mode, Node, NodeConfig, Recv, Target,
};
use macrolink_wire::{Challenge, FrameKind, Header, Proof, CHALLENGE_LEN, HEADER_LEN, MAC_LEN};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// A raw TCP connection from `src` to endpoint 5 of `node` that passed the
/// handshake: a peer that does exactly what a test tells it.
pub fn raw_conn(node: &Node, src: Addr) -> TcpStream {
    let mut s = TcpStream::connect(node.tcp_addr().unwrap()).unwrap();
    let mut h = Header::new(FrameKind::Hello);
    h.src_node = src.node;
    h.src_ep = src.ep;
    h.dst_ep = 5;
    let answer = hello(&mut s, &Key::open(), h, |s, msg| s.write_all(msg));
    assert_eq!(answer.kind, FrameKind::HelloOk);
    s
}

/// Speaks the initiator's side of the handshake with `key`: answers the
/// challenge with `h` and its proof (sent by `send`), and returns the
/// answer, whose proof it checks when the answer is HelloOk.
pub fn hello<S: Read + Write>(
    s: &mut S,
    key: &Key,
    h: Header,
    send: impl FnOnce(&mut S, &[u8]) -> std::io::Result<()>,
) -> Header {
    let mut c = [0u8; CHALLENGE_LEN];
    s.read_exact(&mut c).unwrap();
    let challenge = Challenge::decode(&c).unwrap();
    let nonce = key::nonce().unwrap();
    let hb = h.encode();
    let proof = Proof {
        nonce,
        mac: key.initiator_mac(&challenge.nonce, &[&hb], &nonce),
    };
    let mut msg = hb.to_vec();
    msg.extend_from_slice(&proof.encode());
    send(s, &msg).unwrap();
    let mut a = [0u8; HEADER_LEN];
    s.read_exact(&mut a).unwrap();
    let answer = Header::decode(&a).unwrap();
    if answer.kind == FrameKind::HelloOk {
        let mut mac = [0u8; MAC_LEN];
        s.read_exact(&mut mac).unwrap();
        let want = key.acceptor_mac(&nonce, &challenge.nonce, &a);
        assert!(key::macs_match(&want, &mac), "the node proves the key");
    }
    answer
}

/// Aborts the test process after `secs` unless the returned guard is
/// dropped first: a test whose subject would block for good fails instead
/// of hanging the suite, and one that ends takes its watchdog with it.
#[must_use = "the watchdog is called off when this is dropped"]
pub fn watchdog(secs: u64, what: &'static str) -> Watchdog {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = done.clone();
    std::thread::spawn(move || {
        let until = std::time::Instant::now() + Duration::from_secs(secs);
        while std::time::Instant::now() < until {
            if seen.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("{what}: still blocked after {secs} s");
        std::process::abort();
    });
    Watchdog(done)
}

/// Calls its watchdog off when dropped.
pub struct Watchdog(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Sends `bytes` over a unix socket with `fds` (up to 4) attached.
pub fn send_with_fds(
    s: &mut std::os::unix::net::UnixStream,
    bytes: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    assert!(cmsg.push(SendAncillaryMessage::ScmRights(fds)));
    let n = rustix::net::sendmsg(
        &*s,
        &[std::io::IoSlice::new(bytes)],
        &mut cmsg,
        SendFlags::empty(),
    )?;
    assert_eq!(n, bytes.len());
    Ok(())
}

/// An anonymous file of `len` bytes, sealed against resizing or not.
pub fn memfd(len: u64, sealed: bool) -> std::fs::File {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd =
        rustix::fs::memfd_create("test", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    if sealed {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    }
    std::fs::File::from(fd)
}

/// Nodes 1 and 2 on this host, each knowing the other, and the directory
/// of their sockets.
pub fn nodes() -> (Node, Node, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(NodeConfig::local(1, dir.path())).unwrap();
    let b = Node::start(NodeConfig::local(2, dir.path())).unwrap();
    a.add_peer(2, b.tcp_addr().unwrap());
    b.add_peer(1, a.tcp_addr().unwrap());
    (a, b, dir)
}

/// Endpoint `ep` of each node, both completing by `completion`.
pub fn pair(a: &Node, b: &Node, ep: u32, completion: Completion) -> (Endpoint, Endpoint) {
    let cfg = EndpointConfig {
        completion,
        ..EndpointConfig::default()
    };
    (a.open(ep, cfg).unwrap(), b.open(ep, cfg).unwrap())
}

/// `msg` from `x` to `y` over `to_y` and back in `mode`, both read into
/// `buf`, both on this thread: each read finds its message there.
pub fn round_trip(
    x: &mut Endpoint,
    y: &mut Endpoint,
    to_y: Target,
    mode: Mode,
    buf: &mut [u8],
    msg: &[u8],
) {
    x.write(to_y, msg).unwrap();
    let r = y.read(buf).unwrap();
    assert_eq!(r.len, msg.len());
    let back = y.reply_target(&r, mode).unwrap();
    y.write(back, msg).unwrap();
    let r = x.read(buf).unwrap();
    assert_eq!((r.from, r.len), (y.addr(), msg.len()));
}

/// Most messages a [`Flood`] writes.
pub const FLOOD_MAX: u64 = 20_000;

/// A writer that keeps a reader busy: writes from a thread of its own,
/// until stopped, [`FLOOD_MAX`] messages or 10 s.
pub struct Flood<T> {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    handle: thread::JoinHandle<T>,
}

impl<T: Send + 'static> Flood<T> {
    /// Starts writing with `write`, which holds `state`.
    pub fn start(mut state: T, mut write: impl FnMut(&mut T) + Send + 'static) -> Flood<T> {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let handle = {
            let (stop, sent) = (stop.clone(), sent.clone());
            thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(10);
                let mut n = 0u64;
                while n < FLOOD_MAX && !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    write(&mut state);
                    n += 1;
                    sent.store(n, Ordering::Relaxed);
                }
                state
            })
        };
        Flood { stop, sent, handle }
    }

    /// Stops it and takes its state back, reading with `rx` meanwhile (a
    /// write may wait for the reader); returns how many it wrote.
    pub fn end(self, rx: &mut Endpoint) -> (T, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let mut buf = vec![0u8; 64 << 10];
        let until = Instant::now() + Duration::from_secs(20);
        while !self.handle.is_finished() && Instant::now() < until {
            rx.read_timeout(&mut buf, Duration::from_millis(10))
                .unwrap();
        }
        assert!(self.handle.is_finished(), "the flood did not end");
        let state = self.handle.join().unwrap();
        // What is left, read, so that nothing is left unread at close.
        for _ in 0..FLOOD_MAX {
            let r = rx.read_timeout(&mut buf, Duration::from_millis(50));
            if r.unwrap().is_none() {
                break;
            }
        }
        (state, self.sent.load(Ordering::Relaxed))
    }
}

/// Messages a [`busy_read`] reads before it has the quiet side speak.
pub const SPEAKS_AFTER: u64 = 200;

/// Reads as a busy reader does (50 us of work on each message, slower
/// than a flood writes) until `wanted` says a message is the one looked
/// for; `speak` is called once, when [`SPEAKS_AFTER`] messages have been
/// read, and `spoken` says when what it wrote has left the writer.
/// Returns how many messages came between that and the one looked for,
/// `None` if it did not come within 20 s.
pub fn busy_read(
    rx: &mut Endpoint,
    mut speak: impl FnMut(),
    spoken: impl Fn() -> bool,
    wanted: impl Fn(&Recv, &[u8]) -> bool,
) -> Option<u64> {
    let mut buf = [0u8; 256];
    let (mut busy, mut since) = (0u64, None);
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if busy == SPEAKS_AFTER {
            speak();
        }
        if since.is_none() && busy >= SPEAKS_AFTER && spoken() {
            since = Some(busy);
        }
        let left = until.saturating_duration_since(Instant::now());
        let r = rx.read_timeout(&mut buf, left).unwrap()?;
        if wanted(&r, &buf[..r.len]) {
            return Some(busy - since.unwrap_or(busy));
        }
        busy += 1;
        let work = Instant::now() + Duration::from_micros(50);
        while Instant::now() < work {
            std::hint::spin_loop();
        }
    }
    None
}
