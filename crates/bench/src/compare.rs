//! `macrolink bench compare`: ours and the established tools in one run,
//! with the ratio of each figure.

use macrolink_fabric::{Completion, Mode, Pages, Transport};
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::peers::{self, iperf3, sockperf, ucx_perftest};
use crate::proto::Test;
use crate::session::Session;
use crate::stats::MedianInterval;
use crate::sweep;

mod alternate;
mod beside_sockperf;
mod chart;
mod groups;
mod placement;
mod sleeping;
mod sockets;
mod table;

use alternate::{alternated_bw, least_messages, median, Lat, Moved, Pairs, BRIEF_ALTERNATIONS};
pub use alternate::{Host, Pair};
use placement::alternated_steady;
pub use placement::Placement;

pub use chart::png;
pub use groups::{Group, Groups, FEWEST_PAIRS_ASKED, MOST_PAIRS_ASKED};
pub use table::table;

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Seconds per bandwidth figure.
    pub seconds: f64,
    /// Iterations per latency figure.
    pub iterations: u64,
    /// The groups of rows to make.
    pub only: Groups,
    /// Pairs of runs behind each alternated latency row, where not each
    /// row's own number ([`groups::pairs`]).
    pub pairs: Option<usize>,
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
    /// Whether it is, as far as the runs behind it can tell.
    pub met: Option<Verdict>,
    /// How our side waits for work (`poll`, `wait`).
    pub ours_regime: &'static str,
    /// How the peer's side does.
    pub peer_regime: &'static str,
    /// Our 99th percentile, for latency rows.
    pub ours_p99: Option<f64>,
    /// The peer's, where it reports one.
    pub theirs_p99: Option<f64>,
    /// Why the row is as it is, printed below the table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
    /// The lowest and the highest ours / theirs of the runs made back to
    /// back, where the row is a median of several: how far the machine
    /// moved the ratio while the row ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pairs: Option<(f64, f64)>,
    /// The interval that holds the median of those runs' ratios, and at
    /// what confidence: what the verdict is of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<MedianInterval>,
    /// What the machine's host took during those runs, and the ratio of
    /// the pairs it took (next to) nothing from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<Host>,
    /// For a row of small messages over shared memory or UCX: how many of
    /// its pairs ran in one placement of the processors, and whether the
    /// figures are of those alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// The target, as `target` says it.
    #[serde(skip)]
    goal: Goal,
}

impl Row {
    /// Says how each side waits for work.
    fn regimes(mut self, ours: &'static str, peer: &'static str) -> Row {
        self.ours_regime = ours;
        self.peer_regime = peer;
        self
    }

    /// Adds the spread of the ratios of runs made back to back, and what
    /// the host took during them.
    fn pairs(mut self, pairs: Pairs) -> Row {
        self.pairs = pairs.spread();
        self.host = pairs.host();
        self.interval = pairs.interval();
        self.met = verdict(self.goal, self.ratio, self.interval);
        self
    }

    /// Adds the spread of the row's own runs, each over the limit it is
    /// held to (its `theirs`: a limit, not a peer's run), and the interval
    /// that holds their median: a row of a few runs against a limit is
    /// judged as a row of pairs is, a tie where its runs fall on both
    /// sides of the limit. Its figure is their median.
    fn runs(mut self, figures: &[f64]) -> Row {
        let Some(limit) = self.theirs.filter(|l| *l > 0.0) else {
            return self;
        };
        let each = figures.iter().map(|&f| (f, limit));
        self.pairs = alternate::spread(each.clone());
        self.interval = crate::stats::median_interval(each.map(|(f, l)| f / l).collect());
        self.met = verdict(self.goal, self.ratio, self.interval);
        self
    }

    /// Says how the row's pairs stood with the processors' placement.
    fn placement(mut self, p: Placement) -> Row {
        self.placement = Some(p);
        self
    }

    /// Adds a note, printed below the table and marked in the row.
    fn note(mut self, note: &'static str) -> Row {
        self.note = Some(note);
        self
    }

    /// Adds both sides' 99th percentiles.
    fn p99(mut self, ours: Option<f64>, theirs: Option<f64>) -> Row {
        self.ours_p99 = ours;
        self.theirs_p99 = theirs;
        self
    }
}

/// Our side polls (spins on its endpoint).
const POLL: &str = "poll";
/// Our side sleeps until traffic comes.
const WAIT: &str = "wait";
/// UCX's default: the program calls `ucp_worker_progress` in a loop.
const BUSY_PROGRESS: &str = "busy progress";
/// Blocking sockets: the kernel wakes the reader.
const BLOCKING: &str = "blocking";
/// [`WAIT`], both sides on one processor.
const WAIT_ONE: &str = "wait 1 cpu";
/// [`BLOCKING`], both sides on one processor.
const BLOCKING_ONE: &str = "blocking 1 cpu";

/// What a row's ratio should be.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Goal {
    AtMost(f64),
    AtLeast(f64),
    Info,
}

