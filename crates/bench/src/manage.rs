//! `macrolink bench manage`: how soon macro-cluster management notices a
//! host that dies or freezes, acts on it, and replaces a manager that dies
//! or freezes, with the default settings (probes every 200 ms, 400 ms of
//! suspicion, a lease of 1 s); then whether it stays quiet for a while
//! under packet loss and a stalled observer. Each group's hosts are
//! processes in a network namespace of the group's, the central manager in
//! one of its own, joined by veth pairs; times are read from the central
//! manager's decision log against the moment of the kill, and from
//! `manage status` for takeovers.
//!
//! ```text
//!  ns g0: g0h0 (manager) g0h1 (fallback) g0h2 .. ──veth──┐
//!  ns g1: g1h0 g1h1 g1h2 ..                   ──veth──┤ ns central: the central manager
//!  SIGKILL / SIGSTOP a host ─► decisions.jsonl: failed (detection), reset ─► restart / SIGCONT ─► healthy
//!  SIGKILL / SIGSTOP a group's manager ─► manage status: the fallback manages (takeover)
//!  soak: 5 % of g0's datagrams dropped (iptables statistic), g0's manager stopped 20 s: no action at all
//! ```

use anyhow::Context;
use macrolink_testbed::netns::{in_ns, join, Namespaces};
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
    /// Kills and freezes of managers, in all.
    pub takeovers: usize,
    /// Seconds of the quiet run (0: none).
    pub soak_s: u64,
    /// Share of group 0's datagrams dropped during it.
    pub loss: f64,
    /// Seconds group 0's manager is stopped during it.
    pub stall_s: u64,
    /// Hosts killed again after their reset, to be excluded (at most the
    /// hosts that are neither manager nor fallback).
    pub exclusions: usize,
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

/// What the quiet run saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Soak {
    /// How long, seconds.
    pub seconds: u64,
    /// Datagrams into group 0's namespace dropped, and in all.
    pub dropped: u64,
    /// Datagrams in all.
    pub datagrams: u64,
    /// Seconds group 0's manager was stopped.
    pub stalled_s: u64,
    /// Whether its fallback took over meanwhile.
    pub taken_over: bool,
    /// Seconds the central manager was stopped, later.
    pub central_stalled_s: u64,
    /// What was decided about the stopped manager itself (it answered
    /// nobody for that long: failed and reset is the right call).
    pub stalled_host: Vec<String>,
    /// Hosts declared failed besides it (none died).
    pub false_failures: usize,
    /// Resets decided besides it.
    pub false_resets: usize,
    /// Exclusions decided.
    pub false_exclusions: usize,
    /// Hosts declared suspect (suspicion is no action).
    pub suspicions: usize,
}

/// Everything measured.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The timed events.
    pub rows: Vec<Row>,
    /// Frozen managers thawed that acted again (a report taken from them,
    /// or the group managed by them again).
    pub thawed_acted: usize,
    /// Frozen managers thawed.
    pub thawed: usize,
    /// The quiet run, if any.
    pub soak: Option<Soak>,
}

const DETECT_PEERS: &str =
    "Slurm SlurmdTimeout 300 s; Kubernetes NotReady ~40 s; memberlist ~5 s (16 hosts)";
const TAKEOVER_PEERS: &str = "Slurm SlurmctldTimeout 120 s";

/// The stations of a cluster of `groups` × `hosts` plus a central manager,
/// in namespaces.
struct Bed {
    exe: PathBuf,
    dir: macrolink_testbed::undo::Scratch,
    file: PathBuf,
    names: Vec<String>,
    /// The namespace of each host.
    homes: Vec<String>,
    procs: Vec<Option<Child>>,
    /// Central's namespace, then each group's.
    ns: Namespaces,
}

/// A decision of the central manager's log: at (wall-clock ns), host,
/// state, action.
type Decided = (u64, String, String, String);

/// Port of host `i` of a group (in the group's namespace).
const PORT: u16 = 7200;

