//! One more thread in a peer's process, that only sleeps: a library
//! preloaded into it (`resident.c`, built with this crate) starts it.
//!
//! A node of ours keeps a thread for each of its listeners (its acceptors
//! of tcp and shared-memory connections), asleep in `accept`; sockperf's
//! processes have one thread. In a process of more than one thread, each
//! system call on a descriptor takes a reference to its file and drops it
//! after (the kernel's `fdget`, `fput`), which a process of one thread
//! skips; and glibc's socket calls, cancellation points, switch
//! cancellation on and off around the call. With this library, sockperf
//! pays both: [`crate::compare`]'s row of it measures what they cost
//! sockperf, more than the first costs ours (which make raw system calls).

use std::process::Command;

use super::preload::Library;

/// The library, as built for this crate (`build.rs`).
const LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libmacrolink_resident.so"));

/// The library written out for the runs of one figure.
#[derive(Debug)]
pub struct Resident {
    lib: Library,
}

impl Resident {
    /// Writes the library out into a directory of its own.
    pub fn new() -> anyhow::Result<Resident> {
        Ok(Resident {
            lib: Library::write("libmacrolink_resident.so", LIBRARY)?,
        })
    }

    /// `cmd` with the library preloaded: one thread more in its process.
    pub fn preload<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        self.lib.preload(cmd)
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// The threads of `sleep` started with the library preloaded or not.
    fn threads(preload: bool) -> usize {
        let r = super::Resident::new().unwrap();
        let mut cmd = Command::new("sleep");
        cmd.arg("5").stdout(Stdio::null());
        if preload {
            r.preload(&mut cmd);
        }
        let mut child = cmd.spawn().expect("sleep runs");
        let tasks = format!("/proc/{}/task", child.id());
        // The library's constructor runs before `main`, once the program
        // is loaded: a second at most for the second thread to show.
        let t0 = Instant::now();
        let mut n = 0;
        while t0.elapsed() < Duration::from_secs(1) {
            n = std::fs::read_dir(&tasks).map(|d| d.count()).unwrap_or(0);
            if n >= 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        n
    }

    #[test]
    fn a_preloaded_process_has_one_thread_more() {
        assert_eq!(threads(false), 1);
        assert_eq!(threads(true), 2);
    }
}
