//! DP-II's latency model (HKU): the time of a message of l bytes from one
//! process to another is
//!
//! ```text
//!  L(l) = T_startup + T_send(l) + T_net(l) + T_delivery(l)
//! ```
//!
//! and each term is close to a constant plus a cost per byte. [`fit`] finds
//! the constant and the per-byte cost of each term by least squares from
//! measured breakdowns at several sizes (`macrolink bench breakdown`);
//! [`fit_total`] does it for the total alone (`macrolink bench lat`).

use serde::Serialize;

use crate::check::Check;
use crate::report::{Plot, Report};

/// A term: `at_zero + per_byte * l`, microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Linear {
    /// Microseconds at zero bytes.
    pub at_zero_us: f64,
    /// Nanoseconds per byte.
    pub per_byte_ns: f64,
}

impl Linear {
    /// The term at `l` bytes, microseconds.
    pub fn at(&self, l: f64) -> f64 {
        self.at_zero_us + self.per_byte_ns * l / 1000.0
    }
}

/// One measured breakdown: size and the four terms, microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Sample {
    /// Bytes.
    pub size: f64,
    /// T_startup, T_send, T_net, T_delivery.
    pub terms: [f64; 4],
}

/// The four fitted terms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Model {
    /// T_startup.
    pub startup: Linear,
    /// T_send.
    pub send: Linear,
    /// T_net.
    pub net: Linear,
    /// T_delivery.
    pub delivery: Linear,
}

impl Model {
    /// The terms in order.
    pub fn terms(&self) -> [Linear; 4] {
        [self.startup, self.send, self.net, self.delivery]
    }

    /// L(l), microseconds.
    pub fn total(&self, l: f64) -> f64 {
        self.terms().iter().map(|t| t.at(l)).sum()
    }
}

/// Least squares line through (x, y) points; a constant where all x are
/// alike; `None` without points.
pub fn line(points: &[(f64, f64)]) -> Option<Linear> {
    if points.is_empty() {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    Some(Linear {
        at_zero_us: my - slope * mx,
        per_byte_ns: slope * 1000.0,
    })
}

/// The model that fits `samples` best, term by term.
pub fn fit(samples: &[Sample]) -> Option<Model> {
    let term = |i: usize| {
        line(
            &samples
                .iter()
                .map(|s| (s.size, s.terms[i]))
                .collect::<Vec<_>>(),
        )
    };
    Some(Model {
        startup: term(0)?,
        send: term(1)?,
        net: term(2)?,
        delivery: term(3)?,
    })
}

/// The line that fits measured totals (size, microseconds) best.
pub fn fit_total(points: &[(f64, f64)]) -> Option<Linear> {
    line(points)
}

/// DP-II's breakdowns on Gigabit Ethernet: 1 B and 1500 B.
pub const PAPER: [Sample; 2] = [
    Sample {
        size: 1.0,
        terms: [0.44, 0.7, 16.82, 0.36],
    },
    Sample {
        size: 1500.0,
        terms: [0.44, 5.23, 69.96, 12.21],
    },
];

/// The paper's totals beside the sums of its terms, and the per-byte costs
/// its two sizes imply.
pub fn paper() -> Vec<Check> {
    let m = fit(&PAPER).expect("two samples");
    let mut c = Vec::new();
    for s in &PAPER {
        for (name, (t, printed)) in ["T_startup", "T_send", "T_net", "T_delivery"]
            .iter()
            .zip(m.terms().iter().zip(s.terms))
        {
            c.push(
                Check::new(format!("{} B: {name}, us", s.size), t.at(s.size), printed).within(1e-6),
            );
        }
    }
    c.push(
        Check::new(
            "1 B: T_startup + T_send + T_net + T_delivery, us",
            m.total(1.0),
            18.32,
        )
        .within(1e-6),
    );
    c.push(
        Check::new(
            "1500 B: T_startup + T_send + T_net + T_delivery, us",
            m.total(1500.0),
            87.84,
        )
        .within(1e-6),
    );
    c.push(
        Check::new(
            "round trip of 1 B, us (twice the single trip)",
            2.0 * m.total(1.0),
            36.64,
        )
        .within(1e-6),
    );
    c.push(
        Check::new(
            "T_net per byte, ns (Gigabit Ethernet's wire: 8 ns)",
            m.net.per_byte_ns,
            8.0,
        )
        .noted("the rest is the host's PCI bus and the NIC, as the paper says"),
    );
    c
}

/// Why a benchmark's JSON gives no model.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FitError {
    /// Not JSON, or not a list of rows.
    #[error("not a benchmark's JSON rows: {0}")]
    NotRows(String),
    /// No row has a size with a breakdown (`bench breakdown`) or a median
    /// latency (`bench lat`).
    #[error("no row has a size with startup/send/net/delivery or usec.median")]
    Nothing,
}

