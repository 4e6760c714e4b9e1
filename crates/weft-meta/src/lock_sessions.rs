//! The MDS's side of advisory locks (docs/format.md §14): the [`LockTable`] behind a lock, who may lock (the
//! permission rules of `perm.rs`, as knfsd and Lustre check: read for a shared lock, write for an exclusive one;
//! any of the two for `flock`, which Linux allows on any open file), and when a client's locks go away.
//!
//! A client that vanishes (killed, its host down) never unlocks. The RPC server tells the service which sessions
//! used a connection when it closes ([`weft_rpc::Service::connection_closed`]); a session that holds locks and has
//! made no call since is given `grace_ms` to come back on a new connection (a client reconnects on its next call,
//! and one holding locks calls `Null` often enough that the server's idle timeout never closes it); after that its
//! locks are released. Locks live in memory only: an MDS restart drops them all, like an NFS server reboot without
//! a reclaim period (clients are not told; their next unlock finds nothing to release).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weft_proto::msg::{GetLockReq, LockClass, LockHolder, LockKind, ReleaseLocksReq, SetLockReq};
use weft_proto::{ErrorCode, WireError};

use crate::locks::{LockError, LockOp, LockTable, Owner};
use crate::perm::Mask;
use crate::store::MetaStore;
use crate::{Clock, Cred, Namespace};

/// Default for `locks_grace_ms`: how long a lock-holding session whose connection closed may take to come back.
pub const DEFAULT_LOCKS_GRACE_MS: u64 = 10_000;

pub struct SessionLocks {
    table: Mutex<LockTable>,
    /// When each session holding locks last made a call (only those: a lookup per call, skipped while none do).
    seen: Mutex<HashMap<u64, Instant>>,
    holders: AtomicUsize,
    grace_ms: u64,
}

fn lock_error(e: LockError) -> WireError {
    match e {
        LockError::NoLocks { locks_max } => {
            WireError::new(ErrorCode::NoLocks, format!("the lock table is full ({locks_max} locks, locks_max)"))
        }
        LockError::BadRange { start, end } => {
            WireError::new(ErrorCode::Invalid, format!("lock range starts at {start}, after its end {end}"))
        }
        LockError::Conflict(h) => WireError::new(ErrorCode::Busy, format!("conflicts with {h:?}")),
    }
}

impl SessionLocks {
    pub fn new(locks_max: usize, grace_ms: u64) -> SessionLocks {
        SessionLocks {
            table: Mutex::new(LockTable::new(locks_max)),
            seen: Mutex::new(HashMap::new()),
            holders: AtomicUsize::new(0),
            grace_ms,
        }
    }

