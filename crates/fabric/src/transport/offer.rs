//! Rendezvous over shared memory: a reader that sleeps waiting for a
//! large reliable message offers the sender its own buffer, and the sender
//! writes the message straight into it with cross-memory copies
//! (`process_vm_writev`), so the waiting reader's processor copies nothing
//! out of the ring.
//!
//! ```text
//!  reader (consumer of the ring)            sender (its producer)
//!  ring empty, about to sleep:
//!    addr, len; gen|OFFERED  ─────────►  a message >= PLACE_MIN, ring drained:
//!    sleeps                               CAS gen|OFFERED -> gen|BUSY
//!                                         process_vm_writev(reader, addr),
//!                                           all but the last `lead`
//!  wakes: CAS gen|OFFERED -> IDLE  ◄────  doorbell, then the rest
//!    fails on BUSY: spins                 `Placed` frame into the ring
//!    fails on PLACED: the `Placed` frame  gen|PLACED
//!    is next in the ring, the message in
//!    the buffer; how long it spun ──────► the next lead (`next_lead`)
//! ```
//!
//! The doorbell rings before the copy ends: a sleeping reader takes some
//! microseconds to wake, which the last part of the copy hides, and the
//! next offer comes that much sooner. How long before follows the
//! reader's wake-ups: it says how long it spun on each copy.
//!
//! An offer lives for one sleep of one read and is withdrawn before the
//! read goes on, so the buffer is the read's own until it returns. A
//! withdrawal that finds the sender BUSY spins a while (the tail of the
//! copy), then sleeps until the sender rings again, for at most
//! [`busy_limit`]: a sender still BUSY then is taken as broken, the offer
//! taken back and the connection lost (the sender checks the state before
//! each of its writes and stops). The sender takes an
//! offer only when the reader has read everything sent before, so the
//! `Placed` frame is the next thing the reader reads. The process written
//! to is the one the kernel names as the socket's peer (and only one of
//! this user), never one named in shared memory. A copy that fails (no
//! permission, an address the reader does not have) puts IDLE back and the
//! message goes through the ring; a refusal of permission turns the path
//! off for the connection.

use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::{Duration, Instant};

/// Smallest message worth a rendezvous. The kernel's cross-memory copy
/// runs at a third of a user-space copy's speed, and each message costs the
/// reader a wake-up: measured here, a waiting reader spent more of its
/// processor per byte on placed messages of 64 and 256 KiB than on copying
/// them out of the ring, and less than half as much from 1 MB up.
pub(crate) const PLACE_MIN: usize = 512 * 1024;

/// How long a sender waits for the next offer of a reader that offers
/// before sending through the ring.
pub(crate) const OFFER_WAIT: std::time::Duration = std::time::Duration::from_millis(2);

/// How long a reader that finds the sender still copying spins before it
/// sleeps until the sender rings.
pub(crate) const BUSY_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// How long a reader waits for a sender that is copying into its buffer
/// before it takes the connection as broken: a sender stopped or hung
/// inside its copy (or one that wrote `BUSY` and nothing more) would
/// otherwise hold the read, even one that does not wait, for good. A
/// copy runs at gigabytes a second; the bound grows by a second for each
/// [`BUSY_RATE`] bytes of the buffer, for a host that is slow or busy.
#[cfg(not(test))]
pub(crate) const BUSY_LIMIT: Duration = Duration::from_secs(10);
/// The bound in this crate's tests, which hold a sender busy on purpose.
#[cfg(test)]
pub(crate) const BUSY_LIMIT: Duration = Duration::from_millis(200);

/// Bytes a second a copy into an offered buffer is given at the least, on
/// top of [`BUSY_LIMIT`].
pub(crate) const BUSY_RATE: u64 = 64 << 20;

/// How long a reader waits for a sender copying into an offered buffer of
/// `len` bytes.
pub(crate) fn busy_limit(len: u64) -> Duration {
    BUSY_LIMIT + Duration::from_secs(len / BUSY_RATE)
}

