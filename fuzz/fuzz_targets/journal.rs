//! The metadata journal's decoders on arbitrary bytes: `decode_seg_header`, `decode_entry`, the recovery `scan`
//! and `decode_redo` must never panic, and whatever they accept must re-encode to the very bytes it came from.
//! Half the inputs are first turned into a well-formed segment (entries framed with valid CRCs, then a few bytes
//! overwritten and the tail cut), so the scan's tail, gap and corruption rules are reached, not only the CRC check.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_meta::journal::{
    ENTRY_HEADER_BYTES, decode_entry, decode_redo, decode_seg_header, encode_entry, encode_redo, scan,
};

/// A segment of entries whose payloads are slices of `body`, LSNs mostly consecutive, then damaged as `body`'s
/// last bytes say.
fn well_formed(seq: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"WEFTJNL1");
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&1u64.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    let crc = crc32c::crc32c(&out[..28]);
    out.extend_from_slice(&crc.to_le_bytes());
    let (ctl, rest) = body.split_at(body.len().min(8));
    let mut lsn = 1u64;
    for (i, payload) in rest.chunks(7).enumerate() {
        let c = ctl.get(i % 8).copied().unwrap_or(0);
        // Now and then skip or repeat an LSN, and claim more or less as synced.
        lsn = match c % 16 {
            0 => lsn + 2,
            1 => lsn,
            _ => lsn + 1,
        };
        encode_entry(&mut out, seq, lsn - 1, (lsn - 1).saturating_sub(u64::from(c >> 6)), payload);
    }
    for w in ctl.chunks(2) {
        if let [at, v] = *w {
            let i = usize::from(at) * out.len() / 256;
            if let Some(b) = out.get_mut(i) {
                *b ^= v;
            }
        }
    }
    let keep = out.len() - usize::from(ctl.first().copied().unwrap_or(0) % 8).min(out.len());
    out.truncate(keep);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((params, raw)) = data.split_first_chunk::<9>() else { return };
    let seq = u64::from(params[0] % 4);
    let applied = u64::from_le_bytes(params[1..9].try_into().unwrap()) % 8;
    let built;
    let seg = if params[0] & 0x80 != 0 {
        built = well_formed(seq, raw);
        &built[..]
    } else {
        raw
    };
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
