//! Delay variation: a distribution, and correlation between neighbours.

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::Nanos;

/// Shape of the delay variation, centred on the link's delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Distribution {
    /// Evenly between -amount and +amount.
    Uniform,
    /// Normal, standard deviation `amount`.
    Normal,
    /// Pareto (shape 3, a long tail of late packets), mean zero, scale
    /// `amount`.
    Pareto,
}

/// Variation of the delay.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Jitter {
    /// Scale of the variation (for uniform, the half-width).
    pub amount: Nanos,
    /// Shape.
    pub distribution: Distribution,
    /// Weight of the previous packet's variation in the next one (0 to 1).
    pub correlation: f64,
}

/// The variation drawn for the previous packet.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct JitterState {
    last: f64,
}

impl JitterState {
    /// Nanoseconds to add to (or take from) the delay of the next packet.
    pub(crate) fn next(&mut self, j: &Jitter, rng: &mut impl Rng) -> f64 {
        let a = j.amount as f64;
        let fresh = match j.distribution {
            Distribution::Uniform => rng.random_range(-1.0..=1.0) * a,
            Distribution::Normal => normal(rng) * a,
            Distribution::Pareto => {
                // Pareto with shape 3 and scale 1 has mean 1.5; shifted to
                // mean zero.
                let u: f64 = rng.random_range(f64::EPSILON..1.0);
                (u.powf(-1.0 / 3.0) - 1.5) * a
            }
        };
        let c = j.correlation.clamp(0.0, 1.0);
        self.last = c * self.last + (1.0 - c) * fresh;
        self.last
    }
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}
