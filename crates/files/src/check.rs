//! The check a compute host of a cluster file runs at start: a file copied
//! to each storage host's file service and back (through the lane's
//! gateways where a lane serves it), compared byte for byte, and removed.

use macrolink_cluster::{Cluster, Host};
use macrolink_gwnet::check::PathCheck;
use std::path::Path;

use crate::auth::Secret;
use crate::copy::{Copier, CopyOptions, Location};
use crate::error::{Error, Result};
use crate::{lane, ClientOptions};

/// Copies `data` from compute host `h` to the file service of every
/// storage host of `c` that runs one, and back; two rows each (up, down).
/// `scratch` is a directory for the local copies.
pub fn round_trip(
    c: &Cluster,
    h: &Host,
    shm: &Path,
    secret: &Secret,
    data: &[u8],
    scratch: &Path,
) -> Result<Vec<PathCheck>> {
    let src = scratch.join("check");
    let back = scratch.join("back");
    std::fs::write(&src, data).map_err(|e| Error::local(src.display(), e))?;
    let mut out = Vec::new();
    for s in c.hosts.iter().filter(|s| s.files.is_some()) {
        let addr = s.files.map(|a| a.to_string()).unwrap_or_default();
        let mut client = ClientOptions {
            shm_dir: shm.to_path_buf(),
            ..Default::default()
        };
        lane::add_routes(c, Some(h), &mut client);
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
        let up = copier.copy(&Location::Local(src.clone()), &remote)?;
        let down = copier.copy(&remote, &Location::Local(back.clone()))?;
        let same = std::fs::read(&back).map_err(|e| Error::local(back.display(), e))? == data;
        copier.client(&addr)?.remove(&name, false)?;
        for (what, r) in [("up", &up), ("down", &down)] {
            out.push(PathCheck {
                storage: s.name.clone(),
                through: format!("{through} (cp {what})"),
                bytes: r.bytes,
                secs: r.secs,
                ok: same,
            });
        }
    }
    Ok(out)
}