/// How much of a placed message the sender leaves to copy when it wakes
/// a sleeping reader (the lead) follows the reader's wake-ups, so that it
/// is up about when the copy ends: a reader that finds the copy done
/// woke late, and the next lead is [`LEAD_STEP`] longer; one that waited
/// on the copy longer than [`SPIN_BUDGET`] woke early, and the next lead
/// is a quarter shorter (a quarter step at the least, down to none); one
/// that waited less keeps it. A fixed lead
/// suits one host only: where a wake-up is quick (a few microseconds),
/// 128 KiB had the reader spin on each copy's end, 13-15 % of a core at
/// 1 MB against 5-7 % with none, at the same bandwidth within the runs'
/// spread; where it takes 28-40 µs (a virtual machine whose idle
/// processors halt), 128 KiB was too short, and each 160 KiB more bought
/// some 5 % of bandwidth with the reader's spin.
pub(crate) const LEAD_STEP: usize = 16 * 1024;

/// The longest lead.
pub(crate) const LEAD_MAX: usize = 512 * 1024;

/// How long a reader may wait on an unfinished copy before the lead is
/// taken as too long: at 10,000 messages a second, 0.5 % of a core. At
/// 2 µs, on a 2-core AMD EPYC VM, a sixth of a waiting 1 MB reader's
/// samples were its waits on the copy; at 500 ns, six runs of each
/// alternated, its CPU fell from 13.0-16.6 % of a core to 12.0-15.1 at
/// the same bandwidth, and from 9.8-11.0 % to 8.7-10.2 paced to 6,583
/// messages a second.
pub(crate) const SPIN_BUDGET: Duration = Duration::from_nanos(500);

/// The lead after a placed message whose reader waited `waited` on the
/// copy (zero: it found the copy done).
pub(crate) fn next_lead(lead: usize, waited: Duration) -> usize {
    if waited.is_zero() {
        (lead + LEAD_STEP).min(LEAD_MAX)
    } else if waited > SPIN_BUDGET {
        lead.saturating_sub((lead / 4).max(LEAD_STEP / 4))
    } else {
        lead
    }
}

/// The word in which a reader tells the sender how long it waited on the
/// copy into offer `gen` (nanoseconds, at most `u32::MAX`).
pub(crate) fn waited_word(gen: u64, waited: Duration) -> u64 {
    let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
    ((gen & 0xFFFF_FFFF) << 32) | ns.min(u64::from(u32::MAX))
}

/// What a reader's word says about offer `gen`: how long it waited on the
/// copy, if the word is about that offer.
pub(crate) fn waited_on(word: u64, gen: u64) -> Option<Duration> {
    (word >> 32 == gen & 0xFFFF_FFFF).then(|| Duration::from_nanos(word & 0xFFFF_FFFF))
}

/// How much of [`OFFER_WAIT`] the sender spins before it sleeps.
pub(crate) const OFFER_SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// How long after a wait in vain a large message first waits again for
/// an offer the reader has not renewed, and the longest such gap (each
/// wait in vain doubles it). A reader kept from its offer for a
/// moment (its host did not run it for a few milliseconds: measured here,
/// one to six 2.4 ms waits in vain in 2 s of 1 MB messages) then reads from
/// the ring as fast as the sender writes, never finds it empty, never
/// sleeps and never offers again, until a wait of the sender's lets it
/// drain the ring, sleep and offer.
/// A reader that stopped offering costs the sender one [`OFFER_WAIT`] a
/// gap, at most 2 ms a second once the gaps have grown. A wait that finds
/// an offer halves the gap rather than start it over: a reader that
/// offers to one sender now and to another then (it offers to whoever sent
/// the last large message) settles the gaps where about half the tries
/// find an offer.
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(1);
pub(crate) const RETRY_LAST: Duration = Duration::from_secs(1);

/// One direction's offer, in the segment beside its ring's counters.
#[repr(C)]
pub(crate) struct OfferCtrl {
    /// Written by the reader (offer, withdraw) and the sender (take,
    /// place, decline); `addr` and `len` by the reader only.
    pub(crate) words: CachePadded<OfferWords>,
    /// The sender waits for an offer: the reader rings when it makes one.
    pub(crate) want: CachePadded<AtomicU32>,
}

#[repr(C)]
pub(crate) struct OfferWords {
    pub(crate) state: AtomicU64,
    pub(crate) addr: AtomicU64,
    pub(crate) len: AtomicU64,
    /// Written by the reader: how long it waited on the copy into its
    /// last placed offer ([`waited_word`]).
    pub(crate) waited: AtomicU64,
}

