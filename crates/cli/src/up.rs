//! `macrolink up` and `macrolink node`: a cluster file brought to life, all
//! on this machine or one host per process under a launcher.

use anyhow::Context;
use clap::Args as ClapArgs;
use macrolink_cluster::{Cluster, Host, Role};
use macrolink_files::check::round_trip;
use macrolink_files::setup::load_secret;
use macrolink_files::{ServeConfig, Server};
use macrolink_gwnet::check::{node_config, PathCheck};
use macrolink_gwnet::done::{self, Pending};
use macrolink_testbed::data::pattern;
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
    /// End with the compute hosts: each says when it is done, and gateways
    /// and storage hosts end once all have (for a job of one host per
    /// rank: srun, mpirun).
    #[arg(long)]
    until_done: bool,
    /// Where the central manager keeps its decision log and state, when
    /// this host is the central manager of the file's macro-clusters.
    /// (default: /var/lib/macrolink/manage for root, else
    /// ~/.local/state/macrolink/manage)
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

fn load(path: &Path) -> anyhow::Result<Cluster> {
    Cluster::load(path).with_context(|| format!("in {}", path.display()))
}

/// Prints the rows of compute host `h`'s checks; whether all passed.
fn report(h: &Host, rows: &[PathCheck]) -> bool {
    rows.iter().for_each(|r| println!("{}", r.row(&h.name)));
    rows.iter().all(|r| r.ok)
}

/// Compute host `h`'s checks: a striped transfer to each storage host, and
/// (`files`) a copy to each file service and back.
fn check(c: &Cluster, h: &Host, shm: &Path, mib: usize, files: bool) -> anyhow::Result<bool> {
    let payload = pattern(mib << 20, u64::from(h.node));
    let mut ok = report(h, &macrolink_gwnet::check::lanes(c, h, shm, &payload)?);
    if files {
        let secret = load_secret(None).context("the file service needs a secret")?;
        let scratch = tempfile::tempdir()?;
        let rows = round_trip(c, h, shm, &secret, &payload, scratch.path())?;
        ok &= report(h, &rows);
    }
    Ok(ok)
}

/// Starts storage host `h` as one process: its file service, exporting
/// `export`, on the host's fabric node, which also receives striped
/// transfers.
fn spawn_files(exe: &Path, h: &Host, export: &Path, shm: &Path) -> anyhow::Result<Peer> {
    let listen = h.files.context("no files address")?;
    let fabric = h.listen().context("no storage address")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "serve",
        "--exit-with-parent",
        "--listen",
        &listen.to_string(),
    ])
    .args(["--node", &h.node.to_string()])
    .args(["--fabric", &fabric.to_string(), "--sink"])
    .arg(export)
    .arg("--shm-dir")
    .arg(shm);
    Peer::spawn_cmd(cmd).with_context(|| format!("starting the file service of {}", h.name))
}

