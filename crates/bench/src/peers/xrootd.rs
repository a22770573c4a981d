//! XRootD: `xrootd` serving a directory on loopback, and `xrdcp` copying to
//! and from it.

use anyhow::bail;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, Tool};

/// The server.
pub const SERVER: Tool = Tool {
    program: "xrootd",
    package: "xrootd-server",
};
/// The copy client.
pub const CLIENT: Tool = Tool {
    program: "xrdcp",
    package: "xrootd-client",
};

/// An `xrootd` exporting a directory; stopped when dropped.
#[derive(Debug)]
pub struct Xrootd {
    child: Child,
    /// Its port on loopback.
    pub port: u16,
}

impl Xrootd {
    /// Starts xrootd exporting `export` on a free port, its configuration
    /// and log in `dir` (writable by the user it runs as: `nobody` when
    /// started by root, which xrootd refuses to run as); `None` when it is
    /// not installed.
    pub fn start(dir: &Path, export: &Path) -> anyhow::Result<Option<Xrootd>> {
        if Command::new(SERVER.program).arg("-v").output().is_err() {
            return Ok(None);
        }
        let port = free_port()?;
        let cfg = dir.join("xrootd.cfg");
        std::fs::write(
            &cfg,
            format!("all.export {}\nxrd.port {port}\n", export.display()),
        )?;
        let mut cmd = Command::new(SERVER.program);
        cmd.arg("-c")
            .arg(&cfg)
            .arg("-l")
            .arg(dir.join("xrootd.log"));
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            cmd.args(["-R", "nobody"]);
        }
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
        let server = Xrootd { child, port };
        let until = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > until {
                let log = std::fs::read_to_string(dir.join("xrootd.log")).unwrap_or_default();
                bail!("xrootd did not start: {log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Some(server))
    }

    /// The `root://` URL of `path` (absolute, inside the export).
    pub fn url(&self, path: &Path) -> String {
        format!("root://127.0.0.1:{}/{}", self.port, path.display())
    }
}

impl Drop for Xrootd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `xrdcp` copying `from` to `to` (either a `root://` URL) over `streams`
/// parallel data streams (its `--streams`, beside the control stream, at
/// most 15), overwriting, quietly, with one retry of the connection and a
/// minute per request.
pub fn xrdcp(from: &str, to: &str, streams: u32) -> Command {
    let mut c = Command::new(CLIENT.program);
    c.args(["-f", "-s", "--streams", &streams.clamp(1, 15).to_string()])
        .args([from, to])
        .env("XRD_CONNECTIONRETRY", "1")
        .env("XRD_REQUESTTIMEOUT", "60");
    c
}