/// Whether a row's ratio meets its target, as far as the runs behind it
/// can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The ratio meets the target, and so does all of its interval (or it
    /// is of one run).
    Yes,
    /// Neither the ratio nor any of its interval does.
    No,
    /// The interval reaches across the target: at the noise these runs
    /// met, they cannot tell.
    Tie,
}

/// The verdict on `ratio` against `goal`: of the ratio alone where no
/// interval is known, else a tie unless the ratio and both ends of the
/// interval agree. `None` without a ratio or a target.
fn verdict(goal: Goal, ratio: Option<f64>, interval: Option<MedianInterval>) -> Option<Verdict> {
    let holds = |x: f64| match goal {
        Goal::AtMost(limit) => Some(x <= limit),
        Goal::AtLeast(limit) => Some(x >= limit),
        Goal::Info => None,
    };
    let point = holds(ratio?)?;
    let ends = interval.map_or([point; 2], |i| {
        [holds(i.lo) == Some(true), holds(i.hi) == Some(true)]
    });
    Some(match (point, ends) {
        (true, [true, true]) => Verdict::Yes,
        (false, [false, false]) => Verdict::No,
        _ => Verdict::Tie,
    })
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
    let target = match goal {
        Goal::AtMost(x) => format!("<= {x}"),
        Goal::AtLeast(x) => format!(">= {x}"),
        Goal::Info => "-".into(),
    };
    let met = verdict(goal, ratio, None);
    Row {
        figure: figure.into(),
        unit,
        ours,
        peer: peer.into(),
        theirs,
        ratio,
        target,
        met,
        ours_regime: "-",
        peer_regime: "-",
        ours_p99: None,
        theirs_p99: None,
        note: None,
        pairs: None,
        interval: None,
        host: None,
        placement: None,
        goal,
    }
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

/// A peer's figure, or `None` with the reason on standard error.
fn opt<T>(r: anyhow::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("peer run failed: {e:#}");
            None
        }
    }
}

/// Runs every figure, ours against a target started from `exe`.
pub fn run(exe: &Path, a: &Options) -> anyhow::Result<Vec<Row>> {
    let tools = [ucx_perftest::TOOL, iperf3::TOOL, sockperf::TOOL];
    if let Some(install) = peers::missing(&tools) {
        eprintln!("peers missing: install them with `{install}`; their rows show n.a.");
    }
    let stray = peers::running(&tools);
    if !stray.is_empty() {
        let list: Vec<String> = stray
            .iter()
            .map(|(pid, p)| format!("{p} ({pid})"))
            .collect();
        eprintln!(
            "warning: already running here: {}; they take CPU from both sides of every row \
             (a busy-polling server takes a whole core): stop them for figures that mean anything",
            list.join(", ")
        );
    }
    let has_ucx = ucx_perftest::TOOL.installed();
    let has_sockperf = sockperf::TOOL.installed();
    // One session for the groups that share it, opened by the first.
    let mut main = None;
    let mut rows = Vec::new();
    if a.only.has(Group::Shm) {
        rows.extend(shm_rows(session(exe, &mut main)?, a, has_ucx)?);
    }
    if a.only.has(Group::TcpBw) {
        rows.extend(tcp_bw_rows(session(exe, &mut main)?, a, has_ucx)?);
    }
    for (t, m, udp, g) in [
        (Transport::Tcp, Mode::Reliable, false, Group::Tcp),
        (Transport::Udp, Mode::Datagram, true, Group::Udp),
    ] {
        if a.only.has(g) {
            eprintln!("{t} latency ...");
            rows.extend(sockets::rows(exe, a, t, m, udp, has_sockperf)?);
        }
    }

    if has_ucx && a.only.has(Group::Ucx) {
        for (name, tls) in [("sm", "sm,self"), ("tcp", "tcp")] {
            ucx_rows(exe, a, name, tls, &mut rows)?;
        }
    }
    if a.only.has(Group::Waiting) {
        rows.extend(waiting_rows(session(exe, &mut main)?, a, has_ucx)?);
    }
    if a.only.has(Group::Cpu) {
        rows.extend(cpu_rows(session(exe, &mut main)?, a)?);
    }
    Ok(rows)
}

/// The session `main` holds, opened now if it is not yet.
fn session<'a>(exe: &Path, main: &'a mut Option<Session>) -> anyhow::Result<&'a mut Session> {
    if main.is_none() {
        *main = Some(Session::open(exe, None)?);
    }
    Ok(main.as_mut().expect("opened above"))
}

/// A ping-pong of `n` iterations of `size` bytes on `s`: its median and
/// 99th percentile.
fn lat_n(
    s: &mut Session,
    t: Transport,
    m: Mode,
    c: Completion,
    size: usize,
    n: u64,
) -> anyhow::Result<Lat> {
    let u = s.client().latency(Test::PingPong, t, m, c, size, n)?.usec;
    Ok(Lat {
        median: u.median,
        p99: Some(u.p99),
    })
}

