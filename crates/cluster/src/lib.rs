//! The cluster file as plain data: the hosts of a cluster, their roles and
//! addresses, the IO lanes that join compute hosts to storage, and the
//! settings of the gateway protocol. The same file drives `macrolink up`
//! (every host a process on one machine) and `macrolink node` (one host of a
//! real deployment, found by name or by the launcher's rank).
//!
//! ```text
//!   cluster.toml ──parse──► Cluster ──check──► hosts, lanes, settings
//!                                               │
//!        macrolink up / node ◄──────────────────┤ which host am I (me)
//!        gateways            ◄── storage_peers ─┤ where to forward
//!        compute hosts, cp   ◄── lane_of ───────┘ which gateways to use
//! ```
//!
//! This crate knows no service: it holds what the file says, with typed
//! errors for what is wrong with it. A setting the file leaves out stays
//! `None`, and the service that reads it supplies its own default. New kinds
//! of table (segments joined by range-extension relays, macro-clusters with
//! their managers) come in as modules of their own beside `lane`.
#![forbid(unsafe_code)]

mod error;
mod host;
mod lane;
mod manage;
mod segment;
mod settings;

pub use error::Error;
pub use host::{Host, Role};
pub use lane::Lane;
pub use manage::{Macro, ManageSettings};
pub use segment::{RangeSettings, RelayPlan, Segment};
pub use settings::{HealthSettings, StripeSettings};

use serde::Deserialize;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

/// The embedded default cluster (`examples/clusters/local.toml`): a compute
/// host, two gateways and a storage host with its file service, on loopback.
pub const DEFAULT: &str = include_str!("../../../examples/clusters/local.toml");

/// Launchers' rank variables, in the order they are looked at.
const RANK_VARS: [&str; 3] = ["SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"];

/// A whole cluster file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    /// File holding the shared secret of the cluster's fabric and file
    /// service (never the secret itself); relative to the cluster file.
    /// The environment (`MACROLINK_SECRET_FILE`, `MACROLINK_SECRET`) and
    /// `--secret-file` come first.
    #[serde(default)]
    pub secret_file: Option<std::path::PathBuf>,
    /// Hosts.
    #[serde(rename = "host", default)]
    pub hosts: Vec<Host>,
    /// IO lanes.
    #[serde(rename = "lane", default)]
    pub lanes: Vec<Lane>,
    /// Dead-gateway detection.
    #[serde(default)]
    pub health: HealthSettings,
    /// Striping of transfers over gateways.
    #[serde(default)]
    pub stripe: StripeSettings,
    /// Segments joined by a pair of relays (none: one fabric).
    #[serde(rename = "segment", default)]
    pub segments: Vec<Segment>,
    /// The long link between the relays.
    #[serde(default)]
    pub range: RangeSettings,
    /// Macro-clusters, each with its manager and fallback.
    #[serde(rename = "macro", default)]
    pub macros: Vec<Macro>,
    /// How the cluster is managed.
    #[serde(default)]
    pub manage: ManageSettings,
}

