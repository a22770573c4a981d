//! Where the host has put the machine's processors, as a ping-pong of
//! small messages over shared memory feels it: the time one cache line
//! takes between two threads. On a virtual machine that moves between
//! levels from one second to the next (40-120 ns a half round trip in
//! some seconds, 320-460 in others on a 2-core EPYC VM), and so does
//! either side's figure in a row of 8-byte messages over shared memory or
//! UCX, by as much, and a ping-pong over loopback sockets by a third. A
//! pair of runs of ours and the peer's compares the two only where both
//! ran in one placement, so a row of such pairs
//! probes the line before our run, between the two and after the peer's,
//! and counts the pairs whose three probes agree ([`steady`]), running
//! more pairs until it has as many as it asked for, or gives up at three
//! times that and says so. Pairs each in one placement may still not all
//! be in the same one: a row's figures, a median of each side's runs,
//! are then of the pairs in the most common placement ([`one_level`]),
//! so that ours and the peer's do not each come from another.
//!
//! ```text
//!  probe ─► ours ─► probe ─► theirs ─► probe    steady: the three within
//!    └──────────────── one pair ──────────────┘         STEADY_SPREAD
//! ```

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::alternate::{median, Lat, Pairs, Took};

/// The most the highest of a pair's three probes may be of the lowest for
/// the pair to count: the levels lie three times or more apart, one
/// level's probes within a third of each other.
pub(super) const STEADY_SPREAD: f64 = 1.5;

/// The least the far placement's probe is of the near one's: counted
/// pairs whose probes lie further apart than this were not all in one.
const LEVELS_APART: f64 = 3.0;

/// Round trips of one probe, at most; fewer where [`PROBE_TIME`] runs out
/// first (a probe of two threads on one processor, which pass the line at
/// each switch).
const PROBE_TRIPS: u64 = 20_000;

/// Round trips before the timed ones.
const WARM_TRIPS: u64 = 1_000;

/// The longest one probe runs (its timed round trips).
const PROBE_TIME: Duration = Duration::from_millis(30);

/// Pairs a row runs at most, as a multiple of the steady pairs it asks
/// for.
const MOST_PAIRS: usize = 3;

/// A cache line of its own (the two threads pass nothing else).
#[repr(align(128))]
struct Line(AtomicU64);

/// Whether a pair's probes (µs a half round trip; `None`: a probe that
/// failed) say both runs had one placement.
pub(super) fn steady(probes: [Option<f64>; 3]) -> bool {
    let Some(p) = probes.iter().copied().collect::<Option<Vec<f64>>>() else {
        return false;
    };
    let lo = p.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = p.iter().copied().fold(0.0, f64::max);
    lo > 0.0 && hi <= STEADY_SPREAD * lo
}

/// The mean half round trip (µs) of one cache line passed back and forth
/// between this thread and another, over [`PROBE_TRIPS`] round trips or
/// [`PROBE_TIME`], whichever ends first; `None` if none was made.
pub(super) fn probe() -> Option<f64> {
    let line = Line(AtomicU64::new(0));
    let stop = AtomicU64::new(0);
    let (trips, took) = std::thread::scope(|s| {
        s.spawn(|| {
            // Answers each odd value with the next even one until told
            // to stop, or for the warm-up's and the timed trips' time
            // at most (each bounded by PROBE_TIME).
            let until = Instant::now() + PROBE_TIME * 3;
            let mut spins = 0u32;
            loop {
                let v = line.0.load(Ordering::Acquire);
                if v % 2 == 1 {
                    line.0.store(v + 1, Ordering::Release);
                    continue;
                }
                if stop.load(Ordering::Relaxed) == 1 {
                    return;
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1024) && Instant::now() >= until {
                    return;
                }
                std::hint::spin_loop();
            }
        });
        // The first round trips, not timed, bring the other thread up
        // and the line into both processors' caches.
        let mut t0 = Instant::now();
        let mut trips = 0u64;
        let mut warm = true;
        'trips: while trips < PROBE_TRIPS {
            if warm && trips == WARM_TRIPS {
                (warm, trips, t0) = (false, 0, Instant::now());
            }
            let v = 2 * (trips + if warm { 0 } else { WARM_TRIPS }) + 1;
            line.0.store(v, Ordering::Release);
            let mut spins = 0u32;
            while line.0.load(Ordering::Acquire) != v + 1 {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1024) && t0.elapsed() >= PROBE_TIME {
                    break 'trips;
                }
                std::hint::spin_loop();
            }
            trips += 1;
            if trips.is_multiple_of(256) && t0.elapsed() >= PROBE_TIME {
                break;
            }
        }
        let took = t0.elapsed();
        stop.store(1, Ordering::Relaxed);
        (trips, took)
    });
    (trips > 0).then(|| took.as_secs_f64() * 1e6 / trips as f64 / 2.0)
}

