//! Where a waiting endpoint of one tcp connection, or of datagrams alone,
//! sleeps: in that connection's own `recv`, or the UDP socket's
//! `recvfrom`, while its peer answers quickly, else in its wait set (or
//! `poll`, once datagrams are in use).
//!
//! A sleep in the wait set is one `epoll_wait` and then a `recv` of what it
//! found: two system calls a message, where a reader sleeping in a blocking
//! `recv` (sockperf's) makes one. A `recv` hears nothing else, so it sleeps
//! for a short nap at most (the socket's receive timeout, [`RECV_NAP`],
//! which the kernel makes a clock tick or two: 8 ms at 250 Hz, 20 ms at
//! most): a new connection, or a first datagram beside a connection, that
//! comes while the peer is quiet waits that long at most. While the peer
//! talks, the pass after its next message adopts a new connection, and a
//! sleep in a connection's `recv` that took a message has the UDP socket
//! looked at once 5 ms have gone since the last such look (`udp_look`).
//! A sleep in the UDP socket's `recvfrom` is chosen only where there is no
//! connection to miss. It is tried only after a sleep that watched
//! everything and that the connection (or the UDP socket) alone ended
//! within [`RECV_NAP`], and given up after a nap in which nothing came: a
//! peer that answers slowly keeps the endpoint in its set, woken once a
//! message, not once more after each nap. While it sleeps in the
//! connection's `recv` the endpoint leaves its wait set, which lets the
//! connection go (a packet to a socket in a set runs the set's callback),
//! and comes back to it once the `recv` is given up, or once there is
//! nothing to sleep in the `recv` of (a second connection, a near
//! deadline).
//!
//! ```text
//!        set (or poll) sleep ended by the sleeper alone, in < RECV_NAP
//!   ┌─────┐ ─────────────────────────────────────────────────────► ┌──────┐
//!   │ set │                                                         │ recv │
//!   └─────┘ ◄──── recv sleep heard nothing, or no sleeper now ───── └──────┘
//!      ▲ any other set sleep            something came: stays ▲
//! ```
//!
//! The sleeper ([`Sleeper`]): the one connection, where it is tcp (a
//! shared-memory doorbell is heard best in the set) and datagrams are not
//! in use; the UDP socket, where they are and there is no connection.

use std::time::Duration;

pub(crate) use crate::transport::tcp::{RECV_NAP, RECV_NAP_MOST};

/// What a sleep may be in the `recv` of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sleeper {
    /// The endpoint's one connection, in this slot.
    Conn(usize),
    /// The endpoint's UDP socket.
    Udp,
}

/// The decision, apart from the sockets and the clock.
#[derive(Debug, Default)]
pub(super) struct RecvSleep {
    on: bool,
}

impl RecvSleep {
    /// Whether the next sleep may be in the `recv` of the [`Sleeper`].
    #[inline]
    pub(super) fn on(&self) -> bool {
        self.on
    }

    /// A sleep that watched everything (in the wait set, or in `poll`)
    /// ended after `took`; `alone`: the one it may sleep in the `recv` of
    /// ended it, and nothing else stirred.
    pub(super) fn slept_watching(&mut self, alone: bool, took: Duration) {
        self.on = alone && took < RECV_NAP;
    }

    /// A sleep in the connection's `recv` ended: something came (`got`)
    /// or its nap went by.
    pub(super) fn slept_in_recv(&mut self, got: bool) {
        self.on = got;
    }

    /// Nothing may be slept in the `recv` of now (a second connection
    /// came, a deadline is near): the sleep watches everything, and an
    /// endpoint that left its wait set for the `recv` goes back to it.
    pub(super) fn none_to_sleep_in(&mut self) {
        self.on = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: Duration = Duration::from_micros(20);

    #[test]
    fn a_quick_answer_the_connection_alone_brought_moves_the_sleep_into_its_recv() {
        let mut s = RecvSleep::default();
        assert!(!s.on(), "the first sleep is in the set");
        s.slept_watching(true, QUICK);
        assert!(s.on());
        s.slept_in_recv(true);
        assert!(s.on(), "stays while answers come");
    }

    #[test]
    fn a_slow_answer_or_another_stirring_keeps_the_sleep_in_the_set() {
        let mut s = RecvSleep::default();
        s.slept_watching(true, RECV_NAP);
        assert!(!s.on(), "an answer slower than the nap");
        s.slept_watching(false, QUICK);
        assert!(!s.on(), "the inbox or the UDP socket stirred too");
    }

    #[test]
    fn nothing_to_sleep_in_goes_back_to_the_set() {
        let mut s = RecvSleep::default();
        s.slept_watching(true, QUICK);
        s.none_to_sleep_in();
        assert!(!s.on(), "a second connection, a near deadline");
    }

    #[test]
    fn a_nap_that_heard_nothing_goes_back_to_the_set() {
        let mut s = RecvSleep::default();
        s.slept_watching(true, QUICK);
        s.slept_in_recv(false);
        assert!(!s.on());
        s.slept_watching(true, QUICK);
        assert!(s.on(), "and back once answers are quick again");
    }
}
