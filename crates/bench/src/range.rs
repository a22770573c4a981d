//! `macrolink bench range`: the Longbow paper's measurements in shape, on a
//! link emulated by `macrolink link` between two namespaces. For each
//! distance (and loss, and relay window) every contender moves data across
//! the same link in the same run: macrolink straight over the long link
//! (tcp transport), macrolink through the pair of relays, and iperf3 with
//! cubic and with bbr, each with one stream and with several.
//!
//! ```text
//!  ns A: bench bw / iperf3 -c ─► relay A ═╗            ╔═ relay B ─► bench serve (127.0.0.1)
//!                     └──────────────── TUN ══ macrolink link ══ TUN ──► bench serve, iperf3 -s (10.77.0.2)
//! ```
//!
//! Like with like: every contender is a TCP byte stream (macrolink's
//! reliable mode, waiting completion, 4 MiB messages), one or N streams,
//! over the one link; the relays' long hop is their own protocol on UDP,
//! which is the point of them.
//!
//! Beside the throughput: [`latency()`], the IMB patterns through the relays
//! and straight over the link at each distance, and [`accuracy()`], the
//! emulator itself checked against what it is asked.

use anyhow::{bail, Context};
use macrolink_testbed::netns::Namespaces;
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use crate::peers::{self, iperf3};

pub mod accuracy;
pub mod latency;
pub use accuracy::{acc_line, accuracy, AccRow, Bound, ACC_HEADER};
pub use latency::{
    fit_line, lat_line, latency, latency_fit, paper_line, LatFit, LatRow, FIT_HEADER, LAT_HEADER,
};

/// End A's address on the emulated link, and end B's.
const A_ADDR: &str = "10.77.0.1";
const B_ADDR: &str = "10.77.0.2";
/// Far nodes' ports behind relay B; direct targets' ports on B's device.
const FAR_PORT: u16 = 7600;
/// Relay A's port for the first far node (its `fabric` port).
const RELAY_PORT: u16 = 7640;
const DIRECT_PORT: u16 = 7700;
const IPERF_PORT: u16 = 5301;
/// One-way delay of a kilometre of fibre, µs.
pub const US_PER_KM: f64 = 5.0;
/// What a pair of Longbows adds to a PingPong of 1 byte, µs (the paper's
/// 9.9 less 4.0, over 3 m of fibre).
pub const PAPER_PAIR_US: f64 = 5.9;
/// One Longbow from its InfiniBand port to its optical port, µs: the
/// paper's quarter of the pair's.
pub const PAPER_ONE_US: f64 = 1.48;
/// The paper's latency per km of its model: 8.2 µs predicted over 690 m
/// less the pair's 5.9 µs (fibre itself is [`US_PER_KM`], which the
/// emulator charges).
pub const PAPER_US_PER_KM: f64 = (8.2 - PAPER_PAIR_US) / 0.69;
/// The IMB patterns of the latency rows, in `bench lat`'s words.
pub const PATTERNS: &str = "ping-pong,ping-ping,send-recv,exchange";

/// Who moves the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Contender {
    /// macrolink through the relay pair.
    Relays,
    /// macrolink straight over the long link, tcp transport.
    Direct,
    /// iperf3, cubic.
    Cubic,
    /// iperf3, bbr.
    Bbr,
}

impl Contender {
    /// Every contender, in table order.
    pub const ALL: [Contender; 4] = [
        Contender::Relays,
        Contender::Direct,
        Contender::Cubic,
        Contender::Bbr,
    ];

    /// Its column name.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Relays => "macrolink via relays",
            Contender::Direct => "macrolink direct",
            Contender::Cubic => "iperf3 cubic",
            Contender::Bbr => "iperf3 bbr",
        }
    }
}

impl std::str::FromStr for Contender {
    type Err = String;

