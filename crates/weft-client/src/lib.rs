//! The native client library: everything an application (or the `weft` CLI, or a FUSE daemon) needs to use a
//! Weft cluster.
//!
//! - [`Client`] holds one session with the metadata service and one per data server (opened lazily), plus a
//!   bounded cache of layouts. Namespace calls go to the MDS; data never does.
//! - [`File`] is an open file: reads and writes are split by the layout into per-server pieces, merged into
//!   transfer units and sent to all the file's data servers at once. Payload bytes go from the caller's buffer to
//!   the socket and from the socket into the caller's buffer, never through a copy.
//! - Data-server access is by capability: [`Client::open`] (an [`OpenMode`]) and [`Client::create_path`] get one
//!   from the MDS with the file's fresh attributes, and the [`File`] renews it while it is used.
//! - A `Client` acts as one user: the process's uid, gid and groups by default, or any other with
//!   [`Client::with_user`] (a FUSE daemon, per request). Every metadata request carries that user (its user block);
//!   the MDS decides what it may do under the key the client proved, and owns new entries to it.
//! - Consistency is close-to-open: [`Client::open`] fetches fresh attributes; [`File::sync`] and [`File::close`]
//!   commit size and mtime to the MDS (LAYOUTCOMMIT), the largest size winning among concurrent writers.
//! - With a cache bank (`[cache]`, `attrs = true`), [`Client::getattr`] and [`Client::lookup`] ask it first (the
//!   MDS publishes every change there before it replies) and the MDS on a miss; opens always go to the MDS. A
//!   client never stores into the bank (see `weft_cache::attrs`).
//! - Advisory locks ([`Client::set_lock`], [`Client::get_lock`], [`Client::release_locks`]) are kept by the MDS for
//!   this client's session and an owner id the caller picks (`locks.rs`).

mod capability;
mod catch_up;
mod cluster;
mod ec;
mod ec_cache;
mod ec_calls;
mod ec_codec;
mod ec_delta;
mod ec_gather;
mod ec_rows;
#[cfg(test)]
mod ec_sim;
mod ec_version;
mod ec_write;
mod error;
mod file;
mod handle;
mod io_queue;
mod layouts;
pub mod lease_channel;
pub mod lease_trust;
pub mod meta_cache;
mod mirror;
mod mirror_fence;
mod plain;
mod recycle;
mod redundancy;
pub mod scrub;
mod stale;
mod striped;
pub mod test_hooks;
mod transfer;
mod verifier;
#[cfg(test)]
mod verifier_sim;

pub use capability::OpenMode;
pub use catch_up::heal_rows;
pub use cluster::{ClientTuning, ClusterConfig, FabricChoice};
pub use error::ClientError;
pub use handle::File;
pub use io_queue::{Completion, IoKind, IoOp, IoQueue};
pub use locks::{LOCK_KEEPALIVE_MS, LOCK_RETRY_FIRST_MS, LOCK_RETRY_MAX_MS};
/// The security mode of `ClusterConfig::auth`.
pub use weft_rpc::AuthMode;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use weft_fabric::{AnyFabric, ShmConfig, ShmFabric, TcpFabric};
use weft_proto::msg::*;
use weft_proto::{
    Attr, Capability, DirEntry, ErrorCode, Layout, ROOT_INO, Request, Response, Rights, ServerInfo, SetAttrs, StatFs,
    UserCred,
};
use weft_rpc::{ClientConfig, RpcClient};

use crate::capability::{CapHolder, is_expired};
use crate::layouts::LayoutCache;

pub type Rpc = RpcClient<AnyFabric>;

/// A connection to one Weft cluster, acting as one user. Cheap to clone; [`Client::with_user`] makes a client for
/// another user sharing the same sessions.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    user: Arc<UserCred>,
}

/// How long a data server that did not answer is left out of redundant reads before they try it again. Plain
/// reads and all writes always try it: only a read that can be served from the other chunks or copies skips it.
pub(crate) const UNREACHABLE_HOLD_MS: u64 = 2000;

/// The answers of the positions a request went to that succeeded, and the failures of the others, each by
/// position, ascending.
/// Each answer with the session it came on (`None`: the session changed while the call ran).
type Answered = (Vec<(usize, Response, Option<u64>)>, Vec<(usize, ClientError)>);

/// What a sync of a handle's positions found.
#[derive(Debug, Default)]
pub(crate) struct Synced {
    /// The positions that synced, with their write verifiers after the sync (docs/format.md §33).
    pub(crate) answers: Vec<verifier::Answer>,
    /// The positions that failed, with why.
    pub(crate) failed: Vec<(usize, ClientError)>,
}

struct Inner {
    tuning: ClientTuning,
    rpc_cfg: ClientConfig,
    mds: Rpc,
    /// Data server addresses by id, refreshed from the MDS when an unknown id shows up in a layout.
    servers: Mutex<HashMap<u32, String>>,
    /// Open data-server sessions: looked up under a plain lock on every read and write.
    ds: Mutex<HashMap<u32, Rpc>>,
    /// Serialises opening sessions, so two calls to a new server open one.
    ds_connect: tokio::sync::Mutex<()>,
    /// Each data server's write verifier as last learned (docs/format.md §33).
    verifiers: verifier::Verifiers,
    /// Data servers that did not answer (connect refused, timed out, connection lost), with when: redundant reads
    /// leave them out for [`UNREACHABLE_HOLD_MS`] and decode from, or read, the other chunks. One entry per server
    /// of the cluster at most.
    unreachable_ds: Mutex<HashMap<u32, std::time::Instant>>,
    /// This client's own changes sent to the MDS (docs/format.md §31, "a mount's own changes").
    own: Mutex<OwnChanges>,
    layouts: LayoutCache,
    /// One fabric for all sessions: its shm side owns the client's arena, shared with every shm server.
    fabric: AnyFabric,
    /// The cache bank (`[cache]` in cluster.toml), if it names any daemon.
    bank: Option<weft_cache::Bank>,
    /// Parity buffers of ec writes, reused (`recycle.rs`).
    recycled: recycle::Recycled,
    /// Which inode each name named at its last lookup (bounded: the bank's `lookup_guesses_max` slots), so a
    /// lookup through the bank fetches the entry and the child's attributes in one multi-get.
    guesses: weft_cache::attrs::EntryGuesses,
    /// Whether this client's attribute and lookup calls keep missing the bank, and so pause asking it.
    attr_misses: weft_cache::MissHint,
    /// Whether the MDS runs requests as the user they assert (the cluster key, or no authentication), so this
    /// client can check a directory's search permission for its own user exactly; a per-client key may map the
    /// user to another (docs/format.md §9), and then only a directory anyone may search is checked locally.
    asserted_user_is_effective: bool,
    /// Set once the first lock is granted: the keepalive task runs from then on (`locks.rs`).
    lock_keepalive: std::sync::OnceLock<()>,
    /// The MDS session this client's locks were taken on (0: none yet); when the client's session changes (its
    /// service died, another answers), the locks are adopted from it before the next lock call (format §30).
    locks_session: std::sync::atomic::AtomicU64,
    /// Attributes and entries cached under metadata leases, once [`Client::hold_leases`] started the channel.
    meta_cache: std::sync::OnceLock<Arc<Mutex<meta_cache::MetaCache>>>,
    /// Tests' hooks inside the ec paths (`test_hooks.rs`); empty in production.
    hooks: test_hooks::TestHooks,
}

/// A pNFS data server ([`Client::pnfs_devices`]): a data server's id and the NFS addresses it serves at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PnfsDevice {
    pub server: u32,
    /// Over TCP.
    pub addrs: Vec<std::net::SocketAddr>,
    /// Over RPC-over-RDMA (announced as `rdma:ip:port`, docs/format.md §23).
    pub rdma_addrs: Vec<std::net::SocketAddr>,
}

/// An MDS's refusal of a request it cannot decode: an op newer than it (the caller falls back to an older one).
fn is_bad_request(e: &ClientError) -> bool {
    matches!(e, ClientError::Meta(weft_rpc::RpcError::Remote(w)) if w.code == ErrorCode::BadRequest)
}

