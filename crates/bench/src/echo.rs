//! The peer of `macrolink echo`: answers every message with the same
//! message, and every notified put with the bytes it placed (as a reliable
//! message), over the transport it came by.

use macrolink_fabric::{Completion, Endpoint, EndpointConfig, Error, Mode, RecvKind, RegionKey};

/// Largest message an echo endpoint takes: a peer that announces more
/// breaks the protocol and loses its connection, so no peer can make the
/// echo grow its buffer past this.
pub const MAX_MESSAGE: u64 = 64 << 20;
/// Bytes of the buffer kept between messages.
const KEPT: usize = 1 << 20;

/// The settings of an echo endpoint.
pub fn endpoint_config(completion: Completion) -> EndpointConfig {
    EndpointConfig {
        completion,
        max_message: MAX_MESSAGE,
        ..EndpointConfig::default()
    }
}

/// What an echo process bears per endpoint, for its start-up message.
pub fn limits(cfg: &EndpointConfig) -> String {
    format!(
        "messages up to {} MiB (a larger one costs its sender the connection); buffers up to {} MiB per endpoint, back to {} MiB after each message; receive pool {} KiB",
        cfg.max_message >> 20,
        cfg.max_message >> 20,
        KEPT >> 20,
        (cfg.tokens * cfg.token_size) >> 10
    )
}

/// Answers on `ep` until the process ends; `region` is the key of the
/// region the endpoint registered, if any.
pub fn serve(mut ep: Endpoint, region: Option<RegionKey>) {
    let mut buf = vec![0u8; KEPT];
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
                if buf.len() < r.len {
                    buf.resize(r.len, 0);
                }
                if ep
                    .read_region(key, offset as usize, &mut buf[..r.len])
                    .is_err()
                {
                    continue;
                }
                (Mode::Reliable, &buf[..r.len])
            }
        };
        // Over the connection it came in on: the sender may be reachable
        // only that way (through a relay, from behind an address it dialled).
        let sent = ep.reply_target(&r, mode).and_then(|t| ep.write(t, data));
        if let Err(e) = sent {
            tracing::info!("cannot answer {}: {e}", r.from);
        }
        if buf.len() > KEPT {
            // One large message must not keep its memory for good.
            buf.truncate(KEPT);
            buf.shrink_to_fit();
        }
    }
}
