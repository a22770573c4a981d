//! Whether the machine itself stopped while a run went on.
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
//! each processor a thread kept to it sleeps [`PERIOD`] at a time and
//! keeps the latest any sleep woke past its time (a processor the host
//! held shows there as long as it held it), and the processor time the
//! host gave to others meanwhile (steal, where the hypervisor reports it
//! to the kernel). Each thread wakes a hundred times a second: together
//! they take no measurable share of a processor.

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the probe sleeps at a time.
pub const PERIOD: Duration = Duration::from_millis(10);

/// What a probe saw of the machine during a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Stalled {
    /// The latest any sleep of [`PERIOD`] woke past its time, ms.
    pub late_ms: f64,
    /// Processor time the host gave to others meanwhile, summed over this
    /// machine's processors, ms; `None` where the kernel does not count it.
    pub steal_ms: Option<f64>,
}

impl Stalled {
    /// Of two runs together: the later wake-up, the steal of both.
    pub fn and(self, other: Stalled) -> Stalled {
        Stalled {
            late_ms: self.late_ms.max(other.late_ms),
            steal_ms: match (self.steal_ms, other.steal_ms) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            },
        }
    }

    /// `late / steal ms`, rounded to the millisecond (steal `n.a.` where
    /// not counted).
    pub fn terse(&self) -> String {
        let steal = self
            .steal_ms
            .map_or("n.a.".to_string(), |s| format!("{s:.0}"));
        format!("{:.0} / {steal} ms", self.late_ms)
    }
}

/// A probe running beside a run, a thread kept to each processor this
/// thread may run on; [`Probe::finish`] stops it.
///
/// One thread that may run anywhere is woken on whichever processor is
/// free, and misses the host holding the other: in one run of eight
/// striped transfers at four gateways the host took 840 ms of processor
/// time and took two live gateways out of use, while such a thread woke
/// at most 272 ms late.
#[derive(Debug)]
pub struct Probe {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Duration>>,
    steal: Option<u64>,
}

impl Probe {
    /// Starts a probe thread on each processor of the calling thread's
    /// mask.
    pub fn start() -> std::io::Result<Probe> {
        let stop = Arc::new(AtomicBool::new(false));
        let steal = steal_ms();
        let mask = sched_getaffinity(None)?;
        let mut probe = Probe {
            stop,
            threads: Vec::new(),
            steal,
        };
        for cpu in (0..CpuSet::MAX_CPU).filter(|&c| mask.is_set(c)) {
            let flag = probe.stop.clone();
            let t = std::thread::Builder::new()
                .name(format!("stall probe {cpu}"))
                .spawn(move || {
                    let mut one = CpuSet::new();
                    one.set(cpu);
                    // Unpinned (a processor gone offline meanwhile), the
                    // thread still says when the machine as a whole stopped.
                    let _ = sched_setaffinity(None, &one);
                    watch(
                        || {
                            let t = Instant::now();
                            std::thread::park_timeout(PERIOD);
                            t.elapsed()
                        },
                        // SYNC POINT: pairs with the store in `halt`; the
                        // flag guards no other data.
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
        let late = self.halt();
        Stalled {
            late_ms: late.as_secs_f64() * 1e3,
            steal_ms: self
                .steal
                .zip(steal_ms())
                .map(|(a, b)| b.saturating_sub(a) as f64),
        }
    }

    /// Stops the threads; the latest wake-up of any.
    fn halt(&mut self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        for t in &self.threads {
            t.thread().unpark();
        }
        self.threads
            .drain(..)
            .map(|t| t.join().unwrap_or_default())
            .max()
            .unwrap_or_default()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Sleeps with `sleep` (which returns how long it slept, meant to be
/// [`PERIOD`]) until `stop` says so; the most any sleep overran.
fn watch(mut sleep: impl FnMut() -> Duration, stop: impl Fn() -> bool) -> Duration {
    let mut late = Duration::ZERO;
    while !stop() {
        late = late.max(sleep().saturating_sub(PERIOD));
    }
    late
}

/// The processor time the host gave to others since boot, summed over
/// this machine's processors (`/proc/stat`), ms.
fn steal_ms() -> Option<u64> {
    use procfs::CurrentSI;
    procfs::KernelStats::current().ok()?.total.steal_ms()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn the_latest_wake_up_of_any_sleep_is_kept() {
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
        assert_eq!(late, Duration::from_millis(300));
        assert_eq!(n.get(), 4);
        // Stopped before its first sleep, it saw nothing.
        assert_eq!(watch(|| unreachable!(), || true), Duration::ZERO);
    }

    #[test]
    fn two_runs_keep_the_later_wake_up_and_the_steal_of_both() {
        let a = Stalled {
            late_ms: 12.0,
            steal_ms: Some(5.0),
        };
        let b = Stalled {
            late_ms: 368.0,
            steal_ms: Some(120.0),
        };
        assert_eq!(
            a.and(b),
            Stalled {
                late_ms: 368.0,
                steal_ms: Some(125.0)
            }
        );
        let uncounted = Stalled {
            late_ms: 1.0,
            steal_ms: None,
        };
        assert_eq!(a.and(uncounted).steal_ms, Some(5.0));
        assert_eq!(a.and(b).terse(), "368 / 125 ms");
        assert_eq!(uncounted.terse(), "1 / n.a. ms");
    }

    #[test]
    fn a_probe_watches_each_processor_and_reads_the_kernels_steal() {
        let p = Probe::start().unwrap();
        // One thread on each processor this thread may run on.
        let mask = sched_getaffinity(None).unwrap();
        assert_eq!(p.processors(), mask.count() as usize);
        std::thread::sleep(3 * PERIOD);
        let s = p.finish();
        assert!(s.late_ms >= 0.0 && s.late_ms.is_finite(), "{s:?}");
        // Linux has counted steal in /proc/stat since 2.6.11.
        assert!(s.steal_ms.is_some_and(|ms| ms >= 0.0), "{s:?}");
    }
}
