//! The storage side: counts each chunk of a transfer once, acknowledges each
//! copy through the gateway it came by, and checks the whole transfer's hash.
//!
//! [`run`] is a measuring sink, as an iperf3 server is: it hashes each new
//! chunk as it goes by and keeps nothing else, so a transfer may be larger
//! than memory. [`receive`] hands each new chunk to the caller (the file
//! service writes it to a file).

use macrolink_fabric::{clock_ns, Addr, Endpoint, Error, IoBuf, Mode, Result, Transport};
use macrolink_gateway::assemble::Assembler;
use macrolink_gateway::msg::Msg;
use macrolink_gateway::stripe::Chunk;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::to_pair;

/// Most chunks a sink keeps account of in one transfer (a flag each, 1 MiB
/// at most, and a hash for each that arrived; 1 TiB in chunks of 1 MiB).
pub const MAX_CHUNKS: u64 = 1 << 20;
/// Smallest chunk a sink accepts (but for a transfer that is smaller).
pub const MIN_CHUNK: u64 = 4096;
/// Transfers a sink keeps account of at once; chunks of further ones are
/// dropped until one ends.
pub const MAX_TRANSFERS: usize = 64;

struct Transfer {
    asm: Assembler,
    /// Hashes of the chunks that arrived, by sequence number: memory grows
    /// with the bytes that came, not with the size a peer announced.
    hashes: BTreeMap<u64, u64>,
}

/// Receives until the endpoint fails. Returns after `stop_after` verdicts
/// when given (for tests and benchmarks).
pub fn run(mut ep: Endpoint, stop_after: Option<u64>) -> Result<()> {
    let mut buf = IoBuf::new(8 << 20)?;
    let mut out = Vec::with_capacity(64);
    let mut transfers: HashMap<((u32, u32), u64), Transfer> = HashMap::new();
    let mut verdicts = 0;
    tracing::info!(
        "sink: {MAX_TRANSFERS} transfers at once, of at most {MAX_CHUNKS} chunks of {MIN_CHUNK} bytes or more; messages up to {} MiB",
        crate::MAX_MESSAGE >> 20
    );
    loop {
        let r = match ep.read(&mut buf) {
            Ok(r) => r,
            Err(Error::PeerLost { .. }) => continue,
            Err(Error::BufferTooSmall { needed, .. }) => {
                buf.ensure(needed)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        out.clear();
        match Msg::decode(&buf[..r.len]) {
            Ok(Msg::Chunk {
                transfer,
                total,
                chunk,
                from,
                data,
                ..
            }) => {
                // Any chunk tells the chunk size: a later one by its offset,
                // the first by its length.
                let size = match chunk.seq {
                    0 => chunk.len,
                    s => chunk.offset / s,
                };
                if size < MIN_CHUNK.min(total) || total.div_ceil(size.max(1)) > MAX_CHUNKS {
                    tracing::warn!("sink: transfer of {total} bytes in chunks of {size} refused");
                    continue;
                }
                let key = (from, transfer);
                if !transfers.contains_key(&key) && transfers.len() >= MAX_TRANSFERS {
                    tracing::warn!("sink: {MAX_TRANSFERS} transfers open; a new one refused");
                    continue;
                }
                let t = transfers.entry(key).or_insert_with(|| Transfer {
                    asm: Assembler::new(total, size.max(1)),
                    hashes: BTreeMap::new(),
                });
                match t.asm.accept(chunk, data.len()) {
                    Ok(new) => {
                        if new {
                            t.hashes.insert(chunk.seq, crate::chunk_hash(data));
                        }
                        Msg::Ack {
                            transfer,
                            seq: chunk.seq,
                            to: from,
                        }
                        .encode(&mut out)
                    }
                    Err(e) => {
                        tracing::warn!("sink: chunk refused: {e:?}");
                        continue;
                    }
                }
            }
            Ok(Msg::Done {
                transfer,
                hash,
                from,
                ..
            }) => {
                let ok = transfers.remove(&(from, transfer)).is_some_and(|t| {
                    let hashes: Vec<u64> = t.hashes.into_values().collect();
                    t.asm.is_complete() && crate::transfer_hash(&hashes) == hash
                });
                Msg::Verdict {
                    transfer,
                    ok,
                    to: from,
                }
                .encode(&mut out);
                verdicts += 1;
            }
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!("sink: malformed message from {}: {e:?}", r.from);
                continue;
            }
        }
        // Answer over the link the message came by: another may be dark.
        let back = ep.reply_target(&r, Mode::Reliable);
        if let Err(e) = back.and_then(|t| ep.write(t, &out)) {
            tracing::info!("sink: cannot answer {}: {e}", r.from);
        }
        if stop_after.is_some_and(|n| verdicts >= n) {
            return Ok(());
        }
    }
}

/// Address of a sink as the messages carry it.
pub fn pair(a: Addr) -> (u32, u32) {
    to_pair(a)
}

/// A transfer a receiver expects.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    /// Its id (the receiver's key: chunks of other ids are dropped).
    pub transfer: u64,
    /// The sender's endpoint.
    pub from: Addr,
    /// Bytes in all.
    pub total: u64,
    /// Bytes per chunk.
    pub chunk: u64,
}

