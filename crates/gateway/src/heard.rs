//! What the transfers of one process (a file server's downloads, a
//! benchmark's flows) share about each gateway: when it was last heard
//! from, and how many chunks they have in flight through it.
//!
//! A gateway that acknowledged any transfer's chunk or answered any
//! transfer's heartbeat a moment ago is alive for all of them. A transfer
//! alone judges a gateway by its own heartbeats and its own
//! chunks' round trips. Eight transfers through the same gateways queue
//! behind each other there: one transfer's heartbeat waits behind the
//! others' chunks, and its own last round trip may be from before the
//! queue grew, so it may take out of use a gateway that is forwarding
//! the others' chunks as it judges. A gateway nobody hears from is judged
//! as before: one silent to every transfer for longer than the detection
//! bound (or twice the last round trip of a chunk through it) is taken out
//! of use by all of them. What is shared is whether the gateway lives, not
//! how a transfer's own connection to it fares: chunks that wait too long
//! on one are sent again elsewhere by their timeouts.
//!
//! How many transfers use a gateway and their chunks in flight are shared
//! so that the transfers share one window at each gateway (see
//! [`crate::stripe`]) rather than queue a window each there.
//!
//! ```text
//!  transfer A ── ack via gw 1 ──► hear(gw 1, now) ──► Heard ──► news() ──► transfer B's
//!                                                                          Health::heard(1)
//!  transfer A ── fly(gw 1, 3) ───────────────────────► Heard ──► others(gw 1) ──► B's
//!                                                                          Striper::set_others
//! ```
//!
//! Each transfer looks its gateways up once ([`Heard::watch`]); after that
//! hearing, taking news and telling or asking what is in flight are one
//! atomic operation per gateway, no lock. A transfer and its chunks leave
//! the counts when its [`Watch`] is dropped.

use crate::health::Health;
use crate::stripe::Others;
use crate::{Gw, Nanos};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A gateway as every transfer names it: (node, endpoint).
pub type GatewayId = (u32, u32);

/// The shared table; clones share it. Keep one per set of transfers that
/// use the same gateways (a server, a benchmark run): two clusters in one
/// process each keep their own.
#[derive(Clone, Debug, Default)]
pub struct Heard(Arc<Mutex<HashMap<GatewayId, Arc<Slot>>>>);

/// One gateway's entry.
#[derive(Debug, Default)]
struct Slot {
    /// When some transfer last heard from it.
    heard: AtomicU64,
    /// Chunks in flight through it, of every transfer.
    flying: AtomicUsize,
    /// Transfers that use it (their [`Watch`]es).
    transfers: AtomicUsize,
}

impl Heard {
    /// An empty table.
    pub fn new() -> Heard {
        Heard::default()
    }

    /// One transfer's view of `gateways` (in its lane's order).
    pub fn watch(&self, gateways: &[GatewayId]) -> Watch {
        let mut table = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let slots: Vec<Arc<Slot>> = gateways
            .iter()
            .map(|g| table.entry(*g).or_default().clone())
            .collect();
        for s in &slots {
            s.transfers.fetch_add(1, Ordering::Relaxed);
        }
        let seen = slots
            .iter()
            .map(|s| s.heard.load(Ordering::Relaxed))
            .collect();
        let flying = vec![0; slots.len()];
        Watch {
            slots,
            seen,
            flying,
        }
    }
}

/// One transfer's handle on the [`Heard`] entries of its gateways.
#[derive(Debug)]
pub struct Watch {
    slots: Vec<Arc<Slot>>,
    /// What this transfer last took from each slot.
    seen: Vec<Nanos>,
    /// This transfer's chunks in flight through each, as last told.
    flying: Vec<usize>,
}

impl Watch {
    /// This transfer heard from `gw` at `now` (a gateway it has in use:
    /// see `Health::is_up`).
    pub fn hear(&mut self, gw: Gw, now: Nanos) {
        if let Some(s) = self.slots.get(gw) {
            s.heard.fetch_max(now, Ordering::Relaxed);
            self.seen[gw] = self.seen[gw].max(now);
        }
    }

    /// Tells `health` of every gateway another transfer heard from since
    /// the last call: as good as an answered heartbeat (and like one, it
    /// does not bring back a gateway this transfer took out of use).
    pub fn news(&mut self, health: &mut Health) {
        for (gw, s) in self.slots.iter().enumerate() {
            let at = s.heard.load(Ordering::Relaxed);
            if at > self.seen[gw] {
                self.seen[gw] = at;
                health.heard(gw);
            }
        }
    }

    /// This transfer has `n` chunks in flight through `gw`.
    pub fn fly(&mut self, gw: Gw, n: usize) {
        let (Some(s), Some(mine)) = (self.slots.get(gw), self.flying.get_mut(gw)) else {
            return;
        };
        if n > *mine {
            s.flying.fetch_add(n - *mine, Ordering::Relaxed);
        } else {
            s.flying.fetch_sub(*mine - n, Ordering::Relaxed);
        }
        *mine = n;
    }

