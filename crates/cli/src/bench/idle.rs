//! `macrolink bench idle`.

use clap::Args as ClapArgs;
use macrolink_bench::idle::{self, Plan};
use macrolink_fabric::{Completion, Transport};
use std::path::PathBuf;

use crate::args::one_of;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Numbers of quiet connections the measuring endpoint holds, a row each.
    #[arg(long, value_delimiter = ',', default_value = "0,4,16,64,256,1000")]
    quiet: Vec<u32>,
    /// The ping-pong's transport (the quiet connections are tcp).
    #[arg(long, default_value = "tcp", value_parser = one_of::<Transport>(Transport::NAMES))]
    transport: Transport,
    /// Completion of both sides.
    #[arg(long, default_value = "poll", value_parser = one_of::<Completion>(Completion::NAMES))]
    completion: Completion,
    /// Message bytes.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Round trips timed per row and round (each row is measured three
    /// times, in turn with the others, and reports its middle run).
    #[arg(long, default_value_t = 20_000)]
    count: usize,
    /// Write the rows as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let plan = Plan {
        quiet: a.quiet,
        transport: a.transport,
        completion: a.completion,
        size: a.size,
        count: a.count.max(1),
    };
    let rows = plan.run(|r| {
        eprintln!("{} quiet connections: {:.2} us", r.quiet, r.median_us);
    })?;
    print!("{}", idle::table(&plan, &rows));
    if let Some(p) = &a.json {
        macrolink_bench::report::write_json(p, &rows)?;
    }
    Ok(())
}
