//! Arbitrary bytes into the request user block decoder (`FLAG_USER`, docs/format.md §1), the once block decoder
//! (`FLAG_ONCE`, §1) and the clients keyring parser (§9).
//!
//! Checked properties:
//! - `UserCred::decode_prefix` never panics; a block it accepts has at most `USER_GROUPS_MAX` groups and
//!   re-encodes to exactly the bytes it consumed (one block, one reading);
//! - `OnceTag::decode_prefix` never panics; a block it accepts names no client or call 0 and re-encodes to the 16
//!   bytes it consumed;
//! - `ClientKeys::parse` never panics on any text; a keyring it accepts prints to text that parses to an equal
//!   keyring.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_proto::{ONCE_BYTES, OnceTag, USER_GROUPS_MAX, UserCred};
use weft_rpc::ClientKeys;

fuzz_target!(|data: &[u8]| {
    if let Ok((user, rest)) = UserCred::decode_prefix(data) {
        assert!(user.groups.len() <= USER_GROUPS_MAX, "{user:?} passed the group limit");
        let mut enc = Vec::new();
        user.encode_into(&mut enc).expect("a decoded block encodes");
        assert_eq!(enc.len(), data.len() - rest.len(), "the block consumed its encoded length");
        assert_eq!(&enc[..], &data[..enc.len()], "user block round trip");
    }
    if let Ok((tag, rest)) = OnceTag::decode_prefix(data) {
        assert!(tag.client != 0 && tag.call != 0, "{tag:?} passed the zero check");
        let mut enc = Vec::new();
        tag.encode_into(&mut enc);
        assert_eq!((enc.len(), rest.len()), (ONCE_BYTES, data.len() - ONCE_BYTES));
        assert_eq!(&enc[..], &data[..ONCE_BYTES], "once block round trip");
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let path = std::path::Path::new("fuzz.keyring");
        if let Ok(keys) = ClientKeys::parse(text, path) {
            let again = ClientKeys::parse(&keys.to_text(), path).expect("a printed keyring parses");
            assert_eq!(again, keys, "keyring round trip");
        }
    }
});
