//! Macro-cluster management (the macro-cluster paper's management
//! function): each group of hosts has a local manager, with a fallback, that
//! watches its hosts and reports to a central manager, which decides to
//! reset a host or exclude it. Here, as state machines with the clock
//! passed in and no I/O:
//!
//! ```text
//!   local manager                                   central manager
//!   Detector (probes, indirect probes, suspicion)   Policy (reset, then exclude;
//!        │ Alive / Suspect / Failed                   rate limits; the dark-group
//!        ▼                                            brake; operator orders)
//!   Lease (epoch) ── reports carry the epoch ──► EpochGate ──► Policy ──► Decision log
//!        ▲ beats
//!   fallback's Lease: takes over with epoch + 1 when the beats stop
//! ```
#![forbid(unsafe_code)]

pub mod detect;
pub mod excluded;
pub mod lease;
pub mod policy;

/// Nanoseconds on the caller's clock.
pub type Nanos = u64;

/// One millisecond.
pub const MS: Nanos = 1_000_000;
/// One second.
pub const SEC: Nanos = 1_000_000_000;
