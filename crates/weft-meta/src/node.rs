//! A metadata service node: [`run`] opens the store (redb, replaying its journal; or PostgreSQL with `db`),
//! listens (tcp, and rdma messages if configured), serves [`MetaService`] and starts the orphan collector
//! (`gc.rs`) and the membership task (`drain.rs`).

use std::path::PathBuf;
use std::sync::Arc;

use tracing::info;
use weft_fabric::{AnyFabric, Fabric, Listener, TcpFabric};
use weft_proto::FrameLimits;
use weft_rpc::{Credential, RpcServer, ServerConfig};

use crate::config::MetaConfig;
use crate::drain::run_membership;
use crate::gc::collect_orphans;
use crate::service::{HealHooks, MetaService};
use crate::{MdsStore, Namespace, PgConfig, PgStore, RedbStore, SystemClock};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaServerError {
    #[error("opening the metadata store in {dir}: {source}")]
    Store { dir: PathBuf, source: crate::MetaError },
    /// The PostgreSQL store (`db`) could not be opened (the connection string is not repeated: it may hold a
    /// password).
    #[error("opening the metadata database: {0}")]
    Database(crate::MetaError),
    #[error("listening on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("serving: {0}")]
    Serve(std::io::Error),
    #[error("{0}")]
    Key(weft_rpc::KeyError),
    #[error("{0}")]
    Keyring(weft_rpc::KeyringError),
    #[error("{0}")]
    Tls(weft_fabric::TlsError),
    #[error("[cache]: {0}")]
    Cache(weft_cache::ConfigError),
}

/// Runs the metadata service until the process is stopped. `ready` is told the listening address.
pub async fn run(cfg: MetaConfig, ready: impl FnOnce(&str)) -> Result<(), MetaServerError> {
    run_with(cfg, None, DutyFlag::default(), ready, |_, _| {}).await
}

/// [`run`] with a healer beside it (`weft meta` with `heal = true`: `HealNow` and `ListStale`'s progress go to
/// `heal`), also telling `started` the metrics registry (when serving metrics) and the listening address once the
/// service listens: `weft meta` starts its background scrubber there. `duty` learns whether this service holds
/// the duty lease (docs/format.md §28): the healer and the scrubber run only while it does.
pub async fn run_with(
    cfg: MetaConfig,
    heal: Option<HealHooks>,
    duty: DutyFlag,
    ready: impl FnOnce(&str),
    started: impl FnOnce(Option<&Arc<weft_rpc::Metrics>>, &str),
) -> Result<(), MetaServerError> {
    let key = weft_rpc::auth::role_key(cfg.auth, cfg.key_file.as_deref(), "metadata service")
        .map_err(MetaServerError::Key)?;
    let dir = cfg.data_dir.clone();
    let store = open_store(&cfg)?;
    let (store_name, store_stats) = match &store {
        MdsStore::Redb(s) => (dir.display().to_string(), StoreStats::Journal(s.journal_stats())),
        MdsStore::Pg(s) => ("postgresql".to_string(), StoreStats::Pg(s.stats())),
    };
    let ns = Namespace::new(store, SystemClock, cfg.liveness_ms)
        .map_err(|source| MetaServerError::Store { dir: dir.clone(), source })?
        .with_xattr_bytes_max(cfg.xattr_bytes_max_per_inode)
        .with_rebuild_after_ms(cfg.rebuild_after_ms)
        .with_stale_limits(cfg.stale_ranges_per_slot_max, cfg.stale_entries_max)
        .with_duty_lease_ms(cfg.duty_lease_ms)
        .with_locks_orphan_ms(cfg.locks_orphan_ms);
    let ns = Arc::new(ns);
    // Before serving: a lone service holds its duties from the start (format §28).
    step_duty(&ns).await;
    let _ = duty.0.set(ns.clone());
    let ring =
        weft_rpc::auth::role_keyring(key.clone(), cfg.clients_keyring.as_deref()).map_err(MetaServerError::Keyring)?;
    let tls = cfg.tls_config().map_err(MetaServerError::Tls)?;
    let tcp = TcpFabric::default().with_tls(tls);
    // The rdma side channel proves the same keys before any queue pair exists.
    let fabric = AnyFabric::new(tcp.clone(), Default::default())
        .with_side_channel_auth(ring.clone().map(weft_rpc::SideServer::boxed));
    let listener = fabric
        .listen(&cfg.listen)
        .await
        .map_err(|source| MetaServerError::Listen { addr: cfg.listen.clone(), source })?;
    let addr = listener.local_addr().map_err(MetaServerError::Serve)?;
    let metrics = match &cfg.metrics_listen {
        Some(at) => Some(serve_metrics(at, store_stats).await?),
        None => None,
    };
    let server_cfg = ServerConfig {
        metrics: metrics.clone(),
        limits: FrameLimits { body_bytes_max: 1 << 20, data_bytes_max: 0 },
        slots_max: cfg.slots_max,
        sessions_max: cfg.sessions_max,
        sessions_per_key_max: cfg.sessions_per_key_max,
        pool_buffers: 1,
        auth: ring,
        served_ops: served_ops(),
        ..ServerConfig::default()
    };
    let cap_key = key.as_ref().map(weft_rpc::CapabilityKey::derive);
    let bank = match cfg.cache.clone().filter(|c| c.enabled() && c.attrs) {
        Some(c) => {
            let seal = match &key {
                Some(k) => weft_cache::BankKey::for_cluster(|parts| k.sign(parts), c.key_generation),
                None => weft_cache::BankKey::public(),
            };
            Some(weft_cache::Bank::new(c, seal).map_err(MetaServerError::Cache)?)
        }
        None => None,
    };
    let service = MetaService::new(ns.clone())
        .with_capabilities(cap_key, cfg.capability_ttl_ms)
        .with_leases(cfg.lease_ms)
        .with_metrics(metrics.as_ref())
        .with_pnfs_handle_ttl(cfg.pnfs_handle_ttl_ms)
        .with_cache_bank(bank)
        .with_lock_quota(cfg.locks_max, cfg.locks_grace_ms, cfg.locks_per_client_session_max)
        .with_heal(heal);
    let server = RpcServer::<AnyFabric, _>::new(server_cfg, Arc::new(service));
    info!(%addr, tls = cfg.tls, store = %store_name, "metadata service listening");
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
    tokio::spawn(run_membership(
        ns.clone(),
        tcp.clone(),
        cfg.membership_interval_ms,
        key.clone().map(Credential::cluster),
    ));
    tokio::spawn(hold_duty_lease(ns.clone()));
    tokio::spawn(sweep_once_records(ns.clone()));
    tokio::spawn(collect_orphans(ns, tcp, cfg.gc_interval_ms, key.map(Credential::cluster)));
    started(metrics.as_ref(), &addr);
    ready(&addr);
    server.serve(listener).await.map_err(MetaServerError::Serve)
}

