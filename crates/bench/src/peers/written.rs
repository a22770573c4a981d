//! Buffers that hold data: a library preloaded into `ucx_perftest`
//! (`written.c`, built with this crate) writes each buffer the tool maps
//! (`ucp_mem_map`) once before its run.
//!
//! `ucx_perftest` never writes the buffer it sends from. Its pages are
//! then the kernel's zero page (the huge zero page on transparent huge
//! pages), and every copy out of them, a cross-memory read or a socket's
//! copy, reads the same 4 KiB over and over from the first level of the
//! cache. Measured on a 2-core Xeon VM, a 1 MB `process_vm_readv` ran at
//! 14.7-21.4 GB/s out of never-written pages and 8.3-10.3 out of written
//! ones, and `tag_bw -O 1 -E sleep` over posix,cma at 1 MB gave 10.9-14.9
//! GB/s as the tool comes and 8.2-9.3 with its buffers written. Ours send
//! from buffers that hold data, so the peer's do too.

use std::path::PathBuf;
use std::process::Command;

use super::preload::Library;

/// The library, as built for this crate (`build.rs`).
const LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libmacrolink_written.so"));

/// The variable naming the file into which the library notes the size of
/// each buffer it wrote, one decimal line each.
const LOG_VAR: &str = "MACROLINK_WRITTEN_LOG";

/// The library written out for the runs of one figure, and the file it
/// notes its work in; both removed when dropped.
#[derive(Debug)]
pub struct Written {
    lib: Library,
}

impl Written {
    /// Writes the library out into a directory of its own.
    pub fn new() -> anyhow::Result<Written> {
        Ok(Written {
            lib: Library::write("libmacrolink_written.so", LIBRARY)?,
        })
    }

    fn log(&self) -> PathBuf {
        self.lib.dir().join("written")
    }

    /// `cmd` with the library preloaded.
    pub fn preload<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        self.lib.preload(cmd).env(LOG_VAR, self.log())
    }

    /// The sizes of the buffers written so far, by every process started
    /// with [`preload`](Self::preload).
    pub fn buffers(&self) -> Vec<u64> {
        std::fs::read_to_string(self.log())
            .map(|s| sizes(&s))
            .unwrap_or_default()
    }

    /// Fails unless a buffer of at least `size` bytes was written: the
    /// library did not reach the tool's buffers, whose figures would then
    /// be those of the zero page.
    pub fn check(&self, size: usize) -> anyhow::Result<()> {
        let b = self.buffers();
        if b.iter().any(|&n| n >= size as u64) {
            return Ok(());
        }
        anyhow::bail!(
            "ucx_perftest's buffers of {size} B were not written before its run (the library \
             preloaded into it wrote {b:?}): its figures would be those of the kernel's zero \
             page, not of memory holding data"
        )
    }
}

/// The sizes in the library's notes; lines that are not a size are left out.
fn sizes(log: &str) -> Vec<u64> {
    log.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    #[test]
    fn the_notes_are_read_a_size_a_line() {
        assert_eq!(
            super::sizes("1000000\n8\nx\n\n2097152\n"),
            [1_000_000, 8, 2_097_152]
        );
    }

    /// UCX's tools are installed wherever the tests run (`.ci/run`). A
    /// loopback run (`-l`: the tool talks to itself) maps a send and a
    /// receive buffer; with the library preloaded both are written, and
    /// without it nothing is noted.
    #[test]
    fn the_preloaded_library_writes_the_buffers_ucx_perftest_maps() {
        let size = 300_000usize;
        let run = |w: &super::Written, preload: bool| {
            let mut cmd = Command::new("ucx_perftest");
            cmd.args(["-l", "-t", "tag_bw", "-s", &size.to_string()])
                .args(["-n", "20", "-w", "2", "-f", "-v"])
                .env("UCX_TLS", "posix,cma,self");
            if preload {
                w.preload(&mut cmd);
            }
            let out = cmd.output().expect("ucx_perftest runs");
            assert!(out.status.success(), "{out:?}");
        };
        let bare = super::Written::new().unwrap();
        run(&bare, false);
        assert!(bare.buffers().is_empty());
        assert!(bare.check(size).is_err());
        let w = super::Written::new().unwrap();
        run(&w, true);
        let big = w.buffers().iter().filter(|&&n| n >= size as u64).count();
        assert!(big >= 2, "{:?}", w.buffers());
        w.check(size).unwrap();
    }
}
