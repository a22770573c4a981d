//! `macrolink bench manage`: how soon macro-cluster management notices a
//! host that dies or freezes, acts on it, and replaces a manager that dies,
//! with the default settings (probes every 200 ms, 400 ms of suspicion, a
//! lease of 1 s). Every host's station is a process on loopback; times are
//! read from the central manager's decision log against the moment of the
//! kill, and from `manage status` for takeovers.
//!
//! ```text
//!  SIGKILL / SIGSTOP a host ─► decisions.jsonl: failed (detection), reset ─► restart / SIGCONT ─► healthy
//!  SIGKILL a group's manager ─► manage status: the fallback manages (takeover) ─► restart: the new fallback
//! ```

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The `macrolink` binary.
    pub exe: PathBuf,
    /// Macro-clusters.
    pub groups: usize,
    /// Hosts in each (at least 3: manager, fallback, one more).
    pub hosts: usize,
    /// Kills and freezes of hosts, each.
    pub trials: usize,
    /// Kills of managers.
    pub takeovers: usize,
    /// First port of the hosts' management addresses.
    pub port: u16,
}

/// One line of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// What was timed.
    pub event: String,
    /// How many times.
    pub trials: usize,
    /// Median, seconds.
    pub median_s: f64,
    /// 99th percentile, seconds.
    pub p99_s: f64,
    /// Slowest, seconds.
    pub max_s: f64,
    /// What others do by default (documented, not run here).
    pub others: String,
}

const DETECT_PEERS: &str =
    "Slurm SlurmdTimeout 300 s; Kubernetes NotReady ~40 s; memberlist ~5 s (16 hosts)";
const TAKEOVER_PEERS: &str = "Slurm SlurmctldTimeout 120 s";

/// The stations of a cluster of `groups` × `hosts` plus a central manager.
struct Bed {
    exe: PathBuf,
    dir: tempfile::TempDir,
    file: PathBuf,
    names: Vec<String>,
    procs: Vec<Option<Child>>,
}

