//! The control protocol: what client and server say to each other over the
//! TCP contact connection. Pure data and codec, no I/O.
//!
//! Each message is a 4-byte little-endian length followed by that many
//! bytes of a postcard-encoded [`Request`] or [`Reply`]. A length over the
//! receiver's limit, a body that does not decode, or bytes left over after
//! it are [`ProtoError`]s, never a panic.
//!
//! ```text
//!  client                                   server
//!  ──────                                   ──────
//!                    ◄───────────────────── Reply::Challenge{nonce}
//!  Request::Auth{proof, nonce, fabric} ───►  proof checked, else refused
//!                    ◄───────────────────── Reply::Welcome{proof, fabric}
//!  Request::Stat / List / Mkdir / Remove / Sums ──► one Reply each
//!  Request::Get{streams: client regions} ─► Reply::Sending{size}
//!      data as puts into the client's regions, credits back
//!                    ◄───────────────────── Reply::Sent{bytes, digest}
//!  Request::Put{...} ─────────────────────► Reply::Receiving{streams: server regions}
//!      data as puts into the server's regions, credits back
//!  Request::Commit{bytes, digest} ────────► Reply::Done (renamed into place)
//! ```
//!
//! When the cluster puts I/O gateways between the two, a `Get` or `Put`
//! names a [`Lane`]: the data goes as chunks striped over the gateways
//! (see `macrolink-gwnet`) instead of puts, and the digests are the same.

use serde::{Deserialize, Serialize};

/// Version of this protocol; a server refuses clients of another.
pub const VERSION: u16 = 4;
/// Largest request a server reads.
pub const MAX_REQUEST: usize = 64 << 10;
/// Largest reply a client reads (a long directory listing).
pub const MAX_REPLY: usize = 64 << 20;

/// How a peer reaches one's fabric node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricInfo {
    /// Node id.
    pub node: u32,
    /// Host identity (the kernel's boot id): equal ids share memory.
    pub host: String,
    /// Directory where the node meets others of its host.
    pub shm_dir: String,
    /// TCP address of the node.
    pub tcp: String,
    /// Whether this side takes shared memory when the hosts match.
    pub shm: bool,
    /// Whether this side's node speaks UCX.
    pub ucx: bool,
}

impl FabricInfo {
    /// The transport two nodes should use: shared memory when both are on
    /// one host, meet in one directory and take it; else UCX when both
    /// speak it; else TCP.
    pub fn transport_to(&self, other: &FabricInfo) -> macrolink_fabric::Transport {
        let same = self.shm
            && other.shm
            && !self.host.is_empty()
            && self.host == other.host
            && self.shm_dir == other.shm_dir;
        if same {
            macrolink_fabric::Transport::Shm
        } else if self.ucx && other.ucx {
            macrolink_fabric::Transport::Ucx
        } else {
            macrolink_fabric::Transport::Tcp
        }
    }
}

/// One data stream's receiving end: an endpoint and its registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamEnd {
    /// Endpoint id on the receiver's node.
    pub ep: u32,
    /// Access key of the region.
    pub key: u64,
}

/// The shape of a bulk transfer: bytes `[offset, offset + len)` of a file,
/// cut in chunks of `chunk` bytes dealt round-robin over the streams, each
/// stream with `slots` chunk-sized slots in its receiving region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// First byte.
    pub offset: u64,
    /// Bytes to move.
    pub len: u64,
    /// Chunk size.
    pub chunk: u32,
    /// Slots per stream.
    pub slots: u32,
}

/// Most streams one transfer may use.
pub const MAX_STREAMS: u32 = 64;
/// Most bytes of one stream's receiving region.
pub const MAX_REGION: u64 = 1 << 30;

impl Shape {
    /// Number of chunks.
    pub fn chunks(&self) -> u64 {
        self.len.div_ceil(self.chunk.max(1) as u64)
    }

    /// File offset and length of chunk `i`.
    pub fn chunk_at(&self, i: u64) -> (u64, usize) {
        let rel = i * self.chunk as u64;
        let n = (self.len - rel.min(self.len)).min(self.chunk as u64);
        (self.offset + rel, n as usize)
    }

