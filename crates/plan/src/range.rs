//! Longbow range extension (University of Florida): what a pair of relays
//! and kilometres of fibre add to latency, the bandwidth-delay product a
//! relay's buffer (credit) must cover to keep the link full, and the
//! throughput a smaller buffer allows.
//!
//! ```text
//!  one way     = host + pair + km * fibre          (fibre: 5 us/km in glass)
//!  round trip  = 2 * one way
//!  BDP         = rate * round trip                 (the credit that keeps the link full)
//!  throughput  = min(rate, window / round trip)    (a window of credit per round trip)
//! ```

use serde::Serialize;

use crate::check::Check;
use crate::report::{Plot, Report};

/// Light in glass (refractive index about 1.47): microseconds per km.
pub const FIBRE_US_PER_KM: f64 = 5.0;
/// Light in vacuum, the paper's 3.33 microseconds per km.
pub const VACUUM_US_PER_KM: f64 = 3.336;

/// A long link.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Link {
    /// Data rate, bytes per second (4X SDR: 8 Gbit/s of data, 1000 MB/s).
    pub rate: f64,
    /// One-way latency of the hosts and their own fabric, microseconds.
    pub host_us: f64,
    /// One-way latency added by a relay pair, microseconds.
    pub pair_us: f64,
    /// Propagation, microseconds per km.
    pub us_per_km: f64,
}

/// The link at one distance.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct AtDistance {
    /// Kilometres of fibre.
    pub km: f64,
    /// One-way latency added by the relays and the fibre, microseconds.
    pub added_us: f64,
    /// One-way latency end to end, microseconds.
    pub one_way_us: f64,
    /// Round trip, microseconds.
    pub rtt_us: f64,
    /// Bandwidth-delay product: the buffer (credit) that keeps the link
    /// full, bytes.
    pub bdp_bytes: f64,
    /// Throughput with the window asked for, bytes per second.
    pub throughput: f64,
    /// That throughput as a share of the rate.
    pub share: f64,
}

impl Link {
    /// The paper's 4X SDR link through a Longbow pair: 1000 MB/s of data,
    /// 4.0 us between hosts on one fabric, 5.9 us more through the pair.
    pub fn paper() -> Link {
        Link {
            rate: 1e9,
            host_us: 4.0,
            pair_us: 5.9,
            us_per_km: FIBRE_US_PER_KM,
        }
    }

    /// The link over `km` of fibre, with `window` bytes of credit.
    pub fn at(&self, km: f64, window: f64) -> AtDistance {
        let added = self.pair_us + km * self.us_per_km;
        let one_way = self.host_us + added;
        let rtt = 2.0 * one_way;
        let bdp = self.rate * rtt * 1e-6;
        let throughput = if rtt > 0.0 {
            self.rate.min(window / (rtt * 1e-6))
        } else {
            self.rate
        };
        AtDistance {
            km,
            added_us: added,
            one_way_us: one_way,
            rtt_us: rtt,
            bdp_bytes: bdp,
            throughput,
            share: throughput / self.rate,
        }
    }
}

/// The paper's figures beside the model's.
pub fn paper() -> Vec<Check> {
    let (no_relay, with_pair) = (4.0, 9.9);
    let pair = with_pair - no_relay;
    let vacuum = Link {
        us_per_km: VACUUM_US_PER_KM,
        ..Link::paper()
    };
    let glass = Link::paper();
    // Throughput falls linearly with distance: 80.6 MB/s lost over 2 km.
    let drop_2km = 80.6;
    vec![
        Check::new("PingPong 1 B: latency of the Longbow pair, us (9.9 - 4.0)", pair, 5.9),
        Check::new("per Longbow, us", pair / 2.0, 1.48).noted(
            "IMB PingPong reports half a round trip, so 5.9 us one way crosses two Longbows (2.95 us each); 1.48 is 5.9 / 4",
        ),
        Check::new("690 m: predicted added latency, us (paper's 3.33 us/km)", vacuum.at(0.69, 0.0).added_us, 8.2).within(0.05),
        Check::new("690 m: predicted added latency, us (glass, 5 us/km)", glass.at(0.69, 0.0).added_us, 8.0).noted(
            "measured 8.0; the paper's 3.33 us/km is light in vacuum, glass is near 5 us/km",
        ),
        Check::new("690 m: measured added latency, us (paper's prediction)", 8.0, 8.2)
            .noted("measurement against the paper's own prediction"),
        Check::new("690 m: predicted TTCP drop, MB/s (80.6 x 0.69/2)", drop_2km * 0.69 / 2.0, 27.6)
            .within(0.25),
        Check::new("2 km: bandwidth-delay product, KiB", glass.at(2.0, 0.0).bdp_bytes / 1024.0, 60.0).noted(
            "not reproduced: 1000 MB/s over a 39.8 us round trip (hosts, pair, 2 km of glass) is 39 KiB; 60 KiB needs about 61 us",
        ),
        Check::new("3 m, four streams: share of 1000 MB/s, %", 970.0 / 10.0, 97.0).within(0.5),
    ]
}

