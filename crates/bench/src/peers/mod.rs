//! The established tools that macrolink's figures are put beside, one
//! module each: how to start it, run it, read its figures, and which
//! Debian package holds it when it is missing.
//!
//! ```text
//!   compare   ── ucx_perftest, iperf3, sockperf
//!   gateways  ── iperf3 (in network namespaces, over the kernel's ECMP)
//!   files     ── xrootd / xrdcp
//!   iobench   ── fio
//! ```
//!
//! A peer's server is a [`Server`], killed when dropped; a peer's client
//! runs under [`output`], killed when it overruns its time.

pub mod fio;
pub mod iperf3;
pub mod preload;
pub mod resident;
pub mod sockperf;
pub mod ucx_perftest;
pub mod written;
pub mod xrootd;

use anyhow::{bail, Context};
use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// A peer's ping-pong latency: half round trips, µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    /// Median.
    pub median: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl From<crate::stats::Summary> for Latency {
    fn from(s: crate::stats::Summary) -> Latency {
        Latency {
            median: s.median,
            p99: s.p99,
        }
    }
}

/// An established tool: the program and the Debian package that has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tool {
    /// The program.
    pub program: &'static str,
    /// The Debian package(s) to install for it.
    pub package: &'static str,
}

impl Tool {
    /// Whether the program can be started here.
    pub fn installed(&self) -> bool {
        ["--version", "-h"].iter().any(|flag| {
            Command::new(self.program)
                .arg(flag)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        })
    }
}

/// The `apt-get install` line for the tools of `tools` that are missing,
/// or `None` when all are there.
pub fn missing(tools: &[Tool]) -> Option<String> {
    let mut packages: Vec<&str> = tools
        .iter()
        .filter(|t| !t.installed())
        .map(|t| t.package)
        .collect();
    packages.dedup();
    (!packages.is_empty()).then(|| format!("apt-get install {}", packages.join(" ")))
}

/// Processes of `tools` already running on this machine, as (pid,
/// program), zombies left out: a peer's server left over from an earlier
/// run (a busy-polling sockperf, say) takes a core from both sides of
/// every figure, and on two cores ruins them.
pub fn running(tools: &[Tool]) -> Vec<(u32, &'static str)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((comm, state)) = name_and_state_in_stat(&stat) else {
            continue;
        };
        if state == 'Z' {
            continue;
        }
        // The kernel keeps 15 bytes of a name.
        let named = |t: &&Tool| t.program.get(..15).unwrap_or(t.program) == comm;
        if let Some(t) = tools.iter().find(named) {
            found.push((pid, t.program));
        }
    }
    found.sort_unstable();
    found
}

/// `program` to be run here, or inside network namespace `ns`.
pub fn command(ns: Option<&str>, program: &str) -> Command {
    match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, program]);
            c
        }
        None => Command::new(program),
    }
}

/// A peer's server process, killed when dropped.
#[derive(Debug)]
pub struct Server(Child);

impl Server {
    /// Starts `cmd` with its output thrown away, and gives it `settle` to
    /// start listening.
    pub fn start(cmd: &mut Command, settle: Duration) -> anyhow::Result<Server> {
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {:?}", cmd.get_program()))?;
        std::thread::sleep(settle);
        Ok(Server(child))
    }

    /// The CPU time (user and system, all its threads) the server used in
    /// all, once it has ended by itself within `limit`; `None` if it did
    /// not. The ended process stays unreaped, and so readable in `/proc`,
    /// until the `Server` is dropped.
    pub fn cpu_at_exit(&self, limit: Duration) -> Option<Duration> {
        use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};
        let pid = Pid::from_child(&self.0);
        let opts = WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG;
        let until = Instant::now() + limit;
        while waitid(WaitId::Pid(pid), opts).ok()?.is_none() {
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).ok()?;
        let ticks = cpu_ticks_in_stat(&stat)?;
        let per_s = rustix::param::clock_ticks_per_second().max(1);
        Some(Duration::from_secs_f64(ticks as f64 / per_s as f64))
    }
}

