//! A deterministic simulated network for testing protocol state machines
//! without sockets, threads or the system clock: a virtual clock, nodes
//! joined by one-way links with delay, rate, jitter, a bounded queue, seeded
//! loss and reordering, nodes that die, come back or freeze, and links that
//! are cut for a while.
//!
//! ```text
//!   loop {
//!       while let Some(d) = net.poll() {        // every message due by now()
//!           machine.on_message(d.to, d.msg, net.now());
//!       }
//!       for tx in machine.poll_transmit(net.now()) {
//!           net.send(link_of(tx), tx.bytes, tx.msg);  // delay, rate, loss, ...
//!       }
//!       net.advance_to(next(net.next_event(), machine.next_deadline()));
//!   }
//! ```
//!
//! The same seed and the same calls give the same deliveries, so a failing
//! run can be replayed; `LinkStats` says what each link did with its
//! messages.
#![forbid(unsafe_code)]

mod fate;
mod link;
mod net;

pub use fate::Outage;
pub use link::{LinkSpec, LinkStats, QueueLimit};
pub use net::{Delivery, LinkId, Net, NodeId};

/// Nanoseconds on the virtual clock.
pub type Nanos = u64;

/// One millisecond.
pub const MS: Nanos = 1_000_000;
/// One microsecond.
pub const US: Nanos = 1_000;
