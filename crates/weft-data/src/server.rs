//! The data server process: the RPC service over an [`ObjectStore`], its configuration, and the heartbeat that
//! registers it with the metadata service.
//!
//! Disk I/O runs on tokio's blocking pool so the network side keeps receiving the next transfer unit while the
//! disk writes (or reads) this one: with the client keeping several units in flight, disk and network overlap.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{info, warn};
use weft_fabric::{AnyFabric, Fabric, Listener, TcpFabric};
use weft_proto::msg::RegisterServerReq;
use weft_proto::{ErrorCode, FrameLimits, Request, Response, WireError};
use weft_rpc::{
    BufferPool, CallCtx, ClientConfig, PoolBuf, PoolClass, Reply, ReplyData, RpcClient, RpcServer, ServerConfig,
    Service,
};

use crate::pipeline::{self, join_error, memory_error};
use crate::store::{MappedRead, ObjectStore};

/// `weft data --config F`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// Stable id of this server; layouts refer to it.
    pub id: u32,
    /// Address to listen on (`host:0` picks a free port).
    pub listen: String,
    /// Address clients should use, if not the listening one (e.g. behind NAT or when listening on 0.0.0.0).
    #[serde(default)]
    pub advertise: Option<String>,
    /// Directory holding the objects.
    pub root: PathBuf,
    /// The metadata service to register with.
    pub mds: String,
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// Largest payload of one request (a transfer unit); also the size of the largest pool buffers.
    #[serde(default = "default_transfer_unit")]
    pub transfer_unit_bytes: u32,
    /// Buffers of the transfer unit's size in the pool (the largest class; see [`DataConfig::pool_classes`]).
    #[serde(default = "default_pool_buffers")]
    pub pool_buffers: u32,
    /// The pool's size classes below the transfer unit (`[[pool_classes]]` tables of `buf_bytes` and `buffers`);
    /// empty picks [`DEFAULT_POOL_CLASSES`]. Each class is one zone, allocated and pre-faulted at start; payload
    /// memory is bounded by the sum of `buffers × buf_bytes` over the classes plus `pool_buffers ×
    /// transfer_unit_bytes`.
    #[serde(default)]
    pub pool_classes: Vec<PoolClassConfig>,
    /// One-sided transfers larger than this move in pieces of this size (a multiple of 4096), the disk working on
    /// one piece while the fabric moves the next.
    #[serde(default = "default_pipeline_piece")]
    pub pipeline_piece_bytes: u32,
    /// The same for fabrics that move bytes without the CPU (`rdma`: the NIC does the transfer, so overlapping it
    /// with the disk costs no core; `pipeline_piece_bytes` applies to `shm`, whose transfer is a CPU copy).
    #[serde(default = "default_rdma_pipeline_piece")]
    pub rdma_pipeline_piece_bytes: u32,
    #[serde(default = "default_slots_max")]
    pub slots_max: u32,
    #[serde(default = "default_sessions_max")]
    pub sessions_max: u32,
    /// Benchmarks only (Sandia's short circuit, `weft bench --short-circuit server`): writes are discarded and
    /// reads served as zeros without touching the disk, showing the ceiling of everything before the store.
    #[serde(default)]
    pub short_circuit: bool,
    /// Also listen for same-host clients on the `shm` fabric, at `shm_socket` (default `ROOT/weft-data.sock`).
    #[serde(default = "default_true")]
    pub shm: bool,
    #[serde(default)]
    pub shm_socket: Option<PathBuf>,
    /// Also listen for `rdma` clients when this host has an RDMA device (libibverbs and a device; the side
    /// channel listens on the TCP listener's address, port `rdma_port`, 0 = any free port).
    #[serde(default = "default_true")]
    pub rdma: bool,
    #[serde(default)]
    pub rdma_port: u16,
}

/// One size class of the data server's buffer pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolClassConfig {
    pub buf_bytes: u32,
    pub buffers: u32,
}

