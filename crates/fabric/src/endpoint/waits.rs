//! The connections of an endpoint that has more than a few, in one epoll
//! set: a sleep, and a look at what the cold ones have, then cost the
//! kernel the descriptors that stirred, not every one the endpoint holds.
//!
//! A polling endpoint of a few connections (or a waiting one that uses
//! datagrams, below) polls each one's descriptor when it sleeps; its
//! sockets are in no set, since a socket in an epoll set costs every
//! packet that arrives on it the set's callback (measured here: 4 % on a
//! polling tcp ping-pong of one connection). Past [`WATCH_OVER`]
//! connections the set watches all of them: a sleep polls
//! the set's descriptor beside the inbox's wake-up, the UDP socket and the
//! UCX worker, and asks the set which connections stirred when it did; an
//! endpoint that does not sleep (polling, or waiting but kept busy) asks
//! it now and then which of its cold connections have something (see
//! `transport::tcp`).
//!
//! ```text
//!  a connection made ─► add(slot, fd)     gone ─► remove(slot, fd)
//!     (either may start or end the watch: true when it does)
//!  watching: poll(.., set's fd) ─► look() ─► stirred(slot), stirred_slots()
//! ```
//!
//! A waiting endpoint sleeps in the set itself: the set then holds the
//! inbox's wake-up, the UDP socket and the UCX worker as well (its
//! *others*) and watches every connection, however few, so that a sleep
//! is one `epoll_wait` that says what stirred, as a sleep in `poll` of
//! them all says, but without handing the kernel every descriptor again
//! and taking it back each time (both sides of a 64 B tcp ping-pong on one
//! processor: 0.35-0.45 us a round trip for two bare threads, 0.2 us for
//! two endpoints). An endpoint that uses datagrams sleeps in `poll`
//! instead (see `Endpoint::sleeps_in_set`).
//!
//! ```text
//!  sleep_here(others) ─► the set holds them, watches every connection
//!  sleep(timeout) ─► other_stirred(k), stirred(slot)
//!  sleep_elsewhere() ─► back to a few connections polled by the sleep
//! ```
//!
//! The set is level-triggered, as `poll` is: what is left unread stirs
//! the next look again. The one exception is a shared-memory doorbell (a
//! pipe), which the set watches edge-triggered where the kernel reports
//! every byte written into a pipe so watched: each ring then stirs one
//! look whether the pipe was read since or not, so the end of a sleep
//! need not read it (see `transport::shm`). A look also says whether
//! each connection's descriptor hung up. Its buffer holds an event for
//! every connection and every other descriptor, so one look reports all
//! that stirred.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::transport::sys::Epoll;

/// An endpoint of more connections than this has its set watch them.
pub(crate) const WATCH_OVER: usize = 4;

/// What an event of the set's `k`-th other descriptor carries (a slot's
/// event carries the slot, far below).
const OTHER: u64 = 1 << 62;

#[derive(Debug)]
pub(crate) struct Waits {
    epoll: Epoll,
    /// Each slot's connection's descriptor, and whether the set watches
    /// it edge-triggered.
    fds: Vec<Option<(RawFd, bool)>>,
    /// Connections the endpoint holds.
    live: usize,
    /// The set holds every connection.
    watching: bool,
    /// The endpoint sleeps in the set, which then holds these too.
    others: Vec<RawFd>,
    /// The others that stirred in the last look, a bit each.
    others_stirred: u32,
    /// Room for an event from every connection and every other.
    events: Vec<libc::epoll_event>,
    /// Events the last look filled in.
    ready: usize,
    /// The number of the look in which each slot's connection last stirred.
    stirred: Vec<u64>,
    /// The number of the look in which each slot's connection last hung up.
    hung: Vec<u64>,
    /// The number of the last look (the first is 1).
    looks: u64,
    /// While the set watches, the slots a pass reads, a bit each: a cold
    /// connection dozes (its bit clear) until a look finds it stirred, so
    /// that a pass walks past none of a thousand quiet connections.
    awake: Vec<u64>,
}

impl Waits {
    pub(crate) fn new() -> io::Result<Waits> {
        Ok(Waits {
            epoll: Epoll::new()?,
            fds: Vec::new(),
            live: 0,
            watching: false,
            others: Vec::new(),
            others_stirred: 0,
            events: Vec::new(),
            ready: 0,
            stirred: Vec::new(),
            hung: Vec::new(),
            looks: 0,
            awake: Vec::new(),
        })
    }

