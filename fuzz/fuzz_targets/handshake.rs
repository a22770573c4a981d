//! Any bytes into the fabric handshake's records: an error or a record that
//! encodes back to the same bytes; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use macrolink_wire::{Challenge, Proof, CHALLENGE_LEN, PROOF_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = Challenge::decode(data) {
        assert_eq!(&c.encode()[..], &data[..CHALLENGE_LEN]);
    }
    if let Ok(p) = Proof::decode(data) {
        assert_eq!(&p.encode()[..], &data[..PROOF_LEN]);
    }
});
