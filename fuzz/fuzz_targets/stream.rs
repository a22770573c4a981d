//! Any bytes a peer can send a node: as its handshake (first byte even), or
//! on a connection that passed the handshake (odd) into an endpoint that
//! reads them. The node answers, refuses or drops the connection; it never
//! panics and keeps serving.
#![no_main]

use libfuzzer_sys::fuzz_target;
use macrolink_fabric::{Endpoint, EndpointConfig, Key, Node, NodeConfig};
use macrolink_wire::{FrameKind, Header};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

struct Target {
    node: Node,
    ep: Endpoint,
    buf: Vec<u8>,
}

fn target() -> &'static Mutex<Target> {
    static T: OnceLock<Mutex<Target>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("macrolink-fuzz-{}", std::process::id()));
        let mut cfg = NodeConfig::local(1, dir);
        cfg.shm_dir = None;
        cfg.key = Some(Key::open());
        let node = Node::start(cfg).unwrap();
        let ep = node
            .open(
                5,
                EndpointConfig {
                    max_message: 1 << 20,
                    ..EndpointConfig::default()
                },
            )
            .unwrap();
        Mutex::new(Target {
            node,
            ep,
            buf: vec![0; 1 << 20],
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let mut t = target().lock().unwrap();
    let mut s = TcpStream::connect(t.node.tcp_addr().unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    if mode % 2 == 1 {
        let mut h = Header::new(FrameKind::Hello);
        (h.src_node, h.src_ep, h.dst_ep) = (7, 7, 5);
        macrolink_fabric::handshake(&mut s, &Key::open(), h).unwrap();
    }
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Shutdown::Write);
    if mode % 2 == 0 {
        // Whatever the node answers, then the end of the connection.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
        return;
    }
    let t = &mut *t;
    for _ in 0..64 {
        match t.ep.read_timeout(&mut t.buf, Duration::from_millis(50)) {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
});
