//! The cluster file: hosts, their roles and addresses, macro-cluster lanes.
//! The same file drives `macrolink up` (every host a process here) and
//! `macrolink node` (one host of a real deployment).

use anyhow::{bail, Context};
use serde::Deserialize;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

/// The embedded default cluster (examples/clusters/local.toml).
pub const DEFAULT: &str = include_str!("../../../examples/clusters/local.toml");

/// What a host does.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs applications; reaches storage through gateways.
    Compute,
    /// Forwards between the fabric and the storage network.
    Gateway,
    /// Holds data.
    Storage,
}

/// One host.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Unique name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// Node id, unique.
    pub node: u32,
    /// Level-1 (fabric) address: where it listens for macrolink traffic.
    pub fabric: Option<SocketAddr>,
    /// Level-2 (storage network) address.
    pub storage: Option<SocketAddr>,
    /// Storage hosts: contact address of the file service (`macrolink
    /// serve`), if it runs there.
    pub files: Option<SocketAddr>,
    /// Storage hosts: directory the file service exports (`macrolink up`
    /// makes a scratch one when none is named).
    pub export: Option<std::path::PathBuf>,
}

impl Host {
    /// The address it listens on.
    pub fn listen(&self) -> Option<SocketAddr> {
        match self.role {
            Role::Storage => self.storage.or(self.fabric),
            _ => self.fabric,
        }
    }
}

/// A group of gateways serving a set of storage hosts.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lane {
    /// Gateway host names.
    pub gateways: Vec<String>,
    /// Storage host names.
    pub storage: Vec<String>,
}

/// Dead-gateway detection settings (`[health]`).
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSettings {
    /// Milliseconds between heartbeats to a gateway.
    pub interval_ms: u64,
    /// Unanswered heartbeats in a row that take a gateway out of use.
    pub misses: u32,
}

impl Default for HealthSettings {
    fn default() -> Self {
        let d = macrolink_gateway::health::HealthConfig::default();
        HealthSettings {
            interval_ms: d.interval / 1_000_000,
            misses: d.misses,
        }
    }
}

/// Striping settings (`[stripe]`).
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StripeSettings {
    /// KiB per chunk.
    pub chunk_kib: u64,
    /// Chunks in flight per gateway.
    pub window: usize,
    /// Milliseconds before an unanswered chunk is sent again.
    pub rto_ms: u64,
}

impl Default for StripeSettings {
    fn default() -> Self {
        let d = macrolink_gateway::stripe::StripeConfig::default();
        StripeSettings {
            chunk_kib: d.chunk / 1024,
            window: d.window,
            rto_ms: d.rto / 1_000_000,
        }
    }
}

/// A whole cluster file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
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
}

impl Cluster {
    /// Reads and checks a cluster file.
    pub fn load(path: &Path) -> anyhow::Result<Cluster> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Cluster::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parses and checks cluster text.
    pub fn parse(text: &str) -> anyhow::Result<Cluster> {
        let c: Cluster = toml::from_str(text)?;
        c.check()?;
        Ok(c)
    }

    /// The transfer settings the file asks for.
    /// Names and lanes of the file services of storage hosts, for clients.
    pub fn file_routes(&self, opts: &mut macrolink_files::ClientOptions) {
        for s in self.hosts.iter().filter(|h| h.role == Role::Storage) {
            let Some(files) = s.files else { continue };
            opts.hosts.insert(s.name.clone(), files);
            let Some(lane) = self.lane_of(&s.name) else {
                continue;
            };
            let gateways = lane
                .gateways
                .iter()
                .filter_map(|g| self.host(g))
                .filter_map(|g| Some((macrolink_fabric::Addr::new(g.node, 1), g.listen()?)))
                .collect();
            opts.lanes.insert(
                files,
                macrolink_files::lane::Route {
                    gateways,
                    send: self.send_config(),
                },
            );
        }
    }

