//! The compute side: one transfer striped over every live gateway, with
//! heartbeats, failover and an end-to-end hash check. (A file server that
//! sends a download through a lane runs the same loop.)
//!
//! A chunk goes to the next gateway in turn whose connection can take it
//! at once ([`Endpoint::can_take`]): the write of a chunk waits until the
//! connection has taken all of it, and a sender whose own links are the
//! slow ones would otherwise wait on one full connection while the others
//! ran dry.

use macrolink_cluster::Cluster;
use macrolink_fabric::{clock_ns, Addr, Endpoint, Error, Mode, Result, Transport};
use macrolink_gateway::health::{Health, HealthConfig};
use macrolink_gateway::heard::Heard;
use macrolink_gateway::lanes::Lanes;
use macrolink_gateway::msg::{encode_chunk_head, Msg, CHUNK_HEADER};
use macrolink_gateway::stripe::{Chunk, StripeConfig, Striper};
use macrolink_manage::excluded::Excluded;
use std::time::Duration;

use crate::to_pair;

mod run;

use run::{Gateways, Run};

/// Settings of a send.
#[derive(Clone, Debug)]
pub struct SendConfig {
    /// Chunking and retransmission.
    pub stripe: StripeConfig,
    /// Heartbeats.
    pub health: HealthConfig,
    /// Equal-cost multipath instead of striping: the transfer is one flow,
    /// kept on the gateway its identity hashes to while that gateway lives,
    /// and moved to the next choice among the live ones when it dies.
    pub pinned: bool,
    /// Give up when no chunk is acknowledged for this long (nanoseconds;
    /// 0: never).
    pub patience: u64,
    /// Hosts the central manager has excluded: a gateway among them is
    /// taken out of use as soon as it is (and not dialled at all), by
    /// every transfer that shares the set.
    pub excluded: Option<Excluded>,
    /// When the gateways were last heard from, shared with the other
    /// transfers of this process that use them (see
    /// [`macrolink_gateway::heard`]); `None`: this transfer judges alone.
    pub heard: Option<Heard>,
    /// The transport to the gateways (the fast fabric's: tcp, or ucx over
    /// InfiniBand or RoCE).
    pub transport: Transport,
}

impl Default for SendConfig {
    fn default() -> SendConfig {
        SendConfig {
            stripe: StripeConfig::default(),
            health: HealthConfig::default(),
            pinned: false,
            patience: 0,
            excluded: None,
            heard: None,
            transport: Transport::Tcp,
        }
    }
}

/// How long a transfer may hear no acknowledgement before it fails rather
/// than hangs, in the settings a cluster file makes.
pub const PATIENCE: u64 = 30_000_000_000;

impl SendConfig {
    /// The settings a cluster file asks for, the defaults of
    /// [`StripeConfig`] and [`HealthConfig`] where it is silent; striped,
    /// failing after [`PATIENCE`] without an acknowledgement.
    pub fn from_cluster(c: &Cluster) -> SendConfig {
        const MS: u64 = 1_000_000;
        let (s, h) = (StripeConfig::default(), HealthConfig::default());
        SendConfig {
            stripe: StripeConfig {
                chunk: c.stripe.chunk_kib.map_or(s.chunk, |k| k * 1024),
                window: c.stripe.window.unwrap_or(s.window),
                rto: c.stripe.rto_ms.map_or(s.rto, |ms| ms * MS),
            },
            health: HealthConfig {
                interval: c.health.interval_ms.map_or(h.interval, |ms| ms * MS),
                misses: c.health.misses.unwrap_or(h.misses),
            },
            pinned: false,
            patience: PATIENCE,
            excluded: None,
            heard: None,
            transport: Transport::Tcp,
        }
    }
}

/// What a send measured.
#[derive(Clone, Debug, Default)]
pub struct SendReport {
    /// Bytes sent.
    pub bytes: u64,
    /// Seconds from start to the verdict.
    pub secs: f64,
    /// Longest time without a new chunk acknowledged, in seconds.
    pub longest_stall: f64,
    /// Chunks sent again.
    pub resent: u64,
    /// Gateways taken out of use during the send.
    pub failovers: u64,
    /// Whether the storage host found the hash right.
    pub verified: bool,
    /// Chunks sent through each gateway.
    pub per_gateway: Vec<u64>,
    /// Chunks sent through gateways that had been out of use and came back.
    pub after_return: u64,
    /// Gateways out of use at the end.
    pub down: Vec<bool>,
    /// When each gateway was last taken out of use ([`clock_ns`]; 0: never).
    pub down_at: Vec<u64>,
}

/// Where the chunks of a transfer come from: fills the buffer with the
/// bytes of the chunk (the same bytes each time it is asked).
pub type Reader<'a> = dyn FnMut(Chunk, &mut [u8]) -> std::io::Result<()> + 'a;

