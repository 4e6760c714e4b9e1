//! Arbitrary bytes into the request user block decoder (`FLAG_USER`, docs/format.md §1) and the clients keyring
//! parser (§9).
//!
//! Checked properties:
//! - `UserCred::decode_prefix` never panics; a block it accepts has at most `USER_GROUPS_MAX` groups and
//!   re-encodes to exactly the bytes it consumed (one block, one reading);
//! - `ClientKeys::parse` never panics on any text; a keyring it accepts prints to text that parses to an equal
//!   keyring.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_proto::{USER_GROUPS_MAX, UserCred};
use weft_rpc::ClientKeys;

fuzz_target!(|data: &[u8]| {
    if let Ok((user, rest)) = UserCred::decode_prefix(data) {
        assert!(user.groups.len() <= USER_GROUPS_MAX, "{user:?} passed the group limit");
        let mut enc = Vec::new();
        user.encode_into(&mut enc).expect("a decoded block encodes");
        assert_eq!(enc.len(), data.len() - rest.len(), "the block consumed its encoded length");
        assert_eq!(&enc[..], &data[..enc.len()], "user block round trip");
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let path = std::path::Path::new("fuzz.keyring");
        if let Ok(keys) = ClientKeys::parse(text, path) {
            let again = ClientKeys::parse(&keys.to_text(), path).expect("a printed keyring parses");
            assert_eq!(again, keys, "keyring round trip");
        }
    }
});
