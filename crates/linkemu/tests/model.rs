//! The link model on a virtual clock: each impairment does what it was
//! asked, within the bounds the emulator promises (delay exact, rate within
//! a fraction of a percent, probabilities within three standard
//! deviations), and a seed repeats a run.

use macrolink_linkemu::{
    flip, Distribution, Fate, Jitter, LossModel, Nanos, Pipe, QueueLimit, Rate, Spec, Stats,
};

const MS: Nanos = 1_000_000;
const US: Nanos = 1_000;

/// Offers `n` packets of `len` bytes, one every `gap`, and carries them
/// all; returns each delivery's (offer order, due time) and the counters.
fn run(spec: Spec, n: u64, len: usize, gap: Nanos) -> (Vec<(u64, Nanos)>, Stats) {
    let mut p = Pipe::new(spec);
    let mut out = Vec::new();
    for i in 0..n {
        let now = i * gap;
        while let Some(d) = p.pop_due(now) {
            out.push((d.packet, d.due));
        }
        p.offer(now, len, i);
    }
    while let Some(t) = p.next_due() {
        while let Some(d) = p.pop_due(t) {
            out.push((d.packet, d.due));
        }
    }
    (out, p.stats())
}

/// Whether `got` of `n` trials is within three standard deviations of `p`.
fn within_3_sigma(got: u64, n: u64, p: f64) -> bool {
    let sigma = (n as f64 * p * (1.0 - p)).sqrt();
    (got as f64 - n as f64 * p).abs() <= 3.0 * sigma.max(1.0)
}

#[test]
fn a_fixed_delay_is_exact_and_a_distance_is_5_us_per_km() {
    assert_eq!(Spec::km(2.0).delay, 10 * US);
    assert_eq!(Spec::km(13_840.0).delay, 69_200 * US); // 8,600 miles
    let (out, s) = run(Spec::new(3 * MS), 1000, 1500, 10 * US);
    for (i, (pkt, due)) in out.iter().enumerate() {
        assert_eq!(*pkt, i as u64);
        assert_eq!(*due, i as u64 * 10 * US + 3 * MS);
    }
    assert_eq!(
        (s.offered, s.carried, s.delayed, s.reordered),
        (1000, 1000, 1000, 0)
    );
}

#[test]
fn the_rate_limit_sends_at_the_rate_and_the_queue_drops_at_its_tail() {
    // 1 Gbit/s, packets of 1500 B offered at once: the last leaves when
    // 15 MB have gone at 125 MB/s.
    let rate = Rate {
        bytes_per_sec: 125_000_000,
        burst: 1500,
        queue: QueueLimit::Bytes(u64::MAX),
    };
    let spec = Spec {
        rate: Some(rate),
        ..Spec::new(0)
    };
    let (out, s) = run(spec, 10_000, 1500, 0);
    let last = out.last().unwrap().1 as f64;
    let ideal = 9_999.0 * 1500.0 / 125e6 * 1e9;
    assert!((last / ideal - 1.0).abs() < 0.001, "{last} vs {ideal}");
    assert_eq!(s.queue_drops, 0);

    // Offered at twice the rate into a queue of 10 ms: what is carried
    // goes at the rate (within 1%), the rest is dropped at the tail, and no
    // packet waits longer than the queue allows.
    let spec = Spec {
        rate: Some(Rate {
            queue: QueueLimit::Time(10 * MS),
            ..rate
        }),
        ..Spec::new(0)
    };
    let gap = 6 * US; // 1500 B every 6 us = 250 MB/s
    let (out, s) = run(spec, 100_000, 1500, gap);
    let span = out.last().unwrap().1 - out[0].1;
    let carried_rate = (out.len() - 1) as f64 * 1500.0 / (span as f64 / 1e9);
    assert!((carried_rate / 125e6 - 1.0).abs() < 0.01, "{carried_rate}");
    assert!(s.queue_drops > 40_000 && s.queue_drops < 52_000, "{s}");
    assert!(out.iter().all(|&(i, due)| due - i * gap <= 10 * MS));

    // A queue of bytes: 10 packets fit, the 11th offered at once does not.
    let spec = Spec {
        rate: Some(Rate {
            queue: QueueLimit::Bytes(15_000),
            ..rate
        }),
        ..Spec::new(0)
    };
    let mut p = Pipe::new(spec);
    let fates: Vec<Fate> = (0..12).map(|i| p.offer(0, 1500, i)).collect();
    // The first leaves at once (the bucket holds one packet), ten wait.
    assert!(fates[..11].iter().all(|f| matches!(f, Fate::Due(_))));
    assert_eq!(fates[11], Fate::QueueFull);
}

#[test]
fn bernoulli_loss_is_within_three_sigma_over_100_000_packets() {
    for p in [0.001, 0.01, 0.1] {
        let spec = Spec {
            loss: LossModel::Bernoulli { p },
            ..Spec::new(MS)
        };
        let (out, s) = run(spec, 100_000, 100, US);
        assert!(within_3_sigma(s.lost, 100_000, p), "p {p}: {s}");
        assert_eq!(out.len() as u64 + s.lost, 100_000);
    }
}

