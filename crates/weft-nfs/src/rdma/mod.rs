//! RPC-over-RDMA version 1 (RFC 8166, NFS binding RFC 8267): the transport header and its chunk lists, pure
//! code with no verbs in it (docs/format.md §25). The verbs and RDMA CM side lives in weft-fabric's `rdma`
//! directory; this module only decides, from what a client sent, what the server may move and where.
//!
//! - [`header`]: decoding a requester's transport header (xid, version, credits, RDMA_MSG / RDMA_NOMSG, read
//!   list, write list, reply chunk) with every count, length and position checked against [`HeaderLimits`]
//!   before use, and encoding the responder's headers (RDMA_MSG, RDMA_NOMSG, RDMA_ERROR) and the RFC 8797
//!   connection private data.
//! - [`chunks`]: where a call's read chunk lands in the reassembled call record, and how a reply is placed:
//!   the READ data into the first write chunk, a long reply into the reply chunk, each cut into pieces that
//!   stay inside the segments the client offered. A reply that does not fit what was offered is refused
//!   ([`chunks::PlaceError`]), never written past a segment.
//!
//! - [`transport`] (feature `rdma`): the RDMA CM listener and per-connection queue pairs that use the above.
//!
//! Trust: the server believes no chunk beyond what the client offered: every RDMA READ and RDMA WRITE it issues
//! comes out of [`chunks`], whose pieces are sub-ranges of the client's segments (handle, offset, length).

pub mod chunks;
pub mod header;
#[cfg(feature = "rdma")]
pub mod transport;

pub use chunks::{CallLayout, Piece, PlaceError, Placement, call_layout, place_reply, reply_header_bytes};
pub use header::{
    ChunkError, Decoded, HeaderLimits, PrivateData, RdmaHeader, ReadSegment, Segment, decode, encode_error_chunk,
    encode_error_vers, encode_reply_header,
};

/// The port NFS over RDMA listens on (RFC 5666 §12, kept by RFC 8166/8267).
pub const NFS_RDMA_PORT: u16 = 20049;
/// The protocol version this module speaks (`rdma_vers`).
pub const RPCRDMA_VERSION: u32 = 1;
/// The inline threshold both directions assume when no RFC 8797 private data says otherwise (RFC 8166 §3.3.2).
pub const INLINE_DEFAULT_BYTES: usize = 1024;
