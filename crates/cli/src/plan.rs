//! `macrolink plan`: the papers' models (`macrolink_plan`), read from
//! files given here and printed.

use anyhow::Context;
use clap::{Args as ClapArgs, Subcommand};
use macrolink_bench::plot::lines_png;
use macrolink_bench::report::save;
use macrolink_cluster::Cluster;
use macrolink_plan::{design, interconnect, latency, pascal, range, storage, Prices, Report};
use std::path::{Path, PathBuf};

use crate::args::parse_size;

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    command: Plan,
}

/// Where the rows go besides the screen.
#[derive(Debug, ClapArgs)]
struct Out {
    /// Print the paper's own tables, each figure beside the model's.
    #[arg(long)]
    paper: bool,
    /// Write the rows as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the rows as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw a PNG (io-network: switches against nodes, Figure 12; range:
    /// throughput against distance; latency: model against measured).
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Plan {
    /// PaScal: FESIO and PaScal Level-2 networks side by side (switches,
    /// ports, cables, NICs, RIOB, WIOB, cost, saving, cost-growing index).
    IoNetwork {
        /// Compute nodes.
        #[arg(long, value_delimiter = ',', default_values_t = pascal::PAPER_NODES)]
        nodes: Vec<u64>,
        /// Compute nodes per I/O node.
        #[arg(long, default_value_t = 16)]
        ratio: u64,
        /// Price table (TOML; default: the paper's 2005 prices).
        #[arg(long)]
        prices: Option<PathBuf>,
        /// FESIO's switch kind (default: the largest).
        #[arg(long)]
        fesio_switch: Option<String>,
        /// PaScal's switch kind (default: the cheapest that serves).
        #[arg(long)]
        pascal_switch: Option<String>,
        #[command(flatten)]
        out: Out,
    },
    /// CERN: a storage macro-cluster of RAID boxes: capacity, bandwidth.
    Storage {
        #[command(flatten)]
        spec: SpecArgs,
        #[command(flatten)]
        out: Out,
    },
    /// CERN: interconnect prices and latencies, and N hosts on each.
    Interconnect {
        #[arg(long, default_value_t = 16)]
        hosts: u64,
        #[command(flatten)]
        out: Out,
    },
    /// Longbow: latency by relays and distance, BDP, throughput per buffer.
    Range {
        /// Data rate of the link, Gbit/s (4X SDR carries 8).
        #[arg(long, default_value_t = 8.0)]
        gbit: f64,
        /// Kilometres of fibre.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "0.003,0.69,2,10,100,1000,14000"
        )]
        km: Vec<f64>,
        /// Buffers (credit windows) to show the throughput of.
        #[arg(long, value_delimiter = ',', default_value = "256KiB,4MiB", value_parser = parse_size)]
        window: Vec<u64>,
        /// One-way latency of the hosts, us.
        #[arg(long, default_value_t = 4.0)]
        host_us: f64,
        /// One-way latency of a relay pair, us.
        #[arg(long, default_value_t = 5.9)]
        pair_us: f64,
        /// Propagation, us per km.
        #[arg(long, default_value_t = range::FIBRE_US_PER_KM)]
        us_per_km: f64,
        #[command(flatten)]
        out: Out,
    },
    /// DP-II: fit L(l) = T_startup + T_send + T_net + T_delivery to a
    /// `bench breakdown` or `bench lat` JSON.
    Latency {
        /// The JSON a benchmark wrote (--json).
        #[arg(long)]
        from: Option<PathBuf>,
        #[command(flatten)]
        out: Out,
    },
    /// A cluster file's lanes for a target storage bandwidth: gateways,
    /// links, storage hosts, and PaScal's cost beside FESIO's.
    Cluster {
        cluster: PathBuf,
        /// Storage bandwidth to reach, GB/s.
        #[arg(long)]
        target_gbs: f64,
        /// Rate of a storage-side link, Gbit/s (default: the lane's `link_gbit`).
        #[arg(long)]
        link_gbit: Option<f64>,
        /// Links per gateway (default: the lane's `links`, else 1).
        #[arg(long)]
        links: Option<u32>,
        /// Per-gateway rate measured by `bench gateways --json`.
        #[arg(long)]
        from_bench: Option<PathBuf>,
        /// What one storage host takes, Gbit/s (default: one gateway's links).
        #[arg(long)]
        storage_gbit: Option<f64>,
        /// Compute hosts (default: the file's).
        #[arg(long)]
        compute: Option<u64>,
        #[arg(long)]
        prices: Option<PathBuf>,
        #[command(flatten)]
        out: Out,
    },
}