/// A bandwidth run of `secs` seconds and at least `least` messages (a
/// peer's run beside it moves as many).
fn bw(
    s: &mut Session,
    t: Transport,
    m: Mode,
    c: Completion,
    size: usize,
    least: u64,
    secs: f64,
) -> anyhow::Result<crate::report::BwRow> {
    let plan = sweep::Bandwidth {
        least,
        ..sweep::Bandwidth::one(t, m, c, size, secs)
    };
    let mut rows = plan.run(s.client())?;
    rows.pop().ok_or_else(|| anyhow::anyhow!("no row"))
}

/// Shared memory beside UCX over posix: the 8 B ping-pong and the puts.
fn shm_rows(s: &mut Session, a: &Options, has_ucx: bool) -> anyhow::Result<Vec<Row>> {
    let (n, secs) = (a.iterations, a.seconds);
    let mut rows = Vec::new();
    eprintln!("shm latency ...");
    // Both sides as many iterations: a run of a fifth of ucx_perftest's
    // was its first few milliseconds, slower by a third on some machines.
    let shm_n = n * SHM_LAT_RUN;
    let times = groups::pairs(a.pairs, BRIEF_ALTERNATIONS);
    let (ours, theirs, pairs, placed) = alternated_steady(
        times,
        || {
            lat_n(
                s,
                Transport::Shm,
                Mode::Reliable,
                Completion::Poll,
                8,
                shm_n,
            )
        },
        has_ucx.then_some(|| opt(ucx_perftest::latency("posix,self", 8, shm_n)).map(Lat::from)),
        placement::probe,
    )?;
    rows.push(
        row(
            &format!("shm 8 B ping-pong, half rt, median of {times}"),
            "us",
            Some(ours.median),
            "ucx_perftest tag_lat (posix,self)",
            theirs.map(|l| l.median),
            Goal::AtMost(1.0),
        )
        .regimes(POLL, BUSY_PROGRESS)
        .p99(ours.p99, theirs.and_then(|l| l.p99))
        .pairs(pairs)
        .placement(placed)
        .note(UCX_WINDOW),
    );

    for size in [1_000_000usize, 4_000_000] {
        eprintln!("shm put {size} B ...");
        // Three runs of each side alternated, and their medians: one run
        // of either moves by a tenth with the machine's minute.
        let (ours, theirs, pairs) = alternated_bw(
            || {
                let least = least_messages(20_000.0, secs, size);
                let r = bw(
                    s,
                    Transport::Shm,
                    Mode::Put,
                    Completion::Poll,
                    size,
                    least,
                    secs,
                )?;
                Ok(Moved::from(&r))
            },
            |r| {
                (has_ucx && r.mb_per_s.is_some())
                    .then(|| opt(ucx_put("posix,cma,self", size, r.messages)))
                    .flatten()
                    .map(|f| f.mb_per_s)
            },
        )?;
        rows.push(
            row(
                &format!("shm put {size} B, median of 3"),
                "MB/s",
                ours,
                "ucx_perftest ucp_put_bw (posix,cma)",
                theirs,
                Goal::AtLeast(0.9),
            )
            .regimes(POLL, BUSY_PROGRESS)
            .pairs(pairs),
        );
        let mc = memcpy_rate(size, secs.min(1.0));
        rows.push(
            row(
                &format!("shm put {size} B, median of 3"),
                "MB/s",
                ours,
                "single-core memcpy",
                Some(mc),
                Goal::Info,
            )
            .regimes(POLL, "-"),
        );
    }
    Ok(rows)
}

