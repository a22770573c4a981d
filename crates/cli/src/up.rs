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
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::supervise::Hosts;

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
    /// Directory where fabric nodes of this host meet (shared memory).
    #[arg(long)]
    shm_dir: Option<PathBuf>,
    /// The directory a storage host's file service exports when the
    /// cluster file names none.
    #[arg(long)]
    export: Option<PathBuf>,
    /// When this host is the central manager: the command that resets a
    /// host when the cluster file sets no `reset_command` ({host} and
    /// {reason} put in).
    #[arg(long)]
    reset_command: Option<String>,
    #[command(flatten)]
    metrics: crate::args::MetricsArgs,
    #[command(flatten)]
    child: crate::args::ChildArgs,
    /// UCX on a gateway's or storage host's node: compute hosts that start
    /// it too (`cp --ucx`) reach them over it.
    #[command(flatten)]
    ucx: crate::args::UcxArgs,
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

/// Starts every host of the cluster here and checks each path.
pub fn up(a: UpArgs) -> anyhow::Result<()> {
    let cluster = match &a.cluster {
        Some(p) => load(p)?,
        None => Cluster::embedded(),
    };
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    // Every host here is a child of this process: the file's secret if it
    // names one (so that `manage` and `cp` reach them with the file alone),
    // else a fresh one each run, which the embedded default's file names.
    macrolink_files::setup::secret_from_cluster(&cluster);
    let fresh = match &a.cluster {
        None => macrolink_files::setup::fresh_secret_file(&dir.path().join("secret"))?,
        Some(_) => false,
    };
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
            let named = if fresh {
                "secret_file = \"secret\"\n"
            } else {
                ""
            };
            std::fs::write(&p, format!("{named}{}", macrolink_cluster::DEFAULT))?;
            p
        }
    };
    let mut hosts = Hosts::new(&exe, dir.path().join("resets"))?;
    start_hosts(&hosts, &cluster, &file, dir.path())?;
    hosts.watch()?;
    println!("{}", macrolink_gwnet::check::HEADER);
    let mut ok = true;
    for h in cluster.with_role(Role::Compute) {
        ok &= check(&cluster, h, dir.path(), a.mib, true)?;
    }
    if !cluster.macros.is_empty() {
        match crate::manage::status_table(&cluster, std::time::Duration::from_secs(5)) {
            Ok(t) => eprintln!("\nmacro-cluster management (macrolink manage status):\n{t}"),
            Err(e) => eprintln!("macro-cluster management: no status: {e:#}"),
        }
    }
    if a.stay {
        eprintln!(
            "hosts running; interrupt to stop. Their cluster file: {} \
             (macrolink manage status FILE, macrolink cp --cluster FILE ...)",
            file.display()
        );
        loop {
            // Until a signal ends the process (exit_on_signals).
            std::thread::park();
        }
    }
    drop(hosts);
    anyhow::ensure!(ok, "some checks failed");
    Ok(())
}

