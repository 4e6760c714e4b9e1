//! The data server's RPC service: [`DataService::call`] matches the op and hands it to one method per op over the
//! [`ObjectStore`].
//!
//! Disk I/O runs on tokio's blocking pool so the network side keeps receiving the next transfer unit while the
//! disk writes (or reads) this one: with the client keeping several units in flight, disk and network overlap.
//! Small reads and writes (up to [`INLINE_IO_BYTES_MAX`]) run in place instead, see `DataService::read_inline`.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::warn;
use weft_fabric::PeerMemory;
use weft_proto::msg::{InoReq, ReadChunksReq, ReadReq, TruncateReq, WriteChunksReq, WriteReq};
use weft_proto::{Chunk, ErrorCode, Request, Response, WireError};
use weft_rpc::{BufferPool, CallCtx, PoolBuf, Reply, ReplyData, Service};

use crate::config::{DEFAULT_PIPELINE_PIECE_BYTES, DEFAULT_RDMA_PIPELINE_PIECE_BYTES};
use crate::pipeline::{self, Piece, join_error, memory_error};
use crate::store::{DataError, MappedRead, ObjectStore};

/// Reads and writes up to this size run on the runtime worker that received them, without a mapping or a
/// hand-off to the blocking pool (see `DataService::read_inline`).
pub const INLINE_IO_BYTES_MAX: u32 = 64 << 10;

pub struct DataService {
    store: Arc<ObjectStore>,
    /// Reads served from mappings in flight at once: each pins its pages and a mapping until its reply is sent.
    mapped_reads: Arc<Semaphore>,
    /// See [`DataConfig::short_circuit`](crate::DataConfig::short_circuit).
    short_circuit: bool,
    /// See [`DataConfig::pipeline_piece_bytes`](crate::DataConfig::pipeline_piece_bytes) and
    /// [`DataConfig::rdma_pipeline_piece_bytes`](crate::DataConfig::rdma_pipeline_piece_bytes).
    piece_bytes: u64,
    rdma_piece_bytes: u64,
}

impl DataService {
    /// `mapped_reads_max` bounds the reads served from page-cache mappings at once (the copying path is bounded
    /// by the RPC server's buffer pool).
    pub fn new(store: Arc<ObjectStore>, mapped_reads_max: u32) -> DataService {
        DataService {
            store,
            mapped_reads: Arc::new(Semaphore::new(mapped_reads_max.max(1) as usize)),
            short_circuit: false,
            piece_bytes: u64::from(DEFAULT_PIPELINE_PIECE_BYTES),
            rdma_piece_bytes: u64::from(DEFAULT_RDMA_PIPELINE_PIECE_BYTES),
        }
    }

    /// See [`DataConfig::pipeline_piece_bytes`](crate::DataConfig::pipeline_piece_bytes); rounded down to whole
    /// 4 KiB blocks, at least one.
    pub fn with_pipeline_piece_bytes(mut self, bytes: u32) -> DataService {
        self.piece_bytes = (u64::from(bytes) / 4096).max(1) * 4096;
        self
    }

    /// See [`DataConfig::rdma_pipeline_piece_bytes`](crate::DataConfig::rdma_pipeline_piece_bytes); rounded as
    /// above.
    pub fn with_rdma_pipeline_piece_bytes(mut self, bytes: u32) -> DataService {
        self.rdma_piece_bytes = (u64::from(bytes) / 4096).max(1) * 4096;
        self
    }

    /// Benchmarks only: see [`DataConfig::short_circuit`](crate::DataConfig::short_circuit).
    pub fn with_short_circuit(mut self, on: bool) -> DataService {
        self.short_circuit = on;
        self
    }

    // ---- One method per op --------------------------------------------------------------------------------------

