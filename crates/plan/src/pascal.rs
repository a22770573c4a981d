//! PaScal's cost model (LANL, section 4.4-4.5): the Level-2 (storage side)
//! Gigabit Ethernet network of a cluster of N compute nodes built two ways.
//!
//! ```text
//!  FESIO: every compute node has a NIC on the Level-2 network. Beyond one
//!         switch (P ports) the switches federate into a two-level fat tree:
//!           leaves  = ceil(N / (P/2))        (P/2 ports down, P/2 up)
//!           spines  = ceil(leaves * (P/2) / P)
//!           ports   = N + 2 * leaves * (P/2) cables = N + leaves * (P/2)
//!  PaScal: only the I/O nodes (N / ratio, 16 by default) are on Level-2;
//!           switches = ceil(io / P)  ports = cables = NICs = io
//!  RIOB = #switch * P * port rate                       (reserved I/O bandwidth)
//!  WIOB = (RIOB - required) / RIOB if #switch > 1, else 0 (wasted share)
//!  cost = #switch * price + NICs * nic + cables * cable
//!  CGI  ≈ #switch (the paper's cost-growing index: switches dominate cost)
//! ```

use serde::Serialize;

use crate::check::Check;
use crate::prices::{Prices, Switch};
use crate::report::{Plot, Report};

/// One architecture at one cluster size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Design {
    /// FESIO or PaScal.
    pub arch: &'static str,
    /// Compute nodes.
    pub nodes: u64,
    /// TeraFlops of the compute nodes.
    pub tflops: f64,
    /// Required I/O bandwidth, GB/s.
    pub required_gbs: f64,
    /// The switch kind.
    pub switch: String,
    /// Switches.
    pub switches: u64,
    /// Switch ports in use.
    pub used_ports: u64,
    /// Cables.
    pub cables: u64,
    /// Gigabit NICs.
    pub nics: u64,
    /// I/O nodes (PaScal; 0 for FESIO).
    pub io_nodes: u64,
    /// Reserved I/O bandwidth, GB/s.
    pub riob_gbs: f64,
    /// Wasted share of the reserved bandwidth, 0..1.
    pub wiob: f64,
    /// Equipment cost.
    pub cost: f64,
    /// Cost-growing index: switches used.
    pub cgi: u64,
}

/// Why a design cannot be made.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DesignError {
    /// More nodes than a two-level fabric of this switch holds.
    #[error(
        "{nodes} nodes need more than a two-level fabric of {ports}-port switches (at most {max})"
    )]
    TooLarge {
        /// Nodes asked for.
        nodes: u64,
        /// Ports per switch.
        ports: u32,
        /// The most the fabric holds.
        max: u64,
    },
    /// No switch kind of that name.
    #[error("no switch named {0:?} in the price table")]
    NoSwitch(String),
    /// A ratio of zero compute nodes per I/O node.
    #[error("the compute:I/O ratio must be positive")]
    ZeroRatio,
}

fn finish(p: &Prices, mut d: Design, ports_per_switch: u32, price: f64) -> Design {
    d.tflops = d.nodes as f64 / p.nodes_per_tflop;
    d.required_gbs = p.required_gbs(d.nodes);
    d.riob_gbs = d.switches as f64 * f64::from(ports_per_switch) * p.port_gbs();
    d.wiob = if d.switches > 1 {
        (d.riob_gbs - d.required_gbs) / d.riob_gbs
    } else {
        0.0
    };
    d.cost = d.switches as f64 * price + d.nics as f64 * p.nic + d.cables as f64 * p.cable;
    d.cgi = d.switches;
    d
}

fn empty(arch: &'static str, nodes: u64, s: &Switch) -> Design {
    Design {
        arch,
        nodes,
        tflops: 0.0,
        required_gbs: 0.0,
        switch: s.name.clone(),
        switches: 0,
        used_ports: 0,
        cables: 0,
        nics: 0,
        io_nodes: 0,
        riob_gbs: 0.0,
        wiob: 0.0,
        cost: 0.0,
        cgi: 0,
    }
}

