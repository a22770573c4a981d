//! The network: nodes, links, the virtual clock and the messages in flight.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::fate::{Fate, Outage};
use crate::link::{Link, LinkSpec, LinkStats};
use crate::Nanos;

/// A node of the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

/// A one-way link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkId(pub usize);

/// A message that reached its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery<M> {
    /// When it arrived (at or before `now`).
    pub at: Nanos,
    /// The link it came over.
    pub link: LinkId,
    /// The sending node.
    pub from: NodeId,
    /// The receiving node.
    pub to: NodeId,
    /// Its size as sent.
    pub bytes: u64,
    /// The message.
    pub msg: M,
}

/// Nodes, links, a virtual clock and the messages in flight.
#[derive(Debug)]
pub struct Net<M> {
    now: Nanos,
    rng: StdRng,
    nodes: Vec<Fate>,
    links: Vec<Link>,
    /// (arrival, sending order): the order messages are delivered in.
    queue: BinaryHeap<Reverse<(Nanos, u64)>>,
    in_flight: HashMap<u64, (LinkId, u64, M)>,
    order: u64,
}

impl<M> Net<M> {
    /// An empty network at time 0, its random choices drawn from `seed`.
    pub fn new(seed: u64) -> Net<M> {
        Net {
            now: 0,
            rng: StdRng::seed_from_u64(seed),
            nodes: Vec::new(),
            links: Vec::new(),
            queue: BinaryHeap::new(),
            in_flight: HashMap::new(),
            order: 0,
        }
    }

    /// The virtual time.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Moves the clock to `t` (never back).
    pub fn advance_to(&mut self, t: Nanos) {
        self.now = self.now.max(t);
    }

    /// Moves the clock on by `dt`.
    pub fn step(&mut self, dt: Nanos) {
        self.now = self.now.saturating_add(dt);
    }

    /// When the next message in flight arrives, if any is.
    pub fn next_event(&self) -> Option<Nanos> {
        self.queue.peek().map(|Reverse((at, _))| *at)
    }

    /// Messages in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// A new node.
    pub fn add_node(&mut self) -> NodeId {
        self.nodes.push(Fate::default());
        NodeId(self.nodes.len() - 1)
    }

    /// A new one-way link from `from` to `to`.
    pub fn add_link(&mut self, from: NodeId, to: NodeId, spec: LinkSpec) -> LinkId {
        self.links.push(Link::new(from.0, to.0, spec));
        LinkId(self.links.len() - 1)
    }

    /// Links both ways between `a` and `b`, alike.
    pub fn add_pair(&mut self, a: NodeId, b: NodeId, spec: LinkSpec) -> (LinkId, LinkId) {
        (self.add_link(a, b, spec), self.add_link(b, a, spec))
    }

    /// What link `l` did so far.
    pub fn stats(&self, l: LinkId) -> LinkStats {
        self.links[l.0].stats
    }

    /// Changes what link `l` does from now on.
    pub fn set_spec(&mut self, l: LinkId, spec: LinkSpec) {
        self.links[l.0].spec = spec;
    }

    /// Node `n` dies at `at`, for good unless [`revive`](Self::revive)d.
    pub fn kill(&mut self, n: NodeId, at: Nanos) {
        self.nodes[n.0].add(Outage::Dead {
            from: at,
            until: Nanos::MAX,
        });
    }

    /// Node `n`, dead at `at`, comes back then.
    pub fn revive(&mut self, n: NodeId, at: Nanos) {
        self.nodes[n.0].revive(at);
    }

    /// Node `n` is frozen from `from` until `until`: what reaches it waits
    /// for the thaw.
    pub fn freeze(&mut self, n: NodeId, from: Nanos, until: Nanos) {
        self.nodes[n.0].add(Outage::Frozen { from, until });
    }

    /// Link `l` carries nothing from `from` until `until`.
    pub fn cut(&mut self, l: LinkId, from: Nanos, until: Nanos) {
        self.links[l.0].cuts.push((from, until));
    }

    /// Every link between `a` and `b`, both ways, carries nothing from
    /// `from` until `until`.
    pub fn partition(&mut self, a: NodeId, b: NodeId, from: Nanos, until: Nanos) {
        for l in &mut self.links {
            if (l.from, l.to) == (a.0, b.0) || (l.from, l.to) == (b.0, a.0) {
                l.cuts.push((from, until));
            }
        }
    }

    /// Whether node `n` is alive (not dead) at `at`.
    pub fn is_alive(&self, n: NodeId, at: Nanos) -> bool {
        !self.nodes[n.0].is_dead(at)
    }

    /// Whether node `n` is frozen at `at`.
    pub fn is_frozen(&self, n: NodeId, at: Nanos) -> bool {
        self.nodes[n.0].thaw(at).is_some()
    }

    /// Sends `msg` of `bytes` over link `l` at `now`.
    pub fn send(&mut self, l: LinkId, bytes: u64, msg: M) {
        let now = self.now;
        let link = &mut self.links[l.0];
        link.stats.sent += 1;
        if self.nodes[link.from].is_dead(now) || link.is_cut(now) {
            link.stats.dropped_down += 1;
            return;
        }
        if !link.has_room(now, bytes) {
            link.stats.queue_drops += 1;
            return;
        }
        let start = now.max(link.busy_until);
        let on_wire = start + link.spec.wire_time(bytes);
        link.busy_until = on_wire;
        if link.spec.loss > 0.0 && self.rng.random::<f64>() < link.spec.loss {
            link.stats.lost += 1;
            return;
        }
        let jitter = match link.spec.jitter {
            0 => 0,
            j => self.rng.random_range(0..=j),
        };
        let mut at = on_wire + link.spec.delay + jitter;
        if !link.spec.reorder {
            at = at.max(link.last_arrival);
        }
        link.last_arrival = link.last_arrival.max(at);
        self.order += 1;
        self.queue.push(Reverse((at, self.order)));
        self.in_flight.insert(self.order, (l, bytes, msg));
    }

    /// The next message due at or before `now`, in time order (ties in
    /// sending order). Messages to a dead node, or over a link cut when
    /// they arrive, are dropped; those to a frozen node wait for its thaw.
    pub fn poll(&mut self) -> Option<Delivery<M>> {
        while let Some(&Reverse((at, order))) = self.queue.peek() {
            if at > self.now {
                return None;
            }
            self.queue.pop();
            let Some((l, bytes, msg)) = self.in_flight.remove(&order) else {
                continue;
            };
            let link = &mut self.links[l.0];
            let (from, to) = (link.from, link.to);
            if self.nodes[to].is_dead(at) || link.is_cut(at) {
                link.stats.dropped_down += 1;
                continue;
            }
            if let Some(thaw) = self.nodes[to].thaw(at) {
                self.queue.push(Reverse((thaw, order)));
                self.in_flight.insert(order, (l, bytes, msg));
                continue;
            }
            link.stats.delivered += 1;
            link.stats.bytes += bytes;
            if order < link.last_delivered {
                link.stats.reordered += 1;
            }
            link.last_delivered = link.last_delivered.max(order);
            return Some(Delivery {
                at,
                link: l,
                from: NodeId(from),
                to: NodeId(to),
                bytes,
                msg,
            });
        }
        None
    }

    /// Moves the clock to the next arrival (if it is no later than
    /// `until`, else to `until`) and returns what arrived then.
    pub fn run_until(&mut self, until: Nanos) -> Vec<Delivery<M>> {
        let t = self.next_event().map_or(until, |e| e.min(until));
        self.advance_to(t);
        std::iter::from_fn(|| self.poll()).collect()
    }
}
