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

use anyhow::{bail, Context};
use macrolink_testbed::netns::Namespaces;
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::peers::iperf3;

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
const US_PER_KM: f64 = 5.0;

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
}

/// One latency figure: 8-byte ping-pongs, half a round trip.
#[derive(Clone, Debug, Serialize)]
pub struct LatRow {
    /// km of fibre.
    pub km: f64,
    /// Through the relay pair, or straight over the link.
    pub via_relays: bool,
    /// Median, µs.
    pub median_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
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
    let mut lines = BufReader::new(out).lines();
    loop {
        match lines.next().transpose()? {
            Some(l) if l.starts_with("ready") => break,
            Some(_) => {}
            None => bail!("macrolink {} exited before it was ready", args.join(" ")),
        }
    }
    // Keep draining what it prints, so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Ok(child)
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

/// `macrolink bench bw` from ns A to each of `targets` at once: for each,
/// a `bench serve` started in ns B at its first address (a target serves
/// one run and quits), dialled at its second. Each sends the same count of
/// messages, about `seconds` at `rate` together; the figure is all their
/// bytes over the longest run's time (a sum of their own rates would count
/// each one's start and end twice).
fn bench_bw(
    e: &Ends<'_>,
    targets: Vec<(String, String)>,
    (seconds, rate): (u32, f64),
) -> anyhow::Result<f64> {
    let ([a, _], exe, secret, dir) = (e.ns, e.exe, e.secret, e.dir);
    // One stream: bench's own timing. Several: the same count each, about
    // `seconds` at `rate` together (the one-stream figure just measured).
    let count = (rate * f64::from(seconds) / MESSAGE as f64 / targets.len() as f64).max(4.0) as u64;
    let how = match targets.len() {
        1 => ["--seconds".to_string(), seconds.to_string()],
        _ => ["--count".to_string(), count.to_string()],
    };
    let _serves = (0..targets.len())
        .map(|i| target(e, &targets[i].0, &format!("shm-{i}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut runs = Vec::new();
    for (i, (_, t)) in targets.iter().enumerate() {
        let json = dir.join(format!("bw-{i}.json"));
        let child = Command::new("ip")
            .args(["netns", "exec", a])
            .arg(exe)
            .args(["bench", "bw", "--connect", t, "--transport", "tcp"])
            .args(["--mode", "reliable", "--completion", "wait"])
            .args(["--sizes", &MESSAGE.to_string()])
            .args(&how)
            .arg("--json")
            .arg(&json)
            .env("MACROLINK_SECRET_FILE", secret)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        runs.push((child, json));
    }
    // Each ends after its seconds; wait for all before judging any.
    let outs: Vec<_> = runs
        .into_iter()
        .map(|(c, json)| (c.wait_with_output(), json))
        .collect();
    let (mut bytes, mut longest) = (0.0, 0.0f64);
    for (out, json) in outs {
        let out = out?;
        if !out.status.success() {
            bail!("bench bw: {}", String::from_utf8_lossy(&out.stderr));
        }
        let rows: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
        let row = &rows[0];
        bytes += row["bytes"].as_f64().context("bytes in bench bw's row")?;
        longest = longest.max(
            row["seconds"]
                .as_f64()
                .context("seconds in bench bw's row")?,
        );
    }
    Ok(bytes / longest.max(1e-9) / 1e6)
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
    let dir = tempfile::tempdir()?;
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
                        let mb_per_s = figure(&ends, contender, streams, (o.seconds, expect))?;
                        if streams == 1 {
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
fn link(o: &Options, [a, b]: [&str; 2], km: f64, loss: &str) -> anyhow::Result<Kill> {
    let one_way_us = km * US_PER_KM;
    let queue_ms = (2.0 * one_way_us / 1000.0).max(5.0);
    let mut spec = format!("delay {one_way_us}us rate {} queue {queue_ms}ms", o.rate);
    if loss != "0" && loss != "0%" {
        spec += &format!(" loss {loss}");
    }
    let mtu = o.mtu.to_string();
    let mut cmd = Command::new(&o.exe);
    cmd.args(["link", "--mtu", &mtu, a, b])
        .args(spec.split_whitespace())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = Kill(cmd.spawn()?);
    let mut first = String::new();
    BufReader::new(child.0.stdout.take().context("link stdout")?).read_line(&mut first)?;
    if !first.starts_with("ready") {
        bail!("macrolink link {spec}: {first}");
    }
    Ok(child)
}

/// A `bench serve` in ns B at `at`. Every target is node 2 to its client
/// (bench's protocol); each meets no other in shared memory (`shm`, a
/// directory of its own).
fn target(e: &Ends<'_>, at: &str, shm: &str) -> anyhow::Result<Kill> {
    let shm = e.dir.join(shm);
    std::fs::create_dir_all(&shm)?;
    let shm = shm.display().to_string();
    let args = [
        "bench",
        "serve",
        "--node",
        "2",
        "--tcp",
        at,
        "--shm-dir",
        &shm,
    ];
    start(e.ns[1], e.exe, &args, e.secret)
}

/// `macrolink bench lat` from ns A (8 B ping-pong, tcp, waiting
/// completion, `count` times) to a target started in ns B at `at`, dialled
/// at `dial`: (median, p99) of the half round trip, µs.
fn bench_lat(e: &Ends<'_>, at: &str, dial: &str, count: u32) -> anyhow::Result<(f64, f64)> {
    let a = e.ns[0];
    let _serve = target(e, at, "shm-lat")?;
    let json = e.dir.join("lat.json");
    let out = Command::new("ip")
        .args(["netns", "exec", a])
        .arg(e.exe)
        .args(["bench", "lat", "--connect", dial, "--transport", "tcp"])
        .args([
            "--completion",
            "wait",
            "--sizes",
            "8",
            "--count",
            &count.to_string(),
        ])
        .arg("--json")
        .arg(&json)
        .env("MACROLINK_SECRET_FILE", e.secret)
        .output()?;
    if !out.status.success() {
        bail!("bench lat: {}", String::from_utf8_lossy(&out.stderr));
    }
    let rows: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    let us = &rows[0]["usec"];
    let get = |k: &str| us[k].as_f64().context("a latency in bench lat's row");
    Ok((get("median")?, get("p99")?))
}

/// Half round trips through the relay pair and straight over the link, at
/// each distance of `o` (no loss, measured window).
pub fn latency(
    o: &Options,
    count: u32,
    mut each: impl FnMut(&LatRow),
) -> anyhow::Result<Vec<LatRow>> {
    let ns = Namespaces::new(2).map_err(anyhow::Error::msg)?;
    let (a, b) = (ns.names[0].as_str(), ns.names[1].as_str());
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("secret");
    std::fs::write(&secret, format!("{:032x}", rand_u128()))?;
    let cluster = dir.path().join("two.toml");
    std::fs::write(&cluster, cluster_file(1, None, o.mtu))?;
    let c = cluster.to_str().context("path")?;
    let mut rows = Vec::new();
    for &km in &o.km {
        let _link = link(o, [a, b], km, "0")?;
        let relay = |ns, host| start(ns, &o.exe, &["relay", c, "--host", host], &secret);
        let _relays = [relay(a, "relay-a")?, relay(b, "relay-b")?];
        let e = Ends {
            ns: [a, b],
            exe: &o.exe,
            secret: &secret,
            dir: dir.path(),
        };
        let far = format!("127.0.0.1:{FAR_PORT}");
        let direct = format!("{B_ADDR}:{DIRECT_PORT}");
        for (via_relays, at, dial) in [
            (true, &far, format!("127.0.0.1:{RELAY_PORT}")),
            (false, &direct, direct.clone()),
        ] {
            let (median_us, p99_us) = bench_lat(&e, at, &dial, count)?;
            let row = LatRow {
                km,
                via_relays,
                median_us,
                p99_us,
            };
            each(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// What the latency rows say, fitted: the pair's added median (relays less
/// direct, averaged over the distances) and µs per km (least squares of
/// the direct medians against km).
pub fn latency_fit(rows: &[LatRow]) -> (f64, Option<f64>) {
    let direct: Vec<&LatRow> = rows.iter().filter(|r| !r.via_relays).collect();
    let added: Vec<f64> = direct
        .iter()
        .filter_map(|d| {
            let r = rows.iter().find(|r| r.via_relays && r.km == d.km)?;
            Some(r.median_us - d.median_us)
        })
        .collect();
    let pair = added.iter().sum::<f64>() / added.len().max(1) as f64;
    let n = direct.len() as f64;
    let (mx, my) = (
        direct.iter().map(|r| r.km).sum::<f64>() / n,
        direct.iter().map(|r| r.median_us).sum::<f64>() / n,
    );
    let sxx: f64 = direct.iter().map(|r| (r.km - mx).powi(2)).sum();
    let sxy: f64 = direct
        .iter()
        .map(|r| (r.km - mx) * (r.median_us - my))
        .sum();
    (pair, (direct.len() >= 2 && sxx > 0.0).then(|| sxy / sxx))
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

/// The heading of the rows [`line`] prints.
pub const HEADER: &str =
    "      km  loss    window  contender              streams      MB/s  of link";

/// One row as a line of the table.
pub fn line(r: &Row) -> String {
    format!(
        "{:>8}  {:<6} {:>7}  {:<22} {:>7} {:>9.1}  {:>6.3}",
        r.km,
        r.loss,
        r.window_kib.map_or("auto".into(), |w| format!("{w}K")),
        r.contender.name(),
        r.streams,
        r.mb_per_s,
        r.of_link
    )
}

/// Throughput against distance, one line per contender and stream count,
/// distance in metres on a log axis.
pub fn plot(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows.iter().filter(|r| r.window_kib.is_none()) {
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
    Duration::from_secs((cases * per_case) as u64 * (u64::from(o.seconds) + 2))
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

    fn a_long() -> std::net::SocketAddr {
        format!("{A_ADDR}:7650").parse().unwrap()
    }

    fn b_long() -> std::net::SocketAddr {
        format!("{B_ADDR}:7670").parse().unwrap()
    }

    #[test]
    fn the_fit_finds_the_pairs_cost_and_the_cost_per_km() {
        let row = |km: f64, via_relays: bool, median_us: f64| LatRow {
            km,
            via_relays,
            median_us,
            p99_us: 0.0,
        };
        let rows = [
            row(0.0, false, 30.0),
            row(0.0, true, 110.0),
            row(100.0, false, 530.0),
            row(100.0, true, 610.0),
        ];
        let (pair, per_km) = latency_fit(&rows);
        assert!((pair - 80.0).abs() < 1e-9);
        assert!((per_km.unwrap() - 5.0).abs() < 1e-9);
        assert_eq!(latency_fit(&rows[..2]).1, None, "one distance: no slope");
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
