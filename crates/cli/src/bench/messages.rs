//! `macrolink bench bw`, `lat`, `oneway`, `breakdown` and `serve`: the
//! messaging tables, against a target this process starts or one on
//! another host.

use clap::Args as ClapArgs;
use macrolink_bench::client::Client;
use macrolink_bench::proto::Test;
use macrolink_bench::report;
use macrolink_bench::server::Server;
use macrolink_bench::session::{Session, TARGET_NODE};
use macrolink_bench::sweep;
use macrolink_fabric::{Completion, Mode, Node, Pages, Transport};
use macrolink_testbed::ready::Line;
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::args::{one_of, parse_secs, ChildArgs, NodeArgs};

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
    /// With --listen: serve runs over UCX too (as --transport ucx asks).
    #[arg(long, requires = "listen")]
    ucx: bool,
}

#[derive(Debug, ClapArgs)]
pub struct BwArgs {
    #[command(flatten)]
    peer: Peer,
    /// Transports to measure.
    #[arg(long, value_delimiter = ',', default_value = "shm", value_parser = one_of::<Transport>(Transport::NAMES))]
    transport: Vec<Transport>,
    /// Modes to measure.
    #[arg(long, value_delimiter = ',', default_value = "reliable", value_parser = one_of::<Mode>(Mode::NAMES))]
    mode: Vec<Mode>,
    /// Completion of both sides.
    #[arg(long, value_delimiter = ',', default_value = "poll", value_parser = one_of::<Completion>(Completion::NAMES))]
    completion: Vec<Completion>,
    /// Message sizes in bytes (default: the papers' rows, 10 B to 4 MB).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Puts in flight.
    #[arg(long, default_value_t = sweep::PUT_WINDOW)]
    window: usize,
    /// Seconds per size (the count is picked from a warm-up run).
    #[arg(long, default_value_t = 0.3)]
    seconds: f64,
    /// Messages per size instead of a duration.
    #[arg(long)]
    count: Option<u64>,
    /// Seconds of untimed traffic before each size's run (as iperf3's
    /// --omit).
    #[arg(long, value_parser = parse_secs)]
    warm: Option<f64>,
    /// Messages a second at most, so that a datagram stream does not
    /// outrun its receiver (default: as fast as they go).
    #[arg(long)]
    pace: Option<f64>,
    /// Draw MB/s over size as a PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Put into the JSON when the target's messages arrived (reliable
    /// runs; the host's monotonic clock, ns, and messages so far; 4,096 at
    /// most a row), to count runs made at once over their common span.
    #[arg(long, requires = "json")]
    arrivals: bool,
    /// The pages both sides' buffers lie on: huge asks for transparent
    /// huge pages, into which a large message placed over shared memory
    /// is copied about twice as fast.
    #[arg(long, default_value = "base", value_parser = one_of::<Pages>(Pages::NAMES))]
    pages: Pages,
}