    /// `Read`: the bytes go back as the reply's payload.
    async fn read(&self, ctx: &CallCtx, r: ReadReq) -> Result<Reply, WireError> {
        fits_transfer_unit(ctx, "read", u64::from(r.len))?;
        if let Some(buf) = self.read_inline(ctx, r.ino, r.offset, u64::from(r.len)).await? {
            return Ok(Reply { resp: Response::Read(()), data: Some(Box::new(buf)) });
        }
        // Larger ranges inside the object: verified and sent straight from the page cache.
        let permit = self.mapped_reads.clone().acquire_owned().await.expect("never closed");
        let mapped = {
            let store = self.store.clone();
            on_blocking_pool(move || store.read_mapped(r.ino, r.offset, u64::from(r.len))).await?
        };
        if let Some(read) = mapped {
            return Ok(Reply { resp: Response::Read(()), data: Some(Box::new(MappedReply { read, _permit: permit })) });
        }
        drop(permit);
        // Past the object's end or a missing object: copy into a pool buffer, filling zeros.
        let mut buf = ctx.pool.acquire(r.len as usize).await;
        let store = self.store.clone();
        let buf = on_blocking_pool(move || store.read(r.ino, r.offset, buf.as_mut_slice()).map(|()| buf)).await?;
        Ok(Reply { resp: Response::Read(()), data: Some(Box::new(buf)) })
    }

    /// `ReadChunks`: the server puts the bytes into the client's memory, then replies.
    async fn read_chunks(&self, ctx: &CallCtx, r: ReadChunksReq) -> Result<Reply, WireError> {
        let (memory, len) = checked_chunks(ctx, "read", &r.chunks)?;
        if let Some(buf) = self.read_inline(ctx, r.ino, r.offset, len).await? {
            memory.put(&r.chunks, buf.as_slice()).map_err(|e| memory_error(&ctx.peer, e))?;
            return Ok(Response::ReadChunks(()).into());
        }
        // A fabric that reaches any server memory (shm) is served from page-cache mappings, straight into the
        // client's memory; one that needs registered memory (rdma) from pool buffers in the zones.
        let map = !memory.wants_zone_buffers();
        let _permit = match map {
            true => Some(self.mapped_reads.clone().acquire_owned().await.expect("never closed")),
            false => None,
        };
        let (pieces, bufs) = self.pieces(ctx, &*memory, &r.chunks, r.offset).await?;
        pipeline::read_chunks(self.store.clone(), memory, ctx.peer.clone(), r.ino, pieces, bufs, map).await?;
        Ok(Response::ReadChunks(()).into())
    }

    /// `WriteChunks`: the server gets the bytes from the client's memory when it has a buffer for them (its own
    /// pace, its own memory) and writes them.
    async fn write_chunks(&self, ctx: &CallCtx, w: WriteChunksReq) -> Result<Reply, WireError> {
        let (memory, len) = checked_chunks(ctx, "write", &w.chunks)?;
        if self.short_circuit {
            return Ok(Response::WriteChunks(len as u32).into());
        }
        if len <= u64::from(INLINE_IO_BYTES_MAX) {
            let mut buf = ctx.pool.acquire(len as usize).await;
            memory.get(&w.chunks, buf.as_mut_slice()).map_err(|e| memory_error(&ctx.peer, e))?;
            self.store.write(w.ino, w.offset, buf.as_slice()).map_err(WireError::from)?;
            return Ok(Response::WriteChunks(len as u32).into());
        }
        let (pieces, bufs) = self.pieces(ctx, &*memory, &w.chunks, w.offset).await?;
        pipeline::write_chunks(self.store.clone(), memory, ctx.peer.clone(), w.ino, pieces, bufs).await?;
        Ok(Response::WriteChunks(len as u32).into())
    }

