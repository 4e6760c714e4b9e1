//! Arbitrary bytes into the frame decoder, then into every body decoder the receiver would try.
//!
//! Input: a 40-byte header followed by the body. Any panic is a bug: these decoders see untrusted network bytes.
//! Checked properties:
//! - `Header::decode` never panics, and a header it accepts respects the limits and survives `encode`/`decode`;
//! - `Request::decode`, `Response::decode` and `msg::decode::<WireError>` never panic on the remaining bytes;
//! - whatever decodes re-encodes to a body that decodes to an equal value (one frame, one reading);
//! - a `Read`/`ReadChunks` body decodes only with its trailing fill hint (issue 16), and a hint survives the
//!   round trip.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_proto::{FrameLimits, HEADER_LEN, Header, Request, Response, WireError, msg};

fuzz_target!(|data: &[u8]| {
    let limits = FrameLimits::default();
    let Ok(header) = Header::decode(data, &limits) else {
        return;
    };
    assert!(header.body_len <= limits.body_bytes_max, "{header:?} passed the body limit");
    assert!(header.data_len <= limits.data_bytes_max, "{header:?} passed the data limit");
    let again = Header::decode(&header.encode(), &limits).expect("a re-encoded header decodes");
    assert_eq!(again, header, "header round trip");

    let body = &data[HEADER_LEN..];
    // The checksum check must not panic either; whether it passes does not matter here.
    let _ = header.check_body(body);

    if let Ok(req) = Request::decode(header.op, body) {
        assert_eq!(req.op() as u16, header.op, "request decoded as another op");
        let enc = req.encode_body();
        let back = Request::decode(header.op, &enc)
            .unwrap_or_else(|e| panic!("re-encoded {req:?} ({enc:?}) does not decode: {e}"));
        assert_eq!(back, req, "request round trip");
        let _ = req.op().is_idempotent();
        let _ = req.op().request_has_data();
        // The fill hint is the body's last field: without its option byte the body is short, never misread.
        if matches!(req, Request::Read(_) | Request::ReadChunks(_)) {
            assert!(Request::decode(header.op, &enc[..enc.len() - 1]).is_err(), "{req:?} decoded without its hint");
        }
    }

    if let Ok(resp) = Response::decode(header.op, body) {
        assert_eq!(resp.op() as u16, header.op, "response decoded as another op");
        let enc = resp.encode_body();
        let back = Response::decode(header.op, &enc)
            .unwrap_or_else(|e| panic!("re-encoded {resp:?} ({enc:?}) does not decode: {e}"));
        assert_eq!(back, resp, "response round trip");
    }

    if let Ok(err) = msg::decode::<WireError>(header.op, body) {
        let _ = err.to_string();
        let _ = err.code.errno();
        let enc = msg::encode_value(&err);
        let back: WireError = msg::decode(header.op, &enc)
            .unwrap_or_else(|e| panic!("re-encoded {err:?} ({enc:?}) does not decode: {e}"));
        assert_eq!(back, err, "wire error round trip");
    }
});
