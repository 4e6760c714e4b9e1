//! A data server node: [`run`] opens the object store, listens (tcp, and shm and rdma where they can be had) and
//! serves [`DataService`]; `heartbeat` registers the server with the metadata service and repeats it, carrying
//! the server's free space, so the MDS reports it up (and up again after either side restarts). Each reply feeds
//! the server's lease to serve clients (`lease.rs`); the first heartbeat is sent before the server reports ready,
//! so a cluster that reports it up finds it serving.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use weft_fabric::{AnyFabric, Fabric, Listener, ShmFabric, ShmServerConfig, TcpFabric};
use weft_proto::msg::{RegisterPnfsReq, RegisterServerDevReq};
use weft_proto::{FrameLimits, Request, Response, ServerState};
use weft_rpc::{BufferPool, CapabilityKey, ClientConfig, Credential, RpcClient, RpcServer, ServerConfig};

use crate::cache_fill::CacheFiller;
use crate::capabilities::CapabilityGate;
use crate::config::DataConfig;
use crate::lease::LeaseGate;
use crate::service::DataService;
use crate::store::ObjectStore;

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
    #[error("{0}")]
    Key(weft_rpc::KeyError),
    #[error("{0}")]
    Keyring(weft_rpc::KeyringError),
    #[error("{0}")]
    Tls(weft_fabric::TlsError),
    #[error("the [cache] table: {0}")]
    Cache(weft_cache::ConfigError),
    #[error("configuration: {0}")]
    Config(String),
}

/// What a data server hands its pNFS data-server listener (weft-nfs `ds`, docs/format.md §23), which lives in a
/// crate above this one: the config, the object store, the capability gate Weft's own requests go through (so a
/// removal is seen by both) and the lease (so a fenced server serves pNFS no more than Weft's own clients).
pub struct NfsParts {
    pub cfg: DataConfig,
    pub store: Arc<ObjectStore>,
    /// `None` with authentication off: nothing is checked.
    pub gate: Option<Arc<CapabilityGate>>,
    pub lease: Arc<LeaseGate>,
    /// The server's buffer zones (Weft's own data path's): RPC-over-RDMA READs are read into them and RDMA
    /// WRITTEN from there, with no staging copy.
    pub pool: BufferPool,
}

/// The addresses the pNFS listeners bound.
#[derive(Debug, Clone, Default)]
pub struct NfsBound {
    /// `nfs_listen` (TCP).
    pub tcp: Vec<SocketAddr>,
    /// `nfs_rdma_listen` (RPC-over-RDMA), when set.
    pub rdma: Option<SocketAddr>,
}

/// Starts the pNFS listeners on `cfg.nfs_listen` and `cfg.nfs_rdma_listen` and answers the addresses they bound
/// (they serve in tasks and threads of their own).
pub type NfsStarter =
    Box<dyn FnOnce(NfsParts) -> Pin<Box<dyn Future<Output = Result<NfsBound, std::io::Error>> + Send>> + Send>;

/// Runs a data server until the process is stopped. `ready` is told the listening address.
pub async fn run(cfg: DataConfig, ready: impl FnOnce(&str)) -> Result<(), DataServerError> {
    run_with_nfs(cfg, ready, None).await
}

