//! Where chunk data goes (RFC 8166 §3.4–§3.5 and §4.3, RFC 8267 §4; docs/format.md §25).
//!
//! Calls: a read chunk's bytes belong at its XDR position in the call. [`call_layout`] says where: the
//! reassembled record is `inline[..position]`, the chunk, zero padding to 4 bytes (the requester sends no XDR
//! roundup, §4.3.1), then `inline[position..]`; the server RDMA READs the chunk straight to its place in a
//! registered buffer, so only the small inline parts are copied around it.
//!
//! Replies: [`place_reply`] puts a reply's tail (the READ data, [`crate::rpc::Reply::tail`]) into the call's first
//! write chunk, without XDR padding (§4.3.2), and the rest inline (RDMA_MSG) if it fits the client's inline
//! threshold, else into the reply chunk (RDMA_NOMSG). Every RDMA WRITE it plans is a sub-range of a segment the
//! client offered; what does not fit is a [`PlaceError`] (answered with RDMA_ERROR ERR_CHUNK), never an overrun.

use super::header::{RdmaHeader, Segment};

/// One RDMA READ or WRITE: `len` bytes between the client's segment (`handle`, `remote_offset`) and the server's
/// buffer at `local_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub handle: u32,
    pub remote_offset: u64,
    pub local_offset: usize,
    pub len: usize,
}

/// Where a call's read chunk goes in the reassembled call record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallLayout {
    /// Bytes of the inline message before the chunk (its XDR position).
    pub position: usize,
    pub chunk_bytes: usize,
    /// Zero bytes after the chunk, so the inline rest starts 4-aligned.
    pub pad_bytes: usize,
    /// The whole record: inline bytes + chunk + padding.
    pub record_bytes: usize,
    /// The RDMA READs, with `local_offset` in the record.
    pub reads: Vec<Piece>,
}

/// Why a call or reply cannot be moved within what the client offered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlaceError {
    #[error("call record of {len} bytes is over the limit of {max}")]
    CallTooLarge { len: usize, max: usize },
    #[error("READ data of {len} bytes does not fit the write chunk of {offered} bytes")]
    WriteChunkTooSmall { len: usize, offered: u64 },
    #[error("reply of {len} bytes does not fit the reply chunk of {offered} bytes")]
    ReplyChunkTooSmall { len: usize, offered: u64 },
    #[error("reply of {len} bytes is over the inline threshold of {max} and no reply chunk was offered")]
    NoReplyChunk { len: usize, max: usize },
}

/// Cuts `len` bytes, starting at `local_start`, into the given segments in order; returns the pieces and the
/// segments echoed with the bytes each received (RFC 8166 §4.2.1: a responder returns how much it wrote).
fn cut(segments: &[Segment], len: usize, local_start: usize) -> Option<(Vec<Piece>, Vec<Segment>)> {
    let mut left = len;
    let mut local = local_start;
    let mut pieces = Vec::new();
    let mut used = Vec::with_capacity(segments.len());
    for s in segments {
        let n = left.min(s.length as usize);
        if n > 0 {
            pieces.push(Piece { handle: s.handle, remote_offset: s.offset, local_offset: local, len: n });
        }
        used.push(Segment { length: n as u32, ..*s });
        left -= n;
        local += n;
    }
    (left == 0).then_some((pieces, used))
}

fn total(segments: &[Segment]) -> u64 {
    segments.iter().map(|s| s.length as u64).sum()
}

/// The record layout of a call whose header is `h` and whose inline part is `inline_bytes` long; `None` when it
/// has no read chunk (the inline bytes are the whole call).
pub fn call_layout(
    h: &RdmaHeader,
    inline_bytes: usize,
    record_bytes_max: usize,
) -> Result<Option<CallLayout>, PlaceError> {
    let Some(position) = h.read_position() else { return Ok(None) };
    // Checked at decode: the position is 4-aligned and inside the inline bytes, the chunk within the limits.
    let position = position as usize;
    assert!(position <= inline_bytes, "decode checks the position");
    let chunk_bytes = usize::try_from(h.read_bytes()).unwrap_or(usize::MAX);
    let pad_bytes = if h.nomsg { 0 } else { crate::xdr::pad_of(chunk_bytes).len() };
    let record_bytes = inline_bytes.saturating_add(chunk_bytes).saturating_add(pad_bytes);
    if record_bytes > record_bytes_max {
        return Err(PlaceError::CallTooLarge { len: record_bytes, max: record_bytes_max });
    }
    let segs: Vec<Segment> = h.read_chunk(position as u32).copied().collect();
    let (reads, _) = cut(&segs, chunk_bytes, position).expect("the chunk's own length fits it");
    Ok(Some(CallLayout { position, chunk_bytes, pad_bytes, record_bytes, reads }))
}

