//! `macrolink bench files`.

use clap::Args as ClapArgs;
use macrolink_bench::files::{self, Options};
use std::path::PathBuf;

use crate::args::parse_size;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Size of the file copied.
    #[arg(long, default_value = "2GiB", value_parser = parse_size)]
    size: u64,
    /// Runs of each command; the best counts.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Streams of `macrolink cp`.
    #[arg(long, default_value_t = 2)]
    streams: u32,
    /// Move macrolink's data over TCP, as between two hosts, instead of
    /// shared memory.
    #[arg(long)]
    no_shm: bool,
    /// Directory to work in (default: a new one in the system's temporary
    /// directory, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Write the rows as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the rows as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let opts = Options {
        size: a.size,
        runs: a.runs,
        streams: a.streams,
        no_shm: a.no_shm,
        dir: a.dir,
        json: a.json,
        csv: a.csv,
    };
    files::run(&std::env::current_exe()?, &opts)
}
