//! The target side of every benchmark: answers runs until told to quit.

use macrolink_fabric::{
    Addr, Completion, Endpoint, EndpointConfig, Error, IoBuf, Mode, Node, RecvKind, RegionKey,
    Result, Target, Transport,
};
use std::time::{Duration, Instant};

use crate::clock::{clock_ns, Mark};
use crate::proto::{Done, Start, Test};
use crate::{CTL_EP, DATA_EP};

/// How long a target waits for a message it expects before giving up.
const PATIENCE: Duration = Duration::from_secs(30);
/// Quiet time after which a datagram stream is taken to be over.
const DATAGRAM_TAIL: Duration = Duration::from_millis(200);

/// Endpoint settings for benchmark data: a pool large enough for two 4 MB
/// messages in flight each way.
pub fn data_config(completion: Completion) -> EndpointConfig {
    EndpointConfig {
        completion,
        tokens: 256,
        token_size: 64 * 1024,
        ..EndpointConfig::default()
    }
}

/// The target of benchmark runs on one node.
#[derive(Debug)]
pub struct Server {
    ctl: Endpoint,
    data: Endpoint,
    key: RegionKey,
    buf: IoBuf,
    /// When the run being served must be over.
    deadline: Instant,
}

impl Server {
    /// Opens the control and data endpoints and a put region of `region` bytes.
    pub fn new(node: &Node, region: usize) -> Result<Server> {
        let ctl = node.open(CTL_EP, data_config(Completion::Wait))?;
        let mut data = node.open(DATA_EP, data_config(Completion::Wait))?;
        let key = data.register(region)?;
        Ok(Server {
            ctl,
            data,
            key,
            buf: IoBuf::new(8 << 20)?,
            deadline: Instant::now(),
        })
    }

    /// Key of the region puts go to.
    pub fn region_key(&self) -> RegionKey {
        self.key
    }

    /// Serves runs, one initiator after another, until one sends Quit. A
    /// peer that goes away, a record that is not one, a run that fails: each
    /// is reported and the target waits for the next run.
    pub fn serve(&mut self) -> Result<()> {
        let mut ctl_buf = [0u8; 64];
        loop {
            let r = match self.ctl.read(&mut ctl_buf) {
                Ok(r) => r,
                Err(Error::PeerLost { peer, reason }) => {
                    tracing::info!("initiator {peer} gone: {reason}");
                    continue;
                }
                Err(Error::BufferTooSmall { needed, .. }) => {
                    tracing::warn!("control record of {needed} bytes dropped");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let start = match Start::decode(&ctl_buf[..r.len]) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("bad control record from {}: {e}", r.from);
                    continue;
                }
            };
            if start.test == Test::Quit {
                return Ok(());
            }
            if let Err(e) = self.answer(&start, r.from, r.transport) {
                tracing::warn!("run for {} failed: {e}", r.from);
            }
        }
    }

    /// Runs what `start` asks for `from`, and reports back.
    fn answer(&mut self, start: &Start, from: Addr, transport: Transport) -> Result<()> {
        let reply = self.ctl.target_via(from, Mode::Reliable, transport)?;
        self.data.set_completion(start.completion);
        self.ctl.write(reply, &self.key.0.to_le_bytes())?;
        let done = self.run(start, Addr::new(from.node, DATA_EP))?;
        self.ctl.write(reply, &done.encode())
    }

    /// The next message of the run, by the run's deadline.
    fn read(&mut self) -> Result<macrolink_fabric::Recv> {
        // Not `ok_or`: an error made and dropped on every message.
        match self.data.read_by(&mut self.buf, self.deadline)? {
            Some(r) => Ok(r),
            None => Err(Error::Timeout),
        }
    }

    fn reply_target(&mut self, peer: Addr, s: &Start) -> Result<Target> {
        let mode = if s.mode == Mode::Datagram {
            Mode::Datagram
        } else {
            Mode::Reliable
        };
        self.data.target_via(peer, mode, s.transport)
    }

