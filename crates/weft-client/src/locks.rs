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
        let r = meta_call!(self, SetLock(req));
        if taking && r.is_none() {
            self.keep_alive_for_locks();
        }
        Ok(r)
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
        Ok(meta_call!(self, GetLock(req)))
    }

    /// Drops this client's locks on `ino` (every inode: `None`) of `owner` (every owner: `None`); returns how many.
    pub async fn release_locks(&self, ino: Option<u64>, owner: Option<u64>) -> Result<u32, ClientError> {
        Ok(meta_call!(self, ReleaseLocks(ReleaseLocksReq { ino, owner })))
    }

    /// Takes over the locks of `previous_session` (this client's predecessor, authenticated with the same key;
    /// docs/format.md §22): they are this client's session's from now on. Errors: `AdoptRefused` (another
    /// principal's session), `Invalid` (this session already holds locks).
    pub async fn adopt_locks(&self, previous_session: u64) -> Result<AdoptLocksResp, ClientError> {
        let r = meta_call!(self, AdoptLocks(AdoptLocksReq { previous_session }));
        if r.total > 0 {
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
                }
            });
        });
    }
}