/// [`run`], also serving pNFS through `nfs` when `nfs_listen` is set (the `weft data` binary passes weft-nfs's
/// starter). A server whose config asks for NFS but that has no starter refuses to start.
pub async fn run_with_nfs(
    cfg: DataConfig,
    ready: impl FnOnce(&str),
    nfs: Option<NfsStarter>,
) -> Result<(), DataServerError> {
    cfg.check().map_err(DataServerError::Config)?;
    let key =
        weft_rpc::auth::role_key(cfg.auth, cfg.key_file.as_deref(), "data server").map_err(DataServerError::Key)?;
    let store =
        ObjectStore::open(&cfg.root).map_err(|source| DataServerError::Store { root: cfg.root.clone(), source })?;
    let store = Arc::new(store);
    let shm_rules =
        ShmServerConfig { socket_group: cfg.shm_socket_group.clone(), arena_bytes_max: cfg.shm_arena_bytes_max };
    let ring =
        weft_rpc::auth::role_keyring(key.clone(), cfg.clients_keyring.as_deref()).map_err(DataServerError::Keyring)?;
    let tls = cfg.tls_config().map_err(DataServerError::Tls)?;
    let tcp = TcpFabric::default().with_tls(tls);
    // The rdma side channel proves the same keys before any queue pair exists; handshakes are bounded.
    let fabric = AnyFabric::new(tcp.clone(), ShmFabric::default().with_server(shm_rules))
        .with_side_channel_auth(ring.clone().map(weft_rpc::SideServer::boxed))
        .with_rdma_handshake_limits(cfg.rdma_handshakes_max, cfg.rdma_handshake_timeout_ms);
    let listener = fabric
        .listen(&cfg.listen)
        .await
        .map_err(|source| DataServerError::Listen { addr: cfg.listen.clone(), source })?;
    let addr = listener.local_addr().map_err(DataServerError::Serve)?;
    let advertise = cfg.advertise.clone().unwrap_or_else(|| addr.clone());
    let shm_listener = listen_shm(&fabric, &cfg).await;
    let shm_addr = shm_listener.as_ref().and_then(|l| l.local_addr().ok());
    let (rdma_listener, rdma_addr) = listen_rdma(&fabric, &cfg, &addr, &advertise).await;
    let metrics = match &cfg.metrics_listen {
        Some(at) => {
            let m = weft_rpc::Metrics::new("data");
            weft_rpc::metrics::register_client(&m);
            m.listen(at).await.map_err(|source| DataServerError::Listen { addr: at.clone(), source })?;
            Some(m)
        }
        None => None,
    };
    let server_cfg = ServerConfig {
        metrics: metrics.clone(),
        limits: FrameLimits { body_bytes_max: 64 << 10, data_bytes_max: cfg.transfer_unit_bytes },
        slots_max: cfg.slots_max,
        sessions_max: cfg.sessions_max,
        pool_buffers: cfg.pool_buffers,
        shm_addr: shm_addr.clone(),
        rdma_addr: rdma_addr.clone(),
        auth: ring,
        served_ops: served_ops(),
        ..ServerConfig::default()
    };
    let pool = BufferPool::with_classes(&cfg.pool_classes()).map_err(DataServerError::Pool)?;
    let gate = key.as_ref().map(|k| {
        Arc::new(CapabilityGate::new(
            CapabilityKey::derive(k),
            cfg.capability_clock_skew_ms,
            cfg.removed_inode_memory_ms,
            cfg.removed_inodes_max as usize,
        ))
    });
    let lease = Arc::new(LeaseGate::new(cfg.id, cfg.lease_ms));
    let nfs_wanted = !cfg.nfs_listen.is_empty() || cfg.nfs_rdma_listen.is_some();
    let nfs_named = || cfg.nfs_listen.iter().chain(cfg.nfs_rdma_listen.iter()).cloned().collect::<Vec<_>>().join(",");
    let nfs_addrs = match (nfs_wanted, nfs) {
        (false, _) => Vec::new(),
        (true, None) => {
            return Err(DataServerError::Listen {
                addr: nfs_named(),
                source: std::io::Error::new(std::io::ErrorKind::Unsupported, "this build serves no pNFS"),
            });
        }
        (true, Some(start)) => {
            let parts = NfsParts {
                cfg: cfg.clone(),
                store: store.clone(),
                gate: gate.clone(),
                lease: lease.clone(),
                pool: pool.clone(),
            };
            let bound = start(parts).await.map_err(|source| DataServerError::Listen { addr: nfs_named(), source })?;
            let advertised: Vec<String> = if cfg.nfs_advertise.is_empty() {
                let rdma = bound.rdma.iter().map(|a| format!("{}{a}", weft_proto::msg::PNFS_RDMA_PREFIX));
                bound.tcp.iter().map(ToString::to_string).chain(rdma).collect()
            } else {
                cfg.nfs_advertise.clone()
            };
            info!(id = cfg.id, bound = ?bound, advertised = ?advertised, "pnfs data server listening");
            advertised
        }
    };
    let filler = match &cfg.cache {
        Some(cache) => {
            let seal = match &key {
                Some(k) => weft_cache::BankKey::for_cluster(|parts| k.sign(parts), cache.key_generation),
                None => weft_cache::BankKey::public(),
            };
            CacheFiller::start(cache, seal, cfg.fill_limits(), store.clone(), cfg.id).map_err(DataServerError::Cache)?
        }
        None => None,
    };
    let service = DataService::new(store.clone(), cfg.pool_buffers)
        .with_shared_capability_gate(gate)
        .with_lease_gate(Some(lease.clone()))
        .with_cache_filler(filler)
        .with_short_circuit(cfg.short_circuit)
        .with_pipeline_piece_bytes(cfg.pipeline_piece_bytes)
        .with_rdma_pipeline_piece_bytes(cfg.rdma_pipeline_piece_bytes)
        .with_metrics(metrics.as_deref());
    let server = RpcServer::<AnyFabric, _>::with_pool(server_cfg, Arc::new(service), pool);
    info!(id = cfg.id, %addr, tls = cfg.tls, %advertise, shm = ?shm_addr, rdma = ?rdma_addr, root = %cfg.root.display(), mds = %cfg.mds, "data server listening");
    // Drawn (and logged) now, not at the first fsync: an operator comparing logs across a reboot sees it change.
    crate::verifier::write_verifier();
    // One heartbeat per metadata service (each must hear every data server, docs/format.md §28), and one beat of
    // each before reporting ready (bounded by its call timeout): with a service up, the server serves from its
    // first request; without, it refuses clients (StaleLayout) until one answers.
    let mut first_beats = tokio::task::JoinSet::new();
    for mds in cfg.mds.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let parts = (tcp.clone(), advertise.clone(), nfs_addrs.clone(), store.clone(), lease.clone());
        let credential = key.clone().map(Credential::cluster);
        let mut heartbeat = Heartbeat::new(cfg.clone(), mds.to_string(), parts, credential);
        first_beats.spawn(async move {
            heartbeat.beat().await;
            heartbeat
        });
    }
    while let Some(beaten) = first_beats.join_next().await {
        match beaten {
            Ok(heartbeat) => drop(tokio::spawn(heartbeat.run())),
            Err(e) => warn!("a first heartbeat panicked: {e}"),
        }
    }
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

