//! What an endpoint does when a pass moved nothing: a polling one spins, a
//! waiting one sleeps in one `epoll_wait` of its wait set, or one `poll`,
//! of everything that may stir it, and offers a waiting read's buffer to
//! the connection likely to fill it.

use std::cell::OnceCell;
use std::time::{Duration, Instant};

use super::recv_sleep::{Sleeper, RECV_NAP_MOST};
use super::waits::Waits;
use super::{Deadline, Endpoint, HOT_SPINS};
use crate::error::Result;
use crate::rx::{give_way, Step, NAP, SPINS_PER_CHECK};
use crate::transport::sys;
use crate::transport::tcp::COLD_EVERY;
use crate::types::{Completion, Recv};

/// Where the inbox's wake-up and the UDP socket are among the others of
/// the wait set an endpoint sleeps in (see [`Endpoint::sleep_where`]).
const INBOX: usize = 0;
const UDP: usize = 1;

impl Endpoint {
    /// Nothing moved: spin or sleep. `user`, the buffer of a waiting read,
    /// may receive a message during the sleep, which is then returned.
    /// `now` is the clock read once for the sleep (read here if the caller
    /// did not): the deadline, the sleep's length and the UDP socket's
    /// turn are all taken from that one reading.
    pub(super) fn idle(
        &mut self,
        deadline: Deadline,
        now: &OnceCell<Instant>,
        user: Option<&mut [u8]>,
    ) -> Result<Option<Recv>> {
        match self.core.completion {
            Completion::Poll => {
                // Soon after traffic, spin flat out, as a busy-polling peer
                // does (a pause costs some tens of nanoseconds on current
                // processors, which a message then waits); after a while
                // of nothing, pause between looks.
                if self.idle_spins >= HOT_SPINS {
                    std::hint::spin_loop();
                }
                self.idle_spins += 1;
                give_way(self.idle_spins);
                if self.idle_spins >= SPINS_PER_CHECK {
                    self.idle_spins = HOT_SPINS;
                    for s in &mut self.slots {
                        if let Some(c) = s.conn.as_mut() {
                            c.link.check_alive();
                        }
                    }
                }
                Ok(None)
            }
            Completion::Wait => self.sleep(deadline, now, user),
        }
    }

