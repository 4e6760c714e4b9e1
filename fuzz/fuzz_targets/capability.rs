//! Arbitrary bytes into the capability decoder and checker (docs/format.md §10): what a data server does with the
//! `cap` field of every data request, from any key holder.
//!
//! Checked properties:
//! - neither the decoder nor the checker panics, whatever the fields (huge key ids, unknown rights bits, versions);
//! - whatever decodes re-encodes to a body that decodes to an equal value;
//! - a capability the checker accepts is exactly the one the MDS would seal from its fields (so no input other
//!   than a correctly sealed one passes), and the same bytes with one MAC bit flipped are refused.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_proto::msg;
use weft_proto::{Capability, Rights};
use weft_rpc::{CapabilityKey, Demand, Key};

fuzz_target!(|data: &[u8]| {
    let Some((&seal_first, body)) = data.split_first() else {
        return;
    };
    let Ok(mut cap) = msg::decode::<Capability>(0, body) else {
        return;
    };
    let enc = msg::encode_value(&cap);
    assert_eq!(msg::decode::<Capability>(0, &enc).expect("a re-encoded capability decodes"), cap);
    let key = CapabilityKey::derive(&Key::from_bytes([0x42; 32]));
    // Half the inputs are sealed first, so the checks past the MAC are reached too.
    if seal_first & 1 == 1
        && let Ok(sealed) = key.seal(cap.ino, cap.rights, cap.expiry_ms, &cap.key_id, cap.session, cap.data_version)
    {
        cap = sealed;
    }
    let demand = Demand {
        ino: cap.ino,
        rights: Rights::from_bits(seal_first >> 6).unwrap_or(Rights::READ),
        key_id: &cap.key_id,
        now_ms: u64::from(seal_first >> 1),
        skew_ms: 0,
    };
    if key.check(&cap, &demand).is_ok() {
        let resealed = key.seal(cap.ino, cap.rights, cap.expiry_ms, &cap.key_id, cap.session, cap.data_version).expect("it sealed");
        assert_eq!(resealed, cap, "an accepted capability is the sealed one");
        let mut flipped = cap.clone();
        flipped.mac[usize::from(seal_first) % flipped.mac.len()] ^= 0x80;
        assert!(key.check(&flipped, &demand).is_err(), "a flipped MAC bit passed");
    }
});
