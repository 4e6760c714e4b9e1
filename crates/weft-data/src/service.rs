//! The data server's RPC service: [`DataService::call`] matches the op and hands it to one method per op over the
//! [`ObjectStore`].
//!
//! Disk I/O runs on tokio's blocking pool so the network side keeps receiving the next transfer unit while the
//! disk writes (or reads) this one: with the client keeping several units in flight, disk and network overlap.
//! Small reads and writes (up to [`INLINE_IO_BYTES_MAX`]) run in place instead, see `DataService::read_inline`.
//!
//! Before any op on an inode runs, [`DataService::admit`] checks the server's lease (`lease.rs`: a client request
//! is served only while the MDS's last heartbeat reply said `Up`, else `StaleLayout`) and the capability it carries
//! (with authentication on): a refused request reads and writes nothing.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::warn;
use weft_fabric::PeerMemory;
use weft_proto::msg::{
    FillHint, FsyncReq, InoReq, ReadChunkRangeReq, ReadChunksReq, ReadReq, ReadRowsReq, TruncateReq, VERIFY_BAD_MAX,
    VERIFY_BYTES_MAX, VerifyReq, VerifyResp, WriteChunkRangeReq, WriteChunksReq, WriteFence, WriteReq, WriteRowsReq,
};
use weft_proto::{Chunk, ErrorCode, Request, Response, Rights, WireError};
use weft_rpc::metrics::FabricBytes;
use weft_rpc::metrics::prometheus_client::metrics::counter::Counter;
use weft_rpc::{BufferPool, CallCtx, Metrics, PoolBuf, Reply, ReplyData, Service};

use crate::cache_fill::{CacheFiller, FillName};
use crate::capabilities::CapabilityGate;
use crate::config::{DEFAULT_PIPELINE_PIECE_BYTES, DEFAULT_RDMA_PIPELINE_PIECE_BYTES};
use crate::lease::LeaseGate;
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
    /// Checks capabilities; `None` with authentication off (nothing is checked).
    gate: Option<Arc<CapabilityGate>>,
    /// The lease to serve clients (stale-layout fencing); `None` serves everyone (a store without an MDS: tests).
    lease: Option<Arc<LeaseGate>>,
    /// The cache bank's fills and invalidations; `None` without a bank caching data.
    filler: Option<Arc<CacheFiller>>,
    /// Counters, when the server exports metrics.
    metrics: Option<DataMetrics>,
}

