//! When a pass looks at the endpoint's datagram socket. A look is a system
//! call, some tenths of a microsecond, and a polling endpoint passes every
//! few tens of nanoseconds, so the socket is looked at on every pass only
//! by a polling endpoint while datagrams are in use: this endpoint sends
//! them, or a member's came. Else it looks when the clock, asked every
//! [`CLOCK_EVERY`] passes, busy or idle, says [`COLD_GAP`] has gone since
//! the last look made on the clock's word. A waiting endpoint looks when
//! its sleep saw the socket stir or a caller that will not sleep asked,
//! and otherwise on the clock's word as well (a busy reader does not
//! sleep).
//!
//! What came from a stranger (junk, datagrams without the fabric's token
//! or for another endpoint) does not put datagrams in use: a sender of
//! one would otherwise have a polling endpoint make a system call on
//! every pass for good, and a waiting one sleep in `poll` rather than its
//! wait set.

use std::time::{Duration, Instant};

use crate::types::Completion;

/// Passes between reads of the clock, while polling with datagrams not
/// in use or waiting.
pub(super) const CLOCK_EVERY: u32 = 1024;

/// Time between looks made on the clock's word. The first datagram to a
/// polling endpoint that does not use them waits for the next such look:
/// up to this gap and [`CLOCK_EVERY`] passes more, or [`CLOCK_EVERY`]
/// passes where these take longer (a pass that moves large messages may
/// take tens of microseconds). A look a
/// ping-pong of shared-memory messages meets (some 0.2 us a round trip)
/// adds a look's time to that round trip: one look every 1,024 passes
/// met about one in a hundred and doubled the 99th percentile of their
/// half round trip (0.10 us median, 0.21-0.24 p99, against 0.12-0.13 with
/// a look every 250 us, which meets about one in a thousand).
pub(super) const COLD_GAP: Duration = Duration::from_micros(250);

/// Time between looks after sleeps that did not hear the socket (in a
/// talking connection's `recv`): a first datagram waits up to this gap
/// and the connection's next message. A quarter of the longest nap, after
/// which it is heard where the connection falls quiet: a gap as short as
/// [`COLD_GAP`] had a ping-pong over that connection look once every ten
/// messages or so, for nothing.
pub(super) const DEAF_GAP: Duration = Duration::from_millis(5);

/// The decision, apart from the socket and the clock.
#[derive(Debug)]
pub(super) struct UdpLook {
    /// Datagrams are in use: look on every pass while polling.
    hot: bool,
    /// The socket may hold datagrams not looked for yet (a sleep saw it
    /// stir, or a caller asked for a look without a sleep).
    woke: bool,
    /// Passes until the clock is asked whether [`COLD_GAP`] has gone.
    countdown: u32,
    /// The last look made on the clock's word.
    last: Option<Instant>,
}

impl UdpLook {
    pub(super) fn new() -> UdpLook {
        UdpLook {
            hot: false,
            woke: true,
            countdown: 1,
            last: None,
        }
    }

    /// Whether this pass looks at the socket; `now` reads the clock, once
    /// every [`CLOCK_EVERY`] passes at most.
    #[inline]
    pub(super) fn due(&mut self, completion: Completion, now: impl FnOnce() -> Instant) -> bool {
        let mut look = match completion {
            Completion::Poll => self.hot,
            Completion::Wait => self.woke,
        };
        self.countdown -= 1;
        if self.countdown == 0 {
            self.countdown = CLOCK_EVERY;
            if !look {
                let t = now();
                if self
                    .last
                    .is_none_or(|l| t.saturating_duration_since(l) >= COLD_GAP)
                {
                    self.last = Some(t);
                    look = true;
                }
            }
        }
        if look {
            self.woke = false;
        }
        look
    }

    /// Datagrams are in use from now on: this endpoint sends them, or a
    /// member's came.
    pub(super) fn heat(&mut self) {
        self.hot = true;
    }

    /// Whether datagrams are in use.
    pub(super) fn hot(&self) -> bool {
        self.hot
    }

