//! `macrolink bench` with tiny sweeps: the output's structure, and numbers
//! that are positive and consistent (bytes moved = size x messages). No
//! assertion on speed.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");

fn run(args: &[&str]) -> String {
    run_in(None, args)
}

/// As [`run`], with nodes meeting under `runtime` (its `XDG_RUNTIME_DIR`)
/// when given, apart from other tests' nodes of the same ids.
fn run_in(runtime: Option<&Path>, args: &[&str]) -> String {
    let mut c = Command::new(EXE);
    if let Some(r) = runtime {
        c.env("XDG_RUNTIME_DIR", r);
    }
    let out = c.args(args).output().expect("macrolink runs");
    assert!(
        out.status.success(),
        "macrolink {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(path: &Path) -> Vec<Value> {
    serde_json::from_str::<Value>(&std::fs::read_to_string(path).unwrap())
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"))
}

#[test]
fn bw_rows_are_consistent_and_written_three_ways() {
    let d = tempfile::tempdir().unwrap();
    let (j, c, p) = (
        d.path().join("bw.json"),
        d.path().join("bw.csv"),
        d.path().join("bw.png"),
    );
    let table = run(&[
        "bench",
        "bw",
        "--transport",
        "shm,tcp",
        "--mode",
        "datagram,reliable,put",
        "--completion",
        "poll,wait",
        "--sizes",
        "10,1000,3000",
        "--count",
        "40",
        "--json",
        j.to_str().unwrap(),
        "--csv",
        c.to_str().unwrap(),
        "--plot",
        p.to_str().unwrap(),
    ]);
    let rows = json(&j);
    assert_eq!(rows.len(), 2 * 3 * 2 * 3);
    assert_eq!(
        table.lines().count(),
        1 + rows.len() + 1,
        "header, rows, plot line"
    );
    for r in &rows {
        let size = num(r, "size");
        if r["mode"] == "datagram" && size > 2048.0 {
            assert!(
                r["mb_per_s"].is_null(),
                "datagram above the MTU is n.a.: {r}"
            );
            continue;
        }
        assert_eq!(num(r, "sent"), 40.0, "{r}");
        // Connected transports lose nothing, even in datagram mode.
        assert_eq!(num(r, "delivered"), 40.0, "{r}");
        assert_eq!(num(r, "bytes"), size * 40.0, "{r}");
        for k in [
            "seconds",
            "mb_per_s",
            "msgs_per_s",
            "cpu_initiator",
            "cpu_target",
        ] {
            assert!(num(r, k) > 0.0, "{k} in {r}");
        }
        assert!(r.get("arrivals").is_none(), "only with --arrivals: {r}");
        let mbs = num(r, "bytes") / num(r, "seconds") / 1e6;
        assert!(
            (mbs - num(r, "mb_per_s")).abs() < 1e-6 * mbs.max(1.0),
            "{r}"
        );
    }
    assert!(table.contains("n.a."));
    let csv = std::fs::read_to_string(&c).unwrap();
    assert!(csv.starts_with("transport,mode,completion,size,"));
    assert_eq!(csv.lines().count(), rows.len() + 1);
    assert_eq!(&std::fs::read(&p).unwrap()[..4], b"\x89PNG");
}

/// Large messages to a waiting target over shared memory, both sides'
/// buffers on huge pages: the target reads them into its buffer on huge
/// pages (the sender places them there), every byte counted.
#[test]
fn bw_on_huge_pages_carries_every_byte_and_says_so() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("bw.json");
    for pages in ["huge", "base"] {
        run(&[
            "bench",
            "bw",
            "--transport",
            "shm",
            "--mode",
            "reliable",
            "--completion",
            "wait",
            "--sizes",
            "3000000",
            "--count",
            "30",
            "--pages",
            pages,
            "--json",
            j.to_str().unwrap(),
        ]);
        let rows = json(&j);
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(r["pages"], pages, "{r}");
        assert_eq!(num(r, "delivered"), 30.0, "{r}");
        assert_eq!(num(r, "bytes"), 3e6 * 30.0, "{r}");
        assert!(num(r, "mb_per_s") > 0.0, "{r}");
    }
}

