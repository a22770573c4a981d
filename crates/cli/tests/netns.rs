//! The gateway testbed in network namespaces (`macrolink_testbed::netns`): a
//! compute host, two gateway hosts and a storage host, each in its own
//! namespace, storage-side links shaped to 1 Gbit/s with tbf. One gateway is
//! killed mid-transfer; the transfer completes and the storage host's hash
//! check passes.
//!
//! Needs root and iproute2. Where they are missing the test says so and does
//! nothing, unless MACROLINK_REQUIRE_NETNS=1 (set by .ci/run): then it fails.

use macrolink_bench::gateways::{files_through, send_config, striped, Fault};
use macrolink_fabric::{Addr, Node, NodeConfig};
use macrolink_testbed::data::pattern;
use macrolink_testbed::netns::{enter, in_ns, qdisc_sent, Shape, Testbed, ECMP_ADDR};
use macrolink_testbed::{require, Peer};
use std::path::Path;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");

/// A testbed of `gateways` gateways with `links` storage links each, or
/// `None` where namespaces cannot be made here (a failure under CI).
fn testbed(gateways: usize, links: usize) -> Option<Testbed> {
    testbed_of(Shape {
        compute: 1,
        gateways,
        storage: 1,
        links,
    })
}

fn testbed_of(shape: Shape) -> Option<Testbed> {
    require::testbed(shape, "1gbit")
}

/// 32 MiB striped over two gateways of a testbed while `fault` strikes
/// gateway 0; `None` where the testbed cannot be built.
fn two_gateways_with(fault: Fault, seed: u64) -> Option<macrolink_gwnet::client::SendReport> {
    let tb = testbed(2, 1)?;
    let payload = pattern(32 << 20, seed);
    let r = striped(
        Path::new(EXE),
        &tb,
        2,
        &payload,
        &send_config(4, 100, 3),
        Some(fault),
        1,
    )
    .unwrap()
    .report;
    assert!(r.verified, "{r:?}");
    assert_eq!(r.bytes, 32 << 20);
    Some(r)
}

#[test]
fn a_gateway_killed_in_the_namespace_testbed_loses_nothing() {
    let Some(r) = two_gateways_with(Fault::KillGateway(1.0 / 3.0), 2_654_435_761) else {
        return;
    };
    eprintln!("namespace testbed, gateway killed: {r:?}");
    assert!(r.failovers >= 1, "{r:?}");
}

#[test]
fn a_gateway_frozen_mid_transfer_is_found_by_heartbeats_and_loses_nothing() {
    // SIGSTOP: the gateway's connections stay open and its kernel still
    // takes bytes, so no error tells the client; only missed heartbeats do.
    let Some(r) = two_gateways_with(Fault::FreezeGateway(0.3), 2_246_822_519) else {
        return;
    };
    eprintln!("namespace testbed, gateway frozen: {r:?}");
    assert!(r.failovers >= 1, "the frozen gateway stayed in use: {r:?}");
    assert!(r.down[0] && !r.down[1], "{r:?}");
}

fn sent_bytes(ns: &str, dev: &str) -> u64 {
    qdisc_sent(ns, dev).unwrap()
}

#[test]
fn a_gateway_with_two_storage_links_uses_both() {
    let Some(tb) = testbed(1, 2) else {
        return;
    };
    let payload = pattern(24 << 20, 0);
    let r = striped(
        Path::new(EXE),
        &tb,
        1,
        &payload,
        &send_config(4, 100, 3),
        None,
        1,
    )
    .unwrap()
    .report;
    assert!(r.verified, "{r:?}");
    let g = tb.gateway(0);
    let dev = |j: usize| tb.storage_link(0, j);
    let (a, b) = (sent_bytes(&g, &dev(0)), sent_bytes(&g, &dev(1)));
    eprintln!("two links carried {a} and {b} bytes");
    for x in [a, b] {
        assert!(
            x > (24 << 20) / 3,
            "a link carried only {x} of {} bytes",
            24 << 20
        );
    }
}

