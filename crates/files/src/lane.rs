//! The data path through I/O gateways: a transfer's chunks striped over the
//! live gateways of a lane (see `macrolink-gwnet`), each placed once at its
//! offset in the file, acknowledged end to end, and sent again through
//! another gateway when one dies. The digests are those of the direct path,
//! so the end-to-end check is the same.
//!
//! ```text
//!  Put: client ── Chunk ──► gateway ×N ── Chunk ──► server endpoint (pwrite)
//!              ◄── Ack ───           ◄── Ack ────
//!  Get: client ── Hello ──► gateway ×N ── Hello ──► server endpoint
//!       (pwrite) ◄ Chunk ─           ◄── Chunk ──  (the gateways' own
//!              ── Ack ───►           ── Ack ────►   connections carry them)
//! ```

use macrolink_cluster::{Cluster, Host, Role};
use macrolink_fabric::{Addr, Endpoint, EndpointConfig, Error as FabricError};
use macrolink_gateway::heard::Heard;
use macrolink_gateway::msg::Msg;
use macrolink_gateway::stripe::{Chunk, StripeConfig};
use macrolink_gwnet::client::{stripe, SendConfig};
use macrolink_gwnet::sink::{receive as receive_chunks, Expect};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::data::{DataError, Shared, Sink, Source};
use crate::proto::Shape;
use crate::sums::Digest;

/// How a client reaches a server's data through gateways.
#[derive(Clone, Debug)]
pub struct Route {
    /// Each gateway's endpoint and the address its node listens on.
    pub gateways: Vec<(Addr, SocketAddr)>,
    /// Striping and heartbeats (the chunk size is the transfer's).
    pub send: SendConfig,
}

impl Route {
    /// The gateways not excluded by the central manager now.
    pub fn live(&self) -> Vec<Addr> {
        let out = |a: &Addr| {
            self.send
                .excluded
                .as_ref()
                .is_some_and(|x| x.contains(a.node))
        };
        self.gateways
            .iter()
            .map(|g| g.0)
            .filter(|a| !out(a))
            .collect()
    }
}

/// Adds what cluster `c` says to `opts`: the contact address of each
/// storage host's file service by host name, and for each one that a lane
/// serves, the route through that lane's gateways. A client on host `me`
/// of a file with two segments reaches the other segment's hosts through
/// its relay.
pub fn add_routes(c: &Cluster, me: Option<&Host>, opts: &mut crate::ClientOptions) {
    let dial = |h: &Host| match me {
        Some(me) => c.address_of(me, h),
        None => h.listen(),
    };
    // The transfers of this process share what they hear of the gateways.
    let heard = Heard::new();
    for s in c.with_role(Role::Storage) {
        let Some(files) = s.files else { continue };
        opts.hosts.insert(s.name.clone(), files);
        if let Some(me) = me.filter(|me| c.across(me, s)) {
            if let Some(relay) = c.address_of(me, s) {
                opts.relayed.insert(files, (s.node, relay));
            }
        }
        if let (None, Some(seg)) = (me, c.segment_of(&s.name)) {
            let hint = format!(
                "{} is in segment {} of the cluster file; from the other segment, \
                 name this host with --host so that its relay is used",
                s.name, seg.name
            );
            opts.segment_hints.insert(files, hint);
        }
        let Some(lane) = c.lane_of(&s.name) else {
            continue;
        };
        let gateways = c
            .gateways_of(lane)
            .filter_map(|g| Some((Addr::new(g.node, 1), dial(g)?)))
            .collect();
        opts.lanes.insert(
            files,
            Route {
                gateways,
                send: SendConfig {
                    excluded: opts.excluded.clone(),
                    heard: Some(heard.clone()),
                    // To the gateways over the fast fabric's transport.
                    transport: if opts.ucx.is_some() {
                        macrolink_fabric::Transport::Ucx
                    } else {
                        macrolink_fabric::Transport::Tcp
                    },
                    ..SendConfig::from_cluster(c)
                },
            },
        );
    }
}

/// The far side of a lane transfer.
#[derive(Clone, Copy, Debug)]
pub struct Far<'a> {
    /// The gateways between.
    pub gateways: &'a [Addr],
    /// The endpoint at the other end.
    pub peer: Addr,
    /// The transfer id (the receiver's key).
    pub key: u64,
}

/// A transfer that acknowledges nothing for this long fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// How long a server waits for the gateways to say hello before a `Get`.
pub const HELLO_WAIT: Duration = Duration::from_secs(2);

/// Settings of lane endpoints: those of the gateway protocol.
pub fn endpoint_config() -> EndpointConfig {
    macrolink_gwnet::endpoint_config()
}

/// What a lane transfer did, for the record: what went through each
/// gateway, and what held the transfer back as the side that reports it
/// saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Carried {
    /// Chunks that went through each gateway, by its node.
    pub per_gateway: Vec<(u32, u64)>,
    /// The side that reports: the sender, or the receiver.
    pub sender: bool,
    /// The sender's chunks sent again (a gateway died or a chunk timed
    /// out).
    pub resent: u64,
    /// The receiver's chunks that came again (sent again while the first
    /// copy was on its way) and were dropped.
    pub duplicates: u64,
    /// Times the sender took a gateway out of use (one that went twice
    /// counts twice; one the central manager excluded counts).
    pub failovers: u64,
    /// The longest time without progress: the sender's without a new
    /// chunk acknowledged, the receiver's between two chunks placed (its
    /// own writes included).
    pub longest_stall: Duration,
}

