//! `macrolink link` between two namespaces: traffic crosses it, delayed,
//! rate-limited and dropped as asked, and it reports what it did. The
//! bounds here are loose (that the impairment is there, not how precise
//! it is: the README states the accuracy measured by hand).

use macrolink_testbed::require;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");

/// A child killed (and reaped) on drop, the first line it printed, and
/// what it prints after.
struct Spawned(Child, String, Option<std::thread::JoinHandle<String>>);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(args: &[&str]) -> Spawned {
    let mut c = Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    // Keep reading what follows, so the child never blocks on a full pipe.
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        while out.read_line(&mut rest).is_ok_and(|n| n > 0) {}
        rest
    });
    Spawned(c, line, Some(rest))
}

fn run_in(ns: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, EXE])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Runs `macrolink bench ARGS --connect` in namespace `a` against a target
/// started in `b` on `port`, its rows written to `json`.
fn bench_across(a: &str, b: &str, port: u16, args: &str, json: &std::path::Path) {
    let at = format!("10.77.0.2:{port}");
    // Its node meets under a directory of the test's own, which goes with
    // it: the target is killed at the end and leaves its socket file.
    let runtime = tempfile::tempdir().unwrap();
    let env = format!("XDG_RUNTIME_DIR={}", runtime.path().display());
    let serve = spawn(&[
        "ip", "netns", "exec", b, "env", &env, EXE, "bench", "serve", "--tcp", &at,
    ]);
    assert!(serve.1.starts_with("ready"), "{}", serve.1);
    let mut all: Vec<&str> = vec!["bench"];
    all.extend(args.split_whitespace());
    all.extend(["--connect", &at, "--json", json.to_str().unwrap()]);
    let (ok, out) = run_in(a, &all);
    assert!(ok, "{out}");
}

fn rows(path: &std::path::Path) -> Vec<Value> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.as_array().unwrap().clone()
}