/// One fitted group of a benchmark's rows (a transport; with `bench lat`,
/// a pattern too).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fitted {
    /// The group: transport, and pattern where the rows name one.
    pub group: String,
    /// The terms.
    pub model: Model,
    /// (bytes, measured microseconds) of its rows.
    pub measured: Vec<(f64, f64)>,
}

/// Fits each group of a benchmark's rows: term by term from `bench
/// breakdown`'s, the total alone (shown as T_net) from `bench lat`'s.
pub fn fit_rows(json: &str) -> Result<Vec<Fitted>, FitError> {
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(json).map_err(|e| FitError::NotRows(e.to_string()))?;
    let num = |r: &serde_json::Value, k: &str| r[k].as_f64();
    let mut groups: Vec<(String, Vec<&serde_json::Value>)> = Vec::new();
    for r in &rows {
        let name = [&r["transport"], &r["test"], &r["mode"], &r["completion"]]
            .iter()
            .filter_map(|v| v.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        match groups.iter_mut().find(|(g, _)| *g == name) {
            Some((_, v)) => v.push(r),
            None => groups.push((name, vec![r])),
        }
    }
    let mut out = Vec::new();
    for (group, rows) in groups {
        let samples: Vec<Sample> = rows
            .iter()
            .filter_map(|r| {
                let terms = [
                    num(r, "startup")?,
                    num(r, "send")?,
                    num(r, "net")?,
                    num(r, "delivery")?,
                ];
                Some(Sample {
                    size: num(r, "size")?,
                    terms,
                })
            })
            .collect();
        let measured: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|r| {
                Some((
                    num(r, "size")?,
                    num(r, "total").or(r["usec"]["median"].as_f64())?,
                ))
            })
            .collect();
        let model = match fit(&samples) {
            Some(m) => m,
            None => match fit_total(&measured) {
                Some(net) => Model {
                    net,
                    ..Model::default()
                },
                None => continue,
            },
        };
        out.push(Fitted {
            group,
            model,
            measured,
        });
    }
    if out.is_empty() {
        return Err(FitError::Nothing);
    }
    Ok(out)
}

/// `plan latency`: the model fitted to each transport of a `bench
/// breakdown --json` file (term by term) or a `bench lat --json` file (the
/// total alone, shown as T_net); without one, DP-II's own breakdowns.
pub fn report(json: Option<&str>) -> Result<Report, FitError> {
    let fitted = match json {
        Some(j) => fit_rows(j)?,
        None => vec![Fitted {
            group: "DP-II on Gigabit Ethernet".into(),
            model: fit(&PAPER).unwrap_or_default(),
            measured: PAPER
                .iter()
                .map(|s| (s.size, s.terms.iter().sum()))
                .collect(),
        }],
    };
    let mut text = String::new();
    let mut series = Vec::new();
    for f in &fitted {
        text += &format!("{}:\n{}\n", f.group, table(&f.model, &f.measured));
        let pts = |g: &dyn Fn(f64, f64) -> f64| {
            f.measured
                .iter()
                .map(|&(l, us)| (l.max(1.0), g(l, us)))
                .collect()
        };
        series.push((format!("{} measured", f.group), pts(&|_, us| us)));
        series.push((format!("{} model", f.group), pts(&|l, _| f.model.total(l))));
    }
    let plot = Plot {
        title: "L(l): DP-II's model fitted, against the measured latency",
        axes: ("bytes", "microseconds"),
        series,
    };
    Ok(Report::new(text, &fitted).paper(paper(), &[]).plot(plot))
}