/// How a row's pairs stood with the placement.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Placement {
    /// Pairs run.
    pub run: usize,
    /// Of those, the steady ones, which the row's figures are of where
    /// there are at least half as many as it asked for; else of all.
    pub steady: usize,
    /// Whether the row's figures are of the steady pairs alone.
    pub of_steady: bool,
    /// Where the steady pairs fell in more than one placement: how many
    /// were in the most common one, which the row's figures are then of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<usize>,
    /// The lowest and highest probe of the pairs the figures are of, µs
    /// a half round trip of one cache line.
    pub line_us: Option<(f64, f64)>,
}

impl Placement {
    /// One line for below the table.
    pub fn line(&self, figure: &str) -> String {
        let probes = self
            .line_us
            .map_or("no probe".into(), |(lo, hi)| format!("{lo:.3}-{hi:.3} us"));
        // Pairs each steady may still differ from each other.
        let apart = self.line_us.is_some_and(|(lo, hi)| hi > LEVELS_APART * lo);
        let which = if apart {
            ", not all pairs in the same one"
        } else {
            ""
        };
        if let (true, Some(k)) = (self.of_steady, self.level) {
            format!(
                "{figure}: {} of {} pairs with both runs in one placement, {k} of them in the \
                 most common one{which} (one cache line between two threads {probes} a half \
                 round trip, before, between and after their runs); the row is of those {k}",
                self.steady, self.run
            )
        } else if self.of_steady {
            format!(
                "{figure}: {} of {} pairs with both runs in one placement{which} (one cache line \
                 between two threads {probes} a half round trip, before, between and after \
                 their runs); the row is of those",
                self.steady, self.run
            )
        } else {
            format!(
                "{figure}: {} of {} pairs with both runs in one placement, too few: the row is of \
                 all {} (one cache line between two threads {probes} a half round trip), and \
                 moves with where the host put the processors",
                self.steady, self.run, self.run
            )
        }
    }
}

/// One pair's figures and the probes around its runs.
struct Probed {
    ours: Lat,
    theirs: Option<Lat>,
    probes: [Option<f64>; 3],
    took: Took,
}

/// A steady pair's placement: the middle of its three probes, µs.
fn level(probes: [Option<f64>; 3]) -> f64 {
    let mut p = probes.map(|p| p.unwrap_or(0.0));
    p.sort_by(f64::total_cmp);
    p[1]
}