#[test]
fn a_warm_up_runs_before_the_counted_run_and_is_left_out_of_it() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("w.json");
    let t = std::time::Instant::now();
    run(&[
        "bench",
        "bw",
        "--transport",
        "tcp",
        "--sizes",
        "1000",
        "--count",
        "40",
        "--warm",
        "1.5",
        "--json",
        j.to_str().unwrap(),
    ]);
    // A second and a half of traffic went first: the command took that at
    // least, and the row counts the 40 messages alone.
    assert!(t.elapsed().as_secs_f64() >= 1.5, "{:?}", t.elapsed());
    let rows = json(&j);
    assert_eq!(rows.len(), 1);
    assert_eq!(num(&rows[0], "sent"), 40.0);
    assert_eq!(num(&rows[0], "bytes"), 40_000.0);
    assert!(num(&rows[0], "seconds") < 1.5, "{}", rows[0]);
}

#[test]
fn arrivals_say_when_the_targets_messages_came_at_most_4096_a_row() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("a.json");
    run(&[
        "bench",
        "bw",
        "--transport",
        "tcp",
        "--mode",
        "reliable,datagram",
        "--sizes",
        "100",
        "--count",
        "10000",
        "--json",
        j.to_str().unwrap(),
        "--arrivals",
    ]);
    let rows = json(&j);
    let r = rows.iter().find(|r| r["mode"] == "reliable").unwrap();
    let a: Vec<(u64, u64)> = r["arrivals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_u64().unwrap()))
        .collect();
    // 10,000 messages: every third one, 3,333 of them, and the last.
    assert_eq!(a.len(), 3334);
    assert!(a[..3333]
        .iter()
        .enumerate()
        .all(|(i, p)| p.1 == 3 * (i as u64 + 1)));
    assert_eq!(a[3333].1, 10_000);
    assert!(a.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
    // Within the run on the one clock the row's start is read from.
    let start = num(r, "started_ns");
    let end = start + num(r, "seconds") * 1e9;
    assert!(
        a[0].0 as f64 >= start && a[a.len() - 1].0 as f64 <= end,
        "{start} {end} {a:?}"
    );
    // A datagram run has none.
    let g = rows.iter().find(|r| r["mode"] == "datagram").unwrap();
    assert!(g.get("arrivals").is_none(), "{g}");
}

#[test]
fn udp_datagram_rows_count_what_arrived() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("u.json");
    run(&[
        "bench",
        "bw",
        "--transport",
        "udp",
        "--mode",
        "datagram",
        "--sizes",
        "100,2048,4096",
        "--count",
        "50",
        "--json",
        j.to_str().unwrap(),
    ]);
    let rows = json(&j);
    assert_eq!(rows.len(), 3);
    for r in &rows[..2] {
        let got = num(r, "delivered");
        assert!(got > 0.0 && got <= 50.0, "{r}");
        assert_eq!(num(r, "bytes"), got * num(r, "size"), "{r}");
    }
    assert!(rows[2]["mb_per_s"].is_null());
}

