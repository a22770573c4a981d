//! `macrolink iobench` and the hidden `macrolink iobench-worker` it starts.

use clap::Args as ClapArgs;
use macrolink_iobench::phase::Layout;
use std::path::PathBuf;

use crate::args::{parse_size, parse_sizes, Sizes};
use crate::files::ClientArgs;

/// Arguments of `macrolink iobench`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Directory or ml://host[:port]/dir to test in (default: a new
    /// directory under the current one, removed afterwards).
    target: Option<String>,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: u64,
    /// Patterns: n-n, n-1.
    #[arg(long, value_delimiter = ',', default_value = "n-n,n-1", value_parser = parse_layout)]
    patterns: Vec<Layout>,
    /// Transfer sizes.
    #[arg(long, value_delimiter = ',', value_parser = parse_size,
          default_value = "512KiB,2MiB,8MiB,32MiB,64MiB")]
    sizes: Vec<u64>,
    /// Bytes each worker writes and reads in each test.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    file_size: u64,
    /// Block sizes of the random-write test (local directories; "" skips it).
    #[arg(long, value_parser = parse_sizes, default_value = "4KiB,64KiB,1MiB")]
    random_blocks: Sizes,
    /// Do not fsync written files before closing them.
    #[arg(long)]
    no_fsync: bool,
    /// Run fio with the matching job beside each test (local directories).
    #[arg(long)]
    fio: bool,
    /// Runs of each test, alternated with fio's under --fio: each row is
    /// the median run, beside the range of them all [default: 3 with
    /// --fio, else 1].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100))]
    runs: Option<u64>,
    /// Write the rows as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the rows as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw effective bandwidth over transfer size as a PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Under a launcher (srun, mpirun): where the ranks meet, a directory
    /// all of them see (default: the target directory).
    #[arg(long)]
    sync_dir: Option<PathBuf>,
    #[command(flatten)]
    client: ClientArgs,
}

fn parse_layout(s: &str) -> Result<Layout, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string())
}

/// Runs the benchmark; its workers are this program's `iobench-worker`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let opts = macrolink_iobench::Options {
        target: a.target,
        workers: a.workers,
        patterns: a.patterns,
        sizes: a.sizes,
        file_size: a.file_size,
        random_blocks: a.random_blocks.0,
        fsync: !a.no_fsync,
        fio: a.fio,
        runs: a.runs.unwrap_or(if a.fio { 3 } else { 1 }) as usize,
        json: a.json,
        csv: a.csv,
        plot: a.plot,
        sync_dir: a.sync_dir,
        client: a.client.setup(),
    };
    macrolink_iobench::run(&opts, &|| {
        let mut c = std::process::Command::new(&exe);
        c.arg("iobench-worker");
        c
    })
}

/// One worker: its setup and phases on standard input.
pub fn worker() -> anyhow::Result<()> {
    macrolink_iobench::worker::serve()
}
