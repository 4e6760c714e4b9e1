//! Advisory locks (docs/format.md §14): POSIX record locks and `flock` locks kept by the MDS for (this client's
//! MDS session, an owner id the caller picks: a FUSE `lock_owner`, an NFSv4 lock-owner).
//!
//! The MDS never waits: a blocking request (F_SETLKW, `flock` without LOCK_NB) is [`Client::set_lock_wait`],
//! which retries here with capped exponential backoff ([`LOCK_RETRY_FIRST_MS`] doubling to [`LOCK_RETRY_MAX_MS`])
//! for as long as its caller still wants the lock. Nothing is queued anywhere, so nothing grows and no wait-for
//! graph can deadlock the server; the cost is up to one backoff step of latency after an unlock, and no fairness.
//!
//! While it may hold locks, a client sends `Null` to the MDS every [`LOCK_KEEPALIVE_MS`], so the server's idle
//! timeout never closes its connection (a closed connection that does not come back loses its locks).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use weft_proto::msg::{AdoptLocksReq, AdoptLocksResp, GetLockReq, LockHolder, ReleaseLocksReq, SetLockReq};
use weft_proto::{Request, Response};

use crate::{Client, ClientError, Inner, unexpected};

/// First wait of a blocking lock request after a conflict.
pub const LOCK_RETRY_FIRST_MS: u64 = 5;
/// Longest wait between two tries of a blocking lock request.
pub const LOCK_RETRY_MAX_MS: u64 = 500;
/// How often a client that may hold locks shows the MDS it is alive.
pub const LOCK_KEEPALIVE_MS: u64 = 60_000;

impl Client {
    /// Sets or clears (`kind = None`) a lock: `None` when done, or the lock in the way (the request changed
    /// nothing). Errors: `Permission` (a shared lock needs read access, an exclusive one write access), `NoLocks`
    /// (the MDS's table is full), `Invalid` (`start > end`).
    pub async fn set_lock(&self, req: SetLockReq) -> Result<Option<LockHolder>, ClientError> {
        let taking = req.kind.is_some();
        let r = match self.lock_call(Request::SetLock(req)).await? {
            Response::SetLock(r) => r,
            other => return Err(unexpected(other)),
        };
        if taking && r.is_none() {
            let now = self.mds_session();
            let _ = self.inner.locks_session.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
            self.keep_alive_for_locks();
        }
        Ok(r)
    }

    /// A lock call, on the session that holds this client's locks: if the session changed (a failover to another
    /// metadata service, format §30), the old session's locks are adopted first; if it changed during the call,
    /// the call ran on a session without them, so it is made again after the adoption (an unlock would have
    /// released nothing; a lock would have met this client's own old locks).
    async fn lock_call(&self, req: Request) -> Result<Response, ClientError> {
        self.reclaim_locks().await;
        let before = self.mds_session();
        let r = self.meta(req.clone()).await;
        if self.mds_session() != before && self.reclaim_locks().await {
            return self.meta(req).await;
        }
        r
    }

    /// Adopts the locks of the session they were taken on if this client's session is another now; answers
    /// whether it tried.
    async fn reclaim_locks(&self) -> bool {
        let held = self.inner.locks_session.load(Ordering::SeqCst);
        let now = self.mds_session();
        if held == 0 || now == 0 || held == now {
            return false;
        }
        match self.meta(Request::AdoptLocks(AdoptLocksReq { previous_session: held })).await {
            Ok(Response::AdoptLocks(r)) => tracing::info!(
                from = format_args!("{held:#x}"),
                to = format_args!("{now:#x}"),
                locks = r.total,
                "took this client's locks over to its new metadata session"
            ),
            Ok(other) => tracing::warn!("adopting this client's locks: unexpected reply {:?}", other.op()),
            // An embedded store's restart dropped them (nothing to adopt), or they are gone: the next lock call
            // meets whatever the MDS holds.
            Err(e) => tracing::warn!(from = format_args!("{held:#x}"), "could not take over this client's locks: {e}"),
        }
        self.inner.locks_session.store(self.mds_session(), Ordering::SeqCst);
        true
    }

