//! Control messages between the two sides of a benchmark: fixed little-endian
//! records, decoded with a typed error, never a panic.

use macrolink_fabric::{Completion, Mode, Pages, Transport};
use thiserror::Error;

/// What a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// Unidirectional stream of `count` messages or puts.
    Bandwidth,
    /// Ping-pong: the target answers each message.
    PingPong,
    /// Both sides send, then both receive.
    PingPing,
    /// Each side sends one to the other and receives one (IMB SendRecv on two ranks).
    SendRecv,
    /// Each side sends two (one per neighbour) and receives two.
    Exchange,
    /// Clock exchange: the target answers each probe with its clock.
    Clock,
    /// One-way: the target records the arrival time of each message.
    OneWay,
    /// Breakdown: as OneWay, with the target's probe stages.
    Breakdown,
    /// The target process exits.
    Quit,
}

impl Test {
    /// The IMB patterns of a latency run, as the command line names them.
    pub const PATTERNS: &'static [&'static str] =
        &["ping-pong", "ping-ping", "send-recv", "exchange"];
}

impl std::str::FromStr for Test {
    type Err = String;
    /// A latency pattern by its command-line name.
    fn from_str(s: &str) -> Result<Test, String> {
        match s {
            "ping-pong" => Ok(Test::PingPong),
            "ping-ping" => Ok(Test::PingPing),
            "send-recv" => Ok(Test::SendRecv),
            "exchange" => Ok(Test::Exchange),
            _ => Err(format!("{s:?} is not one of {:?}", Test::PATTERNS)),
        }
    }
}

impl Test {
    const ALL: [Test; 9] = [
        Test::Bandwidth,
        Test::PingPong,
        Test::PingPing,
        Test::SendRecv,
        Test::Exchange,
        Test::Clock,
        Test::OneWay,
        Test::Breakdown,
        Test::Quit,
    ];
}

/// Why a control record is not valid.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    /// Too short for its kind.
    #[error("control record of {0} bytes is truncated")]
    Truncated(usize),
    /// An unknown code in a field.
    #[error("unknown {field} code {code}")]
    Unknown {
        /// Field name.
        field: &'static str,
        /// Code found.
        code: u8,
    },
    /// A message size past what a target allocates for.
    #[error("message size {0} exceeds the largest a target takes ({MAX_SIZE} bytes)")]
    TooLarge(u64),
}

/// Largest message size a run may ask for: the target's buffer grows to it.
pub const MAX_SIZE: u64 = 64 << 20;

/// Start of a run, initiator to target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start {
    /// What to measure.
    pub test: Test,
    /// Mode of the data target.
    pub mode: Mode,
    /// Transport of the data target.
    pub transport: Transport,
    /// How the target waits.
    pub completion: Completion,
    /// Bytes per message.
    pub size: u64,
    /// Messages (or iterations).
    pub count: u64,
    /// A reliable bandwidth run: the target notes when its messages
    /// arrive and sends the notes back in its [`Done`].
    pub arrivals: bool,
    /// The pages the target's receive buffer lies on (and the
    /// initiator's send buffer, in a bandwidth run).
    pub pages: Pages,
}

const START_LEN: usize = 24;

fn code<T: Copy + PartialEq>(all: &[T], v: T) -> u8 {
    all.iter().position(|x| *x == v).unwrap_or(0) as u8
}

fn pick<T: Copy>(all: &[T], field: &'static str, c: u8) -> Result<T, ProtoError> {
    all.get(c as usize)
        .copied()
        .ok_or(ProtoError::Unknown { field, code: c })
}

const MODES: [Mode; 3] = [Mode::Datagram, Mode::Reliable, Mode::Put];
const TRANSPORTS: [Transport; 4] = [
    Transport::Shm,
    Transport::Tcp,
    Transport::Udp,
    Transport::Ucx,
];
const COMPLETIONS: [Completion; 2] = [Completion::Poll, Completion::Wait];
const PAGES: [Pages; 2] = [Pages::Base, Pages::Huge];