    fn run(&mut self, s: &Start, peer: Addr) -> Result<Done> {
        let size = s.size as usize;
        self.buf.ensure_on(size, s.pages)?;
        // One deadline for the run, not a clock read per message.
        self.deadline =
            Instant::now() + PATIENCE + Duration::from_micros(s.count.saturating_mul(100));
        let mut done = Done::default();
        if s.transport == Transport::Udp && s.test != Test::Bandwidth {
            // The initiator's sync datagram tells us where it is.
            self.read()?;
        }
        let mark = Mark::now();
        let mut timed = None;
        match s.test {
            Test::Bandwidth => match s.mode {
                Mode::Put => loop {
                    let r = self.read()?;
                    if let RecvKind::PutPlaced { .. } = r.kind {
                        done.messages = s.count;
                        done.bytes = s.count * s.size;
                        break;
                    }
                },
                Mode::Reliable if s.arrivals => {
                    // When messages arrived, asked for: (time, messages so
                    // far), every `every`-th one and the last, for runs made
                    // at once to be counted over the span all of them ran.
                    let every = arrival_stride(s.count);
                    done.samples.reserve(2 * (s.count / every + 1) as usize);
                    let mut left = every;
                    for _ in 0..s.count {
                        let r = self.read()?;
                        done.messages += 1;
                        done.bytes += r.len as u64;
                        left -= 1;
                        if left == 0 || done.messages == s.count {
                            left = every;
                            done.samples.extend([clock_ns(), done.messages]);
                        }
                    }
                }
                Mode::Reliable => {
                    for _ in 0..s.count {
                        let r = self.read()?;
                        done.messages += 1;
                        done.bytes += r.len as u64;
                    }
                }
                Mode::Datagram => {
                    while done.messages < s.count {
                        match self.data.read_timeout(&mut self.buf, DATAGRAM_TAIL)? {
                            Some(r) => {
                                done.messages += 1;
                                done.bytes += r.len as u64;
                                timed = Some(mark.since());
                            }
                            None => break,
                        }
                    }
                }
            },
            Test::PingPong => {
                let t = self.reply_target(peer, s)?;
                for _ in 0..s.count {
                    let r = self.read()?;
                    self.data.write(t, &self.buf[..r.len])?;
                    done.messages += 1;
                    done.bytes += r.len as u64;
                }
            }
            Test::PingPing | Test::SendRecv | Test::Exchange => {
                let t = self.reply_target(peer, s)?;
                let per = if s.test == Test::Exchange { 2 } else { 1 };
                let out = vec![0x5au8; size];
                for _ in 0..s.count {
                    for _ in 0..per {
                        self.data.write(t, &out)?;
                    }
                    for _ in 0..per {
                        let r = self.read()?;
                        done.messages += 1;
                        done.bytes += r.len as u64;
                    }
                }
            }
            Test::Clock => {
                let t = self.reply_target(peer, s)?;
                for _ in 0..s.count {
                    self.read()?;
                    self.data.write(t, &clock_ns().to_le_bytes())?;
                }
            }
            Test::OneWay | Test::Breakdown => {
                let t = self.reply_target(peer, s)?;
                self.data.set_probe(s.test == Test::Breakdown);
                for _ in 0..s.count {
                    let r = self.read()?;
                    done.messages += 1;
                    done.bytes += r.len as u64;
                    if s.test == Test::Breakdown {
                        let tm = self.data.timings();
                        done.samples.push(tm.read_header);
                        done.samples.push(tm.read_delivered);
                    } else {
                        done.samples.push(clock_ns());
                    }
                    self.data.write(t, b"k")?;
                }
                self.data.set_probe(false);
            }
            Test::Quit => {}
        }
        let (cpu, wall) = timed.unwrap_or_else(|| mark.since());
        done.cpu_ns = cpu;
        done.wall_ns = wall;
        Ok(done)
    }
}

/// Arrivals a bandwidth run reports at most, besides its last message's.
pub const MAX_ARRIVALS: u64 = 4096;

/// Every how many messages a run of `count` notes an arrival: every one up
/// to [`MAX_ARRIVALS`], else as many as that at even steps (and the last
/// message's).
pub fn arrival_stride(count: u64) -> u64 {
    count.div_ceil(MAX_ARRIVALS).max(1)
}

/// Which control transport carries a run over `t` (udp and ucx runs are
/// steered over tcp).
pub fn control_transport(t: Transport) -> Transport {
    match t {
        Transport::Udp | Transport::Ucx => Transport::Tcp,
        t => t,
    }
}
