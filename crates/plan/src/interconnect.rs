//! CERN's interconnect price table (June 2003): bandwidth, host card and
//! switch port prices (low and high), host and switch latency, and what a
//! macro-cluster of N hosts costs in each.

use serde::Serialize;

/// One interconnect.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Interconnect {
    /// Its name.
    pub name: &'static str,
    /// Gbit/s.
    pub gbit: f64,
    /// Host card, US dollars, lowest and highest quote.
    pub card: (f64, f64),
    /// Host latency, microseconds, where given.
    pub host_us: Option<f64>,
    /// Switch port, US dollars, lowest and highest.
    pub port: (f64, f64),
    /// Switch latency, microseconds, lowest and highest, where given.
    pub switch_us: Option<(f64, f64)>,
}

/// The paper's Table 2.
pub const PAPER: [Interconnect; 5] = [
    Interconnect {
        name: "10 GE Ethernet",
        gbit: 10.0,
        card: (7995.0, 7995.0),
        host_us: None,
        port: (12_000.0, 12_000.0),
        switch_us: Some((35.0, 45.0)),
    },
    Interconnect {
        name: "2 G Fibre Channel",
        gbit: 2.0,
        card: (999.0, 1400.0),
        host_us: Some(40.0),
        port: (600.0, 2200.0),
        switch_us: Some((1.0, 2.0)),
    },
    Interconnect {
        name: "Infiniband IB X4",
        gbit: 10.0,
        card: (475.0, 955.0),
        host_us: Some(7.0),
        port: (600.0, 1000.0),
        switch_us: Some((0.2, 0.2)),
    },
    Interconnect {
        name: "Gigabit Ethernet, prices 1998",
        gbit: 1.0,
        card: (900.0, 1200.0),
        host_us: Some(60.0),
        port: (2000.0, 2800.0),
        switch_us: None,
    },
    Interconnect {
        name: "Gigabit Ethernet, prices 2003",
        gbit: 1.0,
        card: (150.0, 200.0),
        host_us: Some(60.0),
        port: (400.0, 650.0),
        switch_us: None,
    },
];

/// What `hosts` hosts cost on one interconnect, each with a card and a
/// switch port.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Cost {
    /// The interconnect.
    pub name: &'static str,
    /// Hosts.
    pub hosts: u64,
    /// Lowest total, US dollars.
    pub low: f64,
    /// Highest total.
    pub high: f64,
    /// Lowest per Gbit/s of one host's link.
    pub low_per_gbit: f64,
    /// Host and one switch latency, microseconds, where both are given.
    pub latency_us: Option<f64>,
}

/// The cost of `hosts` hosts on `i`.
pub fn cost(i: &Interconnect, hosts: u64) -> Cost {
    let n = hosts as f64;
    let low = n * (i.card.0 + i.port.0);
    Cost {
        name: i.name,
        hosts,
        low,
        high: n * (i.card.1 + i.port.1),
        low_per_gbit: if n > 0.0 { low / n / i.gbit } else { 0.0 },
        latency_us: i.host_us.zip(i.switch_us).map(|(h, s)| h + s.0),
    }
}

/// `plan interconnect`: the table, and `hosts` hosts on each.
pub fn report(hosts: u64) -> crate::Report {
    let rows: Vec<Cost> = PAPER.iter().map(|i| cost(i, hosts)).collect();
    crate::Report::new(table(hosts), &rows)
}

/// The paper's table and what `hosts` hosts cost on each.
pub fn table(hosts: u64) -> String {
    let mut s = format!(
        "{:<30} {:>6} {:>13} {:>9} {:>13} {:>11} | {:>5} hosts: {:>9} {:>9} {:>10} {:>9}\n",
        "interconnect",
        "Gbit/s",
        "card $",
        "host us",
        "port $",
        "switch us",
        hosts,
        "low $",
        "high $",
        "low $/Gbit",
        "us"
    );
    let range = |(a, b): (f64, f64)| {
        if a == b {
            format!("{a}")
        } else {
            format!("{a}-{b}")
        }
    };
    for i in &PAPER {
        let c = cost(i, hosts);
        s += &format!(
            "{:<30} {:>6} {:>13} {:>9} {:>13} {:>11} | {:>17} {:>9} {:>10.0} {:>9}\n",
            i.name,
            i.gbit,
            range(i.card),
            i.host_us.map_or("n.g.".into(), |h| h.to_string()),
            range(i.port),
            i.switch_us.map_or("n.g.".into(), range),
            c.low,
            c.high,
            c.low_per_gbit,
            c.latency_us.map_or("-".into(), |l| format!("{l}"))
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_macro_cluster_of_sixteen_hosts() {
        let ib = cost(&PAPER[2], 16);
        assert_eq!((ib.low, ib.high), (16.0 * 1075.0, 16.0 * 1955.0));
        assert!((ib.latency_us.unwrap() - 7.2).abs() < 1e-9);
        assert_eq!(cost(&PAPER[0], 16).latency_us, None);
        // Per Gbit/s InfiniBand undercuts 2003 Gigabit Ethernet, as the paper argues.
        assert!(ib.low_per_gbit < cost(&PAPER[4], 16).low_per_gbit);
        assert_eq!(cost(&PAPER[4], 0).low_per_gbit, 0.0);
    }
}