/// Tcp bandwidth beside iperf3, and over tcp beside ucx_perftest.
fn tcp_bw_rows(s: &mut Session, a: &Options, has_ucx: bool) -> anyhow::Result<Vec<Row>> {
    let (n, secs) = (a.iterations, a.seconds);
    let mut rows = Vec::new();
    eprintln!("tcp bandwidth ...");
    // iperf3 blocks in the kernel and writes `-l` bytes at a time: ours
    // waits too, with messages of the same size. iperf3 writes 1 MiB at
    // most, so a 4 MB row would compare unlike sizes: there is none. Three
    // runs of each side alternated, as the shm puts: one run of either
    // moves by a fifth with the machine's minute here.
    {
        let size = 1_000_000usize;
        let len = size.min(iperf3::MAX_LEN);
        let has_iperf3 = iperf3::TOOL.installed();
        // The receiving kernel's copy out of the socket is the floor of a
        // receiver's CPU over tcp: beside iperf3's receiver, per byte, of
        // the same runs.
        let per_gb = |cpu: Option<f64>, mb_per_s: Option<f64>| match (cpu, mb_per_s) {
            (Some(c), Some(r)) if r > 0.0 => Some(c * 1e4 / r),
            _ => None,
        };
        let (mut ours_cpu, mut theirs_cpu) = (Vec::new(), Vec::new());
        let (ours, theirs, pairs) = alternated_bw(
            || {
                let r = bw(
                    s,
                    Transport::Tcp,
                    Mode::Reliable,
                    Completion::Wait,
                    size,
                    0,
                    secs,
                )?;
                ours_cpu.extend(per_gb(r.cpu_target, r.mb_per_s));
                Ok(Moved::from(&r))
            },
            |_| {
                let run = iperf3::Run {
                    server_ns: None,
                    client_ns: None,
                    addr: "127.0.0.1",
                    port: peers::free_port().unwrap_or(5201),
                    flows: 1,
                    secs: (secs * 2.0).ceil() as u32,
                    congestion: None,
                    len: Some(len),
                    omit: 0,
                };
                let f = has_iperf3.then(|| opt(run.figures())).flatten()?;
                theirs_cpu.extend(per_gb(f.receiver_cpu, Some(f.mb_per_s)));
                Some(f.mb_per_s)
            },
        )?;
        rows.push(
            row(
                &format!("tcp reliable {size} B, median of 3"),
                "MB/s",
                ours,
                &format!("iperf3, one stream, -l {len}"),
                theirs,
                Goal::AtLeast(1.0),
            )
            .regimes(WAIT, BLOCKING)
            .pairs(pairs),
        );
        rows.push(
            row(
                &format!("tcp reliable {size} B, receiver CPU"),
                "ms/GB",
                median(ours_cpu),
                "iperf3's receiver (the kernel's copy)",
                median(theirs_cpu),
                Goal::Info,
            )
            .regimes(WAIT, BLOCKING),
        );
    }
    if has_ucx {
        let least = least_messages(4_000.0, secs, 1_000_000);
        let r = bw(
            s,
            Transport::Tcp,
            Mode::Reliable,
            Completion::Poll,
            1_000_000,
            least,
            secs,
        )?;
        let (ours, iters) = (r.mb_per_s, r.sent);
        // Its own window: ours keeps as many messages in flight as the
        // connection's buffers hold.
        let window = ucx_perftest::DEFAULT_WINDOW;
        let theirs =
            ours.and_then(|_| opt(ucx_perftest::run("tcp", "tag_bw", 1_000_000, iters, window)));
        let theirs = theirs.map(|f| f.mb_per_s);
        rows.push(
            row(
                "tcp reliable 1000000 B",
                "MB/s",
                ours,
                "ucx_perftest tag_bw (tcp)",
                theirs,
                Goal::Info,
            )
            .regimes(POLL, BUSY_PROGRESS),
        );
        let ours = lat_n(s, Transport::Tcp, Mode::Reliable, Completion::Poll, 8, n)?;
        let theirs = opt(ucx_perftest::latency("tcp", 8, n));
        rows.push(
            row(
                "tcp 8 B ping-pong, half round trip",
                "us",
                Some(ours.median),
                "ucx_perftest tag_lat (tcp)",
                theirs.map(|l| l.median),
                Goal::Info,
            )
            .regimes(POLL, BUSY_PROGRESS)
            .p99(ours.p99, theirs.map(|l| l.p99))
            .note(UCX_WINDOW),
        );
    }
    Ok(rows)
}

/// Large reliable messages to a waiting reader, beside UCX's sleeping
/// mode.
fn waiting_rows(s: &mut Session, a: &Options, has_ucx: bool) -> anyhow::Result<Vec<Row>> {
    let secs = a.seconds;
    let mut rows = Vec::new();
    // A waiting reader of large messages takes them by rendezvous: beside
    // UCX's event-driven mode, whose shared-memory rendezvous is the same
    // one cross-memory copy, on the same pages as ours: at 1 MB base
    // pages (with the floor of one wake-up a message), at 4 MB huge pages
    // (the least at which UCX takes them).
    eprintln!("shm reliable 1 MB, waiting ...");
    rows.extend(sleeping::rows(s, has_ucx, secs, 1_000_000, Pages::Base)?);
    eprintln!("shm reliable 4 MB on huge pages, waiting ...");
    rows.extend(sleeping::rows(s, has_ucx, secs, 4_000_000, Pages::Huge)?);
    Ok(rows)
}

/// Runs behind each of the target-CPU rows.
const CPU_RUNS: usize = 3;

