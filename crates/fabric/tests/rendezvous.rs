//! Large reliable messages over shared memory to a read that sleeps: the
//! sender writes them straight into the read's buffer (the rendezvous of
//! `transport::offer`). They arrive whole and in order, a buffer whose read
//! has returned is never written to afterwards, and a buffer too small for
//! the message gets its error with the message kept.

use macrolink_fabric::{
    Addr, Completion, Endpoint, EndpointConfig, Error, IoBuf, Mode, Node, NodeConfig, Pages,
    Target, Transport,
};
use std::thread;
use std::time::Duration;

mod common;
use common::watchdog;

const MIB: usize = 1 << 20;

fn waiting() -> EndpointConfig {
    EndpointConfig {
        completion: Completion::Wait,
        ..EndpointConfig::default()
    }
}

/// Message `i` of `len` bytes: no two alike, no two messages alike.
fn message(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j.wrapping_mul(31) ^ (j >> 9) ^ i.wrapping_mul(97)) as u8)
        .collect()
}

/// Two nodes of one directory, a waiting reader on node 1 and a writer
/// on node 2 with its target, the reader over shared memory.
fn pair(dir: &std::path::Path) -> (Node, Node, Endpoint, Endpoint, Target) {
    let a = Node::start(NodeConfig::local(1, dir)).unwrap();
    let b = Node::start(NodeConfig::local(2, dir)).unwrap();
    let rx = a.open(5, waiting()).unwrap();
    let mut tx = b.open(6, waiting()).unwrap();
    let t = tx
        .target_via(Addr::new(1, 5), Mode::Reliable, Transport::Shm)
        .unwrap();
    (a, b, rx, tx, t)
}

/// As [`pair`], after one large message, so that the reader knows whom to
/// offer to.
fn introduced(dir: &std::path::Path) -> (Node, Node, Endpoint, Endpoint, Target) {
    let (a, b, mut rx, mut tx, t) = pair(dir);
    tx.write(t, &message(0, MIB)).unwrap();
    let mut buf = vec![0u8; 2 * MIB];
    assert_eq!(rx.read(&mut buf).unwrap().len, MIB);
    (a, b, rx, tx, t)
}

/// Writes `sent` to `t` from a thread of its own, after the reader has
/// had time to fall asleep on its first read (so its offer is up when the
/// first message goes); the thread gives the writer back.
fn write_later(mut tx: Endpoint, t: Target, sent: Vec<Vec<u8>>) -> thread::JoinHandle<Endpoint> {
    thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        for m in &sent {
            tx.write(t, m).unwrap();
        }
        tx
    })
}

#[test]
fn large_messages_to_a_waiting_read_are_placed_whole_and_in_order() {
    let _watch = watchdog(120, "placed messages");
    let dir = tempfile::tempdir().unwrap();
    let (_a, _b, mut rx, tx, t) = pair(dir.path());
    let sizes = [MIB, 3 * MIB + 17, 512 << 10, MIB, 100, 2 * MIB, MIB];
    let sent: Vec<Vec<u8>> = (0..4 * sizes.len())
        .map(|i| message(i, sizes[i % sizes.len()]))
        .collect();
    // Made before the writer starts its clock: 112 MB take a while in a
    // debug build on a busy host.
    let mut got = vec![vec![0u8; 4 * MIB]; sent.len()];
    let writer = write_later(tx, t, sent.clone());
    for (i, buf) in got.iter_mut().enumerate() {
        let r = rx.read_timeout(buf, Duration::from_secs(30)).unwrap();
        assert_eq!(r.expect("a message within 30 s").len, sent[i].len());
    }
    let _tx = writer.join().unwrap();
    for (i, (g, m)) in got.iter().zip(&sent).enumerate() {
        assert!(g[..m.len()] == m[..], "message {i} arrived whole");
        assert!(g[m.len()..].iter().all(|&b| b == 0), "and nothing past it");
    }
    let st = rx.stats();
    assert_eq!(st.messages_in, sent.len() as u64);
    assert!(st.messages_placed >= 1, "none was placed: {st:?}");
}

/// A read into a buffer on huge pages (which the sender's cross-memory
/// copy takes about twice as fast) gets placed messages whole, across the
/// huge pages' boundaries.
#[test]
fn messages_placed_into_a_buffer_on_huge_pages_arrive_whole() {
    let _watch = watchdog(120, "placed on huge pages");
    let dir = tempfile::tempdir().unwrap();
    let (_a, _b, mut rx, tx, t) = pair(dir.path());
    let sizes = [3 * MIB + 17, MIB, 2 * MIB + 4095];
    let sent: Vec<Vec<u8>> = (0..9).map(|i| message(i, sizes[i % 3])).collect();
    let mut buf = IoBuf::on(4 * MIB, Pages::Huge).unwrap();
    let writer = write_later(tx, t, sent.clone());
    for (i, m) in sent.iter().enumerate() {
        buf.fill(0);
        let r = rx.read_timeout(&mut buf, Duration::from_secs(30)).unwrap();
        assert_eq!(r.expect("a message within 30 s").len, m.len());
        assert!(buf[..m.len()] == m[..], "message {i} arrived whole");
        assert!(
            buf[m.len()..].iter().all(|&b| b == 0),
            "and nothing past it"
        );
    }
    let _tx = writer.join().unwrap();
    assert!(rx.stats().messages_placed >= 1, "none was placed");
}

