//! The RPC-over-RDMA version 1 transport header (RFC 8166 §4.1–§4.3, XDR in §5.3 and §5.4; docs/format.md §25).
//!
//! ```text
//! rdma_xid u32 | rdma_vers u32 (1) | rdma_credit u32 | rdma_proc u32 | body
//! RDMA_MSG (0), RDMA_NOMSG (1): read list | write list | reply chunk, then (RDMA_MSG) the RPC message inline
//! read list:   { 1 | position u32 | handle u32 | length u32 | offset u64 }* 0
//! write list:  { 1 | count u32 | { handle u32 | length u32 | offset u64 }^count }* 0
//! reply chunk: 0 | 1 count u32 { handle u32 | length u32 | offset u64 }^count
//! RDMA_ERROR (4): ERR_VERS (1) low u32 high u32 | ERR_CHUNK (2)
//! ```
//!
//! Decoding refuses with the answer RFC 8166 §5.3.2 and §4.5 prescribe ([`ChunkError::reply`]): a version other
//! than 1 gets ERR_VERS, a malformed or over-limit header ERR_CHUNK, and a header too short to carry its xid
//! and version (or an RDMA_ERROR from the client) gets nothing.

use crate::xdr::{Reader, Writer, XdrError};

pub const RDMA_MSG: u32 = 0;
pub const RDMA_NOMSG: u32 = 1;
/// Deprecated by RFC 8166 (§4.2.2): refused with ERR_CHUNK.
pub const RDMA_MSGP: u32 = 2;
/// Deprecated by RFC 8166 (§4.2.2): refused with ERR_CHUNK.
pub const RDMA_DONE: u32 = 3;
pub const RDMA_ERROR: u32 = 4;

pub const ERR_VERS: u32 = 1;
pub const ERR_CHUNK: u32 = 2;

/// One RDMA segment a client offered: its memory handle (rkey), length in bytes and offset (address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub handle: u32,
    pub length: u32,
    pub offset: u64,
}

/// A read-list entry: a segment of a read chunk, and the XDR position of the chunk in the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadSegment {
    pub position: u32,
    pub target: Segment,
}

/// A decoded requester header (RDMA_MSG or RDMA_NOMSG).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaHeader {
    pub xid: u32,
    /// Credits the requester asks for (RFC 8166 §3.3.1).
    pub credits: u32,
    /// RDMA_MSG (`false`: the RPC call follows inline) or RDMA_NOMSG (`true`: the call is in a position-zero
    /// read chunk).
    pub nomsg: bool,
    /// The read list as sent, in order (segments of one chunk share a position).
    pub reads: Vec<ReadSegment>,
    /// The write chunks, each a list of segments.
    pub writes: Vec<Vec<Segment>>,
    pub reply_chunk: Option<Vec<Segment>>,
}

impl RdmaHeader {
    /// The read segments of the chunk at `position`, in order.
    pub fn read_chunk(&self, position: u32) -> impl Iterator<Item = &Segment> {
        self.reads.iter().filter(move |r| r.position == position).map(|r| &r.target)
    }

    /// The one position of the read chunk that carries a DDP-eligible item (RDMA_MSG), or 0 for the whole call
    /// (RDMA_NOMSG); `None` when the read list is empty.
    pub fn read_position(&self) -> Option<u32> {
        self.reads.first().map(|r| r.position)
    }

    /// Total bytes of the read chunk (checked against the limits at decode, so it cannot overflow).
    pub fn read_bytes(&self) -> u64 {
        self.reads.iter().map(|r| r.target.length as u64).sum()
    }
}

/// What decoding a received message gives.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A call: its header and the RPC message bytes sent inline (empty for RDMA_NOMSG).
    Call(RdmaHeader, &'a [u8]),
    /// An RDMA_ERROR from the requester: dropped, there is nothing to answer.
    ClientError { xid: u32 },
}

