//! The paper's claim on a simulated long link: link-level credit as a host
//! adapter has it (32 KiB) keeps a link of 1 ms each way nearly idle, while
//! a pair of relays whose long hop grants its bandwidth-delay product keeps
//! it full. Deterministic: simnet's virtual clock, no sockets.

use macrolink_relay::{window, Credit, Hop};
use macrolink_simnet::{LinkId, LinkSpec, Net, NodeId, MS, US};

/// InfiniBand's largest MTU.
const PKT: u64 = 2048;
/// Data rate of every link: 1 GB/s (4X SDR's 8 Gbit/s of data).
const RATE: u64 = 1_000_000_000;
/// A host adapter's link-level buffer.
const HCA: u64 = 32 << 10;
/// One-way delay of the long link: 200 km of fibre.
const LONG: u64 = MS;
/// One-way delay of a short link: a few metres and a switch.
const SHORT: u64 = US;
/// Bytes moved in each run.
const TOTAL: u64 = 32 << 20;

#[derive(Clone, Copy, Debug)]
enum M {
    Data(u64),
    Credit(u64),
}

/// A relay of the path: its buffer, the link it sends on, and the link its
/// credits go back upstream on.
struct Relay {
    node: NodeId,
    hop: Hop,
    out: LinkId,
    back: LinkId,
}

/// A path from `src` to `dst`: the first link (and the credit its far end
/// grants), the relays, and the link the destination returns credit on.
struct Path {
    net: Net<M>,
    src: NodeId,
    dst: NodeId,
    first: LinkId,
    first_credit: u64,
    relays: Vec<Relay>,
    dst_back: LinkId,
}

/// A data link of `delay` at the rate, and its credit link back.
fn pair(net: &mut Net<M>, a: NodeId, b: NodeId, delay: u64) -> (LinkId, LinkId) {
    let data = net.add_link(a, b, LinkSpec::new(delay).rate(RATE));
    let back = net.add_link(b, a, LinkSpec::new(delay));
    (data, back)
}

/// Host to host over the long link, link-level credit only.
fn direct() -> Path {
    let mut net = Net::new(1);
    let (src, dst) = (net.add_node(), net.add_node());
    let (first, dst_back) = pair(&mut net, src, dst, LONG);
    Path {
        net,
        src,
        dst,
        first,
        first_credit: HCA,
        relays: Vec::new(),
        dst_back,
    }
}

/// Host, relay A, long link, relay B, host: each relay's buffer sized to
/// the long link's bandwidth-delay product.
fn relayed() -> Path {
    let mut net = Net::new(1);
    let [src, ra, rb, dst] = [(); 4].map(|_| net.add_node());
    let buffer = window::relay_buffer(RATE, LONG, PKT);
    let (first, ra_back) = pair(&mut net, src, ra, SHORT);
    let (long, rb_back) = pair(&mut net, ra, rb, LONG);
    let (last, dst_back) = pair(&mut net, rb, dst, SHORT);
    Path {
        net,
        src,
        dst,
        first,
        first_credit: HCA,
        relays: vec![
            Relay {
                node: ra,
                hop: Hop::new(HCA, buffer),
                out: long,
                back: ra_back,
            },
            Relay {
                node: rb,
                hop: Hop::new(buffer, HCA),
                out: last,
                back: rb_back,
            },
        ],
        dst_back,
    }
}

/// Sends TOTAL bytes along `p`; the bytes per second the destination saw.
fn throughput(mut p: Path) -> f64 {
    let mut credit = Credit::new(p.first_credit);
    let (mut left, mut got, mut last) = (TOTAL, 0u64, 0);
    loop {
        while left > 0 && credit.may_send(PKT) {
            p.net.send(p.first, PKT, M::Data(PKT));
            credit.sent(PKT);
            left -= PKT;
        }
        for r in p.relays.iter_mut() {
            while let Some(len) = r.hop.forward() {
                p.net.send(r.out, len, M::Data(len));
            }
            if let Some(c) = r.hop.credit_due(8 * PKT) {
                p.net.send(r.back, 8, M::Credit(c));
            }
        }
        let Some(t) = p.net.next_event() else { break };
        for d in p.net.run_until(t) {
            let relay = p.relays.iter_mut().find(|r| r.node == d.to);
            match (d.msg, relay) {
                (M::Data(len), None) => {
                    assert_eq!(d.to, p.dst);
                    got += len;
                    last = d.at;
                    // The destination drains at once and returns credit.
                    p.net.send(p.dst_back, 8, M::Credit(len));
                }
                (M::Data(len), Some(r)) => r.hop.arrived(len).unwrap(),
                (M::Credit(n), None) => {
                    assert_eq!(d.to, p.src);
                    credit.returned(n).unwrap();
                }
                (M::Credit(n), Some(r)) => r.hop.downstream_returned(n).unwrap(),
            }
        }
    }
    assert_eq!(got, TOTAL, "every byte arrived");
    got as f64 / (last as f64 / 1e9)
}

#[test]
fn relays_with_bdp_buffers_keep_a_long_link_full_where_link_credit_cannot() {
    let alone = throughput(direct());
    let relayed = throughput(relayed());
    eprintln!(
        "1 GB/s over 1 ms each way: link credit of 32 KiB {:.1} MB/s, relays with {} bytes each {:.1} MB/s",
        alone / 1e6,
        window::relay_buffer(RATE, LONG, PKT),
        relayed / 1e6
    );
    // Link credit: one window per round trip, as the model says.
    let model = window::utilisation(HCA, RATE, 2 * LONG) * RATE as f64;
    assert!((alone / model - 1.0).abs() < 0.05, "{alone} vs {model}");
    assert!(alone < 0.02 * RATE as f64);
    // Relays: the long link stays full (the paper: 97 % of the data rate).
    assert!(relayed > 0.95 * RATE as f64, "{relayed}");
}