/// Whether this service holds the duty lease (docs/format.md §28) now, for the duties that run beside it in the
/// `weft` binary (the healer, the scrubber): they look before each pass. Always true on the embedded store.
#[derive(Clone, Default)]
pub struct DutyFlag(Arc<std::sync::OnceLock<Arc<crate::MdsNamespace>>>);

impl DutyFlag {
    /// False until the service has started, then whether it holds the lease.
    pub fn held(&self) -> bool {
        self.0.get().is_some_and(|ns| ns.duty_held())
    }
}

/// Steps the duty lease every third of its time (format §28), so the duties run at exactly one service.
async fn hold_duty_lease(ns: Arc<crate::MdsNamespace>) {
    let every = std::time::Duration::from_millis(ns.duty_step_every_ms().max(1));
    loop {
        tokio::time::sleep(every).await;
        step_duty(&ns).await;
    }
}

async fn step_duty(ns: &Arc<crate::MdsNamespace>) {
    let n = ns.clone();
    match tokio::task::spawn_blocking(move || n.duty_step()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!("the duty lease: reading or renewing it failed (retrying): {e}"),
        Err(e) => tracing::warn!("the duty lease: its step panicked: {e}"),
    }
    // This service's liveness for the lock sessions it holds, and (at the holder) the release of a dead
    // service's (format §30).
    let n = ns.clone();
    match tokio::task::spawn_blocking(move || n.service_beat().and_then(|()| n.reap_orphan_locks())).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!("lock sessions: the liveness beat or the release of a dead service's failed: {e}"),
        Err(e) => tracing::warn!("lock sessions: the step panicked: {e}"),
    }
}

/// Every ten minutes, removes the once records (docs/format.md §27) no retry can still need (the duty holder).
async fn sweep_once_records(ns: Arc<crate::MdsNamespace>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(600));
    loop {
        tick.tick().await;
        if !ns.duty_held() {
            continue;
        }
        let ns = ns.clone();
        match tokio::task::spawn_blocking(move || ns.sweep_once_records()).await {
            Ok(Ok(n)) if n > 0 => info!(removed = n, "swept once records older than an hour"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!("sweeping once records: {}", e.message),
            Err(e) => tracing::warn!("sweeping once records: {e}"),
        }
    }
}

