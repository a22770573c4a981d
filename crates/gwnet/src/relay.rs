//! The gateway: relays chunks toward storage and acks back toward compute
//! hosts, and answers heartbeats. No application code runs here.

use macrolink_fabric::{Endpoint, Error, Mode, Result, Transport};
use macrolink_gateway::msg::Msg;

use crate::from_pair;

/// Relays until the endpoint fails.
pub fn run(mut ep: Endpoint) -> Result<()> {
    let mut buf = vec![0u8; 8 << 20];
    let mut out = Vec::with_capacity(64);
    loop {
        let r = match ep.read(&mut buf) {
            Ok(r) => r,
            Err(Error::PeerLost { peer, reason }) => {
                tracing::info!("relay: {peer} gone: {reason}");
                continue;
            }
            Err(Error::BufferTooSmall { needed, .. }) => {
                buf.resize(needed, 0);
                continue;
            }
            Err(e) => return Err(e),
        };
        let next = match Msg::decode(&buf[..r.len]) {
            Ok(Msg::Ping { seq }) => {
                out.clear();
                Msg::Pong { seq }.encode(&mut out);
                let t = ep.target_via(r.from, Mode::Reliable, Transport::Tcp)?;
                if let Err(e) = ep.write(t, &out) {
                    tracing::info!("relay: cannot answer {}: {e}", r.from);
                }
                continue;
            }
            Ok(Msg::Chunk { to, .. }) | Ok(Msg::Done { to, .. }) => from_pair(to),
            Ok(Msg::Ack { to, .. }) | Ok(Msg::Verdict { to, .. }) => from_pair(to),
            Ok(Msg::Pong { .. }) => continue,
            Err(e) => {
                tracing::warn!("relay: malformed message from {}: {e:?}", r.from);
                continue;
            }
        };
        let sent = ep
            .target_via(next, Mode::Reliable, Transport::Tcp)
            .and_then(|t| ep.write(t, &buf[..r.len]));
        if let Err(e) = sent {
            tracing::info!("relay: cannot forward to {next}: {e}");
        }
    }
}
