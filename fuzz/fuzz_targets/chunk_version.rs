//! The §17 chunk-version sidecar decoders on arbitrary bytes: `decode_header` and `decode_record` never panic, a
//! record they accept re-encodes to the same bytes, and a header they accept names a unit that is a multiple of 4096.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_proto::chunk_version::{RECORD_BYTES, decode_header, decode_record, encode_header, encode_record};

fuzz_target!(|data: &[u8]| {
    let _ = decode_header(data);
    let _ = decode_record(data);
    let mut b = [0u8; RECORD_BYTES];
    let n = data.len().min(RECORD_BYTES);
    b[..n].copy_from_slice(&data[..n]);
    if let Ok(Some(r)) = decode_record(&b) {
        assert_eq!(encode_record(&r), b, "a decoded record re-encodes to its bytes");
    }
    if let Ok(unit) = decode_header(&b) {
        assert_eq!(unit % 4096, 0);
        assert_eq!(encode_header(unit), b);
    }
});
