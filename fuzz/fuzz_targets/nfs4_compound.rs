//! Arbitrary bytes into the NFSv4.1 COMPOUND decoder (crate weft-nfs, module nfs4): the header, every op's
//! arguments in turn, and the settable attributes of the ops that carry them, as the gateway decodes them from any
//! caller on its port.
//!
//! Any panic is a bug. Checked properties:
//! - the decoder never panics and never decodes more ops than the header's count or `COMPOUND_OPS_MAX`;
//! - each op's settable attributes decode to an NFSv4 status or a value, never a panic;
//! - a bitmap re-encodes to bytes that decode to the same set.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_nfs::nfs4::attrs::{self, Bitmap};
use weft_nfs::nfs4::decode::{self, COMPOUND_OPS_MAX, CreateHow, Op};
use weft_nfs::xdr::{Reader, Writer};

fuzz_target!(|data: &[u8]| {
    if let Ok((h, ops)) = decode::decode_all(data) {
        assert!(ops.len() as u32 <= h.ops.min(COMPOUND_OPS_MAX));
        for op in &ops {
            let raw = match op {
                Op::SetAttr { attrs, .. } | Op::Create { attrs, .. } => Some(attrs),
                Op::Open { how: CreateHow::Unchecked(a) | CreateHow::Guarded(a), .. } => Some(a),
                Op::Open { how: CreateHow::Exclusive41(_, a), .. } => Some(a),
                _ => None,
            };
            if let Some(a) = raw {
                let _ = attrs::settable_from(&a.bits, a.list, &attrs::settable());
                let _ = attrs::settable_from(&a.bits, a.list, &attrs::exclcreat());
            }
            if let Op::GetAttr(b) | Op::Readdir { want: b, .. } = op {
                let mut w = Writer::new();
                b.encode(&mut w);
                let back = Bitmap::decode(&mut Reader::new(&w.buf)).expect("our bitmap decodes");
                assert_eq!(back.iter().collect::<Vec<_>>(), b.iter().collect::<Vec<_>>());
            }
        }
    }
    // The same bytes as one op of every code, as the loop would meet them.
    for code in [3u32, 6, 12, 13, 14, 18, 26, 34, 38, 42, 43, 55] {
        let _ = decode::op(code, &mut Reader::new(data));
    }
});