/// The waiting target's and initiator's CPU at 1 MB, beside the papers'
/// event-driven column: the medians of [`CPU_RUNS`] runs, the target's
/// judged on all of them.
fn cpu_rows(s: &mut Session, a: &Options) -> anyhow::Result<Vec<Row>> {
    let secs = a.seconds;
    let mut rows = Vec::new();
    eprintln!("wait-mode CPU ...");
    for (t, m) in [
        (Transport::Shm, Mode::Put),
        (Transport::Shm, Mode::Reliable),
        (Transport::Tcp, Mode::Put),
        (Transport::Tcp, Mode::Reliable),
    ] {
        // Three runs, and their medians: one run's CPU moves with the
        // machine as its bandwidth does.
        let (mut target, mut initiator, mut mb_s) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..CPU_RUNS {
            let r = bw(s, t, m, Completion::Wait, 1_000_000, 0, secs)?;
            target.extend(r.cpu_target);
            initiator.extend(r.cpu_initiator);
            mb_s.extend(r.mb_per_s);
        }
        // A limit, not a peer's run. A put's target does nothing by
        // design (the initiator copies): the initiator's row says what
        // the bytes cost. The sender is not paced: a target woken once a
        // message spends more of its processor the faster they come, and
        // the row says how fast that was.
        let limit = match median(mb_s) {
            Some(mb) => format!("limit: 10% (papers' event-driven column), at {mb:.0} MB/s"),
            None => "limit: 10% (papers' event-driven column)".to_string(),
        };
        rows.push(
            row(
                &format!("{t} {m} 1 MB, target CPU"),
                "%",
                median(target.clone()),
                &limit,
                Some(10.0),
                Goal::AtMost(1.0),
            )
            .regimes(WAIT, "-")
            .runs(&target),
        );
        rows.push(
            row(
                &format!("{t} {m} 1 MB, initiator CPU"),
                "%",
                median(initiator),
                "-",
                None,
                Goal::Info,
            )
            .regimes(WAIT, "-"),
        );
    }
    Ok(rows)
}

/// macrolink over UCX beside ucx_perftest, both on UCX's transports `tls`
/// (named `name` in the rows), both polling: 8-byte tagged ping-pongs
/// (ours: reliable messages, which are UCX tagged sends) and puts of 1 MB
/// and 4 MB.
fn ucx_rows(
    exe: &Path,
    a: &Options,
    name: &str,
    tls: &str,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    eprintln!("ucx ({name}) ...");
    let opts = macrolink_fabric::UcxOptions {
        tls: Some(tls.into()),
        devices: None,
    };
    let mut s = Session::open_with(exe, None, Some(&opts))?;
    let n = a.iterations;
    let times = groups::pairs(a.pairs, BRIEF_ALTERNATIONS);
    let (ours, theirs, pairs, placed) = alternated_steady(
        times,
        || {
            let u = s
                .client()
                .latency(
                    Test::PingPong,
                    Transport::Ucx,
                    Mode::Reliable,
                    Completion::Poll,
                    8,
                    n,
                )?
                .usec;
            Ok(Lat {
                median: u.median,
                p99: Some(u.p99),
            })
        },
        Some(|| opt(ucx_perftest::latency(tls, 8, n)).map(Lat::from)),
        placement::probe,
    )?;
    rows.push(
        row(
            &format!("ucx ({name}) 8 B ping-pong, half rt, median of {times}"),
            "us",
            Some(ours.median),
            &format!("ucx_perftest tag_lat ({tls})"),
            theirs.map(|l| l.median),
            Goal::AtMost(1.05),
        )
        .regimes(POLL, BUSY_PROGRESS)
        .p99(ours.p99, theirs.and_then(|l| l.p99))
        .pairs(pairs)
        .placement(placed)
        .note(UCX_WINDOW),
    );
    for size in [1_000_000usize, 4_000_000] {
        // Three runs of each side alternated, as the shm puts: UCX's tcp
        // moves by a fifth from one minute to the next here.
        let (ours, theirs, pairs) = alternated_bw(
            || {
                let plan = sweep::Bandwidth {
                    least: least_messages(10_000.0, a.seconds, size),
                    ..sweep::Bandwidth::one(
                        Transport::Ucx,
                        Mode::Put,
                        Completion::Poll,
                        size,
                        a.seconds,
                    )
                };
                let r = plan.run(s.client())?.pop();
                Ok(r.as_ref().map(Moved::from).unwrap_or_default())
            },
            |r| {
                r.mb_per_s?;
                opt(ucx_put(tls, size, r.messages).map(|f| f.mb_per_s))
            },
        )?;
        // Over shared memory UCX puts into memory it allocated itself
        // (ucx_perftest's buffers) by one copy, and into memory it
        // registered (our regions) by software emulation: unlike, so
        // not judged.
        let shm = shared_memory_only(tls);
        let r = row(
            &format!("ucx ({name}) put {size} B, median of 3"),
            "MB/s",
            ours,
            &format!("ucx_perftest ucp_put_bw ({tls})"),
            theirs,
            if shm { Goal::Info } else { Goal::AtLeast(0.95) },
        )
        .regimes(POLL, BUSY_PROGRESS)
        .pairs(pairs);
        rows.push(if shm { r.note(UCX_SHM_PUT) } else { r });
    }
    Ok(())
}

/// `ucx_perftest ucp_put_bw` over `tls`, as many puts in flight as ours.
fn ucx_put(tls: &str, size: usize, iters: u64) -> anyhow::Result<ucx_perftest::Figures> {
    let window = sweep::PUT_WINDOW as u32;
    ucx_perftest::run(tls, "ucp_put_bw", size, iters, window)
}