/// What a receive saw.
#[derive(Clone, Debug, Default)]
pub struct ReceiveReport {
    /// Chunks placed, by the node of the gateway they came through.
    pub per_gateway: Vec<(u32, u64)>,
    /// Chunks that came again and were dropped.
    pub duplicates: u64,
    /// The longest time between two chunks placed, from the first, in
    /// nanoseconds: a stall of the path, or of the receiver's own writes
    /// (placing is part of it).
    pub longest_gap: u64,
    /// Whether every chunk is in place.
    pub complete: bool,
}

/// How often a receiver says hello through each gateway.
const HELLO_EVERY: u64 = 200_000_000;

/// Receives transfer `expect` on `ep`, handing each chunk to `place` once
/// however often it comes, and acknowledging every copy through the gateway
/// it came by; until `stop` says so (the sender may send a chunk again after
/// the last one is placed, when an acknowledgement was lost). With `hello`
/// (gateways and the sender), it says hello to the sender through every
/// gateway now and then, so that gateways open the connections the sender
/// sends back through, and reopen them after coming back.
pub fn receive(
    ep: &mut Endpoint,
    expect: Expect,
    place: &mut dyn FnMut(Chunk, &[u8]) -> std::io::Result<()>,
    hello: Option<&[Addr]>,
    stop: &dyn Fn() -> bool,
) -> Result<ReceiveReport> {
    let mut asm = Assembler::new(expect.total, expect.chunk.max(1));
    let mut report = ReceiveReport::default();
    let mut buf = IoBuf::new(64 << 10)?;
    let mut out = Vec::with_capacity(64);
    let me = to_pair(ep.addr());
    let mut next_hello = 0u64;
    let mut last_placed = None;
    while !stop() {
        if let Some(gws) = hello {
            let now = clock_ns();
            if now >= next_hello {
                next_hello = now + HELLO_EVERY;
                out.clear();
                Msg::Hello {
                    from: me,
                    to: to_pair(expect.from),
                }
                .encode(&mut out);
                for gw in gws {
                    let sent = ep
                        .target_via(*gw, Mode::Reliable, Transport::Tcp)
                        .and_then(|t| ep.write(t, &out));
                    if let Err(e) = sent {
                        tracing::debug!("hello through {gw}: {e}");
                    }
                }
            }
        }
        let r = match ep.read_timeout(&mut buf, Duration::from_millis(50)) {
            Ok(Some(r)) => r,
            Ok(None) | Err(Error::PeerLost { .. }) => continue,
            Err(Error::BufferTooSmall { needed, .. }) => {
                buf.ensure(needed)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        let Ok(Msg::Chunk {
            transfer,
            total,
            chunk,
            from,
            data,
            ..
        }) = Msg::decode(&buf[..r.len])
        else {
            continue;
        };
        if transfer != expect.transfer || from != to_pair(expect.from) || total != expect.total {
            tracing::warn!("chunk of an unknown transfer from {}; dropped", r.from);
            continue;
        }
        match asm.accept(chunk, data.len()) {
            Ok(true) => {
                place(chunk, data)?;
                let now = clock_ns();
                if let Some(last) = last_placed {
                    report.longest_gap = report.longest_gap.max(now - last);
                }
                last_placed = Some(now);
                match report
                    .per_gateway
                    .iter_mut()
                    .find(|(n, _)| *n == r.from.node)
                {
                    Some((_, c)) => *c += 1,
                    None => report.per_gateway.push((r.from.node, 1)),
                }
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!("chunk refused: {e:?}");
                continue;
            }
        }
        out.clear();
        Msg::Ack {
            transfer,
            seq: chunk.seq,
            to: from,
        }
        .encode(&mut out);
        let back = ep.reply_target(&r, Mode::Reliable);
        if let Err(e) = back.and_then(|t| ep.write(t, &out)) {
            tracing::info!("cannot acknowledge through {}: {e}", r.from);
        }
    }
    report.duplicates = asm.duplicates;
    report.complete = asm.is_complete();
    Ok(report)
}
