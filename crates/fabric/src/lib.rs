//! The macrolink messaging core: Directed Point endpoints over shared memory,
//! TCP and UDP, with datagram, reliable and put modes.
//!
//! ```text
//!   process A (node 1)                         process B (node 2)
//!  ┌──────────────────────┐                  ┌──────────────────────┐
//!  │ Endpoint 1:7         │   shm rings      │ Endpoint 2:5         │
//!  │  target(2:5, mode) ──┼──────────────────┼─► read()             │
//!  │  write / put         │   or tcp / udp   │  token pool, regions │
//!  └──────────────────────┘                  └──────────────────────┘
//!        Node 1: listeners (tcp, unix socket) hand new connections
//!        to the endpoint named in the handshake.
//! ```
//!
//! The loop that drives it: the thread owning an endpoint calls `read`,
//! `write`, `put`, `wait_put` or `progress`; each call does one or more
//! passes over the endpoint's streams, placing arriving bytes straight into
//! the waiting reader's buffer, a registered region, or the token pool, and
//! then spins (polling completion) or sleeps in `poll(2)` (waiting completion)
//! until something stirs.
//!
//! ```no_run
//! use macrolink_fabric::{Addr, EndpointConfig, Mode, Node, NodeConfig};
//! let node = Node::start(NodeConfig::local(1, "/tmp/ml"))?;
//! let mut ep = node.open(7, EndpointConfig::default())?;
//! let t = ep.target(Addr::new(2, 5), Mode::Reliable)?;
//! ep.write(t, b"hello")?;
//! let mut buf = vec![0u8; 1 << 20];
//! let got = ep.read(&mut buf)?;
//! println!("{} bytes from {}", got.len, got.from);
//! # Ok::<(), macrolink_fabric::Error>(())
//! ```

mod endpoint;
mod error;
pub mod gate;
mod iobuf;
pub mod key;
mod node;
mod pool;
mod puts;
mod rx;
pub mod seal;
mod transport;
mod types;

pub use endpoint::Endpoint;
pub use error::{Error, Result};
pub use iobuf::IoBuf;
pub use key::Key;
pub use macrolink_wire::Refusal;
pub use node::{default_shm_dir, remove_sockets, Node, NodeConfig, DEFAULT_MTU, DEFAULT_RING};
pub use transport::contact::{handshake, hear, Answer, Heard, RAIL_USER_TIMEOUT_MS};
pub use transport::sys::clock_ns;
pub use transport::ucx::{Missing as UcxMissing, UcxOptions};
pub use transport::Caps;
pub use types::{
    Addr, Completion, EndpointConfig, Mode, Pages, PutHandle, Recv, RecvKind, RegionKey, Stats,
    Target, Timings, Transport, UnknownName,
};
