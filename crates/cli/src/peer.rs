//! A `macrolink echo` process started by this one: the other side of demos
//! and of the multi-process tests.

use anyhow::{bail, Context};
use macrolink_fabric::RegionKey;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A peer process started by this one; killed when dropped.
#[derive(Debug)]
pub struct Peer {
    child: Child,
    /// Its node's TCP address.
    pub tcp: std::net::SocketAddr,
    /// Region key of each endpoint.
    pub keys: Vec<(u32, RegionKey)>,
    /// A file service's fabric node address, when it names one.
    pub fabric: Option<std::net::SocketAddr>,
}

impl Peer {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts `macrolink echo` (the binary at `exe`) as node `node` with `extra` arguments and waits
    /// for its `ready` line.
    pub fn spawn(exe: &Path, node: u32, shm_dir: &Path, extra: &[&str]) -> anyhow::Result<Peer> {
        Peer::spawn_role(exe, "echo", node, shm_dir, extra)
    }

    /// Starts `macrolink ROLE` (echo, gateway, sink) as node `node` and waits
    /// for its `ready` line.
    pub fn spawn_role(
        exe: &Path,
        role: &str,
        node: u32,
        shm_dir: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Peer> {
        let mut cmd = Command::new(exe);
        cmd.args([role, "--exit-with-parent", "--node", &node.to_string()])
            .arg("--shm-dir")
            .arg(shm_dir)
            .args(extra);
        Peer::spawn_cmd(cmd)
    }

    /// Starts a prepared `macrolink` command line (it may run under a
    /// wrapper such as `ip netns exec NS`) and waits for its `ready` line.
    pub fn spawn_cmd(mut cmd: Command) -> anyhow::Result<Peer> {
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the peer")?;
        let mut keys = Vec::new();
        let mut lines = BufReader::new(child.stdout.take().context("peer stdout")?).lines();
        loop {
            let Some(line) = lines.next().transpose()? else {
                let _ = child.kill();
                bail!("peer exited before it was ready");
            };
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(name).map(str::to_owned))
            };
            if line.starts_with("region ") {
                let ep = field("ep=").context("ep")?.parse()?;
                let key = field("key=").context("key")?;
                let key = u64::from_str_radix(key.trim_start_matches("0x"), 16)?;
                keys.push((ep, RegionKey(key)));
            } else if line.starts_with("ready ") {
                let tcp = field("tcp=").context("tcp")?.parse()?;
                let fabric = field("fabric=").map(|f| f.parse()).transpose()?;
                return Ok(Peer {
                    child,
                    tcp,
                    keys,
                    fabric,
                });
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
