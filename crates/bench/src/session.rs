//! A benchmark session: a target (`macrolink bench serve`) that this
//! process starts on this host, or one that runs on another host, and the
//! initiator's node and client facing it.
//!
//! ```text
//!   Session::open(exe, None)       ── spawns `macrolink bench serve --node 2`, reads its ready line
//!   Session::open(exe, Some(addr)) ── a target elsewhere, started with `--listen`
//!   drop                           ── Quit, then a child has 2 s to exit before it is killed;
//!                                     then its directory goes (or at a signal, see `undo`)
//! ```

use macrolink_fabric::{Node, NodeConfig, UcxOptions};
use macrolink_testbed::undo::Scratch;
use macrolink_testbed::Peer;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::time::Duration;

use crate::client::Client;

/// Node id of the target of a session.
pub const TARGET_NODE: u32 = 2;

/// A target and the initiator's client.
#[derive(Debug)]
pub struct Session {
    client: Option<Client>,
    target: Option<Peer>,
    _node: Node,
    /// The shared-memory meeting directory of a target started here:
    /// removed after both sides have gone (fields drop after `drop`), or
    /// by the signal handler (`undo::on_signal`) if a signal ends the run.
    _dir: Option<Scratch>,
}

impl Session {
    /// Starts a target (the binary `exe`, unless `connect` names one
    /// elsewhere) and the initiator.
    pub fn open(exe: &Path, connect: Option<SocketAddr>) -> anyhow::Result<Session> {
        Session::open_with(exe, connect, None)
    }

    /// As [`open`](Self::open), both sides with UCX (`ucx`) when asked.
    pub fn open_with(
        exe: &Path,
        connect: Option<SocketAddr>,
        ucx: Option<&UcxOptions>,
    ) -> anyhow::Result<Session> {
        let (target, dir, tcp) = match connect {
            Some(a) => (None, None, a),
            None => {
                // A directory of its own: sessions of one run may overlap.
                let dir = macrolink_testbed::undo::scratch()?;
                let mut extra = Vec::new();
                if let Some(u) = ucx {
                    extra.push("--ucx".to_string());
                    if let Some(t) = &u.tls {
                        extra.extend(["--ucx-tls".to_string(), t.clone()]);
                    }
                }
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                let p = Peer::spawn_role(exe, "bench serve", TARGET_NODE, dir.path(), &extra)?;
                let tcp = p.tcp;
                (Some(p), Some(dir), tcp)
            }
        };
        let mut cfg = NodeConfig::local(
            1,
            dir.as_ref()
                .map_or_else(macrolink_fabric::default_shm_dir, |d| {
                    d.path().to_path_buf()
                }),
        );
        if let Some(a) = connect {
            cfg.shm_dir = None;
            // Datagrams leave from the address that reaches the target, not
            // from loopback.
            cfg.udp = Some(source_toward(a)?);
        }
        cfg.peers.insert(TARGET_NODE, tcp);
        cfg.ucx = ucx.cloned();
        let node = Node::start(cfg)?;
        let client = Client::new(&node, TARGET_NODE)?;
        Ok(Session {
            client: Some(client),
            target,
            _node: node,
            _dir: dir,
        })
    }

    /// The initiator.
    pub fn client(&mut self) -> &mut Client {
        self.client.as_mut().expect("the client lives until drop")
    }
}

/// This host's address the kernel would send from to reach `to`.
fn source_toward(to: SocketAddr) -> std::io::Result<IpAddr> {
    let any: SocketAddr = match to {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any)?;
    // Connecting a UDP socket sends nothing; it only picks the route.
    s.connect(to)?;
    Ok(s.local_addr()?.ip())
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            let _ = c.quit();
        }
        if let Some(mut t) = self.target.take() {
            t.wait_exit(Duration::from_secs(2));
        }
    }
}
