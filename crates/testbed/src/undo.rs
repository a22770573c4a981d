//! What a run made outside itself (network namespaces, directories),
//! undone also when the run is stopped by a signal, where no destructor
//! runs.
//!
//! ```text
//!   Namespaces::new / Testbed::build ──made──► MADE ◄──removed── their Drop
//!   scratch() ─────────────────────────made──►      ◄──removed── Scratch's Drop
//!
//!   SIGINT / SIGTERM / SIGHUP ──► on_signal's thread: kill this process's
//!       children and every process in MADE's namespaces, delete the
//!       namespaces and the directories, exit with 128 + the signal
//! ```
//!
//! A run that is not told to [`on_signal`] keeps the default: a signal
//! ends it where it is.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Thing {
    Netns(String),
    Dir(PathBuf),
}

static MADE: Mutex<Vec<Thing>> = Mutex::new(Vec::new());

fn made_list() -> MutexGuard<'static, Vec<Thing>> {
    // A panic elsewhere leaves the list as it was: still worth undoing.
    MADE.lock().unwrap_or_else(|p| p.into_inner())
}

fn made(t: Thing) {
    made_list().push(t);
}

fn removed(t: &Thing) {
    let mut list = made_list();
    if let Some(i) = list.iter().position(|x| x == t) {
        list.swap_remove(i);
    }
}

/// Namespace `name` is about to be made (listed before it exists, so that
/// a signal between the two still removes it).
pub(crate) fn made_netns(name: &str) {
    made(Thing::Netns(name.to_string()));
}

/// Namespace `name` has been deleted.
pub(crate) fn removed_netns(name: &str) {
    removed(&Thing::Netns(name.to_string()));
}

/// A temporary directory, removed when dropped, and by [`on_signal`]'s
/// handler if a signal stops the run first.
#[derive(Debug)]
pub struct Scratch {
    dir: tempfile::TempDir,
    _listed: Listed,
}

impl Scratch {
    /// Its path.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A new temporary directory, listed for [`on_signal`].
pub fn scratch() -> std::io::Result<Scratch> {
    listed(tempfile::tempdir()?)
}

/// A new temporary directory inside `parent`, listed for [`on_signal`].
pub fn scratch_in(parent: &Path) -> std::io::Result<Scratch> {
    listed(tempfile::tempdir_in(parent)?)
}

fn listed(dir: tempfile::TempDir) -> std::io::Result<Scratch> {
    let listed = Listed::new(Thing::Dir(dir.path().to_path_buf()));
    Ok(Scratch {
        dir,
        _listed: listed,
    })
}

/// A thing on the list while this lives.
#[derive(Debug)]
struct Listed(Thing);

impl Listed {
    fn new(t: Thing) -> Listed {
        made(t.clone());
        Listed(t)
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        removed(&self.0);
    }
}

/// From now on SIGINT, SIGTERM and SIGHUP undo what this process made
/// (its children killed, its namespaces with everything in them, its
/// directories) and end it with status 128 + the signal. Once per
/// process; later calls do nothing.
pub fn on_signal() -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    static ONCE: OnceLock<()> = OnceLock::new();
    if ONCE.get().is_some() {
        return Ok(());
    }
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    let _ = ONCE.set(());
    std::thread::Builder::new()
        .name("undo-on-signal".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let said = undo_all();
                eprintln!("stopped by signal {sig}: {said}");
                std::process::exit(128 + sig);
            }
        })?;
    Ok(())
}

/// Undoes everything listed, holding the list so that nothing is added
/// meanwhile; says what it did.
fn undo_all() -> String {
    let mut list = made_list();
    let mut killed = kill_children();
    let mut gone = Vec::new();
    for t in list.drain(..) {
        match t {
            Thing::Netns(ns) => {
                killed += kill_all(&pids_in(&ns));
                let _ = Command::new("ip").args(["netns", "del", &ns]).output();
                gone.push(ns);
            }
            Thing::Dir(d) => {
                let _ = std::fs::remove_dir_all(&d);
                gone.push(d.display().to_string());
            }
        }
    }
    // A child the main thread started meanwhile (its namespace now gone).
    killed += kill_children();
    format!("killed {killed} processes, removed {}", gone.join(" "))
}

/// Kills `pids` and reaps those that are this process's children (each
/// given at most a second); how many it signalled.
fn kill_all(pids: &[Pid]) -> usize {
    let signalled: Vec<Pid> = pids
        .iter()
        .copied()
        .filter(|&p| rustix::process::kill_process(p, Signal::KILL).is_ok())
        .collect();
    let by = Instant::now() + Duration::from_secs(1);
    for &p in &signalled {
        while Instant::now() < by {
            match rustix::process::waitpid(Some(p), WaitOptions::NOHANG) {
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                // Reaped, or not ours to reap (init reaps it).
                Ok(Some(_)) | Err(_) => break,
            }
        }
    }
    signalled.len()
}

fn kill_children() -> usize {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let children: Vec<Pid> = children_of(me)
        .into_iter()
        .filter_map(Pid::from_raw)
        .collect();
    kill_all(&children)
}

/// The processes in namespace `ns` (`ip netns pids`).
fn pids_in(ns: &str) -> Vec<Pid> {
    Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .map(|o| parse_pids(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default()
}

fn parse_pids(text: &str) -> Vec<Pid> {
    text.split_whitespace()
        .filter_map(|w| w.parse().ok())
        .filter_map(Pid::from_raw)
        .collect()
}

/// The processes whose parent is `parent`, from `/proc/*/stat`.
pub fn children_of(parent: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| parent_in_stat(&s))
                == Some(parent)
        })
        .collect()
}

/// The parent's pid in a `/proc/PID/stat` line: the second field after
/// the command name, which is in parentheses and may hold anything.
fn parent_in_stat(stat: &str) -> Option<i32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (a (b) c) S 17 4242 4242 0 -1 4194560 120 0 0 0";
        assert_eq!(parent_in_stat(stat), Some(17));
        assert_eq!(parent_in_stat("garbage"), None);
        assert_eq!(parent_in_stat("1 (x) S"), None);
    }

    #[test]
    fn pids_are_read_one_a_line_and_nothing_else() {
        let got: Vec<i32> = parse_pids("12\n 345\nnope\n0\n")
            .iter()
            .map(|p| p.as_raw_nonzero().get())
            .collect();
        assert_eq!(got, [12, 345]);
    }

    #[test]
    fn a_child_of_this_process_is_found_and_a_scratch_directory_is_listed_while_it_lives() {
        let mut c = Command::new("sleep").arg("10").spawn().unwrap();
        let found = children_of(std::process::id() as i32).contains(&(c.id() as i32));
        let _ = c.kill();
        let _ = c.wait();
        assert!(found);
        let s = scratch().unwrap();
        let d = s.path().to_path_buf();
        assert!(made_list().contains(&Thing::Dir(d.clone())));
        drop(s);
        assert!(!made_list().contains(&Thing::Dir(d.clone())) && !d.exists());
    }
}