    /// [`Client::set_lock`] until granted, retrying after conflicts with capped exponential backoff while
    /// `wanted()` holds (the waiting process is still there). Returns whether the lock was set; a lock granted
    /// just as `wanted()` turned false is released again.
    pub async fn set_lock_wait(&self, req: SetLockReq, wanted: impl Fn() -> bool) -> Result<bool, ClientError> {
        let mut wait_ms = LOCK_RETRY_FIRST_MS;
        loop {
            if self.set_lock(req.clone()).await?.is_none() {
                if wanted() {
                    return Ok(true);
                }
                let undo = SetLockReq { kind: None, ..req };
                self.set_lock(undo).await?;
                return Ok(false);
            }
            if !wanted() {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
            wait_ms = (wait_ms * 2).min(LOCK_RETRY_MAX_MS);
        }
    }

    /// The first lock of another owner that conflicts with the one described (F_GETLK), or `None`.
    pub async fn get_lock(&self, req: GetLockReq) -> Result<Option<LockHolder>, ClientError> {
        match self.lock_call(Request::GetLock(req)).await? {
            Response::GetLock(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// Drops this client's locks on `ino` (every inode: `None`) of `owner` (every owner: `None`); returns how many.
    pub async fn release_locks(&self, ino: Option<u64>, owner: Option<u64>) -> Result<u32, ClientError> {
        match self.lock_call(Request::ReleaseLocks(ReleaseLocksReq { ino, owner })).await? {
            Response::ReleaseLocks(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// Takes over the locks of `previous_session` (this client's predecessor, authenticated with the same key;
    /// docs/format.md §22): they are this client's session's from now on. Errors: `AdoptRefused` (another
    /// principal's session), `Invalid` (this session already holds locks).
    pub async fn adopt_locks(&self, previous_session: u64) -> Result<AdoptLocksResp, ClientError> {
        let r = meta_call!(self, AdoptLocks(AdoptLocksReq { previous_session }));
        if r.total > 0 {
            self.inner.locks_session.store(self.mds_session(), Ordering::SeqCst);
            self.keep_alive_for_locks();
        }
        Ok(r)
    }

    /// Shows the MDS this client's connection is alive (`Null` outside the slots, so no sequence is spent).
    pub async fn ping_mds(&self) -> Result<(), ClientError> {
        self.inner.mds.ping().await.map_err(ClientError::Meta)
    }

    /// The session this client holds at the MDS now: the one its locks are held by (an MDS restart, which drops
    /// every lock, gives it a new one).
    pub fn mds_session(&self) -> u64 {
        self.inner.mds.session_id()
    }

    /// Starts, once per client, the task that keeps the MDS connection busy enough not to be closed as idle; it
    /// ends with the client.
    fn keep_alive_for_locks(&self) {
        let inner: Weak<Inner> = Arc::downgrade(&self.inner);
        let user = self.user.clone();
        self.inner.lock_keepalive.get_or_init(|| {
            tokio::spawn(async move {
                let period = Duration::from_millis(LOCK_KEEPALIVE_MS);
                loop {
                    tokio::time::sleep(period).await;
                    let Some(inner) = inner.upgrade() else { return };
                    // Outside the slots (`ping`): a slotted Null would skip a sequence number and make the MDS
                    // refuse the slot's next call, costing the session (and with it every lock it holds).
                    if let Err(e) = inner.mds.ping().await {
                        tracing::debug!("lock keepalive: {e}");
                    }
                    // With several services (format §30): a slotted point read meets a service that lost this
                    // session, which opens a new one; the locks are then adopted well before a dead service's
                    // sessions lose theirs (`locks_orphan_ms`).
                    let client = Client { inner, user: user.clone() };
                    let root = weft_proto::msg::InoReq { ino: weft_proto::ROOT_INO };
                    if client.meta(Request::GetAttr(root)).await.is_ok() {
                        client.reclaim_locks().await;
                    }
                }
            });
        });
    }
}
