//! The answers UCX holds for peers: control messages (answers to region
//! queries and revocations, credit) this side sent with UCX's own sends
//! that UCX has not finished, with their bytes, counted by the peer's
//! node. A peer whose worker does not progress leaves them pending, and
//! UCX 1.13 did not end those of a connection closed by force (over shared
//! memory, seen still pending seconds after the peer took to progressing):
//! they stay here until UCX ends them or the port closes.
//!
//! ```text
//!  send pending ──► live ──(its connection goes)──► gone
//!                    │                                │
//!                    └──── UCX done: freed ◄──────────┘ (looked at every 100 ms)
//!
//!  by node:  ≥ ANSWERS_CAP ─► its connections' questions end them; no new connection from it
//!  in all:   ≥ TOTAL_CAP   ─► every node's questions wait for none; no new connection at all
//! ```
//!
//! The bookkeeping only: whether UCX is done with a request, and freeing
//! it, is the caller's (`done` below).

use std::collections::HashMap;
use std::ffi::c_void;
use std::time::{Duration, Instant};

use super::Refused;

/// Answers UCX holds for one node's peers, at most: a connection of a
/// node at it that asks again is dropped, and the node gets no new one. A
/// peer that progresses has a few at a time: it asks for one region at a
/// time, and credit goes back once for each half of its window.
pub(super) const ANSWERS_CAP: u32 = 1024;
/// Answers UCX holds in all, at most (several nodes at their cap): past
/// it, no new connection from any node, and questions end their
/// connection.
pub(super) const TOTAL_CAP: usize = 8 * ANSWERS_CAP as usize;
/// Passes between two looks at the clock, while there are answers of
/// connections gone.
const LOOK_EVERY: u32 = 4096;
/// Time between two looks at them: a look asks UCX about each (up to
/// `TOTAL_CAP`, some tens of microseconds), which a polling reader's
/// every 4096 passes would feel.
const LOOK_GAP: Duration = Duration::from_millis(100);

/// One answer UCX has not finished sending.
#[derive(Debug)]
pub(super) struct Answer {
    /// Its connection's index and token.
    pub(super) index: u16,
    pub(super) token: u64,
    pub(super) node: u32,
    pub(super) req: *mut c_void,
    /// What UCX may still read.
    pub(super) _bytes: Vec<u8>,
}

#[derive(Debug, Default)]
pub(super) struct Held {
    /// Of connections that are here.
    live: Vec<Answer>,
    /// Of connections gone.
    gone: Vec<Answer>,
    by_node: HashMap<u32, u32>,
    /// Passes since the last look at the clock, and the last look at
    /// `gone`.
    passes: u32,
    looked: Option<Instant>,
    /// Whether a node or the total crossed its cap since the last
    /// [`changed`](Self::changed).
    crossed: bool,
}

impl Held {
    /// A send UCX holds.
    pub(super) fn push(&mut self, a: Answer) {
        let n = self.by_node.entry(a.node).or_default();
        *n += 1;
        self.crossed |= *n == ANSWERS_CAP;
        self.live.push(a);
        self.crossed |= self.total() == TOTAL_CAP;
    }

    pub(super) fn has_live(&self) -> bool {
        !self.live.is_empty()
    }

    /// How many UCX holds for `node`'s peers.
    pub(super) fn of_node(&self, node: u32) -> u32 {
        self.by_node.get(&node).copied().unwrap_or(0)
    }

    pub(super) fn total(&self) -> usize {
        self.live.len() + self.gone.len()
    }

    /// Of connections gone.
    #[cfg(test)]
    pub(super) fn gone(&self) -> usize {
        self.gone.len()
    }

    /// Drops those `done` says UCX has finished (it frees them).
    pub(super) fn reap(&mut self, done: impl FnMut(*mut c_void) -> bool) {
        self.reap_in(false, done);
    }

    /// As [`reap`](Self::reap), for the answers of connections gone.
    pub(super) fn reap_gone(&mut self, done: impl FnMut(*mut c_void) -> bool) {
        self.reap_in(true, done);
    }

    fn reap_in(&mut self, gone: bool, mut done: impl FnMut(*mut c_void) -> bool) {
        let was = self.total();
        let list = if gone { &mut self.gone } else { &mut self.live };
        let (by_node, crossed) = (&mut self.by_node, &mut self.crossed);
        list.retain(|a| !(done(a.req) && forget(by_node, crossed, a.node)));
        self.crossed |= was >= TOTAL_CAP && self.total() < TOTAL_CAP;
    }

    /// Whom to refuse now, if that may have changed since the last call.
    pub(super) fn changed(&mut self) -> Option<Refused> {
        std::mem::take(&mut self.crossed).then(|| self.refused())
    }

    /// The connection (`index`, `token`) is going: what UCX holds for it
    /// is looked at now and then from now on, not on each pass.
    pub(super) fn orphan(&mut self, index: u16, token: u64) {
        let (left, kept) = std::mem::take(&mut self.live)
            .into_iter()
            .partition(|a| a.index == index && a.token == token);
        self.live = kept;
        self.gone.extend::<Vec<_>>(left);
    }

