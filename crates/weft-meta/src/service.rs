//! The metadata service's RPC service: [`MetaService::call`] maps the caller to the identity it acts as
//! ([`MetaService::caller_cred`]) and runs each request through [`Namespace::execute_as`] (which holds one function
//! per op and checks its permissions), in place for point reads and on tokio's blocking pool for the rest.
//!
//! Store transactions are synchronous and durable (a journal fdatasync), so they run on the blocking pool.
//!
//! `Open` and `CreateOpen` are answered here: the namespace checks the caller's access, and the service seals a
//! capability (docs/format.md §10) for the calling connection's key and session with the capability key.
//!
//! With a cache bank (`[cache]` with `attrs = true`), every change is published to it after it commits and before
//! its reply ([`crate::push`]), so a client that reads attributes or lookups from the bank sees it.
//!
//! [`Namespace::execute_as`]: crate::Namespace::execute_as

use std::sync::Arc;

use weft_proto::msg::{
    CreateReq, HealProgress, ListStaleResp, MetaBackupReq, OpenReq, OpenResp, PNFS_KEY_ID, PnfsHandleReq,
    PnfsHandleResp, RenewOpenReq, SetSizeOpenReq,
};
use weft_proto::{Attr, Capability, DataRedundancy, ErrorCode, Request, Response, Rights, UserCred, WireError};
use weft_rpc::keyring::NOBODY_ID;
use weft_rpc::{CallCtx, CapabilityKey, Demand, KeyPolicy, PoolBuf, Principal, Reply, Service};

use crate::lease_service::Leases;
use crate::leases::Limits;
use crate::lock_sessions::{DEFAULT_LOCKS_GRACE_MS, SessionLocks};
use crate::locks::DEFAULT_LOCKS_MAX;
use crate::once::OnceCall;
use crate::push::Pusher;
use crate::touched::Touched;
use crate::{Cred, MdsNamespace};

/// Default lifetime of a capability: one minute. It bounds how long a removed permission keeps working on the
/// data servers (ARCHITECTURE.md, Invariants), and a client renews each open file's capability once per 40 s of
/// use, one cheap MDS call (NFSv4 leases are 90 s by default, for the same trade).
pub const DEFAULT_CAPABILITY_TTL_MS: u64 = 60_000;

/// Default lifetime of a pNFS data-server filehandle's capability (`PnfsHandle`, docs/format.md §23): a
/// capability's, so a pNFS handle is no stronger than any other (issue 31): a client that ignores a recall after a
/// chmod keeps writing at most this long (plus the data servers' clock skew). An expired handle is
/// `NFS4ERR_STALE` at the data server, which sends the Linux client back to the gateway for its I/O and a fresh
/// layout (one LAYOUTGET a minute per file in use): the renewal rides on the layout.
pub const DEFAULT_PNFS_HANDLE_TTL_MS: u64 = DEFAULT_CAPABILITY_TTL_MS;

pub struct MetaService {
    ns: Arc<MdsNamespace>,
    /// `None` with authentication off: capabilities are issued empty (version 0).
    cap_key: Option<CapabilityKey>,
    capability_ttl_ms: u64,
    /// Lifetime of the capabilities `PnfsHandle` seals.
    pnfs_handle_ttl_ms: u64,
    /// Publishes changes to the cache bank (`None`: no bank, or `attrs = false`).
    pusher: Option<Arc<Pusher>>,
    /// Advisory locks (ops 127–129), in memory.
    locks: Arc<SessionLocks>,
    /// The healer running beside this MDS (`HealNow`, progress in `ListStale`), if any.
    heal: Option<HealHooks>,
    /// Metadata leases (docs/format.md §31): granted on an embedded store only.
    leases: Arc<Leases>,
}

/// How the MDS talks to a healer in its process: a nudge (`HealNow`) and its progress (for `ListStale`).
#[derive(Clone)]
pub struct HealHooks {
    pub nudge: Arc<dyn Fn() + Send + Sync>,
    pub progress: Arc<dyn Fn() -> HealProgress + Send + Sync>,
}

impl MetaService {
    pub fn new(ns: Arc<MdsNamespace>) -> MetaService {
        MetaService {
            ns,
            cap_key: None,
            capability_ttl_ms: DEFAULT_CAPABILITY_TTL_MS,
            pnfs_handle_ttl_ms: DEFAULT_PNFS_HANDLE_TTL_MS,
            pusher: None,
            locks: Arc::new(SessionLocks::new(DEFAULT_LOCKS_MAX, DEFAULT_LOCKS_GRACE_MS)),
            heal: None,
            leases: Arc::new(Leases::new(None)),
        }
        .with_leases(crate::leases::DEFAULT_LEASE_MS)
    }

    /// Grants metadata leases of `lease_ms` (0: none). Services sharing a store grant none: they do not yet recall
    /// each other's clients (docs/format.md §31).
    pub fn with_leases(mut self, lease_ms: u64) -> MetaService {
        let granting = lease_ms > 0 && !crate::MetaStore::shared(self.ns.store());
        self.leases = Arc::new(Leases::new(granting.then(|| Limits { lease_ms, ..Limits::default() })));
        self
    }

