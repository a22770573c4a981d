//! An endpoint's pass: one look at every connection, the UDP socket and
//! the UCX worker, moving what came along, and the read that loops over
//! passes until a message is delivered or its deadline comes.

use std::cell::OnceCell;
use std::time::{Duration, Instant};

use super::alone::Alone;
use super::{Deadline, Endpoint};
use crate::error::{Error, Result};
use crate::rx::{Body, Ready, Step};
use crate::transport::offer::PLACE_MIN;
use crate::transport::sys;
use crate::transport::tcp::COLD_EVERY;
use crate::types::{Completion, Mode, Recv, RecvKind};

/// How long a read that does not wait goes on while passes move bytes
/// without delivering a message (a long one coming, or a flood of
/// datagrams that are not ours).
const TRY_BUSY: Duration = Duration::from_millis(10);

impl Endpoint {
    pub(super) fn read_until(
        &mut self,
        buf: &mut [u8],
        deadline: Deadline,
    ) -> Result<Option<Recv>> {
        if matches!(deadline, Deadline::Now) {
            self.look_again();
        } else if let Some(one) = self.one_source() {
            if let Alone::Read(r) = self.read_alone(one, buf, deadline)? {
                return Ok(r);
            }
        }
        // Passes that moved something without delivering (a long message
        // coming in parts, or datagrams that are not ours): the deadline is
        // still looked at now and then, so a peer that keeps the endpoint
        // busy (a flood of junk) does not hold the read past it.
        let mut busy: u32 = 0;
        let mut busy_since = None;
        loop {
            if let Some(r) = self.pop_ready(buf)? {
                self.delivered();
                return Ok(Some(r));
            }
            let moved = match self.progress_with(Some(&mut *buf)) {
                Ok((Some(r), _)) => {
                    self.delivered();
                    self.flush_ctrl();
                    return Ok(Some(r));
                }
                Ok((None, moved)) => moved,
                Err(e) => return Err(e),
            };
            let answered = self.flush_ctrl();
            if moved || answered || !self.core.ready.is_empty() {
                self.idle_spins = 0;
                busy = busy.wrapping_add(1);
                if busy.is_multiple_of(256) {
                    let now = Instant::now();
                    let end = match deadline {
                        Deadline::At(t) => Some(t),
                        // A read that does not wait gives a busy spell
                        // this long.
                        Deadline::Now => Some(*busy_since.get_or_insert(now) + TRY_BUSY),
                        Deadline::Never => None,
                    };
                    if end.is_some_and(|t| now >= t) {
                        return Ok(None);
                    }
                }
                continue;
            }
            // Reading the clock costs as much as a pass: while polling, look
            // at it every 256 idle passes only; while waiting, once a sleep,
            // and the sleep takes that reading for what it times.
            let polling = self.core.completion == Completion::Poll;
            let now = OnceCell::new();
            match deadline {
                Deadline::Now => return Ok(None),
                Deadline::At(t)
                    if (!polling || (self.idle_spins + 1).is_multiple_of(256))
                        && *now.get_or_init(Instant::now) >= t =>
                {
                    return Ok(None)
                }
                _ => {}
            }
            if let Some(r) = self.idle(deadline, &now, Some(&mut *buf))? {
                self.delivered();
                self.flush_ctrl();
                return Ok(Some(r));
            }
        }
    }

    /// The next pass looks at every connection, and a waiting endpoint's
    /// at the UDP socket, for a caller that will not sleep: what a waiting
    /// read leaves to its sleep's `poll` (a socket an earlier read
    /// emptied, the UDP socket) is looked for now. A polling endpoint
    /// looks at a UDP socket it does not use as `udp_look` says, not on
    /// each such call (a system call each).
    pub(super) fn look_again(&mut self) {
        self.udp_look.stirred();
        self.look_at_conns();
    }

    /// The next pass reads every connection that has something: a few
    /// are read whatever they have, many are asked about first.
    pub(super) fn look_at_conns(&mut self) {
        if self.waits.watching() {
            self.look_at_set();
        } else {
            self.look_at_each();
        }
    }

    /// Tells every connection whether the wait set watches it (it does
    /// while there are more than a few; see `transport::tcp`).
    pub(super) fn rewatch(&mut self) {
        let on = self.waits.watching();
        self.watching = on;
        for c in self.slots.iter_mut().filter_map(|s| s.conn.as_mut()) {
            c.link.watched(on);
        }
    }

    pub(super) fn look_at_each(&mut self) {
        self.waits.wake_all();
        for s in &mut self.slots {
            if let Some(c) = s.conn.as_mut() {
                c.link.look_again();
            }
        }
    }