#[test]
fn lat_patterns_report_ordered_summaries() {
    let d = tempfile::tempdir().unwrap();
    let (j, p) = (d.path().join("l.json"), d.path().join("l.png"));
    let table = run(&[
        "bench",
        "lat",
        "--pattern",
        "ping-pong,ping-ping,send-recv,exchange",
        "--transport",
        "shm,tcp",
        "--sizes",
        "8,5000",
        "--count",
        "30",
        "--json",
        j.to_str().unwrap(),
        "--plot",
        p.to_str().unwrap(),
    ]);
    let rows = json(&j);
    assert_eq!(rows.len(), 4 * 2 * 2);
    assert!(
        table.ends_with(&format!("plot: {}\n", p.display())),
        "{table}"
    );
    let png = std::fs::read(&p).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    for r in &rows {
        let u = &r["usec"];
        let (min, med, p99) = (num(u, "min"), num(u, "median"), num(u, "p99"));
        assert!(0.0 < min && min <= med && med <= p99, "{r}");
        assert_eq!(num(r, "iterations"), 30.0);
        let each = num(r, "mb_per_s_each_way");
        let factor = if r["test"] == "Exchange" { 2.0 } else { 1.0 };
        assert!(
            (each - factor * num(r, "size") / med).abs() < 1e-6 * each,
            "{r}"
        );
        let both = num(r, "mb_per_s_both");
        let k = if r["test"] == "PingPong" { 1.0 } else { 2.0 };
        assert!((both - k * each).abs() < 1e-6 * both, "{r}");
    }
}

#[test]
fn udp_datagram_ping_pong() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("u.json");
    run(&[
        "bench",
        "lat",
        "--pattern",
        "ping-pong,exchange",
        "--transport",
        "udp",
        "--mode",
        "datagram",
        "--sizes",
        "64",
        "--count",
        "30",
        "--json",
        j.to_str().unwrap(),
    ]);
    let rows = json(&j);
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| num(&r["usec"], "median") > 0.0));
}

#[test]
fn oneway_and_breakdown_add_up() {
    let d = tempfile::tempdir().unwrap();
    let (o, b) = (d.path().join("o.json"), d.path().join("b.json"));
    run(&[
        "bench",
        "oneway",
        "--count",
        "50",
        "--json",
        o.to_str().unwrap(),
    ]);
    for r in json(&o) {
        assert!(num(&r, "error_usec") > 0.0, "{r}");
        // One host, one clock: the offset lies within its error bound.
        assert!(
            num(&r, "offset_usec").abs() <= num(&r, "error_usec") + 1.0,
            "{r}"
        );
        assert!(num(&r["usec"], "median") > 0.0, "{r}");
    }
    let table = run(&[
        "bench",
        "breakdown",
        "--transport",
        "shm,tcp,udp",
        "--count",
        "50",
        "--json",
        b.to_str().unwrap(),
    ]);
    assert!(table.contains("T_startup") && table.contains("T_delivery"));
    let rows = json(&b);
    assert_eq!(
        rows.len(),
        6,
        "shm, tcp and udp (datagrams), 1 B and 1500 B"
    );
    for r in &rows {
        let parts: f64 = ["startup", "send", "net", "delivery"]
            .iter()
            .map(|k| num(r, k))
            .sum();
        assert!((parts - num(r, "total")).abs() < 1e-9, "{r}");
        for k in ["startup", "send", "delivery"] {
            assert!(num(r, k) >= 0.0, "{k} in {r}");
        }
        assert!(num(r, "total") > 0.0, "{r}");
    }
}

