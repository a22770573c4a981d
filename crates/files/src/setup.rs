//! How a client process reaches file servers: where the shared secret
//! comes from, which data path it may use, and the cluster file that names
//! storage hosts and their lanes. Plain data, so that a command can pass it
//! on to worker processes it starts.
//!
//! ```text
//!   ClientSetup ──secret()──► Secret          (--secret-file, MACROLINK_SECRET)
//!               ──options()─► ClientOptions   (shm dir, --no-shm, cluster hosts and lanes)
//!               ──connect(server)──► Client
//! ```

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use macrolink_fabric::seal::Seal;
use macrolink_manage::excluded::Excluded;

use crate::auth::Secret;
use crate::client::{Client, ClientOptions};
use crate::copy::Location;
use crate::error::Error;
use crate::lane;

pub use macrolink_fabric::key::{SECRET_FILE_VAR, SECRET_VAR};

/// A client's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientSetup {
    /// File holding the shared secret; without it, `MACROLINK_SECRET`.
    pub secret_file: Option<PathBuf>,
    /// Move data over TCP even when the server shares this host's memory.
    pub no_shm: bool,
    /// Directory where fabric nodes of this host meet (default: the
    /// fabric's).
    pub shm_dir: Option<PathBuf>,
    /// Cluster file: storage hosts by name, and the gateways of their lanes.
    pub cluster: Option<PathBuf>,
    /// This host's name in the cluster file (default: from the launcher's
    /// rank, if any): across a relay pair, hosts of the other segment are
    /// reached through this host's relay.
    #[serde(default)]
    pub host: Option<String>,
    /// Start UCX on this side's node: file data to servers and gateways
    /// that speak it too goes over it.
    #[serde(default)]
    pub ucx: bool,
    /// UCX's transports (`UCX_TLS`), when not from the environment.
    #[serde(default)]
    pub ucx_tls: Option<String>,
}

impl ClientSetup {
    /// The shared secret: `secret_file`, else the environment's, else the
    /// one the cluster file names.
    pub fn secret(&self) -> Result<Secret, Error> {
        let from_cluster = match (&self.secret_file, &self.cluster) {
            (None, Some(p)) if !env_names_secret() => macrolink_cluster::Cluster::load(p)
                .ok()
                .and_then(|c| c.secret_file),
            _ => None,
        };
        load_secret(self.secret_file.as_deref().or(from_cluster.as_deref()))
    }

    /// The client options these settings make.
    pub fn options(&self) -> Result<ClientOptions, Error> {
        let mut opts = ClientOptions {
            shm_dir: self
                .shm_dir
                .clone()
                .unwrap_or_else(macrolink_fabric::default_shm_dir),
            no_shm: self.no_shm,
            ucx: (self.ucx || self.ucx_tls.is_some()).then(|| macrolink_fabric::UcxOptions {
                tls: self.ucx_tls.clone(),
                devices: None,
            }),
            ..ClientOptions::default()
        };
        if let Some(p) = &self.cluster {
            let c = macrolink_cluster::Cluster::load(p)
                .map_err(|e| Error::Usage(format!("{}: {e}", p.display())))?;
            opts.excluded = self.secret().ok().and_then(|s| watch_excluded(&c, &s));
            let me = match &self.host {
                Some(n) => Some(
                    c.me(Some(n))
                        .map_err(|e| Error::Usage(format!("{}: {e}", p.display())))?,
                ),
                None => c.me(None).ok(),
            };
            lane::add_routes(&c, me, &mut opts);
        }
        Ok(opts)
    }

    /// A client of `server` (`host:port`, or a host name of the cluster file).
    pub fn connect(&self, server: &str) -> Result<Client, Error> {
        Client::connect(server, &self.secret()?, &self.options()?)
    }

    /// A client of the one server `url` (`ml://host[:port]/path`) names,
    /// and the path.
    pub fn connect_url(&self, url: &str) -> Result<(Client, String), Error> {
        match url.parse()? {
            Location::Remote { server, path } => Ok((self.connect(&server)?, path)),
            Location::Local(_) => Err(Error::Usage(format!("{url}: not an ml:// URL"))),
            Location::Striped { .. } => Err(Error::Usage(format!(
                "{url}: names several servers; name one"
            ))),
        }
    }
}

/// How often a process asks the central manager which hosts are excluded.
pub const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// The hosts the central manager of cluster file `c` has excluded, kept up
/// to date by one thread per process (for the first cluster file that
/// names a central manager); `None` when `c` names none.
pub fn watch_excluded(c: &macrolink_cluster::Cluster, secret: &Secret) -> Option<Excluded> {
    static WATCH: std::sync::OnceLock<Option<Excluded>> = std::sync::OnceLock::new();
    c.manage.central.as_ref()?;
    WATCH
        .get_or_init(|| {
            let seal = Seal::new(
                secret
                    .fabric_key()
                    .derive(macrolink_managenet::SEAL_CONTEXT),
            );
            macrolink_managenet::watch_excluded(c, seal, WATCH_EVERY).unwrap_or_else(|e| {
                tracing::warn!("not watching the central manager's exclusions: {e}");
                None
            })
        })
        .clone()
}

/// Whether the environment names a secret.
fn env_names_secret() -> bool {
    std::env::var_os(SECRET_VAR).is_some() || std::env::var_os(SECRET_FILE_VAR).is_some()
}

/// Names the secret file of cluster file `c` to this process and its
/// children, unless the environment names a secret. Call before starting
/// any thread.
pub fn secret_from_cluster(c: &macrolink_cluster::Cluster) {
    if let (false, Some(f)) = (env_names_secret(), &c.secret_file) {
        // Before any thread exists (the caller's promise), and children inherit it.
        std::env::set_var(SECRET_FILE_VAR, f);
    }
}

