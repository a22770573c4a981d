//! The gateway: relays chunks toward storage and acks back toward compute
//! hosts, and answers heartbeats. No application code runs here.
//!
//! A storage host reached over several links (rails) gets a connection per
//! link; messages go round-robin over the rails that work, and a rail that
//! fails is left alone for a while (link aggregation with failover: the
//! decisions are `macrolink_gateway::rails`, this module writes).

use macrolink_fabric::{clock_ns, Addr, Endpoint, Error, IoBuf, Mode, Result, Transport};
use macrolink_gateway::msg::Msg;
use macrolink_gateway::rails::Rails;
use std::net::SocketAddr;

use crate::from_pair;

/// Writes `msg` to `to` over the next working rail, or over the endpoint's
/// usual connection when `to` has only one.
fn forward(rails: &mut Rails<SocketAddr>, ep: &mut Endpoint, to: Addr, msg: &[u8]) -> Result<()> {
    if !rails.bonded(to.node) {
        let t = ep.target_via(to, Mode::Reliable, Transport::Tcp)?;
        return ep.write(t, msg);
    }
    let mut last = Error::Unreachable {
        node: to.node,
        transport: Transport::Tcp,
    };
    while let Some(addr) = rails.pick(to.node, clock_ns()) {
        match ep
            .target_at(to, Mode::Reliable, addr)
            .and_then(|t| ep.write(t, msg))
        {
            Ok(()) => {
                rails.sent(to.node, addr);
                return Ok(());
            }
            Err(e) => {
                let rest = rails.failed(addr, clock_ns());
                tracing::info!(
                    "relay: rail {addr} to {to} failed ({e}); resting {} ms",
                    rest / 1_000_000
                );
                last = e;
            }
        }
    }
    Err(last)
}

/// Relays until the endpoint fails, to the storage hosts `peers` names
/// (node, address; a node named more than once has a rail per address).
/// The endpoint's node reaches a host with one rail as it reaches any peer,
/// so its configuration names that host too.
pub fn run(mut ep: Endpoint, peers: &[(u32, SocketAddr)]) -> Result<()> {
    let mut rails = Rails::new(peers);
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
        if let Err(e) = forward(&mut rails, &mut ep, next, &buf[..r.len]) {
            tracing::info!("relay: cannot forward to {next}: {e}");
        }
    }
}