/// The data server's own series (the RPC server counts requests and latency).
struct DataMetrics {
    /// Object bytes written (in) and read (out), by the fabric the request came over, one-sided transfers included.
    bytes: FabricBytes,
    /// Requests refused by the capability check (or a `RemoveObject` without the cluster key).
    refusals: Counter,
    /// Rows of ec chunks read with their bytes (`ReadRows` with data: read-modify-write, degraded reads, heals).
    ec_rows_read: Counter,
    /// Rows of ec chunks written (`WriteRows`).
    ec_rows_written: Counter,
    /// Ranges of ec chunks written (`WriteChunkRange`: delta parity of small writes).
    ec_ranges_written: Counter,
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
            gate: None,
            lease: None,
            filler: None,
            metrics: None,
        }
    }

    /// Fills the cache bank after reads that ask for it and invalidates it after writes (`cache_fill.rs`).
    pub fn with_cache_filler(mut self, filler: Option<Arc<CacheFiller>>) -> DataService {
        self.filler = filler;
        self
    }

    /// Counts bytes moved and capability refusals into `metrics`.
    pub fn with_metrics(mut self, metrics: Option<&Metrics>) -> DataService {
        self.metrics = metrics.map(|m| DataMetrics {
            bytes: FabricBytes::new(
                m,
                "weft_data_bytes",
                "Object bytes written (in) and read (out) by clients, by fabric (one-sided transfers included)",
            ),
            refusals: m.counter(
                "weft_data_capability_refusals",
                "Requests refused for a missing, expired or wrong capability, without a lease (StaleLayout), or RemoveObject without the cluster key",
            ),
            ec_rows_read: m.counter(
                "weft_data_ec_rows_read_with_bytes",
                "Rows of erasure-coded chunks read with their bytes (read-modify-write of partial rows, degraded reads, heals)",
            ),
            ec_rows_written: m.counter("weft_data_ec_rows_written", "Rows of erasure-coded chunks written"),
            ec_ranges_written: m.counter(
                "weft_data_ec_chunk_ranges_written",
                "Ranges of erasure-coded chunks written without the rest of their row (delta parity of small writes)",
            ),
        });
        self
    }

    /// Checks every request's capability with `gate` (authentication on).
    pub fn with_capability_gate(self, gate: Option<CapabilityGate>) -> DataService {
        self.with_shared_capability_gate(gate.map(Arc::new))
    }

    /// [`DataService::with_capability_gate`] with a gate shared with the pNFS listener (one removed-inode memory).
    pub fn with_shared_capability_gate(mut self, gate: Option<Arc<CapabilityGate>>) -> DataService {
        self.gate = gate;
        self
    }

    /// Serves requests carrying a capability only under `lease` (`lease.rs`), whichever key they proved.
    pub fn with_lease_gate(mut self, lease: Option<Arc<LeaseGate>>) -> DataService {
        self.lease = lease;
        self
    }

    /// The lease and capability checks of a request on an inode, and who may remove objects: only a server of the cluster
    /// (the MDS's orphan collector proves the cluster key). Ops on no inode pass.
    fn admit(&self, ctx: &CallCtx, req: &Request) -> Result<(), WireError> {
        let (ino, rights, cap) = match req {
            Request::Read(r) => (r.ino, Rights::READ, &r.cap),
            Request::ReadChunks(r) => (r.ino, Rights::READ, &r.cap),
            Request::Write(w) => (w.ino, Rights::WRITE, &w.cap),
            Request::WriteChunks(w) => (w.ino, Rights::WRITE, &w.cap),
            Request::Truncate(t) => (t.ino, Rights::WRITE, &t.cap),
            Request::ReadRows(r) => (r.ino, Rights::READ, &r.cap),
            Request::WriteRows(w) => (w.ino, Rights::WRITE, &w.cap),
            Request::ReadChunkRange(r) => (r.ino, Rights::READ, &r.cap),
            Request::WriteChunkRange(w) => (w.ino, Rights::WRITE, &w.cap),
            Request::VerifyObject(v) => (v.ino, Rights::READ, &v.cap),
            Request::FenceWrites(f) => (f.ino, Rights::WRITE, &f.cap),
            // Durability of what is there: either right will do.
            Request::Fsync(f) => (f.ino, Rights::NONE, &f.cap),
            Request::FsyncVerified(f) => (f.ino, Rights::NONE, &f.cap),
            Request::ListObjects(_) => {
                if !ctx.principal.is_trusted_server() {
                    warn!(peer = %ctx.peer, key = ctx.principal.name(),
                        "refusing ListObjects: only the metadata service (cluster key) lists objects");
                    return Err(WireError::new(
                        ErrorCode::NotPermitted,
                        format!(
                            "ListObjects needs the cluster key (this connection proved {:?})",
                            ctx.principal.name()
                        ),
                    ));
                }
                return Ok(());
            }
            Request::RemoveObject(r) => {
                if !ctx.principal.is_trusted_server() {
                    warn!(peer = %ctx.peer, key = ctx.principal.name(), ino = r.ino,
                        "refusing RemoveObject: only the metadata service (cluster key) removes objects");
                    return Err(WireError::new(
                        ErrorCode::NotPermitted,
                        format!(
                            "RemoveObject needs the cluster key (this connection proved {:?})",
                            ctx.principal.name()
                        ),
                    ));
                }
                return Ok(());
            }
            _ => return Ok(()),
        };
        // One question per request: a fenced server (not Up at the MDS, or its lease lapsed) serves no client.
        if let Some(lease) = &self.lease {
            lease.admit(&ctx.peer)?;
        }
        match &self.gate {
            Some(gate) => gate.admit(&ctx.peer, &ctx.principal, ino, rights, cap),
            None => Ok(()),
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
    async fn write_chunks(&self, ctx: &CallCtx, w: WriteChunksReq, fence: WriteFence) -> Result<Reply, WireError> {
        let (memory, len) = checked_chunks(ctx, "write", &w.chunks)?;
        if self.short_circuit {
            return Ok(Response::WriteChunks(len as u32).into());
        }
        if len <= u64::from(INLINE_IO_BYTES_MAX) {
            let mut buf = ctx.pool.acquire(len as usize).await;
            memory.get(&w.chunks, buf.as_mut_slice()).map_err(|e| memory_error(&ctx.peer, e))?;
            self.store.write_fenced(w.ino, w.offset, buf.as_slice(), fence).map_err(WireError::from)?;
            return Ok(Response::WriteChunks(len as u32).into());
        }
        let (pieces, bufs) = self.pieces(ctx, &*memory, &w.chunks, w.offset).await?;
        pipeline::write_chunks(self.store.clone(), memory, ctx.peer.clone(), (w.ino, fence), pieces, bufs).await?;
        Ok(Response::WriteChunks(len as u32).into())
    }

    /// `Write`: the bytes came as the request's payload.
    async fn write(&self, w: WriteReq, data: Option<PoolBuf>, fence: WriteFence) -> Result<Reply, WireError> {
        let buf = data.ok_or_else(|| WireError::new(ErrorCode::BadRequest, "write without a payload"))?;
        let n = buf.len() as u32;
        if self.short_circuit {
            return Ok(Response::Write(n).into());
        }
        if n <= INLINE_IO_BYTES_MAX {
            // As small reads: a page-cache write takes less than the hand-off to the blocking pool.
            self.store.write_fenced(w.ino, w.offset, buf.as_slice(), fence).map_err(WireError::from)?;
        } else {
            let store = self.store.clone();
            on_blocking_pool(move || store.write_fenced(w.ino, w.offset, buf.as_slice(), fence)).await?;
        }
        Ok(Response::Write(n).into())
    }

    /// `ReadRows` (docs/format.md §17): the rows' versions, and with `data` their bytes as the payload.
    async fn read_rows(&self, ctx: &CallCtx, r: ReadRowsReq) -> Result<Reply, WireError> {
        let store = self.store.clone();
        if !r.data {
            let v = on_blocking_pool(move || store.read_rows(r.ino, r.unit, r.first_row, r.rows, None)).await?;
            return Ok(Response::ReadRows(v).into());
        }
        let len = u64::from(r.rows) * u64::from(r.unit);
        fits_transfer_unit(ctx, "read", len)?;
        if let Some(m) = &self.metrics {
            m.ec_rows_read.inc_by(u64::from(r.rows));
        }
        let mut buf = ctx.pool.acquire(len as usize).await;
        let (v, buf) = on_blocking_pool(move || {
            let v = store.read_rows(r.ino, r.unit, r.first_row, r.rows, Some(buf.as_mut_slice()))?;
            Ok((v, buf))
        })
        .await?;
        Ok(Reply { resp: Response::ReadRows(v), data: Some(Box::new(buf)) })
    }

    /// `WriteRows` (docs/format.md §17): compare-and-set of whole chunks and their version records.
    async fn write_rows(&self, w: WriteRowsReq, data: Option<PoolBuf>) -> Result<Reply, WireError> {
        let buf = data.ok_or_else(|| WireError::new(ErrorCode::BadRequest, "WriteRows without a payload"))?;
        let store = self.store.clone();
        let rows = w.rows.len() as u64;
        on_blocking_pool(move || store.write_rows(w.ino, w.unit, w.first_row, &w.rows, buf.as_slice())).await?;
        if let Some(m) = &self.metrics {
            m.ec_rows_written.inc_by(rows);
        }
        Ok(Response::WriteRows(()).into())
    }

    /// `ReadChunkRange` (docs/format.md §17, ranges of a chunk): one row's record and part of its chunk.
    async fn read_chunk_range(&self, ctx: &CallCtx, r: ReadChunkRangeReq) -> Result<Reply, WireError> {
        fits_transfer_unit(ctx, "read", u64::from(r.len))?;
        let mut buf = ctx.pool.acquire(r.len as usize).await;
        let store = self.store.clone();
        let read = move || {
            let v = store.read_chunk_range(r.ino, r.unit, r.row, r.offset, buf.as_mut_slice())?;
            Ok((v, buf))
        };
        // As small reads (`read_inline`): a page-cache read takes less than the hand-off to the blocking pool.
        let (v, buf) = if r.len <= INLINE_IO_BYTES_MAX { read()? } else { on_blocking_pool(read).await? };
        Ok(Reply { resp: Response::ReadChunkRange(v), data: Some(Box::new(buf)) })
    }

    /// `WriteChunkRange` (docs/format.md §17, ranges of a chunk): compare-and-set of part of one row's chunk.
    async fn write_chunk_range(&self, w: WriteChunkRangeReq, data: Option<PoolBuf>) -> Result<Reply, WireError> {
        let buf = data.ok_or_else(|| WireError::new(ErrorCode::BadRequest, "WriteChunkRange without a payload"))?;
        let store = self.store.clone();
        let small = buf.len() <= INLINE_IO_BYTES_MAX as usize;
        let write = move || store.write_chunk_range(w.ino, w.unit, w.row, w.offset, &w.write, buf.as_slice());
        if small {
            write().map_err(WireError::from)?;
        } else {
            on_blocking_pool(write).await?;
        }
        if let Some(m) = &self.metrics {
            m.ec_ranges_written.inc();
        }
        Ok(Response::WriteChunkRange(()).into())
    }

    async fn truncate(&self, t: TruncateReq, fence: WriteFence) -> Result<Reply, WireError> {
        let store = self.store.clone();
        on_blocking_pool(move || store.truncate_fenced(t.ino, t.size, fence)).await?;
        Ok(Response::Truncate(()).into())
    }

    async fn verify(&self, v: VerifyReq) -> Result<Reply, WireError> {
        if v.len > VERIFY_BYTES_MAX {
            return Err(WireError::new(
                ErrorCode::OutOfRange,
                format!("VerifyObject of {} bytes: at most {VERIFY_BYTES_MAX} per request", v.len),
            ));
        }
        let store = self.store.clone();
        let (object_len, bad, bad_more) =
            on_blocking_pool(move || store.verify(v.ino, v.offset, v.len, VERIFY_BAD_MAX)).await?;
        Ok(Response::VerifyObject(VerifyResp { object_len, bad, bad_more }).into())
    }

    async fn remove_object(&self, r: InoReq) -> Result<Reply, WireError> {
        if let Some(gate) = &self.gate {
            gate.removed(r.ino);
        }
        let store = self.store.clone();
        on_blocking_pool(move || store.remove(r.ino)).await?;
        Ok(Response::RemoveObject(()).into())
    }

    async fn fsync(&self, r: FsyncReq) -> Result<Reply, WireError> {
        if weft_rpc::fault::fail_fsync() {
            // Tests only (`WEFT_FAULT=fail-fsync:N`): a disk that cannot flush.
            return Err(WireError::new(ErrorCode::Io, format!("fsync of inode {} failed (fault injection)", r.ino)));
        }
        let delay_ms = weft_rpc::fault::fsync_delay_ms();
        if delay_ms > 0 {
            // Tests only (`WEFT_FAULT=delay-fsync:MS:N`): a slow disk.
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
        }
        if !self.short_circuit {
            let store = self.store.clone();
            on_blocking_pool(move || store.fsync(r.ino)).await?;
        }
        Ok(Response::Fsync(()).into())
    }

    /// `Fsync`, answered with the write verifier (docs/format.md §33).
    async fn fsync_verified(&self, r: FsyncReq) -> Result<Reply, WireError> {
        self.fsync(r).await?;
        Ok(Response::FsyncVerified(crate::verifier::write_verifier()).into())
    }

    async fn space_stat(&self) -> Result<Reply, WireError> {
        let store = self.store.clone();
        let s = on_blocking_pool(move || store.space()).await?;
        Ok(Response::SpaceStat(s).into())
    }

    async fn space_stat_dev(&self) -> Result<Reply, WireError> {
        let store = self.store.clone();
        let s = on_blocking_pool(move || store.space_dev()).await?;
        Ok(Response::SpaceStatDev(s).into())
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
        // A fenced op is its unfenced op plus the fence it carries (docs/format.md §32): admitted, counted and
        // invalidated the same way.
        let (req, fence) = split_fence(req);
        if let Some(gate) = weft_rpc::fault::write_gate()
            && matches!(req, Request::Write(_) | Request::WriteChunks(_) | Request::Truncate(_))
        {
            // Tests only (`WEFT_FAULT=gate-writes:PATH`): the write waits, before anything, while the gate is shut.
            while gate.exists() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
        if let Err(e) = self.admit(ctx, &req) {
            if let Some(m) = &self.metrics {
                m.refusals.inc();
            }
            return Err(e);
        }
        // (inbound, bytes) of a transfer, counted once it succeeded.
        let moved = match &req {
            Request::Write(_) => Some((true, data.as_ref().map_or(0, |d| d.len() as u64))),
            Request::WriteChunks(w) => Some((true, chunk_bytes(&w.chunks))),
            Request::Read(r) => Some((false, u64::from(r.len))),
            Request::ReadChunks(r) => Some((false, chunk_bytes(&r.chunks))),
            _ => None,
        };
        let writes_ino = match &req {
            Request::Write(w) => Some(w.ino),
            Request::WriteChunks(w) => Some(w.ino),
            Request::Truncate(t) => Some(t.ino),
            Request::WriteRows(w) => Some(w.ino),
            Request::WriteChunkRange(w) => Some(w.ino),
            _ => None,
        };
        let bank = match &self.filler {
            Some(filler) => self.before_bank(filler, &req, data.as_ref()),
            None => BankWork::None,
        };
        let r = self.run(ctx, req, data, fence).await;
        if let (Some(filler), Ok(_)) = (&self.filler, &r) {
            match bank {
                BankWork::None => {}
                // Offered once the reply is ready: the worker reads and stores while the reply goes out.
                BankWork::Fill { ino, hint, offset, len } => filler.fill(ino, hint, offset, len),
                // Once the bytes are in the store, before the reply: a full queue holds the reply back.
                BankWork::Invalidate { ino, offset, len } => filler.invalidate(ino, offset, len).await,
            }
        }
        if let (Some(m), Some((inbound, bytes)), Ok(_)) = (&self.metrics, moved, &r) {
            m.bytes.add(weft_rpc::metrics::fabric_index_of(ctx.fabric), inbound, bytes);
        }
        // Admitted before the object's removal and finished after it: the object it recreated goes again, so no
        // object outlives its orphan record.
        if let (Some(ino), Some(gate)) = (writes_ino, &self.gate)
            && gate.was_removed(ino)
        {
            let store = self.store.clone();
            on_blocking_pool(move || store.remove(ino)).await?;
            return Err(weft_rpc::Refusal::Removed(ino).to_wire());
        }
        r
    }
}

/// What the cache bank needs done after an op (see [`DataService::before_bank`]).
enum BankWork {
    None,
    Fill { ino: u64, hint: FillName, offset: u64, len: u64 },
    Invalidate { ino: u64, offset: u64, len: u64 },
}

impl DataService {
    /// Before an admitted op runs: a read that asks for a fill names it ([`fill_version`]) and records the name
    /// (so a write from now on deletes what it fills); a write or a shrinking truncate names the object range
    /// whose cached blocks it changes.
    fn before_bank(&self, filler: &CacheFiller, req: &Request, data: Option<&PoolBuf>) -> BankWork {
        let (ino, hint, offset, len) = match req {
            Request::Read(r) => (r.ino, fill_version(r.fill, &r.cap), r.offset, u64::from(r.len)),
            Request::ReadChunks(r) => {
                let len = r.chunks.iter().map(|c| u64::from(c.len)).sum();
                (r.ino, fill_version(r.fill, &r.cap), r.offset, len)
            }
            Request::Write(w) => {
                return BankWork::Invalidate { ino: w.ino, offset: w.offset, len: data.map_or(0, |d| d.len() as u64) };
            }
            Request::WriteChunks(w) => {
                let len = w.chunks.iter().map(|c| u64::from(c.len)).sum();
                return BankWork::Invalidate { ino: w.ino, offset: w.offset, len };
            }
            Request::WriteRows(w) => {
                let offset = w.first_row.saturating_mul(u64::from(w.unit));
                return BankWork::Invalidate { ino: w.ino, offset, len: data.map_or(0, |d| d.len() as u64) };
            }
            Request::WriteChunkRange(w) => {
                let offset = w.row.saturating_mul(u64::from(w.unit)).saturating_add(u64::from(w.offset));
                return BankWork::Invalidate { ino: w.ino, offset, len: data.map_or(0, |d| d.len() as u64) };
            }
            Request::Truncate(t) => {
                // Growing only adds zeros past the old end, which a short cached block already stands for.
                let old = self.store.object_len(t.ino).unwrap_or(u64::MAX);
                let len = old.saturating_sub(t.size);
                return BankWork::Invalidate { ino: t.ino, offset: t.size, len };
            }
            _ => return BankWork::None,
        };
        let Some(data_version) = hint else { return BankWork::None };
        let hint = filler.name(data_version);
        filler.saw(ino, hint);
        BankWork::Fill { ino, hint, offset, len }
    }

    /// One op, admitted.
    async fn run(
        &self,
        ctx: &CallCtx,
        req: Request,
        data: Option<PoolBuf>,
        fence: WriteFence,
    ) -> Result<Reply, WireError> {
        match req {
            Request::Read(r) => self.read(ctx, r).await,
            Request::ReadChunks(r) => self.read_chunks(ctx, r).await,
            Request::WriteChunks(w) => self.write_chunks(ctx, w, fence).await,
            Request::Write(w) => self.write(w, data, fence).await,
            Request::Truncate(t) => self.truncate(t, fence).await,
            Request::FenceWrites(f) => {
                let store = self.store.clone();
                let resp = on_blocking_pool(move || store.fence(f.ino, f.act)).await?;
                Ok(Response::FenceWrites(resp).into())
            }
            Request::ReadRows(r) => self.read_rows(ctx, r).await,
            Request::WriteRows(w) => self.write_rows(w, data).await,
            Request::ReadChunkRange(r) => self.read_chunk_range(ctx, r).await,
            Request::WriteChunkRange(w) => self.write_chunk_range(w, data).await,
            Request::RemoveObject(r) => self.remove_object(r).await,
            Request::ListObjects(r) => {
                let store = self.store.clone();
                let limit = r.limit.min(weft_proto::msg::LIST_OBJECTS_MAX) as usize;
                let (inos, eof) = on_blocking_pool(move || store.list_objects(r.after, limit)).await?;
                Ok(Response::ListObjects(weft_proto::msg::ListObjectsResp { inos, eof }).into())
            }
            Request::Fsync(r) => self.fsync(r).await,
            Request::FsyncVerified(r) => self.fsync_verified(r).await,
            Request::WriteVerifier(()) => Ok(Response::WriteVerifier(crate::verifier::write_verifier()).into()),
            Request::SpaceStat(()) => self.space_stat().await,
            Request::SpaceStatDev(()) => self.space_stat_dev().await,
            Request::VerifyObject(v) => self.verify(v).await,
            other => {
                Err(WireError::new(ErrorCode::BadRequest, format!("{:?} is not served by a data server", other.op())))
            }
        }
    }
}

/// A fenced op as its unfenced op and the fence it carries; any other op with [`WriteFence::NONE`].
fn split_fence(req: Request) -> (Request, WriteFence) {
    match req {
        Request::FencedWrite(w) => (Request::Write(WriteReq { ino: w.ino, offset: w.offset, cap: w.cap }), w.fence),
        Request::FencedTruncate(t) => {
            (Request::Truncate(TruncateReq { ino: t.ino, size: t.size, cap: t.cap }), t.fence)
        }
        Request::FencedWriteChunks(w) => {
            let chunks = WriteChunksReq { ino: w.ino, offset: w.offset, chunks: w.chunks, cap: w.cap };
            (Request::WriteChunks(chunks), w.fence)
        }
        other => (other, WriteFence::NONE),
    }
}

/// The data version a read's fill goes under: the one the MDS sealed into the read's capability, never the
/// reader's claim, so a reader cannot plant what it read under a version other readers will ask for
/// (docs/format.md §12). Only with authentication off (an empty capability, which the gate then lets through)
/// is the hint's own version used. `None`: the read asked for no fill.
fn fill_version(hint: Option<FillHint>, cap: &weft_proto::Capability) -> Option<u64> {
    let hint = hint?;
    Some(if cap.is_none() { hint.data_version } else { cap.data_version })
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

/// Bytes a chunk list names (saturating: the list was not checked yet, and this is only a count).
fn chunk_bytes(chunks: &[Chunk]) -> u64 {
    chunks.iter().fold(0u64, |n, c| n.saturating_add(u64::from(c.len)))
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
mod tests {
    //! The pipelined one-sided path against a client memory held in this process, so a test can see every `get`
    //! and `put`, make one fail, and check that rdma-style transfers only touch buffers inside announced zones.

    use std::path::PathBuf;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use weft_fabric::MemoryError;
    use weft_proto::{ChunkError, Region};

    use super::*;
    use crate::{DataConfig, PoolClassConfig};

    const K: usize = 1024;
    const REGION_BYTES: usize = 4 << 20;

    /// Two regions of "client memory"; `get`/`put` number `fail_at` fails.
    struct FakeMemory {
        regions: Mutex<[Vec<u8>; 2]>,
        zone: bool,
        fail_get_at: Option<usize>,
        fail_put_at: Option<usize>,
        gets: AtomicUsize,
        puts: AtomicUsize,
        /// Transfers whose server-side buffer lay outside every announced zone.
        unzoned: AtomicUsize,
    }

    impl FakeMemory {
        fn new(zone: bool) -> FakeMemory {
            FakeMemory {
                regions: Mutex::new([vec![0; REGION_BYTES], vec![0; REGION_BYTES]]),
                zone,
                fail_get_at: None,
                fail_put_at: None,
                gets: AtomicUsize::new(0),
                puts: AtomicUsize::new(0),
                unzoned: AtomicUsize::new(0),
            }
        }
        fn note_zone(&self, buf: &[u8]) {
            if weft_fabric::zones::find(buf.as_ptr(), buf.len()).is_none() {
                self.unzoned.fetch_add(1, Ordering::Relaxed);
            }
        }
        fn region(&self, id: usize) -> Vec<u8> {
            self.regions.lock().unwrap()[id].clone()
        }
    }

    fn injected() -> MemoryError {
        MemoryError::Io(std::io::Error::other("injected failure"))
    }

    impl PeerMemory for FakeMemory {
        fn register(&self, _add: &[Region], _remove: &[u32]) -> Result<(), ChunkError> {
            Ok(())
        }
        fn check(&self, chunks: &[Chunk], want: u64) -> Result<(), ChunkError> {
            for (index, c) in chunks.iter().enumerate() {
                if c.region > 1 || c.offset + u64::from(c.len) > REGION_BYTES as u64 {
                    return Err(ChunkError::UnknownRegion { index, region: c.region });
                }
            }
            let have = chunks.iter().map(|c| u64::from(c.len)).sum();
            if have != want {
                return Err(ChunkError::LengthMismatch { have, want });
            }
            Ok(())
        }
        fn get(&self, chunks: &[Chunk], dst: &mut [u8]) -> Result<(), MemoryError> {
            if Some(self.gets.fetch_add(1, Ordering::SeqCst)) == self.fail_get_at {
                return Err(injected());
            }
            self.note_zone(dst);
            let r = self.regions.lock().unwrap();
            let mut at = 0;
            for c in chunks {
                let (o, n) = (c.offset as usize, c.len as usize);
                dst[at..at + n].copy_from_slice(&r[c.region as usize][o..o + n]);
                at += n;
            }
            assert_eq!(at, dst.len(), "a piece's chunks add up to its buffer");
            Ok(())
        }
        fn put(&self, chunks: &[Chunk], src: &[u8]) -> Result<(), MemoryError> {
            if Some(self.puts.fetch_add(1, Ordering::SeqCst)) == self.fail_put_at {
                return Err(injected());
            }
            if self.zone {
                self.note_zone(src);
            }
            let mut r = self.regions.lock().unwrap();
            let mut at = 0;
            for c in chunks {
                let (o, n) = (c.offset as usize, c.len as usize);
                r[c.region as usize][o..o + n].copy_from_slice(&src[at..at + n]);
                at += n;
            }
            assert_eq!(at, src.len(), "a piece's chunks add up to its bytes");
            Ok(())
        }
        fn revoke(&self) {}
        fn wants_zone_buffers(&self) -> bool {
            self.zone
        }
    }

    fn setup(name: &str) -> (DataService, BufferPool, PathBuf) {
        let dir = std::env::temp_dir().join(format!("weft-data-pipe-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Arc::new(ObjectStore::open(&dir).unwrap());
        let cfg = DataConfig {
            id: 1,
            listen: String::new(),
            advertise: None,
            root: dir.clone(),
            metrics_listen: None,
            mds: String::new(),
            key_file: None,
            auth: weft_rpc::AuthMode::None,
            clients_keyring: None,
            tls: false,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
            heartbeat_ms: 1000,
            lease_ms: 150_000,
            transfer_unit_bytes: 2 << 20,
            pool_buffers: 2,
            pool_classes: vec![PoolClassConfig { buf_bytes: 64 << 10, buffers: 4 }],
            pipeline_piece_bytes: 64 << 10,
            rdma_pipeline_piece_bytes: 64 << 10,
            slots_max: 4,
            sessions_max: 4,
            short_circuit: false,
            shm: false,
            shm_socket: None,
            shm_socket_group: None,
            shm_arena_bytes_max: 1 << 20,
            rdma: false,
            rdma_port: 0,
            capability_clock_skew_ms: 0,
            removed_inode_memory_ms: 0,
            removed_inodes_max: 1,
            cache_fill_queue_max: 1,
            cache_versions_per_inode: 1,
            cache_recent_inodes_max: 1,
            cache_filled_recent_max: 0,
            cache: None,
            rdma_handshakes_max: 4,
            rdma_handshake_timeout_ms: 1000,
            nfs_listen: vec![],
            nfs_advertise: vec![],
            nfs_rdma_listen: None,
            nfs_connections_max: 1,
            nfs_clients_max: 1,
            nfs_sessions_max: 1,
        };
        let pool = BufferPool::with_classes(&cfg.pool_classes()).unwrap();
        let svc = DataService::new(store, 4)
            .with_pipeline_piece_bytes(cfg.pipeline_piece_bytes)
            .with_rdma_pipeline_piece_bytes(cfg.rdma_pipeline_piece_bytes);
        (svc, pool, dir)
    }

    fn ctx(pool: &BufferPool, memory: &Arc<FakeMemory>) -> CallCtx {
        CallCtx {
            session: 1,
            peer: "test".into(),
            principal: weft_rpc::Principal::Anonymous,
            user: None,
            slot: 0,
            once: None,
            pool: pool.clone(),
            memory: Some(memory.clone()),
            peer_cred: None,
            fabric: "shm",
        }
    }

    /// Odd-sized chunks laid out backwards in `region` from `start`, so bytes cut into the wrong piece, or
    /// pieces taken in the wrong order, land in the wrong place.
    fn scattered(region: u32, start: u64, total: usize) -> Vec<Chunk> {
        let sizes = [7 * K + 13, 333, 70 * K + 1, 4096, 1, 19 * K + 7];
        let mut chunks = Vec::new();
        let mut left = total;
        let mut end = start + 2 * total as u64;
        let mut i = 0;
        while left > 0 {
            let n = sizes[i % sizes.len()].min(left);
            // Leave a one-byte gap between chunks.
            end -= n as u64 + 1;
            chunks.push(Chunk { region, offset: end, len: n as u32 });
            left -= n;
            i += 1;
        }
        chunks
    }

    fn gather(mem: &[u8], chunks: &[Chunk]) -> Vec<u8> {
        chunks.iter().flat_map(|c| mem[c.offset as usize..c.offset as usize + c.len as usize].to_vec()).collect()
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| ((i * 7 + i / 4099) as u8).wrapping_add(seed)).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pipelined_transfers_with_straddling_chunks_round_trip() {
        for zone in [false, true] {
            let (svc, pool, dir) = setup(if zone { "zone" } else { "map" });
            let mem = Arc::new(FakeMemory::new(zone));
            let data = pattern(3, 700 * K + 77);
            let wchunks = scattered(0, 1001, data.len());
            {
                let mut r = mem.regions.lock().unwrap();
                let mut at = 0;
                for c in &wchunks {
                    let (o, n) = (c.offset as usize, c.len as usize);
                    r[0][o..o + n].copy_from_slice(&data[at..at + n]);
                    at += n;
                }
            }
            let offset = 3 * 4096 + 1234;
            let req = Request::WriteChunks(WriteChunksReq {
                cap: weft_proto::Capability::none(),
                ino: 7,
                offset,
                chunks: wchunks.clone(),
            });
            let reply = svc.call(&ctx(&pool, &mem), req, None).await.unwrap();
            assert!(matches!(reply.resp, Response::WriteChunks(n) if n as usize == data.len()));
            let pieces = pipeline::split(&wchunks, offset, 64 << 10).unwrap().len();
            assert!(pieces > 10);
            assert_eq!(mem.gets.load(Ordering::SeqCst), pieces);
            let mut disk = vec![0u8; data.len()];
            svc.store.read(7, offset, &mut disk).unwrap();
            assert!(disk == data, "zone={zone}: the object holds the bytes in chunk order");

            // Read back a range that starts before the data and runs past the object's end (zeros there).
            let read_off = offset - 5000;
            let read_len = data.len() + 5000 + 9000;
            let rchunks = scattered(1, 17, read_len);
            let req = Request::ReadChunks(ReadChunksReq {
                cap: weft_proto::Capability::none(),
                fill: None,
                ino: 7,
                offset: read_off,
                chunks: rchunks.clone(),
            });
            svc.call(&ctx(&pool, &mem), req, None).await.unwrap();
            let got = gather(&mem.region(1), &rchunks);
            assert!(got[..5000].iter().all(|&b| b == 0), "zone={zone}: before the data");
            assert!(got[5000..5000 + data.len()] == data[..], "zone={zone}: the data, in chunk order");
            assert!(got[5000 + data.len()..].iter().all(|&b| b == 0), "zone={zone}: past the end");
            assert_eq!(mem.unzoned.load(Ordering::SeqCst), 0, "zone={zone}: every buffer came from a zone");
            assert_eq!(pool.available(), 6, "every buffer went back");
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_get_in_the_second_piece_fails_the_write() {
        let (svc, pool, dir) = setup("failget");
        let mut mem = FakeMemory::new(true);
        mem.fail_get_at = Some(1);
        let mem = Arc::new(mem);
        let chunks = vec![Chunk { region: 0, offset: 5, len: 300 << 10 }];
        let req =
            Request::WriteChunks(WriteChunksReq { cap: weft_proto::Capability::none(), ino: 8, offset: 100, chunks });
        let err = svc.call(&ctx(&pool, &mem), req, None).await.err().expect("the write fails");
        assert_eq!(err.code, ErrorCode::Io, "{err:?}");
        assert_eq!(mem.gets.load(Ordering::SeqCst), 2, "nothing is fetched after the failed piece");
        assert_eq!(pool.available(), 6);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_read_or_put_stops_the_puts() {
        for zone in [false, true] {
            let (svc, pool, dir) = setup(if zone { "failz" } else { "failm" });
            let data = pattern(5, 400 << 10);
            svc.store.write(9, 0, &data).unwrap();
            // Corrupt a byte in the third piece: the read of that piece fails its checksum.
            let path = svc.store.object_path(9);
            let mut raw = std::fs::read(&path).unwrap();
            raw[(128 << 10) + 10] ^= 1;
            std::fs::write(&path, &raw).unwrap();
            let mem = Arc::new(FakeMemory::new(zone));
            let chunks = vec![Chunk { region: 1, offset: 0, len: 400 << 10 }];
            let req = Request::ReadChunks(ReadChunksReq {
                cap: weft_proto::Capability::none(),
                fill: None,
                ino: 9,
                offset: 0,
                chunks: chunks.clone(),
            });
            let err = svc.call(&ctx(&pool, &mem), req, None).await.err().expect("the read fails");
            assert_eq!(err.code, ErrorCode::Corrupt, "{err:?}");
            assert_eq!(mem.puts.load(Ordering::SeqCst), 2, "zone={zone}: pieces after the bad one are not put");
            let got = mem.region(1);
            assert!(got[..128 << 10] == data[..128 << 10], "zone={zone}");
            assert!(got[128 << 10..].iter().all(|&b| b == 0), "zone={zone}: nothing after the failure");

            // A put that fails ends the transfer: the piece being read meanwhile is never put.
            let mut mem = FakeMemory::new(zone);
            mem.fail_put_at = Some(0);
            let mem = Arc::new(mem);
            let req = Request::ReadChunks(ReadChunksReq {
                cap: weft_proto::Capability::none(),
                fill: None,
                ino: 9,
                offset: 0,
                chunks: chunks.clone(),
            });
            let err = svc.call(&ctx(&pool, &mem), req, None).await.err().expect("the read fails");
            assert_eq!(err.code, ErrorCode::Io, "{err:?}");
            assert_eq!(mem.puts.load(Ordering::SeqCst), 1);
            assert!(mem.region(1).iter().all(|&b| b == 0));
            assert_eq!(pool.available(), 6);
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// With a gate: a request on an inode without a good capability is refused before the store is touched, and
    /// only a cluster-key connection removes objects (the MDS's orphan collector).
    #[tokio::test]
    async fn the_gate_refuses_before_the_store_and_only_the_cluster_removes_objects() {
        use weft_proto::msg::FsyncReq;
        use weft_rpc::{CapabilityKey, Key, Principal};
        let (svc, pool, dir) = setup("gate");
        let key = CapabilityKey::derive(&Key::from_bytes([9; 32]));
        let svc = svc.with_capability_gate(Some(CapabilityGate::new(key.clone(), 0, 60_000, 8)));
        let memory = Arc::new(FakeMemory::new(false));
        let mut cx = ctx(&pool, &memory);
        cx.principal = Principal::Key { key_id: "alice".into(), policy: weft_rpc::KeyPolicy::Trusted };
        let expiry = weft_rpc::capability::unix_now_ms() + 60_000;
        let theirs = key.seal(3, Rights::READ_WRITE, expiry, "cluster", 1, 0).unwrap();
        let mine = key.seal(3, Rights::READ_WRITE, expiry, "alice", 1, 0).unwrap();
        let write = |cap| Request::Truncate(TruncateReq { ino: 3, size: 4096, cap });
        let e = svc.call(&cx, write(theirs), None).await.map(|_| ()).unwrap_err();
        assert_eq!(e.code, ErrorCode::CapabilityRefused, "another key's capability: {e}");
        assert!(!common_object(&dir, 3).exists(), "a refused truncate created the object");
        svc.call(&cx, write(mine.clone()), None).await.unwrap();
        assert!(common_object(&dir, 3).exists());
        let mine_again = mine.clone();
        let fsync = Request::Fsync(FsyncReq { ino: 3, cap: mine });
        svc.call(&cx, fsync, None).await.unwrap();
        let remove = || Request::RemoveObject(InoReq { ino: 3 });
        let e = svc.call(&cx, remove(), None).await.map(|_| ()).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotPermitted, "{e}");
        assert!(common_object(&dir, 3).exists(), "a refused RemoveObject removed the object");
        cx.principal =
            Principal::Key { key_id: weft_rpc::auth::CLUSTER_KEY_ID.into(), policy: weft_rpc::KeyPolicy::Cluster };
        svc.call(&cx, remove(), None).await.unwrap();
        assert!(!common_object(&dir, 3).exists());
        // Removed: a still-valid capability of its own key no longer recreates it.
        cx.principal = Principal::Key { key_id: "alice".into(), policy: weft_rpc::KeyPolicy::Trusted };
        let e = svc.call(&cx, write(mine_again), None).await.map(|_| ()).unwrap_err();
        assert!(e.message.contains("removed"), "{e}");
        assert!(!common_object(&dir, 3).exists(), "a write after the removal recreated the object");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Without an Up lease a request carrying a capability is refused with `StaleLayout` before the store is
    /// touched, whichever key it proved (clients commonly hold the cluster key); ops with no capability pass; an Up
    /// reply lets requests in.
    #[tokio::test]
    async fn a_fenced_server_refuses_before_the_store() {
        use weft_proto::ServerState;
        use weft_proto::msg::HeartbeatResp;
        use weft_rpc::Principal;
        let (svc, pool, dir) = setup("lease");
        let lease = Arc::new(LeaseGate::new(4, 60_000));
        let svc = svc.with_lease_gate(Some(lease.clone()));
        let memory = Arc::new(FakeMemory::new(false));
        let mut cx = ctx(&pool, &memory);
        cx.principal =
            Principal::Key { key_id: weft_rpc::auth::CLUSTER_KEY_ID.into(), policy: weft_rpc::KeyPolicy::Cluster };
        let truncate = |ino| Request::Truncate(TruncateReq { ino, size: 4096, cap: weft_proto::Capability::none() });
        let e = svc.call(&cx, truncate(5), None).await.map(|_| ()).unwrap_err();
        assert_eq!(e.code, ErrorCode::StaleLayout, "{e}");
        assert!(e.message.contains("data server 4"), "{e}");
        assert!(!common_object(&dir, 5).exists(), "a fenced truncate created the object");
        lease.on_reply(lease.now_ms(), HeartbeatResp { state: ServerState::Draining, rebuild_after_ms: 60_000 });
        let e = svc.call(&cx, truncate(5), None).await.map(|_| ()).unwrap_err();
        assert!(e.message.contains("not Up at the MDS (Draining)"), "{e}");
        assert!(!common_object(&dir, 5).exists());
        // The drain's own ops carry no capability and pass.
        svc.call(&cx, Request::RemoveObject(InoReq { ino: 5 }), None).await.unwrap();
        lease.on_reply(lease.now_ms(), HeartbeatResp { state: ServerState::Up, rebuild_after_ms: 60_000 });
        svc.call(&cx, truncate(6), None).await.unwrap();
        assert!(common_object(&dir, 6).exists(), "served under an Up lease");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn common_object(root: &std::path::Path, ino: u64) -> PathBuf {
        root.join("objects").join(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}"))
    }
}
