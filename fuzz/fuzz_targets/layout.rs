//! The striping arithmetic of `weft_proto::layout` on arbitrary layouts and ranges.
//!
//! `Layout::validate` must never panic. On layouts it accepts as a file layout (`validate(false)`):
//! - `pieces(offset, len)` covers exactly `[offset, offset + len)` in file order, with no gap and no overlap, each
//!   piece non-empty, inside one stripe unit, on a server index below the stripe count, and at the object offset
//!   the formula gives (checked by inverting it);
//! - `object_size(file_size, i)` matches an independent closed form, and the brute force over `pieces` for small
//!   files; the object sizes of all servers add up to the file size.
//! - with redundancy (§16), `validate` never panics, and an accepted `ec k+m` file layout's `data_view` is a valid
//!   plain layout of `k` servers whose object sizes the ec layout's data servers share, parity as data server 0.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use weft_proto::Layout;
use weft_proto::layout::{STRIPE_COUNT_MAX, STRIPE_UNIT_BYTES_MAX, STRIPE_UNIT_BYTES_MIN};

/// Most pieces one call may produce, so that a huge `len` does not turn into a huge allocation.
const PIECES_MAX: u64 = 4096;

#[derive(Debug, Arbitrary)]
struct Input {
    /// Build a layout that is valid by construction (most inputs), or take the raw fields as they come, to
    /// exercise `validate` on garbage.
    shaped: bool,
    stripe_unit: u32,
    stripe_count: u32,
    servers: Vec<u32>,
    offset: u64,
    len: u64,
    file_size: u64,
    ec_k: u8,
    ec_m: u8,
}

fn layout_of(input: &Input) -> Layout {
    if !input.shaped {
        return Layout {
            stripe_unit: input.stripe_unit,
            stripe_count: input.stripe_count,
            servers: input.servers.clone(),
            redundancy: weft_proto::DataRedundancy::Plain,
            generation: 0,
        };
    }
    let units = STRIPE_UNIT_BYTES_MAX / STRIPE_UNIT_BYTES_MIN;
    let stripe_unit = (input.stripe_unit % units + 1) * STRIPE_UNIT_BYTES_MIN;
    let stripe_count = input.stripe_count % STRIPE_COUNT_MAX + 1;
    let servers = (0..stripe_count).map(|i| input.servers.get(i as usize).copied().unwrap_or(i)).collect();
    Layout { stripe_unit, stripe_count, servers, redundancy: weft_proto::DataRedundancy::Plain, generation: 0 }
}

fuzz_target!(|input: Input| {
    let ec = Layout { redundancy: weft_proto::DataRedundancy::Ec { k: input.ec_k, m: input.ec_m }, ..layout_of(&input) };
    let _ = ec.validate(true);
    if ec.validate(false).is_ok() {
        let k = u32::from(input.ec_k);
        let data = ec.data_view(0);
        assert!(data.validate(false).is_ok(), "data view of {ec:?}");
        assert_eq!(data.stripe_count, k);
        for i in 0..ec.stripe_count {
            let want = data.object_size(input.file_size, if i < k { i } else { 0 });
            assert_eq!(ec.object_size(input.file_size, i), want, "object {i} of {ec:?}");
        }
    }
    let layout = layout_of(&input);
    let _ = layout.validate(true);
    if layout.validate(false).is_err() {
        return;
    }
    let unit = layout.stripe_unit as u64;
    let count = layout.stripe_count as u64;

    // --- pieces ---
    let offset = input.offset;
    let len = input.len % (unit * PIECES_MAX);
    // `pieces` clamps the end of the range at u64::MAX (it uses saturating_add); a range past it is cut there.
    let end = offset.saturating_add(len);
    let pieces = layout.pieces(offset, len);
    let mut at = offset;
    for p in &pieces {
        assert_eq!(p.file_offset, at, "gap or overlap at {at} in {pieces:?} for {layout:?}");
        assert!(p.len > 0, "empty piece {p:?}");
        let last = p.file_offset + (p.len - 1);
        assert!(last < end, "piece {p:?} runs past the end {end}");
        assert_eq!(p.file_offset / unit, last / unit, "piece {p:?} crosses a stripe unit of {unit}");
        assert!((p.server_index as u64) < count, "piece {p:?} names server index >= {count}");
        assert!((p.server_index as usize) < layout.servers.len());
        // Invert the formula: object block b on server i holds stripe b * count + i.
        assert_eq!(p.object_offset % unit, p.file_offset % unit, "piece {p:?}: offset within the unit differs");
        let stripe = (p.object_offset / unit).checked_mul(count).and_then(|s| s.checked_add(p.server_index as u64));
        let back = stripe.and_then(|s| s.checked_mul(unit)).and_then(|o| o.checked_add(p.object_offset % unit));
        assert_eq!(back, Some(p.file_offset), "piece {p:?} does not map back to its file offset ({layout:?})");
        at = p.file_offset + p.len;
    }
    assert_eq!(at, end, "pieces {pieces:?} stop at {at}, not at {end}");

    // --- object_size ---
    let file_size = input.file_size;
    let stripes = file_size.div_ceil(unit);
    let mut total: u128 = 0;
    for i in 0..layout.stripe_count {
        let got = layout.object_size(file_size, i);
        let server = i as u64;
        let want = if server >= stripes {
            0
        } else {
            // The last stripe on server i, and how many bytes of the file it holds.
            let last = server + ((stripes - 1 - server) / count) * count;
            let bytes = (file_size - last * unit).min(unit);
            (last / count) * unit + bytes
        };
        assert_eq!(got, want, "object_size({file_size}, {i}) for {layout:?}");
        total += got as u128;
    }
    assert_eq!(total, file_size as u128, "object sizes of {layout:?} do not add up to {file_size}");

    // Brute force over `pieces` for files of a few stripes: each object's size is the end of its last piece.
    let small = file_size % (unit * 8 * count);
    let mut brute = vec![0u64; layout.stripe_count as usize];
    for p in layout.pieces(0, small) {
        let e = &mut brute[p.server_index as usize];
        *e = (*e).max(p.object_offset + p.len);
    }
    for (i, want) in brute.iter().enumerate() {
        let got = layout.object_size(small, i as u32);
        assert_eq!(got, *want, "object_size({small}, {i}) vs pieces for {layout:?}");
    }
});
