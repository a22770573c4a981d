//! What can go wrong for a client, and the exit code a script sees for it.

use std::io;

use crate::data::DataError;
use crate::proto::{Code, ProtoError};

/// Exit codes of the client commands.
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// Any failure not listed below.
    pub const OTHER: i32 = 1;
    /// Bad command line (also clap's code).
    pub const USAGE: i32 = 2;
    /// No such file or directory.
    pub const NOT_FOUND: i32 = 3;
    /// Refused: authentication, permissions, a path outside the export, a
    /// read-only export.
    pub const REFUSED: i32 = 4;
    /// The data did not verify.
    pub const MISMATCH: i32 = 5;
    /// The server could not be reached, or the connection broke.
    pub const CONNECTION: i32 = 6;
    /// No space left on the device.
    pub const NO_SPACE: i32 = 7;
    /// Exists already, or a directory is not empty, or the wrong kind.
    pub const CONFLICT: i32 = 8;
    /// A server limit was reached; try again later.
    pub const BUSY: i32 = 9;

    /// A reader of the output went away (`| head`): the status a shell
    /// gives any tool that SIGPIPE ended.
    pub const CLOSED_PIPE: i32 = 141;

    /// Writes a client command's output; a reader that has gone ends the
    /// process quietly, as it ends any Unix tool.
    pub fn print(text: &str) -> Result<(), super::Error> {
        use std::io::Write;
        match std::io::stdout().lock().write_all(text.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(CLOSED_PIPE),
            r => r.map_err(|e| super::Error::local("standard output", e)),
        }
    }
}

/// A failed client operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server refused the request.
    #[error("{message}")]
    Remote {
        /// Why.
        code: Code,
        /// The server's words.
        message: String,
    },
    /// The server's proof did not match: it does not know the secret.
    #[error("the server failed to prove it knows the secret")]
    ServerNotAuthentic,
    /// The server speaks another protocol version.
    #[error("server speaks protocol version {0}, this client {1}")]
    Version(u16, u16),
    /// The server sent something that is not a valid reply.
    #[error("bad reply from the server: {0}")]
    Proto(#[from] ProtoError),
    /// The server answered out of turn.
    #[error("unexpected reply from the server: {0}")]
    Unexpected(String),
    /// The contact connection failed.
    #[error("{context}: {source}")]
    Connection {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A local file operation failed.
    #[error("{context}: {source}")]
    Local {
        /// What was being done, on which path.
        context: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The data path failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The fabric could not be set up.
    #[error("fabric: {0}")]
    Fabric(#[from] macrolink_fabric::Error),
    /// The copy did not verify.
    #[error("checksum mismatch on {0}: the copy was not kept")]
    Mismatch(String),
    /// The request cannot be done as asked.
    #[error("{0}")]
    Usage(String),
    /// Another transfer is writing the same local file.
    #[error("{0}: another copy to this name is in progress; try again when it ends")]
    Busy(String),
}

/// Result of a client operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Remote { code, .. } => code_exit(*code),
            Error::Busy(_) => exit::BUSY,
            Error::ServerNotAuthentic => exit::REFUSED,
            Error::Version(..) | Error::Proto(_) | Error::Unexpected(_) => exit::CONNECTION,
            Error::Connection { .. } => exit::CONNECTION,
            Error::Local { source, .. } => code_exit(crate::ops::code_of(source)),
            Error::Data(DataError::File(e)) => code_exit(crate::ops::code_of(e)),
            Error::Data(_) | Error::Fabric(_) => exit::CONNECTION,
            Error::Mismatch(_) => exit::MISMATCH,
            Error::Usage(_) => exit::USAGE,
        }
    }

    /// A local failure on `path`.
    pub fn local(context: impl std::fmt::Display, source: io::Error) -> Error {
        Error::Local {
            context: context.to_string(),
            source,
        }
    }
}

fn code_exit(code: Code) -> i32 {
    match code {
        Code::NotFound => exit::NOT_FOUND,
        Code::Auth | Code::Escape | Code::ReadOnly | Code::Denied | Code::Excluded => exit::REFUSED,
        Code::Exists | Code::NotEmpty | Code::WrongKind => exit::CONFLICT,
        Code::NoSpace => exit::NO_SPACE,
        Code::Busy => exit::BUSY,
        Code::Mismatch => exit::MISMATCH,
        Code::Lost => exit::CONNECTION,
        Code::BadRequest | Code::Io => exit::OTHER,
    }
}
