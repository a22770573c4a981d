//! One striped transfer (or several at once) from the compute host through
//! `n` gateways of the testbed to its storage host, with a fault struck
//! midway when asked.

use anyhow::bail;
use macrolink_fabric::{clock_ns, Addr, Node, NodeConfig};
use macrolink_gateway::stripe::StripeConfig;
use macrolink_gwnet::client::{send, SendConfig, SendReport};
use macrolink_testbed::netns::{enter, in_ns, Testbed};
use macrolink_testbed::Peer;
use std::path::Path;
use std::sync::atomic::Ordering;

use crate::stalls::{Probe, Stalled};

/// Something to break once a share of the transfer is acknowledged.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Kill gateway 0 (SIGKILL) at this share.
    KillGateway(f64),
    /// Take storage-side link `link` of gateway 0 down at this share.
    LinkDown(f64, usize),
    /// Freeze gateway 0 (SIGSTOP) at this share: its connections stay open
    /// and say nothing, as a hung host's do; only heartbeats can tell.
    FreezeGateway(f64),
}

/// Transfer settings: 1 MiB chunks, `window` in flight per gateway,
/// heartbeats every `heartbeat_ms` with `misses` allowed; a transfer that
/// hears no acknowledgement for 30 s fails instead of waiting on.
pub fn send_config(window: usize, heartbeat_ms: u64, misses: u32) -> SendConfig {
    SendConfig {
        stripe: StripeConfig {
            chunk: 1 << 20,
            window,
            rto: 500_000_000,
        },
        health: macrolink_gateway::health::HealthConfig {
            interval: heartbeat_ms * 1_000_000,
            misses,
        },
        pinned: false,
        patience: 30_000_000_000,
        excluded: None,
        heard: None,
        transport: macrolink_fabric::Transport::Tcp,
    }
}

/// What a run of [`striped`] measured.
#[derive(Debug)]
pub struct Striped {
    /// The client's report (of all flows together).
    pub report: SendReport,
    /// When the fault struck ([`clock_ns`]; 0: none did).
    pub struck: u64,
    /// What a probe saw of the machine while the flows ran (the time
    /// their rate is over).
    pub machine: Stalled,
}

impl Striped {
    /// Seconds from the fault to gateway `gw` being taken out of use.
    pub fn found_after(&self, gw: usize) -> Option<f64> {
        let at = *self.report.down_at.get(gw)?;
        (self.struck != 0 && at >= self.struck).then(|| (at - self.struck) as f64 / 1e9)
    }
}

