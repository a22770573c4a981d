//! `macrolink bench files`: `macrolink cp` against a `macrolink serve` on
//! this host, beside `xrdcp` against an `xrootd` exporting the same
//! directory, and beside plain `cp` from the page cache; best of N runs of
//! each whole command, printed as ratios.

use anyhow::bail;
use macrolink_files::data::Pattern;
use macrolink_testbed::Peer;
use serde::Serialize;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::peers::xrootd::{self, Xrootd};
use crate::report;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Size of the file copied.
    pub size: u64,
    /// Runs of each command; the best counts.
    pub runs: usize,
    /// Streams of `macrolink cp`.
    pub streams: u32,
    /// Move macrolink's data over TCP, as between two hosts, instead of
    /// shared memory.
    pub no_shm: bool,
    /// Directory to work in (default: a new one in the system's temporary
    /// directory, removed afterwards).
    pub dir: Option<PathBuf>,
    /// Write the rows as JSON.
    pub json: Option<PathBuf>,
    /// Write the rows as CSV.
    pub csv: Option<PathBuf>,
}

/// One row: a copy done three ways.
#[derive(Clone, Debug, Serialize)]
pub struct FileRow {
    /// What was copied where.
    pub case: String,
    /// `macrolink cp`, MB/s.
    pub ours_mb_s: f64,
    /// `xrdcp`, MB/s, when xrootd is installed.
    pub xrdcp_mb_s: Option<f64>,
    /// `cp`, MB/s.
    pub cp_mb_s: f64,
    /// The processor time the host gave to others during the run each
    /// figure comes from (macrolink cp's, xrdcp's, cp's), ms; `None` where
    /// the machine does not count it (or xrdcp did not run).
    pub ours_host_ms: Option<u64>,
    /// As `ours_host_ms`, of xrdcp's best run.
    pub xrdcp_host_ms: Option<u64>,
    /// As `ours_host_ms`, of cp's best run.
    pub cp_host_ms: Option<u64>,
}

fn make_file(path: &Path, size: u64) -> anyhow::Result<()> {
    let mut f = File::create(path)?;
    let mut buf = vec![0u8; 4 << 20];
    let mut off = 0;
    while off < size {
        let n = (size - off).min(buf.len() as u64) as usize;
        Pattern::fill(&mut buf[..n], off);
        f.write_all(&buf[..n])?;
        off += n as u64;
    }
    Ok(())
}

fn warm(path: &Path) -> anyhow::Result<()> {
    std::io::copy(&mut File::open(path)?, &mut std::io::sink())?;
    Ok(())
}

fn chmod(path: &Path, mode: u32) -> anyhow::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// One copy, timed three ways.
struct Case<'a> {
    name: &'static str,
    /// The local side: the file an upload reads or a download writes.
    local: &'a Path,
    /// The file in the export.
    remote: &'a Path,
    upload: bool,
}

impl Case<'_> {
    /// (source, destination) of a copy between `remote` and `local` as one
    /// tool names them.
    fn ends<T>(&self, remote: T, local: T) -> (T, T) {
        if self.upload {
            (local, remote)
        } else {
            (remote, local)
        }
    }
}

/// A command to time, made anew for each run.
type Contender<'a> = Box<dyn Fn() -> Command + 'a>;

/// The best run of one command.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Best {
    /// Its time, s.
    secs: f64,
    /// What `steal` rose by across it (the host's share of the run).
    steal_ms: Option<u64>,
}

