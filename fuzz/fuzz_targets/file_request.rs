//! Any bytes into the file service's request and reply decoders, and any
//! decoded path into the export's path check: an error or a value that
//! encodes back to an equal one; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use macrolink_files::{confine, proto};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = proto::decode::<proto::Request>(data) {
        let bytes = proto::encode(&r);
        assert_eq!(proto::decode::<proto::Request>(&bytes[4..]), Ok(r.clone()));
        if let proto::Request::Stat { path } | proto::Request::List { path } = &r {
            if let Ok(p) = confine::relative(path) {
                assert!(p.is_relative());
                assert!(!p.components().any(|c| c == std::path::Component::ParentDir));
            }
        }
    }
    let _ = proto::decode::<proto::Reply>(data);
    if data.len() >= 4 {
        let _ = proto::frame_len(data[..4].try_into().unwrap(), proto::MAX_REQUEST);
    }
});
