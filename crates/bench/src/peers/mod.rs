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
pub mod sockperf;
pub mod ucx_perftest;
pub mod xrootd;

use anyhow::{bail, Context};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let start = Instant::now();
    while child.try_wait()?.is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{cmd:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// A TCP port free on loopback just now.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn output_bounds_the_run() {
        let out = output(
            Command::new("sh").args(["-c", "echo out; echo err >&2"]),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(out, "out\nerr\n");
        let e = output(Command::new("sleep").arg("5"), Duration::from_millis(100)).unwrap_err();
        assert!(e.to_string().contains("ran past"), "{e}");
        let c = command(Some("ns1"), "iperf3");
        assert_eq!(c.get_program(), "ip");
        assert_eq!(
            c.get_args().collect::<Vec<_>>(),
            ["netns", "exec", "ns1", "iperf3"]
        );
    }
}