/// This client's own changes sent to the MDS: how many so far, and how many are waiting for their replies.
#[derive(Debug, Default, Clone, Copy)]
struct OwnChanges {
    sent: u64,
    in_flight: u64,
}

/// One own change in flight ([`Client::meta`]): counted when made, done when dropped (answered, failed or
/// cancelled). Requests that change nothing are not counted.
struct OwnChangeInFlight<'a>(Option<&'a Mutex<OwnChanges>>);

impl<'a> OwnChangeInFlight<'a> {
    fn start(client: &'a Client, req: &Request) -> Self {
        if matches!(req.meta_change(), weft_proto::MetaChange::Nothing) {
            return OwnChangeInFlight(None);
        }
        let mut own = client.inner.own.lock().expect("own changes");
        own.sent += 1;
        own.in_flight += 1;
        OwnChangeInFlight(Some(&client.inner.own))
    }
}

impl Drop for OwnChangeInFlight<'_> {
    fn drop(&mut self) {
        if let Some(own) = self.0 {
            let mut own = own.lock().unwrap_or_else(|e| e.into_inner());
            assert!(own.in_flight > 0, "an own change ended that never started");
            own.in_flight -= 1;
        }
    }
}

/// A directory's attributes as a create left them ([`Client::create_open_dir`]).
#[derive(Debug, Clone)]
pub struct DirAfter {
    pub attr: Attr,
    /// No other change of this client's own was in flight when the create was sent, nor sent before its reply.
    pub alone: bool,
    /// [`Client::own_changes_sent`] when the reply arrived: the attributes hold this client's every change while
    /// the count stays here (and the directory's lease holds).
    pub sent: u64,
}

fn unexpected(r: Response) -> ClientError {
    ClientError::Protocol(format!("unexpected response {:?}", r.op()))
}

macro_rules! meta_call {
    ($self:ident, $variant:ident($req:expr)) => {
        match $self.meta(Request::$variant($req)).await? {
            Response::$variant(r) => r,
            other => return Err(unexpected(other)),
        }
    };
}

/// The bank key of a client: derived from the cluster key it proves; none for a client that proves a per-client
/// key (the bank is sealed under a key only the cluster key's holders have, so such a client reads and fills
/// through the servers instead); the public key with authentication off (docs/format.md §12).
fn bank_key(
    credential: Option<&weft_rpc::auth::Credential>,
    cache: &weft_cache::CacheConfig,
) -> Option<weft_cache::BankKey> {
    match credential {
        None => Some(weft_cache::BankKey::public()),
        Some(c) if &*c.key_id == weft_rpc::auth::CLUSTER_KEY_ID => {
            Some(weft_cache::BankKey::for_cluster(|parts| c.key.sign(parts), cache.key_generation))
        }
        Some(c) => {
            tracing::info!(
                key_id = %c.key_id,
                "the cache bank is not used: its items are sealed under the cluster key, and this client proves a \
                 per-client key"
            );
            None
        }
    }
}

// After `meta_call!`, which it uses.
mod locks;

impl Client {
    pub async fn connect(cluster: &ClusterConfig) -> Result<Client, ClientError> {
        let tuning = cluster.client.clone();
        let mut rpc_cfg = tuning.rpc_config();
        rpc_cfg.credential = cluster.credential().map_err(ClientError::Key)?;
        let user = ids::current_user()?;
        let tls = cluster.tls_config().map_err(ClientError::Tls)?;
        let fabric = AnyFabric::new(
            TcpFabric::default().with_tls(tls),
            ShmFabric::new(ShmConfig {
                arena_buffers: tuning.arena_buffers.max(1),
                buffer_bytes: tuning.buffered_bytes_max.max(4096),
            }),
        )
        // The rdma side channel proves our key before any queue pair is made.
        .with_side_channel_auth(rpc_cfg.credential.clone().map(weft_rpc::SideClient::boxed));
        let bank = match &cluster.cache {
            Some(c) if c.enabled() => match bank_key(rpc_cfg.credential.as_ref(), c) {
                Some(seal) => Some(weft_cache::Bank::new(c.clone(), seal).map_err(ClientError::Cache)?),
                None => None,
            },
            _ => None,
        };
        // The MDS keeps every tagged call's outcome in its store (format §27): a retry after a restart or a failover is
        // answered with it.
        let mds_cfg =
            ClientConfig { failover_timeout_ms: tuning.mds_failover_timeout_ms, once_tags: true, ..rpc_cfg.clone() };
        let mds = RpcClient::connect(fabric.clone(), &cluster.mds, mds_cfg).await.map_err(ClientError::Meta)?;
        let asserted_user_is_effective =
            cluster.auth == AuthMode::None || cluster.key_id == weft_rpc::auth::CLUSTER_KEY_ID;
        let client = Client {
            inner: Arc::new(Inner {
                layouts: LayoutCache::new(tuning.layout_cache_entries),
                tuning,
                rpc_cfg,
                mds,
                servers: Mutex::new(HashMap::new()),
                ds: Mutex::new(HashMap::new()),
                ds_connect: tokio::sync::Mutex::new(()),
                verifiers: verifier::Verifiers::default(),
                unreachable_ds: Mutex::new(HashMap::new()),
                own: Mutex::new(OwnChanges::default()),
                fabric,
                guesses: weft_cache::attrs::EntryGuesses::new(
                    bank.as_ref().filter(|b| b.caches_attrs()).map_or(0, |b| b.config().lookup_guesses_max as usize),
                ),
                attr_misses: match bank.as_ref().map(|b| b.config()) {
                    Some(c) => weft_cache::MissHint::new(c.attr_miss_streak_max, c.attr_miss_skip_max),
                    None => weft_cache::MissHint::new(0, 0),
                },
                bank,
                recycled: Default::default(),
                asserted_user_is_effective,
                lock_keepalive: std::sync::OnceLock::new(),
                locks_session: std::sync::atomic::AtomicU64::new(0),
                meta_cache: std::sync::OnceLock::new(),
                hooks: Default::default(),
            }),
            user: Arc::new(user),
        };
        Ok(client)
    }

    /// This client's connections acting as `user`: what a FUSE daemon or a gateway does for each request. Cheap
    /// (no new session); the MDS maps `user` through the key this client proved (a per-client key may pin or squash
    /// it).
    pub fn with_user(&self, user: UserCred) -> Client {
        Client { inner: self.inner.clone(), user: Arc::new(user) }
    }

    /// The user this client acts as.
    pub fn user(&self) -> &UserCred {
        &self.user
    }

    pub fn tuning(&self) -> &ClientTuning {
        &self.inner.tuning
    }

    /// The cache bank, if the cluster config names one (its counters say what it served).
    pub fn bank(&self) -> Option<&weft_cache::Bank> {
        self.inner.bank.as_ref()
    }

    /// Calls to the MDS this client sent again (a lost connection, a failover), since it connected.
    pub fn mds_resends(&self) -> u64 {
        self.inner.mds.resends()
    }

    /// Tests only: this client's hooks inside the ec write and heal paths (shared with its clones).
    #[doc(hidden)]
    pub fn test_hooks(&self) -> &test_hooks::TestHooks {
        &self.inner.hooks
    }

    /// The ec write path's reused buffers.
    pub(crate) fn recycled(&self) -> &recycle::Recycled {
        &self.inner.recycled
    }

    /// The bank, if it caches data blocks.
    pub(crate) fn data_bank(&self) -> Option<&weft_cache::Bank> {
        self.inner.bank.as_ref().filter(|b| b.config().data)
    }

    async fn meta(&self, req: Request) -> Result<Response, ClientError> {
        // A change of this client's own: the MDS recalls nothing from it, so the lease cache drops it itself.
        let pending = self.lease_cache().map(|c| meta_cache::Pending::of(&req, meta_cache::lock(c).ticket()));
        let _own = OwnChangeInFlight::start(self, &req);
        let r = self.inner.mds.call_simple_as(Some(&self.user), req).await.map_err(ClientError::Meta);
        if let (Some(c), Some(p)) = (self.lease_cache(), pending) {
            let now = (std::time::Instant::now(), self.mds_session());
            p.settle(&mut meta_cache::lock(c), r.as_ref().ok(), now);
        }
        let r = r?;
        if let Some(l) = attr_layout(&r) {
            self.inner.layouts.insert(l.0, l.1.clone());
        }
        Ok(r)
    }

