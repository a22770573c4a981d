//! The central manager's decisions. Local managers report what they see of
//! each host; the policy keeps every host's state and decides: a failed
//! host is first **reset**; one that fails again soon after its reset, or
//! does not come back in time, is **excluded** until an operator includes
//! it again. Resets and exclusions are rate-limited, and when more than a
//! set share of a group goes dark at once nothing is done at all: that is
//! the network or the manager, not the hosts. A health check that itself
//! failed says nothing about the host and never leads to an action.
//!
//! ```text
//!  Healthy ─suspect─► Suspect ─failed or unhealthy─► Failed ──reset──► Resetting ─alive─► Healthy
//!     ▲                  │alive                        │ again within `again_within`,      │
//!     └──────────────────┘                             │ or not back within `come_back`    │
//!                                                      └────────────► Excluded ◄───────────┘
//!  operator: reset, exclude, include (Excluded ─include─► Healthy)
//! ```
//!
//! Every change is a [`Decision`] with its reason, for the log; the whole
//! state serializes, for the state file. Time is the caller's: the central
//! manager passes wall-clock nanoseconds, so that a state file read back
//! after a restart keeps its meaning.

use crate::Nanos;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Actions kept per host (the latest; the decision log has them all).
pub const MAX_ACTIONS: usize = 16;

/// Policy settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyConfig {
    /// A reset host must answer again within this.
    pub come_back: Nanos,
    /// A host that fails again within this of its reset is excluded.
    pub again_within: Nanos,
    /// Most resets, cluster-wide, in one `rate_window`.
    pub resets_per_window: u32,
    /// Most exclusions, cluster-wide, in one `rate_window`.
    pub exclusions_per_window: u32,
    /// The window of the rate limits.
    pub rate_window: Nanos,
    /// More than this share of a group dark at once: no action in it.
    pub dark_share: f64,
}

impl Default for PolicyConfig {
    /// Back within 120 s of a reset; excluded when failing again within
    /// 10 min; at most 4 resets and 2 exclusions a minute; no action in a
    /// group with more than half its hosts dark.
    fn default() -> Self {
        PolicyConfig {
            come_back: 120 * crate::SEC,
            again_within: 600 * crate::SEC,
            resets_per_window: 4,
            exclusions_per_window: 2,
            rate_window: 60 * crate::SEC,
            dark_share: 0.5,
        }
    }
}

/// What the central manager holds a host to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostState {
    /// Answers, and its health check passes.
    Healthy,
    /// Its manager suspects it.
    Suspect,
    /// Failed (no answer, or an unhealthy check); awaiting an action.
    Failed,
    /// Reset; awaiting its return.
    Resetting,
    /// Out of use until an operator includes it.
    Excluded,
}

impl HostState {
    /// Dark: not to be counted on now.
    fn dark(self) -> bool {
        matches!(
            self,
            HostState::Suspect | HostState::Failed | HostState::Resetting
        )
    }
}

/// What a local manager saw of a host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Observed {
    /// It answers and its check passes.
    Alive,
    /// It stopped answering for a while.
    Suspect,
    /// It stopped answering for the whole suspicion time.
    Failed,
    /// It answers, but its health check says it is unhealthy, and why.
    Unhealthy(String),
    /// The health check itself failed (crashed, timed out): nothing is
    /// known of the host from it.
    Unknown(String),
}

/// What the central manager does to a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Run the host's reset command.
    Reset,
    /// Take it out of use and run the exclude command.
    Exclude,
    /// Take it back into use and run the include command.
    Include,
}

/// An operator's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Reset now.
    Reset,
    /// Exclude now.
    Exclude,
    /// Include again.
    Include,
}

/// One change of a host's state, or one action, with its reason: a line
/// of the decision log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// When (the caller's clock).
    pub at: Nanos,
    /// The host.
    pub host: String,
    /// Its state after the decision.
    pub state: HostState,
    /// What to do, if anything.
    pub action: Option<Action>,
    /// Why.
    pub reason: String,
}

/// What the policy keeps of one host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    /// Its group.
    pub group: String,
    /// Its state.
    pub state: HostState,
    /// Since when.
    pub since: Nanos,
    /// When it was last reset.
    pub last_reset: Option<Nanos>,
    /// The last health check's words (or why it could not say).
    pub health: Option<String>,
    /// Why the last decision about it, or why none was taken yet.
    pub reason: String,
    /// The latest actions taken on it (at most [`MAX_ACTIONS`]).
    pub actions: Vec<(Nanos, Action)>,
}

/// Everything the policy keeps: what the state file holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyState {
    /// Hosts by name.
    pub hosts: BTreeMap<String, HostRecord>,
    /// Times of recent resets, for the rate limit.
    pub resets: VecDeque<Nanos>,
    /// Times of recent exclusions, for the rate limit.
    pub exclusions: VecDeque<Nanos>,
}