    /// `Write`: the bytes came as the request's payload.
    async fn write(&self, w: WriteReq, data: Option<PoolBuf>) -> Result<Reply, WireError> {
        let buf = data.ok_or_else(|| WireError::new(ErrorCode::BadRequest, "write without a payload"))?;
        let n = buf.len() as u32;
        if self.short_circuit {
            return Ok(Response::Write(n).into());
        }
        if n <= INLINE_IO_BYTES_MAX {
            // As small reads: a page-cache write takes less than the hand-off to the blocking pool.
            self.store.write(w.ino, w.offset, buf.as_slice()).map_err(WireError::from)?;
        } else {
            let store = self.store.clone();
            on_blocking_pool(move || store.write(w.ino, w.offset, buf.as_slice())).await?;
        }
        Ok(Response::Write(n).into())
    }

    async fn truncate(&self, t: TruncateReq) -> Result<Reply, WireError> {
        let store = self.store.clone();
        on_blocking_pool(move || store.truncate(t.ino, t.size)).await?;
        Ok(Response::Truncate(()).into())
    }

    async fn remove_object(&self, r: InoReq) -> Result<Reply, WireError> {
        let store = self.store.clone();
        on_blocking_pool(move || store.remove(r.ino)).await?;
        Ok(Response::RemoveObject(()).into())
    }

    async fn fsync(&self, r: InoReq) -> Result<Reply, WireError> {
        if !self.short_circuit {
            let store = self.store.clone();
            on_blocking_pool(move || store.fsync(r.ino)).await?;
        }
        Ok(Response::Fsync(()).into())
    }

    async fn space_stat(&self) -> Result<Reply, WireError> {
        let store = self.store.clone();
        let s = on_blocking_pool(move || store.space()).await?;
        Ok(Response::SpaceStat(s).into())
    }

    // ---- Shared by the ops --------------------------------------------------------------------------------------

    /// The small-read choice of `Read` and `ReadChunks`: a read of up to [`INLINE_IO_BYTES_MAX`] bytes (or any
    /// read, short-circuited) is read into a pool buffer right here and returned; a larger one is `None`, left to
    /// the caller's mapped or pipelined path.
    ///
    /// Why in place: for random I/O, mapping a few pages costs more (mmap, populate, munmap and its TLB
    /// shootdown) than copying them, and a hand-off to the blocking pool costs two thread wake-ups, more than a
    /// page-cache read. A cache miss holds this worker for one small disk read. Short-circuited, the buffer is
    /// zeros.
    async fn read_inline(&self, ctx: &CallCtx, ino: u64, offset: u64, len: u64) -> Result<Option<PoolBuf>, WireError> {
        if !self.short_circuit && len > u64::from(INLINE_IO_BYTES_MAX) {
            return Ok(None);
        }
        let mut buf = ctx.pool.acquire(len as usize).await;
        if self.short_circuit {
            buf.as_mut_slice().fill(0);
        } else {
            self.store.read(ino, offset, buf.as_mut_slice()).map_err(WireError::from)?;
        }
        Ok(Some(buf))
    }

    /// A one-sided transfer of `chunks` at object `offset` cut into pieces, with the buffers to move them through.
    async fn pieces(
        &self,
        ctx: &CallCtx,
        memory: &dyn PeerMemory,
        chunks: &[Chunk],
        offset: u64,
    ) -> Result<(Vec<Piece>, Vec<PoolBuf>), WireError> {
        let pieces = pipeline::split(chunks, offset, self.piece_bytes_for(memory)).map_err(bad_pieces)?;
        let piece_max = pieces.iter().map(|p| p.len).max().unwrap_or(0) as usize;
        let bufs = piece_buffers(&ctx.pool, pieces.len(), piece_max).await;
        Ok((pieces, bufs))
    }

    /// The piece size for transfers with `memory`'s fabric.
    fn piece_bytes_for(&self, memory: &dyn PeerMemory) -> u64 {
        if memory.wants_zone_buffers() { self.rdma_piece_bytes } else { self.piece_bytes }
    }
}

