//! fio: the file I/O job that matches a phase of `macrolink iobench`.

use anyhow::{bail, Context};
use std::path::Path;
use std::process::Command;

use super::Tool;

/// How the names of the files fio's jobs make begin: a job's number (or
/// `shared`) follows.
const PREFIX: &str = "iobench-fio.";

/// The tool.
pub const TOOL: Tool = Tool {
    program: "fio",
    package: "fio",
};

/// What a job does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rw {
    /// Sequential write.
    Write,
    /// Sequential read.
    Read,
    /// Writes at random offsets.
    RandWrite,
}

/// One fio job.
#[derive(Clone, Copy, Debug)]
pub struct Job {
    /// What it does.
    pub rw: Rw,
    /// All jobs share one file, a region each (N-to-1); else a file each.
    pub shared_file: bool,
    /// Block size.
    pub bs: u64,
    /// Bytes per job.
    pub size: u64,
    /// Jobs.
    pub numjobs: u64,
    /// fsync written files at the end.
    pub end_fsync: bool,
}

impl Job {
    /// fio's command-line arguments for this job in `dir`.
    pub fn args(&self, dir: &Path) -> Vec<String> {
        let rw = match self.rw {
            Rw::Write => "write",
            Rw::Read => "read",
            Rw::RandWrite => "randwrite",
        };
        let mut a = vec![
            "--name=iobench".to_string(),
            format!("--directory={}", dir.display()),
            format!("--rw={rw}"),
            format!("--bs={}", self.bs),
            format!("--size={}", self.size),
            format!("--numjobs={}", self.numjobs),
            "--ioengine=psync".into(),
            // Page-aligned buffers, as iobench's are: with fio's own
            // placement the kernel's copy out of the page cache ran five
            // times slower on an AMD EPYC (2.6 against 13 GB/s).
            "--iomem_align=4096".into(),
            // Reads come from the page cache, as iobench's do.
            "--invalidate=0".into(),
            // Files grow as they are written, as iobench's do: no blocks
            // set aside before the clock starts.
            "--fallocate=none".into(),
            "--group_reporting".into(),
            "--output-format=json".into(),
        ];
        if self.shared_file {
            a.push(format!("--filename={PREFIX}shared"));
            a.push(format!("--offset_increment={}", self.size));
        } else {
            a.push(format!("--filename_format={PREFIX}$jobnum"));
        }
        if self.end_fsync && self.rw != Rw::Read {
            a.push("--end_fsync=1".into());
        }
        a
    }
}

/// Runs `job` in `dir`; fio's bandwidth in 10^6 bytes per second. A job
/// that writes starts from no files of fio's (written over, the pages of
/// the run before would be there already); its files stay for the read
/// jobs that follow, until [`remove_files`].
pub fn run(dir: &Path, job: &Job) -> anyhow::Result<f64> {
    if job.rw != Rw::Read {
        remove_files(dir, job)?;
    }
    let out = Command::new(TOOL.program)
        .args(job.args(dir))
        .output()
        .with_context(|| format!("running fio (apt-get install {})", TOOL.package))?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    bandwidth(&out.stdout, job.rw)
}

/// Removes the files `job` makes in `dir`, by their names: nothing else
/// there is touched.
pub fn remove_files(dir: &Path, job: &Job) -> anyhow::Result<()> {
    let names: Vec<String> = if job.shared_file {
        vec![format!("{PREFIX}shared")]
    } else {
        (0..job.numjobs).map(|j| format!("{PREFIX}{j}")).collect()
    };
    for n in names {
        let path = dir.join(n);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", path.display()));
            }
            _ => {}
        }
    }
    Ok(())
}

/// fio's aggregate bandwidth (MB/s) for `rw` from its JSON output.
pub fn bandwidth(json: &[u8], rw: Rw) -> anyhow::Result<f64> {
    // fio may print notes before the JSON document.
    let start = json
        .iter()
        .position(|&b| b == b'{')
        .context("no JSON from fio")?;
    let v: serde_json::Value = serde_json::from_slice(&json[start..])?;
    let side = if rw == Rw::Read { "read" } else { "write" };
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
            rw: Rw::Write,
            shared_file: true,
            bs: 4096,
            size: 1 << 20,
            numjobs: 3,
            end_fsync: true,
        };
        let a = j.args(Path::new("/d"));
        assert!(a.contains(&"--filename=iobench-fio.shared".to_string()));
        assert!(a.contains(&"--offset_increment=1048576".to_string()));
        assert!(a.contains(&"--end_fsync=1".to_string()));
        assert!(a.contains(&"--fallocate=none".to_string()), "as iobench's");
        let r = Job {
            rw: Rw::Read,
            shared_file: false,
            ..j
        };
        let a = r.args(Path::new("/d"));
        assert!(a.iter().any(|x| x.starts_with("--filename_format=")));
        assert!(!a.contains(&"--end_fsync=1".to_string()));
        let json = br#"note: x {"jobs":[{"read":{"bw_bytes":2000000},"write":{"bw_bytes":0}}]}"#;
        assert_eq!(bandwidth(json, Rw::Read).unwrap(), 2.0);
    }

    #[test]
    fn fios_files_stay_from_its_write_through_its_reads_and_go_when_told() {
        let d = tempfile::tempdir().unwrap();
        let files = || {
            let mut v: Vec<String> = std::fs::read_dir(d.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        let write = Job {
            rw: Rw::Write,
            shared_file: false,
            bs: 64 << 10,
            size: 1 << 20,
            numjobs: 2,
            end_fsync: false,
        };
        // A longer file of an earlier run, which a write into it would
        // leave as long: a write starts without it. A file of someone
        // else's stays.
        std::fs::write(d.path().join("iobench-fio.0"), vec![1u8; 2 << 20]).unwrap();
        std::fs::write(d.path().join("fio.conf"), b"x").unwrap();
        assert!(run(d.path(), &write).unwrap() > 0.0);
        let written = files();
        assert_eq!(written, ["fio.conf", "iobench-fio.0", "iobench-fio.1"]);
        let len = std::fs::metadata(d.path().join("iobench-fio.0"))
            .unwrap()
            .len();
        assert_eq!(
            len, write.size,
            "a new file, not the longer one written over"
        );
        let read = Job {
            rw: Rw::Read,
            ..write
        };
        for _ in 0..2 {
            assert!(run(d.path(), &read).unwrap() > 0.0);
            assert_eq!(files(), written, "a read keeps fio's files for the next");
        }
        remove_files(d.path(), &read).unwrap();
        assert_eq!(files(), ["fio.conf"]);
    }
}