/// The store `cfg` names: the PostgreSQL database `db`, else the embedded store in `data_dir`.
fn open_store(cfg: &MetaConfig) -> Result<MdsStore, MetaServerError> {
    if let Some(url) = &cfg.db {
        let pg_cfg = PgConfig::default()
            .with_connections_max(cfg.db_connections_max)
            .with_failover_timeout_ms(cfg.db_failover_timeout_ms);
        let store = PgStore::connect_with(url, pg_cfg).map_err(MetaServerError::Database)?;
        return Ok(MdsStore::Pg(Box::new(store)));
    }
    let dir = &cfg.data_dir;
    std::fs::create_dir_all(dir).map_err(|e| MetaServerError::Store { dir: dir.clone(), source: e.into() })?;
    let store = RedbStore::open_with(dir, cfg.journal())
        .map_err(|source| MetaServerError::Store { dir: dir.clone(), source })?;
    Ok(MdsStore::Redb(store))
}

/// The metrics handles of the store a service runs on.
enum StoreStats {
    Journal(crate::journal::JournalStats),
    Pg(crate::PgStats),
}

/// The MDS's metrics (the RPC server's, added by `RpcServer`; the store's: the journal's or PostgreSQL's; the RPC
/// clients' of the orphan collector), served on `at`.
async fn serve_metrics(at: &str, store: StoreStats) -> Result<Arc<weft_rpc::Metrics>, MetaServerError> {
    let m = weft_rpc::Metrics::new("mds");
    match store {
        StoreStats::Journal(journal) => {
            m.register("weft_mds_journal_commits", "Journal group commits (one fdatasync each)", journal.commits);
            m.register(
                "weft_mds_journal_group_entries",
                "Journal entries (metadata transactions) made durable by one group commit",
                journal.group_entries,
            );
        }
        StoreStats::Pg(pg) => {
            let retries = "PostgreSQL write transactions run again (conflict, deadlock, connection lost)";
            m.register("weft_mds_pg_retries", retries, pg.retries);
            m.register("weft_mds_pg_gave_up", "PostgreSQL writes failed after their last try", pg.gave_up);
        }
    }
    weft_rpc::metrics::register_client(&m);
    m.listen(at).await.map_err(|source| MetaServerError::Listen { addr: at.to_string(), source })?;
    Ok(m)
}

/// The ops the MDS answers, by the code ranges of weft-proto's msg.rs (1–99 every server, 100–199 the MDS): the
/// label sets of its `weft_rpc_server_requests` series.
fn served_ops() -> Vec<(usize, &'static str)> {
    weft_proto::Op::ALL.iter().filter(|&&op| (op as u16) < 200).map(|&op| (op as usize, op.name())).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use weft_proto::msg::{LookupReq, MkdirReq};
    use weft_proto::{FileKind, ROOT_INO, Request, Response};
    use weft_rpc::{ClientConfig, RpcClient};

    use super::*;

    #[test]
    fn the_mds_counts_the_ops_it_serves() {
        let names: Vec<&str> = served_ops().into_iter().map(|(_, n)| n).collect();
        assert!(names.contains(&"Create") && names.contains(&"SessionCreate") && !names.contains(&"WriteChunks"));
    }

    /// Starts a metadata service on `db = url` (no authentication) on `rt`; returns its address.
    fn start(rt: &tokio::runtime::Runtime, url: &str, data_dir: &std::path::Path) -> String {
        let text = format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nauth = \"none\"\ndb = \"{url}\"\n",
            data_dir.display()
        );
        let cfg: MetaConfig = toml::from_str(&text).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let served = run(cfg, move |addr| {
                let _ = tx.send(addr.to_string());
            })
            .await;
            panic!("the metadata service ended: {served:?}");
        });
        rx.recv_timeout(Duration::from_secs(30)).expect("the metadata service started")
    }

    /// Two services on one database (`weft meta` with `db`): what one creates, the other serves; the embedded
    /// store's directory is never made.
    #[test]
    fn two_services_serve_one_postgresql_database() {
        let url = crate::pg_testing::fresh_url();
        let unused = std::env::temp_dir().join(format!("weft-meta-no-redb-{}", std::process::id()));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (one, two) = (start(&rt, &url, &unused), start(&rt, &url, &unused));
        rt.block_on(async {
            let client = |addr: String| async move {
                RpcClient::connect(TcpFabric::default(), &addr, ClientConfig::default()).await.unwrap()
            };
            let mkdir = Request::Mkdir(MkdirReq { parent: ROOT_INO, name: "shared".into(), mode: 0o40755 });
            let (made, _) = client(one).await.call(mkdir, Vec::new(), Vec::new()).await.unwrap();
            let Response::Mkdir(made) = made else { panic!("{made:?}") };
            let lookup = Request::Lookup(LookupReq { parent: ROOT_INO, name: "shared".into() });
            let (found, _) = client(two).await.call(lookup, Vec::new(), Vec::new()).await.unwrap();
            let Response::Lookup(found) = found else { panic!("{found:?}") };
            assert_eq!((found.ino, found.kind), (made.ino, FileKind::Dir));
        });
        rt.shutdown_background();
        assert!(!unused.exists(), "no embedded store was opened");
    }
}
