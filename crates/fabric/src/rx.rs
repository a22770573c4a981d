//! Where arriving traffic goes, whatever carried it: the endpoint's token
//! pool, its queue of what waits for the application, its registered
//! regions and its table of puts in flight. Every transport's receive side
//! writes into a [`Core`] and reports what one pass did as a [`Step`].

use std::collections::VecDeque;
use std::time::Duration;

use crate::pool::{Chain, TokenPool};
use crate::puts::PutTable;
use crate::transport::region::Regions;
use crate::types::{Addr, Completion, Mode, Recv, RegionKey, Stats, Timings, Transport};

/// Where a waiting message's bytes are.
#[derive(Debug)]
pub(crate) enum Body {
    /// Tokens of the pool.
    Staged(Chain),
    /// A buffer of its own: the message stalled while placed in a reader's
    /// buffer and was finished aside.
    Held(Vec<u8>),
    /// Still with the transport, which places it straight into the
    /// reader's buffer when it is read (UCX: a probed message).
    Pending(crate::transport::ucx::Pending),
}

/// Something waiting for the application in arrival order.
#[derive(Debug)]
pub(crate) enum Ready {
    Msg {
        from: Addr,
        mode: Mode,
        transport: Transport,
        len: usize,
        body: Body,
        via: Option<(u32, u32)>,
    },
    Placed {
        from: Addr,
        transport: Transport,
        via: Option<(u32, u32)>,
        key: RegionKey,
        offset: u64,
        len: usize,
    },
    Lost {
        peer: Addr,
        reason: String,
    },
}

/// Endpoint state the receive path writes into.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) id: u32,
    pub(crate) completion: Completion,
    pub(crate) max_message: u64,
    pub(crate) pool: TokenPool,
    pub(crate) ready: VecDeque<Ready>,
    pub(crate) ready_cap: usize,
    pub(crate) regions: Regions,
    pub(crate) puts: PutTable,
    /// Control frames queued on connections since the endpoint last sent
    /// them (see `Connection::control`).
    pub(crate) ctrl_queued: usize,
    pub(crate) stats: Stats,
    /// Probe on: record the stages of each message in `timings`.
    pub(crate) probe: bool,
    pub(crate) timings: Timings,
    /// What the pass that returned [`Step::Delivered`] delivered.
    pub(crate) got: Option<Recv>,
    /// Why the connection of the pass that returned [`Step::Lost`] broke.
    pub(crate) lost: String,
    /// A connection of the pass is cold: it reads only when told to look
    /// again (see `transport::tcp`).
    pub(crate) cold: bool,
}

impl Core {
    /// The state of endpoint `id`, whose pool is `pool` and whose queue for
    /// the application holds at most `ready_cap` entries.
    pub(crate) fn new(
        id: u32,
        completion: Completion,
        max_message: u64,
        pool: TokenPool,
        ready_cap: usize,
    ) -> Core {
        Core {
            id,
            completion,
            max_message,
            pool,
            ready: VecDeque::with_capacity(ready_cap),
            ready_cap,
            regions: Regions::new(),
            puts: PutTable::new(),
            ctrl_queued: 0,
            stats: Stats::default(),
            probe: false,
            timings: Timings::default(),
            got: None,
            lost: String::new(),
            cold: false,
        }
    }

    /// Copies `data` into a new chain; `None` (nothing kept) when the pool or
    /// the queue is full.
    pub(crate) fn stage(&mut self, data: &[u8]) -> Option<Chain> {
        if self.ready.len() >= self.ready_cap {
            return None;
        }
        let mut chain = Chain::EMPTY;
        let mut rest = data;
        while !rest.is_empty() {
            let Some(space) = self.pool.tail_space(&mut chain) else {
                self.pool.release(chain);
                return None;
            };
            let n = space.len().min(rest.len());
            space[..n].copy_from_slice(&rest[..n]);
            self.pool.commit(&chain, n);
            rest = &rest[n..];
        }
        Some(chain)
    }

    /// Notes that a message's header has been seen, when the probe is on.
    pub(crate) fn header_seen(&mut self) {
        if self.probe {
            self.timings.read_header = crate::clock_ns();
        }
    }

    /// Hands `r` to the read that made this pass.
    #[inline]
    pub(crate) fn deliver(&mut self, r: Recv) -> Step {
        self.got = Some(r);
        Step::Delivered
    }

    /// The connection this pass was over is broken, for `reason`.
    pub(crate) fn broken(&mut self, reason: String) -> Step {
        self.lost = reason;
        Step::Lost
    }

    /// Counts a message handed to the application.
    pub(crate) fn count_in(&mut self, len: usize) {
        self.stats.messages_in += 1;
        self.stats.bytes_in += len as u64;
    }
}

/// What one pass over a connection did. Two words, returned in registers:
/// what a pass delivered, or why it lost its connection, waits in the
/// [`Core`] (a `Recv` returned by value through three calls cost a small
/// message's read a sixth of its time in stalled copies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Idle,
    Moved,
    /// A message or notice for the read, in [`Core::got`].
    Delivered,
    /// A message of `len` bytes sent in `mode` is in the read's buffer,
    /// from the peer of the connection of this pass: the endpoint, which
    /// knows both, makes the read's `Recv`.
    Message {
        len: usize,
        mode: Mode,
    },
    /// A message fills the pool and the waiting reader's buffer is smaller.
    TooSmall(u64),
    /// The connection is broken, for the reason in [`Core::lost`].
    Lost,
}

impl Step {
    /// Folds a step that moved nothing into what came before.
    pub(crate) fn or_moved(moved: bool) -> Step {
        if moved {
            Step::Moved
        } else {
            Step::Idle
        }
    }
}

/// Longest a sleeping wait lasts before looking around again.
pub(crate) const NAP: Duration = Duration::from_millis(200);
/// How long a message placed straight into a reader's buffer may wait for
/// its next bytes before it is held aside (and the read looks at the other
/// connections, and at its deadline). Far longer than the gap between the
/// segments of a flowing message.
pub(crate) const HOLD: Duration = Duration::from_millis(20);

/// Idle polls between liveness checks of shared-memory peers.
pub(crate) const SPINS_PER_CHECK: u32 = 1 << 12;

/// Idle polls after which a polling side begins to offer its processor
/// ([`give_way`]): a message in flight comes well within them.
pub(crate) const YIELD_FROM: u32 = 1 << 10;

/// Idle polls between two offers of the processor, from [`YIELD_FROM`] on.
pub(crate) const SPINS_PER_YIELD: u32 = 1 << 6;

/// Offers the processor to whatever else is ready to run on it, at the
/// `spins`-th idle poll of a polling side if that is one at which it
/// should ([`YIELD_FROM`], [`SPINS_PER_YIELD`]). Where more busy processes
/// share a host than it has processors, the peer a side awaits may be
/// waiting for this very processor: spinning on, each would hold it to
/// the end of its time slice, and every message would wait that long
/// (1,000 round trips over shared memory took 4 ms each way with both
/// sides on one processor of a 250 Hz kernel; with this, 15 us in a
/// release build, 145 us in a debug one).
/// Where the processor has nothing else to run, the offer returns at once.
pub(crate) fn give_way(spins: u32) {
    if spins >= YIELD_FROM && spins.is_multiple_of(SPINS_PER_YIELD) {
        std::thread::yield_now();
    }
}
