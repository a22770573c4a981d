//! The gateway testbed in network namespaces (PaScal's Level-1 / Level-2):
//! C compute hosts, G gateway hosts and S storage hosts, each in its own
//! namespace. Each gateway bridges its fabric side (one veth to every
//! compute host, unshaped) and each of its storage-side links (one veth to
//! every storage host, shaped with `tc tbf`). The kernel's own equal-cost
//! multipath routes through the same gateways give the baseline to compare
//! with.
//!
//! ```text
//!   compute c ── 10.71.i.(10+c) ─┐
//!                                 ├ bridge 10.71.i.2 ── gateway i ── bridge 10.(72+2j).i.1 ─┬─(tbf)── storage s: 10.(72+2j).i.(2+s)
//!   (ECMP baseline: 10.73.0.1 on storage 0, reached from compute 0 over every gateway)
//! ```
//!
//! Only addresses inside these namespaces are used; everything is removed on
//! drop, also when a run fails.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::peer::Peer;

/// Port every role listens on inside its namespace.
pub const PORT: u16 = 7400;
/// Node id of compute host 0; host `c` is `COMPUTE_NODE + c`.
pub const COMPUTE_NODE: u32 = 1;
/// Node id of storage host 0; host `s` is `STORAGE_NODE + s`.
pub const STORAGE_NODE: u32 = 10;
/// Node id of gateway 0; gateway `i` is `GATEWAY_NODE + i`.
pub const GATEWAY_NODE: u32 = 21;
/// The storage host's address behind the kernel's multipath routes.
pub const ECMP_ADDR: &str = "10.73.0.1";

/// How many hosts of each role, and links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Compute hosts.
    pub compute: usize,
    /// Gateway hosts.
    pub gateways: usize,
    /// Storage hosts.
    pub storage: usize,
    /// Storage-side links per gateway.
    pub links: usize,
}

/// Namespaces and links of one run.
#[derive(Debug)]
pub struct Testbed {
    tag: String,
    shape: Shape,
    namespaces: Vec<String>,
    ecmp: std::sync::atomic::AtomicBool,
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

/// Bare network namespaces (loopback up, nothing else), removed when
/// dropped: for tests that join them their own way (`macrolink link`).
#[derive(Debug)]
pub struct Namespaces {
    /// Their names.
    pub names: Vec<String>,
}

impl Namespaces {
    /// `n` new namespaces.
    pub fn new(n: usize) -> Result<Namespaces, String> {
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut made = Namespaces { names: Vec::new() };
        for i in 0..n {
            let ns = format!("mlns{}-{k}-{i}", std::process::id());
            crate::undo::made_netns(&ns);
            made.names.push(ns.clone());
            ip(&["netns", "add", &ns])?;
            in_ns(&ns, &["ip", "link", "set", "lo", "up"])?;
        }
        Ok(made)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = ip(&["netns", "del", ns]);
            crate::undo::removed_netns(ns);
        }
    }
}

/// A veth pair with ends `a` in `ns_a` and `b` in `ns_b`, both up.
fn veth(a: &str, ns_a: &str, b: &str, ns_b: &str) -> Result<(), String> {
    ip(&["link", "add", a, "type", "veth", "peer", "name", b])?;
    ip(&["link", "set", a, "netns", ns_a])?;
    ip(&["link", "set", b, "netns", ns_b])?;
    in_ns(ns_a, &["ip", "link", "set", a, "up"])?;
    in_ns(ns_b, &["ip", "link", "set", b, "up"])
}

/// Joins namespaces `ns_a` and `ns_b` by a veth pair: end `a` in the first
/// with address `addr_a`, end `b` in the second with `addr_b` (both with a
/// prefix length), both up.
pub fn join(
    (a, ns_a, addr_a): (&str, &str, &str),
    (b, ns_b, addr_b): (&str, &str, &str),
) -> Result<(), String> {
    veth(a, ns_a, b, ns_b)?;
    in_ns(ns_a, &["ip", "addr", "add", addr_a, "dev", a])?;
    in_ns(ns_b, &["ip", "addr", "add", addr_b, "dev", b])
}

/// A bridge `name` in `ns` holding `addr`, up.
fn bridge(ns: &str, name: &str, addr: &str) -> Result<(), String> {
    in_ns(ns, &["ip", "link", "add", name, "type", "bridge"])?;
    in_ns(ns, &["ip", "addr", "add", addr, "dev", name])?;
    in_ns(ns, &["ip", "link", "set", name, "up"])
}

fn shape_tbf(ns: &str, dev: &str, rate: &str) -> Result<(), String> {
    let tbf = [
        "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
    ];
    let tail = ["burst", "256kb", "latency", "20ms"];
    in_ns(ns, &[&tbf[..], &tail[..]].concat())
}

impl Testbed {
    /// One compute host, `gateways` gateways and one storage host, with
    /// storage-side links shaped to `rate` (a tc rate such as "1gbit").
    pub fn new(gateways: usize, rate: &str) -> Result<Testbed, String> {
        Testbed::with_links(gateways, 1, rate)
    }

