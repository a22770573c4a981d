//! `macrolink echo`: a peer that answers whatever it receives.

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_fabric::{EndpointConfig, Error, Mode, Node, RecvKind};
use macrolink_testbed::ready::Line;

use crate::args::{parse_ids, ChildArgs, CompletionArg, Ids, NodeArgs};

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
    #[arg(long, value_enum, default_value_t = CompletionArg::Wait)]
    completion: CompletionArg,
    #[command(flatten)]
    child: ChildArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.child.apply();
    let node = Node::start(args.node.config()).context("starting the node")?;
    let cfg = EndpointConfig {
        completion: args.completion.into(),
        ..EndpointConfig::default()
    };
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
        workers.push(std::thread::spawn(move || serve(ep, key)));
    }
    Line::node(node.id(), node.tcp_addr()).print()?;
    for w in workers {
        let _ = w.join();
    }
    Ok(())
}

fn serve(mut ep: macrolink_fabric::Endpoint, region: Option<macrolink_fabric::RegionKey>) {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let r = match ep.read(&mut buf) {
            Ok(r) => r,
            Err(Error::BufferTooSmall { needed, .. }) => {
                buf.resize(needed, 0);
                continue;
            }
            Err(Error::PeerLost { peer, reason }) => {
                tracing::info!("peer {peer} gone: {reason}");
                continue;
            }
            Err(e) => {
                tracing::warn!("endpoint {}: {e}", ep.addr());
                continue;
            }
        };
        let (mode, data) = match r.kind {
            RecvKind::Message(mode) => (mode, &buf[..r.len]),
            RecvKind::PutPlaced { key, offset } => {
                if Some(key) != region {
                    continue;
                }
                let Some(mem) = ep.region(key) else { continue };
                let off = offset as usize;
                if buf.len() < r.len {
                    buf.resize(r.len, 0);
                }
                buf[..r.len].copy_from_slice(&mem[off..off + r.len]);
                (Mode::Reliable, &buf[..r.len])
            }
        };
        let sent = ep
            .target_via(r.from, mode, r.transport)
            .and_then(|t| ep.write(t, data));
        if let Err(e) = sent {
            tracing::info!("cannot answer {}: {e}", r.from);
        }
    }
}
