//! Equal-cost multipath over the live gateways of a lane, by rendezvous
//! (highest random weight) hashing of the flow's identity: flows spread
//! evenly, a flow stays on its gateway while that gateway lives, and when one
//! dies only its own flows move.

use twox_hash::XxHash3_64;

use crate::Gw;

/// The gateways of one lane and which of them are alive.
#[derive(Clone, Debug)]
pub struct Paths {
    alive: Vec<bool>,
}

impl Paths {
    /// `n` gateways, all alive.
    pub fn new(n: usize) -> Paths {
        Paths {
            alive: vec![true; n],
        }
    }

    /// Gateways in the lane.
    pub fn len(&self) -> usize {
        self.alive.len()
    }

    /// Whether the lane has no gateway.
    pub fn is_empty(&self) -> bool {
        self.alive.is_empty()
    }

    /// Marks a gateway up or down.
    pub fn set_alive(&mut self, gw: Gw, alive: bool) {
        if let Some(a) = self.alive.get_mut(gw) {
            *a = alive;
        }
    }

    /// Whether `gw` is alive.
    pub fn is_alive(&self, gw: Gw) -> bool {
        self.alive.get(gw).copied().unwrap_or(false)
    }

    /// The live gateways.
    pub fn live(&self) -> impl Iterator<Item = Gw> + '_ {
        self.alive
            .iter()
            .enumerate()
            .filter(|(_, a)| **a)
            .map(|(i, _)| i)
    }

    /// The gateway for a flow (source, destination, port...), or `None` when
    /// every gateway is down.
    pub fn pick(&self, flow: &[u8]) -> Option<Gw> {
        self.live().max_by_key(|&gw| {
            (
                XxHash3_64::oneshot_with_seed(gw as u64, flow),
                std::cmp::Reverse(gw),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(i: u32) -> [u8; 4] {
        i.to_le_bytes()
    }

    #[test]
    fn flows_spread_evenly() {
        for n in 1..=8 {
            let p = Paths::new(n);
            let mut count = vec![0u32; n];
            let flows = 20_000;
            for i in 0..flows {
                count[p.pick(&flow(i)).unwrap()] += 1;
            }
            let fair = flows as f64 / n as f64;
            for c in &count {
                assert!(
                    (*c as f64 - fair).abs() < 0.06 * fair,
                    "{n} ways: {count:?}"
                );
            }
        }
    }

    #[test]
    fn only_the_dead_gateways_flows_move_and_they_come_back() {
        let mut p = Paths::new(4);
        let before: Vec<Gw> = (0..5000).map(|i| p.pick(&flow(i)).unwrap()).collect();
        p.set_alive(2, false);
        let during: Vec<Gw> = (0..5000).map(|i| p.pick(&flow(i)).unwrap()).collect();
        for (b, d) in before.iter().zip(&during) {
            if *b == 2 {
                assert_ne!(*d, 2);
            } else {
                assert_eq!(b, d, "a flow on a live gateway moved");
            }
        }
        // The dead gateway's flows spread over the three others.
        let moved: Vec<Gw> = before
            .iter()
            .zip(&during)
            .filter(|(b, _)| **b == 2)
            .map(|(_, d)| *d)
            .collect();
        for gw in [0, 1, 3] {
            let share = moved.iter().filter(|&&d| d == gw).count() as f64 / moved.len() as f64;
            assert!((share - 1.0 / 3.0).abs() < 0.1, "{gw}: {share}");
        }
        p.set_alive(2, true);
        let after: Vec<Gw> = (0..5000).map(|i| p.pick(&flow(i)).unwrap()).collect();
        assert_eq!(before, after, "a returning gateway takes its flows back");
    }

    #[test]
    fn no_live_gateway_no_path() {
        let mut p = Paths::new(2);
        p.set_alive(0, false);
        p.set_alive(1, false);
        assert_eq!(p.pick(b"x"), None);
        assert_eq!(Paths::new(0).pick(b"x"), None);
    }
}
