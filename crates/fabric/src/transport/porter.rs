//! The acceptors' own table of descriptors, and how what they accept
//! crosses into the endpoints' table.
//!
//! While more than one thread shares a table of descriptors, every system
//! call on a descriptor takes a reference to its file and drops it after
//! (`fdget`, `fput`); a table held by one thread alone is spared that. A
//! node's acceptors live as long as the node, asleep in `accept`: in the
//! application's table they would put that price on every send and
//! receive of a single-threaded application (an MPI rank, a benchmark). So
//! they run on a table of their own (`unshare(CLONE_FILES)`), which keeps
//! only what they use, and what they accept crosses over two socket pairs:
//!
//! ```text
//!  acceptors' table                            endpoints' table
//!  ────────────────                            ────────────────
//!  a handshake's stream: its descriptors ─parcels─► the next endpoint that
//!    (SCM_RIGHTS) and a ticket naming               adopts takes them, builds
//!    the rest (its shape)                           the stream, gives it to
//!                                                   its endpoint's inbox
//!  copies of the endpoints' doorbells ◄──bells─── an endpoint opened (its
//!    (a handshake wakes one asleep)                 eventfd), closed (none)
//! ```
//!
//! A descriptor is a number in one table. What the acceptors' side holds
//! is kept as a number and closed there (or with the table, when its last
//! thread ends); what the endpoints' side holds ([`Dock`]) is owned there;
//! nothing of one table is closed from the other. An inbox whose last
//! holder was a handshake leaves its doorbell's number to the endpoints'
//! side to close ([`orphan`], [`close_orphans`]).
//!
//! The acceptors' threads take no signal sent to the process: a handler
//! runs on the table of the thread that takes its signal, where a handler
//! writing to a descriptor of the endpoints' table would miss it.

use std::cell::Cell;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};

use super::memfd;
use super::sys;

/// The acceptors' side, shared with the endpoints' side for what is not
/// a descriptor. Its descriptors are numbers in the acceptors' table.
pub(crate) struct Porter<P> {
    /// The write end of the parcels.
    parcels: RawFd,
    /// The read end of the bells.
    bells: RawFd,
    next: AtomicU64,
    /// What each parcel on its way is, but for its descriptors.
    shapes: Mutex<HashMap<u64, P>>,
    /// The endpoints' doorbells, copied into the acceptors' table: endpoint
    /// id to (the serial of its inbox, the copy).
    rings: Mutex<HashMap<u32, (u64, RawFd)>>,
}

impl<P> std::fmt::Debug for Porter<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Porter").finish_non_exhaustive()
    }
}

/// The endpoints' side: the read end of the parcels and the write end of
/// the bells, owned in the endpoints' table. Held by the node and its
/// endpoints, never by an acceptor.
pub(crate) struct Dock<P> {
    parcels: OwnedFd,
    bells: OwnedFd,
    porter: Arc<Porter<P>>,
}

impl<P> std::fmt::Debug for Dock<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dock")
            .field("parcels", &self.parcels)
            .field("bells", &self.bells)
            .finish_non_exhaustive()
    }
}

/// The two socket pairs: the endpoints' side, and the ends the acceptors
/// take into their table (closed here once they have).
pub(crate) struct Pairs<P> {
    pub(crate) dock: Dock<P>,
    pub(crate) parcels_tx: OwnedFd,
    pub(crate) bells_rx: OwnedFd,
}

impl<P> Pairs<P> {
    pub(crate) fn new() -> io::Result<Pairs<P>> {
        let pair = || {
            socketpair(
                AddressFamily::UNIX,
                SocketType::SEQPACKET,
                SocketFlags::CLOEXEC,
                None,
            )
        };
        let (parcels_tx, parcels_rx) = pair()?;
        let (bells_tx, bells_rx) = pair()?;
        // Neither side waits on the other: a parcel that finds no room is
        // a connection refused, a bell that finds none an endpoint the
        // acceptors do not wake (it finds its connections on its next
        // pass), and a look takes what is there.
        for end in [&parcels_tx, &parcels_rx, &bells_tx, &bells_rx] {
            rustix::io::ioctl_fionbio(end, true)?;
        }
        let porter = Arc::new(Porter {
            parcels: parcels_tx.as_raw_fd(),
            bells: bells_rx.as_raw_fd(),
            next: AtomicU64::new(0),
            shapes: Mutex::new(HashMap::new()),
            rings: Mutex::new(HashMap::new()),
        });
        Ok(Pairs {
            dock: Dock {
                parcels: parcels_rx,
                bells: bells_tx,
                porter,
            },
            parcels_tx,
            bells_rx,
        })
    }
}