    fn from_str(s: &str) -> Result<Contender, String> {
        match s {
            "relays" => Ok(Contender::Relays),
            "direct" => Ok(Contender::Direct),
            "cubic" => Ok(Contender::Cubic),
            "bbr" => Ok(Contender::Bbr),
            _ => Err(format!("{s}: one of relays, direct, cubic, bbr")),
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The `macrolink` binary.
    pub exe: PathBuf,
    /// Distances, km of fibre.
    pub km: Vec<f64>,
    /// Streams of each contender (each figure once per count).
    pub streams: Vec<u32>,
    /// Link rate, in `macrolink link`'s words (`1gbit`).
    pub rate: String,
    /// Loss rates, in its words (`0.1%`; `gemodel 1% 10%` for bursts).
    pub loss: Vec<String>,
    /// The relays' window, KiB (`None`: measured).
    pub windows: Vec<Option<u64>>,
    /// Contenders to run.
    pub contenders: Vec<Contender>,
    /// Seconds per figure.
    pub seconds: u32,
    /// MTU of the link's devices.
    pub mtu: u32,
}

/// One figure.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// km of fibre.
    pub km: f64,
    /// Loss asked of the link.
    pub loss: String,
    /// The relays' window, KiB (measured when absent).
    pub window_kib: Option<u64>,
    /// Who.
    pub contender: Contender,
    /// Streams.
    pub streams: u32,
    /// 10^6 bytes per second received.
    pub mb_per_s: f64,
    /// Share of the link's rate.
    pub of_link: f64,
    /// Why the figure could not be had (its rate then reads 0): the sweep
    /// goes on with the next.
    pub error: Option<String>,
}

/// A child killed on drop.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a macrolink command in `ns` and waits for its ready line.
fn start(ns: &str, exe: &Path, args: &[&str], secret: &Path) -> anyhow::Result<Kill> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(exe)
        .args(args)
        .env("MACROLINK_SECRET_FILE", secret)
        .stdout(Stdio::piped());
    // Their own words only when a log level asks for them.
    if std::env::var_os("MACROLINK_LOG").is_none() {
        cmd.stderr(Stdio::null());
    }
    let mut child = Kill(cmd.spawn().context("starting macrolink")?);
    let out = child.0.stdout.take().context("stdout")?;
    let (first, _rest) = ready_line(out);
    match first.recv_timeout(READY_LIMIT) {
        Ok(Some(l)) if l.starts_with("ready") => Ok(child),
        Ok(_) | Err(RecvTimeoutError::Disconnected) => {
            bail!("macrolink {} exited before it was ready", args.join(" "))
        }
        Err(RecvTimeoutError::Timeout) => bail!(
            "macrolink {} was not ready within {READY_LIMIT:?}",
            args.join(" ")
        ),
    }
}

/// Reads `out` on a thread of its own: the first line that starts with
/// "ready" (or `None` when the output ends without one) is sent on the
/// first channel as it comes; every line after it is kept, and handed
/// back when the output ends. Reading goes on to the end, so that the
/// child never blocks on a full pipe.
fn ready_line(
    out: impl std::io::Read + Send + 'static,
) -> (
    Receiver<Option<String>>,
    std::thread::JoinHandle<Vec<String>>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let rest = std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines().map_while(Result::ok);
        let first = lines.find(|l| l.starts_with("ready"));
        let _ = tx.send(first);
        lines.collect()
    });
    (rx, rest)
}

/// The cluster file of the two segments: near hosts in A, `far` far nodes
/// in B (2, 3, ...), a relay in each.
fn cluster_file(far: u32, window_kib: Option<u64>, mtu: u32) -> String {
    let mut s = String::from(
        "[[host]]\nname = \"near\"\nrole = \"compute\"\nnode = 1\nfabric = \"127.0.0.1:7599\"\n",
    );
    for n in 0..far {
        s += &format!(
            "[[host]]\nname = \"far{n}\"\nrole = \"compute\"\nnode = {}\nfabric = \"127.0.0.1:{}\"\n",
            n + 2,
            FAR_PORT + n as u16
        );
    }
    s += &format!(
        "[[host]]\nname = \"relay-a\"\nrole = \"relay\"\nnode = 91\nfabric = \"127.0.0.1:{RELAY_PORT}\"\nlong = \"{A_ADDR}:7650\"\n\
         [[host]]\nname = \"relay-b\"\nrole = \"relay\"\nnode = 92\nfabric = \"127.0.0.1:7660\"\nlong = \"{B_ADDR}:7670\"\n\
         [[segment]]\nname = \"a\"\nhosts = [\"near\"]\nrelay = \"relay-a\"\n[[segment]]\nname = \"b\"\nhosts = [{}]\nrelay = \"relay-b\"\n\
         [range]\npacket = {}\n",
        (0..far).map(|n| format!("\"far{n}\"")).collect::<Vec<_>>().join(", "),
        mtu - 28,
    );
    if let Some(w) = window_kib {
        s += &format!("window_kib = {w}\n");
    }
    s
}

