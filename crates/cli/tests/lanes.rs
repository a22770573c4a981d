//! The file service through gateway processes: a cluster file puts a lane
//! of two gateways between `cp` and the storage host, file data goes as
//! chunks striped over both, in both directions, and a gateway killed
//! mid-copy loses nothing.

use macrolink_testbed::data::pattern;
use macrolink_testbed::Peer;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");

/// A storage host serving an export on node 10, two gateways, and the
/// cluster file that names them; with management, a central manager
/// (host `boss`) that gateways and storage host obey.
struct Site {
    dir: tempfile::TempDir,
    gateways: Vec<Peer>,
    _server: Peer,
    central: Option<Child>,
    /// Where the server, gw0 and gw1 serve their metrics (managed sites).
    metrics: Vec<std::net::SocketAddr>,
}

impl Drop for Site {
    fn drop(&mut self) {
        if let Some(mut c) = self.central.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The management part of a cluster file: gw0 (node 21), gw1 (22) and
/// store0 (10) in one macro-cluster, `boss` its central manager, each on a
/// port of its own.
fn management() -> String {
    let port = || {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    format!(
        "[[host]]\nname = \"boss\"\nrole = \"compute\"\nnode = 1\nfabric = \"127.0.0.1:1\"\n\
         manage = \"{}\"\n\n\
         [[macro]]\nname = \"m0\"\nhosts = [\"gw0\", \"gw1\", \"store0\"]\n\
         manager = \"gw0\"\nfallback = \"gw1\"\n\n\
         [manage]\ncentral = \"boss\"\n",
        port()
    ) + &format!("@gw0={}\n@gw1={}\n@store0={}\n", port(), port(), port())
}

/// `manage = "..."` of host `name` in `management`.
fn manage_line(management: &str, name: &str) -> String {
    let at = management
        .lines()
        .find_map(|l| l.strip_prefix(&format!("@{name}=")))
        .unwrap();
    format!("manage = \"{at}\"\n")
}

/// `management` without its own notes, for a file.
fn management_tables(management: &str) -> String {
    management
        .lines()
        .filter(|l| !l.starts_with('@'))
        .map(|l| format!("{l}\n"))
        .collect()
}

impl Site {
    fn new() -> Site {
        Site::with(None)
    }

    /// With a central manager, its state kept in the site's directory.
    fn managed() -> Site {
        Site::with(Some(management()))
    }

    fn with(management: Option<String>) -> Site {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("export")).unwrap();
        std::fs::write(dir.path().join("secret"), "lanes-test-secret-0123456789").unwrap();
        let m = management.as_deref();
        let manage_of = |name: &str| m.map(|m| manage_line(m, name)).unwrap_or_default();
        let tables = m.map(management_tables).unwrap_or_default();
        // What the server and the central manager read: the hosts by node
        // id (their fabric addresses are not known yet, nor needed).
        let manage_file = dir.path().join("manage.toml");
        if m.is_some() {
            let hosts: String = [("gw0", "gateway", 21), ("gw1", "gateway", 22)]
                .iter()
                .map(|(n, role, id)| {
                    format!(
                        "[[host]]\nname = \"{n}\"\nrole = \"{role}\"\nnode = {id}\n\
                         fabric = \"127.0.0.1:1\"\n{}\n",
                        manage_of(n)
                    )
                })
                .collect();
            let store = format!(
                "[[host]]\nname = \"store0\"\nrole = \"storage\"\nnode = 10\n\
                 storage = \"127.0.0.1:1\"\n{}\n",
                manage_of("store0")
            );
            std::fs::write(&manage_file, hosts + &store + &tables).unwrap();
        }
        let metrics: Vec<std::net::SocketAddr> = match m {
            Some(_) => (0..3)
                .map(|_| {
                    std::net::TcpListener::bind("127.0.0.1:0")
                        .unwrap()
                        .local_addr()
                        .unwrap()
                })
                .collect(),
            None => Vec::new(),
        };
        let with_metrics = |i: usize| match metrics.get(i) {
            Some(a) => vec!["--metrics".to_string(), a.to_string()],
            None => Vec::new(),
        };
        let mut c = Command::new(EXE);
        c.args(["serve", "--listen", "127.0.0.1:0", "--node", "10"])
            .args(with_metrics(0))
            .args(["--fabric", "127.0.0.1:0", "--sink", "--shm-dir"])
            .arg(dir.path())
            .arg("--secret-file")
            .arg(dir.path().join("secret"));
        if m.is_some() {
            c.arg("--cluster").arg(&manage_file);
        }
        c.arg(dir.path().join("export"));
        let server = Peer::spawn_cmd(c).expect("server starts");
        let fabric = server.fabric.expect("the server names its fabric address");
        let gateways: Vec<Peer> = (0..2)
            .map(|i| {
                let peer = format!("10={fabric}");
                let secret = dir.path().join("secret");
                let secret = secret.to_str().unwrap();
                let more = with_metrics(1 + i as usize);
                let mut extra = vec!["--peer", &peer, "--secret-file", secret];
                extra.extend(more.iter().map(String::as_str));
                Peer::spawn_role(Path::new(EXE), "gateway", 21 + i, dir.path(), &extra)
                    .expect("gateway starts")
            })
            .collect();
        let cluster = format!(
            r#"
[[host]]
name = "gw0"
role = "gateway"
node = 21
fabric = "{}"
{}
[[host]]
name = "gw1"
role = "gateway"
node = 22
fabric = "{}"
{}
[[host]]
name = "store0"
role = "storage"
node = 10
storage = "{fabric}"
files = "{}"
{}
[[lane]]
gateways = ["gw0", "gw1"]
storage = ["store0"]

{tables}"#,
            gateways[0].tcp,
            manage_of("gw0"),
            gateways[1].tcp,
            manage_of("gw1"),
            server.tcp,
            manage_of("store0"),
        );
        std::fs::write(dir.path().join("cluster.toml"), cluster).unwrap();
        let central = m.map(|_| {
            Command::new(EXE)
                .args(["manage", "run"])
                .arg(&manage_file)
                .args(["--host", "boss", "--state-dir"])
                .arg(dir.path().join("state"))
                .arg("--secret-file")
                .arg(dir.path().join("secret"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        });
        Site {
            dir,
            gateways,
            _server: server,
            central,
            metrics,
        }
    }

    /// `macrolink manage ARGS` against the site's central manager.
    fn manage(&self, args: &[&str]) -> Output {
        Command::new(EXE)
            .arg("manage")
            .arg(args[0])
            .arg(self.dir.path().join("manage.toml"))
            .args(&args[1..])
            .arg("--secret-file")
            .arg(self.dir.path().join("secret"))
            .output()
            .unwrap()
    }

    fn export(&self, name: &str) -> PathBuf {
        self.dir.path().join("export").join(name)
    }

    fn local(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn cp(&self, args: &[&str]) -> Command {
        let mut c = Command::new(EXE);
        c.arg("cp")
            .arg("--cluster")
            .arg(self.dir.path().join("cluster.toml"))
            .arg("--secret-file")
            .arg(self.dir.path().join("secret"))
            .arg("--shm-dir")
            .arg(self.dir.path())
            .args(args)
            .stderr(Stdio::piped());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cp(args).output().unwrap()
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Chunks each gateway carried, from `cp`'s summary.
fn carried(o: &Output) -> Vec<(u32, u64)> {
    let text = stderr(o);
    let Some(line) = text
        .lines()
        .find_map(|l| l.strip_prefix("chunks through gateways: "))
    else {
        return Vec::new();
    };
    line.split(", ")
        .map(|p| {
            let (gw, n) = p.trim_start_matches("node ").split_once(": ").unwrap();
            (gw.parse().unwrap(), n.parse().unwrap())
        })
        .collect()
}

/// The figures of `cp`'s `held back by:` line, in order (counts, then the
/// longest stall in ms).
fn held(o: &Output) -> Vec<f64> {
    let text = stderr(o);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("held back by: "))
        .unwrap_or_else(|| panic!("no held line: {text}"));
    line.split(", ")
        .map(|part| {
            part.split_whitespace()
                .find_map(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("no figure in {part:?}"))
        })
        .collect()
}

fn wait_for_bytes(path: &Path, min: u64) {
    let until = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(path).map_or(0, |m| m.len()) < min {
        assert!(Instant::now() < until, "{} never grew", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until the file at `path` begins with `prefix`.
fn wait_for_prefix(path: &Path, prefix: &[u8]) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let mut head = vec![0; prefix.len()];
        let got = std::fs::File::open(path).and_then(|f| {
            use std::os::unix::fs::FileExt;
            f.read_exact_at(&mut head, 0)
        });
        if got.is_ok() && head == prefix {
            return;
        }
        assert!(
            Instant::now() < until,
            "{} never began with the data",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn finish(c: Child) -> Output {
    c.wait_with_output().unwrap()
}

#[test]
fn files_go_up_and_down_through_both_gateways_of_the_lane() {
    let site = Site::new();
    for (i, size) in [0usize, 1, 4095, (1 << 20) + 1, 24 << 20]
        .into_iter()
        .enumerate()
    {
        let data = pattern(size, i as u64 + 7);
        let name = format!("f{i}");
        std::fs::write(site.local(&name), &data).unwrap();
        let url = format!("ml://store0/{name}");
        let local = site.local(&name);
        let up = site.run(&["--chunk", "256KiB", local.to_str().unwrap(), &url]);
        assert!(up.status.success(), "upload of {size}: {}", stderr(&up));
        assert!(std::fs::read(site.export(&name)).unwrap() == data, "{size}");
        let back = site.local(&format!("{name}.back"));
        let down = site.run(&["--chunk", "256KiB", &url, back.to_str().unwrap()]);
        assert!(
            down.status.success(),
            "download of {size}: {}",
            stderr(&down)
        );
        assert!(std::fs::read(&back).unwrap() == data, "{size}");
        if size >= 1 << 20 {
            for o in [&up, &down] {
                let per = carried(o);
                let total: u64 = per.iter().map(|(_, n)| n).sum();
                assert_eq!(total, (size as u64).div_ceil(256 << 10), "{per:?}");
                assert!(
                    per.len() == 2 && per.iter().all(|(_, n)| *n > 0),
                    "both gateways carry chunks: {per:?}"
                );
            }
        }
    }
}

#[test]
fn a_gateway_killed_mid_copy_loses_nothing_either_way() {
    let mut site = Site::new();
    let size = 48usize << 20;
    let data = pattern(size, 3);
    std::fs::write(site.export("big"), &data).unwrap();
    // Down, with the first gateway killed a third of the way.
    let back = site.local("big.back");
    let child = site
        .cp(&[
            "--limit-rate",
            "24MB",
            "ml://store0/big",
            back.to_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    wait_for_bytes(&site.local(".big.back.ml-part"), size as u64 / 3);
    site.gateways[0].kill();
    let down = finish(child);
    assert!(down.status.success(), "{}", stderr(&down));
    assert!(std::fs::read(&back).unwrap() == data);
    // cp, the receiver, says what it saw: chunks that came twice and the
    // longest time between two placed.
    assert!(
        stderr(&down).contains("held back by: chunks that came twice: "),
        "{}",
        stderr(&down)
    );
    assert_eq!(held(&down).len(), 2, "{}", stderr(&down));
    // Up through the one left, while the first is still dead.
    let up = site.run(&[back.to_str().unwrap(), "ml://store0/big.up"]);
    assert!(up.status.success(), "{}", stderr(&up));
    assert!(std::fs::read(site.export("big.up")).unwrap() == data);
    let per = carried(&up);
    assert!(
        per.iter().all(|(gw, n)| *gw == 22 || *n == 0),
        "only the live gateway carries: {per:?}"
    );
}

#[test]
fn a_gateway_killed_mid_upload_loses_nothing() {
    let mut site = Site::new();
    let size = 48usize << 20;
    let data = pattern(size, 5);
    let src = site.local("up");
    std::fs::write(&src, &data).unwrap();
    let child = site
        .cp(&[
            "--limit-rate",
            "24MB",
            src.to_str().unwrap(),
            "ml://store0/up",
        ])
        .spawn()
        .unwrap();
    wait_for_bytes(&site.export(".up.ml-part"), size as u64 / 3);
    site.gateways[1].kill();
    let up = finish(child);
    assert!(up.status.success(), "{}", stderr(&up));
    assert!(std::fs::read(site.export("up")).unwrap() == data);
    // cp, the sender, says what the loss cost: the gateway taken out of
    // use, and a stall.
    let text = stderr(&up);
    assert!(
        text.contains("held back by: chunks sent again: ") && text.contains(", failovers: "),
        "{text}"
    );
    let [_, failovers, stall] = held(&up)[..] else {
        panic!("{text}")
    };
    assert!(failovers >= 1.0 && stall > 0.0, "{text}");
}

#[test]
fn a_killed_download_through_the_lane_resumes() {
    let site = Site::new();
    let size = 32usize << 20;
    let data = pattern(size, 11);
    std::fs::write(site.export("r"), &data).unwrap();
    let back = site.local("r.back");
    let mut child = site
        .cp(&[
            "--limit-rate",
            "8MB",
            "ml://store0/r",
            back.to_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    // Chunks land out of order, over two streams: wait for a prefix that is
    // really there, not only for a length.
    wait_for_prefix(&site.local(".r.back.ml-part"), &data[..size / 4]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(!back.exists(), "no final name before the copy completes");
    let done = site.run(&["--resume", "ml://store0/r", back.to_str().unwrap()]);
    assert!(done.status.success(), "{}", stderr(&done));
    assert!(stderr(&done).contains("bytes resumed"), "{}", stderr(&done));
    assert!(std::fs::read(&back).unwrap() == data);
}

#[test]
fn iobench_through_the_lane_adds_up() {
    let site = Site::new();
    std::fs::create_dir(site.export("io")).unwrap();
    let json = site.local("io.json");
    let out = Command::new(EXE)
        .args(["iobench", "ml://store0/io", "--workers", "2"])
        .args(["--sizes", "64KiB,1MiB", "--file-size", "2MiB"])
        .arg("--json")
        .arg(&json)
        .arg("--cluster")
        .arg(site.dir.path().join("cluster.toml"))
        .arg("--secret-file")
        .arg(site.dir.path().join("secret"))
        .arg("--shm-dir")
        .arg(site.dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // Write and read, N-to-N and N-to-1, two sizes (no random writes on an
    // export).
    assert_eq!(rows.len(), 2 * 2 * 2, "{rows:#?}");
    for r in &rows {
        assert_eq!(r["bytes"].as_u64().unwrap(), 2 * (2 << 20), "{r}");
        assert!(r["effective_mb_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    let left = std::fs::read_dir(site.export("io")).unwrap().count();
    assert_eq!(left, 0, "iobench leaves nothing behind");
}

/// Uploads `src` as `name0`, `name1`, ... until `done` accepts `cp`'s
/// output, for at most ten seconds (an exclusion reaches the server within
/// a watch period); the output and the name of the last.
fn cp_until(
    site: &Site,
    src: &Path,
    name: &str,
    done: impl Fn(&Output) -> bool,
) -> (Output, String) {
    let until = Instant::now() + Duration::from_secs(10);
    for i in 0.. {
        let to = format!("{name}{i}");
        let out = site.run(&[src.to_str().unwrap(), &format!("ml://store0/{to}")]);
        if done(&out) || Instant::now() > until {
            return (out, to);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    unreachable!()
}

#[test]
fn an_excluded_gateway_carries_nothing_more_and_an_excluded_storage_host_takes_no_new_work() {
    let site = Site::managed();
    let size = 48usize << 20;
    let data = pattern(size, 13);
    let src = site.local("ex");
    std::fs::write(&src, &data).unwrap();
    // The central manager answers before anything is asked of it.
    let until = Instant::now() + Duration::from_secs(10);
    while !site.manage(&["status"]).status.success() {
        assert!(Instant::now() < until, "the central manager never answered");
        std::thread::sleep(Duration::from_millis(100));
    }
    // An upload paced to two seconds; gw0 excluded a quarter of the way.
    let mut child = site
        .cp(&[
            "--limit-rate",
            "24MB",
            "--chunk",
            "256KiB",
            src.to_str().unwrap(),
            "ml://store0/ex",
        ])
        .spawn()
        .unwrap();
    wait_for_bytes(&site.export(".ex.ml-part"), size as u64 / 4);
    let ex = site.manage(&["exclude", "gw0", "--reason", "bad cable"]);
    assert!(
        ex.status.success(),
        "{}",
        String::from_utf8_lossy(&ex.stderr)
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "the upload ended before gw0 was excluded: nothing was tested"
    );
    let up = finish(child);
    assert!(up.status.success(), "{}", stderr(&up));
    assert!(std::fs::read(site.export("ex")).unwrap() == data);
    let per = carried(&up);
    let of = |gw: u32| per.iter().find(|p| p.0 == gw).map_or(0, |p| p.1);
    let total = (size as u64).div_ceil(256 << 10);
    assert!(
        of(21) > 0 && of(21) < total / 2 && of(21) + of(22) >= total,
        "gw0 carried until it was excluded, gw1 the rest: {per:?}"
    );
    // New transfers, both ways, leave gw0 out from the start.
    let back = site.local("ex.back");
    for args in [
        [src.to_str().unwrap(), "ml://store0/ex2"],
        ["ml://store0/ex", back.to_str().unwrap()],
    ] {
        let o = site.run(&["--chunk", "256KiB", args[0], args[1]]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(carried(&o), [(22, total)], "{args:?}");
    }
    assert!(std::fs::read(&back).unwrap() == data);
    // What the server and the gateways counted.
    let scrape = |i: usize| macrolink_metrics::get(site.metrics[i], "/metrics").unwrap();
    let value = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name}: {text}"))
    };
    let files = scrape(0);
    assert_eq!(
        value(&files, r#"macrolink_files_files_total{op="put"} "#),
        2,
        "{files}"
    );
    assert_eq!(
        value(&files, r#"macrolink_files_files_total{op="get"} "#),
        1,
        "{files}"
    );
    assert_eq!(
        value(&files, r#"macrolink_files_bytes_total{op="get"} "#),
        size as u64
    );
    assert_eq!(
        value(&files, "macrolink_files_gateways_in_use "),
        1,
        "{files}"
    );
    let (gw0, gw1) = (scrape(1), scrape(2));
    let chunks = r#"macrolink_gateway_relayed_total{kind="chunk"} "#;
    assert_eq!(value(&gw0, chunks), of(21), "{gw0}");
    assert!(value(&gw1, chunks) >= of(22) + 2 * total, "{gw1}");
    // The storage host excluded: refused with a clear error, nothing written.
    let ex = site.manage(&["exclude", "store0", "--reason", "disk errors"]);
    assert!(
        ex.status.success(),
        "{}",
        String::from_utf8_lossy(&ex.stderr)
    );
    let (refused, no) = cp_until(&site, &src, "no", |o| !o.status.success());
    assert_eq!(refused.status.code(), Some(4), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("excluded by the cluster's central manager"),
        "{}",
        stderr(&refused)
    );
    assert!(!site.export(&no).exists() && !site.export(&format!(".{no}.ml-part")).exists());
    let files = scrape(0);
    assert!(value(&files, r#"macrolink_files_errors_total{code="excluded"} "#) >= 1);
    // Taken back, it works again.
    let inc = site.manage(&["include", "store0", "--reason", "disk replaced"]);
    assert!(
        inc.status.success(),
        "{}",
        String::from_utf8_lossy(&inc.stderr)
    );
    let (again, yes) = cp_until(&site, &src, "yes", |o| o.status.success());
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(std::fs::read(site.export(&yes)).unwrap() == data);
}
