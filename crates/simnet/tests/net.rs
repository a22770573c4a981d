//! The simulated network's arithmetic and fates, on its virtual clock.

use macrolink_simnet::{LinkSpec, Nanos, Net, QueueLimit, MS, US};

/// Every delivery up to `until`: (arrival, message).
fn drain(net: &mut Net<u64>, until: Nanos) -> Vec<(Nanos, u64)> {
    let mut out = Vec::new();
    while net.now() < until {
        for d in net.run_until(until) {
            out.push((d.at, d.msg));
        }
        if net.next_event().is_none() {
            net.advance_to(until);
        }
    }
    out.extend(std::iter::from_fn(|| net.poll()).map(|d| (d.at, d.msg)));
    out
}

#[test]
fn delay_and_rate_are_exact() {
    let mut net = Net::new(1);
    let (a, b) = (net.add_node(), net.add_node());
    // 1 MB/s: 1000 bytes take 1 ms on the wire; 5 ms of fibre.
    let l = net.add_link(a, b, LinkSpec::new(5 * MS).rate(1_000_000));
    for i in 0..3 {
        net.send(l, 1000, i);
    }
    net.advance_to(2 * MS);
    net.send(l, 500, 3);
    let got = drain(&mut net, 100 * MS);
    assert_eq!(
        got,
        [
            (6 * MS, 0),
            (7 * MS, 1),
            (8 * MS, 2),
            (8 * MS + 500 * US, 3)
        ],
        "queued behind each other, then the delay"
    );
    assert_eq!(net.stats(l).delivered, 4);
    assert_eq!(net.stats(l).bytes, 3500);
    assert_eq!(LinkSpec::new(0).bits_per_sec(8_000_000).wire_time(1000), MS);
}

#[test]
fn jitter_keeps_order_unless_reordering_is_asked() {
    for reorder in [false, true] {
        let mut net = Net::new(7);
        let (a, b) = (net.add_node(), net.add_node());
        let l = net.add_link(a, b, LinkSpec::new(MS).jitter(2 * MS).reorder(reorder));
        for i in 0..1000 {
            net.send(l, 100, i);
            net.step(10 * US);
        }
        let got: Vec<u64> = drain(&mut net, 100 * MS).iter().map(|g| g.1).collect();
        assert_eq!(got.len(), 1000);
        let in_order = got.windows(2).all(|w| w[0] < w[1]);
        let reordered = net.stats(l).reordered;
        if reorder {
            assert!(!in_order && reordered > 100, "{reordered}");
        } else {
            assert!(in_order && reordered == 0);
        }
    }
}

#[test]
fn loss_is_near_its_probability() {
    let mut net = Net::new(3);
    let (a, b) = (net.add_node(), net.add_node());
    let p = 0.01;
    let l = net.add_link(a, b, LinkSpec::new(MS).loss(p));
    let n = 100_000u64;
    for i in 0..n {
        net.send(l, 100, i);
    }
    let got = drain(&mut net, 10 * MS).len() as f64;
    let lost = net.stats(l).lost as f64;
    assert_eq!(got + lost, n as f64);
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    assert!((lost - n as f64 * p).abs() <= 3.0 * sd, "lost {lost}");
}

#[test]
fn a_full_queue_drops_at_the_tail() {
    let mut net = Net::new(1);
    let (a, b) = (net.add_node(), net.add_node());
    // 1 MB/s, 3000 bytes of queue: a burst of 10 x 1000 keeps 3.
    let spec = LinkSpec::new(0).rate(1_000_000);
    let by_bytes = net.add_link(a, b, spec.queue(QueueLimit::Bytes(3000)));
    let by_time = net.add_link(a, b, spec.queue(QueueLimit::Time(2 * MS)));
    for i in 0..10 {
        net.send(by_bytes, 1000, i);
        net.send(by_time, 1000, 100 + i);
    }
    let got: Vec<u64> = drain(&mut net, 100 * MS).iter().map(|g| g.1).collect();
    assert_eq!(got, [0, 100, 1, 101, 2, 102]);
    assert_eq!(net.stats(by_bytes).queue_drops, 7);
    assert_eq!(net.stats(by_time).queue_drops, 7);
}

#[test]
fn dead_nodes_and_cut_links_carry_nothing_and_frozen_ones_wait() {
    let mut net = Net::new(1);
    let (a, b, c) = (net.add_node(), net.add_node(), net.add_node());
    let (ab, ba) = net.add_pair(a, b, LinkSpec::new(MS));
    let ac = net.add_link(a, c, LinkSpec::new(MS));
    net.kill(b, 10 * MS);
    net.revive(b, 20 * MS);
    net.freeze(c, 30 * MS, 50 * MS);
    net.cut(ab, 60 * MS, 70 * MS);
    let mut log = Vec::new();
    for t in (0..80).map(|ms| ms * MS) {
        net.advance_to(t);
        log.extend(std::iter::from_fn(|| net.poll()).map(|d| (d.at, d.msg)));
        if t % (5 * MS) == 0 {
            net.send(ab, 1, t / MS);
            net.send(ba, 1, 1000 + t / MS);
            net.send(ac, 1, 2000 + t / MS);
        }
    }
    let of = |base: u64| -> Vec<u64> {
        log.iter()
            .filter(|(_, m)| (base..base + 1000).contains(m))
            .map(|(_, m)| m - base)
            .collect()
    };
    // Sent at 5 arrives at 6; sent at 10 and 15 meet a dead node; back at 20.
    assert_eq!(of(0), [0, 5, 20, 25, 30, 35, 40, 45, 50, 55, 70, 75]);
    assert_eq!(
        of(1000),
        [0, 5, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75]
    );
    // Everything sent to c while frozen arrives at the thaw, in order.
    assert_eq!(of(2000), (0..16).map(|i| i * 5).collect::<Vec<_>>());
    let thawed: Vec<Nanos> = log
        .iter()
        .filter(|(_, m)| (2030..2050).contains(m))
        .map(|(at, _)| *at)
        .collect();
    assert!(thawed.iter().all(|&at| at == 50 * MS), "{thawed:?}");
    assert!(!net.is_alive(b, 15 * MS) && net.is_alive(b, 20 * MS));
    assert!(net.is_frozen(c, 40 * MS) && !net.is_frozen(c, 50 * MS));
    assert_eq!(net.stats(ab).dropped_down, 2 + 2);
    assert_eq!(net.stats(ba).dropped_down, 2);
}

#[test]
fn a_partition_cuts_both_ways_and_heals() {
    let mut net = Net::new(1);
    let (a, b) = (net.add_node(), net.add_node());
    let (ab, ba) = net.add_pair(a, b, LinkSpec::new(MS));
    net.partition(a, b, 0, 10 * MS);
    net.send(ab, 1, 1);
    net.send(ba, 1, 2);
    net.advance_to(10 * MS);
    net.send(ab, 1, 3);
    let got: Vec<u64> = drain(&mut net, 20 * MS).iter().map(|g| g.1).collect();
    assert_eq!(got, [3]);
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let run = |seed| {
        let mut net = Net::new(seed);
        let (a, b) = (net.add_node(), net.add_node());
        let spec = LinkSpec::new(MS)
            .jitter(MS)
            .loss(0.1)
            .rate(10_000_000)
            .reorder(true);
        let l = net.add_link(a, b, spec);
        for i in 0..500 {
            net.send(l, 100 + i % 900, i);
            net.step(50 * US);
        }
        drain(&mut net, 200 * MS)
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}
