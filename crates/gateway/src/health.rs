//! Dead-gateway detection: a heartbeat to every gateway each `interval`; a
//! gateway that leaves `misses` heartbeats in a row unanswered is down; one
//! that answers again is up. A chunk that went through a gateway and was
//! acknowledged answers its heartbeats too: a heartbeat queues behind the
//! chunks on its connection, and eight transfers at once over two 1 Gbit/s
//! links left them waiting past three intervals, so that gateways that
//! carried every chunk were taken out of use, 55 times in one run, and
//! hundreds of chunks sent again.
//!
//! A heartbeat waits behind whatever the gateway has queued, and a
//! transfer with no chunk of its own through a gateway for a while (its
//! last chunks went elsewhere) hears nothing else from it: a gateway is
//! taken down only once nothing has been heard from it for twice the
//! last round trip a chunk took through it, as well as after `misses`
//! heartbeats (eight transfers over four links still had live gateways
//! taken out of use 30 times in one run, their queues 0.5 s deep). A
//! gateway that dies with little queued is found as fast as before.

use crate::{Gw, Nanos};

/// Detection settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    /// Time between heartbeats to one gateway.
    pub interval: Nanos,
    /// Unanswered heartbeats in a row that make a gateway down.
    pub misses: u32,
}

impl Default for HealthConfig {
    /// 100 ms and 3 misses: a dead gateway is out of use within 0.4 s.
    fn default() -> Self {
        HealthConfig {
            interval: 100_000_000,
            misses: 3,
        }
    }
}

impl HealthConfig {
    /// Longest time from a gateway's death to its detection.
    pub fn detection_bound(&self) -> Nanos {
        self.interval * (u64::from(self.misses) + 1)
    }
}

/// What the driver must do or learn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthEvent {
    /// Send heartbeat `seq` to the gateway.
    Probe { gw: Gw, seq: u64 },
    /// The gateway stopped answering: take it out of every path.
    Down(Gw),
    /// The gateway answers again: take it back into use.
    Up(Gw),
}

#[derive(Clone, Debug)]
struct State {
    next_probe: Nanos,
    /// Sequence of the last heartbeat sent.
    sent: u64,
    /// Sequence of the last heartbeat answered.
    answered: u64,
    up: bool,
    /// When it was last heard from (an answer, or a chunk acknowledged),
    /// as the poll after it saw: `answered` then was `answered_seen`.
    heard_at: Nanos,
    answered_seen: u64,
    /// The last round trip of a chunk through it.
    trip: Nanos,
}

/// Heartbeat bookkeeping of one compute host for the gateways of a lane.
#[derive(Clone, Debug)]
pub struct Health {
    cfg: HealthConfig,
    gws: Vec<State>,
}

impl Health {
    /// `n` gateways, taken to be up, first probed at `now`.
    pub fn new(n: usize, cfg: HealthConfig, now: Nanos) -> Health {
        Health {
            cfg,
            gws: (0..n)
                .map(|_| State {
                    next_probe: now,
                    sent: 0,
                    answered: 0,
                    up: true,
                    heard_at: now,
                    answered_seen: 0,
                    trip: 0,
                })
                .collect(),
        }
    }

    /// The answer to heartbeat `seq` came from `gw`.
    pub fn on_reply(&mut self, gw: Gw, seq: u64, out: &mut Vec<HealthEvent>) {
        let Some(s) = self.gws.get_mut(gw) else {
            return;
        };
        if seq > s.sent || seq <= s.answered {
            return; // not ours, or old
        }
        s.answered = seq;
        if !s.up {
            s.up = true;
            out.push(HealthEvent::Up(gw));
        }
    }

    /// A chunk that went through `gw` was acknowledged: it forwards, so
    /// every heartbeat sent to it so far counts as answered. A gateway out
    /// of use stays so until it answers a heartbeat (the chunk may have
    /// passed it before it failed).
    pub fn heard(&mut self, gw: Gw) {
        if let Some(s) = self.gws.get_mut(gw).filter(|s| s.up) {
            s.answered = s.sent;
        }
    }

