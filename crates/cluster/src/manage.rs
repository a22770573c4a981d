//! Macro-clusters and their management: groups of hosts (4, 8 or 16 in
//! the paper), each with a manager and a fallback, which report to one
//! central manager; and what the managers do (probe, check health, reset,
//! exclude). Each host that takes part has a `manage` address, where its
//! agent answers probes and where its managers listen.
//!
//! ```text
//!  [[macro]] name, hosts, manager, fallback ──reports──► [manage] central
//! ```

use serde::Deserialize;

/// One macro-cluster.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Macro {
    /// Name.
    pub name: String,
    /// Its hosts.
    pub hosts: Vec<String>,
    /// The host that manages it (one of its hosts, or a small machine of
    /// its own).
    pub manager: String,
    /// The host that takes over when the manager is gone.
    pub fallback: String,
}

/// How the cluster is managed; each setting left out takes the manager's
/// default.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ManageSettings {
    /// The host of the central manager.
    pub central: Option<String>,
    /// Time between probes of one host, ms.
    pub probe_ms: Option<u64>,
    /// Suspicion before a host is failed, ms.
    pub suspicion_ms: Option<u64>,
    /// Silence of the manager after which the fallback takes over, ms.
    pub lease_ms: Option<u64>,
    /// Health check run on each host: exit 0 healthy, 1 unhealthy (the
    /// reason on stdout), anything else the check itself failed.
    pub health_command: Option<String>,
    /// Time between health checks, ms.
    pub health_ms: Option<u64>,
    /// Command that resets a host (`{host}` is its name); by default the
    /// host's process is restarted.
    pub reset_command: Option<String>,
    /// Command run when a host is excluded (`{host}`, `{reason}`), e.g.
    /// `scontrol update nodename={host} state=drain reason="{reason}"`.
    pub exclude_command: Option<String>,
    /// Command run when a host is included again (`{host}`).
    pub include_command: Option<String>,
    /// A reset host must be back within this, s.
    pub come_back_s: Option<u64>,
    /// A host failing again within this of its reset is excluded, s.
    pub again_within_s: Option<u64>,
    /// More than this share of a group dark at once: no action.
    pub dark_share: Option<f64>,
    /// Most resets a minute, cluster-wide.
    pub resets_per_minute: Option<u32>,
    /// Most exclusions a minute, cluster-wide.
    pub exclusions_per_minute: Option<u32>,
}
