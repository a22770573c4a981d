//! `macrolink up` on the embedded cluster, and `macrolink node` running one
//! host each from a cluster file, found by name or by the launcher's rank.

use macrolink_testbed::Peer;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");
const SECRET: &str = "cluster test secret, long enough";

#[test]
fn up_starts_the_embedded_cluster_and_checks_its_path() {
    let out = Command::new(EXE)
        .args(["up", "--mib", "8"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("compute0")).collect();
    assert_eq!(
        rows.len(),
        3,
        "a striped transfer, cp up and cp down: {text}"
    );
    for row in &rows {
        assert!(
            row.contains("store0")
                && row.contains(" yes ")
                && row.contains(&(8u64 << 20).to_string())
                && row.contains("gw0,gw1"),
            "{row}"
        );
    }
    assert!(
        rows[1].ends_with("(cp up)") && rows[2].ends_with("(cp down)"),
        "{text}"
    );
    // The embedded default's macro-cluster, managed by gw0.
    let err = String::from_utf8_lossy(&out.stderr);
    let managed = err
        .lines()
        .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["m0", "gw0", "1"]);
    assert!(managed, "{err}");
    for h in ["compute0", "gw0", "gw1", "store0"] {
        assert!(
            err.lines()
                .any(|l| l.starts_with(h) && l.contains(" healthy ")),
            "{h}: {err}"
        );
    }
}

#[test]
fn up_joins_two_segments_through_the_relay_pair() {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/clusters/two-segments.toml"
    );
    let out = Command::new(EXE)
        .args(["up", file, "--mib", "8"])
        .output()
        .unwrap();
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{text}\n{err}");
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("compute0")).collect();
    assert_eq!(
        rows.len(),
        3,
        "a striped transfer, cp up and cp down: {text}"
    );
    for r in &rows {
        assert!(r.contains(" yes ") && r.contains("gw0,gw1"), "{text}");
    }
    assert!(rows[1].ends_with("(cp up)") && rows[2].ends_with("(cp down)"));
    for relay in ["relay-east", "relay-west"] {
        assert!(err.contains(&format!("{relay} (relay) up")), "{err}");
    }
}

/// Kills a host process if the test ends before it does.
struct Reap(Peer);

impl Drop for Reap {
    fn drop(&mut self) {
        self.0.kill();
    }
}

