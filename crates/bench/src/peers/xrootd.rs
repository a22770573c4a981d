//! XRootD: `xrootd` serving a directory on loopback, and `xrdcp` copying to
//! and from it.

use anyhow::bail;
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

/// How long xrootd may take to start: until its log says it serves its port.
const START_WAIT: Duration = Duration::from_secs(20);

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
        // A free port may be taken by another program before xrootd binds
        // it: xrootd then exits, and a second port is tried.
        let mut last = String::new();
        for _ in 0..2 {
            match Self::start_on(dir, export, free_port()?)? {
                Ok(server) => return Ok(Some(server)),
                Err(why) => last = why,
            }
        }
        bail!("xrootd did not start: {last}")
    }

    /// One try of [`start`](Self::start) on `port`: the server, or why it
    /// failed to start there. Fails when it neither starts nor fails within
    /// [`START_WAIT`].
    fn start_on(dir: &Path, export: &Path, port: u16) -> anyhow::Result<Result<Xrootd, String>> {
        let cfg = dir.join("xrootd.cfg");
        let log_path = dir.join("xrootd.log");
        std::fs::write(
            &cfg,
            format!("all.export {}\nxrd.port {port}\n", export.display()),
        )?;
        let mut cmd = Command::new(SERVER.program);
        cmd.arg("-c").arg(&cfg).arg("-l").arg(&log_path);
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            cmd.args(["-R", "nobody"]);
        }
        // What it says before its log is open goes to a file beside it.
        let err_path = dir.join("xrootd.err");
        let err = std::fs::File::create(&err_path)?;
        let child = cmd.stdout(Stdio::null()).stderr(err).spawn()?;
        let mut server = Xrootd { child, port };
        let log = || {
            let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
            format!("{}{}", read(&err_path), read(&log_path))
        };
        // Ready when its log says so for this port: a connection alone
        // may reach another program that holds the port.
        let (done, failed) = (
            format!(":{port} initialization completed"),
            format!(":{port} initialization failed"),
        );
        let until = Instant::now() + START_WAIT;
        loop {
            let text = log();
            if text.contains(&done) {
                break;
            }
            if let Some(status) = server.child.try_wait()? {
                return Ok(Err(format!("port {port}: {status}; {text}")));
            }
            if text.contains(&failed) {
                return Ok(Err(format!("port {port}: {text}")));
            }
            if Instant::now() > until {
                bail!("xrootd did not start on port {port} within {START_WAIT:?}: {text}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Ok(server))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_port_taken_before_xrootd_binds_it_is_said_and_another_is_tried() {
        let d = tempfile::tempdir().unwrap();
        // xrootd runs as nobody when started by root: it must reach both.
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let export = d.path().join("export");
        std::fs::create_dir(&export).unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let why = match Xrootd::start_on(d.path(), &export, port).unwrap() {
            Ok(_) => panic!("xrootd listens on a port another program holds"),
            Err(why) => why,
        };
        assert!(why.contains(&format!("port {port}")), "{why}");
        assert!(why.contains("already in use"), "{why}");
        // `start` takes a port of its own and serves.
        let server = Xrootd::start(d.path(), &export)
            .unwrap()
            .expect("installed");
        assert_ne!(server.port, port);
        std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    }
}
