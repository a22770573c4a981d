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
    assert_eq!(rows.len(), 1, "{text}");
    assert!(
        rows[0].contains(" yes ") && rows[0].contains("gw0,gw1"),
        "{text}"
    );
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

#[test]
fn node_runs_each_host_of_a_file_by_name_or_rank() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("c.toml");
    let export = d.path().join("export");
    std::fs::create_dir(&export).unwrap();
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
        c.env("MACROLINK_SECRET", SECRET);
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