/// Across a relay pair, a storage host with no lane: the contact crosses
/// (`ls` works), file data is refused by name rather than sent where the
/// far side cannot answer.
#[test]
fn across_the_relays_without_a_lane_cp_says_so_and_ls_works() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("c.toml");
    let export = d.path().join("export");
    std::fs::create_dir(&export).unwrap();
    // Its own meeting directory: other tests run hosts with the same node ids.
    let run = d.path().join("run");
    std::fs::write(export.join("there"), b"x").unwrap();
    std::fs::write(
        &file,
        r#"
[[host]]
name = "cpu"
role = "compute"
node = 1
fabric = "127.0.0.1:7401"
[[host]]
name = "disk"
role = "storage"
node = 10
storage = "127.0.0.1:7410"
files = "127.0.0.1:7430"
export = "EXPORT"
[[host]]
name = "relay-e"
role = "relay"
node = 91
fabric = "127.0.0.1:7440"
long = "127.0.0.1:7450"
[[host]]
name = "relay-w"
role = "relay"
node = 92
fabric = "127.0.0.1:7460"
long = "127.0.0.1:7470"
[[segment]]
name = "east"
hosts = ["cpu"]
relay = "relay-e"
[[segment]]
name = "west"
hosts = ["disk"]
relay = "relay-w"
"#
        .replace("EXPORT", export.to_str().unwrap()),
    )
    .unwrap();
    let host = |name: &str| {
        let mut c = Command::new(EXE);
        c.args(["node"]).arg(&file).args(["--host", name]);
        c.env("MACROLINK_SECRET", SECRET)
            .env("XDG_RUNTIME_DIR", &run);
        Reap(Peer::spawn_cmd(c).unwrap())
    };
    let _hosts = ["disk", "relay-e", "relay-w"].map(host);
    let client = |args: &[&str]| {
        let out = Command::new(EXE)
            .args(args)
            .arg("--cluster")
            .arg(&file)
            .args(["--host", "cpu"])
            .env("MACROLINK_SECRET", SECRET)
            .env("XDG_RUNTIME_DIR", &run)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, text) = client(&["ls", "ml://disk/"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("there"), "{text}");
    let src = d.path().join("src");
    std::fs::write(&src, b"some bytes").unwrap();
    let (code, text) = client(&["cp", src.to_str().unwrap(), "ml://disk/new"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains("across the relay pair") && text.contains("[[lane]]"),
        "{text}"
    );
    assert!(!export.join("new").exists());
}

#[test]
fn node_runs_each_host_of_a_file_by_name_or_rank() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("c.toml");
    let export = d.path().join("export");
    std::fs::create_dir(&export).unwrap();
    // Its own meeting directory: other tests run hosts with the same node ids.
    let run = d.path().join("run");
    std::fs::write(
        &file,
        r#"
[[host]]
name = "cpu"
role = "compute"
node = 1
fabric = "127.0.0.1:7201"

[[host]]
name = "gw"
role = "gateway"
node = 21
fabric = "127.0.0.1:7221"

[[host]]
name = "disk"
role = "storage"
node = 10
storage = "127.0.0.1:7210"
files = "127.0.0.1:7230"
export = "EXPORT"

[[lane]]
gateways = ["gw"]
storage = ["disk"]
"#
        .replace("EXPORT", export.to_str().unwrap()),
    )
    .unwrap();
    let host = |name: &str| {
        let mut c = Command::new(EXE);
        c.args(["node"]).arg(&file).args(["--host", name]);
        c.env("MACROLINK_SECRET", SECRET)
            .env("XDG_RUNTIME_DIR", &run);
        Reap(Peer::spawn_cmd(c).unwrap())
    };
    let _disk = host("disk");
    let _gw = host("gw");
    // The compute host is rank 0 under Slurm.
    let out = Command::new(EXE)
        .args(["node"])
        .arg(&file)
        .args(["--mib", "4"])
        .env("SLURM_PROCID", "0")
        .env("MACROLINK_SECRET", SECRET)
        .env("XDG_RUNTIME_DIR", &run)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("cpu")).collect();
    assert_eq!(
        rows.len(),
        3,
        "a striped transfer, cp up and cp down: {text}"
    );
    assert!(rows.iter().all(|l| l.contains(" yes ")), "{text}");
    assert!(
        export.join("check-cpu").metadata().is_err(),
        "the check cleans up"
    );
    // A rank past the hosts, and an unknown name, are clear errors.
    let bad = Command::new(EXE)
        .args(["node"])
        .arg(&file)
        .env("SLURM_PROCID", "9")
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("SLURM_PROCID=9"));
    let bad = Command::new(EXE)
        .args(["node"])
        .arg(&file)
        .args(["--host", "nope"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no host named"));
}

/// Host process `rank` of `file`, as a launcher starts it: its rank in the
/// environment, the secret only in the cluster file, nodes meeting in
/// `run`'s directory.
fn rank(file: &std::path::Path, run: &std::path::Path, rank: usize, extra: &[&str]) -> Command {
    let mut c = Command::new(EXE);
    c.arg("node").arg(file).args(extra);
    c.env("SLURM_PROCID", rank.to_string())
        .env("XDG_RUNTIME_DIR", run)
        .env_remove("MACROLINK_SECRET")
        .env_remove("MACROLINK_SECRET_FILE");
    c
}

#[test]
fn a_job_of_one_host_per_rank_ends_when_its_compute_host_is_done() {
    let d = tempfile::tempdir().unwrap();
    let file = macrolink_testbed::site::write(d.path(), 7600).unwrap();
    let run = d.path().join("run");
    let args = ["--until-done", "--mib", "4"];
    // Services first, in reverse rank order, so that the compute host finds
    // them up; each waits for the compute host to say it is done.
    let services: Vec<_> = (1..4)
        .rev()
        .map(|r| Reap(Peer::spawn_cmd(rank(&file, &run, r, &args)).unwrap()))
        .collect();
    let out = rank(&file, &run, 0, &args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = text.lines().filter(|l| l.starts_with("compute0")).count();
    assert_eq!(rows, 3, "{text}");
    for mut s in services {
        assert!(
            s.0.wait_exit(std::time::Duration::from_secs(20)),
            "a service host ended with the job"
        );
    }
    let left = macrolink_testbed::site::sockets_left(&run.join("macrolink"));
    assert!(left.is_empty(), "sockets left behind: {left:?}");
}

#[test]
fn a_host_ended_by_a_signal_leaves_no_socket_behind() {
    let d = tempfile::tempdir().unwrap();
    let file = macrolink_testbed::site::write(d.path(), 7650).unwrap();
    let run = d.path().join("run");
    let shm = run.join("macrolink");
    for (r, sig) in [(1, libc::SIGTERM), (3, libc::SIGINT)] {
        let mut host = Reap(Peer::spawn_cmd(rank(&file, &run, r, &[])).unwrap());
        assert!(!macrolink_testbed::site::sockets_left(&shm).is_empty());
        // SAFETY: kill sends a signal to a process id; it touches no memory.
        assert_eq!(unsafe { libc::kill(host.0.pid() as i32, sig) }, 0);
        assert!(host.0.wait_exit(std::time::Duration::from_secs(10)));
        let left = macrolink_testbed::site::sockets_left(&shm);
        assert!(left.is_empty(), "rank {r}: sockets left behind: {left:?}");
    }
}

#[test]
fn a_storage_host_without_an_export_is_told_what_to_add() {
    let d = tempfile::tempdir().unwrap();
    let file = macrolink_testbed::site::write(d.path(), 7680).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let bare: String = text
        .lines()
        .filter(|l| !l.starts_with("export"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&file, bare).unwrap();
    let out = rank(&file, &d.path().join("run"), 3, &[]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("add export = "), "{err}");
}

#[test]
fn up_ended_by_a_signal_takes_its_hosts_and_scratch_with_it() {
    use std::io::BufRead;
    let d = tempfile::tempdir().unwrap();
    let file = macrolink_testbed::site::write(d.path(), 7850).unwrap();
    let tmp = d.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut up = Command::new(EXE)
        .arg("up")
        .arg(&file)
        .args(["--mib", "1", "--stay"])
        .env("TMPDIR", &tmp)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(up.stderr.take().unwrap()).lines();
    let said = err
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("hosts running"));
    assert!(said, "up never said its hosts run");
    let hosts = children_of(up.id());
    assert_eq!(hosts.len(), 3, "two gateways and a storage host: {hosts:?}");
    // SAFETY: kill sends a signal to a process id; it touches no memory.
    assert_eq!(unsafe { libc::kill(up.id() as i32, libc::SIGTERM) }, 0);
    let status = up.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while hosts
        .iter()
        .any(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
    {
        assert!(
            std::time::Instant::now() < until,
            "hosts outlived up: {hosts:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(left.is_empty(), "scratch left behind: {left:?}");
}

/// The process ids whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                // pid (comm) state ppid ...: the comm may hold spaces.
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// The process of host `host` among `pids` (its command line names it).
fn process_of(pids: &[u32], host: &str) -> Option<u32> {
    pids.iter().copied().find(|p| {
        std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
            let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
            args.windows(2)
                .any(|w| w[0] == b"--host" && w[1] == host.as_bytes())
        })
    })
}

/// Host `host`'s state as `manage status --json` says, if it answers.
fn state_of(file: &std::path::Path, host: &str) -> Option<String> {
    let out = Command::new(EXE)
        .args(["manage", "status", "--json"])
        .arg(file)
        .env_remove("MACROLINK_SECRET")
        .env_remove("MACROLINK_SECRET_FILE")
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(v["hosts"][host]["state"].as_str()?.to_string())
}

#[test]
fn up_restarts_a_killed_host_on_its_reset_and_a_host_killed_again_is_excluded_and_avoided() {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    let d = tempfile::tempdir().unwrap();
    let fast = "probe_ms = 100\nsuspicion_ms = 400\nlease_ms = 800\n\
                again_within_s = 60\ncome_back_s = 30\n";
    let file = macrolink_testbed::site::write_with_managers(d.path(), 7950, fast).unwrap();
    // Ends `up` (and with it its hosts) whatever happens below.
    struct Ends(std::process::Child);
    impl Drop for Ends {
        fn drop(&mut self) {
            // SAFETY: kill sends a signal to a process id; it touches no memory.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
        }
    }
    let mut up = Ends(
        Command::new(EXE)
            .arg("up")
            .arg(&file)
            .args(["--mib", "1", "--stay"])
            .env_remove("MACROLINK_SECRET")
            .env_remove("MACROLINK_SECRET_FILE")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let up_pid = up.0.id();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let err = up.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut said = Vec::new();
    let mut wait_for = |what: &str, secs: u64| -> String {
        let until = Instant::now() + Duration::from_secs(secs);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(l) if l.contains(what) => return l,
                Ok(l) => said.push(l),
                Err(_) => break,
            }
        }
        panic!("up never said {what:?}: {said:#?}");
    };
    wait_for("hosts running", 60);
    let until = Instant::now() + Duration::from_secs(10);
    while state_of(&file, "gw1").as_deref() != Some("healthy") {
        assert!(Instant::now() < until, "gw1 never healthy");
        std::thread::sleep(Duration::from_millis(100));
    }
    // gw1's process killed: the central manager resets it, `up` starts it again.
    let first = process_of(&children_of(up_pid), "gw1").expect("gw1's process");
    // SAFETY: kill sends a signal to a process id; it touches no memory.
    assert_eq!(unsafe { libc::kill(first as i32, libc::SIGKILL) }, 0);
    let line = wait_for("gw1: reset: process", 20);
    let second = process_of(&children_of(up_pid), "gw1").expect("gw1 started again");
    assert_ne!(first, second, "{line}");
    assert!(line.ends_with(&second.to_string()), "{line}");
    let until = Instant::now() + Duration::from_secs(15);
    while state_of(&file, "gw1").as_deref() != Some("healthy") {
        assert!(Instant::now() < until, "gw1 never came back");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Killed again within the window: excluded, not reset again.
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(second as i32, libc::SIGKILL) }, 0);
    let until = Instant::now() + Duration::from_secs(20);
    while state_of(&file, "gw1").as_deref() != Some("excluded") {
        assert!(Instant::now() < until, "gw1 never excluded");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        process_of(&children_of(up_pid), "gw1").is_none(),
        "an excluded host is not started again"
    );
    // A copy through the lane now leaves gw1 (node 22) out.
    let src = d.path().join("x");
    std::fs::write(&src, macrolink_testbed::data::pattern(8 << 20, 9)).unwrap();
    let cp = Command::new(EXE)
        .arg("cp")
        .arg("--cluster")
        .arg(&file)
        .arg(&src)
        .arg("ml://store0/x")
        .env_remove("MACROLINK_SECRET")
        .env_remove("MACROLINK_SECRET_FILE")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&cp.stderr);
    assert!(cp.status.success(), "{text}");
    let through = text
        .lines()
        .find_map(|l| l.strip_prefix("chunks through gateways: "))
        .unwrap_or_default();
    assert!(
        through.starts_with("node 21: ") && !through.contains("node 22"),
        "{text}"
    );
    assert!(std::fs::read(d.path().join("export/x")).unwrap() == std::fs::read(&src).unwrap());
}