impl Bed {
    fn new(o: &Options) -> anyhow::Result<Bed> {
        anyhow::ensure!(o.hosts >= 3, "a group needs at least 3 hosts");
        anyhow::ensure!(o.groups >= 1 && o.groups <= 200, "1 to 200 groups");
        anyhow::ensure!(o.hosts <= 500, "at most 500 hosts a group");
        let ns = Namespaces::new(o.groups + 1).map_err(anyhow::Error::msg)?;
        let tag = std::process::id() % 100_000;
        for g in 0..o.groups {
            let (c, h) = (format!("mc{tag}g{g}"), format!("mh{tag}g{g}"));
            let net = format!("10.62.{}", g + 1);
            join(
                (&c, &ns.names[0], &format!("{net}.254/24")),
                (&h, &ns.names[g + 1], &format!("{net}.1/24")),
            )
            .map_err(anyhow::Error::msg)?;
            let gw = format!("{net}.254");
            in_ns(
                &ns.names[g + 1],
                &["ip", "route", "add", "10.62.0.0/16", "via", &gw],
            )
            .map_err(anyhow::Error::msg)?;
        }
        let dir = macrolink_testbed::undo::scratch()?;
        std::fs::write(
            dir.path().join("secret"),
            "bench manage secret, long enough",
        )?;
        let mut names = vec!["central".to_string()];
        let mut homes = vec![ns.names[0].clone()];
        let mut t = String::from("secret_file = \"secret\"\n");
        t += "[[host]]\nname = \"central\"\nrole = \"compute\"\nnode = 1\n\
              fabric = \"127.0.0.1:1\"\nmanage = \"10.62.1.254:7199\"\n";
        for g in 0..o.groups {
            for i in 0..o.hosts {
                let name = format!("g{g}h{i}");
                t += &format!(
                    "[[host]]\nname = \"{name}\"\nrole = \"compute\"\nnode = {}\n\
                     fabric = \"127.0.0.1:1\"\nmanage = \"10.62.{}.1:{}\"\n",
                    names.len() + 1,
                    g + 1,
                    PORT + i as u16
                );
                names.push(name);
                homes.push(ns.names[g + 1].clone());
            }
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
            homes,
            ns,
        };
        for i in 0..bed.names.len() {
            bed.start(i)?;
        }
        Ok(bed)
    }

    /// `macrolink ARGS` in namespace `ns`.
    fn command(&self, ns: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(&self.exe)
            .env_remove("MACROLINK_SECRET")
            .env_remove("MACROLINK_SECRET_FILE");
        c
    }