#[test]
fn a_buffer_whose_read_returned_is_not_written_later() {
    let _watch = watchdog(120, "withdrawn offers");
    let dir = tempfile::tempdir().unwrap();
    let (_a, _b, mut rx, mut tx, t) = introduced(dir.path());
    let mut buf = vec![0u8; 2 * MIB];
    // Reads that time out offer their buffers while they sleep.
    let mut old = vec![0u8; 2 * MIB];
    for _ in 0..5 {
        assert!(rx
            .read_timeout(&mut old, Duration::from_millis(20))
            .unwrap()
            .is_none());
    }
    // What comes after goes to the buffer of the read that is waiting.
    let writer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        for i in 1..6 {
            tx.write(t, &message(i, MIB)).unwrap();
        }
        tx
    });
    for i in 1..6 {
        let r = rx.read_timeout(&mut buf, Duration::from_secs(30)).unwrap();
        assert_eq!(r.expect("a message").len, MIB);
        assert!(buf[..MIB] == message(i, MIB)[..], "message {i}");
    }
    let _tx = writer.join().unwrap();
    assert!(
        old.iter().all(|&b| b == 0),
        "a withdrawn buffer was written"
    );
    assert!(rx.stats().messages_placed >= 1, "none was placed");
}

#[test]
fn a_read_too_small_for_a_placed_size_gets_its_error_and_the_message_stays() {
    let _watch = watchdog(120, "a small buffer");
    let dir = tempfile::tempdir().unwrap();
    let (_a, _b, mut rx, mut tx, t) = introduced(dir.path());
    let mut big = vec![0u8; 4 * MIB];
    let writer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        tx.write(t, &message(1, 2 * MIB)).unwrap();
        tx
    });
    // The offer of this buffer is too small for the message that comes.
    let mut small = vec![0u8; MIB];
    let err = rx
        .read_timeout(&mut small, Duration::from_secs(30))
        .expect_err("a read too small for the message");
    assert!(
        matches!(err, Error::BufferTooSmall { needed, .. } if needed == 2 * MIB),
        "{err}"
    );
    let r = rx.read_timeout(&mut big, Duration::from_secs(30)).unwrap();
    assert_eq!(r.expect("the message kept").len, 2 * MIB);
    assert!(big[..2 * MIB] == message(1, 2 * MIB)[..]);
    let _tx = writer.join().unwrap();
}

#[test]
fn a_reader_kept_away_once_gets_its_messages_placed_again() {
    let _watch = watchdog(120, "placing again");
    let dir = tempfile::tempdir().unwrap();
    let (_a, _b, mut rx, mut tx, t) = introduced(dir.path());
    const COUNT: usize = 300;
    let kinds: Vec<Vec<u8>> = (0..3).map(|i| message(i, MIB)).collect();
    let writer = {
        let kinds = kinds.clone();
        thread::spawn(move || {
            for i in 0..COUNT {
                tx.write(t, &kinds[i % kinds.len()]).unwrap();
            }
            tx
        })
    };
    let mut buf = vec![0u8; 2 * MIB];
    let check = |rx: &mut Endpoint, i: usize, buf: &mut [u8]| {
        let r = rx.read_timeout(buf, Duration::from_secs(30)).unwrap();
        assert_eq!(r.expect("a message within 30 s").len, MIB);
        assert!(buf[..MIB] == kinds[i % kinds.len()][..], "message {i}");
    };
    check(&mut rx, 0, &mut buf);
    // The reader is away while the writer waits for its next offer: the
    // wait is in vain and the ring fills (4 MiB).
    thread::sleep(Duration::from_millis(100));
    let before = rx.stats().messages_placed;
    for i in 1..COUNT {
        check(&mut rx, i, &mut buf);
    }
    let _tx = writer.join().unwrap();
    let placed = rx.stats().messages_placed - before;
    // Read at full speed, the reader would find the ring refilled on every
    // read, never sleep and never offer again: the writer must try.
    assert!(
        placed >= COUNT as u64 / 2,
        "{placed} of the {} messages after the pause placed",
        COUNT - 1
    );
}
