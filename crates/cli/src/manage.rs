//! `macrolink manage`: macro-cluster management. `run` runs a host's
//! management roles (its agent, the local manager or fallback of its
//! group, the central manager); `status` shows the central manager's view;
//! `reset`, `exclude` and `include` are an operator's orders.

use anyhow::Context;
use clap::{Args as ClapArgs, Subcommand};
use macrolink_cluster::Cluster;
use macrolink_fabric::seal::Seal;
use macrolink_managenet::{ask, Station, SEAL_CONTEXT};
use macrolink_wire::manage::Body;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::args::ChildArgs;
use crate::files::SecretArgs;

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run this host's management roles until SIGINT or SIGTERM: its agent
    /// (probes, health check), the local manager or fallback of its group,
    /// the central manager (also as `manage local`, `manage central`).
    #[command(alias = "local", alias = "central")]
    Run {
        /// Cluster file with [[macro]] groups and [manage].
        cluster: PathBuf,
        /// This host (default: from the launcher's rank).
        #[arg(long)]
        host: Option<String>,
        /// Where the central manager keeps its decision log and state.
        /// (default: /var/lib/macrolink/manage for root, else
        /// ~/.local/state/macrolink/manage)
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// On the central manager: serve Prometheus metrics (/metrics),
        /// a status page (/) and the state (/status.json) at this address.
        #[arg(long)]
        metrics: Option<std::net::SocketAddr>,
        /// On the central manager: the command that resets a host when the
        /// cluster file sets no `reset_command` ({host} and {reason} put
        /// in); `macrolink up` restarts the processes it runs with it.
        #[arg(long)]
        reset_command: Option<String>,
        #[command(flatten)]
        secret: SecretArgs,
        #[command(flatten)]
        child: ChildArgs,
    },
    /// The central manager's view: groups and who manages each; hosts with
    /// their state, since when, health and actions.
    Status {
        /// Cluster file.
        cluster: PathBuf,
        /// Print the central manager's JSON.
        #[arg(long)]
        json: bool,
        /// Show it again every this many seconds, until interrupted.
        #[arg(long)]
        watch: Option<f64>,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Reset a host now.
    Reset(OrderArgs),
    /// Exclude a host until it is included again.
    Exclude(OrderArgs),
    /// Include an excluded host again.
    Include(OrderArgs),
}

#[derive(Debug, ClapArgs)]
struct OrderArgs {
    /// Cluster file.
    cluster: PathBuf,
    /// The host.
    host: String,
    /// Why (kept in the decision log).
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    secret: SecretArgs,
}

