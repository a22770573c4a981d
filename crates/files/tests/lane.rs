//! A file's bytes through a gateway in one process: `lane::send` from a
//! compute node, a relay, and `lane::receive` into a file on the storage
//! node.

use macrolink_fabric::{Addr, Node, NodeConfig};
use macrolink_files::data::{DataError, Shared, Sink};
use macrolink_files::lane::{self, Carried, Far};
use macrolink_files::proto::Shape;
use macrolink_gwnet::client::SendConfig;
use macrolink_gwnet::relay;
use macrolink_testbed::data::pattern;
use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const STORAGE: u32 = 10;
const GATEWAY: u32 = 21;
const KEY: u64 = 0x5eed;

/// A node with tcp on loopback and no shared memory.
fn node(id: u32, peers: &[(u32, SocketAddr)]) -> Node {
    let mut cfg = NodeConfig::local(id, "/nonexistent");
    cfg.shm_dir = None;
    cfg.tcp = Some("127.0.0.1:0".parse().unwrap());
    cfg.peers = peers.iter().copied().collect();
    Node::start(cfg).unwrap()
}

/// A file that takes writes below `room` bytes and refuses the rest.
struct Small {
    file: File,
    room: u64,
}

impl Sink for Small {
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if offset + data.len() as u64 > self.room {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "no space left here",
            ));
        }
        self.file.write_all_at(data, offset)
    }
}

/// A file that takes a while over the write at `slow`.
struct Stalling {
    file: File,
    slow: u64,
    pause: Duration,
}

impl Sink for Stalling {
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if offset == self.slow {
            std::thread::sleep(self.pause);
        }
        self.file.write_all_at(data, offset)
    }
}

/// What the receiver returned: each chunk's digest by index, and what it
/// says held it back.
type Received = Result<(Vec<(u64, [u8; 16])>, Carried), DataError>;

/// Sends `data` from a compute node through one relay to a storage
/// node that receives it into `sink`; the receiver's result, and what the
/// sender says held it back once it saw every chunk acknowledged.
fn through_a_gateway(data: &[u8], sink: &dyn Sink) -> (Received, Option<Carried>) {
    let storage = node(STORAGE, &[]);
    let rail = (STORAGE, storage.tcp_addr().unwrap());
    let gw = node(GATEWAY, &[rail]);
    let gw_addr = gw.tcp_addr().unwrap();
    let gw_ep = gw.open(1, lane::endpoint_config()).unwrap();
    std::thread::spawn(move || {
        let _node = gw;
        relay::run(gw_ep, &[rail], &relay::Meter::default())
    });
    let compute = node(1, &[(GATEWAY, gw_addr)]);
    let mut tx = compute.open(1, lane::endpoint_config()).unwrap();
    let mut rx = storage.open(1, lane::endpoint_config()).unwrap();
    let gateways = [Addr::new(GATEWAY, 1)];
    let shape = Shape {
        offset: 0,
        len: data.len() as u64,
        chunk: 256 << 10,
        slots: 4,
    };
    let src_dir = tempfile::tempdir().unwrap();
    std::fs::write(src_dir.path().join("src"), data).unwrap();
    let source = File::open(src_dir.path().join("src")).unwrap();
    let shared_tx = Shared::default();
    let shared_rx = Shared::default();
    let done = AtomicBool::new(false);
    let (tx_addr, rx_addr) = (tx.addr(), rx.addr());
    std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let far = Far {
                gateways: &gateways,
                peer: rx_addr,
                key: KEY,
            };
            let r = lane::send(
                &mut tx,
                far,
                &shape,
                &source,
                &shared_tx,
                SendConfig::default(),
            );
            done.store(true, Ordering::Relaxed);
            r.ok().map(|(_, carried)| carried)
        });
        let far = Far {
            gateways: &gateways,
            peer: tx_addr,
            key: KEY,
        };
        let got = lane::receive(&mut rx, far, &shape, sink, &shared_rx, &done, false);
        // A receiver that failed stops the sender, as the session does.
        shared_tx.abort.store(true, Ordering::Relaxed);
        (got, sender.join().unwrap())
    })
}

#[test]
fn a_file_through_a_gateway_arrives_whole_with_each_chunks_digest() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern((5 << 20) + 12345, 3);
    let file = File::create(dir.path().join("f")).unwrap();
    let (got, acked) = through_a_gateway(&data, &file);
    let (mut list, _) = got.unwrap();
    assert!(acked.is_some(), "the sender saw every chunk acknowledged");
    drop(file);
    assert!(std::fs::read(dir.path().join("f")).unwrap() == data);
    // Every chunk's digest, once, each that of its bytes.
    list.sort();
    assert_eq!(list.len(), data.len().div_ceil(256 << 10));
    for (i, (seq, d)) in list.iter().enumerate() {
        assert_eq!(*seq, i as u64);
        let at = i * (256 << 10);
        let end = (at + (256 << 10)).min(data.len());
        assert_eq!(*d, macrolink_files::sums::chunk(&data[at..end]));
    }
}

#[test]
fn a_write_that_fails_fails_the_transfer_with_the_files_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(8 << 20, 4);
    let sink = Small {
        file: File::create(dir.path().join("f")).unwrap(),
        room: 3 << 20,
    };
    let start = std::time::Instant::now();
    let (got, _) = through_a_gateway(&data, &sink);
    match got {
        Err(DataError::File(e)) => {
            assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
        }
        other => panic!("expected the file's error, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "the receiver stopped at the failure, not at the sender's patience"
    );
}

#[test]
fn both_sides_say_what_held_a_transfer_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(4 << 20, 5);
    let pause = Duration::from_millis(300);
    let sink = Stalling {
        file: File::create(dir.path().join("f")).unwrap(),
        slow: 2 << 20,
        pause,
    };
    let (got, sent) = through_a_gateway(&data, &sink);
    let (_, received) = got.unwrap();
    let sent = sent.expect("the sender saw every chunk acknowledged");
    assert!(std::fs::read(dir.path().join("f")).unwrap() == data);
    // The write that paused held both ends: no chunk placed, none
    // acknowledged, for at least as long.
    assert!(!received.sender && sent.sender);
    assert!(received.longest_stall >= pause, "{received:?}");
    // The sender's stall is between two acknowledgements, each a trip
    // after its chunk's placing: the pause, give or take their jitter.
    assert!(sent.longest_stall >= pause * 9 / 10, "{sent:?}");
    assert_eq!(received.per_gateway, [(GATEWAY, 16)]);
    assert_eq!(sent.per_gateway, [(GATEWAY, 16 + sent.resent)]);
    // Each in its own words.
    let (r, s) = (received.to_string(), sent.to_string());
    assert!(
        r.starts_with(&format!(
            "chunks that came twice: {}, longest stall: ",
            received.duplicates
        )),
        "{r}"
    );
    assert!(
        s.starts_with(&format!(
            "chunks sent again: {}, failovers: {}, longest stall: ",
            sent.resent, sent.failovers
        )),
        "{s}"
    );
}
