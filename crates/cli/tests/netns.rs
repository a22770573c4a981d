//! The gateway testbed in network namespaces: a compute host, two gateway
//! hosts and a storage host, each in its own namespace; fabric-side veth
//! links unshaped, storage-side links shaped to 1 Gbit/s with tbf. One
//! gateway is killed mid-transfer; the transfer completes and the storage
//! host's hash check passes.
//!
//! Needs root and iproute2. Where they are missing the test says so and does
//! nothing, unless MACROLINK_REQUIRE_NETNS=1 (set by .ci/run): then it fails.
//! Everything it makes is removed at the end, also when it fails; it only
//! uses addresses inside its own namespaces.

use macrolink::peer::Peer;
use macrolink_fabric::{Addr, Completion, EndpointConfig, Node, NodeConfig};
use macrolink_gateway::stripe::StripeConfig;
use macrolink_gwnet::client::{send, SendConfig};
use std::os::fd::AsRawFd;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");
const PORT: u16 = 7400;

/// Namespaces and links of one test run; removed on drop.
struct Testbed {
    tag: String,
    namespaces: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn in_ns(ns: &str, args: &[&str]) -> Result<(), String> {
    let mut full = vec!["netns", "exec", ns];
    full.extend_from_slice(args);
    if args.first() == Some(&"tc") {
        let out = Command::new("ip")
            .args(&full)
            .output()
            .map_err(|e| e.to_string())?;
        return if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}: {}",
                full.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        };
    }
    ip(&full)
}

impl Testbed {
    fn new(gateways: usize) -> Result<Testbed, String> {
        let tag = format!("ml{}", std::process::id() % 100_000);
        let mut tb = Testbed {
            tag: tag.clone(),
            namespaces: Vec::new(),
        };
        let c = format!("{tag}c");
        let s = format!("{tag}s");
        for ns in std::iter::once(c.clone())
            .chain((0..gateways).map(|i| format!("{tag}g{i}")))
            .chain(std::iter::once(s.clone()))
        {
            ip(&["netns", "add", &ns])?;
            tb.namespaces.push(ns.clone());
            in_ns(&ns, &["ip", "link", "set", "lo", "up"])?;
        }
        for i in 0..gateways {
            let g = format!("{tag}g{i}");
            // Fabric side: compute <-> gateway i, unshaped.
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
            // Storage side: gateway i <-> storage, 1 Gbit/s each way.
            let (gs, sg) = (format!("{tag}g{i}s"), format!("{tag}s{i}"));
            ip(&["link", "add", &gs, "type", "veth", "peer", "name", &sg])?;
            ip(&["link", "set", &gs, "netns", &g])?;
            ip(&["link", "set", &sg, "netns", &s])?;
            in_ns(
                &g,
                &["ip", "addr", "add", &format!("10.72.{i}.1/24"), "dev", &gs],
            )?;
            in_ns(
                &s,
                &["ip", "addr", "add", &format!("10.72.{i}.2/24"), "dev", &sg],
            )?;
            in_ns(&g, &["ip", "link", "set", &gs, "up"])?;
            in_ns(&s, &["ip", "link", "set", &sg, "up"])?;
            for (ns, dev) in [(&g, &gs), (&s, &sg)] {
                in_ns(
                    ns,
                    &[
                        "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "1gbit", "burst",
                        "256kb", "latency", "20ms",
                    ],
                )?;
            }
        }
        Ok(tb)
    }

    fn ns(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.tag)
    }

    /// Starts `macrolink ROLE` inside namespace `ns`.
    fn spawn(
        &self,
        ns: &str,
        role: &str,
        node: u32,
        extra: &[&str],
        dir: &std::path::Path,
    ) -> Peer {
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            ns,
            EXE,
            role,
            "--exit-with-parent",
            "--node",
            &node.to_string(),
        ])
        .arg("--shm-dir")
        .arg(dir.join(ns))
        .args(["--udp", "127.0.0.1"])
        .args(extra);
        Peer::spawn_cmd(cmd).unwrap_or_else(|e| panic!("{role} in {ns}: {e:#}"))
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

fn data(n: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_gateway_killed_in_the_namespace_testbed_loses_nothing() {
    let required = std::env::var("MACROLINK_REQUIRE_NETNS").is_ok_and(|v| v == "1");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tb = match (root, Testbed::new(2)) {
        (true, Ok(tb)) => tb,
        (r, res) => {
            let why = if r {
                res.err().unwrap_or_default()
            } else {
                "not root".into()
            };
            assert!(
                !required,
                "namespace testbed required but unavailable: {why}"
            );
            eprintln!("namespace test not run here: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let sink_tcp = format!("0.0.0.0:{PORT}");
    let _sink = tb.spawn(&tb.ns("s"), "sink", 10, &["--tcp", &sink_tcp], dir.path());
    let mut gateways: Vec<Peer> = (0..2u32)
        .map(|i| {
            let tcp = format!("10.71.{i}.2:{PORT}");
            let sink = format!("10=10.72.{i}.2:{PORT}");
            tb.spawn(
                &tb.ns(&format!("g{i}")),
                "gateway",
                21 + i,
                &["--tcp", &tcp, "--peer", &sink],
                dir.path(),
            )
        })
        .collect();

    // The compute host: this test's thread, moved into its namespace.
    let compute_ns = tb.ns("c");
    let shm = dir.path().join(&compute_ns);
    let payload = data(32 << 20);
    let mut victim = Some(gateways.remove(0));
    let report = std::thread::scope(|s| {
        s.spawn(|| {
            let f = std::fs::File::open(format!("/var/run/netns/{compute_ns}")).unwrap();
            // SAFETY: setns with a namespace descriptor we just opened; it
            // moves only this thread (and the threads it starts).
            assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
            let mut cfg = NodeConfig::local(1, &shm);
            cfg.peers
                .insert(21, format!("10.71.0.2:{PORT}").parse().unwrap());
            cfg.peers
                .insert(22, format!("10.71.1.2:{PORT}").parse().unwrap());
            let node = Node::start(cfg).unwrap();
            let mut ep = node
                .open(
                    1,
                    EndpointConfig {
                        completion: Completion::Wait,
                        tokens: 256,
                        ..EndpointConfig::default()
                    },
                )
                .unwrap();
            let cfg = SendConfig {
                stripe: StripeConfig {
                    chunk: 1 << 20,
                    window: 4,
                    rto: 500_000_000,
                },
                ..SendConfig::default()
            };
            let gws = [Addr::new(21, 1), Addr::new(22, 1)];
            send(
                &mut ep,
                &gws,
                Addr::new(10, 1),
                1,
                &payload,
                cfg,
                &mut |acked, total| {
                    if acked * 3 >= total {
                        if let Some(mut g) = victim.take() {
                            g.kill();
                        }
                    }
                },
            )
            .unwrap()
        })
        .join()
        .unwrap()
    });
    eprintln!("namespace testbed, gateway killed: {report:?}");
    assert!(report.verified, "{report:?}");
    assert!(report.failovers >= 1, "{report:?}");
    assert_eq!(report.bytes, 32 << 20);
}