    /// A chunk sent through `gw` was acknowledged `rtt` after it went: a
    /// heartbeat to it waits about as long behind what it has queued.
    pub fn trip(&mut self, gw: Gw, rtt: Nanos) {
        if let Some(s) = self.gws.get_mut(gw) {
            s.trip = rtt;
        }
    }

    /// Heartbeats due at `now`, and gateways found down.
    pub fn poll(&mut self, now: Nanos, out: &mut Vec<HealthEvent>) {
        for (gw, s) in self.gws.iter_mut().enumerate() {
            if s.answered != s.answered_seen {
                s.answered_seen = s.answered;
                s.heard_at = now;
            }
            if now < s.next_probe {
                continue;
            }
            // Heartbeats sent whose answer time (one interval) has passed,
            // and silence longer than a chunk's trip through it twice.
            let unanswered = s.sent - s.answered;
            let silent = now.saturating_sub(s.heard_at) >= 2 * s.trip;
            if s.up && unanswered >= u64::from(self.cfg.misses) && silent {
                s.up = false;
                out.push(HealthEvent::Down(gw));
            }
            s.sent += 1;
            out.push(HealthEvent::Probe { gw, seq: s.sent });
            s.next_probe = now + self.cfg.interval;
        }
    }

    /// The driver saw `gw` fail (its connection broke): it is down until it
    /// answers a heartbeat again, which then raises `Up`.
    pub fn mark_down(&mut self, gw: Gw) {
        if let Some(s) = self.gws.get_mut(gw) {
            s.up = false;
            s.answered = s.sent;
        }
    }

    /// Whether `gw` is up.
    pub fn is_up(&self, gw: Gw) -> bool {
        self.gws.get(gw).is_some_and(|s| s.up)
    }

    /// When `poll` next has work.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.gws.iter().map(|s| s.next_probe).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    /// Runs heartbeats with a 1 ms answer delay; gateway `dead` stops
    /// answering at `dies` and starts again at `revives`.
    fn run(dead: Gw, dies: Nanos, revives: Nanos, until: Nanos) -> Vec<(Nanos, HealthEvent)> {
        let mut h = Health::new(3, HealthConfig::default(), 0);
        let mut log = Vec::new();
        let mut pending: Vec<(Nanos, Gw, u64)> = Vec::new();
        let mut now = 0;
        while now <= until {
            let mut out = Vec::new();
            for &(at, gw, seq) in pending.iter().filter(|p| p.0 == now) {
                let _ = at;
                h.on_reply(gw, seq, &mut out);
            }
            pending.retain(|p| p.0 != now);
            h.poll(now, &mut out);
            for e in out {
                if let HealthEvent::Probe { gw, seq } = e {
                    let answers = gw != dead || now < dies || now >= revives;
                    if answers {
                        pending.push((now + MS, gw, seq));
                    }
                } else {
                    log.push((now, e));
                }
            }
            now += MS;
        }
        log
    }

    #[test]
    fn a_dead_gateway_is_found_within_the_bound_and_taken_back() {
        let cfg = HealthConfig::default();
        let dies = 1234 * MS;
        let log = run(1, dies, 3000 * MS, 4000 * MS);
        assert_eq!(log.len(), 2, "{log:?}");
        let (t_down, e) = log[0];
        assert_eq!(e, HealthEvent::Down(1));
        assert!(
            t_down > dies && t_down - dies <= cfg.detection_bound(),
            "{}",
            (t_down - dies) / MS
        );
        assert!(t_down - dies >= cfg.interval * u64::from(cfg.misses - 1));
        let (t_up, e) = log[1];
        assert_eq!(e, HealthEvent::Up(1));
        assert!(t_up >= 3000 * MS && t_up - 3000 * MS <= cfg.interval + MS);
    }

    #[test]
    fn healthy_gateways_raise_nothing() {
        assert!(run(9, 0, 0, 5000 * MS).is_empty());
    }

    #[test]
    fn a_gateway_marked_down_comes_up_on_its_next_answer() {
        let mut h = Health::new(2, HealthConfig::default(), 0);
        let mut out = Vec::new();
        h.poll(0, &mut out);
        h.mark_down(1);
        assert!(!h.is_up(1));
        out.clear();
        h.on_reply(1, 1, &mut out);
        assert!(
            out.is_empty(),
            "an answer sent before the failure does not count"
        );
        h.poll(100_000_000, &mut out);
        out.clear();
        h.on_reply(1, 2, &mut out);
        assert_eq!(out, [HealthEvent::Up(1)]);
    }

