//! `macrolink bench compare`.

use clap::Args as ClapArgs;
use macrolink_bench::compare::{self, Options};
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
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let opts = Options {
        seconds: a.seconds,
        iterations: a.iterations,
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
