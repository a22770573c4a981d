//! Helpers shared by the fabric's test suites (each uses some of them).
#![allow(dead_code)]

use macrolink_fabric::{Addr, Node};
use macrolink_wire::{FrameKind, Header, HEADER_LEN};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A raw TCP connection from `src` to endpoint 5 of `node` that passed the
/// handshake: a peer that does exactly what a test tells it.
pub fn raw_conn(node: &Node, src: Addr) -> TcpStream {
    let mut s = TcpStream::connect(node.tcp_addr().unwrap()).unwrap();
    let mut h = Header::new(FrameKind::Hello);
    h.src_node = src.node;
    h.src_ep = src.ep;
    h.dst_ep = 5;
    s.write_all(&h.encode()).unwrap();
    let mut b = [0u8; HEADER_LEN];
    s.read_exact(&mut b).unwrap();
    assert_eq!(Header::decode(&b).unwrap().kind, FrameKind::HelloOk);
    s
}

/// Aborts the test process after `secs`: a test whose subject would block
/// for good fails instead of hanging the suite.
pub fn watchdog(secs: u64, what: &'static str) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(secs));
        eprintln!("{what}: still blocked after {secs} s");
        std::process::abort();
    });
}
