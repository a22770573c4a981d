//! Range extension, as a pair of Obsidian Longbows does it for InfiniBand:
//! link-level credit flow control stalls a long link, because a sender may
//! have no more bytes on the wire than the receiver's buffer holds, and a
//! credit comes back only a round trip later. A relay at each end of the
//! long link holds a buffer as large as its bandwidth-delay product and
//! splits the path into three links in series, each with a credit loop of
//! its own, so the long one stays full.
//!
//! ```text
//!  host ──short──► relay A ════════ long link ════════► relay B ──short──► host
//!       ◄credits─┘        ◄─ credits for BDP bytes ──┘         ◄─credits─┘
//! ```
//!
//! Pure state machines: [`Credit`] (a sender's view of one link), [`Hop`]
//! (a relay's buffer between its upstream and downstream links), and the
//! sizing in [`window`]. No I/O, no clock.

mod credit;
pub mod haul;
mod hop;
pub mod window;

pub use credit::{Credit, Overreturn};
pub use hop::{Hop, Overrun};
