//! `macrolink cp` up and down through a lane of the testbed: the file
//! service on the storage host behind relaying gateways.

use anyhow::{bail, Context};
use macrolink_testbed::data::pattern;
use macrolink_testbed::netns::{qdisc_sent, Testbed, ECMP_ADDR, PORT};
use macrolink_testbed::Peer;
use std::path::Path;
use std::process::Command;

use super::held::watched;
use crate::stalls::Stalled;
use crate::stats::median_run;

/// What `cp` did through a lane of the testbed: each column's figures are
/// of its median run (of an even number of runs, the slower of the middle
/// two).
#[derive(Debug, Default)]
pub struct LaneCopy {
    /// Each column's rates, MB/s, in the order run (up, up with direct
    /// I/O, down, down keeping every page cached, down with direct I/O,
    /// down to `/dev/null`).
    pub runs: [Vec<f64>; 6],
    /// Upload, MB/s, as `cp` timed it.
    pub up: f64,
    /// The same upload written past the server's page cache (`cp
    /// --direct`), MB/s.
    pub up_direct: f64,
    /// Download, MB/s.
    pub down: f64,
    /// The same download with every page kept cached (`cp --cache`), MB/s.
    pub down_cached: f64,
    /// The same download written past the page cache (`cp --direct`),
    /// MB/s.
    pub down_direct: f64,
    /// The same download into `/dev/null`: the lane and cp without a file
    /// system, MB/s.
    pub down_null: f64,
    /// Chunks each gateway carried (by node): up, up with direct I/O,
    /// down, down keeping every page cached, down with direct I/O, down to
    /// `/dev/null`.
    pub carried: [Vec<(u32, u64)>; 6],
    /// What held each copy back, as cp saw it (its `held back by:` line:
    /// the sender's chunks sent again and gateways taken out of use up,
    /// the receiver's chunks that came twice down, and the longest stall).
    pub held: [String; 6],
    /// Retransmission timeouts of the testbed's kernels during each copy.
    pub tcp_timeouts: [u64; 6],
    /// What a probe saw of the machine during each copy.
    pub machine: [Stalled; 6],
    /// Bytes each gateway's first storage-side link sent during the first
    /// upload.
    pub link_bytes: Vec<u64>,
    /// The same bytes written from memory to a file beside cp's, in 1 MiB
    /// writes, after the copies (each of them and this run after a sync),
    /// through the page cache, MB/s.
    pub fs_write: f64,
    /// The same, written as cp writes by default (uncached past the
    /// file's head), MB/s.
    pub fs_write_uncached: f64,
    /// Bytes of the source that the storage host's page cache held as
    /// each download began (by `fincore`).
    pub source_cached: [u64; 4],
}

/// One copy of a column.
#[derive(Debug, Default)]
struct Once {
    rate: f64,
    carried: Vec<(u32, u64)>,
    held: String,
    tcp_timeouts: u64,
    machine: Stalled,
    /// Of a download: the bytes of its source cached as it began.
    source_cached: u64,
}

/// Writes `data` to a new file `path` in 1 MiB writes (as cp's receiver
/// does, without a sync), through the page cache or, with `uncached`, as
/// cp writes by default; MB/s.
fn write_rate(path: &Path, data: &[u8], uncached: bool) -> anyhow::Result<f64> {
    use macrolink_files::data::Sink;
    let t = std::time::Instant::now();
    let f = std::fs::File::create(path)?;
    let u = macrolink_files::uncached::Uncached::new(&f);
    let sink: &dyn Sink = if uncached { &u } else { &f };
    for (i, c) in data.chunks(1 << 20).enumerate() {
        sink.write_at(c, (i << 20) as u64)?;
    }
    drop(f);
    Ok(data.len() as f64 / t.elapsed().as_secs_f64() / 1e6)
}

/// Reads `path` through the page cache and drops the bytes, leaving its
/// pages cached.
fn warm(path: &Path) -> anyhow::Result<()> {
    let mut f = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    std::io::copy(&mut f, &mut std::io::sink())?;
    Ok(())
}

/// The type of the file system that holds `dir`, as its mount names it
/// (`findmnt`); else as `stat -f` does, which tells ext2, ext3 and ext4
/// apart by no more than their shared magic number ("ext2/ext3").
pub(super) fn fs_type(dir: &Path) -> String {
    let ask = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .arg(dir)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|t| !t.is_empty())
    };
    ask("findmnt", &["-n", "-f", "-o", "FSTYPE", "--target"])
        .or_else(|| ask("stat", &["-f", "-c", "%T"]))
        .unwrap_or_else(|| "unknown".into())
}

/// What cp's summary says of a copy through a lane.
struct Copied {
    /// MB/s.
    rate: f64,
    /// Chunks each gateway carried, by node.
    per: Vec<(u32, u64)>,
    /// Its `held back by:` words (`n.a.` when it printed none).
    held: String,
}