    /// A pass of an endpoint whose wait set watches: on one in COLD_EVERY,
    /// the set says which dozing connections have something. Out of line:
    /// an endpoint of a few connections never comes here, and its pass
    /// stays small.
    #[cold]
    #[inline(never)]
    pub(super) fn count_to_look(&mut self) {
        self.cold_countdown -= 1;
        if self.cold_countdown == 0 {
            self.cold_countdown = COLD_EVERY;
            self.look_at_set();
        }
    }

    /// Asks the wait set which connections have something, and has the
    /// next pass read those (and the UDP socket, when the set holds it and
    /// it stirred).
    pub(super) fn look_at_set(&mut self) {
        if let Err(e) = self.waits.look() {
            tracing::debug!("a look at the wait set failed: {e}; looking at each connection");
            return self.look_at_each();
        }
        self.heard_others();
        for i in self.waits.stirred_slots() {
            if let Some(c) = self.slots.get_mut(i).and_then(|s| s.conn.as_mut()) {
                c.link.look_again();
                // What a descriptor watched edge-triggered reports is said
                // once: a hang-up taken here, outside a sleep, is heard
                // now, a ring counted among those left in the pipe.
                if let Some(gone) = self.waits.stirred_edge(i) {
                    c.link.rang(gone);
                }
            }
        }
    }

    /// A read returns a message: the next idle passes spin flat out again.
    pub(super) fn delivered(&mut self) {
        self.idle_spins = 0;
        if self.core.probe {
            self.core.timings.read_delivered = sys::clock_ns();
        }
    }

    pub(super) fn pop_ready(&mut self, buf: &mut [u8]) -> Result<Option<Recv>> {
        match self.core.ready.front() {
            None => return Ok(None),
            Some(Ready::Msg { len, .. }) if *len > buf.len() => {
                return Err(Error::BufferTooSmall {
                    needed: *len,
                    have: buf.len(),
                })
            }
            Some(_) => {}
        }
        Ok(match self.core.ready.pop_front() {
            Some(Ready::Msg {
                from,
                mode,
                transport,
                len,
                body,
                via,
            }) => {
                match body {
                    Body::Staged(chain) => {
                        self.core.pool.drain_into(chain, buf);
                    }
                    Body::Held(data) => buf[..len].copy_from_slice(&data),
                    Body::Pending(m) => {
                        let Some(port) = self.ucx.as_mut() else {
                            return Err(Error::BadTarget);
                        };
                        if let Err(reason) = port.receive(m, &mut buf[..len]) {
                            return Err(Error::PeerLost { peer: from, reason });
                        }
                    }
                }
                self.core.stats.messages_in += 1;
                self.core.stats.bytes_in += len as u64;
                Some(Recv {
                    from,
                    len,
                    kind: RecvKind::Message(mode),
                    transport,
                    via,
                })
            }
            Some(Ready::Placed {
                from,
                transport,
                via,
                key,
                offset,
                len,
            }) => Some(Recv {
                from,
                len,
                kind: RecvKind::PutPlaced { key, offset },
                transport,
                via,
            }),
            Some(Ready::Lost { peer, reason }) => return Err(Error::PeerLost { peer, reason }),
            None => None,
        })
    }

    pub(super) fn progress_all(&mut self, user: Option<&mut [u8]>) -> Result<bool> {
        self.progress_with(user).map(|(_, moved)| moved)
    }

