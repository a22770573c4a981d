//! What a link does to the packets that cross it, one direction at a time:
//! the model of `macrolink link` (the user-space emulator between two TUN
//! devices), usable in process as well, for tests of protocols without
//! namespaces. No I/O and no clock of its own: the caller says what time it
//! is.
//!
//! ```text
//!  offer(now, len) ─► loss model ─► token bucket + bounded queue ─► delay + jitter ─► line
//!                     (Bernoulli,    (rate; tail drop past bytes    (fixed or km;        │
//!                      Gilbert-       or time)                        distribution,       │
//!                      Elliott)                                       correlation)        │
//!  pop_due(now) ◄── in order, unless reordered ◄── duplicated, corrupted (a bit to flip) ◄┘
//! ```
//!
//! A seed makes every decision repeatable.

mod bucket;
pub mod forward;
mod jitter;
mod loss;
mod parse;
mod pipe;
mod spec;
mod stats;
pub mod tun;

pub use jitter::{Distribution, Jitter};
pub use loss::LossModel;
pub use parse::DEFAULT_QUEUE;
pub use pipe::{flip, Delivery, Fate, Pipe};
pub use spec::{QueueLimit, Rate, Spec, NS_PER_KM};
pub use stats::Stats;

/// Nanoseconds on the caller's clock.
pub type Nanos = u64;