/// Of pairs at `levels` (each steady pair's [`level`]), those in the
/// most common placement, as indices into `levels` in their order, where
/// they lie further apart than [`LEVELS_APART`]; `None` where they do
/// not, or no placement holds more of them than the others and at least
/// half of `times`. The pairs are split at the widest step between neighbours
/// (the far levels lie three times or more above the near), and again
/// while the part kept still spans more than one.
pub(super) fn one_level(levels: &[f64], times: usize) -> Option<Vec<usize>> {
    let mut order: Vec<usize> = (0..levels.len()).collect();
    order.sort_by(|&a, &b| levels[a].total_cmp(&levels[b]));
    let mut kept: &[usize] = &order;
    let mut split = false;
    while let (Some(&lo), Some(&hi)) = (kept.first(), kept.last()) {
        if !(levels[lo] > 0.0 && levels[hi] > LEVELS_APART * levels[lo]) {
            break;
        }
        let step = |i: usize| levels[kept[i]] / levels[kept[i - 1]];
        let Some(at) = (1..kept.len()).max_by(|&i, &j| step(i).total_cmp(&step(j))) else {
            break;
        };
        let (near, far) = kept.split_at(at);
        let larger = match near.len().cmp(&far.len()) {
            std::cmp::Ordering::Greater => near,
            std::cmp::Ordering::Less => far,
            std::cmp::Ordering::Equal => break,
        };
        if 2 * larger.len() < times {
            break;
        }
        (kept, split) = (larger, true);
    }
    split.then(|| {
        let mut one = kept.to_vec();
        one.sort_unstable();
        one
    })
}

