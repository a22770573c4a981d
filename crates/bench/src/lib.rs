//! Benchmarks: the shapes of the source papers' tables, measured here, and
//! beside each figure the established tool that does the same job, run in
//! the same command.
//!
//! Messaging (`bench bw`, `lat`, `oneway`, `breakdown`): an initiator and a
//! target process, each measuring its own CPU time.
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
//! what it really burnt. Results are plain data ([`report`]) printed as
//! tables, JSON, CSV and plots.
//!
//! Beside the peers ([`peers`]: one module per established tool):
//! [`compare`] puts messaging figures beside ucx_perftest, iperf3 and
//! sockperf; [`gateways`] runs PaScal's lanes in network namespaces beside
//! the kernel's multipath routes (iperf3); [`files`] puts `macrolink cp`
//! beside xrdcp and cp. [`idle`] measures what quiet connections cost a
//! busy one, in one process; [`wake`] what waking a sleeping thread costs
//! it, the floor under a waiting reader's CPU.

pub mod balloon;
pub mod client;
pub mod clock;
pub mod compare;
pub mod demo;
pub mod echo;
pub mod files;
pub mod floor;
pub mod gateways;
pub mod idle;
pub mod manage;
pub mod peers;
pub mod pin;
pub mod plot;
pub mod progress;
pub mod proto;
pub mod range;
pub mod report;
pub mod server;
pub mod session;
pub mod sleeps;
pub mod stalls;
pub mod stats;
pub mod sweep;
pub mod wake;

/// The papers' message sizes (bytes), 10 B to 4 MB.
pub const PAPER_SIZES: [usize; 15] = [
    10, 100, 1000, 2000, 3000, 5000, 10_000, 50_000, 100_000, 250_000, 500_000, 750_000, 1_000_000,
    2_000_000, 4_000_000,
];

/// Endpoint id of the control endpoint on both sides.
pub const CTL_EP: u32 = 1;
/// Endpoint id of the data endpoint on both sides.
pub const DATA_EP: u32 = 2;
