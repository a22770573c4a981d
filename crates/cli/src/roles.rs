//! `macrolink gateway` and `macrolink sink`: the gateway and storage roles of
//! a striped transfer, one process each.

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_fabric::{Endpoint, Node, NodeConfig};
use macrolink_gwnet::done::{self, Pending, DONE_EP};
use macrolink_testbed::ready::Line;
use std::net::SocketAddr;

use crate::args::{ChildArgs, MetricsArgs, NodeArgs};

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Endpoint id to serve on.
    #[arg(long, default_value_t = 1)]
    pub ep: u32,
    #[command(flatten)]
    pub child: ChildArgs,
}

#[derive(Debug, ClapArgs)]
pub struct GatewayArgs {
    #[command(flatten)]
    pub role: Args,
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// Starts the node and the endpoint of a gateway-protocol role, and says
/// so; with `until`, the process ends once those compute hosts are done.
fn start(cfg: NodeConfig, ep: u32, until: Option<Pending>) -> anyhow::Result<(Node, Endpoint)> {
    let node = Node::start(cfg).context("starting the node")?;
    let ep = node.open(ep, macrolink_gwnet::endpoint_config())?;
    if let Some(p) = until {
        exit_when_done(&node, p)?;
    }
    Line::node(node.id(), node.tcp_addr()).print()?;
    Ok((node, ep))
}

/// Relays between compute and storage hosts, forwarding to the storage
/// hosts `storage` names (several addresses of one host are its rails);
/// its counters served as `metrics` asks.
pub fn gateway(
    cfg: NodeConfig,
    storage: &[(u32, SocketAddr)],
    ep: u32,
    until: Option<Pending>,
    metrics: &MetricsArgs,
) -> anyhow::Result<()> {
    let meter = macrolink_gwnet::relay::Meter::default();
    metrics.serve("macrolink_gateway", |r| meter.register(r))?;
    let (_node, ep) = start(cfg, ep, until)?;
    macrolink_gwnet::relay::run(ep, storage, &meter)?;
    Ok(())
}

/// Receives striped transfers and checks them.
pub fn sink(cfg: NodeConfig, ep: u32, until: Option<Pending>) -> anyhow::Result<()> {
    let (_node, ep) = start(cfg, ep, until)?;
    macrolink_gwnet::sink::run(ep, None)?;
    Ok(())
}

/// Ends this process (status 0, its node sockets removed) once every
/// compute host of `p` has said it is done to `node`.
pub fn exit_when_done(node: &Node, p: Pending) -> anyhow::Result<()> {
    let ep = node.open(DONE_EP, done::endpoint_config())?;
    let (id, n) = (node.id(), p.waiting().count());
    std::thread::Builder::new()
        .name("ml-until-done".into())
        .spawn(move || match done::wait(ep, p) {
            Ok(()) => {
                eprintln!("node {id}: every compute host is done ({n}); ending");
                macrolink_fabric::remove_sockets();
                std::process::exit(0);
            }
            Err(e) => tracing::warn!("no longer waiting for compute hosts: {e}"),
        })?;
    Ok(())
}

/// On SIGINT, SIGTERM or SIGHUP (Ctrl-C, `scancel`, a launcher ending the
/// job), removes this process's node sockets, runs `then`, and exits with
/// 128 + the signal's number, as a shell reports a process the signal
/// killed.
pub fn exit_on_signals(then: impl FnOnce() + Send + 'static) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("ml-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                macrolink_fabric::remove_sockets();
                then();
                std::process::exit(128 + sig);
            }
        })?;
    Ok(())
}
