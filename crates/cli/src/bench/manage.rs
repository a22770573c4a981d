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
    /// Managers killed and frozen (alternately, round the groups).
    #[arg(long, default_value_t = 20)]
    takeovers: usize,
    /// Seconds of the quiet run (loss on one group, a stalled manager; no
    /// host dies): every action in it is a false one. 0: none.
    #[arg(long, default_value_t = 600)]
    soak: u64,
    /// Share of group 0's datagrams dropped in the quiet run.
    #[arg(long, default_value_t = 0.05)]
    loss: f64,
    /// Seconds group 0's manager is stopped in the quiet run.
    #[arg(long, default_value_t = 20)]
    stall: u64,
    /// Hosts killed again after their reset, to be excluded (each host
    /// but the managers once at most).
    #[arg(long, default_value_t = 10)]
    exclusions: usize,
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
        soak_s: a.soak,
        loss: a.loss,
        stall_s: a.stall,
        exclusions: a.exclusions,
    };
    let bar = macrolink_bench::progress::bar((2 * o.trials + o.takeovers + o.exclusions) as u64);
    let out = manage::run(&o, |what| {
        bar.set_message(what.to_string());
        if !what.starts_with("soak") {
            bar.inc(1);
        }
    })?;
    bar.finish_and_clear();
    print!("{}", manage::table(&out, &o));
    macrolink_bench::report::save(a.json.as_deref(), None, std::slice::from_ref(&out))?;
    Ok(())
}
