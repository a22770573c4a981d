//! Loss models: independent (Bernoulli) and bursty (Gilbert-Elliott).

use rand::Rng;
use serde::{Deserialize, Serialize};

/// How packets are lost.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum LossModel {
    /// None lost.
    None,
    /// Each packet lost with probability `p`, independently.
    Bernoulli {
        /// Loss probability.
        p: f64,
    },
    /// Two states, good and bad, each with its own loss probability; after
    /// each packet the good state turns bad with probability `p`, the bad
    /// one good with probability `r` (netem's `gemodel p r 1-h 1-k`).
    GilbertElliott {
        /// Good to bad.
        p: f64,
        /// Bad to good.
        r: f64,
        /// Loss probability in the bad state (1-h).
        loss_bad: f64,
        /// Loss probability in the good state (1-k).
        loss_good: f64,
    },
}

impl LossModel {
    pub(crate) fn check(&self) -> Result<(), String> {
        let probs: &[f64] = match self {
            LossModel::None => &[],
            LossModel::Bernoulli { p } => &[*p],
            LossModel::GilbertElliott {
                p,
                r,
                loss_bad,
                loss_good,
            } => &[*p, *r, *loss_bad, *loss_good],
        };
        match probs.iter().find(|v| !(0.0..=1.0).contains(*v)) {
            Some(v) => Err(format!("loss probabilities must be in 0..=1, not {v}")),
            None => Ok(()),
        }
    }

    /// The long-run share of packets lost.
    pub fn mean(&self) -> f64 {
        match *self {
            LossModel::None => 0.0,
            LossModel::Bernoulli { p } => p,
            LossModel::GilbertElliott {
                p,
                r,
                loss_bad,
                loss_good,
            } => {
                if p + r == 0.0 {
                    return loss_good;
                }
                let bad = p / (p + r);
                bad * loss_bad + (1.0 - bad) * loss_good
            }
        }
    }
}

/// The state a loss model keeps between packets.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LossState {
    bad: bool,
}

impl LossState {
    /// Whether the next packet is lost.
    pub(crate) fn lose(&mut self, m: &LossModel, rng: &mut impl Rng) -> bool {
        match *m {
            LossModel::None => false,
            LossModel::Bernoulli { p } => p > 0.0 && rng.random::<f64>() < p,
            LossModel::GilbertElliott {
                p,
                r,
                loss_bad,
                loss_good,
            } => {
                let loss = if self.bad { loss_bad } else { loss_good };
                let lost = loss > 0.0 && rng.random::<f64>() < loss;
                let flip = if self.bad { r } else { p };
                if flip > 0.0 && rng.random::<f64>() < flip {
                    self.bad = !self.bad;
                }
                lost
            }
        }
    }
}
