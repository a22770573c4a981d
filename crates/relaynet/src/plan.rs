//! A relay's [`Config`] from the cluster file: its ports, its peer, the
//! near hosts, the long link's settings, and the key of its datagrams.

use macrolink_cluster::{Cluster, Error as ClusterError, Host, Role};
use macrolink_relay::haul;
use std::collections::BTreeMap;

use crate::Config;
use macrolink_fabric::Key;

/// Connections one near address may hold, unless set.
pub const PER_SOURCE: usize = 256;

/// Why a host cannot run as a relay.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The host is not a relay of the file's pair.
    #[error("host {0:?} is not the relay of a segment (the file needs two [[segment]] tables, each naming its relay)")]
    NotARelay(String),
    /// The file itself.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// The configuration of relay host `h` of `c`, a cluster of `key`.
pub fn config(c: &Cluster, h: &Host, key: Key) -> Result<Config, PlanError> {
    let not = || PlanError::NotARelay(h.name.clone());
    if h.role != Role::Relay {
        return Err(not());
    }
    let plan = c.relay_plan(h).ok_or_else(not)?;
    let r = c.range;
    let mut haul = haul::Config {
        high: plan.high,
        rate: r.rate_mbit.map(|m| (m * 1e6 / 8.0) as u64),
        window: r.window_kib.map(|k| k << 10),
        ..haul::Config::default()
    };
    if let Some(p) = r.packet {
        // The file gives the datagram; the tag rides in it.
        haul.packet = p.clamp(256, 65_000) - crate::TAG_LEN;
    }
    if let Some(m) = r.buffer_mib {
        haul.receive_buffer = m << 20;
        haul.send_buffer = m << 20;
    }
    if let Some(ms) = r.dead_ms {
        haul.dead_after = ms * 1_000_000;
        haul.keepalive = haul.keepalive.min(haul.dead_after / 4);
    }
    Ok(Config {
        long_local: plan.long_local,
        long_peer: plan.long_peer,
        key,
        listen: plan.listen,
        near: plan.near.into_iter().collect::<BTreeMap<_, _>>(),
        near_files: plan.near_files.into_iter().collect(),
        haul,
        per_source: PER_SOURCE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_datagram_size_holds_the_tag_and_each_relay_gets_its_side() {
        let text = include_str!("../../../examples/clusters/two-segments.toml");
        let c = Cluster::parse(text).unwrap();
        let seal = || Key::from_secret(b"a relay plan's secret").unwrap();
        let east = config(&c, c.host("relay-east").unwrap(), seal()).unwrap();
        let west = config(&c, c.host("relay-west").unwrap(), seal()).unwrap();
        assert_eq!(east.haul.packet + crate::TAG_LEN, c.range.packet.unwrap());
        assert!(!east.haul.high && west.haul.high);
        assert_eq!(east.long_peer, west.long_local);
        assert_eq!(east.haul.dead_after, 3_000_000_000);
        assert_eq!(east.listen.len(), 3);
        assert_eq!(west.near.len(), 3);
        let store = c.host("store0").unwrap();
        assert_eq!(west.near_files.get(&store.node), store.files.as_ref());
        assert!(east.near_files.is_empty());
        let gw = c.host("gw0").unwrap();
        assert!(matches!(
            config(&c, gw, seal()),
            Err(PlanError::NotARelay(_))
        ));
    }
}
