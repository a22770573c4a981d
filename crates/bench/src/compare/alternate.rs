//! Runs of our side and a peer's made one after the other, and what is
//! kept of them: each side's median, the spread of the ratios of the
//! runs made back to back, and the processor time the machine's host took
//! during each run.
//! One run moves with where the scheduler puts the processes and with
//! whatever else the machine does in that second; alternated runs share
//! both. A virtual machine's host also stops its processors now and then:
//! a run it took time from is slower for that, and a pair of runs it took
//! (next to) nothing from compares the two sides alone.
//!
//! ```text
//!  ours ─► theirs ─► ours ─► theirs ─► ...   (5 or 9 latency, 3 bandwidth)
//!   └ median of ours ┘  └ median of theirs ┘  └ lowest, highest ours/theirs ┘
//!   steal ─►  steal ─►                          └ the ratio of the calm pairs ┘
//! ```

pub(super) use crate::stats::median;
use crate::stats::{median_interval, MedianInterval};
use serde::Serialize;
use std::time::Instant;

/// Latency runs of each side behind one latency row, alternated.
pub(super) const ALTERNATIONS: usize = 5;

/// Latency runs of each side behind a row of small messages over shared
/// memory or UCX, alternated. A run of either side there lasts tens of
/// milliseconds (the peer's start-up is most of a pair), and moves between
/// levels with where the host has put the machine's two processors in
/// that second: one cache line passed between two threads kept to them
/// took 40-120 ns a half round trip in some seconds and 320-460 ns in
/// others on the 2-core EPYC VM, and either side's half round trip moved
/// between 0.15 and 0.39 µs (ours) or 0.18 and 0.65 (UCX's) with no steal
/// in either. Five pairs left the verdict to which levels three of five
/// runs of each fell on; nine cost a few seconds more. Such rows count a
/// pair only where both its runs had one placement (`placement`).
pub(super) const BRIEF_ALTERNATIONS: usize = 9;

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

/// The most of a run's length the host may take, summed over the
/// processors, for the run to count as calm: the kernel counts steal in
/// 10 ms ticks, so a run of a second may lose one tick, one of two
/// seconds two, a shorter one none.
pub const CALM_SHARE: f64 = 0.01;

/// One run of ours and the peer's run right after it: each side's figure,
/// how long each run took (ms), and the processor time the machine's host
/// took during each (steal, summed over the processors, ms; `None` where
/// it is not counted).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Pair {
    pub ours: f64,
    pub theirs: f64,
    pub ours_run_ms: f64,
    pub theirs_run_ms: f64,
    pub host_ours_ms: Option<f64>,
    pub host_theirs_ms: Option<f64>,
}

impl Pair {
    /// Whether the host took no more than [`CALM_SHARE`] of either run.
    fn calm(&self) -> bool {
        let calm = |took: Option<f64>, run_ms: f64| took.is_some_and(|t| t <= CALM_SHARE * run_ms);
        calm(self.host_ours_ms, self.ours_run_ms) && calm(self.host_theirs_ms, self.theirs_run_ms)
    }
}

/// How long the two runs of a pair took, and what the host took during
/// each, ms.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Took {
    ours_run: f64,
    theirs_run: f64,
    ours: Option<f64>,
    theirs: Option<f64>,
}

/// What the host took during a row's pairs of runs, and the row's ratio
/// over the pairs it took (next to) nothing from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Host {
    /// Steal during our runs of the row's pairs, summed, ms (`None`
    /// unless every one was counted).
    pub ours_ms: Option<f64>,
    /// During the peer's runs of those pairs.
    pub theirs_ms: Option<f64>,
    /// Pairs the host took no more than `CALM_SHARE` (1 %) of either run
    /// from.
    pub calm_pairs: usize,
    /// The median of ours over the median of theirs, of those pairs.
    pub calm_ratio: Option<f64>,
    /// Every pair.
    pub pairs: Vec<Pair>,
}

/// The pairs of runs behind one row, and how the host's steal is read
/// (cumulative, ms).
#[derive(Clone, Debug)]
pub(super) struct Pairs {
    runs: Vec<Pair>,
    steal: fn() -> Option<u64>,
}

