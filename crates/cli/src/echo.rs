//! `macrolink echo`: a peer that answers whatever it receives.

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_fabric::{Completion, Node};
use macrolink_testbed::ready::Line;

use crate::args::{one_of, parse_ids, ChildArgs, Ids, NodeArgs};

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    node: NodeArgs,
    /// Endpoint ids to open: `5` or a range `1-64`.
    #[arg(long, default_value = "1", value_parser = parse_ids)]
    eps: Ids,
    /// Bytes of the region each endpoint registers for puts (0: none).
    #[arg(long, default_value_t = 4 << 20)]
    region: usize,
    /// How endpoints wait for traffic.
    #[arg(long, default_value = "wait", value_parser = one_of::<Completion>(Completion::NAMES))]
    completion: Completion,
    #[command(flatten)]
    child: ChildArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.child.apply();
    let node = Node::start(args.node.config()?).context("starting the node")?;
    let cfg = macrolink_bench::echo::endpoint_config(args.completion);
    eprintln!("echo: {}", macrolink_bench::echo::limits(&cfg));
    let mut workers = Vec::new();
    for &id in &args.eps.0 {
        let mut ep = node
            .open(id, cfg)
            .with_context(|| format!("opening endpoint {id}"))?;
        let key = if args.region > 0 {
            let k = ep.register(args.region)?;
            Line::region()
                .with("ep", id)
                .with("key", format!("{:#x}", k.0))
                .with("bytes", args.region)
                .print()?;
            Some(k)
        } else {
            None
        };
        workers.push(std::thread::spawn(move || {
            macrolink_bench::echo::serve(ep, key)
        }));
    }
    Line::node(node.id(), node.tcp_addr()).print()?;
    for w in workers {
        let _ = w.join();
    }
    Ok(())
}
