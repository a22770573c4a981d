//! Any bytes into the long-haul packet decoder, and any run of datagrams
//! into a relay's link state machine: an error or a packet that encodes
//! back to the same bytes; the link never panics, whatever it is fed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use macrolink_relay::haul::{Config, Link};
use macrolink_wire::haul::Packet;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::decode(data) {
        let mut out = vec![0u8; data.len()];
        assert_eq!(p.encode(&mut out), Some(data.len()));
        assert_eq!(out, data);
    }
    // Datagrams as (u16 length, bytes)…, each a millisecond apart; the
    // link's own flows write and read between them.
    let mut link = Link::new(Config::default(), 1, 0);
    let flow = link.open(5).expect("a flow");
    let mut rest = data;
    let mut now = 0u64;
    let mut out = vec![0u8; 2048];
    while rest.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let (d, tail) = rest[2..].split_at(n);
        rest = tail;
        now += 1_000_000;
        let _ = link.handle(now, d);
        link.write(flow, &[7; 3000]);
        let (a, b) = link.readable(flow);
        let len = a.len() + b.len();
        link.consume(flow, len);
        link.on_timeout(now);
        for _ in 0..64 {
            if link.poll_transmit(now, &mut out).is_none() {
                break;
            }
        }
        while link.poll_event().is_some() {}
        link.send_datagram(9, &d[..d.len().min(200)]);
        while link.poll_datagram().is_some() {}
    }
});
