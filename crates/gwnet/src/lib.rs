//! I/O gateways over the fabric: the decisions of `macrolink-gateway` driven
//! by real endpoints.
//!
//! ```text
//!  client (compute host)        relay (gateway host)        sink (storage host)
//!  Striper + Health ── Chunk ──► forwards to `to` ── Chunk ──► Assembler
//!        ▲          ◄── Ack ──── forwards to `to` ◄── Ack ───    │
//!        └── Ping/Pong (answered by the relay itself)            ▼
//!  Done{hash} ─────────────────────────────────────────────► Verdict
//! ```
//!
//! The hash is [`transfer_hash`] of the chunks' hashes, which each end
//! computes as chunks go by, not in a pass over the whole at the end.
#![forbid(unsafe_code)]

pub mod check;
pub mod client;
pub mod done;
pub mod relay;
pub mod sink;

/// The hash of one chunk.
pub fn chunk_hash(data: &[u8]) -> u64 {
    XxHash3_64::oneshot(data)
}

/// The whole transfer's hash, as `Done` carries it: the hash of its chunks'
/// hashes in sequence order. Both ends hash each chunk as it goes by, so
/// checking the whole costs nothing once the last chunk is in.
pub fn transfer_hash(chunks: &[u64]) -> u64 {
    let bytes: Vec<u8> = chunks.iter().flat_map(|c| c.to_le_bytes()).collect();
    XxHash3_64::oneshot(&bytes)
}

use macrolink_fabric::{Addr, Completion, EndpointConfig};
use std::time::Duration;

/// How long a gateway-protocol endpoint waits for a peer that takes nothing
/// (a hung host: its connections stay open) before giving it up. Far longer
/// than a healthy peer ever makes a 1 MiB chunk wait.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings of every endpoint that speaks the gateway protocol (compute
/// hosts, relays, storage hosts): waiting completion, tokens for the many
/// small acknowledgements, and [`SEND_TIMEOUT`], so that one hung peer of a
/// relay or a storage host cannot hold up the others.
pub fn endpoint_config() -> EndpointConfig {
    EndpointConfig {
        completion: Completion::Wait,
        tokens: 256,
        send_timeout: Some(SEND_TIMEOUT),
        max_message: MAX_MESSAGE,
        ..EndpointConfig::default()
    }
}

/// Largest gateway-protocol message (a chunk and its header): what a
/// relay's or sink's buffer may grow to.
pub const MAX_MESSAGE: u64 = 64 << 20;
use twox_hash::XxHash3_64;

fn to_pair(a: Addr) -> (u32, u32) {
    (a.node, a.ep)
}

fn from_pair(p: (u32, u32)) -> Addr {
    Addr::new(p.0, p.1)
}