/// Bounds of one transport header, checked before anything is allocated for it.
#[derive(Debug, Clone, Copy)]
pub struct HeaderLimits {
    /// Segments in the read list (all chunks together).
    pub read_segments_max: usize,
    /// Write chunks in the write list (an NFS call has at most one DDP-eligible result, RFC 8267 §4.2).
    pub write_chunks_max: usize,
    /// Segments in one write chunk or in the reply chunk.
    pub chunk_segments_max: usize,
    /// The largest chunk (sum of its segment lengths) and the largest reassembled call record.
    pub chunk_bytes_max: u64,
}

impl Default for HeaderLimits {
    fn default() -> Self {
        // Linux's client covers a 1 MiB READ or WRITE with one FRWR segment per 256 pages; 64 segments leave it
        // room on devices with smaller registration limits.
        HeaderLimits {
            read_segments_max: 64,
            write_chunks_max: 2,
            chunk_segments_max: 64,
            chunk_bytes_max: (1 << 20) + 4096,
        }
    }
}

/// Why a header was refused; [`ChunkError::reply`] is the answer the requester gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    /// Too short for xid and version: no answer can be addressed.
    #[error("transport header of {0} bytes has no xid and version")]
    NoXid(usize),
    #[error("RPC-over-RDMA version {vers}, not 1 (xid {xid:#x})")]
    Version { xid: u32, vers: u32 },
    #[error("procedure {proc_} is not RDMA_MSG or RDMA_NOMSG (xid {xid:#x})")]
    Proc { xid: u32, proc_: u32 },
    #[error("malformed transport header (xid {xid:#x}): {error}")]
    Xdr { xid: u32, error: XdrError },
    #[error("{what} (xid {xid:#x}): {count} over the limit {max}")]
    TooMany { xid: u32, what: &'static str, count: u64, max: u64 },
    #[error("bad read list (xid {xid:#x}): {why}")]
    ReadList { xid: u32, why: &'static str },
    #[error("segment offset {offset:#x} + length {length} wraps (xid {xid:#x})")]
    Wraps { xid: u32, offset: u64, length: u32 },
}

impl ChunkError {
    /// The RDMA_ERROR message this refusal gets (RFC 8166 §4.5), if one can be sent.
    pub fn reply(&self, credits: u32) -> Option<Vec<u8>> {
        match self {
            ChunkError::NoXid(_) => None,
            ChunkError::Version { xid, .. } => Some(encode_error_vers(*xid, credits)),
            ChunkError::Proc { xid, .. }
            | ChunkError::Xdr { xid, .. }
            | ChunkError::TooMany { xid, .. }
            | ChunkError::ReadList { xid, .. }
            | ChunkError::Wraps { xid, .. } => Some(encode_error_chunk(*xid, credits)),
        }
    }
}

fn segment(r: &mut Reader<'_>, xid: u32) -> Result<Segment, ChunkError> {
    let xdr = |error| ChunkError::Xdr { xid, error };
    let handle = r.u32().map_err(xdr)?;
    let length = r.u32().map_err(xdr)?;
    let offset = r.u64().map_err(xdr)?;
    if offset.checked_add(length as u64).is_none() {
        return Err(ChunkError::Wraps { xid, offset, length });
    }
    Ok(Segment { handle, length, offset })
}

/// A counted list of segments (a write chunk or the reply chunk), bounded in count and in total bytes.
fn chunk(r: &mut Reader<'_>, xid: u32, limits: &HeaderLimits, what: &'static str) -> Result<Vec<Segment>, ChunkError> {
    let n = r.u32().map_err(|error| ChunkError::Xdr { xid, error })? as usize;
    if n > limits.chunk_segments_max {
        return Err(ChunkError::TooMany { xid, what, count: n as u64, max: limits.chunk_segments_max as u64 });
    }
    // Each segment is 16 bytes: a count the remaining bytes cannot hold is refused before allocating.
    if n.saturating_mul(16) > r.remaining() {
        return Err(ChunkError::Xdr { xid, error: XdrError::Truncated { at: r.position(), wanted: n * 16 } });
    }
    let mut segs = Vec::with_capacity(n);
    let mut total = 0u64;
    for _ in 0..n {
        let s = segment(r, xid)?;
        total += s.length as u64;
        if total > limits.chunk_bytes_max {
            return Err(ChunkError::TooMany { xid, what, count: total, max: limits.chunk_bytes_max });
        }
        segs.push(s);
    }
    Ok(segs)
}

/// Decodes one received message (RFC 8166 §4.1–§4.3) and checks its chunk lists against `limits` and against
/// the rules of RFC 8166 §4.3 and RFC 8267 §4: the read list of an RDMA_MSG has at most one chunk, at a
/// 4-aligned position inside the inline message; an RDMA_NOMSG's read list is one position-zero chunk and
/// nothing follows the header.
pub fn decode<'a>(msg: &'a [u8], limits: &HeaderLimits) -> Result<Decoded<'a>, ChunkError> {
    let mut r = Reader::new(msg);
    let (Ok(xid), Ok(vers)) = (r.u32(), r.u32()) else { return Err(ChunkError::NoXid(msg.len())) };
    if vers != super::RPCRDMA_VERSION {
        return Err(ChunkError::Version { xid, vers });
    }
    let xdr = |error| ChunkError::Xdr { xid, error };
    let credits = r.u32().map_err(xdr)?;
    let proc_ = r.u32().map_err(xdr)?;
    let nomsg = match proc_ {
        RDMA_MSG => false,
        RDMA_NOMSG => true,
        RDMA_ERROR => return Ok(Decoded::ClientError { xid }),
        _ => return Err(ChunkError::Proc { xid, proc_ }),
    };
    let mut reads = Vec::new();
    let mut read_total = 0u64;
    while r.bool().map_err(xdr)? {
        if reads.len() == limits.read_segments_max {
            let max = limits.read_segments_max as u64;
            return Err(ChunkError::TooMany { xid, what: "read segments", count: max + 1, max });
        }
        let position = r.u32().map_err(xdr)?;
        let target = segment(&mut r, xid)?;
        read_total += target.length as u64;
        if read_total > limits.chunk_bytes_max {
            let max = limits.chunk_bytes_max;
            return Err(ChunkError::TooMany { xid, what: "read chunk bytes", count: read_total, max });
        }
        reads.push(ReadSegment { position, target });
    }
    let mut writes = Vec::new();
    while r.bool().map_err(xdr)? {
        if writes.len() == limits.write_chunks_max {
            let max = limits.write_chunks_max as u64;
            return Err(ChunkError::TooMany { xid, what: "write chunks", count: max + 1, max });
        }
        writes.push(chunk(&mut r, xid, limits, "write chunk")?);
    }
    let reply_chunk = if r.bool().map_err(xdr)? { Some(chunk(&mut r, xid, limits, "reply chunk")?) } else { None };
    let inline = r.rest();
    let bad = |why| Err(ChunkError::ReadList { xid, why });
    if let Some(first) = reads.first() {
        if reads.iter().any(|s| s.position != first.position) {
            return bad("more than one read chunk");
        }
        if first.position % 4 != 0 {
            return bad("read chunk position is not a multiple of 4");
        }
        if nomsg && first.position != 0 {
            return bad("RDMA_NOMSG without a position-zero read chunk");
        }
        if !nomsg && first.position == 0 {
            return bad("RDMA_MSG with a position-zero read chunk");
        }
        if !nomsg && first.position as usize > inline.len() {
            return bad("read chunk position past the inline message");
        }
    }
    if nomsg && reads.is_empty() {
        return bad("RDMA_NOMSG call without a position-zero read chunk");
    }
    if nomsg && !inline.is_empty() {
        return bad("RDMA_NOMSG with an inline message");
    }
    Ok(Decoded::Call(RdmaHeader { xid, credits, nomsg, reads, writes, reply_chunk }, inline))
}

