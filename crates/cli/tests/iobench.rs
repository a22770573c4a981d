//! `macrolink iobench` on a directory and on an ml:// export: tiny runs
//! whose numbers must add up.

use macrolink_testbed::Peer;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");
const SECRET: &str = "iobench test secret, long enough";

fn rows(target: &str, shm: &std::path::Path, json: &std::path::Path) -> Vec<serde_json::Value> {
    let out = Command::new(EXE)
        .args([
            "iobench",
            target,
            "--workers",
            "3",
            "--sizes",
            "64KiB,1MiB",
            "--file-size",
            "2MiB",
            "--random-blocks",
            "4KiB",
            "--json",
        ])
        .arg(json)
        .arg("--shm-dir")
        .arg(shm)
        .env("MACROLINK_SECRET", SECRET)
        .output()
        .unwrap();
    let text = succeeded(&out);
    assert!(text.contains("eff MB/s"), "{text}");
    serde_json::from_slice::<Vec<serde_json::Value>>(&std::fs::read(json).unwrap()).unwrap()
}

/// The standard output of a run that must have succeeded.
fn succeeded(out: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}{err}");
    text
}

/// A temporary directory with an empty `data` directory in it.
fn with_data() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir(&data).unwrap();
    (d, data)
}

fn check(rows: &[serde_json::Value], with_random: bool) {
    let want = 2 * 2 * 2 + usize::from(with_random);
    assert_eq!(rows.len(), want, "{rows:#?}");
    for r in rows {
        assert_eq!(r["workers"], 3);
        assert_eq!(r["bytes"].as_u64().unwrap(), 3 * (2 << 20), "{r}");
        let eff = r["effective_mb_s"].as_f64().unwrap();
        let xfer = r["transfer_mb_s"].as_f64().unwrap();
        assert!(eff > 0.0 && eff <= xfer * 1.000001, "{r}");
    }
    let pats: Vec<_> = rows
        .iter()
        .map(|r| r["pattern"].as_str().unwrap())
        .collect();
    assert!(pats.contains(&"n-n") && pats.contains(&"n-1"));
}

#[test]
fn iobench_on_a_directory_adds_up_and_cleans_up() {
    let (d, data) = with_data();
    let r = rows(
        data.to_str().unwrap(),
        &d.path().join("shm"),
        &d.path().join("r.json"),
    );
    check(&r, true);
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0, "files left");
}

#[test]
fn iobench_on_an_export_adds_up_and_cleans_up() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("export");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    let shm = d.path().join("shm");
    let mut cmd = Command::new(EXE);
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .arg(&root)
        .arg("--shm-dir")
        .arg(&shm)
        .env("MACROLINK_SECRET", SECRET);
    let server = Peer::spawn_cmd(cmd).unwrap();
    let r = rows(
        &format!("ml://{}/sub", server.tcp),
        &shm,
        &d.path().join("r.json"),
    );
    check(&r, false);
    assert_eq!(std::fs::read_dir(root.join("sub")).unwrap().count(), 0);
}

#[test]
fn iobench_under_a_launcher_runs_one_worker_per_rank() {
    let (d, data) = with_data();
    let json = d.path().join("r.json");
    // What a launcher does: the same command once per rank, with its rank.
    let ranks: Vec<_> = (0..3)
        .map(|r| {
            Command::new(EXE)
                .args(["iobench", data.to_str().unwrap()])
                .args(["--sizes", "64KiB,1MiB", "--file-size", "2MiB"])
                .args(["--random-blocks", "4KiB", "--json"])
                .arg(&json)
                .env("PMI_RANK", r.to_string())
                .env("PMI_SIZE", "3")
                .env("PMI_JOBID", "iobench-test")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for o in &outs {
        assert!(o.status.success());
    }
    assert!(String::from_utf8_lossy(&outs[0].stdout).contains("eff MB/s"));
    assert!(outs[1].stdout.is_empty(), "only rank 0 reports");
    let r: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    check(&r, true);
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0, "files left");
}

#[test]
fn iobench_beside_fio_alternates_runs_and_says_how_fio_ran() {
    let (d, data) = with_data();
    let json = d.path().join("r.json");
    let out = Command::new(EXE)
        .args(["iobench", data.to_str().unwrap(), "--fio", "--runs", "2"])
        .args(["--workers", "2", "--sizes", "1MiB", "--file-size", "4MiB"])
        .args(["--random-blocks", "64KiB", "--json"])
        .arg(&json)
        .arg("--shm-dir")
        .arg(d.path().join("shm"))
        .output()
        .unwrap();
    let text = succeeded(&out);
    assert!(
        text.contains("eff range") && text.contains("fio range"),
        "{text}"
    );
    assert!(text.contains("the median run of 2"), "{text}");
    assert!(
        text.contains("--ioengine=psync") && text.contains("--end_fsync=1"),
        "{text}"
    );
    let rows: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // n-n and n-1, write and read, and the random write.
    assert_eq!(rows.len(), 5, "{rows:#?}");
    for r in &rows {
        assert_eq!(r["runs"], 2, "{r}");
        let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
        assert!(f("effective_low_mb_s") <= f("effective_mb_s"), "{r}");
        assert!(f("effective_mb_s") <= f("effective_high_mb_s"), "{r}");
        assert!(f("fio_low_mb_s") > 0.0, "{r}");
        assert!(f("fio_low_mb_s") <= f("fio_mb_s") && f("fio_mb_s") <= f("fio_high_mb_s"));
    }
    // Neither side's files stay: fio's last write was read and removed.
    let left: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "files left: {left:?}");
}