/// Why the UCX shared-memory put rows have no target.
const UCX_SHM_PUT: &str = "ucx_perftest puts into buffers UCX allocated itself \
as shared segments the sender maps, so its put is one copy; a region of ours is memory \
UCX registers, and UCX 1.13 has no shared-memory put into registered memory: it emulates \
the put over active messages, a copy on each side (UCX_PROTO_INFO=y says \"software \
emulation\"). Unlike, so not judged; macrolink's own shm put is in the rows beside \
ucx_perftest above.";

/// How ucx_perftest's latency percentiles are had, beside ours.
const UCX_WINDOW: &str = "ucx_perftest keeps the times of its last 2048 iterations \
(TIMING_QUEUE_SIZE) and reports one percentile of those a run: its median is of a run with \
-R 50, its p99 of the next, with -R 99; ours are of every timed iteration, after a warm-up.";

/// The shared-memory latency row's runs, both sides', in `--iterations`:
/// at 0.1 us a half round trip, 100,000 iterations are 20 ms.
const SHM_LAT_RUN: u64 = 5;

/// Iterations of a ping-pong whose half round trip took `half_rt_us` that
/// last `span`: `floor` at least, a hundred times it at most.
fn iterations_for(span: Duration, half_rt_us: f64, floor: u64) -> u64 {
    let round_trip = 2.0 * half_rt_us.max(1e-3) * 1e-6;
    let n = (span.as_secs_f64() / round_trip) as u64;
    n.clamp(floor, floor.saturating_mul(100))
}

/// What the bare ping-pong rows measure: the sleep a waiting endpoint
/// no longer pays in these ping-pongs, not a peer.
const SLEEP_FLOOR: &str = "two threads of this process in a ping-pong over loopback, \
no transport of ours in it, each sleeping in one poll of the three descriptors a waiting \
endpoint of ours hears (its inbox's eventfd, its datagram socket, the connection) and then \
a recv (bare poll), or in one epoll_wait of the three in an epoll set and then a recv (bare \
epoll), or, as sockperf's blocking sides do, in a blocking recv on the socket alone. A \
waiting endpoint sleeps the epoll way, or the poll way once it uses datagrams (in our \
endpoint the epoll way measured 0.2 us a round trip slower over udp on one processor), \
where it hears more than one connection or its datagrams, or where its peer answers \
slowly: a system call more a message on each side than a blocking recv. In a quick \
ping-pong such as the waiting row's, one of one tcp connection or of datagrams alone \
sleeps in that socket's own recv, as a blocking recv does (the fabric's recv_sleep): the \
ratio is what that saves here.";

/// What the one-processor rows measure.
const ONE_PROCESSOR: &str = "both sides of each ping-pong, ours and the peer's, kept to \
one processor (sched_setaffinity, inherited by what the run starts): a message wakes a \
reader on the processor it runs on, so no wake-up crosses processors, and the time is the \
system calls, the switches and the work that a message costs each side. Where idle \
processors halt (a virtual machine), a wake-up across processors is most of a waiting \
row's time; here it is none of it.";