/// FESIO: every one of `nodes` compute nodes on the Level-2 network of
/// switch kind `s`.
pub fn fesio(p: &Prices, s: &Switch, nodes: u64) -> Result<Design, DesignError> {
    let ports = u64::from(s.ports);
    let half = ports / 2;
    let mut d = empty("FESIO", nodes, s);
    d.nics = nodes;
    if nodes <= ports {
        d.switches = u64::from(nodes > 0);
        d.used_ports = nodes;
        d.cables = nodes;
    } else {
        let max = half * ports;
        if nodes > max {
            return Err(DesignError::TooLarge {
                nodes,
                ports: s.ports,
                max,
            });
        }
        let leaves = nodes.div_ceil(half);
        let uplinks = leaves * half;
        let spines = uplinks.div_ceil(ports);
        d.switches = leaves + spines;
        d.used_ports = nodes + 2 * uplinks;
        d.cables = nodes + uplinks;
    }
    Ok(finish(p, d, s.ports, s.price))
}

/// PaScal: `io_nodes` I/O nodes, each with `links` ports, on the Level-2
/// network of switch kind `s`, serving `nodes` compute nodes.
pub fn pascal_with(p: &Prices, s: &Switch, nodes: u64, io_nodes: u64, links: u64) -> Design {
    let mut d = empty("PaScal", nodes, s);
    d.io_nodes = io_nodes;
    d.used_ports = io_nodes * links;
    d.cables = d.used_ports;
    d.nics = d.used_ports;
    d.switches = d.used_ports.div_ceil(u64::from(s.ports));
    finish(p, d, s.ports, s.price)
}

/// PaScal with one I/O node per `ratio` compute nodes, one link each, on
/// switch kind `s`, or on the kind that costs least when `s` is `None`.
pub fn pascal(
    p: &Prices,
    s: Option<&Switch>,
    nodes: u64,
    ratio: u64,
) -> Result<Design, DesignError> {
    if ratio == 0 {
        return Err(DesignError::ZeroRatio);
    }
    let io = nodes.div_ceil(ratio);
    Ok(match s {
        Some(s) => pascal_with(p, s, nodes, io, 1),
        None => p
            .switches
            .iter()
            .map(|s| pascal_with(p, s, nodes, io, 1))
            .min_by(|a, b| a.cost.total_cmp(&b.cost))
            .expect("a price table has a switch"),
    })
}

/// FESIO beside PaScal at one size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// FESIO.
    pub fesio: Design,
    /// PaScal.
    pub pascal: Design,
    /// 1 - PaScal's cost / FESIO's.
    pub saving: f64,
    /// 1 - PaScal's NICs / FESIO's.
    pub nic_reduction: f64,
    /// 1 - PaScal's used ports / FESIO's.
    pub port_reduction: f64,
    /// FESIO's cables per PaScal cable.
    pub cable_ratio: f64,
}

/// The two architectures for `nodes` compute nodes: FESIO on switch kind
/// `fesio_switch` (the largest when `None`), PaScal on `pascal_switch` (the
/// cheapest that serves when `None`).
pub fn compare(
    p: &Prices,
    nodes: u64,
    ratio: u64,
    fesio_switch: Option<&str>,
    pascal_switch: Option<&str>,
) -> Result<Comparison, DesignError> {
    let named = |n: &str| p.switch(n).ok_or_else(|| DesignError::NoSwitch(n.into()));
    let fs = match fesio_switch {
        Some(n) => named(n)?,
        None => p.largest(),
    };
    let ps = pascal_switch.map(named).transpose()?;
    let fesio = fesio(p, fs, nodes)?;
    let pascal = pascal(p, ps, nodes, ratio)?;
    Ok(between(fesio, pascal))
}

