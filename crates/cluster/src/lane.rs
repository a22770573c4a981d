//! IO lanes (PaScal): the gateways that serve a set of storage hosts.

use serde::Deserialize;

/// A group of gateways serving a set of storage hosts.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lane {
    /// Gateway host names.
    pub gateways: Vec<String>,
    /// Storage host names.
    pub storage: Vec<String>,
    /// Rate of each storage-side link of its gateways, Gbit/s (what
    /// `plan cluster` designs with).
    pub link_gbit: Option<f64>,
    /// Storage-side links per gateway.
    pub links: Option<u32>,
}