/// Bytes of a bell: endpoint id, inbox serial.
const BELL_LEN: usize = 12;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<P> Porter<P> {
    /// From an acceptors' table: sends `fds` with `parcel`, what they are,
    /// to the endpoints' table, and closes them here once sent. Fails when
    /// the parcels have no room (no endpoint has looked for a while).
    pub(crate) fn carry(&self, parcel: P, fds: Vec<OwnedFd>) -> io::Result<()> {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.shapes).insert(ticket, parcel);
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        // SAFETY: `parcels` is the write end of the parcels in this
        // (the acceptors') table, open while any acceptor thread runs.
        let tx = unsafe { BorrowedFd::borrow_raw(self.parcels) };
        if let Err(e) = memfd::send_with_fds(tx, &ticket.to_le_bytes(), &borrowed) {
            lock(&self.shapes).remove(&ticket);
            return Err(e);
        }
        Ok(())
    }

    /// Wakes endpoint `ep` (inbox `serial`) if it sleeps: one write to the
    /// acceptors' copy of its doorbell.
    pub(crate) fn ring(&self, ep: u32, serial: u64) {
        let mut rings = lock(&self.rings);
        if let Err(e) = self.hear_bells(&mut rings) {
            tracing::warn!("the acceptors' bells: {e}");
        }
        if let Some(&(s, fd)) = rings.get(&ep) {
            if s == serial {
                let one: u64 = 1;
                // A full counter (EAGAIN) still leaves the doorbell readable.
                // SAFETY: 8 bytes of a live u64, to a descriptor `rings` holds.
                unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
            }
        }
    }

    /// Takes the bells waiting into `rings`: doorbells of endpoints opened
    /// (copied into this table), and of endpoints closed (closed here).
    /// `Ok(false)` when the endpoints' side is gone.
    fn hear_bells(&self, rings: &mut HashMap<u32, (u64, RawFd)>) -> io::Result<bool> {
        // SAFETY: the read end of the bells in the acceptors' table.
        let rx = unsafe { BorrowedFd::borrow_raw(self.bells) };
        loop {
            let mut b = [0u8; BELL_LEN];
            let mut fd = None;
            let got = memfd::recv_with_fds(rx, &mut b, |f| {
                fd.get_or_insert(f);
            });
            match got? {
                Some(BELL_LEN) => {}
                Some(0) => return Ok(false),
                Some(_) => continue,
                None => return Ok(true),
            }
            let ep = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let mut s8 = [0u8; 8];
            s8.copy_from_slice(&b[4..]);
            let serial = u64::from_le_bytes(s8);
            let old = match fd {
                Some(f) => rings.insert(ep, (serial, f.into_raw_fd())),
                None => match rings.get(&ep) {
                    Some(&(s, _)) if s == serial => rings.remove(&ep),
                    _ => None,
                },
            };
            if let Some((_, old)) = old {
                // SAFETY: a copy this table held for `rings` alone.
                drop(unsafe { OwnedFd::from_raw_fd(old) });
            }
        }
    }

    /// The bells' thread, in the acceptors' table: takes bells as they
    /// come, so that they never fill their socket, until the endpoints'
    /// side is gone.
    pub(crate) fn listen_to_bells(&self) {
        mark();
        loop {
            match self.hear_bells(&mut lock(&self.rings)) {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    // Looked at again after a pause, not in a spin.
                    tracing::warn!("the acceptors' bells: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            }
            let _ = sys::wait_fd(
                self.bells,
                sys::Interest::Read,
                std::time::Duration::from_secs(3600),
            );
        }
    }
}

impl<P> Dock<P> {
    /// Tells the acceptors of endpoint `ep`'s doorbell (`Some`, when it
    /// opens) or that it is gone (`None`).
    pub(crate) fn bell(&self, ep: u32, serial: u64, wake: Option<BorrowedFd<'_>>) {
        let mut b = [0u8; BELL_LEN];
        b[..4].copy_from_slice(&ep.to_le_bytes());
        b[4..].copy_from_slice(&serial.to_le_bytes());
        let sent = match wake {
            Some(fd) => memfd::send_with_fds(&self.bells, &b, &[fd]),
            None => rustix::net::send(&self.bells, &b, rustix::net::SendFlags::NOSIGNAL)
                .map(drop)
                .map_err(io::Error::from),
        };
        if let Err(e) = sent {
            // A sleeping endpoint is then woken by its next nap's end, not
            // by the acceptors, and finds its connections on that pass.
            tracing::warn!("endpoint {ep}: the acceptors did not hear of it: {e}");
        }
    }

    /// Takes the parcels waiting (some at most): each with its
    /// descriptors, now of this table. A parcel whose shape is gone is
    /// dropped.
    pub(crate) fn take(&self, mut each: impl FnMut(P, Vec<OwnedFd>)) {
        close_orphans();
        for _ in 0..PARCELS_PER_LOOK {
            let mut b = [0u8; 8];
            let mut fds = Vec::new();
            let got = memfd::recv_with_fds(&self.parcels, &mut b, |f| fds.push(f));
            match got {
                Ok(Some(8)) => {}
                Ok(Some(_)) => continue,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("taking accepted connections: {e}");
                    return;
                }
            }
            if let Some(p) = lock(&self.porter.shapes).remove(&u64::from_le_bytes(b)) {
                each(p, fds);
            }
        }
    }

    /// The acceptors' side.
    pub(crate) fn porter(&self) -> &Arc<Porter<P>> {
        &self.porter
    }
}