/// The comparison of two designs.
pub fn between(fesio: Design, pascal: Design) -> Comparison {
    let share = |a: f64, b: f64| if b > 0.0 { 1.0 - a / b } else { 0.0 };
    Comparison {
        saving: share(pascal.cost, fesio.cost),
        nic_reduction: share(pascal.nics as f64, fesio.nics as f64),
        port_reduction: share(pascal.used_ports as f64, fesio.used_ports as f64),
        cable_ratio: if pascal.cables > 0 {
            fesio.cables as f64 / pascal.cables as f64
        } else {
            0.0
        },
        fesio,
        pascal,
    }
}

/// The sizes of Tables 4 and 5.
pub const PAPER_NODES: [u64; 7] = [128, 256, 512, 1024, 2048, 4096, 8192];

/// The paper's Tables 2 to 5, each figure beside the model's.
pub fn paper() -> Vec<Check> {
    let p = Prices::paper();
    let mut c = Vec::new();
    // Table 2: the Pink cluster, 1024 nodes; FESIO on 12 Extreme 6816
    // (G-256), PaScal on one Extreme 6808 (G-128).
    let t2 = compare(&p, 1024, 16, Some("G-256"), None).expect("the paper's sizes fit");
    // Each side's rows: switches, switch cost, NICs, NIC cost, cables,
    // cable cost, used ports, total, as printed.
    let sides = [
        (
            &t2.fesio,
            "G-256",
            "Extreme 6816",
            [
                12.0,
                2_688_000.0,
                1024.0,
                51_200.0,
                2048.0,
                10_240.0,
                2048.0,
                2_749_400.0,
            ],
        ),
        (
            &t2.pascal,
            "G-128",
            "Extreme 6808",
            [1.0, 116_000.0, 64.0, 3_200.0, 64.0, 320.0, 64.0, 119_520.0],
        ),
    ];
    for (d, kind, model, printed) in sides {
        let price = p.switch(kind).map_or(0.0, |s| s.price);
        let figures = [
            (format!("{model} switches"), d.switches as f64),
            ("switch cost $".into(), d.switches as f64 * price),
            ("GigE NICs".into(), d.nics as f64),
            ("NIC cost $".into(), d.nics as f64 * p.nic),
            ("cables".into(), d.cables as f64),
            ("cable cost $".into(), d.cables as f64 * p.cable),
            ("used GigE ports".into(), d.used_ports as f64),
            ("total cost $".into(), d.cost),
        ];
        for ((what, model), printed) in figures.into_iter().zip(printed) {
            let check = Check::new(format!("Table 2, {} {what}", d.arch), model, printed);
            c.push(match (d.arch, what.as_str()) {
                ("FESIO", "used GigE ports") => check.noted(
                    "Table 2 counts a port per cable; every switch port in use, as Table 4 counts them, is 3072",
                ),
                ("FESIO", "total cost $") => check.noted("slip: its own rows add up to $2,749,440"),
                ("PaScal", "cable cost $") => check.noted("printed \"#320\": a typo for $320"),
                _ => check,
            });
        }
    }
    // Table 3, from Table 2.
    c.push(Check::new("Table 3, cost saving %", 100.0 * t2.saving, 95.65).within(0.005));
    c.push(
        Check::new(
            "Table 3, Gigabit NIC card reduction %",
            100.0 * t2.nic_reduction,
            93.75,
        )
        .within(0.005),
    );
    c.push(
        Check::new(
            "Table 3, Gigabit port count reduction %",
            100.0 * t2.port_reduction,
            96.88,
        )
        .within(0.005)
        .noted(
            "96.88% is 1 - 64/2048 (Table 2's ports); with every switch port counted, 1 - 64/3072",
        ),
    );
    c.push(Check::new(
        "Table 3, cable management complexity 1:N",
        t2.cable_ratio,
        32.0,
    ));
    // Tables 4 and 5: G-256 switches for both.
    let printed4: [(u64, u64, u64, u64, f64, f64); 7] = [
        (1, 128, 128, 1, 32.0, 0.0),
        (1, 256, 256, 2, 32.0, 0.0),
        (6, 1536, 1024, 4, 192.0, 97.92),
        (12, 3072, 2048, 8, 384.0, 97.92),
        (24, 6144, 4192, 16, 768.0, 97.92),
        (48, 12288, 8192, 32, 1536.0, 97.92),
        (96, 24576, 16384, 64, 3072.0, 97.92),
    ];
    let printed5: [(u64, u64, f64); 7] = [
        (1, 8, 32.0),
        (1, 16, 32.0),
        (1, 32, 32.0),
        (1, 64, 32.0),
        (1, 128, 32.0),
        (1, 256, 32.0),
        (2, 512, 64.0),
    ];
    let rows: Vec<Comparison> = PAPER_NODES
        .iter()
        .map(|&n| compare(&p, n, 16, Some("G-256"), Some("G-256")).expect("the paper's sizes fit"))
        .collect();
    for (r, &(sw, ports, cables, req, riob, wiob)) in rows.iter().zip(&printed4) {
        let f = &r.fesio;
        let n = f.nodes;
        let t = |what: &str| format!("Table 4, {n} nodes, {what}");
        c.push(Check::new(t("TeraFlops"), f.tflops, req as f64));
        c.push(Check::new(t("required GB/s"), f.required_gbs, req as f64));
        c.push(Check::new(t("switches"), f.switches as f64, sw as f64));
        c.push(Check::new(
            t("used ports"),
            f.used_ports as f64,
            ports as f64,
        ));
        let cab = Check::new(t("cables"), f.cables as f64, cables as f64);
        c.push(if n == 2048 {
            cab.noted("slip: 2048 nodes and 2048 leaf-to-spine links are 4096 cables, as the other rows' 2N")
        } else {
            cab
        });
        c.push(Check::new(t("RIOB GB/s"), f.riob_gbs, riob));
        c.push(Check::new(t("WIOB %"), 100.0 * f.wiob, wiob).within(0.005));
    }
    for (r, &(sw, io, riob)) in rows.iter().zip(&printed5) {
        let s = &r.pascal;
        let n = s.nodes;
        let t = |what: &str| format!("Table 5, {n} nodes, {what}");
        c.push(Check::new(t("switches"), s.switches as f64, sw as f64));
        c.push(Check::new(t("used ports"), s.used_ports as f64, io as f64));
        c.push(Check::new(t("I/O nodes"), s.io_nodes as f64, io as f64));
        c.push(Check::new(t("RIOB GB/s"), s.riob_gbs, riob));
        c.push(Check::new(t("WIOB %"), 100.0 * s.wiob, 0.0).within(0.005));
    }
    c
}