    /// The session to data server `id`, opened on first use.
    /// The address the metadata service gave for data server `id`, if this client has asked for it.
    pub fn server_addr(&self, id: u32) -> Option<String> {
        self.inner.servers.lock().expect("servers").get(&id).cloned()
    }

    /// Remembers the server of `e` as unreachable if `e` says it did not answer (not if it answered an error).
    pub(crate) fn note_unreachable(&self, e: &ClientError) {
        if let ClientError::Data { server, source } | ClientError::DataAt { server, source, .. } = e
            && matches!(
                source,
                weft_rpc::RpcError::Connect { .. }
                    | weft_rpc::RpcError::Timeout { .. }
                    | weft_rpc::RpcError::ConnectionLost { .. }
            )
        {
            self.inner.unreachable_ds.lock().expect("unreachable").insert(*server, std::time::Instant::now());
        }
    }

    /// Whether data server `id` did not answer within the last [`UNREACHABLE_HOLD_MS`]: a redundant read then
    /// goes to the other chunks first instead of paying the failed call's retries again on every read.
    pub(crate) fn recently_unreachable(&self, id: u32) -> bool {
        let mut m = self.inner.unreachable_ds.lock().expect("unreachable");
        match m.get(&id) {
            Some(t) if t.elapsed() < std::time::Duration::from_millis(UNREACHABLE_HOLD_MS) => true,
            Some(_) => {
                m.remove(&id);
                false
            }
            None => false,
        }
    }

    pub(crate) async fn data_server(&self, id: u32) -> Result<Rpc, ClientError> {
        if let Some(c) = self.inner.ds.lock().expect("data servers").get(&id) {
            return Ok(c.clone());
        }
        let _connecting = self.inner.ds_connect.lock().await;
        if let Some(c) = self.inner.ds.lock().expect("data servers").get(&id) {
            return Ok(c.clone());
        }
        let mut addr = self.inner.servers.lock().expect("servers").get(&id).cloned();
        if addr.is_none() {
            self.refresh_servers().await?;
            addr = self.inner.servers.lock().expect("servers").get(&id).cloned();
        }
        let addr = addr.ok_or(ClientError::UnknownServer(id))?;
        let c = self.open_data_server(id, &addr).await?;
        // Before the connection carries a write: what a handle's first write to it is judged by (§33).
        match c.call_simple(Request::WriteVerifier(())).await {
            Ok(Response::WriteVerifier(v)) => self.inner.verifiers.connected(id, v),
            Ok(other) => {
                c.close().await;
                return Err(ClientError::Protocol(format!("data server {id}: WriteVerifier answered {other:?}")));
            }
            Err(source) => {
                c.close().await;
                return Err(ClientError::Data { server: id, source });
            }
        }
        self.inner.ds.lock().expect("data servers").insert(id, c.clone());
        Ok(c)
    }

    /// A session with data server `id` at `addr`, over the fabric the tuning chooses.
    async fn open_data_server(&self, id: u32, addr: &str) -> Result<Rpc, ClientError> {
        let data = |source| ClientError::Data { server: id, source };
        let fabric = self.inner.fabric.clone();
        let tcp = RpcClient::connect(fabric.clone(), addr, self.inner.rpc_cfg.clone()).await.map_err(data)?;
        let choice = self.inner.tuning.fabric;
        if choice == FabricChoice::Tcp {
            return Ok(tcp);
        }
        let offer = fabric_offer(&tcp).await;
        // The one-sided address to try, by preference: shm on this host, else rdma (with a device here).
        let (name, one_sided) = match choice {
            FabricChoice::Shm => ("shm", offer.shm),
            FabricChoice::Rdma => ("rdma", offer.rdma),
            _ => match (offer.shm, offer.rdma) {
                (Some(shm), _) => ("shm", Some(shm)),
                (None, Some(rdma)) if weft_fabric::rdma_available() => ("rdma", Some(rdma)),
                _ => ("tcp", None),
            },
        };
        let c = match one_sided {
            Some(to) => match RpcClient::connect(fabric, &to, self.inner.rpc_cfg.clone()).await {
                Ok(c) => {
                    tcp.close().await;
                    tracing::debug!(server = id, %to, "data server reached over {name}");
                    c
                }
                // shm: same boot id but another mount namespace (containers); rdma: no route or no device.
                Err(e) if choice == FabricChoice::Auto => {
                    tracing::warn!(server = id, %to, "{name} unreachable, using tcp: {e}");
                    tcp
                }
                Err(e) => {
                    tcp.close().await;
                    return Err(data(e));
                }
            },
            None if choice == FabricChoice::Auto => tcp,
            None => {
                tcp.close().await;
                let why = if name == "shm" { "no shm fabric to this host" } else { "no rdma listener" };
                return Err(ClientError::Protocol(format!(
                    "data server {id} at {addr} offers {why} (--fabric {name})"
                )));
            }
        };
        Ok(c)
    }

    /// Data server `id`'s write verifier asked now (`WriteVerifier`), with the session it was answered on (`None`
    /// if the session changed meanwhile): what a writer about to write there keeps (docs/format.md §33), exact
    /// where [`Kept::before_write`](verifier::Kept::before_write)'s knowledge may be a reboot behind.
    pub(crate) async fn verifier_now(&self, id: u32) -> Result<verifier::Before, ClientError> {
        let ds = self.data_server(id).await?;
        let session = ds.session_id();
        match ds.call_simple(Request::WriteVerifier(())).await {
            Ok(Response::WriteVerifier(v)) => {
                self.inner.verifiers.answered(id, v);
                Ok(verifier::Before { verifier: Some(v), session: (ds.session_id() == session).then_some(session) })
            }
            Ok(other) => Err(ClientError::Protocol(format!("data server {id}: WriteVerifier answered {other:?}"))),
            Err(source) => Err(ClientError::Data { server: id, source }),
        }
    }

    /// The session this client holds with data server `id` now, if connected (docs/format.md §33).
    pub(crate) fn session_with(&self, id: u32) -> Option<u64> {
        self.inner.ds.lock().expect("data servers").get(&id).map(|c| c.session_id())
    }

    /// What this client learned of each data server's write verifier (docs/format.md §33).
    pub(crate) fn verifiers(&self) -> &verifier::Verifiers {
        &self.inner.verifiers
    }