    /// Bytes of each stream's receiving region.
    pub fn region_len(&self) -> usize {
        self.chunk as usize * self.slots as usize
    }

    /// Checks the numbers a peer sent; the error says what is wrong.
    pub fn check(&self, streams: u32) -> Result<(), String> {
        if !(4096..=64 << 20).contains(&self.chunk) {
            return Err(format!("chunk of {} bytes (4 KiB to 64 MiB)", self.chunk));
        }
        if self.slots == 0 || self.chunk as u64 * self.slots as u64 > MAX_REGION {
            return Err(format!("{} slots of {} bytes", self.slots, self.chunk));
        }
        if streams == 0 || streams > MAX_STREAMS {
            return Err(format!("{streams} streams (1 to {MAX_STREAMS})"));
        }
        if self.offset.checked_add(self.len).is_none() {
            return Err("range past 2^64".into());
        }
        Ok(())
    }
}

/// The data of a transfer goes through I/O gateways: chunks striped over
/// the live ones, acknowledged end to end, sent again through another when
/// one dies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lane {
    /// The gateways' endpoints, as (node, endpoint).
    pub gateways: Vec<(u32, u32)>,
    /// The client's endpoint that sends (`Put`) or receives (`Get`).
    pub ep: u32,
    /// `Get`: the transfer id the client accepts chunks of.
    pub key: u64,
}

/// Most gateways one lane may name.
pub const MAX_GATEWAYS: usize = 64;

/// How a `Put` lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Landing {
    /// Into a temporary name, renamed over the final one once verified.
    Replace {
        /// Keep the partial data if the transfer fails, to resume later.
        keep_partial: bool,
    },
    /// Into the file itself at the given offset (parallel writers of one
    /// file, as in the N-to-1 pattern); created if missing.
    InPlace,
}

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Answer to the challenge.
    Auth {
        /// Protocol version of the client.
        version: u16,
        /// Keyed hash of the server's nonce.
        proof: [u8; 32],
        /// The client's nonce, for the server to prove itself.
        nonce: [u8; 32],
        /// The client's fabric node.
        fabric: FabricInfo,
    },
    /// Metadata of one path.
    Stat {
        /// Path under the export root.
        path: String,
    },
    /// Entries of a directory.
    List {
        /// Path under the export root.
        path: String,
    },
    /// Makes a directory.
    Mkdir {
        /// Path under the export root.
        path: String,
        /// Make missing parents too, and accept an existing directory.
        parents: bool,
    },
    /// Removes a file, or a directory.
    Remove {
        /// Path under the export root.
        path: String,
        /// Remove a directory with everything in it.
        recursive: bool,
    },
    /// Digests of the chunks of a file (or of its partial upload), for
    /// resuming.
    Sums {
        /// Path under the export root.
        path: String,
        /// Chunk size.
        chunk: u32,
        /// The partial upload of the path rather than the file.
        partial: bool,
    },
    /// Sends bytes of a file to the client's regions.
    Get {
        /// Path under the export root.
        path: String,
        /// Range and chunking; `len` is cut to the file's end.
        shape: Shape,
        /// The client's receiving ends, one per stream.
        streams: Vec<StreamEnd>,
        /// Hash the chunks for the end-to-end check.
        verify: bool,
        /// Through I/O gateways instead of `streams`.
        lane: Option<Lane>,
    },
    /// Receives bytes of a file from the client.
    Put {
        /// Path under the export root.
        path: String,
        /// Size of the whole file once written (Replace) or ignored (InPlace).
        size: u64,
        /// Range and chunking.
        shape: Shape,
        /// Streams the client will send over.
        streams: u32,
        /// Acknowledge only once the data is durable.
        sync: bool,
        /// Where the bytes land.
        landing: Landing,
        /// Hash the chunks for the end-to-end check.
        verify: bool,
        /// Through I/O gateways: the server answers with one stream end,
        /// its receiving endpoint and the transfer id it accepts.
        lane: Option<Lane>,
        /// Write the file past the page cache (`O_DIRECT`) where the file
        /// system does direct I/O (see [`crate::direct`]).
        direct: bool,
    },
    /// Ends a `Put`: every byte has been sent.
    Commit {
        /// Bytes sent.
        bytes: u64,
        /// Digest of what was sent (see [`crate::sums`]).
        digest: [u8; 16],
    },
}