fn put_segment(w: &mut Writer, s: &Segment) {
    w.u32(s.handle).u32(s.length).u64(s.offset);
}

/// The responder's header (RFC 8166 §4.2.1): RDMA_MSG (the reply follows inline) or RDMA_NOMSG (the reply is
/// in the reply chunk), an empty read list, the call's write chunks with each segment's length set to the bytes
/// written into it (`writes`), and the reply chunk likewise (`reply_chunk`).
pub fn encode_reply_header(
    xid: u32,
    credits: u32,
    nomsg: bool,
    writes: &[Vec<Segment>],
    reply_chunk: Option<&[Segment]>,
) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(xid).u32(super::RPCRDMA_VERSION).u32(credits).u32(if nomsg { RDMA_NOMSG } else { RDMA_MSG });
    w.bool(false);
    for chunk in writes {
        w.bool(true).u32(chunk.len() as u32);
        for s in chunk {
            put_segment(&mut w, s);
        }
    }
    w.bool(false);
    match reply_chunk {
        Some(chunk) => {
            w.bool(true).u32(chunk.len() as u32);
            for s in chunk {
                put_segment(&mut w, s);
            }
        }
        None => {
            w.bool(false);
        }
    }
    w.buf
}

/// RDMA_ERROR ERR_VERS: this server speaks version 1 only.
pub fn encode_error_vers(xid: u32, credits: u32) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(xid).u32(super::RPCRDMA_VERSION).u32(credits).u32(RDMA_ERROR).u32(ERR_VERS);
    w.u32(super::RPCRDMA_VERSION).u32(super::RPCRDMA_VERSION);
    w.buf
}

