//! Arbitrary bytes into the NFS gateway's RPC-over-RDMA decoders (crate weft-nfs, module `rdma`): the transport
//! header with its read list, write list and reply chunk, the RFC 8797 private data, and the placement of calls
//! and replies into the chunks a header offers.
//!
//! Any panic is a bug: the gateway decodes these from any client on port 20049. Checked properties:
//! - a refused header gets the answer RFC 8166 prescribes (ERR_VERS or ERR_CHUNK for its xid, or nothing);
//! - every decoded list is within the limits (small here);
//! - every planned RDMA READ lands inside the reassembled record, every planned RDMA WRITE is inside a segment
//!   the header offered, and a reply is refused rather than overrun what was offered.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_nfs::rdma::{
    Decoded, HeaderLimits, PrivateData, Segment, call_layout, decode, encode_reply_header, place_reply,
};

fn inside(p: &weft_nfs::rdma::Piece, segs: &[Segment]) -> bool {
    segs.iter().any(|s| {
        s.handle == p.handle
            && p.remote_offset >= s.offset
            && p.remote_offset + p.len as u64 <= s.offset + s.length as u64
    })
}

fuzz_target!(|data: &[u8]| {
    let limits = HeaderLimits { read_segments_max: 8, write_chunks_max: 2, chunk_segments_max: 8, chunk_bytes_max: 1 << 16 };
    let _ = PrivateData::decode(data);
    // The first 8 bytes steer the reply sizes; the rest is the received message.
    let (steer, msg) = data.split_at(data.len().min(8));
    let mut s = [0u8; 8];
    s[..steer.len()].copy_from_slice(steer);
    let head = u16::from_be_bytes([s[0], s[1]]) as usize;
    let tail = u32::from_be_bytes([s[2], s[3], s[4], s[5]]) as usize % (1 << 17);
    let inline_max = 1024 + u16::from_be_bytes([s[6], s[7]]) as usize % 4096;
    match decode(msg, &limits) {
        Err(e) => {
            if let Some(reply) = e.reply(1) {
                assert_eq!(&reply[..4], &msg[..4], "an error answer carries the xid");
                assert!(reply.len() == 20 || reply.len() == 28);
            }
        }
        Ok(Decoded::ClientError { .. }) => {}
        Ok(Decoded::Call(h, inline)) => {
            assert!(h.reads.len() <= limits.read_segments_max && h.writes.len() <= limits.write_chunks_max);
            assert!(h.writes.iter().all(|c| c.len() <= limits.chunk_segments_max));
            if let Ok(Some(l)) = call_layout(&h, inline.len(), 1 << 17) {
                let segs: Vec<Segment> = h.reads.iter().map(|r| r.target).collect();
                for p in &l.reads {
                    assert!(inside(p, &segs));
                    assert!(p.local_offset >= l.position && p.local_offset + p.len <= l.position + l.chunk_bytes);
                }
                assert_eq!(l.record_bytes, inline.len() + l.chunk_bytes + l.pad_bytes);
            }
            if let Ok(p) = place_reply(&h, head, tail, inline_max) {
                for piece in &p.data {
                    assert!(inside(piece, &h.writes[0]) && piece.local_offset + piece.len <= tail);
                }
                let offered = h.reply_chunk.clone().unwrap_or_default();
                for piece in &p.reply {
                    assert!(inside(piece, &offered) && piece.local_offset + piece.len <= p.message_bytes);
                }
                let hdr = encode_reply_header(h.xid, 1, p.nomsg, &p.writes, p.reply_chunk.as_deref());
                if !p.nomsg {
                    assert!(hdr.len() + p.message_bytes <= inline_max);
                }
                assert!(matches!(decode(&hdr, &HeaderLimits::default()), Ok(Decoded::Call(..)) | Err(_)));
            }
        }
    }
});
