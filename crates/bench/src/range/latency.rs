//! `macrolink bench range --latency`: the IMB patterns of 8-byte messages
//! through the relay pair and straight over the link at each distance, and
//! what they say fitted: what the pair adds, one relay, and a km of fibre,
//! beside the Longbow paper's figures.

use anyhow::Context;
use macrolink_testbed::netns::Namespaces;
use serde::Serialize;

use super::{
    bench_lat, cluster_file, link, rand_u128, start, Ends, Options, B_ADDR, DIRECT_PORT, FAR_PORT,
    PAPER_ONE_US, PAPER_PAIR_US, PAPER_US_PER_KM, PATTERNS, RELAY_PORT, US_PER_KM,
};

/// One latency figure: an IMB pattern of 8-byte messages.
#[derive(Clone, Debug, Serialize)]
pub struct LatRow {
    /// km of fibre.
    pub km: f64,
    /// The pattern, as `bench lat` names it in its rows (`PingPong`,
    /// `PingPing`, `SendRecv`, `Exchange`).
    pub pattern: String,
    /// Through the relay pair, or straight over the link.
    pub via_relays: bool,
    /// Median, µs: half a round trip for PingPong, one iteration for the
    /// others.
    pub median_us: f64,
    /// Mean, µs.
    pub mean_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
}

impl LatRow {
    /// The figure the fit takes: the median of PingPong's half round
    /// trips; the mean of the others' iterations, as IMB's t. In those
    /// both sides send before they receive, so one side runs a message
    /// ahead and its iterations alternate short and long: their median is
    /// a short one.
    pub fn typical(&self) -> (&'static str, f64) {
        if self.pattern == "PingPong" {
            ("median", self.median_us)
        } else {
            ("mean", self.mean_us)
        }
    }
}

/// What the latency rows of one pattern say, fitted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatFit {
    /// The pattern, as in [`LatRow`].
    pub pattern: String,
    /// Which figure of its rows is fitted ([`LatRow::typical`]): `median`
    /// or `mean`.
    pub figure: &'static str,
    /// What the pair adds to that figure, µs: relays less direct, averaged
    /// over the distances.
    pub pair_us: f64,
    /// What one relay adds, µs: half the pair's, since one direction
    /// crosses both.
    pub per_relay_us: f64,
    /// µs per km: least squares of the direct figures against km (`None`
    /// with one distance).
    pub per_km_us: Option<f64>,
}