/// A child process killed if the test fails before it exits by itself.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a benchmark target, its node meeting others under `runtime`;
/// returns it and the address its ready line names.
fn target(runtime: &Path, args: &[&str]) -> (Reap, String) {
    let mut target = Reap(
        Command::new(EXE)
            .args(args)
            .env("XDG_RUNTIME_DIR", runtime)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(target.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("tcp="))
        .unwrap()
        .to_owned();
    (target, addr)
}

#[test]
fn two_hosts_via_listen_and_connect() {
    let d = tempfile::tempdir().unwrap();
    let (mut target, addr) = target(d.path(), &["bench", "bw", "--listen", "127.0.0.1:0"]);
    let j = d.path().join("r.json");
    run_in(
        Some(d.path()),
        &[
            "bench",
            "bw",
            "--connect",
            &addr,
            "--transport",
            "tcp",
            "--mode",
            "reliable,put",
            "--sizes",
            "1000",
            "--count",
            "25",
            "--json",
            j.to_str().unwrap(),
        ],
    );
    for r in json(&j) {
        assert_eq!(num(&r, "bytes"), 25_000.0, "{r}");
    }
    // The initiator tells the target to quit when it is done.
    assert!(target.0.wait().unwrap().success());
}

#[test]
fn bench_serve_outlives_strangers_and_serves_the_readme_example() {
    use std::io::Write;
    let d = tempfile::tempdir().unwrap();
    let (mut target, addr) = target(d.path(), &["bench", "serve", "--tcp", "127.0.0.1:0"]);
    // Strangers: garbage for a hello, a hello that stops half-way, a
    // member that connects to the control endpoint and leaves, a datagram.
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.write_all(&[0xab; 200]).unwrap();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.write_all(&[0x4c; 10]).unwrap();
    drop(s);
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let mut h = macrolink_wire::Header::new(macrolink_wire::FrameKind::Hello);
    (h.src_node, h.src_ep, h.dst_ep) = (9, 9, macrolink_bench::CTL_EP);
    macrolink_fabric::handshake(&mut s, &macrolink_fabric::Key::open(), h).unwrap();
    drop(s);
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    u.send_to(b"hello?", &addr).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(target.0.try_wait().unwrap().is_none(), "bench serve exited");
    // The README's example, as written: no node ids given.
    let out = run_in(
        Some(d.path()),
        &[
            "bench",
            "lat",
            "--connect",
            &addr,
            "--transport",
            "tcp",
            "--sizes",
            "8",
            "--count",
            "50",
        ],
    );
    assert!(out.contains("tcp"), "{out}");
    assert!(target.0.wait().unwrap().success());
}

#[test]
fn files_bench_rows_have_every_case_and_positive_rates() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("files.json");
    let work = d.path().join("work");
    let text = run(&[
        "bench",
        "files",
        "--size",
        "3MiB",
        "--runs",
        "1",
        "--dir",
        work.to_str().unwrap(),
        "--json",
        j.to_str().unwrap(),
    ]);
    assert!(text.contains("download to /dev/null"), "{text}");
    // Over shared memory the xrdcp ratio is not judged, and the run says why.
    assert!(text.contains("xrdcp has no shared-memory path"), "{text}");
    assert!(text.contains("each with 2 data streams"), "{text}");
    assert!(text.contains("host ms: the processor time"), "{text}");
    let rows = json(&j);
    let cases: Vec<&str> = rows.iter().map(|r| r["case"].as_str().unwrap()).collect();
    assert_eq!(
        cases,
        ["download to /dev/null", "download to a file", "upload"]
    );
    for r in &rows {
        assert!(num(r, "ours_mb_s") > 0.0 && num(r, "cp_mb_s") > 0.0, "{r}");
        // The xrdcp column is there when xrootd is installed, else null.
        assert!(r["xrdcp_mb_s"].is_null() || num(r, "xrdcp_mb_s") > 0.0);
        // Linux counts what the host took (steal) in /proc/stat.
        assert!(
            r["ours_host_ms"].is_u64() && r["cp_host_ms"].is_u64(),
            "{r}"
        );
    }
    // What it made in a directory it was given, it removed.
    assert!(!work.join("export/src").exists() && !work.join("local/up").exists());
}