    /// Blocks until a connection, the datagram socket, the UCX worker or
    /// the inbox stirs. With `user`, the buffer of a waiting read, offers
    /// it to the connection that sent the last large message, and returns
    /// the message placed in it, if one was.
    pub(super) fn sleep(
        &mut self,
        deadline: Deadline,
        now: &OnceCell<Instant>,
        mut user: Option<&mut [u8]>,
    ) -> Result<Option<Recv>> {
        let one = self.recv_sleeper(deadline, now);
        if one.is_none() {
            self.recv_sleep.none_to_sleep_in();
        }
        if self.waits.sleeps_here() != self.sleeps_in_set() {
            self.sleep_where();
        }
        if let Some(Sleeper::Udp) = one.filter(|_| self.recv_sleep.on()) {
            let udp = self.udp.as_mut().expect("a datagram socket");
            if let Some(got) = udp.sleep_read() {
                self.recv_sleep.slept_in_recv(got);
                if got {
                    // The next pass takes the datagram the sleep kept.
                    self.udp_look.stirred();
                }
                return Ok(None);
            }
        }
        if let Some(Sleeper::Conn(i)) = one.filter(|_| self.recv_sleep.on()) {
            let conn = self.slots[i].conn.as_mut().expect("the one connection");
            if let Some(got) = conn.link.sleep_read() {
                self.recv_sleep.slept_in_recv(got);
                // The set's looks are for dozing connections, and there is
                // none but this one, which the sleep just read: the count
                // to the next starts over (else a look every few messages).
                self.cold_countdown = COLD_EVERY;
                if got {
                    // What the sleep took is read on the next pass, were
                    // the connection dozing (a cold one that a set
                    // watches: not while the endpoint sleeps out of it).
                    self.waits.wake(i);
                    // The `recv` did not hear the UDP socket (a new
                    // connection is looked for on every pass). Timed from
                    // before the sleep: the socket's turn comes no later
                    // than one sleep after the gap, as a sleep of the
                    // socket alone makes it.
                    self.udp_look.slept_deaf(*now.get_or_init(Instant::now));
                } else {
                    self.udp_look.stirred();
                }
                return Ok(None);
            }
        }
        let mut armed = true;
        for s in &mut self.slots {
            if let Some(c) = s.conn.as_mut() {
                armed &= c.link.arm_read();
            }
        }
        if let Some(p) = self.ucx.as_mut() {
            armed &= p.arm();
        }
        let mut offered = None;
        let to = self.offer_to.or_else(|| self.only_conn());
        if let (true, Some(i), Some(buf)) = (armed, to, user.as_deref_mut()) {
            let conn = self.slots.get_mut(i).and_then(|s| s.conn.as_mut());
            if conn.is_some_and(|c| c.link.offer(buf)) {
                offered = Some(i);
            }
        }
        // A failed sleep is reported after the offer is withdrawn.
        let mut slept = Ok(());
        if armed {
            let timeout = match deadline {
                Deadline::At(t) => t
                    .saturating_duration_since(*now.get_or_init(Instant::now))
                    .min(NAP),
                _ => NAP,
            };
            let since = one.map(|s| (s, *now.get_or_init(Instant::now)));
            let in_set = self.waits.sleeps_here();
            slept = if in_set {
                self.sleep_in_set(timeout)
            } else {
                self.sleep_in_poll(timeout)
            };
            if let Some((s, t)) = since {
                let alone = match s {
                    Sleeper::Conn(i) if in_set => self.waits.only_stirred(i),
                    Sleeper::Conn(i) => {
                        let conn = self.slots[i].conn.as_ref();
                        conn.is_some_and(|c| self.polled_alone(c.link.read_fd()))
                    }
                    Sleeper::Udp => {
                        let udp = self.udp.as_ref();
                        !in_set && udp.is_some_and(|u| self.polled_alone(u.raw_fd()))
                    }
                };
                self.recv_sleep.slept_watching(alone, t.elapsed());
            }
        }
        for s in &mut self.slots {
            if let Some(c) = s.conn.as_mut() {
                c.link.disarm();
            }
        }
        let placed = offered.filter(|&i| {
            let conn = self.slots[i].conn.as_mut();
            conn.is_some_and(|c| c.link.withdraw())
        });
        if let Some(i) = placed {
            // The message is in the buffer and its notice next on the
            // connection: nothing else may be read into the buffer first.
            let gen = self.slots[i].gen;
            let conn = self.slots[i].conn.as_mut().expect("withdrawn above");
            match conn.link.progress(&mut self.core, user) {
                Step::Message { len, mode } => return Ok(Some(conn.recv(i, gen, len, mode))),
                Step::Delivered => return Ok(self.core.got.take()),
                Step::Lost => {
                    let reason = std::mem::take(&mut self.core.lost);
                    self.lose(i, reason);
                }
                _ => self.lose(i, "a message placed without its notice".into()),
            }
        }
        slept?;
        Ok(None)
    }

    /// What a sleep may sleep in the `recv` of (see `recv_sleep`), with
    /// no deadline within the longest nap and no UCX worker: the one
    /// connection, where nothing else is to be heard but the inbox and an
    /// idle UDP socket; the UDP socket, where datagrams are in use and
    /// there is no connection, nothing else but the inbox.
    fn recv_sleeper(&self, deadline: Deadline, now: &OnceCell<Instant>) -> Option<Sleeper> {
        if self.ucx.is_some() {
            return None;
        }
        if let Deadline::At(t) = deadline {
            if t.saturating_duration_since(*now.get_or_init(Instant::now)) < RECV_NAP_MOST {
                return None;
            }
        }
        if self.core.completion != Completion::Wait {
            return None;
        }
        if !self.udp_look.hot() {
            // A tcp connection's socket alone can be slept in: a shared
            // memory one's doorbell is heard best in the set.
            return self
                .only_conn()
                .filter(|&i| {
                    self.slots[i]
                        .conn
                        .as_ref()
                        .is_some_and(|c| c.link.can_sleep_read())
                })
                .map(Sleeper::Conn);
        }
        let no_conn = self.slots.iter().all(|s| s.conn.is_none());
        (no_conn && self.udp.is_some()).then_some(Sleeper::Udp)
    }

    /// Whether the last sleep in `poll` was ended by `fd` alone, and
    /// nothing else it watched stirred.
    fn polled_alone(&self, fd: std::os::fd::RawFd) -> bool {
        let p = &self.pollfds;
        p.iter().any(|p| p.fd == fd) && p.iter().all(|p| (p.fd == fd) == (p.revents != 0))
    }

    /// Sleeps in one `epoll_wait` of the wait set, which holds everything
    /// that may stir the endpoint (see `waits`), and has the next pass
    /// read what stirred.
    fn sleep_in_set(&mut self, timeout: Duration) -> std::io::Result<()> {
        self.waits.sleep(timeout)?;
        self.heard_others();
        self.heard_conns(|w, i| w.stirred(i));
        Ok(())
    }

