//! A message costs no allocation once a connection is set up: over every
//! transport, polling and waiting, small and large messages, both ways
//! (over UCX, what macrolink allocates; UCX's own pools are its own).
//! The allocations of this thread are counted (the node's own threads,
//! acceptors and the like, are not the message path).

mod common;

use common::{nodes, pair, round_trip};
use macrolink_fabric::{
    Completion, Endpoint, EndpointConfig, Mode, Node, NodeConfig, Transport, UcxOptions,
};
use macrolink_testbed::require;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call goes to the system allocator unchanged; counting
// touches a thread-local cell with a constant initialiser and no
// destructor, which itself allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

#[test]
fn a_message_allocates_nothing() {
    // The count sees this thread's allocations.
    let before = allocs();
    let v = std::hint::black_box(vec![1u8; 10]);
    assert_eq!(allocs(), before + 1);
    drop(v);
    let (a, b, _dir) = nodes();
    let cases = [
        (Transport::Shm, Mode::Reliable),
        (Transport::Tcp, Mode::Reliable),
        (Transport::Shm, Mode::Datagram),
        (Transport::Tcp, Mode::Datagram),
        (Transport::Udp, Mode::Datagram),
    ];
    let mut ep = 10;
    for completion in [Completion::Poll, Completion::Wait] {
        for (transport, mode) in cases {
            ep += 1;
            let (mut x, mut y) = pair(&a, &b, ep, completion);
            let to_y = x.target_via(y.addr(), mode, transport).unwrap();
            let sizes: &[usize] = if mode == Mode::Datagram {
                &[8, 1000]
            } else {
                &[8, 1000, 100_000, 1_000_000]
            };
            let mut buf = vec![0u8; 1 << 20];
            // One exchange sets up the way back; a few hundred more fill
            // whatever grows to its working size (rings, staging, pools).
            for &size in sizes {
                let msg = vec![0x5a; size];
                for _ in 0..300 {
                    round_trip(&mut x, &mut y, to_y, mode, &mut buf, &msg);
                }
                let before = allocs();
                let rounds = if size > 100_000 { 200 } else { 2000 };
                for _ in 0..rounds {
                    round_trip(&mut x, &mut y, to_y, mode, &mut buf, &msg);
                }
                let n = allocs() - before;
                assert_eq!(
                    n, 0,
                    "{transport} {mode} {completion:?}, {size} B: {n} allocations in {rounds} round trips"
                );
            }
        }
    }
}

/// Over UCX (its shared memory and its tcp), what macrolink does on the
/// way of a message allocates nothing either (UCX's own memory is its
/// pools', not counted here), credit going back included.
#[test]
fn a_message_over_ucx_allocates_nothing() {
    for tls in ["sm,self", "tcp"] {
        let dir = tempfile::tempdir().unwrap();
        let node = |id| {
            let mut c = NodeConfig::local(id, dir.path());
            c.ucx = Some(UcxOptions {
                tls: Some(tls.into()),
                devices: None,
            });
            require::ucx(Node::start(c))
        };
        let (Some(a), Some(b)) = (node(1), node(2)) else {
            return;
        };
        a.add_peer(2, b.tcp_addr().unwrap());
        b.add_peer(1, a.tcp_addr().unwrap());
        for (ep, completion) in [(7, Completion::Poll), (8, Completion::Wait)] {
            // A write that finds no room fails rather than hangs the test.
            let cfg = EndpointConfig {
                completion,
                send_timeout: Some(std::time::Duration::from_secs(10)),
                ..EndpointConfig::default()
            };
            let (mut x, y) = (a.open(ep, cfg).unwrap(), b.open(ep, cfg).unwrap());
            let to_y = x
                .target_via(y.addr(), Mode::Reliable, Transport::Ucx)
                .unwrap();
            let mut buf = vec![0u8; 1 << 16];
            // The first round with the reader on a thread of its own: over
            // UCX's tcp a connection is made while both sides move.
            let first = std::thread::spawn(move || {
                let mut y = y;
                let mut buf = [0u8; 64];
                let r = y.read(&mut buf).unwrap();
                let t = y.reply_target(&r, Mode::Reliable).unwrap();
                y.write(t, &buf[..r.len]).unwrap();
                (y, t)
            });
            x.write(to_y, b"hello").unwrap();
            assert_eq!(x.read(&mut buf).unwrap().len, 5);
            let (mut y, back) = first.join().unwrap();
            let mut round = |x: &mut Endpoint, y: &mut Endpoint, msg: &[u8]| {
                x.write(to_y, msg).unwrap();
                let r = y.read(&mut buf).unwrap();
                assert_eq!(r.len, msg.len());
                y.write(back, msg).unwrap();
                let r = x.read(&mut buf).unwrap();
                assert_eq!((r.from, r.len), (y.addr(), msg.len()));
            };
            for size in [8, 1000] {
                let msg = vec![0x5a; size];
                for _ in 0..300 {
                    round(&mut x, &mut y, &msg);
                }
                let before = allocs();
                for _ in 0..2000 {
                    round(&mut x, &mut y, &msg);
                }
                let n = allocs() - before;
                assert_eq!(
                    n, 0,
                    "ucx ({tls}) {completion:?}, {size} B: {n} allocations in 2000 round trips"
                );
            }
        }
    }
}

