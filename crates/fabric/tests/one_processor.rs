//! Two polling sides on one processor, as where more processes poll than a
//! host has processors: after a while of finding nothing, each offers the
//! processor to whatever else is ready to run there, so a ping-pong goes at
//! the pace of a switch between the two sides. Spinning on instead, each
//! side would keep the processor until the scheduler took it away, at the
//! end of its time slice (a tick: 4 ms at 250 Hz), and every message would
//! wait that long.
//!
//! A test binary of its own: no other test of it runs on the processor
//! meanwhile (cargo runs one test binary at a time).

use macrolink_fabric::{Completion, Mode, Transport};
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
use std::time::{Duration, Instant};

mod common;

/// Round trips of each transport's ping-pong.
const TRIPS: u32 = 1_000;

/// The most a half round trip may take on average: four times what a
/// debug build takes over udp, its slowest (15-290 us in a release build,
/// 145-470 us in a debug one, over shm, tcp and udp on a 2-core EPYC VM),
/// and half the time slice it took where the sides spun on (4 ms, the
/// tick of that kernel's 250 Hz; where the tick is shorter, this cannot
/// tell the two apart).
const HALF_TRIP_MOST: Duration = Duration::from_millis(2);

/// Keeps this thread, and the threads it starts from now on, to one of
/// the processors it may run on.
fn pin_to_one() {
    let mask = sched_getaffinity(None).unwrap();
    let cpu = (0..CpuSet::MAX_CPU).find(|&c| mask.is_set(c)).unwrap();
    let mut one = CpuSet::new();
    one.set(cpu);
    sched_setaffinity(None, &one).unwrap();
}

#[test]
fn polling_sides_sharing_one_processor_hand_it_to_each_other() {
    let _watch = common::watchdog(120, "one-processor ping-pong");
    pin_to_one();
    let (a, b, _dir) = common::nodes();
    let cases = [
        (Transport::Shm, Mode::Reliable),
        (Transport::Tcp, Mode::Reliable),
        (Transport::Udp, Mode::Datagram),
    ];
    for (i, (transport, mode)) in cases.into_iter().enumerate() {
        let (mut x, mut y) = common::pair(&a, &b, 10 + i as u32, Completion::Poll);
        let to_y = x.target_via(y.addr(), mode, transport).unwrap();
        // The echo runs on a thread of its own, on this processor too.
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            for _ in 0..=TRIPS {
                let r = y
                    .read_timeout(&mut buf, Duration::from_secs(30))
                    .unwrap()
                    .unwrap_or_else(|| panic!("{transport}: no ping in 30 s"));
                let back = y.reply_target(&r, mode).unwrap();
                y.write(back, &buf[..r.len]).unwrap();
            }
        });
        let mut buf = [0u8; 64];
        let mut trip = |n: u32| {
            x.write(to_y, &n.to_le_bytes()).unwrap();
            let r = x
                .read_timeout(&mut buf, Duration::from_secs(30))
                .unwrap()
                .unwrap_or_else(|| panic!("{transport}: no pong in 30 s"));
            assert_eq!(&buf[..r.len], n.to_le_bytes(), "{transport}");
        };
        // The first round trip makes the connection.
        trip(0);
        let t0 = Instant::now();
        for n in 1..=TRIPS {
            trip(n);
        }
        let took = t0.elapsed();
        echo.join().unwrap();
        let half = took / (2 * TRIPS);
        assert!(
            half <= HALF_TRIP_MOST,
            "{transport}: {TRIPS} round trips on one processor took {took:?}, {half:?} a \
             message: the sides kept the processor to the end of their time slices"
        );
        eprintln!("{transport}: {half:?} a half round trip on one processor");
    }
}
