//! `macrolink bench range --accuracy`: the link emulator checked against
//! what it is asked, in the namespaces the range figures run in, each
//! check on a link of its own between ns A and ns B.
//!
//! ```text
//!  delay 0, 1ms, 10ms  bench lat: 8 B ping-pongs, tcp, waiting; median half round trip less delay 0's
//!  rate R, 100mbit     bench bw: one stream, tcp, 4 MiB messages; payload × MTU/(MTU − 52) on the wire
//!  loss 1% seed 7      bench bw: 10^5 UDP datagrams of 100 B, paced; share lost, beside the link's count
//! ```
//!
//! A datagram stream is paced so that only the link drops: unpaced, the
//! sender outruns the TUN device's queue and the receiver's socket, and
//! their drops would count as the link's. The receiver's socket drops are
//! read from ns B's `/proc/net/snmp` and printed beside the figure.

use anyhow::Context;
use macrolink_testbed::netns::Namespaces;
use serde::Serialize;
use std::process::Command;
use std::time::Duration;

use super::{bench_lat, bench_rows, rand_u128, rate_bytes, run_limit, Ends, Link, Options, B_ADDR};
use super::{DIRECT_PORT, MESSAGE};

/// 8-byte ping-pongs behind each delay figure.
const PINGS: u32 = 200;
/// Delays asked, in the link's words and in µs.
const DELAYS: [(&str, f64); 3] = [("0", 0.0), ("1ms", 1_000.0), ("10ms", 10_000.0)];
/// A delay is met within this share of it, or this many µs if more.
const DELAY_SHARE: f64 = 0.02;
const DELAY_FLOOR_US: f64 = 200.0;
/// A rate is met within this share of it.
const RATE_SHARE: f64 = 0.03;
/// The rate checked beside the run's own.
const SLOW_RATE: &str = "100mbit";
/// Bytes of a full TCP segment's packet that are not payload: IPv4 (20),
/// TCP (20) and its timestamps option (12).
const TCP_IP_HEADERS: u32 = 52;
/// The loss asked, in the link's words and as a probability; its seed.
const LOSS: (&str, f64) = ("1%", 0.01);
const LOSS_SEED: u64 = 7;
/// Datagrams of the loss check, their payload, and how many a second leave
/// (a quarter of what the receiver here was seen to take without a drop).
const DATAGRAMS: u64 = 100_000;
const DATAGRAM_BYTES: usize = 100;
const DATAGRAM_PACE: u64 = 25_000;

/// The measured values that meet a check, lowest to highest.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Bound {
    /// Lowest.
    pub low: f64,
    /// Highest.
    pub high: f64,
}

impl Bound {
    /// `asked` give or take the larger of `share` of it and `floor`.
    pub fn around(asked: f64, share: f64, floor: f64) -> Bound {
        let half = (asked.abs() * share).max(floor);
        Bound {
            low: asked - half,
            high: asked + half,
        }
    }

    /// Three standard deviations either side of `p`: where the share lost
    /// falls when each of `n` is lost with probability `p`, independently.
    pub fn bernoulli(p: f64, n: u64) -> Bound {
        let sd = (p * (1.0 - p) / n.max(1) as f64).sqrt();
        Bound {
            low: p - 3.0 * sd,
            high: p + 3.0 * sd,
        }
    }

    /// The same bound in a unit `k` times smaller (a share as a percentage:
    /// 100).
    pub fn times(self, k: f64) -> Bound {
        Bound {
            low: self.low * k,
            high: self.high * k,
        }
    }

    /// Whether `x` is a number within the bound.
    pub fn holds(&self, x: f64) -> bool {
        x.is_finite() && (self.low..=self.high).contains(&x)
    }
}

/// The rate on the wire, in the unit of `payload`, of a TCP stream that
/// carries `payload` in full segments of an `mtu`-byte link.
pub fn wire_rate(payload: f64, mtu: u32) -> f64 {
    let mss = mtu.saturating_sub(TCP_IP_HEADERS).max(1);
    payload * f64::from(mtu) / f64::from(mss)
}

