//! `macrolink serve` and `macrolink cp` as processes: interrupted copies,
//! killed servers and clients, exit codes.

use macrolink_testbed::data::pattern;
use macrolink_testbed::require;
use macrolink_testbed::Peer;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");
const SECRET: &str = "process test secret, long enough";
const MB: usize = 1 << 20;

struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    fn new() -> Site {
        let dir = tempfile::tempdir().unwrap();
        for d in ["export", "local", "shm"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        Site { dir }
    }
    fn root(&self) -> PathBuf {
        self.dir.path().join("export")
    }
    fn local(&self) -> PathBuf {
        self.dir.path().join("local")
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(EXE);
        c.args(args)
            .arg("--shm-dir")
            .arg(self.dir.path().join("shm"))
            .env("MACROLINK_SECRET", SECRET)
            .env_remove("MACROLINK_SECRET_FILE");
        c
    }
    fn serve(&self, extra: &[&str]) -> Peer {
        let mut c = self.cmd(&["serve", "--listen", "127.0.0.1:0"]);
        c.arg(self.root()).args(extra);
        Peer::spawn_cmd(c).expect("server starts")
    }
    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).stderr(Stdio::piped()).output().unwrap()
    }
}

fn url(p: &Peer, path: &str) -> String {
    format!("ml://{}/{path}", p.tcp)
}

fn partial(p: &Path) -> PathBuf {
    let name = p.file_name().unwrap().to_str().unwrap();
    p.with_file_name(format!(".{name}.ml-part"))
}

