//! The initiator side: drives runs against a [`Server`](crate::server::Server)
//! and turns what both sides measured into rows.

use macrolink_fabric::{
    Addr, Completion, Endpoint, Error, IoBuf, Mode, Node, Pages, RegionKey, Result, Target,
    Transport, DEFAULT_RING,
};
use macrolink_wire::HEADER_LEN;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::clock::{clock_ns, Mark, Ticks};
use crate::proto::{Done, Start, Test};
use crate::report::{BreakdownRow, BwRow, LatRow, OneWayRow};
use crate::server::{control_transport, data_config};
use crate::stats::Summary;
use crate::{CTL_EP, DATA_EP};

/// How long the initiator waits for the target's answer.
const PATIENCE: Duration = Duration::from_secs(60);

/// What a bandwidth run is made of.
#[derive(Clone, Copy, Debug)]
pub struct BwSpec {
    /// Transport.
    pub transport: Transport,
    /// Mode.
    pub mode: Mode,
    /// Completion of both sides.
    pub completion: Completion,
    /// Bytes per message.
    pub size: usize,
    /// Messages.
    pub count: u64,
    /// Puts in flight.
    pub window: usize,
    /// Messages a second at most (`None`: as fast as they go).
    pub pace: Option<f64>,
    /// A reliable run brings back when its messages arrived
    /// ([`BwRow::arrivals`]).
    pub arrivals: bool,
    /// The pages both sides' buffers lie on.
    pub pages: Pages,
}

/// The initiator of benchmark runs.
#[derive(Debug)]
pub struct Client {
    ctl: Endpoint,
    data: Endpoint,
    ctl_targets: HashMap<Transport, Target>,
    server: u32,
    key: RegionKey,
    buf: IoBuf,
    mtu: usize,
}

/// Untimed iterations before a latency run, as the peers make theirs
/// (`ucx_perftest` 10,000 by default, sockperf its warm-up messages): up
/// to 10,000 or 64 MiB, whichever is less, and over shared memory at least
/// one lap of the ring, whose pages are touched for the first time in the
/// first lap (a page fault every 64 messages of 8 bytes); at most 100,000,
/// and (in [`Client::latency`]) at most 0.2 s.
pub fn warm_up(transport: Transport, size: usize) -> u64 {
    let frame = (size + HEADER_LEN) as u64;
    let lap = match transport {
        Transport::Shm => (DEFAULT_RING as u64).div_ceil(frame),
        _ => 0,
    };
    lap.max(WARM_UP.min(WARM_UP_BYTES / frame)).min(100_000)
}

/// `ucx_perftest`'s warm-up iterations.
const WARM_UP: u64 = 10_000;
/// At most this long a warm-up, in nanoseconds.
const WARM_UP_TIME: u64 = 200_000_000;
/// Iterations that time one before the warm-up.
const PROBE: u64 = 16;
/// At most this many bytes each way in a warm-up of large messages.
const WARM_UP_BYTES: u64 = 64 << 20;

/// Most messages in one bandwidth run.
const MAX_COUNT: u64 = 5_000_000;
/// Most warm-up runs before a bandwidth run.
const WARM_ROUNDS: usize = 8;

/// Most runs of a warm-up before a run (`Client::warm`).
const WARM_RUNS: usize = 64;

/// Messages of a first warm-up run: some 4 MB of `size`-byte messages (one
/// message of 4 MB or more), at most 2,000.
fn first_count(size: usize) -> u64 {
    (4_000_000 / size.max(1)).clamp(1, 2000) as u64
}

/// The count of a run meant to last `target` seconds, after one of `count`
/// messages that took `took`: scaled by the ratio, up by tenfold at most
/// (so short a run says little), never under one message.
fn scaled(count: u64, took: f64, target: f64) -> u64 {
    let f = if took > 0.0 {
        (target / took).min(10.0)
    } else {
        10.0
    };
    ((count as f64 * f).ceil() as u64).clamp(1, MAX_COUNT)
}

/// After a warm-up run of `count` messages that took `took` seconds, for a
/// run of `secs`: the count of the next warm-up while this one was too
/// short to time (under a twentieth of `secs`), grown towards that mark,
/// at least twofold; `None` once it was long enough, or cannot grow.
fn warm_again(count: u64, took: f64, secs: f64) -> Option<u64> {
    let mark = secs / 20.0;
    if took >= mark || count >= MAX_COUNT {
        return None;
    }
    Some(scaled(count, took, mark).max(count * 2).min(MAX_COUNT))
}