/// RDMA_ERROR ERR_CHUNK: the header (or a chunk it offered) cannot be served.
pub fn encode_error_chunk(xid: u32, credits: u32) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(xid).u32(super::RPCRDMA_VERSION).u32(credits).u32(RDMA_ERROR).u32(ERR_CHUNK);
    w.buf
}

/// The RFC 8797 connection private data (`rpcrdma_connect_private`, 8 bytes): magic 0xf6ab0e18, version 1,
/// flags (bit 0: remote invalidation supported), then the send and receive sizes, each in units of 1 KiB minus 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    pub remote_invalidate: bool,
    /// Largest message this side sends inline.
    pub send_bytes: usize,
    /// Largest message this side receives inline.
    pub recv_bytes: usize,
}

impl PrivateData {
    pub const MAGIC: u32 = 0xf6ab_0e18;
    pub const VERSION: u8 = 1;
    pub const BYTES: usize = 8;

    /// Decodes a peer's private data; `None` for anything else (a peer without RFC 8797 sends zeros or
    /// nothing, and then both sides assume [`super::INLINE_DEFAULT_BYTES`]).
    pub fn decode(b: &[u8]) -> Option<PrivateData> {
        let b: &[u8; 8] = b.get(..8)?.try_into().ok()?;
        if u32::from_be_bytes([b[0], b[1], b[2], b[3]]) != Self::MAGIC || b[4] != Self::VERSION {
            return None;
        }
        Some(PrivateData {
            remote_invalidate: b[5] & 1 != 0,
            send_bytes: (b[6] as usize + 1) * 1024,
            recv_bytes: (b[7] as usize + 1) * 1024,
        })
    }

    /// Encodes; sizes are rounded down to whole KiB within 1–256 KiB.
    pub fn encode(&self) -> [u8; 8] {
        let unit = |n: usize| ((n / 1024).clamp(1, 256) - 1) as u8;
        let m = Self::MAGIC.to_be_bytes();
        [
            m[0],
            m[1],
            m[2],
            m[3],
            Self::VERSION,
            self.remote_invalidate as u8,
            unit(self.send_bytes),
            unit(self.recv_bytes),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[u32]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_be_bytes()).collect()
    }

    /// An NFS WRITE as Linux sends it: RDMA_MSG, one read chunk of one segment at position 0x80, no write list,
    /// no reply chunk, then the inline call; bytes written out by hand from RFC 8166 §4.3's layout.
    #[test]
    fn a_write_call_decodes_from_hand_made_bytes() {
        let mut m = words(&[0x11223344, 1, 32, RDMA_MSG, 1, 0x80, 0xabcd, 8192, 0x0000_7f00, 0x1000_0000, 0, 0, 0]);
        m.extend_from_slice(&[9u8; 0x84]);
        let Decoded::Call(h, inline) = decode(&m, &HeaderLimits::default()).unwrap() else { panic!("a call") };
        assert_eq!((h.xid, h.credits, h.nomsg), (0x11223344, 32, false));
        let seg = Segment { handle: 0xabcd, length: 8192, offset: 0x7f00_1000_0000 };
        assert_eq!(h.reads, vec![ReadSegment { position: 0x80, target: seg }]);
        assert!(h.writes.is_empty() && h.reply_chunk.is_none());
        assert_eq!(inline.len(), 0x84);
        assert_eq!((h.read_position(), h.read_bytes()), (Some(0x80), 8192));
    }

