//! I/O gateway logic (PaScal): compute hosts reach storage through N gateway
//! hosts. This crate holds the decisions, as state machines that take events
//! and `now` and return what to do; it does no I/O and reads no clock.
//!
//! ```text
//!   compute host                        gateways            storage host
//!   ────────────                        ────────            ────────────
//!   Paths::pick(flow) ── ECMP hash ───►  gw 0  ─┐
//!   Striper: chunks ─── round robin ──►  gw 1  ─┼──────────► Assembler
//!     ▲   retransmit on path down / RTO  gw 2  ─┘            (each chunk once,
//!     └── acks ◄────────────────────────────────────────────  checksum at end)
//!   Health: heartbeats per gateway; a gateway that misses `misses` in a row
//!   is down (taken out of Paths, its chunks sent again elsewhere); one that
//!   answers again is up.
//! ```
//!
//! A gateway with several storage-side links spreads its messages over them
//! ([`rails::Rails`]); a transfer's view of which gateways it may use, and
//! when to dial one again, is [`lanes::Lanes`]. Transfers of one process
//! tell each other which gateways they heard from, and share each
//! gateway's window ([`heard::Heard`], `Striper::set_others`).
//!
//! The driver loop: feed `Health::on_reply` / `Striper::on_ack` as answers
//! arrive, call `Health::poll(now)` and `Striper::poll_transmit(now)` for what
//! to send, and sleep until the earliest `next_deadline`.
#![forbid(unsafe_code)]

pub mod assemble;
pub mod health;
pub mod heard;
pub mod lanes;
pub mod msg;
pub mod paths;
pub mod rails;
pub mod stripe;

/// Index of a gateway (a path) in a lane.
pub type Gw = usize;

/// Nanoseconds on the caller's clock.
pub type Nanos = u64;