    /// The fabric each open data server session uses, by server id (`tcp`, `shm` or `rdma`).
    pub async fn fabrics(&self) -> Vec<(u32, &'static str)> {
        let ds = self.inner.ds.lock().expect("data servers").clone();
        let mut v: Vec<(u32, &'static str)> = ds.iter().map(|(id, c)| (*id, c.capabilities().name)).collect();
        v.sort();
        v
    }

    async fn refresh_servers(&self) -> Result<(), ClientError> {
        let list = self.cluster_info().await?;
        let mut s = self.inner.servers.lock().expect("servers");
        for info in list {
            s.insert(info.id, info.addr);
        }
        Ok(())
    }

    // ---- namespace -------------------------------------------------------------------------------------------

    /// The attributes of `parent`'s entry `name`: from the lease cache (or the MDS, to be leased) while this
    /// client holds leases ([`Client::hold_leases`]); else from the cache bank when it has the entry, the child's
    /// attributes, and the parent's attributes showing that this client's user may search `parent`
    /// ([`bank_may_search`]); else from the MDS, which checks everything itself.
    pub async fn lookup(&self, parent: u64, name: &str) -> Result<Attr, ClientError> {
        if let Some(c) = self.live_lease_cache() {
            return self.lookup_leased(c, parent, name).await;
        }
        if let Some(attr) = self.lookup_in_bank(parent, name).await {
            return Ok(attr);
        }
        let attr = meta_call!(self, Lookup(LookupReq { parent, name: name.into() }));
        self.inner.guesses.remember(parent, name, attr.ino);
        Ok(attr)
    }

    /// [`Client::lookup`] from the MDS only (never the cache bank): a lease holder's reply grants leases on the
    /// directory and the child (docs/format.md §31).
    pub async fn lookup_at_mds(&self, parent: u64, name: &str) -> Result<Attr, ClientError> {
        let attr = meta_call!(self, Lookup(LookupReq { parent, name: name.into() }));
        self.inner.guesses.remember(parent, name, attr.ino);
        Ok(attr)
    }

    /// [`Client::getattr`] from the MDS only: a lease holder's reply grants a lease on `ino`.
    pub async fn getattr_at_mds(&self, ino: u64) -> Result<Attr, ClientError> {
        Ok(meta_call!(self, GetAttr(InoReq { ino })))
    }

    /// Op 146, the lease channel (docs/format.md §31): acknowledges recalls up to `acked` of `epoch` and returns
    /// when recalls wait, or after about `hold_ms`.
    pub async fn lease_wait(
        &self,
        epoch: u64,
        acked: u64,
        hold_ms: u32,
    ) -> Result<weft_proto::msg::LeaseWaitResp, ClientError> {
        Ok(meta_call!(self, LeaseWait(weft_proto::msg::LeaseWaitReq { epoch, acked, hold_ms })))
    }

    /// The attributes of `ino`: from the lease cache while this client holds leases; else from the cache bank if it
    /// has them (attributes are not secret beyond the lookup
    /// that found the inode), else from the MDS.
    pub async fn getattr(&self, ino: u64) -> Result<Attr, ClientError> {
        if let Some(c) = self.live_lease_cache() {
            return self.getattr_leased(c, ino).await;
        }
        if let Some(bank) = self.attr_bank()
            && self.inner.attr_misses.ask()
        {
            let found = bank.get_attr(ino).await;
            self.inner.attr_misses.record(found.is_some());
            if let Some(attr) = found {
                return Ok(attr);
            }
        }
        Ok(meta_call!(self, GetAttr(InoReq { ino })))
    }

    /// The bank, when it caches attributes and lookups.
    fn attr_bank(&self) -> Option<&weft_cache::Bank> {
        self.inner.bank.as_ref().filter(|b| b.caches_attrs())
    }

    /// The cache bank's own counters (hits, misses, refused items…), if this client has a bank.
    pub fn bank_stats(&self) -> Option<weft_cache::BankStats> {
        self.inner.bank.as_ref().map(|b| b.stats())
    }

    /// A lookup served by the bank: one multi-get of the parent's attributes and the entry, which carries the
    /// child's attributes while the name is the child's sole name; for a name of a file with several links the
    /// entry carries none, and the attributes of the inode the name named at this client's last lookup
    /// (`EntryGuesses`) come in the same multi-get, or in a second when that guess was missing or wrong. Each is
    /// far cheaper than the MDS. `None` sends the lookup to the MDS.
    async fn lookup_in_bank(&self, parent: u64, name: &str) -> Option<Attr> {
        let bank = self.attr_bank()?;
        if !self.inner.attr_misses.ask() {
            return None;
        }
        let guess = self.inner.guesses.guess(parent, name);
        let found = bank.get_lookup(parent, name, guess).await;
        // The bank held what a lookup needs (whether or not this user may use it): not a miss.
        self.inner.attr_misses.record(found.dir.is_some() && found.child.is_some());
        let (dir, child) = (found.dir?, found.child?);
        if !bank_may_search(&dir, &self.user, self.inner.asserted_user_is_effective) {
            return None;
        }
        let attr = match found.attr {
            Some(attr) => attr,
            None => bank.get_attr(child).await?,
        };
        if !found.carried {
            // Only names whose entries carry no attributes need a guess.
            self.inner.guesses.remember(parent, name, child);
        }
        Some(attr)
    }

    /// Changes attributes. A size change truncates (or extends) the file's objects first, then records the size.
    pub async fn setattr(&self, ino: u64, set: SetAttrs) -> Result<Attr, ClientError> {
        self.setattr_as(ino, set, false).await
    }

    /// [`Client::setattr`], or with `nfs` [`Client::nfs_setattr`]: the objects are cut first (a size change needs
    /// a write capability: `Open`, or `NfsOpen`), then the attributes recorded (`SetAttr`, or `NfsSetAttr`).
    async fn setattr_as(&self, ino: u64, set: SetAttrs, nfs: bool) -> Result<Attr, ClientError> {
        if let Some(size) = set.size
            && self.getattr(ino).await?.kind == weft_proto::FileKind::File
        {
            let f = if nfs {
                self.nfs_open_ino(ino, OpenMode::Write).await?
            } else {
                self.open_ino(ino, OpenMode::Write).await?
            };
            f.truncate_objects_only(size).await?;
        }
        if !nfs {
            return Ok(meta_call!(self, SetAttr(SetAttrReq { ino, set })));
        }
        let req = SetAttrReq { ino, set };
        match self.meta_or_older(Request::NfsSetAttr(req.clone()), || Request::SetAttr(req)).await? {
            Response::NfsSetAttr(a) | Response::SetAttr(a) => Ok(a),
            other => Err(unexpected(other)),
        }
    }

    /// Records attributes at the MDS only (the caller already dealt with the objects).
    pub(crate) async fn meta_setattr_only(&self, ino: u64, set: SetAttrs) -> Result<Attr, ClientError> {
        Ok(meta_call!(self, SetAttr(SetAttrReq { ino, set })))
    }

    /// Creates (or, unless `exclusive`, finds) a regular file; it belongs to this client's user.
    pub async fn create(&self, parent: u64, name: &str, mode: u32, exclusive: bool) -> Result<Attr, ClientError> {
        Ok(meta_call!(self, Create(CreateReq { parent, name: name.into(), mode, exclusive })))
    }

    /// A FIFO, socket or device node in `parent` (device nodes: root only).
    pub async fn mknod(
        &self,
        parent: u64,
        name: &str,
        kind: weft_proto::FileKind,
        mode: u32,
        rdev: u32,
    ) -> Result<Attr, ClientError> {
        Ok(meta_call!(self, Mknod(MknodReq { parent, name: name.into(), kind, mode, rdev })))
    }

    pub async fn mkdir(&self, parent: u64, name: &str, mode: u32) -> Result<Attr, ClientError> {
        Ok(meta_call!(self, Mkdir(MkdirReq { parent, name: name.into(), mode })))
    }

    pub async fn rmdir(&self, parent: u64, name: &str) -> Result<(), ClientError> {
        meta_call!(self, Rmdir(NameReq { parent, name: name.into() }));
        Ok(())
    }

    pub async fn unlink(&self, parent: u64, name: &str) -> Result<(), ClientError> {
        meta_call!(self, Unlink(NameReq { parent, name: name.into() }));
        Ok(())
    }

    pub async fn rename(
        &self,
        src_parent: u64,
        src_name: &str,
        dst_parent: u64,
        dst_name: &str,
        flags: u32,
    ) -> Result<(), ClientError> {
        meta_call!(
            self,
            Rename(RenameReq { src_parent, src_name: src_name.into(), dst_parent, dst_name: dst_name.into(), flags })
        );
        Ok(())
    }

    pub async fn symlink(&self, parent: u64, name: &str, target: &str) -> Result<Attr, ClientError> {
        Ok(meta_call!(self, Symlink(SymlinkReq { parent, name: name.into(), target: target.into() })))
    }

    /// The value of extended attribute `name` (with its namespace prefix) of inode `ino`; `NoData` if absent.
    pub async fn getxattr(&self, ino: u64, name: &str) -> Result<Vec<u8>, ClientError> {
        Ok(meta_call!(self, GetXattr(XattrReq { ino, name: name.into() })))
    }

    /// Sets extended attribute `name`; `flags` is 0, `XATTR_CREATE` or `XATTR_REPLACE` (weft_proto::msg).
    /// `system.posix_acl_access`/`_default` take the Linux ACL value format and keep the mode bits coherent.
    pub async fn setxattr(&self, ino: u64, name: &str, value: &[u8], flags: u32) -> Result<(), ClientError> {
        meta_call!(self, SetXattr(SetXattrReq { ino, name: name.into(), value: value.to_vec(), flags }));
        Ok(())
    }

    /// The names of inode `ino`'s extended attributes this user may see.
    pub async fn listxattr(&self, ino: u64) -> Result<Vec<String>, ClientError> {
        Ok(meta_call!(self, ListXattr(InoReq { ino })))
    }

    /// Removes extended attribute `name`; `NoData` if absent.
    pub async fn removexattr(&self, ino: u64, name: &str) -> Result<(), ClientError> {
        meta_call!(self, RemoveXattr(XattrReq { ino, name: name.into() }));
        Ok(())
    }

    pub async fn readlink(&self, ino: u64) -> Result<String, ClientError> {
        Ok(meta_call!(self, Readlink(InoReq { ino })))
    }

    pub async fn link(&self, ino: u64, new_parent: u64, new_name: &str) -> Result<Attr, ClientError> {
        Ok(meta_call!(self, Link(LinkReq { ino, new_parent, new_name: new_name.into() })))
    }

    /// One page of a directory, after `after` (empty: from the start).
    pub async fn readdir_page(&self, ino: u64, after: &str, limit: u32) -> Result<ReaddirResp, ClientError> {
        Ok(meta_call!(self, Readdir(ReaddirReq { ino, after: after.into(), limit })))
    }

    /// One page of a directory with each entry's attributes (at most `READDIRPLUS_ENTRIES_MAX` entries).
    /// A lease holder's page fills its lease cache (the directory's lease covers its names).
    pub async fn readdir_plus_page(&self, ino: u64, after: &str, limit: u32) -> Result<ReaddirPlusResp, ClientError> {
        let t = self.lease_ticket();
        let page = meta_call!(self, ReaddirPlus(ReaddirReq { ino, after: after.into(), limit }));
        self.cache_listing(t, ino, &page);
        Ok(page)
    }

    /// A whole directory, page by page.
    pub async fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>, ClientError> {
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            let page = self.readdir_page(ino, &after, weft_proto::READDIR_ENTRIES_MAX).await?;
            if let Some(last) = page.entries.last() {
                after = last.name.clone();
            }
            let eof = page.eof || page.entries.is_empty();
            out.extend(page.entries);
            if eof {
                return Ok(out);
            }
        }
    }