/// The fitted terms, and the model's total beside each measured one.
pub fn table(m: &Model, measured: &[(f64, f64)]) -> String {
    let mut s = format!("{:<12} {:>14} {:>14}\n", "term", "us at 0 B", "ns per byte");
    for (name, t) in ["T_startup", "T_send", "T_net", "T_delivery"]
        .iter()
        .zip(m.terms())
    {
        s += &format!(
            "{name:<12} {:>14.3} {:>14.4}\n",
            t.at_zero_us, t.per_byte_ns
        );
    }
    s += &format!(
        "\n{:>10} {:>12} {:>12} {:>8}\n",
        "bytes", "measured us", "model us", "model/m"
    );
    for &(size, us) in measured {
        let p = m.total(size);
        s += &format!(
            "{size:>10} {us:>12.3} {p:>12.3} {:>8.3}\n",
            if us > 0.0 { p / us } else { 0.0 }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_terms_are_recovered() {
        let truth = Model {
            startup: Linear {
                at_zero_us: 0.5,
                per_byte_ns: 0.0,
            },
            send: Linear {
                at_zero_us: 0.7,
                per_byte_ns: 3.0,
            },
            net: Linear {
                at_zero_us: 16.0,
                per_byte_ns: 35.0,
            },
            delivery: Linear {
                at_zero_us: 0.3,
                per_byte_ns: 8.0,
            },
        };
        let samples: Vec<Sample> = [1.0, 100.0, 1500.0, 9000.0, 65536.0]
            .iter()
            .map(|&size| Sample {
                size,
                terms: truth.terms().map(|t| t.at(size)),
            })
            .collect();
        let m = fit(&samples).unwrap();
        for (a, b) in m.terms().iter().zip(truth.terms()) {
            assert!((a.at_zero_us - b.at_zero_us).abs() < 1e-9, "{a:?} {b:?}");
            assert!((a.per_byte_ns - b.per_byte_ns).abs() < 1e-9, "{a:?} {b:?}");
        }
        let t = fit_total(
            &samples
                .iter()
                .map(|s| (s.size, s.terms.iter().sum()))
                .collect::<Vec<_>>(),
        )
        .unwrap();
        assert!((t.at_zero_us - 17.5).abs() < 1e-9 && (t.per_byte_ns - 46.0).abs() < 1e-9);
        assert_eq!(fit(&[]), None);
        let flat = line(&[(5.0, 2.0), (5.0, 4.0)]).unwrap();
        assert_eq!((flat.at_zero_us, flat.per_byte_ns), (3.0, 0.0));
    }

    #[test]
    fn the_papers_totals_are_the_sums_of_its_terms() {
        let c = paper();
        let (last, agreeing) = c.split_last().unwrap();
        assert_eq!(agreeing.len(), 11);
        assert!(agreeing.iter().all(Check::agrees), "{c:?}");
        assert!(!last.agrees() && last.note.is_some());
        assert!((last.model - (69.96 - 16.82) / 1.499).abs() < 1e-9);
    }

    #[test]
    fn a_benchmarks_json_is_fitted() {
        let breakdown = r#"[{"transport":"shm","size":1,"startup":0.1,"send":0.2,"net":0.3,"delivery":0.4,"total":1.0},
                           {"transport":"shm","size":1001,"startup":0.1,"send":1.2,"net":2.3,"delivery":0.4,"total":4.0}]"#;
        let r = report(Some(breakdown)).unwrap();
        let m = &r.rows[0]["model"];
        assert!(
            (m["send"]["per_byte_ns"].as_f64().unwrap() - 1.0).abs() < 1e-9,
            "{}",
            r.rows
        );
        assert!((m["net"]["per_byte_ns"].as_f64().unwrap() - 2.0).abs() < 1e-9);
        let lat = r#"[{"test":"PingPong","size":8,"usec":{"median":5.0}},{"test":"PingPong","size":1008,"usec":{"median":6.0}}]"#;
        let r = report(Some(lat)).unwrap();
        assert!((r.rows[0]["model"]["net"]["per_byte_ns"].as_f64().unwrap() - 1.0).abs() < 1e-9);
        // Two transports are fitted apart.
        let two = r#"[{"transport":"shm","size":1,"total":1.0},{"transport":"shm","size":1001,"total":2.0},
                      {"transport":"tcp","size":1,"total":10.0},{"transport":"tcp","size":1001,"total":30.0}]"#;
        let f = fit_rows(two).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].group.as_str(), f[1].group.as_str()), ("shm", "tcp"));
        assert!(
            (f[0].model.net.per_byte_ns - 1.0).abs() < 1e-9
                && (f[1].model.net.per_byte_ns - 20.0).abs() < 1e-9
        );
        assert_eq!(report(Some("[]")).unwrap_err(), FitError::Nothing);
        assert!(matches!(report(Some("{")), Err(FitError::NotRows(_))));
        assert!(report(None).unwrap().paper.len() == 12);
    }
}
