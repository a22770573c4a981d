//! `macrolink bench compare`: ours and the established tools in one run,
//! with the ratio of each figure.

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use macrolink_bench::client::BwSpec;
use macrolink_bench::proto::Test;
use macrolink_fabric::{Completion, Mode, Transport};
use serde::Serialize;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::Session;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Seconds per bandwidth figure.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Iterations per latency figure.
    #[arg(long, default_value_t = 20_000)]
    iterations: u64,
    /// Write the rows as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// One figure, ours beside the peer's.
#[derive(Debug, Serialize)]
pub struct Row {
    /// What is measured.
    pub figure: String,
    /// Unit of both figures.
    pub unit: &'static str,
    /// Our figure.
    pub ours: Option<f64>,
    /// The established tool and its figure.
    pub peer: String,
    /// Its figure.
    pub theirs: Option<f64>,
    /// ours / theirs.
    pub ratio: Option<f64>,
    /// What the ratio should be.
    pub target: String,
    /// Whether it is.
    pub met: Option<bool>,
}

enum Goal {
    AtMost(f64),
    AtLeast(f64),
    Info,
}

fn row(
    figure: &str,
    unit: &'static str,
    ours: Option<f64>,
    peer: &str,
    theirs: Option<f64>,
    goal: Goal,
) -> Row {
    let ratio = match (ours, theirs) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let (target, met) = match goal {
        Goal::AtMost(x) => (format!("<= {x}"), ratio.map(|r| r <= x)),
        Goal::AtLeast(x) => (format!(">= {x}"), ratio.map(|r| r >= x)),
        Goal::Info => ("-".into(), None),
    };
    Row {
        figure: figure.into(),
        unit,
        ours,
        peer: peer.into(),
        theirs,
        ratio,
        target,
        met,
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Which Debian package holds each tool.
const TOOLS: [(&str, &str); 3] = [
    ("ucx_perftest", "ucx-utils"),
    ("iperf3", "iperf3"),
    ("sockperf", "sockperf"),
];

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
        || Command::new(tool)
            .arg("-h")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
}

/// A peer server, killed when dropped.
#[derive(Debug)]
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn server(cmd: &mut Command) -> anyhow::Result<Server> {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting a peer server")?;
    // Give it time to listen.
    std::thread::sleep(Duration::from_millis(400));
    Ok(Server(child))
}

fn output(cmd: &mut Command, limit: Duration) -> anyhow::Result<String> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let start = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            bail!("{cmd:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// ucx_perftest's CSV line (`-f -v`): returns (median latency us, bandwidth MB/s in 10^6 B/s).
fn ucx(tls: &str, test: &str, size: usize, iters: u64) -> anyhow::Result<(f64, f64)> {
    let port = free_port()?.to_string();
    let _srv = server(
        Command::new("ucx_perftest")
            .args(["-p", &port])
            .env("UCX_TLS", tls),
    )?;
    let out = output(
        Command::new("ucx_perftest")
            .args([
                "127.0.0.1",
                "-p",
                &port,
                "-t",
                test,
                "-s",
                &size.to_string(),
            ])
            .args(["-n", &iters.to_string(), "-f", "-v"])
            .env("UCX_TLS", tls),
        Duration::from_secs(120),
    )?;
    parse_ucx(&out).with_context(|| format!("ucx_perftest said: {out}"))
}

/// Parses the figures line of `ucx_perftest -f -v`: iterations, median
/// latency, average latency, overall latency, average bandwidth (MiB/s), ...
pub fn parse_ucx(out: &str) -> Option<(f64, f64)> {
    let line = out.lines().rev().find(|l| {
        l.split(',').count() >= 6 && l.split(',').all(|f| f.trim().parse::<f64>().is_ok())
    })?;
    let f: Vec<f64> = line
        .split(',')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    Some((f[1], f[4] * 1.048_576))
}

/// iperf3's received rate in 10^6 B/s, one stream.
fn iperf3(secs: f64) -> anyhow::Result<f64> {
    let port = free_port()?.to_string();
    let _srv = server(Command::new("iperf3").args(["-s", "-1", "-p", &port]))?;
    let out = output(
        Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port, "-J", "-t"])
            .arg(format!("{}", secs.ceil().max(1.0))),
        Duration::from_secs(60),
    )?;
    let v: serde_json::Value = serde_json::from_str(&out).context("iperf3 JSON")?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 8e6)
        .context("iperf3: no received rate")
}

