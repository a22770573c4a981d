//! `macrolink bench gateways`: one compute host to storage through 1..N
//! gateways on shaped storage-side links, macrolink's striping beside the
//! kernel's own equal-cost multipath (iperf3 with one and with many flows);
//! and the stall when a gateway is killed mid-transfer.

use anyhow::{bail, Context};
use macrolink_fabric::{clock_ns, Addr, Node, NodeConfig};
use macrolink_gateway::stripe::StripeConfig;
use macrolink_gwnet::client::{send, SendConfig, SendReport};
use macrolink_testbed::data::pattern;
use macrolink_testbed::netns::{enter, in_ns, qdisc_sent, Testbed, ECMP_ADDR, PORT};
use macrolink_testbed::{require, Peer};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

use crate::peers::iperf3;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Largest number of gateways.
    pub max: usize,
    /// MiB per transfer (the failover case too).
    pub mib: usize,
    /// Rate of each storage-side link (tc syntax).
    pub rate: String,
    /// Seconds per iperf3 run.
    pub seconds: u32,
    /// Chunks in flight per gateway.
    pub window: usize,
    /// Striped runs of each kind (one transfer, eight) per number of
    /// gateways: the table gives their median and their range.
    pub runs: usize,
    /// Milliseconds between heartbeats to each gateway.
    pub heartbeat_ms: u64,
    /// Unanswered heartbeats in a row that take a gateway out of use.
    pub misses: u32,
    /// Write the rows as JSON.
    pub json: Option<PathBuf>,
    /// Draw bandwidth against gateways as a PNG.
    pub plot: Option<PathBuf>,
    /// Where the cp columns' files live (the system's temporary directory
    /// when `None`): on the file system whose part is to be measured.
    pub dir: Option<PathBuf>,
}

/// What held the striped runs of one kind back: chunks sent again (their
/// path lost or their timeout passed), gateways taken out of use, and the
/// longest time without a new chunk acknowledged. The first two are summed
/// over the runs and, of eight transfers, over the transfers (one gateway
/// lost counts once for each transfer that took it out of use); the stall
/// is the longest of any. Beside them, the retransmission timeouts the
/// testbed's kernels had meanwhile, summed: a stall with none is not the
/// kernel's loss recovery.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Held {
    /// Chunks sent again.
    pub resent: u64,
    /// Gateways taken out of use.
    pub failovers: u64,
    /// The longest stall, ms.
    pub longest_stall_ms: f64,
    /// Retransmission timeouts of the testbed's kernels during the runs.
    pub tcp_timeouts: u64,
}

impl Held {
    /// What held one run back.
    fn of(r: &SendReport, tcp_timeouts: u64) -> Held {
        Held {
            resent: r.resent,
            failovers: r.failovers,
            longest_stall_ms: r.longest_stall * 1e3,
            tcp_timeouts,
        }
    }

    /// What held `runs` back together: counts summed, the longest stall.
    fn over(runs: &[Run]) -> Held {
        runs.iter().fold(Held::default(), |a, r| Held {
            resent: a.resent + r.held.resent,
            failovers: a.failovers + r.held.failovers,
            longest_stall_ms: a.longest_stall_ms.max(r.held.longest_stall_ms),
            tcp_timeouts: a.tcp_timeouts + r.held.tcp_timeouts,
        })
    }
}

/// One striped run: its rate and what held it back.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    /// MB/s.
    pub mb_per_s: f64,
    /// What held it back.
    pub held: Held,
}

impl Run {
    fn of(r: &SendReport, tcp_timeouts: u64) -> Run {
        Run {
            mb_per_s: r.bytes as f64 / r.secs / 1e6,
            held: Held::of(r, tcp_timeouts),
        }
    }
}

/// The lowest of `runs`' MB/s; `None` for none.
fn lowest_rate(runs: &[Run]) -> Option<f64> {
    runs.iter().map(|r| r.mb_per_s).reduce(f64::min)
}

/// The median of `runs`' MB/s (of an even number of runs, the mean of
/// the middle two); 0 for none.
fn median_rate(runs: &[Run]) -> f64 {
    crate::stats::median(runs.iter().map(|r| r.mb_per_s).collect()).unwrap_or(0.0)
}

/// Runs `f`; what it returned, and the retransmission timeouts the
/// testbed's kernels had meanwhile.
fn timeouts_over<T>(
    tb: &Testbed,
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, u64)> {
    let before = tb.tcp_timeouts()?;
    let t = f()?;
    Ok((t, tb.tcp_timeouts()?.saturating_sub(before)))
}