    pub fn send_config(&self) -> macrolink_gwnet::client::SendConfig {
        macrolink_gwnet::client::SendConfig {
            stripe: macrolink_gateway::stripe::StripeConfig {
                chunk: self.stripe.chunk_kib * 1024,
                window: self.stripe.window,
                rto: self.stripe.rto_ms * 1_000_000,
            },
            health: macrolink_gateway::health::HealthConfig {
                interval: self.health.interval_ms * 1_000_000,
                misses: self.health.misses,
            },
            pinned: false,
            // A transfer that hears nothing for this long fails, not hangs.
            patience: 30_000_000_000,
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.health.interval_ms == 0 || self.health.misses == 0 {
            bail!("[health] interval_ms and misses must be positive");
        }
        if self.stripe.chunk_kib == 0 || self.stripe.window == 0 || self.stripe.rto_ms == 0 {
            bail!("[stripe] chunk_kib, window and rto_ms must be positive");
        }
        let mut names = HashSet::new();
        let mut ids = HashSet::new();
        for h in &self.hosts {
            if !names.insert(h.name.as_str()) {
                bail!("host name {:?} appears twice", h.name);
            }
            if !ids.insert(h.node) {
                bail!("node id {} appears twice", h.node);
            }
            if (h.files.is_some() || h.export.is_some()) && h.role != Role::Storage {
                bail!("host {:?}: only storage hosts run the file service", h.name);
            }
            if h.listen().is_none() {
                bail!(
                    "host {:?} ({:?}) has no address to listen on",
                    h.name,
                    h.role
                );
            }
        }
        for (i, l) in self.lanes.iter().enumerate() {
            if l.gateways.is_empty() || l.storage.is_empty() {
                bail!("lane {i} needs at least one gateway and one storage host");
            }
            for (names, role) in [(&l.gateways, Role::Gateway), (&l.storage, Role::Storage)] {
                for n in names {
                    match self.host(n) {
                        Some(h) if h.role == role => {}
                        Some(h) => bail!("lane {i}: {n:?} is a {:?} host, not {role:?}", h.role),
                        None => bail!("lane {i}: no host named {n:?}"),
                    }
                }
            }
        }
        Ok(())
    }

    /// The host with that name.
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// This process's host: by `name`, or by the launcher's rank variable
    /// (Slurm, Open MPI, PMI) as an index into the hosts.
    pub fn me(&self, name: Option<&str>) -> anyhow::Result<&Host> {
        if let Some(n) = name {
            return self
                .host(n)
                .with_context(|| format!("no host named {n:?} in the cluster file"));
        }
        for var in ["SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"] {
            if let Ok(v) = std::env::var(var) {
                let rank: usize = v.parse().with_context(|| format!("{var}={v}"))?;
                return self.hosts.get(rank).with_context(|| {
                    format!("{var}={rank} but the file has {} hosts", self.hosts.len())
                });
            }
        }
        bail!("name the host with --host, or start under a launcher that sets SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK")
    }

    /// The lane whose gateways serve storage host `name`.
    pub fn lane_of(&self, storage: &str) -> Option<&Lane> {
        self.lanes
            .iter()
            .find(|l| l.storage.iter().any(|s| s == storage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_default_parses() {
        let c = Cluster::parse(DEFAULT).unwrap();
        assert_eq!(c.hosts.len(), 4);
        assert_eq!(c.lane_of("store0").unwrap().gateways, ["gw0", "gw1"]);
        assert_eq!(c.me(Some("gw1")).unwrap().node, 22);
    }

    #[test]
    fn settings_default_and_can_be_set() {
        let hosts = "[[host]]\nname = 'a'\nrole = 'compute'\nnode = 1\nfabric = '127.0.0.1:1'\n";
        let c = Cluster::parse(hosts).unwrap();
        assert_eq!(c.send_config().health.interval, 100_000_000, "default");
        assert_eq!(
            Cluster::parse(DEFAULT).unwrap().send_config().health.misses,
            3
        );
        let text = format!("{hosts}[health]\ninterval_ms = 20\nmisses = 2\n[stripe]\nchunk_kib = 256\nwindow = 8\n");
        let s = Cluster::parse(&text).unwrap().send_config();
        assert_eq!((s.health.interval, s.health.misses), (20_000_000, 2));
        assert_eq!(
            (s.stripe.chunk, s.stripe.window, s.stripe.rto),
            (256 * 1024, 8, 500_000_000)
        );
        assert!(Cluster::parse(&format!("{hosts}[health]\nmisses = 0\n")).is_err());
    }

    #[test]
    fn bad_files_get_clear_errors() {
        let cases = [
            ("[[host]]\nname='a'\nrole='router'\nnode=1\nfabric='127.0.0.1:1'", "unknown variant"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1", "no address"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1\nfabric='127.0.0.1:1'\n[[host]]\nname='a'\nrole='gateway'\nnode=2\nfabric='127.0.0.1:2'", "appears twice"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1\nfabric='127.0.0.1:1'\n[[lane]]\ngateways=['a']\nstorage=['b']", "not Gateway"),
            ("[[lane]]\ngateways=['x']\nstorage=['y']", "no host named"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1\nfabric='not an address'", "invalid socket address"),
            ("[[host]]\nname='a'\nrole='compute'\nnode=1\nfabric='127.0.0.1:1'\ncolour='red'", "unknown field"),
        ];
        for (text, want) in cases {
            let err = format!("{:#}", Cluster::parse(text).unwrap_err());
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
