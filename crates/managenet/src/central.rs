//! The central manager: takes the reports of each group's manager of the
//! newest epoch (and refuses older ones), decides by the policy, runs the
//! configured commands, writes every decision to a log (JSON lines) and
//! the whole state to a file (atomically) that a restart reads back, and
//! answers operators' orders and status requests.
//!
//! ```text
//!  Report ─► EpochGate ─refused─► Refused (to the sender)
//!               └─accepted─► Policy ─► Decision ─► decisions.jsonl, state.json, command
//!  Order  ─► Policy ─► Reply        Status ─► Reply (the state in JSON)
//! ```

use macrolink_manage::lease::{EpochGate, Verdict};
use macrolink_manage::policy::{
    Action, Decision, HostState, Observed, Order, Policy, PolicyConfig, PolicyState,
};
use macrolink_manage::Nanos;
use macrolink_wire::manage::{Body, OrderKind, Seen, MAX_REPLY};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::local::{send, Send};

/// Commands the central manager runs; `{host}` and `{reason}` are put in
/// (quoted for the shell), and `MACROLINK_HOST` / `MACROLINK_REASON` set.
#[derive(Clone, Debug, Default)]
pub struct Commands {
    /// Resets a host.
    pub reset: Option<String>,
    /// Runs when a host is excluded.
    pub exclude: Option<String>,
    /// Runs when a host is included again.
    pub include: Option<String>,
}

/// Decisions kept in memory for the status view.
const RECENT: usize = 64;
/// Orders remembered with their answers.
const NONCES: usize = 1024;
/// Commands running at once, at most.
const MAX_CHILDREN: usize = 64;

/// One group as the central manager sees it.
#[derive(Debug)]
struct Group {
    name: String,
    gate: EpochGate,
    /// Newest report taken: (epoch, number).
    last: (u64, u64),
}

/// The central manager.
#[derive(Debug)]
pub struct Central {
    me: u32,
    groups: Vec<Group>,
    names: HashMap<u32, String>,
    nodes: HashMap<String, u32>,
    policy: Policy,
    commands: Commands,
    log: std::fs::File,
    state_path: PathBuf,
    recent: VecDeque<Decision>,
    /// Orders answered, with the answer (a retry of the same order gets
    /// it again; the order is not carried out twice).
    answered: VecDeque<(u64, (bool, String))>,
    children: Vec<(String, Child)>,
    window: Option<std::sync::Arc<crate::web::Window>>,
    /// How long a manager not heard keeps its place.
    lease: Nanos,
}

/// The central manager's state as `manage status` shows it.
#[derive(Debug, Serialize)]
pub struct Status<'a> {
    /// Groups: name, the node that holds the lease, its epoch.
    pub groups: Vec<GroupStatus>,
    /// Hosts, by name.
    pub hosts: &'a std::collections::BTreeMap<String, macrolink_manage::policy::HostRecord>,
    /// The latest decisions, oldest first.
    pub decisions: Vec<&'a Decision>,
}

/// One group in the status.
#[derive(Debug, Serialize)]
pub struct GroupStatus {
    /// Name.
    pub name: String,
    /// The host managing it, as the central manager last heard.
    pub manager: Option<String>,
    /// Its epoch.
    pub epoch: Option<u64>,
}

