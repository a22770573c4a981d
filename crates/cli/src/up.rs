//! `macrolink up` and `macrolink node`: a cluster file brought to life, all
//! on this machine or one host per process under a launcher.

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_cluster::{Cluster, Host, Role};
use macrolink_fabric::{Addr, Node, NodeConfig};
use macrolink_files::copy::{Copier, CopyOptions, Location};
use macrolink_files::setup::{load_secret, SECRET_FILE_VAR, SECRET_VAR};
use macrolink_files::{ClientOptions, Limits, ServeConfig, Server};
use macrolink_gwnet::client::{send, SendConfig};
use macrolink_testbed::ready::Line;
use macrolink_testbed::Peer;
use std::path::{Path, PathBuf};

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

fn load(path: &Path) -> anyhow::Result<Cluster> {
    Cluster::load(path).with_context(|| format!("in {}", path.display()))
}

/// The fabric node of host `h`, knowing the TCP addresses of `peers`.
fn node_config(h: &Host, shm: &Path, peers: &[(u32, std::net::SocketAddr)]) -> NodeConfig {
    let mut cfg = NodeConfig::local(h.node, shm);
    cfg.tcp = h.listen();
    cfg.peers = peers.iter().copied().collect();
    cfg
}

/// A row of the check table.
fn row(h: &Host, s: &Host, bytes: u64, secs: f64, ok: bool, through: &str) {
    println!(
        "{:<10} {:<10} {:>9} {:>10.1} {:>9}  {through}",
        h.name,
        s.name,
        bytes,
        bytes as f64 / secs / 1e6,
        if ok { "yes" } else { "NO" },
    );
}

/// One check transfer per storage host from compute host `h`; prints a row each.
fn check(c: &Cluster, h: &Host, shm: &Path, mib: usize) -> anyhow::Result<bool> {
    let gateways: Vec<_> = c
        .with_role(Role::Gateway)
        .filter_map(|g| Some((g.node, g.listen()?)))
        .collect();
    let node = Node::start(node_config(h, shm, &gateways)).context("starting the compute node")?;
    let mut ep = node.open(1, macrolink_gwnet::endpoint_config())?;
    let payload = macrolink_testbed::data::pattern(mib << 20, u64::from(h.node));
    let mut all_ok = true;
    for (t, s) in c.with_role(Role::Storage).enumerate() {
        let Some(lane) = c.lane_of(&s.name) else {
            println!("{:<10} {:<10} no lane serves it", h.name, s.name);
            all_ok = false;
            continue;
        };
        let gws: Vec<Addr> = c.gateways_of(lane).map(|g| Addr::new(g.node, 1)).collect();
        let cfg = SendConfig::from_cluster(c);
        let to = Addr::new(s.node, 1);
        let r = send(
            &mut ep,
            &gws,
            to,
            t as u64 + 1,
            &payload,
            cfg,
            &mut |_, _| {},
        )?;
        all_ok &= r.verified;
        row(h, s, r.bytes, r.secs, r.verified, &lane.gateways.join(","));
    }
    Ok(all_ok)
}

/// Starts storage host `h` as one process: its file service, exporting
/// `export`, on the host's fabric node, which also receives striped
/// transfers.
fn spawn_files(exe: &Path, h: &Host, export: &Path, shm: &Path) -> anyhow::Result<Peer> {
    let listen = h.files.context("no files address")?;
    let fabric = h.listen().context("no storage address")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["serve", "--listen", &listen.to_string()])
        .args(["--node", &h.node.to_string()])
        .args(["--fabric", &fabric.to_string(), "--sink"])
        .arg(export)
        .arg("--shm-dir")
        .arg(shm);
    Peer::spawn_cmd(cmd).with_context(|| format!("starting the file service of {}", h.name))
}

