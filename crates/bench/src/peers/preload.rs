//! A library built with this crate (`build.rs`), written out into a
//! directory of its own for a peer's processes to preload; both go when
//! it is dropped.

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A library written out, and the directory it is in.
#[derive(Debug)]
pub struct Library {
    dir: tempfile::TempDir,
    name: &'static str,
}

impl Library {
    /// Writes `bytes` out as the library `name`.
    pub fn write(name: &'static str, bytes: &[u8]) -> anyhow::Result<Library> {
        let dir = tempfile::Builder::new()
            .prefix("macrolink-preload")
            .tempdir()
            .with_context(|| format!("a directory for the preloaded library {name}"))?;
        let l = Library { dir, name };
        std::fs::write(l.path(), bytes)
            .with_context(|| format!("writing out the preloaded library {name}"))?;
        Ok(l)
    }

    /// The library's file.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join(self.name)
    }

    /// Its directory, for files the library writes.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `cmd` with the library preloaded.
    pub fn preload<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.env("LD_PRELOAD", self.path())
    }
}
