//! One processor for a stretch of runs: the calling thread, and every
//! thread and process it starts meanwhile, run on it alone.

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// The calling thread kept to one processor until dropped; what it starts
/// meanwhile inherits the mask (and keeps it).
#[derive(Debug)]
pub struct OneProcessor {
    before: CpuSet,
    cpu: usize,
}

impl OneProcessor {
    /// Keeps the calling thread to the lowest processor it may run on.
    pub fn pin() -> std::io::Result<OneProcessor> {
        let before = sched_getaffinity(None)?;
        let cpu = (0..CpuSet::MAX_CPU)
            .find(|&c| before.is_set(c))
            .ok_or_else(|| std::io::Error::other("no processor in this thread's mask"))?;
        let mut one = CpuSet::new();
        one.set(cpu);
        sched_setaffinity(None, &one)?;
        Ok(OneProcessor { before, cpu })
    }

    /// The processor kept to.
    pub fn cpu(&self) -> usize {
        self.cpu
    }
}

impl Drop for OneProcessor {
    fn drop(&mut self) {
        // What was allowed before is allowed again; a failure leaves the
        // thread on one processor, which slows the runs after it and
        // loses nothing.
        let _ = sched_setaffinity(None, &self.before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_and_what_it_starts_run_on_one_processor_until_the_pin_is_dropped() {
        std::thread::spawn(|| {
            let before = sched_getaffinity(None).unwrap().count();
            let pin = OneProcessor::pin().unwrap();
            assert_eq!(sched_getaffinity(None).unwrap().count(), 1);
            assert!(sched_getaffinity(None).unwrap().is_set(pin.cpu()));
            let child = std::thread::spawn(|| sched_getaffinity(None).unwrap().count())
                .join()
                .unwrap();
            assert_eq!(child, 1, "a thread started meanwhile inherits the mask");
            let out = std::process::Command::new("grep")
                .args(["Cpus_allowed_list", "/proc/self/status"])
                .output()
                .unwrap();
            let list = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                list.split_whitespace().last(),
                Some(pin.cpu().to_string().as_str()),
                "a process started meanwhile inherits the mask: {list}"
            );
            drop(pin);
            assert_eq!(sched_getaffinity(None).unwrap().count(), before);
        })
        .join()
        .unwrap();
    }
}
