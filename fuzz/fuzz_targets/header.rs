//! Any bytes into the frame header decoder: an error or a header that
//! encodes back to the same bytes; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use macrolink_wire::{Header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::decode(data) {
        assert_eq!(&h.encode()[..], &data[..HEADER_LEN]);
        assert_eq!(h.validate(), Ok(()));
    }
});