impl Service for DataService {
    async fn call(&self, ctx: &CallCtx, req: Request, data: Option<PoolBuf>) -> Result<Reply, WireError> {
        match req {
            Request::Read(r) => self.read(ctx, r).await,
            Request::ReadChunks(r) => self.read_chunks(ctx, r).await,
            Request::WriteChunks(w) => self.write_chunks(ctx, w).await,
            Request::Write(w) => self.write(w, data).await,
            Request::Truncate(t) => self.truncate(t).await,
            Request::RemoveObject(r) => self.remove_object(r).await,
            Request::Fsync(r) => self.fsync(r).await,
            Request::SpaceStat(()) => self.space_stat().await,
            other => {
                Err(WireError::new(ErrorCode::BadRequest, format!("{:?} is not served by a data server", other.op())))
            }
        }
    }
}

/// A mapped read on its way out: the mapping and its range lock live until the reply is sent.
struct MappedReply {
    read: MappedRead,
    _permit: OwnedSemaphorePermit,
}

impl ReplyData for MappedReply {
    fn as_bytes(&self) -> &[u8] {
        self.read.as_bytes()
    }
}

/// Runs a store call on tokio's blocking pool.
async fn on_blocking_pool<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DataError> + Send + 'static,
) -> Result<T, WireError> {
    tokio::task::spawn_blocking(f).await.map_err(join_error)?.map_err(WireError::from)
}

/// Refuses a transfer (`what` is "read" or "write") larger than a transfer unit.
fn fits_transfer_unit(ctx: &CallCtx, what: &str, len: u64) -> Result<(), WireError> {
    if len > ctx.pool.buf_bytes() as u64 {
        return Err(WireError::new(
            ErrorCode::OutOfRange,
            format!("{what} of {len} bytes exceeds the transfer unit of {}", ctx.pool.buf_bytes()),
        ));
    }
    Ok(())
}

/// The client memory a chunk list names and the list's length, once the list is checked: refused before the disk
/// is touched if the connection has no one-sided fabric, the transfer exceeds a unit, or a chunk lies outside the
/// client's registered regions.
fn checked_chunks(ctx: &CallCtx, what: &str, chunks: &[Chunk]) -> Result<(Arc<dyn PeerMemory>, u64), WireError> {
    let memory = one_sided(ctx)?;
    let len: u64 = chunks.iter().map(|c| u64::from(c.len)).sum();
    fits_transfer_unit(ctx, what, len)?;
    memory.check(chunks, len).map_err(|e| refuse_chunks(ctx, e))?;
    Ok((memory, len))
}

/// Two buffers for a pipelined transfer of `pieces` pieces, the largest `piece_max` bytes (one for a single
/// piece, or if the pool has no class that can lend a pair: the stages then alternate instead of overlapping).
async fn piece_buffers(pool: &BufferPool, pieces: usize, piece_max: usize) -> Vec<PoolBuf> {
    if pieces < 2 {
        return vec![pool.acquire(piece_max).await];
    }
    match pool.acquire_pair(piece_max).await {
        Some((a, b)) => vec![a, b],
        None => vec![pool.acquire(piece_max).await],
    }
}

fn one_sided(ctx: &CallCtx) -> Result<Arc<dyn PeerMemory>, WireError> {
    ctx.memory.clone().ok_or_else(|| {
        WireError::new(ErrorCode::BadRequest, "chunk lists need a one-sided fabric; this connection has none")
    })
}

fn bad_pieces(e: pipeline::PieceError) -> WireError {
    WireError::new(ErrorCode::BadRequest, format!("chunk list refused: {e}"))
}

/// A chunk outside the client's registered regions: refused, logged, and nothing was read or written.
fn refuse_chunks(ctx: &CallCtx, e: weft_proto::ChunkError) -> WireError {
    warn!(peer = %ctx.peer, "refusing a chunk list: {e}");
    WireError::new(ErrorCode::BadRequest, format!("chunk list refused: {e}"))
}

#[cfg(test)]
mod tests;
