//! Messaging benchmarks: the shapes of the source papers' tables.
//!
//! ```text
//!  initiator (client.rs)                     target (server.rs)
//!  ctl 1:1 ── Start{test, mode, size, count} ─► ctl 2:1
//!                     ◄──────────── Ready ─────
//!  data 1:2 ══ messages / puts / ping-pongs ══► data 2:2
//!                     ◄── Done{cpu, wall, bytes, samples} ─
//! ```
//!
//! Each side measures its own process CPU time over the run, so a polling
//! side shows about 100% as in the papers' tables, and a waiting side shows
//! what it really burnt. Results are plain data ([`report`]) that the CLI
//! prints as tables, JSON, CSV and plots.

pub mod client;
pub mod clock;
pub mod plot;
pub mod proto;
pub mod report;
pub mod server;
pub mod stats;

/// The papers' message sizes (bytes), 10 B to 4 MB.
pub const PAPER_SIZES: [usize; 15] = [
    10, 100, 1000, 2000, 3000, 5000, 10_000, 50_000, 100_000, 250_000, 500_000, 750_000, 1_000_000,
    2_000_000, 4_000_000,
];

/// Endpoint id of the control endpoint on both sides.
pub const CTL_EP: u32 = 1;
/// Endpoint id of the data endpoint on both sides.
pub const DATA_EP: u32 = 2;
