//! The peer of `macrolink echo`: answers every message with the same
//! message, and every notified put with the bytes it placed (as a reliable
//! message), over the transport it came by.

use macrolink_fabric::{Endpoint, Error, Mode, RecvKind, RegionKey};

/// Answers on `ep` until the process ends; `region` is the key of the
/// region the endpoint registered, if any.
pub fn serve(mut ep: Endpoint, region: Option<RegionKey>) {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let r = match ep.read(&mut buf) {
            Ok(r) => r,
            Err(Error::BufferTooSmall { needed, .. }) => {
                buf.resize(needed, 0);
                continue;
            }
            Err(Error::PeerLost { peer, reason }) => {
                tracing::info!("peer {peer} gone: {reason}");
                continue;
            }
            Err(e) => {
                tracing::warn!("endpoint {}: {e}", ep.addr());
                continue;
            }
        };
        let (mode, data) = match r.kind {
            RecvKind::Message(mode) => (mode, &buf[..r.len]),
            RecvKind::PutPlaced { key, offset } => {
                if Some(key) != region {
                    continue;
                }
                let Some(mem) = ep.region(key) else { continue };
                let off = offset as usize;
                if buf.len() < r.len {
                    buf.resize(r.len, 0);
                }
                buf[..r.len].copy_from_slice(&mem[off..off + r.len]);
                (Mode::Reliable, &buf[..r.len])
            }
        };
        let sent = ep
            .target_via(r.from, mode, r.transport)
            .and_then(|t| ep.write(t, data));
        if let Err(e) = sent {
            tracing::info!("cannot answer {}: {e}", r.from);
        }
    }
}
