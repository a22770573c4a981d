//! Whether a processor of the machine was held from it while a run went
//! on.
//!
//! ```text
//!  the run     ──────────────────────────────────────────────►
//!  processor 0 sleep 10 ms │ wake: how late? │ sleep 10 ms │ …
//!  processor 1 sleep 10 ms │ wake: how late? │ sleep 10 ms │ …
//!  /proc/stat  steal before ─────────────────────── steal after
//! ```
//!
//! A virtual machine's processors stop now and then while its host runs
//! something else, for hundreds of milliseconds on the machines here. A
//! transfer that stalls meanwhile looks like a slow gateway or a lost
//! link, and may be taken for one. A [`Probe`] runs beside the run: on
//! each processor a thread kept to it, at the lowest real-time priority
//! where it may have one, sleeps [`PERIOD`] at a time and keeps the most
//! any sleep overran and the most its overruns add up to in any second;
//! and the processor time the host gave to others
//! meanwhile (steal, where the hypervisor reports it to the kernel). A
//! real-time thread preempts the machine's own work at once, so an
//! overrun of more than a few milliseconds is a processor the host held
//! (or the kernel kept from preemption); without real-time priority, it
//! may also be the machine's own load. Each thread wakes a hundred times
//! a second for a few microseconds; where that would touch what is
//! measured, [`steal_ms`] read before and after says what the host took.

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the probe sleeps at a time.
pub const PERIOD: Duration = Duration::from_millis(10);

/// The span over which a processor's overruns are summed.
pub const WINDOW: Duration = Duration::from_secs(1);

/// What a probe saw of the machine during a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Stalled {
    /// The most any sleep of [`PERIOD`] overran, on any processor, ms.
    pub late_ms: f64,
    /// The most of any one second ([`WINDOW`]) that one processor was
    /// held: its sleeps' overruns that ended within that second, summed,
    /// ms. A host that gives a processor back for a moment now and then
    /// holds it for long in short pieces, which one overrun misses.
    pub held_ms: f64,
    /// Processor time the host gave to others meanwhile, summed over this
    /// machine's processors, ms (the kernel counts it in ticks, 10 ms on
    /// the machines here); `None` where it is not counted or could not
    /// be read.
    pub steal_ms: Option<f64>,
}

impl Stalled {
    /// Of two runs together: the later overrun, the steal of both (`None`
    /// unless both were counted).
    pub fn and(self, other: Stalled) -> Stalled {
        Stalled {
            late_ms: self.late_ms.max(other.late_ms),
            held_ms: self.held_ms.max(other.held_ms),
            steal_ms: self.steal_ms.zip(other.steal_ms).map(|(a, b)| a + b),
        }
    }

    /// Of `runs` together; nothing for none.
    pub fn over(runs: impl IntoIterator<Item = Stalled>) -> Stalled {
        runs.into_iter().reduce(Stalled::and).unwrap_or_default()
    }

    /// `late / held / steal ms` (steal `n.a.` where not counted).
    pub fn terse(&self) -> String {
        let steal = self
            .steal_ms
            .map_or("n.a.".to_string(), |s| format!("{s:.0}"));
        format!("{:.0} / {:.0} / {steal} ms", self.late_ms, self.held_ms)
    }
}

/// A probe running beside a run, a thread kept to each processor this
/// thread may run on; [`Probe::finish`] stops it.
///
/// One thread that may run anywhere is woken on whichever processor is
/// free, and misses the host holding the other: in one run of eight
/// striped transfers through four gateways, the host took 840 ms of
/// processor time and the transfers took live gateways out of use, while
/// such a thread overran at most 272 ms.
#[derive(Debug)]
pub struct Probe {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Overruns>>,
    steal: Option<u64>,
}

impl Probe {
    /// Starts a probe thread on each processor of the calling thread's
    /// mask.
    pub fn start() -> std::io::Result<Probe> {
        let mask = sched_getaffinity(None)?;
        let mut probe = Probe {
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            steal: steal_ms(),
        };
        for cpu in (0..CpuSet::MAX_CPU).filter(|&c| mask.is_set(c)) {
            let flag = probe.stop.clone();
            let t = std::thread::Builder::new()
                .name(format!("stall probe {cpu}"))
                .spawn(move || {
                    let mut one = CpuSet::new();
                    one.set(cpu);
                    // Unpinned (a processor gone offline meanwhile), the
                    // thread still sees the machine as a whole held.
                    let _ = sched_setaffinity(None, &one);
                    // Without the privilege, an ordinary thread: its
                    // overruns then also count the machine's own load.
                    let _ = lowest_real_time();
                    watch(
                        || {
                            let t = Instant::now();
                            std::thread::park_timeout(PERIOD);
                            t.elapsed()
                        },
                        // The flag guards no other data; `halt`'s unpark
                        // after the store makes the next look see it.
                        || flag.load(Ordering::Relaxed),
                    )
                })?;
            probe.threads.push(t);
        }
        Ok(probe)
    }

