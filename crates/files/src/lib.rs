//! The file service: RFIO's model on the macrolink fabric. Contact,
//! authentication and metadata go over a TCP connection; file data moves
//! over the fastest fabric path both hosts share (shared memory on one
//! host, TCP otherwise) as one-sided puts into the receiver's registered
//! regions, with credits flowing back.
//!
//! ```text
//!   macrolink cp / ls / ...                     macrolink serve ROOT
//!   ┌────────────┐   TCP: challenge, auth,      ┌──────────────────┐
//!   │ client     │◄─── requests, replies ──────►│ session thread   │
//!   │            │                              │  ops on ROOT      │
//!   │ streams ×N │◄════ fabric: puts, credits ═►│ streams ×N        │
//!   └────────────┘                              └──────────────────┘
//! ```
//!
//! [`proto`], [`auth`], [`confine`], [`credit`] and [`sums`] are pure; [`data`] runs one
//! transfer's streams; [`server`] and [`client`] hold the sockets; [`copy`]
//! is what `macrolink cp` does with them; [`direct`] and [`uncached`] are
//! the ways a received file is written besides the page cache's own.

#![forbid(unsafe_code)]

pub mod auth;
pub mod check;
pub mod client;
pub mod confine;
pub mod copy;
pub mod credit;
pub mod data;
pub mod direct;
pub mod error;
pub mod lane;
pub mod meter;
pub mod ops;
pub mod partial;
pub mod proto;
pub mod server;
pub mod setup;
pub mod stripe;
pub mod sums;
pub mod uncached;
mod wire_io;

pub use client::{Client, ClientOptions, Moved};
pub use error::{exit, Error, Result};
pub use server::{Limits, ServeConfig, Server};
pub use setup::ClientSetup;
