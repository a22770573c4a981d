//! `macrolink bench`: the papers' tables, measured here.

use anyhow::{bail, Context};
use clap::{Args as ClapArgs, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use macrolink_bench::client::{BwSpec, Client};
use macrolink_bench::proto::Test;
use macrolink_bench::report::{self, BwRow};
use macrolink_bench::server::Server;
use macrolink_fabric::{Completion, Mode, Node, NodeConfig, Transport};
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::node_args::{CompletionArg, ModeArg, NodeArgs, TransportArg};

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Unidirectional bandwidth per message size, with CPU % of both sides.
    Bw(BwArgs),
    /// Latency: PingPong, PingPing, SendRecv, Exchange.
    Lat(LatArgs),
    /// One-way latency, with the clock offset estimate and its error bound.
    Oneway(OneArgs),
    /// DP-II latency breakdown: T_startup + T_send + T_net + T_delivery.
    Breakdown(OneArgs),
    /// Ours beside ucx_perftest, iperf3 and sockperf, with ratios.
    Compare(crate::compare::Args),
    /// Through 1..N gateways in network namespaces, beside kernel ECMP (root).
    Gateways(crate::gwbench::Args),
    /// `macrolink cp` beside xrdcp (xrootd) and cp, same files, same run.
    Files(crate::filebench::Args),
    /// The target side, for runs between two hosts (`--connect` on the other).
    Serve(ServeArgs),
}

/// Where the other side is.
#[derive(Debug, Clone, ClapArgs)]
pub struct Peer {
    /// The target runs elsewhere, started there with `--listen ADDR`.
    #[arg(long, conflicts_with = "listen")]
    connect: Option<SocketAddr>,
    /// Be the target of another host's runs, on this TCP address.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Write the rows as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the rows as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
}

#[derive(Debug, ClapArgs)]
pub struct BwArgs {
    #[command(flatten)]
    peer: Peer,
    /// Transports to measure.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "shm")]
    transport: Vec<TransportArg>,
    /// Modes to measure.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "reliable")]
    mode: Vec<ModeArg>,
    /// Completion of both sides.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "poll")]
    completion: Vec<CompletionArg>,
    /// Message sizes in bytes (default: the papers' rows, 10 B to 4 MB).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Puts in flight.
    #[arg(long, default_value_t = 16)]
    window: usize,
    /// Seconds per size (the count is picked from a warm-up run).
    #[arg(long, default_value_t = 0.3)]
    seconds: f64,
    /// Messages per size instead of a duration.
    #[arg(long)]
    count: Option<u64>,
    /// Draw MB/s over size as a PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Debug, ClapArgs)]
pub struct LatArgs {
    #[command(flatten)]
    peer: Peer,
    /// Patterns to run.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ping-pong")]
    pattern: Vec<Pattern>,
    /// Transports.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "shm")]
    transport: Vec<TransportArg>,
    /// Mode (datagram or reliable).
    #[arg(long, value_enum, default_value = "reliable")]
    mode: ModeArg,
    /// Completion of both sides.
    #[arg(long, value_enum, default_value = "poll")]
    completion: CompletionArg,
    /// Message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "8,1000,65536,1000000")]
    sizes: Vec<usize>,
    /// Iterations per size.
    #[arg(long, default_value_t = 2000)]
    count: u64,
}

#[derive(Debug, ClapArgs)]
pub struct OneArgs {
    #[command(flatten)]
    peer: Peer,
    /// Transports.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "shm,tcp")]
    transport: Vec<TransportArg>,
    /// Message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "1,1500")]
    sizes: Vec<usize>,
    /// Messages per size.
    #[arg(long, default_value_t = 2000)]
    count: u64,
}

#[derive(Debug, ClapArgs)]
pub struct ServeArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Exit when the parent process exits.
    #[arg(long)]
    exit_with_parent: bool,
}

/// IMB-style latency patterns.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Pattern {
    PingPong,
    PingPing,
    SendRecv,
    Exchange,
}