    /// The socket may hold something: the next pass of a waiting
    /// endpoint looks (a polling one looks as [`UdpLook::due`] says).
    pub(super) fn stirred(&mut self) {
        self.woke = true;
    }

    /// A sleep that did not hear the socket (one in a connection's
    /// `recv`) ended at `now`, with a message: the next pass looks if
    /// [`DEAF_GAP`] has gone since the last look made on the clock's word.
    /// A peer that keeps the sleeper busy so holds a first datagram back
    /// no longer than that gap and its next message.
    pub(super) fn slept_deaf(&mut self, now: Instant) {
        if self
            .last
            .is_none_or(|l| now.saturating_duration_since(l) >= DEAF_GAP)
        {
            self.last = Some(now);
            self.woke = true;
        }
    }
}

impl super::Endpoint {
    /// Whether datagrams are in use, the port of the endpoint's UDP
    /// socket and the token its datagrams carry.
    #[cfg(test)]
    pub(crate) fn udp_look(&self) -> (bool, u16, u64) {
        let udp = self.udp.as_ref();
        (
            self.udp_look.hot(),
            udp.map_or(0, |u| u.port()),
            udp.map_or(0, |u| u.token()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passes until `look` says to look, at most `max`; the clock is
    /// `clock` and moves `step` a pass.
    fn passes_to_look(
        look: &mut UdpLook,
        c: Completion,
        clock: &mut Instant,
        step: Duration,
        max: u32,
    ) -> Option<u32> {
        for i in 1..=max {
            *clock += step;
            let t = *clock;
            if look.due(c, || t) {
                return Some(i);
            }
        }
        None
    }

    #[test]
    fn a_sleep_deaf_to_the_socket_has_it_looked_at_once_a_gap() {
        let mut l = UdpLook::new();
        let mut t = Instant::now();
        let c = Completion::Wait;
        // The first pass looks, as a new endpoint's does.
        assert!(l.due(c, || t));
        l.slept_deaf(t);
        assert!(
            l.due(c, || t),
            "the first such sleep: no look on the clock yet"
        );
        for _ in 0..3 {
            t += DEAF_GAP / 4;
            l.slept_deaf(t);
            assert!(!l.due(c, || t), "within the gap of the last look");
        }
        t += DEAF_GAP / 4;
        l.slept_deaf(t);
        assert!(l.due(c, || t), "a gap after the last look");
        assert!(!l.due(c, || t), "once");
    }

    #[test]
    fn a_polling_endpoint_without_datagrams_looks_once_a_gap() {
        let mut l = UdpLook::new();
        let mut t = Instant::now();
        let ns = Duration::from_nanos;
        // The first pass looks.
        assert_eq!(
            passes_to_look(&mut l, Completion::Poll, &mut t, ns(25), 1),
            Some(1)
        );
        // Quick passes: not before the gap has gone, at the first clock
        // read after it.
        let n = passes_to_look(&mut l, Completion::Poll, &mut t, ns(25), 1 << 20).unwrap();
        let gap_passes = (COLD_GAP.as_nanos() / 25) as u32;
        assert!(n >= gap_passes, "{n} < {gap_passes}");
        assert!(n < gap_passes + CLOCK_EVERY + 1, "{n}");
        assert_eq!(n % CLOCK_EVERY, 0, "{n}: looked without asking the clock");
        // Slow passes (busy ones): at the next clock read.
        let n = passes_to_look(&mut l, Completion::Poll, &mut t, COLD_GAP, 1 << 20).unwrap();
        assert_eq!(n, CLOCK_EVERY);
    }

    #[test]
    fn the_clock_is_read_once_every_so_many_passes() {
        let mut l = UdpLook::new();
        let mut reads = 0;
        for _ in 0..10 * CLOCK_EVERY {
            l.due(Completion::Poll, || {
                reads += 1;
                Instant::now()
            });
        }
        assert_eq!(reads, 10);
    }

    #[test]
    fn datagrams_in_use_are_looked_for_on_every_pass_while_polling() {
        let mut l = UdpLook::new();
        l.heat();
        assert!(l.hot());
        let never = || -> Instant { panic!("a hot socket needs no clock") };
        for _ in 0..3 * CLOCK_EVERY {
            assert!(l.due(Completion::Poll, never));
        }
    }

    #[test]
    fn a_waiting_endpoint_looks_when_the_socket_stirred() {
        let mut l = UdpLook::new();
        let mut t = Instant::now();
        let ns = Duration::from_nanos;
        l.heat();
        assert!(l.due(Completion::Wait, || t), "stirred at the start");
        assert!(!l.due(Completion::Wait, || t));
        l.stirred();
        assert!(l.due(Completion::Wait, || t));
        assert!(!l.due(Completion::Wait, || t));
        // And otherwise on the clock's word, hot or not: the first read of
        // the clock looks (no look was made on its word yet), the next
        // once a gap has gone since.
        let gap_passes = (COLD_GAP.as_nanos() / 25) as u32;
        for hot in [true, false] {
            let mut l = UdpLook::new();
            if hot {
                l.heat();
            }
            assert!(l.due(Completion::Wait, || t), "stirred at the start");
            let n = passes_to_look(&mut l, Completion::Wait, &mut t, ns(25), 1 << 20).unwrap();
            assert_eq!(n, CLOCK_EVERY, "hot: {hot}");
            for _ in 0..2 {
                let n = passes_to_look(&mut l, Completion::Wait, &mut t, ns(25), 1 << 20).unwrap();
                assert!(n >= gap_passes, "hot: {hot}: {n} < {gap_passes}");
                assert!(n < gap_passes + CLOCK_EVERY + 1, "hot: {hot}: {n}");
                assert_eq!(n % CLOCK_EVERY, 0, "hot: {hot}: {n}");
            }
        }
    }

    /// Junk, datagrams without the fabric's token and those of a node the
    /// endpoint's session does not admit, sent to a polling endpoint, are
    /// dropped without putting datagrams in use (every pass would then
    /// make a system call); a member's datagram puts them in use.
    #[test]
    fn only_a_members_datagram_puts_datagrams_in_use() {
        use crate::{Mode, Transport};
        use macrolink_wire::{FrameKind, Header};
        let dir = tempfile::tempdir().unwrap();
        let (a, b, poll) = super::super::test_nodes(dir.path(), Completion::Poll);
        let mut rx = a.open(5, poll).unwrap();
        let mut tx = b.open(9, poll).unwrap();
        let (hot, port, token) = rx.udp_look();
        assert!(!hot && port != 0);
        rx.bind_session(2, 0x5e55);
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut d = Header::new(FrameKind::Datagram);
        (d.src_node, d.src_ep, d.dst_ep, d.len, d.total, d.key) = (7, 7, 5, 4, 4, 99);
        let mut stranger = d.encode().to_vec();
        stranger.extend_from_slice(b"ping");
        // The fabric's token, from a node the session does not admit.
        d.key = token;
        let mut outsider = d.encode().to_vec();
        outsider.extend_from_slice(b"ping");
        let mut buf = [0u8; 64];
        let until = Instant::now() + Duration::from_secs(10);
        for junk in [&b"junk"[..], &stranger, &outsider] {
            let bad = rx.stats().bad_frames + rx.stats().strangers;
            u.send_to(junk, ("127.0.0.1", port)).unwrap();
            while rx.stats().bad_frames + rx.stats().strangers == bad {
                assert!(Instant::now() < until, "the junk was never looked at");
                assert_eq!(rx.try_read(&mut buf).unwrap(), None);
            }
            assert!(!rx.udp_look().0, "{junk:?} put datagrams in use");
        }
        let t = tx
            .target_via(rx.addr(), Mode::Datagram, Transport::Udp)
            .unwrap();
        tx.write(t, b"member").unwrap();
        let r = loop {
            if let Some(r) = rx.try_read(&mut buf).unwrap() {
                break r;
            }
            assert!(Instant::now() < until, "the member's datagram never came");
        };
        assert_eq!((r.from, &buf[..r.len]), (tx.addr(), &b"member"[..]));
        assert!(rx.udp_look().0);
    }
}
