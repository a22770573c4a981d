//! The host processes `macrolink up` runs on this machine, and their
//! restart when the central manager resets one: the reset command `up`
//! gives the central manager (when the cluster file sets none) leaves the
//! host's name in a directory that a thread here watches; the host's
//! processes are then killed, as a power reset would, and started again.
//!
//! ```text
//!  central ── reset gw1 ──► touch DIR/gw1 ──► watcher: kill gw1's processes, start them again
//! ```

use anyhow::Context;
use macrolink_testbed::ready::Line;
use macrolink_testbed::Peer;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the watcher looks for resets.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// One process of a host, and how to start it again.
#[derive(Debug)]
struct Hosted {
    host: String,
    args: Vec<OsString>,
    /// It prints a ready line before it serves.
    ready: bool,
    running: Running,
}

#[derive(Debug)]
enum Running {
    Ready(Peer),
    Plain(Child),
    Gone,
}

impl Running {
    fn pid(&self) -> Option<u32> {
        match self {
            Running::Ready(p) => Some(p.pid()),
            Running::Plain(c) => Some(c.id()),
            Running::Gone => None,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Running::Plain(c) = self {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The host processes of one `up`; all killed when dropped.
#[derive(Debug)]
pub struct Hosts {
    exe: PathBuf,
    procs: Arc<Mutex<Vec<Hosted>>>,
    resets: PathBuf,
    stop: Arc<AtomicBool>,
    watcher: Option<std::thread::JoinHandle<()>>,
}

/// `s` quoted for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Hosts {
    /// Hosts run from binary `exe`; resets asked for in directory `resets`
    /// (made here).
    pub fn new(exe: &Path, resets: PathBuf) -> anyhow::Result<Hosts> {
        std::fs::create_dir_all(&resets)?;
        Ok(Hosts {
            exe: exe.to_path_buf(),
            procs: Arc::default(),
            resets,
            stop: Arc::default(),
            watcher: None,
        })
    }

    /// The reset command that restarts a host's processes here (the
    /// central manager puts the host's name, quoted, for `{host}`).
    pub fn reset_command(&self) -> String {
        format!(
            "touch {}/{{host}}",
            quote(&self.resets.display().to_string())
        )
    }

    /// Starts a process of host `host`: the binary with `args`; with
    /// `ready`, waits for its ready line and returns it.
    pub fn start(
        &self,
        host: &str,
        args: Vec<OsString>,
        ready: bool,
    ) -> anyhow::Result<Option<Line>> {
        let running = spawn(&self.exe, &args, ready).with_context(|| format!("starting {host}"))?;
        let line = match &running {
            Running::Ready(p) => Some(p.ready.clone()),
            _ => None,
        };
        lock(&self.procs).push(Hosted {
            host: host.to_string(),
            args,
            ready,
            running,
        });
        Ok(line)
    }

    /// From now on, restarts a host's processes when a reset asks for it.
    pub fn watch(&mut self) -> anyhow::Result<()> {
        let (exe, procs, dir, stop) = (
            self.exe.clone(),
            self.procs.clone(),
            self.resets.clone(),
            self.stop.clone(),
        );
        // The processes it starts end with this thread (their parent
        // death signal is the thread's): it lives as long as `up`.
        self.watcher = Some(
            std::thread::Builder::new()
                .name("ml-up-resets".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        for host in take_resets(&dir) {
                            restart(&exe, &procs, &host);
                        }
                        std::thread::sleep(LOOK_EVERY);
                    }
                })?,
        );
        Ok(())
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.watcher.take() {
            let _ = t.join();
        }
        lock(&self.procs).clear();
    }
}

fn lock(p: &Mutex<Vec<Hosted>>) -> std::sync::MutexGuard<'_, Vec<Hosted>> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

fn spawn(exe: &Path, args: &[OsString], ready: bool) -> anyhow::Result<Running> {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    Ok(if ready {
        Running::Ready(Peer::spawn_cmd(cmd)?)
    } else {
        Running::Plain(cmd.spawn()?)
    })
}

/// The hosts whose reset was asked for in `dir`, their requests removed.
fn take_resets(dir: &Path) -> Vec<String> {
    let Ok(d) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    d.flatten()
        .filter_map(|e| {
            let _ = std::fs::remove_file(e.path());
            e.file_name().into_string().ok()
        })
        .collect()
}

/// Kills every process of `host` and starts it again.
fn restart(exe: &Path, procs: &Mutex<Vec<Hosted>>, host: &str) {
    let mut procs = lock(procs);
    let mine: Vec<&mut Hosted> = procs.iter_mut().filter(|p| p.host == host).collect();
    if mine.is_empty() {
        eprintln!("{host}: reset asked for, but it is no host this `up` runs");
    }
    for p in mine {
        let old = p.running.pid();
        // Dropping it kills it.
        p.running = Running::Gone;
        match spawn(exe, &p.args, p.ready) {
            Ok(r) => {
                eprintln!(
                    "{host}: reset: process {} killed, started again as {}",
                    old.map_or("-".into(), |p| p.to_string()),
                    r.pid().unwrap_or_default()
                );
                p.running = r;
            }
            Err(e) => eprintln!("{host}: reset: could not start it again: {e:#}"),
        }
    }
}