/// What the paper's formulas say that its figures do not.
pub const PAPER_NOTES: [&str; 3] = [
    "RIOB's formula names the G-128 switch, but its figures (32 GB/s per switch) and the text use G-256: 256 Gbit/s = 32 GB/s",
    "WIOB's \"Required I/O Bandwidth^2\": the 2 is the footnote mark (\"Reference to [21]\"), not a square; with a square the 512-node row would be 91.67%, not the printed 97.92%",
    "Table 2 leaves out the I/O nodes' own cost (64 servers); so does this model",
];

/// `plan io-network`: FESIO and PaScal at each of `nodes`, with Figure 12
/// (switches against nodes) as the plot.
pub fn report(
    p: &Prices,
    nodes: &[u64],
    ratio: u64,
    fesio_switch: Option<&str>,
    pascal_switch: Option<&str>,
) -> Result<Report, DesignError> {
    let rows = nodes
        .iter()
        .map(|&n| compare(p, n, ratio, fesio_switch, pascal_switch).map(|c| Row::from(&c)))
        .collect::<Result<Vec<_>, _>>()?;
    let line = |name: &str, f: fn(&Row) -> u64| {
        let pts = rows.iter().map(|r| (r.nodes as f64, f(r) as f64)).collect();
        (name.to_string(), pts)
    };
    let plot = Plot {
        title: "Cost-growing index: Level-2 switches (PaScal, Figure 12)",
        axes: ("compute nodes", "switches"),
        series: vec![
            line("FESIO", |r| r.fesio_cgi),
            line("PaScal", |r| r.pascal_cgi),
        ],
    };
    Ok(Report::new(table(&rows), &rows)
        .paper(paper(), &PAPER_NOTES)
        .plot(plot))
}