    /// Serves the lease table's gauges on `metrics` (call after [`MetaService::with_leases`]).
    pub fn with_metrics(self, metrics: Option<&Arc<weft_rpc::Metrics>>) -> MetaService {
        if let Some(m) = metrics {
            self.leases.register_metrics(m);
        }
        self
    }

    /// Connects `HealNow` and `ListStale`'s progress to the healer running beside this MDS.
    pub fn with_heal(mut self, hooks: Option<HealHooks>) -> MetaService {
        self.heal = hooks;
        self
    }

    /// The stale-range ops (130–133): the caller's trust comes from the key its connection proved.
    async fn stale_op(&self, ctx: &CallCtx, cred: Cred, req: Request) -> Result<Response, WireError> {
        let trusted = ctx.principal.is_trusted_server();
        let ns = self.ns.clone();
        let blocking = |f: Box<dyn FnOnce() -> Result<Response, WireError> + Send>| async move {
            tokio::task::spawn_blocking(f)
                .await
                .map_err(|e| WireError::new(ErrorCode::Internal, format!("metadata task failed: {e}")))?
        };
        match req {
            Request::MarkStale(r) => {
                blocking(Box::new(move || ns.mark_stale(&cred, trusted, &r).map(Response::MarkStale))).await
            }
            Request::ClearStale(r) => {
                blocking(Box::new(move || ns.clear_stale(trusted, &r).map(Response::ClearStale))).await
            }
            Request::ListStale(r) => {
                let page = ns.list_stale(&r)?;
                let progress = self.heal.as_ref().map(|h| (h.progress)()).unwrap_or_default();
                Ok(Response::ListStale(ListStaleResp {
                    entries: page.entries,
                    more: page.more,
                    total_entries: page.total_entries,
                    progress,
                }))
            }
            Request::HealNow(()) => {
                if !trusted && !cred.is_root() {
                    return Err(WireError::new(
                        ErrorCode::NotPermitted,
                        "weft heal --now: root or the cluster key only",
                    ));
                }
                match &self.heal {
                    Some(h) => {
                        (h.nudge)();
                        Ok(Response::HealNow(()))
                    }
                    None => {
                        Err(WireError::new(ErrorCode::NotSupported, "no healer runs beside this MDS (heal = false)"))
                    }
                }
            }
            other => Err(WireError::new(ErrorCode::Internal, format!("{:?} is not a stale-range op", other.op()))),
        }
    }

