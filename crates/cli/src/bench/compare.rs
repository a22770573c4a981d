//! `macrolink bench compare`.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args as ClapArgs;
use macrolink_bench::compare::{
    self, Group, Groups, Options, FEWEST_PAIRS_ASKED, MOST_PAIRS_ASKED,
};
use std::path::PathBuf;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Seconds per bandwidth figure.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Iterations per latency figure.
    #[arg(long, default_value_t = 20_000)]
    iterations: u64,
    /// Write the rows as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw each judged ratio beside its target as a PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Only these groups of rows (comma-separated; all where none is
    /// named): shm (shared memory beside UCX), tcp-bw (tcp bandwidth beside
    /// iperf3 and UCX), tcp and udp (64 B ping-pongs beside sockperf, with
    /// their floors), ucx (ours over UCX beside ucx_perftest), waiting
    /// (large messages to a waiting reader beside UCX's sleeping mode), cpu
    /// (a waiting target's CPU).
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = PossibleValuesParser::new(Group::names()).try_map(|s| s.parse::<Group>()),
    )]
    only: Vec<Group>,
    /// Pairs of runs (ours, then the peer's) behind each alternated latency
    /// row, from 3 to 99 (each row's own number where not given: 5 beside
    /// sockperf, 9 over shared memory and UCX).
    #[arg(long, value_parser = clap::value_parser!(u64).range(FEWEST_PAIRS_ASKED as u64..=MOST_PAIRS_ASKED as u64))]
    pairs: Option<u64>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let opts = Options {
        seconds: a.seconds,
        iterations: a.iterations,
        only: Groups::of(&a.only),
        pairs: a.pairs.map(|p| p as usize),
    };
    let rows = compare::run(&std::env::current_exe()?, &opts)?;
    print!("{}", compare::table(&rows));
    if let Some(p) = &a.json {
        macrolink_bench::report::write_json(p, &rows)?;
    }
    if let Some(p) = &a.plot {
        compare::png(p, &rows)?;
        println!("plot: {}", p.display());
    }
    Ok(())
}
