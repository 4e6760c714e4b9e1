//! The metadata service process: the RPC service over a [`Namespace`], its configuration, and the garbage
//! collector that deletes the objects of removed files from the data servers.
//!
//! Store transactions are synchronous and durable (a journal fdatasync), so they run on tokio's blocking pool.
//! Invariant: a file's objects are deleted only after the transaction that removed its last name committed
//! (it records the file in the orphan table in that same transaction), so a crash never loses track of them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tracing::{debug, info, warn};
use weft_fabric::{AnyFabric, Fabric, Listener, TcpFabric};
use weft_proto::msg::InoReq;
use weft_proto::{ErrorCode, FrameLimits, Request, WireError};
use weft_rpc::{CallCtx, ClientConfig, PoolBuf, Reply, RpcClient, RpcServer, ServerConfig, Service};

use crate::{JournalConfig, Namespace, RedbStore, SystemClock};

/// `weft meta --config F`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaConfig {
    /// Address to listen on (`host:0` picks a free port).
    pub listen: String,
    /// Also serve clients over the `rdma` fabric's messages at this address (`rdma:host:port`), e.g. on a cluster
    /// whose clients reach nothing else; off by default (metadata is never on the data path).
    #[serde(default)]
    pub rdma_listen: Option<String>,
    /// Directory of the embedded store (`meta.redb`).
    pub data_dir: PathBuf,
    /// A data server unheard of for this long is reported down.
    #[serde(default = "default_liveness_ms")]
    pub liveness_ms: u64,
    #[serde(default = "default_slots_max")]
    pub slots_max: u32,
    #[serde(default = "default_sessions_max")]
    pub sessions_max: u32,
    /// How often removed files' objects are collected from the data servers.
    #[serde(default = "default_gc_interval_ms")]
    pub gc_interval_ms: u64,
    /// Size each metadata journal segment is preallocated to.
    #[serde(default = "default_journal_segment_bytes")]
    pub journal_segment_bytes: u64,
    /// Journal bytes not yet checkpointed above which writers wait for a checkpoint (back-pressure).
    #[serde(default = "default_journal_bytes_max")]
    pub journal_bytes_max: u64,
    /// Journal bytes since the last checkpoint that trigger the next one.
    #[serde(default = "default_checkpoint_bytes")]
    pub checkpoint_bytes: u64,
    /// Longest a journaled change waits for a checkpoint into the store (bounds replay time after a crash).
    #[serde(default = "default_checkpoint_interval_ms")]
    pub checkpoint_interval_ms: u64,
}

impl MetaConfig {
    /// The store's journal limits from this config.
    pub fn journal(&self) -> JournalConfig {
        JournalConfig {
            segment_bytes: self.journal_segment_bytes,
            journal_bytes_max: self.journal_bytes_max,
            checkpoint_bytes: self.checkpoint_bytes,
            checkpoint_interval_ms: self.checkpoint_interval_ms,
        }
    }
}

fn default_liveness_ms() -> u64 {
    5000
}
fn default_slots_max() -> u32 {
    64
}
fn default_sessions_max() -> u32 {
    4096
}
fn default_gc_interval_ms() -> u64 {
    1000
}
fn default_journal_segment_bytes() -> u64 {
    JournalConfig::default().segment_bytes
}
fn default_journal_bytes_max() -> u64 {
    JournalConfig::default().journal_bytes_max
}
fn default_checkpoint_bytes() -> u64 {
    JournalConfig::default().checkpoint_bytes
}
fn default_checkpoint_interval_ms() -> u64 {
    JournalConfig::default().checkpoint_interval_ms
}

pub struct MetaService {
    ns: Arc<Namespace<RedbStore, SystemClock>>,
}

impl Service for MetaService {
    async fn call(&self, _ctx: &CallCtx, req: Request, _data: Option<PoolBuf>) -> Result<Reply, WireError> {
        // Point reads never wait for a disk flush (redb reads from its cache; a miss is one pread), so they run
        // in place: a hop to the blocking pool costs two thread wake-ups, more than the lookup itself. Writes
        // wait for the journal's fdatasync and readdir pages may be long, so those go to the blocking pool.
        if matches!(req, Request::GetAttr(_) | Request::Lookup(_) | Request::Readlink(_) | Request::Null(_)) {
            return Ok(self.ns.execute(&req)?.into());
        }
        let ns = self.ns.clone();
        let resp = tokio::task::spawn_blocking(move || ns.execute(&req))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("metadata task failed: {e}")))??;
        Ok(resp.into())
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaServerError {
    #[error("opening the metadata store in {dir}: {source}")]
    Store { dir: PathBuf, source: crate::MetaError },
    #[error("listening on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("serving: {0}")]
    Serve(std::io::Error),
}