    fn start(&mut self, i: usize) -> anyhow::Result<()> {
        // `ip netns exec` runs the command in its own place: the child is
        // the station itself, for signals.
        // The central manager reads its own copy: its policy may change.
        let file = match i {
            0 => self.dir.path().join("central.toml"),
            _ => self.file.clone(),
        };
        if !file.exists() {
            std::fs::copy(&self.file, &file)?;
        }
        let c = self
            .command(&self.homes[i])
            .args([
                "manage",
                "run",
                "--exit-with-parent",
                "--host",
                &self.names[i],
            ])
            .arg(&file)
            .arg("--state-dir")
            .arg(self.dir.path().join("state"))
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

    /// The central manager's decisions.
    fn decisions(&self) -> Vec<Decided> {
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
        let out = self
            .command(&self.homes[0])
            .args(["manage", "status", "--json"])
            .arg(&self.file)
            .output()
            .ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v["groups"][g]["manager"].as_str().map(str::to_string)
    }

    /// Waits up to 10 s from `start` until group `g` is managed by
    /// another host than `old`; that host.
    fn taken_over(&self, g: usize, old: &str, start: Instant) -> anyhow::Result<String> {
        loop {
            match self.manager(g) {
                Some(m) if m != old => return Ok(m),
                _ => {}
            }
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(10),
                "no takeover of g{g} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
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
        // Then the namespaces go (`ns` is dropped after this).
        let _ = &self.ns;
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
pub fn run(o: &Options, mut each: impl FnMut(&str)) -> anyhow::Result<Outcome> {
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
    let (mut takeover, mut frozen_takeover) = (Vec::new(), Vec::new());
    let (mut thawed, mut thawed_acted) = (0, 0);
    for t in 0..o.takeovers {
        let (g, frozen) = (t % o.groups, (t / o.groups) % 2 == 1);
        let old = bed.manager(g).context("no manager")?;
        let at = bed.index(&old).context("manager")?;
        let start = Instant::now();
        if frozen {
            bed.signal(at, libc::SIGSTOP);
        } else {
            bed.kill(at);
        }
        let new = bed.taken_over(g, &old, start)?;
        let took = start.elapsed();
        each(&format!(
            "g{g}: {old} {}, taken over by {new} after {:.3} s",
            if frozen { "frozen" } else { "killed" },
            took.as_secs_f64()
        ));
        if frozen {
            frozen_takeover.push(took.as_nanos() as u64);
            // Thawed, the old manager must not act: the group stays with
            // the new one, and nothing is decided meanwhile.
            let t0 = wall();
            bed.signal(at, libc::SIGCONT);
            thawed += 1;
            std::thread::sleep(Duration::from_secs(3));
            let flipped = bed.manager(g).as_deref() != Some(new.as_str());
            let acted = bed
                .decisions()
                .iter()
                .any(|d| d.0 > t0 && d.1 != old && d.2 != "healthy");
            if flipped || acted {
                thawed_acted += 1;
            }
        } else {
            takeover.push(took.as_nanos() as u64);
            bed.start(at)?;
            // It comes back as the fallback, and is seen healthy again.
            bed.decided(&old, wall() - 1, |s, _| s == "healthy").ok();
            std::thread::sleep(Duration::from_millis(1500));
        }
    }
    let soak = match o.soak_s {
        0 => None,
        _ => Some(soak(&mut bed, o, &mut each)?),
    };
    let excluded = exclusions(&mut bed, o, &mut each)?;
    Ok(Outcome {
        rows: vec![
            row("killed host (SIGKILL): failed", kill_detect, DETECT_PEERS),
            row("killed host: reset command run", kill_reset, ""),
            row("frozen host (SIGSTOP): failed", stop_detect, DETECT_PEERS),
            row("manager killed: fallback manages", takeover, TAKEOVER_PEERS),
            row(
                "manager frozen: fallback manages",
                frozen_takeover,
                TAKEOVER_PEERS,
            ),
            row("killed again after reset: excluded", excluded, ""),
        ],
        thawed,
        thawed_acted,
        soak,
    })
}

/// Hosts killed again after their reset (every one was reset in the
/// trials before), with the central manager restarted on a policy that
/// excludes a host failing again within an hour of its reset (its state
/// read back); each host killed once, started again and included. Times
/// from the kill to the exclusion.
fn exclusions(bed: &mut Bed, o: &Options, each: &mut impl FnMut(&str)) -> anyhow::Result<Vec<u64>> {
    if o.exclusions == 0 {
        return Ok(Vec::new());
    }
    let central = bed.dir.path().join("central.toml");
    let text =
        std::fs::read_to_string(&bed.file)?.replace("again_within_s = 0", "again_within_s = 3600");
    std::fs::write(&central, text)?;
    bed.kill(0);
    bed.start(0)?;
    let until = Instant::now() + Duration::from_secs(15);
    while (0..o.groups).any(|g| bed.manager(g).is_none()) {
        anyhow::ensure!(
            Instant::now() < until,
            "the central manager did not come back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut out = Vec::new();
    // The hosts of each group that the trials reset.
    let per_group = (o.hosts - 2).min(o.trials.div_ceil(o.groups));
    for t in 0..o.exclusions.min(o.groups * per_group) {
        let (g, i) = (t % o.groups, 2 + t / o.groups);
        let name = format!("g{g}h{i}");
        let at = bed.index(&name).context("host")?;
        let t0 = wall();
        bed.kill(at);
        let excluded = bed.decided(&name, t0, |_, a| a == "exclude")?;
        out.push(excluded - t0);
        each(&format!(
            "killed {name} again: excluded after {:.3} s",
            (excluded - t0) as f64 / 1e9
        ));
        bed.start(at)?;
        let ok = bed
            .command(&bed.homes[0])
            .args(["manage", "include"])
            .arg(&central)
            .args([&name, "--reason", "bench: back in"])
            .output()?;
        anyhow::ensure!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
    }
    Ok(out)
}

/// The quiet run: `o.soak_s` seconds with `o.loss` of group 0's datagrams
/// dropped by the firewall and group 0's manager stopped for `o.stall_s`
/// a third of the way in; every failure, reset and exclusion the central
/// manager decides meanwhile is a false one (nothing dies).
fn soak(bed: &mut Bed, o: &Options, each: &mut impl FnMut(&str)) -> anyhow::Result<Soak> {
    let ns = bed.ns.names[1].clone();
    let drop = format!("{}", o.loss);
    let rules: [&[&str]; 2] = [
        &[
            "iptables",
            "-A",
            "INPUT",
            "-p",
            "udp",
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            &drop,
            "-j",
            "DROP",
        ],
        &["iptables", "-A", "INPUT", "-p", "udp", "-j", "ACCEPT"],
    ];
    for r in rules {
        in_ns(&ns, r).map_err(|e| anyhow::anyhow!("{e} (the soak needs iptables)"))?;
    }
    let t0 = wall();
    let start = Instant::now();
    let total = Duration::from_secs(o.soak_s);
    let stall_at = total / 3;
    let manager = bed.manager(0).context("no manager of g0")?;
    let at = bed.index(&manager).context("manager")?;
    let (mut stalled, mut taken_over, mut central_stalled) = (false, false, false);
    let mut shown = 0;
    while start.elapsed() < total {
        if !stalled && start.elapsed() >= stall_at {
            stalled = true;
            bed.signal(at, libc::SIGSTOP);
            let t = Instant::now();
            std::thread::sleep(Duration::from_secs(o.stall_s));
            taken_over = bed.manager(0).is_some_and(|m| m != manager);
            bed.signal(at, libc::SIGCONT);
            each(&format!(
                "soak: {manager} stopped {:.0} s (taken over: {taken_over})",
                t.elapsed().as_secs_f64()
            ));
        }
        if !central_stalled && start.elapsed() >= 2 * stall_at {
            // The observer of every report stopped, then woken: stale
            // reports and timers must not make it act.
            central_stalled = true;
            bed.signal(0, libc::SIGSTOP);
            std::thread::sleep(Duration::from_secs(o.stall_s));
            bed.signal(0, libc::SIGCONT);
            each(&format!(
                "soak: the central manager stopped {} s",
                o.stall_s
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
        let secs = start.elapsed().as_secs();
        if secs >= shown + 30 {
            shown = secs;
            each(&format!("soak: {secs} of {} s", o.soak_s));
        }
    }
    let counts = |ns: &str| -> (u64, u64) {
        let out = Command::new("ip")
            .args([
                "netns", "exec", ns, "iptables", "-L", "INPUT", "-n", "-v", "-x",
            ])
            .output();
        let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        let rows: Vec<u64> = text
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect();
        (rows.first().copied().unwrap_or(0), rows.iter().sum())
    };
    let (dropped, datagrams) = counts(&ns);
    let (mine, after): (Vec<_>, Vec<_>) = bed
        .decisions()
        .into_iter()
        .filter(|d| d.0 > t0)
        .partition(|d| d.1 == manager);
    let n = |f: &dyn Fn(&Decided) -> bool| after.iter().filter(|d| f(d)).count();
    Ok(Soak {
        seconds: o.soak_s,
        dropped,
        datagrams,
        stalled_s: o.stall_s,
        taken_over,
        central_stalled_s: o.stall_s,
        stalled_host: mine
            .iter()
            .map(|d| match d.3.as_str() {
                "" => format!("{} {}", d.1, d.2),
                a => format!("{} {} ({a})", d.1, d.2),
            })
            .collect(),
        false_failures: n(&|d| d.2 == "failed"),
        false_resets: n(&|d| d.3 == "reset"),
        false_exclusions: n(&|d| d.3 == "exclude"),
        suspicions: n(&|d| d.2 == "suspect"),
    })
}

/// The table.
pub fn table(out: &Outcome, o: &Options) -> String {
    let mut t = format!(
        "{} groups of {} hosts (processes, a network namespace per group) and a central manager in its own; default settings (probe 200 ms, suspicion 400 ms, lease 1 s)\n",
        o.groups, o.hosts
    );
    t += &format!(
        "{:<36} {:>6} {:>8} {:>8} {:>8}  {}\n",
        "event",
        "trials",
        "median s",
        "p99 s",
        "max s",
        "others' defaults (documented, not run here)"
    );
    for r in &out.rows {
        t += &format!(
            "{:<36} {:>6} {:>8.3} {:>8.3} {:>8.3}  {}\n",
            r.event, r.trials, r.median_s, r.p99_s, r.max_s, r.others
        );
    }
    t += &format!(
        "frozen managers thawed: {}, of which acted again: {}\n",
        out.thawed, out.thawed_acted
    );
    if let Some(s) = &out.soak {
        t += &format!(
            "quiet run: {} s; g0 lost {} of {} datagrams ({:.1} %); g0's manager stopped {} s (fallback took over: {}; \
             decided about it: {}); the central manager stopped {} s\n\
             false failures {}, false resets {}, false exclusions {} (suspicions, no action: {})\n",
            s.seconds,
            s.dropped,
            s.datagrams,
            100.0 * s.dropped as f64 / s.datagrams.max(1) as f64,
            s.stalled_s,
            if s.taken_over { "yes" } else { "no" },
            match s.stalled_host.is_empty() {
                true => "nothing".to_string(),
                false => s.stalled_host.join(", "),
            },
            s.central_stalled_s,
            s.false_failures,
            s.false_resets,
            s.false_exclusions,
            s.suspicions
        );
    }
    t
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