    /// One pass over every connection and the datagram socket.
    #[inline(always)]
    pub(super) fn progress_with(
        &mut self,
        mut user: Option<&mut [u8]>,
    ) -> Result<(Option<Recv>, bool)> {
        self.adopt_incoming();
        // Cold connections doze (a pass skips them) while the wait set
        // watches: on one pass in COLD_EVERY the set says which have
        // something (one system call for all of them). Asked here, not at
        // the end of a pass: a pass that delivers ends early, and a reader
        // kept busy by one connection (polling, or waiting and so never
        // asleep) would never ask.
        let watching = self.watching;
        if watching {
            self.count_to_look();
        }
        let mut moved = false;
        // UCX first: what its worker holds for a connection goes ahead of
        // the loss a pass over the connections may find for it.
        if let Some(port) = self.ucx.as_mut() {
            match port.progress(&mut self.core, user.as_deref_mut(), &mut self.slots) {
                Step::Delivered => return Ok((self.core.got.take(), true)),
                Step::TooSmall(needed) => {
                    return Err(Error::BufferTooSmall {
                        needed: needed as usize,
                        have: user.map_or(0, |b| b.len()),
                    })
                }
                Step::Moved => moved = true,
                // The port's messages come as `Delivered`.
                Step::Idle | Step::Lost | Step::Message { .. } => {}
            }
        }
        // The datagram socket costs a system call per look: `udp_look`
        // says when (a steady stream on other connections does not keep a
        // datagram waiting: the look comes before the connections, since
        // a pass that delivers from one ends there). While waiting, a look
        // that finds nothing is a system call the sleep's `poll` makes
        // anyway.
        match self.udp_pass(user.as_deref_mut())? {
            Step::Delivered => return Ok((self.core.got.take(), true)),
            Step::Moved => moved = true,
            _ => {}
        }
        let n = self.slots.len();
        // One connection's part of a pass, `idle` done when it had nothing:
        // a macro, not a function, since the loop of a few connections
        // measured 5 ns a message slower (shm, 8 B) with a function.
        macro_rules! visit {
            ($i:expr, $idle:block) => {{
                let i = $i;
                let gen = self.slots[i].gen;
                let Some(conn) = self.slots[i].conn.as_mut() else {
                    continue;
                };
                let r = match conn.link.progress(&mut self.core, user.as_deref_mut()) {
                    Step::Idle => {
                        $idle
                        continue;
                    }
                    Step::Moved => {
                        moved = true;
                        continue;
                    }
                    Step::Message { len, mode } => conn.recv(i, gen, len, mode),
                    Step::Delivered => match self.core.got.take() {
                        Some(r) => r,
                        None => {
                            debug_assert!(false, "a pass delivered nothing");
                            moved = true;
                            continue;
                        }
                    },
                    Step::TooSmall(needed) => {
                        return Err(Error::BufferTooSmall {
                            needed: needed as usize,
                            have: user.map_or(0, |b| b.len()),
                        })
                    }
                    Step::Lost => {
                        let reason = std::mem::take(&mut self.core.lost);
                        self.lose(i, reason);
                        moved = true;
                        continue;
                    }
                };
                self.next_slot = if i + 1 == n { 0 } else { i + 1 };
                if r.len >= PLACE_MIN && r.kind == RecvKind::Message(Mode::Reliable) {
                    self.offer_to = Some(i);
                }
                return Ok((Some(r), true));
            }};
        }
        // From where the last delivery left off, round to it (no division
        // per slot: a pass is a few tens of nanoseconds).
        let start = self.next_slot.min(n);
        if !watching || n == 0 {
            for i in (start..n).chain(0..start) {
                visit!(i, {});
            }
            return Ok((None, moved));
        }
        // Watched connections (many, or those of a waiting endpoint): those
        // awake, by their bits, from `start` round to it (its word's bits
        // from `start`, the other words, its word's bits before `start`).
        // One that goes cold dozes.
        let words = n.div_ceil(64);
        let (sw, sb) = (start / 64, start % 64);
        for k in 0..=words {
            let w = (sw + k) % words;
            let mask = match k {
                0 => u64::MAX << sb,
                k if k == words => (1u64 << sb) - 1,
                _ => u64::MAX,
            };
            let mut bits = self.waits.awake(w) & mask;
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if i >= n {
                    break;
                }
                self.core.cold = false;
                visit!(i, {
                    if self.core.cold {
                        self.waits.doze(i);
                    }
                });
            }
        }
        Ok((None, moved))
    }

    /// A pass's look at the datagram socket, when `udp_look` says this
    /// pass looks: what it took (`Idle` when it did not look).
    #[inline(always)]
    pub(super) fn udp_pass(&mut self, user: Option<&mut [u8]>) -> Result<Step> {
        let look = self.udp.is_some() && self.udp_look.due(self.core.completion, Instant::now);
        let Some(udp) = self.udp.as_mut().filter(|_| look) else {
            return Ok(Step::Idle);
        };
        let step = udp.progress(&mut self.core, &self.inbox, user)?;
        if matches!(step, Step::Delivered | Step::Moved) && udp.heard_member() {
            self.udp_look.heat();
        }
        Ok(step)
    }

    /// The slot of the endpoint's one connection, when it has one only.
    pub(super) fn only_conn(&self) -> Option<usize> {
        let mut live = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.conn.is_some());
        match (live.next(), live.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        }
    }

    /// Drops a broken connection, and tells the application once it was
    /// the last to its peer. Two endpoints that both write to each other
    /// have a connection each way: when one closes, the connection it only
    /// read on ends at once, while messages it wrote before closing may
    /// still wait in the other, and are read before the loss is told.
    pub(super) fn lose(&mut self, i: usize, reason: String) {
        let gen = self.slots[i].gen;
        if let Some(mut conn) = self.slots[i].conn.take() {
            if self.waits.remove(i, conn.link.read_fd()) {
                self.rewatch();
            }
            conn.link.release(&mut self.core.pool);
            self.core.puts.lose(i as u32, gen, conn.peer);
            self.forget_conn(i as u32, gen);
            tracing::debug!(peer = %conn.peer, "connection lost: {reason}");
            let peer = conn.peer;
            let another = self
                .slots
                .iter()
                .any(|s| s.conn.as_ref().is_some_and(|c| c.peer == peer));
            if !another {
                self.core.ready.push_back(Ready::Lost { peer, reason });
            }
        }
    }
}
