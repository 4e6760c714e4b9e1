//! The metadata service's RPC service: [`MetaService::call`] runs each request through [`Namespace::execute`]
//! (which holds one function per op), in place for point reads and on tokio's blocking pool for the rest.
//!
//! Store transactions are synchronous and durable (a journal fdatasync), so they run on the blocking pool.

use std::sync::Arc;

use weft_proto::msg::RegisterServerReq;
use weft_proto::{ErrorCode, Request, WireError};
use weft_rpc::{CallCtx, PoolBuf, Reply, Service};

use crate::{Namespace, RedbStore, SystemClock};

pub struct MetaService {
    ns: Arc<Namespace<RedbStore, SystemClock>>,
}

impl MetaService {
    pub fn new(ns: Arc<Namespace<RedbStore, SystemClock>>) -> MetaService {
        MetaService { ns }
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
            Request::GetAttr(_) | Request::Lookup(_) | Request::Readlink(_) | Request::Null(_) => {
                self.execute_in_place(&req)
            }
            req => self.execute_on_blocking_pool(req).await,
        }
    }
}