impl From<Pattern> for Test {
    fn from(p: Pattern) -> Test {
        match p {
            Pattern::PingPong => Test::PingPong,
            Pattern::PingPing => Test::PingPing,
            Pattern::SendRecv => Test::SendRecv,
            Pattern::Exchange => Test::Exchange,
        }
    }
}

/// A target this process started on this host, or one elsewhere.
#[derive(Debug)]
pub struct Session {
    child: Option<Child>,
    _node: Node,
    dir: Option<PathBuf>,
    pub client: Option<Client>,
}

impl Session {
    /// Starts a target (unless `connect` names one) and the initiator.
    pub fn open(connect: Option<SocketAddr>) -> anyhow::Result<Session> {
        let (child, dir, tcp) = match connect {
            Some(a) => (None, None, a),
            None => {
                let dir =
                    std::env::temp_dir().join(format!("macrolink-bench-{}", std::process::id()));
                std::fs::create_dir_all(&dir)?;
                let (child, tcp) = spawn_server(&dir)?;
                (Some(child), Some(dir), tcp)
            }
        };
        let mut cfg = NodeConfig::local(
            1,
            dir.clone()
                .unwrap_or_else(macrolink_fabric::default_shm_dir),
        );
        if connect.is_some() {
            cfg.shm_dir = None;
        }
        cfg.peers.insert(2, tcp);
        let node = Node::start(cfg)?;
        let client = Client::new(&node, 2)?;
        Ok(Session {
            child,
            _node: node,
            dir,
            client: Some(client),
        })
    }

    pub fn client(&mut self) -> &mut Client {
        self.client.as_mut().expect("client present until drop")
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            let _ = c.quit();
        }
        if let Some(mut ch) = self.child.take() {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = ch.try_wait() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let _ = ch.kill();
            let _ = ch.wait();
        }
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn spawn_server(dir: &Path) -> anyhow::Result<(Child, SocketAddr)> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "bench",
            "serve",
            "--exit-with-parent",
            "--node",
            "2",
            "--shm-dir",
        ])
        .arg(dir)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the benchmark target")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("target stdout")?).read_line(&mut line)?;
    let tcp = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("tcp="))
        .with_context(|| format!("target said {line:?}"))?
        .parse()?;
    Ok((child, tcp))
}

fn progress(total: u64) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

fn save<T: Serialize>(peer: &Peer, rows: &[T]) -> anyhow::Result<()> {
    if let Some(p) = &peer.json {
        report::write_json(p, rows).with_context(|| p.display().to_string())?;
    }
    if let Some(p) = &peer.csv {
        report::write_csv(p, rows).with_context(|| p.display().to_string())?;
    }
    Ok(())
}