    /// `weft meta backup` (op 141): a consistent copy of the store into a new embedded store on this host.
    async fn backup(&self, ctx: &CallCtx, r: MetaBackupReq) -> Result<Response, WireError> {
        if !ctx.principal.is_trusted_server() {
            return Err(WireError::new(ErrorCode::NotPermitted, "weft meta backup: the cluster key only"));
        }
        let dir = std::path::PathBuf::from(&r.dir);
        if !dir.is_absolute() {
            return Err(WireError::new(ErrorCode::Invalid, format!("backup directory {:?} is not absolute", r.dir)));
        }
        let ns = self.ns.clone();
        tracing::info!(dir = %dir.display(), peer = %ctx.peer, "backup of the namespace begins");
        let copied = tokio::task::spawn_blocking(move || crate::copy::backup_to(ns.store(), &dir))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("backup task failed: {e}")))?;
        let d = copied.map_err(|e| {
            let code = match e {
                crate::copy::CopyError::TargetNotEmpty(_) => ErrorCode::Exists,
                _ => ErrorCode::Io,
            };
            tracing::warn!("backup into {} failed: {e}", r.dir);
            WireError::new(code, format!("backup into {}: {e}", r.dir))
        })?;
        tracing::info!(
            dir = r.dir,
            inodes = d.inodes,
            entries = d.dirents,
            crc = d.crc,
            "backup of the namespace done"
        );
        Ok(Response::MetaBackup(d.into()))
    }

    /// Holds at most `locks_max` advisory locks; a vanished client's go `grace_ms` after its connection closed.
    pub fn with_locks(self, locks_max: usize, grace_ms: u64) -> MetaService {
        self.with_lock_quota(locks_max, grace_ms, locks_max)
    }

    /// [`MetaService::with_locks`], with at most `per_client_session_max` locks per session of a per-client key.
    pub fn with_lock_quota(mut self, locks_max: usize, grace_ms: u64, per_client_session_max: usize) -> MetaService {
        let locks = SessionLocks::new(locks_max, grace_ms).with_per_client_session_max(per_client_session_max);
        // Services sharing the database share the locks too (docs/format.md §30).
        let locks = if crate::MetaStore::shared(self.ns.store()) { locks.shared(self.ns.clone()) } else { locks };
        self.locks = Arc::new(locks);
        self
    }

    /// Publishes attributes and lookups to `bank` after every change (when it caches them).
    pub fn with_cache_bank(mut self, bank: Option<weft_cache::Bank>) -> MetaService {
        self.pusher = bank.filter(|b| b.caches_attrs()).map(|b| Pusher::new(b, self.ns.clone()));
        self
    }

    /// Seals capabilities under `key` (derived from the cluster key), valid for `ttl_ms`.
    pub fn with_capabilities(mut self, key: Option<CapabilityKey>, ttl_ms: u64) -> MetaService {
        self.cap_key = key;
        self.capability_ttl_ms = ttl_ms.max(1);
        self
    }

    /// pNFS data-server filehandles (`PnfsHandle`) are sealed valid for `ttl_ms`.
    pub fn with_pnfs_handle_ttl(mut self, ttl_ms: u64) -> MetaService {
        self.pnfs_handle_ttl_ms = ttl_ms.max(1);
        self
    }

    /// `PnfsHandle` (docs/format.md §23): the caller's access checked as for `Open` (a write handle advances the
    /// data version, as an open for writing), plain layouts only, then a capability sealed for key id `"pnfs"`,
    /// which no connection can prove: it is good only inside a pNFS data-server filehandle.
    async fn pnfs_handle(&self, ctx: &CallCtx, cred: Cred, r: PnfsHandleReq) -> Result<Response, WireError> {
        let attr = match self.open(ctx, cred, OpenReq { ino: r.ino, rights: r.rights }).await? {
            Response::Open(o) => o.attr,
            other => return Err(WireError::new(ErrorCode::Internal, format!("open answered {:?}", other.op()))),
        };
        let redundancy = attr.layout.as_ref().map_or(DataRedundancy::Plain, |l| l.redundancy);
        if redundancy != DataRedundancy::Plain {
            return Err(WireError::new(
                ErrorCode::NotSupported,
                format!(
                    "inode {} has a {:?} layout: a pNFS file layout can express only plain striping, so it is served \
                     through the gateway",
                    r.ino, redundancy
                ),
            ));
        }
        let cap = match &self.cap_key {
            // Unsealed (version 0), but naming the inode and rights: a data server with authentication off checks
            // nothing, yet still needs to know which object the handle is for.
            None => Capability { ino: r.ino, rights: r.rights, key_id: PNFS_KEY_ID.to_string(), ..Capability::none() },
            Some(key) => {
                let expiry_ms = weft_rpc::capability::unix_now_ms().saturating_add(self.pnfs_handle_ttl_ms);
                key.seal(r.ino, r.rights, expiry_ms, PNFS_KEY_ID, ctx.session, attr.data_version)
                    .map_err(|e| WireError::new(ErrorCode::Internal, format!("sealing a pNFS handle: {e}")))?
            }
        };
        Ok(Response::PnfsHandle(PnfsHandleResp { cap }))
    }

    /// A capability for `attr`'s inode at its data version with `rights`, for the calling connection's key and
    /// session; empty with authentication off.
    fn issue(&self, ctx: &CallCtx, attr: &Attr, rights: Rights) -> Result<Capability, WireError> {
        let Some(key) = &self.cap_key else { return Ok(Capability::none()) };
        let key_id = match &ctx.principal {
            Principal::Key { key_id, .. } => key_id.clone(),
            Principal::Anonymous => {
                return Err(WireError::new(
                    ErrorCode::Unauthenticated,
                    "a capability needs an authenticated connection",
                ));
            }
        };
        let now_ms = weft_rpc::capability::unix_now_ms();
        let expiry_ms = now_ms.saturating_add(self.capability_ttl_ms);
        let cap = key
            .seal(attr.ino, rights, expiry_ms, &key_id, ctx.session, attr.data_version)
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("sealing a capability: {e}")))?;
        // What is sealed is what a data server will admit: this inode, these rights, this key, now (§10).
        weft_rpc::invariant!(
            attr.kind == weft_proto::FileKind::File
                && key
                    .check(&cap, &weft_rpc::Demand { ino: attr.ino, rights, key_id: &key_id, now_ms, skew_ms: 0 })
                    .is_ok(),
            "a capability for inode {} ({:?}) that its own check refuses",
            attr.ino,
            attr.kind
        );
        Ok(cap)
    }

    fn opened(&self, ctx: &CallCtx, attr: Attr, rights: Rights) -> Result<OpenResp, WireError> {
        let cap = self.issue(ctx, &attr, rights)?;
        Ok(OpenResp { attr, cap, ttl_ms: self.capability_ttl_ms })
    }

    /// `Open`: access checked as the caller, then a capability. For reading, a point read run in place; for
    /// writing, a transaction (the data version advances) on the blocking pool, as every write.
    async fn open(&self, ctx: &CallCtx, cred: Cred, r: OpenReq) -> Result<Response, WireError> {
        let attr = if r.rights.covers(Rights::WRITE) {
            let ns = self.ns.clone();
            tokio::task::spawn_blocking(move || ns.open(&cred, r.ino, r.rights))
                .await
                .map_err(|e| WireError::new(ErrorCode::Internal, format!("metadata task failed: {e}")))??
        } else {
            self.ns.open(&cred, r.ino, r.rights)?
        };
        Ok(Response::Open(self.opened(ctx, attr, r.rights)?))
    }

    /// `RenewOpen`: [`MetaService::open`] for a file the caller holds open; its owner keeps the open's rights
    /// whatever the mode when `r.cap` proves the open ([`MetaService::proves_open`]).
    async fn renew_open(&self, ctx: &CallCtx, cred: Cred, r: RenewOpenReq) -> Result<Response, WireError> {
        let owner_keeps = self.proves_open(ctx, &r);
        Ok(Response::RenewOpen(self.reopen(ctx, cred, (r.ino, r.rights), owner_keeps).await?))
    }

    /// An `Open` of `ino` for `rights` in which the owner passes whatever the mode when `owner_keeps` (`RenewOpen`
    /// of a proven open; `NfsOpen`, knfsd's owner override).
    async fn reopen(
        &self,
        ctx: &CallCtx,
        cred: Cred,
        (ino, rights): (u64, Rights),
        owner_keeps: bool,
    ) -> Result<OpenResp, WireError> {
        let attr = if rights.covers(Rights::WRITE) {
            let ns = self.ns.clone();
            tokio::task::spawn_blocking(move || ns.renew_open(&cred, ino, rights, owner_keeps))
                .await
                .map_err(|e| WireError::new(ErrorCode::Internal, format!("metadata task failed: {e}")))??
        } else {
            self.ns.renew_open(&cred, ino, rights, owner_keeps)?
        };
        self.opened(ctx, attr, rights)
    }

    /// Whether `r.cap` proves that this connection's key opened `r.ino` for `r.rights`: sealed by this cluster, for
    /// that inode, rights and key, of any age (an open held idle past its capability's lifetime is still an open).
    /// With authentication off every claim is believed, as every asserted user is.
    fn proves_open(&self, ctx: &CallCtx, r: &RenewOpenReq) -> bool {
        let Some(key) = &self.cap_key else { return true };
        let Principal::Key { key_id, .. } = &ctx.principal else { return false };
        let now_ms = weft_rpc::capability::unix_now_ms();
        let demand = Demand { ino: r.ino, rights: r.rights, key_id, now_ms, skew_ms: u64::MAX };
        key.check(&r.cap, &demand).is_ok()
    }

    /// `CreateOpen`: a create and an open for reading and writing in one transaction
    /// ([`crate::Namespace::create_open`]): a new file's creator may write it whatever its mode, as open(2) with
    /// `O_CREAT`; an existing file's mode is checked.
    async fn create_open(&self, ctx: &CallCtx, cred: Cred, r: CreateReq) -> Result<Response, WireError> {
        let (open, _) = self.create_opened(ctx, cred, r, false).await?;
        Ok(Response::CreateOpen(open))
    }

    /// `CreateOpenDir`: `CreateOpen`, and the directory's attributes read right after it (docs/format.md §31), so a
    /// mount holding the directory's lease need not ask for them.
    async fn create_open_dir(&self, ctx: &CallCtx, cred: Cred, r: CreateReq) -> Result<Response, WireError> {
        let (open, dir) = self.create_opened(ctx, cred, r, true).await?;
        let dir = dir.expect("asked for the directory's attributes");
        Ok(Response::CreateOpenDir(weft_proto::msg::CreateOpenDirResp { open, dir }))
    }

    /// The create and open of `CreateOpen`, with (`with_dir`) the directory's attributes read after it.
    async fn create_opened(
        &self,
        ctx: &CallCtx,
        cred: Cred,
        r: CreateReq,
        with_dir: bool,
    ) -> Result<(OpenResp, Option<Attr>), WireError> {
        let ns = self.ns.clone();
        let once = once_call(ctx, &cred);
        let (attr, dir) = tokio::task::spawn_blocking(move || {
            let attr = ns.create_open(&cred, &r, once.as_ref())?;
            let dir = if with_dir { Some(ns.attr(r.parent)?) } else { None };
            Ok::<_, WireError>((attr, dir))
        })
        .await
        .map_err(|e| WireError::new(ErrorCode::Internal, format!("metadata task failed: {e}")))??;
        Ok((self.opened(ctx, attr, Rights::READ_WRITE)?, dir))
    }

    /// `SetSizeOpen` (ftruncate): the right to write comes from the caller's open, as on Linux, proved by the
    /// write capability that open got ([`MetaService::check_open_right`]); the rest is `SetAttr`'s (set-ID bits
    /// dropped for a caller who is not root, as `caller_cred` names it).
    async fn set_size_open(&self, ctx: &CallCtx, cred: Cred, r: SetSizeOpenReq) -> Result<Response, WireError> {
        self.check_open_right(ctx, &r)?;
        let ns = self.ns.clone();
        let once = once_call(ctx, &cred);
        let attr = tokio::task::spawn_blocking(move || ns.set_size_open(&cred, &r, once.as_ref()))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("metadata task failed: {e}")))??;
        Ok(Response::SetSizeOpen(attr))
    }

    /// Whether `r.cap` proves an open for writing of `r.ino` by this connection's key: sealed by this cluster,
    /// WRITE, for that inode and key, unexpired by this MDS's own clock (no skew: it sealed it).
    ///
    /// Why the capability rather than a table of the opens each session made: it already states exactly this fact
    /// ("this key's holder was allowed to write inode N, until T"), sealed at every `Open` and `CreateOpen` after
    /// the access check (a creator's new file whatever its mode, as open(2) with O_CREAT); the data servers already
    /// trust it for the same truncate's objects; and it needs no per-session state to bound, expire or carry across
    /// a failover to another MDS. A right taken away stops working here when it does on the data servers (§10).
    /// With authentication off, capabilities are empty and every asserted user is believed: so is the claim.
    fn check_open_right(&self, ctx: &CallCtx, r: &SetSizeOpenReq) -> Result<(), WireError> {
        let Some(key) = &self.cap_key else { return Ok(()) };
        let Principal::Key { key_id, .. } = &ctx.principal else {
            return Err(WireError::new(ErrorCode::Unauthenticated, "a capability needs an authenticated connection"));
        };
        let now_ms = weft_rpc::capability::unix_now_ms();
        let demand = Demand { ino: r.ino, rights: Rights::WRITE, key_id, now_ms, skew_ms: 0 };
        key.check(&r.cap, &demand).map_err(|e| e.to_wire())
    }

    /// Point reads never wait for a disk flush (redb reads from its cache; a miss is one pread), so they run in
    /// place: a hop to the blocking pool costs two thread wake-ups, more than the lookup itself. With `PgStore` a
    /// point read is a round trip to the database: the store waits inside `block_in_place` (`pg_store.rs`), so
    /// this worker's other tasks move to another thread meanwhile and nothing panics or stalls.
    fn execute_in_place(&self, cred: &Cred, req: &Request) -> Result<Response, WireError> {
        self.ns.execute_as(cred, req)
    }

    /// Writes wait for the journal's fdatasync and readdir pages may be long, so those go to the blocking pool.
    async fn execute_on_blocking_pool(&self, ctx: &CallCtx, cred: Cred, req: Request) -> Result<Response, WireError> {
        let ns = self.ns.clone();
        let once = once_call(ctx, &cred);
        tokio::task::spawn_blocking(move || ns.execute_once(&cred, &req, once.as_ref()))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("metadata task failed: {e}")))?
    }
}