    /// What a sleep that asked the wait set found of the connections:
    /// those that `stirred` says did are read on the next pass, the others
    /// not; those the set watches edge-triggered hear what it reported.
    /// The count of passes to the next look starts over.
    fn heard_conns(&mut self, stirred: impl Fn(&Waits, usize) -> bool) {
        self.cold_countdown = COLD_EVERY;
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(c) = s.conn.as_mut() {
                if stirred(&self.waits, i) {
                    c.link.look_again();
                    if let Some(gone) = self.waits.stirred_edge(i) {
                        c.link.rang(gone);
                    }
                } else {
                    c.link.quiet();
                }
            }
        }
    }

    /// What the last look at the wait set found of the others it holds
    /// while the endpoint sleeps in it: the inbox's wake-up is drained, the
    /// UDP socket read on the next pass.
    pub(super) fn heard_others(&mut self) {
        if self.waits.other_stirred(INBOX) {
            self.inbox.wake.drain();
        }
        if self.udp.is_some() && self.waits.other_stirred(UDP) {
            self.udp_look.stirred();
        }
    }

    /// Sleeps in one `poll` of the inbox, the UDP socket, the UCX worker
    /// and the connections or the set watching them, and has the next pass
    /// read what stirred.
    fn sleep_in_poll(&mut self, timeout: Duration) -> std::io::Result<()> {
        // Many connections are polled through the wait set's descriptor.
        let watching = self.waits.watching();
        self.pollfds.clear();
        self.pollfds
            .push(sys::pollfd(self.inbox.wake.raw(), sys::Interest::Read));
        if let Some(u) = &self.udp {
            self.pollfds
                .push(sys::pollfd(u.raw_fd(), sys::Interest::Read));
        }
        if let Some(p) = &self.ucx {
            self.pollfds
                .push(sys::pollfd(p.raw_fd(), sys::Interest::Read));
        }
        if watching {
            self.pollfds
                .push(sys::pollfd(self.waits.fd(), sys::Interest::Read));
        } else {
            for s in &self.slots {
                if let Some(c) = &s.conn {
                    self.pollfds
                        .push(sys::pollfd(c.link.read_fd(), sys::Interest::Read));
                }
            }
        }
        sys::poll(&mut self.pollfds, Some(timeout))?;
        // The inbox's wake-up and the UDP socket come first; a system
        // call each only when they stirred.
        if self.pollfds[0].revents != 0 {
            self.inbox.wake.drain();
        }
        if self.udp.is_some() && self.pollfds[1].revents != 0 {
            self.udp_look.stirred();
        }
        // Connections whose socket had nothing are not read on the next
        // pass (a system call each, over tcp); those that stirred are.
        let first = 1 + usize::from(self.udp.is_some()) + usize::from(self.ucx.is_some());
        if watching {
            // The set stirred: it says which did (or, failing, all are
            // read).
            let set_stirred = self.pollfds[first].revents != 0;
            let all = set_stirred && self.waits.look().is_err();
            if all {
                self.waits.wake_all();
            }
            self.heard_conns(|w, i| all || (set_stirred && w.stirred(i)));
        } else {
            let conns = self.slots.iter_mut().filter_map(|s| s.conn.as_mut());
            for (c, p) in conns.zip(&self.pollfds[first..]) {
                if p.revents == 0 {
                    c.link.quiet();
                } else {
                    c.link.look_again();
                }
            }
        }
        Ok(())
    }

    /// Whether the endpoint sleeps in its wait set: it does while it waits
    /// and datagrams are not in use. The set then holds the inbox's
    /// wake-up, the UDP socket and the UCX worker beside every connection.
    /// Over udp the set measured slower (64 B datagrams both ways on one
    /// processor: 0.2 us a round trip more than in `poll`; by the profile,
    /// likely because a socket in a set has the set's callback on its wait
    /// queue for good, not only during a sleep, and a UDP socket wakes that
    /// queue as each datagram sent leaves it), so an endpoint that uses
    /// datagrams (sends them, or has received one) sleeps in `poll`; so
    /// does a polling one (which sleeps only when asked to wait), whose few
    /// connections stay out of the set, where every packet would cost the
    /// set's callback.
    /// An endpoint that sleeps in its one connection's `recv` leaves the
    /// set too, and takes the connection out of it (as a polling one's
    /// few are): every packet would run the set's callback for nothing (a
    /// bare tcp ping-pong of blocking `recv`s, each socket also in a set
    /// no one waits on: 2.6 % slower than without the set). It comes back
    /// once a `recv` nap heard nothing: a set of three descriptors, made
    /// again, some system calls each way at most once a nap.
    fn sleeps_in_set(&self) -> bool {
        self.core.completion == Completion::Wait && !self.udp_look.hot() && !self.recv_sleep.on()
    }

    /// Puts the endpoint's sleep where [`Endpoint::sleeps_in_set`] says.
    pub(super) fn sleep_where(&mut self) {
        let changed = if self.sleeps_in_set() {
            // The inbox first, the UDP socket next (`INBOX`, `UDP`).
            let mut others = [self.inbox.wake.raw(); 3];
            let mut n = 1;
            for fd in [
                self.udp.as_ref().map(|u| u.raw_fd()),
                self.ucx.as_ref().map(|p| p.raw_fd()),
            ]
            .into_iter()
            .flatten()
            {
                others[n] = fd;
                n += 1;
            }
            self.waits.sleep_here(&others[..n]).unwrap_or_else(|e| {
                tracing::debug!(
                    "the wait set cannot hold what a sleep hears: {e}; sleeping in poll"
                );
                false
            })
        } else {
            self.waits.sleep_elsewhere()
        };
        if changed {
            self.rewatch();
        }
    }
}

