//! Manual pages and shell completions, generated from the command line.

use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");

#[test]
fn every_command_has_a_manual_page_that_names_its_options() {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(EXE).arg("man").arg(d.path()).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = |name: &str| std::fs::read_to_string(d.path().join(name)).unwrap();
    assert!(page("macrolink.1").contains("macrolink"));
    let cp = page("macrolink-cp.1");
    assert!(
        cp.starts_with(".ie") || cp.contains(".TH macrolink-cp"),
        "{cp}"
    );
    assert!(cp.contains("resume"), "{cp}");
    assert!(page("macrolink-node.1").contains("until"));
    assert!(
        !d.path().join("macrolink-man.1").exists(),
        "no page for a hidden command"
    );
}

#[test]
fn completions_cover_the_commands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(EXE)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        for cmd in ["iobench", "relay", "node"] {
            assert!(text.contains(cmd), "{shell} completions lack {cmd}");
        }
    }
    let bad = Command::new(EXE)
        .args(["completions", "cmd.exe"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
}
