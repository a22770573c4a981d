//! Compiles `examples/c/pingpong.c` against `include/macrolink.h` and the
//! static library, then runs it as two processes: a reliable, a datagram and
//! a put round trip, with the refusals the header documents.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// target/<profile>, where cargo leaves libmacrolink_dp.a.
fn artifact_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// `cargo test` builds the library only as an rlib: build the static
/// library with the same profile.
fn static_lib() -> PathBuf {
    let dir = artifact_dir();
    let profile = dir.file_name().unwrap().to_str().unwrap().to_owned();
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--quiet",
            "-p",
            "macrolink-capi",
            "--lib",
            "--profile",
        ])
        .arg(if profile == "debug" { "dev" } else { &profile })
        .current_dir(root())
        .status()
        .expect("cargo");
    assert!(status.success(), "building libmacrolink_dp.a failed");
    let lib = dir.join("libmacrolink_dp.a");
    assert!(lib.exists(), "{} not built", lib.display());
    lib
}

#[test]
fn c_program_round_trips_through_the_header() {
    let lib = static_lib();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("pingpong");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-std=c11",
            "-D_DEFAULT_SOURCE",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-O1",
            "-I",
        ])
        .arg(root().join("include"))
        .arg(root().join("examples/c/pingpong.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&bin)
        .status()
        .expect("a C compiler (cc)");
    assert!(status.success(), "compiling pingpong.c failed");

    let shm = dir.path().join("shm");
    let mut server = Command::new(&bin)
        .arg("server")
        .arg(&shm)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"ready"), "server said {line:?}");
    let out = Command::new(&bin)
        .arg("client")
        .arg(&shm)
        .args([fields[1], fields[2]])
        .output()
        .unwrap();
    let server_status = server.wait().unwrap();
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert!(server_status.success(), "server failed");
}
