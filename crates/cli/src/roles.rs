//! `macrolink gateway` and `macrolink sink`: the gateway and storage roles of
//! a striped transfer, one process each.

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_fabric::{EndpointConfig, Node};
use std::io::Write;

use crate::node_args::NodeArgs;

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Endpoint id to serve on.
    #[arg(long, default_value_t = 1)]
    pub ep: u32,
    /// Exit when the parent process exits.
    #[arg(long)]
    pub exit_with_parent: bool,
}

fn start(args: &Args) -> anyhow::Result<(Node, macrolink_fabric::Endpoint)> {
    if args.exit_with_parent {
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    }
    let node = Node::start(args.node.config()).context("starting the node")?;
    let ep = node.open(args.ep, endpoint_config())?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "ready node={} tcp={}",
        node.id(),
        node.tcp_addr().map(|a| a.to_string()).unwrap_or_default()
    )?;
    out.flush()?;
    Ok((node, ep))
}

/// Settings of a gateway's or storage host's endpoint.
pub fn endpoint_config() -> EndpointConfig {
    macrolink_gwnet::endpoint_config()
}

/// Relays between compute and storage hosts.
pub fn gateway(args: Args) -> anyhow::Result<()> {
    let rails = macrolink_gwnet::relay::Rails::new(&args.node.peers);
    let (_node, ep) = start(&args)?;
    macrolink_gwnet::relay::run(ep, rails)?;
    Ok(())
}

/// Receives striped transfers and checks them.
pub fn sink(args: Args) -> anyhow::Result<()> {
    let (_node, ep) = start(&args)?;
    macrolink_gwnet::sink::run(ep, None)?;
    Ok(())
}
