//! `macrolink bench gateways`.

use clap::Args as ClapArgs;
use macrolink_bench::gateways::{self, Options};
use std::path::PathBuf;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Largest number of gateways.
    #[arg(long, default_value_t = 4)]
    max: usize,
    /// MiB per transfer (the failover case too).
    #[arg(long, default_value_t = 1024)]
    mib: usize,
    /// Rate of each storage-side link (tc syntax).
    #[arg(long, default_value = "1gbit")]
    rate: String,
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 3)]
    seconds: u32,
    /// Chunks in flight per gateway, shared by the 8 transfers (each
    /// keeps at least one).
    #[arg(long, default_value_t = 4)]
    window: usize,
    /// Runs of each kind per number of gateways, alternated (one striped
    /// transfer and eight; cp's columns in rounds): the tables give their
    /// median and range.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Milliseconds between heartbeats to each gateway.
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    /// Unanswered heartbeats in a row that take a gateway out of use.
    #[arg(long, default_value_t = 3)]
    misses: u32,
    /// Write the rows as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw bandwidth against gateways as a PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Directory for the files that cp moves (default: the system's
    /// temporary directory): a directory on the file system to measure.
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let opts = Options {
        max: a.max,
        mib: a.mib,
        rate: a.rate,
        seconds: a.seconds,
        window: a.window,
        runs: a.runs as usize,
        heartbeat_ms: a.heartbeat_ms,
        misses: a.misses,
        json: a.json,
        plot: a.plot,
        dir: a.dir,
    };
    gateways::run(&std::env::current_exe()?, &opts)
}