/// The command name and the state letter of a `/proc/PID/stat` line:
/// "pid (name) state ...", where the name may hold anything, parentheses too.
fn name_and_state_in_stat(stat: &str) -> Option<(&str, char)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let (_, name) = head.split_once('(')?;
    Some((name, rest.trim_start().chars().next()?))
}

/// utime + stime of a `/proc/PID/stat` line, in clock ticks: the 12th and
/// 13th fields after the command name, which is in parentheses and may
/// hold anything.
fn cpu_ticks_in_stat(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut f = rest.split_whitespace().skip(11);
    let user: u64 = f.next()?.parse().ok()?;
    let system: u64 = f.next()?.parse().ok()?;
    Some(user + system)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to its end, killing it past `limit`; its standard output and
/// standard error together.
pub fn output(cmd: &mut Command, limit: Duration) -> anyhow::Result<String> {
    let out = outputs(vec![cmd], limit)?.remove(0);
    Ok(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// Runs `cmds` at once, each to its end, reading what they print as they
/// go (a full pipe never stalls one); past `limit` kills those still
/// running and fails. Each one's status and output, in order.
pub fn outputs(cmds: Vec<&mut Command>, limit: Duration) -> anyhow::Result<Vec<Output>> {
    let start = Instant::now();
    let mut running = Vec::new();
    for cmd in cmds {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {:?}", cmd.get_program()))?;
        let out = drain(child.stdout.take());
        let err = drain(child.stderr.take());
        running.push((child, short(cmd), out, err));
    }
    let mut status: Vec<Option<ExitStatus>> = vec![None; running.len()];
    while status.iter().any(Option::is_none) {
        for (i, (child, ..)) in running.iter_mut().enumerate() {
            if status[i].is_none() {
                status[i] = child.try_wait()?;
            }
        }
        if status.iter().any(Option::is_none) && start.elapsed() > limit {
            let mut late = Vec::new();
            for (i, (child, what, ..)) in running.iter_mut().enumerate() {
                if status[i].is_none() {
                    let _ = child.kill();
                    let _ = child.wait();
                    late.push(what.clone());
                }
            }
            bail!(
                "{} of {} ({}) ran past {limit:?}",
                late.len(),
                running.len(),
                late.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    running
        .into_iter()
        .zip(status)
        .map(|((_, _, out, err), status)| {
            Ok(Output {
                status: status.context("an exit status")?,
                stdout: out.join().unwrap_or_default(),
                stderr: err.join().unwrap_or_default(),
            })
        })
        .collect()
}

/// A command in a few words: its program's name and first two
/// arguments, past `ip netns exec NS`.
fn short(cmd: &Command) -> String {
    let mut words: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    if words.len() > 4 && words[..3] == ["ip", "netns", "exec"] {
        words.drain(..4);
    }
    if let Some(first) = words.first_mut() {
        *first = first.rsplit('/').next().unwrap_or_default().to_string();
    }
    words.truncate(3);
    words.join(" ")
}

/// Reads `pipe` to its end on a thread of its own.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut all);
        }
        all
    })
}

/// A TCP port free on loopback just now.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_peers_are_found_and_the_dead_are_not() {
        let tool = Tool {
            program: "sleep",
            package: "coreutils",
        };
        let mut child = Server::start(Command::new("sleep").arg("30"), Duration::ZERO).unwrap();
        let pid = child.0.id();
        assert!(running(&[tool]).contains(&(pid, "sleep")));
        let other = Tool {
            program: "no-such-peer",
            package: "none",
        };
        assert!(!running(&[other]).iter().any(|&(p, _)| p == pid));
        child.0.kill().expect("kill");
        // Killed and not yet waited for: a zombie, not running.
        let deadline = Instant::now() + Duration::from_secs(5);
        while running(&[tool]).contains(&(pid, "sleep")) {
            assert!(Instant::now() < deadline, "a killed peer still shows");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_missing_tool_is_named_by_its_package() {
        let sh = Tool {
            program: "sh",
            package: "dash",
        };
        let nope = Tool {
            program: "macrolink-no-such-tool",
            package: "no-such-package",
        };
        assert!(sh.installed() && !nope.installed());
        assert_eq!(missing(&[sh]), None);
        assert_eq!(
            missing(&[sh, nope]).as_deref(),
            Some("apt-get install no-such-package")
        );
    }

    #[test]
    fn a_servers_cpu_is_read_once_it_ended() {
        let stat = "4242 (a (b) c) Z 17 4242 4242 0 -1 4194560 120 0 0 0 150 37 0 0 20 0 1";
        assert_eq!(cpu_ticks_in_stat(stat), Some(187));
        assert_eq!(cpu_ticks_in_stat("1 (x) S 1 2"), None);
        assert_eq!(name_and_state_in_stat(stat), Some(("a (b) c", 'Z')));
        assert_eq!(name_and_state_in_stat("1 x S"), None);
        // One that burns a while, one that sleeps, one that does not end.
        let busy = Server::start(
            Command::new("sh").args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"]),
            Duration::ZERO,
        )
        .unwrap();
        let idle = Server::start(Command::new("sleep").arg("0.3"), Duration::ZERO).unwrap();
        let cpu = busy.cpu_at_exit(Duration::from_secs(60)).unwrap();
        assert!(cpu >= Duration::from_millis(50), "{cpu:?}");
        let cpu = idle.cpu_at_exit(Duration::from_secs(10)).unwrap();
        assert!(cpu < Duration::from_millis(100), "{cpu:?}");
        let endless = Server::start(Command::new("sleep").arg("30"), Duration::ZERO).unwrap();
        let t0 = Instant::now();
        assert_eq!(endless.cpu_at_exit(Duration::from_millis(100)), None);
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn output_bounds_the_run() {
        let out = output(
            Command::new("sh").args(["-c", "echo out; echo err >&2"]),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(out, "out\nerr\n");
        let e = output(Command::new("sleep").arg("5"), Duration::from_millis(100)).unwrap_err();
        assert!(e.to_string().contains("ran past"), "{e}");
        // More than a pipe holds, printed before the end: read as it comes.
        let big = output(
            Command::new("sh").args(["-c", "head -c 1000000 /dev/zero; echo end >&2"]),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(big.len(), 1_000_004);
        // Several at once: one that overruns stops them all, and says which.
        // The quick one is given seconds: on a machine busy compiling, even
        // `true` has taken over 200 ms to start and end.
        let mut quick = Command::new("true");
        let mut slow = Command::new("sleep");
        slow.arg("60");
        let t0 = Instant::now();
        let e = outputs(vec![&mut quick, &mut slow], Duration::from_secs(3)).unwrap_err();
        assert!(
            e.to_string().starts_with("1 of 2 (sleep 60) ran past"),
            "{e}"
        );
        // Stopped at the limit, not waited for.
        assert!(t0.elapsed() < Duration::from_secs(30));
        let mut inside = command(Some("ns1"), "/usr/bin/macrolink");
        inside.args(["bench", "bw", "--connect", "x"]);
        assert_eq!(short(&inside), "macrolink bench bw");
        let mut a = Command::new("true");
        let mut b = Command::new("false");
        let both = outputs(vec![&mut a, &mut b], Duration::from_secs(5)).unwrap();
        assert!(both[0].status.success() && !both[1].status.success());
        let c = command(Some("ns1"), "iperf3");
        assert_eq!(c.get_program(), "ip");
        assert_eq!(
            c.get_args().collect::<Vec<_>>(),
            ["netns", "exec", "ns1", "iperf3"]
        );
    }
}
