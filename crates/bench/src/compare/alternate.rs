//! Runs of our side and a peer's made one after the other, and what is
//! kept of them: each side's median, and the spread of the ratios of the
//! runs made back to back. One run moves with where the scheduler puts
//! the processes and with whatever else the machine does in that second;
//! alternated runs share both.
//!
//! ```text
//!  ours ─► theirs ─► ours ─► theirs ─► ...   (5 latency, 3 bandwidth)
//!   └ median of ours ┘  └ median of theirs ┘  └ lowest, highest ours/theirs ┘
//! ```

pub(super) use crate::stats::median;

/// Latency runs of each side behind one latency row, alternated.
pub(super) const ALTERNATIONS: usize = 5;

/// A latency run's median and 99th percentile, microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Lat {
    pub(super) median: f64,
    pub(super) p99: Option<f64>,
}

impl From<crate::peers::Latency> for Lat {
    fn from(l: crate::peers::Latency) -> Lat {
        Lat {
            median: l.median,
            p99: Some(l.p99),
        }
    }
}

/// Runs our side and the peer's [`ALTERNATIONS`] times each, one after
/// the other, and keeps each side's median of medians and of 99th
/// percentiles. One run moves with where the scheduler puts the processes
/// and with whatever else the machine does in that second; alternated
/// runs share both. `theirs` is `None` when the peer is not installed; a
/// failed run of it counts as missing.
pub(super) fn alternated(
    mut ours: impl FnMut() -> anyhow::Result<Lat>,
    mut theirs: Option<impl FnMut() -> Option<Lat>>,
) -> anyhow::Result<(Lat, Option<Lat>, Option<Spread>)> {
    let (mut a, mut b, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ALTERNATIONS {
        let o = ours()?;
        a.push(o);
        if let Some(r) = theirs.as_mut().and_then(|f| f()) {
            pairs.push((o.median, r.median));
            b.push(r);
        }
    }
    let side = |v: &[Lat]| {
        median(v.iter().map(|l| l.median).collect()).map(|m| Lat {
            median: m,
            p99: median(v.iter().filter_map(|l| l.p99).collect()),
        })
    };
    let ours = side(&a).ok_or_else(|| anyhow::anyhow!("no latency run"))?;
    Ok((ours, side(&b), spread(pairs)))
}

/// Bandwidth runs of each side, three alternated: each side's median, and
/// the spread of each run of ours over the peer's right after it. `theirs`
/// is given our run's figure (a peer's run moves as many bytes).
pub(super) fn alternated_bw(
    mut ours: impl FnMut() -> anyhow::Result<Option<f64>>,
    mut theirs: impl FnMut(Option<f64>) -> Option<f64>,
) -> anyhow::Result<(Option<f64>, Option<f64>, Option<Spread>)> {
    let (mut a, mut b, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        let o = ours()?;
        let t = theirs(o);
        a.extend(o);
        b.extend(t);
        pairs.extend(o.zip(t));
    }
    Ok((median(a), median(b), spread(pairs)))
}

/// The lowest and the highest of some ratios.
pub(super) type Spread = (f64, f64);

/// The lowest and the highest ours / theirs of runs made back to back
/// (`None` without a pair to divide).
pub(super) fn spread(pairs: impl IntoIterator<Item = (f64, f64)>) -> Option<Spread> {
    pairs
        .into_iter()
        .filter(|&(_, b)| b > 0.0)
        .map(|(a, b)| a / b)
        .fold(None, |acc, r| {
            Some(acc.map_or((r, r), |(lo, hi): (f64, f64)| (lo.min(r), hi.max(r))))
        })
}

/// Iterations of a peer's bandwidth run of `size`-byte messages: as many
/// bytes as ours moved (`ours` MB/s for `secs`), both sides timed over the
/// same stretch of the machine; never fewer than `floor` MB/s would move in
/// that time, for a peer slower than ours to reach its pace (`ucx_perftest`'s
/// tcp puts of 4 MB start slowly: 302 of them took 5.3 s, 2,500 took 10.9 s,
/// 230 against 890 MiB/s overall).
pub(super) fn peer_iters(ours: Option<f64>, floor: f64, secs: f64, size: usize) -> u64 {
    let mb_s = ours.map_or(floor, |v| v.max(floor));
    ((mb_s * 1e6 * secs / size.max(1) as f64) as u64).clamp(100, 10_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn a_peers_bandwidth_run_moves_what_ours_moved_and_no_less_than_its_floor() {
        // Ours moved 66 GB/s for a second: 66,000 puts of 1 MB for theirs.
        assert_eq!(peer_iters(Some(66_000.0), 20_000.0, 1.0, 1_000_000), 66_000);
        // Ours slower than the floor, or no figure of ours: the floor.
        assert_eq!(peer_iters(Some(1_200.0), 10_000.0, 1.0, 4_000_000), 2_500);
        assert_eq!(peer_iters(None, 20_000.0, 0.5, 4_000_000), 2_500);
        // Bounded both ways.
        assert_eq!(peer_iters(Some(1.0), 1.0, 0.1, 4_000_000), 100);
        assert_eq!(peer_iters(Some(1e9), 1.0, 10.0, 1), 10_000_000);
    }

    #[test]
    fn bandwidth_runs_alternate_the_peer_moves_what_ours_did_and_a_missing_figure_is_no_pair() {
        let order = RefCell::new(Vec::new());
        let mut ours = [Some(10.0), None, Some(30.0)].into_iter();
        let (a, b, pairs) = alternated_bw(
            || {
                order.borrow_mut().push("o");
                Ok(ours.next().unwrap())
            },
            |o| {
                order.borrow_mut().push("t");
                // Told what ours moved; fails after our failed run.
                o.map(|v| v / 2.0 + 1.0)
            },
        )
        .unwrap();
        assert_eq!(order.into_inner(), ["o", "t", "o", "t", "o", "t"]);
        assert_eq!((a, b), (Some(20.0), Some(11.0)));
        assert_eq!(pairs, Some((10.0 / 6.0, 30.0 / 16.0)));
        // A failure of ours ends the row.
        let e = alternated_bw(|| anyhow::bail!("no run"), |_| Some(1.0));
        assert!(e.is_err());
    }

    #[test]
    fn latency_runs_alternate_and_each_side_keeps_its_median_and_the_pairs_their_spread() {
        let order = RefCell::new(String::new());
        let mut ours = [3.0, 9.0, 1.0, 2.0, 8.0].into_iter();
        let mut theirs = [5.0, 4.0, 7.0, 6.0].into_iter();
        let (a, b, pairs) = alternated(
            || {
                order.borrow_mut().push('o');
                let m = ours.next().unwrap();
                Ok(Lat {
                    median: m,
                    p99: Some(m * 10.0),
                })
            },
            Some(|| {
                order.borrow_mut().push('t');
                // The peer's last run fails: it counts as missing.
                theirs.next().map(|m| Lat {
                    median: m,
                    p99: None,
                })
            }),
        )
        .unwrap();
        assert_eq!(order.into_inner(), "ototototot");
        assert_eq!(
            a,
            Lat {
                median: 3.0,
                p99: Some(30.0)
            }
        );
        assert_eq!(
            b,
            Some(Lat {
                median: 5.5,
                p99: None
            })
        );
        // Each of ours over the peer's run right after it: 3/5, 9/4, 1/7,
        // 2/6; the fifth has no pair.
        assert_eq!(pairs, Some((1.0 / 7.0, 9.0 / 4.0)));
        // No peer: our side alone.
        let none: Option<fn() -> Option<Lat>> = None;
        let (a, b, pairs) = alternated(
            || {
                Ok(Lat {
                    median: 1.0,
                    p99: None,
                })
            },
            none,
        )
        .unwrap();
        assert_eq!((a.median, b, pairs), (1.0, None, None));
        assert_eq!(spread([(2.0, 0.0)]), None, "no ratio of a zero");
        assert_eq!(spread([(2.0, 4.0), (3.0, 0.0)]), Some((0.5, 0.5)));
        // Our run failing fails the row.
        let none: Option<fn() -> Option<Lat>> = None;
        assert!(alternated(|| Err(anyhow::anyhow!("gone")), none).is_err());
        assert_eq!(median(vec![]), None);
    }
}
