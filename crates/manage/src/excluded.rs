//! The hosts the central manager has excluded, as the processes that must
//! obey it know them: one thread learns the set (asking the central
//! manager now and then) and replaces it here; transfers and services read
//! it. A generation number that changes with the set lets a busy loop see
//! a change with one atomic load.
//!
//! ```text
//!  central ──Excluded──► watcher ── replace(set) ──► Excluded ◄── generation() / contains(node)
//!                                                                 gateway client, file service
//! ```

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// A shared set of excluded node ids; clones share it.
#[derive(Clone, Debug, Default)]
pub struct Excluded(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    generation: AtomicU64,
    nodes: RwLock<BTreeSet<u32>>,
}

impl Excluded {
    /// An empty set, never replaced unless someone does.
    pub fn new() -> Excluded {
        Excluded::default()
    }

    /// Makes `nodes` the set; whether it changed (and the generation with
    /// it).
    pub fn replace(&self, nodes: BTreeSet<u32>) -> bool {
        let mut now = self.0.nodes.write().unwrap_or_else(|p| p.into_inner());
        if *now == nodes {
            return false;
        }
        *now = nodes;
        self.0.generation.fetch_add(1, Ordering::Release);
        true
    }

    /// Changes whenever the set does.
    pub fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::Acquire)
    }

    /// Whether node `node` is excluded.
    pub fn contains(&self, node: u32) -> bool {
        self.0
            .nodes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&node)
    }

    /// The set now.
    pub fn nodes(&self) -> BTreeSet<u32> {
        self.0
            .nodes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_seen_by_every_clone_moves_the_generation_and_a_repeat_does_not() {
        let a = Excluded::new();
        let b = a.clone();
        assert_eq!((a.generation(), a.contains(21)), (0, false));
        assert!(a.replace([21, 22].into()));
        let g = b.generation();
        assert!(g > 0 && b.contains(21) && b.contains(22));
        assert!(!a.replace([21, 22].into()), "the same set again");
        assert_eq!(b.generation(), g);
        assert!(a.replace([22].into()));
        assert!(b.generation() > g && !b.contains(21));
        assert_eq!(b.nodes(), [22].into());
    }
}