/// Classes below the transfer unit, by default: 64 KiB for small I/O (the arena size class of the papers),
/// 256 KiB for medium payloads and short pipeline pieces, 1 MiB for the client's usual transfer unit (over TCP)
/// and for pipeline pieces (two per large one-sided transfer in flight). With 32 transfer-unit buffers of 2 MiB,
/// 92 MiB in all.
pub const DEFAULT_POOL_CLASSES: [PoolClassConfig; 3] = [
    PoolClassConfig { buf_bytes: 64 << 10, buffers: 64 },
    PoolClassConfig { buf_bytes: 256 << 10, buffers: 32 },
    PoolClassConfig { buf_bytes: 1 << 20, buffers: 16 },
];

impl DataConfig {
    /// The pool's classes: the configured (or default) ones smaller than the transfer unit, then
    /// `pool_buffers` buffers of the transfer unit, so every payload the server accepts fits a class.
    pub fn pool_classes(&self) -> Vec<PoolClass> {
        let unit = self.transfer_unit_bytes.max(1);
        let below: &[PoolClassConfig] =
            if self.pool_classes.is_empty() { &DEFAULT_POOL_CLASSES } else { &self.pool_classes };
        let mut v: Vec<PoolClass> = below
            .iter()
            .filter(|c| c.buf_bytes < unit)
            .map(|c| PoolClass { buf_bytes: c.buf_bytes as usize, buffers: c.buffers })
            .collect();
        v.push(PoolClass { buf_bytes: unit as usize, buffers: self.pool_buffers.max(1) });
        v
    }
}

fn default_true() -> bool {
    true
}

fn default_heartbeat_ms() -> u64 {
    1000
}
fn default_transfer_unit() -> u32 {
    2 << 20
}
fn default_pool_buffers() -> u32 {
    32
}
fn default_pipeline_piece() -> u32 {
    DEFAULT_PIPELINE_PIECE_BYTES
}
fn default_rdma_pipeline_piece() -> u32 {
    DEFAULT_RDMA_PIPELINE_PIECE_BYTES
}

/// Pieces of a pipelined transfer over a fabric whose transfers do not use the CPU (`rdma`): four per 1 MiB unit,
/// so the disk reads or writes one piece while the NIC moves another.
pub const DEFAULT_RDMA_PIPELINE_PIECE_BYTES: u32 = 256 << 10;

/// Pieces of a pipelined one-sided transfer, by default: the client's 1 MiB transfer unit moves whole, a 2 MiB one
/// in two pieces. Smaller pieces (256 KiB) measured slower here with 8 units in flight on 2 cores: units in
/// flight already overlap disk and transfer, and each piece costs two hand-offs and its own mapping (see
/// ARCHITECTURE.md, "Double buffering").
pub const DEFAULT_PIPELINE_PIECE_BYTES: u32 = 1 << 20;
fn default_slots_max() -> u32 {
    64
}
fn default_sessions_max() -> u32 {
    1024
}

/// Reads and writes up to this size run on the runtime worker that received them, without a mapping or a
/// hand-off to the blocking pool (see `DataService::call`).
pub const INLINE_IO_BYTES_MAX: u32 = 64 << 10;

pub struct DataService {
    store: Arc<ObjectStore>,
    /// Reads served from mappings in flight at once: each pins its pages and a mapping until its reply is sent.
    mapped_reads: Arc<Semaphore>,
    /// See [`DataConfig::short_circuit`].
    short_circuit: bool,
    /// See [`DataConfig::pipeline_piece_bytes`] and [`DataConfig::rdma_pipeline_piece_bytes`].
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

    /// See [`DataConfig::pipeline_piece_bytes`]; rounded down to whole 4 KiB blocks, at least one.
    pub fn with_pipeline_piece_bytes(mut self, bytes: u32) -> DataService {
        self.piece_bytes = (u64::from(bytes) / 4096).max(1) * 4096;
        self
    }

    /// See [`DataConfig::rdma_pipeline_piece_bytes`]; rounded as above.
    pub fn with_rdma_pipeline_piece_bytes(mut self, bytes: u32) -> DataService {
        self.rdma_piece_bytes = (u64::from(bytes) / 4096).max(1) * 4096;
        self
    }

