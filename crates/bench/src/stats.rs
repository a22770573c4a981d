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

/// The confidence [`median_interval`] asks of its interval.
pub const MEDIAN_CONFIDENCE: f64 = 0.9;

/// An interval that holds the median of what some samples were drawn
/// from, with the chance that it does.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MedianInterval {
    /// Its lower end.
    pub lo: f64,
    /// Its upper end.
    pub hi: f64,
    /// The chance that it holds the median (0-1).
    pub confidence: f64,
}

/// The interval of `v`'s order statistics k and n + 1 - k (of n) that
/// holds the median of whatever `v` was drawn from with at least
/// [`MEDIAN_CONFIDENCE`], for the largest such k: each sample falls below
/// the median with a chance of one half, so the interval misses it with
/// the chance that fewer than k fall on one side, 2 P(Bin(n, 1/2) < k)
/// (the sign test's interval; nothing is assumed of the distribution but
/// that the samples are drawn alike and apart). Fewer than five samples
/// cannot give that confidence: their interval is from the lowest to the
/// highest, at the confidence that has (three: 75 %). `None` for fewer
/// than two finite samples.
pub fn median_interval(mut v: Vec<f64>) -> Option<MedianInterval> {
    v.retain(|x| x.is_finite());
    let n = v.len();
    if n < 2 {
        return None;
    }
    v.sort_by(f64::total_cmp);
    // `below`: P(Bin(n, 1/2) <= k - 1), the chance that the interval of
    // order statistics k and n + 1 - k misses the median on one side.
    let mut term = 0.5f64.powi(i32::try_from(n).unwrap_or(i32::MAX));
    let mut below = term;
    let mut k = 1;
    while 2 * (k + 1) <= n + 1 {
        // C(n, k) from C(n, k - 1).
        term *= (n - k + 1) as f64 / k as f64;
        if 1.0 - 2.0 * (below + term) < MEDIAN_CONFIDENCE {
            break;
        }
        below += term;
        k += 1;
    }
    Some(MedianInterval {
        lo: v[k - 1],
        hi: v[n - k],
        confidence: 1.0 - 2.0 * below,
    })
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
    fn the_median_interval_is_of_the_order_statistics_the_sign_test_gives() {
        // Fifteen samples: the 4th and the 12th, 1 - 2 (1 + 15 + 105 + 455)
        // / 2^15 = 96.5 %; the 5th and the 11th would give 88.2 %.
        let v: Vec<f64> = (1..=15).rev().map(f64::from).collect();
        let i = median_interval(v).unwrap();
        assert_eq!((i.lo, i.hi), (4.0, 12.0));
        assert!((i.confidence - (1.0 - 2.0 * 576.0 / 32768.0)).abs() < 1e-12);
        // Nine: the 2nd and the 8th, 96.1 %.
        let i = median_interval((1..=9).map(f64::from).collect()).unwrap();
        assert_eq!((i.lo, i.hi), (2.0, 8.0));
        assert!((i.confidence - (1.0 - 2.0 * 10.0 / 512.0)).abs() < 1e-12);
        // Five: the lowest and the highest give 93.75 %.
        let i = median_interval(vec![3.0, 1.0, 5.0, 2.0, 4.0]).unwrap();
        assert_eq!((i.lo, i.hi, i.confidence), (1.0, 5.0, 0.9375));
        // Three cannot give 90 %: the lowest and the highest, 75 %.
        let i = median_interval(vec![0.7, 1.3, 0.6]).unwrap();
        assert_eq!((i.lo, i.hi, i.confidence), (0.6, 1.3, 0.75));
        // What is not a number is left out; fewer than two, no interval.
        let i = median_interval(vec![f64::NAN, 2.0, f64::INFINITY, 1.0]).unwrap();
        assert_eq!((i.lo, i.hi, i.confidence), (1.0, 2.0, 0.5));
        assert_eq!(median_interval(vec![1.0, f64::NAN]), None);
        assert_eq!(median_interval(Vec::new()), None);
    }

    #[test]
    fn every_median_interval_holds_its_confidence_and_the_median() {
        for n in 2..=99usize {
            let v: Vec<f64> = (0..n).map(|i| ((i * 37) % n) as f64).collect();
            let i = median_interval(v.clone()).unwrap();
            let m = median(v).unwrap();
            assert!(i.lo <= m && m <= i.hi, "n {n}: {i:?} and {m}");
            if n >= 5 {
                assert!(i.confidence >= MEDIAN_CONFIDENCE, "n {n}: {i:?}");
            } else {
                assert_eq!((i.lo, i.hi), (0.0, (n - 1) as f64), "n {n}");
            }
            assert!(i.confidence < 1.0, "n {n}: {i:?}");
        }
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