/// One check: what the link was asked against what crossed it.
#[derive(Clone, Debug, Serialize)]
pub struct AccRow {
    /// `delay`, `rate` or `loss`.
    pub what: &'static str,
    /// What the link was asked, in its words.
    pub asked: String,
    /// What was asked, in `unit`.
    pub expected: f64,
    /// What was measured, in `unit`: the delay added to a half round trip
    /// (for `delay 0`, the half round trip itself: the baseline), the rate
    /// on the wire, the share of datagrams lost.
    pub measured: f64,
    /// `us`, `MB/s` (10^6 bytes a second) or `%`.
    pub unit: &'static str,
    /// Where `measured` meets the check (none for the baseline).
    pub bound: Option<Bound>,
    /// Whether it does.
    pub met: Option<bool>,
    /// What else was seen: the payload rate, the link's own count of what
    /// it dropped, the receiver's.
    pub note: String,
}

impl AccRow {
    fn checked(
        what: &'static str,
        asked: String,
        (expected, measured, unit): (f64, f64, &'static str),
        bound: Bound,
        note: String,
    ) -> AccRow {
        AccRow {
            what,
            asked,
            expected,
            measured,
            unit,
            bound: Some(bound),
            met: Some(bound.holds(measured)),
            note,
        }
    }
}

/// Runs every check; prints each row as it comes.
pub fn accuracy(o: &Options, mut each: impl FnMut(&AccRow)) -> anyhow::Result<Vec<AccRow>> {
    let ns = Namespaces::new(2).map_err(anyhow::Error::msg)?;
    let (a, b) = (ns.names[0].as_str(), ns.names[1].as_str());
    let dir = macrolink_testbed::undo::scratch()?;
    let secret = dir.path().join("secret");
    std::fs::write(&secret, format!("{:032x}", rand_u128()))?;
    let e = Ends {
        ns: [a, b],
        exe: &o.exe,
        secret: &secret,
        dir: dir.path(),
    };
    let mut rows = Vec::new();
    let mut keep = |r: AccRow| {
        each(&r);
        rows.push(r);
    };
    delay(o, &e, &mut keep)?;
    let mut rates = vec![o.rate.as_str()];
    if rate_bytes(&o.rate)? != rate_bytes(SLOW_RATE)? {
        rates.push(SLOW_RATE);
    }
    for rate in rates {
        keep(rate_row(o, &e, rate)?);
    }
    keep(loss(o, &e)?);
    Ok(rows)
}

/// The delay rows: `delay 0` first, the baseline the others are taken from.
fn delay(o: &Options, e: &Ends<'_>, keep: &mut impl FnMut(AccRow)) -> anyhow::Result<()> {
    let direct = format!("{B_ADDR}:{DIRECT_PORT}");
    let mut baseline = 0.0;
    for (words, us) in DELAYS {
        let asked = format!("delay {words}");
        let _link = Link::start(&o.exe, e.ns, o.mtu, &[], &asked)?;
        let lat = bench_lat(e, (&direct, &direct), PINGS, "ping-pong")?;
        let (_, [half_rtt, ..]) = lat.first().context("a row of bench lat")?;
        if us == 0.0 {
            baseline = *half_rtt;
            keep(AccRow {
                what: "delay",
                asked,
                expected: 0.0,
                measured: *half_rtt,
                unit: "us",
                bound: None,
                met: None,
                note: "the baseline: half a round trip through the forwarder".into(),
            });
            continue;
        }
        keep(AccRow::checked(
            "delay",
            asked,
            (us, half_rtt - baseline, "us"),
            Bound::around(us, DELAY_SHARE, DELAY_FLOOR_US),
            format!("half round trip {half_rtt:.1} us"),
        ));
    }
    Ok(())
}

/// One stream of 4 MiB messages over a link of `rate` with no delay, for
/// about the run's seconds.
fn rate_row(o: &Options, e: &Ends<'_>, rate: &str) -> anyhow::Result<AccRow> {
    let asked = format!("rate {rate}");
    let bytes_per_s = rate_bytes(rate)?;
    let count = (f64::from(o.seconds) * bytes_per_s / MESSAGE as f64)
        .ceil()
        .max(4.0)
        .to_string();
    let direct = format!("{B_ADDR}:{DIRECT_PORT}");
    let _link = Link::start(&o.exe, e.ns, o.mtu, &[], &asked)?;
    let size = MESSAGE.to_string();
    let args = [
        "bw",
        "--transport",
        "tcp",
        "--mode",
        "reliable",
        "--completion",
        "wait",
        "--sizes",
        &size,
        "--count",
        &count,
    ];
    let rows = bench_rows(e, (&direct, &direct), &args, run_limit(o.seconds))?;
    let payload = rows
        .first()
        .and_then(|r| r["mb_per_s"].as_f64())
        .context("MB/s in bench bw's row")?;
    let expected = bytes_per_s / 1e6;
    Ok(AccRow::checked(
        "rate",
        asked,
        (expected, wire_rate(payload, o.mtu), "MB/s"),
        Bound::around(expected, RATE_SHARE, 0.0),
        format!("payload {payload:.2} MB/s, MTU {}", o.mtu),
    ))
}

/// Paced datagrams from A to B over a link that loses them one way, beside
/// what the link and the receiver's socket say they dropped.
fn loss(o: &Options, e: &Ends<'_>) -> anyhow::Result<AccRow> {
    let asked = format!("loss {} seed {LOSS_SEED}", LOSS.0);
    let link = Link::start(&o.exe, e.ns, o.mtu, &["--one-way", "--json"], &asked)?;
    let direct = format!("{B_ADDR}:{DIRECT_PORT}");
    let (count, size, pace) = (
        DATAGRAMS.to_string(),
        DATAGRAM_BYTES.to_string(),
        DATAGRAM_PACE.to_string(),
    );
    let args = [
        "bw",
        "--transport",
        "udp",
        "--mode",
        "datagram",
        "--completion",
        "wait",
        "--sizes",
        &size,
        "--count",
        &count,
        "--pace",
        &pace,
    ];
    let socket_drops = || receive_errors(e.ns[1]);
    let before = socket_drops()?;
    // The paced run's own length, and the run's bound on top.
    let paced = Duration::from_secs(DATAGRAMS / DATAGRAM_PACE);
    let rows = bench_rows(e, (&direct, &direct), &args, paced + run_limit(1))?;
    let socket = socket_drops()?.saturating_sub(before);
    let counters = link.counters()?;
    let row = rows.first().context("a row of bench bw")?;
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().with_context(|| format!("{k} in {v}"));
    let (sent, delivered) = (n(row, "sent")?, n(row, "delivered")?);
    let (offered, lost) = (
        n(&counters["a_to_b"], "offered")?,
        n(&counters["a_to_b"], "lost")?,
    );
    let share = sent.saturating_sub(delivered) as f64 / sent.max(1) as f64;
    Ok(AccRow::checked(
        "loss",
        asked,
        (LOSS.1 * 100.0, share * 100.0, "%"),
        Bound::bernoulli(LOSS.1, sent).times(100.0),
        format!(
            "{delivered} of {sent} delivered; link says it dropped {lost} of {offered} \
             ({:.3} %); receiver's socket dropped {socket}",
            lost as f64 * 100.0 / offered.max(1) as f64
        ),
    ))
}

/// Datagrams the UDP sockets of namespace `ns` have had to drop, full.
fn receive_errors(ns: &str) -> anyhow::Result<u64> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()?;
    udp_counter(&String::from_utf8_lossy(&out.stdout), "RcvbufErrors")
        .context("RcvbufErrors in /proc/net/snmp")
}