    /// As [`new`](Self::new), with `links` storage-side links per gateway.
    pub fn with_links(gateways: usize, links: usize, rate: &str) -> Result<Testbed, String> {
        Testbed::build(
            Shape {
                compute: 1,
                gateways,
                storage: 1,
                links,
            },
            rate,
        )
    }

    /// Builds the namespaces and links of `shape`.
    pub fn build(shape: Shape, rate: &str) -> Result<Testbed, String> {
        // Unique per testbed: process id and a counter (interface names
        // stay within 15 characters).
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10;
        let tag = format!("m{}{n}", std::process::id() % 10_000);
        let mut tb = Testbed {
            tag: tag.clone(),
            shape,
            namespaces: Vec::new(),
            ecmp: std::sync::atomic::AtomicBool::new(false),
        };
        let all: Vec<String> = (0..shape.compute)
            .map(|c| tb.compute_ns(c))
            .chain((0..shape.gateways).map(|i| tb.gateway(i)))
            .chain((0..shape.storage).map(|s| tb.storage_ns(s)))
            .collect();
        for ns in all {
            crate::undo::made_netns(&ns);
            tb.namespaces.push(ns.clone());
            ip(&["netns", "add", &ns])?;
            in_ns(&ns, &["ip", "link", "set", "lo", "up"])?;
            // Asymmetric paths are the point of multipath: no reverse-path filter.
            for key in ["all", "default"] {
                in_ns(
                    &ns,
                    &["sysctl", "-qw", &format!("net.ipv4.conf.{key}.rp_filter=0")],
                )?;
            }
        }
        for i in 0..shape.gateways {
            let g = tb.gateway(i);
            let fab = format!("{tag}g{i}f");
            bridge(&g, &fab, &format!("10.71.{i}.2/24"))?;
            for c in 0..shape.compute {
                let cn = tb.compute_ns(c);
                let (cd, gd) = (format!("{tag}c{c}g{i}"), format!("{tag}g{i}c{c}"));
                veth(&cd, &cn, &gd, &g)?;
                in_ns(&g, &["ip", "link", "set", &gd, "master", &fab])?;
                let addr = format!("10.71.{i}.{}/24", 10 + c);
                in_ns(&cn, &["ip", "addr", "add", &addr, "dev", &cd])?;
            }
            for j in 0..shape.links {
                // Storage-side link j of gateway i: 10.(72+2j).i.0/24.
                let net = 72 + 2 * j;
                let br = format!("{tag}g{i}b{j}");
                bridge(&g, &br, &format!("10.{net}.{i}.1/24"))?;
                for st in 0..shape.storage {
                    let sn = tb.storage_ns(st);
                    let (gd, sd) = (tb.port(i, j, st), format!("{tag}s{st}g{i}l{j}"));
                    veth(&gd, &g, &sd, &sn)?;
                    in_ns(&g, &["ip", "link", "set", &gd, "master", &br])?;
                    let addr = format!("10.{net}.{i}.{}/24", 2 + st);
                    in_ns(&sn, &["ip", "addr", "add", &addr, "dev", &sd])?;
                    shape_tbf(&g, &gd, rate)?;
                    shape_tbf(&sn, &sd, rate)?;
                }
            }
        }
        Ok(tb)
    }

    /// Its shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The first compute host's namespace.
    pub fn compute(&self) -> String {
        self.compute_ns(0)
    }

    /// Compute host `c`'s namespace.
    pub fn compute_ns(&self, c: usize) -> String {
        format!("{}c{c}", self.tag)
    }

    /// Gateway `i`'s namespace.
    pub fn gateway(&self, i: usize) -> String {
        format!("{}g{i}", self.tag)
    }

    /// The first storage host's namespace.
    pub fn storage(&self) -> String {
        self.storage_ns(0)
    }

    /// Storage host `s`'s namespace.
    pub fn storage_ns(&self, s: usize) -> String {
        format!("{}s{s}", self.tag)
    }

    /// Gateway `i`'s fabric-side address.
    pub fn gateway_addr(&self, i: usize) -> String {
        format!("10.71.{i}.2:{PORT}")
    }

    /// The first storage host's address on gateway `i`'s first storage-side link.
    pub fn storage_addr(&self, i: usize) -> String {
        format!("10.72.{i}.2:{PORT}")
    }

    fn port(&self, i: usize, j: usize, s: usize) -> String {
        format!("{}g{i}l{j}s{s}", self.tag)
    }

    /// Gateway `i`'s device for its storage-side link `j` to the first
    /// storage host.
    pub fn storage_link(&self, i: usize, j: usize) -> String {
        self.port(i, j, 0)
    }

    /// The first storage host's addresses on every storage-side link of gateway `i`.
    pub fn storage_addrs(&self, i: usize) -> Vec<String> {
        self.storage_addrs_of(0, i)
    }

    /// Storage host `s`'s addresses on every storage-side link of gateway `i`.
    pub fn storage_addrs_of(&self, s: usize, i: usize) -> Vec<String> {
        (0..self.shape.links)
            .map(|j| format!("10.{}.{i}.{}:{PORT}", 72 + 2 * j, 2 + s))
            .collect()
    }

