//! The cache bank's value decoder (`weft_cache::value`, docs/format.md §12) on arbitrary items.
//!
//! `open_value` must never panic; what it accepts must be exactly what `encode_value` seals for the key and kind
//! asked for under the item's nonce (re-sealing the payload gives the item back byte for byte), so no other byte
//! string can pass as a cached payload. The fuzzer cannot forge a seal, so it also seals what it was given under
//! the real key and opens that, which walks every check past the seal. The payload decoders of attributes and lookup items (`AttrItem`, `LookupItem`) run on the
//! same bytes: never a panic, and what they accept survives a re-encode unchanged (postcard may accept an overlong
//! varint, so the bytes themselves need not be canonical).

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_cache::BankKey;
use weft_cache::value::{AttrItem, HEADER_BYTES, ItemKind, LookupItem, encode_value_with_nonce, open_value};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, item)) = data.split_first() else { return };
    let (kind, letter) = match selector % 3 {
        0 => (ItemKind::Block, 'b'),
        1 => (ItemKind::Attrs, 'a'),
        _ => (ItemKind::Lookup, 'l'),
    };
    let key = format!("wf2/0/{letter}/{:x}", selector >> 2);
    // The payload decoders on the raw bytes (after the selector), whatever the header says.
    if let Ok(attr) = AttrItem::decode(item, u64::from(selector)) {
        assert_eq!(AttrItem::decode(&AttrItem(attr.clone()).encode(), attr.ino), Ok(attr));
    }
    if let Ok((ino, attr)) = LookupItem::decode(item, "name") {
        let again = LookupItem { name: "name".into(), ino, attr: attr.clone() }.encode();
        assert_eq!(LookupItem::decode(&again, "name"), Ok((ino, attr)));
    }
    let seal = BankKey::from_secret(&[0x5a; 32]);
    if let Ok(payload) = open_value(item.to_vec(), kind, key.as_bytes(), &seal) {
        let nonce = item[8..20].try_into().unwrap();
        assert_eq!(encode_value_with_nonce(key.as_bytes(), kind, &payload, &seal, nonce).unwrap(), item);
    }
    // A real seal over the bytes, then the bytes cut or grown by one: only the whole item opens.
    let nonce = [selector; 12];
    if let Ok(sealed) = encode_value_with_nonce(key.as_bytes(), kind, item, &seal, nonce) {
        assert_eq!(open_value(sealed.clone(), kind, key.as_bytes(), &seal).as_deref(), Ok(item));
        assert!(open_value(sealed[..sealed.len() - 1].to_vec(), kind, key.as_bytes(), &seal).is_err());
        let other = format!("{key}0");
        assert!(open_value(sealed.clone(), kind, other.as_bytes(), &seal).is_err());
        assert_eq!(sealed.len(), HEADER_BYTES + item.len() + 16);
    }
});
