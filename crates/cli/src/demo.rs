//! `macrolink demo`.

use anyhow::bail;
use clap::Args as ClapArgs;
use macrolink_bench::demo::{self, Options};
use std::time::Duration;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Time spent on each row.
    #[arg(long, default_value = "0.5", value_parser = parse_secs)]
    seconds: Duration,
    /// Bytes of each reliable message and put.
    #[arg(long, default_value_t = 1 << 20)]
    size: usize,
}

fn parse_secs(s: &str) -> anyhow::Result<Duration> {
    Ok(Duration::from_secs_f64(s.parse()?))
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let opts = Options {
        seconds: a.seconds,
        size: a.size,
    };
    let rows = demo::run(&std::env::current_exe()?, &opts)?;
    print!("{}", demo::table(&rows));
    if !rows.iter().all(|r| r.verified) {
        bail!("some exchanges returned wrong bytes")
    }
    Ok(())
}
