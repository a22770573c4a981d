//! A lane designed for a target storage bandwidth (`plan cluster`): how
//! many gateways, links and storage hosts reach it, and what its Level-2
//! network costs built the PaScal way beside the FESIO way.
//!
//! ```text
//!  per gateway  = links * link rate * efficiency   (or a measured per-gateway rate)
//!  gateways     = ceil(target / per gateway)
//!  storage      = ceil(target / per storage host)
//!  cost         = PaScal: gateways * links ports    FESIO: every compute host's port
//! ```

use serde::Serialize;

use crate::pascal::{self, Comparison, DesignError};
use crate::prices::Prices;
use crate::report::Report;
use macrolink_cluster::{Cluster, Role};

/// What a gateway and a storage host can carry.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Rates {
    /// One storage-side link, GB/s.
    pub link_gbs: f64,
    /// Links per gateway.
    pub links: u32,
    /// Share of the links' rate a gateway delivers (1: all of it; from a
    /// benchmark, its measured rate over the links' rate).
    pub efficiency: f64,
    /// One storage host, GB/s.
    pub storage_gbs: f64,
}

impl Rates {
    /// What one gateway carries, GB/s.
    pub fn per_gateway(&self) -> f64 {
        self.link_gbs * f64::from(self.links) * self.efficiency
    }
}

/// A design that meets the target.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// Target storage bandwidth, GB/s.
    pub target_gbs: f64,
    /// Compute hosts.
    pub compute: u64,
    /// Gateways needed.
    pub gateways: u64,
    /// Links per gateway.
    pub links: u32,
    /// Storage hosts needed.
    pub storage: u64,
    /// What the gateways carry together, GB/s.
    pub gateway_gbs: f64,
    /// What the storage hosts take together, GB/s.
    pub storage_gbs: f64,
    /// The Level-2 network the PaScal way beside the FESIO way.
    pub cost: Comparison,
}

/// Why no design reaches the target.
#[derive(Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A rate that is not positive.
    #[error("{0} must be positive")]
    NotPositive(&'static str),
    /// The cost model refused the size.
    #[error(transparent)]
    Design(#[from] DesignError),
    /// The cluster file has no lane to plan.
    #[error("the cluster file has no lane")]
    NoLane,
    /// Nothing says how fast a link is.
    #[error("no link rate: give --link-gbit or --from-bench, or set link_gbit in the lane")]
    NoRate,
    /// The benchmark's JSON has no one-gateway row.
    #[error("the benchmark's JSON has no row with gateways = 1 and its macrolink MB/s")]
    NoBenchRow,
}

/// What `plan cluster` is told besides the cluster file.
#[derive(Clone, Copy, Debug, Default)]
pub struct Asked<'a> {
    /// Rate of a storage-side link, Gbit/s (else the lane's).
    pub link_gbit: Option<f64>,
    /// Links per gateway (else the lane's, else 1).
    pub links: Option<u32>,
    /// `bench gateways --json` rows: the one-gateway rate is measured.
    pub bench: Option<&'a str>,
    /// What one storage host takes, Gbit/s (else one gateway's rate).
    pub storage_gbit: Option<f64>,
    /// Compute hosts (else the file's).
    pub compute: Option<u64>,
}

/// The rates `asked` and the first lane of `c` give.
fn rates(c: &Cluster, asked: &Asked<'_>) -> Result<Rates, PlanError> {
    let lane = c.lanes.first().ok_or(PlanError::NoLane)?;
    let measured = match asked.bench {
        Some(json) => {
            let rows: Vec<serde_json::Value> =
                serde_json::from_str(json).map_err(|_| PlanError::NoBenchRow)?;
            let one = rows.iter().find(|r| r["gateways"] == 1);
            let mbs = one.and_then(|r| r["macrolink"].as_f64());
            Some(mbs.ok_or(PlanError::NoBenchRow)? / 1000.0)
        }
        None => None,
    };
    let links = asked.links.or(lane.links).unwrap_or(1);
    let r = match (measured, asked.link_gbit.or(lane.link_gbit)) {
        (Some(gbs), _) => Rates {
            link_gbs: gbs,
            links: 1,
            efficiency: 1.0,
            storage_gbs: 0.0,
        },
        (None, Some(gbit)) => Rates {
            link_gbs: gbit / 8.0,
            links,
            efficiency: 1.0,
            storage_gbs: 0.0,
        },
        (None, None) => return Err(PlanError::NoRate),
    };
    Ok(Rates {
        storage_gbs: asked.storage_gbit.map_or(r.per_gateway(), |g| g / 8.0),
        ..r
    })
}

