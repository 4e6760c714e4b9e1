//! The metadata journal's decoders on arbitrary bytes: `decode_seg_header`, `decode_entry`, the recovery `scan`
//! and `decode_redo` must never panic, and whatever they accept must re-encode to the very bytes it came from.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_meta::journal::{
    ENTRY_HEADER_BYTES, decode_entry, decode_redo, decode_seg_header, encode_entry, encode_redo, scan,
};

fuzz_target!(|data: &[u8]| {
    let Some((params, seg)) = data.split_first_chunk::<9>() else { return };
    let seq = u64::from(params[0] % 4);
    let applied = u64::from_le_bytes(params[1..9].try_into().unwrap()) % 8;
    let _ = decode_seg_header(seg);

    // One entry at the start of the bytes.
    if let Ok((e, n)) = decode_entry(seg, seq) {
        assert_eq!(n, ENTRY_HEADER_BYTES + e.payload.len());
        let mut again = Vec::new();
        encode_entry(&mut again, seq, e.lsn, e.synced_lsn, e.payload);
        assert_eq!(&again[..], &seg[..n]);
    }

    // The recovery scan over a journal of one or two segments; every entry it replays decodes again.
    let (a, b) = seg.split_at(seg.len() / 2);
    for segments in [vec![(seq, seg)], vec![(seq, a), (seq + 1, b)]] {
        if let Ok(found) = scan(&segments, applied) {
            let mut want = applied;
            for r in &found.replay {
                want += 1;
                assert_eq!(r.lsn, want, "replay out of order");
                let payload = &segments[r.seg].1[r.range.clone()];
                if let Ok(records) = decode_redo(payload) {
                    let mut again = Vec::new();
                    for rec in &records {
                        encode_redo(&mut again, rec);
                    }
                    assert_eq!(again, payload);
                }
            }
        }
    }

    // The redo records of a payload, directly.
    if let Ok(records) = decode_redo(seg) {
        let mut again = Vec::new();
        for rec in &records {
            encode_redo(&mut again, rec);
        }
        assert_eq!(again, seg);
    }
});
