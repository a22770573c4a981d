//! The local manager's failure detector, after SWIM: each member of the
//! group is probed in turn; a probe left unanswered is tried again through
//! other members (indirect probes), so that one bad link does not condemn a
//! host; a host none of them reaches is *suspect*, still probed, and only
//! once the suspicion has lasted its time is it *failed*. Any answer at any
//! point clears it.
//!
//! ```text
//!  Alive ──probe unanswered (ack_timeout)──► indirect probes via k members
//!    ▲                                          │ none answered (indirect_timeout)
//!    │ any ack                                   ▼
//!    ├──────────────────────────────────────── Suspect ──suspicion elapsed──► Failed
//!    └──────────────────────────────────────────────────── any ack ──────────┘
//! ```
//!
//! No I/O and no clock: the driver passes the time in, sends what
//! [`Detector::poll`] asks for, and hands answers to [`Detector::on_ack`].

use crate::Nanos;
use serde::{Deserialize, Serialize};

/// Detection settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetectConfig {
    /// Time between probes of one member.
    pub interval: Nanos,
    /// How long a direct probe waits for its answer.
    pub ack_timeout: Nanos,
    /// Members asked to probe on the manager's behalf.
    pub indirect: usize,
    /// How long indirect probes wait for an answer.
    pub indirect_timeout: Nanos,
    /// How long a member stays suspect before it is failed.
    pub suspicion: Nanos,
}

impl Default for DetectConfig {
    /// Probes every 200 ms, 100 ms for a direct answer, two indirect probes
    /// with 200 ms for theirs, 400 ms of suspicion in which the suspect is
    /// probed every 100 ms, directly and indirectly: a dead host is failed
    /// within 0.9 s of its last answer, and lost packets fail nobody (each
    /// probe has three ways to be answered, and suspicion sees three or
    /// four more probes).
    fn default() -> Self {
        DetectConfig {
            interval: 200 * crate::MS,
            ack_timeout: 100 * crate::MS,
            indirect: 2,
            indirect_timeout: 200 * crate::MS,
            suspicion: 400 * crate::MS,
        }
    }
}

impl DetectConfig {
    /// Longest time from a member's last answer to its failure.
    pub fn detection_bound(&self) -> Nanos {
        self.interval + self.ack_timeout + self.indirect_timeout + self.suspicion
    }
}

/// What the detector makes of a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Liveness {
    /// It answers.
    Alive,
    /// Nobody reached it lately; still probed.
    Suspect,
    /// Suspect for the whole suspicion time.
    Failed,
}

/// What the driver must do or learn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetectEvent {
    /// Send probe `seq` to member `to`.
    Probe { to: usize, seq: u64 },
    /// Ask member `via` to probe member `to` with `seq` and pass the answer
    /// back.
    ProbeVia { to: usize, via: usize, seq: u64 },
    /// Member `0` changed to `1`.
    Changed(usize, Liveness),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiting {
    /// Nothing outstanding.
    No,
    /// A direct probe, sent at this time.
    Direct(Nanos),
    /// Indirect probes, given up at this time.
    Indirect(Nanos),
}

#[derive(Clone, Debug)]
struct Member {
    liveness: Liveness,
    /// When it became suspect.
    since: Nanos,
    next_probe: Nanos,
    /// Sequence of the last probe sent; answers to older ones still count.
    seq: u64,
    /// Sequence of the newest probe answered: an answer to it or an older
    /// one again (a replay) counts for nothing.
    acked: u64,
    /// Where its probe numbers started.
    first: u64,
    waiting: Waiting,
}

/// The failure detector of one group, as its manager runs it.
#[derive(Clone, Debug)]
pub struct Detector {
    cfg: DetectConfig,
    members: Vec<Member>,
    /// Where the choice of helpers for indirect probes goes on from.
    helper: usize,
}