/// What the sender hears while a transfer goes on, on every pass of its
/// loop (about every millisecond): chunks acknowledged and in all.
/// Returning `false` cancels the transfer.
pub type Progress<'a> = dyn FnMut(u64, u64) -> bool + 'a;

/// Sends `data` as transfer `transfer` to `storage` through `gateways`, then
/// asks storage to check the whole transfer's hash; `progress` hears the
/// number of chunks acknowledged so far.
pub fn send(
    ep: &mut Endpoint,
    gateways: &[Addr],
    storage: Addr,
    transfer: u64,
    data: &[u8],
    cfg: SendConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SendReport> {
    let start = clock_ns();
    let chunk = cfg.stripe.chunk.max(1);
    let transport = cfg.transport;
    let mut hashes: Vec<Option<u64>> = vec![None; (data.len() as u64).div_ceil(chunk) as usize];
    let mut read = |c: Chunk, buf: &mut [u8]| {
        buf.copy_from_slice(&data[c.offset as usize..(c.offset + c.len) as usize]);
        if let Some(h @ None) = hashes.get_mut(c.seq as usize) {
            *h = Some(crate::chunk_hash(buf));
        }
        Ok(())
    };
    let mut report = stripe(
        ep,
        gateways,
        storage,
        transfer,
        data.len() as u64,
        &mut read,
        cfg,
        &mut |a, n| {
            progress(a, n);
            true
        },
    )?;
    let hashes: Vec<u64> = hashes.into_iter().map(Option::unwrap_or_default).collect();
    let hash = crate::transfer_hash(&hashes);
    report.verified = ask_verdict(
        ep,
        gateways,
        transport,
        &report.down,
        storage,
        transfer,
        hash,
    );
    report.secs = (clock_ns() - start) as f64 / 1e9;
    Ok(report)
}

/// Every chunk is placed: asks storage to check the whole transfer's hash
/// through a live gateway; whether storage found it right.
fn ask_verdict(
    ep: &mut Endpoint,
    gateways: &[Addr],
    transport: Transport,
    down: &[bool],
    storage: Addr,
    transfer: u64,
    hash: u64,
) -> bool {
    let mut out = Vec::with_capacity(64);
    Msg::Done {
        transfer,
        hash,
        from: to_pair(ep.addr()),
        to: to_pair(storage),
    }
    .encode(&mut out);
    let mut buf = vec![0u8; 1 << 16];
    for _ in 0..3 {
        for (gw, addr) in gateways.iter().enumerate() {
            if down.get(gw).copied().unwrap_or(false) {
                continue;
            }
            let Ok(t) = ep.target_via(*addr, Mode::Reliable, transport) else {
                continue;
            };
            if ep.write(t, &out).is_err() {
                continue;
            }
            let deadline = clock_ns() + 10_000_000_000;
            while clock_ns() < deadline {
                if let Ok(Some(r)) = ep.read_timeout(&mut buf, Duration::from_millis(100)) {
                    if let Ok(Msg::Verdict {
                        transfer: t, ok, ..
                    }) = Msg::decode(&buf[..r.len])
                    {
                        if t == transfer {
                            return ok;
                        }
                    }
                }
            }
        }
    }
    false
}

/// Moves transfer `transfer` of `total` bytes, read chunk by chunk from
/// `read`, to endpoint `to` through `gateways`: striped over the live ones
/// (or pinned to one, see [`SendConfig::pinned`]), each chunk sent again
/// through another gateway until acknowledged. Returns once every chunk is
/// acknowledged; the caller checks the whole end to end.
#[allow(clippy::too_many_arguments)]
pub fn stripe(
    ep: &mut Endpoint,
    gateways: &[Addr],
    storage: Addr,
    transfer: u64,
    total: u64,
    read: &mut Reader<'_>,
    cfg: SendConfig,
    progress: &mut Progress<'_>,
) -> Result<SendReport> {
    let n = gateways.len();
    let start = clock_ns();
    let flow = [
        to_pair(ep.addr()).0.to_le_bytes(),
        to_pair(ep.addr()).1.to_le_bytes(),
    ]
    .concat();
    let ids: Vec<_> = gateways.iter().map(|g| to_pair(*g)).collect();
    let mut run = Run {
        transfer,
        striper: Striper::new(total, n, cfg.stripe),
        health: Health::new(n, cfg.health, start),
        gws: Gateways {
            addrs: gateways.to_vec(),
            transport: cfg.transport,
            targets: vec![None; n],
            lanes: Lanes::new(n),
            fenced: vec![false; n],
        },
        watch: cfg.heard.as_ref().map(|h| h.watch(&ids)),
        events: Vec::new(),
        acked: 0,
        last_ack: start,
        longest: 0,
    };
    let mut fence_seen = u64::MAX;
    run.gws
        .fence(cfg.excluded.as_ref(), &mut fence_seen, &mut run.striper);
    for gw in 0..n {
        // Out of use until it answers a heartbeat, whatever others hear.
        if !run.gws.fenced[gw] && run.gws.target(ep, gw).is_none() {
            run.gws.down(gw, &mut run.striper, Some(&mut run.health));
        }
    }
    if cfg.pinned {
        run.gws.lanes.pin(
            &[flow.as_slice(), &transfer.to_le_bytes()].concat(),
            &mut run.striper,
        );
    }
    let me = to_pair(ep.addr());
    let to = to_pair(storage);
    let mut buf = vec![0u8; 1 << 16];
    let mut out = Vec::with_capacity(CHUNK_HEADER + cfg.stripe.chunk as usize);
    let mut head = Vec::with_capacity(CHUNK_HEADER);
    let mut wait = Duration::ZERO;
    while !run.striper.is_complete() {
        run.gws
            .fence(cfg.excluded.as_ref(), &mut fence_seen, &mut run.striper);
        // What has arrived is heard before any gateway is judged: a pass
        // held up (by a write, or by the scheduler with many transfers on
        // few processors) judges on the answers that came meanwhile.
        run.read_inbox(ep, &mut buf, wait)?;
        wait = Duration::from_millis(1);
        let now = clock_ns();
        run.judge(ep, now, &mut head);
        run.share();
        // A gateway whose connection is still full gets no chunk this
        // pass: the write would wait there while the others ran dry (the
        // sender's own links are the shaped ones when a server sends).
        let room = CHUNK_HEADER + cfg.stripe.chunk as usize;
        let Run {
            striper,
            gws,
            health,
            ..
        } = &mut run;
        while let Some(tx) = striper.poll_transmit_to(now, &mut |gw| {
            gws.target(ep, gw)
                .is_none_or(|t| ep.can_take(t, room).unwrap_or(true))
        }) {
            gws.lanes.sent(tx.gw);
            let c = tx.chunk;
            // The buffer keeps its length from chunk to chunk: only the
            // header is written anew, and the data read over the last.
            head.clear();
            encode_chunk_head(transfer, total, c, me, to, &mut head);
            out.resize(CHUNK_HEADER + c.len as usize, 0);
            out[..CHUNK_HEADER].copy_from_slice(&head);
            read(c, &mut out[CHUNK_HEADER..])?;
            let sent = gws.target(ep, tx.gw).map(|t| ep.write(t, &out));
            if !matches!(sent, Some(Ok(()))) {
                gws.down(tx.gw, striper, Some(health));
            }
        }
        // The others see these chunks before this loop waits for answers.
        run.share();
        // Asked every pass, not on acknowledgements only: a transfer
        // cancelled while none come (its receiver failed) ends now, not
        // when patience runs out.
        if !progress(run.acked, run.striper.chunks()) {
            return Err(Error::Timeout);
        }
        if cfg.patience > 0 && clock_ns().saturating_sub(run.last_ack) > cfg.patience {
            tracing::warn!(
                "transfer {transfer}: nothing acknowledged for {} ms; giving up",
                cfg.patience / 1_000_000
            );
            return Err(Error::Timeout);
        }
    }
    let Run { striper, gws, .. } = run;
    Ok(SendReport {
        bytes: total,
        secs: (clock_ns() - start) as f64 / 1e9,
        longest_stall: run.longest as f64 / 1e9,
        resent: striper.resent,
        failovers: gws.lanes.failovers,
        verified: false,
        per_gateway: gws.lanes.per_gateway.clone(),
        after_return: gws.lanes.after_return,
        down: gws.lanes.down_list().to_vec(),
        down_at: gws.lanes.down_times().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_file_sets_what_it_names_and_leaves_the_defaults() {
        let hosts = "[[host]]\nname = 'a'\nrole = 'compute'\nnode = 1\nfabric = '127.0.0.1:1'\n";
        let c = SendConfig::from_cluster(&Cluster::parse(hosts).unwrap());
        assert_eq!(c.health, HealthConfig::default());
        assert_eq!(c.stripe, StripeConfig::default());
        assert_eq!((c.pinned, c.patience), (false, PATIENCE));
        let embedded = SendConfig::from_cluster(&Cluster::embedded());
        assert_eq!(embedded.health.misses, 3);
        assert_eq!(embedded.stripe.window, 4);
        let text = format!(
            "{hosts}[health]\ninterval_ms = 20\nmisses = 2\n[stripe]\nchunk_kib = 256\nwindow = 8\n"
        );
        let s = SendConfig::from_cluster(&Cluster::parse(&text).unwrap());
        assert_eq!((s.health.interval, s.health.misses), (20_000_000, 2));
        assert_eq!(
            (s.stripe.chunk, s.stripe.window, s.stripe.rto),
            (256 * 1024, 8, 500_000_000)
        );
    }
}
