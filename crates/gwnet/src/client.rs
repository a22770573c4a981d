//! The compute side: one transfer striped over every live gateway, with
//! heartbeats, failover and an end-to-end hash check.

use macrolink_fabric::{clock_ns, Addr, Endpoint, Error, Mode, Result, Target, Transport};
use macrolink_gateway::health::{Health, HealthConfig, HealthEvent};
use macrolink_gateway::msg::{encode_chunk_head, Msg, CHUNK_HEADER};
use macrolink_gateway::paths::Paths;
use macrolink_gateway::stripe::{Chunk, StripeConfig, Striper};
use std::time::Duration;

use crate::to_pair;

/// Settings of a send.
#[derive(Clone, Copy, Debug, Default)]
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

struct Lanes {
    gws: Vec<Addr>,
    targets: Vec<Option<Target>>,
    down: Vec<bool>,
    down_at: Vec<u64>,
    failovers: u64,
    /// Pinned mode: the flow's identity and the gateway it is on.
    pin: Option<(Vec<u8>, usize)>,
    /// Earliest time to dial a gateway again after a failed attempt.
    retry_at: Vec<u64>,
    /// Gateways taken back into use after being out.
    returned: Vec<bool>,
}

/// Time between attempts to reconnect to a down gateway.
const REDIAL: u64 = 1_000_000_000;

impl Lanes {
    fn index(&self, a: Addr) -> Option<usize> {
        self.gws.iter().position(|g| *g == a)
    }

    fn mark_down(&mut self, gw: usize, striper: &mut Striper) {
        if !self.down[gw] {
            self.down[gw] = true;
            self.down_at[gw] = clock_ns();
            self.targets[gw] = None;
            self.failovers += 1;
            striper.on_path_down(gw);
            tracing::info!("gateway {} out of use", self.gws[gw]);
            if let Some((flow, on)) = self.pin.as_mut() {
                if *on == gw {
                    // The flow moves to its next choice among the live ones.
                    let mut live = Paths::new(self.gws.len());
                    for (i, d) in self.down.iter().enumerate() {
                        live.set_alive(i, !d);
                    }
                    if let Some(next) = live.pick(flow) {
                        *on = next;
                        striper.on_path_up(next);
                    }
                }
            }
        }
    }

    /// Whether the striper may use `gw` once it is up.
    fn usable(&self, gw: usize) -> bool {
        self.pin.as_ref().is_none_or(|(_, on)| *on == gw)
    }

    fn target(&mut self, ep: &mut Endpoint, gw: usize) -> Option<Target> {
        let now = clock_ns();
        if self.targets[gw].is_none() && now >= self.retry_at[gw] {
            self.targets[gw] = ep
                .target_via(self.gws[gw], Mode::Reliable, Transport::Tcp)
                .ok();
            if self.targets[gw].is_none() {
                self.retry_at[gw] = now + REDIAL;
            }
        }
        self.targets[gw]
    }
}

/// Where the chunks of a transfer come from: fills the buffer with the
/// bytes of the chunk (the same bytes each time it is asked).
pub type Reader<'a> = dyn FnMut(Chunk, &mut [u8]) -> std::io::Result<()> + 'a;

/// What the sender hears while a transfer goes on: chunks acknowledged and
/// in all. Returning `false` cancels the transfer.
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
    report.verified = ask_verdict(ep, gateways, &report.down, storage, transfer, hash);
    report.secs = (clock_ns() - start) as f64 / 1e9;
    Ok(report)
}

