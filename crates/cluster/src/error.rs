//! What can be wrong with a cluster file, or with finding this process's
//! host in it.

use std::path::PathBuf;

use crate::Role;

/// A cluster file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not a cluster file (TOML syntax, an unknown field or
    /// role, a malformed address).
    #[error("{0}")]
    Syntax(#[from] toml::de::Error),
    /// A setting that must be positive is zero.
    #[error("[{section}] {key} must be positive")]
    NotPositive {
        /// The table.
        section: &'static str,
        /// The key.
        key: &'static str,
    },
    /// Two hosts share a name.
    #[error("host name {0:?} appears twice")]
    DuplicateName(String),
    /// Two hosts share a node id.
    #[error("node id {0} appears twice")]
    DuplicateNode(u32),
    /// A host that is not a storage host names a file service.
    #[error("host {0:?}: only storage hosts run the file service")]
    FilesNotOnStorage(String),
    /// A host without the address its role listens on.
    #[error("host {name:?} ({role:?}) has no address to listen on")]
    NoAddress {
        /// The host.
        name: String,
        /// Its role.
        role: Role,
    },
    /// A lane without gateways or without storage hosts.
    #[error("lane {0} needs at least one gateway and one storage host")]
    EmptyLane(usize),
    /// A lane names a host of the wrong role.
    #[error("lane {lane}: {name:?} is a {is:?} host, not {want:?}")]
    WrongRole {
        /// The lane's index.
        lane: usize,
        /// The host.
        name: String,
        /// Its role.
        is: Role,
        /// The role the lane needs there.
        want: Role,
    },
    /// A name that no host has.
    #[error("{context}no host named {name:?}")]
    NoHost {
        /// Where it was named ("lane 0: ", or empty).
        context: String,
        /// The name.
        name: String,
    },
    /// The launcher's rank variable is not a number.
    #[error("{var}={value} is not a rank")]
    BadRank {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The launcher's rank is past the hosts of the file.
    #[error("{var}={rank} but the file has {hosts} hosts")]
    RankPastHosts {
        /// The variable.
        var: &'static str,
        /// The rank.
        rank: usize,
        /// Hosts in the file.
        hosts: usize,
    },
    /// Neither a name nor a launcher's rank says which host this is.
    #[error("name the host with --host, or start under a launcher that sets SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK")]
    WhichHost,
    /// Segments that do not make one relay pair.
    #[error("segments: {0}")]
    Segment(String),
    /// A `[[macro]]` group or the `[manage]` table is wrong.
    #[error("macro-clusters: {0}")]
    Macro(String),
}
