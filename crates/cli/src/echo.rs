//! `macrolink echo`: a peer that answers whatever it receives.

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_fabric::{EndpointConfig, Error, Mode, Node, RecvKind};
use std::io::Write;

use crate::node_args::{parse_ids, CompletionArg, NodeArgs};

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    node: NodeArgs,
    /// Endpoint ids to open: `5` or a range `1-64`.
    #[arg(long, default_value = "1", value_parser = parse_ids)]
    eps: crate::node_args::Ids,
    /// Bytes of the region each endpoint registers for puts (0: none).
    #[arg(long, default_value_t = 4 << 20)]
    region: usize,
    /// How endpoints wait for traffic.
    #[arg(long, value_enum, default_value_t = CompletionArg::Wait)]
    completion: CompletionArg,
    /// Exit when the parent process exits.
    #[arg(long)]
    exit_with_parent: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.exit_with_parent {
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    }
    let node = Node::start(args.node.config()).context("starting the node")?;
    let cfg = EndpointConfig {
        completion: args.completion.into(),
        ..EndpointConfig::default()
    };
    let mut workers = Vec::new();
    let mut out = std::io::stdout().lock();
    for &id in &args.eps.0 {
        let mut ep = node
            .open(id, cfg)
            .with_context(|| format!("opening endpoint {id}"))?;
        let key = if args.region > 0 {
            let k = ep.register(args.region)?;
            writeln!(out, "region ep={id} key={:#x} bytes={}", k.0, args.region)?;
            Some(k)
        } else {
            None
        };
        workers.push(std::thread::spawn(move || serve(ep, key)));
    }
    let tcp = node.tcp_addr().map(|a| a.to_string()).unwrap_or_default();
    writeln!(out, "ready node={} tcp={tcp}", node.id())?;
    out.flush()?;
    drop(out);
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
