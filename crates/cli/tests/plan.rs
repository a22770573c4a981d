//! `macrolink plan` as a user runs it: each subcommand's table, the
//! papers' tables with their slips, the files it writes.

use serde_json::Value;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_macrolink");

fn plan(args: &[&str]) -> String {
    let out = Command::new(EXE).arg("plan").args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn io_network_reproduces_the_papers_tables_and_writes_rows_and_a_plot() {
    let d = tempfile::tempdir().unwrap();
    let (json, csv, png) = (
        d.path().join("r.json"),
        d.path().join("r.csv"),
        d.path().join("f12.png"),
    );
    let text = plan(&[
        "io-network",
        "--nodes",
        "128,1024,8192",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert!(text.contains("97.92") && text.contains("95.65"), "{text}");
    let rows: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[1]["fesio_switches"], 12);
    assert_eq!(rows[2]["pascal_io_nodes"], 512);
    assert_eq!(std::fs::read_to_string(&csv).unwrap().lines().count(), 4);
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    let paper = plan(&["io-network", "--paper"]);
    assert!(paper.contains("104 figures, 4 differ"), "{paper}");
    assert!(paper.contains("slip: its own rows add up to $2,749,440"));
    assert!(paper.contains("Table 4, 2048 nodes, cables") && paper.contains("-96"));
}

#[test]
fn storage_range_latency_and_interconnect_print_their_papers() {
    assert!(plan(&["storage", "--paper"]).contains("15 figures, 8 differ"));
    let s = plan(&["storage", "--boxes", "8", "--link-mbs", "350"]);
    assert!(s.lines().nth(1).unwrap().contains("2800"), "{s}");
    assert!(plan(&["range", "--paper"]).contains("8 figures, 4 differ"));
    let r = plan(&["range", "--km", "2", "--window", "256KiB"]);
    assert!(r.contains("39.80") && r.contains("100.0%"), "{r}");
    assert!(plan(&["latency", "--paper"]).contains("12 figures, 1 differ"));
    assert!(plan(&["interconnect", "--hosts", "16"]).contains("17200"));
}

#[test]
fn latency_fits_a_benchmarks_json() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("bd.json");
    // T_send costs 2 ns a byte, T_net 5 ns, on top of 0.1 + 0.5 + 1.0 + 0.2 us.
    let rows: Vec<Value> = [1u64, 1500, 65536]
        .iter()
        .map(|&l| {
            let (send, net) = (0.5 + 2e-3 * l as f64, 1.0 + 5e-3 * l as f64);
            serde_json::json!({"transport": "tcp", "size": l, "startup": 0.1, "send": send,
                "net": net, "delivery": 0.2, "total": 0.1 + send + net + 0.2})
        })
        .collect();
    std::fs::write(&f, serde_json::to_string(&rows).unwrap()).unwrap();
    let text = plan(&["latency", "--from", f.to_str().unwrap()]);
    let term = |name: &str| -> Vec<f64> {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap())
            .collect()
    };
    assert_eq!(term("T_send"), [0.5, 2.0]);
    assert_eq!(term("T_net"), [1.0, 5.0]);
    let bad = Command::new(EXE)
        .args(["plan", "latency", "--from", "/nonexistent.json"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
}

#[test]
fn cluster_plans_the_example_file() {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/clusters/local.toml"
    );
    let t = plan(&[
        "cluster",
        file,
        "--target-gbs",
        "2",
        "--link-gbit",
        "10",
        "--links",
        "2",
    ]);
    assert!(t.starts_with("target 2 GB/s: 1 gateways x 2 links"), "{t}");
    let out = Command::new(EXE)
        .args(["plan", "cluster", file, "--target-gbs", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no link rate"));
}
