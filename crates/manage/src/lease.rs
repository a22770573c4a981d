//! Who manages a group: its manager and its fallback hold one lease
//! between them, numbered by an epoch. The one that manages beats to the
//! other; the other takes over, with the next epoch, when the beats stop for
//! a lease's time. Every report and action carries the epoch, and whoever
//! receives them ([`EpochGate`]: the central manager, the hosts) takes the
//! newest epoch's holder only, so a manager cut off or frozen and then back
//! can never act: it learns of the newer epoch (from the other's beats, or
//! from a report refused) and steps down to be the fallback.
//!
//! ```text
//!   start ─► Fallback ──no beat for `lease`──► Manager(epoch + 1) ──beats──►
//!               ▲                                   │
//!               └──── a newer epoch (beat, refusal) ┘
//! ```
//!
//! Both start as the fallback, so that a manager that comes back joins as
//! one; the preferred (the file's `manager`) waits one lease, the other one
//! and a half, so that at a cold start the preferred one manages.

use crate::Nanos;
use serde::{Deserialize, Serialize};

/// Lease settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseConfig {
    /// Time between beats of the managing side.
    pub beat: Nanos,
    /// Silence after which the other side takes over.
    pub lease: Nanos,
}

impl Default for LeaseConfig {
    /// Beats every 200 ms, a lease of 1 s: a dead manager is replaced
    /// within about 1.2 s, and four lost beats in a row change nothing.
    fn default() -> Self {
        LeaseConfig {
            beat: 200 * crate::MS,
            lease: 1000 * crate::MS,
        }
    }
}

/// Which side manages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Manages: probes, reports, acts.
    Manager,
    /// Watches the manager's beats.
    Fallback,
}

/// What the driver must do or learn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseEvent {
    /// Send a beat with this epoch to the other side.
    Beat { epoch: u64 },
    /// This side manages from now on, with this epoch.
    TookOver { epoch: u64 },
    /// This side stops managing: a newer epoch is held elsewhere.
    SteppedDown { epoch: u64 },
}

/// One side's lease.
#[derive(Clone, Debug)]
pub struct Lease {
    cfg: LeaseConfig,
    preferred: bool,
    role: Role,
    epoch: u64,
    /// From when the other side's silence counts.
    last_heard: Nanos,
    /// When a word of the other side last came (or this side started).
    word: Nanos,
    next_beat: Nanos,
}

impl Lease {
    /// A side starting at `now`, as the fallback; `preferred` for the
    /// file's manager.
    pub fn new(cfg: LeaseConfig, preferred: bool, now: Nanos) -> Lease {
        Lease {
            cfg,
            preferred,
            role: Role::Fallback,
            epoch: 0,
            last_heard: now,
            word: now,
            next_beat: now,
        }
    }

    /// Which side this is now.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The newest epoch this side knows.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The epoch to act with, when this side manages.
    pub fn acting(&self) -> Option<u64> {
        (self.role == Role::Manager).then_some(self.epoch)
    }

    fn patience(&self) -> Nanos {
        if self.preferred {
            self.cfg.lease
        } else {
            self.cfg.lease + self.cfg.lease / 2
        }
    }

    /// A beat from the other side, which came at `now`.
    pub fn on_beat(&mut self, epoch: u64, now: Nanos, out: &mut Vec<LeaseEvent>) {
        let tie_lost = epoch == self.epoch && self.role == Role::Manager && !self.preferred;
        if epoch > self.epoch || tie_lost {
            self.newer(epoch, now, out);
        } else if epoch == self.epoch {
            // `now` is when the beat came, which may be before a refusal
            // read earlier: the side was heard at the latest of the two.
            self.heard(now);
        }
    }

    /// A report or action of this side was refused: epoch `epoch` is held
    /// by another (the refusal says which epoch).
    pub fn on_refused(&mut self, epoch: u64, now: Nanos, out: &mut Vec<LeaseEvent>) {
        if epoch >= self.epoch {
            self.newer(epoch, now, out);
        }
    }

