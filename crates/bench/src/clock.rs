//! Process CPU time and the wall clock the benchmarks read.

pub use macrolink_fabric::clock_ns;

/// The clock of a latency run's iterations: the processor's time-stamp
/// counter where it ticks at a constant rate (as `ucx_perftest`'s loop
/// reads it), else the monotonic clock. A read costs 9 ns on the machines
/// here against 21 for `clock_gettime`, and a ping-pong reads once a
/// round trip: the loop times the fabric, not its clock.
#[derive(Debug, Clone)]
pub struct Ticks(quanta::Clock);

impl Ticks {
    /// Calibrates the counter against the monotonic clock.
    pub fn new() -> Ticks {
        Ticks(quanta::Clock::new())
    }

    /// A reading, in the counter's units.
    #[inline]
    pub fn raw(&self) -> u64 {
        self.0.raw()
    }

    /// Nanoseconds between two readings.
    #[inline]
    pub fn ns(&self, from: u64, to: u64) -> u64 {
        self.0.delta_as_nanos(from, to)
    }
}

impl Default for Ticks {
    fn default() -> Ticks {
        Ticks::new()
    }
}

/// CPU time (user + system) this process has used, in nanoseconds.
pub fn cpu_ns() -> u64 {
    usage_ns(libc::RUSAGE_SELF)
}

/// CPU time (user + system) of this process's children that have ended
/// and been waited for, in nanoseconds: across the run of a child and
/// nothing else, that child's.
pub fn children_cpu_ns() -> u64 {
    usage_ns(libc::RUSAGE_CHILDREN)
}

fn usage_ns(who: libc::c_int) -> u64 {
    // SAFETY: rusage is plain data; zeroed is a valid value to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(who, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU and wall time at one instant.
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    cpu: u64,
    wall: u64,
}

impl Mark {
    /// Now.
    pub fn now() -> Mark {
        Mark {
            cpu: cpu_ns(),
            wall: clock_ns(),
        }
    }

    /// CPU and wall nanoseconds since this mark.
    pub fn since(self) -> (u64, u64) {
        let now = Mark::now();
        (now.cpu - self.cpu, now.wall - self.wall)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_child_that_ended_is_counted_with_the_children() {
        // This thread's own time: the process's holds the tests running
        // beside this one.
        let thread = || super::usage_ns(libc::RUSAGE_THREAD);
        let (before, own) = (super::children_cpu_ns(), thread());
        let spin = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done";
        let st = std::process::Command::new("sh")
            .args(["-c", spin])
            .status()
            .expect("sh runs");
        assert!(st.success());
        let used = super::children_cpu_ns() - before;
        assert!(used > 10_000_000, "{used} ns");
        // Not counted as this process's own, which waited meanwhile.
        let own = thread() - own;
        assert!(own * 4 < used, "own {own} ns, the child's {used} ns");
    }

    #[test]
    fn ticks_measure_what_the_monotonic_clock_does() {
        let ticks = super::Ticks::new();
        let (t0, c0) = (ticks.raw(), super::clock_ns());
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (t1, c1) = (ticks.raw(), super::clock_ns());
        let (by_ticks, by_clock) = (ticks.ns(t0, t1) as f64, (c1 - c0) as f64);
        assert!(
            (by_ticks / by_clock - 1.0).abs() < 0.05,
            "{by_ticks} ns by the counter, {by_clock} by the clock"
        );
    }
}