    /// An NFS READ: one write chunk of two segments and a reply chunk of one.
    #[test]
    fn a_read_call_with_write_and_reply_chunks_decodes() {
        let mut m =
            words(&[7, 1, 128, RDMA_MSG, 0, 1, 2, 1, 4096, 0, 0x100, 2, 4096, 0, 0x200, 0, 1, 1, 3, 512, 0, 0x300]);
        m.extend_from_slice(&[0; 8]);
        let Decoded::Call(h, inline) = decode(&m, &HeaderLimits::default()).unwrap() else { panic!("a call") };
        assert_eq!(
            h.writes,
            vec![vec![
                Segment { handle: 1, length: 4096, offset: 0x100 },
                Segment { handle: 2, length: 4096, offset: 0x200 }
            ]]
        );
        assert_eq!(h.reply_chunk, Some(vec![Segment { handle: 3, length: 512, offset: 0x300 }]));
        assert_eq!(inline, &[0; 8]);
    }

    #[test]
    fn a_long_call_comes_as_nomsg_with_a_position_zero_chunk() {
        let m = words(&[5, 1, 8, RDMA_NOMSG, 1, 0, 4, 2000, 0, 0x40, 0, 0, 0]);
        let Decoded::Call(h, inline) = decode(&m, &HeaderLimits::default()).unwrap() else { panic!("a call") };
        assert!(h.nomsg && inline.is_empty());
        assert_eq!(h.read_position(), Some(0));
    }

