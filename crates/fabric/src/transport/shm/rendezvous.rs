//! The rendezvous of a shared-memory connection: a reader asleep on a
//! large message offers its buffer in the offer block beside its ring, and
//! the sender copies the message straight into it with one cross-memory
//! write (see [`crate::transport::offer`] for the states and the timing).
//!
//! ```text
//!  reader: offer(buf) ─► OFFERED ─────────────────────────► withdraw(): PLACED? the frame is next
//!  sender: place(payload): OFFERED ─CAS─► BUSY ─ copy, ring ahead ─► `Placed` frame ─► placed(): PLACED
//! ```

use std::io;
use std::sync::atomic::{fence, Ordering};
use std::time::Instant;

use super::ShmStream;
use crate::transport::offer::{self, OfferCtrl, Phase};
use crate::transport::sys::{self, Interest};

impl ShmStream {
    pub(super) fn tx_offer(&self) -> &OfferCtrl {
        // SAFETY: as for `tx`.
        unsafe { &*self.tx_offer }
    }

    pub(super) fn rx_offer(&self) -> &OfferCtrl {
        // SAFETY: as for `tx`.
        unsafe { &*self.rx_offer }
    }

    /// Reader: offers `buf` for the next message while the incoming ring
    /// is empty; false when it is not (or an offer is out). `buf` must not
    /// be touched until [`withdraw`](Self::withdraw) returns.
    pub(crate) fn offer(&mut self, buf: &mut [u8]) -> bool {
        if self.peer_gone || self.offers.out.is_some() {
            return false;
        }
        if self.rx().tail.load(Ordering::Acquire) != self.rx_head {
            return false;
        }
        // The sender places only into a drained ring: it must see so.
        self.publish_head();
        self.offers.gen = self.offers.gen.wrapping_add(1);
        let gen = self.offers.gen;
        let o = self.rx_offer();
        o.words
            .addr
            .store(buf.as_mut_ptr() as u64, Ordering::Relaxed);
        o.words.len.store(buf.len() as u64, Ordering::Relaxed);
        // SYNC POINT: release pairs with the sender's acquire (its CAS to
        // BUSY): the buffer's address and length are seen with the offer.
        o.words
            .state
            .store(offer::state(gen, Phase::Offered), Ordering::Release);
        // Dekker fence with the sender's `want` store + state load.
        fence(Ordering::SeqCst);
        if o.want.load(Ordering::Relaxed) != 0 {
            self.ring_doorbell(&self.rx_offer().want);
        }
        self.offers.out = Some((gen, buf.len() as u64));
        true
    }