/// Waits until `path` holds at least `min` bytes.
fn wait_for_bytes(path: &Path, min: u64) {
    let until = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(path).map_or(0, |m| m.len()) < min {
        assert!(Instant::now() < until, "{} never grew", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill(c: &mut Child) {
    let _ = c.kill();
    let _ = c.wait();
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_killed_download_resumes_and_keeps_the_final_name_clean() {
    let site = Site::new();
    let server = site.serve(&[]);
    let data = pattern(24 * MB, 5);
    std::fs::write(site.root().join("src"), &data).unwrap();
    let dst = site.local().join("dst");
    let mut cp = site
        .cmd(&["cp", "-q", "--limit-rate", "8MiB", "--chunk", "256KiB"])
        .args([url(&server, "src"), dst.display().to_string()])
        .spawn()
        .unwrap();
    wait_for_bytes(&partial(&dst), 4 * MB as u64);
    kill(&mut cp);
    assert!(!dst.exists(), "no file under the final name");
    let o = site.run(&[
        "cp",
        "--resume",
        "--chunk",
        "256KiB",
        &url(&server, "src"),
        &dst.display().to_string(),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("resumed"), "{}", stderr(&o));
    assert!(std::fs::read(&dst).unwrap() == data, "resumed copy differs");
    assert!(!partial(&dst).exists());
}

#[test]
fn a_killed_server_leaves_the_old_file_and_the_upload_resumes() {
    let site = Site::new();
    let mut server = site.serve(&[]);
    let final_name = site.root().join("f");
    std::fs::write(&final_name, b"old content").unwrap();
    let data = pattern(24 * MB, 9);
    let src = site.local().join("f");
    std::fs::write(&src, &data).unwrap();
    let cp = site
        .cmd(&[
            "cp",
            "-q",
            "--resume",
            "--limit-rate",
            "8MiB",
            "--chunk",
            "256KiB",
        ])
        .args([src.display().to_string(), url(&server, "f")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_bytes(&partial(&final_name), 4 * MB as u64);
    server.kill();
    let o = cp.wait_with_output().unwrap();
    assert_eq!(code(&o), 6, "connection lost: {}", stderr(&o));
    assert_eq!(std::fs::read(&final_name).unwrap(), b"old content");
    let server = site.serve(&[]);
    let o = site.run(&[
        "cp",
        "--resume",
        "--chunk",
        "256KiB",
        &src.display().to_string(),
        &url(&server, "f"),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("resumed"), "{}", stderr(&o));
    assert!(std::fs::read(&final_name).unwrap() == data);
    assert!(!partial(&final_name).exists());
}

#[test]
fn a_killed_client_leaves_no_partial_upload_behind() {
    let site = Site::new();
    let server = site.serve(&[]);
    let src = site.local().join("g");
    std::fs::write(&src, pattern(24 * MB, 2)).unwrap();
    let mut cp = site
        .cmd(&["cp", "-q", "--limit-rate", "8MiB"])
        .args([src.display().to_string(), url(&server, "g")])
        .spawn()
        .unwrap();
    let part = partial(&site.root().join("g"));
    wait_for_bytes(&part, 2 * MB as u64);
    kill(&mut cp);
    let until = Instant::now() + Duration::from_secs(20);
    while part.exists() {
        assert!(Instant::now() < until, "the partial upload stays");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!site.root().join("g").exists());
}

#[test]
fn exit_codes_tell_failures_apart() {
    let site = Site::new();
    let server = site.serve(&[]);
    let ro = site.serve(&["--read-only"]);
    std::fs::write(site.root().join("there"), b"x").unwrap();
    let local = site.local().join("l");
    std::fs::write(&local, b"y").unwrap();
    let l = local.display().to_string();
    let cases: Vec<(Vec<String>, i32)> = vec![
        (vec!["stat".into(), url(&server, "there")], 0),
        (vec!["stat".into(), url(&server, "missing")], 3),
        (vec!["cp".into(), url(&server, "missing"), l.clone()], 3),
        (vec!["stat".into(), url(&server, "../x")], 4),
        (vec!["cp".into(), l.clone(), url(&ro, "new")], 4),
        (vec!["mkdir".into(), url(&server, "there")], 8),
        (vec!["ls".into(), "ml://127.0.0.1:1/".into()], 6),
        (vec!["cp".into(), l.clone(), "/tmp/x".into()], 2),
    ];
    for (args, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = site.run(&args);
        assert_eq!(code(&o), want, "{args:?}: {}", stderr(&o));
        if want != 0 {
            assert!(stderr(&o).starts_with("macrolink: "), "{}", stderr(&o));
        }
    }
    // A wrong secret.
    let o = site
        .cmd(&["ls", &url(&server, "")])
        .env("MACROLINK_SECRET", "a different secret, long enough")
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    // ls shows what is there.
    let o = site.cmd(&["ls", &url(&server, "")]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains(" there"));
}

/// A 4 MiB tmpfs mounted on a fresh directory; unmounted when dropped.
struct SmallDisk {
    path: PathBuf,
}

impl SmallDisk {
    /// None (with the reason printed) where mounting is not allowed here;
    /// with MACROLINK_REQUIRE_ROOT=1 (CI) that is a failure instead.
    fn mount(at: PathBuf) -> Option<SmallDisk> {
        std::fs::create_dir_all(&at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
            .arg(&at)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return require::root_failed("full-disk test", "cannot mount a tmpfs");
        }
        Some(SmallDisk { path: at })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

#[test]
fn a_full_disk_fails_the_upload_cleanly_and_the_server_goes_on() {
    let site = Site::new();
    let Some(disk) = SmallDisk::mount(site.root().join("small")) else {
        return;
    };
    let server = site.serve(&[]);
    let src = site.local().join("big");
    std::fs::write(&src, pattern(8 * MB, 4)).unwrap();
    let o = site.run(&[
        "cp",
        "-q",
        "--chunk",
        "256KiB",
        &src.display().to_string(),
        &url(&server, "small/big"),
    ]);
    assert_eq!(code(&o), 7, "no space: {}", stderr(&o));
    assert!(stderr(&o).contains("space"), "{}", stderr(&o));
    let left: Vec<_> = std::fs::read_dir(&disk.path).unwrap().collect();
    assert!(left.is_empty(), "nothing left on the full disk: {left:?}");
    // The server still serves, and the small disk still takes small files.
    std::fs::write(site.local().join("small"), b"fits").unwrap();
    let o = site.run(&[
        "cp",
        &site.local().join("small").display().to_string(),
        &url(&server, "small/ok"),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(std::fs::read(disk.path.join("ok")).unwrap(), b"fits");
}

/// Starts a `cp` slowed to 20 MB/s, so that another starts while it runs
/// (32 MB: 1.5 s after its first MB, for a loaded host to start the other).
fn slow_cp(site: &Site, from: &str, to: &str) -> Child {
    site.cmd(&["cp", "-q", "--limit-rate", "20MB", from, to])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn two_uploads_to_one_name_land_one_whole_file_in_either_order() {
    let site = Site::new();
    let server = site.serve(&[]);
    let (a, b) = (pattern(32 * MB, 21), pattern(32 * MB, 22));
    let (fa, fb) = (site.local().join("a"), site.local().join("b"));
    std::fs::write(&fa, &a).unwrap();
    std::fs::write(&fb, &b).unwrap();
    let dst = url(&server, "same.bin");
    for (first, second, first_data) in [(&fa, &fb, &a), (&fb, &fa, &b)] {
        let slow = slow_cp(&site, first.to_str().unwrap(), &dst);
        wait_for_bytes(&partial(&site.root().join("same.bin")), MB as u64);
        let o = site.run(&["cp", second.to_str().unwrap(), &dst]);
        assert_eq!(code(&o), 9, "the second is refused as busy: {}", stderr(&o));
        assert!(stderr(&o).contains("in progress"), "{}", stderr(&o));
        let done = finish(slow);
        assert_eq!(code(&done), 0, "{}", stderr(&done));
        let landed = std::fs::read(site.root().join("same.bin")).unwrap();
        assert!(landed == *first_data, "the file is the first upload, whole");
        assert!(!partial(&site.root().join("same.bin")).exists());
    }
}

#[test]
fn two_downloads_to_one_name_land_one_whole_file() {
    let site = Site::new();
    let server = site.serve(&[]);
    let data = pattern(32 * MB, 23);
    std::fs::write(site.root().join("src"), &data).unwrap();
    let dst = site.local().join("got");
    let slow = slow_cp(&site, &url(&server, "src"), dst.to_str().unwrap());
    wait_for_bytes(&partial(&dst), MB as u64);
    let o = site.run(&["cp", &url(&server, "src"), dst.to_str().unwrap()]);
    assert_eq!(code(&o), 9, "{}", stderr(&o));
    assert_eq!(code(&finish(slow)), 0);
    assert!(std::fs::read(&dst).unwrap() == data);
}

#[test]
fn names_of_255_bytes_go_up_and_down() {
    let site = Site::new();
    let server = site.serve(&[]);
    let name = "n".repeat(255);
    let data = pattern(3 * MB, 24);
    let src = site.local().join(&name);
    std::fs::write(&src, &data).unwrap();
    let o = site.run(&["cp", src.to_str().unwrap(), &url(&server, &name)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(std::fs::read(site.root().join(&name)).unwrap() == data);
    let back = site.local().join("back");
    std::fs::create_dir(&back).unwrap();
    let o = site.run(&["cp", &url(&server, &name), back.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(std::fs::read(back.join(&name)).unwrap() == data);
}

/// `serve --ucx-tls tcp` and `cp --ucx-tls tcp --no-shm`: the flags a
/// site with InfiniBand gives (with its own UCX_TLS), here on UCX's tcp.
#[test]
fn cp_moves_files_over_ucx_when_both_ends_start_it() {
    let site = Site::new();
    let mut probe = macrolink_fabric::NodeConfig::local(1, site.dir.path().join("shm"));
    probe.ucx = Some(macrolink_fabric::UcxOptions::default());
    if require::ucx(macrolink_fabric::Node::start(probe)).is_none() {
        return;
    }
    let server = site.serve(&["--ucx-tls", "tcp"]);
    let data = pattern(5 * MB + 3, 31);
    let src = site.local().join("over-ucx");
    std::fs::write(&src, &data).unwrap();
    let (to, from) = (url(&server, "u"), src.to_str().unwrap());
    let ucx = ["cp", "--ucx-tls", "tcp", "--no-shm"];
    let o = site.run(&[&ucx[..], &[from, &to]].concat());
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(std::fs::read(site.root().join("u")).unwrap() == data);
    let back = site.local().join("back-ucx");
    let o = site.run(&[&ucx[..], &[&to, back.to_str().unwrap()]].concat());
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(std::fs::read(&back).unwrap() == data);
}

/// Waits for a child and collects what it printed.
fn finish(c: Child) -> Output {
    c.wait_with_output().unwrap()
}

#[test]
fn a_fifo_a_closed_pipe_and_a_name_with_control_characters_are_handled() {
    let site = Site::new();
    let fifo = site.root().join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path and nothing else.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let evil = "evil\n\x1b[2Jname";
    std::fs::write(site.root().join(evil), b"x").unwrap();
    for i in 0..50 {
        std::fs::write(site.root().join(format!("f{i:02}")), b"y").unwrap();
    }
    let s = site.serve(&[]);
    // The FIFO is refused at once, and the session goes on.
    let to = site.local().join("got");
    let began = Instant::now();
    let o = site.run(&["cp", "-q", &url(&s, "pipe"), to.to_str().unwrap()]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    assert!(began.elapsed() < Duration::from_secs(10));
    let o = site.run(&["ls", &url(&s, "")]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let listing = String::from_utf8(o.stdout).unwrap();
    // Control characters reach the terminal escaped.
    assert!(listing.contains(r"evil\n\u{1b}[2Jname"), "{listing}");
    assert!(!listing.contains('\x1b'));
    assert_eq!(listing.lines().count(), 52);
    // A reader that stops early: no panic, no message, as `ls | head`.
    let mut ls = site.cmd(&["ls", &url(&s, "")]);
    let mut child = ls
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // closed before anything is read
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success() || o.status.code() == Some(141),
        "{:?}: {}",
        o.status,
        stderr(&o)
    );
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
}