    #[test]
    fn every_refusal_gets_its_answer() {
        let lim =
            HeaderLimits { read_segments_max: 2, write_chunks_max: 1, chunk_segments_max: 2, chunk_bytes_max: 10_000 };
        let refuse = |w: &[u32]| decode(&words(w), &lim).unwrap_err();
        assert_eq!(decode(&[0; 7], &lim).unwrap_err(), ChunkError::NoXid(7));
        assert_eq!(ChunkError::NoXid(7).reply(1), None);
        let v = refuse(&[9, 2, 1, RDMA_MSG, 0, 0, 0]);
        assert_eq!(v, ChunkError::Version { xid: 9, vers: 2 });
        assert_eq!(v.reply(4).unwrap(), words(&[9, 1, 4, RDMA_ERROR, ERR_VERS, 1, 1]));
        let chunk_err = words(&[9, 1, 4, RDMA_ERROR, ERR_CHUNK]);
        for bad in [
            refuse(&[9, 1, 1, RDMA_MSGP, 0, 0, 0]),
            refuse(&[9, 1, 1, RDMA_DONE]),
            refuse(&[9, 1, 1, 77]),
            // Truncated: the read list's bool is missing, a segment is cut short, a bool is 2.
            refuse(&[9, 1, 1, RDMA_MSG]),
            refuse(&[9, 1, 1, RDMA_MSG, 1, 4, 1, 100]),
            refuse(&[9, 1, 1, RDMA_MSG, 2, 0, 0]),
            // Three read segments (limit 2), a read chunk over 10 000 bytes.
            refuse(&[9, 1, 1, RDMA_MSG, 1, 4, 1, 1, 0, 0, 1, 4, 1, 1, 0, 0, 1, 4, 1, 1, 0, 0, 0, 0, 0]),
            refuse(&[9, 1, 1, RDMA_MSG, 1, 4, 1, 6000, 0, 0, 1, 4, 1, 6000, 0, 0, 0, 0, 0]),
            // Two read chunks at different positions; a misaligned position; position past the inline bytes.
            refuse(&[9, 1, 1, RDMA_MSG, 1, 4, 1, 1, 0, 0, 1, 8, 1, 1, 0, 0, 0, 0, 0, 0, 0]),
            refuse(&[9, 1, 1, RDMA_MSG, 1, 6, 1, 1, 0, 0, 0, 0, 0, 0, 0]),
            refuse(&[9, 1, 1, RDMA_MSG, 1, 8, 1, 1, 0, 0, 0, 0, 0, 0]),
            // RDMA_MSG at position 0; RDMA_NOMSG not at 0, without a chunk, with inline bytes.
            refuse(&[9, 1, 1, RDMA_MSG, 1, 0, 1, 1, 0, 0, 0, 0, 0]),
            refuse(&[9, 1, 1, RDMA_NOMSG, 1, 4, 1, 1, 0, 0, 0, 0, 0]),
            refuse(&[9, 1, 1, RDMA_NOMSG, 0, 0, 0]),
            refuse(&[9, 1, 1, RDMA_NOMSG, 0, 0, 1, 1, 1, 10, 0, 0]),
            refuse(&[9, 1, 1, RDMA_NOMSG, 1, 0, 1, 1, 0, 0, 0, 0, 0, 7]),
            // Two write chunks (limit 1); three segments in one (limit 2); a count the bytes cannot hold.
            refuse(&[9, 1, 1, RDMA_MSG, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]),
            refuse(&[9, 1, 1, RDMA_MSG, 0, 1, 3, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0]),
            refuse(&[9, 1, 1, RDMA_MSG, 0, 0, 1, 2, 1, 1]),
            // A reply chunk over 10 000 bytes; a segment whose offset + length wraps.
            refuse(&[9, 1, 1, RDMA_MSG, 0, 0, 1, 2, 1, 6000, 0, 0, 1, 6000, 0, 0]),
            refuse(&[9, 1, 1, RDMA_MSG, 0, 1, 1, 1, 16, 0xffff_ffff, 0xffff_fff8, 0, 0]),
        ] {
            assert_eq!(bad.reply(4).as_deref(), Some(&chunk_err[..]), "{bad}");
        }
        assert_eq!(decode(&words(&[9, 1, 1, RDMA_ERROR, ERR_CHUNK]), &lim).unwrap(), Decoded::ClientError { xid: 9 });
    }

    #[test]
    fn reply_headers_encode_as_rfc_8166_lays_them_out() {
        let seg = Segment { handle: 1, length: 100, offset: 0x0000_0002_0000_0003 };
        assert_eq!(encode_reply_header(5, 32, false, &[], None), words(&[5, 1, 32, RDMA_MSG, 0, 0, 0]));
        assert_eq!(
            encode_reply_header(5, 32, false, &[vec![seg]], None),
            words(&[5, 1, 32, RDMA_MSG, 0, 1, 1, 1, 100, 2, 3, 0, 0])
        );
        assert_eq!(
            encode_reply_header(5, 32, true, &[], Some(&[seg])),
            words(&[5, 1, 32, RDMA_NOMSG, 0, 0, 1, 1, 1, 100, 2, 3])
        );
        // What the server sends decodes (as a header) to the same chunks.
        let m = encode_reply_header(6, 1, false, &[vec![seg, seg]], Some(&[seg]));
        let Decoded::Call(h, _) = decode(&m, &HeaderLimits::default()).unwrap() else { panic!() };
        assert_eq!((h.writes, h.reply_chunk), (vec![vec![seg, seg]], Some(vec![seg])));
    }

    #[test]
    fn private_data_round_trips_and_rejects_others() {
        let p = PrivateData { remote_invalidate: true, send_bytes: 4096, recv_bytes: 4096 };
        let b = p.encode();
        assert_eq!(b, [0xf6, 0xab, 0x0e, 0x18, 1, 1, 3, 3]);
        assert_eq!(PrivateData::decode(&b), Some(p));
        assert_eq!(PrivateData::decode(&[0; 8]), None);
        assert_eq!(PrivateData::decode(&b[..7]), None);
        let mut v2 = b;
        v2[4] = 2;
        assert_eq!(PrivateData::decode(&v2), None);
    }
}