/// Bytes of each message `bench bw` sends.
const MESSAGE: u64 = 4 << 20;

/// The longest a throughput run of about `seconds` may take before it is
/// killed and its row says so: its warm-up, the run, and bench's own
/// patience for the target's report, with room for a link that carries
/// little (a run on one that carries nothing would otherwise wait as long
/// as TCP retries, which on a link losing bursts has been hours).
fn run_limit(seconds: u32) -> Duration {
    Duration::from_secs(3 * u64::from(seconds) + 90)
}

/// Seconds each contender sends before it is timed, whatever its streams:
/// slow start over (1 Gbit/s across 14,000 km opens its window in some ten
/// round trips, 1.4 s), iperf3's left out with `-O`, ours with
/// `bench bw --warm`. Before, our one stream was timed after its warm-up
/// runs and several of ours and iperf3 from their first byte.
const WARM_SECS: u32 = 2;

/// How long a started relay, target or link has to print its ready line.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// `macrolink bench bw` from ns A to each of `targets` at once: for each,
/// a `bench serve` started in ns B at its first address (a target serves
/// one run and quits), dialled at its second. Each sends the same count of
/// messages, about `seconds` at `rate` together; the figure is their bytes
/// over the span in which all of them were in their measured runs
/// ([`together`]).
fn bench_bw(
    e: &Ends<'_>,
    targets: Vec<(String, String)>,
    (seconds, rate): (u32, f64),
) -> anyhow::Result<f64> {
    let ([a, _], exe, secret, dir) = (e.ns, e.exe, e.secret, e.dir);
    // One stream: bench's own timing. Several: the same count each, about
    // `seconds` at `rate` together (the one-stream figure just measured),
    // and 16 at least, so that much remains when the span is trimmed
    // (their warm-ups can end a second or more apart).
    let count =
        (rate * f64::from(seconds) / MESSAGE as f64 / targets.len() as f64).max(16.0) as u64;
    let how = match targets.len() {
        1 => ["--seconds".to_string(), seconds.to_string()],
        _ => ["--count".to_string(), count.to_string()],
    };
    let _serves = (0..targets.len())
        .map(|i| target(e, &targets[i].0, &format!("shm-{i}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut cmds = Vec::new();
    let mut jsons = Vec::new();
    for (i, (_, t)) in targets.iter().enumerate() {
        let json = dir.join(format!("bw-{i}.json"));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", a])
            .arg(exe)
            .args(["bench", "bw", "--connect", t, "--transport", "tcp"])
            .args(["--mode", "reliable", "--completion", "wait"])
            .args(["--sizes", &MESSAGE.to_string()])
            .args(&how)
            .args(["--warm", &WARM_SECS.to_string()])
            .arg("--json")
            .arg(&json)
            .arg("--arrivals")
            .env("MACROLINK_SECRET_FILE", secret);
        cmds.push(cmd);
        jsons.push(json);
    }
    // Each ends after its seconds; all are waited for before any is
    // judged, and none longer than a run's bound.
    let outs = peers::outputs(cmds.iter_mut().collect(), run_limit(seconds + WARM_SECS))
        .context("bench bw (killed: the link carried too little to end the run)")?;
    let mut runs = Vec::new();
    for (out, json) in outs.into_iter().zip(jsons) {
        if !out.status.success() {
            bail!("bench bw: {}", String::from_utf8_lossy(&out.stderr));
        }
        let rows: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
        let row = &rows[0];
        let field = |k: &str| {
            row[k]
                .as_f64()
                .with_context(|| format!("{k} in bench bw's row"))
        };
        let arrivals = row["arrivals"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| Some((p[0].as_f64()?, p[1].as_f64()?)))
                    .collect()
            })
            .unwrap_or_default();
        runs.push(Run {
            bytes: field("bytes")?,
            seconds: field("seconds")?,
            message: MESSAGE as f64,
            arrivals,
        });
    }
    together(&runs)
}

/// One stream's measured run, as `bench bw` reports it.
struct Run {
    bytes: f64,
    seconds: f64,
    /// Bytes a message.
    message: f64,
    /// When its messages arrived at the target: (the host's monotonic
    /// clock in ns, messages so far).
    arrivals: Vec<(f64, f64)>,
}

impl Run {
    /// Messages arrived by `t` (ns), within its arrivals: each message's
    /// bytes taken to come evenly between the arrival before it and its own.
    fn by(&self, t: f64) -> f64 {
        let a = &self.arrivals;
        let i = a.partition_point(|p| p.0 <= t);
        match (i.checked_sub(1).map(|j| a[j]), a.get(i)) {
            (Some((t0, m0)), Some(&(t1, m1))) if t1 > t0 => m0 + (m1 - m0) * (t - t0) / (t1 - t0),
            (Some((_, m0)), _) => m0,
            (None, _) => 0.0,
        }
    }
}

/// MB/s of runs made at once. One run: its own bytes over its own time.
/// Several: their bytes over the span in which all of them were running
/// (from the last one's first arrival to the first one's last, trimmed to
/// whole messages of each, below), each read off its arrivals. Each stream
/// warms up on its own, so their measured runs start and end apart; over
/// the span from the first start to the last end the link also carried
/// warm-ups that are not counted (at 1,000 km and 200 Mbit/s for 1 s:
/// 0.90-0.93 of it with two streams, 0.86-0.88 with four), and over the
/// longest run's time alone it counted streams that each had the link to
/// themselves for part of theirs twice (1.31).
fn together(runs: &[Run]) -> anyhow::Result<f64> {
    match runs {
        [] => bail!("no stream ran"),
        [r] => return Ok(r.bytes / r.seconds.max(1e-9) / 1e6),
        _ => {}
    }
    if let Some(r) = runs.iter().find(|r| {
        r.arrivals
            .windows(2)
            .any(|w| !(w[0].0 <= w[1].0 && w[0].1 < w[1].1))
    }) {
        bail!(
            "a stream's arrivals are out of order ({} of them): not a run of bench bw",
            r.arrivals.len()
        );
    }
    let ends = runs
        .iter()
        .map(|r| Some((r.arrivals.first()?.0, r.arrivals.last()?.0)))
        .collect::<Option<Vec<_>>>()
        .context("a stream's run reported no arrivals")?;
    let all_in = ends.iter().map(|e| e.0).fold(f64::MIN, f64::max);
    let one_out = ends.iter().map(|e| e.1).fold(f64::MAX, f64::min);
    // A stream's share changes when another comes in or goes out, and a
    // message that arrived across that moment came unevenly: the span
    // starts at the latest of each stream's first arrival after all were
    // in, and ends at the earliest of each one's last arrival before one
    // went out, so that every stream is read off between arrivals that
    // all came while all were running.
    let from = runs
        .iter()
        .filter_map(|r| r.arrivals.iter().find(|a| a.0 > all_in).map(|a| a.0))
        .fold(all_in, f64::max);
    let to = runs
        .iter()
        .filter_map(|r| r.arrivals.iter().rev().find(|a| a.0 < one_out).map(|a| a.0))
        .fold(one_out, f64::min);
    // Too short to trim: the untrimmed span, which errs by part of a
    // message of each stream at its ends.
    let (from, to) = if to > from {
        (from, to)
    } else {
        (all_in, one_out)
    };
    if to <= from {
        bail!(
            "the streams' runs overlapped too little to count them together ({:.2} s of all at once); run longer (--seconds)",
            ((one_out - all_in) / 1e9).max(0.0)
        );
    }
    let bytes: f64 = runs
        .iter()
        .map(|r| (r.by(to) - r.by(from)) * r.message)
        .sum();
    Ok(bytes / ((to - from) / 1e9) / 1e6)
}

/// The link's rate in bytes per second, from `macrolink link`'s words.
fn rate_bytes(rate: &str) -> anyhow::Result<f64> {
    let spec: macrolink_linkemu::Spec =
        format!("rate {rate}").parse().map_err(anyhow::Error::msg)?;
    Ok(spec.rate.context("a rate")?.bytes_per_sec as f64)
}

/// Runs every case; prints each row as it comes.
pub fn run(o: &Options, mut each: impl FnMut(&Row)) -> anyhow::Result<Vec<Row>> {
    if !iperf3::TOOL.installed()
        && o.contenders
            .iter()
            .any(|c| matches!(c, Contender::Cubic | Contender::Bbr))
    {
        bail!(
            "iperf3 is not installed (apt-get install iperf3), or leave it out with --contenders"
        );
    }
    let link_rate = rate_bytes(&o.rate)?;
    let ns = Namespaces::new(2).map_err(anyhow::Error::msg)?;
    let (a, b) = (ns.names[0].as_str(), ns.names[1].as_str());
    let dir = macrolink_testbed::undo::scratch()?;
    let secret = dir.path().join("secret");
    std::fs::write(&secret, format!("{:032x}", rand_u128()))?;
    let most = o.streams.iter().copied().max().unwrap_or(1);
    let mut rows = Vec::new();
    for loss in &o.loss {
        for &km in &o.km {
            let _link = link(o, [a, b], km, loss)?;
            for &window in &o.windows {
                let cluster = dir.path().join("two.toml");
                std::fs::write(&cluster, cluster_file(most, window, o.mtu))?;
                let c = cluster.to_str().context("path")?;
                let relay = |ns, host| start(ns, &o.exe, &["relay", c, "--host", host], &secret);
                let _relays = [relay(a, "relay-a")?, relay(b, "relay-b")?];
                for &contender in &o.contenders {
                    if window.is_some() && contender != Contender::Relays {
                        continue;
                    }
                    let mut expect = link_rate;
                    for &streams in &o.streams {
                        let ends = Ends {
                            ns: [a, b],
                            exe: &o.exe,
                            secret: &secret,
                            dir: dir.path(),
                        };
                        let (mb_per_s, error) =
                            match figure(&ends, contender, streams, (o.seconds, expect)) {
                                Ok(v) => (v, None),
                                Err(e) => (0.0, Some(format!("{e:#}"))),
                            };
                        if streams == 1 && error.is_none() {
                            expect = (mb_per_s * 1e6).max(1e6);
                        }
                        let row = Row {
                            km,
                            loss: loss.clone(),
                            window_kib: window,
                            contender,
                            streams,
                            mb_per_s,
                            of_link: mb_per_s * 1e6 / link_rate,
                            error,
                        };
                        each(&row);
                        rows.push(row);
                    }
                }
            }
        }
    }
    Ok(rows)
}

/// `macrolink link` between `a` and `b`: `km` of fibre at the rate, behind
/// a queue of one round trip (the bandwidth-delay product; at least 5 ms,
/// what a well-sized router holds), with `loss`.
fn link(o: &Options, [a, b]: [&str; 2], km: f64, loss: &str) -> anyhow::Result<Link> {
    let one_way_us = km * US_PER_KM;
    let queue_ms = (2.0 * one_way_us / 1000.0).max(5.0);
    let mut spec = format!("delay {one_way_us}us rate {} queue {queue_ms}ms", o.rate);
    if loss != "0" && loss != "0%" {
        spec += &format!(" loss {loss}");
    }
    Link::start(&o.exe, [a, b], o.mtu, &[], &spec)
}

/// `macrolink link` between the two namespaces, stopped on drop.
struct Link {
    child: Kill,
    /// What it prints after its ready line, read until it exits.
    said: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl Link {
    /// Starts it at `mtu` with `flags` (`--json`, `--one-way`) and `spec`,
    /// in its words; returns once its devices are up.
    fn start(
        exe: &Path,
        [a, b]: [&str; 2],
        mtu: u32,
        flags: &[&str],
        spec: &str,
    ) -> anyhow::Result<Link> {
        let mtu = mtu.to_string();
        let mut cmd = Command::new(exe);
        cmd.args(["link", "--mtu", &mtu])
            .args(flags)
            .args([a, b])
            .args(spec.split_whitespace())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = Kill(cmd.spawn()?);
        let out = child.0.stdout.take().context("link stdout")?;
        let (first, said) = ready_line(out);
        match first.recv_timeout(READY_LIMIT) {
            Ok(Some(_)) => {}
            Ok(None) | Err(RecvTimeoutError::Disconnected) => {
                bail!("macrolink link {spec}: exited before it was ready")
            }
            Err(RecvTimeoutError::Timeout) => {
                bail!("macrolink link {spec}: not ready within {READY_LIMIT:?}")
            }
        }
        Ok(Link {
            child,
            said: Some(said),
        })
    }

    /// Stops it (SIGTERM) and returns the counters it prints as it ends
    /// (started with `--json`): `a_to_b` and `b_to_a`.
    fn counters(mut self) -> anyhow::Result<serde_json::Value> {
        let pid = rustix::process::Pid::from_child(&self.child.0);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
        let said = self
            .said
            .take()
            .context("the link's output")?
            .join()
            .map_err(|_| anyhow::anyhow!("reading the link's output failed"))?;
        let last = said.last().context("macrolink link printed no counters")?;
        Ok(serde_json::from_str(last)?)
    }
}

/// A `bench serve` in ns B at `at`. Every target is node 2 to its client
/// (bench's protocol); each meets no other in shared memory (`shm`, a
/// directory of its own).
fn target(e: &Ends<'_>, at: &str, shm: &str) -> anyhow::Result<Kill> {
    let shm = e.dir.join(shm);
    std::fs::create_dir_all(&shm)?;
    let shm = shm.display().to_string();
    // Its datagrams on the address it is dialled at.
    let ip = at.rsplit_once(':').map_or(at, |(ip, _)| ip);
    let args = [
        "bench",
        "serve",
        "--node",
        "2",
        "--tcp",
        at,
        "--udp",
        ip,
        "--shm-dir",
        &shm,
    ];
    start(e.ns[1], e.exe, &args, e.secret)
}

/// `macrolink bench ARGS` from ns A against a target started in ns B at
/// `at`, dialled at `dial`, killed past `limit`: the rows it wrote.
fn bench_rows(
    e: &Ends<'_>,
    (at, dial): (&str, &str),
    args: &[&str],
    limit: Duration,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let _serve = target(e, at, "shm-one")?;
    let json = e.dir.join("one.json");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", e.ns[0]])
        .arg(e.exe)
        .arg("bench")
        .args(args)
        .args(["--connect", dial, "--json"])
        .arg(&json)
        .env("MACROLINK_SECRET_FILE", e.secret);
    let out = peers::outputs(vec![&mut cmd], limit)
        .with_context(|| format!("bench {}", args.join(" ")))?
        .remove(0);
    if !out.status.success() {
        bail!(
            "bench {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_str(&std::fs::read_to_string(&json)?)?)
}

/// `macrolink bench lat` from ns A (8 B messages, tcp, waiting
/// completion, `count` times each of `patterns`, in its words) to a target
/// started in ns B at `at`, dialled at `dial`: each pattern with its
/// median, mean and p99, µs.
fn bench_lat(
    e: &Ends<'_>,
    (at, dial): (&str, &str),
    count: u32,
    patterns: &str,
) -> anyhow::Result<Vec<(String, [f64; 3])>> {
    // bench lat's own bound on each pattern (a minute and 100 us an
    // iteration), and half a minute to start and end.
    let each = Duration::from_secs(60) + Duration::from_micros(u64::from(count) * 100);
    let limit = each * patterns.split(',').count() as u32 + Duration::from_secs(30);
    let count = count.to_string();
    let args = [
        "lat",
        "--transport",
        "tcp",
        "--completion",
        "wait",
        "--sizes",
        "8",
        "--count",
        &count,
        "--pattern",
        patterns,
    ];
    bench_rows(e, (at, dial), &args, limit)?
        .iter()
        .map(|r| {
            let get = |k: &str| {
                r["usec"][k]
                    .as_f64()
                    .context("a latency in bench lat's row")
            };
            let pattern = r["test"].as_str().context("a pattern in bench lat's row")?;
            Ok((
                pattern.to_string(),
                [get("median")?, get("mean")?, get("p99")?],
            ))
        })
        .collect()
}

/// Where a figure is taken: the two namespaces (near, far), the
/// `macrolink` binary, the secret, a scratch directory.
struct Ends<'a> {
    ns: [&'a str; 2],
    exe: &'a Path,
    secret: &'a Path,
    dir: &'a Path,
}

/// One contender's rate with `streams` streams, MB/s.
fn figure(
    e: &Ends<'_>,
    contender: Contender,
    streams: u32,
    (seconds, rate): (u32, f64),
) -> anyhow::Result<f64> {
    let n = streams as usize;
    let [a, b] = e.ns;
    let targets: Vec<(String, String)> = match contender {
        Contender::Relays => (0..n)
            .map(|i| {
                (
                    format!("127.0.0.1:{}", FAR_PORT as usize + i),
                    format!("127.0.0.1:{}", RELAY_PORT as usize + i),
                )
            })
            .collect(),
        Contender::Direct => (0..n)
            .map(|i| format!("{B_ADDR}:{}", DIRECT_PORT as usize + i))
            .map(|at| (at.clone(), at))
            .collect(),
        Contender::Cubic | Contender::Bbr => {
            let congestion = if contender == Contender::Cubic {
                "cubic"
            } else {
                "bbr"
            };
            let run = iperf3::Run {
                server_ns: Some(b),
                client_ns: Some(a),
                addr: B_ADDR,
                port: IPERF_PORT,
                flows: streams,
                secs: seconds,
                congestion: Some(congestion),
                len: None,
                omit: WARM_SECS,
            };
            return run.mb_per_s();
        }
    };
    bench_bw(e, targets, (seconds, rate))
}

fn rand_u128() -> u128 {
    let mut b = [0u8; 16];
    let _ = getrandom::fill(&mut b);
    u128::from_le_bytes(b)
}

/// The heading of the rows [`line()`] prints.
pub const HEADER: &str =
    "      km  loss    window  contender              streams      MB/s  of link";

/// One row as a line of the table; a failed figure says why.
pub fn line(r: &Row) -> String {
    let head = format!(
        "{:>8}  {:<6} {:>7}  {:<22} {:>7}",
        r.km,
        r.loss,
        r.window_kib.map_or("auto".into(), |w| format!("{w}K")),
        r.contender.name(),
        r.streams,
    );
    match &r.error {
        None => format!("{head} {:>9.1}  {:>6.3}", r.mb_per_s, r.of_link),
        Some(e) => format!("{head}  failed: {}", e.lines().next().unwrap_or_default()),
    }
}

/// Throughput against distance, one line per contender and stream count,
/// distance in metres on a log axis.
pub fn plot(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.window_kib.is_none() && r.error.is_none())
    {
        let name = format!(
            "{}, {} stream{}, loss {}",
            r.contender.name(),
            r.streams,
            if r.streams == 1 { "" } else { "s" },
            r.loss
        );
        let point = ((r.km * 1000.0).max(1.0), r.mb_per_s);
        match series.iter_mut().find(|s| s.0 == name) {
            Some(s) => s.1.push(point),
            None => series.push((name, vec![point])),
        }
    }
    crate::plot::lines_png(
        path,
        "throughput against distance (emulated fibre, 5 us/km each way)",
        ("distance, m", "MB/s"),
        &series,
    )
}

/// How long a sweep takes, roughly, to say so at the start.
pub fn estimate(o: &Options) -> Duration {
    let per_case = o.contenders.len() * o.streams.len();
    let cases = o.km.len() * o.loss.len() * o.windows.len();
    Duration::from_secs((cases * per_case) as u64 * (u64::from(o.seconds + WARM_SECS) + 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_file_of_the_two_segments_plans_both_relays() {
        let c = macrolink_cluster::Cluster::parse(&cluster_file(4, Some(256), 9000)).unwrap();
        let a = c.relay_plan(c.host("relay-a").unwrap()).unwrap();
        let b = c.relay_plan(c.host("relay-b").unwrap()).unwrap();
        let dial: Vec<u16> = a.listen.iter().map(|l| l.1.port()).collect();
        assert_eq!(
            dial,
            [RELAY_PORT, RELAY_PORT + 1, RELAY_PORT + 2, RELAY_PORT + 3]
        );
        let far: Vec<u16> = b.near.iter().map(|n| n.1.port()).collect();
        assert_eq!(far, [FAR_PORT, FAR_PORT + 1, FAR_PORT + 2, FAR_PORT + 3]);
        assert_eq!((a.long_peer, b.long_peer), (b_long(), a_long()));
        assert_eq!(c.range.window_kib, Some(256));
        assert_eq!(c.range.packet, Some(8972));
    }

    #[test]
    fn runs_made_at_once_are_counted_over_the_span_all_of_them_ran() {
        // A stream of 1 MB messages: in each piece (from, to, rate), at
        // `rate` MB/s, its messages arriving at even steps (seconds).
        let run = |pieces: &[(f64, f64, f64)]| {
            let mut arrivals = Vec::new();
            let mut m = 0.0;
            for &(from, to, rate) in pieces {
                let mut t = from;
                while t + 1.0 / rate <= to + 1e-9 {
                    t += 1.0 / rate;
                    m += 1.0;
                    arrivals.push((t * 1e9, m));
                }
            }
            let first = pieces[0].0;
            let last = arrivals.last().map_or(first, |a| a.0 / 1e9);
            Run {
                bytes: m * 1e6,
                seconds: last - first,
                message: 1e6,
                arrivals,
            }
        };
        // A 20 MB/s link: stream one at 10 for a second beside the other's
        // warm-up (uncounted), both at 10 each for two, then the other
        // alone at 20 for one. Together: 20, not the 17.5 (70 MB over 4 s)
        // of the first start to the last end, nor the 23.3 (70 over 3) of
        // all bytes over the longest run.
        let a = run(&[(0.0, 1.0, 10.0), (1.0, 3.0, 10.0)]);
        let b = run(&[(1.0, 3.0, 10.0), (3.0, 4.0, 20.0)]);
        let both = together(&[a, b]).unwrap();
        assert!((both - 20.0).abs() < 0.3, "{both}");
        // Shares that change inside the span still add up to the link: one
        // stream at 15 and the other at 5 for a second, then 5 and 15.
        let a = run(&[(0.0, 1.3, 20.0), (1.3, 2.3, 15.0), (2.3, 3.3, 5.0)]);
        let b = run(&[(1.3, 2.3, 5.0), (2.3, 3.3, 15.0), (3.3, 4.0, 20.0)]);
        let shifting = together(&[a, b]).unwrap();
        assert!((shifting - 20.0).abs() < 1.0, "{shifting}");
        // No stream, or arrivals out of order: an error, not a figure.
        assert!(together(&[]).is_err());
        let mut a = run(&[(0.0, 2.0, 20.0)]);
        let b = run(&[(0.0, 2.0, 20.0)]);
        a.arrivals.swap(3, 9);
        let e = together(&[a, b]).unwrap_err().to_string();
        assert!(e.contains("out of order"), "{e}");
        // Runs one after the other share no span: an error, not a figure.
        let a = run(&[(0.0, 1.0, 20.0)]);
        let b = run(&[(2.0, 3.0, 20.0)]);
        let e = together(&[a, b]).unwrap_err().to_string();
        assert!(e.contains("overlapped too little"), "{e}");
        // Overlapping by less than a message of each: counted untrimmed.
        let a = run(&[(0.0, 1.0, 10.0), (1.0, 1.15, 10.0)]);
        let b = run(&[(0.9, 1.0, 10.0), (1.0, 2.0, 20.0)]);
        assert!(together(&[a, b]).unwrap() > 0.0);
        // A run with no arrivals reported cannot be placed.
        let mut a = run(&[(0.0, 1.0, 20.0)]);
        let b = run(&[(0.0, 1.0, 20.0)]);
        a.arrivals.clear();
        assert!(together(&[a, b]).is_err());
        // One stream: its own time.
        let one = together(&[run(&[(5.0, 7.0, 25.0)])]).unwrap();
        assert!((one - 25.0).abs() < 1e-6, "{one}");
        // Between two arrivals a message's bytes come evenly.
        let r = run(&[(0.0, 1.0, 4.0)]);
        assert_eq!(r.by(0.0), 0.0);
        assert!((r.by(0.375e9) - 1.5).abs() < 1e-9);
        assert_eq!(r.by(9e9), 4.0);
    }

    fn a_long() -> std::net::SocketAddr {
        format!("{A_ADDR}:7650").parse().unwrap()
    }

    fn b_long() -> std::net::SocketAddr {
        format!("{B_ADDR}:7670").parse().unwrap()
    }

    #[test]
    fn a_failed_figure_says_why() {
        let mut r = Row {
            km: 1000.0,
            loss: "0.1%".into(),
            window_kib: None,
            contender: Contender::Relays,
            streams: 4,
            mb_per_s: 120.5,
            of_link: 0.964,
            error: None,
        };
        assert!(line(&r).ends_with("120.5   0.964"), "{}", line(&r));
        r.error = Some("bench bw: lost the connection\nmore".into());
        assert!(line(&r).ends_with("failed: bench bw: lost the connection"));
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["error"], "bench bw: lost the connection\nmore");
    }

    #[test]
    fn contenders_are_named_as_on_the_command_line() {
        for c in Contender::ALL {
            let word = serde_json::to_value(c).unwrap();
            assert_eq!(word.as_str().unwrap().parse::<Contender>(), Ok(c));
        }
        assert!("reno".parse::<Contender>().is_err());
        assert_eq!(rate_bytes("1gbit").unwrap(), 125e6);
    }
}