type AnyListener = <AnyFabric as Fabric>::Listener;

/// The shm listener, if configured. It is an optimisation: a server that cannot bind it (path too long, read-only
/// root) still serves everyone over TCP.
async fn listen_shm(fabric: &AnyFabric, cfg: &DataConfig) -> Option<AnyListener> {
    if !cfg.shm {
        return None;
    }
    let path = cfg.shm_socket.clone().unwrap_or_else(|| cfg.root.join("weft-data.sock"));
    let shm_addr = format!("{}{}", weft_fabric::shm::SHM_SCHEME, path.display());
    match fabric.listen(&shm_addr).await {
        Ok(l) => Some(l),
        Err(e) => {
            warn!(%shm_addr, "no shm listener, same-host clients will use tcp: {e}");
            None
        }
    }
}

/// The rdma listener, if configured and this host has a device, with the address clients are told (the
/// advertised host, the listener's port). So is rdma an optimisation: without a device (most hosts) the server
/// says so once and serves over tcp and shm.
async fn listen_rdma(
    fabric: &AnyFabric,
    cfg: &DataConfig,
    addr: &str,
    advertise: &str,
) -> (Option<AnyListener>, Option<String>) {
    if !cfg.rdma {
        return (None, None);
    }
    let ip = addr.rsplit_once(':').map_or("0.0.0.0", |(h, _)| h);
    let listen = format!("rdma:{ip}:{}", cfg.rdma_port);
    match fabric.listen(&listen).await {
        Ok(l) => {
            let port = l.local_addr().ok().and_then(|a| a.rsplit_once(':').map(|(_, p)| p.to_string()));
            let host = advertise.rsplit_once(':').map_or(ip, |(h, _)| h);
            (Some(l), port.map(|p| format!("rdma:{host}:{p}")))
        }
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            info!("no rdma listener: {e}");
            (None, None)
        }
        Err(e) => {
            warn!(%listen, "no rdma listener, clients will use tcp: {e}");
            (None, None)
        }
    }
}

/// Registers with the MDS and repeats it as a heartbeat carrying this server's space; each reply renews (or ends)
/// the lease to serve clients. Survives MDS restarts.
struct Heartbeat {
    cfg: DataConfig,
    /// The one metadata service this heartbeat goes to.
    mds: String,
    tcp: TcpFabric,
    advertise: String,
    /// The pNFS addresses, announced after every heartbeat so a restarted MDS learns them again within one.
    nfs_addrs: Vec<String>,
    store: Arc<ObjectStore>,
    rpc_cfg: ClientConfig,
    client: Option<RpcClient<TcpFabric>>,
    lease: Arc<LeaseGate>,
    healthy: bool,
    /// The state the MDS last answered, to log changes once.
    state: Option<ServerState>,
    /// The lease in force last logged about (its clamp to the MDS's `rebuild_after_ms`).
    lease_ms: u64,
}

impl Heartbeat {
    /// The heartbeat of `cfg`'s server to the service at `mds`; `parts`: the fabric, the address it advertises,
    /// its pNFS addresses, its store (for its space) and the lease its replies renew.
    fn new(
        cfg: DataConfig,
        mds: String,
        parts: (TcpFabric, String, Vec<String>, Arc<ObjectStore>, Arc<LeaseGate>),
        credential: Option<Credential>,
    ) -> Heartbeat {
        let (tcp, advertise, nfs_addrs, store, lease) = parts;
        let rpc_cfg = ClientConfig {
            credential,
            client_name: format!("data-server-{}", cfg.id),
            slots: 1,
            call_timeout_ms: cfg.heartbeat_ms.max(1000) * 5,
            attempts_max: 1,
            ..ClientConfig::default()
        };
        let lease_ms = cfg.lease_ms;
        Heartbeat {
            cfg,
            mds,
            tcp,
            advertise,
            nfs_addrs,
            store,
            rpc_cfg,
            client: None,
            lease,
            healthy: true,
            state: None,
            lease_ms,
        }
    }

