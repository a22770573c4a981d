//! Where a waiting endpoint of one tcp connection sleeps: in that
//! connection's own `recv` while its peer answers quickly, else in its wait
//! set.
//!
//! A sleep in the wait set is one `epoll_wait` and then a `recv` of what it
//! found: two system calls a message, where a reader sleeping in a blocking
//! `recv` (sockperf's) makes one. A `recv` hears nothing else, so it sleeps
//! for a short nap at most (the socket's receive timeout, [`RECV_NAP`],
//! which the kernel makes a clock tick or two: 8 ms at 250 Hz, 20 ms at
//! most): a new connection or a first datagram that comes while the one
//! connection's peer is quiet waits that long at most. While the peer
//! talks, the pass after its next message adopts a new connection, and a
//! sleep that took a message has the UDP socket looked at once 250 us
//! have gone since the last such look (`udp_look`). It is tried only
//! after a sleep in the set that the connection alone ended within
//! [`RECV_NAP`], and given up after a nap in which nothing came: a peer
//! that answers slowly keeps the endpoint in its set, woken once a
//! message, not once more after each nap.
//!
//! ```text
//!            set sleep ended by the connection alone, in < RECV_NAP
//!   ┌─────┐ ─────────────────────────────────────────────────────► ┌──────┐
//!   │ set │                                                         │ recv │
//!   └─────┘ ◄───────────── recv sleep heard nothing ─────────────── └──────┘
//!      ▲ any other set sleep            something came: stays ▲
//! ```

use std::time::Duration;

pub(crate) use crate::transport::tcp::{RECV_NAP, RECV_NAP_MOST};

/// The decision, apart from the sockets and the clock.
#[derive(Debug, Default)]
pub(super) struct RecvSleep {
    on: bool,
}

impl RecvSleep {
    /// Whether the next sleep may be in the one connection's `recv`.
    #[inline]
    pub(super) fn on(&self) -> bool {
        self.on
    }

    /// A sleep in the wait set ended after `took`; `alone`: the one
    /// connection ended it, and nothing else stirred.
    pub(super) fn slept_in_set(&mut self, alone: bool, took: Duration) {
        self.on = alone && took < RECV_NAP;
    }

    /// A sleep in the connection's `recv` ended: something came (`got`)
    /// or its nap went by.
    pub(super) fn slept_in_recv(&mut self, got: bool) {
        self.on = got;
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
        s.slept_in_set(true, QUICK);
        assert!(s.on());
        s.slept_in_recv(true);
        assert!(s.on(), "stays while answers come");
    }

    #[test]
    fn a_slow_answer_or_another_stirring_keeps_the_sleep_in_the_set() {
        let mut s = RecvSleep::default();
        s.slept_in_set(true, RECV_NAP);
        assert!(!s.on(), "an answer slower than the nap");
        s.slept_in_set(false, QUICK);
        assert!(!s.on(), "the inbox or the UDP socket stirred too");
    }

    #[test]
    fn a_nap_that_heard_nothing_goes_back_to_the_set() {
        let mut s = RecvSleep::default();
        s.slept_in_set(true, QUICK);
        s.slept_in_recv(false);
        assert!(!s.on());
        s.slept_in_set(true, QUICK);
        assert!(s.on(), "and back once answers are quick again");
    }
}