/// One row: N gateways.
#[derive(Debug, Serialize)]
pub struct Row {
    /// Gateways in the lane.
    pub gateways: usize,
    /// macrolink, one striped transfer, MB/s: the median of the runs.
    pub macrolink: f64,
    /// Each run of one striped transfer, in the order run.
    pub macrolink_runs: Vec<Run>,
    /// macrolink / (N x its one-gateway figure).
    pub ratio_to_n_links: f64,
    /// macrolink, eight striped transfers at once, MB/s: the median of
    /// the runs.
    pub macrolink_8_flows: f64,
    /// Each run of eight striped transfers, in the order run.
    pub macrolink_8_flows_runs: Vec<Run>,
    /// Eight flows / (N x the one-gateway figure).
    pub ratio_8_flows: f64,
    /// What held the striped transfers back: one transfer, then eight.
    pub held: [Held; 2],
    /// Kernel ECMP, iperf3 one flow, MB/s.
    pub kernel_1_flow: Option<f64>,
    /// Kernel ECMP, iperf3 eight flows, MB/s.
    pub kernel_8_flows: Option<f64>,
    /// `macrolink cp` of the same bytes up through the lane, MB/s.
    pub cp_up: f64,
    /// `macrolink cp` back down through the lane, MB/s.
    pub cp_down: f64,
    /// cp up / (N x the one-gateway striped figure).
    pub ratio_cp_up: f64,
    /// `macrolink cp --direct` up: past the server's page cache, MB/s.
    pub cp_up_direct: f64,
    /// cp up with direct I/O / (N x the one-gateway striped figure).
    pub ratio_cp_up_direct: f64,
    /// cp down / (N x the one-gateway striped figure).
    pub ratio_cp_down: f64,
    /// `macrolink cp --cache` down: every page kept cached, MB/s.
    pub cp_down_cached: f64,
    /// cp down keeping every page / (N x the one-gateway striped figure).
    pub ratio_cp_down_cached: f64,
    /// `macrolink cp --direct` down: past the page cache, MB/s.
    pub cp_down_direct: f64,
    /// cp down with direct I/O / (N x the one-gateway striped figure).
    pub ratio_cp_down_direct: f64,
    /// `macrolink cp` down into `/dev/null`: no file system, MB/s.
    pub cp_down_null: f64,
    /// cp down to `/dev/null` / (N x the one-gateway striped figure).
    pub ratio_cp_down_null: f64,
    /// The same bytes written to a file beside cp's, from memory in 1 MiB
    /// writes, after the copies: what the file system takes alone through
    /// the page cache, MB/s.
    pub fs_write: f64,
    /// The same, written as cp writes by default (uncached past the
    /// file's head), MB/s.
    pub fs_write_uncached: f64,
    /// What held each cp column back, as cp printed it (up, up --direct,
    /// down, down --cache, down --direct, down to /dev/null).
    pub cp_held: [String; 6],
    /// Retransmission timeouts of the testbed's kernels during each cp
    /// column's copy.
    pub cp_tcp_timeouts: [u64; 6],
}

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
            let mut all = SendReport {
                verified: true,
                secs: wall.elapsed().as_secs_f64(),
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
            })
        })
        .join()
        .map_err(|_| anyhow::anyhow!("client thread panicked"))?
    })
}

/// What `cp` did through a lane of the testbed.
#[derive(Debug, Default)]
pub struct LaneCopy {
    /// Upload, MB/s, as `cp` timed it.
    pub up: f64,
    /// The same upload written past the server's page cache (`cp
    /// --direct`), MB/s.
    pub up_direct: f64,
    /// Download, MB/s.
    pub down: f64,
    /// The same download with every page kept cached (`cp --cache`), MB/s.
    pub down_cached: f64,
    /// The same download written past the page cache (`cp --direct`),
    /// MB/s.
    pub down_direct: f64,
    /// The same download into `/dev/null`: the lane and cp without a file
    /// system, MB/s.
    pub down_null: f64,
    /// Chunks each gateway carried (by node): up, up with direct I/O,
    /// down, down keeping every page cached, down with direct I/O, down to
    /// `/dev/null`.
    pub carried: [Vec<(u32, u64)>; 6],
    /// What held each copy back, as cp saw it (its `held back by:` line:
    /// the sender's chunks sent again and gateways taken out of use up,
    /// the receiver's chunks that came twice down, and the longest stall).
    pub held: [String; 6],
    /// Retransmission timeouts of the testbed's kernels during each copy.
    pub tcp_timeouts: [u64; 6],
    /// Bytes each gateway's first storage-side link sent during the upload.
    pub link_bytes: Vec<u64>,
    /// The same bytes written from memory to a file beside cp's, in 1 MiB
    /// writes, after the copies (each of them and this run after a sync),
    /// through the page cache, MB/s.
    pub fs_write: f64,
    /// The same, written as cp writes by default (uncached past the
    /// file's head), MB/s.
    pub fs_write_uncached: f64,
    /// Bytes of the source that the storage host's page cache held as
    /// each download began (by `fincore`).
    pub source_cached: [u64; 4],
}

