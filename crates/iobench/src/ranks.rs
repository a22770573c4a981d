//! iobench under a launcher (`srun`, `mpirun`): every rank is a worker, and
//! the ranks meet at each phase through files in a directory they all see
//! (the shared file system under test, by default). Rank 0 gathers the
//! answers and reports.
//!
//! ```text
//!  rank r: arrive-S-r ──► wait for arrive-S-* of every rank ──► phase S
//!          result-S-r ──► rank 0 waits for result-S-* of every rank
//! ```

use anyhow::{bail, Context};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::phase::Times;

/// How long a rank waits for the others at one meeting point.
const PATIENCE: Duration = Duration::from_secs(600);

/// This process's rank and the number of ranks, from the launcher.
pub fn from_env() -> Option<(u64, u64)> {
    let pairs = [
        ("SLURM_PROCID", "SLURM_NTASKS"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
    ];
    pairs.iter().find_map(|(r, s)| {
        let rank = std::env::var(r).ok()?.parse().ok()?;
        let size = std::env::var(s).ok()?.parse().ok()?;
        (rank < size).then_some((rank, size))
    })
}

/// An id every rank of one launch shares, to keep launches apart.
fn launch_id() -> String {
    for v in [
        "SLURM_JOB_ID",
        "PMIX_NAMESPACE",
        "OMPI_MCA_ess_base_jobid",
        "PMI_JOBID",
    ] {
        if let Ok(id) = std::env::var(v) {
            let step = std::env::var("SLURM_STEP_ID").unwrap_or_default();
            let id: String = format!("{id}.{step}")
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '.' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            return id;
        }
    }
    "run".into()
}

/// The meeting points of one launch.
#[derive(Debug)]
pub struct Barrier {
    dir: PathBuf,
    rank: u64,
    size: u64,
}

impl Barrier {
    /// Meets in a directory under `base` named for this launch.
    pub fn new(base: PathBuf, rank: u64, size: u64) -> anyhow::Result<Barrier> {
        let dir = base.join(format!(".iobench-sync-{}", launch_id()));
        std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
        Ok(Barrier { dir, rank, size })
    }

    /// Number of ranks.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn name(&self, what: &str, step: usize, rank: u64) -> PathBuf {
        self.dir.join(format!("{what}-{step}-{rank}"))
    }

    fn wait_all(&self, what: &str, step: usize) -> anyhow::Result<()> {
        let until = Instant::now() + PATIENCE;
        for r in 0..self.size {
            while !self.name(what, step, r).exists() {
                if Instant::now() > until {
                    bail!("rank {r} never reached {what} {step}");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(())
    }

    /// Arrives at meeting point `step` and waits for every rank.
    pub fn arrive(&self, step: usize) -> anyhow::Result<()> {
        std::fs::write(self.name("arrive", step, self.rank), b"")?;
        self.wait_all("arrive", step)
    }

    /// Leaves this rank's answer to phase `step`; rank 0 gets every rank's.
    pub fn answer(&self, step: usize, t: &Times) -> anyhow::Result<Option<Vec<Times>>> {
        let tmp = self.dir.join(format!(".result-{step}-{}", self.rank));
        std::fs::write(&tmp, t.line())?;
        std::fs::rename(&tmp, self.name("result", step, self.rank))?;
        if self.rank != 0 {
            return Ok(None);
        }
        self.wait_all("result", step)?;
        (0..self.size)
            .map(|r| Times::parse(&std::fs::read_to_string(self.name("result", step, r))?))
            .collect::<anyhow::Result<Vec<_>>>()
            .map(Some)
    }

    /// Every rank is done: once all have said so, rank 0 removes the
    /// meeting directory.
    pub fn finish(self, step: usize) -> anyhow::Result<()> {
        self.arrive(step)?;
        std::fs::write(self.name("left", step, self.rank), b"")?;
        if self.rank == 0 {
            self.wait_all("left", step)?;
            std::fs::remove_dir_all(&self.dir)?;
        }
        Ok(())
    }
}