impl Detector {
    /// `n` members, taken to be alive, probed in turn from `now` on
    /// (spread over one interval, so that probes do not go out in bursts).
    pub fn new(n: usize, cfg: DetectConfig, now: Nanos) -> Detector {
        let step = cfg.interval / n.max(1) as u64;
        Detector {
            cfg,
            members: (0..n)
                .map(|i| Member {
                    liveness: Liveness::Alive,
                    since: now,
                    next_probe: now + step * i as u64,
                    seq: 0,
                    acked: 0,
                    first: 0,
                    waiting: Waiting::No,
                })
                .collect(),
            helper: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> DetectConfig {
        self.cfg
    }

    /// What the detector makes of member `i` now.
    pub fn liveness(&self, i: usize) -> Option<Liveness> {
        self.members.get(i).map(|m| m.liveness)
    }

    /// Member `from` answered probe `seq` (directly or through another
    /// member); whether the answer is fresh. An answer to a probe never
    /// sent, or to one older than an answer already taken, is ignored.
    pub fn on_ack(&mut self, from: usize, seq: u64, out: &mut Vec<DetectEvent>) -> bool {
        let Some(m) = self.members.get_mut(from) else {
            return false;
        };
        if seq <= m.acked || seq > m.seq {
            return false;
        }
        m.acked = seq;
        m.waiting = Waiting::No;
        if m.liveness != Liveness::Alive {
            m.liveness = Liveness::Alive;
            out.push(DetectEvent::Changed(from, Liveness::Alive));
        }
        true
    }

    /// Probe numbers from `first` on (a driver that outlives a detector
    /// starts the next one past every number the last one used, so that
    /// old answers count for nothing).
    pub fn starting_at(mut self, first: u64) -> Detector {
        for m in &mut self.members {
            (m.seq, m.acked, m.first) = (first, first, first);
        }
        self
    }

    /// Whether anything is known of member `i` yet: an answer, or a
    /// suspicion.
    pub fn known(&self, i: usize) -> bool {
        self.members
            .get(i)
            .is_some_and(|m| m.liveness != Liveness::Alive || m.acked > m.first)
    }

    /// Everything due by `now`.
    pub fn poll(&mut self, now: Nanos, out: &mut Vec<DetectEvent>) {
        for i in 0..self.members.len() {
            self.poll_member(i, now, out);
        }
    }

    fn poll_member(&mut self, i: usize, now: Nanos, out: &mut Vec<DetectEvent>) {
        let cfg = self.cfg;
        let m = &mut self.members[i];
        // Only a member taken to be alive waits for one probe's answer: a
        // suspect's fate is its suspicion's time, a failed one's an answer.
        match m.waiting {
            Waiting::Direct(sent) if now >= sent + cfg.ack_timeout => {
                m.waiting = Waiting::Indirect(now + cfg.indirect_timeout);
                let seq = m.seq;
                self.probe_via(i, seq, out);
            }
            Waiting::Indirect(until) if now >= until => {
                m.waiting = Waiting::No;
                m.liveness = Liveness::Suspect;
                m.since = now;
                out.push(DetectEvent::Changed(i, Liveness::Suspect));
            }
            _ => {}
        }
        let m = &mut self.members[i];
        if m.liveness == Liveness::Suspect && now >= m.since + cfg.suspicion {
            m.liveness = Liveness::Failed;
            out.push(DetectEvent::Changed(i, Liveness::Failed));
        }
        if now < m.next_probe {
            return;
        }
        match m.liveness {
            Liveness::Alive => {
                m.next_probe = now + cfg.interval;
                if m.waiting == Waiting::No {
                    m.seq += 1;
                    m.waiting = Waiting::Direct(now);
                    out.push(DetectEvent::Probe { to: i, seq: m.seq });
                }
            }
            // A suspect is probed twice as often, directly and through
            // others at once: several chances to answer before it fails.
            Liveness::Suspect => {
                m.next_probe = now + (cfg.interval / 2).max(1);
                m.seq += 1;
                let seq = m.seq;
                out.push(DetectEvent::Probe { to: i, seq });
                self.probe_via(i, seq, out);
            }
            // Nothing is left to decide about a failed member but that it
            // is back.
            Liveness::Failed => {
                m.next_probe = now + cfg.interval;
                m.seq += 1;
                out.push(DetectEvent::Probe { to: i, seq: m.seq });
            }
        }
    }

    fn probe_via(&mut self, to: usize, seq: u64, out: &mut Vec<DetectEvent>) {
        for via in self.helpers(to) {
            out.push(DetectEvent::ProbeVia { to, via, seq });
        }
    }

    /// Up to `indirect` members other than `i` that are alive, taken in
    /// turn so that one bad helper does not answer for every probe.
    fn helpers(&mut self, i: usize) -> Vec<usize> {
        let n = self.members.len();
        let mut out = Vec::new();
        for k in 0..n {
            if out.len() == self.cfg.indirect {
                break;
            }
            let j = (self.helper + k) % n;
            if j != i && self.members[j].liveness == Liveness::Alive {
                out.push(j);
            }
        }
        self.helper = (self.helper + 1) % n.max(1);
        out
    }

    /// The earliest time [`poll`](Self::poll) has something to do.
    pub fn next_deadline(&self) -> Option<Nanos> {
        let cfg = self.cfg;
        self.members
            .iter()
            .flat_map(|m| {
                let waiting = match m.waiting {
                    Waiting::No => None,
                    Waiting::Direct(sent) => Some(sent + cfg.ack_timeout),
                    Waiting::Indirect(until) => Some(until),
                };
                let suspicion =
                    (m.liveness == Liveness::Suspect).then_some(m.since + cfg.suspicion);
                [Some(m.next_probe), waiting, suspicion]
            })
            .flatten()
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MS;

    /// Runs the detector to `until` in 1 ms steps; members in `dead` never
    /// answer, others answer every probe at once. The changes, with times.
    fn run(
        d: &mut Detector,
        from: Nanos,
        until: Nanos,
        dead: &[usize],
    ) -> Vec<(Nanos, usize, Liveness)> {
        let mut changes = Vec::new();
        let mut t = from;
        while t <= until {
            let mut out = Vec::new();
            d.poll(t, &mut out);
            let mut acks = Vec::new();
            for e in out {
                match e {
                    DetectEvent::Probe { to, seq } | DetectEvent::ProbeVia { to, seq, .. } => {
                        if !dead.contains(&to) {
                            acks.push((to, seq));
                        }
                    }
                    DetectEvent::Changed(i, l) => changes.push((t, i, l)),
                }
            }
            for (to, seq) in acks {
                let mut out = Vec::new();
                let _ = d.on_ack(to, seq, &mut out);
                for e in out {
                    if let DetectEvent::Changed(i, l) = e {
                        changes.push((t, i, l));
                    }
                }
            }
            t += MS;
        }
        changes
    }

    #[test]
    fn a_dead_member_is_suspect_then_failed_within_the_bound() {
        let cfg = DetectConfig::default();
        let mut d = Detector::new(4, cfg, 0);
        assert!(run(&mut d, 0, 1000 * MS, &[]).is_empty(), "all answer");
        // Member 2 dies at 1 s.
        let changes = run(&mut d, 1000 * MS, 3000 * MS, &[2]);
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert_eq!((changes[0].1, changes[0].2), (2, Liveness::Suspect));
        assert_eq!((changes[1].1, changes[1].2), (2, Liveness::Failed));
        assert!(
            changes[1].0 - 1000 * MS <= cfg.detection_bound(),
            "{changes:?}"
        );
        assert_eq!(changes[1].0 - changes[0].0, cfg.suspicion);
        // It comes back.
        let changes = run(&mut d, 3001 * MS, 3500 * MS, &[]);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].2, Liveness::Alive);
        assert!(changes[0].0 - 3001 * MS <= cfg.interval, "{changes:?}");
    }

    #[test]
    fn an_indirect_answer_keeps_a_member_alive() {
        let mut d = Detector::new(3, DetectConfig::default(), 0);
        // Member 1's direct probes are lost; answers through others arrive.
        let mut t = 0;
        while t < 5000 * MS {
            let mut out = Vec::new();
            d.poll(t, &mut out);
            for e in out {
                match e {
                    DetectEvent::ProbeVia { to, seq, via } => {
                        assert_ne!(via, to);
                        let mut o = Vec::new();
                        let _ = d.on_ack(to, seq, &mut o);
                        assert!(o.is_empty(), "{o:?}");
                    }
                    DetectEvent::Probe { to, seq } if to != 1 => {
                        let _ = d.on_ack(to, seq, &mut Vec::new());
                    }
                    DetectEvent::Changed(..) => panic!("{e:?} at {t}"),
                    _ => {}
                }
            }
            t += MS;
        }
    }

    #[test]
    fn a_suspect_that_answers_is_alive_again_and_never_failed() {
        let cfg = DetectConfig::default();
        let mut d = Detector::new(2, cfg, 0);
        let changes = run(&mut d, 0, 400 * MS, &[0]);
        assert_eq!(changes, [(300 * MS, 0, Liveness::Suspect)]);
        let changes = run(&mut d, 401 * MS, 2000 * MS, &[]);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].2, Liveness::Alive);
        assert!(changes[0].0 < 300 * MS + cfg.suspicion, "{changes:?}");
    }

    #[test]
    fn answers_to_probes_never_sent_count_for_nothing() {
        let mut d = Detector::new(2, DetectConfig::default(), 0);
        let _ = run(&mut d, 0, 500 * MS, &[]);
        let _ = run(&mut d, 501 * MS, 2000 * MS, &[1]);
        assert_eq!(d.liveness(1), Some(Liveness::Failed));
        let mut out = Vec::new();
        assert!(!d.on_ack(1, u64::MAX, &mut out));
        assert!(!d.on_ack(1, 0, &mut out));
        assert!(!d.on_ack(7, 1, &mut out));
        // Member 1's first probe was answered before it died: a replay of
        // that answer is not a new one.
        assert!(!d.on_ack(1, 1, &mut out));
        assert!(out.is_empty());
        assert_eq!(d.liveness(1), Some(Liveness::Failed));
        // A detector started past an old one's numbers takes none of its
        // answers, and knows nothing of a member until one comes.
        let mut d = Detector::new(2, DetectConfig::default(), 0).starting_at(1000);
        assert!(!d.known(0));
        assert!(!d.on_ack(0, 5, &mut out));
        d.poll(0, &mut out);
        assert!(d.on_ack(0, 1001, &mut out));
        assert!(d.known(0) && !d.known(1));
    }

    #[test]
    fn next_deadline_is_never_later_than_work_due() {
        let mut d = Detector::new(5, DetectConfig::default(), 0);
        let mut t = 0;
        for _ in 0..200 {
            let next = d.next_deadline().unwrap();
            assert!(next >= t || t == 0, "deadline {next} before now {t}");
            t = next;
            let mut out = Vec::new();
            d.poll(t, &mut out);
            assert!(
                !out.is_empty() || d.next_deadline().unwrap() > t,
                "idle at {t}"
            );
        }
    }
}