#[derive(Debug, ClapArgs)]
pub struct LatArgs {
    #[command(flatten)]
    peer: Peer,
    /// Patterns to run.
    #[arg(long, value_delimiter = ',', default_value = "ping-pong", value_parser = one_of::<Test>(Test::PATTERNS))]
    pattern: Vec<Test>,
    /// Transports.
    #[arg(long, value_delimiter = ',', default_value = "shm", value_parser = one_of::<Transport>(Transport::NAMES))]
    transport: Vec<Transport>,
    /// Mode (datagram or reliable).
    #[arg(long, default_value = "reliable", value_parser = one_of::<Mode>(Mode::NAMES))]
    mode: Mode,
    /// Completion of both sides.
    #[arg(long, default_value = "poll", value_parser = one_of::<Completion>(Completion::NAMES))]
    completion: Completion,
    /// Message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "8,1000,65536,1000000")]
    sizes: Vec<usize>,
    /// Iterations per size.
    #[arg(long, default_value_t = 2000)]
    count: u64,
    /// Draw the median and the 99th percentile over size as a PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Debug, ClapArgs)]
pub struct OneArgs {
    #[command(flatten)]
    peer: Peer,
    /// Transports.
    #[arg(long, value_delimiter = ',', default_value = "shm,tcp", value_parser = one_of::<Transport>(Transport::NAMES))]
    transport: Vec<Transport>,
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
    #[command(flatten)]
    child: ChildArgs,
}

fn save<T: Serialize>(peer: &Peer, rows: &[T]) -> anyhow::Result<()> {
    Ok(report::save(
        peer.json.as_deref(),
        peer.csv.as_deref(),
        rows,
    )?)
}

/// `--listen`: serve another host's runs instead of running any here.
fn listening(peer: &Peer) -> Option<ServeArgs> {
    let addr = peer.listen?;
    Some(ServeArgs {
        node: NodeArgs {
            node: TARGET_NODE,
            shm_dir: None,
            tcp: addr,
            udp: addr.ip(),
            peers: Vec::new(),
            mtu: macrolink_fabric::DEFAULT_MTU,
            secret_file: None,
            ucx: crate::args::UcxArgs {
                ucx: peer.ucx,
                ucx_tls: None,
            },
        },
        child: ChildArgs {
            exit_with_parent: false,
        },
    })
}

/// Where the runs go: a target this process starts, or one elsewhere;
/// both with UCX when a run is over it.
fn session(peer: &Peer, transports: &[Transport]) -> anyhow::Result<Session> {
    let ucx = transports
        .contains(&Transport::Ucx)
        .then(macrolink_fabric::UcxOptions::default);
    Session::open_with(&std::env::current_exe()?, peer.connect, ucx.as_ref())
}

pub fn bw(a: BwArgs) -> anyhow::Result<()> {
    if let Some(s) = listening(&a.peer) {
        return serve(s);
    }
    let plan = sweep::Bandwidth {
        transports: a.transport.clone(),
        modes: a.mode.clone(),
        completions: a.completion.clone(),
        sizes: a.sizes.clone(),
        window: a.window,
        seconds: a.seconds,
        count: a.count,
        least: 0,
        pace: a.pace,
        warm: a.warm,
        arrivals: a.arrivals,
        pages: a.pages,
    };
    let mut rows = plan.run(session(&a.peer, &a.transport)?.client())?;
    print!("{}", report::bw_table(&rows));
    report::save(a.peer.json.as_deref(), None, &rows)?;
    rows.iter_mut().for_each(|r| r.arrivals.clear());
    report::save(None, a.peer.csv.as_deref(), &rows)?;
    if let Some(p) = &a.plot {
        macrolink_bench::plot::bandwidth_png(p, "macrolink bandwidth", &rows)?;
        println!("plot: {}", p.display());
    }
    Ok(())
}

pub fn lat(a: LatArgs) -> anyhow::Result<()> {
    if let Some(s) = listening(&a.peer) {
        return serve(s);
    }
    let plan = sweep::Latency {
        tests: a.pattern.clone(),
        transports: a.transport.clone(),
        mode: a.mode,
        completion: a.completion,
        sizes: a.sizes.clone(),
        count: a.count,
    };
    let rows = plan.run(session(&a.peer, &a.transport)?.client())?;
    print!("{}", report::lat_table(&rows));
    save(&a.peer, &rows)?;
    if let Some(p) = &a.plot {
        let title = "macrolink latency (ping-pong: half a round trip; others: one iteration)";
        macrolink_bench::plot::latency_png(p, title, &rows)?;
        println!("plot: {}", p.display());
    }
    Ok(())
}

/// A run per transport and size, its rows printed by `table`.
type PerSize<R> = fn(&mut Client, &[Transport], &[usize], u64) -> anyhow::Result<Vec<R>>;

fn per_size<R: Serialize>(
    a: OneArgs,
    run: PerSize<R>,
    table: fn(&[R]) -> String,
) -> anyhow::Result<()> {
    if let Some(s) = listening(&a.peer) {
        return serve(s);
    }
    let mut s = session(&a.peer, &a.transport)?;
    let rows = run(s.client(), &a.transport, &a.sizes, a.count)?;
    print!("{}", table(&rows));
    save(&a.peer, &rows)
}

pub fn oneway(a: OneArgs) -> anyhow::Result<()> {
    per_size(a, sweep::oneway, report::oneway_table)
}

pub fn breakdown(a: OneArgs) -> anyhow::Result<()> {
    per_size(a, sweep::breakdown, report::breakdown_table)
}

pub fn serve(a: ServeArgs) -> anyhow::Result<()> {
    a.child.apply();
    let node = Node::start(a.node.config()?)?;
    let mut server = Server::new(&node, 4 << 20)?;
    Line::node(node.id(), node.tcp_addr()).print()?;
    server.serve()?;
    Ok(())
}
