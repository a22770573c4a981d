//! Who does the work: worker processes that this process starts and talks
//! to over pipes, or the ranks of a launch (srun, mpirun), this process
//! among them, meeting through files.

use anyhow::{bail, Context};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use crate::phase::Times;
use crate::ranks::Barrier;
use crate::worker::{self, Setup, Target};

/// A worker process.
#[derive(Debug)]
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    /// Starts `cmd` (a `macrolink iobench-worker`), gives it `setup` and
    /// waits for it to say it is ready.
    pub fn spawn(mut cmd: Command, setup: &Setup) -> anyhow::Result<Worker> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a worker")?;
        let stdin = child.stdin.take().context("worker stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("worker stdout")?);
        let mut w = Worker {
            child,
            stdin,
            stdout,
        };
        writeln!(w.stdin, "{}", serde_json::to_string(setup)?)?;
        w.stdin.flush()?;
        let mut line = String::new();
        w.stdout.read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("worker {} did not start: {line:?}", setup.rank);
        }
        Ok(w)
    }

    fn answer(&mut self) -> anyhow::Result<Times> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("a worker exited");
        }
        Times::parse(line.trim())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one phase on every worker at once.
fn phase(workers: &mut [Worker], line: &str) -> anyhow::Result<Vec<Times>> {
    for w in workers.iter_mut() {
        writeln!(w.stdin, "{line}")?;
        w.stdin.flush()?;
    }
    workers.iter_mut().map(Worker::answer).collect()
}

/// The workers of one run.
#[derive(Debug)]
pub enum Crew {
    /// Processes of this one.
    Processes(Vec<Worker>),
    /// The ranks of a launch.
    Ranks {
        /// What this rank works on.
        target: Box<Target>,
        /// Where the ranks meet.
        barrier: Barrier,
        /// This rank.
        rank: u64,
        /// fsync written files before closing them.
        fsync: bool,
    },
}

impl Crew {
    /// Workers in all.
    pub fn size(&self) -> u64 {
        match self {
            Crew::Processes(w) => w.len() as u64,
            Crew::Ranks { barrier, .. } => barrier.size(),
        }
    }

    /// Whether this process reports.
    pub fn reports(&self) -> bool {
        match self {
            Crew::Processes(_) => true,
            Crew::Ranks { rank, .. } => *rank == 0,
        }
    }

    /// Runs phase `step`; the answers of every worker, on the process that
    /// reports.
    pub fn phase(&mut self, step: usize, line: &str) -> anyhow::Result<Option<Vec<Times>>> {
        match self {
            Crew::Processes(w) => phase(w, line).map(Some),
            Crew::Ranks {
                target,
                barrier,
                rank,
                fsync,
            } => {
                barrier.arrive(step)?;
                let t = worker::phase(target, *rank, *fsync, line)?;
                barrier.answer(step, &t)
            }
        }
    }

    /// Ends the run; true on the process that reports.
    pub fn finish(self, steps: usize) -> anyhow::Result<bool> {
        match self {
            Crew::Processes(w) => {
                drop(w);
                Ok(true)
            }
            Crew::Ranks { barrier, rank, .. } => {
                barrier.finish(steps)?;
                Ok(rank == 0)
            }
        }
    }
}
