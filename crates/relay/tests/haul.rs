//! The long-haul protocol between two relays, run in process over the link
//! emulator's pipes on a virtual clock: deterministic, seeded, no sockets.
//! Each test moves patterned bytes through flows and checks every byte.

use macrolink_linkemu::{LossModel, Pipe, QueueLimit, Rate, Spec};
use macrolink_relay::haul::{Config, Event, Link, Nanos, Stats, DATAGRAM_QUEUE};

const MS: Nanos = 1_000_000;
/// 1 Gbit/s.
const GBIT: u64 = 125_000_000;

fn byte(flow: usize, i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ flow as u8
}

/// One local connection at the sending relay and its twin at the other.
struct Stream {
    id: u32,
    node: u32,
    total: u64,
    written: u64,
    received: u64,
    /// Bytes the far side takes per step (`None`: all).
    take: Option<usize>,
    finished_at: Option<Nanos>,
    far: Option<u32>,
}

struct Pair {
    a: Link,
    b: Link,
    ab: Pipe<Vec<u8>>,
    ba: Pipe<Vec<u8>>,
    now: Nanos,
    streams: Vec<Stream>,
    events_b: Vec<Event>,
    events_a: Vec<Event>,
    /// Packets from b to a are dropped from this time on (a dead peer).
    cut_ba_at: Option<Nanos>,
}

fn link(rate: u64, one_way: Nanos, loss: LossModel, seed: u64) -> Spec {
    let mut s = Spec::new(one_way);
    s.rate = Some(Rate {
        bytes_per_sec: rate,
        burst: 9000,
        queue: QueueLimit::Bytes((rate as f64 * 0.02) as u64 + 100_000),
    });
    s.loss = loss;
    s.seed = seed;
    s
}

impl Pair {
    fn new(cfg: Config, ab: Spec, ba: Spec) -> Pair {
        let b_cfg = Config { high: true, ..cfg };
        Pair {
            a: Link::new(cfg, 0xa, 0),
            b: Link::new(b_cfg, 0xb, 0),
            ab: Pipe::new(ab),
            ba: Pipe::new(ba),
            now: 0,
            streams: Vec::new(),
            events_a: Vec::new(),
            events_b: Vec::new(),
            cut_ba_at: None,
        }
    }

    fn stream(&mut self, node: u32, total: u64, take: Option<usize>) -> usize {
        let id = self.a.open(node).expect("a flow");
        self.streams.push(Stream {
            id,
            node,
            total,
            written: 0,
            received: 0,
            take,
            finished_at: None,
            far: None,
        });
        self.streams.len() - 1
    }

    /// The local sides: write what each flow takes at a, read at b.
    fn apps(&mut self) {
        while let Some(e) = self.b.poll_event() {
            match e {
                // A flow for a node no stream has is one of a run that
                // ended (its packets still on the link): left alone.
                Event::Opened { flow, node } => {
                    if let Some(s) = self
                        .streams
                        .iter_mut()
                        .find(|s| s.far.is_none() && s.node == node)
                    {
                        s.far = Some(flow);
                    }
                }
                Event::Reset { flow } => {
                    for s in self.streams.iter_mut().filter(|s| s.far == Some(flow)) {
                        s.far = None;
                    }
                }
                _ => {}
            }
            self.events_b.push(e);
        }
        while let Some(e) = self.a.poll_event() {
            self.events_a.push(e);
        }
        let mut chunk = Vec::new();
        for (k, s) in self.streams.iter_mut().enumerate() {
            let room = self.a.writable(s.id) as u64;
            let n = room.min(s.total - s.written);
            if n > 0 {
                chunk.clear();
                chunk.extend((s.written..s.written + n).map(|i| byte(k, i)));
                assert_eq!(self.a.write(s.id, &chunk), n as usize);
                s.written += n;
            }
            if s.written == s.total {
                self.a.finish(s.id);
            }
            let Some(far) = s.far else { continue };
            let (x, y) = self.b.readable(far);
            let have = x.len() + y.len();
            let n = s.take.map_or(have, |t| t.min(have));
            for (j, &v) in x.iter().chain(y).take(n).enumerate() {
                let i = s.received + j as u64;
                assert_eq!(v, byte(k, i), "flow {k} byte {i}");
            }
            s.received += n as u64;
            self.b.consume(far, n);
            if self.b.peer_finished(far) && s.finished_at.is_none() {
                assert_eq!(s.received, s.total);
                s.finished_at = Some(self.now);
                self.b.finish(far);
            }
        }
    }

