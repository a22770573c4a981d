//! The price table of `plan io-network`: switch kinds, NICs, cables and
//! the I/O bandwidth a cluster needs, as TOML. The defaults are PaScal's
//! 2005 figures (Table 2: Extreme Networks quotes); a site passes its own.

use serde::{Deserialize, Serialize};

/// PaScal's table, the default.
pub const PAPER: &str = r#"# PaScal (LANL, 2005), Table 2 and section 4.5.
# Required I/O bandwidth: 1 GB/s per TeraFlop, 128 nodes per TeraFlop.
gbs_per_tflop = 1.0
nodes_per_tflop = 128
# Each port and NIC is Gigabit Ethernet.
port_gbit = 1.0
nic = 50.0
cable = 5.0

[[switch]]
name = "G-128"
model = "Extreme 6808"
ports = 128
price = 116000.0

[[switch]]
name = "G-256"
model = "Extreme 6816"
ports = 256
price = 224000.0
"#;

/// A switch kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Switch {
    /// Its name in tables (G-128, G-256, ...).
    pub name: String,
    /// The product, for the record.
    #[serde(default)]
    pub model: String,
    /// Ports, fully populated.
    pub ports: u32,
    /// Price of one, fully populated.
    pub price: f64,
}

/// Prices and the bandwidth rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    /// Required I/O bandwidth per TeraFlop of compute, GB/s.
    pub gbs_per_tflop: f64,
    /// Compute nodes per TeraFlop.
    pub nodes_per_tflop: f64,
    /// Rate of one port, Gbit/s.
    pub port_gbit: f64,
    /// Price of a NIC.
    pub nic: f64,
    /// Price of a cable.
    pub cable: f64,
    /// Switch kinds, smallest first.
    #[serde(rename = "switch")]
    pub switches: Vec<Switch>,
}

/// A price table that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PriceError {
    /// Not TOML of this shape.
    #[error("{0}")]
    Syntax(#[from] toml::de::Error),
    /// A figure that must be positive is not.
    #[error("{0} must be positive")]
    NotPositive(String),
    /// No switch kind is named.
    #[error("the table names no switch")]
    NoSwitch,
}

impl Prices {
    /// PaScal's 2005 table.
    pub fn paper() -> Prices {
        Prices::parse(PAPER).expect("the paper's price table is valid")
    }

    /// Reads a table; switch kinds are sorted by ports.
    pub fn parse(text: &str) -> Result<Prices, PriceError> {
        let mut p: Prices = toml::from_str(text)?;
        for (name, v) in [
            ("gbs_per_tflop", p.gbs_per_tflop),
            ("nodes_per_tflop", p.nodes_per_tflop),
            ("port_gbit", p.port_gbit),
        ] {
            if v.is_nan() || v <= 0.0 {
                return Err(PriceError::NotPositive(name.into()));
            }
        }
        if p.nic < 0.0 || p.cable < 0.0 {
            return Err(PriceError::NotPositive("nic and cable prices".into()));
        }
        if p.switches.is_empty() {
            return Err(PriceError::NoSwitch);
        }
        for s in &p.switches {
            if s.ports < 2 || s.price.is_nan() || s.price < 0.0 {
                return Err(PriceError::NotPositive(format!(
                    "switch {} ports and price",
                    s.name
                )));
            }
        }
        p.switches.sort_by_key(|s| s.ports);
        Ok(p)
    }

    /// The switch kind named `name`.
    pub fn switch(&self, name: &str) -> Option<&Switch> {
        self.switches.iter().find(|s| s.name == name)
    }

    /// The largest switch kind.
    pub fn largest(&self) -> &Switch {
        self.switches.last().expect("checked at parse")
    }

    /// Required I/O bandwidth of `nodes` compute nodes, GB/s.
    pub fn required_gbs(&self, nodes: u64) -> f64 {
        nodes as f64 / self.nodes_per_tflop * self.gbs_per_tflop
    }

    /// Bandwidth of one port, GB/s.
    pub fn port_gbs(&self) -> f64 {
        self.port_gbit / 8.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_table_and_a_sites_own() {
        let p = Prices::paper();
        assert_eq!(p.largest().name, "G-256");
        assert_eq!(p.switch("G-128").unwrap().price, 116_000.0);
        assert_eq!(p.required_gbs(1024), 8.0);
        let site = PAPER.replace("price = 224000.0", "price = 180000.0");
        assert_eq!(Prices::parse(&site).unwrap().largest().price, 180_000.0);
        assert!(matches!(
            Prices::parse(&PAPER.replace("port_gbit = 1.0", "port_gbit = 0.0")),
            Err(PriceError::NotPositive(_))
        ));
        assert!(Prices::parse("gbs_per_tflop = 1\nnodes_per_tflop = 1\nport_gbit = 1\nnic = 1\ncable = 1\nswitch = []\n").is_err());
        assert!(Prices::parse(&format!("{PAPER}\ncolour = 1\n")).is_err());
    }
}