/// `plan range`: `link` at each distance with each window, and the
/// throughput each window allows against distance as the plot.
pub fn report(link: &Link, km: &[f64], windows: &[f64]) -> Report {
    let rows: Vec<(f64, AtDistance)> = windows
        .iter()
        .flat_map(|&w| km.iter().map(move |&d| (w, link.at(d, w))))
        .collect();
    let series = windows
        .iter()
        .map(|&w| {
            let pts = km
                .iter()
                .map(|&d| (d * 1000.0, link.at(d, w).throughput / 1e6))
                .collect();
            (format!("window {} KiB", w / 1024.0), pts)
        })
        .collect();
    let plot = Plot {
        title: "Throughput a window of credit allows over distance",
        axes: ("metres of fibre", "MB/s"),
        series,
    };
    Report::new(table(&rows), &rows)
        .paper(paper(), &[])
        .plot(plot)
}

/// The table a person reads: one row per distance and window.
pub fn table(rows: &[(f64, AtDistance)]) -> String {
    let mut s = format!(
        "{:>10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8}\n",
        "km", "added us", "one way us", "RTT us", "BDP KiB", "window KiB", "MB/s", "of rate"
    );
    for (window, a) in rows {
        s += &format!(
            "{:>10} {:>12.2} {:>12.2} {:>12.2} {:>12.1} {:>12.1} {:>12.1} {:>7.1}%\n",
            crate::check::round(a.km),
            a.added_us,
            a.one_way_us,
            a.rtt_us,
            a.bdp_bytes / 1024.0,
            window / 1024.0,
            a.throughput / 1e6,
            100.0 * a.share
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_papers_predictions_and_where_they_part() {
        let c = paper();
        let off: Vec<usize> = (0..c.len()).filter(|&i| !c[i].agrees()).collect();
        assert_eq!(off, [1, 3, 4, 6], "{c:#?}");
        assert!(off.iter().all(|&i| c[i].note.is_some()));
        let at = Link::paper().at(2.0, 256.0 * 1024.0);
        assert!((at.rtt_us - 39.8).abs() < 1e-9);
        assert_eq!(at.share, 1.0, "SDP's 256 KiB window covers 2 km");
        let far = Link::paper().at(1000.0, 256.0 * 1024.0);
        assert!((far.share - 256.0 * 1024.0 / (far.rtt_us * 1e3)).abs() < 1e-9);
    }

    proptest! {
        #[test]
        fn bdp_scales_with_distance_and_rate(km in 0.0f64..20_000.0, k in 1.1f64..10.0, rate in 1e6f64..1e11) {
            let l = Link { rate, host_us: 0.0, pair_us: 0.0, us_per_km: FIBRE_US_PER_KM };
            let (a, b) = (l.at(km, 0.0), l.at(km * k, 0.0));
            prop_assert!((b.bdp_bytes - k * a.bdp_bytes).abs() <= 1e-6 * b.bdp_bytes.max(1.0));
            let faster = Link { rate: rate * k, ..l }.at(km, 0.0);
            prop_assert!((faster.bdp_bytes - k * a.bdp_bytes).abs() <= 1e-6 * faster.bdp_bytes.max(1.0));
            // A window of one BDP keeps the link full; half of it, half full.
            let full = l.at(km, a.bdp_bytes);
            prop_assert!(km == 0.0 || (full.share - 1.0).abs() < 1e-9);
            let half = l.at(km, a.bdp_bytes / 2.0);
            prop_assert!(km == 0.0 || (half.share - 0.5).abs() < 1e-9);
        }
    }
}