impl Start {
    /// Wire form.
    pub fn encode(&self) -> [u8; START_LEN] {
        let mut b = [0u8; START_LEN];
        b[0] = code(&Test::ALL, self.test);
        b[1] = code(&MODES, self.mode);
        b[2] = code(&TRANSPORTS, self.transport);
        b[3] = code(&COMPLETIONS, self.completion);
        b[4] = u8::from(self.arrivals);
        b[5] = code(&PAGES, self.pages);
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b
    }

    /// Reads a start record.
    pub fn decode(b: &[u8]) -> Result<Start, ProtoError> {
        if b.len() < START_LEN {
            return Err(ProtoError::Truncated(b.len()));
        }
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let size = u64_at(8);
        if size > MAX_SIZE {
            return Err(ProtoError::TooLarge(size));
        }
        Ok(Start {
            test: pick(&Test::ALL, "test", b[0])?,
            mode: pick(&MODES, "mode", b[1])?,
            transport: pick(&TRANSPORTS, "transport", b[2])?,
            completion: pick(&COMPLETIONS, "completion", b[3])?,
            size,
            count: u64_at(16),
            arrivals: b[4] & 1 != 0,
            pages: pick(&PAGES, "pages", b[5])?,
        })
    }
}

/// End of a run, target to initiator: the target's own figures, then any
/// samples: per-message nanosecond timestamps (one-way runs), or pairs of
/// an arrival's time and the messages so far (reliable bandwidth runs that
/// asked for arrivals).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Done {
    /// CPU nanoseconds the target used.
    pub cpu_ns: u64,
    /// Wall nanoseconds from its Ready to its last message.
    pub wall_ns: u64,
    /// Payload bytes it received.
    pub bytes: u64,
    /// Messages it received.
    pub messages: u64,
    /// Samples (meaning depends on the test).
    pub samples: Vec<u64>,
}

impl Done {
    /// Wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32 + 8 * self.samples.len());
        for v in [self.cpu_ns, self.wall_ns, self.bytes, self.messages] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in &self.samples {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Reads a done record.
    pub fn decode(b: &[u8]) -> Result<Done, ProtoError> {
        if b.len() < 32 || !b.len().is_multiple_of(8) {
            return Err(ProtoError::Truncated(b.len()));
        }
        let mut words = b.chunks_exact(8).map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        });
        let mut next = || words.next().unwrap_or(0);
        let (cpu_ns, wall_ns, bytes, messages) = (next(), next(), next(), next());
        Ok(Done {
            cpu_ns,
            wall_ns,
            bytes,
            messages,
            samples: words.collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let s = Start {
            test: Test::Exchange,
            mode: Mode::Put,
            transport: Transport::Udp,
            completion: Completion::Wait,
            size: 4_000_000,
            count: 77,
            arrivals: false,
            pages: Pages::Base,
        };
        assert_eq!(Start::decode(&s.encode()), Ok(s));
        let a = Start {
            test: Test::Bandwidth,
            mode: Mode::Reliable,
            arrivals: true,
            pages: Pages::Huge,
            ..s
        };
        assert_eq!(Start::decode(&a.encode()), Ok(a));
        let d = Done {
            cpu_ns: 1,
            wall_ns: 2,
            bytes: 3,
            messages: 4,
            samples: vec![5, 6],
        };
        assert_eq!(Done::decode(&d.encode()), Ok(d));
    }

    #[test]
    fn bad_records_are_refused() {
        assert_eq!(Start::decode(&[0; 3]), Err(ProtoError::Truncated(3)));
        let mut b = [0u8; START_LEN];
        b[0] = 200;
        assert!(matches!(
            Start::decode(&b),
            Err(ProtoError::Unknown { field: "test", .. })
        ));
        let mut b = [0u8; START_LEN];
        b[5] = 2;
        assert!(matches!(
            Start::decode(&b),
            Err(ProtoError::Unknown { field: "pages", .. })
        ));
        assert!(Done::decode(&[0; 33]).is_err());
        for n in 0..64 {
            let _ = Start::decode(&vec![0xff; n]);
            let _ = Done::decode(&vec![0xff; n]);
        }
    }
}