    /// The connection in `slot` has descriptor `fd`, watched
    /// edge-triggered with `edge` (one that was there is taken out first).
    /// True when the set starts watching with it.
    pub(crate) fn add(&mut self, slot: usize, fd: RawFd, edge: bool) -> io::Result<bool> {
        if self.fds.len() <= slot {
            self.fds.resize(slot + 1, None);
            self.stirred.resize(slot + 1, 0);
            self.hung.resize(slot + 1, 0);
            self.awake.resize(slot / 64 + 1, 0);
        }
        self.wake(slot);
        if let Some((old, _)) = self.fds[slot] {
            self.remove(slot, old);
        }
        if self.watching {
            self.epoll.add(fd, slot as u64, edge)?;
        }
        self.fds[slot] = Some((fd, edge));
        self.live += 1;
        self.events.push(libc::epoll_event { events: 0, u64: 0 });
        if !self.watching && self.live > WATCH_OVER {
            self.watch()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// The connection in `slot`, of descriptor `fd`, is going; `fd` must
    /// still be open (a descriptor closed leaves the set by itself, but
    /// only once no copy of it is open anywhere). True when the set stops
    /// watching with it.
    pub(crate) fn remove(&mut self, slot: usize, fd: RawFd) -> bool {
        if self.fds.get(slot).copied().flatten().map(|(f, _)| f) != Some(fd) {
            return false;
        }
        if self.watching {
            // Fails only for a descriptor not in the set: nothing to undo.
            let _ = self.epoll.delete(fd);
        }
        self.fds[slot] = None;
        self.live -= 1;
        self.events.pop();
        if self.watching && self.live <= WATCH_OVER && self.others.is_empty() {
            self.unwatch();
            return true;
        }
        false
    }

    /// The endpoint sleeps in the set: it holds `others` (at most 32) too
    /// and watches every connection. True when the set starts watching
    /// with it. On failure the set is as it was.
    pub(crate) fn sleep_here(&mut self, others: &[RawFd]) -> io::Result<bool> {
        if !self.others.is_empty() || others.is_empty() {
            return Ok(false);
        }
        debug_assert!(others.len() <= 32);
        for (k, &fd) in others.iter().enumerate() {
            if let Err(e) = self.epoll.add(fd, OTHER + k as u64, false) {
                for &fd in &others[..k] {
                    let _ = self.epoll.delete(fd);
                }
                return Err(e);
            }
        }
        let started = !self.watching;
        if started {
            if let Err(e) = self.watch() {
                for &fd in others {
                    let _ = self.epoll.delete(fd);
                }
                return Err(e);
            }
        }
        self.others.extend_from_slice(others);
        self.events.resize(
            self.live + others.len(),
            libc::epoll_event { events: 0, u64: 0 },
        );
        Ok(started)
    }

    /// The endpoint sleeps no longer in the set: the others leave it, and
    /// it watches only more than a few connections. True when the set stops
    /// watching with it.
    pub(crate) fn sleep_elsewhere(&mut self) -> bool {
        for fd in self.others.drain(..) {
            let _ = self.epoll.delete(fd);
        }
        self.others_stirred = 0;
        self.events.truncate(self.live);
        if self.watching && self.live <= WATCH_OVER {
            self.unwatch();
            return true;
        }
        false
    }

    /// Whether the endpoint sleeps in the set.
    pub(crate) fn sleeps_here(&self) -> bool {
        !self.others.is_empty()
    }

    fn watch(&mut self) -> io::Result<()> {
        for (slot, fd) in self.fds.iter().enumerate() {
            if let Some((fd, edge)) = *fd {
                if let Err(e) = self.epoll.add(fd, slot as u64, edge) {
                    self.unwatch();
                    return Err(e);
                }
            }
        }
        self.watching = true;
        self.wake_all();
        Ok(())
    }

    fn unwatch(&mut self) {
        for (fd, _) in self.fds.iter().flatten() {
            let _ = self.epoll.delete(*fd);
        }
        self.watching = false;
    }

    /// Whether the set watches the endpoint's connections.
    pub(crate) fn watching(&self) -> bool {
        self.watching
    }

    /// The set's descriptor, readable while a connection in it is.
    pub(crate) fn fd(&self) -> RawFd {
        self.epoll.raw()
    }

    /// Asks the set, without waiting, which connections have something.
    pub(crate) fn look(&mut self) -> io::Result<()> {
        self.sleep(Duration::ZERO)
    }

    /// Waits up to `timeout` (as [`Epoll::wait`]) until something in the
    /// set stirs, and notes what did.
    pub(crate) fn sleep(&mut self, timeout: Duration) -> io::Result<()> {
        self.looks += 1;
        self.ready = 0;
        self.others_stirred = 0;
        self.ready = self.epoll.wait(&mut self.events, timeout)?;
        for k in 0..self.ready {
            let token = self.events[k].u64;
            if token >= OTHER {
                self.others_stirred |= 1 << ((token - OTHER) & 31);
                continue;
            }
            let slot = token as usize;
            if let Some(s) = self.stirred.get_mut(slot) {
                *s = self.looks;
                self.wake(slot);
            }
            let hup = (libc::EPOLLHUP | libc::EPOLLERR) as u32;
            if self.events[k].events & hup != 0 {
                if let Some(h) = self.hung.get_mut(slot) {
                    *h = self.looks;
                }
            }
        }
        Ok(())
    }

    /// Whether the `k`-th of the others stirred in the last look.
    pub(crate) fn other_stirred(&self, k: usize) -> bool {
        k < 32 && self.others_stirred & (1 << k) != 0
    }

    /// The connection in `slot` is read on every pass again.
    pub(crate) fn wake(&mut self, slot: usize) {
        if let Some(w) = self.awake.get_mut(slot / 64) {
            *w |= 1 << (slot % 64);
        }
    }

    /// Every connection is read on every pass again.
    pub(crate) fn wake_all(&mut self) {
        self.awake.fill(u64::MAX);
    }

    /// The connection in `slot` is cold: passes skip it until a look at
    /// the set finds it stirred.
    pub(crate) fn doze(&mut self, slot: usize) {
        if let Some(w) = self.awake.get_mut(slot / 64) {
            *w &= !(1 << (slot % 64));
        }
    }

    /// The bits of slots `64 * word..64 * (word + 1)` that are awake.
    pub(crate) fn awake(&self, word: usize) -> u64 {
        self.awake.get(word).copied().unwrap_or(0)
    }

    /// Whether the connection in `slot` stirred in the last look.
    pub(crate) fn stirred(&self, slot: usize) -> bool {
        self.stirred.get(slot) == Some(&self.looks)
    }

    /// Whether the connection in `slot` alone stirred in the last look.
    pub(crate) fn only_stirred(&self, slot: usize) -> bool {
        self.ready == 1 && self.stirred(slot)
    }

    /// Whether the connection in `slot` stirred in the last look by a
    /// descriptor the set watches edge-triggered, and whether that hung up.
    pub(crate) fn stirred_edge(&self, slot: usize) -> Option<bool> {
        let edge = self
            .fds
            .get(slot)
            .copied()
            .flatten()
            .is_some_and(|(_, e)| e);
        (edge && self.stirred(slot)).then(|| self.hung.get(slot) == Some(&self.looks))
    }

    /// The slots of the connections that stirred in the last look.
    pub(crate) fn stirred_slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.events[..self.ready]
            .iter()
            .filter(|e| e.u64 < OTHER)
            .map(|e| e.u64 as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn sorted(w: &Waits) -> Vec<usize> {
        let mut v: Vec<_> = w.stirred_slots().collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn the_set_watches_only_more_than_a_few_connections_and_names_those_with_something() {
        let pairs: Vec<_> = (0..WATCH_OVER + 2)
            .map(|_| UnixStream::pair().unwrap())
            .collect();
        let mut w = Waits::new().unwrap();
        for (i, (_, b)) in pairs.iter().take(WATCH_OVER).enumerate() {
            assert!(!w.add(i * 2, b.as_raw_fd(), false).unwrap());
        }
        (&pairs[1].0).write_all(b"x").unwrap();
        assert!(!w.watching());
        w.look().unwrap();
        assert!(sorted(&w).is_empty(), "a few: nothing in the set");
        // One more: every connection is in the set, the readable one found.
        assert!(w
            .add(WATCH_OVER * 2, pairs[WATCH_OVER].1.as_raw_fd(), false)
            .unwrap());
        assert!(w.watching());
        let last = WATCH_OVER + 1;
        assert!(!w.add(last * 2, pairs[last].1.as_raw_fd(), false).unwrap());
        w.look().unwrap();
        assert_eq!(sorted(&w), [2]);
        assert!(w.stirred(2) && !w.stirred(0) && !w.stirred(last * 2));
        (&pairs[last].0).write_all(b"y").unwrap();
        w.look().unwrap();
        assert_eq!(sorted(&w), [2, last * 2]);
        // Read, it no longer stirs (level-triggered: unread, it still does).
        let mut b = [0u8; 1];
        (&pairs[1].1).read_exact(&mut b).unwrap();
        w.look().unwrap();
        assert_eq!(sorted(&w), [last * 2]);
        assert!(!w.stirred(2));
        // A connection gone leaves the set; down to a few, the set is empty.
        assert!(!w.remove(last * 2, pairs[last].1.as_raw_fd()));
        w.look().unwrap();
        assert!(sorted(&w).is_empty());
        (&pairs[0].0).write_all(b"z").unwrap();
        w.look().unwrap();
        assert_eq!(sorted(&w), [0]);
        assert!(w.remove(WATCH_OVER * 2, pairs[WATCH_OVER].1.as_raw_fd()));
        assert!(!w.watching());
        w.look().unwrap();
        assert!(sorted(&w).is_empty());
        assert!(!w.stirred(0));
    }

    #[test]
    fn a_set_slept_in_holds_the_others_and_watches_even_one_connection() {
        let conn = UnixStream::pair().unwrap();
        let others: Vec<_> = (0..2).map(|_| UnixStream::pair().unwrap()).collect();
        let fds: Vec<_> = others.iter().map(|(_, b)| b.as_raw_fd()).collect();
        let mut w = Waits::new().unwrap();
        assert!(!w.add(3, conn.1.as_raw_fd(), false).unwrap());
        assert!(!w.watching() && !w.sleeps_here());
        assert!(w.sleep_here(&fds).unwrap(), "one connection, watched");
        assert!(w.watching() && w.sleeps_here());
        assert!(!w.sleep_here(&fds).unwrap(), "already");
        let nap = Duration::from_millis(1);
        w.sleep(nap).unwrap();
        assert!(!w.other_stirred(0) && !w.other_stirred(1) && !w.stirred(3));
        // An other stirs: said as such, not as a slot.
        (&others[1].0).write_all(b"x").unwrap();
        w.sleep(Duration::from_secs(5)).unwrap();
        assert!(w.other_stirred(1) && !w.other_stirred(0));
        assert!(sorted(&w).is_empty() && !w.stirred(3));
        // All of them at once: one sleep says so (room for every event).
        (&others[0].0).write_all(b"x").unwrap();
        (&conn.0).write_all(b"x").unwrap();
        w.sleep(Duration::from_secs(5)).unwrap();
        assert!(w.other_stirred(0) && w.other_stirred(1));
        assert_eq!(sorted(&w), [3]);
        assert!(w.stirred(3));
        // A connection added while the set is slept in is watched at once;
        // the last one gone, the set still holds the others.
        let second = UnixStream::pair().unwrap();
        assert!(!w.add(0, second.1.as_raw_fd(), false).unwrap());
        (&second.0).write_all(b"x").unwrap();
        w.look().unwrap();
        assert_eq!(sorted(&w), [0, 3]);
        assert!(!w.remove(0, second.1.as_raw_fd()));
        assert!(!w.remove(3, conn.1.as_raw_fd()));
        assert!(w.watching());
        w.look().unwrap();
        assert!(w.other_stirred(0) && sorted(&w).is_empty());
        // Slept in no longer: the others leave, and so does the watch.
        assert!(!w.add(3, conn.1.as_raw_fd(), false).unwrap());
        assert!(w.sleep_elsewhere(), "a few connections: not watched");
        assert!(!w.watching() && !w.sleeps_here());
        w.look().unwrap();
        assert!(!w.other_stirred(0) && !w.other_stirred(1) && !w.stirred(3));
        // Past a few connections, the set watches after the others leave.
        let many: Vec<_> = (0..=WATCH_OVER)
            .map(|_| UnixStream::pair().unwrap())
            .collect();
        for (i, (_, b)) in many.iter().enumerate() {
            w.add(10 + i, b.as_raw_fd(), false).unwrap();
        }
        assert!(w.watching());
        assert!(!w.sleep_here(&fds).unwrap(), "watching already");
        assert!(!w.sleep_elsewhere(), "still watching");
        assert!(w.watching() && !w.sleeps_here());
    }

    #[test]
    fn the_sets_descriptor_is_readable_while_a_connection_in_it_is() {
        let pairs: Vec<_> = (0..=WATCH_OVER)
            .map(|_| UnixStream::pair().unwrap())
            .collect();
        let mut w = Waits::new().unwrap();
        for (i, (_, b)) in pairs.iter().enumerate() {
            w.add(i, b.as_raw_fd(), false).unwrap();
        }
        let fd = w.fd();
        let readable = || {
            let mut p = [crate::transport::sys::pollfd(
                fd,
                crate::transport::sys::Interest::Read,
            )];
            crate::transport::sys::poll(&mut p, Some(Duration::from_millis(1))).unwrap() == 1
        };
        assert!(!readable());
        (&pairs[3].0).write_all(b"x").unwrap();
        assert!(readable());
        w.look().unwrap();
        assert!(readable(), "still unread");
    }

    #[test]
    fn a_connection_watched_by_its_edges_is_said_so_with_whether_it_hung_up() {
        let flags = rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK;
        let (er, ew) = rustix::pipe::pipe_with(flags).unwrap();
        let (lr, lw) = rustix::pipe::pipe_with(flags).unwrap();
        let mut w = Waits::new().unwrap();
        w.add(1, er.as_raw_fd(), true).unwrap();
        w.add(2, lr.as_raw_fd(), false).unwrap();
        // Slept in, the set watches both.
        let others = UnixStream::pair().unwrap();
        w.sleep_here(&[others.1.as_raw_fd()]).unwrap();
        rustix::io::write(&ew, b"x").unwrap();
        rustix::io::write(&lw, b"x").unwrap();
        w.look().unwrap();
        assert_eq!(sorted(&w), [1, 2]);
        assert_eq!(w.stirred_edge(1), Some(false));
        assert_eq!(w.stirred_edge(2), None, "level-triggered");
        // Unread, the level one stirs again, the edge one only once
        // something more is written.
        w.look().unwrap();
        assert_eq!(sorted(&w), [2]);
        assert_eq!(w.stirred_edge(1), None);
        drop(ew);
        w.look().unwrap();
        assert_eq!(sorted(&w), [1, 2]);
        assert_eq!(w.stirred_edge(1), Some(true), "its writer is gone");
        drop(lw);
        w.look().unwrap();
        assert_eq!(w.stirred_edge(2), None);
    }

    #[test]
    fn a_slot_given_another_connection_watches_only_the_new_one() {
        let pairs: Vec<_> = (0..=WATCH_OVER + 1)
            .map(|_| UnixStream::pair().unwrap())
            .collect();
        let mut w = Waits::new().unwrap();
        for (i, (_, b)) in pairs.iter().take(WATCH_OVER + 1).enumerate() {
            w.add(i, b.as_raw_fd(), false).unwrap();
        }
        let (old, new) = (&pairs[2], &pairs[WATCH_OVER + 1]);
        w.add(2, new.1.as_raw_fd(), false).unwrap();
        assert!(w.watching());
        (&old.0).write_all(b"x").unwrap();
        w.look().unwrap();
        assert!(!w.stirred(2), "the old descriptor was taken out");
        (&new.0).write_all(b"x").unwrap();
        w.look().unwrap();
        assert!(w.stirred(2));
        // Removing with a descriptor that is not the slot's leaves it.
        assert!(!w.remove(2, old.1.as_raw_fd()));
        w.look().unwrap();
        assert!(w.stirred(2));
    }

    #[test]
    fn a_dozing_connection_wakes_when_a_look_finds_it_stirred() {
        // Slots past one word of bits, and one in a word of its own.
        let slots = [0usize, 5, 63, 64, 100, 200];
        let pairs: Vec<_> = slots.iter().map(|_| UnixStream::pair().unwrap()).collect();
        let mut w = Waits::new().unwrap();
        for (&s, (_, b)) in slots.iter().zip(&pairs) {
            w.add(s, b.as_raw_fd(), false).unwrap();
        }
        assert!(w.watching());
        let awake = |w: &Waits| -> Vec<usize> {
            (0..4)
                .flat_map(|k| (0..64).map(move |b| (k, b)))
                .filter(|&(k, b)| w.awake(k) & (1 << b) != 0)
                .map(|(k, b)| k * 64 + b)
                .filter(|s| slots.contains(s))
                .collect()
        };
        assert_eq!(awake(&w), slots, "every connection starts awake");
        for s in slots {
            w.doze(s);
        }
        assert!(awake(&w).is_empty());
        (&pairs[3].0).write_all(b"x").unwrap();
        (&pairs[5].0).write_all(b"x").unwrap();
        w.look().unwrap();
        assert_eq!(awake(&w), [64, 200], "those that stirred");
        w.doze(64);
        w.doze(200);
        w.look().unwrap();
        assert_eq!(awake(&w), [64, 200], "unread, they stir again");
        w.wake_all();
        assert_eq!(awake(&w), slots);
        // A slot given a connection again is awake.
        w.doze(5);
        w.add(5, pairs[1].1.as_raw_fd(), false).unwrap();
        assert!(w.awake(0) & (1 << 5) != 0);
    }
}