#[test]
fn the_testbed_counts_its_kernels_retransmission_timeouts() {
    let Some(tb) = testbed(1, 1) else {
        return;
    };
    let (g, st) = (tb.gateway(0), tb.storage());
    let to: std::net::SocketAddr = tb.storage_addr(0).parse().unwrap();
    let listener = std::thread::scope(|s| {
        s.spawn(|| {
            enter(&st).unwrap();
            std::net::TcpListener::bind(to).unwrap()
        })
        .join()
        .unwrap()
    });
    let before = tb.tcp_timeouts().unwrap();
    let timeouts = std::thread::scope(|s| {
        let (tb, g, listener) = (&tb, &g, &listener);
        s.spawn(move || {
            enter(g).unwrap();
            let mut c = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5)).unwrap();
            let (_peer, _) = listener.accept().unwrap();
            // The gateway's storage-side link taken down under an open
            // connection: what it writes is acknowledged by no one, and
            // sent again when its timeout (200 ms at the least) passes.
            let dev = tb.storage_link(0, 0);
            in_ns(g, &["ip", "link", "set", "dev", &dev, "down"]).unwrap();
            std::io::Write::write_all(&mut c, &[7; 1000]).unwrap();
            let until = Instant::now() + Duration::from_secs(5);
            loop {
                let n = tb.tcp_timeouts().unwrap() - before;
                if n >= 1 || Instant::now() > until {
                    break n;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .join()
        .unwrap()
    });
    assert!(timeouts >= 1, "no retransmission timeout counted");
}

#[test]
fn every_compute_host_reaches_every_storage_host_through_the_lane() {
    let shape = Shape {
        compute: 2,
        gateways: 2,
        storage: 2,
        links: 1,
    };
    let Some(tb) = testbed_of(shape) else {
        return;
    };
    let exe = Path::new(EXE);
    let dir = tempfile::tempdir().unwrap();
    let _sinks: Vec<_> = (0..shape.storage)
        .map(|s| tb.spawn_sink(exe, s, dir.path()).unwrap())
        .collect();
    let _gateways: Vec<_> = (0..shape.gateways)
        .map(|i| tb.spawn_gateway(exe, i, dir.path()).unwrap())
        .collect();
    let payload = pattern(6 << 20, 0);
    std::thread::scope(|scope| {
        for c in 0..shape.compute {
            let (tb, dir, payload) = (&tb, dir.path(), &payload);
            scope.spawn(move || {
                let ns = tb.compute_ns(c);
                enter(&ns).unwrap();
                let mut cfg = NodeConfig::local(1 + c as u32, dir.join(&ns));
                for i in 0..shape.gateways {
                    cfg.peers
                        .insert(tb.gateway_node(i), tb.gateway_addr(i).parse().unwrap());
                }
                let node = Node::start(cfg).unwrap();
                let mut ep = node.open(1, macrolink_gwnet::endpoint_config()).unwrap();
                let gws: Vec<Addr> = (0..shape.gateways)
                    .map(|i| Addr::new(tb.gateway_node(i), 1))
                    .collect();
                for s in 0..shape.storage {
                    let id = (c * shape.storage + s) as u64 + 1;
                    let r = macrolink_gwnet::client::send(
                        &mut ep,
                        &gws,
                        Addr::new(tb.storage_node(s), 1),
                        id,
                        payload,
                        send_config(4, 100, 3),
                        &mut |_, _| {},
                    )
                    .unwrap();
                    assert!(r.verified, "compute {c} to storage {s}: {r:?}");
                    assert_eq!(r.bytes, payload.len() as u64);
                    assert!(
                        r.per_gateway.iter().all(|&b| b > 0),
                        "compute {c} to storage {s} used every gateway: {:?}",
                        r.per_gateway
                    );
                }
            });
        }
    });
}

#[test]
fn a_storage_link_gone_dark_mid_transfer_loses_nothing() {
    let Some(tb) = testbed(1, 2) else {
        return;
    };
    let payload = pattern(24 << 20, 0);
    let r = striped(
        Path::new(EXE),
        &tb,
        1,
        &payload,
        &send_config(4, 100, 3),
        Some(Fault::LinkDown(1.0 / 3.0, 0)),
        1,
    )
    .unwrap()
    .report;
    eprintln!("namespace testbed, storage link down: {r:?}");
    assert!(r.verified, "{r:?}");
    assert_eq!(r.bytes, 24 << 20);
}

#[test]
fn the_file_service_reaches_storage_through_routing_gateways() {
    let Some(tb) = testbed(2, 1) else {
        return;
    };
    tb.kernel_ecmp().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    std::fs::create_dir(&export).unwrap();
    let secret = "namespace test secret, long enough";
    // Each host meets others of its own namespace only: no shared memory
    // between compute and storage, so the data crosses the gateways.
    let mut serve = std::process::Command::new("ip");
    serve
        .args(["netns", "exec", &tb.storage(), EXE, "serve"])
        .arg(&export)
        .args(["--listen", &format!("{ECMP_ADDR}:7130")])
        .arg("--shm-dir")
        .arg(dir.path().join("shm-storage"))
        .env("MACROLINK_SECRET", secret);
    let _server = Peer::spawn_cmd(serve).unwrap();
    let data = pattern(16 << 20, 0);
    let src = dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    let url = format!("ml://{ECMP_ADDR}:7130/f");
    let back = dir.path().join("back");
    let before: u64 = (0..2)
        .map(|i| sent_bytes(&tb.gateway(i), &tb.storage_link(i, 0)))
        .sum();
    for (from, to) in [
        (src.display().to_string(), url.clone()),
        (url, back.display().to_string()),
    ] {
        let out = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &tb.compute(),
                EXE,
                "cp",
                "-q",
                "--streams",
                "4",
            ])
            .args([&from, &to])
            .arg("--shm-dir")
            .arg(dir.path().join("shm-compute"))
            .env("MACROLINK_SECRET", secret)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{from} -> {to}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(std::fs::read(&back).unwrap() == data, "content differs");
    assert!(std::fs::read(export.join("f")).unwrap() == data);
    let after: u64 = (0..2)
        .map(|i| sent_bytes(&tb.gateway(i), &tb.storage_link(i, 0)))
        .sum();
    assert!(
        after - before >= 16 << 20,
        "the upload crossed the gateways' storage links ({} bytes)",
        after - before
    );
}

#[test]
fn the_file_service_rides_the_user_space_gateways_of_its_lane() {
    let Some(tb) = testbed(2, 1) else {
        return;
    };
    // Every copy is compared with its source inside; the files live in
    // the directory given, and go with the run. Two rounds: the second
    // copies over the first's files.
    let parent = tempfile::tempdir().unwrap();
    let r = files_through(Path::new(EXE), &tb, 2, 24, 2, Some(parent.path())).unwrap();
    eprintln!("cp through the lane: {r:?}");
    let figures = [
        r.up,
        r.up_direct,
        r.down,
        r.down_cached,
        r.down_direct,
        r.down_null,
    ];
    for (runs, figure) in r.runs.iter().zip(figures) {
        assert_eq!(runs.len(), 2, "{r:?}");
        // Of two runs, the figure is the slower's.
        assert_eq!(figure, runs[0].min(runs[1]), "{r:?}");
    }
    let left: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
    assert!(left.is_empty(), "the run left {left:?}");
    assert!(r.fs_write > 0.0, "the file system's own rate: {r:?}");
    assert!(r.down_null > 0.0, "the download into /dev/null: {r:?}");
    assert!(r.down_direct > 0.0, "the download with direct I/O: {r:?}");
    assert!(r.down_cached > 0.0, "the download keeping its pages: {r:?}");
    assert!(
        r.fs_write_uncached > 0.0,
        "the file system's uncached rate: {r:?}"
    );
    assert!(r.up_direct > 0.0, "the upload with direct I/O: {r:?}");
    assert_eq!(
        r.source_cached,
        [24 << 20; 4],
        "every download reads a source held in the page cache"
    );
    for per in &r.carried {
        let nodes: Vec<u32> = per.iter().map(|(g, _)| *g).collect();
        assert_eq!(nodes, [21, 22], "{per:?}");
        assert!(
            per.iter().all(|(_, n)| *n > 0),
            "both gateways carry: {per:?}"
        );
        assert_eq!(per.iter().map(|(_, n)| n).sum::<u64>(), 24, "{per:?}");
    }
    for (i, b) in r.link_bytes.iter().enumerate() {
        assert!(
            *b >= (24 << 20) / 4,
            "gateway {i}'s storage link carried {b} bytes of the upload"
        );
    }
}
