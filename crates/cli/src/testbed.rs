//! The gateway testbed in network namespaces (PaScal's Level-1 / Level-2):
//! a compute host, N gateway hosts and a storage host, each in its own
//! namespace. Fabric-side veth links are unshaped; storage-side links are
//! shaped with `tc tbf`. The kernel's own equal-cost multipath routes through
//! the same gateways give the baseline to compare with.
//!
//! ```text
//!   compute ── 10.71.i.0/24 ── gateway i ── 10.72.i.0/24 (tbf) ── storage
//!   (ECMP baseline: 10.73.0.1 on storage, reached from compute over every gateway)
//! ```
//!
//! Only addresses inside these namespaces are used; everything is removed on
//! drop, also when a run fails.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

use crate::peer::Peer;

/// Port every role listens on inside its namespace.
pub const PORT: u16 = 7400;
/// The storage host's address behind the kernel's multipath routes.
pub const ECMP_ADDR: &str = "10.73.0.1";

/// Namespaces and links of one run.
#[derive(Debug)]
pub struct Testbed {
    tag: String,
    gateways: usize,
    links: usize,
    namespaces: Vec<String>,
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run(Command::new("ip").args(args))
}

/// Runs a command inside namespace `ns`.
pub fn in_ns(ns: &str, args: &[&str]) -> Result<(), String> {
    run(Command::new("ip").args(["netns", "exec", ns]).args(args))
}

impl Testbed {
    /// Builds the namespaces for `gateways` gateways with storage-side links
    /// shaped to `rate` (a tc rate such as "1gbit").
    pub fn new(gateways: usize, rate: &str) -> Result<Testbed, String> {
        Testbed::with_links(gateways, 1, rate)
    }