    /// Counts a pass; whether it is time to look at the answers of
    /// connections gone (every [`LOOK_GAP`], the clock read every
    /// [`LOOK_EVERY`] passes).
    pub(super) fn tick(&mut self) -> bool {
        if self.gone.is_empty() {
            return false;
        }
        self.passes += 1;
        if self.passes < LOOK_EVERY {
            return false;
        }
        self.passes = 0;
        let now = Instant::now();
        if self
            .looked
            .is_some_and(|t| now.duration_since(t) < LOOK_GAP)
        {
            return false;
        }
        self.looked = Some(now);
        true
    }

    /// Whom to refuse new connections from, as things stand.
    pub(super) fn refused(&self) -> Refused {
        let mut nodes: Vec<u32> = self
            .by_node
            .iter()
            .filter(|&(_, &n)| n >= ANSWERS_CAP)
            .map(|(&node, _)| node)
            .collect();
        nodes.sort_unstable();
        Refused {
            all: self.total() >= TOTAL_CAP,
            nodes,
        }
    }

    /// Everything held, for the port's end.
    pub(super) fn take_all(&mut self) -> Vec<Answer> {
        self.by_node.clear();
        let mut all = std::mem::take(&mut self.live);
        all.append(&mut self.gone);
        all
    }
}

/// Counts one answer of `node` finished; true.
fn forget(by_node: &mut HashMap<u32, u32>, crossed: &mut bool, node: u32) -> bool {
    if let Some(n) = by_node.get_mut(&node) {
        *crossed |= *n == ANSWERS_CAP;
        *n -= 1;
        if *n == 0 {
            by_node.remove(&node);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(index: u16, node: u32, req: usize) -> Answer {
        Answer {
            index,
            token: 7,
            node,
            req: req as *mut c_void,
            _bytes: Vec::new(),
        }
    }

    #[test]
    fn nodes_are_refused_for_what_ucx_holds_for_them() {
        let mut h = Held::default();
        assert_eq!(h.refused(), Refused::default());
        for i in 0..ANSWERS_CAP - 1 {
            h.push(answer(1, u32::MAX, 1000 + i as usize));
        }
        h.push(answer(2, 3, 1));
        assert_eq!(h.refused(), Refused::default(), "under the cap");
        assert_eq!(h.changed(), None);
        // A second connection of the same node counts with the first.
        h.push(answer(3, u32::MAX, 2));
        assert_eq!(h.changed().map(|r| r.nodes), Some(vec![u32::MAX]));
        assert_eq!(h.of_node(u32::MAX), ANSWERS_CAP);
        let r = h.refused();
        assert_eq!(
            (r.all, r.nodes),
            (false, vec![u32::MAX]),
            "the largest id is a node"
        );
        // Its connections go: what UCX holds for them is still counted.
        h.orphan(1, 7);
        h.orphan(3, 7);
        assert_eq!(
            (h.gone(), h.total()),
            (ANSWERS_CAP as usize, ANSWERS_CAP as usize + 1)
        );
        assert_eq!(h.refused().nodes, vec![u32::MAX]);
        // UCX ends one: the node is taken again.
        h.reap_gone(|req| req as usize == 2);
        assert_eq!(h.of_node(u32::MAX), ANSWERS_CAP - 1);
        assert_eq!(h.changed(), Some(Refused::default()));
        // Live ones are reaped apart.
        h.reap(|_| true);
        assert_eq!((h.of_node(3), h.total()), (0, ANSWERS_CAP as usize - 1));
    }

    #[test]
    fn past_the_total_every_node_is_refused() {
        let mut h = Held::default();
        for i in 0..TOTAL_CAP - 1 {
            h.push(answer(i as u16, (i % 64) as u32, i + 1));
        }
        assert!(!h.refused().all, "one under");
        h.changed();
        h.push(answer(0, 99, 1 << 20));
        let r = h.changed().unwrap();
        assert!(r.all && r.nodes.is_empty(), "{r:?}");
        h.reap(|req| req as usize == 1 << 20);
        assert_eq!(h.changed(), Some(Refused::default()));
    }

    #[test]
    fn answers_of_connections_gone_are_looked_at_now_and_then() {
        let mut h = Held::default();
        assert!(!(0..2 * LOOK_EVERY).any(|_| h.tick()), "none held");
        h.push(answer(1, 1, 1));
        h.orphan(1, 7);
        let looks = (0..2 * LOOK_EVERY).filter(|_| h.tick()).count();
        assert_eq!(looks, 1, "then not again within the gap");
        std::thread::sleep(LOOK_GAP);
        assert!((0..LOOK_EVERY).any(|_| h.tick()), "after the gap");
        assert_eq!(h.take_all().len(), 1);
        assert_eq!(h.of_node(1), 0);
    }
}
