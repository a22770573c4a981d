//! What waking a sleeping thread costs that thread on this machine: the
//! floor under the CPU of a reader that sleeps between messages and is
//! woken once for each.
//!
//! ```text
//!  waker (this thread)                   sleeper (a thread)
//!   spin `interval` ─► posted = i ─► unpark ─►  wakes, sees i
//!   spin until seen = i  ◄──────────────────── seen = i, parks again
//! ```
//!
//! The sleeper does nothing but wake and sleep again (`park`, a futex on
//! Linux); its CPU time over the run, over the wake-ups, is what one
//! wake-up costs a thread here, with no system call of a transport in it.
//! On a virtual machine it is several microseconds (the switch into the
//! woken thread and back out), and a reader woken once a message cannot
//! use less of a core than that times its messages a second.
//!
//! Two more figures come with it: how long the waker's call takes (on a
//! virtual machine whose idle processors halt, the interrupt that wakes
//! the sleeper's processor traps to the host and the waker waits for it),
//! and how late the sleeper runs after that call began. A sender that
//! rings a sleeping reader once a message pays the first each message and
//! the reader is back the second after it: both bound the bandwidth of a
//! stream whose reader sleeps between messages.

use anyhow::{bail, Context};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One measurement.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct WakeCost {
    /// Wake-ups made.
    pub wakes: u64,
    /// The sleeper's CPU time a wake-up, microseconds.
    pub cpu_us: f64,
    /// The waker's call, median, microseconds.
    pub waker_us: f64,
    /// From the waker's call to the sleeper running, median, microseconds.
    pub late_us: f64,
}

impl WakeCost {
    /// The share of a core, in percent, that `per_s` wake-ups a second
    /// take.
    pub fn pct_at(&self, per_s: f64) -> f64 {
        self.cpu_us * per_s / 1e4
    }
}

/// Longest the sleeper may take to see one wake-up.
const PATIENCE: Duration = Duration::from_secs(2);

/// Wakes a sleeping thread `count` times, `interval` apart (the waker
/// spins in between, as a sender copying a message does), and returns the
/// sleeper's CPU time a wake-up, the waker's call and the sleeper's delay.
pub fn measure(count: u64, interval: Duration) -> anyhow::Result<WakeCost> {
    let posted = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(AtomicU64::new(0));
    // When the waker's last call began, nanoseconds after `base`.
    let rung = Arc::new(AtomicU64::new(0));
    let base = Instant::now();
    let slots = usize::try_from(count).context("too many wake-ups")?;
    let sleeper = {
        let (posted, seen, rung) = (posted.clone(), seen.clone(), rung.clone());
        std::thread::Builder::new()
            .name("wake-sleeper".into())
            .spawn(move || -> anyhow::Result<(u64, Vec<u64>)> {
                let mut late = Vec::with_capacity(slots);
                let start = thread_cpu_ns()?;
                for i in 1..=count {
                    let until = Instant::now() + PATIENCE;
                    while posted.load(Ordering::Acquire) < i {
                        if Instant::now() > until {
                            bail!("wake-up {i} of {count} not seen in {PATIENCE:?}");
                        }
                        std::thread::park_timeout(PATIENCE);
                    }
                    late.push(nanos(base.elapsed()).saturating_sub(rung.load(Ordering::Relaxed)));
                    seen.store(i, Ordering::Release);
                }
                Ok((thread_cpu_ns()? - start, late))
            })?
    };
    let mut calls = Vec::with_capacity(slots);
    let mut failed = None;
    for i in 1..=count {
        let t = Instant::now();
        while t.elapsed() < interval {
            std::hint::spin_loop();
        }
        let call = Instant::now();
        rung.store(nanos(call - base), Ordering::Relaxed);
        posted.store(i, Ordering::Release);
        sleeper.thread().unpark();
        calls.push(nanos(call.elapsed()));
        let until = Instant::now() + PATIENCE;
        while seen.load(Ordering::Acquire) < i {
            if Instant::now() > until {
                failed = Some(i);
                break;
            }
            std::hint::spin_loop();
        }
        if failed.is_some() {
            break;
        }
    }
    let (cpu_ns, late) = sleeper
        .join()
        .map_err(|_| anyhow::anyhow!("the sleeping thread panicked"))??;
    if let Some(i) = failed {
        bail!("wake-up {i} of {count} not seen in {PATIENCE:?}");
    }
    Ok(WakeCost {
        wakes: count,
        cpu_us: cpu_ns as f64 / count.max(1) as f64 / 1e3,
        waker_us: median_us(calls),
        late_us: median_us(late),
    })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The median of `ns`, in microseconds (0 for none).
fn median_us(mut ns: Vec<u64>) -> f64 {
    ns.sort_unstable();
    ns.get(ns.len() / 2).map_or(0.0, |&v| v as f64 / 1e3)
}

/// This thread's time on a CPU so far, nanoseconds (the scheduler's own
/// count, the first field of its `schedstat`).
fn thread_cpu_ns() -> anyhow::Result<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat")
        .context("reading /proc/thread-self/schedstat")?;
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .context("no CPU time in /proc/thread-self/schedstat")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_value_in_microseconds() {
        assert_eq!(median_us(vec![3_000, 1_000, 2_000]), 2.0);
        assert_eq!(median_us(vec![]), 0.0);
    }

    #[test]
    fn every_wake_up_is_seen_and_costs_the_sleeper_some_cpu() {
        let c = measure(200, Duration::from_micros(50)).unwrap();
        assert_eq!(c.wakes, 200);
        assert!(c.cpu_us > 0.0 && c.cpu_us.is_finite(), "{c:?}");
        // The call is a system call, and the sleeper runs after it began.
        assert!(c.waker_us > 0.0 && c.waker_us.is_finite(), "{c:?}");
        assert!(c.late_us > 0.0 && c.late_us.is_finite(), "{c:?}");
        // 10,000 wake-ups a second at 5 us each: 5 % of a core.
        let half = WakeCost {
            wakes: 1,
            cpu_us: 5.0,
            waker_us: 0.0,
            late_us: 0.0,
        };
        assert!((half.pct_at(10_000.0) - 5.0).abs() < 1e-9);
    }
}
