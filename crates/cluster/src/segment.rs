//! Segments joined by a pair of range-extension relays. Each segment is a
//! fabric of its own (a site, a building); its relay listens on its near
//! address with one port per host of the other segment, so a host dials a
//! far host at its own relay and never needs a route across the long link.
//!
//! ```text
//!  segment east                                 segment west
//!  c0 ──► relay-east:7400+i ══ long link ══ relay-west ──► host i of west
//! ```

use serde::Deserialize;
use std::net::SocketAddr;

/// One segment.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Segment {
    /// Name.
    pub name: String,
    /// Its hosts, the relay included or not.
    pub hosts: Vec<String>,
    /// Its relay host (role `relay`).
    pub relay: String,
}

/// Settings of the long link between the relays; each left out is
/// measured or takes the relay's default.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RangeSettings {
    /// The long link's rate, Mbit/s: pace at it instead of measuring.
    pub rate_mbit: Option<f64>,
    /// Bytes in flight, KiB, instead of twice the measured
    /// bandwidth-delay product.
    pub window_kib: Option<u64>,
    /// Largest datagram on the long link, bytes (its MTU less 28).
    pub packet: Option<usize>,
    /// Buffer of each relay for each direction, MiB.
    pub buffer_mib: Option<u64>,
    /// Silence after which the peer relay is lost, ms.
    pub dead_ms: Option<u64>,
}

/// What a relay host needs to know to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayPlan {
    /// Its address on the long link.
    pub long_local: SocketAddr,
    /// The other relay's.
    pub long_peer: SocketAddr,
    /// For each far host's node, where near hosts dial it.
    pub listen: Vec<(u32, SocketAddr)>,
    /// Each near host's node and where it listens.
    pub near: Vec<(u32, SocketAddr)>,
    /// Each near storage host's node and its file service's contact
    /// address.
    pub near_files: Vec<(u32, SocketAddr)>,
    /// Whether it is the second of the pair (its flow ids are odd).
    pub high: bool,
}