fn pct(cpu: u64, wall: u64) -> f64 {
    if wall == 0 {
        0.0
    } else {
        cpu as f64 * 100.0 / wall as f64
    }
}

impl Client {
    /// Opens the initiator's endpoints on `node` for runs against node `server`.
    pub fn new(node: &Node, server: u32) -> Result<Client> {
        Ok(Client {
            ctl: node.open(CTL_EP, data_config(Completion::Wait))?,
            data: node.open(DATA_EP, data_config(Completion::Poll))?,
            ctl_targets: HashMap::new(),
            server,
            key: RegionKey(0),
            buf: IoBuf::new(8 << 20)?,
            mtu: node.datagram_mtu(),
        })
    }

    fn ctl_target(&mut self, t: Transport) -> Result<Target> {
        let t = control_transport(t);
        if let Some(x) = self.ctl_targets.get(&t) {
            return Ok(*x);
        }
        let x = self
            .ctl
            .target_via(Addr::new(self.server, CTL_EP), Mode::Reliable, t)?;
        self.ctl_targets.insert(t, x);
        Ok(x)
    }

    fn start(&mut self, s: Start) -> Result<()> {
        let t = self.ctl_target(s.transport)?;
        self.ctl.write(t, &s.encode())?;
        let mut b = [0u8; 16];
        let r = self
            .ctl
            .read_timeout(&mut b, PATIENCE)?
            .ok_or(Error::Timeout)?;
        // Ready carries the key of the target's put region.
        if let Some(k) = b.get(..r.len).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
            self.key = RegionKey(u64::from_le_bytes(k));
        }
        self.data.set_completion(s.completion);
        Ok(())
    }

    fn done(&mut self) -> Result<Done> {
        let mut b = vec![0u8; 1 << 20];
        let r = self
            .ctl
            .read_timeout(&mut b, PATIENCE)?
            .ok_or(Error::Timeout)?;
        Done::decode(&b[..r.len]).map_err(|e| Error::Io(std::io::Error::other(e)))
    }

    /// Over udp, lets the target learn our datagram address before it
    /// answers (it reads this first in every answered run).
    fn sync(&mut self, t: Target, transport: Transport) -> Result<()> {
        if transport == Transport::Udp {
            self.data.write(t, b"sync")?;
        }
        Ok(())
    }

    fn data_target(&mut self, transport: Transport, mode: Mode) -> Result<Target> {
        self.data
            .target_via(Addr::new(self.server, DATA_EP), mode, transport)
    }

    /// Largest datagram payload.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// A unidirectional run. Datagrams larger than the MTU give a row of n.a.
    pub fn bandwidth(&mut self, spec: BwSpec) -> Result<BwRow> {
        let BwSpec {
            transport,
            mode,
            completion,
            size,
            count,
            window,
            pace,
            arrivals,
            pages,
        } = spec;
        let mut row = BwRow {
            transport: transport.to_string(),
            mode: mode.to_string(),
            completion: completion_name(completion).into(),
            size: size as u64,
            sent: count,
            delivered: 0,
            bytes: 0,
            seconds: 0.0,
            started_ns: 0,
            mb_per_s: None,
            msgs_per_s: None,
            cpu_initiator: None,
            cpu_target: None,
            pages: pages.to_string(),
            arrivals: Vec::new(),
        };
        if mode == Mode::Datagram && size > self.mtu {
            return Ok(row);
        }
        let t = self.data_target(transport, mode)?;
        self.start(Start {
            test: Test::Bandwidth,
            mode,
            transport,
            completion,
            size: size as u64,
            count,
            arrivals: arrivals && mode == Mode::Reliable,
            pages,
        })?;
        // Page-aligned, as ucx_perftest's and iperf3's buffers are.
        let mut payload = IoBuf::on(size, pages)?;
        payload.fill(0xa5);
        let mark = Mark::now();
        let t0 = clock_ns();
        match mode {
            Mode::Put => {
                let mut inflight = VecDeque::with_capacity(window);
                for i in 0..count {
                    hold(pace, t0, i);
                    if inflight.len() >= window.max(1) {
                        if let Some(h) = inflight.pop_front() {
                            self.data.wait_put(h)?;
                        }
                    }
                    let last = i + 1 == count;
                    inflight.push_back(self.data.put(t, &payload, 0, self.key, last)?);
                }
                for h in inflight {
                    self.data.wait_put(h)?;
                }
            }
            _ => {
                for i in 0..count {
                    hold(pace, t0, i);
                    self.data.write(t, &payload)?;
                }
            }
        }
        let sending = mark.since();
        let done = self.done()?;
        let (cpu, wall) = if mode == Mode::Datagram {
            sending
        } else {
            mark.since()
        };
        // A datagram stream is timed by its target (first to last arrival).
        let secs = if mode == Mode::Datagram {
            done.wall_ns
        } else {
            wall
        } as f64
            / 1e9;
        row.delivered = done.messages;
        row.bytes = done.bytes;
        row.seconds = secs;
        row.started_ns = t0;
        row.mb_per_s = Some(done.bytes as f64 / secs / 1e6);
        row.msgs_per_s = Some(done.messages as f64 / secs);
        row.cpu_initiator = Some(pct(cpu, wall));
        row.cpu_target = Some(pct(done.cpu_ns, done.wall_ns));
        if arrivals && mode == Mode::Reliable {
            // No more than a target of ours sends, whatever one sent.
            row.arrivals = done
                .samples
                .chunks_exact(2)
                .take(crate::server::MAX_ARRIVALS as usize + 1)
                .map(|p| [p[0], p[1]])
                .collect();
        }
        Ok(row)
    }

    /// Picks a message count that makes a run last about `secs`, from
    /// warm-up runs (which also warm the path) grown until one lasts long
    /// enough that a run's fixed costs (its start and end exchanges, a
    /// region's first mapping) no longer count: a count taken from eight
    /// 1 MB puts made a one-second figure last 15 ms.
    pub fn calibrate(&mut self, spec: BwSpec, secs: f64) -> Result<u64> {
        if spec.mode == Mode::Datagram && spec.size > self.mtu {
            return Ok(0);
        }
        let mut count = first_count(spec.size);
        let mut per = 0.0;
        for _ in 0..WARM_ROUNDS {
            let r = self.bandwidth(BwSpec {
                count,
                arrivals: false,
                ..spec
            })?;
            per = r.seconds / r.delivered.max(1) as f64;
            match warm_again(count, r.seconds, secs) {
                Some(next) => count = next,
                None => break,
            }
        }
        // From the last run's time a message, which came nearest the mark.
        Ok(((secs / per.max(1e-9)) as u64).clamp(16, MAX_COUNT))
    }

    /// Runs untimed traffic of `spec` for about `secs`: runs, each sized
    /// to the time left by the one before, until they add up to that (on a
    /// link so slow that one message takes longer, one message).
    pub fn warm(&mut self, spec: BwSpec, secs: f64) -> Result<()> {
        if spec.mode == Mode::Datagram && spec.size > self.mtu {
            return Ok(());
        }
        let mut count = first_count(spec.size);
        let mut spent = 0.0;
        for _ in 0..WARM_RUNS {
            if spent >= secs {
                break;
            }
            let r = self.bandwidth(BwSpec {
                count,
                arrivals: false,
                ..spec
            })?;
            spent += r.seconds;
            count = scaled(count, r.seconds, secs - spent);
        }
        Ok(())
    }

    /// A latency test: `count` iterations of `test` with messages of `size`.
    pub fn latency(
        &mut self,
        test: Test,
        transport: Transport,
        mode: Mode,
        completion: Completion,
        size: usize,
        count: u64,
    ) -> Result<LatRow> {
        let t = self.data_target(transport, mode)?;
        let out = vec![0x3cu8; size];
        let per = if test == Test::Exchange { 2 } else { 1 };
        let run = |count| Start {
            test,
            mode,
            transport,
            completion,
            size: size as u64,
            count,
            arrivals: false,
            pages: Pages::Base,
        };
        // A few iterations first give the round trip, which bounds the
        // warm-up's time (a long link takes milliseconds an iteration).
        let each = self.probe(run(PROBE), t, &out, per)?;
        let warm = warm_up(transport, size).min(WARM_UP_TIME / each.max(1));
        self.start(run(count + warm))?;
        self.sync(t, transport)?;
        let mut samples = Vec::with_capacity(count as usize);
        // One deadline for the run: what is timed is the fabric, as
        // ucx_perftest and sockperf time theirs.
        let deadline =
            Instant::now() + PATIENCE + Duration::from_micros((count + warm).saturating_mul(100));
        for _ in 0..warm {
            self.iteration(test, t, &out, per, deadline)?;
        }
        // Calibrated (once a process, up to 0.2 s) outside the run's times.
        let ticks = Ticks::new();
        let mark = Mark::now();
        // One clock read an iteration: its end is the next one's start.
        let mut t0 = ticks.raw();
        for _ in 0..count {
            self.iteration(test, t, &out, per, deadline)?;
            let t1 = ticks.raw();
            let dt = ticks.ns(t0, t1) as f64 / 1e3;
            t0 = t1;
            samples.push(if test == Test::PingPong { dt / 2.0 } else { dt });
        }
        let (cpu, wall) = mark.since();
        let done = self.done()?;
        let usec = Summary::of(&mut samples);
        // IMB: PingPong and PingPing move `size` each way per t; SendRecv
        // moves it both ways; Exchange twice both ways.
        let each = match test {
            Test::Exchange => 2.0,
            _ => 1.0,
        } * size as f64
            / usec.median.max(1e-9);
        let both = match test {
            Test::PingPong => each,
            _ => 2.0 * each,
        };
        Ok(LatRow {
            test: test_name(test).into(),
            transport: transport.to_string(),
            mode: mode.to_string(),
            completion: completion_name(completion).into(),
            size: size as u64,
            iterations: count,
            usec,
            mb_per_s_each_way: each,
            mb_per_s_both: both,
            cpu_initiator: pct(cpu, wall),
            cpu_target: pct(done.cpu_ns, done.wall_ns),
        })
    }

    /// Runs `s.count` untimed iterations; returns nanoseconds an iteration.
    fn probe(&mut self, s: Start, t: Target, out: &[u8], per: usize) -> Result<u64> {
        self.start(s)?;
        if s.transport == Transport::Udp {
            self.data.write(t, b"sync")?;
        }
        let deadline = Instant::now() + PATIENCE;
        let t0 = clock_ns();
        for _ in 0..s.count {
            self.iteration(s.test, t, out, per, deadline)?;
        }
        let each = (clock_ns() - t0) / s.count.max(1);
        self.done()?;
        Ok(each)
    }

    /// One iteration of a latency pattern: `per` messages out and back.
    fn iteration(
        &mut self,
        test: Test,
        t: Target,
        out: &[u8],
        per: usize,
        deadline: Instant,
    ) -> Result<()> {
        match test {
            Test::PingPong => {
                self.data.write(t, out)?;
                self.recv_by(deadline)
            }
            _ => {
                for _ in 0..per {
                    self.data.write(t, out)?;
                }
                for _ in 0..per {
                    self.recv_by(deadline)?;
                }
                Ok(())
            }
        }
    }

    // Not `ok_or`: an error made and dropped on every message.
    fn recv(&mut self) -> Result<()> {
        match self.data.read_timeout(&mut self.buf, PATIENCE)? {
            Some(_) => Ok(()),
            None => Err(Error::Timeout),
        }
    }

    fn recv_by(&mut self, deadline: Instant) -> Result<()> {
        match self.data.read_by(&mut self.buf, deadline)? {
            Some(_) => Ok(()),
            None => Err(Error::Timeout),
        }
    }

    /// Estimates the target's clock offset: (offset, error bound) in
    /// nanoseconds, from the exchange with the smallest round trip.
    pub fn clock_offset(&mut self, transport: Transport, probes: u64) -> Result<(f64, f64)> {
        let mode = answered_mode(transport);
        let t = self.data_target(transport, mode)?;
        self.start(Start {
            test: Test::Clock,
            mode,
            transport,
            completion: Completion::Poll,
            size: 8,
            count: probes,
            arrivals: false,
            pages: Pages::Base,
        })?;
        self.sync(t, transport)?;
        let mut best = (f64::MAX, 0.0);
        for _ in 0..probes {
            let t0 = clock_ns();
            self.data.write(t, &t0.to_le_bytes())?;
            let r = self
                .data
                .read_timeout(&mut self.buf, PATIENCE)?
                .ok_or(Error::Timeout)?;
            let t3 = clock_ns();
            if r.len < 8 {
                continue;
            }
            let mut w = [0u8; 8];
            w.copy_from_slice(&self.buf[..8]);
            let ts = u64::from_le_bytes(w) as f64;
            let rtt = (t3 - t0) as f64;
            if rtt < best.0 {
                best = (rtt, ts - (t0 as f64 + t3 as f64) / 2.0);
            }
        }
        self.done()?;
        Ok((best.1, best.0 / 2.0))
    }

    /// One-way latency of `count` messages, one in flight at a time.
    pub fn oneway(&mut self, transport: Transport, size: usize, count: u64) -> Result<OneWayRow> {
        let (offset, err) = self.clock_offset(transport, 200)?;
        let (sent, done) = self.timed_sends(Test::OneWay, transport, size, count)?;
        let mut lat: Vec<f64> = sent
            .iter()
            .zip(&done.samples)
            .map(|(s, a)| (*a as f64 - offset - *s as f64) / 1e3)
            .collect();
        Ok(OneWayRow {
            transport: transport.to_string(),
            size: size as u64,
            iterations: count,
            offset_usec: offset / 1e3,
            error_usec: err / 1e3,
            usec: Summary::of(&mut lat),
        })
    }

    /// DP-II's breakdown of one-way latency into its four stages.
    pub fn breakdown(
        &mut self,
        transport: Transport,
        size: usize,
        count: u64,
    ) -> Result<BreakdownRow> {
        let (offset, err) = self.clock_offset(transport, 200)?;
        self.data.set_probe(true);
        let r = self.timed_sends(Test::Breakdown, transport, size, count);
        self.data.set_probe(false);
        let (stages, done) = r?;
        let mut startup = Vec::new();
        let mut send = Vec::new();
        let mut net = Vec::new();
        let mut delivery = Vec::new();
        for (i, st) in stages.chunks_exact(3).enumerate() {
            let (Some(&hdr), Some(&dlv)) = (done.samples.get(2 * i), done.samples.get(2 * i + 1))
            else {
                break;
            };
            startup.push((st[1] - st[0]) as f64 / 1e3);
            send.push((st[2] - st[1]) as f64 / 1e3);
            net.push((hdr as f64 - offset - st[2] as f64) / 1e3);
            delivery.push(dlv.saturating_sub(hdr) as f64 / 1e3);
        }
        let m = |v: &mut Vec<f64>| Summary::of(v).median;
        let (a, b, c, d) = (m(&mut startup), m(&mut send), m(&mut net), m(&mut delivery));
        Ok(BreakdownRow {
            transport: transport.to_string(),
            size: size as u64,
            iterations: count,
            startup: a,
            send: b,
            net: c,
            delivery: d,
            total: a + b + c + d,
            error_usec: err / 1e3,
        })
    }

    /// Sends `count` messages one at a time (each answered by a 1-byte ack);
    /// returns the initiator's stamps and the target's record.
    fn timed_sends(
        &mut self,
        test: Test,
        transport: Transport,
        size: usize,
        count: u64,
    ) -> Result<(Vec<u64>, Done)> {
        let mode = answered_mode(transport);
        if mode == Mode::Datagram && size > self.mtu {
            return Err(Error::TooLarge {
                len: size,
                mtu: self.mtu,
            });
        }
        let t = self.data_target(transport, mode)?;
        self.start(Start {
            test,
            mode,
            transport,
            completion: Completion::Poll,
            size: size as u64,
            count,
            arrivals: false,
            pages: Pages::Base,
        })?;
        self.sync(t, transport)?;
        let out = vec![0x77u8; size];
        let mut stamps = Vec::with_capacity(3 * count as usize);
        for _ in 0..count {
            if test == Test::Breakdown {
                self.data.write(t, &out)?;
                let tm = self.data.timings();
                stamps.extend([tm.write_enter, tm.write_framed, tm.write_sent]);
            } else {
                stamps.push(clock_ns());
                self.data.write(t, &out)?;
            }
            self.recv()?;
        }
        let done = self.done()?;
        Ok((stamps, done))
    }

    /// Tells the target to exit.
    pub fn quit(mut self) -> Result<()> {
        let t = self.ctl_target(Transport::Tcp)?;
        let s = Start {
            test: Test::Quit,
            mode: Mode::Reliable,
            transport: Transport::Tcp,
            completion: Completion::Wait,
            size: 0,
            count: 0,
            arrivals: false,
            pages: Pages::Base,
        };
        self.ctl.write(t, &s.encode())
    }
}