/// Starts every host of the cluster here and checks each path.
pub fn up(a: UpArgs) -> anyhow::Result<()> {
    let cluster = match &a.cluster {
        Some(p) => load(p)?,
        None => Cluster::embedded(),
    };
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    // Every host here is a child of this process: a fresh secret each run.
    macrolink_files::setup::fresh_secret_unless_set()?;
    // Ended by a signal: the hosts end with this process (they were
    // started with --exit-with-parent), and the scratch directory goes.
    let scratch = dir.path().to_path_buf();
    crate::roles::exit_on_signals(move || {
        let _ = std::fs::remove_dir_all(&scratch);
    })?;
    // The file every host process reads: the one given, or the embedded
    // default's text.
    let file = match &a.cluster {
        Some(p) => p.clone(),
        None => {
            let p = dir.path().join("cluster.toml");
            std::fs::write(&p, macrolink_cluster::DEFAULT)?;
            p
        }
    };
    let mut hosts = Vec::new();
    for h in cluster.hosts.iter().filter(|h| h.role != Role::Compute) {
        let at = h.listen().map(|a| a.to_string()).unwrap_or_default();
        let p = match h.files {
            None if h.role == Role::Relay => {
                let mut cmd = std::process::Command::new(&exe);
                cmd.arg("relay")
                    .arg(&file)
                    .args(["--host", &h.name, "--exit-with-parent"]);
                let p = Peer::spawn_cmd(cmd).with_context(|| format!("starting {}", h.name))?;
                eprintln!("{} (relay) up: far hosts dialled from {at}", h.name);
                p
            }
            None => {
                let args = macrolink_gwnet::check::role_args(&cluster, h);
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
    let stations = start_management(&exe, &cluster, &file, dir.path())?;
    println!("{}", macrolink_gwnet::check::HEADER);
    let mut ok = true;
    for h in cluster.with_role(Role::Compute) {
        ok &= check(&cluster, h, dir.path(), a.mib, true)?;
    }
    if !stations.is_empty() {
        match crate::manage::status_table(&cluster, std::time::Duration::from_secs(5)) {
            Ok(t) => eprintln!("\nmacro-cluster management (macrolink manage status):\n{t}"),
            Err(e) => eprintln!("macro-cluster management: no status: {e:#}"),
        }
    }
    if a.stay {
        eprintln!("hosts running; interrupt to stop");
        loop {
            // Until a signal ends the process (exit_on_signals).
            std::thread::park();
        }
    }
    drop(hosts);
    for mut s in stations {
        let _ = s.kill();
        let _ = s.wait();
    }
    anyhow::ensure!(ok, "some checks failed");
    Ok(())
}

/// Starts the management station of every host of `c` with a `manage`
/// address, when `c` has macro-clusters: each host's agent, its group's
/// manager and fallback, the central manager (state under `dir`).
fn start_management(
    exe: &Path,
    c: &Cluster,
    file: &Path,
    dir: &Path,
) -> anyhow::Result<Vec<std::process::Child>> {
    if c.macros.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for h in c.hosts.iter().filter(|h| h.manage.is_some()) {
        let child = std::process::Command::new(exe)
            .args(["manage", "run", "--exit-with-parent", "--host", &h.name])
            .arg(file)
            .arg("--state-dir")
            .arg(dir.join("manage"))
            .spawn()
            .with_context(|| format!("starting the management of {}", h.name))?;
        out.push(child);
    }
    eprintln!(
        "management up: {} agents, {} macro-cluster(s), central manager on {}",
        out.len(),
        c.macros.len(),
        c.manage.central.as_deref().unwrap_or("?")
    );
    Ok(out)
}

/// Runs storage host `h` of `c` with its file service: the service's
/// fabric node is the host's, and also receives striped transfers; it
/// obeys the exclusions of `c`'s central manager. Never returns but with
/// an error, or by ending the process once `until`'s compute hosts are
/// done.
fn run_file_service(
    c: &Cluster,
    h: &Host,
    shm: &Path,
    until: Option<Pending>,
) -> anyhow::Result<()> {
    let secret = load_secret(None)?;
    let mut cfg = ServeConfig::for_host(h, shm, secret.clone())?;
    cfg.excluded = macrolink_files::setup::watch_excluded(c, &secret);
    let export = cfg.root.display().to_string();
    let server = Server::bind(cfg)?;
    server.start_sink()?;
    if let Some(p) = until {
        crate::roles::exit_when_done(server.node(), p)?;
    }
    let files = server.local_addr()?;
    eprintln!(
        "{}: file service at ml://{files}/ exporting {export}",
        h.name
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

/// Compute host `h` tells the gateways and storage hosts of `c` that it is
/// done, and says which did not answer.
fn say_done(c: &Cluster, h: &Host, shm: &Path) -> anyhow::Result<()> {
    let services: Vec<(u32, std::net::SocketAddr)> = c
        .hosts
        .iter()
        .filter(|s| matches!(s.role, Role::Gateway | Role::Storage))
        .filter_map(|s| Some((s.node, c.address_of(h, s)?)))
        .collect();
    let mut cfg = node_config(h, shm, &services);
    cfg.tcp = None;
    let node = macrolink_fabric::Node::start(cfg)?;
    let mut ep = node.open(1, done::endpoint_config())?;
    let ids: Vec<u32> = services.iter().map(|s| s.0).collect();
    let silent = done::announce(&mut ep, &ids, std::time::Duration::from_secs(10));
    if !silent.is_empty() {
        eprintln!("{}: no answer to `done` from nodes {silent:?}", h.name);
    }
    Ok(())
}

/// Runs this process's host of the cluster.
pub fn node(a: NodeArgs) -> anyhow::Result<()> {
    let cluster = load(&a.cluster)?;
    // Before any thread: the file's secret, for this process and its children.
    macrolink_files::setup::secret_from_cluster(&cluster);
    let h = cluster.me(a.host.as_deref())?.clone();
    let shm = macrolink_fabric::default_shm_dir();
    let storage = cluster.storage_peers(&h);
    let until = a.until_done.then(|| Pending::of(&cluster));
    if h.role != Role::Relay {
        // A relay reports what it carried on a signal, and ends by itself.
        crate::roles::exit_on_signals(|| {})?;
    }
    if h.manage.is_some() && !cluster.macros.is_empty() {
        let dir = a.state_dir.clone();
        let dir = dir.unwrap_or_else(macrolink_managenet::default_state_dir);
        crate::manage::spawn(&cluster, &h.name, dir)?;
    }
    match h.role {
        Role::Compute => {
            println!("{}", macrolink_gwnet::check::HEADER);
            let files = cluster.hosts.iter().any(|s| s.files.is_some());
            let ok = check(&cluster, &h, &shm, a.mib, files);
            if a.until_done {
                say_done(&cluster, &h, &shm)?;
            }
            anyhow::ensure!(ok?, "some checks failed");
            Ok(())
        }
        Role::Storage if h.files.is_some() => run_file_service(&cluster, &h, &shm, until),
        Role::Storage => crate::roles::sink(node_config(&h, &shm, &storage), 1, until),
        Role::Gateway => crate::roles::gateway(node_config(&h, &shm, &storage), &storage, 1, until),
        Role::Relay => crate::relay::serve(&cluster, &h, None, false),
    }
}
