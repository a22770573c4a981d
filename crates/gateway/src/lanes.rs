//! Which gateways of a lane one transfer may use, apart from the striper's
//! own bookkeeping: those out of use and since when, when a gateway whose
//! connection failed may be dialled again, and, for a pinned flow (ECMP
//! rather than striping), the one gateway it rides and where it moves when
//! that one dies.
//!
//! ```text
//!   connection broke / heartbeats missed ──► down(gw, now)   striper: chunks go elsewhere
//!   heartbeat answered, dialled again    ──► up(gw)          striper: gateway back in use
//!   dial failed                          ──► dial_failed(gw, now); may_dial(gw, now) later
//! ```

use crate::paths::Paths;
use crate::stripe::Striper;
use crate::{Gw, Nanos};

/// Time between attempts to dial a gateway whose connection failed.
pub const REDIAL: Nanos = 1_000_000_000;

/// The gateways of one transfer.
#[derive(Clone, Debug)]
pub struct Lanes {
    down: Vec<bool>,
    down_at: Vec<Nanos>,
    retry_at: Vec<Nanos>,
    returned: Vec<bool>,
    /// Pinned mode: the flow's identity and the gateway it is on.
    pin: Option<(Vec<u8>, Gw)>,
    /// Gateways taken out of use.
    pub failovers: u64,
    /// Chunks sent through each gateway.
    pub per_gateway: Vec<u64>,
    /// Chunks sent through gateways that had been out of use and came back.
    pub after_return: u64,
}

impl Lanes {
    /// `n` gateways, all in use.
    pub fn new(n: usize) -> Lanes {
        Lanes {
            down: vec![false; n],
            down_at: vec![0; n],
            retry_at: vec![0; n],
            returned: vec![false; n],
            pin: None,
            failovers: 0,
            per_gateway: vec![0; n],
            after_return: 0,
        }
    }

    /// Pins the transfer, as flow `flow`, to the live gateway its identity
    /// hashes to (equal-cost multipath); the striper uses that one alone.
    pub fn pin(&mut self, flow: &[u8], striper: &mut Striper) {
        let on = self.live().pick(flow).unwrap_or(0);
        for gw in (0..self.down.len()).filter(|g| *g != on) {
            striper.on_path_down(gw);
        }
        self.pin = Some((flow.to_vec(), on));
    }

    fn live(&self) -> Paths {
        let mut live = Paths::new(self.down.len());
        for (i, d) in self.down.iter().enumerate() {
            live.set_alive(i, !d);
        }
        live
    }

    /// Takes `gw` out of use at `now`: its chunks in flight go again
    /// elsewhere, and a flow pinned to it moves to its next choice among the
    /// live ones. Returns whether it was in use.
    pub fn down(&mut self, gw: Gw, now: Nanos, striper: &mut Striper) -> bool {
        if gw >= self.down.len() || self.down[gw] {
            return false;
        }
        self.down[gw] = true;
        self.down_at[gw] = now;
        self.failovers += 1;
        striper.on_path_down(gw);
        let live = self.live();
        if let Some((flow, on)) = self.pin.as_mut() {
            if *on == gw {
                if let Some(next) = live.pick(flow) {
                    *on = next;
                    striper.on_path_up(next);
                }
            }
        }
        true
    }

    /// `gw` answers again and has a connection: back in use (for the
    /// striper too, unless the flow is pinned elsewhere). Returns whether it
    /// was out of use.
    pub fn up(&mut self, gw: Gw, striper: &mut Striper) -> bool {
        if !self.down.get(gw).copied().unwrap_or(false) {
            return false;
        }
        self.down[gw] = false;
        self.returned[gw] = true;
        if self.usable(gw) {
            striper.on_path_up(gw);
        }
        true
    }

    /// Whether `gw` is out of use.
    pub fn is_down(&self, gw: Gw) -> bool {
        self.down.get(gw).copied().unwrap_or(true)
    }

    /// Whether the striper may use `gw` once it is up (a pinned flow uses
    /// one gateway only).
    pub fn usable(&self, gw: Gw) -> bool {
        self.pin.as_ref().is_none_or(|(_, on)| *on == gw)
    }

