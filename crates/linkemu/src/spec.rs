//! What a link is asked to do, one direction.

use serde::{Deserialize, Serialize};

use crate::jitter::Jitter;
use crate::loss::LossModel;
use crate::Nanos;

/// One-way delay of a kilometre of fibre (light at about two thirds of its
/// speed in vacuum).
pub const NS_PER_KM: Nanos = 5_000;

/// How much the queue in front of the rate limit holds before it drops new
/// packets (tail drop).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueueLimit {
    /// Bytes waiting.
    Bytes(u64),
    /// Time the newest packet would wait.
    Time(Nanos),
}

/// A rate limit: a token bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    /// Bytes per second.
    pub bytes_per_sec: u64,
    /// Bytes the bucket holds (a burst sent at once); at least one packet.
    pub burst: u64,
    /// The queue in front of the bucket.
    pub queue: QueueLimit,
}

/// What a link does to packets in one direction.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    /// One-way delay.
    pub delay: Nanos,
    /// Variation of the delay; packets keep their order unless `reorder`.
    pub jitter: Option<Jitter>,
    /// Rate limit.
    pub rate: Option<Rate>,
    /// Loss.
    pub loss: LossModel,
    /// Probability that a packet skips the delay and so overtakes others.
    pub reorder: f64,
    /// Probability that a packet is delivered twice.
    pub duplicate: f64,
    /// Probability that one bit of a packet is flipped.
    pub corrupt: f64,
    /// Seed of every random decision.
    pub seed: u64,
}

impl Spec {
    /// A link of `delay` that does nothing else.
    pub fn new(delay: Nanos) -> Spec {
        Spec {
            delay,
            jitter: None,
            rate: None,
            loss: LossModel::None,
            reorder: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            seed: 1,
        }
    }

    /// A link as long as `km` kilometres of fibre.
    pub fn km(km: f64) -> Spec {
        Spec::new((km.max(0.0) * NS_PER_KM as f64).round() as Nanos)
    }

    /// Whether the probabilities are probabilities, and the rest in range.
    pub fn check(&self) -> Result<(), String> {
        let p = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} must be a probability, not {v}"))
            }
        };
        p("reorder", self.reorder)?;
        p("duplicate", self.duplicate)?;
        p("corrupt", self.corrupt)?;
        self.loss.check()?;
        if let Some(j) = &self.jitter {
            p("jitter correlation", j.correlation)?;
        }
        if let Some(r) = &self.rate {
            if r.bytes_per_sec == 0 {
                return Err("a rate of 0 bytes per second carries nothing".into());
            }
        }
        Ok(())
    }
}
