//! `macrolink bench`: the papers' tables, measured here, beside the
//! established tools.

mod compare;
mod files;
mod gateways;
mod idle;
mod manage;
mod messages;
mod range;

use clap::{Args as ClapArgs, Subcommand};

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Unidirectional bandwidth per message size, with CPU % of both sides.
    Bw(messages::BwArgs),
    /// Latency: PingPong, PingPing, SendRecv, Exchange.
    Lat(messages::LatArgs),
    /// One-way latency, with the clock offset estimate and its error bound.
    Oneway(messages::OneArgs),
    /// DP-II latency breakdown: T_startup + T_send + T_net + T_delivery.
    Breakdown(messages::OneArgs),
    /// Ours beside ucx_perftest, iperf3 and sockperf, with ratios.
    Compare(compare::Args),
    /// A ping-pong while the endpoint also holds many quiet connections.
    Idle(idle::Args),
    /// Through 1..N gateways in network namespaces, beside kernel ECMP (root).
    Gateways(gateways::Args),
    /// `macrolink cp` beside xrdcp (xrootd) and cp, same files, same run.
    Files(files::Args),
    /// Across an emulated long link, with and without the relay pair,
    /// beside iperf3 cubic and bbr (root: namespaces).
    Range(range::Args),
    /// Macro-cluster management: detection of killed and frozen hosts,
    /// resets, takeovers of killed managers, beside others' defaults.
    Manage(manage::Args),
    /// The target side, for runs between two hosts (`--connect` on the other).
    #[command(mut_arg("node", |a| a.default_value("2")))]
    Serve(messages::ServeArgs),
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // The commands that start peers, relays, links or namespaces take
    // them down with them when a signal stops them.
    if !matches!(
        args.command,
        BenchCommand::Bw(_)
            | BenchCommand::Lat(_)
            | BenchCommand::Oneway(_)
            | BenchCommand::Breakdown(_)
            | BenchCommand::Serve(_)
            | BenchCommand::Idle(_)
    ) {
        macrolink_testbed::undo::on_signal()?;
    }
    match args.command {
        BenchCommand::Bw(a) => messages::bw(a),
        BenchCommand::Lat(a) => messages::lat(a),
        BenchCommand::Oneway(a) => messages::oneway(a),
        BenchCommand::Breakdown(a) => messages::breakdown(a),
        BenchCommand::Serve(a) => messages::serve(a),
        BenchCommand::Compare(a) => compare::run(a),
        BenchCommand::Idle(a) => idle::run(a),
        BenchCommand::Gateways(a) => gateways::run(a),
        BenchCommand::Files(a) => files::run(a),
        BenchCommand::Range(a) => range::run(a),
        BenchCommand::Manage(a) => manage::run(a),
    }
}