/// The mode of runs whose every message is answered: reliable, except over
/// udp, which carries datagrams only.
fn answered_mode(transport: Transport) -> Mode {
    if transport == Transport::Udp {
        Mode::Datagram
    } else {
        Mode::Reliable
    }
}

/// Holds back message `i` of a run that began at `t0` (ns) until it is due
/// at `pace` messages a second, once it is more than a millisecond early: a
/// paced sender sends a millisecond's worth at a time.
fn hold(pace: Option<f64>, t0: u64, i: u64) {
    let Some(per_s) = pace.filter(|p| *p > 0.0) else {
        return;
    };
    let due = t0 + (i as f64 * 1e9 / per_s) as u64;
    let now = clock_ns();
    if due > now + 1_000_000 {
        std::thread::sleep(Duration::from_nanos(due - now));
    }
}

/// Name of a completion as the tables print it.
pub fn completion_name(c: Completion) -> &'static str {
    match c {
        Completion::Poll => "poll",
        Completion::Wait => "wait",
    }
}

/// Name of a test as the tables print it.
pub fn test_name(t: Test) -> &'static str {
    match t {
        Test::Bandwidth => "bw",
        Test::PingPong => "PingPong",
        Test::PingPing => "PingPing",
        Test::SendRecv => "SendRecv",
        Test::Exchange => "Exchange",
        Test::Clock => "clock",
        Test::OneWay => "oneway",
        Test::Breakdown => "breakdown",
        Test::Quit => "quit",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_scaled_to_the_time_it_should_take() {
        // Half the time: half the count; twice: twice.
        assert_eq!(scaled(100, 0.2, 0.1), 50);
        assert_eq!(scaled(100, 0.2, 0.4), 200);
        // Up tenfold at most, down to one message at least.
        assert_eq!(scaled(100, 0.001, 1.0), 1000);
        assert_eq!(scaled(100, 0.0, 1.0), 1000);
        assert_eq!(scaled(100, 10.0, 0.001), 1);
        assert_eq!(scaled(100, 1.0, -1.0), 1);
        assert_eq!(scaled(MAX_COUNT, 0.1, 1.0), MAX_COUNT);
        // The first run: some 4 MB, one message of 4 MB or more.
        assert_eq!(first_count(10), 2000);
        assert_eq!(first_count(1_000_000), 4);
        assert_eq!(first_count(4 << 20), 1);
    }

    #[test]
    fn a_bandwidth_warm_up_grows_until_it_lasts_a_twentieth_of_the_run() {
        // Eight 1 MB puts in 1 ms, most of it the run's start and end: ten
        // times more, then as many again as the mark still asks.
        assert_eq!(warm_again(8, 0.001, 1.0), Some(80));
        assert_eq!(warm_again(80, 0.02, 1.0), Some(200));
        assert_eq!(warm_again(200, 0.05, 1.0), None);
        // Never less than twice, never past the largest run.
        assert_eq!(warm_again(100, 0.049, 1.0), Some(200));
        assert_eq!(warm_again(4_000_000, 0.0, 1.0), Some(MAX_COUNT));
        assert_eq!(warm_again(MAX_COUNT, 0.0, 1.0), None);
        // The rounds end: from the smallest count, eight rounds reach the
        // largest run even when every warm-up takes no time at all.
        let (mut c, mut rounds) = (1, 0);
        while let Some(n) = warm_again(c, 0.0, 1.0) {
            assert!(n > c);
            c = n;
            rounds += 1;
        }
        assert!(rounds <= WARM_ROUNDS, "{rounds}");
    }

    #[test]
    fn a_warm_up_goes_once_round_the_ring_and_stays_within_its_bounds() {
        // Over shared memory, small messages: at least one lap of the ring.
        for size in [0, 8, 64, 1000] {
            let w = warm_up(Transport::Shm, size);
            assert!(
                w * (size + HEADER_LEN) as u64 >= DEFAULT_RING as u64,
                "{size} B: {w}"
            );
            assert!(w <= 100_000);
        }
        // Elsewhere ucx_perftest's count, or less for large messages.
        assert_eq!(warm_up(Transport::Tcp, 8), WARM_UP);
        assert_eq!(warm_up(Transport::Udp, 64), WARM_UP);
        let w = warm_up(Transport::Tcp, 1_000_000);
        assert!(w >= 1 && w * 1_000_056 <= WARM_UP_BYTES, "{w}");
        // Large messages over shared memory: the byte bound, beyond a lap.
        assert_eq!(
            warm_up(Transport::Shm, 1_000_000),
            warm_up(Transport::Tcp, 1_000_000)
        );
    }
}