/// Where an offer stands (the low two bits of `state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// None out: withdrawn, declined, or never made.
    Idle = 0,
    /// The reader's buffer waits for the next message.
    Offered = 1,
    /// The sender is copying into it.
    Busy = 2,
    /// The message is in it and its `Placed` frame in the ring.
    Placed = 3,
}

/// Offer numbers wrap within the bits above the phase.
const GEN_MASK: u64 = u64::MAX >> 2;

/// The state word of offer `gen` in `phase`.
pub(crate) fn state(gen: u64, phase: Phase) -> u64 {
    ((gen & GEN_MASK) << 2) | phase as u64
}

/// The offer number and phase of a state word.
pub(crate) fn parse(s: u64) -> (u64, Phase) {
    let phase = match s & 3 {
        0 => Phase::Idle,
        1 => Phase::Offered,
        2 => Phase::Busy,
        _ => Phase::Placed,
    };
    (s >> 2, phase)
}

/// One side's own record of its offers, out of the peer's reach.
#[derive(Debug, Default)]
pub(crate) struct Offers {
    /// Reader: the number of the last offer made.
    pub(crate) gen: u64,
    /// Reader: the offer out (its number and the buffer's length).
    pub(crate) out: Option<(u64, u64)>,
    /// Reader: an offer withdrawn as placed, whose `Placed` frame is due.
    pub(crate) placed: Option<(u64, u64)>,
    /// Sender: the reader's process, while the path is open.
    pub(crate) peer_pid: Option<libc::pid_t>,
    /// Sender: the number of the reader's last offer when a wait for its
    /// next one was in vain (0: it never offered). A large message waits a
    /// little for an offer while the reader's offers are newer, and again
    /// from `retry_at` on.
    pub(crate) stale: u64,
    /// Sender: when a large message may wait again for an offer that is
    /// not newer than `stale`.
    pub(crate) retry_at: Option<Instant>,
    /// Sender: the gap from the next wait in vain to `retry_at`.
    pub(crate) retry_gap: Duration,
    /// Sender: how much of the next placed message is copied after the
    /// reader is rung ([`next_lead`]).
    pub(crate) lead: usize,
    /// Sender: the offer it placed last, whose reader has not yet said
    /// how long it waited on the copy.
    pub(crate) untold: Option<u64>,
}

impl Offers {
    /// Sender: whether a large message that finds no offer waits for one,
    /// the reader's last offer being number `gen`. A reader that never
    /// offered is not waited for.
    pub(crate) fn worth_waiting(&self, gen: u64, now: Instant) -> bool {
        gen != 0 && (gen != self.stale || self.retry_at.is_some_and(|t| now >= t))
    }

    /// Sender: a wait for an offer ended at `now`, having last seen offer
    /// number `gen`, made (`offered`) or not.
    pub(crate) fn waited(&mut self, gen: u64, offered: bool, now: Instant) {
        if offered {
            self.retry_gap = (self.retry_gap / 2).max(RETRY_FIRST);
            return;
        }
        let gap = self.retry_gap.max(RETRY_FIRST);
        self.stale = gen;
        self.retry_at = Some(now + gap);
        self.retry_gap = (gap * 2).min(RETRY_LAST);
    }

    /// Sender: the lead for the next placed message, the reader's `word`
    /// ([`waited_word`]) having told how long it waited on the last one.
    pub(crate) fn lead_after(&mut self, word: u64) -> usize {
        if let Some(waited) = self.untold.and_then(|gen| waited_on(word, gen)) {
            self.lead = next_lead(self.lead, waited);
            self.untold = None;
        }
        self.lead
    }