/// Kind of a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Anything else.
    Other,
}

/// Metadata of one path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Name within its directory.
    pub name: String,
    /// Kind.
    pub kind: Kind,
    /// Bytes.
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Permission bits.
    pub mode: u32,
}

impl Meta {
    /// Its line in a listing, as `ls -l` shows one: kind and mode, size,
    /// modification time, name.
    pub fn ls_line(&self) -> String {
        let kind = match self.kind {
            Kind::File => '-',
            Kind::Dir => 'd',
            Kind::Other => '?',
        };
        format!(
            "{kind}{:04o} {:>14} {:>11} {}",
            self.mode,
            self.size,
            self.mtime,
            shown(&self.name)
        )
    }

    /// Every field, a line each.
    pub fn details(&self) -> String {
        format!(
            "name: {}\nkind: {:?}\nsize: {}\nmode: {:04o}\nmtime: {}\n",
            shown(&self.name),
            self.kind,
            self.size,
            self.mode,
            self.mtime
        )
    }
}

/// A name as a terminal may show it: control characters (a newline, an
/// escape that would drive the terminal) and backslashes escaped, as
/// `ls -b` does.
pub fn shown(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_control() || c == '\\' {
            s.extend(c.escape_default());
        } else {
            s.push(c);
        }
    }
    s
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Code {
    /// No such file or directory.
    NotFound,
    /// Authentication failed.
    Auth,
    /// The path leaves the export root, or names something not allowed.
    Escape,
    /// The export is read-only.
    ReadOnly,
    /// Permission denied by the file system.
    Denied,
    /// Already exists.
    Exists,
    /// Directory not empty.
    NotEmpty,
    /// Not a directory, or a directory where a file was expected.
    WrongKind,
    /// No space left on the device.
    NoSpace,
    /// A limit of connections or open files is reached.
    Busy,
    /// The request was malformed or out of order.
    BadRequest,
    /// The data did not match its digest.
    Mismatch,
    /// The data stream broke.
    Lost,
    /// Any other I/O error.
    Io,
    /// The host is excluded by the cluster's central manager.
    Excluded,
}

/// What a server answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// First message of a connection.
    Challenge {
        /// Protocol version of the server.
        version: u16,
        /// Nonce the client must prove knowledge of the secret against.
        nonce: [u8; 32],
    },
    /// Authentication succeeded.
    Welcome {
        /// Keyed hash of the client's nonce.
        proof: [u8; 32],
        /// The server's fabric node.
        fabric: FabricInfo,
    },
    /// The request succeeded and has nothing to say.
    Ok,
    /// Metadata.
    Meta(Meta),
    /// Directory entries, sorted by name.
    Entries(Vec<Meta>),
    /// Chunk digests of a file: its size and one digest per whole or last
    /// chunk.
    Sums {
        /// Bytes of the file.
        size: u64,
        /// One digest per chunk.
        digests: Vec<[u8; 16]>,
    },
    /// A `Get` is under way.
    Sending {
        /// Size of the whole file.
        size: u64,
        /// Bytes that will be sent.
        len: u64,
        /// Through a lane: the server's sending endpoint (0 otherwise).
        ep: u32,
    },
    /// A `Get` has sent everything.
    Sent {
        /// Bytes sent.
        bytes: u64,
        /// Digest of what was read and sent.
        digest: [u8; 16],
    },
    /// A `Put` may start: the server's receiving ends.
    Receiving {
        /// One per stream.
        streams: Vec<StreamEnd>,
    },
    /// The request failed.
    Error {
        /// Why.
        code: Code,
        /// For a person.
        message: String,
    },
}

/// A control message that could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    /// The length prefix exceeds the limit.
    #[error("message of {len} bytes exceeds the limit of {limit}")]
    TooLong {
        /// Announced length.
        len: usize,
        /// Limit.
        limit: usize,
    },
    /// The body is not a valid message.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// Bytes follow the message inside its frame.
    #[error("{0} stray bytes after the message")]
    Trailing(usize),
}