/// Writes `data` to a new file `path` in 1 MiB writes (as cp's receiver
/// does, without a sync), through the page cache or, with `uncached`, as
/// cp writes by default; MB/s.
fn write_rate(path: &Path, data: &[u8], uncached: bool) -> anyhow::Result<f64> {
    use macrolink_files::data::Sink;
    let t = std::time::Instant::now();
    let f = std::fs::File::create(path)?;
    let u = macrolink_files::uncached::Uncached::new(&f);
    let sink: &dyn Sink = if uncached { &u } else { &f };
    for (i, c) in data.chunks(1 << 20).enumerate() {
        sink.write_at(c, (i << 20) as u64)?;
    }
    drop(f);
    Ok(data.len() as f64 / t.elapsed().as_secs_f64() / 1e6)
}

/// Reads `path` through the page cache and drops the bytes, leaving its
/// pages cached.
fn warm(path: &Path) -> anyhow::Result<()> {
    let mut f = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    std::io::copy(&mut f, &mut std::io::sink())?;
    Ok(())
}

/// The type of the file system that holds `dir`, as its mount names it
/// (`findmnt`); else as `stat -f` does, which tells ext2, ext3 and ext4
/// apart by no more than their shared magic number ("ext2/ext3").
fn fs_type(dir: &Path) -> String {
    let ask = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .arg(dir)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|t| !t.is_empty())
    };
    ask("findmnt", &["-n", "-f", "-o", "FSTYPE", "--target"])
        .or_else(|| ask("stat", &["-f", "-c", "%T"]))
        .unwrap_or_else(|| "unknown".into())
}

/// What cp's summary says of a copy through a lane.
struct Copied {
    /// MB/s.
    rate: f64,
    /// Chunks each gateway carried, by node.
    per: Vec<(u32, u64)>,
    /// Its `held back by:` words (`n.a.` when it printed none).
    held: String,
}

