//! Paths a client names are relative to the export root. This module
//! refuses, by their text, the ones that could leave it: absolute paths and
//! `..`. Symbolic links that point out of the root are refused when the path
//! is opened, by resolving beneath the root's directory handle (`cap-std`).

use std::path::{Component, Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// Starts at the file system root.
    #[error("absolute path {0:?}: paths are relative to the export root")]
    Absolute(String),
    /// Climbs with `..`.
    #[error("path {0:?} climbs with '..'")]
    Parent(String),
    /// Contains a NUL byte.
    #[error("path contains a NUL byte")]
    Nul,
}

/// The path under the root that `path` names; `""` and `"."` name the root.
pub fn relative(path: &str) -> Result<PathBuf, Refused> {
    if path.contains('\0') {
        return Err(Refused::Nul);
    }
    let mut out = PathBuf::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(Refused::Parent(path.into())),
            Component::RootDir | Component::Prefix(_) => {
                return Err(Refused::Absolute(path.into()))
            }
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    Ok(out)
}

/// The temporary name a file is written under until it is complete:
/// `.NAME.ml-part` beside it. A name too long for that (the file system
/// allows 255 bytes) keeps its first 200 bytes and gains a hash of the
/// whole, so the temporary name is the same at each try (for resume) and
/// never too long.
pub fn partial_name(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let short = if 1 + name.len() + PARTIAL_SUFFIX.len() <= MAX_NAME {
        name.to_string()
    } else {
        let mut cut = 200;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        let hash = blake3::hash(name.as_bytes()).to_hex();
        format!("{}.{}", &name[..cut], &hash[..16])
    };
    Some(path.with_file_name(format!(".{short}{PARTIAL_SUFFIX}")))
}

/// The longest file name, in bytes, of the file systems served.
pub const MAX_NAME: usize = 255;

/// Suffix of temporary names.
pub const PARTIAL_SUFFIX: &str = ".ml-part";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_refused_by_their_text() {
        assert_eq!(relative("a/./b/").unwrap(), PathBuf::from("a/b"));
        assert_eq!(relative("").unwrap(), PathBuf::from("."));
        assert_eq!(relative(".").unwrap(), PathBuf::from("."));
        assert!(matches!(relative("/etc/passwd"), Err(Refused::Absolute(_))));
        assert!(matches!(relative("../x"), Err(Refused::Parent(_))));
        assert!(matches!(relative("a/../../x"), Err(Refused::Parent(_))));
        assert!(matches!(relative("a/.."), Err(Refused::Parent(_))));
        assert_eq!(relative("a\0b"), Err(Refused::Nul));
    }

    #[test]
    fn long_names_keep_short_partial_names() {
        for len in [246, 247, 250, 255] {
            let name = "n".repeat(len);
            let p = partial_name(Path::new(&name)).unwrap();
            let part = p.to_str().unwrap();
            assert!(part.len() <= MAX_NAME, "{len}: {}", part.len());
            assert_eq!(
                partial_name(Path::new(&name)).unwrap(),
                p,
                "the same at each try"
            );
        }
        let a = partial_name(Path::new(&format!("{}a", "x".repeat(250)))).unwrap();
        let b = partial_name(Path::new(&format!("{}b", "x".repeat(250)))).unwrap();
        assert_ne!(a, b, "names that share 200 bytes keep apart");
        let wide = "é".repeat(127);
        assert!(
            partial_name(Path::new(&wide))
                .unwrap()
                .to_str()
                .unwrap()
                .len()
                <= MAX_NAME
        );
    }

    #[test]
    fn partial_names_are_hidden_siblings() {
        assert_eq!(
            partial_name(Path::new("d/f.dat")).unwrap(),
            PathBuf::from("d/.f.dat.ml-part")
        );
        assert_eq!(partial_name(Path::new(".")), None);
    }
}