impl MetaService {
    /// The identity a request runs as, from the key its connection proved and the user it asserts (its user
    /// block), as an NFS server maps an AUTH_SYS credential through its export options:
    ///
    /// | key | user block | runs as |
    /// |---|---|---|
    /// | cluster key, or `auth = "none"` | present | the asserted user (a trusted host, AUTH_SYS) |
    /// | cluster key, or `auth = "none"` | absent | root (a server of the cluster: the data servers, tools) |
    /// | client key, `trusted` | present | the asserted user |
    /// | client key, `squash-root` | present | the asserted user; uid 0 and gid 0 (also among the groups) become 65534 |
    /// | client key, `uid=U,gid=G` | any | U, G, no supplementary groups |
    /// | client key, `trusted` or `squash-root` | absent | nobody (65534:65534) |
    pub fn caller_cred(&self, ctx: &CallCtx) -> Result<Cred, WireError> {
        Ok(effective_cred(&ctx.principal, ctx.user.as_ref()))
    }

    /// Only the cluster key registers data servers (with authentication on): anyone else could otherwise receive
    /// new files' data. An id moving to a new address is allowed (a server restarted elsewhere) but logged.
    /// `addr` is `None` for `RegisterPnfs`, which names NFS addresses, not the server's own.
    fn check_registration(&self, ctx: &CallCtx, id: u32, addr: Option<&str>) -> Result<(), WireError> {
        if !ctx.principal.is_trusted_server() {
            tracing::warn!(peer = %ctx.peer, principal = ctx.principal.name(), id, addr,
                "refusing a data-server registration: it needs the cluster key");
            return Err(WireError::new(
                ErrorCode::Permission,
                format!(
                    "registering a data server needs the cluster key (this connection proved {:?})",
                    ctx.principal.name()
                ),
            ));
        }
        let Some(addr) = addr else { return Ok(()) };
        if let Some(old) = self.ns.servers().into_iter().find(|s| s.id == id && s.addr != addr) {
            tracing::warn!(id, old = %old.addr, new = %addr, peer = %ctx.peer, "data server id moves to a new address");
        }
        Ok(())
    }
}