/// Every IMB pattern ([`PATTERNS`]) through the relay pair and straight
/// over the link, at each distance of `o` (no loss, measured window).
pub fn latency(
    o: &Options,
    count: u32,
    mut each: impl FnMut(&LatRow),
) -> anyhow::Result<Vec<LatRow>> {
    let ns = Namespaces::new(2).map_err(anyhow::Error::msg)?;
    let (a, b) = (ns.names[0].as_str(), ns.names[1].as_str());
    let dir = macrolink_testbed::undo::scratch()?;
    let secret = dir.path().join("secret");
    std::fs::write(&secret, format!("{:032x}", rand_u128()))?;
    let cluster = dir.path().join("two.toml");
    std::fs::write(&cluster, cluster_file(1, None, o.mtu))?;
    let c = cluster.to_str().context("path")?;
    let mut rows = Vec::new();
    for &km in &o.km {
        let _link = link(o, [a, b], km, "0")?;
        let relay = |ns, host| start(ns, &o.exe, &["relay", c, "--host", host], &secret);
        let _relays = [relay(a, "relay-a")?, relay(b, "relay-b")?];
        let e = Ends {
            ns: [a, b],
            exe: &o.exe,
            secret: &secret,
            dir: dir.path(),
        };
        let far = format!("127.0.0.1:{FAR_PORT}");
        let direct = format!("{B_ADDR}:{DIRECT_PORT}");
        for (via_relays, at, dial) in [
            (true, &far, format!("127.0.0.1:{RELAY_PORT}")),
            (false, &direct, direct.clone()),
        ] {
            for (pattern, [median_us, mean_us, p99_us]) in
                bench_lat(&e, (at, &dial), count, PATTERNS)?
            {
                let row = LatRow {
                    km,
                    pattern,
                    via_relays,
                    median_us,
                    mean_us,
                    p99_us,
                };
                each(&row);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// What the latency rows say, fitted: one [`LatFit`] per pattern, in the
/// order they first come.
pub fn latency_fit(rows: &[LatRow]) -> Vec<LatFit> {
    let mut patterns: Vec<&str> = Vec::new();
    for r in rows {
        if !patterns.contains(&r.pattern.as_str()) {
            patterns.push(&r.pattern);
        }
    }
    patterns
        .into_iter()
        .map(|p| {
            let of: Vec<&LatRow> = rows.iter().filter(|r| r.pattern == p).collect();
            let (pair_us, per_km_us) = fit(&of);
            LatFit {
                pattern: p.to_string(),
                figure: of.first().map_or("median", |r| r.typical().0),
                pair_us,
                per_relay_us: pair_us / 2.0,
                per_km_us,
            }
        })
        .collect()
}

/// What the pair adds (relays less direct, averaged over the distances)
/// and µs per km (least squares of the direct figures against km) of one
/// pattern's rows, on their [`LatRow::typical`] figure.
fn fit(rows: &[&LatRow]) -> (f64, Option<f64>) {
    let y = |r: &LatRow| r.typical().1;
    let direct: Vec<&LatRow> = rows.iter().copied().filter(|r| !r.via_relays).collect();
    let added: Vec<f64> = direct
        .iter()
        .filter_map(|d| {
            let r = rows.iter().find(|r| r.via_relays && r.km == d.km)?;
            Some(y(r) - y(d))
        })
        .collect();
    let pair = added.iter().sum::<f64>() / added.len().max(1) as f64;
    let n = direct.len() as f64;
    let (mx, my) = (
        direct.iter().map(|r| r.km).sum::<f64>() / n,
        direct.iter().map(|r| y(r)).sum::<f64>() / n,
    );
    let sxx: f64 = direct.iter().map(|r| (r.km - mx).powi(2)).sum();
    let sxy: f64 = direct.iter().map(|r| (r.km - mx) * (y(r) - my)).sum();
    (pair, (direct.len() >= 2 && sxx > 0.0).then(|| sxy / sxx))
}

/// The heading of the rows [`lat_line`] prints.
pub const LAT_HEADER: &str = "      km  path     pattern    median us    mean us   p99 us";

/// One latency row as a line of the table.
pub fn lat_line(r: &LatRow) -> String {
    format!(
        "{:>8}  {:<7}  {:<9} {:>10.1} {:>10.1} {:>8.1}",
        r.km,
        if r.via_relays { "relays" } else { "direct" },
        r.pattern,
        r.median_us,
        r.mean_us,
        r.p99_us
    )
}

/// The heading of the lines [`fit_line`] prints.
pub const FIT_HEADER: &str = "pattern    of       relay pair adds  per relay  per km";

/// One pattern's fit as a line.
pub fn fit_line(f: &LatFit) -> String {
    let per_km = f.per_km_us.map_or("n.a.".into(), |k| format!("{k:.2} us"));
    format!(
        "{:<10} {:<7} {:>13.1} us {:>7.2} us  {per_km}",
        f.pattern, f.figure, f.pair_us, f.per_relay_us
    )
}

/// The paper's figures, in the columns of [`fit_line`].
pub fn paper_line() -> String {
    format!(
        "{:<10} {:<7} {PAPER_PAIR_US:>13.1} us {PAPER_ONE_US:>7.2} us  {PAPER_US_PER_KM:.2} us   \
         (a Longbow pair, IMB PingPong of 1 B; one Longbow port to port, a quarter \
         of the pair's; its model, 8.2 us predicted over 690 m; fibre is {US_PER_KM:.2} us)",
        "paper", "mean"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_finds_the_pairs_cost_and_the_cost_per_km() {
        // PingPong is fitted on its median, the others on their mean.
        let row = |pattern: &str, km: f64, via_relays: bool, us: f64| LatRow {
            km,
            pattern: pattern.into(),
            via_relays,
            median_us: if pattern == "PingPong" { us } else { us / 4.0 },
            mean_us: if pattern == "PingPong" { us * 2.0 } else { us },
            p99_us: 0.0,
        };
        let rows = [
            row("PingPong", 0.0, false, 30.0),
            row("PingPong", 0.0, true, 110.0),
            row("Exchange", 0.0, false, 40.0),
            row("Exchange", 0.0, true, 200.0),
            row("PingPong", 100.0, false, 530.0),
            row("PingPong", 100.0, true, 610.0),
            row("Exchange", 100.0, false, 1040.0),
            row("Exchange", 100.0, true, 1200.0),
        ];
        let fits = latency_fit(&rows);
        let names: Vec<&str> = fits.iter().map(|f| f.pattern.as_str()).collect();
        assert_eq!(names, ["PingPong", "Exchange"]);
        let (pp, ex) = (&fits[0], &fits[1]);
        assert_eq!((pp.figure, ex.figure), ("median", "mean"));
        assert!((pp.pair_us - 80.0).abs() < 1e-9);
        assert!(
            (pp.per_relay_us - 40.0).abs() < 1e-9,
            "one direction crosses both relays"
        );
        assert!((pp.per_km_us.unwrap() - 5.0).abs() < 1e-9);
        assert!((ex.pair_us - 160.0).abs() < 1e-9);
        assert!((ex.per_km_us.unwrap() - 10.0).abs() < 1e-9);
        let one = latency_fit(&rows[..4]);
        assert_eq!(one.len(), 2);
        assert!(
            one.iter().all(|f| f.per_km_us.is_none()),
            "one distance: no slope"
        );
        assert!(fit_line(&one[0]).contains("n.a."));
        assert!(paper_line().contains("5.9 us") && paper_line().contains("1.48 us"));
        assert!(paper_line().contains("3.33 us") && paper_line().contains("fibre is 5.00 us"));
    }

    #[test]
    fn a_latency_row_names_its_path_and_pattern() {
        let r = LatRow {
            km: 2.0,
            pattern: "SendRecv".into(),
            via_relays: true,
            median_us: 160.26,
            mean_us: 170.0,
            p99_us: 300.0,
        };
        let words: Vec<String> = lat_line(&r).split_whitespace().map(String::from).collect();
        assert_eq!(
            words,
            ["2", "relays", "SendRecv", "160.3", "170.0", "300.0"]
        );
        assert_eq!(r.typical(), ("mean", 170.0));
        assert_eq!(
            lat_line(&r).len(),
            LAT_HEADER.len(),
            "columns under their heads"
        );
    }
}
