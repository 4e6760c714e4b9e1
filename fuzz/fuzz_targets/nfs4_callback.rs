//! Arbitrary bytes into the NFSv4.1 back channel's decoders (crate weft-nfs, module nfs4::callback): a
//! CB_COMPOUND reply record as the gateway's connection reader hands it over, and a `callback_sec_parms4` list as
//! CREATE_SESSION and BACKCHANNEL_CTL carry it; and, from the same bytes, a CB_LAYOUTRECALL call encoded and read
//! back.
//!
//! Any panic is a bug. Checked properties:
//! - the decoders never panic, and consume no more than they were given;
//! - a decoded reply lists at most `CB_REPLY_OPS_MAX` op results, and its xid is the record's first word;
//! - the encoded CB_COMPOUND is an RPC call the gateway's own call parser accepts, with the program, version 1,
//!   procedure 1 and the filehandle it was given.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_nfs::nfs4::callback::{self, CbReply, CbSec, CbSequence, Recall};
use weft_nfs::nfs4::state::Stateid;
use weft_nfs::xdr::Reader;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = callback::decode_cb_reply(data) {
        assert_eq!(r.xid().to_be_bytes(), data[..4]);
        if let CbReply::Compound { ops, .. } = &r {
            assert!(ops.len() <= callback::CB_REPLY_OPS_MAX);
        }
    }
    let mut r = Reader::new(data);
    let _ = callback::decode_cb_sec(&mut r);
    assert!(r.position() <= data.len());
    if data.len() < 40 {
        return;
    }
    let word = |i: usize| u32::from_be_bytes(data[i..i + 4].try_into().unwrap());
    let fh = &data[40..data.len().min(40 + 128)];
    let sec = if data[0] & 1 == 1 { CbSec::Sys { machine: "m".into(), uid: word(4), gid: word(8) } } else { CbSec::None };
    let seq = CbSequence { sessionid: data[12..28].try_into().unwrap(), seqid: word(28) };
    let stateid = Stateid { seqid: word(0), other: data[28..40].try_into().unwrap() };
    let rec = callback::encode_cb_layoutrecall(word(32), word(36), &sec, &seq, &Recall { fh: fh.to_vec(), stateid });
    let call = weft_nfs::rpc::parse_call(&rec).expect("the gateway's own call parses");
    assert_eq!((call.xid, call.prog, call.vers, call.proc_), (word(32), word(36), 1, 1));
    assert!(call.args.windows(fh.len().max(1)).any(|w| fh.is_empty() || w == fh));
});
