//! `macrolink demo`: a peer process (`macrolink echo`), and a message
//! exchange with it in every mode over every transport, with the rates and
//! whether every byte came back.

use anyhow::Context;
use macrolink_fabric::{
    Addr, Completion, EndpointConfig, Mode, Node, NodeConfig, RecvKind, RegionKey, Transport,
};
use macrolink_testbed::Peer;
use std::path::Path;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Time spent on each row.
    pub seconds: Duration,
    /// Bytes of each reliable message and put.
    pub size: usize,
}

/// One exchange.
#[derive(Clone, Debug)]
pub struct Row {
    /// Transport.
    pub transport: Transport,
    /// Mode.
    pub mode: Mode,
    /// Bytes per message.
    pub size: usize,
    /// Messages (round trips, or puts).
    pub count: u64,
    /// Seconds.
    pub secs: f64,
    /// Whether every answer held the bytes sent.
    pub verified: bool,
}

/// Starts `macrolink echo` (the binary `exe`) and exchanges with it in
/// every mode over every transport; a row each.
pub fn run(exe: &Path, args: &Options) -> anyhow::Result<Vec<Row>> {
    let dir = std::env::temp_dir().join(format!("macrolink-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = exchange(exe, args, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The table.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<5} {:<9} {:>9} {:>8} {:>12} {:>10} {:>9}\n",
        "via", "mode", "bytes", "count", "messages/s", "MB/s", "verified"
    );
    for r in rows {
        s += &format!(
            "{:<5} {:<9} {:>9} {:>8} {:>12.0} {:>10.1} {:>9}\n",
            r.transport.to_string(),
            r.mode.to_string(),
            r.size,
            r.count,
            r.count as f64 / r.secs,
            (r.count as f64 * r.size as f64) / r.secs / 1e6,
            if r.verified { "yes" } else { "NO" }
        );
    }
    s + "(datagram and reliable rows: round trips through the peer; put rows: one-sided writes, each waited for)\n"
}

fn exchange(exe: &Path, args: &Options, dir: &Path) -> anyhow::Result<Vec<Row>> {
    let peer = Peer::spawn(exe, 2, dir, &["--eps", "1", "--completion", "poll"])?;
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
    let key = RegionKey(peer.keys.first().context("peer has no region")?.1);
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