/// The central manager's decisions.
#[derive(Clone, Debug)]
pub struct Policy {
    cfg: PolicyConfig,
    state: PolicyState,
}

impl Policy {
    /// A policy for `groups` (name, hosts), every host healthy at `now`;
    /// or, with `state` (read back from the state file), as it was, with
    /// hosts new to the file added and hosts gone from it dropped.
    pub fn new(
        cfg: PolicyConfig,
        groups: &[(String, Vec<String>)],
        state: Option<PolicyState>,
        now: Nanos,
    ) -> Policy {
        let mut old = state.unwrap_or_default();
        let mut hosts = BTreeMap::new();
        for (g, members) in groups {
            for h in members {
                let r = old.hosts.remove(h).unwrap_or_else(|| HostRecord {
                    group: g.clone(),
                    state: HostState::Healthy,
                    since: now,
                    last_reset: None,
                    health: None,
                    reason: "new".into(),
                    actions: Vec::new(),
                });
                hosts.insert(
                    h.clone(),
                    HostRecord {
                        group: g.clone(),
                        ..r
                    },
                );
            }
        }
        Policy {
            cfg,
            state: PolicyState { hosts, ..old },
        }
    }

    /// Everything kept, for the state file and the status view.
    pub fn state(&self) -> &PolicyState {
        &self.state
    }

    /// The record of host `h`.
    pub fn host(&self, h: &str) -> Option<&HostRecord> {
        self.state.hosts.get(h)
    }

    /// A local manager saw `seen` of host `h`.
    pub fn observe(&mut self, h: &str, seen: Observed, now: Nanos) -> Vec<Decision> {
        let mut out = Vec::new();
        let Some(r) = self.state.hosts.get_mut(h) else {
            return out;
        };
        let (state, health) = (r.state, r.health.clone());
        match seen {
            Observed::Unknown(why) => {
                let words = format!("the health check itself failed: {why}");
                if health.as_deref() != Some(words.as_str()) {
                    r.health = Some(words.clone());
                    let reason = format!("{words}; the host is not judged by it");
                    out.push(self.set(h, state, None, reason, now));
                }
            }
            Observed::Alive => {
                r.health = None;
                let reason = match state {
                    HostState::Suspect | HostState::Failed => "answers again",
                    HostState::Resetting => "came back after its reset",
                    HostState::Healthy | HostState::Excluded => return out,
                };
                out.push(self.set(h, HostState::Healthy, None, reason.into(), now));
            }
            Observed::Suspect if state == HostState::Healthy => {
                let reason = "its manager suspects it".to_string();
                out.push(self.set(h, HostState::Suspect, None, reason, now));
            }
            Observed::Suspect => {}
            Observed::Failed | Observed::Unhealthy(_)
                if matches!(state, HostState::Healthy | HostState::Suspect) =>
            {
                let reason = match &seen {
                    Observed::Unhealthy(why) => {
                        r.health = Some(why.clone());
                        format!("unhealthy: {why}")
                    }
                    _ => "no answer, directly or through other hosts".into(),
                };
                out.push(self.set(h, HostState::Failed, None, reason, now));
                self.decide(h, now, &mut out);
            }
            Observed::Failed | Observed::Unhealthy(_) => {}
        }
        out
    }

    /// Decisions that fall due by `now`: resets not followed by a return,
    /// and failed hosts whose action waited (rate limit, a dark group).
    pub fn tick(&mut self, now: Nanos) -> Vec<Decision> {
        let mut out = Vec::new();
        let due: Vec<(String, HostState, Nanos)> = self
            .state
            .hosts
            .iter()
            .map(|(h, r)| (h.clone(), r.state, r.since))
            .collect();
        for (h, state, since) in due {
            match state {
                HostState::Resetting if now >= since + self.cfg.come_back => {
                    let why = format!(
                        "not back within {} s of its reset",
                        self.cfg.come_back / crate::SEC
                    );
                    self.exclude(&h, why, now, &mut out);
                }
                HostState::Failed => self.decide(&h, now, &mut out),
                _ => {}
            }
        }
        out
    }

    /// An operator's order about host `h`.
    pub fn order(&mut self, h: &str, order: Order, reason: &str, now: Nanos) -> Vec<Decision> {
        let mut out = Vec::new();
        if !self.state.hosts.contains_key(h) {
            return out;
        }
        let reason = format!("operator: {reason}");
        match order {
            Order::Reset => {
                self.state.resets.push_back(now);
                if let Some(r) = self.state.hosts.get_mut(h) {
                    r.last_reset = Some(now);
                }
                out.push(self.set(h, HostState::Resetting, Some(Action::Reset), reason, now));
            }
            Order::Exclude => {
                self.state.exclusions.push_back(now);
                out.push(self.set(h, HostState::Excluded, Some(Action::Exclude), reason, now));
            }
            // Included: fixed, by the operator's word; its past resets
            // no longer count against it.
            Order::Include => {
                if let Some(r) = self.state.hosts.get_mut(h) {
                    r.last_reset = None;
                }
                out.push(self.set(h, HostState::Healthy, Some(Action::Include), reason, now));
            }
        }
        out
    }

