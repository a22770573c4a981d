//! The storage side: places chunks of each transfer once, acknowledges each
//! through the gateway it came by, and checks the whole transfer's hash.

use macrolink_fabric::{Addr, Endpoint, Error, Mode, Result};
use macrolink_gateway::assemble::Assembler;
use macrolink_gateway::msg::Msg;
use std::collections::HashMap;

use crate::to_pair;

/// Largest transfer a sink accepts into memory.
pub const MAX_TRANSFER: u64 = 4 << 30;

struct Transfer {
    asm: Assembler,
    data: Vec<u8>,
}

/// Receives until the endpoint fails. Returns after `stop_after` verdicts
/// when given (for tests and benchmarks).
pub fn run(mut ep: Endpoint, stop_after: Option<u64>) -> Result<()> {
    let mut buf = vec![0u8; 8 << 20];
    let mut out = Vec::with_capacity(64);
    let mut transfers: HashMap<((u32, u32), u64), Transfer> = HashMap::new();
    let mut verdicts = 0;
    loop {
        let r = match ep.read(&mut buf) {
            Ok(r) => r,
            Err(Error::PeerLost { .. }) => continue,
            Err(Error::BufferTooSmall { needed, .. }) => {
                buf.resize(needed, 0);
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
                if total > MAX_TRANSFER {
                    tracing::warn!("sink: transfer of {total} bytes refused");
                    continue;
                }
                let t = transfers
                    .entry((from, transfer))
                    .or_insert_with(|| Transfer {
                        asm: Assembler::new(total, chunk.len.max(1)),
                        data: vec![0u8; total as usize],
                    });
                match t.asm.place(chunk, data, &mut t.data) {
                    Ok(_) => Msg::Ack {
                        transfer,
                        seq: chunk.seq,
                        to: from,
                    }
                    .encode(&mut out),
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
                    t.asm.is_complete() && xxhash_rust::xxh3::xxh3_64(&t.data) == hash
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