/// Starts every host of `c` (read from `file`) here, but its compute
/// hosts, whose checks this process runs: each gateway and storage host
/// as one `macrolink node` process (its role and its management roles),
/// each relay as `macrolink relay`, and the management station of every
/// other host with a `manage` address. A reset from the central manager
/// restarts a host's processes, unless the file sets a reset command of
/// its own.
fn start_hosts(hosts: &Hosts, c: &Cluster, file: &Path, dir: &Path) -> anyhow::Result<()> {
    let managed = !c.macros.is_empty();
    let os = |s: &[&str]| s.iter().map(OsString::from).collect::<Vec<_>>();
    let state = dir.join("manage");
    let management = |args: &mut Vec<OsString>| {
        args.extend([OsString::from("--state-dir"), state.clone().into()]);
        args.extend(os(&["--reset-command", &hosts.reset_command()]));
    };
    for h in &c.hosts {
        let at = h.listen().map(|a| a.to_string()).unwrap_or_default();
        if matches!(h.role, Role::Gateway | Role::Storage) {
            let mut args = os(&["node", "--exit-with-parent", "--host", &h.name]);
            args.extend([file.into(), "--shm-dir".into(), dir.into()]);
            management(&mut args);
            let export = match (&h.export, h.files) {
                (None, Some(_)) => Some(dir.join(format!("export-{}", h.name))),
                (e, _) => e.clone(),
            };
            if let Some(e) = &export {
                std::fs::create_dir_all(e)?;
                args.extend(["--export".into(), e.into()]);
            }
            hosts.start(&h.name, args, true)?;
            eprintln!("{} ({:?}, node {}) up at {at}", h.name, h.role, h.node);
            continue;
        }
        if h.role == Role::Relay {
            let mut args = os(&["relay", "--exit-with-parent", "--host", &h.name]);
            args.push(file.into());
            hosts.start(&h.name, args, true)?;
            eprintln!("{} (relay) up: far hosts dialled from {at}", h.name);
        }
        if managed && h.manage.is_some() {
            let mut args = os(&["manage", "run", "--exit-with-parent", "--host", &h.name]);
            args.push(file.into());
            management(&mut args);
            hosts.start(&h.name, args, false)?;
        }
    }
    if managed {
        eprintln!(
            "management up: {} macro-cluster(s), central manager on {}",
            c.macros.len(),
            c.manage.central.as_deref().unwrap_or("?")
        );
    }
    Ok(())
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
    metrics: &crate::args::MetricsArgs,
    ucx: Option<macrolink_fabric::UcxOptions>,
) -> anyhow::Result<()> {
    let secret = load_secret(None)?;
    let mut cfg = ServeConfig::for_host(h, shm, secret.clone())?;
    cfg.excluded = macrolink_files::setup::watch_excluded(c, &secret);
    cfg.ucx = ucx;
    metrics.serve("macrolink_files", |r| cfg.meter.register(r))?;
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
    a.child.apply();
    let cluster = load(&a.cluster)?;
    // Before any thread: the file's secret, for this process and its children.
    macrolink_files::setup::secret_from_cluster(&cluster);
    let mut h = cluster.me(a.host.as_deref())?.clone();
    if h.export.is_none() {
        h.export = a.export.clone();
    }
    let shm = a
        .shm_dir
        .clone()
        .unwrap_or_else(macrolink_fabric::default_shm_dir);
    let storage = cluster.storage_peers(&h);
    let until = a.until_done.then(|| Pending::of(&cluster));
    if h.role != Role::Relay {
        // A relay reports what it carried on a signal, and ends by itself.
        crate::roles::exit_on_signals(|| {})?;
    }
    if h.manage.is_some() && !cluster.macros.is_empty() {
        let dir = a.state_dir.clone();
        let dir = dir.unwrap_or_else(macrolink_managenet::default_state_dir);
        crate::manage::spawn(&cluster, &h.name, dir, a.reset_command.clone())?;
    }
    let metered = matches!(h.role, Role::Gateway | Role::Relay)
        || (h.role == Role::Storage && h.files.is_some());
    if a.metrics.metrics.is_some() && !metered {
        eprintln!(
            "{}: --metrics: a {:?} host without a file service counts nothing to serve",
            h.name, h.role
        );
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
        Role::Storage if h.files.is_some() => {
            run_file_service(&cluster, &h, &shm, until, &a.metrics, a.ucx.options())
        }
        Role::Storage => crate::roles::sink(node_config(&h, &shm, &storage), 1, until),
        Role::Gateway => {
            let mut cfg = node_config(&h, &shm, &storage);
            cfg.ucx = a.ucx.options();
            crate::roles::gateway(cfg, &storage, 1, until, &a.metrics)
        }
        Role::Relay => crate::relay::serve(&cluster, &h, None, false, &a.metrics),
    }
}
