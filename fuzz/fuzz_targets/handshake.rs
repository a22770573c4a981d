//! Any bytes into the fabric handshake's records, and into the UCX card
//! and tag that follow it: an error or a record that encodes back to the
//! same bytes; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use macrolink_wire::ucx::{Card, Tag};
use macrolink_wire::{Challenge, Proof, CHALLENGE_LEN, PROOF_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = Challenge::decode(data) {
        assert_eq!(&c.encode()[..], &data[..CHALLENGE_LEN]);
    }
    if let Ok(p) = Proof::decode(data) {
        assert_eq!(&p.encode()[..], &data[..PROOF_LEN]);
    }
    if let Ok(c) = Card::decode(data) {
        assert_eq!(c.encode(), data);
    }
    if let Some(b) = data.get(..8) {
        let t = u64::from_le_bytes(b.try_into().unwrap());
        if let Some(tag) = Tag::decode(t) {
            assert_eq!(tag.encode(), t);
        }
    }
});
