//! Arbitrary bytes into the rdma backend's decoders: the connection info a peer sends over the TCP side channel,
//! the header of a two-sided message, a region descriptor (what a chunk list carries), and the client's arena
//! hello.
//!
//! Any panic is a bug: a peer controls all three. Checked properties: accepted values respect their limits and
//! survive encode/decode unchanged.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_fabric::rdma::RemoteRegion;
use weft_fabric::rdma::wire::{self, ARENA_BYTES_MAX, ArenaHello, CONN_INFO_BYTES, ConnInfo, HELLO_BYTES, MSG_HEADER_BYTES, RECV_CREDITS_MAX};

fuzz_target!(|data: &[u8]| {
    if let Ok(info) = ConnInfo::decode(data.get(..CONN_INFO_BYTES.min(data.len())).unwrap_or_default()) {
        assert!(info.qpn <= 0x00ff_ffff && info.psn <= 0x00ff_ffff, "{info:?}");
        assert!((1..=RECV_CREDITS_MAX).contains(&info.recv_credits), "{info:?}");
        assert_eq!(ConnInfo::decode(&info.encode()).expect("re-encoded info decodes"), info);
    }

    // The first byte picks the completion's byte count, the rest is the receive buffer.
    if let Some((&len, buf)) = data.split_first() {
        if let Ok(h) = wire::decode_header(buf, usize::from(len), 16) {
            assert_eq!(h.payload_len + MSG_HEADER_BYTES, usize::from(len));
            assert!(h.credits <= 16);
        }
    }

    if let Ok(region) = RemoteRegion::decode(data) {
        assert!(region.addr.checked_add(region.len).is_some());
        assert_eq!(RemoteRegion::decode(&region.encode()).expect("re-encoded region decodes"), region);
        let _ = region.contains(&region);
        let _ = region.slice(region.len / 2, region.len);
    }

    if let Ok(h) = ArenaHello::decode(data.get(..HELLO_BYTES.min(data.len())).unwrap_or_default()) {
        assert!(h.len > 0 && h.len <= ARENA_BYTES_MAX && h.addr.checked_add(h.len).is_some(), "{h:?}");
        assert_eq!(ArenaHello::decode(&h.encode()).expect("re-encoded hello decodes"), h);
    }
});
