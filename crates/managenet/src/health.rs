//! A host's health check: a program run now and then (`sh -c`), whose
//! exit says healthy (0) or unhealthy (1, the reason on stdout). Anything
//! else (another status, a signal, a timeout, a program that cannot run)
//! says the check itself failed: unknown, never unhealthy.

use macrolink_wire::manage::{Health, MAX_TEXT};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

/// One check under way.
#[derive(Debug)]
struct Running {
    pid: u32,
    started: Instant,
    killed: bool,
    done: Receiver<std::io::Result<std::process::Output>>,
}

/// Runs the check every `every`, each for at most `timeout`.
#[derive(Debug)]
pub struct Checker {
    command: Option<String>,
    every: Duration,
    timeout: Duration,
    next: Instant,
    running: Option<Running>,
    last: (Health, String),
}

impl Checker {
    /// A checker of `command` (none: never checked).
    pub fn new(command: Option<String>, every: Duration, timeout: Duration) -> Checker {
        Checker {
            command,
            every,
            timeout,
            next: Instant::now(),
            running: None,
            last: (Health::NotChecked, String::new()),
        }
    }

    /// What the last finished check said.
    pub fn last(&self) -> (Health, &str) {
        (self.last.0, &self.last.1)
    }

    /// Starts a check when one is due, and takes the result of one that
    /// finished; kills one past its time.
    pub fn poll(&mut self) {
        let Some(cmd) = &self.command else {
            return;
        };
        if let Some(r) = &mut self.running {
            match r.done.try_recv() {
                Ok(out) => {
                    self.last = verdict(out, r.killed, self.timeout);
                    self.running = None;
                }
                Err(TryRecvError::Empty) if !r.killed && r.started.elapsed() > self.timeout => {
                    // The check runs in a process group of its own: what
                    // it started goes with it, and its output ends.
                    if let Some(pid) = rustix::process::Pid::from_raw(r.pid as i32) {
                        let _ =
                            rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                    }
                    r.killed = true;
                    self.last = (
                        Health::Unknown,
                        format!("the check timed out after {:?}", self.timeout),
                    );
                }
                // One that does not die (stuck in the kernel, or something
                // it left holds its output): given up, so checks go on.
                Err(TryRecvError::Empty) if r.killed && r.started.elapsed() > self.timeout * 2 => {
                    tracing::warn!("a health check (pid {}) would not die; given up", r.pid);
                    self.running = None;
                }
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => self.running = None,
            }
            return;
        }
        if Instant::now() < self.next {
            return;
        }
        self.next = Instant::now() + self.every;
        let child = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        match child {
            Ok(child) => {
                let pid = child.id();
                let (tx, rx) = mpsc::channel();
                std::thread::spawn(move || tx.send(child.wait_with_output()));
                self.running = Some(Running {
                    pid,
                    started: Instant::now(),
                    killed: false,
                    done: rx,
                });
            }
            Err(e) => self.last = (Health::Unknown, format!("could not run the check: {e}")),
        }
    }
}

/// What a finished check says.
fn verdict(
    out: std::io::Result<std::process::Output>,
    killed: bool,
    timeout: Duration,
) -> (Health, String) {
    let out = match out {
        Ok(o) => o,
        Err(e) => return (Health::Unknown, format!("the check failed: {e}")),
    };
    if killed {
        return (
            Health::Unknown,
            format!("the check timed out after {timeout:?}"),
        );
    }
    let said = text(&out.stdout);
    match out.status.code() {
        Some(0) => (Health::Healthy, said),
        Some(1) if said.is_empty() => (Health::Unhealthy, "unhealthy (no reason given)".into()),
        Some(1) => (Health::Unhealthy, said),
        Some(c) => (Health::Unknown, format!("the check exited with status {c}")),
        None => (
            Health::Unknown,
            format!("the check was killed: {}", out.status),
        ),
    }
}

/// The check's words: trimmed, at most `MAX_TEXT` bytes.
fn text(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let s = s.trim();
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(cmd: &str, timeout: Duration) -> (Health, String) {
        let mut c = Checker::new(Some(cmd.into()), Duration::from_secs(60), timeout);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            c.poll();
            if c.last().0 != Health::NotChecked {
                return (c.last().0, c.last().1.to_string());
            }
            assert!(Instant::now() < until, "{cmd} never finished");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn exit_codes_say_healthy_unhealthy_or_unknown() {
        let t = Duration::from_secs(5);
        assert_eq!(check("echo fine", t), (Health::Healthy, "fine".into()));
        assert_eq!(
            check("echo disk full; exit 1", t),
            (Health::Unhealthy, "disk full".into())
        );
        assert_eq!(check("exit 1", t).0, Health::Unhealthy);
        let (h, why) = check("exit 139", t);
        assert_eq!(h, Health::Unknown);
        assert!(why.contains("139"), "{why}");
        let (h, why) = check("kill -SEGV $$", t);
        assert_eq!(h, Health::Unknown, "{why}");
        let (h, why) = check("sleep 30", Duration::from_millis(100));
        assert_eq!(h, Health::Unknown);
        assert!(why.contains("timed out"), "{why}");
        let long = check("yes x | head -c 5000; exit 1", t);
        assert_eq!(long.1.len(), MAX_TEXT);
    }
}