/// As [`super::alternate::alternated`], for a row of small messages over
/// shared memory or UCX: pairs of runs with the placement probed around
/// each ([`probe`], or `probe_with` in tests), until `times` of them
/// are steady or `MOST_PAIRS` times as many were run. Each side's
/// figure is the median of its runs in the steady pairs, where there are
/// at least half of `times` (and of those in the most common placement,
/// where they fell in more than one: [`one_level`]); else in all.
pub(super) fn alternated_steady(
    times: usize,
    mut ours: impl FnMut() -> anyhow::Result<Lat>,
    mut theirs: Option<impl FnMut() -> Option<Lat>>,
    mut probe_with: impl FnMut() -> Option<f64>,
) -> anyhow::Result<(Lat, Option<Lat>, Pairs, Placement)> {
    let mut all: Vec<Probed> = Vec::new();
    let mut runs = Pairs::default();
    let mut steady_n = 0;
    while steady_n < times && all.len() < times * MOST_PAIRS {
        let before = probe_with();
        let mut between = None;
        let (o, t, took) = runs.run(
            &mut ours,
            |_| {
                between = probe_with();
                theirs.as_mut().and_then(|f| f())
            },
            |o, t| Some((o.median, t.median)),
        )?;
        let probes = [before, between, probe_with()];
        steady_n += usize::from(steady(probes));
        all.push(Probed {
            ours: o,
            theirs: t,
            probes,
            took,
        });
    }
    let of_steady = 2 * steady_n >= times;
    let counted: Vec<&Probed> = all
        .iter()
        .filter(|p| !of_steady || steady(p.probes))
        .collect();
    let levels: Vec<f64> = counted.iter().map(|p| level(p.probes)).collect();
    let one = of_steady.then(|| one_level(&levels, times)).flatten();
    let kept: Vec<&Probed> = match &one {
        Some(one) => one.iter().map(|&i| counted[i]).collect(),
        None => counted,
    };
    let side = |v: Vec<Lat>| {
        median(v.iter().map(|l| l.median).collect()).map(|m| Lat {
            median: m,
            p99: median(v.iter().filter_map(|l| l.p99).collect()),
        })
    };
    let ours_lat = side(kept.iter().map(|p| p.ours).collect())
        .ok_or_else(|| anyhow::anyhow!("no latency run"))?;
    let theirs_lat = side(kept.iter().filter_map(|p| p.theirs).collect());
    let probes: Vec<f64> = kept.iter().flat_map(|p| p.probes).flatten().collect();
    let line_us = (!probes.is_empty()).then(|| {
        let lo = probes.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = probes.iter().copied().fold(0.0, f64::max);
        (lo, hi)
    });
    let placement = Placement {
        run: all.len(),
        steady: steady_n,
        of_steady,
        level: one.map(|k| k.len()),
        line_us,
    };
    let mut pairs = Pairs::default();
    for p in &kept {
        if let Some(t) = p.theirs {
            pairs.push(p.ours.median, t.median, p.took);
        }
    }
    Ok((ours_lat, theirs_lat, pairs, placement))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn lat(m: f64) -> Lat {
        Lat {
            median: m,
            p99: Some(m * 2.0),
        }
    }

    #[test]
    fn three_probes_within_the_spread_are_steady_and_a_missing_one_is_not() {
        assert!(steady([Some(0.05), Some(0.07), Some(0.06)]));
        assert!(steady([Some(0.40), Some(0.45), Some(0.32)]));
        assert!(!steady([Some(0.05), Some(0.40), Some(0.06)]));
        assert!(!steady([Some(0.05), None, Some(0.05)]));
        assert!(!steady([Some(0.0), Some(0.0), Some(0.0)]));
    }

    #[test]
    fn a_probe_passes_the_line_and_says_how_long_a_half_round_trip_took() {
        let t0 = Instant::now();
        let p = probe().expect("a probe");
        assert!(p > 0.0 && p.is_finite(), "{p}");
        // Bounded by its time (and the other thread's), whatever the
        // machine does.
        assert!(t0.elapsed() < PROBE_TIME * 10, "{:?}", t0.elapsed());
    }

    /// Runs `alternated_steady` over pairs whose three probes are given in
    /// turn, ours at 1.0 and theirs at 2.0 in a steady pair, 0.5 and 9.0
    /// in another.
    fn run(times: usize, probes: &[f64]) -> (Lat, Option<Lat>, Placement) {
        let at = Cell::new(0usize);
        let calls = Cell::new(0usize);
        let next = || {
            let v = probes[at.get() % probes.len()];
            at.set(at.get() + 1);
            Some(v)
        };
        // Our run is told whether its pair is steady by the probe before
        // it (the probes come in threes).
        let steady_pair = |k: usize| {
            let p = &probes[(3 * k) % probes.len()..];
            steady([Some(p[0]), Some(p[1]), Some(p[2])])
        };
        let ours = || {
            let k = calls.get();
            Ok(lat(if steady_pair(k) { 1.0 } else { 0.5 }))
        };
        let theirs = || {
            let k = calls.get();
            calls.set(k + 1);
            Some(lat(if steady_pair(k) { 2.0 } else { 9.0 }))
        };
        let (o, t, _, p) = alternated_steady(times, ours, Some(theirs), next).unwrap();
        (o, t, p)
    }

    #[test]
    fn pairs_across_a_change_of_placement_are_left_out_and_more_are_run() {
        // Steady, unsteady, steady, ... : five steady pairs asked for.
        let probes = [
            0.05, 0.05, 0.06, // steady
            0.05, 0.40, 0.40, // the placement moved between the runs
        ];
        let (o, t, p) = run(5, &probes);
        assert_eq!((p.run, p.steady, p.of_steady), (9, 5, true));
        assert_eq!(o.median, 1.0);
        assert_eq!(t.unwrap().median, 2.0);
        assert_eq!(p.line_us, Some((0.05, 0.06)));
        assert!(p
            .line("shm 8 B")
            .contains("5 of 9 pairs with both runs in one placement ("));
    }

    #[test]
    fn pairs_each_in_one_placement_but_not_the_same_are_said_to_be_so() {
        let (_, _, p) = run(4, &[0.05, 0.05, 0.06, 0.40, 0.42, 0.45]);
        assert_eq!((p.run, p.steady, p.of_steady), (4, 4, true));
        assert_eq!(p.line_us, Some((0.05, 0.45)));
        assert!(
            p.line("x").contains("not all pairs in the same one"),
            "{}",
            p.line("x")
        );
        // Steady pairs of one level, further apart than one pair may be.
        let (_, _, q) = run(4, &[0.05, 0.05, 0.06, 0.06, 0.08, 0.08]);
        assert_eq!(q.line_us, Some((0.05, 0.08)));
        assert!(!q.line("x").contains("not all"), "{}", q.line("x"));
    }

    #[test]
    fn pairs_far_apart_are_split_at_the_widest_step_and_the_most_common_placement_kept() {
        // Three near, four far: the far ones, in the order given.
        let levels = [0.05, 0.05, 0.17, 0.18, 0.17, 0.06, 0.17];
        assert_eq!(one_level(&levels, 7), Some(vec![2, 3, 4, 6]));
        // As many in each: none kept over the other.
        assert_eq!(one_level(&[0.05, 0.17, 0.05, 0.17], 4), None);
        // One placement, however spread within it.
        assert_eq!(one_level(&[0.05, 0.07, 0.08, 0.1], 4), None);
        // The most common holds fewer than half of the pairs asked for.
        assert_eq!(one_level(&[0.05, 0.05, 0.17], 9), None);
        // Three placements: split twice.
        let three = [0.03, 0.2, 0.03, 0.7, 0.2, 0.03, 0.2, 0.7, 0.03, 0.2, 0.2];
        assert_eq!(one_level(&three, 5), Some(vec![1, 4, 6, 9, 10]));
        // Split once, then the far part's two halves are as many.
        let even = [0.03, 0.03, 0.03, 0.2, 0.2, 0.7, 0.7];
        assert_eq!(one_level(&even, 4), Some(vec![3, 4, 5, 6]));
        assert_eq!(one_level(&[], 4), None);
    }

    #[test]
    fn a_row_of_pairs_in_two_placements_is_of_the_most_common_one() {
        // Each pair: its placement (all three probes), ours, theirs.
        let pairs = [
            (0.05, 1.0, 9.0),
            (0.17, 5.0, 2.0),
            (0.05, 1.0, 9.0),
            (0.17, 6.0, 3.0),
            (0.17, 7.0, 4.0),
        ];
        let (probe, k) = (Cell::new(0usize), Cell::new(0usize));
        let next = || {
            let p = pairs[(probe.get() / 3) % pairs.len()].0;
            probe.set(probe.get() + 1);
            Some(p)
        };
        let ours = || Ok(lat(pairs[k.get()].1));
        let theirs = || {
            let t = pairs[k.get()].2;
            k.set(k.get() + 1);
            Some(lat(t))
        };
        let (o, t, p, placed) = alternated_steady(5, ours, Some(theirs), next).unwrap();
        assert_eq!((placed.run, placed.steady, placed.level), (5, 5, Some(3)));
        // Of all five, 5.0 against 4.0; of the far three, 6.0 against 3.0.
        assert_eq!((o.median, t.unwrap().median), (6.0, 3.0));
        assert_eq!(p.ratios(), vec![2.5, 2.0, 1.75]);
        assert_eq!(placed.line_us, Some((0.17, 0.17)));
        let line = placed.line("udp 64 B");
        assert!(
            line.contains(
                "5 of 5 pairs with both runs in one placement, 3 of them in the most common one ("
            ) && line.ends_with("the row is of those 3"),
            "{line}"
        );
    }

    #[test]
    fn steady_pairs_are_sought_up_to_three_times_as_many_runs() {
        // One steady pair in three: the fifth comes with the 13th pair.
        let probes = [0.05, 0.05, 0.05, 0.05, 0.40, 0.40, 0.40, 0.05, 0.40];
        let (o, t, p) = run(5, &probes);
        assert_eq!((p.run, p.steady, p.of_steady), (13, 5, true));
        assert_eq!(o.median, 1.0);
        assert_eq!(t.unwrap().median, 2.0);
    }

    #[test]
    fn too_few_steady_pairs_leave_the_row_of_all_and_say_so() {
        // None steady: four asked for, twelve run, the row of all.
        let (o, t, p) = run(4, &[0.05, 0.40, 0.05]);
        assert_eq!((p.run, p.steady, p.of_steady), (12, 0, false));
        assert_eq!(o.median, 0.5, "all pairs' median: the unsteady ones");
        assert_eq!(t.unwrap().median, 9.0);
        assert!(p.line("x").contains("too few"), "{}", p.line("x"));
    }
}
