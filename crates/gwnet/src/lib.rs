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
#![forbid(unsafe_code)]

pub mod client;
pub mod relay;
pub mod sink;

use macrolink_fabric::Addr;

fn to_pair(a: Addr) -> (u32, u32) {
    (a.node, a.ep)
}

fn from_pair(p: (u32, u32)) -> Addr {
    Addr::new(p.0, p.1)
}
