//! Builds the libraries preloaded into the peers: one so that the buffers
//! `ucx_perftest` moves hold data (`src/peers/written.c`;
//! `peers::written`), one that keeps a thread asleep in a peer's process
//! (`src/peers/resident.c`; `peers::resident`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for (src, lib, threads) in [
        ("src/peers/written.c", "libmacrolink_written.so", false),
        ("src/peers/resident.c", "libmacrolink_resident.so", true),
    ] {
        println!("cargo:rerun-if-changed={src}");
        let cc = cc::Build::new().get_compiler();
        let mut cmd: Command = cc.to_command();
        cmd.args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
            .arg(out_dir.join(lib))
            .arg(src);
        if threads {
            cmd.arg("-pthread");
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("running the C compiler ({cmd:?}): {e}"));
        assert!(status.success(), "{cmd:?} failed: {status}");
    }
}