#[test]
fn the_link_delays_limits_and_counts_what_crosses_it() {
    let Some(ns) = require::namespaces(2) else {
        return;
    };
    let (a, b) = (&ns.names[0], &ns.names[1]);
    let link = spawn(&[
        EXE, "link", "--json", a, b, "delay", "5ms", "rate", "100mbit",
    ]);
    assert!(link.1.starts_with("ready a="), "{}", link.1);
    let d = tempfile::tempdir().unwrap();
    let lat = d.path().join("lat.json");
    let lat_args = "lat --transport tcp --sizes 8 --count 40";
    bench_across(a, b, 7000, lat_args, &lat);
    let half_rtt_us = rows(&lat)[0]["usec"]["median"].as_f64().unwrap();
    assert!(
        (5_000.0..30_000.0).contains(&half_rtt_us),
        "a 5 ms link gave a half round trip of {half_rtt_us} us"
    );
    let bw = d.path().join("bw.json");
    let bw_args =
        "bw --transport tcp --mode reliable --completion wait --sizes 1048576 --seconds 1";
    bench_across(a, b, 7001, bw_args, &bw);
    let mbs = rows(&bw)[0]["mb_per_s"].as_f64().unwrap();
    assert!(
        mbs > 1.0 && mbs < 12.5 * 1.05,
        "100 Mbit/s carried {mbs} MB/s"
    );
    // SIGTERM: the counters, as JSON.
    let mut link = link;
    // SAFETY: kill sends a signal to a child this test owns.
    unsafe { libc::kill(link.0.id() as i32, libc::SIGTERM) };
    let mut status = None;
    for _ in 0..100 {
        status = link.0.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let said = link.2.take().unwrap().join().unwrap();
    let counters: Value = serde_json::from_str(said.lines().last().unwrap()).unwrap();
    for way in ["a_to_b", "b_to_a"] {
        let c = &counters[way];
        let n = |k: &str| c[k].as_u64().unwrap();
        assert!(n("offered") > 1000, "{counters}");
        let fates = n("carried") + n("queue_drops") + n("lost") + n("in_flight");
        assert_eq!(fates, n("offered"), "{way}");
        assert!(n("delayed") > 0);
    }
}

/// Two segments, one per namespace, joined by `macrolink link` (20 ms each
/// way, 1 % loss both ways) and a pair of relays: 64 MiB go through the
/// relays to an echo on the far side and come back whole; then the far
/// relay is killed and the near side's writes fail instead of hanging.
#[test]
fn the_relay_pair_carries_a_long_lossy_link_and_its_death_is_an_error() {
    use macrolink_fabric::{
        Addr, Completion, EndpointConfig, Key, Mode, Node, NodeConfig, RecvKind, Transport,
    };
    use std::time::Instant;
    let Some(ns) = require::namespaces(2) else {
        return;
    };
    let (a, b) = (&ns.names[0], &ns.names[1]);
    let _link = spawn(&[
        EXE, "link", "--mtu", "9000", a, b, "delay", "20ms", "loss", "1%", "seed", "11",
    ]);
    let d = tempfile::tempdir().unwrap();
    let secret = d.path().join("secret");
    std::fs::write(&secret, "a long link's cluster secret, 32 b").unwrap();
    let file = d.path().join("two.toml");
    std::fs::write(
        &file,
        r#"
[[host]]
name = "near"
role = "compute"
node = 1
fabric = "127.0.0.1:7601"
[[host]]
name = "far"
role = "compute"
node = 2
fabric = "127.0.0.1:7602"
[[host]]
name = "relay-a"
role = "relay"
node = 91
fabric = "127.0.0.1:7640"
long = "10.77.0.1:7650"
[[host]]
name = "relay-b"
role = "relay"
node = 92
fabric = "127.0.0.1:7660"
long = "10.77.0.2:7670"
[[segment]]
name = "a"
hosts = ["near"]
relay = "relay-a"
[[segment]]
name = "b"
hosts = ["far"]
relay = "relay-b"
[range]
packet = 8900
dead_ms = 1000
"#,
    )
    .unwrap();
    let (file, secret) = (file.to_str().unwrap(), secret.to_str().unwrap());
    let relay = |ns: &str, host: &str| {
        spawn(&[
            "ip",
            "netns",
            "exec",
            ns,
            EXE,
            "relay",
            file,
            "--host",
            host,
            "--secret-file",
            secret,
            "--metrics",
            "127.0.0.1:7690",
        ])
    };
    let _ra = relay(a, "relay-a");
    let mut rb = relay(b, "relay-b");
    assert!(rb.1.starts_with("ready"), "{}", rb.1);
    let echo = spawn(&[
        "ip",
        "netns",
        "exec",
        b,
        EXE,
        "echo",
        "--node",
        "2",
        "--tcp",
        "127.0.0.1:7602",
        "--secret-file",
        secret,
        "--region",
        "0",
        "--shm-dir",
        d.path().to_str().unwrap(),
    ]);
    assert!(
        echo.1.starts_with("node") || echo.1.starts_with("ready"),
        "{}",
        echo.1
    );
    let key = Key::from_secret(&std::fs::read(secret).unwrap()).unwrap();
    let (ns_a, rb_pid) = (a.clone(), rb.0.id());
    std::thread::spawn(move || {
        macrolink_testbed::netns::enter(&ns_a).unwrap();
        let mut cfg = NodeConfig::local(1, "/nonexistent");
        cfg.shm_dir = None;
        cfg.key = Some(key);
        cfg.peers.insert(2, "127.0.0.1:7640".parse().unwrap());
        let node = Node::start(cfg).unwrap();
        let ep_cfg = EndpointConfig {
            completion: Completion::Wait,
            send_timeout: Some(Duration::from_secs(30)),
            ..EndpointConfig::default()
        };
        let mut ep = node.open(1, ep_cfg).unwrap();
        let t = ep.target(Addr::new(2, 1), Mode::Reliable).unwrap();
        let start = Instant::now();
        let mut back = vec![0u8; 1 << 20];
        for i in 0..64u64 {
            let m = macrolink_testbed::data::pattern(1 << 20, i);
            ep.write(t, &m).unwrap();
            let r = ep
                .read_timeout(&mut back, Duration::from_secs(30))
                .unwrap()
                .expect("an echo");
            assert_eq!(
                blake3::hash(&back[..r.len]),
                blake3::hash(&m),
                "message {i}"
            );
        }
        let secs = start.elapsed().as_secs_f64();
        eprintln!("64 MiB out and back over 20 ms + 1 % loss: {secs:.1} s");
        // Datagrams cross too, once each: what 1 % loss each way leaves.
        let dt = ep
            .target_via(Addr::new(2, 1), Mode::Datagram, Transport::Udp)
            .unwrap();
        let mut echoed = 0;
        for i in 0..200u64 {
            let m = macrolink_testbed::data::pattern(1000 + i as usize, i);
            ep.write(dt, &m).unwrap();
            if let Some(r) = ep.read_timeout(&mut back, Duration::from_secs(1)).unwrap() {
                assert_eq!(r.kind, RecvKind::Message(Mode::Datagram));
                assert_eq!(&back[..r.len], &m[..], "datagram {i}");
                echoed += 1;
            }
        }
        eprintln!("datagrams: {echoed} of 200 came back");
        assert!(echoed >= 180, "{echoed} of 200 datagrams came back");
        // The near relay's counters, once refreshed: all of it went out
        // (asked again until they say so, for at most 10 s).
        let value = |m: &str, name: &str| -> Option<u64> {
            m.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        };
        let wanted = [
            ("macrolink_relay_bytes_sent_total ", 64 << 20),
            ("macrolink_relay_flows_out_total ", 1),
            ("macrolink_relay_flows_open ", 1),
            ("macrolink_relay_datagrams_out_total ", 180),
        ];
        let asked = Instant::now();
        loop {
            let m = macrolink_metrics::get("127.0.0.1:7690".parse().unwrap(), "/metrics").unwrap();
            let short: Vec<_> = wanted
                .iter()
                .filter(|(name, least)| value(&m, name).is_none_or(|v| v < *least))
                .collect();
            if short.is_empty() {
                break;
            }
            assert!(
                asked.elapsed() < Duration::from_secs(10),
                "counters short of {short:?}: {m}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // The far relay dies mid-transfer: an error within seconds.
        // SAFETY: kill sends a signal to a child the test owns.
        unsafe { libc::kill(rb_pid as i32, libc::SIGKILL) };
        let died = Instant::now();
        let m = vec![7u8; 1 << 20];
        let err = loop {
            if let Err(e) = ep.write(t, &m) {
                break e;
            }
            assert!(died.elapsed() < Duration::from_secs(20), "still writing");
        };
        eprintln!("after the relay died: {err} in {:?}", died.elapsed());
        assert!(died.elapsed() < Duration::from_secs(10));
    })
    .join()
    .unwrap();
    let _ = rb.0.wait();
}

/// `macrolink cp` from one segment to a storage host of the other and
/// back, across the relay pair over a 20 ms link that loses 1 %: the
/// contact goes through the relays, the data through the lane's gateway.
#[test]
fn cp_crosses_the_relay_pair_over_a_long_lossy_link() {
    let Some(ns) = require::namespaces(2) else {
        return;
    };
    let (a, b) = (&ns.names[0], &ns.names[1]);
    let _link = spawn(&[
        EXE, "link", "--mtu", "9000", a, b, "delay", "20ms", "loss", "1%", "seed", "5",
    ]);
    let d = tempfile::tempdir().unwrap();
    let secret = d.path().join("secret");
    std::fs::write(&secret, "a long link's cluster secret, 32 b").unwrap();
    let export = d.path().join("export");
    std::fs::create_dir(&export).unwrap();
    let file = d.path().join("two.toml");
    std::fs::write(
        &file,
        r#"
secret_file = "secret"
[[host]]
name = "near"
role = "compute"
node = 1
fabric = "127.0.0.1:7601"
[[host]]
name = "gw0"
role = "gateway"
node = 21
fabric = "127.0.0.1:7621"
[[host]]
name = "store0"
role = "storage"
node = 10
storage = "127.0.0.1:7610"
files = "127.0.0.1:7611"
[[host]]
name = "relay-a"
role = "relay"
node = 91
fabric = "127.0.0.1:7640"
long = "10.77.0.1:7650"
[[host]]
name = "relay-b"
role = "relay"
node = 92
fabric = "127.0.0.1:7660"
long = "10.77.0.2:7670"
[[segment]]
name = "a"
hosts = ["near"]
relay = "relay-a"
[[segment]]
name = "b"
hosts = ["gw0", "store0"]
relay = "relay-b"
[[lane]]
gateways = ["gw0"]
storage = ["store0"]
[range]
packet = 8900
"#,
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let shm = d.path().to_str().unwrap();
    let host = |ns: &str, name: &str, extra: &[&str]| {
        let mut args = vec![
            "ip",
            "netns",
            "exec",
            ns,
            EXE,
            "node",
            file,
            "--host",
            name,
            "--shm-dir",
            shm,
        ];
        args.extend(extra);
        let s = spawn(&args);
        assert!(s.1.starts_with("ready"), "{name}: {}", s.1);
        s
    };
    let _ra = host(a, "relay-a", &[]);
    let _rb = host(b, "relay-b", &[]);
    let _gw = host(b, "gw0", &[]);
    let _store = host(b, "store0", &["--export", export.to_str().unwrap()]);
    let src = d.path().join("src");
    let data = macrolink_testbed::data::pattern(16 << 20, 3);
    std::fs::write(&src, &data).unwrap();
    let back = d.path().join("back");
    let cp = |args: &[&str]| {
        let mut all = vec!["cp", "--cluster", file];
        all.extend(args);
        run_in(a, &all)
    };
    let (ok, out) = cp(&["--host", "near", src.to_str().unwrap(), "ml://store0/big"]);
    assert!(ok, "cp up: {out}");
    assert_eq!(std::fs::read(export.join("big")).unwrap(), data, "{out}");
    let (ok, out) = cp(&["--host", "near", "ml://store0/big", back.to_str().unwrap()]);
    assert!(ok, "cp down: {out}");
    assert_eq!(std::fs::read(&back).unwrap(), data, "{out}");
    eprintln!("cp up and down, 16 MiB over 20 ms + 1 % loss: {out}");
    // Without saying which host it runs on, the client dials the far
    // host's own address, which this segment cannot reach: a clear error.
    let (ok, out) = cp(&[src.to_str().unwrap(), "ml://store0/other"]);
    eprintln!("without --host: {out}");
    assert!(!ok && out.contains("name this host with --host"), "{out}");
    assert!(!export.join("other").exists());
}

/// `macrolink bench range`, a tiny sweep: one distance, one and two
/// streams, macrolink through the relays and straight over the link (the
/// iperf3 rows need iperf3, which the test does not install); every IMB
/// pattern both ways; the emulator's accuracy checks. Shapes only: what
/// the figures are is for the README, not for a test.
#[test]
fn bench_range_puts_every_contender_on_the_same_link() {
    if require::namespaces(0).is_none() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("range.json");
    let out = Command::new(EXE)
        .args([
            "bench",
            "range",
            "--km",
            "2",
            "--streams",
            "1,2",
            "--seconds",
            "1",
        ])
        .args([
            "--rate",
            "200mbit",
            "--contenders",
            "relays,direct",
            "--latency",
            "50",
            "--accuracy",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let list = |k: &str| {
        all[k]
            .as_array()
            .unwrap_or_else(|| panic!("{k}: {all}"))
            .clone()
    };
    let rows = list("throughput");
    assert_eq!(rows.len(), 4, "{rows:?}");
    for r in &rows {
        let of_link = r["of_link"].as_f64().unwrap();
        assert!((0.05..1.3).contains(&of_link), "{r}");
        assert_eq!(r["km"].as_f64(), Some(2.0));
    }
    let who: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["contender"].as_str().unwrap(),
                r["streams"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        who,
        [("relays", 1), ("relays", 2), ("direct", 1), ("direct", 2)]
    );
    // The latency rows: every pattern on both paths, a fit of each.
    let patterns = ["PingPong", "PingPing", "SendRecv", "Exchange"];
    let lat = list("latency");
    assert_eq!(lat.len(), 8, "{lat:?}");
    for via_relays in [true, false] {
        for p in patterns {
            let r = lat
                .iter()
                .find(|r| r["pattern"] == p && r["via_relays"] == via_relays)
                .unwrap_or_else(|| panic!("no {p}, relays {via_relays}: {lat:?}"));
            let median = r["median_us"].as_f64().unwrap();
            assert!(median.is_finite() && median > 0.0, "{r}");
            assert!(r["mean_us"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["p99_us"].as_f64().unwrap() >= median, "{r}");
        }
    }
    let fits = list("latency_fit");
    let fitted: Vec<&str> = fits
        .iter()
        .map(|f| f["pattern"].as_str().unwrap())
        .collect();
    assert_eq!(fitted, patterns);
    for f in &fits {
        assert!(f["pair_us"].as_f64().unwrap().is_finite(), "{f}");
        assert!(f["per_km_us"].is_null(), "one distance, no slope: {f}");
    }
    for p in patterns {
        let rows = text
            .lines()
            .filter(|l| l.split_whitespace().nth(2) == Some(p));
        assert_eq!(rows.count(), 2, "{p}: a row per path\n{text}");
        let fit = text
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(p));
        assert_eq!(fit.count(), 1, "{p}: its fit\n{text}");
    }
    assert!(
        text.contains("relay pair adds") && text.contains("1.48 us"),
        "{text}"
    );
    // The accuracy rows: each check, in order, with a finite figure.
    let acc = list("accuracy");
    let asked: Vec<&str> = acc.iter().map(|r| r["asked"].as_str().unwrap()).collect();
    assert_eq!(
        asked,
        [
            "delay 0",
            "delay 1ms",
            "delay 10ms",
            "rate 200mbit",
            "rate 100mbit",
            "loss 1% seed 7"
        ],
        "{acc:?}"
    );
    for r in &acc {
        let measured = r["measured"].as_f64().unwrap();
        assert!(measured.is_finite(), "{r}");
        let baseline = r["asked"] == "delay 0";
        assert_eq!(r["met"].is_boolean(), !baseline, "{r}");
        assert_eq!(r["bound"]["low"].is_number(), !baseline, "{r}");
        match r["what"].as_str().unwrap() {
            "rate" => assert!(measured > 0.0, "{r}"),
            "loss" => {
                assert!((0.0..=100.0).contains(&measured), "{r}");
                assert!(
                    r["note"].as_str().unwrap().contains("link says it dropped"),
                    "{r}"
                );
            }
            _ => assert!(!baseline || measured > 0.0, "{r}"),
        }
    }
    let printed = text.lines().filter(|l| {
        let first = l.split_whitespace().next();
        matches!(first, Some("delay" | "rate" | "loss"))
    });
    assert_eq!(printed.count(), 6, "{text}");
}

/// The pid's state letter from `/proc/PID/stat` (`None`: gone).
fn state_of(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// The processes in namespace `ns`.
fn pids_in(ns: &str) -> Vec<i32> {
    let out = Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// `bench range` stopped by SIGTERM mid-run takes down what it started
/// (the link, both relays, the target, the client) and removes its
/// namespaces and its directory, where before they outlived it.
#[test]
fn bench_range_stopped_by_a_signal_leaves_nothing_behind() {
    let Some(_guard) = require::namespaces(0) else {
        return;
    };
    let mut bench = Command::new(EXE)
        .args(["bench", "range", "--km", "10", "--streams", "1"])
        .args(["--seconds", "60", "--rate", "200mbit"])
        .args(["--contenders", "relays"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    struct Reap<'a>(&'a mut Child);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    /// What the run made, taken down here if the test fails first.
    #[derive(Default)]
    struct Leftovers {
        names: Vec<String>,
        pids: Vec<i32>,
        dir: Option<std::path::PathBuf>,
    }
    impl Drop for Leftovers {
        fn drop(&mut self) {
            for p in &self.pids {
                let _ = Command::new("kill")
                    .args(["-KILL", &p.to_string()])
                    .status();
            }
            for n in &self.names {
                for p in pids_in(n) {
                    let _ = Command::new("kill")
                        .args(["-KILL", &p.to_string()])
                        .status();
                }
                let _ = Command::new("ip").args(["netns", "del", n]).status();
            }
            if let Some(d) = &self.dir {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
    let pid = bench.id() as i32;
    let mut left = Leftovers::default();
    let bench = Reap(&mut bench);
    let prefix = format!("mlns{pid}-");
    // Wait (at most 30 s) until the run is under way: both namespaces hold
    // processes and the link runs as the bench's child.
    let t0 = std::time::Instant::now();
    let (names, inside, children) = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "bench range never got going"
        );
        std::thread::sleep(Duration::from_millis(200));
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        let names: Vec<String> = String::from_utf8_lossy(&list.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(&prefix))
            .map(str::to_string)
            .collect();
        let inside: Vec<Vec<i32>> = names.iter().map(|n| pids_in(n)).collect();
        let children = macrolink_testbed::undo::children_of(pid);
        left.names = names.clone();
        left.pids = children.clone();
        // Relay A and the client in A; relay B and the target in B.
        if names.len() == 2 && inside.iter().all(|p| p.len() >= 2) && children.len() >= 3 {
            break (names, inside.concat(), children);
        }
    };
    // The run's directory, from a relay's command line (its cluster file).
    let dir = inside
        .iter()
        .find_map(|p| {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
            cmdline
                .split(|&b| b == 0)
                .map(|a| std::path::PathBuf::from(String::from_utf8_lossy(a).into_owned()))
                .find(|a| a.ends_with("two.toml"))
                .and_then(|a| a.parent().map(|d| d.to_path_buf()))
        })
        .expect("a relay's cluster file");
    left.dir = Some(dir.clone());
    assert!(dir.exists());
    let term = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = macrolink_testbed::peer::exit_within(bench.0, Duration::from_secs(20))
        .expect("bench range did not end on SIGTERM");
    let mut said = String::new();
    let _ = std::io::Read::read_to_string(bench.0.stderr.as_mut().unwrap(), &mut said);
    assert_eq!(status.code(), Some(128 + 15), "{said}");
    assert!(said.contains("stopped by signal 15"), "{said}");
    let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&list.stdout);
    for n in &names {
        assert!(!left.contains(n.as_str()), "{n} is still there: {left}");
    }
    for p in inside.iter().chain(&children) {
        let state = state_of(*p);
        assert!(
            matches!(state, None | Some('Z')),
            "process {p} (state {state:?}) outlived bench range: {said}"
        );
    }
    assert!(!dir.exists(), "{} is still there", dir.display());
}
