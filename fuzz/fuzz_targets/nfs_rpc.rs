//! Arbitrary bytes into the NFS gateway's decoders (crate weft-nfs): the record-marking reader, the ONC RPC call
//! header with its AUTH_SYS credential, every NFSv3 procedure's arguments, MOUNT's path, and the filehandle
//! opener.
//!
//! Any panic is a bug: a gateway decodes all of these from any caller on its port. Checked properties:
//! - no decoder panics, and nothing is allocated past the record bound (the limits are small here);
//! - a record the splitter returns is within the bound;
//! - a call header that fails gets the reply RFC 5531 prescribes, which parses as a reply with its xid;
//! - a handle that opens re-seals to the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_nfs::fh::FhSealer;
use weft_nfs::proto::{decode_args, decode_mount_path};
use weft_nfs::rpc::{self, RecordLimits, ReplyHead};

fuzz_target!(|data: &[u8]| {
    let limits = RecordLimits { record_bytes_max: 64 * 1024, fragments_max: 64 };
    let sealer = FhSealer::new(&weft_rpc::Key::from_bytes([3; 32]), "/");
    // The whole input as a stream of records, and each record as a call.
    let records = match rpc::split_records(data, &limits) {
        Ok(r) => r,
        // Still try the input as one record body.
        Err(_) => vec![data.to_vec()],
    };
    for rec in &records {
        assert!(rec.len() <= limits.record_bytes_max.max(data.len()));
        match rpc::parse_call(rec) {
            Ok(call) => {
                for p in 0..23 {
                    let _ = decode_args(p, call.args);
                }
                let _ = decode_args(call.proc_, call.args);
                let _ = decode_mount_path(call.args);
            }
            Err(e) => {
                if let Some(reply) = e.reply() {
                    let head = rpc::parse_reply(&reply).expect("our reply parses");
                    let xid = match head {
                        ReplyHead::Accepted { xid, .. } | ReplyHead::Denied { xid, .. } => xid,
                    };
                    assert_eq!(Some(xid), e.xid());
                }
            }
        }
        if let Ok(fh) = sealer.open(rec) {
            assert_eq!(&sealer.seal(fh.ino)[..], &rec[..]);
        }
    }
});
