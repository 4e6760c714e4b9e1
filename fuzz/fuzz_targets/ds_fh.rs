//! Arbitrary bytes into the pNFS data-server filehandle decoder (docs/format.md §23) and its offset mapping: what
//! a data server does with every PUTFH from any client.
//!
//! Checked properties:
//! - neither the decoder nor `object_range` panics, whatever the bytes and offsets;
//! - whatever decodes has geometry in bounds and re-encodes to bytes that decode to the same handle;
//! - an object range it answers lies in this server's stripe, inside one stripe unit, and maps back to the file
//!   offset it came from.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_nfs::ds::fh;

fuzz_target!(|data: &[u8]| {
    let Some((head, handle)) = data.split_at_checked(12) else {
        return;
    };
    let Ok(d) = fh::decode(handle) else {
        return;
    };
    assert!(d.unit >= 4096 && d.unit.is_multiple_of(4096) && d.count >= 1 && d.index < d.count);
    let again = fh::encode(&d.cap, d.unit, d.count, d.index, d.generation);
    assert_eq!(fh::decode(&again).as_ref(), Ok(&d), "a re-encoded handle decodes to the same");
    let offset = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let len = u64::from(u32::from_le_bytes(head[8..].try_into().expect("4 bytes")));
    if let Ok(object) = d.object_range(offset, len) {
        let unit = u64::from(d.unit);
        assert_eq!((offset / unit) % u64::from(d.count), u64::from(d.index));
        assert!(offset % unit + len <= unit);
        assert_eq!(d.file_offset(object), offset);
    }
});
