//! `macrolink up` and `macrolink node`: a cluster file brought to life, all
//! on this machine or one host per process under a launcher.

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_fabric::{Addr, Completion, EndpointConfig, Node, NodeConfig};
use macrolink_gwnet::client::send;
use std::path::{Path, PathBuf};

use crate::cluster::{Cluster, Host, Role, DEFAULT};
use crate::peer::Peer;

#[derive(Debug, ClapArgs)]
pub struct UpArgs {
    /// Cluster file (default: the embedded local cluster).
    cluster: Option<PathBuf>,
    /// MiB each compute host sends to each storage host as a check.
    #[arg(long, default_value_t = 64)]
    mib: usize,
    /// Keep the hosts running after the check, until interrupted.
    #[arg(long)]
    stay: bool,
}

#[derive(Debug, ClapArgs)]
pub struct NodeArgs {
    /// Cluster file.
    cluster: PathBuf,
    /// This host's name (default: from SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK).
    #[arg(long)]
    host: Option<String>,
    /// MiB a compute host sends to each storage host as a check.
    #[arg(long, default_value_t = 64)]
    mib: usize,
}

/// The command line that runs a gateway or storage host of the cluster.
fn role_args(c: &Cluster, h: &Host) -> Vec<String> {
    let mut args = vec![
        "--tcp".to_string(),
        h.listen().map(|a| a.to_string()).unwrap_or_default(),
    ];
    if h.role == Role::Gateway {
        for lane in c.lanes.iter().filter(|l| l.gateways.contains(&h.name)) {
            for s in lane.storage.iter().filter_map(|s| c.host(s)) {
                if let Some(a) = s.listen() {
                    args.push("--peer".into());
                    args.push(format!("{}={a}", s.node));
                }
            }
        }
    }
    args
}

/// One check transfer per storage host from compute host `h`; prints a row each.
fn check(c: &Cluster, h: &Host, shm: &Path, mib: usize) -> anyhow::Result<bool> {
    let mut cfg = NodeConfig::local(h.node, shm);
    cfg.tcp = h.listen();
    for g in c.hosts.iter().filter(|g| g.role == Role::Gateway) {
        if let Some(a) = g.listen() {
            cfg.peers.insert(g.node, a);
        }
    }
    let node = Node::start(cfg).context("starting the compute node")?;
    let mut ep = node.open(
        1,
        EndpointConfig {
            completion: Completion::Wait,
            tokens: 256,
            ..EndpointConfig::default()
        },
    )?;
    let payload: Vec<u8> = (0..mib << 20)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2])
        .collect();
    let mut all_ok = true;
    for (t, s) in c
        .hosts
        .iter()
        .filter(|s| s.role == Role::Storage)
        .enumerate()
    {
        let Some(lane) = c.lane_of(&s.name) else {
            println!("{:<10} {:<10} no lane serves it", h.name, s.name);
            all_ok = false;
            continue;
        };
        let gws: Vec<Addr> = lane
            .gateways
            .iter()
            .filter_map(|g| c.host(g))
            .map(|g| Addr::new(g.node, 1))
            .collect();
        let r = send(
            &mut ep,
            &gws,
            Addr::new(s.node, 1),
            t as u64 + 1,
            &payload,
            c.send_config(),
            &mut |_, _| {},
        )?;
        all_ok &= r.verified;
        println!(
            "{:<10} {:<10} {:>9} {:>10.1} {:>9}  {}",
            h.name,
            s.name,
            r.bytes,
            r.bytes as f64 / r.secs / 1e6,
            if r.verified { "yes" } else { "NO" },
            lane.gateways.join(",")
        );
    }
    Ok(all_ok)
}

fn header() {
    println!(
        "{:<10} {:<10} {:>9} {:>10} {:>9}  through",
        "compute", "storage", "bytes", "MB/s", "verified"
    );
}

/// Starts every host of the cluster here and checks each path.
pub fn up(a: UpArgs) -> anyhow::Result<()> {
    let cluster = match &a.cluster {
        Some(p) => Cluster::load(p)?,
        None => Cluster::parse(DEFAULT)?,
    };
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    let mut hosts = Vec::new();
    for h in cluster.hosts.iter().filter(|h| h.role != Role::Compute) {
        let role = if h.role == Role::Gateway {
            "gateway"
        } else {
            "sink"
        };
        let extra = role_args(&cluster, h);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let p = Peer::spawn_role(&exe, role, h.node, dir.path(), &extra)
            .with_context(|| format!("starting {}", h.name))?;
        eprintln!("{} ({:?}, node {}) up at {}", h.name, h.role, h.node, p.tcp);
        hosts.push(p);
    }
    header();
    let mut ok = true;
    for h in cluster.hosts.iter().filter(|h| h.role == Role::Compute) {
        ok &= check(&cluster, h, dir.path(), a.mib)?;
    }
    if a.stay {
        eprintln!("hosts running; interrupt to stop");
        loop {
            std::thread::park();
        }
    }
    drop(hosts);
    anyhow::ensure!(ok, "some checks failed");
    Ok(())
}

/// Runs this process's host of the cluster.
pub fn node(a: NodeArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&a.cluster)?;
    let h = cluster.me(a.host.as_deref())?.clone();
    let shm = macrolink_fabric::default_shm_dir();
    match h.role {
        Role::Compute => {
            header();
            anyhow::ensure!(check(&cluster, &h, &shm, a.mib)?, "some checks failed");
            Ok(())
        }
        role => {
            let extra = role_args(&cluster, &h);
            let mut argv = vec!["macrolink".to_string(), "--node".into(), h.node.to_string()];
            argv.extend(extra);
            let node_args = <crate::node_args::NodeArgs as clap::FromArgMatches>::from_arg_matches(
                &<crate::node_args::NodeArgs as clap::Args>::augment_args(clap::Command::new(
                    "macrolink",
                ))
                .try_get_matches_from(argv)?,
            )?;
            let args = crate::roles::Args {
                node: node_args,
                ep: 1,
                exit_with_parent: false,
            };
            if role == Role::Gateway {
                crate::roles::gateway(args)
            } else {
                crate::roles::sink(args)
            }
        }
    }
}
