//! The cache bank's value decoder (`weft_cache::value`, docs/format.md §12) on arbitrary items.
//!
//! `decode_value` must never panic; what it accepts must be exactly what `encode_value` writes for the key and
//! kind asked for (re-encoding the payload gives the item back byte for byte), so no other byte string can pass
//! as a cached payload. The payload decoders of attributes and lookup items (`AttrItem`, `LookupItem`) run on the
//! same bytes: never a panic, and what they accept survives a re-encode unchanged (postcard may accept an overlong
//! varint, so the bytes themselves need not be canonical).

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use weft_cache::value::{AttrItem, ItemKind, LookupItem, decode_value, encode_value, key_hash};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, item)) = data.split_first() else { return };
    let (kind, letter) = match selector % 3 {
        0 => (ItemKind::Block, 'b'),
        1 => (ItemKind::Attrs, 'a'),
        _ => (ItemKind::Lookup, 'l'),
    };
    let key = format!("wf1/0/{letter}/{:x}", selector >> 2);
    // The payload decoders on the raw bytes (after the selector), whatever the header says.
    if let Ok(attr) = AttrItem::decode(item, u64::from(selector)) {
        assert_eq!(AttrItem::decode(&AttrItem(attr.clone()).encode(), attr.ino), Ok(attr));
    }
    if let Ok((ino, attr)) = LookupItem::decode(item, "name") {
        let again = LookupItem { name: "name".into(), ino, attr: attr.clone() }.encode();
        assert_eq!(LookupItem::decode(&again, "name"), Ok((ino, attr)));
    }
    let item = Bytes::copy_from_slice(item);
    // Feed both the real key's hash and the hash the item claims, so the checks past the key hash are reached.
    let claimed = item.get(8..16).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    for expected in [Some(key_hash(key.as_bytes())), claimed].into_iter().flatten() {
        if let Ok(payload) = decode_value(&item, kind, expected) {
            if expected == key_hash(key.as_bytes()) {
                assert_eq!(encode_value(key.as_bytes(), kind, &payload).unwrap(), item.to_vec());
            } else {
                assert_eq!(payload.len() + 24, item.len());
            }
        }
    }
});
