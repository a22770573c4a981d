//! A cluster file for tests of one host per process, as a launcher runs
//! them: a compute host, two gateways and a storage host with its file
//! service, on loopback ports from `base`, with a secret file and an export
//! in a directory of the test's own.

use std::path::{Path, PathBuf};

/// The hosts of [`write()`]'s file, in rank order.
pub const HOSTS: [&str; 4] = ["compute0", "gw0", "gw1", "store0"];

/// Writes `cluster.toml`, `secret` and `export/` into `dir`; the file's
/// path. Ports `base + 1`, `base + 10`, `base + 21`, `base + 22` and
/// `base + 30` are used.
pub fn write(dir: &Path, base: u16) -> std::io::Result<PathBuf> {
    write_site(dir, base, None)
}

/// [`write()`]'s file with management: every host in one macro-cluster
/// managed by gw0 with gw1 as fallback, store0 the central manager, manage
/// ports `base + 41` to `base + 44`, and `manage` in the `[manage]` table.
pub fn write_with_managers(dir: &Path, base: u16, manage: &str) -> std::io::Result<PathBuf> {
    write_site(dir, base, Some(manage))
}

fn write_site(dir: &Path, base: u16, manage: Option<&str>) -> std::io::Result<PathBuf> {
    let export = dir.join("export");
    std::fs::create_dir_all(&export)?;
    std::fs::write(
        dir.join("secret"),
        "a site's secret, long enough to be one\n",
    )?;
    let p = |n: u16| format!("127.0.0.1:{}", base + n);
    let text = format!(
        r#"secret_file = "secret"

[[host]]
name = "compute0"
role = "compute"
node = 1
fabric = "{}"

[[host]]
name = "gw0"
role = "gateway"
node = 21
fabric = "{}"

[[host]]
name = "gw1"
role = "gateway"
node = 22
fabric = "{}"

[[host]]
name = "store0"
role = "storage"
node = 10
storage = "{}"
files = "{}"
export = "{}"

[[lane]]
gateways = ["gw0", "gw1"]
storage = ["store0"]
"#,
        p(1),
        p(21),
        p(22),
        p(10),
        p(30),
        export.display()
    );
    let text = match manage {
        None => text,
        Some(m) => {
            let mut t = String::new();
            for line in text.lines() {
                t += line;
                t.push('\n');
                if let Some(n) = line.strip_prefix("name = ") {
                    let i = HOSTS
                        .iter()
                        .position(|h| format!("{h:?}") == n)
                        .unwrap_or(0);
                    t += &format!("manage = \"{}\"\n", p(41 + i as u16));
                }
            }
            t + &format!(
                "\n[[macro]]\nname = \"m0\"\nhosts = {HOSTS:?}\nmanager = \"gw0\"\n\
                 fallback = \"gw1\"\n\n[manage]\ncentral = \"store0\"\n{m}"
            )
        }
    };
    let file = dir.join("cluster.toml");
    std::fs::write(&file, text)?;
    Ok(file)
}

/// Socket files of fabric nodes left in meeting directory `shm`.
pub fn sockets_left(shm: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(shm)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `cluster.toml` and `secret` into `dir` for management: hosts
/// `names` (the first the central manager, the rest one macro-cluster
/// managed by the second with the third as fallback), manage ports from
/// `base + 10`, and `manage` appended to the `[manage]` table; the file's
/// path.
pub fn write_managed(
    dir: &Path,
    base: u16,
    names: &[&str],
    manage: &str,
) -> std::io::Result<PathBuf> {
    std::fs::write(dir.join("secret"), "a manager's secret, long enough")?;
    let mut t = String::from("secret_file = \"secret\"\n");
    for (i, n) in names.iter().enumerate() {
        let i = i as u16;
        t += &format!(
            "[[host]]\nname = \"{n}\"\nrole = \"compute\"\nnode = {}\nfabric = \"127.0.0.1:{}\"\nmanage = \"127.0.0.1:{}\"\n",
            i + 1,
            base + i,
            base + 10 + i
        );
    }
    let group: Vec<String> = names[1..].iter().map(|n| format!("\"{n}\"")).collect();
    t += &format!(
        "[[macro]]\nname = \"m0\"\nhosts = [{}]\nmanager = \"{}\"\nfallback = \"{}\"\n[manage]\ncentral = \"{}\"\n{manage}",
        group.join(", "),
        names[1],
        names[2],
        names[0]
    );
    let file = dir.join("cluster.toml");
    std::fs::write(&file, t)?;
    Ok(file)
}
