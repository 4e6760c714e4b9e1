//! Arbitrary bytes into the chunk-list and region decoders, then through the region table's checks.
//!
//! Input: one selector byte, then a body. Checked properties:
//! - `ReadChunksReq`, `WriteChunksReq` and `RegionsReq` bodies never panic the decoder;
//! - applying any decoded registration batch and checking any decoded chunk list never panics;
//! - a chunk list the table accepts lies wholly inside registered regions and adds up to the wanted length.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_proto::msg::{self, Op, ReadChunksReq, RegionsReq, WriteChunksReq};
use weft_proto::{Chunk, RegionTable};

fn check_accepted(t: &RegionTable, chunks: &[Chunk]) {
    let want: u64 = chunks.iter().map(|c| u64::from(c.len)).sum();
    if t.check(chunks, want).is_ok() {
        for c in chunks {
            let r = t.get(c.region).expect("accepted chunk names a registered region");
            assert!(c.offset.checked_add(u64::from(c.len)).is_some_and(|e| e <= r.len), "{c:?} outside {r:?}");
        }
    }
    let _ = t.check(chunks, want.wrapping_add(1));
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let mut t = RegionTable::new(64);
    t.set_arena(1 << 20);
    match sel % 3 {
        0 => {
            if let Ok(r) = msg::decode::<ReadChunksReq>(Op::ReadChunks as u16, body) {
                check_accepted(&t, &r.chunks);
            }
        }
        1 => {
            if let Ok(r) = msg::decode::<WriteChunksReq>(Op::WriteChunks as u16, body) {
                check_accepted(&t, &r.chunks);
            }
        }
        _ => {
            // A registration batch, then the rest of the input as a chunk list against it.
            if let Ok((r, rest)) = postcard::take_from_bytes::<RegionsReq>(body) {
                let _ = t.apply(&r.add, &r.remove);
                if let Ok(chunks) = postcard::from_bytes::<Vec<Chunk>>(rest) {
                    check_accepted(&t, &chunks);
                }
            }
        }
    }
});