/// Every chunk is placed: asks storage to check the whole transfer's hash
/// through a live gateway; whether storage found it right.
fn ask_verdict(
    ep: &mut Endpoint,
    gateways: &[Addr],
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
            let Ok(t) = ep.target_via(*addr, Mode::Reliable, Transport::Tcp) else {
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
    let mut striper = Striper::new(total, n, cfg.stripe);
    let mut health = Health::new(n, cfg.health, start);
    let flow = [
        to_pair(ep.addr()).0.to_le_bytes(),
        to_pair(ep.addr()).1.to_le_bytes(),
    ]
    .concat();
    let mut lanes = Lanes {
        gws: gateways.to_vec(),
        targets: vec![None; n],
        down: vec![false; n],
        down_at: vec![0; n],
        failovers: 0,
        pin: None,
        retry_at: vec![0; n],
        returned: vec![false; n],
    };
    for gw in 0..n {
        if lanes.target(ep, gw).is_none() {
            lanes.mark_down(gw, &mut striper);
        }
    }
    if cfg.pinned {
        let mut live = Paths::new(n);
        for (i, d) in lanes.down.iter().enumerate() {
            live.set_alive(i, !d);
        }
        let on = live
            .pick(&[flow.as_slice(), &transfer.to_le_bytes()].concat())
            .unwrap_or(0);
        for gw in (0..n).filter(|g| *g != on) {
            striper.on_path_down(gw);
        }
        lanes.pin = Some(([flow.as_slice(), &transfer.to_le_bytes()].concat(), on));
    }
    let mut per_gateway = vec![0u64; n];
    let mut after_return = 0u64;
    let me = to_pair(ep.addr());
    let to = to_pair(storage);
    let mut buf = vec![0u8; 1 << 16];
    let mut out = Vec::with_capacity(CHUNK_HEADER + cfg.stripe.chunk as usize);
    let mut head = Vec::with_capacity(CHUNK_HEADER);
    let mut events = Vec::new();
    let (mut acked, mut last_ack, mut longest) = (0u64, start, 0u64);
    while !striper.is_complete() {
        let now = clock_ns();
        // Answers read last pass may have left an Up in `events`: keep it.
        health.poll(now, &mut events);
        for e in events.drain(..) {
            match e {
                HealthEvent::Probe { gw, seq } => {
                    head.clear();
                    Msg::Ping { seq }.encode(&mut head);
                    if let Some(t) = lanes.target(ep, gw) {
                        if ep.write(t, &head).is_err() {
                            lanes.mark_down(gw, &mut striper);
                            health.mark_down(gw);
                        }
                    }
                }
                HealthEvent::Down(gw) => lanes.mark_down(gw, &mut striper),
                HealthEvent::Up(gw) => {
                    if lanes.down[gw] && lanes.target(ep, gw).is_some() {
                        lanes.down[gw] = false;
                        lanes.returned[gw] = true;
                        if lanes.usable(gw) {
                            striper.on_path_up(gw);
                        }
                        tracing::info!("gateway {} back in use", lanes.gws[gw]);
                    }
                }
            }
        }
        while let Some(tx) = striper.poll_transmit(now) {
            per_gateway[tx.gw] += 1;
            if lanes.returned[tx.gw] {
                after_return += 1;
            }
            let c = tx.chunk;
            // The buffer keeps its length from chunk to chunk: only the
            // header is written anew, and the data read over the last.
            head.clear();
            encode_chunk_head(transfer, total, c, me, to, &mut head);
            out.resize(CHUNK_HEADER + c.len as usize, 0);
            out[..CHUNK_HEADER].copy_from_slice(&head);
            read(c, &mut out[CHUNK_HEADER..])?;
            let sent = lanes.target(ep, tx.gw).map(|t| ep.write(t, &out));
            if !matches!(sent, Some(Ok(()))) {
                lanes.mark_down(tx.gw, &mut striper);
                health.mark_down(tx.gw);
            }
        }
        match ep.read_timeout(&mut buf, Duration::from_millis(1)) {
            Ok(Some(r)) => match Msg::decode(&buf[..r.len]) {
                Ok(Msg::Pong { seq }) => {
                    if let Some(gw) = lanes.index(r.from) {
                        health.on_reply(gw, seq, &mut events);
                    }
                }
                Ok(Msg::Ack {
                    transfer: t, seq, ..
                }) if t == transfer => {
                    let now = clock_ns();
                    striper.on_ack(seq, now);
                    acked += 1;
                    longest = longest.max(now - last_ack);
                    last_ack = now;
                    if !progress(acked, striper.chunks()) {
                        return Err(Error::Timeout);
                    }
                }
                _ => {}
            },
            Ok(None) => {}
            Err(Error::PeerLost { peer, .. }) => {
                if let Some(gw) = lanes.index(peer) {
                    lanes.mark_down(gw, &mut striper);
                    health.mark_down(gw);
                }
            }
            Err(e) => return Err(e),
        }
        if cfg.patience > 0 && clock_ns().saturating_sub(last_ack) > cfg.patience {
            tracing::warn!(
                "transfer {transfer}: nothing acknowledged for {} ms; giving up",
                cfg.patience / 1_000_000
            );
            return Err(Error::Timeout);
        }
    }
    Ok(SendReport {
        bytes: total,
        secs: (clock_ns() - start) as f64 / 1e9,
        longest_stall: longest as f64 / 1e9,
        resent: striper.resent,
        failovers: lanes.failovers,
        verified: false,
        per_gateway,
        after_return,
        down: lanes.down,
        down_at: lanes.down_at,
    })
}