impl Central {
    /// A central manager on node `me` for `groups` (name, hosts as (node,
    /// name)), keeping its log and state in `dir` (the state read back if
    /// there is one).
    pub fn new(
        me: u32,
        groups: Vec<(String, Vec<(u32, String)>)>,
        cfg: PolicyConfig,
        commands: Commands,
        dir: &Path,
        now: Nanos,
    ) -> std::io::Result<Central> {
        std::fs::create_dir_all(dir)?;
        let state_path = dir.join("state.json");
        let state: Option<PolicyState> = match std::fs::read(&state_path) {
            Ok(b) => Some(
                serde_json::from_slice(&b)
                    .map_err(|e| std::io::Error::other(format!("{}: {e}", state_path.display())))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if state.is_some() {
            tracing::info!(
                "central manager: state read back from {}",
                state_path.display()
            );
        }
        let by_name: Vec<(String, Vec<String>)> = groups
            .iter()
            .map(|(g, hs)| (g.clone(), hs.iter().map(|h| h.1.clone()).collect()))
            .collect();
        let names: HashMap<u32, String> = groups.iter().flat_map(|g| g.1.iter().cloned()).collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("decisions.jsonl"))?;
        Ok(Central {
            me,
            groups: groups
                .iter()
                .map(|(name, _)| Group {
                    name: name.clone(),
                    gate: EpochGate::default(),
                    last: (0, 0),
                })
                .collect(),
            nodes: names.iter().map(|(n, s)| (s.clone(), *n)).collect(),
            names,
            policy: Policy::new(cfg, &by_name, state, now),
            commands,
            log,
            state_path,
            recent: VecDeque::new(),
            answered: VecDeque::new(),
            children: Vec::new(),
            window: None,
            lease: 0,
        })
    }

    /// Keeps a group's manager in place while it was heard within `lease`:
    /// a newer epoch from another node is taken only after that (the
    /// lease of the cluster file).
    pub fn keep_managers_for(&mut self, lease: Nanos) {
        self.lease = lease;
    }

    /// The epoch gate of `group` on a beat or report from node `from` that
    /// reached this host at `arrived`; the refusal to send it, if refused.
    fn gate(&mut self, group: u16, epoch: u64, from: u32, arrived: Nanos) -> Option<Vec<Send>> {
        let lease = self.lease;
        let g = self.groups.get_mut(group as usize)?;
        match g.gate.check_at(epoch, from, arrived, lease) {
            Verdict::Refused { epoch } => {
                let holder = g.gate.holder().map_or(0, |h| h.1);
                let refused = Body::Refused {
                    group,
                    epoch,
                    holder,
                };
                let mut out = Vec::new();
                send(self.me, from, refused, &mut out);
                Some(out)
            }
            Verdict::Accepted => None,
        }
    }

    /// Datagrams were dropped unread at `at` (the station's clock): no
    /// holder's silence before is counted, up to a lease after its last
    /// word.
    pub fn excuse(&mut self, at: Nanos) {
        for g in &mut self.groups {
            g.gate.excuse(at, self.lease);
        }
    }

    /// A beat of group `group`'s manager `from`, which reached this host at
    /// `arrived` (the station's clock: the holder's silence is judged by
    /// when its words came, not by when they were read); what to answer.
    pub fn on_beat(&mut self, from: u32, group: u16, epoch: u64, arrived: Nanos) -> Vec<Send> {
        self.gate(group, epoch, from, arrived).unwrap_or_default()
    }

    /// A report from node `from`, which reached this host at `arrived`
    /// (the station's clock) and is read at `now` (the wall clock); what
    /// to answer.
    #[allow(clippy::too_many_arguments)]
    pub fn on_report(
        &mut self,
        from: u32,
        group: u16,
        epoch: u64,
        n: u64,
        host: u32,
        seen: Seen,
        text: &str,
        arrived: Nanos,
        now: Nanos,
    ) -> Vec<Send> {
        let out = Vec::new();
        if group as usize >= self.groups.len() {
            return out;
        }
        if let Some(refused) = self.gate(group, epoch, from, arrived) {
            return refused;
        }
        let g = &mut self.groups[group as usize];
        if (epoch, n) <= g.last {
            return out;
        }
        g.last = (epoch, n);
        let Some(name) = self.names.get(&host).cloned() else {
            return out;
        };
        let observed = match seen {
            Seen::Alive => Observed::Alive,
            Seen::Suspect => Observed::Suspect,
            Seen::Failed => Observed::Failed,
            Seen::Unhealthy => Observed::Unhealthy(text.to_string()),
            Seen::Unknown => Observed::Unknown(text.to_string()),
        };
        let d = self.policy.observe(&name, observed, now);
        self.record(d);
        out
    }

    /// An operator's order; the reply's (ok, text). The same order again
    /// (a retry: the same nonce) gets the same answer and is not carried
    /// out twice.
    pub fn on_order(
        &mut self,
        nonce: u64,
        host: u32,
        order: OrderKind,
        why: &str,
        now: Nanos,
    ) -> (bool, String) {
        if let Some((_, said)) = self.answered.iter().find(|a| a.0 == nonce) {
            return said.clone();
        }
        let said = self.carry_out(host, order, why, now);
        if self.answered.len() == NONCES {
            self.answered.pop_front();
        }
        self.answered.push_back((nonce, said.clone()));
        said
    }

    fn carry_out(&mut self, host: u32, order: OrderKind, why: &str, now: Nanos) -> (bool, String) {
        let Some(name) = self.names.get(&host).cloned() else {
            return (false, format!("node {host} is in no macro-cluster"));
        };
        let order = match order {
            OrderKind::Reset => Order::Reset,
            OrderKind::Exclude => Order::Exclude,
            OrderKind::Include => Order::Include,
        };
        let d = self.policy.order(&name, order, why, now);
        let said = d
            .last()
            .map(|d| format!("{}: {:?}, {}", d.host, d.state, d.reason))
            .unwrap_or_default();
        self.record(d);
        (true, said)
    }

    /// Shows the state (and counts decisions) in `w` from now on.
    pub fn show_in(&mut self, w: std::sync::Arc<crate::web::Window>) {
        w.show(self.status_json().unwrap_or_default());
        self.window = Some(w);
    }

    /// Brings the window up to date.
    pub fn refresh(&self) {
        if let (Some(w), Some(s)) = (&self.window, self.status_json()) {
            w.show(s);
        }
    }

    /// Node id of host `name`.
    pub fn node_of(&self, name: &str) -> Option<u32> {
        self.nodes.get(name).copied()
    }

    /// The state in JSON, for a status request (cut to the latest
    /// decisions that fit one datagram; none when the hosts alone do not).
    pub fn status_json(&self) -> Option<String> {
        let groups = self
            .groups
            .iter()
            .map(|g| GroupStatus {
                name: g.name.clone(),
                manager: g
                    .gate
                    .holder()
                    .and_then(|(_, n)| self.names.get(&n).cloned()),
                epoch: g.gate.holder().map(|(e, _)| e),
            })
            .collect::<Vec<_>>();
        let mut keep = self.recent.len();
        loop {
            let s = Status {
                groups: groups
                    .iter()
                    .map(|g| GroupStatus {
                        name: g.name.clone(),
                        manager: g.manager.clone(),
                        epoch: g.epoch,
                    })
                    .collect(),
                hosts: &self.policy.state().hosts,
                decisions: self.recent.iter().skip(self.recent.len() - keep).collect(),
            };
            let text = serde_json::to_string(&s).unwrap_or_default();
            if text.len() <= MAX_REPLY {
                return Some(text);
            }
            if keep == 0 {
                return None;
            }
            keep /= 2;
        }
    }

    /// Decisions due by `now` (returns that did not come, waits that
    /// ended), and commands that finished.
    pub fn poll(&mut self, now: Nanos) {
        let d = self.policy.tick(now);
        self.record(d);
        self.children.retain_mut(|(what, c)| match c.try_wait() {
            Ok(Some(st)) if !st.success() => {
                tracing::warn!("{what}: {st}");
                false
            }
            Ok(Some(_)) => false,
            Ok(None) => true,
            Err(_) => false,
        });
    }

    /// Logs, keeps, acts on and saves decisions.
    fn record(&mut self, decisions: Vec<Decision>) {
        if decisions.is_empty() {
            return;
        }
        for d in decisions {
            tracing::info!(
                "{}: {:?} ({}){}",
                d.host,
                d.state,
                d.reason,
                match d.action {
                    Some(a) => format!(": {a:?}"),
                    None => String::new(),
                }
            );
            if let Ok(line) = serde_json::to_string(&d) {
                let _ = writeln!(self.log, "{line}");
            }
            if let Some(a) = d.action {
                self.act(a, &d.host, &d.reason);
            }
            if let Some(w) = &self.window {
                w.decisions.inc();
                if let Some(a) = d.action {
                    let action = format!("{a:?}").to_lowercase();
                    w.actions
                        .get_or_create(&crate::web::ActionLabels { action })
                        .inc();
                }
            }
            if self.recent.len() == RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back(d);
        }
        if let Err(e) = self.save() {
            tracing::error!(
                "central manager: writing {}: {e}",
                self.state_path.display()
            );
        }
        self.refresh();
    }

    /// Writes the state file: a new file renamed over the old one.
    fn save(&self) -> std::io::Result<()> {
        let dir = self.state_path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        serde_json::to_writer_pretty(&mut tmp, self.policy.state())?;
        tmp.as_file().sync_all()?;
        tmp.persist(&self.state_path).map_err(|e| e.error)?;
        Ok(())
    }

    fn act(&mut self, a: Action, host: &str, reason: &str) {
        let template = match a {
            Action::Reset => &self.commands.reset,
            Action::Exclude => &self.commands.exclude,
            Action::Include => &self.commands.include,
        };
        let Some(t) = template else {
            tracing::warn!("{host}: {a:?} decided, but no command is set for it");
            return;
        };
        if self.children.len() >= MAX_CHILDREN {
            tracing::error!("{host}: {a:?} not run: {MAX_CHILDREN} commands still running");
            return;
        }
        let cmd = t
            .replace("{host}", &quote(host))
            .replace("{reason}", &quote(reason));
        let child = Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .env("MACROLINK_HOST", host)
            .env("MACROLINK_REASON", reason)
            .stdin(Stdio::null())
            .spawn();
        match child {
            Ok(c) => self.children.push((format!("{host}: {a:?}: {cmd}"), c)),
            Err(e) => tracing::error!("{host}: {a:?}: {cmd}: {e}"),
        }
    }

    /// Resets hosts with `cmd` when the cluster file sets no reset
    /// command (`macrolink up` restarts the processes it runs).
    pub fn reset_by_default(&mut self, cmd: String) {
        self.commands.reset.get_or_insert(cmd);
    }

    /// The node ids of the hosts excluded now.
    pub fn excluded_nodes(&self) -> Vec<u32> {
        self.policy
            .state()
            .hosts
            .iter()
            .filter(|(_, r)| r.state == HostState::Excluded)
            .filter_map(|(name, _)| self.node_of(name))
            .collect()
    }

    /// Whether host `name` is excluded now.
    pub fn excluded(&self, name: &str) -> bool {
        self.policy
            .host(name)
            .is_some_and(|r| r.state == HostState::Excluded)
    }
}

/// `s` quoted for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use macrolink_manage::MS;