    pub async fn statfs(&self) -> Result<StatFs, ClientError> {
        Ok(meta_call!(self, Statfs(())))
    }

    /// Sets the plain layout policy new files under directory `ino` inherit (`weft setstripe`).
    pub async fn set_layout(&self, ino: u64, stripe_unit: u32, stripe_count: u32) -> Result<Attr, ClientError> {
        self.set_layout_with(ino, stripe_unit, stripe_count, weft_proto::DataRedundancy::Plain).await
    }

    /// [`Client::set_layout`] with redundancy (`weft setstripe --ec/--mirror`, docs/format.md §16); with
    /// redundancy the stripe count is its width (`k + m`, `n`), whatever `stripe_count` says.
    pub async fn set_layout_with(
        &self,
        ino: u64,
        stripe_unit: u32,
        stripe_count: u32,
        redundancy: weft_proto::DataRedundancy,
    ) -> Result<Attr, ClientError> {
        let stripe_count = redundancy.width().unwrap_or(stripe_count);
        let layout = Layout { stripe_unit, stripe_count, servers: vec![], redundancy, generation: 0 };
        Ok(meta_call!(self, SetLayout(SetLayoutReq { ino, layout })))
    }

    pub async fn commit(&self, ino: u64, size: u64, mtime_ns: i64) -> Result<Attr, ClientError> {
        Ok(meta_call!(self, Commit(CommitReq { ino, size, mtime_ns })))
    }

    /// `SetSizeOpen` (ftruncate): records the size of a file this client holds open for writing, with that open's
    /// write capability `cap` as the right (the MDS verifies it). Metadata only: [`File::truncate`] sets the
    /// objects' lengths first and is what callers want.
    pub async fn set_size_open(&self, ino: u64, size: u64, cap: Capability) -> Result<Attr, ClientError> {
        Ok(meta_call!(self, SetSizeOpen(SetSizeOpenReq { ino, size, cap })))
    }

    /// [`Client::commit`] that also says what mtime and size the file had just before.
    pub async fn commit_wcc(&self, ino: u64, size: u64, mtime_ns: i64) -> Result<CommitWccResp, ClientError> {
        Ok(meta_call!(self, CommitWcc(CommitReq { ino, size, mtime_ns })))
    }

    pub async fn cluster_info(&self) -> Result<Vec<ServerInfo>, ClientError> {
        Ok(meta_call!(self, ClusterInfo(())))
    }

    /// Opens a session to every data server the metadata service lists and a connection to every cache-bank
    /// daemon, so the first reads and stats after connecting do not pay for them (benchmarks call it before
    /// timing; a long-lived mount gains little). Only servers the MDS says are up; one that cannot be reached is
    /// skipped, as are bank daemons that do not answer (both are opened again on first use).
    pub async fn warm_up(&self) -> Result<(), ClientError> {
        let list = self.cluster_info().await?;
        let mut up = Vec::new();
        {
            let mut s = self.inner.servers.lock().expect("servers");
            for info in list {
                if info.state == weft_proto::ServerState::Up {
                    up.push(info.id);
                }
                s.insert(info.id, info.addr);
            }
        }
        for id in up {
            if let Err(e) = self.data_server(id).await {
                tracing::debug!(server = id, "warm-up: {e}");
            }
        }
        if let Some(bank) = &self.inner.bank {
            bank.warm_up().await;
        }
        Ok(())
    }

    /// Membership and rebuild progress (op 135, docs/format.md §19): files waiting for a spare, layout changes, and
    /// the healer's bytes left, rate and ETA when known.
    pub async fn member_status(&self) -> Result<weft_proto::MemberStatus, ClientError> {
        Ok(meta_call!(self, MemberStatus(())))
    }

    /// `weft meta backup` (op 141, cluster key only): the metadata service writes a consistent copy of its
    /// namespace into a new embedded store at `dir` on its host; the answer is what it copied.
    pub async fn meta_backup(&self, dir: &str) -> Result<weft_proto::msg::MetaBackupResp, ClientError> {
        Ok(meta_call!(self, MetaBackup(weft_proto::msg::MetaBackupReq { dir: dir.to_string() })))
    }