    /// What to do about failed host `h`.
    fn decide(&mut self, h: &str, now: Nanos, out: &mut Vec<Decision>) {
        let Some(r) = self.state.hosts.get(h) else {
            return;
        };
        let group = r.group.clone();
        let members: Vec<HostState> = self
            .state
            .hosts
            .values()
            .filter(|o| o.group == group)
            .map(|o| o.state)
            .collect();
        let dark = members.iter().filter(|s| s.dark()).count();
        if dark >= 2 && dark as f64 > self.cfg.dark_share * members.len() as f64 {
            let why = format!(
                "{dark} of {} hosts of {group} dark at once: the network or the manager, \
                 not the hosts; no action",
                members.len()
            );
            self.wait(h, why, now, out);
            return;
        }
        match r.last_reset {
            Some(t) if now < t + self.cfg.again_within => {
                let why = format!(
                    "failed again {:.1} s after its reset",
                    now.saturating_sub(t) as f64 / crate::SEC as f64
                );
                self.exclude(h, why, now, out);
            }
            _ => {
                if !allowed(
                    &mut self.state.resets,
                    self.cfg.resets_per_window,
                    self.cfg.rate_window,
                    now,
                ) {
                    let why = format!(
                        "reset waits: {} resets in {} s already",
                        self.cfg.resets_per_window,
                        self.cfg.rate_window / crate::SEC
                    );
                    self.wait(h, why, now, out);
                    return;
                }
                self.state.resets.push_back(now);
                if let Some(r) = self.state.hosts.get_mut(h) {
                    r.last_reset = Some(now);
                }
                let why = "failed: reset".to_string();
                out.push(self.set(h, HostState::Resetting, Some(Action::Reset), why, now));
            }
        }
    }

    fn exclude(&mut self, h: &str, why: String, now: Nanos, out: &mut Vec<Decision>) {
        let (limit, window) = (self.cfg.exclusions_per_window, self.cfg.rate_window);
        if !allowed(&mut self.state.exclusions, limit, window, now) {
            let why = format!(
                "{why}; exclusion waits: {limit} in {} s already",
                window / crate::SEC
            );
            self.wait(h, why, now, out);
            return;
        }
        self.state.exclusions.push_back(now);
        out.push(self.set(h, HostState::Excluded, Some(Action::Exclude), why, now));
    }

    /// No action yet: said once, not at every tick.
    fn wait(&mut self, h: &str, why: String, now: Nanos, out: &mut Vec<Decision>) {
        let Some(r) = self.state.hosts.get(h) else {
            return;
        };
        if r.reason != why {
            let state = r.state;
            out.push(self.set(h, state, None, why, now));
        }
    }

    fn set(
        &mut self,
        h: &str,
        state: HostState,
        action: Option<Action>,
        reason: String,
        now: Nanos,
    ) -> Decision {
        if let Some(r) = self.state.hosts.get_mut(h) {
            if r.state != state {
                r.since = now;
            }
            r.state = state;
            r.reason = reason.clone();
            if let Some(a) = action {
                if r.actions.len() == MAX_ACTIONS {
                    r.actions.remove(0);
                }
                r.actions.push((now, a));
            }
        }
        Decision {
            at: now,
            host: h.to_string(),
            state,
            action,
            reason,
        }
    }
}