impl Service for MetaService {
    async fn call(&self, ctx: &CallCtx, req: Request, _data: Option<PoolBuf>) -> Result<Reply, WireError> {
        match &req {
            Request::RegisterServer(r) => self.check_registration(ctx, r.id, Some(&r.addr))?,
            Request::RegisterServerDev(r) => self.check_registration(ctx, r.id, Some(&r.addr))?,
            Request::RegisterPnfs(r) => self.check_registration(ctx, r.id, None)?,
            _ => {}
        }
        let cred = self.caller_cred(ctx)?;
        if is_confined(&ctx.principal, &cred) {
            let inos = inodes_named(&req);
            if !inos.is_empty() {
                self.ns.may_reach(&cred, &inos)?;
            }
        }
        self.locks.touch(ctx.session);
        if let Request::LeaseWait(r) = req {
            return Ok(Response::LeaseWait(self.leases.wait(ctx.session, r).await).into());
        }
        // Locks are in memory and answered in place (the permission check is a point read).
        match &req {
            Request::SetLock(r) => {
                return Ok(Response::SetLock(self.locks.set(&self.ns, &cred, &ctx.principal, ctx.session, r)?).into());
            }
            Request::GetLock(r) => {
                return Ok(Response::GetLock(self.locks.get(&self.ns, &cred, ctx.session, r)?).into());
            }
            Request::ReleaseLocks(r) => return Ok(Response::ReleaseLocks(self.locks.release(ctx.session, r)?).into()),
            Request::AdoptLocks(r) => {
                return Ok(Response::AdoptLocks(self.locks.adopt(&ctx.principal, ctx.session, r)?).into());
            }
            _ => {}
        }
        // What the request is about, for the log line of a failure: taken only when debug logging is on (the
        // name is a copy).
        let target = tracing::enabled!(tracing::Level::DEBUG).then(|| target_of(&req));
        let (op, uid) = (req.op(), cred.uid);
        // What the op may change, read before it runs (a removed name's inode is gone from the store after).
        let touched = (self.pusher.is_some() || self.leases.granting()).then(|| Touched::before(&self.ns, &req));
        // A lease holder's grants: the change its op's read saw, and the inodes the request names.
        let seen = self.leases.seen(ctx.session).map(|seen| (seen, inodes_named(&req)));
        let r: Result<Response, WireError> = async {
            let resp = match req {
                Request::Open(r) => {
                    let write = r.rights.covers(Rights::WRITE);
                    let resp = self.open(ctx, cred, r).await?;
                    if !write {
                        return Ok(resp);
                    }
                    // An open for writing advanced the data version: publish the new attributes.
                    resp
                }
                Request::CreateOpen(r) => self.create_open(ctx, cred, r).await?,
                Request::CreateOpenDir(r) => self.create_open_dir(ctx, cred, r).await?,
                Request::RenewOpen(r) => self.renew_open(ctx, cred, r).await?,
                Request::NfsOpen(r) => Response::NfsOpen(self.reopen(ctx, cred, (r.ino, r.rights), true).await?),
                Request::SetSizeOpen(r) => self.set_size_open(ctx, cred, r).await?,
                Request::MetaBackup(r) => return self.backup(ctx, r).await,
                Request::PnfsHandle(r) => self.pnfs_handle(ctx, cred, r).await?,
                // In memory: the servers' NFS addresses are not persisted (each heartbeat repeats them).
                Request::PnfsDevices(()) | Request::RegisterPnfs(_) => return self.execute_in_place(&cred, &req),
                Request::MemberStatus(()) => {
                    // The rebuild's progress is the healer's (in this process): bytes left, rate, and their ETA.
                    if let Some(h) = &self.heal {
                        let p = (h.progress)();
                        let rate = (p.rate_bytes_per_s > 0).then_some(p.rate_bytes_per_s);
                        let eta_ms = rate.map(|r| p.bytes_left.saturating_mul(1000) / r);
                        self.ns.set_rebuild_progress(Some(p.bytes_left), rate, eta_ms);
                    }
                    return self.execute_in_place(&cred, &req);
                }
                req
                @ (Request::MarkStale(_) | Request::ListStale(_) | Request::ClearStale(_) | Request::HealNow(_)) => {
                    return self.stale_op(ctx, cred, req).await;
                }
                Request::GetAttr(_) | Request::Lookup(_) | Request::Readlink(_) | Request::Null(_) => {
                    let resp = self.execute_in_place(&cred, &req)?;
                    if let Some(p) = &self.pusher {
                        p.fill(&req, &resp);
                    }
                    if let Some((seen, named)) = seen {
                        self.leases.grant(ctx.session, &leased_inos(named, &resp), seen).await;
                    }
                    return Ok(resp);
                }
                // Point reads too (a mount with POSIX ACLs asks for each inode's access ACL).
                Request::GetXattr(_) | Request::ListXattr(_) => return self.execute_in_place(&cred, &req),
                req => self.execute_on_blocking_pool(ctx, cred, req).await?,
            };
            self.committed(ctx.session, touched, seen, &resp).await;
            Ok(resp)
        }
        .await;
        if let (Err(e), Some((ino, name))) = (&r, target) {
            let what =
                if e.code == ErrorCode::Permission { "refused by the permission check" } else { "request failed" };
            tracing::debug!(peer = %ctx.peer, key = ctx.principal.name(), session = format_args!("{:#x}", ctx.session),
                uid, op = op.name(), ino, name = name.as_deref().unwrap_or(""), code = ?e.code, "{what}: {}", e.message);
        }
        r.map(Into::into)
    }

