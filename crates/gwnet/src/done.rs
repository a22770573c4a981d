//! The end of a job under a launcher. A job of `macrolink node` processes
//! (`srun -n4 macrolink node C.toml --until-done`) holds compute hosts,
//! which end when their work is over, and service hosts (gateways, storage),
//! which would serve for ever. Each compute host, once done, says so to
//! every service host; a service host started with `--until-done` ends once
//! every compute host of the cluster file has, so the job ends with them.
//!
//! ```text
//!  compute host ── DONE (reliable, endpoint DONE_EP) ──► service host
//!               ◄── BYE ─────────────────────────────── Pending::heard(node)
//!                                                        all heard: exit 0
//! ```
//!
//! Only a fabric peer that proved the cluster's secret can say done, and
//! only for the node id it proved; a node id that is not a compute host of
//! the file counts for nothing.

use macrolink_cluster::{Cluster, Role};
use macrolink_fabric::{Addr, Completion, Endpoint, EndpointConfig, Error, Mode, RecvKind, Result};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The endpoint id on which a service host hears that compute hosts are
/// done ("DONE").
pub const DONE_EP: u32 = 0x444f_4e45;

/// What a compute host says.
const DONE: &[u8] = b"macrolink: done\n";
/// What a service host answers.
const BYE: &[u8] = b"macrolink: bye\n";

/// Largest message the done endpoint takes.
const MAX_MESSAGE: usize = 64;

/// Settings of a done endpoint, on either side: waiting completion, small
/// messages only.
pub fn endpoint_config() -> EndpointConfig {
    EndpointConfig {
        completion: Completion::Wait,
        send_timeout: Some(crate::SEND_TIMEOUT),
        max_message: MAX_MESSAGE as u64,
        ..EndpointConfig::default()
    }
}

/// What a service host made of a done message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// A compute host it was waiting for.
    Counted,
    /// A compute host that had already said so.
    Again,
    /// A node that is no compute host of the file.
    Stranger,
}

/// The compute hosts a service host still waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    waiting: BTreeSet<u32>,
    heard: BTreeSet<u32>,
}

impl Pending {
    /// Waiting for the given compute nodes.
    pub fn new(nodes: impl IntoIterator<Item = u32>) -> Pending {
        Pending {
            waiting: nodes.into_iter().collect(),
            heard: BTreeSet::new(),
        }
    }

    /// Waiting for every compute host of `c`.
    pub fn of(c: &Cluster) -> Pending {
        Pending::new(c.with_role(Role::Compute).map(|h| h.node))
    }

    /// Node `node` said it is done.
    pub fn heard(&mut self, node: u32) -> Heard {
        if self.waiting.remove(&node) {
            self.heard.insert(node);
            Heard::Counted
        } else if self.heard.contains(&node) {
            Heard::Again
        } else {
            Heard::Stranger
        }
    }

    /// Whether every compute host has said so.
    pub fn done(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Compute hosts not heard from yet.
    pub fn waiting(&self) -> impl Iterator<Item = u32> + '_ {
        self.waiting.iter().copied()
    }
}

/// A service host's side: answers every done message on `ep` (opened as
/// [`DONE_EP`] with [`endpoint_config`]) and returns once every node of
/// `pending` has said it is done.
pub fn wait(mut ep: Endpoint, mut pending: Pending) -> Result<()> {
    let mut buf = [0u8; MAX_MESSAGE];
    while !pending.done() {
        let r = match ep.read(&mut buf) {
            Ok(r) => r,
            Err(Error::PeerLost { .. }) => continue,
            // Too long to be ours: read and thrown away.
            Err(Error::BufferTooSmall { needed, .. }) => {
                let mut big = vec![0u8; needed.min(crate::MAX_MESSAGE as usize)];
                let _ = ep.read(&mut big);
                continue;
            }
            Err(e) => return Err(e),
        };
        // Only reliable messages: their sender proved the key for the node
        // it names (a datagram's node id is only what it says).
        if r.kind != RecvKind::Message(Mode::Reliable) || &buf[..r.len] != DONE {
            tracing::warn!("node {}: not a done message; ignored", r.from.node);
            continue;
        }
        match pending.heard(r.from.node) {
            Heard::Stranger => {
                tracing::warn!("node {} is no compute host; ignored", r.from.node);
                continue;
            }
            Heard::Again => {}
            Heard::Counted => {
                let left: Vec<u32> = pending.waiting().collect();
                tracing::info!("compute node {} is done; waiting for {left:?}", r.from.node);
            }
        }
        let answered = ep
            .reply_target(&r, Mode::Reliable)
            .and_then(|t| ep.write(t, BYE));
        if let Err(e) = answered {
            tracing::debug!("no answer to node {}: {e}", r.from.node);
        }
    }
    Ok(())
}

/// A compute host's side: tells each node of `services` on `ep` that this
/// host is done, and waits up to `within` for each to answer. A service
/// host that does not wait for compute hosts (no `--until-done`) counts as
/// answered. Returns those that did not answer.
pub fn announce(ep: &mut Endpoint, services: &[u32], within: Duration) -> Vec<u32> {
    let until = Instant::now() + within;
    let mut told = BTreeSet::new();
    let mut answered = BTreeSet::new();
    let mut buf = [0u8; MAX_MESSAGE];
    while answered.len() < services.len() && Instant::now() < until {
        let untold: Vec<u32> = services
            .iter()
            .filter(|s| !told.contains(*s))
            .copied()
            .collect();
        for s in untold {
            let to = Addr::new(s, DONE_EP);
            match ep
                .target(to, Mode::Reliable)
                .and_then(|t| ep.write(t, DONE))
            {
                Ok(()) => {
                    told.insert(s);
                }
                Err(Error::NoSuchEndpoint(_)) => {
                    tracing::debug!("node {s} does not wait for compute hosts");
                    told.insert(s);
                    answered.insert(s);
                }
                Err(e) => tracing::debug!("node {s} not told yet: {e}"),
            }
        }
        match ep.read_timeout(&mut buf, Duration::from_millis(100)) {
            Ok(Some(r)) if &buf[..r.len] == BYE => {
                answered.insert(r.from.node);
            }
            Ok(_) => {}
            Err(Error::PeerLost { peer, .. }) if !answered.contains(&peer.node) => {
                told.remove(&peer.node);
            }
            Err(e) => tracing::debug!("waiting for answers: {e}"),
        }
    }
    services
        .iter()
        .filter(|s| !answered.contains(*s))
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_counts_each_compute_host_once_and_no_stranger() {
        let mut p = Pending::new([1, 2]);
        assert!(!p.done());
        assert_eq!(p.heard(7), Heard::Stranger);
        assert_eq!(p.heard(1), Heard::Counted);
        assert_eq!(p.heard(1), Heard::Again);
        assert!(!p.done(), "one of two");
        assert_eq!(p.waiting().collect::<Vec<_>>(), [2]);
        assert_eq!(p.heard(2), Heard::Counted);
        assert!(p.done());
        assert_eq!(p.heard(7), Heard::Stranger);
    }

    #[test]
    fn pending_of_a_cluster_waits_for_its_compute_hosts() {
        let c = Cluster::embedded();
        let p = Pending::of(&c);
        let want: Vec<u32> = c.with_role(Role::Compute).map(|h| h.node).collect();
        assert_eq!(p.waiting().collect::<Vec<_>>(), want);
        assert!(!want.is_empty());
    }
}
