//! What happens to a node over time: dead (it takes and sends nothing) or
//! frozen (what reaches it waits until it thaws, as a stopped process's
//! socket buffers do).

use crate::Nanos;

/// A spell of a node's life in which it is not itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outage {
    /// Dead from `from` until `until` (`Nanos::MAX`: for good).
    Dead {
        /// Start.
        from: Nanos,
        /// End.
        until: Nanos,
    },
    /// Frozen from `from` until `until`.
    Frozen {
        /// Start.
        from: Nanos,
        /// End.
        until: Nanos,
    },
}

impl Outage {
    fn span(&self) -> (Nanos, Nanos) {
        match *self {
            Outage::Dead { from, until } | Outage::Frozen { from, until } => (from, until),
        }
    }

    fn covers(&self, at: Nanos) -> bool {
        let (from, until) = self.span();
        from <= at && at < until
    }
}

/// A node's outages.
#[derive(Clone, Debug, Default)]
pub(crate) struct Fate {
    outages: Vec<Outage>,
}

impl Fate {
    pub(crate) fn add(&mut self, o: Outage) {
        self.outages.push(o);
    }

    /// Ends, at `at`, a death that lasts past it.
    pub(crate) fn revive(&mut self, at: Nanos) {
        for o in &mut self.outages {
            if let Outage::Dead { from, until } = o {
                if *from <= at && at < *until {
                    *until = at;
                }
            }
        }
    }

    pub(crate) fn is_dead(&self, at: Nanos) -> bool {
        self.outages
            .iter()
            .any(|o| matches!(o, Outage::Dead { .. }) && o.covers(at))
    }

    /// When a node frozen at `at` thaws (the latest end of the spells that
    /// cover `at`, followed through spells that overlap it).
    pub(crate) fn thaw(&self, at: Nanos) -> Option<Nanos> {
        let mut t = at;
        let mut frozen = false;
        loop {
            let next = self
                .outages
                .iter()
                .filter(|o| matches!(o, Outage::Frozen { .. }) && o.covers(t))
                .map(|o| o.span().1)
                .max();
            match next {
                Some(u) if u > t => {
                    frozen = true;
                    t = u;
                }
                _ => return frozen.then_some(t),
            }
        }
    }
}