    fn connection_closed(&self, sessions: &[u64]) {
        self.locks.connection_closed(sessions);
        self.leases.closed(sessions);
    }
}

/// The inodes a lease holder's reply grants leases on: those the request named (`named`) and those whose attributes
/// the reply carries.
fn leased_inos(mut named: Vec<u64>, resp: &Response) -> Vec<u64> {
    match resp {
        Response::ReaddirPlus(p) => named.extend(p.entries.iter().map(|(_, a)| a.ino)),
        other => named.extend(other.attr().map(|a| a.ino)),
    }
    named.sort_unstable();
    named.dedup();
    named
}

impl MetaService {
    /// A change committed: recall it from lease holders and publish it to the bank before replying, so whoever
    /// hears of it finds no older state; then the caller's own grants, if it holds leases.
    async fn committed(&self, session: u64, touched: Option<Touched>, seen: Option<(u64, Vec<u64>)>, resp: &Response) {
        if let Some(t) = &touched
            && !t.inos.is_empty()
        {
            self.leases.changed(session, &t.recalls()).await;
        }
        if let (Some(p), Some(t)) = (&self.pusher, touched) {
            p.after(t, resp).await;
        }
        if let Some((seen, named)) = seen {
            self.leases.grant(session, &leased_inos(named, resp), seen).await;
        }
    }
}