impl Default for Pairs {
    fn default() -> Pairs {
        Pairs::reading(crate::stalls::steal_ms)
    }
}

impl Pairs {
    /// No pairs yet; the host's steal read by `steal`.
    pub(super) fn reading(steal: fn() -> Option<u64>) -> Pairs {
        Pairs {
            runs: Vec::new(),
            steal,
        }
    }

    /// Runs `ours`, then `theirs` given our run's result, each timed
    /// against the host's steal; a pair where `figure` finds both sides'
    /// figures. Also says what the host took during each run.
    pub(super) fn run<O, T>(
        &mut self,
        ours: impl FnOnce() -> anyhow::Result<O>,
        theirs: impl FnOnce(&O) -> Option<T>,
        figure: impl Fn(&O, &T) -> Option<(f64, f64)>,
    ) -> anyhow::Result<(O, Option<T>, Took)> {
        let took = |since: Option<u64>| {
            since
                .zip((self.steal)())
                .map(|(a, b)| b.saturating_sub(a) as f64)
        };
        let (s, at) = ((self.steal)(), Instant::now());
        let o = ours()?;
        let (host_ours, ours_run) = (took(s), at.elapsed());
        let (s, at) = ((self.steal)(), Instant::now());
        let t = theirs(&o);
        let took = Took {
            ours_run: ours_run.as_secs_f64() * 1e3,
            theirs_run: at.elapsed().as_secs_f64() * 1e3,
            ours: host_ours,
            theirs: took(s),
        };
        if let Some((ours, theirs)) = t.as_ref().and_then(|t| figure(&o, t)) {
            self.push(ours, theirs, took);
        }
        Ok((o, t, took))
    }

    /// Adds a pair of figures of runs the host took `took` from.
    pub(super) fn push(&mut self, ours: f64, theirs: f64, took: Took) {
        self.runs.push(Pair {
            ours,
            theirs,
            ours_run_ms: took.ours_run,
            theirs_run_ms: took.theirs_run,
            host_ours_ms: took.ours,
            host_theirs_ms: took.theirs,
        });
    }

    /// The lowest and the highest ours / theirs (`None` without a pair to
    /// divide).
    pub(super) fn spread(&self) -> Option<Spread> {
        spread(self.figures())
    }

    /// Each pair's ours and theirs.
    fn figures(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.runs.iter().map(|p| (p.ours, p.theirs))
    }

    /// The pairs' ours / theirs, of those with a peer's figure to divide
    /// by.
    pub(super) fn ratios(&self) -> Vec<f64> {
        ratios(self.figures()).collect()
    }

    /// The interval that holds the median of the pairs' ours / theirs
    /// (`stats::median_interval`); `None` without two pairs to divide.
    pub(super) fn interval(&self) -> Option<MedianInterval> {
        median_interval(self.ratios())
    }

    /// What the host took during the pairs; `None` without a pair.
    pub(super) fn host(&self) -> Option<Host> {
        if self.runs.is_empty() {
            return None;
        }
        let sum = |f: fn(&Pair) -> Option<f64>| {
            self.runs
                .iter()
                .map(f)
                .try_fold(0.0, |acc, v| v.map(|v| acc + v))
        };
        let calm: Vec<&Pair> = self.runs.iter().filter(|p| p.calm()).collect();
        let calm_ratio = median(calm.iter().map(|p| p.ours).collect())
            .zip(median(calm.iter().map(|p| p.theirs).collect()))
            .filter(|&(_, b)| b > 0.0)
            .map(|(a, b)| a / b);
        Some(Host {
            ours_ms: sum(|p| p.host_ours_ms),
            theirs_ms: sum(|p| p.host_theirs_ms),
            calm_pairs: calm.len(),
            calm_ratio,
            pairs: self.runs.clone(),
        })
    }
}