    #[test]
    fn a_holders_beats_read_late_keep_it_by_when_they_came() {
        let d = tempfile::tempdir().unwrap();
        let mut c = two_hosts(d.path());
        c.keep_managers_for(800 * MS);
        let refused = |out: &[Send]| !out.is_empty();
        // h1 (node 2) holds epoch 1. The central manager stalls and then
        // reads, in the order they came, h1's beats every 160 ms and h2's
        // newer epoch 50 ms before each: all read at once, long after the
        // first, and h1 was never silent.
        assert!(!refused(&c.on_beat(2, 0, 1, 0)));
        for k in 1..=12u64 {
            let t = k * 160 * MS;
            assert!(refused(&c.on_beat(3, 0, 2, t - 50 * MS)), "at {k}");
            assert!(!refused(&c.on_beat(2, 0, 1, t)), "at {k}");
        }
        // Datagrams dropped at 2.5 s: h1's silence before is not counted.
        c.excuse(2500 * MS);
        assert!(refused(&c.on_beat(3, 0, 2, 2500 * MS + 799 * MS)));
        // Dropped again at 4 s, past a lease after h1's last beat (at
        // 1.92 s): that one excuses only up to there (drops delay a
        // takeover by a lease at most).
        c.excuse(4000 * MS);
        let bound = 1920 * MS + 800 * MS;
        assert!(refused(&c.on_beat(3, 0, 2, bound + 799 * MS)));
        // Silent for a lease after that: h2's epoch holds.
        assert!(!refused(&c.on_beat(3, 0, 2, bound + 800 * MS)));
        assert_eq!(c.groups[0].gate.holder(), Some((2, 3)));
        assert!(refused(&c.on_beat(2, 0, 1, bound + 900 * MS)));
    }