    /// Space of one data server, asked of the server itself.
    pub async fn server_space(&self, id: u32) -> Result<weft_proto::SpaceStat, ClientError> {
        let ds = self.data_server(id).await?;
        match ds.call_simple(Request::SpaceStat(())).await.map_err(|source| ClientError::Data { server: id, source })? {
            Response::SpaceStat(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Space of one data server and the file system it is on (op 217), asked of the server itself.
    pub async fn server_space_dev(&self, id: u32) -> Result<weft_proto::SpaceStatDev, ClientError> {
        let ds = self.data_server(id).await?;
        match ds
            .call_simple(Request::SpaceStatDev(()))
            .await
            .map_err(|source| ClientError::Data { server: id, source })?
        {
            Response::SpaceStatDev(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    // ---- paths -----------------------------------------------------------------------------------------------

    /// Resolves an absolute path (symlinks are not followed).
    pub async fn resolve(&self, path: &str) -> Result<Attr, ClientError> {
        let mut attr = self.getattr(ROOT_INO).await?;
        for name in components(path)? {
            attr = self.lookup(attr.ino, name).await.map_err(|e| e.with_path(path))?;
        }
        Ok(attr)
    }

    /// Resolves the parent directory of `path` and returns it with the last component.
    pub async fn resolve_parent<'p>(&self, path: &'p str) -> Result<(Attr, &'p str), ClientError> {
        let comps = components(path)?;
        let Some((last, dirs)) = comps.split_last() else {
            return Err(ClientError::InvalidPath(format!("{path}: the root has no parent")));
        };
        let mut attr = self.getattr(ROOT_INO).await?;
        for name in dirs {
            attr = self.lookup(attr.ino, name).await.map_err(|e| e.with_path(path))?;
        }
        Ok((attr, last))
    }

    // ---- files -----------------------------------------------------------------------------------------------

    /// `Open`: the fresh attributes of regular file `ino` and a capability for `rights` on its data servers (what
    /// a [`File`] renews with). Refused unless the caller may access the file so.
    pub async fn open_capability(&self, ino: u64, rights: Rights) -> Result<OpenResp, ClientError> {
        Ok(meta_call!(self, Open(OpenReq { ino, rights })))
    }

    /// `RenewOpen` (op 143): a fresh capability for `rights` on `ino`, which this client holds open with `cap`
    /// (expired or not). The owner keeps the open's rights whatever the mode now; anyone else is checked again. An
    /// MDS older than op 143 answers `BadRequest`: then `Open`, which checks everyone by the mode.
    pub async fn renew_capability(&self, ino: u64, rights: Rights, cap: &Capability) -> Result<OpenResp, ClientError> {
        let req = Request::RenewOpen(weft_proto::msg::RenewOpenReq { ino, rights, cap: cap.clone() });
        match self.meta_or_older(req, || Request::Open(OpenReq { ino, rights })).await? {
            Response::RenewOpen(r) | Response::Open(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// `req`, or `older()` when the MDS predates `req`'s op (it answers a request it cannot decode `BadRequest`).
    async fn meta_or_older(&self, req: Request, older: impl FnOnce() -> Request) -> Result<Response, ClientError> {
        match self.meta(req).await {
            Err(e) if is_bad_request(&e) => self.meta(older()).await,
            r => r,
        }
    }

    /// `PnfsHandle` (op 137, docs/format.md §23): a capability sealed for key id `"pnfs"` for file `ino`, read or
    /// (with `write`) read+write, to put into a pNFS data-server filehandle (`weft_nfs::ds::fh::encode`). The MDS
    /// checks this client's user's access as for an open; a file whose layout is not plain striping (ec, mirror)
    /// is refused (`NotSupported`). From an MDS with authentication off: version 0, unsealed, naming the inode.
    pub async fn pnfs_handle(&self, ino: u64, write: bool) -> Result<weft_proto::capability::Capability, ClientError> {
        let rights = if write { Rights::READ_WRITE } else { Rights::READ };
        Ok(meta_call!(self, PnfsHandle(weft_proto::msg::PnfsHandleReq { ino, rights })).cap)
    }

    /// `PnfsDevices` (op 138, docs/format.md §23): every data server that serves pNFS, with the NFS addresses it
    /// announced (TCP and RPC-over-RDMA apart), in server id order. An address the MDS sent that does not parse is a
    /// protocol error.
    pub async fn pnfs_devices(&self) -> Result<Vec<PnfsDevice>, ClientError> {
        let devices = meta_call!(self, PnfsDevices(()));
        devices
            .into_iter()
            .map(|d| {
                let mut dev = PnfsDevice { server: d.server, addrs: Vec::new(), rdma_addrs: Vec::new() };
                for a in &d.addrs {
                    match weft_proto::msg::parse_pnfs_addr(a) {
                        Some((false, s)) => dev.addrs.push(s),
                        Some((true, s)) => dev.rdma_addrs.push(s),
                        None => {
                            return Err(ClientError::Protocol(format!(
                                "data server {} NFS address {a:?} is not ip:port or rdma:ip:port",
                                d.server
                            )));
                        }
                    }
                }
                Ok(dev)
            })
            .collect()
    }

    /// Opens an existing regular file by path with fresh attributes (close-to-open), for `mode`.
    pub async fn open(&self, path: &str, mode: OpenMode) -> Result<File, ClientError> {
        let attr = self.resolve(path).await?;
        self.open_ino(attr.ino, mode).await.map_err(|e| e.with_path(path))
    }

    /// Opens a file by inode with fresh attributes, for `mode`: one round trip (`Open`).
    pub async fn open_ino(&self, ino: u64, mode: OpenMode) -> Result<File, ClientError> {
        let opened = self.open_capability(ino, mode.rights()).await?;
        File::new(self.clone(), opened, mode.rights(), std::time::Instant::now())
    }

    /// [`Client::open_ino`] for an NFS server's client (`NfsOpen`, op 145): the file's owner passes whatever the
    /// mode, as knfsd's owner override. An MDS older than op 145 answers `BadRequest`: then `Open`.
    pub async fn nfs_open_ino(&self, ino: u64, mode: OpenMode) -> Result<File, ClientError> {
        let req = OpenReq { ino, rights: mode.rights() };
        let opened = match self.meta_or_older(Request::NfsOpen(req.clone()), || Request::Open(req)).await? {
            Response::NfsOpen(r) | Response::Open(r) => r,
            other => return Err(unexpected(other)),
        };
        File::new(self.clone(), opened, mode.rights(), std::time::Instant::now())
    }

    /// [`Client::setattr`] for an NFS server's client (`NfsSetAttr`, op 144; its objects cut through
    /// [`Client::nfs_open_ino`]): a size change is allowed to the file's owner whatever the mode, as knfsd's owner
    /// override (NFS clients send ftruncate as SETATTR). Falls back to `SetAttr` on an MDS older than op 144.
    pub async fn nfs_setattr(&self, ino: u64, set: SetAttrs) -> Result<Attr, ClientError> {
        self.setattr_as(ino, set, true).await
    }

    /// Creates (or, unless `exclusive`, opens) a regular file in `parent`, owned by this client's user, opened
    /// read+write: one round trip (`CreateOpen`).
    pub async fn create_open(&self, parent: u64, name: &str, mode: u32, exclusive: bool) -> Result<File, ClientError> {
        let opened = meta_call!(self, CreateOpen(CreateReq { parent, name: name.into(), mode, exclusive }));
        File::new(self.clone(), opened, Rights::READ_WRITE, std::time::Instant::now())
    }

    /// [`Client::create_open`], also answering directory `parent`'s attributes read right after the create
    /// (`CreateOpenDir`, op 147; `None` from an MDS older than it), and whether this client sent no other change
    /// of its own while the create was in flight: only then is nothing of its own missing from them, and they
    /// stay so until [`Client::own_changes_sent`] moves past the count returned (docs/format.md §31).
    pub async fn create_open_dir(
        &self,
        parent: u64,
        name: &str,
        mode: u32,
        exclusive: bool,
    ) -> Result<(File, Option<DirAfter>), ClientError> {
        let before = *self.inner.own.lock().expect("own changes");
        let req = || CreateReq { parent, name: name.into(), mode, exclusive };
        let (opened, dir) =
            match self.meta_or_older(Request::CreateOpenDir(req()), || Request::CreateOpen(req())).await? {
                Response::CreateOpenDir(r) => (r.open, Some(r.dir)),
                Response::CreateOpen(o) => (o, None),
                other => return Err(unexpected(other)),
            };
        let sent = self.own_changes_sent();
        let alone = before.in_flight == 0 && sent == before.sent + 1;
        let dir = dir.map(|attr| DirAfter { attr, alone, sent });
        Ok((File::new(self.clone(), opened, Rights::READ_WRITE, std::time::Instant::now())?, dir))
    }

    /// How many changes of its own this client has sent to the MDS (every request whose `meta_change` is not
    /// `Nothing`), counted before each is sent.
    pub fn own_changes_sent(&self) -> u64 {
        self.inner.own.lock().expect("own changes").sent
    }

    /// Creates (or, unless `exclusive`, opens) a regular file by path, opened read+write. With `truncate`, an
    /// existing file is emptied.
    pub async fn create_path(
        &self,
        path: &str,
        mode: u32,
        exclusive: bool,
        truncate: bool,
    ) -> Result<File, ClientError> {
        let (parent, name) = self.resolve_parent(path).await?;
        let f = self.create_open(parent.ino, name, mode, exclusive).await.map_err(|e| e.with_path(path))?;
        if truncate && f.size() > 0 {
            f.truncate(0).await?;
        }
        Ok(f)
    }

    pub(crate) async fn truncate_objects(
        &self,
        ino: u64,
        layout: &Layout,
        size: u64,
        caps: &CapHolder,
    ) -> Result<(), ClientError> {
        check_file_layout(ino, layout)?;
        self.on_every_object_with(layout, caps, |i, cap| {
            Request::Truncate(TruncateReq { ino, size: layout.object_size(size, i), cap })
        })
        .await
    }

    /// Sets the objects of a file of `size` bytes to their lengths (§5, §16) on every server at once, as
    /// [`Client::truncate_objects`], but returns the positions that failed with their errors instead of the first
    /// error: a redundant layout records the missed ones stale ([`crate::stale::record_missed`]) and goes on.
    /// `fences[slot]`, when given, is what each copy's cut carries (a mirror's, docs/format.md §32).
    pub(crate) async fn truncate_each(
        &self,
        ino: u64,
        layout: &Layout,
        size: u64,
        caps: &CapHolder,
        fences: &[weft_proto::msg::WriteFence],
    ) -> Result<Vec<(usize, ClientError)>, ClientError> {
        let all: Vec<u32> = (0..layout.stripe_count).collect();
        self.on_slots_with(ino, layout, caps, &all, |slot, cap| {
            let size = layout.object_size(size, slot);
            match fences.get(slot as usize) {
                Some(&fence) => Request::FencedTruncate(weft_proto::msg::FencedTruncateReq { ino, size, cap, fence }),
                None => Request::Truncate(TruncateReq { ino, size, cap }),
            }
        })
        .await
    }

    /// Makes the file's objects at layout positions `slots` durable on their data servers (`Fsync`: data,
    /// checksums, chunk versions and name), every server at once. Returns the positions that failed, with their
    /// errors.
    pub(crate) async fn fsync_slots(
        &self,
        ino: u64,
        layout: &Layout,
        caps: &CapHolder,
        slots: &[u32],
    ) -> Result<Synced, ClientError> {
        if self.tuning().short_circuit_network || slots.is_empty() {
            return Ok(Synced::default());
        }
        let make = |_, cap| Request::FsyncVerified(FsyncReq { ino, cap });
        let (answers, failed) = self.on_slots_answered(ino, layout, caps, slots, make).await?;
        let mut synced = Vec::with_capacity(answers.len());
        for (slot, answer, session) in answers {
            let server = layout.servers[slot];
            match answer {
                Response::FsyncVerified(verifier) => {
                    self.inner.verifiers.answered(server, verifier);
                    synced.push(verifier::Answer { slot, server, verifier, session });
                }
                other => {
                    let e = ClientError::Protocol(format!("data server {server}: FsyncVerified answered {other:?}"));
                    return Err(e);
                }
            }
        }
        Ok(Synced { answers: synced, failed })
    }

    /// `make(position, capability)` sent to the server of each position in `slots`, all at once; the positions
    /// that failed, with their errors. A capability refused as expired is renewed and those positions tried once
    /// more (truncate and fsync may run twice).
    async fn on_slots_with(
        &self,
        ino: u64,
        layout: &Layout,
        caps: &CapHolder,
        slots: &[u32],
        make: impl Fn(u32, Capability) -> Request,
    ) -> Result<Vec<(usize, ClientError)>, ClientError> {
        self.on_slots_answered(ino, layout, caps, slots, make).await.map(|(_, failed)| failed)
    }

    /// [`Client::on_slots_with`], with the answers of the positions that succeeded.
    async fn on_slots_answered(
        &self,
        ino: u64,
        layout: &Layout,
        caps: &CapHolder,
        slots: &[u32],
        make: impl Fn(u32, Capability) -> Request,
    ) -> Result<Answered, ClientError> {
        check_file_layout(ino, layout)?;
        let cap = caps.get().await?;
        let (down, tried) = self.presumed_down(layout, slots);
        let (mut answers, mut failed) = self.on_slots(layout, tried.iter().map(|&s| (s, make(s, cap.clone())))).await;
        failed.iter().for_each(|(_, e)| self.note_unreachable(e));
        let expired = |e: &ClientError| matches!(e, ClientError::Data { source, .. } if is_expired(source));
        if failed.iter().any(|(_, e)| expired(e)) {
            let cap = caps.renew_from(&cap).await?;
            let again: Vec<u32> = failed.iter().map(|(i, _)| *i as u32).collect();
            let (more, still) = self.on_slots(layout, again.iter().map(|&s| (s, make(s, cap.clone())))).await;
            answers.extend(more);
            failed = still;
        }
        failed.extend(down);
        Ok((answers, failed))
    }

    /// Of `slots`, those of a redundant layout whose server did not answer moments ago, as failures not tried (at
    /// most the layout's tolerance, and never every slot), so a dead server's connect retries are paid once per
    /// hold, not once per mirror write, truncate or fsync; and the slots to try.
    pub(crate) fn presumed_down(&self, layout: &Layout, slots: &[u32]) -> (Vec<(usize, ClientError)>, Vec<u32>) {
        let is_down = |s: u32| layout.servers.get(s as usize).is_some_and(|&id| self.recently_unreachable(id));
        let down: Vec<u32> = slots.iter().copied().filter(|&s| is_down(s)).collect();
        if down.is_empty() || down.len() > layout.redundancy.tolerates() as usize || down.len() == slots.len() {
            return (Vec::new(), slots.to_vec());
        }
        let failure = |s: u32| (s as usize, ClientError::NotTried { server: layout.servers[s as usize] });
        let tried = slots.iter().copied().filter(|s| !down.contains(s)).collect();
        (down.into_iter().map(failure).collect(), tried)
    }

    /// Each `(position, request)` to the server of that position, all in parallel; the failures, by position.
    async fn on_slots(&self, layout: &Layout, reqs: impl Iterator<Item = (u32, Request)>) -> Answered {
        let mut tasks = tokio::task::JoinSet::new();
        for (slot, req) in reqs {
            // Positions come from this layout's width (a layout change keeps the width): never out of range.
            let Some(&server) = layout.servers.get(slot as usize) else { continue };
            let me = self.clone();
            tasks.spawn(async move {
                let r = async {
                    let ds = me.data_server(server).await?;
                    let session = ds.session_id();
                    let answer = ds.call_simple(req).await.map_err(|source| ClientError::Data { server, source })?;
                    Ok((answer, (ds.session_id() == session).then_some(session)))
                }
                .await;
                (slot as usize, r)
            });
        }
        let (mut answers, mut failed) = (Vec::new(), Vec::new());
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok((slot, Ok((answer, session)))) => answers.push((slot, answer, session)),
                Ok((slot, Err(e))) => failed.push((slot, e)),
                Err(e) => failed.push((usize::MAX, ClientError::Protocol(format!("data server task failed: {e}")))),
            }
        }
        answers.sort_by_key(|(slot, _, _)| *slot);
        failed.sort_by_key(|(slot, _)| *slot);
        (answers, failed)
    }

    /// [`Client::on_every_object`] with requests carrying the file's capability; if a server refuses it as
    /// expired, it is renewed and every request sent once more (truncate and fsync may run twice).
    async fn on_every_object_with(
        &self,
        layout: &Layout,
        caps: &CapHolder,
        make: impl Fn(u32, Capability) -> Request,
    ) -> Result<(), ClientError> {
        let mut cap = caps.get().await?;
        let reqs = (0..layout.stripe_count).map(|i| make(i, cap.clone())).collect();
        match self.on_every_object(layout, reqs).await {
            Err(ClientError::Data { source, .. }) if is_expired(&source) => {
                cap = caps.renew_from(&cap).await?;
                let reqs = (0..layout.stripe_count).map(|i| make(i, cap.clone())).collect();
                self.on_every_object(layout, reqs).await
            }
            other => other,
        }
    }

    /// Sends `reqs[i]` to the data server of stripe index `i`, all in parallel; the first failure is returned.
    async fn on_every_object(&self, layout: &Layout, reqs: Vec<Request>) -> Result<(), ClientError> {
        assert_eq!(reqs.len(), layout.servers.len(), "one request per object");
        let mut tasks = tokio::task::JoinSet::new();
        for (&server, req) in layout.servers.iter().zip(reqs) {
            let me = self.clone();
            tasks.spawn(async move {
                let ds = me.data_server(server).await?;
                ds.call_simple(req).await.map_err(|source| ClientError::Data { server, source })
            });
        }
        let mut first_err = None;
        while let Some(r) = tasks.join_next().await {
            let r = r.map_err(|e| ClientError::Protocol(format!("data server task failed: {e}"))).and_then(|r| r);
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The cached layout of `ino`, if any attribute carrying it has been seen.
    pub fn cached_layout(&self, ino: u64) -> Option<Layout> {
        self.inner.layouts.get(ino)
    }

    /// Ends the sessions politely.
    pub async fn close(&self) {
        let ds: Vec<Rpc> = self.inner.ds.lock().expect("data servers").values().cloned().collect();
        for c in ds {
            c.close().await;
        }
        self.inner.mds.close().await;
    }
}

/// The one-sided fabrics a data server offers this client.
#[derive(Default)]
struct FabricOffer {
    /// Its shm address, if it runs on this host and has one.
    shm: Option<String>,
    /// Its rdma side channel, if it has an RDMA device.
    rdma: Option<String>,
}

async fn fabric_offer(tcp: &Rpc) -> FabricOffer {
    match tcp.call_control(Request::FabricInfo(())).await {
        Ok(Response::FabricInfo(info)) => {
            let same_host = info.host_id == weft_fabric::host_id() && !info.host_id.is_empty();
            FabricOffer { shm: info.shm_addr.filter(|_| same_host), rdma: info.rdma_addr }
        }
        _ => FabricOffer::default(),
    }
}

/// FNV-1a 64 of a directory entry's name: a position that is the entry's own, whatever else the directory holds,
/// from which the NFS gateway's READDIR cookies and the FUSE mount's offsets of cached listings are made.
pub fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// A file's layout comes from the MDS: a malformed one is a protocol error, never a panic here.
fn check_file_layout(ino: u64, layout: &Layout) -> Result<(), ClientError> {
    layout.validate(false).map_err(|e| ClientError::Protocol(format!("file inode {ino}: {e}")))
}

fn attr_layout(r: &Response) -> Option<(u64, &Layout)> {
    let a = match r {
        Response::Lookup(a)
        | Response::GetAttr(a)
        | Response::SetAttr(a)
        | Response::SetSizeOpen(a)
        | Response::Create(a)
        | Response::Link(a)
        | Response::Commit(a) => a,
        Response::Open(o) | Response::CreateOpen(o) => &o.attr,
        Response::CreateOpenDir(r) => &r.open.attr,
        _ => return None,
    };
    (a.kind == weft_proto::FileKind::File).then_some(()).and(a.layout.as_ref().map(|l| (a.ino, l)))
}

/// Whether `user` may search directory `dir` (the check the MDS makes on a lookup's parent), decided from its
/// attributes alone as `perm::may` decides it: a directory with all three execute bits is searchable by anyone;
/// otherwise only when the MDS runs requests as the user they assert (`exact`) are the owner, group and other
/// classes checked for `user` (root searches any directory). Any doubt is `false`: the MDS decides.
fn bank_may_search(dir: &Attr, user: &UserCred, exact: bool) -> bool {
    if dir.kind != weft_proto::FileKind::Dir {
        return false;
    }
    if dir.mode & 0o111 == 0o111 {
        return true;
    }
    if !exact {
        return false;
    }
    if user.uid == 0 {
        return true;
    }
    let bits = if user.uid == dir.uid {
        dir.mode >> 6
    } else if user.gid == dir.gid || user.groups.contains(&dir.gid) {
        dir.mode >> 3
    } else {
        dir.mode
    };
    bits & 1 != 0
}

/// Splits an absolute path into checked components.
pub fn components(path: &str) -> Result<Vec<&str>, ClientError> {
    if !path.starts_with('/') {
        return Err(ClientError::InvalidPath(format!("{path}: paths in a Weft cluster are absolute (start with /)")));
    }
    let mut out = Vec::new();
    for c in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            out.pop();
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

mod ids {
    //! The process's user, group and supplementary groups: the only FFI in this crate.
    #![allow(unsafe_code)]

    use weft_proto::UserCred;

    use crate::ClientError;

    /// Most groups asked of getgroups(2); a process in more is refused with a clear error by `UserCred::new`.
    const GROUPS_READ_MAX: usize = 1024;

    /// The calling process's credential (real uid/gid, as the CLI acts for whoever runs it).
    pub fn current_user() -> Result<UserCred, ClientError> {
        // SAFETY: getuid(2) and getgid(2) have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let mut groups = vec![0 as libc::gid_t; GROUPS_READ_MAX];
        // SAFETY: `groups` holds GROUPS_READ_MAX writable gid_t, the count passed; the kernel writes at most that.
        let n = unsafe { libc::getgroups(GROUPS_READ_MAX as libc::c_int, groups.as_mut_ptr()) };
        if n < 0 {
            return Err(ClientError::User(format!("getgroups: {}", std::io::Error::last_os_error())));
        }
        groups.truncate(n as usize);
        user_cred(uid, gid, groups)
    }

    /// A credential from ids as the system lists them: the primary group and duplicates are dropped from the
    /// supplementary groups (they would only use up the block's room).
    pub fn user_cred(uid: u32, gid: u32, mut groups: Vec<u32>) -> Result<UserCred, ClientError> {
        groups.retain(|&g| g != gid);
        groups.sort_unstable();
        groups.dedup();
        UserCred::new(uid, gid, groups).map_err(|e| ClientError::User(format!("uid {uid}: {e}")))
    }
}

pub use ids::user_cred;

/// Whether an error is the server's "not found".
pub fn is_not_found(e: &ClientError) -> bool {
    e.code() == Some(ErrorCode::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_layout_from_the_mds_is_an_error_not_a_panic() {
        let bad = Layout {
            stripe_unit: 4096,
            stripe_count: 3,
            servers: vec![1],
            redundancy: weft_proto::DataRedundancy::Plain,
            generation: 0,
        };
        match check_file_layout(7, &bad) {
            Err(ClientError::Protocol(m)) => assert!(m.contains("inode 7"), "{m}"),
            other => panic!("expected a protocol error, got {other:?}"),
        }
        let good = Layout {
            stripe_unit: 4096,
            stripe_count: 1,
            servers: vec![1],
            redundancy: weft_proto::DataRedundancy::Plain,
            generation: 0,
        };
        assert!(check_file_layout(7, &good).is_ok());
    }

    fn dir(mode: u32, uid: u32, gid: u32) -> Attr {
        Attr { uid, gid, ..Attr::new(5, weft_proto::FileKind::Dir, mode) }
    }

    /// The local search check agrees with the MDS's rules (perm.rs) where it answers, and says "ask the MDS"
    /// whenever the key may map the user to another.
    #[test]
    fn the_bank_lookup_checks_search_permission_as_the_mds_would() {
        let user = |uid, gid, groups: &[u32]| UserCred { uid, gid, groups: groups.to_vec() };
        let (alice, bob, root) = (user(1000, 100, &[]), user(1001, 200, &[100]), user(0, 0, &[]));
        for exact in [true, false] {
            assert!(bank_may_search(&dir(0o755, 1000, 100), &bob, exact), "anyone searches a 755 directory");
            assert!(bank_may_search(&dir(0o711, 1000, 100), &bob, exact));
            let mut file = dir(0o755, 1000, 100);
            file.kind = weft_proto::FileKind::File;
            assert!(!bank_may_search(&file, &alice, exact), "a file is no directory to search");
        }
        let private = dir(0o700, 1000, 100);
        assert!(bank_may_search(&private, &alice, true), "the owner");
        assert!(!bank_may_search(&private, &bob, true), "another user, even in the group");
        assert!(bank_may_search(&private, &root, true), "root searches any directory");
        assert!(!bank_may_search(&private, &alice, false), "a mapped user: only the MDS knows who it is");
        assert!(!bank_may_search(&private, &root, false), "root may be squashed");
        let group = dir(0o710, 1000, 100);
        assert!(bank_may_search(&group, &bob, true), "through a supplementary group");
        assert!(!bank_may_search(&group, &user(1002, 300, &[]), true));
        let not_owner = dir(0o011, 1000, 100);
        assert!(!bank_may_search(&not_owner, &alice, true), "the owner class alone decides for the owner");
        assert!(bank_may_search(&not_owner, &bob, true));
    }
}