    /// The piece size for transfers with `memory`'s fabric.
    fn piece_bytes_for(&self, memory: &dyn weft_fabric::PeerMemory) -> u64 {
        if memory.wants_zone_buffers() { self.rdma_piece_bytes } else { self.piece_bytes }
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

    /// Benchmarks only: see [`DataConfig::short_circuit`].
    pub fn with_short_circuit(mut self, on: bool) -> DataService {
        self.short_circuit = on;
        self
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

fn one_sided(ctx: &CallCtx) -> Result<std::sync::Arc<dyn weft_fabric::PeerMemory>, WireError> {
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

impl Service for DataService {
    async fn call(&self, ctx: &CallCtx, req: Request, data: Option<PoolBuf>) -> Result<Reply, WireError> {
        let store = self.store.clone();
        match req {
            Request::Read(r) => {
                if r.len as usize > ctx.pool.buf_bytes() {
                    return Err(WireError::new(
                        ErrorCode::OutOfRange,
                        format!("read of {} bytes exceeds the transfer unit of {}", r.len, ctx.pool.buf_bytes()),
                    ));
                }
                if self.short_circuit || r.len <= INLINE_IO_BYTES_MAX {
                    // Small reads (random I/O) are read into a pool buffer right here: mapping a few pages costs
                    // more (mmap, populate, munmap and its TLB shootdown) than copying them, and a hand-off to the
                    // blocking pool costs two thread wake-ups, more than a page-cache read. A cache miss holds
                    // this worker for one small disk read. Short-circuited, the buffer is zeros.
                    let mut buf = ctx.pool.acquire(r.len as usize).await;
                    if self.short_circuit {
                        buf.as_mut_slice().fill(0);
                    } else {
                        store.read(r.ino, r.offset, buf.as_mut_slice()).map_err(WireError::from)?;
                    }
                    return Ok(Reply { resp: Response::Read(()), data: Some(Box::new(buf)) });
                }
                // Larger ranges inside the object: verified and sent straight from the page cache.
                let permit = self.mapped_reads.clone().acquire_owned().await.expect("never closed");
                let mapped = {
                    let store = store.clone();
                    let r = r.clone();
                    tokio::task::spawn_blocking(move || store.read_mapped(r.ino, r.offset, u64::from(r.len)))
                        .await
                        .map_err(join_error)?
                        .map_err(WireError::from)?
                };
                if let Some(read) = mapped {
                    return Ok(Reply {
                        resp: Response::Read(()),
                        data: Some(Box::new(MappedReply { read, _permit: permit })),
                    });
                }
                drop(permit);
                // Past the object's end or a missing object: copy into a pool buffer, filling zeros.
                let mut buf = ctx.pool.acquire(r.len as usize).await;
                let buf =
                    tokio::task::spawn_blocking(move || store.read(r.ino, r.offset, buf.as_mut_slice()).map(|()| buf))
                        .await
                        .map_err(join_error)?
                        .map_err(WireError::from)?;
                Ok(Reply { resp: Response::Read(()), data: Some(Box::new(buf)) })
            }
            Request::ReadChunks(r) => {
                let memory = one_sided(ctx)?;
                let len: u64 = r.chunks.iter().map(|c| u64::from(c.len)).sum();
                if len > ctx.pool.buf_bytes() as u64 {
                    return Err(WireError::new(
                        ErrorCode::OutOfRange,
                        format!("read of {len} bytes exceeds the transfer unit of {}", ctx.pool.buf_bytes()),
                    ));
                }
                // Refuse a bad chunk list before touching the disk.
                memory.check(&r.chunks, len).map_err(|e| refuse_chunks(ctx, e))?;
                if self.short_circuit || len <= u64::from(INLINE_IO_BYTES_MAX) {
                    // As for `Read`: a small range is read (or, short-circuited, zeroed) and put right here.
                    let mut buf = ctx.pool.acquire(len as usize).await;
                    if self.short_circuit {
                        buf.as_mut_slice().fill(0);
                    } else {
                        store.read(r.ino, r.offset, buf.as_mut_slice()).map_err(WireError::from)?;
                    }
                    memory.put(&r.chunks, buf.as_slice()).map_err(|e| memory_error(&ctx.peer, e))?;
                    return Ok(Response::ReadChunks(()).into());
                }
                let pieces =
                    pipeline::split(&r.chunks, r.offset, self.piece_bytes_for(&*memory)).map_err(bad_pieces)?;
                // A fabric that reaches any server memory (shm) is served from page-cache mappings, straight into
                // the client's memory; one that needs registered memory (rdma) from pool buffers in the zones.
                let map = !memory.wants_zone_buffers();
                let _permit = match map {
                    true => Some(self.mapped_reads.clone().acquire_owned().await.expect("never closed")),
                    false => None,
                };
                let piece_max = pieces.iter().map(|p| p.len).max().unwrap_or(0) as usize;
                let bufs = Self::piece_buffers(&ctx.pool, pieces.len(), piece_max).await;
                pipeline::read_chunks(store, memory, ctx.peer.clone(), r.ino, pieces, bufs, map).await?;
                Ok(Response::ReadChunks(()).into())
            }
            Request::WriteChunks(w) => {
                let memory = one_sided(ctx)?;
                let len: u64 = w.chunks.iter().map(|c| u64::from(c.len)).sum();
                if len > ctx.pool.buf_bytes() as u64 {
                    return Err(WireError::new(
                        ErrorCode::OutOfRange,
                        format!("write of {len} bytes exceeds the transfer unit of {}", ctx.pool.buf_bytes()),
                    ));
                }
                memory.check(&w.chunks, len).map_err(|e| refuse_chunks(ctx, e))?;
                if self.short_circuit {
                    return Ok(Response::WriteChunks(len as u32).into());
                }
                // The server pulls the bytes when it has a buffer for them: its own pace, its own memory.
                if len <= u64::from(INLINE_IO_BYTES_MAX) {
                    let mut buf = ctx.pool.acquire(len as usize).await;
                    memory.get(&w.chunks, buf.as_mut_slice()).map_err(|e| memory_error(&ctx.peer, e))?;
                    store.write(w.ino, w.offset, buf.as_slice()).map_err(WireError::from)?;
                    return Ok(Response::WriteChunks(len as u32).into());
                }
                let pieces =
                    pipeline::split(&w.chunks, w.offset, self.piece_bytes_for(&*memory)).map_err(bad_pieces)?;
                let piece_max = pieces.iter().map(|p| p.len).max().unwrap_or(0) as usize;
                let bufs = Self::piece_buffers(&ctx.pool, pieces.len(), piece_max).await;
                pipeline::write_chunks(store, memory, ctx.peer.clone(), w.ino, pieces, bufs).await?;
                Ok(Response::WriteChunks(len as u32).into())
            }
            Request::Write(w) => {
                let buf = data.ok_or_else(|| WireError::new(ErrorCode::BadRequest, "write without a payload"))?;
                let n = buf.len() as u32;
                if self.short_circuit {
                    return Ok(Response::Write(n).into());
                }
                if n <= INLINE_IO_BYTES_MAX {
                    // As small reads: a page-cache write takes less than the hand-off to the blocking pool.
                    store.write(w.ino, w.offset, buf.as_slice()).map_err(WireError::from)?;
                } else {
                    tokio::task::spawn_blocking(move || store.write(w.ino, w.offset, buf.as_slice()))
                        .await
                        .map_err(join_error)?
                        .map_err(WireError::from)?;
                }
                Ok(Response::Write(n).into())
            }
            Request::Truncate(t) => {
                tokio::task::spawn_blocking(move || store.truncate(t.ino, t.size))
                    .await
                    .map_err(join_error)?
                    .map_err(WireError::from)?;
                Ok(Response::Truncate(()).into())
            }
            Request::RemoveObject(r) => {
                tokio::task::spawn_blocking(move || store.remove(r.ino))
                    .await
                    .map_err(join_error)?
                    .map_err(WireError::from)?;
                Ok(Response::RemoveObject(()).into())
            }
            Request::Fsync(_) if self.short_circuit => Ok(Response::Fsync(()).into()),
            Request::Fsync(r) => {
                tokio::task::spawn_blocking(move || store.fsync(r.ino))
                    .await
                    .map_err(join_error)?
                    .map_err(WireError::from)?;
                Ok(Response::Fsync(()).into())
            }
            Request::SpaceStat(()) => {
                let s = tokio::task::spawn_blocking(move || store.space())
                    .await
                    .map_err(join_error)?
                    .map_err(WireError::from)?;
                Ok(Response::SpaceStat(s).into())
            }
            other => {
                Err(WireError::new(ErrorCode::BadRequest, format!("{:?} is not served by a data server", other.op())))
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataServerError {
    #[error("opening the object store at {root}: {source}")]
    Store { root: PathBuf, source: crate::DataError },
    #[error("listening on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("serving: {0}")]
    Serve(std::io::Error),
    #[error("allocating the buffer zones: {0}")]
    Pool(weft_rpc::PoolError),
}

/// Runs a data server until the process is stopped. `ready` is told the listening address.
pub async fn run(cfg: DataConfig, ready: impl FnOnce(&str)) -> Result<(), DataServerError> {
    let store =
        ObjectStore::open(&cfg.root).map_err(|source| DataServerError::Store { root: cfg.root.clone(), source })?;
    let store = Arc::new(store);
    let fabric = AnyFabric::default();
    let listener = fabric
        .listen(&cfg.listen)
        .await
        .map_err(|source| DataServerError::Listen { addr: cfg.listen.clone(), source })?;
    let addr = listener.local_addr().map_err(DataServerError::Serve)?;
    let advertise = cfg.advertise.clone().unwrap_or_else(|| addr.clone());
    // The shm listener is an optimisation: a server that cannot bind it (path too long, read-only root) still
    // serves everyone over TCP.
    let mut shm_listener = None;
    if cfg.shm {
        let path = cfg.shm_socket.clone().unwrap_or_else(|| cfg.root.join("weft-data.sock"));
        let shm_addr = format!("{}{}", weft_fabric::shm::SHM_SCHEME, path.display());
        match fabric.listen(&shm_addr).await {
            Ok(l) => shm_listener = Some(l),
            Err(e) => warn!(%shm_addr, "no shm listener, same-host clients will use tcp: {e}"),
        }
    }
    let shm_addr = shm_listener.as_ref().and_then(|l| l.local_addr().ok());
    // So is rdma: without a device (most hosts) the server says so once and serves over tcp and shm.
    let mut rdma_listener = None;
    let mut rdma_addr = None;
    if cfg.rdma {
        let ip = addr.rsplit_once(':').map_or("0.0.0.0", |(h, _)| h);
        let listen = format!("rdma:{ip}:{}", cfg.rdma_port);
        match fabric.listen(&listen).await {
            Ok(l) => {
                let port = l.local_addr().ok().and_then(|a| a.rsplit_once(':').map(|(_, p)| p.to_string()));
                let host = advertise.rsplit_once(':').map_or(ip, |(h, _)| h);
                rdma_addr = port.map(|p| format!("rdma:{host}:{p}"));
                rdma_listener = Some(l);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => info!("no rdma listener: {e}"),
            Err(e) => warn!(%listen, "no rdma listener, clients will use tcp: {e}"),
        }
    }
    let server_cfg = ServerConfig {
        limits: FrameLimits { body_bytes_max: 64 << 10, data_bytes_max: cfg.transfer_unit_bytes },
        slots_max: cfg.slots_max,
        sessions_max: cfg.sessions_max,
        pool_buffers: cfg.pool_buffers,
        shm_addr: shm_addr.clone(),
        rdma_addr: rdma_addr.clone(),
        ..ServerConfig::default()
    };
    let pool = BufferPool::with_classes(&cfg.pool_classes()).map_err(DataServerError::Pool)?;
    let service = DataService::new(store.clone(), cfg.pool_buffers)
        .with_short_circuit(cfg.short_circuit)
        .with_pipeline_piece_bytes(cfg.pipeline_piece_bytes)
        .with_rdma_pipeline_piece_bytes(cfg.rdma_pipeline_piece_bytes);
    let server = RpcServer::<AnyFabric, _>::with_pool(server_cfg, Arc::new(service), pool);
    info!(id = cfg.id, %addr, %advertise, shm = ?shm_addr, rdma = ?rdma_addr, root = %cfg.root.display(), mds = %cfg.mds, "data server listening");
    tokio::spawn(heartbeat(cfg.clone(), advertise, store));
    for (name, l) in [("shm", shm_listener), ("rdma", rdma_listener)] {
        let Some(l) = l else { continue };
        let server = server.clone();
        tokio::spawn(async move {
            if let Err(e) = server.serve(l).await {
                warn!("{name} listener ended: {e}");
            }
        });
    }
    ready(&addr);
    server.serve(listener).await.map_err(DataServerError::Serve)
}

/// Registers with the MDS and repeats it as a heartbeat carrying this server's space. Survives MDS restarts.
async fn heartbeat(cfg: DataConfig, advertise: String, store: Arc<ObjectStore>) {
    let rpc_cfg = ClientConfig {
        client_name: format!("data-server-{}", cfg.id),
        slots: 1,
        call_timeout_ms: cfg.heartbeat_ms.max(1000) * 5,
        attempts_max: 1,
        ..ClientConfig::default()
    };
    let mut client: Option<RpcClient<TcpFabric>> = None;
    let mut healthy = true;
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.heartbeat_ms.max(10)));
    loop {
        tick.tick().await;
        let space = {
            let store = store.clone();
            match tokio::task::spawn_blocking(move || store.space()).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    warn!("cannot read space of {}: {e}", cfg.root.display());
                    Default::default()
                }
                Err(_) => Default::default(),
            }
        };
        if client.is_none() {
            client = RpcClient::connect(TcpFabric::default(), &cfg.mds, rpc_cfg.clone()).await.ok();
        }
        let result = match &client {
            Some(c) => c
                .call_simple(Request::RegisterServer(RegisterServerReq { id: cfg.id, addr: advertise.clone(), space }))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            None => Err(format!("cannot connect to {}", cfg.mds)),
        };
        match result {
            Ok(()) if !healthy => {
                info!(mds = %cfg.mds, "registered with the metadata service again");
                healthy = true;
            }
            Ok(()) => {}
            Err(e) => {
                if healthy {
                    warn!(mds = %cfg.mds, "heartbeat failed (will keep trying): {e}");
                }
                healthy = false;
                client = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The pipelined one-sided path against a client memory held in this process, so a test can see every `get`
    //! and `put`, make one fail, and check that rdma-style transfers only touch buffers inside announced zones.

    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use weft_fabric::{MemoryError, PeerMemory};
    use weft_proto::msg::{ReadChunksReq, WriteChunksReq};
    use weft_proto::{Chunk, ChunkError, Region};

    use super::*;

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
            mds: String::new(),
            heartbeat_ms: 1000,
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
            rdma: false,
            rdma_port: 0,
        };
        let pool = BufferPool::with_classes(&cfg.pool_classes()).unwrap();
        let svc = DataService::new(store, 4)
            .with_pipeline_piece_bytes(cfg.pipeline_piece_bytes)
            .with_rdma_pipeline_piece_bytes(cfg.rdma_pipeline_piece_bytes);
        (svc, pool, dir)
    }

    fn ctx(pool: &BufferPool, memory: &Arc<FakeMemory>) -> CallCtx {
        CallCtx { session: 1, peer: "test".into(), pool: pool.clone(), memory: Some(memory.clone()) }
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
            let req = Request::WriteChunks(WriteChunksReq { ino: 7, offset, chunks: wchunks.clone() });
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
            let req = Request::ReadChunks(ReadChunksReq { ino: 7, offset: read_off, chunks: rchunks.clone() });
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
        let req = Request::WriteChunks(WriteChunksReq { ino: 8, offset: 100, chunks });
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
            let req = Request::ReadChunks(ReadChunksReq { ino: 9, offset: 0, chunks: chunks.clone() });
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
            let req = Request::ReadChunks(ReadChunksReq { ino: 9, offset: 0, chunks: chunks.clone() });
            let err = svc.call(&ctx(&pool, &mem), req, None).await.err().expect("the read fails");
            assert_eq!(err.code, ErrorCode::Io, "{err:?}");
            assert_eq!(mem.puts.load(Ordering::SeqCst), 1);
            assert!(mem.region(1).iter().all(|&b| b == 0));
            assert_eq!(pool.available(), 6);
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