    /// Whether `gw` may be dialled at `now`.
    pub fn may_dial(&self, gw: Gw, now: Nanos) -> bool {
        self.retry_at.get(gw).is_some_and(|at| now >= *at)
    }

    /// Dialling `gw` failed at `now`: not again for [`REDIAL`].
    pub fn dial_failed(&mut self, gw: Gw, now: Nanos) {
        if let Some(at) = self.retry_at.get_mut(gw) {
            *at = now + REDIAL;
        }
    }

    /// A chunk went through `gw`.
    pub fn sent(&mut self, gw: Gw) {
        if let Some(n) = self.per_gateway.get_mut(gw) {
            *n += 1;
            if self.returned[gw] {
                self.after_return += 1;
            }
        }
    }

    /// Which gateways are out of use.
    pub fn down_list(&self) -> &[bool] {
        &self.down
    }

    /// When each gateway was last taken out of use (0: never).
    pub fn down_times(&self) -> &[Nanos] {
        &self.down_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stripe::StripeConfig;

    const S: Nanos = 1_000_000_000;

    fn striper(n: usize) -> Striper {
        Striper::new(64 << 20, n, StripeConfig::default())
    }

    /// Gateways the striper sends through until the window is full.
    fn used(s: &mut Striper, now: Nanos) -> Vec<Gw> {
        let mut v: Vec<Gw> = std::iter::from_fn(|| s.poll_transmit(now).map(|t| t.gw)).collect();
        v.sort();
        v.dedup();
        v
    }

    #[test]
    fn a_gateway_down_carries_nothing_until_it_is_up() {
        let (mut l, mut s) = (Lanes::new(3), striper(3));
        assert!(l.down(1, 5 * S, &mut s));
        assert!(!l.down(1, 6 * S, &mut s), "once");
        assert_eq!(l.failovers, 1);
        assert_eq!(l.down_times()[1], 5 * S);
        assert_eq!(used(&mut s, 0), [0, 2]);
        assert!(l.up(1, &mut s));
        assert!(!l.up(1, &mut s), "once");
        for gw in [0, 1, 2, 1] {
            l.sent(gw);
        }
        assert_eq!(l.per_gateway, [1, 2, 1]);
        assert_eq!(
            l.after_return, 2,
            "chunks through the gateway that came back"
        );
        assert!(!l.is_down(1) && l.is_down(7));
    }

    #[test]
    fn a_pinned_flow_rides_one_gateway_and_moves_when_it_dies() {
        let (mut l, mut s) = (Lanes::new(4), striper(4));
        l.pin(b"flow 9", &mut s);
        let on = used(&mut s, 0);
        assert_eq!(on.len(), 1, "{on:?}");
        let first = on[0];
        assert!(l.usable(first) && (0..4).filter(|g| l.usable(*g)).count() == 1);
        // Another gateway dying changes nothing for the flow.
        let other = (first + 1) % 4;
        l.down(other, S, &mut s);
        assert!(l.usable(first));
        // Its own dying moves it, to one of the two live others.
        l.down(first, 2 * S, &mut s);
        let moved: Vec<Gw> = (0..4).filter(|g| l.usable(*g)).collect();
        assert_eq!(moved.len(), 1);
        assert!(moved[0] != first && moved[0] != other, "{moved:?}");
        let mut s2 = striper(4);
        let mut l2 = Lanes::new(4);
        l2.pin(b"flow 9", &mut s2);
        assert!(l2.usable(first), "the same flow hashes to the same gateway");
        // Coming back does not take the flow back from where it is now.
        l.up(first, &mut s);
        assert!(!l.usable(first) && l.usable(moved[0]));
    }

    #[test]
    fn a_failed_dial_waits_before_the_next() {
        let mut l = Lanes::new(2);
        assert!(l.may_dial(0, 0) && l.may_dial(1, 0));
        l.dial_failed(0, 10 * S);
        assert!(!l.may_dial(0, 10 * S + REDIAL - 1));
        assert!(l.may_dial(0, 10 * S + REDIAL));
        assert!(l.may_dial(1, 10 * S));
        assert!(!l.may_dial(5, 0), "no such gateway");
    }
}