/// Runs the metadata service until the process is stopped. `ready` is told the listening address.
pub async fn run(cfg: MetaConfig, ready: impl FnOnce(&str)) -> Result<(), MetaServerError> {
    let dir = cfg.data_dir.clone();
    std::fs::create_dir_all(&dir).map_err(|e| MetaServerError::Store { dir: dir.clone(), source: e.into() })?;
    let store = RedbStore::open_with(&dir, cfg.journal())
        .map_err(|source| MetaServerError::Store { dir: dir.clone(), source })?;
    let ns = Namespace::new(store, SystemClock, cfg.liveness_ms)
        .map_err(|source| MetaServerError::Store { dir: dir.clone(), source })?;
    let ns = Arc::new(ns);
    let fabric = AnyFabric::default();
    let listener = fabric
        .listen(&cfg.listen)
        .await
        .map_err(|source| MetaServerError::Listen { addr: cfg.listen.clone(), source })?;
    let addr = listener.local_addr().map_err(MetaServerError::Serve)?;
    let server_cfg = ServerConfig {
        limits: FrameLimits { body_bytes_max: 1 << 20, data_bytes_max: 0 },
        slots_max: cfg.slots_max,
        sessions_max: cfg.sessions_max,
        pool_buffers: 1,
        ..ServerConfig::default()
    };
    let server = RpcServer::<AnyFabric, _>::new(server_cfg, Arc::new(MetaService { ns: ns.clone() }));
    info!(%addr, store = %dir.display(), "metadata service listening");
    if let Some(rdma) = &cfg.rdma_listen {
        let l = fabric.listen(rdma).await.map_err(|source| MetaServerError::Listen { addr: rdma.clone(), source })?;
        info!(addr = %l.local_addr().map_err(MetaServerError::Serve)?, "metadata service listening on rdma");
        let server = server.clone();
        tokio::spawn(async move {
            if let Err(e) = server.serve(l).await {
                tracing::warn!("rdma listener ended: {e}");
            }
        });
    }
    tokio::spawn(collect_orphans(ns, cfg.gc_interval_ms));
    ready(&addr);
    server.serve(listener).await.map_err(MetaServerError::Serve)
}

/// Most orphans handled per round; the rest wait for the next one.
const GC_BATCH: usize = 256;

async fn collect_orphans(ns: Arc<Namespace<RedbStore, SystemClock>>, interval_ms: u64) {
    let mut clients: HashMap<u32, RpcClient<TcpFabric>> = HashMap::new();
    let rpc_cfg = ClientConfig { client_name: "mds-gc".into(), slots: 8, attempts_max: 1, ..ClientConfig::default() };
    let mut tick = tokio::time::interval(Duration::from_millis(interval_ms.max(10)));
    loop {
        tick.tick().await;
        let orphans = {
            let ns = ns.clone();
            match tokio::task::spawn_blocking(move || ns.orphans(GC_BATCH)).await {
                Ok(o) => o,
                Err(_) => continue,
            }
        };
        if orphans.is_empty() {
            continue;
        }
        let addrs: HashMap<u32, String> = ns.servers().into_iter().map(|s| (s.id, s.addr)).collect();
        for (ino, layout) in orphans {
            let mut all_removed = true;
            for server in &layout.servers {
                let client = match clients.get(server) {
                    Some(c) => c.clone(),
                    None => {
                        let Some(addr) = addrs.get(server) else {
                            all_removed = false;
                            continue;
                        };
                        match RpcClient::connect(TcpFabric::default(), addr, rpc_cfg.clone()).await {
                            Ok(c) => {
                                clients.insert(*server, c.clone());
                                c
                            }
                            Err(e) => {
                                debug!(server, "orphan collection: cannot reach data server: {e}");
                                all_removed = false;
                                continue;
                            }
                        }
                    }
                };
                if let Err(e) = client.call_simple(Request::RemoveObject(InoReq { ino })).await {
                    debug!(server, ino, "orphan collection: remove failed, will retry: {e}");
                    clients.remove(server);
                    all_removed = false;
                }
            }
            if all_removed {
                let ns = ns.clone();
                match tokio::task::spawn_blocking(move || ns.orphan_done(ino)).await {
                    Ok(Ok(())) => debug!(ino, "objects of removed file collected"),
                    other => warn!(ino, "cannot clear orphan record: {other:?}"),
                }
            }
        }
    }
}