/// The call a request with a once block is (docs/format.md §27), bound to the key its connection proved and the user
/// it runs as.
fn once_call(ctx: &CallCtx, cred: &Cred) -> Option<OnceCall> {
    ctx.once.map(|tag| OnceCall { tag, slot: ctx.slot, key_id: ctx.principal.name().to_string(), uid: cred.uid })
}

/// The inode a request is about (the directory, for an op on a name) and the name, for logs.
fn target_of(req: &Request) -> (u64, Option<String>) {
    let named = |parent: u64, name: &str| (parent, Some(name.to_string()));
    match req {
        Request::Lookup(r) => named(r.parent, &r.name),
        Request::Create(r) | Request::CreateOpen(r) | Request::CreateOpenDir(r) => named(r.parent, &r.name),
        Request::Mknod(r) => named(r.parent, &r.name),
        Request::Mkdir(r) => named(r.parent, &r.name),
        Request::Rmdir(r) | Request::Unlink(r) => named(r.parent, &r.name),
        Request::Rename(r) => (r.src_parent, Some(format!("{} -> {}:{}", r.src_name, r.dst_parent, r.dst_name))),
        Request::Symlink(r) => named(r.parent, &r.name),
        Request::Link(r) => (r.ino, Some(format!("-> {}:{}", r.new_parent, r.new_name))),
        Request::GetAttr(r) | Request::Readlink(r) => (r.ino, None),
        Request::SetAttr(r) | Request::NfsSetAttr(r) => (r.ino, None),
        Request::SetSizeOpen(r) => (r.ino, None),
        Request::Readdir(r) | Request::ReaddirPlus(r) => (r.ino, None),
        Request::SetLayout(r) => (r.ino, None),
        Request::Commit(r) | Request::CommitWcc(r) => (r.ino, None),
        Request::Open(r) => (r.ino, None),
        Request::RenewOpen(r) => (r.ino, None),
        Request::NfsOpen(r) => (r.ino, None),
        Request::PnfsHandle(r) => (r.ino, None),
        Request::GetXattr(r) | Request::RemoveXattr(r) => (r.ino, Some(r.name.clone())),
        Request::SetXattr(r) => (r.ino, Some(r.name.clone())),
        Request::ListXattr(r) => (r.ino, None),
        _ => (0, None),
    }
}

/// Whether requests of `principal` running as `cred` reach inodes only through directories `cred` may search
/// ([`crate::Namespace::may_reach`]): an unprivileged native client, whose identity its key pins or squashes. The
/// cluster key and trusted client keys are hosts that walk paths themselves (the kernel under a mount, the NFS
/// gateway with knfsd's `no_subtree_check` semantics, docs/format.md §15); root reaches everything anyway.
fn is_confined(principal: &Principal, cred: &Cred) -> bool {
    let pinned = matches!(principal, Principal::Key { policy: KeyPolicy::Fixed { .. } | KeyPolicy::SquashRoot, .. });
    pinned && !cred.is_root()
}

/// The inodes a request addresses by number (a named op's directory, an inode op's inode), which a confined
/// caller must be able to reach. Requests that name none (sessions, servers, the caller's own locks) give none.
fn inodes_named(req: &Request) -> Vec<u64> {
    match req {
        Request::Lookup(r) => vec![r.parent],
        Request::Create(r) | Request::CreateOpen(r) | Request::CreateOpenDir(r) => vec![r.parent],
        Request::Mknod(r) => vec![r.parent],
        Request::Mkdir(r) => vec![r.parent],
        Request::Rmdir(r) | Request::Unlink(r) => vec![r.parent],
        Request::Rename(r) => vec![r.src_parent, r.dst_parent],
        Request::Symlink(r) => vec![r.parent],
        Request::Link(r) => vec![r.ino, r.new_parent],
        Request::GetAttr(r) | Request::Readlink(r) | Request::ListXattr(r) => vec![r.ino],
        Request::SetAttr(r) | Request::NfsSetAttr(r) => vec![r.ino],
        Request::SetSizeOpen(r) => vec![r.ino],
        Request::Readdir(r) | Request::ReaddirPlus(r) => vec![r.ino],
        Request::SetLayout(r) => vec![r.ino],
        Request::Commit(r) | Request::CommitWcc(r) => vec![r.ino],
        Request::Open(r) => vec![r.ino],
        Request::RenewOpen(r) => vec![r.ino],
        Request::NfsOpen(r) => vec![r.ino],
        Request::PnfsHandle(r) => vec![r.ino],
        Request::GetXattr(r) | Request::RemoveXattr(r) => vec![r.ino],
        Request::SetXattr(r) => vec![r.ino],
        Request::SetLock(r) => vec![r.ino],
        Request::GetLock(r) => vec![r.ino],
        Request::MarkStale(r) => vec![r.ino],
        _ => Vec::new(),
    }
}

