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
    let serve = spawn(&[
        "ip", "netns", "exec", b, EXE, "bench", "serve", "--tcp", &at,
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