    /// Heartbeats that wait behind chunks, answered only after 5 intervals,
    /// while chunks through the gateway are acknowledged every 10 ms: up
    /// throughout. Without the acknowledgements: down.
    #[test]
    fn acknowledged_chunks_keep_a_gateway_with_slow_answers_up() {
        for acks in [true, false] {
            let cfg = HealthConfig::default();
            let mut h = Health::new(1, cfg, 0);
            let mut pending = Vec::new();
            let mut downs = 0;
            for now in (0..3000).map(|t| t * MS) {
                let mut out = Vec::new();
                for &(_, seq) in pending.iter().filter(|p: &&(Nanos, u64)| p.0 == now) {
                    h.on_reply(0, seq, &mut out);
                }
                pending.retain(|p| p.0 != now);
                if acks && now % (10 * MS) == 0 {
                    h.heard(0);
                }
                h.poll(now, &mut out);
                for e in out {
                    match e {
                        HealthEvent::Probe { seq, .. } => {
                            pending.push((now + 5 * cfg.interval, seq))
                        }
                        HealthEvent::Down(_) => downs += 1,
                        HealthEvent::Up(_) => {}
                    }
                }
            }
            assert_eq!(downs == 0, acks, "acks: {acks}, downs: {downs}");
        }
    }

    /// Heartbeats that wait behind 600 ms of queued chunks: a transfer
    /// that hears nothing else from the gateway keeps it up while its
    /// chunks' last trip says the queue is that deep, takes it down once
    /// twice that has passed in silence, and without a trip as before.
    #[test]
    fn a_deep_queue_holds_answers_back_without_taking_a_gateway_down() {
        let cfg = HealthConfig::default();
        let queued = 600 * MS;
        let first_down = |trip: Option<Nanos>, answers: bool| {
            let mut h = Health::new(1, cfg, 0);
            if let Some(t) = trip {
                h.trip(0, t);
            }
            let mut pending = Vec::new();
            for now in (0..5000).map(|t| t * MS) {
                let mut out = Vec::new();
                for &(_, seq) in pending.iter().filter(|p: &&(Nanos, u64)| p.0 == now) {
                    h.on_reply(0, seq, &mut out);
                }
                pending.retain(|p| p.0 != now);
                h.poll(now, &mut out);
                for e in out {
                    match e {
                        HealthEvent::Probe { seq, .. } if answers => {
                            pending.push((now + queued, seq))
                        }
                        HealthEvent::Down(_) => return Some(now),
                        _ => {}
                    }
                }
            }
            None
        };
        assert_eq!(first_down(Some(queued), true), None, "answers 600 ms late");
        assert!(first_down(None, true).is_some(), "without a trip: down");
        let silent = first_down(Some(queued), false).expect("a gateway that never answers");
        assert!(
            silent >= 2 * queued && silent <= 2 * queued + cfg.interval,
            "{silent}"
        );
        let quick = first_down(Some(20 * MS), false).unwrap();
        assert!(quick <= cfg.detection_bound(), "{quick}");
    }

    #[test]
    fn an_acknowledged_chunk_does_not_bring_a_gateway_back() {
        let mut h = Health::new(1, HealthConfig::default(), 0);
        let mut out = Vec::new();
        h.poll(0, &mut out);
        h.mark_down(0);
        h.heard(0);
        assert!(!h.is_up(0));
        h.poll(100_000_000, &mut out);
        out.clear();
        h.on_reply(0, 2, &mut out);
        assert_eq!(out, [HealthEvent::Up(0)]);
    }

    #[test]
    fn stale_and_foreign_answers_are_ignored() {
        let mut h = Health::new(1, HealthConfig::default(), 0);
        let mut out = Vec::new();
        h.on_reply(0, 7, &mut out);
        h.on_reply(5, 1, &mut out);
        assert!(out.is_empty());
        assert_eq!(h.next_deadline(), Some(0));
        assert!(h.is_up(0));
    }
}