    /// Reader: takes the offer out back. True when the sender placed a
    /// message in the buffer: its `Placed` frame is next in the ring.
    pub(crate) fn withdraw(&mut self) -> bool {
        let Some((gen, len)) = self.offers.out.take() else {
            return false;
        };
        let mut spin_until = None;
        let mut busy_since: Option<Instant> = None;
        loop {
            // SYNC POINT: acquire pairs with the sender's release of PLACED:
            // its copy and the `Placed` frame are visible once it is seen.
            let r = self.rx_offer().words.state.compare_exchange(
                offer::state(gen, Phase::Offered),
                offer::state(gen, Phase::Idle),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            match r {
                Ok(_) => return false,
                Err(s) if s == offer::state(gen, Phase::Placed) => {
                    self.offers.placed = Some((gen, len));
                    // The sender reads it with the next offer, and sets its
                    // wake-up lead by it.
                    let waited = busy_since.map_or(std::time::Duration::ZERO, |t| t.elapsed());
                    self.rx_offer()
                        .words
                        .waited
                        .store(offer::waited_word(gen, waited), Ordering::Relaxed);
                    return true;
                }
                Err(s) if s == offer::state(gen, Phase::Busy) => {
                    // The sender is inside its copy into the buffer (it
                    // rang ahead of its end): spin a little, then
                    // sleep until it rings again.
                    if self.peer_gone {
                        return false;
                    }
                    let now = Instant::now();
                    let since = *busy_since.get_or_insert(now);
                    if now.duration_since(since) > offer::busy_limit(len) {
                        return self.give_up_offer(s, gen, len, now - since);
                    }
                    let until = *spin_until.get_or_insert_with(|| now + offer::BUSY_SPIN);
                    if now < until {
                        for _ in 0..64 {
                            std::hint::spin_loop();
                        }
                    } else {
                        self.await_placed(s);
                    }
                }
                // Declined, or what no sender writes.
                Err(_) => return false,
            }
        }
    }

    /// Reader: a sender that stayed inside its copy into the buffer (of
    /// `len` bytes, offer `gen`) for `held`, past the bound: the offer is taken back (a sender that goes
    /// on checks the state before each write and stops) and the
    /// connection is broken, so that the read returns rather than waits
    /// for good. Returns false: nothing was placed; true when the sender
    /// placed the message in the same instant (the connection stays).
    #[cold]
    pub(super) fn give_up_offer(
        &mut self,
        busy: u64,
        gen: u64,
        len: u64,
        held: std::time::Duration,
    ) -> bool {
        // SYNC POINT: acquire pairs with the sender's release of PLACED.
        let taken = self.rx_offer().words.state.compare_exchange(
            busy,
            offer::state(gen, Phase::Idle),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if taken == Err(offer::state(gen, Phase::Placed)) {
            self.offers.placed = Some((gen, len));
            return true;
        }
        tracing::warn!(
            "the shared-memory peer held its copy into this reader's buffer for {:.1} s: \
             the connection is taken as broken",
            held.as_secs_f64()
        );
        self.peer_gone = true;
        false
    }

    /// Reader: whether a `Placed` frame for offer `gen` of `total` bytes
    /// is due (a withdrawal found it placed, with room for it).
    pub(crate) fn take_placed(&mut self, gen: u64, total: u64) -> bool {
        self.offers.take_placed(gen, total)
    }

    /// Sender: copies `payload` straight into the buffer the reader
    /// offers, when it offers one large enough and has read everything
    /// sent before. `Some(gen)`: placed; the `Placed` frame goes next, then
    /// [`placed`](Self::placed).
    pub(crate) fn place(&mut self, payload: &[u8]) -> io::Result<Option<u64>> {
        if self.peer_gone {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let Some(pid) = self.offers.peer_pid else {
            return Ok(None);
        };
        let drained = self.tx().head.load(Ordering::Acquire) == self.tx_tail;
        let mut s = self.tx_offer().words.state.load(Ordering::Acquire);
        if !drained || offer::parse(s).1 != Phase::Offered {
            // A reader that offers offers again as soon as it has read what
            // is in the ring and sleeps: wait for that rather than fill the
            // ring. Once a wait is in vain, wait again after the reader has
            // made a new offer, or a while later (`Offers::worth_waiting`).
            if !self.offers.worth_waiting(offer::parse(s).0, Instant::now()) {
                return Ok(None);
            }
            s = self.await_offer()?;
            let (gen, phase) = offer::parse(s);
            self.offers
                .waited(gen, phase == Phase::Offered, Instant::now());
            if phase != Phase::Offered {
                return Ok(None);
            }
        }
        // A reader offers only with its ring empty, and nothing was sent
        // since: the offer finds the ring drained.
        if self.tx().head.load(Ordering::Acquire) != self.tx_tail {
            return Ok(None);
        }
        let gen = offer::parse(s).0;
        let words = &self.tx_offer().words;
        // SYNC POINT: acquire pairs with the reader's release of OFFERED;
        // while BUSY the reader neither withdraws nor moves the buffer.
        if words
            .state
            .compare_exchange(
                s,
                offer::state(gen, Phase::Busy),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return Ok(None);
        }
        let addr = words.addr.load(Ordering::Relaxed);
        let len = words.len.load(Ordering::Relaxed);
        if len < payload.len() as u64 {
            words.state.store(s, Ordering::Release);
            // A reader that saw BUSY may sleep on it: it is over.
            self.kick_reader();
            return Ok(None);
        }
        // The reader's wake-up takes some microseconds: ring it while the
        // last part is copied, so that it is up when the copy ends.
        let lead = self
            .offers
            .lead_after(self.tx_offer().words.waited.load(Ordering::Relaxed));
        let ahead = payload.len().saturating_sub(lead);
        let words = &self.tx_offer().words;
        // A reader that waited too long for the copy takes its buffer back
        // (see `give_up_offer`): each write first checks that it has not.
        let busy = offer::state(gen, Phase::Busy);
        let write = |from: usize, to: usize| {
            if from == to {
                Ok(())
            } else if words.state.load(Ordering::Acquire) != busy {
                Err(io::Error::from(io::ErrorKind::TimedOut))
            } else {
                sys::write_into(pid, &payload[from..to], addr + from as u64)
            }
        };
        // With no lead, `placed` rings.
        let copied = write(0, ahead).and_then(|()| {
            if ahead < payload.len() {
                self.kick_reader();
            }
            write(ahead, payload.len())
        });
        match copied {
            Ok(()) => {
                self.offers.untold = Some(gen);
                Ok(Some(gen))
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                self.peer_gone = true;
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the reader took its buffer back before the copy into it ended",
                ))
            }
            Err(e) => {
                words
                    .state
                    .store(offer::state(gen, Phase::Idle), Ordering::Release);
                self.kick_reader();
                if e.raw_os_error() != Some(libc::EFAULT) {
                    // No permission (another user, a sandbox): not again.
                    self.offers.peer_pid = None;
                }
                tracing::debug!("rendezvous copy refused ({e}); sending through the ring");
                Ok(None)
            }
        }
    }

    /// Sender: rings the reader's doorbell if it sleeps.
    pub(super) fn kick_reader(&self) {
        fence(Ordering::SeqCst);
        if self.tx().reader_sleeping.load(Ordering::Relaxed) != 0 {
            self.ring_doorbell(&self.tx().reader_sleeping);
        }
    }

    /// Reader: sleeps until the offer's state leaves `busy` (the sender
    /// rings when it has placed), at most a nap.
    pub(super) fn await_placed(&mut self, busy: u64) {
        self.rx().reader_sleeping.store(1, Ordering::Relaxed);
        // Dekker fence with the sender's PLACED store + flag load.
        fence(Ordering::SeqCst);
        if self.rx_offer().words.state.load(Ordering::Acquire) == busy {
            let nap = std::time::Duration::from_millis(1);
            let _ = sys::wait_fd(self.bells.fd(), Interest::Read, nap);
        }
        self.rx().reader_sleeping.store(0, Ordering::Relaxed);
        self.check_alive();
    }

    /// Sender: the `Placed` frame of offer `gen` is in the ring.
    pub(crate) fn placed(&mut self, gen: u64) {
        // SYNC POINT: release pairs with the reader's acquire in `withdraw`.
        self.tx_offer()
            .words
            .state
            .store(offer::state(gen, Phase::Placed), Ordering::Release);
        self.kick_reader();
    }

    /// Sender: waits up to [`offer::OFFER_WAIT`] for the reader's next
    /// offer, spinning for the first [`offer::OFFER_SPIN`] of it (a reader
    /// turns round in a few microseconds); returns the state word last seen.
    pub(super) fn await_offer(&mut self) -> io::Result<u64> {
        let now = std::time::Instant::now();
        let spin_until = now + offer::OFFER_SPIN;
        while std::time::Instant::now() < spin_until {
            let s = self.tx_offer().words.state.load(Ordering::Acquire);
            if offer::parse(s).1 == Phase::Offered {
                return Ok(s);
            }
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        }
        let until = now + offer::OFFER_WAIT;
        loop {
            self.tx_offer().want.store(1, Ordering::Relaxed);
            // Dekker fence with the reader's state store + `want` load.
            fence(Ordering::SeqCst);
            let s = self.tx_offer().words.state.load(Ordering::Acquire);
            let left = until.saturating_duration_since(std::time::Instant::now());
            if offer::parse(s).1 == Phase::Offered || left.is_zero() || self.peer_gone {
                self.tx_offer().want.store(0, Ordering::Relaxed);
                return Ok(s);
            }
            sys::wait_fd(self.bells.fd(), Interest::Read, left)?;
            self.check_alive();
        }
    }
}