/// A storage macro-cluster.
#[derive(Debug, ClapArgs)]
struct SpecArgs {
    /// RAID boxes.
    #[arg(long, default_value_t = 2)]
    boxes: u32,
    /// Disks in a box.
    #[arg(long, default_value_t = 12)]
    disks_per_box: u32,
    /// Hot spares in a box.
    #[arg(long, default_value_t = 2)]
    spares_per_box: u32,
    /// Data disks of a RAID group.
    #[arg(long, default_value_t = 4)]
    data: u32,
    /// Parity disks of a RAID group.
    #[arg(long, default_value_t = 1)]
    parity: u32,
    /// Disk size, GB.
    #[arg(long, default_value_t = 200.0)]
    disk_gb: f64,
    /// Disk interface rate, MB/s (Serial-ATA class 1: 150).
    #[arg(long, default_value_t = 150.0)]
    interface_mbs: f64,
    /// What a disk really delivers, MB/s.
    #[arg(long, default_value_t = 40.0)]
    disk_mbs: f64,
    /// The link of each box, MB/s, where it caps the box.
    #[arg(long)]
    link_mbs: Option<f64>,
}

impl SpecArgs {
    fn spec(&self) -> storage::Spec {
        storage::Spec {
            boxes: self.boxes,
            disks_per_box: self.disks_per_box,
            spares_per_box: self.spares_per_box,
            data: self.data,
            parity: self.parity,
            disk_gb: self.disk_gb,
            interface_mbs: self.interface_mbs,
            disk_mbs: self.disk_mbs,
            link_mbs: self.link_mbs,
        }
    }
}

fn read(p: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
}

fn prices(p: &Option<PathBuf>) -> anyhow::Result<Prices> {
    match p {
        None => Ok(Prices::paper()),
        Some(p) => Ok(Prices::parse(&read(p)?).with_context(|| p.display().to_string())?),
    }
}

impl Out {
    /// Prints the report (with --paper, the paper's figures beside the
    /// model's) and writes what was asked.
    fn emit(&self, r: Report) -> anyhow::Result<()> {
        let (text, rows) = r.shown(self.paper);
        print!("{text}");
        save(self.json.as_deref(), self.csv.as_deref(), &rows)?;
        if let (Some(p), Some(plot)) = (&self.plot, &r.plot) {
            lines_png(p, plot.title, plot.axes, &plot.series)?;
            println!("plot: {}", p.display());
        }
        Ok(())
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let (report, out) = match a.command {
        Plan::IoNetwork {
            nodes,
            ratio,
            prices: table,
            fesio_switch,
            pascal_switch,
            out,
        } => {
            let (f, p) = (fesio_switch.as_deref(), pascal_switch.as_deref());
            (pascal::report(&prices(&table)?, &nodes, ratio, f, p)?, out)
        }
        Plan::Storage { spec, out } => {
            let r =
                storage::report(&spec.spec()).context("a box has no room for one RAID group")?;
            (r, out)
        }
        Plan::Interconnect { hosts, out } => (interconnect::report(hosts), out),
        Plan::Range {
            gbit,
            km,
            window,
            host_us,
            pair_us,
            us_per_km,
            out,
        } => {
            let link = range::Link {
                rate: gbit * 1e9 / 8.0,
                host_us,
                pair_us,
                us_per_km,
            };
            let windows: Vec<f64> = window.iter().map(|&w| w as f64).collect();
            (range::report(&link, &km, &windows), out)
        }
        Plan::Latency { from, out } => {
            let json = from.as_deref().map(read).transpose()?;
            (latency::report(json.as_deref())?, out)
        }
        Plan::Cluster {
            cluster,
            target_gbs,
            link_gbit,
            links,
            from_bench,
            storage_gbit,
            compute,
            prices: table,
            out,
        } => {
            let c = Cluster::load(&cluster).with_context(|| cluster.display().to_string())?;
            let bench = from_bench.as_deref().map(read).transpose()?;
            let asked = design::Asked {
                link_gbit,
                links,
                bench: bench.as_deref(),
                storage_gbit,
                compute,
            };
            (
                design::report(&prices(&table)?, &c, target_gbs, &asked)?,
                out,
            )
        }
    };
    out.emit(report)
}
