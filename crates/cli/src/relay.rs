//! `macrolink relay`: one of the pair of range-extension relays that join
//! the two segments of a cluster file over a long link.

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_cluster::{Cluster, Host};
use macrolink_relaynet::{plan, Relay};
use macrolink_testbed::ready::Line;
use std::path::PathBuf;

use crate::args::{ChildArgs, MetricsArgs};
use crate::files::SecretArgs;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Cluster file with two [[segment]] tables, each naming its relay.
    cluster: PathBuf,
    /// This relay's host name (default: from the launcher's rank).
    #[arg(long)]
    host: Option<String>,
    /// Print the report at the end as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    secret: SecretArgs,
    #[command(flatten)]
    metrics: MetricsArgs,
    #[command(flatten)]
    child: ChildArgs,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    a.child.apply();
    let c = Cluster::load(&a.cluster).with_context(|| format!("in {}", a.cluster.display()))?;
    let h = c.me(a.host.as_deref())?;
    serve(&c, h, a.secret.secret_file, a.json, &a.metrics)
}

/// Runs relay host `h` of `c` until SIGINT or SIGTERM.
pub fn serve(
    c: &Cluster,
    h: &Host,
    secret: Option<PathBuf>,
    json: bool,
    metrics: &MetricsArgs,
) -> anyhow::Result<()> {
    let key = macrolink_files::setup::load_secret(secret.as_deref())?.fabric_key();
    let relay = Relay::bind(plan::config(c, h, key)?)?;
    let meter = relay.meter();
    metrics.serve("macrolink_relay", |r| meter.register(r))?;
    eprintln!("{}: {relay}", h.name);
    let first = relay.listening().first().map(|l| l.1.to_string());
    Line::ready()
        .with("tcp", first.unwrap_or_default())
        .with("long", relay.long_addr()?)
        .print()?;
    let report = relay.run_until_signal()?;
    match json {
        true => println!("{}", serde_json::to_string(&report)?),
        false => println!("{report}"),
    }
    Ok(())
}
