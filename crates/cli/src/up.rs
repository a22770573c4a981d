//! `macrolink up` and `macrolink node`: a cluster file brought to life, all
//! on this machine or one host per process under a launcher.

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_fabric::{Addr, Node, NodeConfig};
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
    let mut ep = node.open(1, macrolink_gwnet::endpoint_config())?;
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

/// Environment variable that carries the file service's secret to hosts.
const SECRET_VAR: &str = "MACROLINK_SECRET";

/// Starts storage host `h` as one process: its file service, exporting
/// `export`, on the host's fabric node, which also receives striped
/// transfers.
fn spawn_files(exe: &Path, h: &Host, export: &Path, shm: &Path) -> anyhow::Result<Peer> {
    let listen = h.files.context("no files address")?;
    let fabric = h.listen().context("no storage address")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["serve", "--listen", &listen.to_string()])
        .args([
            "--node",
            &h.node.to_string(),
            "--fabric",
            &fabric.to_string(),
        ])
        .arg("--sink")
        .arg(export)
        .arg("--shm-dir")
        .arg(shm);
    Peer::spawn_cmd(cmd).with_context(|| format!("starting the file service of {}", h.name))
}

/// Copies `mib` MiB to each storage host's file service and back, compared
/// byte for byte; prints a row each.
fn check_files(c: &Cluster, h: &Host, shm: &Path, mib: usize) -> anyhow::Result<bool> {
    use macrolink_files::auth::Secret;
    use macrolink_files::copy::{Copier, CopyOptions, Location};
    let secret = std::env::var(SECRET_VAR).context("the file service needs MACROLINK_SECRET")?;
    let scratch = tempfile::tempdir()?;
    let src = scratch.path().join("check");
    let data: Vec<u8> = (0..mib << 20).map(|i| (i as u32 >> 3) as u8).collect();
    std::fs::write(&src, &data)?;
    let mut ok = true;
    for s in c.hosts.iter().filter(|s| s.files.is_some()) {
        let addr = s.files.context("files address")?;
        let mut client = macrolink_files::ClientOptions {
            shm_dir: shm.to_path_buf(),
            ..Default::default()
        };
        c.file_routes(&mut client);
        let through = match c.lane_of(&s.name) {
            Some(l) => l.gateways.join(","),
            None => "direct".to_string(),
        };
        let opts = CopyOptions {
            client,
            ..CopyOptions::default()
        };
        let mut copier = Copier::new(Secret::new(secret.as_bytes())?, opts);
        let remote = Location::Remote {
            server: addr.to_string(),
            path: format!("check-{}", h.name),
        };
        let back = scratch.path().join("back");
        let up = copier.copy(&Location::Local(src.clone()), &remote)?;
        let down = copier.copy(&remote, &Location::Local(back.clone()))?;
        let same = std::fs::read(&back)? == data;
        ok &= same;
        copier
            .client(&addr.to_string())?
            .remove(&format!("check-{}", h.name), false)?;
        for (what, r) in [("up", &up), ("down", &down)] {
            println!(
                "{:<10} {:<10} {:>9} {:>10.1} {:>9}  {through} (cp {what})",
                h.name,
                s.name,
                r.bytes,
                r.bytes as f64 / r.secs / 1e6,
                if same { "yes" } else { "NO" },
            );
        }
    }
    Ok(ok)
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
    if std::env::var_os(SECRET_VAR).is_none() && std::env::var_os("MACROLINK_SECRET_FILE").is_none()
    {
        // Every host here is a child of this process: a fresh secret each run.
        let mut b = [0u8; 24];
        getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("{e}"))?;
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        // Set before this process starts any thread; children inherit it.
        std::env::set_var(SECRET_VAR, hex);
    }
    let mut hosts = Vec::new();
    for h in cluster.hosts.iter().filter(|h| h.role != Role::Compute) {
        if h.files.is_none() {
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
        } else {
            let export = match &h.export {
                Some(e) => e.clone(),
                None => {
                    let e = dir.path().join(format!("export-{}", h.name));
                    std::fs::create_dir_all(&e)?;
                    e
                }
            };
            let p = spawn_files(&exe, h, &export, dir.path())?;
            eprintln!(
                "{} ({:?}, node {}) up at {}; file service at ml://{}/ exporting {}",
                h.name,
                h.role,
                h.node,
                h.listen().map(|a| a.to_string()).unwrap_or_default(),
                p.tcp,
                export.display()
            );
            hosts.push(p);
        }
    }
    header();
    let mut ok = true;
    for h in cluster.hosts.iter().filter(|h| h.role == Role::Compute) {
        ok &= check(&cluster, h, dir.path(), a.mib)?;
        ok &= check_files(&cluster, h, dir.path(), a.mib)?;
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

/// Runs storage host `h` with its file service: the service's fabric node
/// is the host's, and also receives striped transfers. Never returns but
/// with an error.
fn run_file_service(h: &Host, shm: &Path) -> anyhow::Result<()> {
    use macrolink_files::{Limits, ServeConfig, Server};
    let export = h
        .export
        .clone()
        .with_context(|| format!("host {:?} has `files` but no `export`", h.name))?;
    let secret = crate::files::SecretArgs {
        secret_file: std::env::var_os("MACROLINK_SECRET_FILE").map(PathBuf::from),
    }
    .load()?;
    let server = Server::bind(ServeConfig {
        root: export.clone(),
        listen: h.files.context("files address")?,
        secret,
        read_only: false,
        limits: Limits::default(),
        shm_dir: shm.to_path_buf(),
        fabric: Some((h.node, h.listen().context("no storage address")?)),
    })?;
    crate::files::start_sink(&server)?;
    eprintln!(
        "{}: file service at ml://{}/ exporting {}",
        h.name,
        server.local_addr()?,
        export.display()
    );
    println!(
        "ready node={} tcp={} files={}",
        h.node,
        server
            .node()
            .tcp_addr()
            .map(|a| a.to_string())
            .unwrap_or_default(),
        server.local_addr()?
    );
    std::io::Write::flush(&mut std::io::stdout())?;
    server.run()?;
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
            let mut ok = check(&cluster, &h, &shm, a.mib)?;
            if cluster.hosts.iter().any(|s| s.files.is_some()) {
                ok &= check_files(&cluster, &h, &shm, a.mib)?;
            }
            anyhow::ensure!(ok, "some checks failed");
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
            if role == Role::Storage && h.files.is_some() {
                return run_file_service(&h, &shm);
            }
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