/// `plan cluster`: the first lane of `c` designed for `target_gbs`.
pub fn report(
    p: &Prices,
    c: &Cluster,
    target_gbs: f64,
    asked: &Asked<'_>,
) -> Result<Report, PlanError> {
    let r = rates(c, asked)?;
    let compute = asked
        .compute
        .unwrap_or(c.with_role(Role::Compute).count() as u64);
    let plan = plan(p, compute, target_gbs, r)?;
    let has = c.lanes.first().map_or(0, |l| l.gateways.len());
    let round = crate::check::round;
    let text = format!(
        "target {target_gbs} GB/s: {} gateways x {} links ({} GB/s each, {} GB/s in all; the lane has {has}), \
         {} storage hosts ({} GB/s in all), {compute} compute hosts\n{}",
        plan.gateways,
        plan.links,
        round(r.per_gateway()),
        round(plan.gateway_gbs),
        plan.storage,
        round(plan.storage_gbs),
        crate::pascal::table(&[crate::pascal::Row::from(&plan.cost)])
    );
    Ok(Report::new(text, &plan))
}

/// The design for `target_gbs` with `compute` compute hosts.
pub fn plan(p: &Prices, compute: u64, target_gbs: f64, r: Rates) -> Result<Plan, PlanError> {
    for (name, v) in [
        ("the target", target_gbs),
        ("the link rate", r.link_gbs),
        ("the efficiency", r.efficiency),
        ("the storage host rate", r.storage_gbs),
    ] {
        if v.is_nan() || v <= 0.0 {
            return Err(PlanError::NotPositive(name));
        }
    }
    if r.links == 0 {
        return Err(PlanError::NotPositive("links per gateway"));
    }
    let gateways = (target_gbs / r.per_gateway()).ceil() as u64;
    let storage = (target_gbs / r.storage_gbs).ceil() as u64;
    let fesio = pascal::fesio(p, p.largest(), compute)?;
    let pascal = p
        .switches
        .iter()
        .map(|s| pascal::pascal_with(p, s, compute, gateways, u64::from(r.links)))
        .min_by(|a, b| a.cost.total_cmp(&b.cost))
        .expect("a price table has a switch");
    Ok(Plan {
        target_gbs,
        compute,
        gateways,
        links: r.links,
        storage,
        gateway_gbs: gateways as f64 * r.per_gateway(),
        storage_gbs: storage as f64 * r.storage_gbs,
        cost: pascal::between(fesio, pascal),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GBIT: f64 = 1.0 / 8.0;

    fn rates(links: u32, efficiency: f64) -> Rates {
        Rates {
            link_gbs: GBIT,
            links,
            efficiency,
            storage_gbs: 10.0 * GBIT,
        }
    }

    #[test]
    fn enough_gateways_and_storage_hosts_for_the_target() {
        let p = Prices::paper();
        // 1 GB/s through 1 Gbit/s links: 8 gateways, 4 with two links each.
        let a = plan(&p, 128, 1.0, rates(1, 1.0)).unwrap();
        assert_eq!((a.gateways, a.storage), (8, 1));
        assert!(a.gateway_gbs >= 1.0 && a.storage_gbs >= 1.0);
        assert_eq!(plan(&p, 128, 1.0, rates(2, 1.0)).unwrap().gateways, 4);
        // Gateways that deliver 93% of their links need one more.
        assert_eq!(plan(&p, 128, 1.0, rates(1, 0.93)).unwrap().gateways, 9);
        assert_eq!(a.cost.pascal.used_ports, 8);
        assert_eq!(a.cost.fesio.nics, 128);
        assert!(a.cost.saving > 0.0);
        assert_eq!(
            plan(&p, 128, 0.0, rates(1, 1.0)).unwrap_err(),
            PlanError::NotPositive("the target")
        );
        assert_eq!(
            plan(&p, 128, 1.0, rates(0, 1.0)).unwrap_err(),
            PlanError::NotPositive("links per gateway")
        );
    }

    #[test]
    fn the_embedded_cluster_file_is_planned() {
        let (p, c) = (Prices::paper(), Cluster::embedded());
        let asked = Asked {
            link_gbit: Some(10.0),
            links: Some(2),
            ..Asked::default()
        };
        let r = report(&p, &c, 10.0, &asked).unwrap();
        // 10 GB/s over 2 x 10 Gbit/s (2.5 GB/s) per gateway: 4 gateways.
        assert_eq!(r.rows["gateways"], 4, "{}", r.text);
        assert_eq!(r.rows["storage"], 4);
        assert_eq!(r.rows["compute"], 1);
        assert!(r.text.contains("the lane has 2"), "{}", r.text);
        assert_eq!(
            report(&p, &c, 10.0, &Asked::default()).unwrap_err(),
            PlanError::NoRate
        );
        let bench = r#"[{"gateways":1,"macrolink":119.5},{"gateways":2,"macrolink":238.5}]"#;
        let measured = Asked {
            bench: Some(bench),
            ..Asked::default()
        };
        let r = report(&p, &c, 1.0, &measured).unwrap();
        assert_eq!(r.rows["gateways"], 9, "1 GB/s at 119.5 MB/s a gateway");
        let none = Asked {
            bench: Some("[]"),
            ..Asked::default()
        };
        assert_eq!(
            report(&p, &c, 1.0, &none).unwrap_err(),
            PlanError::NoBenchRow
        );
    }
}
