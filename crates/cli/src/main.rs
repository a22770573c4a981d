//! `macrolink`: the command line.

// The doc comments of the commands' arguments are their `--help`, written
// for a terminal (`ml://host[:port]/path`, `[[macro]]` tables), not links.
#![allow(rustdoc::broken_intra_doc_links)]

mod args;
mod bench;
mod demo;
mod echo;
mod files;
mod iobench;
mod link;
mod manage;
mod manual;
mod plan;
mod relay;
mod roles;
mod supervise;
mod up;

use clap::{Parser, Subcommand};

/// Move data inside clusters, as fast as the hardware allows, and measure it.
#[derive(Debug, Parser)]
#[command(name = "macrolink", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start every host of a cluster file here (default: the embedded local
    /// cluster) and check each compute-to-storage path.
    Up(up::UpArgs),
    /// Run one host of a cluster file (by --host or the launcher's rank).
    Node(up::NodeArgs),
    /// Start a peer process and exchange messages with it in every mode and
    /// over every transport, printing the rates.
    Demo(demo::Args),
    /// Benchmarks: bandwidth, latency, one-way latency, breakdown, comparison.
    Bench(bench::Args),
    /// I/O gateway: relay striped transfers between compute and storage hosts.
    Gateway(roles::GatewayArgs),
    /// Storage side of striped transfers: place chunks, check the whole.
    Sink(roles::Args),
    /// Answer every message with the same message, and every notified put
    /// with the bytes it placed. Prints its addresses on the first line.
    Echo(echo::Args),
    /// Export a directory: the file service's storage side.
    Serve(files::ServeArgs),
    /// Copy files or directories between here and an ml://host/path export,
    /// verified end to end.
    Cp(files::CpArgs),
    /// List a remote directory.
    Ls(files::PathArgs),
    /// Show a remote path's metadata.
    Stat(files::PathArgs),
    /// Remove a remote file, or with -r a directory.
    Rm(files::PathArgs),
    /// Make a remote directory, with -p its parents too.
    Mkdir(files::PathArgs),
    /// Parallel I/O benchmark: N-to-N and N-to-1 write/read, effective
    /// bandwidth, random write; on a directory or an ml:// export.
    Iobench(iobench::Args),
    /// A link emulator (netem in user space) between two network namespaces.
    Link(link::Args),
    /// One of the pair of range-extension relays that join the two segments
    /// of a cluster file over a long link.
    Relay(relay::Args),
    /// Macro-cluster management: run a host's managers, show the central
    /// manager's view, reset, exclude or include a host.
    Manage(manage::Args),
    /// The papers' models: cost and capacity of I/O networks and storage,
    /// range extension, latency; checked against the papers' tables.
    Plan(plan::Args),
    /// Shell completions (bash, zsh, fish, elvish, powershell), on stdout.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Manual pages of every command, written into a directory.
    #[command(hide = true)]
    Man {
        /// Where to write them.
        dir: std::path::PathBuf,
    },
    /// One iobench worker (started by iobench).
    #[command(hide = true)]
    IobenchWorker,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MACROLINK_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let client = |r: Result<(), macrolink_files::Error>| std::process::exit(files::finish(r));
    match Cli::parse().command {
        Command::Serve(a) => files::serve(a),
        Command::Iobench(a) => iobench::run(a),
        Command::IobenchWorker => iobench::worker(),
        Command::Cp(a) => client(files::cp(a)),
        Command::Ls(a) => client(files::ls(a)),
        Command::Stat(a) => client(files::stat(a)),
        Command::Rm(a) => client(files::rm(a)),
        Command::Mkdir(a) => client(files::mkdir(a)),
        Command::Up(a) => up::up(a),
        Command::Node(a) => up::node(a),
        Command::Demo(a) => demo::run(a),
        Command::Echo(a) => echo::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Manage(a) => manage::run(a),
        Command::Link(a) => link::run(a),
        Command::Relay(a) => relay::run(a),
        Command::Completions { shell } => {
            manual::completions::<Cli>(shell);
            Ok(())
        }
        Command::Man { dir } => manual::pages::<Cli>(&dir),
        Command::Gateway(a) => {
            let (r, m) = (a.role, a.metrics);
            r.child.apply();
            roles::exit_on_signals(|| {})?;
            roles::gateway(r.node.config()?, &r.node.peers, r.ep, None, &m)
        }
        Command::Sink(a) => {
            a.child.apply();
            roles::exit_on_signals(|| {})?;
            roles::sink(a.node.config()?, a.ep, None)
        }
    }
}