impl Cluster {
    /// Reads and checks a cluster file.
    pub fn load(path: &Path) -> Result<Cluster, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut c = Cluster::parse(&text)?;
        if let (Some(f), Some(dir)) = (&c.secret_file, path.parent()) {
            c.secret_file = Some(dir.join(f));
        }
        Ok(c)
    }

    /// The embedded default cluster.
    pub fn embedded() -> Cluster {
        Cluster::parse(DEFAULT).expect("the embedded cluster file is valid")
    }

    /// Parses and checks cluster text.
    pub fn parse(text: &str) -> Result<Cluster, Error> {
        let c: Cluster = toml::from_str(text)?;
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), Error> {
        let positive = [
            ("health", "interval_ms", self.health.interval_ms == Some(0)),
            ("health", "misses", self.health.misses == Some(0)),
            ("stripe", "chunk_kib", self.stripe.chunk_kib == Some(0)),
            ("stripe", "window", self.stripe.window == Some(0)),
            ("stripe", "rto_ms", self.stripe.rto_ms == Some(0)),
        ];
        if let Some((section, key, _)) = positive.into_iter().find(|p| p.2) {
            return Err(Error::NotPositive { section, key });
        }
        let mut names = HashSet::new();
        let mut ids = HashSet::new();
        for h in &self.hosts {
            if !names.insert(h.name.as_str()) {
                return Err(Error::DuplicateName(h.name.clone()));
            }
            if !ids.insert(h.node) {
                return Err(Error::DuplicateNode(h.node));
            }
            if (h.files.is_some() || h.export.is_some()) && h.role != Role::Storage {
                return Err(Error::FilesNotOnStorage(h.name.clone()));
            }
            if h.listen().is_none() {
                return Err(Error::NoAddress {
                    name: h.name.clone(),
                    role: h.role,
                });
            }
        }
        for (i, l) in self.lanes.iter().enumerate() {
            if l.gateways.is_empty() || l.storage.is_empty() {
                return Err(Error::EmptyLane(i));
            }
            if l.links == Some(0) || l.link_gbit.is_some_and(|r| r.is_nan() || r <= 0.0) {
                return Err(Error::NotPositive {
                    section: "lane",
                    key: "links and link_gbit",
                });
            }
            for (names, want) in [(&l.gateways, Role::Gateway), (&l.storage, Role::Storage)] {
                for n in names {
                    match self.host(n) {
                        Some(h) if h.role == want => {}
                        Some(h) => {
                            return Err(Error::WrongRole {
                                lane: i,
                                name: n.clone(),
                                is: h.role,
                                want,
                            })
                        }
                        None => {
                            return Err(Error::NoHost {
                                context: format!("lane {i}: "),
                                name: n.clone(),
                            })
                        }
                    }
                }
            }
        }
        self.check_segments()?;
        self.check_macros()
    }

    fn check_macros(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Macro(m));
        if self.macros.is_empty() {
            return match &self.manage.central {
                Some(_) => bad("a central manager but no [[macro]] to manage".into()),
                None => Ok(()),
            };
        }
        let central = match &self.manage.central {
            Some(c) => c,
            None => return bad("[[macro]] groups need a central manager: [manage] central".into()),
        };
        if self
            .manage
            .dark_share
            .is_some_and(|s| !(0.0..=1.0).contains(&s))
        {
            return bad("[manage] dark_share must be between 0 and 1".into());
        }
        let mut seen = HashSet::new();
        for m in &self.macros {
            if m.hosts.is_empty() {
                return bad(format!("{}: no hosts", m.name));
            }
            if m.manager == m.fallback {
                return bad(format!(
                    "{}: the fallback must be another host than the manager",
                    m.name
                ));
            }
            for n in m.hosts.iter().chain([&m.manager, &m.fallback]) {
                match self.host(n) {
                    Some(h) if h.manage.is_some() => {}
                    Some(_) => {
                        return bad(format!("{}: host {n:?} has no `manage` address", m.name))
                    }
                    None => return bad(format!("{}: no host named {n:?}", m.name)),
                }
            }
            for n in &m.hosts {
                if !seen.insert(n.as_str()) {
                    return bad(format!("host {n:?} is in two macro-clusters"));
                }
            }
        }
        match self.host(central) {
            Some(h) if h.manage.is_some() => Ok(()),
            Some(_) => bad(format!(
                "central manager {central:?} has no `manage` address"
            )),
            None => bad(format!("central manager: no host named {central:?}")),
        }
    }

    /// The macro-cluster of host `name`.
    pub fn macro_of(&self, name: &str) -> Option<&Macro> {
        self.macros
            .iter()
            .find(|m| m.hosts.iter().any(|h| h == name))
    }

    fn check_segments(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Segment(m));
        match self.segments.len() {
            0 => return Ok(()),
            2 => {}
            n => return bad(format!("{n} given; a relay pair joins exactly two")),
        }
        let mut seen = HashSet::new();
        for s in &self.segments {
            match self.host(&s.relay) {
                Some(h) if h.role == Role::Relay && h.long.is_some() => {}
                Some(_) => {
                    return bad(format!(
                        "{}: relay {:?} must have role \"relay\" and a `long` address",
                        s.name, s.relay
                    ))
                }
                None => return bad(format!("{}: no host named {:?}", s.name, s.relay)),
            }
            for n in s.hosts.iter().chain([&s.relay]) {
                if self.host(n).is_none() {
                    return bad(format!("{}: no host named {n:?}", s.name));
                }
                if !seen.insert(n.as_str()) && n != &s.relay {
                    return bad(format!("host {n:?} is in two segments"));
                }
            }
        }
        if let Some(h) = self.hosts.iter().find(|h| !seen.contains(h.name.as_str())) {
            return bad(format!("host {:?} is in no segment", h.name));
        }
        if self.segments[0].relay == self.segments[1].relay {
            return bad("the two segments need a relay each".into());
        }
        Ok(())
    }

    /// The segment of host `name`, if the file has segments.
    pub fn segment_of(&self, name: &str) -> Option<&Segment> {
        self.segments
            .iter()
            .find(|s| s.relay == name || s.hosts.iter().any(|h| h == name))
    }

    /// The hosts of a segment that a far relay carries traffic for: all
    /// but its relay, in file order of the segment.
    fn reachable<'a>(&'a self, s: &'a Segment) -> impl Iterator<Item = &'a Host> + 'a {
        s.hosts
            .iter()
            .filter(move |n| **n != s.relay)
            .filter_map(|n| self.host(n))
    }

    /// Where host `from` dials host `to`: `to`'s own address in one
    /// fabric, or, across the relay pair, the port of `from`'s relay that
    /// stands for `to`.
    pub fn address_of(&self, from: &Host, to: &Host) -> Option<SocketAddr> {
        let (Some(a), Some(b)) = (self.segment_of(&from.name), self.segment_of(&to.name)) else {
            return to.listen();
        };
        if a == b {
            return to.listen();
        }
        let i = self.reachable(b).position(|h| h.name == to.name)?;
        let relay = self.host(&a.relay)?.fabric?;
        let port = relay.port().checked_add(u16::try_from(i).ok()?)?;
        Some(SocketAddr::new(relay.ip(), port))
    }

    /// Whether hosts `a` and `b` are in different segments (so one reaches
    /// the other through the relay pair).
    pub fn across(&self, a: &Host, b: &Host) -> bool {
        match (self.segment_of(&a.name), self.segment_of(&b.name)) {
            (Some(x), Some(y)) => x != y,
            _ => false,
        }
    }

    /// What relay host `relay` of a two-segment file needs to run.
    pub fn relay_plan(&self, relay: &Host) -> Option<RelayPlan> {
        let mine = self.segments.iter().position(|s| s.relay == relay.name)?;
        let (near, far) = (&self.segments[mine], &self.segments[1 - mine]);
        let peer = self.host(&far.relay)?;
        let base = relay.fabric?;
        let listen = self
            .reachable(far)
            .enumerate()
            .map(|(i, h)| {
                let port = base.port().checked_add(u16::try_from(i).ok()?)?;
                Some((h.node, SocketAddr::new(base.ip(), port)))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(RelayPlan {
            long_local: relay.long?,
            long_peer: peer.long?,
            listen,
            near: self
                .reachable(near)
                .filter_map(|h| Some((h.node, h.listen()?)))
                .collect(),
            near_files: self
                .reachable(near)
                .filter_map(|h| Some((h.node, h.files?)))
                .collect(),
            high: mine == 1,
        })
    }

    /// The host with that name.
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// The hosts of one role, in file order.
    pub fn with_role(&self, role: Role) -> impl Iterator<Item = &Host> {
        self.hosts.iter().filter(move |h| h.role == role)
    }

    /// This process's host: by `name`, or by the launcher's rank variable
    /// (Slurm, Open MPI, PMI) as an index into the hosts.
    pub fn me(&self, name: Option<&str>) -> Result<&Host, Error> {
        self.me_from(name, |v| std::env::var(v).ok())
    }

    /// As [`me`](Self::me), with the environment given.
    pub fn me_from(
        &self,
        name: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<&Host, Error> {
        if let Some(n) = name {
            return self.host(n).ok_or_else(|| Error::NoHost {
                context: String::new(),
                name: n.to_string(),
            });
        }
        for var in RANK_VARS {
            if let Some(value) = env(var) {
                let rank: usize = value.parse().map_err(|_| Error::BadRank { var, value })?;
                return self.hosts.get(rank).ok_or(Error::RankPastHosts {
                    var,
                    rank,
                    hosts: self.hosts.len(),
                });
            }
        }
        Err(Error::WhichHost)
    }

    /// The lane whose gateways serve storage host `storage`.
    pub fn lane_of(&self, storage: &str) -> Option<&Lane> {
        self.lanes
            .iter()
            .find(|l| l.storage.iter().any(|s| s == storage))
    }

    /// The gateway hosts of a lane, in its order.
    pub fn gateways_of<'a>(&'a self, lane: &'a Lane) -> impl Iterator<Item = &'a Host> + 'a {
        lane.gateways.iter().filter_map(|g| self.host(g))
    }

    /// Where gateway `gw` forwards to: each storage host of every lane it
    /// serves, as (node id, address it listens on).
    pub fn storage_peers(&self, gw: &Host) -> Vec<(u32, SocketAddr)> {
        self.lanes
            .iter()
            .filter(|l| l.gateways.contains(&gw.name))
            .flat_map(|l| l.storage.iter().filter_map(|s| self.host(s)))
            .filter_map(|s| Some((s.node, self.address_of(gw, s)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = "[[host]]\nname = 'a'\nrole = 'compute'\nnode = 1\nfabric = '127.0.0.1:1'\n";

    /// Four managed hosts, and `tail` appended.
    fn managed(tail: &str) -> String {
        let mut t = String::new();
        for (i, n) in ["h0", "h1", "h2", "h3"].iter().enumerate() {
            t += &format!(
                "[[host]]\nname = '{n}'\nrole = 'compute'\nnode = {}\nfabric = '127.0.0.1:{}'\nmanage = '127.0.0.1:{}'\n",
                i + 1,
                7000 + i,
                7100 + i
            );
        }
        t + tail
    }

    #[test]
    fn macro_clusters_name_their_managers_and_a_central_one() {
        let ok = "[[macro]]\nname = 'm0'\nhosts = ['h0', 'h1']\nmanager = 'h0'\nfallback = 'h1'\n\
                  [[macro]]\nname = 'm1'\nhosts = ['h2', 'h3']\nmanager = 'h2'\nfallback = 'h3'\n\
                  [manage]\ncentral = 'h0'\nexclude_command = 'scontrol update nodename={host} state=drain'\n";
        let c = Cluster::parse(&managed(ok)).unwrap();
        assert_eq!(c.macros.len(), 2);
        assert_eq!(c.macro_of("h3").unwrap().name, "m1");
        assert_eq!(c.manage.central.as_deref(), Some("h0"));
        let msg = |tail: &str| Cluster::parse(&managed(tail)).unwrap_err().to_string();
        let one = |hosts: &str, m: &str, f: &str| {
            format!("[[macro]]\nname = 'm'\nhosts = {hosts}\nmanager = '{m}'\nfallback = '{f}'\n")
        };
        assert!(msg(&one("['h0']", "h0", "h1")).contains("[manage] central"));
        let central = "[manage]\ncentral = 'h0'\n";
        assert!(msg(&(one("['h0']", "h1", "h1") + central)).contains("another host"));
        assert!(msg(&(one("['h0']", "h1", "hx") + central)).contains("no host named \"hx\""));
        assert!(msg(&(one("[]", "h1", "h2") + central)).contains("no hosts"));
        let twice = one("['h0', 'h1']", "h0", "h1") + &one("['h1']", "h2", "h3") + central;
        assert!(msg(&twice).contains("in two macro-clusters"));
        assert!(msg(central).contains("no [[macro]]"));
        let bare = "[[host]]\nname = 'x'\nrole = 'compute'\nnode = 9\nfabric = '127.0.0.1:1'\n";
        let unmanaged = bare.to_string() + &one("['x']", "h0", "h1") + central;
        assert!(msg(&unmanaged).contains("\"x\" has no `manage` address"));
    }

    #[test]
    fn a_secret_file_is_found_beside_the_cluster_file() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("c.toml");
        for (given, want) in [
            ("secret", d.path().join("secret")),
            ("/etc/macrolink/secret", "/etc/macrolink/secret".into()),
        ] {
            std::fs::write(&file, format!("secret_file = '{given}'\n{ONE}")).unwrap();
            assert_eq!(Cluster::load(&file).unwrap().secret_file, Some(want));
        }
        assert_eq!(Cluster::embedded().secret_file, None);
    }

    #[test]
    fn the_embedded_default_parses() {
        let c = Cluster::embedded();
        assert_eq!(c.hosts.len(), 4);
        let lane = c.lane_of("store0").unwrap();
        assert_eq!(lane.gateways, ["gw0", "gw1"]);
        let gws: Vec<u32> = c.gateways_of(lane).map(|g| g.node).collect();
        assert_eq!(gws, [21, 22]);
        assert_eq!(c.me(Some("gw1")).unwrap().node, 22);
        let gw0 = c.host("gw0").unwrap();
        assert_eq!(
            c.storage_peers(gw0),
            [(10, "127.0.0.1:7110".parse().unwrap())]
        );
        assert_eq!(c.with_role(Role::Gateway).count(), 2);
        assert_eq!(c.health.misses, Some(3));
        assert_eq!(c.stripe.window, Some(4));
    }

    #[test]
    fn settings_left_out_stay_unset_and_zero_is_refused() {
        let c = Cluster::parse(ONE).unwrap();
        assert_eq!(c.health, HealthSettings::default());
        assert_eq!(c.stripe, StripeSettings::default());
        let text = format!(
            "{ONE}[health]\ninterval_ms = 20\nmisses = 2\n[stripe]\nchunk_kib = 256\nwindow = 8\n"
        );
        let c = Cluster::parse(&text).unwrap();
        assert_eq!((c.health.interval_ms, c.health.misses), (Some(20), Some(2)));
        assert_eq!(
            (c.stripe.chunk_kib, c.stripe.window, c.stripe.rto_ms),
            (Some(256), Some(8), None)
        );
        for (table, key) in [
            ("health", "misses"),
            ("health", "interval_ms"),
            ("stripe", "rto_ms"),
        ] {
            let e = Cluster::parse(&format!("{ONE}[{table}]\n{key} = 0\n")).unwrap_err();
            assert_eq!(e.to_string(), format!("[{table}] {key} must be positive"));
        }
    }

    #[test]
    fn bad_files_get_clear_errors() {
        let cases = [
            ("[[host]]\nname='a'\nrole='router'\nnode=1\nfabric='127.0.0.1:1'", "unknown variant"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1", "no address"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1\nfabric='127.0.0.1:1'\n[[host]]\nname='a'\nrole='gateway'\nnode=2\nfabric='127.0.0.1:2'", "appears twice"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1\nfabric='127.0.0.1:1'\n[[host]]\nname='b'\nrole='gateway'\nnode=1\nfabric='127.0.0.1:2'", "node id 1 appears twice"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1\nfabric='127.0.0.1:1'\nfiles='127.0.0.1:3'", "only storage hosts"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1\nfabric='127.0.0.1:1'\n[[lane]]\ngateways=['a']\nstorage=['b']", "not Gateway"),
            ("[[lane]]\ngateways=['x']\nstorage=['y']", "lane 0: no host named \"x\""),
            ("[[lane]]\ngateways=[]\nstorage=['y']", "at least one gateway"),
            ("[[lane]]\ngateways=['x']\nstorage=['y']\nlinks=0", "[lane] links and link_gbit must be positive"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1\nfabric='not an address'", "invalid socket address"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1\nfabric='127.0.0.1:1'\ncolour='red'", "unknown field"),
        ];
        for (text, want) in cases {
            let err = Cluster::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn far_hosts_are_dialled_at_the_near_relay_one_port_each() {
        let text = include_str!("../../../examples/clusters/two-segments.toml");
        let c = Cluster::parse(text).unwrap();
        let h = |n: &str| c.host(n).unwrap();
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        assert_eq!(
            c.address_of(h("compute0"), h("gw0")),
            Some(at("127.0.0.1:7340"))
        );
        assert_eq!(
            c.address_of(h("compute0"), h("store0")),
            Some(at("127.0.0.1:7342"))
        );
        assert_eq!(
            c.address_of(h("gw1"), h("compute0")),
            Some(at("127.0.0.1:7360"))
        );
        assert_eq!(
            c.address_of(h("gw0"), h("store0")),
            Some(at("127.0.0.1:7310"))
        );
        assert_eq!(c.storage_peers(h("gw0")), [(10, at("127.0.0.1:7310"))]);
        let east = c.relay_plan(h("relay-east")).unwrap();
        assert_eq!(east.long_peer, at("127.0.0.1:7370"));
        assert_eq!(
            east.listen,
            [
                (21, at("127.0.0.1:7340")),
                (22, at("127.0.0.1:7341")),
                (10, at("127.0.0.1:7342"))
            ]
        );
        assert_eq!(east.near, [(1, at("127.0.0.1:7301"))]);
        assert!(!east.high);
        let west = c.relay_plan(h("relay-west")).unwrap();
        assert!(west.high && west.listen == [(1, at("127.0.0.1:7360"))]);
        assert_eq!(west.near.len(), 3);
        assert_eq!(c.range.packet, Some(8972));
        assert!(c.relay_plan(h("gw0")).is_none());
    }

    #[test]
    fn segments_that_are_not_one_relay_pair_are_refused() {
        let text = include_str!("../../../examples/clusters/two-segments.toml");
        let cases = [
            ("hosts = [\"gw0\", \"gw1\", \"store0\"]", "hosts = [\"gw0\", \"gw1\"]", "\"store0\" is in no segment"),
            ("hosts = [\"compute0\"]", "hosts = [\"compute0\", \"gw0\"]", "\"gw0\" is in two segments"),
            ("relay = \"relay-west\"", "relay = \"gw0\"", "must have role"),
            ("relay = \"relay-west\"", "relay = \"nobody\"", "no host named"),
            ("[[segment]]\nname = \"west\"", "[[segment]]\nname = \"x\"\nhosts = []\nrelay = \"relay-west\"\n[[segment]]\nname = \"west\"", "3 given"),
        ];
        for (from, to, want) in cases {
            assert!(text.contains(from), "{from}");
            let err = Cluster::parse(&text.replacen(from, to, 1))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{to}: {err}");
        }
    }

    #[test]
    fn a_host_is_found_by_name_or_by_the_launchers_rank() {
        let c = Cluster::embedded();
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |v: &str| pairs.iter().find(|p| p.0 == v).map(|p| p.1.to_string())
        };
        assert_eq!(
            c.me_from(None, env(&[("SLURM_PROCID", "3")])).unwrap().name,
            "store0"
        );
        assert_eq!(
            c.me_from(
                None,
                env(&[("PMI_RANK", "1"), ("OMPI_COMM_WORLD_RANK", "2")])
            )
            .unwrap()
            .name,
            "gw1",
            "Open MPI's variable is looked at before PMI's"
        );
        assert_eq!(
            c.me_from(Some("gw0"), env(&[("SLURM_PROCID", "3")]))
                .unwrap()
                .name,
            "gw0"
        );
        let msg = |r: Result<&Host, Error>| r.unwrap_err().to_string();
        assert_eq!(
            msg(c.me_from(None, env(&[("SLURM_PROCID", "9")]))),
            "SLURM_PROCID=9 but the file has 4 hosts"
        );
        assert_eq!(
            msg(c.me_from(None, env(&[("PMI_RANK", "x")]))),
            "PMI_RANK=x is not a rank"
        );
        assert!(msg(c.me_from(None, env(&[]))).contains("--host"));
        assert_eq!(
            msg(c.me_from(Some("nope"), env(&[]))),
            "no host named \"nope\""
        );
    }
}
