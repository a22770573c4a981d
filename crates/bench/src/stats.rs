//! Summaries of latency samples.

use serde::Serialize;

/// Minimum, median, 99th percentile and mean of a set of samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Smallest sample.
    pub min: f64,
    /// Middle sample.
    pub median: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl Summary {
    /// Summarises `samples` (sorted in place). An empty set gives zeros.
    pub fn of(samples: &mut [f64]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        samples.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            samples[((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1]
        };
        Summary {
            min: samples[0],
            median: rank(0.5),
            p99: rank(0.99),
            mean: samples.iter().sum::<f64>() / samples.len() as f64,
        }
    }
}

/// The median of `v` (of the two middle ones, their mean); `None` when
/// empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The index of the median of `rates` (of an even number, the slower of
/// the middle two): a run that was, whose figures go together. `None` for
/// none.
pub fn median_run(rates: &[f64]) -> Option<usize> {
    let mut order: Vec<usize> = (0..rates.len()).collect();
    order.sort_by(|&a, &b| rates[a].total_cmp(&rates[b]));
    order.get(rates.len().saturating_sub(1) / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_a_known_set() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = Summary::of(&mut v);
        assert_eq!((s.min, s.median, s.p99, s.mean), (1.0, 50.0, 99.0, 50.5));
        assert_eq!(Summary::of(&mut []), Summary::default());
    }

    #[test]
    fn the_median_run_is_one_that_was_and_of_two_the_slower() {
        assert_eq!(median_run(&[]), None);
        assert_eq!(median_run(&[5.0]), Some(0));
        assert_eq!(median_run(&[300.0, 100.0, 200.0]), Some(2));
        assert_eq!(median_run(&[300.0, 100.0]), Some(1));
        assert_eq!(median_run(&[4.0, 1.0, 3.0, 2.0]), Some(3));
    }
}