#[cfg(test)]
impl Pairs {
    /// Pairs of these figures, each run a second long and its steal as
    /// given.
    pub(super) fn of(runs: &[(f64, f64, Option<f64>, Option<f64>)]) -> Pairs {
        let mut p = Pairs::default();
        for &(ours, theirs, o, t) in runs {
            let took = Took {
                ours_run: 1_000.0,
                theirs_run: 1_000.0,
                ours: o,
                theirs: t,
            };
            p.push(ours, theirs, took);
        }
        p
    }
}

/// Runs our side and the peer's `times` times each ([`ALTERNATIONS`] or
/// [`BRIEF_ALTERNATIONS`]), one after the other, and keeps each side's
/// median of medians and of 99th percentiles. One run moves with where
/// the scheduler puts the processes and with whatever else the machine
/// does in that second; alternated runs share both. `theirs` is `None` when the peer is not installed; a
/// failed run of it counts as missing.
pub(super) fn alternated(
    times: usize,
    mut ours: impl FnMut() -> anyhow::Result<Lat>,
    mut theirs: Option<impl FnMut() -> Option<Lat>>,
) -> anyhow::Result<(Lat, Option<Lat>, Pairs)> {
    let (mut a, mut b, mut pairs) = (Vec::new(), Vec::new(), Pairs::default());
    for _ in 0..times {
        let (o, t, _) = pairs.run(
            &mut ours,
            |_| theirs.as_mut().and_then(|f| f()),
            |o, t| Some((o.median, t.median)),
        )?;
        a.push(o);
        b.extend(t);
    }
    let side = |v: &[Lat]| {
        median(v.iter().map(|l| l.median).collect()).map(|m| Lat {
            median: m,
            p99: median(v.iter().filter_map(|l| l.p99).collect()),
        })
    };
    let ours = side(&a).ok_or_else(|| anyhow::anyhow!("no latency run"))?;
    Ok((ours, side(&b), pairs))
}

/// What a bandwidth run of ours moved: its rate, and how many messages,
/// which the peer's run beside it moves too.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Moved {
    pub(super) mb_per_s: Option<f64>,
    pub(super) messages: u64,
}

impl From<&crate::report::BwRow> for Moved {
    fn from(r: &crate::report::BwRow) -> Moved {
        Moved {
            mb_per_s: r.mb_per_s,
            messages: r.sent,
        }
    }
}

/// Bandwidth runs of each side, three alternated: each side's median, and
/// the pairs of each run of ours and the peer's right after it. `theirs`
/// is told what our run moved (a peer's run moves as many messages).
pub(super) fn alternated_bw(
    mut ours: impl FnMut() -> anyhow::Result<Moved>,
    mut theirs: impl FnMut(Moved) -> Option<f64>,
) -> anyhow::Result<(Option<f64>, Option<f64>, Pairs)> {
    let (mut a, mut b, mut pairs) = (Vec::new(), Vec::new(), Pairs::default());
    for _ in 0..3 {
        let (o, t, _) = pairs.run(
            &mut ours,
            |&o| theirs(o),
            |o, &t| o.mb_per_s.map(|o| (o, t)),
        )?;
        a.extend(o.mb_per_s);
        b.extend(t);
    }
    Ok((median(a), median(b), pairs))
}

/// The lowest and the highest of some ratios.
pub(super) type Spread = (f64, f64);

/// The lowest and the highest ours / theirs of runs made back to back
/// (`None` without a pair to divide).
pub(super) fn spread(pairs: impl IntoIterator<Item = (f64, f64)>) -> Option<Spread> {
    ratios(pairs).fold(None, |acc, r| {
        Some(acc.map_or((r, r), |(lo, hi): (f64, f64)| (lo.min(r), hi.max(r))))
    })
}

/// Ours / theirs of each pair with a peer's figure to divide by.
fn ratios(pairs: impl IntoIterator<Item = (f64, f64)>) -> impl Iterator<Item = f64> {
    pairs
        .into_iter()
        .filter(|&(_, b)| b > 0.0)
        .map(|(a, b)| a / b)
}