/// Best time of each command over `runs` rounds; each round runs every
/// command once, in turn (after `before`), so that a machine whose speed
/// drifts during the run slows all of them alike. `steal` is read before
/// and after each run (see [`crate::stalls::steal_ms`]).
fn best_of_rounds(
    runs: usize,
    before: impl Fn(),
    steal: impl Fn() -> Option<u64>,
    cmds: &[Contender<'_>],
) -> anyhow::Result<Vec<Best>> {
    let none = Best {
        secs: f64::INFINITY,
        steal_ms: None,
    };
    let mut best = vec![none; cmds.len()];
    for _ in 0..runs.max(1) {
        for (cmd, best) in cmds.iter().zip(&mut best) {
            before();
            let mut c = cmd();
            let stolen = steal();
            let t = Instant::now();
            let out = c.stdout(Stdio::null()).stderr(Stdio::piped()).output()?;
            let secs = t.elapsed().as_secs_f64();
            let stolen = stolen.zip(steal()).map(|(a, b)| b.saturating_sub(a));
            if !out.status.success() {
                bail!(
                    "{:?} failed: {}",
                    c.get_program(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            if secs < best.secs {
                *best = Best {
                    secs,
                    steal_ms: stolen,
                };
            }
        }
    }
    Ok(best)
}

/// Starts `macrolink serve` (the binary `exe`) exporting `root`.
fn start_serve(exe: &Path, root: &Path, secret: &str) -> anyhow::Result<Peer> {
    let mut c = Command::new(exe);
    // Every page of an upload kept cached, as xrootd and cp keep theirs.
    c.args(["serve", "--cache", "--listen", "127.0.0.1:0"])
        .arg(root)
        .env("MACROLINK_SECRET", secret);
    Peer::spawn_cmd(c)
}

/// Runs the comparison with `macrolink` processes started from `exe`, and
/// prints its table.
pub fn run(exe: &Path, a: &Options) -> anyhow::Result<()> {
    // A directory of its own goes at the end, or at a signal (`undo`).
    let scratch;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            scratch = macrolink_testbed::undo::scratch()?;
            scratch.path().to_path_buf()
        }
    };
    let (export, local) = (dir.join("export"), dir.join("local"));
    for d in [&export, &local] {
        std::fs::create_dir_all(d)?;
        // The xrootd server runs as nobody and writes into both.
        chmod(d, 0o777)?;
    }
    chmod(&dir, 0o755)?;
    eprintln!("making two files of {} bytes in {}", a.size, dir.display());
    let (src, up) = (export.join("src"), local.join("up"));
    make_file(&src, a.size)?;
    make_file(&up, a.size)?;
    chmod(&src, 0o644)?;
    chmod(&up, 0o644)?;
    warm(&src)?;
    warm(&up)?;

    let mut secret = [0u8; 16];
    getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("{e}"))?;
    let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let serve = start_serve(exe, &export, &secret)?;
    let addr = serve.tcp;
    let xrd = Xrootd::start(&local, &export)?;
    if xrd.is_none() {
        eprintln!(
            "xrootd not found (apt-get install {} {}): no xrdcp column",
            xrootd::SERVER.package,
            xrootd::CLIENT.package
        );
    }
    let ml = |args: &[&str]| {
        let mut c = Command::new(exe);
        // Every page of a download kept cached, as xrdcp and cp keep
        // theirs: the same writes as the peers'.
        c.args(["cp", "-q", "--cache", "--streams", &a.streams.to_string()])
            .args(args)
            .env("MACROLINK_SECRET", &secret);
        if a.no_shm {
            c.arg("--no-shm");
        }
        c
    };
    let cp = |from: &Path, to: &Path| {
        let mut c = Command::new("cp");
        c.arg(from).arg(to);
        c
    };
    let ml_url = |p: &str| format!("ml://{addr}/{p}");
    let xrd_url = |p: &Path| xrd.as_ref().map(|x| x.url(p));
    let runs = a.runs;
    let mut rows = Vec::new();
    let mb = |secs: f64| a.size as f64 / secs / 1e6;
    let null = Path::new("/dev/null");

    let dl = local.join("dl");
    let target = export.join("up");
    let cases = [
        Case {
            name: "download to /dev/null",
            local: null,
            remote: &src,
            upload: false,
        },
        Case {
            name: "download to a file",
            local: &dl,
            remote: &src,
            upload: false,
        },
        Case {
            name: "upload",
            local: &up,
            remote: &target,
            upload: true,
        },
    ];
    for case in &cases {
        eprintln!("{}", case.name);
        let name = case
            .remote
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        let (ours, local) = (ml_url(&name), case.local.display().to_string());
        let (from, to) = case.ends(ours, local.clone());
        let mut cmds: Vec<Contender<'_>> = vec![Box::new(|| ml(&[&from, &to]))];
        let xrd_remote = xrd_url(case.remote);
        if let Some(u) = &xrd_remote {
            let (f, t) = case.ends(u.clone(), local.clone());
            let streams = a.streams;
            cmds.push(Box::new(move || xrootd::xrdcp(&f, &t, streams)));
        }
        let (f, t) = case.ends(case.remote, case.local);
        cmds.push(Box::new(move || cp(f, t)));
        // Each run writes into a file system with nothing dirty left by the
        // last one, whose writeback would otherwise slow it at random.
        let written = if case.upload { case.remote } else { case.local };
        let remove = || {
            if written != null {
                let _ = std::fs::remove_file(written);
                let _ = Command::new("sync").arg("-f").arg(&dir).status();
            }
        };
        let best = best_of_rounds(runs, remove, crate::stalls::steal_ms, &cmds)?;
        let (ours, cp) = (best[0], best[best.len() - 1]);
        let xrdcp = xrd_remote.as_ref().map(|_| best[1]);
        rows.push(FileRow {
            case: case.name.into(),
            ours_mb_s: mb(ours.secs),
            xrdcp_mb_s: xrdcp.map(|b| mb(b.secs)),
            cp_mb_s: mb(cp.secs),
            ours_host_ms: ours.steal_ms,
            xrdcp_host_ms: xrdcp.and_then(|b| b.steal_ms),
            cp_host_ms: cp.steal_ms,
        });
    }

    drop(xrd);
    drop(serve);
    for f in [
        &src,
        &up,
        &target,
        &dl,
        &local.join("xrootd.cfg"),
        &local.join("xrootd.log"),
    ] {
        let _ = std::fs::remove_file(f);
    }
    print!("{}", table(&rows, !a.no_shm));
    println!(
        "{} bytes, best of {runs} rounds, each running every whole command once in turn; page cache warm; \
         macrolink cp and xrdcp each with {} data streams; every written page kept cached by all \
         three (macrolink cp --cache and serve --cache, as xrdcp and cp write); macrolink over {}",
        a.size,
        a.streams,
        if a.no_shm { "TCP" } else { "shared memory" }
    );
    if !a.no_shm {
        println!(
            "xrdcp has no shared-memory path: its ratio is not judged here; \
             run with --no-shm for the like-for-like (TCP) comparison"
        );
    }
    report::save(a.json.as_deref(), a.csv.as_deref(), &rows)?;
    Ok(())
}

/// The table, with ratios and targets; with `shm`, macrolink moved its
/// data through shared memory, which xrdcp cannot, and its ratio to xrdcp
/// is printed but not judged. Each row ends with what the host took
/// during the three runs its figures come from.
pub fn table(rows: &[FileRow], shm: bool) -> String {
    let mut s = format!(
        "{:<22} {:>10} {:>10} {:>7} {:>6} {:>10} {:>7} {:>6} {:>14}\n",
        "case", "ours MB/s", "xrdcp", "ratio", "≥1.0", "cp", "ratio", "≥0.9", "host ms"
    );
    let ms = |v: Option<u64>| v.map_or("n.a.".to_string(), |v| v.to_string());
    for r in rows {
        let (x, xr, xm) = match r.xrdcp_mb_s {
            Some(x) => {
                let q = r.ours_mb_s / x;
                let met = if shm { "-" } else { yes(q >= 1.0) };
                (format!("{x:.1}"), format!("{q:.2}"), met)
            }
            None => ("-".into(), "-".into(), "-"),
        };
        let q = r.ours_mb_s / r.cp_mb_s;
        let xrdcp_host = match r.xrdcp_mb_s {
            Some(_) => ms(r.xrdcp_host_ms),
            None => "-".into(),
        };
        let host = format!("{}/{}/{}", ms(r.ours_host_ms), xrdcp_host, ms(r.cp_host_ms));
        s += &format!(
            "{:<22} {:>10.1} {:>10} {:>7} {:>6} {:>10.1} {:>7.2} {:>6} {:>14}\n",
            r.case,
            r.ours_mb_s,
            x,
            xr,
            xm,
            r.cp_mb_s,
            q,
            yes(q >= 0.9),
            host
        );
    }
    s += HOST;
    s
}

/// What the `host ms` column holds.
const HOST: &str = "host ms: the processor time the machine's host gave to others (steal, \
summed over this machine's processors, in the kernel's 10 ms ticks) during the run each figure \
comes from, macrolink cp's / xrdcp's / cp's (the best of each); n.a. where the machine does \
not count it\n";

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn row(xrdcp: Option<f64>) -> FileRow {
        FileRow {
            case: "upload".into(),
            ours_mb_s: 900.0,
            xrdcp_mb_s: xrdcp,
            cp_mb_s: 1000.0,
            ours_host_ms: Some(20),
            xrdcp_host_ms: xrdcp.map(|_| 0),
            cp_host_ms: None,
        }
    }

    #[test]
    fn each_row_says_what_the_host_took_during_each_sides_figure() {
        let t = table(&[row(Some(450.0)), row(None)], false);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].ends_with("host ms"), "{t}");
        assert!(lines[1].ends_with(" 20/0/n.a."), "{t}");
        // No xrdcp run, no figure of its host time.
        assert!(lines[2].ends_with(" 20/-/n.a."), "{t}");
        assert!(lines[1].contains("2.00") && lines[1].contains("yes"), "{t}");
        assert!(t.contains("host ms: the processor time"), "{t}");
    }

    #[test]
    fn the_best_run_of_each_command_keeps_the_steal_of_that_run() {
        // A counter that rises by 10 across the first run of each command
        // and 30 across the others (two reads a run).
        let reads = Cell::new(0u64);
        let steal = || {
            let n = reads.get();
            reads.set(n + 1);
            let (run, after) = (n / 2, n % 2 == 1);
            let rose = if run < 2 { 10 } else { 30 };
            Some(run * 100 + if after { rose } else { 0 })
        };
        // In the first round the first command sleeps 0 s and the second
        // 0.3 s; in the second round the other way round.
        let round = Cell::new(0);
        let cmds: Vec<Contender<'_>> = vec![
            Box::new(|| {
                let mut c = Command::new("sleep");
                c.arg(if round.get() == 0 { "0" } else { "0.3" });
                c
            }),
            Box::new(|| {
                let mut c = Command::new("sleep");
                c.arg(if round.get() == 0 { "0.3" } else { "0" });
                round.set(round.get() + 1);
                c
            }),
        ];
        let best = best_of_rounds(2, || {}, steal, &cmds).unwrap();
        assert_eq!(best.len(), 2);
        // The first command was quickest in its first run (steal 10), the
        // second in its second (steal 30).
        assert_eq!(best[0].steal_ms, Some(10), "{best:?}");
        assert_eq!(best[1].steal_ms, Some(30), "{best:?}");
        assert!(best.iter().all(|b| b.secs < 0.3), "{best:?}");
        // A machine that does not count steal leaves it unknown.
        let best = best_of_rounds(1, || {}, || None, &cmds[..1]).unwrap();
        assert_eq!(best[0].steal_ms, None);
    }
}