#[test]
fn manage_bench_times_detection_resets_and_takeovers_and_stays_quiet_under_loss() {
    if macrolink_testbed::require::namespaces(0).is_none() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("manage.json");
    let text = run(&[
        "bench",
        "manage",
        "--groups",
        "1",
        "--hosts",
        "3",
        "--trials",
        "1",
        "--takeovers",
        "2",
        "--soak",
        "8",
        "--stall",
        "2",
        "--json",
        j.to_str().unwrap(),
    ]);
    assert!(text.contains("SlurmdTimeout 300 s"), "{text}");
    let out = &json(&j)[0];
    let rows = out["rows"].as_array().unwrap();
    let events: Vec<&str> = rows.iter().map(|r| r["event"].as_str().unwrap()).collect();
    assert_eq!(events.len(), 6, "{rows:?}");
    for r in rows {
        assert_eq!(r["trials"], 1, "{r}");
        let m = num(r, "median_s");
        // Positive, and within the detection or takeover bound (plus slack).
        assert!(m > 0.0 && m < 5.0, "{r}");
        assert!(num(r, "max_s") >= m, "{r}");
    }
    assert_eq!(
        (&out["thawed"], &out["thawed_acted"]),
        (&1.into(), &0.into()),
        "{out}"
    );
    let soak = &out["soak"];
    // The firewall dropped some of the group's datagrams, and nobody was
    // failed, reset or excluded for it.
    assert!(soak["dropped"].as_u64().unwrap() > 0, "{soak}");
    assert!(soak["datagrams"].as_u64().unwrap() > soak["dropped"].as_u64().unwrap());
    for k in ["false_failures", "false_resets", "false_exclusions"] {
        assert_eq!(soak[k], 0, "{k}: {soak}");
    }
}

/// In a process of its own: its polling threads would count in a test's
/// reading of its own process's CPU time.
#[test]
fn idle_rows_name_their_quiet_connections_in_order() {
    let dir = tempfile::tempdir().unwrap();
    for completion in ["poll", "wait"] {
        let j = dir.path().join(format!("idle-{completion}.json"));
        let out = run(&[
            "bench",
            "idle",
            "--quiet",
            "0,6",
            "--count",
            "100",
            "--completion",
            completion,
            "--json",
            j.to_str().unwrap(),
        ]);
        let rows = json(&j);
        assert_eq!(rows.len(), 2, "{out}");
        for (r, quiet) in rows.iter().zip([0.0, 6.0]) {
            assert_eq!(num(r, "quiet"), quiet);
            assert!(num(r, "median_us") > 0.0 && num(r, "p99_us") >= num(r, "median_us"));
        }
        assert!(out.contains(&format!("both sides {completion}")), "{out}");
        let lines: Vec<_> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert!(lines[3].trim_start().starts_with('6'), "{out}");
    }
}

/// What is left in `dir`.
fn left_in(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

/// A session's target meets its client in a directory of its own, which
/// goes with the run.
#[test]
fn a_bench_session_takes_its_directory_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(EXE)
        .args(["bench", "lat", "--transport", "tcp", "--sizes", "8"])
        .args(["--count", "20"])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(left_in(tmp.path()), Vec::<std::path::PathBuf>::new());
}

/// `bench files` stopped by SIGTERM while it makes its files removes its
/// directory (and what it started), where before the directory outlived
/// it.
#[test]
fn bench_files_stopped_by_a_signal_removes_its_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bench = Command::new(EXE)
        .args([
            "bench", "files", "--size", "2GiB", "--runs", "1", "--no-shm",
        ])
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    struct Reap<'a>(&'a mut std::process::Child);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = bench.id();
    let bench = Reap(&mut bench);
    // Under way: its directory holds the export it fills.
    let t0 = std::time::Instant::now();
    while !left_in(tmp.path())
        .iter()
        .any(|d| d.join("export").exists())
    {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "bench files made no directory: {:?}",
            left_in(tmp.path())
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let term = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = macrolink_testbed::peer::exit_within(bench.0, std::time::Duration::from_secs(20))
        .expect("bench files did not end on SIGTERM");
    let mut said = String::new();
    let _ = std::io::Read::read_to_string(bench.0.stderr.as_mut().unwrap(), &mut said);
    assert_eq!(status.code(), Some(128 + 15), "{said}");
    assert_eq!(
        left_in(tmp.path()),
        Vec::<std::path::PathBuf>::new(),
        "{said}"
    );
}