/// `--listen`: serve another host's runs instead of running any here.
fn listening(peer: &Peer) -> Option<ServeArgs> {
    let addr = peer.listen?;
    Some(ServeArgs {
        node: NodeArgs {
            node: 2,
            shm_dir: None,
            tcp: addr,
            udp: addr.ip(),
            peers: Vec::new(),
            mtu: macrolink_fabric::DEFAULT_MTU,
        },
        exit_with_parent: false,
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let peer = match &args.command {
        BenchCommand::Bw(a) => Some(&a.peer),
        BenchCommand::Lat(a) => Some(&a.peer),
        BenchCommand::Oneway(a) | BenchCommand::Breakdown(a) => Some(&a.peer),
        _ => None,
    };
    if let Some(serve_args) = peer.and_then(listening) {
        return serve(serve_args);
    }
    match args.command {
        BenchCommand::Serve(a) => serve(a),
        BenchCommand::Bw(a) => {
            let rows = bw(&a)?;
            print!("{}", report::bw_table(&rows));
            save(&a.peer, &rows)?;
            if let Some(p) = &a.plot {
                macrolink_bench::plot::bandwidth_png(p, "macrolink bandwidth", &rows)?;
                println!("plot: {}", p.display());
            }
            Ok(())
        }
        BenchCommand::Lat(a) => {
            let mut s = Session::open(a.peer.connect)?;
            let pb = progress((a.pattern.len() * a.transport.len() * a.sizes.len()) as u64);
            let mut rows = Vec::new();
            for &p in &a.pattern {
                for &t in &a.transport {
                    for &size in &a.sizes {
                        pb.set_message(format!("{p:?} {t:?} {size} B"));
                        rows.push(s.client().latency(
                            p.into(),
                            t.into(),
                            a.mode.into(),
                            a.completion.into(),
                            size,
                            a.count,
                        )?);
                        pb.inc(1);
                    }
                }
            }
            pb.finish_and_clear();
            print!("{}", report::lat_table(&rows));
            save(&a.peer, &rows)
        }
        BenchCommand::Oneway(a) => {
            let mut s = Session::open(a.peer.connect)?;
            let mut rows = Vec::new();
            for &t in &a.transport {
                for &size in &a.sizes {
                    rows.push(s.client().oneway(t.into(), size, a.count)?);
                }
            }
            print!("{}", report::oneway_table(&rows));
            save(&a.peer, &rows)
        }
        BenchCommand::Breakdown(a) => {
            let mut s = Session::open(a.peer.connect)?;
            let mut rows = Vec::new();
            for &t in &a.transport {
                for &size in &a.sizes {
                    rows.push(s.client().breakdown(t.into(), size, a.count)?);
                }
            }
            print!("{}", report::breakdown_table(&rows));
            save(&a.peer, &rows)
        }
        BenchCommand::Compare(a) => crate::compare::run(a),
        BenchCommand::Gateways(a) => crate::gwbench::run(a),
        BenchCommand::Files(a) => crate::filebench::run(a),
    }
}

/// The bandwidth sweep itself (also used by `compare`).
pub fn bw(a: &BwArgs) -> anyhow::Result<Vec<BwRow>> {
    let sizes = if a.sizes.is_empty() {
        macrolink_bench::PAPER_SIZES.to_vec()
    } else {
        a.sizes.clone()
    };
    let mut s = Session::open(a.peer.connect)?;
    let mut plan = Vec::new();
    for &t in &a.transport {
        for &m in &a.mode {
            let (t, m): (Transport, Mode) = (t.into(), m.into());
            if t == Transport::Udp && m != Mode::Datagram {
                bail!("udp carries datagram mode only");
            }
            for &c in &a.completion {
                for &size in &sizes {
                    plan.push((t, m, Completion::from(c), size));
                }
            }
        }
    }
    let pb = progress(plan.len() as u64);
    let mut rows = Vec::new();
    for (transport, mode, completion, size) in plan {
        pb.set_message(format!("{transport} {mode} {size} B"));
        let mut spec = BwSpec {
            transport,
            mode,
            completion,
            size,
            count: 0,
            window: a.window,
        };
        spec.count = match a.count {
            Some(c) => c,
            None => s.client().calibrate(spec, a.seconds)?,
        };
        rows.push(s.client().bandwidth(spec)?);
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(rows)
}

fn serve(a: ServeArgs) -> anyhow::Result<()> {
    if a.exit_with_parent {
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    }
    let node = Node::start(a.node.config())?;
    let mut server = Server::new(&node, 4 << 20)?;
    println!(
        "ready node={} tcp={}",
        node.id(),
        node.tcp_addr().map(|a| a.to_string()).unwrap_or_default()
    );
    use std::io::Write as _;
    std::io::stdout().flush()?;
    server.serve()?;
    Ok(())
}

impl BwArgs {
    /// A sweep of the given shape with defaults elsewhere.
    pub fn new(
        transport: TransportArg,
        mode: ModeArg,
        completion: CompletionArg,
        sizes: Vec<usize>,
        seconds: f64,
    ) -> BwArgs {
        BwArgs {
            peer: Peer {
                connect: None,
                listen: None,
                json: None,
                csv: None,
            },
            transport: vec![transport],
            mode: vec![mode],
            completion: vec![completion],
            sizes,
            window: 16,
            seconds,
            count: None,
            plot: None,
        }
    }
}
