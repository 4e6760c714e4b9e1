//! The metadata service's RPC service: [`MetaService::call`] runs each request through [`Namespace::execute`]
//! (which holds one function per op), in place for point reads and on tokio's blocking pool for the rest.
//!
//! Store transactions are synchronous and durable (a journal fdatasync), so they run on the blocking pool.
//!
//! `Open` and `CreateOpen` are answered here: the namespace checks the caller's access, and the service seals a
//! capability (docs/format.md §10) for the calling connection's key and session with the capability key.

use std::sync::Arc;

use weft_proto::msg::{CreateReq, OpenReq, OpenResp, RegisterServerReq};
use weft_proto::{Attr, Capability, ErrorCode, Request, Response, Rights, WireError};
use weft_rpc::{CallCtx, CapabilityKey, PoolBuf, Principal, Reply, Service};

use crate::{Cred, Namespace, RedbStore, SystemClock};

/// Default lifetime of a capability: one minute. It bounds how long a removed permission keeps working on the
/// data servers (ARCHITECTURE.md, Invariants), and a client renews each open file's capability once per 40 s of
/// use, one cheap MDS call (NFSv4 leases are 90 s by default, for the same trade).
pub const DEFAULT_CAPABILITY_TTL_MS: u64 = 60_000;

pub struct MetaService {
    ns: Arc<Namespace<RedbStore, SystemClock>>,
    /// `None` with authentication off: capabilities are issued empty (version 0).
    cap_key: Option<CapabilityKey>,
    capability_ttl_ms: u64,
}

impl MetaService {
    pub fn new(ns: Arc<Namespace<RedbStore, SystemClock>>) -> MetaService {
        MetaService { ns, cap_key: None, capability_ttl_ms: DEFAULT_CAPABILITY_TTL_MS }
    }

    /// Seals capabilities under `key` (derived from the cluster key), valid for `ttl_ms`.
    pub fn with_capabilities(mut self, key: Option<CapabilityKey>, ttl_ms: u64) -> MetaService {
        self.cap_key = key;
        self.capability_ttl_ms = ttl_ms.max(1);
        self
    }

    /// The identity the caller acts as. Stub: the ident branch replaces this (per-user identity on MDS requests).
    fn caller_cred(&self, _ctx: &CallCtx) -> Result<Cred, WireError> {
        Ok(Cred::root())
    }

    /// A capability for `ino` with `rights`, for the calling connection's key and session; empty with
    /// authentication off.
    fn issue(&self, ctx: &CallCtx, ino: u64, rights: Rights) -> Result<Capability, WireError> {
        let Some(key) = &self.cap_key else { return Ok(Capability::none()) };
        let key_id = match &ctx.principal {
            Principal::Key { key_id } => key_id.clone(),
            Principal::Anonymous => {
                return Err(WireError::new(
                    ErrorCode::Unauthenticated,
                    "a capability needs an authenticated connection",
                ));
            }
        };
        let expiry_ms = weft_rpc::capability::unix_now_ms().saturating_add(self.capability_ttl_ms);
        key.seal(ino, rights, expiry_ms, &key_id, ctx.session)
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("sealing a capability: {e}")))
    }

    fn opened(&self, ctx: &CallCtx, attr: Attr, rights: Rights) -> Result<OpenResp, WireError> {
        let cap = self.issue(ctx, attr.ino, rights)?;
        Ok(OpenResp { attr, cap, ttl_ms: self.capability_ttl_ms })
    }

    /// `Open`: access checked as the caller, then a capability. A point read, run in place.
    fn open(&self, ctx: &CallCtx, r: &OpenReq) -> Result<Reply, WireError> {
        let cred = self.caller_cred(ctx)?;
        let attr = self.ns.open(&cred, r.ino, r.rights)?;
        Ok(Response::Open(self.opened(ctx, attr, r.rights)?).into())
    }

    /// `CreateOpen`: `Create`, then read+write rights. An exclusive create made the file, and its creator may write
    /// it whatever its mode (as open(2) with O_CREAT); a non-exclusive one may have found an existing file, whose
    /// mode is then checked (so a non-exclusive create of a new file with a mode without write permission for its
    /// owner is refused its capability: the one case where this differs from open(2)).
    async fn create_open(&self, ctx: &CallCtx, r: CreateReq) -> Result<Reply, WireError> {
        let cred = self.caller_cred(ctx)?;
        let ns = self.ns.clone();
        let attr = tokio::task::spawn_blocking(move || {
            let exclusive = r.exclusive;
            let attr = match ns.execute_as(&cred, &Request::Create(r))? {
                Response::Create(a) => a,
                other => return Err(WireError::new(ErrorCode::Internal, format!("create answered {:?}", other.op()))),
            };
            if exclusive { Ok(attr) } else { ns.open(&cred, attr.ino, Rights::READ_WRITE) }
        })
        .await
        .map_err(|e| WireError::new(ErrorCode::Internal, format!("metadata task failed: {e}")))??;
        Ok(Response::CreateOpen(self.opened(ctx, attr, Rights::READ_WRITE)?).into())
    }

    /// Point reads never wait for a disk flush (redb reads from its cache; a miss is one pread), so they run in
    /// place: a hop to the blocking pool costs two thread wake-ups, more than the lookup itself.
    fn execute_in_place(&self, req: &Request) -> Result<Reply, WireError> {
        Ok(self.ns.execute(req)?.into())
    }

    /// Writes wait for the journal's fdatasync and readdir pages may be long, so those go to the blocking pool.
    async fn execute_on_blocking_pool(&self, req: Request) -> Result<Reply, WireError> {
        let ns = self.ns.clone();
        let resp = tokio::task::spawn_blocking(move || ns.execute(&req))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("metadata task failed: {e}")))??;
        Ok(resp.into())
    }
}

impl MetaService {
    /// Only the cluster key registers data servers (with authentication on): anyone else could otherwise receive
    /// new files' data. An id moving to a new address is allowed (a server restarted elsewhere) but logged.
    fn check_registration(&self, ctx: &CallCtx, r: &RegisterServerReq) -> Result<(), WireError> {
        if !ctx.principal.is_trusted_server() {
            tracing::warn!(peer = %ctx.peer, principal = ctx.principal.name(), id = r.id, addr = %r.addr,
                "refusing a data-server registration: it needs the cluster key");
            return Err(WireError::new(
                ErrorCode::Permission,
                format!(
                    "registering a data server needs the cluster key (this connection proved {:?})",
                    ctx.principal.name()
                ),
            ));
        }
        if let Some(old) = self.ns.servers().into_iter().find(|s| s.id == r.id && s.addr != r.addr) {
            tracing::warn!(id = r.id, old = %old.addr, new = %r.addr, peer = %ctx.peer, "data server id moves to a new address");
        }
        Ok(())
    }
}

impl Service for MetaService {
    async fn call(&self, ctx: &CallCtx, req: Request, _data: Option<PoolBuf>) -> Result<Reply, WireError> {
        if let Request::RegisterServer(r) = &req {
            self.check_registration(ctx, r)?;
        }
        match req {
            Request::Open(r) => self.open(ctx, &r),
            Request::CreateOpen(r) => self.create_open(ctx, r).await,
            Request::GetAttr(_) | Request::Lookup(_) | Request::Readlink(_) | Request::Null(_) => {
                self.execute_in_place(&req)
            }
            req => self.execute_on_blocking_pool(req).await,
        }
    }
}