/// [`MetaService::caller_cred`]'s table, as a pure function.
fn effective_cred(principal: &Principal, user: Option<&UserCred>) -> Cred {
    let asserted = |u: &UserCred| Cred::new(u.uid, u.gid, u.groups.clone());
    let nobody = || Cred::new(NOBODY_ID, NOBODY_ID, Vec::new());
    let policy = match principal {
        Principal::Anonymous => KeyPolicy::Cluster,
        Principal::Key { policy, .. } => *policy,
    };
    match (policy, user) {
        (KeyPolicy::Cluster, None) => Cred::root(),
        (KeyPolicy::Cluster | KeyPolicy::Trusted, Some(u)) => asserted(u),
        (KeyPolicy::Fixed { uid, gid }, _) => Cred::new(uid, gid, Vec::new()),
        (KeyPolicy::SquashRoot, Some(u)) => {
            let squash = |id: u32| if id == 0 { NOBODY_ID } else { id };
            Cred::new(squash(u.uid), squash(u.gid), u.groups.iter().map(|&g| squash(g)).collect())
        }
        (KeyPolicy::Trusted | KeyPolicy::SquashRoot, None) => nobody(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(policy: KeyPolicy) -> Principal {
        Principal::Key { key_id: "k".into(), policy }
    }

    #[test]
    fn only_pinned_and_squashed_keys_are_confined_and_never_as_root() {
        let alice = Cred::new(1000, 100, vec![]);
        let confined = |p: KeyPolicy, c: &Cred| is_confined(&key(p), c);
        assert!(confined(KeyPolicy::Fixed { uid: 1000, gid: 100 }, &alice));
        assert!(confined(KeyPolicy::SquashRoot, &alice));
        assert!(!confined(KeyPolicy::Fixed { uid: 0, gid: 0 }, &Cred::root()), "a key pinned to root");
        for p in [KeyPolicy::Cluster, KeyPolicy::Trusted] {
            assert!(!confined(p, &alice), "{p:?}: a host that walks paths itself");
        }
        assert!(!is_confined(&Principal::Anonymous, &alice), "authentication off");
        let rename = Request::Rename(weft_proto::msg::RenameReq {
            src_parent: 7,
            src_name: "a".into(),
            dst_parent: 9,
            dst_name: "b".into(),
            flags: 0,
        });
        assert_eq!(inodes_named(&rename), vec![7, 9]);
        assert_eq!(inodes_named(&Request::Statfs(())), Vec::<u64>::new());
    }

    #[test]
    fn every_key_policy_maps_the_asserted_user_as_documented() {
        let alice = UserCred { uid: 1000, gid: 100, groups: vec![0, 27] };
        let root = UserCred { uid: 0, gid: 0, groups: vec![0, 4] };
        let cred = |p: &Principal, u: Option<&UserCred>| {
            let c = effective_cred(p, u);
            (c.uid, c.gid, c.groups)
        };
        for p in [Principal::Anonymous, key(KeyPolicy::Cluster), key(KeyPolicy::Trusted)] {
            assert_eq!(cred(&p, Some(&alice)), (1000, 100, vec![0, 27]), "{p:?}");
            assert_eq!(cred(&p, Some(&root)), (0, 0, vec![0, 4]), "{p:?}");
        }
        for p in [Principal::Anonymous, key(KeyPolicy::Cluster)] {
            assert_eq!(cred(&p, None), (0, 0, vec![]), "a server of the cluster acts as root");
        }
        let squash = key(KeyPolicy::SquashRoot);
        assert_eq!(cred(&squash, Some(&root)), (65534, 65534, vec![65534, 4]));
        assert_eq!(cred(&squash, Some(&alice)), (1000, 100, vec![65534, 27]), "group 0 is squashed too");
        let fixed = key(KeyPolicy::Fixed { uid: 1234, gid: 55 });
        for u in [Some(&alice), Some(&root), None] {
            assert_eq!(cred(&fixed, u), (1234, 55, vec![]));
        }
        for p in [key(KeyPolicy::Trusted), squash] {
            assert_eq!(cred(&p, None), (65534, 65534, vec![]), "a client key without a user is nobody");
        }
    }
}