/// Parcels one look takes at most (one message each).
const PARCELS_PER_LOOK: usize = 64;

thread_local! {
    /// Whether this thread runs on an acceptors' table.
    static ACCEPTORS: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as one of an acceptors' table (the threads it
/// starts are marked as they start).
pub(crate) fn mark() {
    ACCEPTORS.with(|a| a.set(true));
}

/// Whether the calling thread runs on an acceptors' table: a descriptor
/// of the endpoints' table is not to be closed from it.
pub(crate) fn on_acceptors_table() -> bool {
    ACCEPTORS.with(Cell::get)
}

/// Descriptors of the endpoints' table whose owner was dropped on an
/// acceptors' table (the last holder of an inbox was a handshake): closed
/// from the endpoints' side at its next look.
struct Orphans(Mutex<Vec<RawFd>>);

impl Orphans {
    const fn new() -> Orphans {
        Orphans(Mutex::new(Vec::new()))
    }

    fn push(&self, fd: RawFd) {
        lock(&self.0).push(fd);
    }

    /// From the endpoints' table: closes them.
    fn close(&self) {
        let fds = std::mem::take(&mut *lock(&self.0));
        for fd in fds {
            // SAFETY: a descriptor of this table whose owner is gone; no
            // one else holds its number, which stayed open until now.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
}

static ORPHANS: Orphans = Orphans::new();

/// Leaves `fd`, of the endpoints' table, to be closed from it.
pub(crate) fn orphan(fd: RawFd) {
    ORPHANS.push(fd);
}

/// From the endpoints' table: closes the descriptors left to it.
pub(crate) fn close_orphans() {
    ORPHANS.close();
}

/// Makes the calling thread's table of descriptors its own, keeping only
/// `keep` (and standard input, output and error) open in it. What the
/// thread, and the threads it starts, open from then on is in that table
/// alone; none of them takes a signal sent to the process
/// ([`block_signals`]). Fails, the table still shared, where the kernel
/// does not let it go.
pub(crate) fn own_table(keep: &[RawFd]) -> io::Result<()> {
    block_signals()?;
    // The copy holds every descriptor of the shared table; this thread
    // owns none of them but `keep` (its own copies from now on), and closes
    // the others in its copy at once, touching nothing another holds.
    // SAFETY: as just said.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FILES)? };
    let mut keep: Vec<RawFd> = keep.iter().copied().chain(0..3).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from: u32 = 0;
    let mut closed = Ok(());
    for &k in &keep {
        let k = k as u32;
        if k > from {
            closed = closed.and(close_range(from, k - 1));
        }
        from = k + 1;
    }
    if let Err(e) = closed.and(close_range(from, u32::MAX)) {
        // The table is this thread's all the same: what it could not
        // close it holds a copy of, which keeps the file open.
        tracing::warn!("the acceptors' table kept descriptors it does not use: {e}");
    }
    Ok(())
}

/// Blocks, in the calling thread and the threads it starts from now on,
/// every signal but those an instruction's fault raises in the thread
/// itself. A signal sent to the process is taken by any one of its threads
/// that does not block it, and its handler runs there, on that thread's
/// table of descriptors. A handler that writes to a descriptor (the
/// self-pipe of `signal_hook`, with which `macrolink` ends on SIGTERM)
/// would write, on the acceptors' table, to a number closed there, and the
/// signal would be lost, or to a number another file holds there.
fn block_signals() -> io::Result<()> {
    // SAFETY: sigset_t is plain data, for which all zeroes is a value;
    // sigfillset sets it before anything reads it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t this function owns; the functions
    // only write to it, and pthread_sigmask reads it and changes the mask
    // of the calling thread alone.
    let r = unsafe {
        libc::sigfillset(&mut set);
        for fault in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(&mut set, fault);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    match r {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Closes the descriptors `first..=last` of the calling thread's table.
fn close_range(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: closes descriptors of this thread's table, which it has just
    // made its own: no one else uses their numbers here.
    if unsafe { libc::close_range(first, last, 0) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOSYS) {
        return Err(e);
    }
    // A kernel before 5.9: each open one, as the table lists them.
    let open: Vec<u32> = std::fs::read_dir("/proc/thread-self/fd")?
        .filter_map(|d| d.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&n: &u32| (first..=last).contains(&n))
        .collect();
    for n in open {
        // SAFETY: as above.
        unsafe { libc::close(n as RawFd) };
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    /// Whether threads `a` and `b` of this process share one table of
    /// descriptors (`kcmp`); `None` when one has ended meanwhile.
    pub(crate) fn same_table(a: i32, b: i32) -> Option<bool> {
        // SAFETY: kcmp reads nothing of this process's memory.
        let r = unsafe {
            libc::syscall(libc::SYS_kcmp, a, b, 2 /* KCMP_FILES */, 0, 0)
        };
        (r >= 0).then_some(r == 0)
    }

    /// This process's threads whose name begins with `prefix` (the kernel
    /// keeps 15 bytes of a name).
    pub(crate) fn threads_named(prefix: &str) -> Vec<i32> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| {
                let t = t.ok()?;
                let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
                comm.starts_with(prefix)
                    .then(|| t.file_name().to_str()?.parse().ok())?
            })
            .collect()
    }

    /// What `look` finds once `found` says yes of it, or after 5 s: a
    /// thread names itself once it runs, which may be after the node that
    /// started it has (on a loaded machine, under a sanitizer).
    pub(crate) fn soon<T>(mut look: impl FnMut() -> T, found: impl Fn(&T) -> bool) -> T {
        let until = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let got = look();
            if found(&got) || std::time::Instant::now() > until {
                return got;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A loopback TCP pair.
    fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn a_node_s_acceptors_hold_a_table_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let node = crate::Node::start(crate::NodeConfig::local(4401, dir.path())).unwrap();
        let me = rustix::thread::gettid().as_raw_nonzero().get();
        // Every node's of this process (tests run side by side), this
        // one's among them.
        let (tcp, shm) = soon(
            || {
                (
                    threads_named("ml-tcp-accept-"),
                    threads_named("ml-shm-accept-"),
                )
            },
            |(t, s)| !t.is_empty() && !s.is_empty(),
        );
        assert!(
            !tcp.is_empty() && !shm.is_empty(),
            "acceptors of both kinds"
        );
        for &t in tcp.iter().chain(&shm) {
            assert_ne!(
                same_table(me, t),
                Some(true),
                "acceptor {t} shares this thread's table"
            );
        }
        // A node's two acceptors share theirs, which is this node's
        // threads' alone: some pair of them does.
        let paired = tcp
            .iter()
            .any(|&t| shm.iter().any(|&u| same_table(t, u) == Some(true)));
        assert!(paired, "the tcp and shm acceptors of a node share a table");
        drop(node);
    }

    #[test]
    fn a_socket_closed_after_a_node_started_is_closed_for_its_peer() {
        // Open before the node: the acceptors' table began as a copy of
        // this one, and must not keep it open.
        let (a, mut b) = tcp_pair();
        let dir = tempfile::tempdir().unwrap();
        let node = crate::Node::start(crate::NodeConfig::local(4402, dir.path())).unwrap();
        drop(a);
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(b.read(&mut buf).unwrap(), 0, "end of stream");
        drop(node);
    }

    fn reads_one(efd: &sys::EventFd) -> bool {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64.
        let n = unsafe { libc::read(efd.raw(), (&mut v as *mut u64).cast(), 8) };
        n == 8 && v >= 1
    }

    #[test]
    fn a_thread_marked_as_the_acceptors_is_told_apart_and_orphans_are_closed_later() {
        assert!(!on_acceptors_table());
        let marked = std::thread::spawn(|| {
            mark();
            on_acceptors_table()
        });
        assert!(marked.join().unwrap());
        assert!(!on_acceptors_table(), "only the thread marked");
        let orphans = Orphans::new();
        let efd = sys::EventFd::new().unwrap();
        let fd = efd.into_raw();
        orphans.push(fd);
        // Still open until the endpoints' side closes it.
        // SAFETY: F_GETFD reads a descriptor's flags.
        assert!(unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0);
        orphans.close();
        assert!(lock(&orphans.0).is_empty());
    }

    #[test]
    fn a_flood_no_endpoint_takes_fills_the_parcels_and_is_refused_not_waited_on() {
        // Peers that keep handshaking while no endpoint looks: each
        // parcel holds a descriptor, and the socket's room bounds them.
        let pairs = Pairs::<u32>::new().unwrap();
        let (dock, porter) = (&pairs.dock, pairs.dock.porter().clone());
        let efd = sys::EventFd::new().unwrap();
        let mut sent = 0u32;
        let refused = loop {
            assert!(sent < 100_000, "no bound on parcels in flight");
            let fd = efd.fd().try_clone_to_owned().unwrap();
            match porter.carry(sent, vec![fd]) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(refused.kind(), io::ErrorKind::WouldBlock, "{refused}");
        assert!(sent > 0);
        // The refused one left no shape behind; those in flight arrive,
        // in order, each with its descriptor.
        assert_eq!(lock(&porter.shapes).len(), sent as usize);
        let mut got = Vec::new();
        while got.len() < sent as usize {
            let before = got.len();
            dock.take(|p, fds| got.push((p, fds.len())));
            assert!(got.len() > before, "a look takes some");
        }
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, &(p, n))| p == i as u32 && n == 1));
        porter
            .carry(sent, vec![efd.fd().try_clone_to_owned().unwrap()])
            .unwrap();
    }

    #[test]
    fn a_bell_of_an_endpoint_gone_or_of_another_opening_of_it_does_not_ring() {
        let pairs = Pairs::<()>::new().unwrap();
        let (dock, porter) = (&pairs.dock, pairs.dock.porter().clone());
        let (first, second) = (sys::EventFd::new().unwrap(), sys::EventFd::new().unwrap());
        dock.bell(5, 10, Some(first.fd()));
        porter.ring(5, 11);
        assert!(!reads_one(&first), "another opening's serial");
        porter.ring(5, 10);
        assert!(reads_one(&first));
        dock.bell(5, 10, None);
        porter.ring(5, 10);
        assert!(!reads_one(&first), "gone");
        dock.bell(5, 12, Some(second.fd()));
        porter.ring(5, 12);
        assert!(reads_one(&second));
        assert_eq!(lock(&porter.rings).len(), 1);
    }
}