/// Whether one more event fits in the rate limit; forgets events older
/// than the window.
fn allowed(times: &mut VecDeque<Nanos>, limit: u32, window: Nanos, now: Nanos) -> bool {
    while times.front().is_some_and(|&t| t + window <= now) {
        times.pop_front();
    }
    times.len() < limit as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SEC;

    fn groups() -> Vec<(String, Vec<String>)> {
        let g = |name: &str, n: usize| {
            (
                name.to_string(),
                (0..n).map(|i| format!("{name}-{i}")).collect(),
            )
        };
        vec![g("a", 8), g("b", 8)]
    }

    fn actions(d: &[Decision]) -> Vec<(String, Option<Action>)> {
        d.iter().map(|d| (d.host.clone(), d.action)).collect()
    }

    #[test]
    fn a_failed_host_is_reset_then_excluded_when_it_fails_again() {
        let mut p = Policy::new(PolicyConfig::default(), &groups(), None, 0);
        let d = p.observe("a-1", Observed::Failed, SEC);
        assert_eq!(
            actions(&d),
            [("a-1".into(), None), ("a-1".into(), Some(Action::Reset))]
        );
        assert_eq!(p.host("a-1").unwrap().state, HostState::Resetting);
        let d = p.observe("a-1", Observed::Alive, 30 * SEC);
        assert_eq!(d[0].state, HostState::Healthy);
        assert_eq!(d[0].reason, "came back after its reset");
        let d = p.observe("a-1", Observed::Failed, 90 * SEC);
        assert_eq!(d.last().unwrap().action, Some(Action::Exclude));
        assert!(
            d.last().unwrap().reason.contains("failed again 89.0 s"),
            "{d:?}"
        );
        // Excluded stays so, whatever its manager says, until included.
        assert!(p.observe("a-1", Observed::Alive, 100 * SEC).is_empty());
        let d = p.order("a-1", Order::Include, "fixed", 200 * SEC);
        assert_eq!(d[0].state, HostState::Healthy);
        assert_eq!(d[0].action, Some(Action::Include));
    }

    #[test]
    fn a_reset_host_that_does_not_come_back_is_excluded() {
        let cfg = PolicyConfig::default();
        let mut p = Policy::new(cfg, &groups(), None, 0);
        p.observe("b-3", Observed::Failed, 0);
        assert!(p.tick(cfg.come_back - 1).is_empty());
        let d = p.tick(cfg.come_back);
        assert_eq!(actions(&d), [("b-3".into(), Some(Action::Exclude))]);
        assert!(d[0].reason.contains("not back within 120 s"), "{d:?}");
    }

    #[test]
    fn a_crashed_health_check_never_leads_to_an_action() {
        let mut p = Policy::new(PolicyConfig::default(), &groups(), None, 0);
        let d = p.observe("a-0", Observed::Unknown("exit status 139".into()), SEC);
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].state, d[0].action), (HostState::Healthy, None));
        assert!(p
            .observe("a-0", Observed::Unknown("exit status 139".into()), 2 * SEC)
            .is_empty());
        assert!(p.tick(1000 * SEC).is_empty());
        // An unhealthy check does lead to one.
        let d = p.observe("a-0", Observed::Unhealthy("disk full".into()), 1001 * SEC);
        assert_eq!(d.last().unwrap().action, Some(Action::Reset));
        assert_eq!(p.host("a-0").unwrap().health.as_deref(), Some("disk full"));
    }

    #[test]
    fn a_whole_group_going_dark_is_not_acted_on() {
        let mut p = Policy::new(PolicyConfig::default(), &groups(), None, 0);
        let mut acted = 0;
        for i in 0..8 {
            let d = p.observe(&format!("a-{i}"), Observed::Failed, SEC);
            acted += d.iter().filter(|d| d.action.is_some()).count();
        }
        // The first hosts are reset (rate limit: 4), then the group is
        // more than half dark and the brake holds.
        assert_eq!(acted, 4);
        let held = p.host("a-7").unwrap();
        assert_eq!(held.state, HostState::Failed);
        assert!(held.reason.contains("dark at once"), "{held:?}");
        // Group b is untouched by a's trouble.
        let d = p.observe("b-0", Observed::Failed, 2 * SEC);
        assert!(
            d.iter().all(|d| d.action != Some(Action::Reset)),
            "rate limit: {d:?}"
        );
        assert!(d.last().unwrap().reason.contains("reset waits"), "{d:?}");
        // Once the rate window has passed, b-0 is reset on a tick; a stays held.
        let d = p.tick(62 * SEC);
        let acted: Vec<_> = d.iter().filter(|d| d.action.is_some()).collect();
        assert_eq!(acted.len(), 1, "{d:?}");
        assert_eq!(
            (acted[0].host.as_str(), acted[0].action),
            ("b-0", Some(Action::Reset))
        );
    }

    #[test]
    fn the_state_survives_a_restart_through_json() {
        let mut p = Policy::new(PolicyConfig::default(), &groups(), None, 0);
        p.observe("a-2", Observed::Failed, SEC);
        p.order("b-5", Order::Exclude, "bad memory", 2 * SEC);
        let text = serde_json::to_string(p.state()).unwrap();
        let back: PolicyState = serde_json::from_str(&text).unwrap();
        let mut groups = groups();
        groups[0].1.push("a-new".into());
        let q = Policy::new(PolicyConfig::default(), &groups, Some(back), 3 * SEC);
        assert_eq!(q.host("a-2"), p.host("a-2"));
        assert_eq!(q.host("b-5").unwrap().state, HostState::Excluded);
        assert_eq!(q.host("a-new").unwrap().state, HostState::Healthy);
        assert_eq!(q.state().resets, p.state().resets);
    }
}