#[test]
fn gilbert_elliott_loss_comes_in_bursts_of_the_asked_length() {
    let model = LossModel::GilbertElliott {
        p: 0.01,
        r: 0.25,
        loss_bad: 1.0,
        loss_good: 0.0,
    };
    let spec = Spec {
        loss: model,
        ..Spec::new(MS)
    };
    let n = 1_000_000;
    let mut pipe = Pipe::new(spec);
    let lost: Vec<bool> = (0..n)
        .map(|i| pipe.offer(i * US, 100, i) == Fate::Lost)
        .collect();
    let share = lost.iter().filter(|l| **l).count() as f64 / n as f64;
    assert!(
        (share / model.mean() - 1.0).abs() < 0.1,
        "{share} vs {}",
        model.mean()
    );
    let bursts = lost.windows(2).filter(|w| !w[0] && w[1]).count() as f64;
    let mean_burst = share * n as f64 / bursts;
    assert!(
        (mean_burst / 4.0 - 1.0).abs() < 0.1,
        "mean burst {mean_burst}"
    );
}

#[test]
fn jitter_varies_the_delay_around_its_mean_without_reordering() {
    for distribution in [
        Distribution::Uniform,
        Distribution::Normal,
        Distribution::Pareto,
    ] {
        let jitter = Jitter {
            amount: MS,
            distribution,
            correlation: 0.0,
        };
        let spec = Spec {
            jitter: Some(jitter),
            ..Spec::new(10 * MS)
        };
        // Packets 20 ms apart: the order clamp never binds.
        let (out, s) = run(spec, 20_000, 100, 20 * MS);
        let delays: Vec<f64> = out
            .iter()
            .map(|&(i, due)| (due - i * 20 * MS) as f64)
            .collect();
        let mean = delays.iter().sum::<f64>() / delays.len() as f64;
        assert!(
            (mean / (10 * MS) as f64 - 1.0).abs() < 0.02,
            "{distribution:?}: {mean}"
        );
        assert!(
            delays.iter().any(|d| (d - 1e7).abs() > 1e5),
            "{distribution:?} varies"
        );
        assert_eq!(s.reordered, 0);
        // Packets 10 us apart: jitter of 1 ms would reorder them, but it
        // is asked not to.
        let (out, s) = run(spec, 20_000, 100, 10 * US);
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(s.reordered, 0);
    }
    // Correlation: neighbours' variations follow each other.
    let spec = Spec {
        jitter: Some(Jitter {
            amount: MS,
            distribution: Distribution::Uniform,
            correlation: 0.9,
        }),
        ..Spec::new(10 * MS)
    };
    let (out, _) = run(spec, 20_000, 100, 20 * MS);
    let v: Vec<f64> = out
        .iter()
        .map(|&(i, due)| (due - i * 20 * MS) as f64 - 1e7)
        .collect();
    let lag1 =
        v.windows(2).map(|w| w[0] * w[1]).sum::<f64>() / v.iter().map(|x| x * x).sum::<f64>();
    assert!(lag1 > 0.8, "lag-1 autocorrelation {lag1}");
}

#[test]
fn reordering_duplication_and_corruption_come_at_their_rates() {
    let n = 100_000;
    let spec = Spec {
        reorder: 0.05,
        duplicate: 0.02,
        corrupt: 0.01,
        ..Spec::new(MS)
    };
    let (out, s) = run(spec, n, 1000, 10 * US);
    assert!(within_3_sigma(s.duplicated, n, 0.02), "{s}");
    assert!(within_3_sigma(s.corrupted, n + s.duplicated, 0.01), "{s}");
    assert_eq!(out.len() as u64, n + s.duplicated);
    // Nearly every packet has others on the line (1 ms of them), so nearly
    // every one picked overtakes.
    assert!(within_3_sigma(s.reordered, n, 0.05), "{s}");
    let overtakes = out.windows(2).filter(|w| w[1].0 < w[0].0).count() as u64;
    assert!(overtakes > 0 && overtakes <= s.reordered, "{overtakes} {s}");
    let mut data = vec![0u8; 4];
    flip(&mut data, 9);
    assert_eq!(data, [0, 2, 0, 0]);
    flip(&mut data, 1 << 40); // past the end: nothing
    assert_eq!(data, [0, 2, 0, 0]);
}

#[test]
fn a_seed_repeats_a_run_and_another_seed_does_not() {
    let spec = |seed| Spec {
        loss: LossModel::Bernoulli { p: 0.1 },
        jitter: Some(Jitter {
            amount: 100 * US,
            distribution: Distribution::Normal,
            correlation: 0.3,
        }),
        reorder: 0.01,
        seed,
        ..Spec::new(MS)
    };
    let a = run(spec(7), 10_000, 500, 10 * US);
    let b = run(spec(7), 10_000, 500, 10 * US);
    let c = run(spec(8), 10_000, 500, 10 * US);
    assert_eq!(a, b);
    assert_ne!(a.0, c.0);
}

#[test]
fn counters_read_as_text_and_json_and_bad_specs_are_refused() {
    let (_, s) = run(
        Spec {
            loss: LossModel::Bernoulli { p: 0.5 },
            ..Spec::new(MS)
        },
        100,
        10,
        US,
    );
    let text = s.to_string();
    assert!(
        text.starts_with("offered 100 (1000 bytes), carried "),
        "{text}"
    );
    let json = serde_json::to_value(s).unwrap();
    assert_eq!(json["offered"], 100);
    assert_eq!(
        json["lost"].as_u64().unwrap() + json["carried"].as_u64().unwrap(),
        100
    );
    let bad = Spec {
        reorder: 1.5,
        ..Spec::new(0)
    };
    assert!(bad.check().unwrap_err().contains("reorder"));
    let bad = Spec {
        loss: LossModel::GilbertElliott {
            p: 0.1,
            r: -0.1,
            loss_bad: 1.0,
            loss_good: 0.0,
        },
        ..Spec::new(0)
    };
    assert!(bad.check().is_err());
    assert!(Spec::km(2.0).check().is_ok());
}