fn copied(stderr: &str) -> anyhow::Result<Copied> {
    let rate = stderr
        .lines()
        .find_map(|l| l.split_once(" MB/s)").map(|(a, _)| a))
        .and_then(|a| a.rsplit_once('(').map(|(_, r)| r))
        .and_then(|r| r.parse().ok())
        .with_context(|| format!("cp printed no rate: {stderr}"))?;
    let per = stderr
        .lines()
        .find_map(|l| l.strip_prefix("chunks through gateways: "))
        .map(|l| {
            l.split(", ")
                .filter_map(|p| {
                    let (g, n) = p.strip_prefix("node ")?.split_once(": ")?;
                    Some((g.parse().ok()?, n.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    let held = stderr
        .lines()
        .find_map(|l| l.strip_prefix("held back by: "))
        .unwrap_or("n.a.")
        .to_string();
    Ok(Copied { rate, per, held })
}

/// The file service of the storage host (its node 10, which also takes
/// striped transfers) behind `n` relaying gateways: `cp` of `mib` MiB up and
/// back down from the compute host, with a cluster file naming the lane,
/// in `runs` rounds of every column's copy in turn. The contact connection
/// goes by the kernel's routes (set up here); the data through the relays.
/// Every copy is compared with the source. The files live in a new
/// directory inside `parent` (the system's temporary directory when
/// `None`).
pub fn files_through(
    exe: &Path,
    tb: &Testbed,
    n: usize,
    mib: usize,
    runs: usize,
    parent: Option<&Path>,
) -> anyhow::Result<LaneCopy> {
    tb.kernel_ecmp().map_err(anyhow::Error::msg)?;
    let dir = match parent {
        Some(p) => macrolink_testbed::undo::scratch_in(p)?,
        None => macrolink_testbed::undo::scratch()?,
    };
    let export = dir.path().join("export");
    std::fs::create_dir(&export)?;
    let secret = "gateway testbed secret, long enough";
    // The gateways prove the same key to the server's fabric node.
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, secret)?;
    let files = format!("{ECMP_ADDR}:7130");
    let mut serve = Command::new("ip");
    serve
        .args(["netns", "exec", &tb.storage()])
        .arg(exe)
        .arg("serve")
        .arg(&export)
        .args(["--listen", &files, "--node", "10", "--sink"])
        .args(["--fabric", &format!("0.0.0.0:{PORT}")])
        .arg("--shm-dir")
        .arg(dir.path().join("shm-storage"))
        .env("MACROLINK_SECRET", secret);
    let _server = Peer::spawn_cmd(serve)?;
    let mut gateways = Vec::new();
    let mut hosts = String::new();
    for i in 0..n {
        let node = tb.gateway_node(i);
        let mut args = tb.gateway_args(i);
        args.extend(["--secret-file".into(), secret_file.display().to_string()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        gateways.push(tb.spawn(exe, &tb.gateway(i), "gateway", node, &args, dir.path())?);
        hosts.push_str(&format!(
            "[[host]]\nname = \"gw{i}\"\nrole = \"gateway\"\nnode = {node}\nfabric = \"{}\"\n",
            tb.gateway_addr(i)
        ));
    }
    let names: Vec<String> = (0..n).map(|i| format!("\"gw{i}\"")).collect();
    let cluster = dir.path().join("cluster.toml");
    std::fs::write(
        &cluster,
        format!(
            "{hosts}[[host]]\nname = \"store0\"\nrole = \"storage\"\nnode = 10\n\
             storage = \"{}\"\nfiles = \"{files}\"\n\
             [[lane]]\ngateways = [{}]\nstorage = [\"store0\"]\n",
            tb.storage_addrs(0)[0],
            names.join(", ")
        ),
    )?;
    let data = pattern(mib << 20, 0);
    let src = dir.path().join("src");
    std::fs::write(&src, &data)?;
    let back = dir.path().join("back");
    let cached = dir.path().join("cached");
    let direct = dir.path().join("direct");
    let links = || -> anyhow::Result<Vec<u64>> {
        (0..n)
            .map(|i| qdisc_sent(&tb.gateway(i), &tb.storage_link(i, 0)))
            .collect()
    };
    let mut out = LaneCopy::default();
    let before = links()?;
    let f = "ml://store0/f".to_string();
    let copies: [(String, String, Option<&str>); 6] = [
        (src.display().to_string(), f.clone(), None),
        (
            src.display().to_string(),
            "ml://store0/g".to_string(),
            Some("--direct"),
        ),
        (f.clone(), back.display().to_string(), None),
        (f.clone(), cached.display().to_string(), Some("--cache")),
        (f.clone(), direct.display().to_string(), Some("--direct")),
        (f, "/dev/null".to_string(), None),
    ];
    let mut done: [Vec<Once>; 6] = Default::default();
    for round in 0..runs.max(1) {
        if round > 0 {
            // Each round writes new files, as the first does.
            for f in [
                &export.join("f"),
                &export.join("g"),
                &back,
                &cached,
                &direct,
            ] {
                std::fs::remove_file(f).with_context(|| f.display().to_string())?;
            }
        }
        for (k, (from, to, how)) in copies.iter().enumerate() {
            // Each copy starts with the file system idle: the one before
            // it written back first (else a copy past the page cache
            // waited on its predecessor's write-back: 0.88-0.92 of four
            // links, against 0.96-0.97 after a sync).
            rustix::fs::sync();
            let mut once = Once::default();
            if k >= 2 {
                // Every download reads a source the storage host holds in
                // its page cache, so that the down columns differ only in
                // how cp writes: the upload left `f` cached only for its
                // first `HEAD` bytes, and the first download would else
                // read the rest from the disk and leave it cached for the
                // others.
                let source = export.join("f");
                warm(&source)?;
                once.source_cached =
                    macrolink_testbed::pages::cached_bytes(&source).map_err(anyhow::Error::msg)?;
            }
            let (o, beside) = watched(tb, || {
                Ok(Command::new("ip")
                    .args(["netns", "exec", &tb.compute()])
                    .arg(exe)
                    .arg("cp")
                    .arg(from)
                    .arg(to)
                    .args(how)
                    .arg("--cluster")
                    .arg(&cluster)
                    .arg("--shm-dir")
                    .arg(dir.path().join("shm-compute"))
                    .env("MACROLINK_SECRET", secret)
                    .output()?)
            })?;
            let err = String::from_utf8_lossy(&o.stderr);
            if !o.status.success() {
                bail!("cp {from} {to}: {err}");
            }
            let Copied { rate, per, held } = copied(&err)?;
            if (round, k) == (0, 0) {
                out.link_bytes = links()?.iter().zip(&before).map(|(a, b)| a - b).collect();
            }
            (once.rate, once.carried, once.held) = (rate, per, held);
            (once.tcp_timeouts, once.machine) = (beside.tcp_timeouts, beside.machine);
            done[k].push(once);
        }
        // Every copy of this round has its source's bytes.
        for (name, file) in [
            ("up", &export.join("f")),
            ("up --direct", &export.join("g")),
        ]
        .into_iter()
        .chain([
            ("down", &back),
            ("down --cache", &cached),
            ("down --direct", &direct),
        ]) {
            if std::fs::read(file)? != data {
                bail!(
                    "cp {name} through the lane (round {}) differs from its source",
                    round + 1
                );
            }
        }
    }
    let mut rates = [0.0; 6];
    for (k, runs) in done.into_iter().enumerate() {
        out.runs[k] = runs.iter().map(|o| o.rate).collect();
        let Some(m) = median_run(&out.runs[k]) else {
            continue;
        };
        let Some(once) = runs.into_iter().nth(m) else {
            continue;
        };
        rates[k] = once.rate;
        out.carried[k] = once.carried;
        out.held[k] = once.held;
        out.tcp_timeouts[k] = once.tcp_timeouts;
        out.machine[k] = once.machine;
        if k >= 2 {
            out.source_cached[k - 2] = once.source_cached;
        }
    }
    [
        out.up,
        out.up_direct,
        out.down,
        out.down_cached,
        out.down_direct,
        out.down_null,
    ] = rates;
    rustix::fs::sync();
    out.fs_write = write_rate(&dir.path().join("local"), &data, false)?;
    rustix::fs::sync();
    out.fs_write_uncached = write_rate(&dir.path().join("local-uncached"), &data, true)?;
    Ok(out)
}

/// The cp columns, in the order of [`LaneCopy`]'s copies.
pub(super) const CP_COLUMNS: [&str; 6] = [
    "up",
    "up --direct",
    "down",
    "down --cache",
    "down --direct",
    "down /dev/null",
];

/// cp's `held back by:` words in the held table's shorthand: the figures
/// with slashes between, the stall in ms.
pub(super) fn terse(held: &str) -> String {
    let figures: Vec<&str> = held
        .split(", ")
        .filter_map(|part| part.split_whitespace().find(|w| w.parse::<f64>().is_ok()))
        .collect();
    if figures.is_empty() {
        return held.to_string();
    }
    format!("{} ms", figures.join(" / "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use macrolink_files::copy::CopyReport;
    use macrolink_files::lane::Carried;
    use std::time::Duration;

    #[test]
    fn the_tables_read_what_cp_prints() {
        for sender in [true, false] {
            let report = CopyReport {
                files: 1,
                bytes: 4 << 20,
                secs: 0.5,
                through: vec![(21, 3), (22, 2)],
                held: Some(Carried {
                    sender,
                    resent: 3,
                    duplicates: 2,
                    failovers: 1,
                    longest_stall: Duration::from_micros(1_035_000),
                    ..Carried::default()
                }),
                ..CopyReport::default()
            };
            let Copied { rate, per, held } = copied(&format!("copying ...\n{report}\n")).unwrap();
            assert!((rate - 8.4).abs() < 1e-9, "{rate}");
            assert_eq!(per, [(21, 3), (22, 2)]);
            let want = if sender {
                "3 / 1 / 1035.0 ms"
            } else {
                "2 / 1035.0 ms"
            };
            assert_eq!(terse(&held), want, "{held}");
        }
        let none = copied("1 file, 5 bytes in 1.00 s (0.0 MB/s)").unwrap();
        assert_eq!(terse(&none.held), "n.a.");
    }
}
