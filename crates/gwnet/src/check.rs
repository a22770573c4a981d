//! The check a compute host of a cluster file runs at start (`macrolink
//! up`, `macrolink node`): one striped, hash-checked transfer to each
//! storage host through the gateways of its lane.

use macrolink_cluster::{Cluster, Host, Role};
use macrolink_fabric::{Addr, Node, NodeConfig, Result};
use std::path::Path;

use crate::client::{send, SendConfig};

/// How one path of the cluster did.
#[derive(Clone, Debug, PartialEq)]
pub struct PathCheck {
    /// The storage host.
    pub storage: String,
    /// What the data went through (the lane's gateways), and how.
    pub through: String,
    /// Bytes moved.
    pub bytes: u64,
    /// Seconds it took.
    pub secs: f64,
    /// Whether every byte arrived as sent.
    pub ok: bool,
}

/// The heading of the table of path checks.
pub const HEADER: &str = "compute    storage        bytes       MB/s  verified  through";

impl PathCheck {
    /// The check's row in the table, for compute host `host`.
    pub fn row(&self, host: &str) -> String {
        format!(
            "{:<10} {:<10} {:>9} {:>10.1} {:>9}  {}",
            host,
            self.storage,
            self.bytes,
            self.bytes as f64 / self.secs.max(1e-9) / 1e6,
            if self.ok { "yes" } else { "NO" },
            self.through
        )
    }
}

/// The arguments of `macrolink` that start gateway or storage host `h` of
/// `c` as a process of its own (without a file service).
pub fn role_args(c: &Cluster, h: &Host) -> Vec<String> {
    let mut args = vec![
        if h.role == Role::Gateway {
            "gateway"
        } else {
            "sink"
        }
        .to_string(),
        "--tcp".into(),
        h.listen().map(|a| a.to_string()).unwrap_or_default(),
    ];
    for (node, addr) in c.storage_peers(h) {
        args.push("--peer".into());
        args.push(format!("{node}={addr}"));
    }
    args
}

/// The fabric node of host `h` of a cluster, knowing the addresses of
/// `peers`.
pub fn node_config(h: &Host, shm: &Path, peers: &[(u32, std::net::SocketAddr)]) -> NodeConfig {
    let mut cfg = NodeConfig::local(h.node, shm);
    cfg.tcp = h.listen();
    cfg.peers = peers.iter().copied().collect();
    cfg
}

/// Sends `payload` from compute host `h` to every storage host of `c`
/// through its lane, and asks each for its verdict on the hash.
pub fn lanes(c: &Cluster, h: &Host, shm: &Path, payload: &[u8]) -> Result<Vec<PathCheck>> {
    let gateways: Vec<_> = c
        .with_role(Role::Gateway)
        .filter_map(|g| Some((g.node, c.address_of(h, g)?)))
        .collect();
    let node = Node::start(node_config(h, shm, &gateways))?;
    let mut ep = node.open(1, crate::endpoint_config())?;
    let mut out = Vec::new();
    for s in c.with_role(Role::Storage) {
        let Some(lane) = c.lane_of(&s.name) else {
            out.push(PathCheck {
                storage: s.name.clone(),
                through: "no lane serves it".into(),
                bytes: 0,
                secs: 0.0,
                ok: false,
            });
            continue;
        };
        let gws: Vec<Addr> = c.gateways_of(lane).map(|g| Addr::new(g.node, 1)).collect();
        let cfg = SendConfig::from_cluster(c);
        let to = Addr::new(s.node, 1);
        // A random transfer id: only the two ends know it, so no other
        // member of the fabric can speak for this transfer.
        let id = macrolink_fabric::key::nonce()?;
        let id = u64::from_le_bytes([id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7]]);
        let r = send(&mut ep, &gws, to, id, payload, cfg, &mut |_, _| {})?;
        out.push(PathCheck {
            storage: s.name.clone(),
            through: lane.gateways.join(","),
            bytes: r.bytes,
            secs: r.secs,
            ok: r.verified,
        });
    }
    Ok(out)
}