    /// As [`new`](Self::new), with `links` storage-side links per gateway.
    pub fn with_links(gateways: usize, links: usize, rate: &str) -> Result<Testbed, String> {
        // Unique per testbed: process id and a counter (interface names
        // stay within 15 characters).
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 100;
        let tag = format!("ml{}x{n}", std::process::id() % 100_000);
        let mut tb = Testbed {
            tag: tag.clone(),
            gateways,
            links,
            namespaces: Vec::new(),
        };
        let c = tb.compute();
        let s = tb.storage();
        let all: Vec<String> = std::iter::once(c.clone())
            .chain((0..gateways).map(|i| tb.gateway(i)))
            .chain(std::iter::once(s.clone()))
            .collect();
        for ns in all {
            ip(&["netns", "add", &ns])?;
            tb.namespaces.push(ns.clone());
            in_ns(&ns, &["ip", "link", "set", "lo", "up"])?;
            // Asymmetric paths are the point of multipath: no reverse-path filter.
            for key in ["all", "default"] {
                in_ns(
                    &ns,
                    &["sysctl", "-qw", &format!("net.ipv4.conf.{key}.rp_filter=0")],
                )?;
            }
        }
        for i in 0..gateways {
            let g = tb.gateway(i);
            let (cf, gf) = (format!("{tag}c{i}"), format!("{tag}g{i}f"));
            ip(&["link", "add", &cf, "type", "veth", "peer", "name", &gf])?;
            ip(&["link", "set", &cf, "netns", &c])?;
            ip(&["link", "set", &gf, "netns", &g])?;
            in_ns(
                &c,
                &["ip", "addr", "add", &format!("10.71.{i}.1/24"), "dev", &cf],
            )?;
            in_ns(
                &g,
                &["ip", "addr", "add", &format!("10.71.{i}.2/24"), "dev", &gf],
            )?;
            in_ns(&c, &["ip", "link", "set", &cf, "up"])?;
            in_ns(&g, &["ip", "link", "set", &gf, "up"])?;
            for j in 0..links {
                // Storage-side link j of gateway i: 10.(72+2j).i.0/24.
                let net = 72 + 2 * j;
                let (gs, sg) = (format!("{tag}g{i}s{j}"), format!("{tag}s{i}{j}"));
                ip(&["link", "add", &gs, "type", "veth", "peer", "name", &sg])?;
                ip(&["link", "set", &gs, "netns", &g])?;
                ip(&["link", "set", &sg, "netns", &s])?;
                let (ga, sa) = (format!("10.{net}.{i}.1/24"), format!("10.{net}.{i}.2/24"));
                in_ns(&g, &["ip", "addr", "add", &ga, "dev", &gs])?;
                in_ns(&s, &["ip", "addr", "add", &sa, "dev", &sg])?;
                in_ns(&g, &["ip", "link", "set", &gs, "up"])?;
                in_ns(&s, &["ip", "link", "set", &sg, "up"])?;
                for (ns, dev) in [(&g, &gs), (&s, &sg)] {
                    let tbf = [
                        "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                    ];
                    let tail = ["burst", "256kb", "latency", "20ms"];
                    in_ns(ns, &[&tbf[..], &tail[..]].concat())?;
                }
            }
        }
        Ok(tb)
    }

    /// The compute host's namespace.
    pub fn compute(&self) -> String {
        format!("{}c", self.tag)
    }

    /// Gateway `i`'s namespace.
    pub fn gateway(&self, i: usize) -> String {
        format!("{}g{i}", self.tag)
    }

    /// The storage host's namespace.
    pub fn storage(&self) -> String {
        format!("{}s", self.tag)
    }

    /// Gateway `i`'s fabric-side address.
    pub fn gateway_addr(&self, i: usize) -> String {
        format!("10.71.{i}.2:{PORT}")
    }

    /// The storage host's address on gateway `i`'s first storage-side link.
    pub fn storage_addr(&self, i: usize) -> String {
        format!("10.72.{i}.2:{PORT}")
    }

    /// Gateway `i`'s device for its storage-side link `j`.
    pub fn storage_link(&self, i: usize, j: usize) -> String {
        format!("{}g{i}s{j}", self.tag)
    }

    /// The storage host's addresses on every storage-side link of gateway `i`.
    pub fn storage_addrs(&self, i: usize) -> Vec<String> {
        (0..self.links)
            .map(|j| format!("10.{}.{i}.2:{PORT}", 72 + 2 * j))
            .collect()
    }

    /// Starts `macrolink ROLE` (the binary `exe`) inside namespace `ns`.
    pub fn spawn(
        &self,
        exe: &Path,
        ns: &str,
        role: &str,
        node: u32,
        extra: &[&str],
        dir: &Path,
    ) -> anyhow::Result<Peer> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns])
            .arg(exe)
            .args([role, "--exit-with-parent", "--node", &node.to_string()])
            .arg("--shm-dir")
            .arg(dir.join(ns))
            .args(["--udp", "127.0.0.1"])
            .args(extra);
        Peer::spawn_cmd(cmd)
    }

    /// Sets up the kernel's equal-cost multipath routes from compute to
    /// [`ECMP_ADDR`] over every gateway, with L4 hashing.
    pub fn kernel_ecmp(&self) -> Result<(), String> {
        let (c, s) = (self.compute(), self.storage());
        in_ns(
            &s,
            &["ip", "addr", "add", &format!("{ECMP_ADDR}/32"), "dev", "lo"],
        )?;
        let mut route = vec![
            "ip".to_string(),
            "route".into(),
            "add".into(),
            format!("{ECMP_ADDR}/32"),
        ];
        for i in 0..self.gateways {
            let g = self.gateway(i);
            in_ns(&g, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
            in_ns(
                &g,
                &[
                    "ip",
                    "route",
                    "add",
                    &format!("{ECMP_ADDR}/32"),
                    "via",
                    &format!("10.72.{i}.2"),
                ],
            )?;
            in_ns(
                &s,
                &[
                    "ip",
                    "route",
                    "replace",
                    &format!("10.71.{i}.0/24"),
                    "via",
                    &format!("10.72.{i}.1"),
                ],
            )?;
            route.extend(["nexthop".into(), "via".into(), format!("10.71.{i}.2")]);
        }
        in_ns(
            &c,
            &["sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=1"],
        )?;
        let route: Vec<&str> = route.iter().map(String::as_str).collect();
        in_ns(&c, &route)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Moves the calling thread (and threads it starts later) into namespace `ns`.
pub fn enter(ns: &str) -> std::io::Result<()> {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}"))?;
    // SAFETY: setns with a namespace descriptor just opened; it changes only
    // the calling thread's network namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
