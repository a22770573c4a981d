//! Command-line options that more than one command takes: where a process
//! sits in the fabric, transports, modes and completions as values, sizes.

use anyhow::{bail, Context};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use macrolink_fabric::{Key, NodeConfig};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;

/// Where this process's node sits.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Node id of this process.
    #[arg(long, default_value_t = 1)]
    pub node: u32,
    /// Directory where nodes of this host meet for shared memory.
    #[arg(long, env = "MACROLINK_SHM_DIR")]
    pub shm_dir: Option<PathBuf>,
    /// TCP listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub tcp: SocketAddr,
    /// Address for endpoints' UDP sockets.
    #[arg(long, default_value = "127.0.0.1")]
    pub udp: IpAddr,
    /// Another node's TCP address, as ID=HOST:PORT (repeatable).
    #[arg(long = "peer", value_parser = parse_peer)]
    pub peers: Vec<(u32, SocketAddr)>,
    /// Largest datagram payload in bytes.
    #[arg(long, default_value_t = macrolink_fabric::DEFAULT_MTU)]
    pub mtu: usize,
    /// File of the secret whose key peers must prove (else MACROLINK_SECRET).
    #[arg(long, env = "MACROLINK_SECRET_FILE")]
    pub secret_file: Option<PathBuf>,
    #[command(flatten)]
    pub ucx: UcxArgs,
}

/// `--ucx`: a node that also speaks UCX.
#[derive(Debug, Clone, Default, Args)]
pub struct UcxArgs {
    /// Start UCX too (libucp, loaded at run time; Debian: libucx0), for
    /// data over InfiniBand, RoCE or whatever UCX finds, with peers that
    /// start it too.
    #[arg(long)]
    pub ucx: bool,
    /// UCX's transports, as UCX_TLS says them (`rc,sm,self`, `tcp`);
    /// implies --ucx. Without it UCX reads UCX_TLS and UCX_NET_DEVICES.
    #[arg(long, value_name = "TLS")]
    pub ucx_tls: Option<String>,
}

impl UcxArgs {
    /// What the node's UCX is to be, if any.
    pub fn options(&self) -> Option<macrolink_fabric::UcxOptions> {
        (self.ucx || self.ucx_tls.is_some()).then(|| macrolink_fabric::UcxOptions {
            tls: self.ucx_tls.clone(),
            devices: None,
        })
    }
}

impl NodeArgs {
    pub fn config(&self) -> anyhow::Result<NodeConfig> {
        let mut cfg = NodeConfig::local(
            self.node,
            self.shm_dir
                .clone()
                .unwrap_or_else(macrolink_fabric::default_shm_dir),
        );
        cfg.tcp = Some(self.tcp);
        cfg.udp = Some(self.udp);
        cfg.peers = self.peers.iter().copied().collect();
        cfg.datagram_mtu = self.mtu;
        if let Some(p) = &self.secret_file {
            let b = std::fs::read(p).with_context(|| p.display().to_string())?;
            cfg.key = Some(Key::from_secret(&b)?);
        }
        cfg.ucx = self.ucx.options();
        Ok(cfg)
    }
}

/// `--metrics ADDR` of a service.
#[derive(Debug, Clone, Default, Args)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics (plain HTTP, read
    /// only; any peer may read them).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
}

impl MetricsArgs {
    /// Serves, if asked, what `register` puts in a registry whose names
    /// begin with `prefix`.
    pub fn serve(
        &self,
        prefix: &str,
        register: impl FnOnce(&mut prometheus_client::registry::Registry),
    ) -> anyhow::Result<()> {
        let Some(at) = self.metrics else {
            return Ok(());
        };
        let mut r = prometheus_client::registry::Registry::with_prefix(prefix);
        register(&mut r);
        let bound = macrolink_metrics::bind(at, r)?;
        eprintln!("metrics at http://{bound}/metrics");
        Ok(())
    }
}

/// Options of a process that another one starts.
#[derive(Debug, Clone, Copy, Args)]
pub struct ChildArgs {
    /// Exit when the parent process exits.
    #[arg(long)]
    pub exit_with_parent: bool,
}

impl ChildArgs {
    /// Asks the kernel to end this process (SIGTERM, so that it cleans up
    /// as on any other SIGTERM) when its parent exits, if asked.
    pub fn apply(&self) {
        if self.exit_with_parent {
            // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and
            // touches no memory.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
        }
    }
}

/// A size such as `4MiB` or `100MB`, in bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::parse_size(s).map_err(|e| e.to_string())
}

/// Sizes given as `4KiB,64KiB`; none for an empty list (`""`).
#[derive(Debug, Clone)]
pub struct Sizes(pub Vec<u64>);

/// Parses a comma-separated list of sizes, which may be empty.
pub fn parse_sizes(s: &str) -> Result<Sizes, String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(parse_size)
        .collect::<Result<_, _>>()
        .map(Sizes)
}

/// Seconds from 0 to an hour (`0.5`, `2`).
pub fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s}: seconds from 0 to 3600 expected")),
    }
}

fn parse_peer(s: &str) -> anyhow::Result<(u32, SocketAddr)> {
    let (id, addr) = s.split_once('=').context("expected ID=HOST:PORT")?;
    Ok((
        id.parse().context("node id")?,
        addr.parse().context("address")?,
    ))
}

/// Endpoint ids given as `5` or `1-64`.
#[derive(Debug, Clone)]
pub struct Ids(pub Vec<u32>);

/// Parses `5` or `1-64` into an inclusive range of endpoint ids.
pub fn parse_ids(s: &str) -> anyhow::Result<Ids> {
    let (a, b) = match s.split_once('-') {
        Some((a, b)) => (a.parse()?, b.parse()?),
        None => {
            let v = s.parse()?;
            (v, v)
        }
    };
    if a > b || b - a >= 4096 {
        bail!("endpoint range {s} is empty or too large");
    }
    Ok(Ids((a..=b).collect()))
}

/// A parser of the values named `names` (shown in --help), each parsed by
/// its type's `FromStr`.
pub fn one_of<T>(names: &'static [&'static str]) -> impl TypedValueParser<Value = T>
where
    T: FromStr + Clone + Send + Sync + 'static,
    T::Err: std::fmt::Debug,
{
    PossibleValuesParser::new(names).map(|s| s.parse().expect("one of the possible values"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_list_of_sizes_may_be_empty() {
        assert_eq!(super::parse_sizes("").unwrap().0, Vec::<u64>::new());
        assert_eq!(
            super::parse_sizes("4KiB, 1MiB").unwrap().0,
            vec![4096, 1 << 20]
        );
        assert!(super::parse_sizes("4KiB,lots").is_err());
    }

    #[test]
    fn seconds_are_finite_and_bounded() {
        assert_eq!(super::parse_secs("1.5"), Ok(1.5));
        assert_eq!(super::parse_secs("0"), Ok(0.0));
        for bad in ["NaN", "inf", "-1", "3601", "soon"] {
            assert!(super::parse_secs(bad).is_err(), "{bad}");
        }
    }
}