impl Bed {
    fn new(o: &Options) -> anyhow::Result<Bed> {
        anyhow::ensure!(o.hosts >= 3, "a group needs at least 3 hosts");
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join("secret"),
            "bench manage secret, long enough",
        )?;
        let mut names = vec!["central".to_string()];
        for g in 0..o.groups {
            names.extend((0..o.hosts).map(|i| format!("g{g}h{i}")));
        }
        let mut t = String::from("secret_file = \"secret\"\n");
        for (i, n) in names.iter().enumerate() {
            let port = o.port + i as u16;
            t += &format!(
                "[[host]]\nname = \"{n}\"\nrole = \"compute\"\nnode = {}\nfabric = \"127.0.0.1:{port}\"\nmanage = \"127.0.0.1:{}\"\n",
                i + 1,
                port + 1000
            );
        }
        for g in 0..o.groups {
            let hosts: Vec<String> = (0..o.hosts).map(|i| format!("\"g{g}h{i}\"")).collect();
            t += &format!(
                "[[macro]]\nname = \"g{g}\"\nhosts = [{}]\nmanager = \"g{g}h0\"\nfallback = \"g{g}h1\"\n",
                hosts.join(", ")
            );
        }
        // Defaults for detection and the lease; resets never wait, and a
        // host failing again soon after its reset is reset again (not
        // excluded), so that trials follow each other.
        t += "[manage]\ncentral = \"central\"\nreset_command = \"true\"\nagain_within_s = 0\n\
              resets_per_minute = 100000\nexclusions_per_minute = 100000\n";
        let file = dir.path().join("cluster.toml");
        std::fs::write(&file, t)?;
        let mut bed = Bed {
            exe: o.exe.clone(),
            dir,
            file,
            procs: names.iter().map(|_| None).collect(),
            names,
        };
        for i in 0..bed.names.len() {
            bed.start(i)?;
        }
        Ok(bed)
    }

    fn start(&mut self, i: usize) -> anyhow::Result<()> {
        let c = Command::new(&self.exe)
            .args([
                "manage",
                "run",
                "--exit-with-parent",
                "--host",
                &self.names[i],
            ])
            .arg(&self.file)
            .arg("--state-dir")
            .arg(self.dir.path().join("state"))
            .env_remove("MACROLINK_SECRET")
            .env_remove("MACROLINK_SECRET_FILE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting a station")?;
        self.procs[i] = Some(c);
        Ok(())
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, i: usize, sig: i32) {
        if let Some(c) = &self.procs[i] {
            // SAFETY: kill sends a signal to a process id; it touches no
            // memory.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// The central manager's decisions: (at, host, state, action).
    fn decisions(&self) -> Vec<(u64, String, String, String)> {
        std::fs::read_to_string(self.dir.path().join("state/decisions.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let v: Value = serde_json::from_str(l).ok()?;
                Some((
                    v["at"].as_u64()?,
                    v["host"].as_str()?.to_string(),
                    v["state"].as_str()?.to_string(),
                    v["action"].as_str().unwrap_or("").to_string(),
                ))
            })
            .collect()
    }

    /// Waits up to 10 s for a decision about `host` after `after` that
    /// `ok` takes; its time.
    fn decided(
        &self,
        host: &str,
        after: u64,
        ok: impl Fn(&str, &str) -> bool,
    ) -> anyhow::Result<u64> {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self
                .decisions()
                .into_iter()
                .find(|d| d.1 == host && d.0 > after && ok(&d.2, &d.3));
            if let Some(d) = found {
                return Ok(d.0);
            }
            anyhow::ensure!(
                Instant::now() < until,
                "no decision about {host} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Who manages group `g`, as `manage status` says.
    fn manager(&self, g: usize) -> Option<String> {
        let out = Command::new(&self.exe)
            .args(["manage", "status", "--json"])
            .arg(&self.file)
            .env_remove("MACROLINK_SECRET")
            .env_remove("MACROLINK_SECRET_FILE")
            .output()
            .ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v["groups"][g]["manager"].as_str().map(str::to_string)
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for i in 0..self.procs.len() {
            self.signal(i, libc::SIGCONT);
            self.kill(i);
        }
    }
}

fn wall() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Median, 99th percentile and maximum of `ns`, in seconds.
fn spread(mut ns: Vec<u64>) -> (f64, f64, f64) {
    if ns.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    ns.sort_unstable();
    let at =
        |q: f64| ns[((q * ns.len() as f64).ceil() as usize).clamp(1, ns.len()) - 1] as f64 / 1e9;
    (
        ns[ns.len() / 2] as f64 / 1e9,
        at(0.99),
        *ns.last().unwrap_or(&0) as f64 / 1e9,
    )
}

fn row(event: &str, ns: Vec<u64>, others: &str) -> Row {
    let trials = ns.len();
    let (median_s, p99_s, max_s) = spread(ns);
    Row {
        event: event.into(),
        trials,
        median_s,
        p99_s,
        max_s,
        others: others.into(),
    }
}

/// Runs the trials; `each` hears of every one (for progress).
pub fn run(o: &Options, mut each: impl FnMut(&str)) -> anyhow::Result<Vec<Row>> {
    let mut bed = Bed::new(o)?;
    // Every group managed before the first trial.
    let until = Instant::now() + Duration::from_secs(15);
    while (0..o.groups).any(|g| bed.manager(g).is_none()) {
        anyhow::ensure!(Instant::now() < until, "the groups' managers did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (mut kill_detect, mut kill_reset, mut stop_detect) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..o.trials * 2 {
        let (g, frozen) = (t % o.groups, (t / o.groups) % 2 == 1);
        // Never the group's manager or fallback: those are the takeovers'.
        let i = 2 + (t / (2 * o.groups)) % (o.hosts - 2);
        let name = format!("g{g}h{i}");
        let at = bed.index(&name).context("host")?;
        let t0 = wall();
        if frozen {
            bed.signal(at, libc::SIGSTOP);
        } else {
            bed.kill(at);
        }
        let failed = bed.decided(&name, t0, |s, _| s == "failed")?;
        let reset = bed.decided(&name, t0, |_, a| a == "reset")?;
        if frozen {
            stop_detect.push(failed - t0);
            bed.signal(at, libc::SIGCONT);
        } else {
            kill_detect.push(failed - t0);
            kill_reset.push(reset - t0);
            bed.start(at)?;
        }
        bed.decided(&name, reset, |s, _| s == "healthy")?;
        each(&format!(
            "{} {name}: failed after {:.3} s",
            if frozen { "froze" } else { "killed" },
            (failed - t0) as f64 / 1e9
        ));
    }
    let mut takeover = Vec::new();
    for t in 0..o.takeovers {
        let g = t % o.groups;
        let old = bed.manager(g).context("no manager")?;
        let at = bed.index(&old).context("manager")?;
        let start = Instant::now();
        bed.kill(at);
        while bed.manager(g).as_deref() == Some(old.as_str()) {
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(10),
                "no takeover of g{g} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        takeover.push(start.elapsed().as_nanos() as u64);
        each(&format!(
            "g{g}: {old} killed, taken over after {:.3} s",
            start.elapsed().as_secs_f64()
        ));
        bed.start(at)?;
        // It comes back as the fallback, and is seen healthy again.
        bed.decided(&old, wall() - 1, |s, _| s == "healthy").ok();
        std::thread::sleep(Duration::from_millis(1500));
    }
    Ok(vec![
        row("killed host (SIGKILL): failed", kill_detect, DETECT_PEERS),
        row("killed host: reset command run", kill_reset, ""),
        row("frozen host (SIGSTOP): failed", stop_detect, DETECT_PEERS),
        row("manager killed: fallback manages", takeover, TAKEOVER_PEERS),
    ])
}

/// The table.
pub fn table(rows: &[Row], o: &Options) -> String {
    let mut out = format!(
        "{} groups of {} hosts and a central manager, each a process on loopback; default settings (probe 200 ms, suspicion 400 ms, lease 1 s)\n",
        o.groups, o.hosts
    );
    out += &format!(
        "{:<36} {:>6} {:>8} {:>8} {:>8}  {}\n",
        "event",
        "trials",
        "median s",
        "p99 s",
        "max s",
        "others' defaults (documented, not run here)"
    );
    for r in rows {
        out += &format!(
            "{:<36} {:>6} {:>8.3} {:>8.3} {:>8.3}  {}\n",
            r.event, r.trials, r.median_s, r.p99_s, r.max_s, r.others
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_median_p99_and_max() {
        let ns: Vec<u64> = (1..=100).map(|i| i * 10_000_000).collect();
        let (m, p, x) = spread(ns);
        assert_eq!((m, p, x), (0.51, 0.99, 1.0));
        assert!(spread(Vec::new()).0.is_nan());
    }
}