/// The fewest messages of `size` bytes a bandwidth pair's runs move: as
/// many as `floor` MB/s moves in `secs`. A run of ours lasts `secs` or
/// moves this many, whichever is more, and the peer's beside it moves as
/// many messages as ours did: both sides timed over as many bytes, on the
/// same stretch of the machine. The floor is for a peer that starts slowly
/// (`ucx_perftest`'s tcp puts of 4 MB: 302 of them took 5.3 s, 2,500 took
/// 10.9 s, 230 against 890 MiB/s overall); a run of ours that stopped at
/// `secs` meanwhile would be timed over its own start alone.
pub(super) fn least_messages(floor: f64, secs: f64, size: usize) -> u64 {
    ((floor * 1e6 * secs / size.max(1) as f64) as u64).clamp(100, 10_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn the_fewest_messages_of_a_pair_are_what_its_floor_moves_in_its_time() {
        // 10 GB/s for a second: 10,000 puts of 1 MB, 2,500 of 4 MB.
        assert_eq!(least_messages(10_000.0, 1.0, 1_000_000), 10_000);
        assert_eq!(least_messages(20_000.0, 0.5, 4_000_000), 2_500);
        // Bounded both ways.
        assert_eq!(least_messages(1.0, 0.1, 4_000_000), 100);
        assert_eq!(least_messages(1e9, 10.0, 1), 10_000_000);
    }

    #[test]
    fn bandwidth_runs_alternate_the_peer_moves_as_many_messages_and_a_missing_figure_is_no_pair() {
        let order = RefCell::new(Vec::new());
        let told = RefCell::new(Vec::new());
        let moved = |mb_per_s, messages| Moved { mb_per_s, messages };
        let mut ours = [
            moved(Some(10.0), 300),
            moved(None, 0),
            moved(Some(30.0), 900),
        ]
        .into_iter();
        let (a, b, pairs) = alternated_bw(
            || {
                order.borrow_mut().push("o");
                Ok(ours.next().unwrap())
            },
            |o| {
                order.borrow_mut().push("t");
                told.borrow_mut().push(o.messages);
                // Fails after our failed run.
                o.mb_per_s.map(|v| v / 2.0 + 1.0)
            },
        )
        .unwrap();
        assert_eq!(order.into_inner(), ["o", "t", "o", "t", "o", "t"]);
        assert_eq!(told.into_inner(), [300, 0, 900]);
        assert_eq!((a, b), (Some(20.0), Some(11.0)));
        assert_eq!(pairs.spread(), Some((10.0 / 6.0, 30.0 / 16.0)));
        assert_eq!(pairs.runs.len(), 2, "a missing figure is no pair");
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
            5,
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
        assert_eq!(pairs.spread(), Some((1.0 / 7.0, 9.0 / 4.0)));
        // No peer: our side alone, as many runs as asked.
        let none: Option<fn() -> Option<Lat>> = None;
        let mut runs = 0;
        let (a, b, pairs) = alternated(
            3,
            || {
                runs += 1;
                Ok(Lat {
                    median: 1.0,
                    p99: None,
                })
            },
            none,
        )
        .unwrap();
        assert_eq!(runs, 3);
        assert_eq!((a.median, b, pairs.spread()), (1.0, None, None));
        assert_eq!(pairs.host(), None, "no pair, nothing to say of the host");
        assert_eq!(spread([(2.0, 0.0)]), None, "no ratio of a zero");
        assert_eq!(spread([(2.0, 4.0), (3.0, 0.0)]), Some((0.5, 0.5)));
        // Our run failing fails the row.
        let none: Option<fn() -> Option<Lat>> = None;
        assert!(alternated(5, || Err(anyhow::anyhow!("gone")), none).is_err());
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn the_calm_ratio_is_of_the_pairs_the_host_took_next_to_nothing_from() {
        // Runs of a second each: a tick of 10 ms is 1 %, calm.
        let p = Pairs::of(&[
            (1.0, 1.0, Some(0.0), Some(10.0)),
            // The host took 300 ms from our run: slow, and not calm.
            (3.0, 1.0, Some(300.0), Some(0.0)),
            (1.2, 1.0, Some(0.0), Some(0.0)),
            // ... 20 ms from the peer's run, 2 %.
            (1.0, 2.0, Some(0.0), Some(20.0)),
            (1.1, 1.0, Some(10.0), Some(0.0)),
        ]);
        let h = p.host().unwrap();
        assert_eq!((h.ours_ms, h.theirs_ms), (Some(310.0), Some(30.0)));
        assert_eq!(h.calm_pairs, 3);
        // Medians of the three calm pairs: 1.1 over 1.0.
        assert!((h.calm_ratio.unwrap() - 1.1).abs() < 1e-9, "{h:?}");
        assert_eq!(h.pairs.len(), 5);
        // All pairs' spread still counts the slow ones.
        assert_eq!(p.spread(), Some((0.5, 3.0)));

        // Steal not counted for one run: the sum is unknown, not short,
        // and that pair is not calm; the other's tick is (1 %).
        let p = Pairs::of(&[
            (1.0, 1.0, None, Some(0.0)),
            (2.0, 1.0, Some(10.0), Some(0.0)),
        ]);
        let h = p.host().unwrap();
        assert_eq!((h.ours_ms, h.theirs_ms), (None, Some(0.0)));
        assert_eq!((h.calm_pairs, h.calm_ratio), (1, Some(2.0)));
    }

    /// A host's steal counter for the test below, moved by its runs.
    static STOLEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1_000);

    fn stolen() -> Option<u64> {
        Some(STOLEN.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn steal(ms: u64) {
        STOLEN.fetch_add(ms, std::sync::atomic::Ordering::Relaxed);
    }

    #[test]
    fn each_run_of_a_pair_is_timed_against_the_host_on_its_own() {
        let mut p = Pairs::reading(stolen);
        // The host takes 30 ms during ours, 7 during the peer's, and 100
        // after the pair (no run's: the next pair reads it 0).
        let (o, t, took) = p
            .run(
                || {
                    steal(30);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    Ok(5.0)
                },
                |&o| {
                    steal(7);
                    Some(o * 2.0)
                },
                |&o, &t| Some((o, t)),
            )
            .map(|(o, t, took)| {
                steal(100);
                (o, t, took)
            })
            .unwrap();
        assert_eq!((o, t), (5.0, Some(10.0)), "the peer is told ours");
        assert_eq!((took.ours, took.theirs), (Some(30.0), Some(7.0)));
        // Each run's own length: ours slept 20 ms, the peer's did not.
        assert!(took.ours_run >= 20.0 && took.ours_run < 1_000.0, "{took:?}");
        assert!(took.theirs_run < took.ours_run, "{took:?}");
        // No figure of theirs: no pair, but what the host took is said.
        let (_, t, took) = p
            .run(|| Ok(1.0), |_| None::<f64>, |&o, &t| Some((o, t)))
            .unwrap();
        assert_eq!((t, took.ours, took.theirs), (None, Some(0.0), Some(0.0)));
        assert_eq!(p.runs.len(), 1);
        let q = p.runs[0];
        assert_eq!((q.ours, q.theirs), (5.0, 10.0));
        assert_eq!((q.host_ours_ms, q.host_theirs_ms), (Some(30.0), Some(7.0)));
        assert!(q.ours_run_ms >= 20.0, "{q:?}");
        // 30 ms of a run of a few tens of ms: not calm.
        assert_eq!(p.host().unwrap().calm_pairs, 0);
        // A failure of ours ends the row before the peer runs.
        let ran = std::cell::Cell::new(false);
        let e = p.run(
            || anyhow::bail!("gone"),
            |_: &f64| {
                ran.set(true);
                Some(1.0)
            },
            |&o, &t| Some((o, t)),
        );
        assert!(e.is_err() && !ran.get());
        // Where steal is not counted, it is unknown, not none.
        let mut p = Pairs::reading(|| None);
        let (.., took) = p
            .run(|| Ok(1.0), |_| Some(1.0), |&o, &t| Some((o, t)))
            .unwrap();
        assert_eq!((took.ours, took.theirs), (None, None));
        assert_eq!(p.host().unwrap().calm_pairs, 0);
    }
}
