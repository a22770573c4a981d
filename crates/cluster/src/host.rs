//! One host of the cluster and what it does.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

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
    /// Joins its segment to another over a long link.
    Relay,
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
    /// Storage hosts: directory the file service exports.
    pub export: Option<PathBuf>,
    /// Relay hosts: UDP address on the long link.
    pub long: Option<SocketAddr>,
    /// Managed hosts: UDP address of its management agent (probes, health)
    /// and of the managers it runs.
    pub manage: Option<SocketAddr>,
}

impl Host {
    /// The address its node listens on: a storage host's storage-side
    /// address when it has one, every other host's fabric address.
    pub fn listen(&self) -> Option<SocketAddr> {
        match self.role {
            Role::Storage => self.storage.or(self.fabric),
            _ => self.fabric,
        }
    }
}