    /// Words from the other side may have been lost at `now` (dropped
    /// unread): its silence before is not counted, up to one patience
    /// after its last word (anyone can make a socket drop a datagram, so
    /// drops delay a takeover, never hold it off for good).
    pub fn excuse(&mut self, now: Nanos) {
        let bound = self.word.saturating_add(self.patience());
        self.last_heard = self.last_heard.max(now.min(bound));
    }

    fn heard(&mut self, now: Nanos) {
        self.last_heard = self.last_heard.max(now);
        self.word = self.word.max(now);
    }

    fn newer(&mut self, epoch: u64, now: Nanos, out: &mut Vec<LeaseEvent>) {
        self.epoch = epoch;
        self.heard(now);
        if self.role == Role::Manager {
            self.role = Role::Fallback;
            out.push(LeaseEvent::SteppedDown { epoch });
        }
    }

    /// Everything due by `now`.
    pub fn poll(&mut self, now: Nanos, out: &mut Vec<LeaseEvent>) {
        if self.role == Role::Fallback && now >= self.last_heard + self.patience() {
            self.role = Role::Manager;
            self.epoch += 1;
            self.next_beat = now;
            out.push(LeaseEvent::TookOver { epoch: self.epoch });
        }
        if self.role == Role::Manager && now >= self.next_beat {
            self.next_beat = now + self.cfg.beat;
            out.push(LeaseEvent::Beat { epoch: self.epoch });
        }
    }

    /// The earliest time [`poll`](Self::poll) has something to do.
    pub fn next_deadline(&self) -> Nanos {
        match self.role {
            Role::Manager => self.next_beat,
            Role::Fallback => self.last_heard + self.patience(),
        }
    }
}

/// What a receiver makes of an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// From the holder of the newest epoch: act on it.
    Accepted,
    /// Older, or the same epoch from another sender: ignore it, and tell
    /// the sender which epoch holds.
    Refused {
        /// The epoch that holds.
        epoch: u64,
    },
}

/// A receiver's check of one group's epochs: the newest epoch's first
/// sender holds it. The central manager also arbitrates
/// ([`check_at`](Self::check_at)): a newer epoch from another node is
/// taken only once the holder has been silent for a lease, so a fallback
/// cut off from its manager alone (a partition between the two) cannot
/// unseat a manager the central manager still hears.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochGate {
    holder: Option<(u64, u32)>,
    /// From when the holder's silence counts.
    #[serde(default)]
    heard: Nanos,
    /// When a word of the holder last came.
    #[serde(default)]
    word: Nanos,
}

impl EpochGate {
    /// Whether a report or action of `epoch` from node `from` counts.
    pub fn check(&mut self, epoch: u64, from: u32) -> Verdict {
        self.check_at(epoch, from, 0, 0)
    }

    /// Whether a report or beat of `epoch` from node `from`, heard at
    /// `now`, counts, when a holder heard within `lease` keeps its place.
    pub fn check_at(&mut self, epoch: u64, from: u32, now: Nanos, lease: Nanos) -> Verdict {
        match self.holder {
            Some((e, who)) if epoch < e || (epoch == e && from != who) => {
                Verdict::Refused { epoch: e }
            }
            Some((e, who)) if from != who && now < self.heard.saturating_add(lease) => {
                Verdict::Refused { epoch: e }
            }
            _ => {
                self.holder = Some((epoch, from));
                // Words read out of the order they came never move it back.
                self.heard = self.heard.max(now);
                self.word = self.word.max(now);
                Verdict::Accepted
            }
        }
    }

    /// Words may have been lost at `now` (dropped unread): the holder's
    /// silence before is not counted, up to a `lease` after its last word
    /// (anyone can make a socket drop a datagram, so drops delay a
    /// takeover, never hold it off for good).
    pub fn excuse(&mut self, now: Nanos, lease: Nanos) {
        let bound = self.word.saturating_add(lease);
        self.heard = self.heard.max(now.min(bound));
    }