impl Endpoint {
    /// Whether the endpoint sleeps in its wait set, and whether its next
    /// sleep may be in a `recv`.
    #[cfg(test)]
    pub(crate) fn sleeps_where(&self) -> (bool, bool) {
        (self.waits.sleeps_here(), self.recv_sleep.on())
    }
}

#[cfg(test)]
mod tests {
    use crate::{Completion, Mode, Transport};
    use std::time::Duration;

    /// Waiting ping-pongs of two endpoints in two threads over each
    /// transport: over shared memory the reader stays in its wait set
    /// (its doorbell is heard best there; a socket it cannot sleep in the
    /// `recv` of), over tcp and udp it comes to sleep in the socket's
    /// `recv`, out of the set.
    #[test]
    fn a_quick_peer_moves_the_sleep_into_the_recv_of_a_socket_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, wait) = super::super::test_nodes(dir.path(), Completion::Wait);
        let cases = [
            (Mode::Reliable, Transport::Shm, false),
            (Mode::Reliable, Transport::Tcp, true),
            (Mode::Datagram, Transport::Udp, true),
        ];
        for (i, (mode, transport, in_recv)) in cases.into_iter().enumerate() {
            let ep = 10 + 2 * i as u32;
            let mut rx = a.open(ep, wait).unwrap();
            let mut tx = b.open(ep + 1, wait).unwrap();
            let to = tx.target_via(rx.addr(), mode, transport).unwrap();
            let echo = std::thread::spawn(move || {
                let mut buf = [0u8; 16];
                for _ in 0..300 {
                    tx.write(to, b"ping").unwrap();
                    let r = tx.read_timeout(&mut buf, Duration::from_secs(5));
                    assert!(r.unwrap().is_some(), "{transport}: no answer in 5 s");
                }
                tx
            });
            let mut buf = [0u8; 16];
            let mut in_set = 0;
            let mut recv_on = 0;
            for _ in 0..300 {
                let r = rx.read_timeout(&mut buf, Duration::from_secs(5)).unwrap();
                let r = r.unwrap_or_else(|| panic!("{transport}: no ping in 5 s"));
                let back = rx.reply_target(&r, mode).unwrap();
                rx.write(back, b"pong").unwrap();
                let (set, on) = rx.sleeps_where();
                in_set += usize::from(set);
                recv_on += usize::from(on);
            }
            let _tx = echo.join().unwrap();
            if in_recv {
                assert!(recv_on > 0, "{transport}: never in the recv");
            } else {
                assert_eq!((in_set, recv_on), (300, 0), "{transport}: out of the set");
            }
            // Nothing comes: the deadline, taken from the one reading of
            // the clock each sleep makes, ends the read in its time, from
            // the recv (a deadline farther than its longest nap) or not.
            for wait in [Duration::from_millis(60), Duration::from_millis(5)] {
                let t0 = std::time::Instant::now();
                let r = rx.read_timeout(&mut buf, wait).unwrap();
                let took = t0.elapsed();
                assert!(r.is_none(), "{transport}: nothing was sent");
                assert!(
                    took >= wait && took < wait + Duration::from_secs(1),
                    "{transport}: a read of {wait:?} took {took:?}"
                );
            }
        }
    }
}
