//! Arbitrary bytes into the decoders of the authentication bodies (ops 4–6, docs/format.md §9): `AuthBegin`'s
//! request and response, `AuthFinish`, `SessionBind`.
//!
//! Any panic is a bug: a server decodes these from peers that have proved nothing yet. Checked properties:
//! - no decoder panics;
//! - whatever decodes re-encodes to a body that decodes to an equal value;
//! - the request decoders reached through `Request::decode` agree with the direct ones.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_proto::msg::{self, AuthBeginReq, AuthBeginResp, AuthFinishReq, Op, SessionBindReq};
use weft_proto::{Request, Response};

fn round_trip<T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(op: Op, body: &[u8]) {
    if let Ok(v) = msg::decode::<T>(op as u16, body) {
        let enc = msg::encode_value(&v);
        assert_eq!(msg::decode::<T>(op as u16, &enc).expect("a re-encoded body decodes"), v, "{op:?} round trip");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => round_trip::<AuthBeginReq>(Op::AuthBegin, body),
        1 => round_trip::<AuthBeginResp>(Op::AuthBegin, body),
        2 => round_trip::<AuthFinishReq>(Op::AuthFinish, body),
        _ => round_trip::<SessionBindReq>(Op::SessionBind, body),
    }
    for op in [Op::AuthBegin, Op::AuthFinish, Op::SessionBind] {
        if let Ok(req) = Request::decode(op as u16, body) {
            assert_eq!(Request::decode(op as u16, &req.encode_body()).as_ref(), Ok(&req), "{op:?} request round trip");
        }
        if let Ok(resp) = Response::decode(op as u16, body) {
            assert_eq!(Response::decode(op as u16, &resp.encode_body()).as_ref(), Ok(&resp), "{op:?} response round trip");
        }
    }
});