    /// Reader: whether a `Placed` frame for offer `gen` of `total` bytes is
    /// the one a withdrawal found placed, with room for it. Forgets it.
    pub(crate) fn take_placed(&mut self, gen: u64, total: u64) -> bool {
        matches!(self.placed.take(), Some((g, len)) if g == gen & GEN_MASK && total <= len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_words_keep_number_and_phase_apart() {
        for phase in [Phase::Idle, Phase::Offered, Phase::Busy, Phase::Placed] {
            for gen in [0, 1, 7, GEN_MASK, GEN_MASK + 1] {
                assert_eq!(parse(state(gen, phase)), (gen & GEN_MASK, phase));
            }
        }
    }

    #[test]
    fn a_wait_in_vain_is_tried_again_after_gaps_that_double() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut o = Offers::default();
        assert!(!o.worth_waiting(0, t0), "a reader that never offered");
        assert!(o.worth_waiting(3, t0));
        o.waited(3, false, t0);
        assert!(!o.worth_waiting(3, t0), "the same offer, at once");
        assert!(o.worth_waiting(4, t0), "a newer offer");
        assert!(o.worth_waiting(3, ms(1)), "the same offer, a gap later");
        // In vain again, and again: the gaps grow, to a bound.
        o.waited(3, false, ms(1));
        assert!(!o.worth_waiting(3, ms(2)));
        assert!(o.worth_waiting(3, ms(3)));
        let mut now = ms(3);
        for _ in 0..20 {
            o.waited(3, false, now);
            now = o.retry_at.unwrap();
        }
        assert_eq!(o.retry_gap, RETRY_LAST);
        o.waited(3, false, now);
        assert_eq!(o.retry_at, Some(now + RETRY_LAST));
        // A wait that finds an offer halves the gap, to the first one.
        o.waited(9, true, now);
        o.waited(9, false, now);
        assert_eq!(o.retry_at, Some(now + RETRY_LAST / 2));
        assert_eq!(o.stale, 9);
        for _ in 0..20 {
            o.waited(9, true, now);
        }
        o.waited(9, false, now);
        assert_eq!(o.retry_at, Some(now + RETRY_FIRST));
    }

    #[test]
    fn the_lead_grows_after_a_late_reader_shrinks_after_a_long_wait_and_holds_between() {
        let late = Duration::ZERO;
        let long = SPIN_BUDGET + Duration::from_nanos(1);
        assert_eq!(next_lead(0, late), LEAD_STEP);
        assert_eq!(next_lead(LEAD_MAX - 1, late), LEAD_MAX);
        assert_eq!(next_lead(LEAD_MAX, late), LEAD_MAX);
        assert_eq!(next_lead(4 * LEAD_STEP, SPIN_BUDGET), 4 * LEAD_STEP);
        assert_eq!(next_lead(4 * LEAD_STEP, long), 3 * LEAD_STEP);
        // Short leads shrink by a quarter step, to none.
        let mut lead = LEAD_STEP;
        let mut shrinks = 0;
        while lead > 0 {
            lead = next_lead(lead, long);
            shrinks += 1;
            assert!(shrinks < 10, "the lead never reaches none");
        }
        assert_eq!(next_lead(0, long), 0);
    }

    #[test]
    fn a_readers_word_speaks_of_its_offer_only_and_once() {
        let us = Duration::from_micros(7);
        let w = waited_word(5, us);
        assert_eq!(waited_on(w, 5), Some(us));
        assert_eq!(waited_on(w, 6), None);
        assert_eq!(waited_on(w, 5 + (1 << 32)), Some(us), "numbers wrap");
        let long = waited_word(5, Duration::from_secs(7200));
        assert_eq!(
            waited_on(long, 5),
            Some(Duration::from_nanos(u32::MAX.into()))
        );
        let mut o = Offers::default();
        assert_eq!(o.lead_after(w), 0, "nothing placed: nothing heard");
        o.untold = Some(5);
        assert_eq!(
            o.lead_after(waited_word(4, Duration::ZERO)),
            0,
            "another offer's"
        );
        assert_eq!(o.lead_after(waited_word(5, Duration::ZERO)), LEAD_STEP);
        assert_eq!(o.untold, None);
        assert_eq!(
            o.lead_after(waited_word(5, Duration::ZERO)),
            LEAD_STEP,
            "heard once"
        );
    }

    #[test]
    fn a_placed_frame_matches_only_its_offer_and_room() {
        let mut o = Offers {
            placed: Some((5, 1000)),
            ..Offers::default()
        };
        assert!(!o.take_placed(5, 1001), "longer than the buffer");
        o.placed = Some((5, 1000));
        assert!(!o.take_placed(4, 10), "another offer");
        assert!(!o.take_placed(5, 10), "forgotten after one look");
        o.placed = Some((5, 1000));
        assert!(o.take_placed(5, 1000));
    }
}