/// Gives this process and its children a fresh random secret, unless the
/// environment names one. Call before starting any thread.
pub fn fresh_secret_unless_set() -> Result<(), Error> {
    if env_names_secret() {
        return Ok(());
    }
    let mut b = [0u8; 24];
    getrandom::fill(&mut b).map_err(|e| Error::Usage(format!("no randomness: {e}")))?;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    // Before any thread exists (the caller's promise), and children inherit it.
    std::env::set_var(SECRET_VAR, hex);
    Ok(())
}

/// Writes a fresh random secret to `path` (readable by its owner only)
/// and names it to this process and its children, unless the environment
/// names a secret; whether it did. Call before starting any thread.
pub fn fresh_secret_file(path: &Path) -> Result<bool, Error> {
    if env_names_secret() {
        return Ok(false);
    }
    let mut b = [0u8; 24];
    getrandom::fill(&mut b).map_err(|e| Error::Usage(format!("no randomness: {e}")))?;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(hex.as_bytes()))
        .map_err(|e| Error::local(path.display(), e))?;
    // Before any thread exists (the caller's promise), and children inherit it.
    std::env::set_var(SECRET_FILE_VAR, path);
    Ok(true)
}

/// The shared secret: from `file`, else the file `MACROLINK_SECRET_FILE`
/// names, else `MACROLINK_SECRET` itself.
pub fn load_secret(file: Option<&Path>) -> Result<Secret, Error> {
    let from_env = std::env::var_os(SECRET_FILE_VAR).map(PathBuf::from);
    let bytes = match (
        file.map(Path::to_path_buf).or(from_env),
        std::env::var_os(SECRET_VAR),
    ) {
        (Some(p), _) => std::fs::read(&p).map_err(|e| Error::local(p.display(), e))?,
        (None, Some(s)) => s.into_encoded_bytes(),
        (None, None) => {
            return Err(Error::Usage(format!(
                "no secret: give --secret-file FILE or set {SECRET_VAR}"
            )))
        }
    };
    Secret::new(&bytes).map_err(|e| Error::Usage(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_file_names_hosts_and_their_lanes() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("c.toml");
        std::fs::write(&file, macrolink_cluster::DEFAULT).unwrap();
        let setup = ClientSetup {
            cluster: Some(file),
            no_shm: true,
            ..ClientSetup::default()
        };
        let o = setup.options().unwrap();
        assert!(o.no_shm);
        let files = "127.0.0.1:7130".parse().unwrap();
        assert_eq!(o.hosts.get("store0"), Some(&files));
        let route = &o.lanes[&files];
        let nodes: Vec<u32> = route.gateways.iter().map(|(a, _)| a.node).collect();
        assert_eq!(nodes, [21, 22]);
        assert_eq!(route.gateways[0].1, "127.0.0.1:7121".parse().unwrap());
        assert_eq!(route.send.stripe.window, 4);
        let missing = ClientSetup {
            cluster: Some(d.path().join("nope.toml")),
            ..ClientSetup::default()
        };
        assert!(matches!(missing.options(), Err(Error::Usage(m)) if m.contains("nope.toml")));
    }

    #[test]
    fn across_a_relay_pair_the_far_storage_and_gateways_are_reached_at_the_relay() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("two.toml");
        let text = include_str!("../../../examples/clusters/two-segments.toml");
        std::fs::write(&file, text).unwrap();
        let c = macrolink_cluster::Cluster::parse(text).unwrap();
        let files = c.host("store0").unwrap().files.unwrap();
        let setup = |host: Option<&str>| ClientSetup {
            cluster: Some(file.clone()),
            host: host.map(String::from),
            ..ClientSetup::default()
        };
        // From compute0 (east): the contact at relay-east's port for store0,
        // the gateways at its ports for gw0 and gw1.
        let o = setup(Some("compute0")).options().unwrap();
        let east = c.host("relay-east").unwrap().fabric.unwrap();
        let at = |i: u16| std::net::SocketAddr::new(east.ip(), east.port() + i);
        assert_eq!(o.relayed.get(&files), Some(&(10, at(2))));
        let gws: Vec<_> = o.lanes[&files].gateways.iter().map(|g| g.1).collect();
        assert_eq!(gws, [at(0), at(1)]);
        assert!(o.segment_hints.is_empty());
        // From gw0 (west, store0's segment): straight there.
        let o = setup(Some("gw0")).options().unwrap();
        assert!(o.relayed.is_empty());
        let gw0 = c.host("gw0").unwrap().listen().unwrap();
        assert_eq!(o.lanes[&files].gateways[0].1, gw0);
        // Unsaid: straight there, and a hint for when that fails.
        let o = setup(None).options().unwrap();
        assert!(o.relayed.is_empty());
        assert!(o.segment_hints[&files].contains("--host"));
        let unknown = setup(Some("nobody")).options();
        assert!(matches!(unknown, Err(Error::Usage(m)) if m.contains("nobody")));
    }

    #[test]
    fn the_secret_comes_from_its_file() {
        let d = tempfile::tempdir().unwrap();
        let (good, short) = (d.path().join("good"), d.path().join("short"));
        std::fs::write(&good, "a secret of sufficient length\n").unwrap();
        std::fs::write(&short, "short").unwrap();
        assert!(load_secret(Some(&good)).is_ok());
        assert!(
            matches!(load_secret(Some(&short)), Err(Error::Usage(m)) if m.contains("at least 16"))
        );
        assert!(load_secret(Some(&d.path().join("none"))).is_err());
    }
}