/// Bytes of the responder header [`super::header::encode_reply_header`] writes for these chunks.
pub fn reply_header_bytes(writes: &[Vec<Segment>], reply_chunk: Option<&[Segment]>) -> usize {
    16 + 4 + writes.iter().map(|c| 8 + 16 * c.len()).sum::<usize>() + 4 + reply_chunk.map_or(4, |c| 8 + 16 * c.len())
}

/// How one reply travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// RDMA WRITEs of the tail into the first write chunk; `local_offset` is in the tail.
    pub data: Vec<Piece>,
    /// The call's write chunks echoed with the bytes written into each segment (zero for unused ones).
    pub writes: Vec<Vec<Segment>>,
    /// `true`: RDMA_NOMSG, the message went into the reply chunk by `reply`; `false`: RDMA_MSG, the message
    /// follows the header inline.
    pub nomsg: bool,
    /// RDMA WRITEs of the message into the reply chunk; `local_offset` is in the message (head, then the tail
    /// and its padding when the tail is not in a write chunk).
    pub reply: Vec<Piece>,
    /// The reply chunk echoed with the bytes written (RDMA_NOMSG only: Linux's client refuses an RDMA_MSG that
    /// reports reply-chunk bytes).
    pub reply_chunk: Option<Vec<Segment>>,
    /// Whether the tail is part of the message (inline or reply chunk) rather than in a write chunk.
    pub tail_in_message: bool,
    /// Bytes of the message (the RPC reply as carried inline or in the reply chunk).
    pub message_bytes: usize,
}

