//! The stale-range record decoder and rules (`weft_meta::stale`, docs/format.md §18) on arbitrary bytes, and the
//! once record decoder (`weft_meta::once`, §27) and the shared-store lock records (`weft_meta::db_locks`, §30): they
//! never panic, and what they accept encodes back to the same bytes.
//!
//! `decode` must never panic; what it accepts is well formed and survives an encode and decode unchanged; the
//! mark and clear rules, driven by the input, never panic and keep every entry well formed and within its cap.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_meta::stale;

fuzz_target!(|data: &[u8]| {
    weft_meta::once::fuzz_decode(data);
    weft_meta::db_locks::fuzz_decode(data);
    if let Ok(ranges) = stale::decode("fuzz", data) {
        assert!(stale::is_well_formed(&ranges));
        // Postcard accepts a varint with redundant continuation bytes, so the bytes need not come back the same;
        // what was decoded must.
        let again = stale::encode(&ranges).unwrap();
        assert_eq!(stale::decode("again", &again).unwrap(), ranges);
    }
    // Marks and clears from the bytes: 9 bytes per step (op, start, length).
    let mut ranges = Vec::new();
    let mut seq = 0u64;
    let mut listed = Vec::new();
    for step in data.chunks_exact(9) {
        let start = u64::from(u32::from_le_bytes(step[1..5].try_into().unwrap()) % 4096);
        let len = u64::from(u32::from_le_bytes(step[5..9].try_into().unwrap()) % 512) + 1;
        if step[0] % 3 == 0 {
            if let Some(&(s, e, q)) = listed.get(usize::from(step[0]) % listed.len().max(1)) {
                let _ = stale::clear(&mut ranges, s, e, q);
            }
        } else {
            seq += 1;
            let r = stale::mark(&mut ranges, start, start + len, seq, 8);
            listed.push((r.start, r.end.min(r.start.saturating_add(len)), r.seq));
        }
        assert!(stale::is_well_formed(&ranges) && ranges.len() <= 8, "{ranges:?}");
        let back = stale::decode("again", &stale::encode(&ranges).unwrap());
        if ranges.is_empty() {
            assert!(back.is_err(), "an empty entry is never stored");
        } else {
            assert_eq!(back.unwrap(), ranges);
        }
    }
});