    /// The other transfers through `gw`, and their chunks in flight.
    pub fn others(&self, gw: Gw) -> Others {
        match (self.slots.get(gw), self.flying.get(gw)) {
            (Some(s), Some(mine)) => Others {
                transfers: s.transfers.load(Ordering::Relaxed).saturating_sub(1),
                chunks: s.flying.load(Ordering::Relaxed).saturating_sub(*mine),
            },
            _ => Others::default(),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        for gw in 0..self.slots.len() {
            self.fly(gw, 0);
            self.slots[gw].transfers.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{HealthConfig, HealthEvent};

    const MS: Nanos = 1_000_000;

    /// Transfer B's heartbeats to gateway 0 wait `late` behind queued
    /// chunks and its last chunk came back in 20 ms; transfer A hears the
    /// gateway every 10 ms until `a_stops`. When B first takes the gateway
    /// down, if it does within 5 s.
    fn b_takes_down(shared: bool, late: Option<Nanos>, a_stops: Nanos) -> Option<Nanos> {
        let cfg = HealthConfig::default();
        let heard = Heard::new();
        let mut a = heard.watch(&[(7, 1)]);
        let mut b = heard.watch(&[(7, 1)]);
        let mut h = Health::new(1, cfg, 0);
        h.trip(0, 20 * MS);
        let mut pending: Vec<(Nanos, u64)> = Vec::new();
        for now in (0..5000).map(|t| t * MS) {
            let mut out = Vec::new();
            for &(_, seq) in pending.iter().filter(|p| p.0 == now) {
                h.on_reply(0, seq, &mut out);
            }
            pending.retain(|p| p.0 != now);
            if now < a_stops && now % (10 * MS) == 0 {
                a.hear(0, now);
            }
            if shared {
                b.news(&mut h);
            }
            h.poll(now, &mut out);
            for e in out {
                match e {
                    HealthEvent::Probe { seq, .. } => {
                        if let Some(l) = late {
                            pending.push((now + l, seq));
                        }
                    }
                    HealthEvent::Down(_) => return Some(now),
                    HealthEvent::Up(_) => {}
                }
            }
        }
        None
    }

    #[test]
    fn a_gateway_another_transfer_hears_stays_up() {
        let late = Some(600 * MS);
        assert_eq!(b_takes_down(true, late, u64::MAX), None);
        assert!(
            b_takes_down(false, late, u64::MAX).is_some(),
            "on its own heartbeats alone the transfer takes it down"
        );
    }

    #[test]
    fn a_gateway_nobody_hears_is_found_as_fast_as_before() {
        let bound = HealthConfig::default().detection_bound();
        let alone = b_takes_down(false, None, 0).expect("never answers");
        assert!(alone <= bound, "{alone}");
        let dies = 2000 * MS;
        let shared = b_takes_down(true, None, dies).expect("dies at 2 s");
        assert!(shared > dies && shared - dies <= bound, "{}", shared - dies);
    }

    #[test]
    fn news_is_what_others_heard_since_the_last_look() {
        let heard = Heard::new();
        let mut a = heard.watch(&[(1, 1), (2, 1)]);
        let mut b = heard.watch(&[(2, 1), (1, 1)]);
        let mut other = Heard::new().watch(&[(1, 1)]);
        let mut h = Health::new(2, HealthConfig::default(), 0);
        let mut out = Vec::new();
        for t in 0..3 {
            h.poll(t * 100 * MS, &mut out);
        }
        out.clear();
        other.hear(0, 250 * MS);
        a.hear(0, 250 * MS); // node 1: b's gateway 1
        b.news(&mut h);
        h.poll(300 * MS, &mut out);
        assert_eq!(
            out,
            [
                HealthEvent::Down(0),
                HealthEvent::Probe { gw: 0, seq: 4 },
                HealthEvent::Probe { gw: 1, seq: 4 }
            ],
            "node 2 unheard is down; node 1 heard through a, not through another table"
        );
        out.clear();
        b.news(&mut h);
        h.poll(400 * MS, &mut out);
        assert!(out.iter().all(|e| matches!(e, HealthEvent::Probe { .. })));
        b.news(&mut h);
        h.poll(500 * MS, &mut out);
        h.poll(600 * MS, &mut out);
        assert!(
            out.contains(&HealthEvent::Down(1)),
            "old news counts once: {out:?}"
        );
    }

    #[test]
    fn each_transfer_sees_the_others_and_their_chunks_in_flight_until_they_end() {
        let heard = Heard::new();
        let mut a = heard.watch(&[(1, 1), (2, 1)]);
        let mut b = heard.watch(&[(2, 1), (1, 1)]);
        let stranger = Heard::new().watch(&[(1, 1)]);
        let others = |transfers, chunks| Others { transfers, chunks };
        a.fly(0, 3); // node 1
        a.fly(1, 2); // node 2
        b.fly(0, 4); // node 2
        assert_eq!((b.others(0), b.others(1)), (others(1, 2), others(1, 3)));
        assert_eq!((a.others(0), a.others(1)), (others(1, 0), others(1, 4)));
        assert_eq!(stranger.others(0), others(0, 0), "another table");
        // Answers come back and chunks go: the counts follow, either way.
        a.fly(0, 1);
        b.fly(0, 6);
        assert_eq!((b.others(1), a.others(1)), (others(1, 1), others(1, 6)));
        drop(b);
        assert_eq!(a.others(1), others(0, 0), "an ended transfer leaves");
        let c = heard.watch(&[(1, 1)]);
        assert_eq!(c.others(0), others(1, 1));
        drop(a);
        assert_eq!(c.others(0), others(0, 0));
        assert_eq!(c.others(7), others(0, 0), "a gateway it does not use");
    }
}