/// Places a reply of `head_bytes` plus a tail of `tail_bytes` (0: none) for the call `h`; `inline_max` is the
/// largest message, transport header included, the client receives inline.
pub fn place_reply(
    h: &RdmaHeader,
    head_bytes: usize,
    tail_bytes: usize,
    inline_max: usize,
) -> Result<Placement, PlaceError> {
    let mut writes: Vec<Vec<Segment>> =
        h.writes.iter().map(|c| c.iter().map(|s| Segment { length: 0, ..*s }).collect()).collect();
    let mut data = Vec::new();
    let tail_in_chunk = tail_bytes > 0 && !h.writes.is_empty();
    if tail_in_chunk {
        let offered = total(&h.writes[0]);
        let (pieces, used) =
            cut(&h.writes[0], tail_bytes, 0).ok_or(PlaceError::WriteChunkTooSmall { len: tail_bytes, offered })?;
        data = pieces;
        writes[0] = used;
    }
    let message_bytes =
        if tail_in_chunk { head_bytes } else { head_bytes + tail_bytes + crate::xdr::pad_of(tail_bytes).len() };
    let inline_len = reply_header_bytes(&writes, None) + message_bytes;
    if inline_len <= inline_max {
        return Ok(Placement {
            data,
            writes,
            nomsg: false,
            reply: vec![],
            reply_chunk: None,
            tail_in_message: !tail_in_chunk,
            message_bytes,
        });
    }
    let Some(offered) = &h.reply_chunk else {
        return Err(PlaceError::NoReplyChunk { len: inline_len, max: inline_max });
    };
    // Linux's client refuses an RDMA_NOMSG reply that also reports write-chunk bytes: a reply with its data in
    // a write chunk must fit inline (its head is a few hundred bytes).
    if tail_in_chunk {
        return Err(PlaceError::NoReplyChunk { len: inline_len, max: inline_max });
    }
    let (reply, used) = cut(offered, message_bytes, 0)
        .ok_or(PlaceError::ReplyChunkTooSmall { len: message_bytes, offered: total(offered) })?;
    Ok(Placement { data, writes, nomsg: true, reply, reply_chunk: Some(used), tail_in_message: true, message_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(handle: u32, length: u32, offset: u64) -> Segment {
        Segment { handle, length, offset }
    }

    fn header(reads: Vec<(u32, Segment)>, writes: Vec<Vec<Segment>>, reply_chunk: Option<Vec<Segment>>) -> RdmaHeader {
        let nomsg = reads.first().is_some_and(|r| r.0 == 0);
        let reads =
            reads.into_iter().map(|(position, target)| super::super::ReadSegment { position, target }).collect();
        RdmaHeader { xid: 1, credits: 1, nomsg, reads, writes, reply_chunk }
    }

    #[test]
    fn a_read_chunk_lands_at_its_position_padded() {
        let h = header(vec![(0x80, seg(1, 4000, 0x1000)), (0x80, seg(2, 1001, 0x9000))], vec![], None);
        let l = call_layout(&h, 0x84, 1 << 20).unwrap().unwrap();
        assert_eq!((l.position, l.chunk_bytes, l.pad_bytes, l.record_bytes), (0x80, 5001, 3, 0x84 + 5001 + 3));
        assert_eq!(
            l.reads,
            vec![
                Piece { handle: 1, remote_offset: 0x1000, local_offset: 0x80, len: 4000 },
                Piece { handle: 2, remote_offset: 0x9000, local_offset: 0x80 + 4000, len: 1001 },
            ]
        );
        assert_eq!(call_layout(&h, 0x84, 4096), Err(PlaceError::CallTooLarge { len: 0x84 + 5004, max: 4096 }));
        assert_eq!(call_layout(&header(vec![], vec![], None), 100, 4096), Ok(None));
        // RDMA_NOMSG: the chunk is the whole call, unpadded.
        let n = call_layout(&header(vec![(0, seg(3, 2002, 0))], vec![], None), 0, 4096).unwrap().unwrap();
        assert_eq!((n.position, n.pad_bytes, n.record_bytes), (0, 0, 2002));
    }

    #[test]
    fn read_data_goes_to_the_write_chunk_and_the_head_inline() {
        let h = header(vec![], vec![vec![seg(7, 4096, 0x10), seg(8, 4096, 0x20)]], Some(vec![seg(9, 512, 0)]));
        let p = place_reply(&h, 120, 5000, 1024).unwrap();
        assert_eq!(
            p.data,
            vec![
                Piece { handle: 7, remote_offset: 0x10, local_offset: 0, len: 4096 },
                Piece { handle: 8, remote_offset: 0x20, local_offset: 4096, len: 904 },
            ]
        );
        assert_eq!(p.writes, vec![vec![seg(7, 4096, 0x10), seg(8, 904, 0x20)]]);
        assert!(!p.nomsg && !p.tail_in_message && p.reply_chunk.is_none() && p.reply.is_empty());
        assert_eq!(p.message_bytes, 120);
        // More data than offered: refused, nothing planned past the segments.
        assert_eq!(place_reply(&h, 120, 8193, 1024), Err(PlaceError::WriteChunkTooSmall { len: 8193, offered: 8192 }));
    }

    #[test]
    fn a_long_reply_goes_to_the_reply_chunk_within_its_segments() {
        let h = header(vec![], vec![vec![seg(7, 64, 0)]], Some(vec![seg(9, 1000, 0x100), seg(10, 3000, 0x200)]));
        // A READDIR-sized reply with no tail: too long for 1024 inline.
        let p = place_reply(&h, 3000, 0, 1024).unwrap();
        assert!(p.nomsg && p.data.is_empty());
        assert_eq!(p.writes, vec![vec![seg(7, 0, 0)]], "the unused write chunk comes back empty");
        assert_eq!(
            p.reply,
            vec![
                Piece { handle: 9, remote_offset: 0x100, local_offset: 0, len: 1000 },
                Piece { handle: 10, remote_offset: 0x200, local_offset: 1000, len: 2000 },
            ]
        );
        assert_eq!(p.reply_chunk, Some(vec![seg(9, 1000, 0x100), seg(10, 2000, 0x200)]));
        assert_eq!(place_reply(&h, 4001, 0, 1024), Err(PlaceError::ReplyChunkTooSmall { len: 4001, offered: 4000 }));
        // A tail without a write chunk travels in the message, padded.
        let h2 = header(vec![], vec![], Some(vec![seg(9, 4000, 0)]));
        let p2 = place_reply(&h2, 100, 1001, 1024).unwrap();
        assert!(p2.nomsg && p2.tail_in_message);
        assert_eq!(p2.message_bytes, 1104);
        // Short replies go inline whatever was offered.
        let p3 = place_reply(&h2, 100, 0, 1024).unwrap();
        assert!(!p3.nomsg && p3.reply_chunk.is_none() && p3.message_bytes == 100);
    }

    #[test]
    fn a_long_reply_without_a_reply_chunk_is_refused() {
        let h = header(vec![], vec![], None);
        let hdr = reply_header_bytes(&[], None);
        assert_eq!(hdr, 28);
        assert!(place_reply(&h, 1024 - hdr, 0, 1024).is_ok());
        assert_eq!(place_reply(&h, 1025 - hdr, 0, 1024), Err(PlaceError::NoReplyChunk { len: 1025, max: 1024 }));
        // Data in a write chunk with a head too long for inline: not sent as RDMA_NOMSG (Linux refuses it).
        let h2 = header(vec![], vec![vec![seg(1, 8192, 0)]], Some(vec![seg(2, 8192, 0)]));
        assert!(matches!(place_reply(&h2, 2000, 100, 1024), Err(PlaceError::NoReplyChunk { .. })));
    }
}
