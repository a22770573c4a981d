//! One side (manager or fallback) of one group's local management: the
//! lease with the other side, and, while this side manages, the failure
//! detector over the group's hosts and the reports to the central manager.

use macrolink_manage::detect::{DetectConfig, DetectEvent, Detector, Liveness};
use macrolink_manage::lease::{Lease, LeaseConfig, LeaseEvent};
use macrolink_manage::Nanos;
use macrolink_wire::manage::{Body, Health, Message, Seen};

/// A message to send, encoded, and the node it goes to.
pub type Send = (u32, Vec<u8>);

/// `body` from node `me` to node `to`, encoded; nothing (and a warning)
/// when a text is over its limit.
pub fn send(me: u32, to: u32, body: Body<'_>, out: &mut Vec<Send>) {
    match (Message { from: me, body }).encode() {
        Some(b) => out.push((to, b)),
        None => tracing::warn!("a message to node {to} is over a limit; not sent"),
    }
}

/// A report as sent, to tell a change from a repeat.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Said {
    seen: Seen,
    text: String,
}

/// One group's local management on this host.
#[derive(Debug)]
pub struct Local {
    /// This host's node id.
    me: u32,
    /// Group index in the cluster file.
    pub group: u16,
    name: String,
    /// The group's hosts (node ids).
    members: Vec<u32>,
    /// The other side of the lease.
    other: u32,
    central: u32,
    detect: DetectConfig,
    detector: Option<Detector>,
    lease: Lease,
    /// Newest beat heard: (epoch, number).
    heard: (u64, u64),
    beats: u64,
    reports: u64,
    /// What each member's agent last said of its health.
    health: Vec<(Health, String)>,
    said: Vec<Option<Said>>,
    next_full: Nanos,
}

/// Wall-clock nanoseconds: where beat, report and probe numbers start, so
/// that a restarted station's numbers are past every one it used before
/// (and old messages replayed count for nothing).
fn numbers_from() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// Time between full reports of every host (a central manager that
/// restarted learns the whole group within it).
const FULL_REPORT: Nanos = 1_000_000_000;