/// Whether a `UCX_TLS` list names shared-memory transports only.
fn shared_memory_only(tls: &str) -> bool {
    tls.split(',')
        .all(|t| matches!(t.trim(), "sm" | "self" | "posix" | "sysv" | "cma"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fifteen pairs, ours at `ours(i)` against the peer's 1.0.
    fn fifteen(ours: impl Fn(usize) -> f64) -> Pairs {
        let runs: Vec<_> = (0..15).map(|i| (ours(i), 1.0, None, None)).collect();
        Pairs::of(&runs)
    }

    #[test]
    fn a_verdict_stands_where_the_ratio_and_all_of_its_interval_agree_and_else_is_a_tie() {
        let judged = |goal, pairs: Pairs| {
            let ours = median(pairs.ratios());
            row("lat", "us", ours, "peer", Some(1.0), goal).pairs(pairs)
        };
        // All fifteen ahead, or all behind: the verdict stands.
        let ahead = judged(Goal::AtMost(1.0), fifteen(|i| 0.90 + 0.005 * i as f64));
        assert_eq!(ahead.met, Some(Verdict::Yes));
        let i = ahead.interval.unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(
            close(i.lo, 0.915) && close(i.hi, 0.955),
            "the 4th and the 12th of 15: {i:?}"
        );
        let behind = judged(Goal::AtMost(1.0), fifteen(|i| 1.05 + 0.01 * i as f64));
        assert_eq!(behind.met, Some(Verdict::No));
        // At parity, the ratio just over the target or just under it, its
        // interval across it: a tie either way.
        let even = judged(Goal::AtMost(1.0), fifteen(|i| 0.97 + 0.005 * i as f64));
        assert!(close(even.ratio.unwrap(), 1.005));
        assert_eq!(even.met, Some(Verdict::Tie));
        let even = judged(Goal::AtMost(1.0), fifteen(|i| 0.96 + 0.005 * i as f64));
        assert!(close(even.ratio.unwrap(), 0.995));
        assert_eq!(even.met, Some(Verdict::Tie));
        // One pair far off does not move it: 14 of 15 ahead.
        let one_off = judged(
            Goal::AtMost(1.0),
            fifteen(|i| if i == 3 { 1.5 } else { 0.9 }),
        );
        assert_eq!(one_off.met, Some(Verdict::Yes));
        // At least: three pairs of bandwidth, one below.
        let three = |r: [f64; 3]| Pairs::of(&r.map(|o| (o, 1.0, None, None)));
        let bw = judged(Goal::AtLeast(1.0), three([1.5, 1.6, 1.7]));
        assert_eq!(bw.met, Some(Verdict::Yes));
        assert_eq!(bw.interval.unwrap().confidence, 0.75);
        let bw = judged(Goal::AtLeast(1.0), three([0.62, 0.70, 1.28]));
        assert_eq!(bw.met, Some(Verdict::Tie));
        // A row of one run is judged on its ratio; one without a target
        // or a peer's figure is not judged.
        let one = row(
            "cpu",
            "%",
            Some(11.8),
            "limit",
            Some(10.0),
            Goal::AtMost(1.0),
        );
        assert_eq!((one.met, one.interval), (Some(Verdict::No), None));
        // Three runs against a limit: judged on all three, as three pairs
        // are; over it and under it, a tie.
        let cpu = |runs: &[f64]| {
            row(
                "cpu",
                "%",
                median(runs.to_vec()),
                "limit",
                Some(10.0),
                Goal::AtMost(1.0),
            )
            .runs(runs)
        };
        let across = cpu(&[10.4, 9.6, 10.07]);
        assert_eq!(across.met, Some(Verdict::Tie));
        assert!(close(across.ratio.unwrap(), 1.007));
        let (lo, hi) = across.pairs.unwrap();
        assert!(close(lo, 0.96) && close(hi, 1.04), "{lo} {hi}");
        let i = across.interval.unwrap();
        assert!(
            close(i.lo, 0.96) && close(i.hi, 1.04) && i.confidence == 0.75,
            "{i:?}"
        );
        assert_eq!(cpu(&[7.9, 8.08, 8.3]).met, Some(Verdict::Yes));
        assert_eq!(cpu(&[12.1, 13.3, 15.0]).met, Some(Verdict::No));
        // One run: its ratio alone; no limit: nothing to judge against.
        let lone = cpu(&[11.8]);
        assert_eq!((lone.met, lone.interval), (Some(Verdict::No), None));
        let unlimited = row("cpu", "%", Some(8.0), "-", None, Goal::Info).runs(&[7.0, 8.0, 9.0]);
        assert_eq!((unlimited.met, unlimited.pairs), (None, None));
        let info =
            row("lat", "us", Some(1.0), "peer", Some(2.0), Goal::Info).pairs(fifteen(|_| 0.5));
        assert_eq!(info.met, None);
        // The table says so, with the interval and its confidence.
        let i = even.interval.unwrap();
        let t = table(&[even]);
        let line = t.lines().nth(1).unwrap();
        assert!(line.ends_with("tie"), "{t}");
        assert!(
            line.contains(&format!("{:.2}-{:.2} 96%", i.lo, i.hi)),
            "{t}"
        );
        assert!(t.contains("median in: where the median"), "{t}");
        let json = serde_json::to_value(&one_off).unwrap();
        assert_eq!(json["met"], "yes");
        assert_eq!(json["interval"]["lo"], 0.9);
    }

    #[test]
    fn each_row_says_both_regimes_and_latency_rows_both_p99s() {
        let rows = [
            row(
                "tcp 64 B ping-pong, half round trip",
                "us",
                Some(4.0),
                "sockperf pp --tcp --nonblocked --mps=max",
                Some(2.0),
                Goal::AtMost(1.0),
            )
            .regimes(POLL, "busy poll")
            .p99(Some(5.5), Some(3.25))
            .pairs(Pairs::of(&[
                (3.5, 2.0, Some(0.0), Some(0.0)),
                (5.0, 2.0, Some(120.0), Some(0.0)),
            ])),
            row(
                "tcp reliable 1000000 B",
                "MB/s",
                Some(300.0),
                "iperf3, one stream, -l 1000000",
                None,
                Goal::AtLeast(1.0),
            )
            .regimes(WAIT, BLOCKING),
        ];
        assert_eq!(rows[0].ratio, Some(2.0));
        assert_eq!(rows[0].met, Some(Verdict::No));
        assert_eq!(rows[1].met, None, "no peer figure, no verdict");
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("regime ours / theirs") && lines[0].contains("their p99"));
        assert!(lines[1].contains("poll / busy poll"), "{t}");
        assert!(
            lines[1].contains("5.50") && lines[1].contains("3.25"),
            "{t}"
        );
        assert!(lines[1].trim_end().ends_with("NO"), "{t}");
        assert!(
            lines[0].contains("pairs") && lines[1].contains("1.75-2.50"),
            "{t}"
        );
        // The host took 120 ms from our second run; the first pair alone
        // was calm.
        assert!(
            lines[0].contains("host ms") && lines[1].contains("120/0"),
            "{t}"
        );
        assert!(
            lines[0].contains("calm") && lines[1].contains("1.75 (1)"),
            "{t}"
        );
        assert!(t.contains("host ms: the processor time"), "{t}");
        assert!(
            lines[2].contains("wait / blocking") && lines[2].contains("n.a."),
            "{t}"
        );
        let j = serde_json::to_value(&rows[0]).unwrap();
        assert_eq!(j["host"]["calm_pairs"], 1);
        assert_eq!(j["host"]["pairs"][1]["host_ours_ms"], 120.0);
        assert_eq!(j["ours_regime"], "poll");
        assert_eq!(j["peer_regime"], "busy poll");
        assert_eq!(j["theirs_p99"], 3.25);
        assert_eq!(j["pairs"], serde_json::json!([1.75, 2.5]));
        let j = serde_json::to_value(&rows[1]).unwrap();
        assert!(j.get("pairs").is_none() && j.get("host").is_none(), "{j}");
    }

    #[test]
    fn a_row_of_pairs_probed_for_the_placement_says_below_the_table_how_many_held_it() {
        let placed = Placement {
            run: 11,
            steady: 9,
            of_steady: true,
            level: None,
            line_us: Some((0.05, 0.07)),
        };
        let r = row(
            "shm 8 B ping-pong, half rt",
            "us",
            Some(0.09),
            "ucx_perftest tag_lat (posix,self)",
            Some(0.10),
            Goal::AtMost(1.0),
        )
        .placement(placed);
        let t = table(std::slice::from_ref(&r));
        assert!(
            t.lines().any(|l| l.starts_with(
                "placement: shm 8 B ping-pong, half rt (- / -): 9 of 11 pairs with both runs"
            ) && l.contains("0.050-0.070 us")),
            "{t}"
        );
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["placement"]["steady"], 9);
        assert_eq!(j["placement"]["of_steady"], true);
        // A row without probes prints no such line.
        let plain = row("x", "us", Some(1.0), "y", Some(1.0), Goal::Info);
        assert!(!table(&[plain]).contains("placement:"));
    }

    #[test]
    fn a_run_of_ours_beside_sockperf_lasts_as_long_as_its_counted_run() {
        let span = Duration::from_millis(1600);
        // 5 us a half round trip: 160,000 round trips in 1.6 s.
        assert_eq!(iterations_for(span, 5.0, 20_000), 160_000);
        // 40 us: 20,000; slower, the floor; far faster, a hundred floors.
        assert_eq!(iterations_for(span, 40.0, 20_000), 20_000);
        assert_eq!(iterations_for(span, 400.0, 20_000), 20_000);
        assert_eq!(iterations_for(span, 0.001, 20_000), 2_000_000);
        assert_eq!(iterations_for(span, 0.0, 20_000), 2_000_000);
    }

    #[test]
    fn an_unlike_row_is_not_judged_and_says_why_below_the_table() {
        assert!(shared_memory_only("sm,self") && shared_memory_only("posix, cma,self"));
        assert!(!shared_memory_only("tcp") && !shared_memory_only("sm,tcp"));
        let unlike = |size| {
            row(
                &format!("ucx (sm) put {size} B"),
                "MB/s",
                Some(10_000.0),
                "ucx_perftest ucp_put_bw (sm,self)",
                Some(30_000.0),
                Goal::Info,
            )
            .regimes(POLL, BUSY_PROGRESS)
            .note(UCX_SHM_PUT)
        };
        let judged = row(
            "ucx (tcp) put 1000000 B",
            "MB/s",
            Some(2_000.0),
            "ucx_perftest ucp_put_bw (tcp)",
            Some(2_200.0),
            Goal::AtLeast(0.95),
        );
        let rows = [unlike(1_000_000), judged, unlike(4_000_000)];
        assert_eq!(rows[0].met, None);
        assert_eq!(rows[1].met, Some(Verdict::No));
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[1].contains("- [1]") && !lines[1].contains("NO"),
            "{t}"
        );
        assert!(!lines[2].contains('['), "{t}");
        assert!(lines[3].contains("- [1]"), "{t}");
        // One note for both rows that share it.
        assert_eq!(lines.len(), 5, "{t}");
        assert!(lines[4].starts_with("[1] ucx_perftest puts into buffers UCX allocated"));
        let j = serde_json::to_value(&rows[0]).unwrap();
        assert!(j["note"].as_str().unwrap().contains("software emulation"));
    }
}
