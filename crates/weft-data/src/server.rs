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
use weft_rpc::{CallCtx, ClientConfig, PoolBuf, Reply, ReplyData, RpcClient, RpcServer, ServerConfig, Service};

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
    /// Largest payload of one request (a transfer unit); also the size of each pool buffer.
    #[serde(default = "default_transfer_unit")]
    pub transfer_unit_bytes: u32,
    /// Payload buffers in the pool: the bound on payload memory (`pool_buffers × transfer_unit_bytes`).
    #[serde(default = "default_pool_buffers")]
    pub pool_buffers: u32,
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
}

impl DataService {
    /// `mapped_reads_max` bounds the reads served from page-cache mappings at once (the copying path is bounded
    /// by the RPC server's buffer pool).
    pub fn new(store: Arc<ObjectStore>, mapped_reads_max: u32) -> DataService {
        DataService {
            store,
            mapped_reads: Arc::new(Semaphore::new(mapped_reads_max.max(1) as usize)),
            short_circuit: false,
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

/// A chunk outside the client's registered regions: refused, logged, and nothing was read or written.
fn refuse_chunks(ctx: &CallCtx, e: weft_proto::ChunkError) -> WireError {
    warn!(peer = %ctx.peer, "refusing a chunk list: {e}");
    WireError::new(ErrorCode::BadRequest, format!("chunk list refused: {e}"))
}

fn memory_error(peer: &str, e: weft_fabric::MemoryError) -> WireError {
    match e {
        weft_fabric::MemoryError::Chunk(c) => {
            warn!(%peer, "refusing a chunk list: {c}");
            WireError::new(ErrorCode::BadRequest, format!("chunk list refused: {c}"))
        }
        other => {
            warn!(%peer, "one-sided transfer failed: {other}");
            WireError::new(ErrorCode::Io, other.to_string())
        }
    }
}

fn join_error(e: tokio::task::JoinError) -> WireError {
    WireError::new(ErrorCode::Internal, format!("disk task failed: {e}"))
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
                let permit = self.mapped_reads.clone().acquire_owned().await.expect("never closed");
                let peer = ctx.peer.clone();
                // Read and put in one blocking task: the data goes from the page-cache mapping (or a pool buffer
                // past the object's end) straight into the client's memory.
                let mapped = {
                    let store = store.clone();
                    let memory = memory.clone();
                    let chunks = r.chunks.clone();
                    tokio::task::spawn_blocking(move || -> Result<bool, WireError> {
                        let Some(read) = store.read_mapped(r.ino, r.offset, len).map_err(WireError::from)? else {
                            return Ok(false);
                        };
                        memory.put(&chunks, read.as_bytes()).map_err(|e| memory_error(&peer, e))?;
                        Ok(true)
                    })
                    .await
                    .map_err(join_error)??
                };
                drop(permit);
                if !mapped {
                    let mut buf = ctx.pool.acquire(len as usize).await;
                    let peer = ctx.peer.clone();
                    tokio::task::spawn_blocking(move || -> Result<(), WireError> {
                        store.read(r.ino, r.offset, buf.as_mut_slice()).map_err(WireError::from)?;
                        memory.put(&r.chunks, buf.as_slice()).map_err(|e| memory_error(&peer, e))
                    })
                    .await
                    .map_err(join_error)??;
                }
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
                let mut buf = ctx.pool.acquire(len as usize).await;
                if len <= u64::from(INLINE_IO_BYTES_MAX) {
                    memory.get(&w.chunks, buf.as_mut_slice()).map_err(|e| memory_error(&ctx.peer, e))?;
                    store.write(w.ino, w.offset, buf.as_slice()).map_err(WireError::from)?;
                    return Ok(Response::WriteChunks(len as u32).into());
                }
                let peer = ctx.peer.clone();
                tokio::task::spawn_blocking(move || -> Result<(), WireError> {
                    memory.get(&w.chunks, buf.as_mut_slice()).map_err(|e| memory_error(&peer, e))?;
                    store.write(w.ino, w.offset, buf.as_slice()).map_err(WireError::from)
                })
                .await
                .map_err(join_error)??;
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
    let server_cfg = ServerConfig {
        limits: FrameLimits { body_bytes_max: 64 << 10, data_bytes_max: cfg.transfer_unit_bytes },
        slots_max: cfg.slots_max,
        sessions_max: cfg.sessions_max,
        pool_buffers: cfg.pool_buffers,
        shm_addr: shm_addr.clone(),
        ..ServerConfig::default()
    };
    let server = RpcServer::<AnyFabric, _>::new(
        server_cfg,
        Arc::new(DataService::new(store.clone(), cfg.pool_buffers).with_short_circuit(cfg.short_circuit)),
    );
    info!(id = cfg.id, %addr, %advertise, shm = ?shm_addr, root = %cfg.root.display(), mds = %cfg.mds, "data server listening");
    tokio::spawn(heartbeat(cfg.clone(), advertise, store));
    if let Some(l) = shm_listener {
        let server = server.clone();
        tokio::spawn(async move {
            if let Err(e) = server.serve(l).await {
                warn!("shm listener ended: {e}");
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