/// Starts a sink and `n` gateways in `tb`, then sends `payload` from the
/// compute namespace; `kill_at` kills gateway 0 once that share is acknowledged.
pub fn striped(
    exe: &Path,
    tb: &Testbed,
    n: usize,
    payload: &[u8],
    send_cfg: &SendConfig,
    fault: Option<Fault>,
    flows: usize,
) -> anyhow::Result<Striped> {
    let dir = macrolink_testbed::undo::scratch()?;
    let _sink = tb.spawn_sink(exe, 0, dir.path())?;
    let gws = (0..n)
        .map(|i| tb.spawn_gateway(exe, i, dir.path()).map(Some))
        .collect::<anyhow::Result<Vec<Option<Peer>>>>()?;
    let compute = tb.compute();
    let shm = dir.path().join(&compute);
    let addrs: Vec<String> = (0..n).map(|i| tb.gateway_addr(i)).collect();
    let gws = std::sync::Mutex::new(gws);
    let done = std::sync::atomic::AtomicBool::new(false);
    // When the fault struck (clock_ns; 0: not yet).
    let struck = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<Striped> {
            enter(&compute)?;
            let mut cfg = NodeConfig::local(1, &shm);
            for (i, a) in addrs.iter().enumerate() {
                cfg.peers.insert(tb.gateway_node(i), a.parse()?);
            }
            let node = Node::start(cfg)?;
            // The flows share what they hear of the gateways, as a file
            // server's downloads do (unless the caller gave a table).
            let cfg = &SendConfig {
                heard: send_cfg
                    .heard
                    .clone()
                    .or_else(|| Some(macrolink_gateway::heard::Heard::new())),
                ..send_cfg.clone()
            };
            let targets: Vec<Addr> = (0..n).map(|i| Addr::new(tb.gateway_node(i), 1)).collect();
            // `flows` transfers at once, each from its own endpoint and
            // thread (started here, so in the compute namespace too).
            let share = payload.len() / flows.max(1);
            // Flows together: from before the first starts to after the
            // last has its verdict.
            let probe = Probe::start()?;
            let wall = std::time::Instant::now();
            let reports: Vec<anyhow::Result<SendReport>> = std::thread::scope(|fs| {
                let handles: Vec<_> = (0..flows.max(1))
                    .map(|f| {
                        let (node, targets, gws, fault, done, struck) =
                            (&node, &targets, &gws, &fault, &done, &struck);
                        fs.spawn(move || -> anyhow::Result<SendReport> {
                            let ep_cfg = macrolink_gwnet::endpoint_config();
                            let mut ep = node.open(1 + f as u32, ep_cfg)?;
                            let part = &payload[f * share..(f + 1) * share];
                            let r = send(
                                &mut ep,
                                targets,
                                Addr::new(tb.storage_node(0), 1),
                                f as u64 + 1,
                                part,
                                cfg.clone(),
                                &mut |acked, total| match &fault {
                                    Some(Fault::KillGateway(k))
                                        if acked as f64 >= k * total as f64 =>
                                    {
                                        let mut g = gws.lock().unwrap_or_else(|p| p.into_inner());
                                        if let Some(mut victim) = g[0].take() {
                                            victim.kill();
                                            struck.store(clock_ns(), Ordering::Relaxed);
                                        }
                                    }
                                    Some(Fault::FreezeGateway(k))
                                        if acked as f64 >= k * total as f64
                                            && !done.swap(
                                                true,
                                                std::sync::atomic::Ordering::AcqRel,
                                            ) =>
                                    {
                                        let g = gws.lock().unwrap_or_else(|p| p.into_inner());
                                        if let Some(victim) = &g[0] {
                                            // SAFETY: kill(2) on a child this process
                                            // started and has not reaped.
                                            unsafe {
                                                libc::kill(victim.pid() as i32, libc::SIGSTOP);
                                            }
                                            struck.store(clock_ns(), Ordering::Relaxed);
                                        }
                                    }
                                    Some(Fault::LinkDown(k, link))
                                        if acked as f64 >= k * total as f64
                                            && !done.swap(
                                                true,
                                                std::sync::atomic::Ordering::AcqRel,
                                            ) =>
                                    {
                                        let dev = tb.storage_link(0, *link);
                                        let _ = in_ns(
                                            &tb.gateway(0),
                                            &["ip", "link", "set", "dev", &dev, "down"],
                                        );
                                        struck.store(clock_ns(), Ordering::Relaxed);
                                    }
                                    _ => {}
                                },
                            )?;
                            if !r.verified {
                                bail!("the storage host's hash check failed");
                            }
                            Ok(r)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .map_err(|_| anyhow::anyhow!("flow thread panicked"))?
                    })
                    .collect()
            });
            let secs = wall.elapsed().as_secs_f64();
            let machine = probe.finish();
            let mut all = SendReport {
                verified: true,
                secs,
                ..SendReport::default()
            };
            for r in reports {
                let r = r?;
                all.bytes += r.bytes;
                all.longest_stall = all.longest_stall.max(r.longest_stall);
                all.resent += r.resent;
                all.failovers += r.failovers;
                all.verified &= r.verified;
                all.down.resize(r.down.len(), false);
                for (a, d) in all.down.iter_mut().zip(&r.down) {
                    *a |= d;
                }
                all.down_at.resize(r.down_at.len(), 0);
                for (a, d) in all.down_at.iter_mut().zip(&r.down_at) {
                    *a = (*a).max(*d);
                }
            }
            Ok(Striped {
                report: all,
                struck: struck.load(Ordering::Relaxed),
                machine,
            })
        })
        .join()
        .map_err(|_| anyhow::anyhow!("client thread panicked"))?
    })
}
