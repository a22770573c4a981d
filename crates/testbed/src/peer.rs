//! A macrolink process started by this one (an `echo`, a gateway, a sink,
//! a file server, ...): started, read up to its ready line, and killed when
//! dropped.

use anyhow::{bail, Context};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::ready::Line;

/// A child process that has said it is ready; killed when dropped.
#[derive(Debug)]
pub struct Peer {
    child: Child,
    /// Its ready line.
    pub ready: Line,
    /// Its `tcp=` address: a node's TCP address, or a file server's contact
    /// address.
    pub tcp: SocketAddr,
    /// A file server's fabric node address (`fabric=`), when it names one.
    pub fabric: Option<SocketAddr>,
    /// Region key of each endpoint that registered one (`region` lines).
    pub keys: Vec<(u32, u64)>,
}

impl Peer {
    /// Starts `macrolink echo` (the binary at `exe`) as node `node` with
    /// `extra` arguments.
    pub fn spawn(exe: &Path, node: u32, shm_dir: &Path, extra: &[&str]) -> anyhow::Result<Peer> {
        Peer::spawn_role(exe, "echo", node, shm_dir, extra)
    }

    /// Starts `macrolink ROLE` (echo, gateway, sink, bench serve) as node
    /// `node`, gone when this process is.
    pub fn spawn_role(
        exe: &Path,
        role: &str,
        node: u32,
        shm_dir: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Peer> {
        let mut cmd = Command::new(exe);
        cmd.args(role.split_whitespace())
            .args(["--exit-with-parent", "--node", &node.to_string()])
            .arg("--shm-dir")
            .arg(shm_dir)
            .args(extra);
        Peer::spawn_cmd(cmd)
    }

    /// Starts a prepared command line (it may run under a wrapper such as
    /// `ip netns exec NS`) and reads its output up to the ready line.
    pub fn spawn_cmd(mut cmd: Command) -> anyhow::Result<Peer> {
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {:?}", cmd.get_program()))?;
        let mut lines = BufReader::new(child.stdout.take().context("peer stdout")?).lines();
        let mut keys = Vec::new();
        loop {
            let Some(text) = lines.next().transpose()? else {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{:?} exited before it was ready", cmd.get_program());
            };
            let Some(line) = Line::parse(&text) else {
                continue;
            };
            match line.word() {
                "region" => {
                    let key = line.get("key").context("region line without key=")?;
                    let key = u64::from_str_radix(key.trim_start_matches("0x"), 16)
                        .with_context(|| format!("key in {text:?}"))?;
                    keys.push((line.value("ep")?, key));
                }
                "ready" => {
                    return Ok(Peer {
                        tcp: line.value("tcp")?,
                        fabric: line.value_opt("fabric")?,
                        ready: line,
                        child,
                        keys,
                    })
                }
                _ => {}
            }
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `limit` for it to exit by itself; whether it did.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        exit_within(&mut self.child, limit).is_some()
    }

    /// Asks it to end (SIGTERM), so that it removes what it made (the
    /// socket files of its nodes), then kills it if it has not within 2 s.
    pub fn end(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = rustix::process::Pid::from_child(&self.child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            self.wait_exit(Duration::from_secs(2));
        }
        self.kill();
    }
}

/// Waits up to `limit` for `child` to exit by itself; its status if it
/// did.
pub fn exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn regions_and_the_ready_line_are_read() {
        let mut p = Peer::spawn_cmd(sh(
            "echo noise; echo region ep=3 key=0xff bytes=9; echo ready node=2 tcp=127.0.0.1:9 fabric=127.0.0.1:8; sleep 30",
        ))
        .unwrap();
        assert_eq!(p.keys, [(3, 255)]);
        assert_eq!(p.tcp, "127.0.0.1:9".parse().unwrap());
        assert_eq!(p.fabric, Some("127.0.0.1:8".parse().unwrap()));
        assert_eq!(p.ready.value::<u32>("node").unwrap(), 2);
        assert!(!p.wait_exit(Duration::from_millis(50)));
        p.kill();
    }

    #[test]
    fn a_child_that_dies_first_is_an_error() {
        let e = Peer::spawn_cmd(sh("echo starting; exit 3")).unwrap_err();
        assert!(e.to_string().contains("exited before it was ready"), "{e}");
        let mut p = Peer::spawn_cmd(sh("echo ready tcp=127.0.0.1:1")).unwrap();
        assert!(p.wait_exit(Duration::from_secs(5)));
    }
}