/// sockperf ping-pong median latency (half round trip) in microseconds.
fn sockperf(udp: bool, size: usize, secs: f64) -> anyhow::Result<f64> {
    let port = free_port()?.to_string();
    let proto: &[&str] = if udp { &[] } else { &["--tcp"] };
    let _srv = server(Command::new("sockperf").arg("sr").args(proto).args([
        "-i",
        "127.0.0.1",
        "-p",
        &port,
    ]))?;
    let out = output(
        Command::new("sockperf")
            .arg("pp")
            .args(proto)
            .args([
                "-i",
                "127.0.0.1",
                "-p",
                &port,
                "-m",
                &size.to_string(),
                "-t",
            ])
            .arg(format!("{}", secs.ceil().max(1.0))),
        Duration::from_secs(60),
    )?;
    parse_sockperf(&out).with_context(|| format!("sockperf said: {out}"))
}

/// The 50th percentile line of sockperf's report.
pub fn parse_sockperf(out: &str) -> Option<f64> {
    out.lines()
        .find(|l| l.contains("percentile 50.000"))
        .and_then(|l| l.rsplit('=').next())
        .and_then(|v| v.trim().parse().ok())
}

/// Single-core memcpy rate of `size`-byte copies, 10^6 B/s.
fn memcpy_rate(size: usize, secs: f64) -> f64 {
    let src = vec![1u8; size];
    let mut dst = vec![0u8; size];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs || n == 0 {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        n += 1;
    }
    (n * size as u64) as f64 / start.elapsed().as_secs_f64() / 1e6
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(t, _)| !have(t))
        .map(|(_, p)| *p)
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "peers missing: install them with `apt-get install {}`; their rows show n.a.",
            missing.join(" ")
        );
    }
    let has = |t: &str| have(t);
    let mut s = Session::open(None)?;
    let mut rows = Vec::new();
    let n = a.iterations;
    let secs = a.seconds;
    let lat = |s: &mut Session, t, m, size| -> anyhow::Result<f64> {
        Ok(s.client()
            .latency(Test::PingPong, t, m, Completion::Poll, size, n)?
            .usec
            .median)
    };
    let bw = |s: &mut Session, t, m, c, size| -> anyhow::Result<macrolink_bench::report::BwRow> {
        let mut spec = BwSpec {
            transport: t,
            mode: m,
            completion: c,
            size,
            count: 0,
            window: 16,
        };
        spec.count = s.client().calibrate(spec, secs)?;
        Ok(s.client().bandwidth(spec)?)
    };
    let opt = |r: anyhow::Result<f64>| match r {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("peer run failed: {e:#}");
            None
        }
    };

    eprintln!("shm latency ...");
    // Sub-microsecond figures move with where the scheduler puts the two
    // processes: best median of three runs each, interleaved.
    let (mut ours, mut theirs) = (f64::MAX, None::<f64>);
    for _ in 0..3 {
        ours = ours.min(lat(&mut s, Transport::Shm, Mode::Reliable, 8)?);
        if has("ucx_perftest") {
            if let Some(v) = opt(ucx("posix,self", "tag_lat", 8, n * 5).map(|x| x.0)) {
                theirs = Some(theirs.map_or(v, |t| t.min(v)));
            }
        }
    }
    rows.push(row(
        "shm 8 B ping-pong, half round trip, polling",
        "us",
        Some(ours),
        "ucx_perftest tag_lat (posix), best of 3",
        theirs,
        Goal::AtMost(1.0),
    ));

    for size in [1_000_000usize, 4_000_000] {
        eprintln!("shm put {size} B ...");
        let ours = bw(&mut s, Transport::Shm, Mode::Put, Completion::Poll, size)?.mb_per_s;
        let iters = (secs * 20_000_000_000.0 / size as f64) as u64;
        let theirs = has("ucx_perftest")
            .then(|| opt(ucx("posix,cma,self", "ucp_put_bw", size, iters.max(100)).map(|x| x.1)))
            .flatten();
        rows.push(row(
            &format!("shm put {size} B"),
            "MB/s",
            ours,
            "ucx_perftest ucp_put_bw (posix,cma)",
            theirs,
            Goal::AtLeast(0.9),
        ));
        let mc = memcpy_rate(size, secs.min(1.0));
        rows.push(row(
            &format!("shm put {size} B"),
            "MB/s",
            ours,
            "single-core memcpy",
            Some(mc),
            Goal::Info,
        ));
    }

    eprintln!("tcp bandwidth ...");
    let ip = has("iperf3").then(|| opt(iperf3(secs * 2.0))).flatten();
    for size in [1_000_000usize, 4_000_000] {
        let ours = bw(
            &mut s,
            Transport::Tcp,
            Mode::Reliable,
            Completion::Poll,
            size,
        )?
        .mb_per_s;
        rows.push(row(
            &format!("tcp reliable {size} B"),
            "MB/s",
            ours,
            "iperf3, one stream",
            ip,
            Goal::AtLeast(1.0),
        ));
    }
    if has("ucx_perftest") {
        let ours = bw(
            &mut s,
            Transport::Tcp,
            Mode::Reliable,
            Completion::Poll,
            1_000_000,
        )?
        .mb_per_s;
        let theirs =
            opt(ucx("tcp", "tag_bw", 1_000_000, (secs * 4000.0) as u64 + 100).map(|x| x.1));
        rows.push(row(
            "tcp reliable 1000000 B",
            "MB/s",
            ours,
            "ucx_perftest tag_bw (tcp)",
            theirs,
            Goal::Info,
        ));
        let ours = lat(&mut s, Transport::Tcp, Mode::Reliable, 8)?;
        let theirs = opt(ucx("tcp", "tag_lat", 8, n).map(|x| x.0));
        rows.push(row(
            "tcp 8 B ping-pong, half round trip",
            "us",
            Some(ours),
            "ucx_perftest tag_lat (tcp)",
            theirs,
            Goal::Info,
        ));
    }

    eprintln!("tcp and udp latency ...");
    let ours = lat(&mut s, Transport::Tcp, Mode::Reliable, 64)?;
    let theirs = has("sockperf")
        .then(|| opt(sockperf(false, 64, secs * 2.0)))
        .flatten();
    rows.push(row(
        "tcp 64 B ping-pong, half round trip",
        "us",
        Some(ours),
        "sockperf pp --tcp (median)",
        theirs,
        Goal::AtMost(1.1),
    ));
    let ours = lat(&mut s, Transport::Udp, Mode::Datagram, 64)?;
    let theirs = has("sockperf")
        .then(|| opt(sockperf(true, 64, secs * 2.0)))
        .flatten();
    rows.push(row(
        "udp 64 B ping-pong, half round trip",
        "us",
        Some(ours),
        "sockperf pp (udp, median)",
        theirs,
        Goal::AtMost(1.1),
    ));

    eprintln!("wait-mode CPU ...");
    for (t, m) in [
        (Transport::Shm, Mode::Put),
        (Transport::Shm, Mode::Reliable),
        (Transport::Tcp, Mode::Put),
        (Transport::Tcp, Mode::Reliable),
    ] {
        let r = bw(&mut s, t, m, Completion::Wait, 1_000_000)?;
        rows.push(row(
            &format!("{t} {m} 1 MB, waiting target CPU"),
            "%",
            r.cpu_target,
            "10% (papers' event-driven column)",
            Some(10.0),
            Goal::AtMost(1.0),
        ));
    }
    drop(s);

    println!(
        "{:<46} {:>5} {:>10}  {:<38} {:>10} {:>7} {:>6} {:>4}",
        "figure", "unit", "ours", "beside", "theirs", "ratio", "target", "met"
    );
    let f = |v: Option<f64>, p: usize| v.map_or("n.a.".into(), |x| format!("{x:.p$}"));
    for r in &rows {
        println!(
            "{:<46} {:>5} {:>10}  {:<38} {:>10} {:>7} {:>6} {:>4}",
            r.figure,
            r.unit,
            f(r.ours, 2),
            r.peer,
            f(r.theirs, 2),
            f(r.ratio, 2),
            r.target,
            match r.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "",
            }
        );
    }
    if let Some(p) = &a.json {
        macrolink_bench::report::write_json(p, &rows)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_outputs_parse() {
        let u = "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n100000,0.479,0.476,0.476,16.03,16.03,2100508,2100508\n";
        let (lat, bw) = parse_ucx(u).unwrap();
        assert_eq!(lat, 0.479);
        assert!((bw - 16.03 * 1.048_576).abs() < 1e-9);
        let s = "sockperf: ---> percentile 75.000 =   11.276\nsockperf: ---> percentile 50.000 =   10.313\n";
        assert_eq!(parse_sockperf(s), Some(10.313));
        assert_eq!(parse_sockperf("nothing"), None);
        assert_eq!(parse_ucx("a,b\n"), None);
    }
}