/// The cluster file, and the seal of its management datagrams.
fn open(path: &Path, secret: &SecretArgs) -> anyhow::Result<(Cluster, Seal)> {
    let c = Cluster::load(path).with_context(|| format!("in {}", path.display()))?;
    // Before any thread: the file's secret, unless the environment names one.
    macrolink_files::setup::secret_from_cluster(&c);
    let key = macrolink_files::setup::load_secret(secret.secret_file.as_deref())?.fabric_key();
    Ok((c, Seal::new(key.derive(SEAL_CONTEXT))))
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let wait = Duration::from_secs(5);
    // Orders and status requests are small: a reason of at most this.
    if let Command::Reset(o) | Command::Exclude(o) | Command::Include(o) = &a.command {
        anyhow::ensure!(
            o.reason.len() <= macrolink_wire::manage::MAX_TEXT,
            "--reason: at most {} bytes",
            macrolink_wire::manage::MAX_TEXT
        );
    }
    match a.command {
        Command::Run {
            cluster,
            host,
            state_dir,
            metrics,
            reset_command,
            secret,
            child,
        } => {
            child.apply();
            let (c, seal) = open(&cluster, &secret)?;
            let name = c.me(host.as_deref())?.name.clone();
            let dir = state_dir.unwrap_or_else(macrolink_managenet::default_state_dir);
            let mut station = Station::bind(&c, &name, seal, dir)?;
            if let Some(cmd) = reset_command {
                station.reset_by_default(cmd);
            }
            if let Some(at) = metrics {
                let l =
                    std::net::TcpListener::bind(at).with_context(|| format!("--metrics {at}"))?;
                eprintln!(
                    "{name}: metrics at http://{}/metrics, status page at /",
                    l.local_addr()?
                );
                station.serve_web(l)?;
            }
            let stop = Arc::new(AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, stop.clone())?;
            }
            eprintln!("{name}: management at {}", station.local_addr()?);
            station.run(&stop)?;
            Ok(())
        }
        Command::Status {
            cluster,
            json,
            watch,
            secret,
        } => {
            let (c, seal) = open(&cluster, &secret)?;
            loop {
                let (ok, text) = ask(
                    &c,
                    &seal,
                    |nonce, sent_ms| Body::Status { nonce, sent_ms },
                    wait,
                )?;
                anyhow::ensure!(ok, "{text}");
                match json {
                    true => println!("{text}"),
                    false => println!("{}", macrolink_managenet::status::table(&text)?),
                }
                let Some(every) = watch else {
                    return Ok(());
                };
                anyhow::ensure!(every.is_finite(), "--watch: a number of seconds");
                std::thread::sleep(Duration::from_secs_f64(every.clamp(0.1, 86_400.0)));
            }
        }
        Command::Reset(o) => order(o, "reset"),
        Command::Exclude(o) => order(o, "exclude"),
        Command::Include(o) => order(o, "include"),
    }
}

fn order(o: OrderArgs, kind: &str) -> anyhow::Result<()> {
    let (c, seal) = open(&o.cluster, &o.secret)?;
    let host = c
        .host(&o.host)
        .with_context(|| format!("no host named {:?}", o.host))?
        .node;
    let order = macrolink_managenet::order_kind(kind).context("order")?;
    let reason = o.reason.as_str();
    let (ok, text) = ask(
        &c,
        &seal,
        |nonce, sent_ms| Body::Order {
            nonce,
            sent_ms,
            host,
            order,
            text: reason,
        },
        Duration::from_secs(5),
    )?;
    anyhow::ensure!(ok, "{text}");
    println!("{text}");
    Ok(())
}

/// The seal of management datagrams, from the secret this process has
/// (the environment's, else the cluster file's).
fn seal() -> anyhow::Result<Seal> {
    let key = macrolink_files::setup::load_secret(None)?.fabric_key();
    Ok(Seal::new(key.derive(SEAL_CONTEXT)))
}

/// Runs host `host`'s management roles of `c` on a thread of this process
/// (`macrolink node` for a host with a `manage` address), for as long as
/// the process lives.
pub fn spawn(
    c: &Cluster,
    host: &str,
    state_dir: PathBuf,
    reset_command: Option<String>,
) -> anyhow::Result<()> {
    let mut station = Station::bind(c, host, seal()?, state_dir)?;
    if let Some(cmd) = reset_command {
        station.reset_by_default(cmd);
    }
    std::thread::Builder::new()
        .name("ml-manage".into())
        .spawn(move || {
            if let Err(e) = station.run(&AtomicBool::new(false)) {
                tracing::error!("management stopped: {e}");
            }
        })?;
    Ok(())
}

/// The central manager's view of `c` as a table, once it has heard from
/// the manager of every group (waiting up to `wait`).
pub fn status_table(c: &Cluster, wait: Duration) -> anyhow::Result<String> {
    let seal = seal()?;
    let until = std::time::Instant::now() + wait;
    loop {
        let (ok, text) = ask(
            c,
            &seal,
            |nonce, sent_ms| Body::Status { nonce, sent_ms },
            wait,
        )?;
        anyhow::ensure!(ok, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text)?;
        let heard = v["groups"]
            .as_array()
            .is_some_and(|g| g.iter().all(|g| !g["manager"].is_null()));
        if heard || std::time::Instant::now() > until {
            return Ok(macrolink_managenet::status::table(&text)?);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