    #[test]
    fn words_reach_the_shell_as_they_are() {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", quote("it's $HOME `x` \"y\"")))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's $HOME `x` \"y\"");
    }
}

/// A central manager on node 1 of one group, h1 (node 2) and h2 (node
/// 3), keeping its files in `dir`.
#[cfg(test)]
fn two_hosts(dir: &Path) -> Central {
    let groups = vec![(
        "m0".to_string(),
        vec![(2, "h1".to_string()), (3, "h2".to_string())],
    )];
    Central::new(
        1,
        groups,
        PolicyConfig::default(),
        Commands::default(),
        dir,
        0,
    )
    .unwrap()
}

#[cfg(test)]
mod order_tests {
    use super::*;

    #[test]
    fn an_order_retried_with_its_nonce_is_answered_again_and_carried_out_once() {
        let d = tempfile::tempdir().unwrap();
        let mut c = two_hosts(d.path());
        let first = c.on_order(7, 3, OrderKind::Exclude, "bad", 1);
        assert!(first.0, "{first:?}");
        assert_eq!(c.on_order(7, 3, OrderKind::Exclude, "bad", 2), first);
        let actions = &c.policy.host("h2").unwrap().actions;
        assert_eq!(actions.len(), 1, "{actions:?}");
        assert!(
            !c.on_order(8, 99, OrderKind::Reset, "who", 3).0,
            "no such host"
        );
    }
}