    async fn run(mut self) {
        let mut tick = tokio::time::interval(Duration::from_millis(self.cfg.heartbeat_ms.max(10)));
        // The first tick is immediate; `run` follows a beat.
        tick.tick().await;
        loop {
            tick.tick().await;
            self.beat().await;
        }
    }

    /// One heartbeat: its reply feeds the lease, measured from before it was sent.
    async fn beat(&mut self) {
        let cfg = &self.cfg;
        let space = {
            let store = self.store.clone();
            match tokio::task::spawn_blocking(move || store.space_dev()).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    warn!("cannot read space of {}: {e}", cfg.root.display());
                    Default::default()
                }
                Err(_) => Default::default(),
            }
        };
        let sent_ms = self.lease.now_ms();
        let mut connect_error = None;
        if self.client.is_none() {
            self.client = RpcClient::connect(self.tcp.clone(), &self.mds, self.rpc_cfg.clone())
                .await
                .map_err(|e| connect_error = Some(e.to_string()))
                .ok();
        }
        let result = match &self.client {
            Some(c) => match c
                .call_simple(Request::RegisterServerDev(RegisterServerDevReq {
                    id: cfg.id,
                    addr: self.advertise.clone(),
                    space,
                }))
                .await
            {
                Ok(Response::RegisterServerDev(r)) => Ok(r),
                Ok(other) => Err(format!("unexpected reply {:?}", other.op())),
                Err(e) => Err(e.to_string()),
            },
            None => Err(connect_error.unwrap_or_else(|| format!("cannot connect to {}", self.mds))),
        };
        let result = match (result, &self.client) {
            (Ok(reply), Some(c)) if !self.nfs_addrs.is_empty() => c
                .call_simple(Request::RegisterPnfs(RegisterPnfsReq { id: cfg.id, addrs: self.nfs_addrs.clone() }))
                .await
                .map(|_| reply)
                .map_err(|e| format!("announcing the pNFS addresses: {e}")),
            (r, _) => r,
        };
        match result {
            Ok(reply) => {
                if !self.healthy {
                    info!(mds = %self.mds, "registered with the metadata service again");
                    self.healthy = true;
                }
                let lease_ms = self.lease.on_reply(sent_ms, reply);
                if self.state != Some(reply.state) {
                    if reply.state.is_up() {
                        info!(id = cfg.id, state = ?reply.state, lease_ms, "the MDS reports this server up: serving clients");
                    } else {
                        warn!(id = cfg.id, state = ?reply.state,
                            "the MDS reports this server not up: refusing client I/O (StaleLayout) until it is");
                    }
                    self.state = Some(reply.state);
                }
                if lease_ms != self.lease_ms {
                    info!(
                        id = cfg.id,
                        lease_ms,
                        configured_ms = cfg.lease_ms,
                        rebuild_after_ms = reply.rebuild_after_ms,
                        "lease to serve clients: at most half the MDS's rebuild_after_ms"
                    );
                    if lease_ms < cfg.heartbeat_ms.saturating_mul(2) {
                        warn!(
                            id = cfg.id,
                            lease_ms,
                            heartbeat_ms = cfg.heartbeat_ms,
                            "the lease is shorter than two heartbeats: one late heartbeat fences this server"
                        );
                    }
                    self.lease_ms = lease_ms;
                }
            }
            Err(e) => {
                if self.healthy {
                    warn!(mds = %self.mds, "heartbeat failed (will keep trying; client I/O is refused once the lease lapses): {e}");
                }
                self.healthy = false;
                self.client = None;
            }
        }
    }
}

/// The ops a data server answers, by the code ranges of weft-proto's msg.rs (1–99 every server, 200–299 data
/// servers): the label sets of its `weft_rpc_server_requests` series.
fn served_ops() -> Vec<(usize, &'static str)> {
    weft_proto::Op::ALL
        .iter()
        .filter(|&&op| !(100..200).contains(&(op as u16)))
        .map(|&op| (op as usize, op.name()))
        .collect()
}

#[cfg(test)]
mod served_ops_tests {
    #[test]
    fn a_data_server_counts_the_ops_it_serves() {
        let names: Vec<&str> = super::served_ops().into_iter().map(|(_, n)| n).collect();
        assert!(names.contains(&"WriteChunks") && names.contains(&"SessionCreate") && !names.contains(&"Create"));
    }
}