/// Encodes a message with its length prefix.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut out = vec![0u8; 4];
    let body = postcard::to_stdvec(msg).expect("encoding into a Vec cannot fail");
    out[..4].copy_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Checks a length prefix against `limit`.
pub fn frame_len(prefix: [u8; 4], limit: usize) -> Result<usize, ProtoError> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > limit {
        return Err(ProtoError::TooLong { len, limit });
    }
    Ok(len)
}

/// Decodes one message body (without its prefix).
pub fn decode<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ProtoError> {
    let (msg, rest) =
        postcard::take_from_bytes(body).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(ProtoError::Trailing(rest.len()));
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip<T: Serialize + for<'a> Deserialize<'a> + PartialEq + std::fmt::Debug>(m: T) {
        let bytes = encode(&m);
        let len = frame_len(bytes[..4].try_into().unwrap(), MAX_REPLY).unwrap();
        assert_eq!(len, bytes.len() - 4);
        assert_eq!(decode::<T>(&bytes[4..]).unwrap(), m);
    }

    #[test]
    fn messages_round_trip() {
        round_trip(Request::Get {
            path: "a/b".into(),
            shape: Shape {
                offset: 7,
                len: u64::MAX,
                chunk: 1 << 20,
                slots: 8,
            },
            streams: vec![StreamEnd { ep: 3, key: 99 }],
            verify: true,
            lane: None,
        });
        round_trip(Request::Get {
            path: "a".into(),
            shape: Shape {
                offset: 0,
                len: 9,
                chunk: 4096,
                slots: 1,
            },
            streams: vec![],
            verify: false,
            lane: Some(Lane {
                gateways: vec![(21, 1), (22, 1)],
                ep: 5,
                key: u64::MAX,
            }),
        });
        round_trip(Request::Put {
            path: "x".into(),
            size: 5,
            shape: Shape {
                offset: 0,
                len: 5,
                chunk: 4096,
                slots: 2,
            },
            streams: 2,
            sync: true,
            landing: Landing::Replace { keep_partial: true },
            verify: false,
            lane: None,
            direct: true,
        });
        round_trip(Reply::Sending {
            size: 3,
            len: 2,
            ep: 17,
        });
        round_trip(Reply::Error {
            code: Code::Escape,
            message: "no".into(),
        });
        round_trip(Reply::Entries(vec![Meta {
            name: "f".into(),
            kind: Kind::File,
            size: 1,
            mtime: -1,
            mode: 0o644,
        }]));
    }

    #[test]
    fn bad_frames_are_errors() {
        assert!(matches!(
            frame_len((MAX_REQUEST as u32 + 1).to_le_bytes(), MAX_REQUEST),
            Err(ProtoError::TooLong { .. })
        ));
        assert!(matches!(
            decode::<Request>(&[200]),
            Err(ProtoError::Malformed(_))
        ));
        let mut ok = encode(&Request::Stat { path: "a".into() });
        ok.push(0);
        assert_eq!(decode::<Request>(&ok[4..]), Err(ProtoError::Trailing(1)));
        // A string whose length runs past the end.
        assert!(decode::<Request>(&[1, 0xff, 0xff, 0xff, 0x0f]).is_err());
    }

    #[test]
    fn shapes_cut_ranges_into_chunks() {
        let s = Shape {
            offset: 100,
            len: 10_000,
            chunk: 4096,
            slots: 2,
        };
        assert_eq!(s.chunks(), 3);
        assert_eq!(s.chunk_at(0), (100, 4096));
        assert_eq!(s.chunk_at(2), (100 + 8192, 10_000 - 8192));
        assert!(s.check(1).is_ok());
        assert!(s.check(0).is_err());
        assert!(s.check(MAX_STREAMS + 1).is_err());
        assert!(Shape { chunk: 10, ..s }.check(1).is_err());
        assert!(Shape { slots: 0, ..s }.check(1).is_err());
        assert!(Shape {
            offset: u64::MAX,
            ..s
        }
        .check(1)
        .is_err());
        assert_eq!(Shape { len: 0, ..s }.chunks(), 0);
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<Request>(&bytes);
            let _ = decode::<Reply>(&bytes);
        }
    }
}