/// Copies `mib` MiB to each storage host's file service and back, compared
/// byte for byte; prints a row each.
fn check_files(c: &Cluster, h: &Host, shm: &Path, mib: usize) -> anyhow::Result<bool> {
    let secret = load_secret(None).context("the file service needs a secret")?;
    let scratch = tempfile::tempdir()?;
    let src = scratch.path().join("check");
    let data = macrolink_testbed::data::pattern(mib << 20, u64::from(h.node) + 1);
    std::fs::write(&src, &data)?;
    let mut ok = true;
    for s in c.hosts.iter().filter(|s| s.files.is_some()) {
        let addr = s.files.context("files address")?.to_string();
        let mut client = ClientOptions {
            shm_dir: shm.to_path_buf(),
            ..Default::default()
        };
        macrolink_files::lane::add_routes(c, &mut client);
        let through = c
            .lane_of(&s.name)
            .map_or("direct".to_string(), |l| l.gateways.join(","));
        let opts = CopyOptions {
            client,
            ..CopyOptions::default()
        };
        let mut copier = Copier::new(secret.clone(), opts);
        let name = format!("check-{}", h.name);
        let remote = Location::Remote {
            server: addr.clone(),
            path: name.clone(),
        };
        let back = scratch.path().join("back");
        let up = copier.copy(&Location::Local(src.clone()), &remote)?;
        let down = copier.copy(&remote, &Location::Local(back.clone()))?;
        let same = std::fs::read(&back)? == data;
        ok &= same;
        copier.client(&addr)?.remove(&name, false)?;
        for (what, r) in [("up", &up), ("down", &down)] {
            row(
                h,
                s,
                r.bytes,
                r.secs,
                same,
                &format!("{through} (cp {what})"),
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

/// The command line that starts gateway or storage host `h` of `c` here.
fn role_args(c: &Cluster, h: &Host) -> Vec<String> {
    let mut args = vec![
        if h.role == Role::Gateway {
            "gateway"
        } else {
            "sink"
        }
        .to_string(),
        "--tcp".into(),
        h.listen().map(|a| a.to_string()).unwrap_or_default(),
    ];
    for (node, addr) in c.storage_peers(h) {
        args.push("--peer".into());
        args.push(format!("{node}={addr}"));
    }
    args
}

/// Starts every host of the cluster here and checks each path.
pub fn up(a: UpArgs) -> anyhow::Result<()> {
    let cluster = match &a.cluster {
        Some(p) => load(p)?,
        None => Cluster::embedded(),
    };
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    if std::env::var_os(SECRET_VAR).is_none() && std::env::var_os(SECRET_FILE_VAR).is_none() {
        // Every host here is a child of this process: a fresh secret each run.
        let mut b = [0u8; 24];
        getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("{e}"))?;
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        // Set before this process starts any thread; children inherit it.
        std::env::set_var(SECRET_VAR, hex);
    }
    let mut hosts = Vec::new();
    for h in cluster.hosts.iter().filter(|h| h.role != Role::Compute) {
        let at = h.listen().map(|a| a.to_string()).unwrap_or_default();
        let p = match h.files {
            None => {
                let args = role_args(&cluster, h);
                let (role, extra) = args.split_first().context("role")?;
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                let p = Peer::spawn_role(&exe, role, h.node, dir.path(), &extra)
                    .with_context(|| format!("starting {}", h.name))?;
                eprintln!("{} ({:?}, node {}) up at {at}", h.name, h.role, h.node);
                p
            }
            Some(_) => {
                let export = match &h.export {
                    Some(e) => e.clone(),
                    None => dir.path().join(format!("export-{}", h.name)),
                };
                std::fs::create_dir_all(&export)?;
                let p = spawn_files(&exe, h, &export, dir.path())?;
                eprintln!(
                    "{} ({:?}, node {}) up at {at}; file service at ml://{}/ exporting {}",
                    h.name,
                    h.role,
                    h.node,
                    p.tcp,
                    export.display()
                );
                p
            }
        };
        hosts.push(p);
    }
    header();
    let mut ok = true;
    for h in cluster.with_role(Role::Compute) {
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
    let export = h
        .export
        .clone()
        .with_context(|| format!("host {:?} has `files` but no `export`", h.name))?;
    let server = Server::bind(ServeConfig {
        root: export.clone(),
        listen: h.files.context("files address")?,
        secret: load_secret(None)?,
        read_only: false,
        limits: Limits::default(),
        shm_dir: shm.to_path_buf(),
        fabric: Some((h.node, h.listen().context("no storage address")?)),
    })?;
    crate::files::start_sink(&server)?;
    let files = server.local_addr()?;
    eprintln!(
        "{}: file service at ml://{files}/ exporting {}",
        h.name,
        export.display()
    );
    let tcp = server.node().tcp_addr().map(|a| a.to_string());
    Line::ready()
        .with("node", h.node)
        .with("tcp", tcp.unwrap_or_default())
        .with("files", files)
        .print()?;
    server.run()?;
    Ok(())
}

/// Runs this process's host of the cluster.
pub fn node(a: NodeArgs) -> anyhow::Result<()> {
    let cluster = load(&a.cluster)?;
    let h = cluster.me(a.host.as_deref())?.clone();
    let shm = macrolink_fabric::default_shm_dir();
    let storage = cluster.storage_peers(&h);
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
        Role::Storage if h.files.is_some() => run_file_service(&h, &shm),
        Role::Storage => crate::roles::sink(node_config(&h, &shm, &storage), 1),
        Role::Gateway => crate::roles::gateway(node_config(&h, &shm, &storage), &storage, 1),
    }
}
