//! A message costs the system calls the kernel needs to carry it and no
//! more: none over shared memory; over tcp and udp one send and one
//! receive (what `sockperf --nonblocked` makes); a waiting endpoint of
//! one tcp connection, or of datagrams alone, sleeps in that receive, as
//! sockperf's blocking `recv` does. Small
//! messages, both ways, polling and waiting. The system calls of this
//! thread are counted by the kernel (a perf counter on the
//! `raw_syscalls:sys_enter` tracepoint, which needs root); both endpoints
//! of each pair run on it, so that a read finds its message there and the
//! count is of the message's path alone, not of polls that found nothing.

mod common;

use common::{nodes, pair, round_trip};
use macrolink_fabric::{Completion, Mode, Transport};
use macrolink_testbed::require;
use perf_event::events::Tracepoint;
use perf_event::{Builder, Counter};

/// Where the kernel names its tracepoints.
const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The id of the tracepoint on the way into every system call.
fn sys_enter_id() -> Option<String> {
    TRACEFS.iter().find_map(|d| {
        // Listing the events first has the kernel make their entries.
        let _ = std::fs::read_dir(format!("{d}/events"));
        std::fs::read_to_string(format!("{d}/events/raw_syscalls/sys_enter/id")).ok()
    })
}

/// The tracepoint's id, from tracefs where it is mounted, or else where
/// this mounts it for the moment it takes to read (and then unmounts).
fn tracepoint_id() -> Result<String, String> {
    if let Some(id) = sys_enter_id() {
        return Ok(id);
    }
    let mount = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev", TRACEFS[0]])
        .status()
        .map_err(|e| format!("mount: {e}"))?;
    if !mount.success() {
        return Err(format!("no tracefs, and mounting it failed ({mount})"));
    }
    let id = sys_enter_id();
    let _ = std::process::Command::new("umount")
        .arg(TRACEFS[0])
        .status();
    id.ok_or_else(|| "no raw_syscalls tracepoint in tracefs".into())
}

/// A counter of this thread's system calls, enabled; or why there is none.
fn syscall_counter() -> Result<Counter, String> {
    let id = tracepoint_id()?;
    let id = id
        .trim()
        .parse()
        .map_err(|e| format!("tracepoint id {id:?}: {e}"))?;
    let mut c = Builder::new(Tracepoint::with_id(id))
        .observe_self()
        .any_cpu()
        // The tracepoint fires in the kernel, on the way into each call.
        .include_kernel()
        .build()
        .map_err(|e| format!("perf_event_open: {e}"))?;
    c.enable()
        .map_err(|e| format!("enabling the counter: {e}"))?;
    Ok(c)
}

#[test]
fn a_message_costs_the_system_calls_that_carry_it() {
    const WHAT: &str = "system call count test";
    if require::root(WHAT).is_none() {
        return;
    }
    let mut calls = match syscall_counter() {
        Ok(c) => c,
        Err(why) => return require::root_failed(WHAT, &why).unwrap_or(()),
    };
    // The counter counts: a read of it is a system call itself.
    let a0 = calls.read().unwrap();
    let a1 = calls.read().unwrap();
    let own = a1 - a0;
    for _ in 0..10 {
        let _ = std::fs::metadata("/");
    }
    let a2 = calls.read().unwrap();
    assert!(a2 - a1 >= 10 + own, "ten stat calls counted ({})", a2 - a1);
    assert!(own >= 1, "the counter's read is counted ({own})");
    let (a, b, _dir) = nodes();
    // Whether the transport's messages go through the kernel: a send and
    // a receive each.
    let cases = [
        (Transport::Shm, Mode::Reliable, false),
        (Transport::Shm, Mode::Datagram, false),
        (Transport::Tcp, Mode::Reliable, true),
        (Transport::Tcp, Mode::Datagram, true),
        (Transport::Udp, Mode::Datagram, true),
    ];
    let mut ep = 10;
    for completion in [Completion::Poll, Completion::Wait] {
        for (transport, mode, kernel) in cases {
            ep += 1;
            let (mut x, mut y) = pair(&a, &b, ep, completion);
            let to_y = x.target_via(y.addr(), mode, transport).unwrap();
            let mut buf = vec![0u8; 1 << 16];
            for size in [8usize, 1000] {
                let msg = vec![0x5a; size];
                for _ in 0..300 {
                    round_trip(&mut x, &mut y, to_y, mode, &mut buf, &msg);
                }
                let rounds = 2000u64;
                let before = calls.read().unwrap();
                let t0 = std::time::Instant::now();
                for _ in 0..rounds {
                    round_trip(&mut x, &mut y, to_y, mode, &mut buf, &msg);
                }
                let took = t0.elapsed();
                let n = calls.read().unwrap() - before - own;
                let most = budget(kernel, transport, completion, rounds, took);
                if kernel {
                    // The count is of this path: each message's send and
                    // receive are in it.
                    assert!(
                        n >= 4 * rounds,
                        "{transport} {mode} {completion:?}: {n} calls"
                    );
                }
                assert!(
                    n <= most,
                    "{transport} {mode} {completion:?}, {size} B: {n} system calls in {rounds} \
                     round trips, {most} at most"
                );
            }
        }
    }
}

/// The most system calls `rounds` round trips (two messages each) may
/// make. Through the kernel, a message is one send and one receive. A
/// waiting endpoint leaves a socket it emptied to its sleep rather than
/// asking it again (which would cost a call more a message where the next
/// message is not there yet, as in a ping-pong across processes), and one
/// whose one connection is tcp and answers quickly, or that hears
/// datagrams alone that come quickly, sleeps in that connection's `recv`
/// or in the UDP socket's `recvfrom`: the sleep is the receive, as a
/// blocking `recv` (sockperf's) is. A sleep in the wait set's
/// `epoll_wait` (or `poll`) before the receive, the call more, would
/// exceed the budget.
/// Over shared memory a polling endpoint makes none; a waiting one that
/// finds its messages there, and so never sleeps, asks its wait set
/// without sleeping, on one pass in `COLD_EVERY` (8), which connections it
/// left dozing have something. An endpoint asleep in its connection's
/// `recv`, which does not hear its UDP socket, looks at that socket once
/// 5 ms have gone since the last look (two endpoints here: two looks
/// each 5 ms of the `took` the round trips took). Over all of it, a
/// hundredth of a call a round trip for the endpoints' checks now and then
/// (a peer's liveness).
fn budget(
    kernel: bool,
    transport: Transport,
    completion: Completion,
    rounds: u64,
    took: std::time::Duration,
) -> u64 {
    let per_message = if kernel { 2 } else { 0 };
    let looks = match (kernel, completion) {
        (false, Completion::Wait) => rounds / 2,
        _ => 0,
    };
    let udp_looks = match (transport, completion) {
        (Transport::Tcp, Completion::Wait) => 2 * (took.as_millis() as u64 / 5 + 1),
        _ => 0,
    };
    2 * per_message * rounds + looks + udp_looks + rounds / 100
}