fn copied(stderr: &str) -> anyhow::Result<Copied> {
    let rate = stderr
        .lines()
        .find_map(|l| l.split_once(" MB/s)").map(|(a, _)| a))
        .and_then(|a| a.rsplit_once('(').map(|(_, r)| r))
        .and_then(|r| r.parse().ok())
        .with_context(|| format!("cp printed no rate: {stderr}"))?;
    let per = stderr
        .lines()
        .find_map(|l| l.strip_prefix("chunks through gateways: "))
        .map(|l| {
            l.split(", ")
                .filter_map(|p| {
                    let (g, n) = p.strip_prefix("node ")?.split_once(": ")?;
                    Some((g.parse().ok()?, n.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    let held = stderr
        .lines()
        .find_map(|l| l.strip_prefix("held back by: "))
        .unwrap_or("n.a.")
        .to_string();
    Ok(Copied { rate, per, held })
}

/// The file service of the storage host (its node 10, which also takes
/// striped transfers) behind `n` relaying gateways: `cp` of `mib` MiB up and
/// back down from the compute host, with a cluster file naming the lane.
/// The contact connection goes by the kernel's routes (set up here); the
/// data through the relays. Both copies are compared with the source. The
/// files live in a new directory inside `parent` (the system's temporary
/// directory when `None`).
pub fn files_through(
    exe: &Path,
    tb: &Testbed,
    n: usize,
    mib: usize,
    parent: Option<&Path>,
) -> anyhow::Result<LaneCopy> {
    tb.kernel_ecmp().map_err(anyhow::Error::msg)?;
    let dir = match parent {
        Some(p) => macrolink_testbed::undo::scratch_in(p)?,
        None => macrolink_testbed::undo::scratch()?,
    };
    let export = dir.path().join("export");
    std::fs::create_dir(&export)?;
    let secret = "gateway testbed secret, long enough";
    // The gateways prove the same key to the server's fabric node.
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, secret)?;
    let files = format!("{ECMP_ADDR}:7130");
    let mut serve = Command::new("ip");
    serve
        .args(["netns", "exec", &tb.storage()])
        .arg(exe)
        .arg("serve")
        .arg(&export)
        .args(["--listen", &files, "--node", "10", "--sink"])
        .args(["--fabric", &format!("0.0.0.0:{PORT}")])
        .arg("--shm-dir")
        .arg(dir.path().join("shm-storage"))
        .env("MACROLINK_SECRET", secret);
    let _server = Peer::spawn_cmd(serve)?;
    let mut gateways = Vec::new();
    let mut hosts = String::new();
    for i in 0..n {
        let node = tb.gateway_node(i);
        let mut args = tb.gateway_args(i);
        args.extend(["--secret-file".into(), secret_file.display().to_string()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        gateways.push(tb.spawn(exe, &tb.gateway(i), "gateway", node, &args, dir.path())?);
        hosts.push_str(&format!(
            "[[host]]\nname = \"gw{i}\"\nrole = \"gateway\"\nnode = {node}\nfabric = \"{}\"\n",
            tb.gateway_addr(i)
        ));
    }
    let names: Vec<String> = (0..n).map(|i| format!("\"gw{i}\"")).collect();
    let cluster = dir.path().join("cluster.toml");
    std::fs::write(
        &cluster,
        format!(
            "{hosts}[[host]]\nname = \"store0\"\nrole = \"storage\"\nnode = 10\n\
             storage = \"{}\"\nfiles = \"{files}\"\n\
             [[lane]]\ngateways = [{}]\nstorage = [\"store0\"]\n",
            tb.storage_addrs(0)[0],
            names.join(", ")
        ),
    )?;
    let data = pattern(mib << 20, 0);
    let src = dir.path().join("src");
    std::fs::write(&src, &data)?;
    let back = dir.path().join("back");
    let cached = dir.path().join("cached");
    let direct = dir.path().join("direct");
    let links = || -> anyhow::Result<Vec<u64>> {
        (0..n)
            .map(|i| qdisc_sent(&tb.gateway(i), &tb.storage_link(i, 0)))
            .collect()
    };
    let mut out = LaneCopy::default();
    let before = links()?;
    let f = "ml://store0/f".to_string();
    let copies: [(String, String, Option<&str>); 6] = [
        (src.display().to_string(), f.clone(), None),
        (
            src.display().to_string(),
            "ml://store0/g".to_string(),
            Some("--direct"),
        ),
        (f.clone(), back.display().to_string(), None),
        (f.clone(), cached.display().to_string(), Some("--cache")),
        (f.clone(), direct.display().to_string(), Some("--direct")),
        (f, "/dev/null".to_string(), None),
    ];
    let mut rates = [0.0; 6];
    for (k, (from, to, how)) in copies.into_iter().enumerate() {
        // Each copy starts with the file system idle: the one before it
        // written back first (else a copy past the page cache waited on
        // its predecessor's write-back: 0.88-0.92 of four links, against
        // 0.96-0.97 after a sync).
        rustix::fs::sync();
        if k >= 2 {
            // Every download reads a source the storage host holds in its
            // page cache, so that the down columns differ only in how cp
            // writes: the upload left `f` cached only for its first
            // `HEAD` bytes, and the first download would else read the
            // rest from the disk and leave it cached for the others.
            let source = export.join("f");
            warm(&source)?;
            out.source_cached[k - 2] =
                macrolink_testbed::pages::cached_bytes(&source).map_err(anyhow::Error::msg)?;
        }
        let (o, tcp_timeouts) = timeouts_over(tb, || {
            Ok(Command::new("ip")
                .args(["netns", "exec", &tb.compute()])
                .arg(exe)
                .args(["cp", &from, &to])
                .args(how)
                .arg("--cluster")
                .arg(&cluster)
                .arg("--shm-dir")
                .arg(dir.path().join("shm-compute"))
                .env("MACROLINK_SECRET", secret)
                .output()?)
        })?;
        out.tcp_timeouts[k] = tcp_timeouts;
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            bail!("cp {from} {to}: {err}");
        }
        let Copied { rate, per, held } = copied(&err)?;
        if k == 0 {
            out.link_bytes = links()?.iter().zip(&before).map(|(a, b)| a - b).collect();
        }
        rates[k] = rate;
        out.carried[k] = per;
        out.held[k] = held;
    }
    [
        out.up,
        out.up_direct,
        out.down,
        out.down_cached,
        out.down_direct,
        out.down_null,
    ] = rates;
    rustix::fs::sync();
    out.fs_write = write_rate(&dir.path().join("local"), &data, false)?;
    rustix::fs::sync();
    out.fs_write_uncached = write_rate(&dir.path().join("local-uncached"), &data, true)?;
    if std::fs::read(export.join("f"))? != data
        || std::fs::read(export.join("g"))? != data
        || std::fs::read(&back)? != data
        || std::fs::read(&cached)? != data
        || std::fs::read(&direct)? != data
    {
        bail!("a copy through the lane differs from its source");
    }
    Ok(out)
}

/// The cp columns, in the order of [`LaneCopy`]'s copies.
const CP_COLUMNS: [&str; 6] = [
    "up",
    "up --direct",
    "down",
    "down --cache",
    "down --direct",
    "down /dev/null",
];

/// cp's `held back by:` words in the held table's shorthand: the figures
/// with slashes between, the stall in ms.
fn terse(held: &str) -> String {
    let figures: Vec<&str> = held
        .split(", ")
        .filter_map(|part| part.split_whitespace().find(|w| w.parse::<f64>().is_ok()))
        .collect();
    if figures.is_empty() {
        return held.to_string();
    }
    format!("{} ms", figures.join(" / "))
}

/// Bandwidth against gateways: each way of moving data beside N x the
/// one-gateway figure.
fn plot(path: &Path, rows: &[Row], one: f64, rate: &str) -> anyhow::Result<()> {
    type Pick = fn(&Row) -> Option<f64>;
    let picks: [(&str, Pick); 13] = [
        ("N x one gateway", |_| None),
        ("macrolink, one striped transfer (median)", |r| {
            Some(r.macrolink)
        }),
        ("macrolink, 8 transfers (median)", |r| {
            Some(r.macrolink_8_flows)
        }),
        ("macrolink, one striped transfer (lowest run)", |r| {
            lowest_rate(&r.macrolink_runs)
        }),
        ("macrolink, 8 transfers (lowest run)", |r| {
            lowest_rate(&r.macrolink_8_flows_runs)
        }),
        ("kernel ECMP, iperf3 1 flow", |r| r.kernel_1_flow),
        ("kernel ECMP, iperf3 8 flows", |r| r.kernel_8_flows),
        ("macrolink cp up", |r| Some(r.cp_up)),
        ("macrolink cp --direct up", |r| Some(r.cp_up_direct)),
        ("macrolink cp down", |r| Some(r.cp_down)),
        ("macrolink cp --cache down", |r| Some(r.cp_down_cached)),
        ("macrolink cp --direct down", |r| Some(r.cp_down_direct)),
        ("macrolink cp down into /dev/null", |r| Some(r.cp_down_null)),
    ];
    let series: Vec<(String, Vec<(f64, f64)>)> = picks
        .iter()
        .enumerate()
        .map(|(i, (name, pick))| {
            let pts = rows
                .iter()
                .filter_map(|r| {
                    let y = if i == 0 {
                        Some(r.gateways as f64 * one)
                    } else {
                        pick(r)
                    };
                    Some((r.gateways as f64, y?))
                })
                .collect();
            (name.to_string(), pts)
        })
        .collect();
    crate::plot::lines_png(
        path,
        &format!("one compute host to storage through N gateways ({rate} storage links)"),
        ("gateways", "MB/s"),
        &series,
    )
}

/// iperf3 from compute to storage over the kernel's multipath routes, MB/s.
fn kernel(tb: &Testbed, flows: u32, secs: u32) -> anyhow::Result<f64> {
    iperf3::Run {
        server_ns: Some(&tb.storage()),
        client_ns: Some(&tb.compute()),
        addr: ECMP_ADDR,
        port: 5201,
        flows,
        secs,
        congestion: None,
        len: None,
        omit: 0,
    }
    .mb_per_s()
}

/// Runs the benchmark with gateway processes started from `exe`, and
/// prints its tables.
pub fn run(exe: &Path, a: &Options) -> anyhow::Result<()> {
    if !require::is_root() {
        bail!("the gateway testbed needs root (network namespaces)");
    }
    let iperf = iperf3::TOOL.installed();
    if !iperf {
        eprintln!(
            "iperf3 missing (apt-get install {}): the kernel ECMP columns show n.a.",
            iperf3::TOOL.package
        );
    }
    let exe = exe.to_path_buf();
    let payload = pattern(a.mib << 20, 0);
    let cfg = send_config(a.window, a.heartbeat_ms, a.misses);
    let mut rows: Vec<Row> = Vec::new();
    let mut one = 0.0;
    for n in 1..=a.max {
        eprintln!("{n} gateway(s) ...");
        let tb = Testbed::new(n, &a.rate).map_err(anyhow::Error::msg)?;
        // One transfer and eight, alternated, so that both kinds share
        // whatever else the machine does meanwhile: one run of either
        // moves with it, the median of a few much less.
        let (mut one_flow, mut eight) = (Vec::new(), Vec::new());
        for _ in 0..a.runs.max(1) {
            let (r, k) = timeouts_over(&tb, || striped(&exe, &tb, n, &payload, &cfg, None, 1))?;
            one_flow.push(Run::of(&r.report, k));
            let (r, k) = timeouts_over(&tb, || striped(&exe, &tb, n, &payload, &cfg, None, 8))?;
            eight.push(Run::of(&r.report, k));
        }
        let (mbs, many) = (median_rate(&one_flow), median_rate(&eight));
        if n == 1 {
            one = mbs;
        }
        let (k1, k8) = if iperf {
            tb.kernel_ecmp().map_err(anyhow::Error::msg)?;
            (
                kernel(&tb, 1, a.seconds).ok(),
                kernel(&tb, 8, a.seconds).ok(),
            )
        } else {
            (None, None)
        };
        let cp = files_through(&exe, &tb, n, a.mib, a.dir.as_deref())?;
        rows.push(Row {
            gateways: n,
            macrolink: mbs,
            ratio_to_n_links: mbs / (n as f64 * one),
            macrolink_8_flows: many,
            ratio_8_flows: many / (n as f64 * one),
            held: [Held::over(&one_flow), Held::over(&eight)],
            macrolink_runs: one_flow,
            macrolink_8_flows_runs: eight,
            kernel_1_flow: k1,
            kernel_8_flows: k8,
            cp_up: cp.up,
            cp_down: cp.down,
            ratio_cp_up: cp.up / (n as f64 * one),
            cp_up_direct: cp.up_direct,
            ratio_cp_up_direct: cp.up_direct / (n as f64 * one),
            ratio_cp_down: cp.down / (n as f64 * one),
            cp_down_cached: cp.down_cached,
            ratio_cp_down_cached: cp.down_cached / (n as f64 * one),
            cp_down_direct: cp.down_direct,
            ratio_cp_down_direct: cp.down_direct / (n as f64 * one),
            cp_down_null: cp.down_null,
            ratio_cp_down_null: cp.down_null / (n as f64 * one),
            fs_write: cp.fs_write,
            fs_write_uncached: cp.fs_write_uncached,
            cp_held: cp.held.clone(),
            cp_tcp_timeouts: cp.tcp_timeouts,
        });
    }
    let f = |v: Option<f64>| v.map_or("n.a.".to_string(), |x| format!("{x:.1}"));
    println!(
        "storage-side links: {} each; one striped transfer of {} MiB; macrolink: the median \
         of {} runs of each, alternated, and the range of each run's / (N x one)",
        a.rate,
        a.mib,
        a.runs.max(1)
    );
    println!(
        "{:>8} {:>14} {:>12} {:>10} {:>17} {:>12} {:>10} {:>14} {:>15}",
        "gateways",
        "macrolink MB/s",
        "/ (N x one)",
        "range",
        "macrolink 8 flows",
        "/ (N x one)",
        "range",
        "kernel 1 flow",
        "kernel 8 flows",
    );
    for r in &rows {
        let range = |runs: &[Run]| {
            let to_n = |mbs: f64| mbs / (r.gateways as f64 * one);
            let lo = lowest_rate(runs).unwrap_or(0.0);
            let hi = runs.iter().map(|r| r.mb_per_s).fold(0.0, f64::max);
            format!("{:.2}-{:.2}", to_n(lo), to_n(hi))
        };
        println!(
            "{:>8} {:>14.1} {:>12.2} {:>10} {:>17.1} {:>12.2} {:>10} {:>14} {:>15}",
            r.gateways,
            r.macrolink,
            r.ratio_to_n_links,
            range(&r.macrolink_runs),
            r.macrolink_8_flows,
            r.ratio_8_flows,
            range(&r.macrolink_8_flows_runs),
            f(r.kernel_1_flow),
            f(r.kernel_8_flows),
        );
    }
    println!(
        "what held the striped transfers back: chunks sent again / gateways taken out of use \
         (each summed over the runs and the transfers) / longest stall of any; rto: the \
         testbed's kernels' TCP retransmission timeouts meanwhile, summed:"
    );
    println!(
        "{:>8} {:>24} {:>6} {:>24} {:>6}",
        "gateways", "one transfer", "rto", "8 transfers", "rto"
    );
    for r in &rows {
        let h = |h: &Held| {
            format!(
                "{} / {} / {:.1} ms",
                h.resent, h.failovers, h.longest_stall_ms
            )
        };
        println!(
            "{:>8} {:>24} {:>6} {:>24} {:>6}",
            r.gateways,
            h(&r.held[0]),
            r.held[0].tcp_timeouts,
            h(&r.held[1]),
            r.held[1].tcp_timeouts
        );
    }
    println!("cp of the same file through the lane, MB/s and / (N x one):");
    let cols = &CP_COLUMNS;
    println!(
        "{:>8} {:>13} {:>13} {:>13} {:>13} {:>13} {:>14} {:>9} {:>9}",
        "gateways", cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], "fs write", "uncached"
    );
    for r in &rows {
        let c = |mbs: f64, ratio: f64| format!("{mbs:.1} {ratio:.2}");
        println!(
            "{:>8} {:>13} {:>13} {:>13} {:>13} {:>13} {:>14} {:>9.1} {:>9.1}",
            r.gateways,
            c(r.cp_up, r.ratio_cp_up),
            c(r.cp_up_direct, r.ratio_cp_up_direct),
            c(r.cp_down, r.ratio_cp_down),
            c(r.cp_down_cached, r.ratio_cp_down_cached),
            c(r.cp_down_direct, r.ratio_cp_down_direct),
            c(r.cp_down_null, r.ratio_cp_down_null),
            r.fs_write,
            r.fs_write_uncached,
        );
    }
    println!(
        "what held each copy back, as cp saw it (up: its chunks sent again / times it took a \
         gateway out of use / longest time without an acknowledgement; down: chunks that came \
         twice / longest time between two chunks placed):"
    );
    let header = || {
        println!(
            "{:>8} {:>18} {:>18} {:>13} {:>13} {:>13} {:>14}",
            "gateways", cols[0], cols[1], cols[2], cols[3], cols[4], cols[5]
        )
    };
    header();
    for r in &rows {
        let h: Vec<String> = r.cp_held.iter().map(|h| terse(h)).collect();
        println!(
            "{:>8} {:>18} {:>18} {:>13} {:>13} {:>13} {:>14}",
            r.gateways, h[0], h[1], h[2], h[3], h[4], h[5]
        );
    }
    println!("the testbed's kernels' TCP retransmission timeouts during each copy:");
    header();
    for r in &rows {
        let t = &r.cp_tcp_timeouts;
        println!(
            "{:>8} {:>18} {:>18} {:>13} {:>13} {:>13} {:>14}",
            r.gateways, t[0], t[1], t[2], t[3], t[4], t[5]
        );
    }
    println!(
        "one: macrolink's striped figure through one gateway (the median run). macrolink: one \
         striped transfer over every gateway, and 8 at once; kernel ECMP: iperf3 with 1 and with 8 flows (blocking \
         sockets), hashed over the same links; cp: macrolink cp, one file with its default 2 \
         streams, through the lane's relays to the file service on the storage host (contact by \
         IP routes). None of these has a peer in the same regime here: the kernel columns show \
         what the links carry, not a like-for-like copy."
    );
    let files = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let pages = if crate::balloon::reports_free_pages() {
        "this machine's balloon device reports free memory to its host (virtio-balloon free \
         page reporting): the host takes freed pages back within seconds, and the first write \
         to each new page-cache page waits for the host to fault it in, at a pace that moves \
         from minute to minute; a copy that keeps its pages cached pays the same, so it may run \
         somewhat below or above this one write"
    } else {
        "a copy that keeps its pages cached runs at most about this fast"
    };
    println!(
        "cp's files live in {} ({}); up and down: as cp and the server write by default, the \
         first {} MiB of a file through the page cache and the rest uncached (RWF_DONTCACHE: \
         written back at once and its pages freed, so that they serve again); --cache: every \
         page kept cached, as an ordinary write; --direct: written past the page cache \
         (O_DIRECT), by the server up, by cp down; /dev/null: the download into nothing, what \
         the lane and cp carry with no file system on the client. fs write: the same bytes \
         written from memory to a new file beside them in 1 MiB writes by one thread, after the \
         copies, with no network, through the page cache: what the file system and the \
         machine's supply of new pages give one writer; {pages}; uncached: the same, written as \
         cp writes by default (--dir puts the files elsewhere). Each copy and each write start \
         after a sync, with the file system idle; each download reads a file the storage host \
         holds in its page cache, as each upload reads one cp's host holds.",
        files.display(),
        fs_type(&files),
        macrolink_files::uncached::HEAD >> 20,
    );
    eprintln!("bonding ...");
    println!(
        "bonding: one gateway with 1 and with 2 storage-side links of {} each",
        a.rate
    );
    let mut single = 0.0;
    for links in 1..=2 {
        let tb = Testbed::with_links(1, links, &a.rate).map_err(anyhow::Error::msg)?;
        let r = striped(&exe, &tb, 1, &payload, &cfg, None, 1)?.report;
        let mbs = r.bytes as f64 / r.secs / 1e6;
        if links == 1 {
            single = mbs;
        }
        println!(
            "  {links} link(s): {mbs:>7.1} MB/s  ({:.0}% of one link)",
            100.0 * mbs / single
        );
    }
    eprintln!("failover ...");
    let faults = [
        ("killed (SIGKILL)", Fault::KillGateway(0.5)),
        ("frozen (SIGSTOP)", Fault::FreezeGateway(0.5)),
    ];
    for (what, fault) in faults {
        let tb = Testbed::new(2, &a.rate).map_err(anyhow::Error::msg)?;
        let run = striped(&exe, &tb, 2, &payload, &cfg, Some(fault), 1)?;
        let r = &run.report;
        let found = run
            .found_after(0)
            .map_or("never".to_string(), |s| format!("after {:.0} ms", s * 1e3));
        println!(
            "failover: 2 gateways, one {what} halfway: {:.1} MB/s overall, \
             taken out of use {found}, longest stall {:.1} ms, {} chunks sent again, hash verified",
            r.bytes as f64 / r.secs / 1e6,
            r.longest_stall * 1e3,
            r.resent
        );
    }
    if let Some(p) = &a.json {
        crate::report::write_json(p, &rows)?;
    }
    if let Some(p) = &a.plot {
        plot(p, &rows, one, &a.rate)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use macrolink_files::copy::CopyReport;
    use macrolink_files::lane::Carried;
    use std::time::Duration;

    #[test]
    fn a_cell_is_its_median_run_and_holds_what_held_any_run() {
        let run = |bytes: u64, secs: f64, resent: u64, stall: f64, timeouts: u64| {
            let r = SendReport {
                bytes,
                secs,
                resent,
                failovers: resent / 2,
                longest_stall: stall,
                ..SendReport::default()
            };
            Run::of(&r, timeouts)
        };
        // A run that dips, with a stall and chunks sent again, among two
        // that do not.
        let runs = [
            run(300_000_000, 1.0, 0, 0.020, 0),
            run(300_000_000, 1.5, 4, 0.400, 3),
            run(310_000_000, 1.0, 0, 0.010, 1),
        ];
        assert_eq!(runs.each_ref().map(|r| r.mb_per_s), [300.0, 200.0, 310.0]);
        assert_eq!(median_rate(&runs), 300.0);
        assert_eq!(lowest_rate(&runs), Some(200.0));
        // The dip keeps what held it back in its own run...
        assert_eq!(runs[1].held.resent, 4);
        assert_eq!(runs[1].held.longest_stall_ms, 400.0);
        // ... and the cell says it too.
        let h = Held::over(&runs);
        assert_eq!((h.resent, h.failovers, h.tcp_timeouts), (4, 2, 4));
        assert_eq!(h.longest_stall_ms, 400.0);
        // Of two, the mean of both; of none, nothing.
        assert_eq!(median_rate(&runs[..2]), 250.0);
        assert_eq!((median_rate(&[]), lowest_rate(&[])), (0.0, None));
    }

    #[test]
    fn the_tables_read_what_cp_prints() {
        for sender in [true, false] {
            let report = CopyReport {
                files: 1,
                bytes: 4 << 20,
                secs: 0.5,
                through: vec![(21, 3), (22, 2)],
                held: Some(Carried {
                    sender,
                    resent: 3,
                    duplicates: 2,
                    failovers: 1,
                    longest_stall: Duration::from_micros(1_035_000),
                    ..Carried::default()
                }),
                ..CopyReport::default()
            };
            let Copied { rate, per, held } = copied(&format!("copying ...\n{report}\n")).unwrap();
            assert!((rate - 8.4).abs() < 1e-9, "{rate}");
            assert_eq!(per, [(21, 3), (22, 2)]);
            let want = if sender {
                "3 / 1 / 1035.0 ms"
            } else {
                "2 / 1035.0 ms"
            };
            assert_eq!(terse(&held), want, "{held}");
        }
        let none = copied("1 file, 5 bytes in 1.00 s (0.0 MB/s)").unwrap();
        assert_eq!(terse(&none.held), "n.a.");
    }
}
