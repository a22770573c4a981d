//! Builds the library preloaded into `ucx_perftest` so that the buffers it
//! moves hold data (`src/peers/written.c`; `peers::written`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "src/peers/written.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("libmacrolink_written.so");
    let cc = cc::Build::new().get_compiler();
    let mut cmd: Command = cc.to_command();
    cmd.args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(src);
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler ({cmd:?}): {e}"));
    assert!(status.success(), "{cmd:?} failed: {status}");
}
