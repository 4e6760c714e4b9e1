//! The metadata service's RPC service: [`MetaService::call`] runs each request through [`Namespace::execute`]
//! (which holds one function per op), in place for point reads and on tokio's blocking pool for the rest.
//!
//! Store transactions are synchronous and durable (a journal fdatasync), so they run on the blocking pool.

use std::sync::Arc;

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

impl Service for MetaService {
    async fn call(&self, _ctx: &CallCtx, req: Request, _data: Option<PoolBuf>) -> Result<Reply, WireError> {
        match req {
            Request::GetAttr(_) | Request::Lookup(_) | Request::Readlink(_) | Request::Null(_) => {
                self.execute_in_place(&req)
            }
            req => self.execute_on_blocking_pool(req).await,
        }
    }
}
