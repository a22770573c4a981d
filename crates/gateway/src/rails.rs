//! Link aggregation on a gateway's storage side: a storage host reached
//! over several links (rails) gets its messages round-robin over the rails
//! that work; a rail that fails rests, for a time that doubles with each
//! failure in a row, before it is tried again.
//!
//! ```text
//!   pick(node, now) ──► rail r ──write──► ok:     sent(node, r)   (next after r)
//!                                  └────► failed: failed(r, now)  (rests), pick again
//! ```

use std::collections::HashMap;
use std::hash::Hash;

use crate::Nanos;

/// How long a failed rail first rests.
pub const REST: Nanos = 1_000_000_000;
/// The longest rest.
pub const REST_MAX: Nanos = 30_000_000_000;

/// The rails to each storage node, and which of them rest.
#[derive(Clone, Debug)]
pub struct Rails<R> {
    links: HashMap<u32, Vec<R>>,
    next: HashMap<u32, usize>,
    /// Failed rails: until when they rest, and how long that rest is.
    resting: HashMap<R, (Nanos, Nanos)>,
}

impl<R: Copy + Eq + Hash> Rails<R> {
    /// Rails from (node, rail) pairs; a node named once has one rail.
    pub fn new(pairs: &[(u32, R)]) -> Rails<R> {
        let mut links: HashMap<u32, Vec<R>> = HashMap::new();
        for (n, r) in pairs {
            links.entry(*n).or_default().push(*r);
        }
        Rails {
            links,
            next: HashMap::new(),
            resting: HashMap::new(),
        }
    }

    /// Whether `node` is reached over more than one rail (otherwise its one
    /// connection is the endpoint's usual one, and nothing here applies).
    pub fn bonded(&self, node: u32) -> bool {
        self.links.get(&node).is_some_and(|l| l.len() > 1)
    }

    /// The rail to try next for `node` at `now`: the first one that does not
    /// rest, going round from the one after the last that worked.
    pub fn pick(&self, node: u32, now: Nanos) -> Option<R> {
        let links = self.links.get(&node)?;
        let start = self.next.get(&node).copied().unwrap_or(0);
        (0..links.len())
            .map(|k| links[(start + k) % links.len()])
            .find(|r| self.resting.get(r).is_none_or(|(until, _)| now >= *until))
    }

    /// A message went over `rail` to `node`: the next goes over the one
    /// after it, and the rail rests no more.
    pub fn sent(&mut self, node: u32, rail: R) {
        if let Some(links) = self.links.get(&node) {
            if let Some(i) = links.iter().position(|r| *r == rail) {
                self.next.insert(node, (i + 1) % links.len());
            }
        }
        self.resting.remove(&rail);
    }

    /// Writing over `rail` failed at `now`: it rests, twice as long as its
    /// last rest if it had one. Returns the rest.
    pub fn failed(&mut self, rail: R, now: Nanos) -> Nanos {
        let rest = self
            .resting
            .get(&rail)
            .map_or(REST, |(_, r)| (r * 2).min(REST_MAX));
        self.resting.insert(rail, (now + rest, rest));
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn messages_go_round_the_rails() {
        let mut r = Rails::new(&[(10, 'a'), (10, 'b'), (10, 'c'), (11, 'x')]);
        assert!(r.bonded(10) && !r.bonded(11) && !r.bonded(12));
        let mut seen = Vec::new();
        for _ in 0..6 {
            let rail = r.pick(10, 0).unwrap();
            r.sent(10, rail);
            seen.push(rail);
        }
        assert_eq!(seen, ['a', 'b', 'c', 'a', 'b', 'c']);
        assert_eq!(r.pick(12, 0), None);
    }

    #[test]
    fn a_failed_rail_rests_longer_each_time_and_comes_back() {
        let mut r = Rails::new(&[(10, 'a'), (10, 'b')]);
        assert_eq!(r.pick(10, 0), Some('a'));
        assert_eq!(r.failed('a', 0), REST);
        // The message goes over the other rail; so do the next, while 'a' rests.
        assert_eq!(r.pick(10, 0), Some('b'));
        r.sent(10, 'b');
        assert_eq!(r.pick(10, S / 2), Some('b'));
        r.sent(10, 'b');
        // Rested: tried again, and fails again: twice as long.
        assert_eq!(r.pick(10, S), Some('a'));
        assert_eq!(r.failed('a', S), 2 * REST);
        assert_eq!(r.pick(10, 2 * S), Some('b'));
        let mut now = 3 * S;
        let mut rest = 2 * REST;
        for _ in 0..10 {
            rest = r.failed('a', now);
            now += rest;
        }
        assert_eq!(rest, REST_MAX, "the rest is bounded");
        // Once it works, it rests no more and takes its turn.
        r.sent(10, 'a');
        assert_eq!(r.pick(10, now), Some('b'));
        r.sent(10, 'b');
        assert_eq!(r.pick(10, now), Some('a'));
        assert_eq!(
            r.failed('a', now),
            REST,
            "a fresh failure rests the first time again"
        );
    }

    #[test]
    fn every_rail_resting_means_no_rail() {
        let mut r = Rails::new(&[(10, 1u8), (10, 2)]);
        r.failed(1, 0);
        r.failed(2, 0);
        assert_eq!(r.pick(10, S - 1), None);
        assert_eq!(r.pick(10, S), Some(1));
    }
}
