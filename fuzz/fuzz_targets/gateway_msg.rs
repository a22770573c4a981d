//! Any bytes into the gateway message decoder: an error or a message that
//! encodes back to the same bytes; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use macrolink_gateway::msg::Msg;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Msg::decode(data) {
        let mut out = Vec::new();
        m.encode(&mut out);
        assert_eq!(Msg::decode(&out), Ok(m));
    }
});
