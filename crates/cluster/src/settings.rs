//! Settings of the gateway protocol, as the file states them. A setting the
//! file leaves out is `None`: the service that uses it has its own default.

use serde::Deserialize;

/// Dead-gateway detection (`[health]`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HealthSettings {
    /// Milliseconds between heartbeats to a gateway.
    pub interval_ms: Option<u64>,
    /// Unanswered heartbeats in a row that take a gateway out of use.
    pub misses: Option<u32>,
}

/// Striping of transfers over the gateways of a lane (`[stripe]`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StripeSettings {
    /// KiB per chunk.
    pub chunk_kib: Option<u64>,
    /// Chunks in flight per gateway, shared by a process's transfers
    /// through it (each keeps at least one).
    pub window: Option<usize>,
    /// Milliseconds before an unanswered chunk is sent again.
    pub rto_ms: Option<u64>,
}
