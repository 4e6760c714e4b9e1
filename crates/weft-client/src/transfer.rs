//! Bulk reads and writes of object ranges on one data server, choosing the transfer by size class and fabric
//! (RPC Read-Write, dissertation ch. 6):
//!
//! - two-sided fabric, or at most `inline_bytes_max`: `Read`/`Write` with the data inline in the message;
//! - one-sided, at most `buffered_bytes_max` (and the arena's buffer size): an arena buffer is the chunk; the client
//!   copies once into or out of it, the server copies out of or into it;
//! - one-sided, larger: the caller's own buffers are the chunks, registered through the session's pin-down cache
//!   ([`weft_rpc::RpcClient::call_with_chunks`]); the server `put`s a read's data into them before replying and
//!   `get`s a write's data at its own pace.
//!
//! Every request carries the file's capability (docs/format.md §10), which the caller passes in.

use bytes::{Bytes, BytesMut};
use weft_fabric::Fabric;
use weft_proto::msg::{
    FencedWriteChunksReq, FencedWriteReq, FillHint, ReadChunksReq, ReadReq, WriteChunksReq, WriteFence, WriteReq,
};
use weft_proto::{Capability, Request, Response};
use weft_rpc::{RpcClient, RpcError};

/// Size classes of bulk transfers on a one-sided fabric (defaults from the PVFS report and dissertation ch. 6):
/// up to `inline_bytes_max` the data rides inline in the message (a registration would cost more than the copy);
/// up to `buffered_bytes_max` it is staged through the client's pre-registered arena (one copy on the client);
/// larger, the server moves it straight from or to the caller's buffer, one transfer unit per request, all units
/// in flight at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SizeClasses {
    pub inline_bytes_max: usize,
    pub buffered_bytes_max: usize,
}

impl Default for SizeClasses {
    fn default() -> Self {
        SizeClasses { inline_bytes_max: 4 << 10, buffered_bytes_max: 64 << 10 }
    }
}

/// Reads `sum(dest lengths)` bytes of object `ino` at `offset` into `dest`, by the size class's method; `fill`
/// asks the server to store the cache-bank blocks it read.
pub(crate) async fn read_object<F: Fabric>(
    ds: &RpcClient<F>,
    classes: SizeClasses,
    ino: u64,
    offset: u64,
    dest: Vec<BytesMut>,
    cap: Capability,
    fill: Option<FillHint>,
) -> Result<Vec<BytesMut>, RpcError> {
    let len: usize = dest.iter().map(|d| d.len()).sum();
    let arena = if len > classes.inline_bytes_max { ds.arena() } else { None };
    let Some(arena) = arena else {
        let req = Request::Read(ReadReq { ino, offset, len: len as u32, cap, fill });
        return ds.call(req, Vec::new(), dest).await.map(|(_, d)| d);
    };
    if len <= classes.buffered_bytes_max.min(arena.buf_bytes()) {
        let buf = arena.acquire(len).await;
        let req = Request::ReadChunks(ReadChunksReq { ino, offset, chunks: vec![buf.chunk(0, len)], cap, fill });
        ds.call(req, Vec::new(), Vec::new()).await?;
        let mut dest = dest;
        let mut at = 0;
        for d in dest.iter_mut() {
            let n = d.len();
            buf.copy_out(at, &mut d[..]);
            at += n;
        }
        return Ok(dest);
    }
    let (_, dest) = ds
        .call_with_chunks(dest, |chunks| {
            Request::ReadChunks(ReadChunksReq { ino, offset, chunks, cap: cap.clone(), fill })
        })
        .await?;
    Ok(dest)
}

/// Writes the concatenation of `data` at `offset` of object `ino`; returns the bytes written.
pub(crate) async fn write_object<F: Fabric>(
    ds: &RpcClient<F>,
    classes: SizeClasses,
    (ino, fence): (u64, WriteFence),
    offset: u64,
    data: Vec<Bytes>,
    cap: Capability,
) -> Result<u32, RpcError> {
    let len: usize = data.iter().map(|d| d.len()).sum();
    let arena = if len > classes.inline_bytes_max { ds.arena() } else { None };
    let written = |r: Response| match r {
        Response::Write(n) | Response::WriteChunks(n) | Response::FencedWrite(n) | Response::FencedWriteChunks(n) => {
            Ok(n)
        }
        other => Err(RpcError::Protocol {
            addr: ds.addr().to_string(),
            source: weft_proto::FrameError::BadBody { op: other.op() as u16, reason: "not a write reply".into() },
        }),
    };
    let Some(arena) = arena else {
        let req = match fence {
            WriteFence::NONE => Request::Write(WriteReq { ino, offset, cap }),
            fence => Request::FencedWrite(FencedWriteReq { ino, offset, cap, fence }),
        };
        return written(ds.call(req, data, Vec::new()).await?.0);
    };
    if len <= classes.buffered_bytes_max.min(arena.buf_bytes()) {
        let mut buf = arena.acquire(len).await;
        let mut at = 0;
        for d in &data {
            buf.copy_in(at, d);
            at += d.len();
        }
        let req = write_chunks_req(ino, offset, vec![buf.chunk(0, len)], cap, fence);
        return written(ds.call(req, Vec::new(), Vec::new()).await?.0);
    }
    // The server only reads these chunks (it `get`s the data), as `Bytes` buffers require.
    let (r, _) = ds.call_with_chunks(data, |chunks| write_chunks_req(ino, offset, chunks, cap.clone(), fence)).await?;
    written(r)
}

/// `WriteChunks`, or `FencedWriteChunks` for a mirror copy (docs/format.md §32).
fn write_chunks_req(
    ino: u64,
    offset: u64,
    chunks: Vec<weft_proto::Chunk>,
    cap: Capability,
    fence: WriteFence,
) -> Request {
    match fence {
        WriteFence::NONE => Request::WriteChunks(WriteChunksReq { ino, offset, chunks, cap }),
        fence => Request::FencedWriteChunks(FencedWriteChunksReq { ino, offset, chunks, cap, fence }),
    }
}
