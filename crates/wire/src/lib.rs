//! Frame formats of the macrolink fabric.
//!
//! Every byte that crosses a transport starts with one fixed-size [`Header`]
//! (56 bytes, little endian). Data follows the header as `len` payload bytes.
//!
//! ```text
//!  sender                                   receiver
//!  ------                                   --------
//!  Header::encode ──► [header | payload] ──► Header::decode ──► demultiplex by
//!                     stream (tcp, shm)       (typed error on    (src node, src ep,
//!                     or one datagram (udp)    malformed input)   dst ep)
//! ```
//!
//! The crate does no I/O and holds no state: it turns bytes into headers and
//! back, and refuses anything malformed, truncated or oversized with a
//! [`WireError`]. It never panics on input; the fuzz targets under `fuzz/`
//! and the property tests below check that.
#![forbid(unsafe_code)]

pub mod haul;
mod header;
mod hello;
pub mod manage;
pub mod ucx;

pub use header::{
    Flags, FrameKind, Header, Refusal, WireError, HEADER_LEN, MAGIC, MAX_DATAGRAM, MAX_FRAME,
    VERSION,
};
pub use hello::{Challenge, Proof, CHALLENGE_LEN, MAC_LEN, NONCE_LEN, PROOF_LEN};
