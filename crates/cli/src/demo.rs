//! `macrolink demo`: a peer process, and a message exchange with it in every
//! mode over every transport, with the rates.

use anyhow::{bail, Context};

use crate::peer::Peer;
use clap::Args as ClapArgs;
use macrolink_fabric::{
    Addr, Completion, EndpointConfig, Mode, Node, NodeConfig, RecvKind, Transport,
};
use std::time::{Duration, Instant};

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Time spent on each row.
    #[arg(long, default_value = "0.5", value_parser = parse_secs)]
    seconds: Duration,
    /// Bytes of each reliable message and put.
    #[arg(long, default_value_t = 1 << 20)]
    size: usize,
}

fn parse_secs(s: &str) -> anyhow::Result<Duration> {
    Ok(Duration::from_secs_f64(s.parse()?))
}

struct Row {
    transport: Transport,
    mode: Mode,
    size: usize,
    count: u64,
    secs: f64,
    verified: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("macrolink-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = exchange(&args, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let rows = result?;
    println!(
        "{:<5} {:<9} {:>9} {:>8} {:>12} {:>10} {:>9}",
        "via", "mode", "bytes", "count", "messages/s", "MB/s", "verified"
    );
    for r in &rows {
        println!(
            "{:<5} {:<9} {:>9} {:>8} {:>12.0} {:>10.1} {:>9}",
            r.transport.to_string(),
            r.mode.to_string(),
            r.size,
            r.count,
            r.count as f64 / r.secs,
            (r.count as f64 * r.size as f64) / r.secs / 1e6,
            if r.verified { "yes" } else { "NO" }
        );
    }
    println!("(datagram and reliable rows: round trips through the peer; put rows: one-sided writes, each waited for)");
    if rows.iter().all(|r| r.verified) {
        Ok(())
    } else {
        bail!("some exchanges returned wrong bytes")
    }
}

fn exchange(args: &Args, dir: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    let exe = std::env::current_exe()?;
    let peer = Peer::spawn(&exe, 2, dir, &["--eps", "1", "--completion", "poll"])?;
    let mut cfg = NodeConfig::local(1, dir);
    cfg.peers.insert(2, peer.tcp);
    let node = Node::start(cfg)?;
    let mut ep = node.open(
        1,
        EndpointConfig {
            completion: Completion::Poll,
            ..EndpointConfig::default()
        },
    )?;
    let key = peer.keys.first().context("peer has no region")?.1;
    let to = Addr::new(2, 1);
    let mtu = node.datagram_mtu();
    let mut rows = Vec::new();
    for (transport, mode) in [
        (Transport::Shm, Mode::Datagram),
        (Transport::Shm, Mode::Reliable),
        (Transport::Shm, Mode::Put),
        (Transport::Tcp, Mode::Datagram),
        (Transport::Tcp, Mode::Reliable),
        (Transport::Tcp, Mode::Put),
        (Transport::Udp, Mode::Datagram),
    ] {
        let size = if mode == Mode::Datagram {
            mtu.min(1024)
        } else {
            args.size
        };
        let t = ep.target_via(to, mode, transport)?;
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
        let mut buf = vec![0u8; size.max(1)];
        let start = Instant::now();
        let mut count = 0u64;
        let mut verified = true;
        while start.elapsed() < args.seconds || count == 0 {
            if mode == Mode::Put {
                ep.put_wait(t, &data, 0, key, false)?;
            } else {
                ep.write(t, &data)?;
                let r = ep
                    .read_timeout(&mut buf, Duration::from_secs(5))?
                    .context("no answer from the peer")?;
                verified &= r.len == size && buf[..size] == data[..];
            }
            count += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        if mode == Mode::Put {
            // One notified put: the peer answers with the bytes it placed.
            ep.put_wait(t, &data, 0, key, true)?;
            let r = ep
                .read_timeout(&mut buf, Duration::from_secs(5))?
                .context("no answer from the peer")?;
            verified &= r.kind == RecvKind::Message(Mode::Reliable) && buf[..size] == data[..];
        }
        rows.push(Row {
            transport,
            mode,
            size,
            count,
            secs,
            verified,
        });
    }
    drop(ep);
    Ok(rows)
}