    /// Locks held now, all clients.
    pub fn len(&self) -> usize {
        self.table.lock().expect("lock table").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every call: a session holding locks is alive.
    pub fn touch(&self, session: u64) {
        if self.holders.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(at) = self.seen.lock().expect("lock sessions").get_mut(&session) {
            *at = Instant::now();
        }
    }

    /// Keeps `seen` to exactly the sessions holding locks.
    fn note(&self, session: u64, table: &LockTable) {
        let mut seen = self.seen.lock().expect("lock sessions");
        if table.session_holds(session) {
            seen.insert(session, Instant::now());
        } else {
            seen.remove(&session);
        }
        self.holders.store(seen.len(), Ordering::Relaxed);
    }

    /// Who may take `kind` (`None`: any) locks on `ino`: read for shared, write for exclusive; `flock`: either.
    fn check<S: MetaStore, C: Clock>(
        ns: &Namespace<S, C>,
        cred: &Cred,
        ino: u64,
        class: LockClass,
        kind: LockKind,
    ) -> Result<(), WireError> {
        match (class, kind) {
            (LockClass::Posix, LockKind::Shared) => ns.may_access(cred, ino, Mask::READ),
            (LockClass::Posix, LockKind::Exclusive) => ns.may_access(cred, ino, Mask::WRITE),
            (LockClass::Flock, _) => {
                ns.may_access(cred, ino, Mask::READ).or_else(|_| ns.may_access(cred, ino, Mask::WRITE))
            }
        }
    }

    /// `SetLock` for `session`: the caller's permission, then the table. An unlock needs no permission (the
    /// caller only drops its own locks).
    pub fn set<S: MetaStore, C: Clock>(
        &self,
        ns: &Namespace<S, C>,
        cred: &Cred,
        session: u64,
        r: &SetLockReq,
    ) -> Result<Option<LockHolder>, WireError> {
        if let Some(kind) = r.kind {
            Self::check(ns, cred, r.ino, r.class, kind)?;
        }
        let owner = Owner { session, owner: r.owner };
        let op = LockOp { class: r.class, kind: r.kind, start: r.start, end: r.end, pid: r.pid };
        let mut table = self.table.lock().expect("lock table");
        let out = match table.set(r.ino, owner, op) {
            Ok(()) => None,
            Err(LockError::Conflict(h)) => Some(h),
            Err(e) => return Err(lock_error(e)),
        };
        self.note(session, &table);
        Ok(out)
    }

    /// `GetLock`: the first conflicting lock of another owner (same permission as setting it).
    pub fn get<S: MetaStore, C: Clock>(
        &self,
        ns: &Namespace<S, C>,
        cred: &Cred,
        session: u64,
        r: &GetLockReq,
    ) -> Result<Option<LockHolder>, WireError> {
        Self::check(ns, cred, r.ino, r.class, r.kind)?;
        let owner = Owner { session, owner: r.owner };
        let (start, end) = if r.class == LockClass::Flock { (0, u64::MAX) } else { (r.start, r.end) };
        self.table.lock().expect("lock table").get(r.ino, r.class, owner, r.kind, start, end).map_err(lock_error)
    }

    /// `ReleaseLocks`: only ever the caller's own session's.
    pub fn release(&self, session: u64, r: &ReleaseLocksReq) -> u32 {
        let mut table = self.table.lock().expect("lock table");
        let n = table.release(session, r.ino, r.owner);
        self.note(session, &table);
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// A connection closed that carried `sessions`: each one holding locks gets `grace_ms` to make a call again,
    /// else its locks go.
    pub fn connection_closed(self: &Arc<Self>, sessions: &[u64]) {
        let closed_at = Instant::now();
        let holding: Vec<u64> = {
            let seen = self.seen.lock().expect("lock sessions");
            sessions.iter().copied().filter(|s| seen.contains_key(s)).collect()
        };
        if holding.is_empty() {
            return;
        }
        let me = self.clone();
        // One task per closed connection that held locks: bounded by the server's connection table.
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(me.grace_ms)).await;
            me.expire(&holding, closed_at);
        });
    }

    /// Releases the locks of each of `sessions` that made no call since `closed_at`; returns how many sessions.
    fn expire(&self, sessions: &[u64], closed_at: Instant) -> usize {
        let mut expired = 0;
        for &session in sessions {
            let back = self.seen.lock().expect("lock sessions").get(&session).is_none_or(|&at| at >= closed_at);
            if back {
                continue;
            }
            let mut table = self.table.lock().expect("lock table");
            let n = table.release(session, None, None);
            self.note(session, &table);
            expired += 1;
            tracing::info!(
                session = format_args!("{session:#x}"),
                locks = n,
                grace_ms = self.grace_ms,
                "released the locks of a session whose connection closed and did not come back"
            );
        }
        expired
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use weft_proto::ROOT_INO;
    use weft_proto::msg::MkdirReq;

    use super::*;
    use crate::{DEFAULT_LIVENESS_MS, ManualClock, MemStore};

    #[test]
    fn permission_then_the_table_and_only_sessions_that_stay_away_lose_their_locks() {
        let ns = Namespace::new(MemStore::new(), Arc::new(ManualClock::new(0)), DEFAULT_LIVENESS_MS).unwrap();
        let root = Cred::root();
        let mkdir = weft_proto::Request::Mkdir(MkdirReq { parent: ROOT_INO, name: "d".into(), mode: 0o700 });
        let ino = match ns.execute_as(&root, &mkdir).unwrap() {
            weft_proto::Response::Mkdir(a) => a.ino,
            other => panic!("{other:?}"),
        };
        let locks = SessionLocks::new(10, 0);
        let req = |kind, owner| SetLockReq { ino, class: LockClass::Posix, kind, start: 0, end: 9, owner, pid: 1 };
        let alice = Cred::new(1000, 1000, vec![]);
        let e = locks.set(&ns, &alice, 7, &req(Some(LockKind::Shared), 1)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Permission, "a 0700 directory of root's: alice may not read it");
        assert_eq!(locks.set(&ns, &alice, 7, &req(None, 1)).unwrap(), None, "an unlock needs no permission");
        assert_eq!(locks.set(&ns, &root, 1, &req(Some(LockKind::Shared), 1)).unwrap(), None);
        assert_eq!(locks.set(&ns, &root, 2, &req(Some(LockKind::Shared), 1)).unwrap(), None);
        let h = locks.set(&ns, &root, 3, &req(Some(LockKind::Exclusive), 1)).unwrap().expect("a conflict");
        assert_eq!((h.kind, h.start, h.end), (LockKind::Shared, 0, 9));
        assert_eq!(locks.holders.load(Ordering::Relaxed), 2, "only sessions 1 and 2 are watched");

        // Both connections close; session 1 calls again (a reconnect), session 2 does not.
        let closed_at = Instant::now();
        locks.touch(1);
        assert_eq!(locks.expire(&[1, 2, 9], closed_at), 1);
        assert_eq!(locks.len(), 1, "session 2's lock went, session 1's stayed");
        let q = GetLockReq { ino, class: LockClass::Posix, kind: LockKind::Exclusive, start: 0, end: 0, owner: 1 };
        assert!(locks.get(&ns, &root, 3, &q).unwrap().is_some());
        assert_eq!(locks.release(1, &ReleaseLocksReq { ino: None, owner: None }), 1);
        assert!(locks.is_empty());
        assert_eq!(locks.holders.load(Ordering::Relaxed), 0, "nobody watched: touch is one atomic load");
    }
}