    /// The newest epoch and its holder.
    pub fn holder(&self) -> Option<(u64, u32)> {
        self.holder
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MS;

    /// Two sides beating to each other every ms over a link that carries
    /// beats only while `up(t)`; the events with times.
    fn run(
        a: &mut Lease,
        b: &mut Lease,
        from: Nanos,
        until: Nanos,
        up: impl Fn(Nanos) -> bool,
    ) -> Vec<(Nanos, char, LeaseEvent)> {
        let mut seen = Vec::new();
        let mut t = from;
        while t <= until {
            step('a', a, b, t, up(t), &mut seen);
            step('b', b, a, t, up(t), &mut seen);
            t += MS;
        }
        seen
    }

    /// `me` polls at `t`; its beats reach `other` when `up`.
    fn step(
        name: char,
        me: &mut Lease,
        other: &mut Lease,
        t: Nanos,
        up: bool,
        seen: &mut Vec<(Nanos, char, LeaseEvent)>,
    ) {
        let mut out = Vec::new();
        me.poll(t, &mut out);
        for e in out {
            match e {
                LeaseEvent::Beat { epoch } if up => {
                    let mut o = Vec::new();
                    other.on_beat(epoch, t, &mut o);
                    let who = if name == 'a' { 'b' } else { 'a' };
                    seen.extend(o.into_iter().map(|e| (t, who, e)));
                }
                LeaseEvent::Beat { .. } => {}
                e => seen.push((t, name, e)),
            }
        }
    }

    #[test]
    fn the_preferred_side_manages_and_the_other_takes_over_when_it_dies() {
        let cfg = LeaseConfig::default();
        let (mut a, mut b) = (Lease::new(cfg, true, 0), Lease::new(cfg, false, 0));
        let seen = run(&mut a, &mut b, 0, 5000 * MS, |_| true);
        assert_eq!(seen, [(cfg.lease, 'a', LeaseEvent::TookOver { epoch: 1 })]);
        assert_eq!((a.acting(), b.acting()), (Some(1), None));
        // a dies at 5 s: b takes over within a lease and a beat.
        let mut out = Vec::new();
        let mut t = 5000 * MS;
        while out.is_empty() {
            b.poll(t, &mut out);
            t += MS;
        }
        assert_eq!(out[0], LeaseEvent::TookOver { epoch: 2 });
        assert!(t - 5000 * MS <= cfg.lease + cfg.lease / 2 + cfg.beat, "{t}");
    }

    #[test]
    fn a_manager_cut_off_and_back_steps_down_and_the_gate_never_takes_it() {
        let cfg = LeaseConfig::default();
        let (mut a, mut b) = (Lease::new(cfg, true, 0), Lease::new(cfg, false, 0));
        let mut gate = EpochGate::default();
        // Cut from 2 s to 6 s: both manage for a while, with two epochs.
        let seen = run(&mut a, &mut b, 0, 8000 * MS, |t| {
            !(2000 * MS..6000 * MS).contains(&t)
        });
        let took: Vec<_> = seen
            .iter()
            .filter(|(_, _, e)| matches!(e, LeaseEvent::TookOver { .. }))
            .collect();
        assert_eq!(took.len(), 2, "{seen:?}");
        assert_eq!(took[1].1, 'b');
        let down = seen
            .iter()
            .find(|(_, who, e)| *who == 'a' && *e == LeaseEvent::SteppedDown { epoch: 2 })
            .expect("a stepped down");
        assert!(
            (6000 * MS..=6000 * MS + cfg.beat).contains(&down.0),
            "{seen:?}"
        );
        assert_eq!((a.acting(), b.acting()), (None, Some(2)));
        // What the gate makes of their reports, in any order.
        assert_eq!(gate.check(2, 22), Verdict::Accepted);
        assert_eq!(gate.check(1, 21), Verdict::Refused { epoch: 2 });
        assert_eq!(
            gate.check(2, 21),
            Verdict::Refused { epoch: 2 },
            "same epoch, other sender"
        );
        assert_eq!(gate.check(3, 21), Verdict::Accepted);
        assert_eq!(gate.holder(), Some((3, 21)));
    }

    #[test]
    fn beats_read_out_of_time_and_words_dropped_never_shorten_the_patience() {
        let cfg = LeaseConfig::default();
        let mut b = Lease::new(cfg, true, 0);
        let mut out = Vec::new();
        // A beat that came at 600 ms, read after one that came at 700.
        b.on_beat(0, 700 * MS, &mut out);
        b.on_beat(0, 600 * MS, &mut out);
        b.poll(700 * MS + cfg.lease - 1, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // Datagrams dropped at 1.5 s: the silence before is not counted;
        // dropped again at 2.4 s, past a patience after the last beat (at
        // 700 ms): that one excuses only up to there. Drops delay a
        // takeover by one patience at most.
        b.excuse(1500 * MS);
        b.poll(1500 * MS + cfg.lease - 1, &mut out);
        assert!(out.is_empty(), "{out:?}");
        b.excuse(2400 * MS);
        let bound = 700 * MS + cfg.lease;
        b.poll(bound + cfg.lease - 1, &mut out);
        assert!(out.is_empty(), "{out:?}");
        b.poll(bound + cfg.lease, &mut out);
        assert_eq!(
            out,
            [
                LeaseEvent::TookOver { epoch: 1 },
                LeaseEvent::Beat { epoch: 1 }
            ]
        );
    }

    #[test]
    fn a_refusal_makes_a_manager_step_down_and_wait_a_lease() {
        let cfg = LeaseConfig::default();
        let mut a = Lease::new(cfg, true, 0);
        let mut out = Vec::new();
        a.poll(cfg.lease, &mut out);
        assert_eq!(a.acting(), Some(1));
        out.clear();
        a.on_refused(4, 2000 * MS, &mut out);
        assert_eq!(out, [LeaseEvent::SteppedDown { epoch: 4 }]);
        assert_eq!(a.acting(), None);
        out.clear();
        a.poll(2000 * MS + cfg.lease - 1, &mut out);
        assert!(out.is_empty());
        a.poll(2000 * MS + cfg.lease, &mut out);
        assert_eq!(out[0], LeaseEvent::TookOver { epoch: 5 });
    }

    #[test]
    fn the_gate_keeps_a_holder_it_hears_and_takes_the_newer_epoch_once_it_is_silent() {
        let lease = 1000 * MS;
        let mut gate = EpochGate::default();
        assert_eq!(gate.check_at(1, 21, 0, lease), Verdict::Accepted);
        // 21 beats on; 22, cut off from 21 alone, takes over with epoch 2.
        assert_eq!(gate.check_at(1, 21, 500 * MS, lease), Verdict::Accepted);
        assert_eq!(
            gate.check_at(2, 22, 900 * MS, lease),
            Verdict::Refused { epoch: 1 },
            "the holder was heard 400 ms ago"
        );
        assert_eq!(gate.check_at(1, 21, 1400 * MS, lease), Verdict::Accepted);
        assert_eq!(
            gate.check_at(3, 22, 2300 * MS, lease),
            Verdict::Refused { epoch: 1 }
        );
        // 21 dies: a lease after it was last heard, 22's epoch holds.
        assert_eq!(gate.check_at(3, 22, 2400 * MS, lease), Verdict::Accepted);
        assert_eq!(gate.holder(), Some((3, 22)));
        assert_eq!(
            gate.check_at(1, 21, 2500 * MS, lease),
            Verdict::Refused { epoch: 3 },
            "the old manager back: refused"
        );
        // The holder itself moving to a newer epoch is taken at once.
        assert_eq!(gate.check_at(4, 22, 2600 * MS, lease), Verdict::Accepted);
    }

    #[test]
    fn at_a_cold_start_cut_in_two_the_tie_goes_to_the_preferred_side() {
        let cfg = LeaseConfig::default();
        let (mut a, mut b) = (Lease::new(cfg, true, 0), Lease::new(cfg, false, 0));
        let seen = run(&mut a, &mut b, 0, 4000 * MS, |t| t >= 3000 * MS);
        assert_eq!((a.acting(), b.acting()), (Some(1), None), "{seen:?}");
    }
}