impl Local {
    /// Group `group` (`name`, `members`) as node `me` runs it, with
    /// `other` the other side of the lease and `central` the central
    /// manager; `preferred` on the file's manager.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        me: u32,
        group: u16,
        name: String,
        members: Vec<u32>,
        other: u32,
        central: u32,
        preferred: bool,
        detect: DetectConfig,
        lease: LeaseConfig,
        now: Nanos,
    ) -> Local {
        let n = members.len();
        Local {
            me,
            group,
            name,
            members,
            other,
            central,
            detect,
            detector: None,
            lease: Lease::new(lease, preferred, now),
            heard: (0, 0),
            beats: numbers_from(),
            reports: numbers_from(),
            health: vec![(Health::NotChecked, String::new()); n],
            said: vec![None; n],
            next_full: now,
        }
    }

    /// The epoch this side acts with, when it manages.
    pub fn acting(&self) -> Option<u64> {
        self.lease.acting()
    }

    /// A beat from the other side that reached this host at `came` and is
    /// read at `now` (silence is judged by when beats came); a replayed or
    /// older one changes nothing.
    pub fn on_beat(&mut self, epoch: u64, n: u64, came: Nanos, now: Nanos) {
        if (epoch, n) <= self.heard {
            return;
        }
        self.heard = (epoch, n);
        let mut ev = Vec::new();
        self.lease.on_beat(epoch, came, &mut ev);
        self.lease_events(ev, now);
    }

    /// Datagrams were dropped unread at `now`: the other side's silence
    /// before is not counted (up to one patience after its last word).
    pub fn excuse(&mut self, now: Nanos) {
        self.lease.excuse(now);
    }

    /// The central manager refused a report (read at `now`; it errs
    /// toward waiting longer): epoch `epoch` is held by
    /// node `holder`. A refusal that names this side (an old report of its
    /// own, replayed or late) changes nothing.
    pub fn on_refused(&mut self, epoch: u64, holder: u32, now: Nanos) {
        if holder == self.me {
            return;
        }
        let mut ev = Vec::new();
        self.lease.on_refused(epoch, now, &mut ev);
        self.lease_events(ev, now);
    }

    /// Member `member` answered probe `seq`, with its health.
    pub fn on_ack(&mut self, member: u32, seq: u64, health: Health, text: &str) -> Vec<Send> {
        let mut out = Vec::new();
        let Some(i) = self.members.iter().position(|&m| m == member) else {
            return out;
        };
        let Some(d) = &mut self.detector else {
            return out;
        };
        let mut ev = Vec::new();
        // Only a fresh answer says anything of the host's health.
        if !d.on_ack(i, seq, &mut ev) {
            return out;
        }
        self.health[i] = (health, text.to_string());
        self.report_changes(false, &mut out);
        out
    }

    /// Everything due by `now`: beats, probes, reports.
    pub fn poll(&mut self, now: Nanos) -> Vec<Send> {
        let me = self.me;
        let mut out = Vec::new();
        let mut ev = Vec::new();
        self.lease.poll(now, &mut ev);
        for e in &ev {
            if let LeaseEvent::Beat { epoch } = *e {
                self.beats += 1;
                let n = self.beats;
                let beat = Body::Beat {
                    group: self.group,
                    epoch,
                    n,
                };
                send(me, self.other, beat, &mut out);
                // And to the central manager, which keeps a manager it
                // hears in place (see `EpochGate::check_at`).
                send(me, self.central, beat, &mut out);
            }
        }
        self.lease_events(ev, now);
        let Some(d) = &mut self.detector else {
            return out;
        };
        let mut ev = Vec::new();
        d.poll(now, &mut ev);
        for e in ev {
            match e {
                DetectEvent::Probe { to, seq } => {
                    send(
                        me,
                        self.members[to],
                        Body::Ping { seq, origin: me },
                        &mut out,
                    );
                }
                DetectEvent::ProbeVia { to, via, seq } => {
                    let member = self.members[to];
                    send(
                        me,
                        self.members[via],
                        Body::PingReq { seq, member },
                        &mut out,
                    );
                }
                DetectEvent::Changed(..) => {}
            }
        }
        let full = now >= self.next_full;
        if full {
            self.next_full = now + FULL_REPORT;
        }
        self.report_changes(full, &mut out);
        out
    }

    /// The earliest time [`poll`](Self::poll) has something to do.
    pub fn next_deadline(&self) -> Nanos {
        let lease = self.lease.next_deadline();
        match &self.detector {
            Some(d) => d
                .next_deadline()
                .map_or(lease, |t| t.min(lease))
                .min(self.next_full),
            None => lease,
        }
    }

    fn lease_events(&mut self, ev: Vec<LeaseEvent>, now: Nanos) {
        for e in ev {
            match e {
                LeaseEvent::TookOver { epoch } => {
                    tracing::info!("{}: managing, epoch {epoch}", self.name);
                    // A fresh view: what this side knew before is old.
                    let n = self.members.len();
                    let d = Detector::new(n, self.detect, now).starting_at(numbers_from());
                    self.detector = Some(d);
                    self.said = vec![None; n];
                    self.health = vec![(Health::NotChecked, String::new()); n];
                    self.next_full = now;
                }
                LeaseEvent::SteppedDown { epoch } => {
                    tracing::info!(
                        "{}: epoch {epoch} is held elsewhere; the fallback now",
                        self.name
                    );
                    self.detector = None;
                }
                LeaseEvent::Beat { .. } => {}
            }
        }
    }

    /// Reports to the central manager what changed (or, `full`, all).
    fn report_changes(&mut self, full: bool, out: &mut Vec<Send>) {
        let (Some(epoch), Some(d)) = (self.lease.acting(), &self.detector) else {
            return;
        };
        for i in 0..self.members.len() {
            // Nothing to say of a host this side has not heard from yet.
            if !d.known(i) {
                continue;
            }
            let now_said = match d.liveness(i) {
                Some(Liveness::Alive) | None => match &self.health[i] {
                    (Health::Unhealthy, t) => Said {
                        seen: Seen::Unhealthy,
                        text: t.clone(),
                    },
                    (Health::Unknown, t) => Said {
                        seen: Seen::Unknown,
                        text: t.clone(),
                    },
                    _ => Said {
                        seen: Seen::Alive,
                        text: String::new(),
                    },
                },
                Some(Liveness::Suspect) => Said {
                    seen: Seen::Suspect,
                    text: String::new(),
                },
                Some(Liveness::Failed) => Said {
                    seen: Seen::Failed,
                    text: String::new(),
                },
            };
            if !full && self.said[i].as_ref() == Some(&now_said) {
                continue;
            }
            self.reports += 1;
            let report = Body::Report {
                group: self.group,
                epoch,
                n: self.reports,
                host: self.members[i],
                seen: now_said.seen,
                text: &now_said.text,
            };
            send(self.me, self.central, report, out);
            self.said[i] = Some(now_said);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use macrolink_manage::{MS, SEC};

    /// Node 1, the preferred side of group 0 (hosts 1..3, fallback 2,
    /// central 9), managing once it has polled at the lease's end.
    fn managing() -> Local {
        let lease = LeaseConfig::default();
        let mut l = Local::new(
            1,
            0,
            "m0".into(),
            vec![1, 2, 3],
            2,
            9,
            true,
            DetectConfig::default(),
            lease,
            0,
        );
        let out = l.poll(lease.lease);
        let reports = out
            .iter()
            .filter(|(to, m)| {
                *to == 9
                    && matches!(
                        macrolink_wire::manage::Message::decode(m).map(|m| m.body),
                        Ok(Body::Report { .. })
                    )
            })
            .count();
        let beats = out.iter().filter(|(to, _)| *to == 9).count() - reports;
        assert_eq!(beats, 1, "the manager beats to the central manager too");
        assert_eq!(reports, 0, "nothing known yet: no report");
        l
    }

    #[test]
    fn a_refusal_naming_this_side_is_a_replay_and_changes_nothing() {
        let mut l = managing();
        let epoch = l.acting().expect("manages");
        l.on_refused(epoch, 1, SEC);
        assert_eq!(l.acting(), Some(epoch), "its own old report, replayed");
        l.on_refused(epoch, 2, SEC + MS);
        assert_eq!(l.acting(), None, "the same epoch held by the other side");
    }
}
