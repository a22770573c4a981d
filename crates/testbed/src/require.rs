//! Tests that need root, or network namespaces, run where they can and say
//! why they did not run elsewhere; where the environment says they are
//! required (`MACROLINK_REQUIRE_NETNS=1`, `MACROLINK_REQUIRE_ROOT=1`,
//! `MACROLINK_REQUIRE_UCX=1`, as CI sets them), not running is a failure
//! instead.

use crate::netns::{Namespaces, Shape, Testbed};

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `Some(())` when the test may use root; `None` with the reason printed
/// when it cannot and need not; a panic when `MACROLINK_REQUIRE_ROOT=1`.
pub fn root(what: &str) -> Option<()> {
    if is_root() {
        return Some(());
    }
    skip("MACROLINK_REQUIRE_ROOT", what, "not root")
}

/// A failed attempt at something that needs root (mounting, say):
/// `None` with the reason printed, or a panic when `MACROLINK_REQUIRE_ROOT=1`.
pub fn root_failed<T>(what: &str, why: &str) -> Option<T> {
    skip("MACROLINK_REQUIRE_ROOT", what, why)
}

/// A testbed of `shape` with storage-side links shaped to `rate`, or `None`
/// (with the reason printed) where namespaces cannot be made here; a panic
/// when `MACROLINK_REQUIRE_NETNS=1`.
pub fn testbed(shape: Shape, rate: &str) -> Option<Testbed> {
    let why = if is_root() {
        match Testbed::build(shape, rate) {
            Ok(tb) => return Some(tb),
            Err(why) => why,
        }
    } else {
        "not root".to_string()
    };
    skip("MACROLINK_REQUIRE_NETNS", "namespace test", &why)
}

/// `n` bare namespaces, or `None` (with the reason printed) where they
/// cannot be made here; a panic when `MACROLINK_REQUIRE_NETNS=1`.
pub fn namespaces(n: usize) -> Option<Namespaces> {
    let why = if is_root() {
        match Namespaces::new(n) {
            Ok(ns) => return Some(ns),
            Err(why) => why,
        }
    } else {
        "not root".to_string()
    };
    skip("MACROLINK_REQUIRE_NETNS", "namespace test", &why)
}

/// What a start of something that needs UCX gave: its value, or `None`
/// (with the reason printed) where UCX is missing here; a panic when
/// `MACROLINK_REQUIRE_UCX=1`.
pub fn ucx<T, E: std::fmt::Display>(started: Result<T, E>) -> Option<T> {
    match started {
        Ok(v) => Some(v),
        Err(e) => skip("MACROLINK_REQUIRE_UCX", "UCX test", &e.to_string()),
    }
}

fn skip<T>(var: &str, what: &str, why: &str) -> Option<T> {
    assert!(
        !required(var),
        "{what} required ({var}=1) but cannot run: {why}"
    );
    eprintln!("{what} not run here: {why}");
    None
}

/// `Some(())` when a Slurm cluster answers `scontrol ping` (with the
/// environment's `SLURM_CONF`); `None` with the reason printed, or a panic
/// when `MACROLINK_REQUIRE_SLURM=1`.
pub fn slurm() -> Option<()> {
    let why = match std::process::Command::new("scontrol").arg("ping").output() {
        Ok(o) if String::from_utf8_lossy(&o.stdout).contains("is UP") => return Some(()),
        Ok(o) => format!(
            "no slurmctld answers `scontrol ping`: {}",
            String::from_utf8_lossy(&o.stdout).trim()
        ),
        Err(e) => format!("scontrol: {e}"),
    };
    skip("MACROLINK_REQUIRE_SLURM", "Slurm test", &why)
}

/// `Some(())` when `program --version` runs; `None` with the reason
/// printed, or a panic when `var` is `1`.
pub fn program(program: &str, var: &str) -> Option<()> {
    let why = match std::process::Command::new(program)
        .arg("--version")
        .output()
    {
        Ok(o) if o.status.success() => return Some(()),
        Ok(o) => format!("{program} --version: {}", o.status),
        Err(e) => format!("{program}: {e}"),
    };
    skip(var, &format!("test with {program}"), &why)
}