    fn step(&mut self) {
        let mut buf = vec![0u8; 65_536];
        self.apps();
        for side in [&mut self.a, &mut self.b] {
            side.on_timeout(self.now);
        }
        while let Some(n) = self.a.poll_transmit(self.now, &mut buf) {
            self.ab.offer(self.now, n, buf[..n].to_vec());
        }
        while let Some(n) = self.b.poll_transmit(self.now, &mut buf) {
            if self.cut_ba_at.is_some_and(|t| self.now >= t) {
                continue;
            }
            self.ba.offer(self.now, n, buf[..n].to_vec());
        }
        while let Some(d) = self.ab.pop_due(self.now) {
            self.b.handle(self.now, &d.packet).expect("a good packet");
        }
        while let Some(d) = self.ba.pop_due(self.now) {
            self.a.handle(self.now, &d.packet).expect("a good packet");
        }
        self.apps();
        let next = [
            self.ab.next_due(),
            self.ba.next_due(),
            self.a.next_timeout(),
            self.b.next_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(self.now + MS);
        self.now = next.max(self.now + 1_000);
    }

    /// Steps until every stream is done, or `limit` of virtual time.
    fn run(&mut self, limit: Nanos) {
        while self.now < limit && self.streams.iter().any(|s| s.finished_at.is_none()) {
            self.step();
        }
    }

    fn goodput(&self, k: usize) -> f64 {
        let s = &self.streams[k];
        s.total as f64 * 1e9 / s.finished_at.expect("finished") as f64
    }
}

fn jumbo() -> Config {
    Config {
        packet: 8900,
        ..Config::default()
    }
}

#[test]
fn one_flow_fills_a_long_link_and_the_window_settles_near_twice_the_bdp() {
    // 1 Gbit/s, 10 ms each way: the BDP is 2.5 MB.
    let spec = link(GBIT, 10 * MS, LossModel::None, 1);
    let mut p = Pair::new(jumbo(), spec, spec);
    p.stream(7, 256 << 20, None);
    p.run(30_000 * MS);
    let g = p.goodput(0) / GBIT as f64;
    let s: Stats = p.a.stats();
    eprintln!("goodput {:.3} of the link; {s:?}", g);
    assert!(g > 0.85, "goodput {g:.3} of the link rate");
    let bdp = GBIT as f64 * 0.020;
    let w = s.window as f64;
    assert!(
        (1.5 * bdp..3.0 * bdp).contains(&w),
        "window {w} against a BDP of {bdp}"
    );
    assert!(
        (s.min_rtt as f64) < 20.5e6 && s.min_rtt >= 20 * MS,
        "{}",
        s.min_rtt
    );
}

#[test]
fn one_percent_loss_costs_resends_not_bytes_and_the_rate_holds() {
    let spec = link(GBIT, 10 * MS, LossModel::Bernoulli { p: 0.01 }, 3);
    let mut p = Pair::new(jumbo(), spec, Spec { seed: 4, ..spec });
    p.stream(7, 64 << 20, None);
    p.run(60_000 * MS);
    let s = p.a.stats();
    let g = p.goodput(0) / GBIT as f64;
    eprintln!("goodput {g:.3}; {s:?}");
    assert!(g > 0.6, "goodput {g:.3}");
    let resent = s.bytes_resent as f64 / s.bytes_sent as f64;
    assert!((0.005..0.03).contains(&resent), "resent {resent:.4}");
}

#[test]
fn bursts_of_loss_and_reordering_lose_nothing() {
    let mut spec = link(
        GBIT / 4,
        5 * MS,
        LossModel::GilbertElliott {
            p: 0.01,
            r: 0.3,
            loss_bad: 0.5,
            loss_good: 0.001,
        },
        9,
    );
    spec.reorder = 0.02;
    spec.duplicate = 0.01;
    let mut p = Pair::new(Config::default(), spec, Spec { seed: 10, ..spec });
    p.stream(1, 8 << 20, None);
    p.stream(2, 3 << 20, None);
    p.run(60_000 * MS);
    for k in 0..2 {
        assert!(p.streams[k].finished_at.is_some(), "stream {k}");
    }
    assert!(p.a.stats().lost > 0);
}

/// Bursts of ten lost packets both ways on a short link (50 µs each way),
/// as netem's `gemodel 1% 10%`: the state lasts ten packets, not a time,
/// so the probes sent after a burst that took a window's tail are lost in
/// it too. The probe timeout stops doubling at four times: the stream
/// keeps over 0.3 of the link (0.13 while it doubled to 64 times).
#[test]
fn bursts_that_take_the_probes_too_cost_little_time() {
    let spec = link(
        GBIT,
        50_000,
        LossModel::GilbertElliott {
            p: 0.01,
            r: 0.1,
            loss_bad: 1.0,
            loss_good: 0.0,
        },
        9,
    );
    let mut p = Pair::new(jumbo(), spec, Spec { seed: 10, ..spec });
    p.stream(7, 64 << 20, None);
    p.run(120_000 * MS);
    let g = p.goodput(0) / GBIT as f64;
    let s = p.a.stats();
    eprintln!("goodput {g:.3}; {s:?}");
    assert!(
        s.lost > 500 && s.probes > 20,
        "bursts took the tails: {s:?}"
    );
    assert!(g > 0.3, "goodput {g:.3} of the link");
}

#[test]
fn four_flows_share_the_link_fairly() {
    let spec = link(GBIT, 2 * MS, LossModel::None, 1);
    let mut p = Pair::new(jumbo(), spec, spec);
    for n in 0..4 {
        p.stream(n, 32 << 20, None);
    }
    p.run(30_000 * MS);
    let times: Vec<f64> = (0..4)
        .map(|k| p.streams[k].finished_at.unwrap() as f64)
        .collect();
    let (lo, hi) = times
        .iter()
        .fold((f64::MAX, 0.0f64), |(l, h), &t| (l.min(t), h.max(t)));
    assert!(hi / lo < 1.1, "finish times {times:?}");
    let all = 4.0 * (32u64 << 20) as f64 * 1e9 / hi / GBIT as f64;
    assert!(all > 0.85, "together {all:.3} of the link");
}

#[test]
fn a_slow_receiver_holds_only_its_own_share_and_others_go_at_full_rate() {
    let spec = link(GBIT, 5 * MS, LossModel::None, 1);
    let cfg = Config {
        receive_buffer: 8 << 20,
        ..jumbo()
    };
    let mut p = Pair::new(cfg, spec, spec);
    let slow = p.stream(1, 64 << 20, Some(0));
    let fast = p.stream(2, 64 << 20, None);
    p.run(30_000 * MS);
    assert!(p.streams[fast].finished_at.is_some());
    let g = p.goodput(fast) / GBIT as f64;
    assert!(g > 0.8, "the fast flow got {g:.3} of the link");
    let s = &p.streams[slow];
    assert_eq!(s.received, 0);
    let held = p.b.readable(s.far.unwrap());
    let held = held.0.len() + held.1.len();
    assert!(
        held as u64 <= cfg.receive_buffer,
        "the stalled flow holds {held} bytes"
    );
    assert!(held > 0, "it got its share before stalling");
    // Now it drains: everything arrives.
    p.streams[slow].take = None;
    p.run(p.now + 30_000 * MS);
    assert_eq!(p.streams[slow].received, 64 << 20);
}

#[test]
fn a_silent_peer_resets_every_flow_after_the_dead_time() {
    let spec = link(GBIT, 5 * MS, LossModel::None, 1);
    let cfg = Config {
        dead_after: 500 * MS,
        ..jumbo()
    };
    let mut p = Pair::new(cfg, spec, spec);
    p.stream(1, 1 << 40, None);
    p.stream(2, 1 << 40, None);
    p.cut_ba_at = Some(200 * MS);
    p.run(2_000 * MS);
    let resets = p
        .events_a
        .iter()
        .filter(|e| matches!(e, Event::Reset { .. }))
        .count();
    assert_eq!(resets, 2, "{:?}", p.events_a);
    assert!(p.events_a.contains(&Event::PeerLost));
    assert_eq!(p.a.flows(), 0);
}

#[test]
fn a_seed_makes_a_run_repeat_exactly() {
    let run = || {
        let spec = link(GBIT / 2, 3 * MS, LossModel::Bernoulli { p: 0.02 }, 5);
        let mut p = Pair::new(Config::default(), spec, Spec { seed: 6, ..spec });
        p.stream(1, 4 << 20, None);
        p.run(10_000 * MS);
        (p.now, p.a.stats().packets_sent, p.a.stats().lost)
    };
    assert_eq!(run(), run());
}

#[test]
fn an_earlier_session_is_a_replay_while_the_peer_speaks_and_a_later_one_a_restart() {
    use macrolink_wire::haul::{Body, Packet};
    let ping = |session: u64, pn: u64| {
        let mut b = [0u8; 64];
        let n = Packet {
            session,
            pn,
            body: Body::Ping,
        }
        .encode(&mut b)
        .unwrap();
        b[..n].to_vec()
    };
    let mut a = Link::new(Config::default(), 1, 0);
    let flow = a.open(3).unwrap();
    a.handle(0, &ping(50, 0)).unwrap();
    a.handle(10 * MS, &ping(40, 0)).unwrap();
    assert_eq!(a.stats().stale, 1);
    assert!(a.has(flow) && a.poll_event().is_none());
    // A later run of the peer, at once: run 50 never answered the flow,
    // so it goes on with run 60, and nothing counts as lost.
    a.handle(20 * MS, &ping(60, 0)).unwrap();
    assert_eq!(a.stats().stale, 1);
    assert!(a.has(flow) && a.poll_event().is_none());
    // Run 60 answers the flow's first packet; then the peer is silent,
    // and comes back with an earlier session (its clock set back): a
    // restart all the same, which loses the flow.
    let mut out = vec![0u8; 2048];
    let mut pns = Vec::new();
    while let Some(n) = a.poll_transmit(20 * MS, &mut out) {
        pns.push(Packet::decode(&out[..n]).unwrap().pn);
    }
    assert!(!pns.is_empty());
    let mut b = [0u8; 256];
    let n = Packet {
        session: 60,
        pn: 1,
        body: Body::Ack(macrolink_wire::haul::Ack {
            delay_us: 0,
            ranges: vec![(pns[0], pns[0])],
            credits: Vec::new(),
        }),
    }
    .encode(&mut b)
    .unwrap();
    a.handle(30 * MS, &b[..n]).unwrap();
    a.handle(40 * MS, &ping(55, 0)).unwrap();
    assert_eq!(a.stats().stale, 2, "55 while 60 speaks");
    assert!(a.has(flow));
    a.handle(2_000 * MS, &ping(55, 1)).unwrap();
    assert_eq!(a.poll_event(), Some(Event::Reset { flow }));
    assert_eq!(a.poll_event(), Some(Event::PeerLost));
    assert!(!a.has(flow));
}

/// Both relays start again while packets of their last runs are still on
/// a long link: each first hears its peer's last run, then the new one. A
/// flow opened at once crosses whole and is not reset (it was: the old
/// run's packets were taken as the peer, the new run's as replays, and a
/// second later the switch to the new run reset every flow).
#[test]
fn a_pair_started_again_with_the_last_runs_packets_on_the_link_carries_a_new_flow() {
    let spec = link(GBIT, 70 * MS, LossModel::None, 9);
    let mut p = Pair::new(jumbo(), spec, spec);
    p.stream(7, 64 << 20, None);
    p.run(1_500 * MS);
    assert!(p.streams[0].finished_at.is_none() && p.a.stats().bytes_sent > 0);
    assert!(
        p.ab.next_due().is_some() && p.ba.next_due().is_some(),
        "packets of the last runs are on the link both ways"
    );
    // Both start again (later sessions); the pipes keep what is on them.
    p.a = Link::new(jumbo(), 0x1a, p.now);
    p.b = Link::new(
        Config {
            high: true,
            ..jumbo()
        },
        0x1b,
        p.now,
    );
    p.streams.clear();
    p.events_a.clear();
    p.events_b.clear();
    let k = p.stream(8, 8 << 20, None);
    let id = p.streams[k].id;
    p.run(p.now + 30_000 * MS);
    assert!(
        p.streams[k].finished_at.is_some(),
        "the new flow did not finish; a: {:?} {:?}",
        p.a.stats(),
        p.events_a
    );
    assert!(
        !p.events_a.contains(&Event::Reset { flow: id }),
        "{:?}",
        p.events_a
    );
}

#[test]
fn flows_opened_together_over_a_lossy_link_each_arrive_whole() {
    // Their first packets are lost and overtaken by later flows' first
    // packets: each is still a new flow when its first packet does arrive.
    let mut spec = link(GBIT / 8, 2 * MS, LossModel::Bernoulli { p: 0.1 }, 21);
    spec.reorder = 0.05;
    let mut p = Pair::new(Config::default(), spec, Spec { seed: 22, ..spec });
    for n in 0..16 {
        p.stream(n, 256 << 10, None);
    }
    p.run(60_000 * MS);
    for (k, s) in p.streams.iter().enumerate() {
        assert!(
            s.finished_at.is_some(),
            "stream {k}: {} of {}",
            s.received,
            s.total
        );
    }
}

#[test]
fn datagrams_go_once_beside_a_flow_over_loss_and_duplication_and_a_full_queue_drops_them() {
    let mut spec = link(GBIT, 2 * MS, LossModel::Bernoulli { p: 0.01 }, 5);
    spec.duplicate = 0.05;
    let mut p = Pair::new(jumbo(), spec, Spec { seed: 6, ..spec });
    p.stream(1, 16 << 20, None);
    const N: u32 = 2000;
    let body = |i: u32| i.to_le_bytes().repeat(100);
    let (mut sent, mut got) = (0u32, Vec::new());
    while p.now < 10_000 * MS && (p.streams[0].finished_at.is_none() || sent < N) {
        while sent < N && p.a.send_datagram(3, &body(sent)) {
            sent += 1;
            if sent % 8 == 0 {
                break;
            }
        }
        p.step();
        while let Some((node, d)) = p.b.poll_datagram() {
            assert_eq!(node, 3);
            let i = u32::from_le_bytes(d[..4].try_into().unwrap());
            assert_eq!(d, body(i), "datagram {i} whole");
            got.push(i);
        }
    }
    for _ in 0..2000 {
        p.step();
        while let Some((_, d)) = p.b.poll_datagram() {
            got.push(u32::from_le_bytes(d[..4].try_into().unwrap()));
        }
    }
    assert!(p.streams[0].finished_at.is_some(), "the flow finished");
    let arrived = got.len();
    got.sort_unstable();
    got.dedup();
    assert_eq!(got.len(), arrived, "no datagram arrived twice");
    let s = p.a.stats();
    eprintln!("{arrived} of {N} datagrams arrived; {s:?}");
    assert_eq!(s.datagrams_sent, u64::from(N));
    assert!(
        (1900..N as usize).contains(&arrived),
        "1 % lost, none resent: {arrived}"
    );
    let before = s.datagrams_dropped;
    let dropped = (0..DATAGRAM_QUEUE + 10)
        .filter(|_| !p.a.send_datagram(3, b"x"))
        .count();
    assert_eq!(dropped, 10, "past the queue, datagrams are dropped");
    assert!(!p.a.send_datagram(3, &vec![0; jumbo().packet]), "too large");
    assert_eq!(p.a.stats().datagrams_dropped, before + 11);
}
