//! The failure detector of a group of eight hosts and its manager on
//! `macrolink-simnet`: a virtual clock, 100 µs links, seeded loss. Hosts
//! answer probes, and probe on the manager's behalf when it asks.

use macrolink_manage::detect::{DetectConfig, DetectEvent, Detector, Liveness};
use macrolink_manage::{Nanos, MS, SEC};
use macrolink_simnet::{LinkId, LinkSpec, Net, NodeId, US};
use std::collections::HashMap;

#[derive(Clone, Copy, Debug)]
enum Msg {
    /// Probe `seq` of member `member`; answer to `reply`.
    Ping {
        member: usize,
        seq: u64,
        reply: usize,
    },
    /// Probe member `member` with `seq` for the manager.
    PingReq { member: usize, seq: u64 },
    /// Member `member` answers `seq`.
    Ack { member: usize, seq: u64 },
}

/// Node 0 is the manager; node i + 1 is member i.
struct Group {
    net: Net<Msg>,
    links: HashMap<(usize, usize), LinkId>,
    det: Detector,
    changes: Vec<(Nanos, usize, Liveness)>,
}

impl Group {
    fn new(n: usize, loss: f64, seed: u64) -> Group {
        let mut net = Net::new(seed);
        let nodes: Vec<NodeId> = (0..=n).map(|_| net.add_node()).collect();
        let mut links = HashMap::new();
        for a in 0..=n {
            for b in 0..=n {
                if a != b {
                    let l = net.add_link(nodes[a], nodes[b], LinkSpec::new(100 * US).loss(loss));
                    links.insert((a, b), l);
                }
            }
        }
        Group {
            net,
            links,
            det: Detector::new(n, DetectConfig::default(), 0),
            changes: Vec::new(),
        }
    }

    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        self.net.send(self.links[&(from, to)], 64, msg);
    }

    /// Runs the group until `until`.
    fn run(&mut self, until: Nanos) {
        loop {
            let now = self.net.now();
            while let Some(d) = self.net.poll() {
                let (me, from) = (d.to.0, d.from.0);
                match d.msg {
                    Msg::Ping { member, seq, reply } => {
                        self.send(me, reply, Msg::Ack { member, seq });
                    }
                    Msg::PingReq { member, seq } => {
                        self.send(
                            me,
                            member + 1,
                            Msg::Ping {
                                member,
                                seq,
                                reply: me,
                            },
                        );
                    }
                    // A helper passes the answer on to the manager.
                    Msg::Ack { member, seq } if me != 0 => {
                        self.send(me, 0, Msg::Ack { member, seq });
                    }
                    Msg::Ack { member, seq } => {
                        let _ = from;
                        let mut out = Vec::new();
                        self.det.on_ack(member, seq, &mut out);
                        self.note(now, out);
                    }
                }
            }
            let mut out = Vec::new();
            self.det.poll(now, &mut out);
            for e in out.iter().copied() {
                match e {
                    DetectEvent::Probe { to, seq } => self.send(
                        0,
                        to + 1,
                        Msg::Ping {
                            member: to,
                            seq,
                            reply: 0,
                        },
                    ),
                    DetectEvent::ProbeVia { to, via, seq } => {
                        self.send(0, via + 1, Msg::PingReq { member: to, seq })
                    }
                    DetectEvent::Changed(..) => {}
                }
            }
            self.note(now, out);
            if now >= until {
                return;
            }
            let next = [self.net.next_event(), self.det.next_deadline()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(until)
                .clamp(now + 1, until);
            self.net.advance_to(next);
        }
    }

    fn note(&mut self, now: Nanos, out: Vec<DetectEvent>) {
        for e in out {
            if let DetectEvent::Changed(i, l) = e {
                self.changes.push((now, i, l));
            }
        }
    }
}

#[test]
fn five_percent_loss_for_ten_minutes_fails_nobody() {
    let mut g = Group::new(8, 0.05, 7);
    g.run(600 * SEC);
    let failed: Vec<_> = g
        .changes
        .iter()
        .filter(|c| c.2 == Liveness::Failed)
        .collect();
    let suspected = g
        .changes
        .iter()
        .filter(|c| c.2 == Liveness::Suspect)
        .count();
    eprintln!(
        "10 min, 8 hosts, 5 % loss: {suspected} suspicions, {} failures",
        failed.len()
    );
    assert!(failed.is_empty(), "false failures: {failed:?}");
}

#[test]
fn a_host_cut_off_from_the_manager_alone_is_not_failed() {
    let mut g = Group::new(8, 0.0, 3);
    let (m, h) = (NodeId(0), NodeId(4));
    g.net.partition(m, h, SEC, 30 * SEC);
    g.run(40 * SEC);
    assert!(
        g.changes.iter().all(|c| c.2 != Liveness::Failed),
        "{:?}",
        g.changes
    );
}

#[test]
fn killed_hosts_are_failed_within_the_bound_over_fifty_trials() {
    let cfg = DetectConfig::default();
    let mut times = Vec::new();
    for trial in 0..50u64 {
        let mut g = Group::new(8, 0.01, trial);
        let victim = (trial % 8) as usize;
        // Killed at a time that falls anywhere in the probe cycle.
        let at = 2 * SEC + trial * 7 * MS;
        g.net.kill(NodeId(victim + 1), at);
        g.run(at + 3 * SEC);
        let failed: Vec<_> = g
            .changes
            .iter()
            .filter(|c| c.2 == Liveness::Failed)
            .collect();
        assert_eq!(failed.len(), 1, "trial {trial}: {:?}", g.changes);
        assert_eq!(failed[0].1, victim);
        times.push(failed[0].0 - at);
    }
    times.sort_unstable();
    let (median, max) = (times[times.len() / 2], times[times.len() - 1]);
    eprintln!(
        "detection of a killed host over 50 trials: median {} ms, max {} ms (bound {} ms)",
        median / MS,
        max / MS,
        cfg.detection_bound() / MS
    );
    // The bound plus the links' delays.
    assert!(max <= cfg.detection_bound() + MS, "{times:?}");
}
