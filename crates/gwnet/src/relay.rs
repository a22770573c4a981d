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
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;

use crate::from_pair;

/// Labels of a message kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// chunk, ack, done, verdict or hello.
    pub kind: String,
}

/// What a gateway counts (`macrolink gateway --metrics`); clones share it.
#[derive(Clone, Debug, Default)]
pub struct Meter {
    /// Messages relayed, by kind.
    pub relayed: Family<KindLabels, Counter>,
    /// Bytes relayed.
    pub bytes: Counter,
    /// Heartbeats answered.
    pub heartbeats: Counter,
    /// Messages that could not be passed on.
    pub dropped: Counter,
    /// Rails to storage taken out of use for a while.
    pub rail_failures: Counter,
}

impl Meter {
    /// Registers every counter in `r`.
    pub fn register(&self, r: &mut Registry) {
        r.register("relayed", "Messages relayed, by kind", self.relayed.clone());
        r.register("bytes", "Bytes relayed", self.bytes.clone());
        r.register("heartbeats", "Heartbeats answered", self.heartbeats.clone());
        r.register(
            "dropped",
            "Messages that could not be passed on",
            self.dropped.clone(),
        );
        r.register(
            "rail_failures",
            "Rails to storage that failed and were rested",
            self.rail_failures.clone(),
        );
    }

    fn relayed(&self, kind: &str, bytes: usize) {
        let kind = kind.to_string();
        self.relayed.get_or_create(&KindLabels { kind }).inc();
        self.bytes.inc_by(bytes as u64);
    }
}

/// Writes `msg` to `to` over the next working rail, or over the endpoint's
/// usual connection when `to` has only one.
fn forward(
    rails: &mut Rails<SocketAddr>,
    ep: &mut Endpoint,
    to: Addr,
    msg: &[u8],
    meter: &Meter,
) -> Result<()> {
    if !rails.bonded(to.node) {
        // A compute host that came over UCX is answered there; the rest
        // over tcp (the storage network).
        let t = match ep.connected_target(to, Mode::Reliable) {
            Some(t) => t,
            None => ep.target_via(to, Mode::Reliable, Transport::Tcp)?,
        };
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
                meter.rail_failures.inc();
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
/// so its configuration names that host too. `meter` counts what passes.
pub fn run(mut ep: Endpoint, peers: &[(u32, SocketAddr)], meter: &Meter) -> Result<()> {
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
                match sent {
                    Ok(()) => {
                        meter.heartbeats.inc();
                    }
                    Err(e) => tracing::info!("relay: cannot answer {}: {e}", r.from),
                }
                continue;
            }
            Ok(Msg::Chunk { to, .. }) => ("chunk", from_pair(to)),
            Ok(Msg::Done { to, .. }) => ("done", from_pair(to)),
            Ok(Msg::Hello { to, .. }) => ("hello", from_pair(to)),
            Ok(Msg::Ack { to, .. }) => ("ack", from_pair(to)),
            Ok(Msg::Verdict { to, .. }) => ("verdict", from_pair(to)),
            Ok(Msg::Pong { .. }) => continue,
            Err(e) => {
                tracing::warn!("relay: malformed message from {}: {e:?}", r.from);
                continue;
            }
        };
        let (kind, next) = next;
        match forward(&mut rails, &mut ep, next, &buf[..r.len], meter) {
            Ok(()) => meter.relayed(kind, r.len),
            Err(e) => {
                meter.dropped.inc();
                tracing::info!("relay: cannot forward to {next}: {e}");
            }
        }
    }
}