    /// Node id of gateway `i`.
    pub fn gateway_node(&self, i: usize) -> u32 {
        GATEWAY_NODE + i as u32
    }

    /// Node id of storage host `s`.
    pub fn storage_node(&self, s: usize) -> u32 {
        STORAGE_NODE + s as u32
    }

    /// The arguments that make `macrolink gateway` gateway `i` of this
    /// testbed: its fabric address, and one `--peer` for each storage-side
    /// link to each storage host (the gateway uses them all).
    pub fn gateway_args(&self, i: usize) -> Vec<String> {
        let mut args = vec!["--tcp".to_string(), self.gateway_addr(i)];
        for s in 0..self.shape.storage {
            for a in self.storage_addrs_of(s, i) {
                args.push("--peer".into());
                args.push(format!("{}={a}", self.storage_node(s)));
            }
        }
        args
    }

    /// Starts gateway `i` (`macrolink gateway`, the binary `exe`) in its
    /// namespace, its shared-memory directory under `dir`.
    pub fn spawn_gateway(&self, exe: &Path, i: usize, dir: &Path) -> anyhow::Result<Peer> {
        let args = self.gateway_args(i);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.spawn(
            exe,
            &self.gateway(i),
            "gateway",
            self.gateway_node(i),
            &args,
            dir,
        )
        .with_context(|| format!("starting gateway {i}"))
    }

    /// Starts `macrolink sink` on storage host `s`, listening on every
    /// address of its namespace.
    pub fn spawn_sink(&self, exe: &Path, s: usize, dir: &Path) -> anyhow::Result<Peer> {
        let listen = format!("0.0.0.0:{PORT}");
        let ns = self.storage_ns(s);
        self.spawn(
            exe,
            &ns,
            "sink",
            self.storage_node(s),
            &["--tcp", &listen],
            dir,
        )
        .with_context(|| format!("starting the sink of storage host {s}"))
    }

    /// Retransmission timeouts the kernels of the testbed's namespaces
    /// have had so far (`TCPTimeouts`: a connection that heard no
    /// acknowledgement for its whole timeout, 200 ms at the least, and
    /// sent again). Read before and after a run, the difference says
    /// whether a stall of a quarter second or more may be the kernel's
    /// loss recovery. (Segments sent again in all, `RetransSegs`, run to
    /// hundreds a run on these shaped links, nearly all tail-loss probes
    /// of queues that answer late, which stall nothing.)
    pub fn tcp_timeouts(&self) -> anyhow::Result<u64> {
        self.namespaces.iter().map(|ns| tcp_timeouts(ns)).sum()
    }

    /// Bytes the qdisc of `dev` in namespace `ns` has sent.
    pub fn sent_bytes(&self, ns: &str, dev: &str) -> anyhow::Result<u64> {
        qdisc_sent(ns, dev)
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
    /// [`ECMP_ADDR`] over every gateway, with L4 hashing, and routes from
    /// compute to the storage network behind each gateway. Once: a second
    /// call finds them there.
    pub fn kernel_ecmp(&self) -> Result<(), String> {
        if self.ecmp.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Ok(());
        }
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
        for i in 0..self.shape.gateways {
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
            // The storage network behind each gateway, for connections
            // that storage hosts open towards compute hosts.
            for j in 0..self.shape.links {
                let net = format!("10.{}.{i}.0/24", 72 + 2 * j);
                let via = format!("10.71.{i}.2");
                in_ns(&c, &["ip", "route", "add", &net, "via", &via])?;
            }
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
            crate::undo::removed_netns(ns);
        }
    }
}

/// Bytes a qdisc has sent, from `tc -s qdisc show`.
pub fn qdisc_sent(ns: &str, dev: &str) -> anyhow::Result<u64> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "Sent")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no Sent in {text}"))
}

/// Retransmission timeouts the kernel of namespace `ns` has had
/// (`TCPTimeouts` of its `/proc/net/netstat`).
pub fn tcp_timeouts(ns: &str) -> anyhow::Result<u64> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/netstat"])
        .output()?;
    if !out.status.success() {
        anyhow::bail!(
            "reading namespace {ns}'s TCP counters: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    timeouts_of(&text).with_context(|| format!("no TcpExt TCPTimeouts in {text}"))
}

fn timeouts_of(netstat: &str) -> Option<u64> {
    let mut ext = netstat.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (ext.next()?, ext.next()?);
    let at = names.split_whitespace().position(|w| w == "TCPTimeouts")?;
    values.split_whitespace().nth(at)?.parse().ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_retransmission_timeouts_are_read() {
        let netstat = "TcpExt: SyncookiesSent EmbryonicRsts TCPTimeouts TCPLossProbes\n\
                       TcpExt: 0 2 17 3297\n\
                       IpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(timeouts_of(netstat), Some(17));
        assert_eq!(timeouts_of("IpExt: InNoRoutes\nIpExt: 0\n"), None);
    }
}
