//! Any bytes into the benchmark target's control records: an error or a
//! record within the limits; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use macrolink_bench::proto::{Done, Start, MAX_SIZE};

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Start::decode(data) {
        assert!(s.size <= MAX_SIZE);
        assert_eq!(Start::decode(&s.encode()), Ok(s));
    }
    if let Ok(d) = Done::decode(data) {
        assert_eq!(Done::decode(&d.encode()), Ok(d));
    }
});
