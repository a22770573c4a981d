//! macrolink under real launchers: a Slurm cluster of four nodes on this
//! machine (`.ci/slurm` starts it in CI) and Open MPI's `mpirun`. One host
//! of a cluster file per rank, `iobench` with one worker per rank, a batch
//! job, and `scancel` of a job of hosts that leaves nothing behind.
//!
//! Where no Slurm answers, or `mpirun` is missing, these tests say so and
//! pass, unless `MACROLINK_REQUIRE_SLURM=1` / `MACROLINK_REQUIRE_MPI=1`
//! (CI) makes that a failure.

use macrolink_testbed::{require, site};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");

/// The four Slurm nodes hold one task each: one job at a time.
static SLURM: Mutex<()> = Mutex::new(());

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `c` for at most `limit`; its output.
fn run(mut c: Command, limit: Duration) -> Output {
    let mut child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{c:?} ran past {limit:?}\n{}\n{}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A command with the environment of a test job: nodes meet in `run`, no
/// secret but the cluster file's.
fn job(program: &str, run: &Path) -> Command {
    let mut c = Command::new(program);
    c.env("XDG_RUNTIME_DIR", run)
        .env_remove("MACROLINK_SECRET")
        .env_remove("MACROLINK_SECRET_FILE");
    c
}

/// The compute host's check rows, all verified, from a job's output.
fn check_rows(out: &str) {
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("compute0")).collect();
    assert_eq!(rows.len(), 3, "a striped transfer, cp up, cp down: {out}");
    assert!(rows.iter().all(|r| r.contains(" yes ")), "{out}");
}

#[test]
fn srun_runs_one_host_per_rank_and_the_job_ends_with_the_compute_host() {
    let Some(()) = require::slurm() else { return };
    let _one = SLURM.lock().unwrap_or_else(|e| e.into_inner());
    let d = tempfile::tempdir().unwrap();
    let file = site::write(d.path(), 7700).unwrap();
    let run_dir = d.path().join("run");
    let mut c = job("srun", &run_dir);
    c.args([
        "-N4",
        "-n4",
        "--kill-on-bad-exit=1",
        "--time=2",
        EXE,
        "node",
    ])
    .arg(&file)
    .args(["--until-done", "--mib", "8"]);
    let out = run(c, Duration::from_secs(150));
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    eprintln!("{o}{e}");
    assert!(out.status.success(), "{o}\n{e}");
    check_rows(&o);
    assert_eq!(
        e.matches("every compute host is done (1)").count(),
        3,
        "both gateways and the storage host ended with the job: {e}"
    );
    let left = site::sockets_left(&run_dir.join("macrolink"));
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn srun_iobench_reports_once_for_all_four_ranks() {
    let Some(()) = require::slurm() else { return };
    let _one = SLURM.lock().unwrap_or_else(|e| e.into_inner());
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let json = d.path().join("r.json");
    let mut c = job("srun", d.path());
    c.args(["-n4", "--time=2", EXE, "iobench"])
        .arg(&data)
        .args(["--sizes", "64KiB,1MiB", "--file-size", "2MiB", "--json"])
        .arg(&json);
    let out = run(c, Duration::from_secs(150));
    let o = text(&out.stdout);
    eprintln!("{o}{}", text(&out.stderr));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(o.matches("eff MB/s").count(), 1, "one report: {o}");
    let rows: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(r["workers"].as_u64(), Some(4), "{r}");
    }
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0, "files left");
}

/// Writes a batch script that runs `line` under `sh`.
fn script(dir: &Path, line: &str) -> std::path::PathBuf {
    let p = dir.join("job.sh");
    std::fs::write(&p, format!("#!/bin/sh\nset -e\n{line}\n")).unwrap();
    p
}

/// Waits until Slurm no longer knows job `id`.
fn gone(id: &str, limit: Duration) {
    let until = Instant::now() + limit;
    loop {
        let q = Command::new("squeue")
            .args(["-h", "-j", id])
            .output()
            .unwrap();
        if text(&q.stdout).trim().is_empty() {
            return;
        }
        assert!(
            Instant::now() < until,
            "job {id} still queued: {}",
            text(&q.stdout)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn sbatch_runs_a_job_of_hosts_and_scancel_leaves_nothing_behind() {
    let Some(()) = require::slurm() else { return };
    let _one = SLURM.lock().unwrap_or_else(|e| e.into_inner());
    let d = tempfile::tempdir().unwrap();
    let file = site::write(d.path(), 7750).unwrap();
    let run_dir = d.path().join("run");
    let out_file = d.path().join("job.out");

    // A batch job that ends by itself.
    let ends = script(
        d.path(),
        &format!("srun {EXE} node {} --until-done --mib 4", file.display()),
    );
    let mut c = job("sbatch", &run_dir);
    c.args(["--wait", "-N4", "-n4", "--time=2", "-o"])
        .arg(&out_file)
        .arg(&ends);
    let out = run(c, Duration::from_secs(150));
    let o = std::fs::read_to_string(&out_file).unwrap_or_default();
    assert!(out.status.success(), "{}\n{o}", text(&out.stderr));
    check_rows(&o);

    // A job of services that would run for ever, cancelled once the
    // compute host's check is through.
    let stays = script(
        d.path(),
        &format!("srun {EXE} node {} --mib 4", file.display()),
    );
    std::fs::remove_file(&out_file).unwrap();
    let mut c = job("sbatch", &run_dir);
    c.args(["--parsable", "-N4", "-n4", "--time=2", "-o"])
        .arg(&out_file)
        .arg(&stays);
    let out = run(c, Duration::from_secs(30));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let until = Instant::now() + Duration::from_secs(120);
    while std::fs::read_to_string(&out_file)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("compute0"))
        .count()
        < 3
    {
        assert!(Instant::now() < until, "no check in {}", out_file.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !site::sockets_left(&run_dir.join("macrolink")).is_empty(),
        "the service hosts still run"
    );
    let cancel = Command::new("scancel").arg(&id).output().unwrap();
    assert!(cancel.status.success(), "{}", text(&cancel.stderr));
    gone(&id, Duration::from_secs(60));
    let left = site::sockets_left(&run_dir.join("macrolink"));
    assert!(left.is_empty(), "scancel left sockets: {left:?}");
    let procs = processes_with(&file.display().to_string());
    assert!(procs.is_empty(), "scancel left processes: {procs:?}");
}

/// Process ids whose command line contains `needle`.
fn processes_with(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| text(&c).replace('\0', " ").contains(needle))
        })
        .collect()
}

#[test]
fn mpirun_runs_one_host_per_rank_from_the_cluster_file_alone() {
    let Some(()) = require::program("mpirun", "MACROLINK_REQUIRE_MPI") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let file = site::write(d.path(), 7800).unwrap();
    let run_dir = d.path().join("run");
    let mut c = job("mpirun", &run_dir);
    c.args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .args(["-x", "XDG_RUNTIME_DIR", EXE, "node"])
        .arg(&file)
        .args(["--until-done", "--mib", "8"]);
    let out = run(c, Duration::from_secs(150));
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    eprintln!("{o}{e}");
    assert!(out.status.success(), "{o}\n{e}");
    check_rows(&o);
    let left = site::sockets_left(&run_dir.join("macrolink"));
    assert!(left.is_empty(), "{left:?}");
}