/// As above with the two endpoints on two threads, so that a waiting read
/// sleeps (and over shared memory offers its buffer to large messages):
/// each thread counts its own.
#[test]
fn a_message_between_two_threads_allocates_nothing() {
    let (a, b, _dir) = nodes();
    let mut ep = 40;
    for completion in [Completion::Wait, Completion::Poll] {
        for transport in [Transport::Shm, Transport::Tcp] {
            ep += 1;
            let (mut x, mut y) = pair(&a, &b, ep, completion);
            let to_y = x.target_via(y.addr(), Mode::Reliable, transport).unwrap();
            for size in [8usize, 100_000, 1_000_000] {
                let (warm, rounds) = if size > 100_000 {
                    (100, 200)
                } else {
                    (300, 2000)
                };
                // A message whose writer stalls (20 ms, which a loaded host
                // may impose) partway through being read straight into the
                // reader's buffer is moved into one of its own: one
                // allocation each, counted apart, and not the message path.
                let echo = std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 20];
                    let (mut before, mut held) = (0, 0);
                    for i in 0..warm + rounds {
                        if i == warm {
                            (before, held) = (allocs(), y.stats().messages_held);
                        }
                        let r = y.read(&mut buf).unwrap();
                        let back = y.reply_target(&r, Mode::Reliable).unwrap();
                        y.write(back, &buf[..r.len]).unwrap();
                    }
                    let held = y.stats().messages_held - held;
                    (y, allocs() - before - held)
                });
                let msg = vec![0x5a; size];
                let mut buf = vec![0u8; 1 << 20];
                let (mut before, mut held) = (0, 0);
                for i in 0..warm + rounds {
                    if i == warm {
                        (before, held) = (allocs(), x.stats().messages_held);
                    }
                    x.write(to_y, &msg).unwrap();
                    assert_eq!(x.read(&mut buf).unwrap().len, size);
                }
                let mine = allocs() - before - (x.stats().messages_held - held);
                let (back, theirs) = echo.join().unwrap();
                y = back;
                if (transport, completion, size) == (Transport::Shm, Completion::Wait, 1_000_000) {
                    // The sleeping reader's path: messages placed in its buffer.
                    assert!(y.stats().messages_placed > 0, "{:?}", y.stats());
                }
                assert_eq!(
                    (mine, theirs),
                    (0, 0),
                    "{transport} {completion:?}, {size} B: allocations in {rounds} round trips"
                );
            }
        }
    }
}

/// An endpoint that found a message on every read so far sleeps for the
/// first time only when one finds nothing, which may be long after its
/// first message: that first sleep allocates nothing either.
#[test]
fn a_first_sleep_allocates_nothing() {
    let (a, b, _dir) = nodes();
    let mut ep = 60;
    for transport in [Transport::Shm, Transport::Tcp, Transport::Udp] {
        ep += 1;
        let (mut x, mut y) = pair(&a, &b, ep, Completion::Wait);
        let mode = if transport == Transport::Udp {
            Mode::Datagram
        } else {
            Mode::Reliable
        };
        let to_y = x.target_via(y.addr(), mode, transport).unwrap();
        let mut buf = vec![0u8; 1 << 16];
        for _ in 0..300 {
            x.write(to_y, b"warm").unwrap();
            assert_eq!(y.read(&mut buf).unwrap().len, 4);
        }
        let before = allocs();
        let got = y.read_timeout(&mut buf, std::time::Duration::from_millis(2));
        let n = allocs() - before;
        assert!(got.unwrap().is_none(), "{transport}: nothing was sent");
        assert_eq!(n, 0, "{transport}: allocations in the first sleep");
    }
}