/// `bench compare --only` makes the groups named and no other, and
/// `--pairs` sets the pairs behind each alternated latency row (UCX is
/// installed wherever the tests run, `.ci/run`).
#[test]
fn compare_makes_only_the_groups_asked_for_with_the_pairs_asked_for() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("compare.json");
    let compare = |only: &str| {
        let table = run(&[
            "bench",
            "compare",
            "--only",
            only,
            "--seconds",
            "0.2",
            "--iterations",
            "2000",
            "--pairs",
            "3",
            "--json",
            j.to_str().unwrap(),
        ]);
        (table, json(&j))
    };
    let (table, rows) = compare("cpu");
    let figures: Vec<&str> = rows.iter().map(|r| r["figure"].as_str().unwrap()).collect();
    assert_eq!(
        figures,
        [
            "shm put 1 MB, target CPU",
            "shm put 1 MB, initiator CPU",
            "shm reliable 1 MB, target CPU",
            "shm reliable 1 MB, initiator CPU",
            "tcp put 1 MB, target CPU",
            "tcp put 1 MB, initiator CPU",
            "tcp reliable 1 MB, target CPU",
            "tcp reliable 1 MB, initiator CPU",
        ]
    );
    for r in &rows {
        assert!(num(r, "ours") >= 0.0, "{r}");
        assert_eq!(r["ours_regime"], "wait", "{r}");
    }
    // A target's CPU is judged beside the limit at the bandwidth it was
    // measured at, which the row names.
    for r in rows
        .iter()
        .filter(|r| r["figure"].as_str().unwrap().ends_with("target CPU"))
    {
        let peer = r["peer"].as_str().unwrap();
        let mb = peer
            .strip_suffix(" MB/s")
            .and_then(|p| p.rsplit_once(", at "))
            .and_then(|(_, mb)| mb.parse::<f64>().ok());
        assert!(mb.is_some_and(|mb| mb > 0.0), "{r}");
    }
    assert!(!table.contains("ping-pong"), "{table}");

    let (table, rows) = compare("shm");
    assert!(
        rows.iter()
            .all(|r| r["figure"].as_str().unwrap().starts_with("shm ")),
        "{rows:?}"
    );
    let lat = &rows[0];
    assert_eq!(lat["figure"], "shm 8 B ping-pong, half rt, median of 3");
    assert!(num(lat, "ours") > 0.0 && num(lat, "theirs") > 0.0, "{lat}");
    // Three pairs asked for; up to three times as many run looking for
    // pairs of one placement.
    let placed = &lat["placement"];
    let (run, steady) = (
        placed["run"].as_u64().unwrap(),
        placed["steady"].as_u64().unwrap(),
    );
    assert!((3..=9).contains(&run) && steady <= run, "{lat}");
    // The figures are of the pairs in one placement where there are
    // enough of them (of those in the most common one, where they fell
    // in more than one), else of every pair.
    let counted = match (placed["of_steady"].as_bool().unwrap(), placed.get("level")) {
        (true, Some(k)) => k.as_u64().unwrap(),
        (true, None) => steady,
        (false, _) => run,
    };
    assert_eq!(
        lat["host"]["pairs"].as_array().unwrap().len() as u64,
        counted,
        "{lat}"
    );
    // Its verdict is of the interval that holds its pairs' median ratio.
    let i = &lat["interval"];
    let (lo, hi, sure) = (num(i, "lo"), num(i, "hi"), num(i, "confidence"));
    assert!(lo > 0.0 && lo <= hi && sure > 0.0 && sure < 1.0, "{lat}");
    assert!(
        ["yes", "no", "tie"].contains(&lat["met"].as_str().unwrap()),
        "{lat}"
    );
    assert!(table.contains("median in: where the median"), "{table}");
    assert!(
        table.contains("placement: shm 8 B ping-pong, half rt, median of 3"),
        "{table}"
    );
    assert!(!table.contains("target CPU"), "{table}");
}