/// A comparison as one flat row (for tables, CSV and JSON).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Compute nodes.
    pub nodes: u64,
    /// TeraFlops.
    pub tflops: f64,
    /// Required I/O bandwidth, GB/s.
    pub required_gbs: f64,
    /// FESIO: switch kind.
    pub fesio_switch: String,
    /// FESIO: switches.
    pub fesio_switches: u64,
    /// FESIO: switch ports in use.
    pub fesio_ports: u64,
    /// FESIO: cables.
    pub fesio_cables: u64,
    /// FESIO: NICs.
    pub fesio_nics: u64,
    /// FESIO: reserved I/O bandwidth, GB/s.
    pub fesio_riob_gbs: f64,
    /// FESIO: wasted share of it, %.
    pub fesio_wiob_pct: f64,
    /// FESIO: cost.
    pub fesio_cost: f64,
    /// PaScal: switch kind.
    pub pascal_switch: String,
    /// PaScal: switches.
    pub pascal_switches: u64,
    /// PaScal: I/O nodes.
    pub pascal_io_nodes: u64,
    /// PaScal: switch ports in use (= cables = NICs).
    pub pascal_ports: u64,
    /// PaScal: reserved I/O bandwidth, GB/s.
    pub pascal_riob_gbs: f64,
    /// PaScal: wasted share of it, %.
    pub pascal_wiob_pct: f64,
    /// PaScal: cost.
    pub pascal_cost: f64,
    /// Saving of PaScal over FESIO, %.
    pub saving_pct: f64,
    /// Cost-growing index (switches), FESIO.
    pub fesio_cgi: u64,
    /// Cost-growing index (switches), PaScal.
    pub pascal_cgi: u64,
}

impl From<&Comparison> for Row {
    fn from(c: &Comparison) -> Row {
        let (f, p) = (&c.fesio, &c.pascal);
        Row {
            nodes: f.nodes,
            tflops: f.tflops,
            required_gbs: f.required_gbs,
            fesio_switch: f.switch.clone(),
            fesio_switches: f.switches,
            fesio_ports: f.used_ports,
            fesio_cables: f.cables,
            fesio_nics: f.nics,
            fesio_riob_gbs: f.riob_gbs,
            fesio_wiob_pct: 100.0 * f.wiob,
            fesio_cost: f.cost,
            pascal_switch: p.switch.clone(),
            pascal_switches: p.switches,
            pascal_io_nodes: p.io_nodes,
            pascal_ports: p.used_ports,
            pascal_riob_gbs: p.riob_gbs,
            pascal_wiob_pct: 100.0 * p.wiob,
            pascal_cost: p.cost,
            saving_pct: 100.0 * c.saving,
            fesio_cgi: f.cgi,
            pascal_cgi: p.cgi,
        }
    }
}

