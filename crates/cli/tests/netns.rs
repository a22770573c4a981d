//! The gateway testbed in network namespaces (`macrolink::testbed`): a
//! compute host, two gateway hosts and a storage host, each in its own
//! namespace, storage-side links shaped to 1 Gbit/s with tbf. One gateway is
//! killed mid-transfer; the transfer completes and the storage host's hash
//! check passes.
//!
//! Needs root and iproute2. Where they are missing the test says so and does
//! nothing, unless MACROLINK_REQUIRE_NETNS=1 (set by .ci/run): then it fails.

use macrolink::gwbench::{send_config, striped, Fault};
use macrolink::testbed::Testbed;
use std::path::Path;

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");

/// A testbed of `gateways` gateways with `links` storage links each, or
/// `None` (with the reason printed) where namespaces cannot be made here;
/// with MACROLINK_REQUIRE_NETNS=1 (CI) that is a failure instead.
fn testbed(gateways: usize, links: usize) -> Option<Testbed> {
    let required = std::env::var("MACROLINK_REQUIRE_NETNS").is_ok_and(|v| v == "1");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    match (root, Testbed::with_links(gateways, links, "1gbit")) {
        (true, Ok(tb)) => Some(tb),
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
            None
        }
    }
}

#[test]
fn a_gateway_killed_in_the_namespace_testbed_loses_nothing() {
    let Some(tb) = testbed(2, 1) else {
        return;
    };
    let payload: Vec<u8> = (0..32u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let r = striped(
        Path::new(EXE),
        &tb,
        2,
        &payload,
        send_config(4, 100, 3),
        Some(Fault::KillGateway(1.0 / 3.0)),
        1,
    )
    .unwrap();
    eprintln!("namespace testbed, gateway killed: {r:?}");
    assert!(r.verified, "{r:?}");
    assert!(r.failovers >= 1, "{r:?}");
    assert_eq!(r.bytes, 32 << 20);
}

/// Bytes a qdisc has sent, from `tc -s qdisc show`.
fn sent_bytes(ns: &str, dev: &str) -> u64 {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "Sent")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no Sent in {text}"))
}

#[test]
fn a_gateway_with_two_storage_links_uses_both() {
    let Some(tb) = testbed(1, 2) else {
        return;
    };
    let payload = macrolink::gwbench::payload(24 << 20);
    let r = striped(
        Path::new(EXE),
        &tb,
        1,
        &payload,
        send_config(4, 100, 3),
        None,
        1,
    )
    .unwrap();
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