    /// Processors watched.
    pub fn processors(&self) -> usize {
        self.threads.len()
    }

    /// Stops the probe and says what it saw.
    pub fn finish(mut self) -> Stalled {
        let seen = self.halt();
        Stalled {
            late_ms: seen.late.as_secs_f64() * 1e3,
            held_ms: seen.worst.as_secs_f64() * 1e3,
            steal_ms: self
                .steal
                .zip(steal_ms())
                .map(|(a, b)| b.saturating_sub(a) as f64),
        }
    }

    /// Stops the threads; the most any overran, and the most any
    /// processor was held in a second.
    fn halt(&mut self) -> Overruns {
        self.stop.store(true, Ordering::Relaxed);
        for t in &self.threads {
            t.thread().unpark();
        }
        self.threads
            .drain(..)
            .map(|t| t.join().unwrap_or_default())
            .fold(Overruns::default(), |a, b| Overruns {
                late: a.late.max(b.late),
                worst: a.worst.max(b.worst),
                ..Overruns::default()
            })
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Puts the calling thread at the lowest real-time priority (`SCHED_FIFO`
/// 1): above every ordinary thread, below every real-time one.
fn lowest_real_time() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler(2) on the calling thread (pid 0) with a
    // valid, initialised parameter that it only reads.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What one processor's probe saw: its sleeps' overruns.
#[derive(Debug, Default)]
struct Overruns {
    /// The most any overran.
    late: Duration,
    /// The most that overran within one [`WINDOW`] (at most a window).
    worst: Duration,
    /// Time since the first sleep began, as the sleeps tell it.
    now: Duration,
    /// The overruns that ended within the last window: when each ended,
    /// and by how much; at most a window's sleeps.
    recent: VecDeque<(Duration, Duration)>,
    /// Their sum.
    sum: Duration,
}

impl Overruns {
    /// A sleep of [`PERIOD`] took `slept`.
    fn note(&mut self, slept: Duration) {
        self.now += slept;
        let over = slept.saturating_sub(PERIOD);
        self.late = self.late.max(over);
        if !over.is_zero() {
            self.recent.push_back((self.now, over));
            self.sum += over;
        }
        while let Some(&(at, o)) = self.recent.front() {
            if at + WINDOW > self.now {
                break;
            }
            self.recent.pop_front();
            self.sum -= o;
        }
        self.worst = self.worst.max(self.sum.min(WINDOW));
    }
}

/// Sleeps with `sleep` (which returns how long it slept, meant to be
/// [`PERIOD`]) until `stop` says so; what the sleeps' overruns were.
fn watch(mut sleep: impl FnMut() -> Duration, stop: impl Fn() -> bool) -> Overruns {
    let mut seen = Overruns::default();
    while !stop() {
        seen.note(sleep());
    }
    seen
}

/// The processor time the host gave to others since boot, summed over
/// this machine's processors (`/proc/stat`), ms; `None` where it is not
/// counted. Read before and after a run whose latency or processor time
/// a probe's threads would touch, it says what the host took meanwhile.
pub fn steal_ms() -> Option<u64> {
    use procfs::CurrentSI;
    procfs::KernelStats::current().ok()?.total.steal_ms()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn the_most_any_sleep_overran_is_kept() {
        // Sleeps that overran by 1, 300 and 2 ms, then one that woke
        // early (a spurious wake-up is not a stall).
        let slept = [11, 310, 12, 4].map(Duration::from_millis);
        let n = Cell::new(0);
        let late = watch(
            || {
                let s = slept[n.get()];
                n.set(n.get() + 1);
                s
            },
            || n.get() == slept.len(),
        );
        assert_eq!(late.late, Duration::from_millis(300));
        assert_eq!(late.worst, Duration::from_millis(303));
        assert_eq!(n.get(), 4);
        // Stopped before its first sleep, it saw nothing.
        let none = watch(|| unreachable!(), || true);
        assert_eq!((none.late, none.worst), (Duration::ZERO, Duration::ZERO));
    }

    /// Feeds `slept` (ms) to a processor's record.
    fn overruns(slept: impl IntoIterator<Item = u64>) -> Overruns {
        let mut o = Overruns::default();
        for ms in slept {
            o.note(Duration::from_millis(ms));
        }
        o
    }

    #[test]
    fn a_processor_held_in_short_pieces_shows_as_the_most_of_a_second_held() {
        // Twenty sleeps that each overran by 50 ms, then a quiet 1.5 s:
        // never more than 50 ms at once, but 17 of them (850 ms) within
        // one second.
        let o = overruns(std::iter::repeat_n(60, 20).chain(std::iter::repeat_n(10, 150)));
        assert_eq!(o.late, Duration::from_millis(50));
        assert_eq!(o.worst, Duration::from_millis(850));
        // The window forgets what ended a second ago.
        assert!(o.recent.is_empty() && o.sum.is_zero(), "{o:?}");
        // Two holds of 300 ms two seconds apart are 300 ms in a second,
        // not 600.
        let apart = overruns(
            std::iter::once(310)
                .chain(std::iter::repeat_n(10, 200))
                .chain(std::iter::once(310)),
        );
        assert_eq!(apart.worst, Duration::from_millis(300));
        // One hold of 1.5 s is all of a second.
        assert_eq!(overruns([1510]).worst, WINDOW);
    }

    #[test]
    fn runs_together_keep_the_latest_overrun_and_the_steal_of_all_or_none() {
        let a = Stalled {
            late_ms: 12.0,
            held_ms: 400.0,
            steal_ms: Some(5.0),
        };
        let b = Stalled {
            late_ms: 368.0,
            held_ms: 368.0,
            steal_ms: Some(120.0),
        };
        let uncounted = Stalled {
            late_ms: 1.0,
            held_ms: 1.0,
            steal_ms: None,
        };
        let both = Stalled {
            late_ms: 368.0,
            held_ms: 400.0,
            steal_ms: Some(125.0),
        };
        assert_eq!(a.and(b), both);
        assert_eq!(Stalled::over([a, b]), both);
        // A run whose steal was not read leaves the sum unknown, not short.
        assert_eq!(Stalled::over([a, uncounted, b]).steal_ms, None);
        assert_eq!(Stalled::over([a, uncounted, b]).late_ms, 368.0);
        assert_eq!(Stalled::over([]), Stalled::default());
        assert_eq!(both.terse(), "368 / 400 / 125 ms");
        assert_eq!(uncounted.terse(), "1 / 1 / n.a. ms");
    }

    /// Holds one processor from the probe for `HOLD` with a real-time
    /// thread of a higher priority kept to it: the probe's thread there
    /// overruns by about as much, where one free to move would have run
    /// on the other processor. Needs root (real-time priority).
    #[test]
    fn a_processor_held_from_the_probe_shows_as_an_overrun() {
        const HOLD: Duration = Duration::from_millis(200);
        let mask = sched_getaffinity(None).unwrap();
        let cpu = (0..CpuSet::MAX_CPU).find(|&c| mask.is_set(c)).unwrap();
        let p = Probe::start().unwrap();
        assert_eq!(p.processors(), mask.count() as usize);
        // Let the probe's threads reach their processors.
        std::thread::sleep(5 * PERIOD);
        std::thread::spawn(move || {
            let mut one = CpuSet::new();
            one.set(cpu);
            sched_setaffinity(None, &one).unwrap();
            let param = libc::sched_param { sched_priority: 2 };
            // SAFETY: sched_setscheduler(2) on this thread with a valid
            // parameter that it only reads.
            let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
            assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
            let t = Instant::now();
            // Bounded: HOLD, then back to an ordinary thread's share.
            while t.elapsed() < HOLD {
                std::hint::spin_loop();
            }
        })
        .join()
        .unwrap();
        let s = p.finish();
        let half = HOLD.as_secs_f64() * 1e3 / 2.0;
        assert!(
            s.late_ms >= half && s.held_ms >= half,
            "a {HOLD:?} hold shows as {s:?}"
        );
        // Linux has counted steal in /proc/stat since 2.6.11.
        assert!(s.steal_ms.is_some(), "{s:?}");
    }
}
