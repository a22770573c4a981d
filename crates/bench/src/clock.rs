//! Process CPU time and the wall clock the benchmarks read.

pub use macrolink_fabric::clock_ns;

/// CPU time (user + system) this process has used, in nanoseconds.
pub fn cpu_ns() -> u64 {
    // SAFETY: rusage is plain data; zeroed is a valid value to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
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