impl std::fmt::Display for Carried {
    /// What held the transfer back, in the words of the side that saw it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.sender {
            write!(
                f,
                "chunks sent again: {}, failovers: {}",
                self.resent, self.failovers
            )?;
        } else {
            write!(f, "chunks that came twice: {}", self.duplicates)?;
        }
        write!(
            f,
            ", longest stall: {:.1} ms",
            self.longest_stall.as_secs_f64() * 1e3
        )
    }
}

fn data_error(e: FabricError, shared: &Shared) -> DataError {
    match e {
        _ if shared.abort.load(Ordering::Relaxed) => DataError::Aborted,
        FabricError::Io(e) => DataError::File(e),
        e => DataError::Fabric(e),
    }
}

/// A wait for the rate limit that ended in an abort, as the chunk
/// callbacks report it (the abort flag then names the cause).
fn paced(e: DataError) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Sends bytes `shape` of `source` to `far`; returns the digests of its
/// chunks by index once every chunk is acknowledged.
pub fn send(
    ep: &mut Endpoint,
    far: Far<'_>,
    shape: &Shape,
    source: &dyn Source,
    shared: &Shared,
    cfg: SendConfig,
) -> Result<(Vec<(u64, Digest)>, Carried), DataError> {
    let mut digests: Vec<Option<Digest>> = vec![None; shape.chunks() as usize];
    let mut read = |c: Chunk, buf: &mut [u8]| -> std::io::Result<()> {
        let first = matches!(digests.get(c.seq as usize), Some(None));
        if first {
            shared.pace(buf.len()).map_err(paced)?;
        }
        source.read_at(buf, shape.offset + c.offset)?;
        if let Some(d @ None) = digests.get_mut(c.seq as usize) {
            *d = Some(shared.digest(buf));
            shared.bytes.fetch_add(c.len, Ordering::Relaxed);
        }
        Ok(())
    };
    let cfg = SendConfig {
        stripe: StripeConfig {
            chunk: u64::from(shape.chunk),
            ..cfg.stripe
        },
        patience: PATIENCE.as_nanos() as u64,
        ..cfg
    };
    let mut progress = |_: u64, _: u64| !shared.abort.load(Ordering::Relaxed);
    let r = stripe(
        ep,
        far.gateways,
        far.peer,
        far.key,
        shape.len,
        &mut read,
        cfg,
        &mut progress,
    );
    let report = shared.stop_others_on_error(r.map_err(|e| data_error(e, shared)))?;
    let list = digests
        .into_iter()
        .enumerate()
        .filter_map(|(i, d)| d.map(|d| (i as u64, d)))
        .collect();
    let carried = Carried {
        per_gateway: far
            .gateways
            .iter()
            .zip(&report.per_gateway)
            .map(|(g, n)| (g.node, *n))
            .collect(),
        sender: true,
        resent: report.resent,
        duplicates: 0,
        failovers: report.failovers,
        longest_stall: Duration::from_secs_f64(report.longest_stall),
    };
    Ok((list, carried))
}

/// Receives bytes `shape` from `far` into `sink` until `done` is set (the
/// sender has said over the contact connection that every chunk is
/// acknowledged) or the transfer is aborted. With `hello`, says hello
/// through the gateways so that they carry the sender's chunks here (a
/// `Get`). Returns the digests of the chunks by index.
pub fn receive(
    ep: &mut Endpoint,
    far: Far<'_>,
    shape: &Shape,
    sink: &dyn Sink,
    shared: &Shared,
    done: &AtomicBool,
    hello: bool,
) -> Result<(Vec<(u64, Digest)>, Carried), DataError> {
    let mut list = Vec::new();
    let mut place = |c: Chunk, data: &[u8]| -> std::io::Result<()> {
        shared.pace(data.len()).map_err(paced)?;
        sink.write_at(data, shape.offset + c.offset)?;
        list.push((c.seq, shared.digest(data)));
        shared.bytes.fetch_add(c.len, Ordering::Relaxed);
        Ok(())
    };
    let expect = Expect {
        transfer: far.key,
        from: far.peer,
        total: shape.len,
        chunk: u64::from(shape.chunk),
    };
    let stop = || done.load(Ordering::Relaxed) || shared.abort.load(Ordering::Relaxed);
    let hello = hello.then_some(far.gateways);
    let r = receive_chunks(ep, expect, &mut place, hello, &stop);
    let report = shared.stop_others_on_error(r.map_err(|e| data_error(e, shared)))?;
    Ok((
        list,
        Carried {
            per_gateway: report.per_gateway,
            sender: false,
            resent: 0,
            duplicates: report.duplicates,
            failovers: 0,
            longest_stall: Duration::from_nanos(report.longest_gap),
        },
    ))
}

/// Waits until each of `gateways` has said hello on `ep` (it has opened
/// its connection here), or `wait` has passed; returns how many did.
pub fn await_hellos(ep: &mut Endpoint, gateways: &[Addr], wait: Duration) -> usize {
    let mut seen = vec![false; gateways.len()];
    let start = Instant::now();
    let mut buf = vec![0u8; 256];
    while seen.iter().any(|s| !s) && start.elapsed() < wait {
        if let Ok(Some(r)) = ep.read_timeout(&mut buf, Duration::from_millis(20)) {
            if let Ok(Msg::Hello { .. }) = Msg::decode(&buf[..r.len]) {
                if let Some(i) = gateways.iter().position(|g| *g == r.from) {
                    seen[i] = true;
                }
            }
        }
    }
    seen.iter().filter(|s| **s).count()
}
