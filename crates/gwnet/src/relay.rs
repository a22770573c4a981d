//! The gateway: relays chunks toward storage and acks back toward compute
//! hosts, and answers heartbeats. No application code runs here.
//!
//! A storage host reached over several links (rails) gets a connection per
//! link; messages go round-robin over the rails that work, and a rail that
//! fails is left alone for a while (link aggregation with failover).

use macrolink_fabric::{Addr, Endpoint, Error, IoBuf, Mode, Result, Transport};
use macrolink_gateway::msg::Msg;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::from_pair;

/// How long a failed rail first rests before it is tried again; each further
/// failure doubles it, up to `RAIL_REST_MAX`.
const RAIL_REST: Duration = Duration::from_secs(1);
const RAIL_REST_MAX: Duration = Duration::from_secs(30);

/// The storage-side links of a gateway, per storage node.
#[derive(Debug, Default)]
pub struct Rails {
    links: HashMap<u32, Vec<SocketAddr>>,
    next: HashMap<u32, usize>,
    /// Failed rails: until when they rest, and how long the last rest was.
    resting: HashMap<SocketAddr, (Instant, Duration)>,
}

impl Rails {
    /// Rails from (node, address) pairs; a node named once has one rail.
    pub fn new(pairs: &[(u32, SocketAddr)]) -> Rails {
        let mut links: HashMap<u32, Vec<SocketAddr>> = HashMap::new();
        for (n, a) in pairs {
            links.entry(*n).or_default().push(*a);
        }
        Rails {
            links,
            ..Rails::default()
        }
    }

    /// Writes `msg` to `to` over the next working rail, or over the
    /// endpoint's usual connection when `to` has no rails.
    fn send(&mut self, ep: &mut Endpoint, to: Addr, msg: &[u8]) -> Result<()> {
        let Some(links) = self.links.get(&to.node).filter(|l| l.len() > 1) else {
            let t = ep.target_via(to, Mode::Reliable, Transport::Tcp)?;
            return ep.write(t, msg);
        };
        let n = links.len();
        let start = *self.next.get(&to.node).unwrap_or(&0);
        let mut last = Err(Error::Unreachable {
            node: to.node,
            transport: Transport::Tcp,
        });
        for k in 0..n {
            let addr = links[(start + k) % n];
            if self
                .resting
                .get(&addr)
                .is_some_and(|(until, _)| Instant::now() < *until)
            {
                continue;
            }
            match ep
                .target_at(to, Mode::Reliable, addr)
                .and_then(|t| ep.write(t, msg))
            {
                Ok(()) => {
                    self.next.insert(to.node, (start + k + 1) % n);
                    self.resting.remove(&addr);
                    return Ok(());
                }
                Err(e) => {
                    let rest = self
                        .resting
                        .get(&addr)
                        .map_or(RAIL_REST, |(_, r)| (*r * 2).min(RAIL_REST_MAX));
                    tracing::info!("relay: rail {addr} to {to} failed ({e}); resting {rest:?}");
                    self.resting.insert(addr, (Instant::now() + rest, rest));
                    last = Err(e);
                }
            }
        }
        last
    }
}

/// Relays until the endpoint fails.
pub fn run(mut ep: Endpoint, mut rails: Rails) -> Result<()> {
    let mut buf = IoBuf::new(8 << 20)?;
    let mut out = Vec::with_capacity(64);
    loop {
        let r = match ep.read(&mut buf) {
            Ok(r) => r,
            Err(Error::PeerLost { peer, reason }) => {
                tracing::info!("relay: {peer} gone: {reason}");
                continue;
            }
            Err(Error::BufferTooSmall { needed, .. }) => {
                buf.ensure(needed)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        let next = match Msg::decode(&buf[..r.len]) {
            Ok(Msg::Ping { seq }) => {
                out.clear();
                Msg::Pong { seq }.encode(&mut out);
                // Over the connection it came by; a peer gone since is no
                // reason for the relay to stop.
                let sent = ep
                    .reply_target(&r, Mode::Reliable)
                    .and_then(|t| ep.write(t, &out));
                if let Err(e) = sent {
                    tracing::info!("relay: cannot answer {}: {e}", r.from);
                }
                continue;
            }
            Ok(Msg::Chunk { to, .. }) | Ok(Msg::Done { to, .. }) | Ok(Msg::Hello { to, .. }) => {
                from_pair(to)
            }
            Ok(Msg::Ack { to, .. }) | Ok(Msg::Verdict { to, .. }) => from_pair(to),
            Ok(Msg::Pong { .. }) => continue,
            Err(e) => {
                tracing::warn!("relay: malformed message from {}: {e:?}", r.from);
                continue;
            }
        };
        if let Err(e) = rails.send(&mut ep, next, &buf[..r.len]) {
            tracing::info!("relay: cannot forward to {next}: {e}");
        }
    }
}