/// A counter of the `Udp:` lines of `/proc/net/snmp` (names, then values).
fn udp_counter(snmp: &str, name: &str) -> Option<u64> {
    let mut udp = snmp.lines().filter_map(|l| l.strip_prefix("Udp:"));
    let (names, values) = (udp.next()?, udp.next()?);
    let at = names.split_whitespace().position(|n| n == name)?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// The heading of the rows [`acc_line`] prints.
pub const ACC_HEADER: &str =
    "what   asked              measured           bound                    met      what else";

/// One check as a line of the table.
pub fn acc_line(r: &AccRow) -> String {
    let prec = match r.unit {
        "us" => 1,
        "%" => 3,
        _ => 2,
    };
    let bound = r.bound.map_or("baseline".into(), |b| {
        format!("{:.prec$} .. {:.prec$} {}", b.low, b.high, r.unit)
    });
    let met = match r.met {
        Some(true) => "met",
        Some(false) => "not met",
        None => "-",
    };
    format!(
        "{:<6} {:<18} {:>12.prec$} {:<5} {:<24} {met:<8} {}",
        r.what, r.asked, r.measured, r.unit, bound, r.note
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_is_met_within_two_percent_or_200_us() {
        let short = Bound::around(1_000.0, DELAY_SHARE, DELAY_FLOOR_US);
        assert_eq!((short.low, short.high), (800.0, 1_200.0));
        assert!(short.holds(1_199.0) && !short.holds(1_201.0));
        let long = Bound::around(100_000.0, DELAY_SHARE, DELAY_FLOOR_US);
        assert_eq!((long.low, long.high), (98_000.0, 102_000.0));
        assert!(!long.holds(f64::NAN) && !long.holds(f64::INFINITY));
    }

    #[test]
    fn the_three_sigma_band_of_one_percent_over_10_5() {
        // sd = sqrt(0.01 × 0.99 / 10^5) = 0.000315: 0.906 % to 1.094 %.
        let b = Bound::bernoulli(0.01, 100_000).times(100.0);
        assert!((b.low - 0.9056).abs() < 1e-3, "{b:?}");
        assert!((b.high - 1.0944).abs() < 1e-3, "{b:?}");
        assert!(b.holds(0.944) && !b.holds(0.85) && !b.holds(1.2));
        let none = Bound::bernoulli(0.0, 0);
        assert!(
            none.holds(0.0) && !none.holds(0.001),
            "no loss asked: none allowed"
        );
    }

    #[test]
    fn the_rate_on_the_wire_adds_the_headers_of_full_segments() {
        // 1500-byte packets carry 1448 bytes: 12.0 MB/s of payload is
        // 12.43 on the wire, within 3 % of 100 Mbit/s.
        let wire = wire_rate(12.0, 1500);
        assert!((wire - 12.0 * 1500.0 / 1448.0).abs() < 1e-9);
        assert!(Bound::around(12.5, RATE_SHARE, 0.0).holds(wire));
        assert!((wire_rate(122.6, 9000) - 123.31).abs() < 0.01);
        assert!(
            wire_rate(1.0, 10).is_finite(),
            "an MTU too small for headers"
        );
    }

    #[test]
    fn the_receivers_drops_are_read_from_proc_net_snmp() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
            Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
            Udp: 7025 0 34061 0 34060 0\n\
            UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
            UdpLite: 0 0 0 0 0 0\n";
        assert_eq!(udp_counter(snmp, "RcvbufErrors"), Some(34_060));
        assert_eq!(udp_counter(snmp, "InDatagrams"), Some(7_025));
        assert_eq!(udp_counter(snmp, "NoSuch"), None);
        assert_eq!(udp_counter("Udp: RcvbufErrors\n", "RcvbufErrors"), None);
    }

    #[test]
    fn a_check_prints_its_bound_and_whether_it_is_met() {
        let r = AccRow::checked(
            "loss",
            "loss 1% seed 7".into(),
            (1.0, 0.944, "%"),
            Bound::bernoulli(0.01, 100_000).times(100.0),
            "link says it dropped 944".into(),
        );
        assert_eq!(r.met, Some(true));
        let l = acc_line(&r);
        assert!(
            l.contains("0.944 %") && l.contains("0.906 .. 1.094 %"),
            "{l}"
        );
        assert!(
            l.contains(" met ") && l.ends_with("link says it dropped 944"),
            "{l}"
        );
        assert_eq!(
            l.find("0.906"),
            ACC_HEADER.find("bound"),
            "columns under their heads"
        );
        let base = AccRow {
            bound: None,
            met: None,
            ..r
        };
        assert!(acc_line(&base).contains("baseline"));
    }
}
