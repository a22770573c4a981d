//! fio running the job that matches an iobench phase, for the ratio column.

use anyhow::{bail, Context};
use std::path::Path;
use std::process::Command;

use super::worker::{Layout, Op};

/// One fio job.
#[derive(Clone, Copy, Debug)]
pub struct Job {
    /// Operation.
    pub op: Op,
    /// Pattern.
    pub layout: Layout,
    /// Transfer (block) size.
    pub xfer: u64,
    /// Bytes per worker.
    pub size: u64,
    /// Workers (fio jobs).
    pub workers: u64,
    /// fsync written files at the end.
    pub fsync: bool,
}

impl Job {
    /// fio's command-line arguments for this job in `dir`.
    pub fn args(&self, dir: &Path) -> Vec<String> {
        let rw = match self.op {
            Op::Write => "write",
            Op::Read => "read",
            Op::RandWrite => "randwrite",
        };
        let mut a = vec![
            "--name=iobench".to_string(),
            format!("--directory={}", dir.display()),
            format!("--rw={rw}"),
            format!("--bs={}", self.xfer),
            format!("--size={}", self.size),
            format!("--numjobs={}", self.workers),
            "--ioengine=psync".into(),
            // Page-aligned buffers, as iobench's are: with fio's own
            // placement the kernel's copy out of the page cache ran five
            // times slower on an AMD EPYC (2.6 against 13 GB/s).
            "--iomem_align=4096".into(),
            // Reads come from the page cache, as iobench's do.
            "--invalidate=0".into(),
            "--group_reporting".into(),
            "--output-format=json".into(),
        ];
        match self.layout {
            Layout::NToN => a.push("--filename_format=fio.$jobnum".into()),
            Layout::NTo1 => {
                a.push("--filename=fio.shared".into());
                a.push(format!("--offset_increment={}", self.size));
            }
        }
        if self.fsync && self.op != Op::Read {
            a.push("--end_fsync=1".into());
        }
        a
    }
}

/// Runs `job` in `dir`; returns fio's bandwidth in MB/s. Files are kept
/// after a write job for the read job that follows, and removed after it.
pub fn run(dir: &Path, job: &Job) -> anyhow::Result<f64> {
    let out = Command::new("fio")
        .args(job.args(dir))
        .output()
        .context("running fio (apt-get install fio)")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    if job.op != Op::Write {
        for e in std::fs::read_dir(dir)?.flatten() {
            if e.file_name().to_string_lossy().starts_with("fio.") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    bandwidth(&out.stdout, job.op)
}

/// fio's aggregate bandwidth (MB/s) for `op` from its JSON output.
pub fn bandwidth(json: &[u8], op: Op) -> anyhow::Result<f64> {
    // fio may print notes before the JSON document.
    let start = json
        .iter()
        .position(|&b| b == b'{')
        .context("no JSON from fio")?;
    let v: serde_json::Value = serde_json::from_slice(&json[start..])?;
    let side = if op == Op::Read { "read" } else { "write" };
    let bw = v["jobs"][0][side]["bw_bytes"]
        .as_f64()
        .context("fio output without bw_bytes")?;
    Ok(bw / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_match_the_patterns() {
        let j = Job {
            op: Op::Write,
            layout: Layout::NTo1,
            xfer: 4096,
            size: 1 << 20,
            workers: 3,
            fsync: true,
        };
        let a = j.args(Path::new("/d"));
        assert!(a.contains(&"--filename=fio.shared".to_string()));
        assert!(a.contains(&"--offset_increment=1048576".to_string()));
        assert!(a.contains(&"--end_fsync=1".to_string()));
        let r = Job {
            op: Op::Read,
            layout: Layout::NToN,
            ..j
        };
        let a = r.args(Path::new("/d"));
        assert!(a.iter().any(|x| x.starts_with("--filename_format=")));
        assert!(!a.contains(&"--end_fsync=1".to_string()));
        let json = br#"note: x {"jobs":[{"read":{"bw_bytes":2000000},"write":{"bw_bytes":0}}]}"#;
        assert_eq!(bandwidth(json, Op::Read).unwrap(), 2.0);
    }
}
