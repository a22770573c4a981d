//! What an endpoint does when a pass moved nothing: a polling one spins, a
//! waiting one sleeps in one `poll` of everything that may stir it, and
//! offers a waiting read's buffer to the connection likely to fill it.

use std::time::Instant;

use super::{Deadline, Endpoint, HOT_SPINS};
use crate::error::Result;
use crate::rx::{Step, NAP, SPINS_PER_CHECK};
use crate::transport::sys;
use crate::transport::tcp::COLD_EVERY;
use crate::types::{Completion, Recv};

impl Endpoint {
    /// Nothing moved: spin or sleep. `user`, the buffer of a waiting read,
    /// may receive a message during the sleep, which is then returned.
    pub(super) fn idle(
        &mut self,
        deadline: Deadline,
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
            Completion::Wait => self.sleep(deadline, user),
        }
    }

    /// Blocks until a connection, the datagram socket, the UCX worker or
    /// the inbox stirs. With `user`, the buffer of a waiting read, offers
    /// it to the connection that sent the last large message, and returns
    /// the message placed in it, if one was.
    pub(super) fn sleep(
        &mut self,
        deadline: Deadline,
        mut user: Option<&mut [u8]>,
    ) -> Result<Option<Recv>> {
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
        // A failed `poll` is reported after the offer is withdrawn.
        let mut polled = Ok(0);
        // Many connections are polled through the wait set's descriptor.
        let watching = self.waits.watching();
        if armed {
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
            let timeout = match deadline {
                Deadline::At(t) => t.saturating_duration_since(Instant::now()).min(NAP),
                _ => NAP,
            };
            polled = sys::poll(&mut self.pollfds, Some(timeout));
        }
        if armed && polled.is_ok() {
            // The inbox's wake-up and the UDP socket come first; a system
            // call each only when they stirred.
            if self.pollfds[0].revents != 0 {
                self.inbox.wake.drain();
            }
            if self.udp.is_some() && self.pollfds[1].revents != 0 {
                self.udp_woke = true;
            }
            // Connections whose socket had nothing are not read on the next
            // pass (a system call each, over tcp); those that stirred are.
            let first = 1 + usize::from(self.udp.is_some()) + usize::from(self.ucx.is_some());
            if watching {
                // The set stirred: it says which did (or, failing, all are
                // read).
                let set_stirred = self.pollfds[first].revents != 0;
                // The sleep asked the set: the count of passes starts over.
                self.cold_countdown = COLD_EVERY;
                let all = set_stirred && self.waits.look().is_err();
                if all {
                    self.waits.wake_all();
                }
                let stirred = |i| all || (set_stirred && self.waits.stirred(i));
                for (i, s) in self.slots.iter_mut().enumerate() {
                    if let Some(c) = s.conn.as_mut() {
                        if stirred(i) {
                            c.link.look_again();
                        } else {
                            c.link.quiet();
                        }
                    }
                }
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
        polled?;
        Ok(None)
    }
}
