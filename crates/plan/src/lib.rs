//! The models a site designer uses before buying anything, from the source
//! papers, as pure functions: no I/O, no clock. Each module states the
//! paper's formula beside the code and has a `paper()` that puts every
//! figure the paper prints beside the model's, naming the paper's slips.
//!
//! ```text
//!  pascal        FESIO vs PaScal: switches, ports, cables, NICs, RIOB, WIOB, cost, CGI
//!  storage       CERN storage macro-clusters: RAID groups, capacity, bandwidth
//!  interconnect  CERN's price and latency table, and N hosts on each
//!  range         Longbow: latency per relay pair and per km, BDP, throughput per buffer
//!  latency       DP-II: L(l) = T_startup + T_send + T_net + T_delivery, fitted
//!  design        a lane for a target bandwidth, and its Level-2 cost
//!  prices        the price table (TOML; the paper's by default)
//!  report        what a subcommand shows: table, rows, the paper's figures, a plot
//! ```
#![forbid(unsafe_code)]

pub mod check;
pub mod design;
pub mod interconnect;
pub mod latency;
pub mod pascal;
pub mod prices;
pub mod range;
pub mod report;
pub mod storage;

pub use check::Check;
pub use prices::Prices;
pub use report::{Plot, Report};