/// The table a person reads: FESIO and PaScal side by side.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:>6} {:>6} {:>7} | {:>6} {:>4} {:>6} {:>6} {:>6} {:>8} {:>7} {:>12} | {:>6} {:>4} {:>5} {:>5} {:>8} {:>6} {:>10} | {:>7}\n",
        "nodes", "TF", "req GB/s", "FESIO", "sw", "ports", "cables", "NICs", "RIOB GB/s", "WIOB %", "cost $",
        "PaScal", "sw", "I/O", "ports", "RIOB GB/s", "WIOB %", "cost $", "saving %"
    );
    for r in rows {
        s += &format!(
            "{:>6} {:>6} {:>7} | {:>6} {:>4} {:>6} {:>6} {:>6} {:>8} {:>7.2} {:>12.0} | {:>6} {:>4} {:>5} {:>5} {:>8} {:>6.2} {:>10.0} | {:>7.2}\n",
            r.nodes,
            crate::check::round(r.tflops),
            crate::check::round(r.required_gbs),
            r.fesio_switch,
            r.fesio_switches,
            r.fesio_ports,
            r.fesio_cables,
            r.fesio_nics,
            crate::check::round(r.fesio_riob_gbs),
            r.fesio_wiob_pct,
            r.fesio_cost,
            r.pascal_switch,
            r.pascal_switches,
            r.pascal_io_nodes,
            r.pascal_ports,
            crate::check::round(r.pascal_riob_gbs),
            r.pascal_wiob_pct,
            r.pascal_cost,
            r.saving_pct,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_papers_tables_match_but_for_the_named_slips() {
        let checks = paper();
        let off: Vec<&Check> = checks.iter().filter(|c| !c.agrees()).collect();
        let names: Vec<&str> = off.iter().map(|c| c.what.as_str()).collect();
        assert_eq!(
            names,
            [
                "Table 2, FESIO used GigE ports",
                "Table 2, FESIO total cost $",
                "Table 3, Gigabit port count reduction %",
                "Table 4, 2048 nodes, cables",
            ],
            "{off:#?}"
        );
        assert!(off.iter().all(|c| c.note.is_some()));
        assert!(checks
            .iter()
            .filter(|c| c.note.is_none())
            .all(Check::agrees));
    }

    #[test]
    fn a_fat_tree_beyond_its_size_is_refused() {
        let p = Prices::paper();
        let g = p.switch("G-128").unwrap();
        assert!(fesio(&p, g, 64 * 128).is_ok());
        assert_eq!(
            fesio(&p, g, 64 * 128 + 1).unwrap_err(),
            DesignError::TooLarge {
                nodes: 8193,
                ports: 128,
                max: 8192
            }
        );
        assert_eq!(pascal(&p, None, 10, 0).unwrap_err(), DesignError::ZeroRatio);
        assert!(compare(&p, 10, 16, Some("G-512"), None).is_err());
        let none = compare(&p, 0, 16, None, None).unwrap();
        assert_eq!((none.fesio.switches, none.pascal.cost), (0, 0.0));
    }

    proptest! {
        #[test]
        fn cost_and_switches_grow_with_nodes(n in 1u64..30_000, step in 1u64..2_000) {
            let p = Prices::paper();
            let (a, b) = (compare(&p, n, 16, None, None).unwrap(), compare(&p, n + step, 16, None, None).unwrap());
            prop_assert!(b.fesio.cost >= a.fesio.cost && b.pascal.cost >= a.pascal.cost);
            prop_assert!(b.fesio.switches >= a.fesio.switches);
            prop_assert!(b.fesio.cables >= a.fesio.cables && b.pascal.used_ports >= a.pascal.used_ports);
            prop_assert!(a.pascal.cost <= a.fesio.cost);
            // The wasted share: nothing with one switch, the same fixed share
            // of a full fat tree of fully populated switches.
            prop_assert!((0.0..1.0).contains(&a.fesio.wiob));
            prop_assert!(a.pascal.wiob >= 0.0 && a.pascal.wiob < 1.0);
        }

        #[test]
        fn fesio_wasted_share_grows_with_nodes_on_one_switch_kind(n in 257u64..16_384) {
            let p = Prices::paper();
            let g = p.largest();
            let (a, b) = (fesio(&p, g, n).unwrap(), fesio(&p, g, 2 * n).unwrap());
            // Reserved bandwidth grows in whole switches, required with the
            // nodes: the share wasted stays within a switch's worth.
            prop_assert!((a.wiob - b.wiob).abs() < 0.02, "{} {}", a.wiob, b.wiob);
            prop_assert!(b.riob_gbs >= a.riob_gbs);
        }
    }
}
