//! `macrolink bench manage`: how soon management notices, acts, and
//! replaces a dead manager.

use clap::Args as ClapArgs;
use macrolink_bench::manage::{self, Options};
use std::path::PathBuf;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Macro-clusters.
    #[arg(long, default_value_t = 2)]
    groups: usize,
    /// Hosts in each.
    #[arg(long, default_value_t = 8)]
    hosts: usize,
    /// Hosts killed, and as many frozen.
    #[arg(long, default_value_t = 50)]
    trials: usize,
    /// Managers killed.
    #[arg(long, default_value_t = 10)]
    takeovers: usize,
    /// First port of the stations (management addresses from port + 1000).
    #[arg(long, default_value_t = 17100)]
    port: u16,
    /// Write the rows as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let o = Options {
        exe: std::env::current_exe()?,
        groups: a.groups,
        hosts: a.hosts,
        trials: a.trials,
        takeovers: a.takeovers,
        port: a.port,
    };
    let bar = macrolink_bench::progress::bar((2 * o.trials + o.takeovers) as u64);
    let rows = manage::run(&o, |what| {
        bar.set_message(what.to_string());
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    print!("{}", manage::table(&rows, &o));
    macrolink_bench::report::save(a.json.as_deref(), None, &rows)?;
    Ok(())
}
