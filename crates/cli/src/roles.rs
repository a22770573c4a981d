//! `macrolink gateway` and `macrolink sink`: the gateway and storage roles of
//! a striped transfer, one process each.

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_fabric::{Endpoint, Node, NodeConfig};
use macrolink_testbed::ready::Line;
use std::net::SocketAddr;

use crate::args::{ChildArgs, NodeArgs};

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

/// Starts the node and the endpoint of a gateway-protocol role, and says so.
fn start(cfg: NodeConfig, ep: u32) -> anyhow::Result<(Node, Endpoint)> {
    let node = Node::start(cfg).context("starting the node")?;
    let ep = node.open(ep, macrolink_gwnet::endpoint_config())?;
    Line::node(node.id(), node.tcp_addr()).print()?;
    Ok((node, ep))
}

/// Relays between compute and storage hosts, forwarding to the storage
/// hosts `storage` names (several addresses of one host are its rails).
pub fn gateway(cfg: NodeConfig, storage: &[(u32, SocketAddr)], ep: u32) -> anyhow::Result<()> {
    let (_node, ep) = start(cfg, ep)?;
    macrolink_gwnet::relay::run(ep, storage)?;
    Ok(())
}

/// Receives striped transfers and checks them.
pub fn sink(cfg: NodeConfig, ep: u32) -> anyhow::Result<()> {
    let (_node, ep) = start(cfg, ep)?;
    macrolink_gwnet::sink::run(ep, None)?;
    Ok(())
}
