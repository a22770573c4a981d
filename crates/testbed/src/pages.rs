//! How much of a file the page cache holds, as util-linux's `fincore`
//! counts it: for tests of how files are written.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Bytes of the file at `path` that the page cache holds.
pub fn cached_bytes(path: &Path) -> Result<u64, String> {
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()
        .map_err(|e| format!("fincore (util-linux): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "fincore {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .map_err(|e| format!("fincore said {text:?}: {e}"))
}

/// [`cached_bytes`] once it is at most `at_most`, or what it last was
/// when `patience` runs out: pages written back are freed a moment after
/// the write-back that frees them.
pub fn cached_bytes_within(path: &Path, at_most: u64, patience: Duration) -> Result<u64, String> {
    let until = Instant::now() + patience;
    loop {
        let n = cached_bytes(path)?;
        if n <= at_most || Instant::now() >= until {
            return Ok(n);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_just_written_is_cached_and_a_missing_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
        assert_eq!(cached_bytes(&p).unwrap(), 1 << 20);
        assert!(cached_bytes(&dir.path().join("none")).is_err());
    }
}
