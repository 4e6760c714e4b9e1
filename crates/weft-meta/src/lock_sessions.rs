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
//!
//! A restarted NFS gateway takes over its killed predecessor's locks with `AdoptLocks` (docs/format.md §22): only
//! when the predecessor's session took them under the same principal (recorded here at each grant, from the
//! connection's proof, never from a field); the predecessor's session is then ended for locks.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weft_proto::msg::{
    ADOPTED_LIST_MAX, AdoptLocksReq, AdoptLocksResp, AdoptedLock, GetLockReq, LockClass, LockHolder, LockKind,
    ReleaseLocksReq, SetLockReq,
};
use weft_proto::{ErrorCode, WireError};
use weft_rpc::Principal;

use crate::db_locks;
use crate::locks::{LockError, LockOp, LockTable, Owner};
use crate::perm::Mask;
use crate::store::MetaStore;
use crate::{Clock, Cred, Namespace};

/// Default for `locks_grace_ms`: how long a lock-holding session whose connection closed may take to come back.
pub const DEFAULT_LOCKS_GRACE_MS: u64 = 10_000;

/// Sessions ended for locks by an `AdoptLocks` remembered (oldest forgotten first).
pub const ENDED_SESSIONS_MAX: usize = 1024;

/// A session holding locks: when it last made a call, and who its connection proved to be when it took them.
struct Holder {
    at: Instant,
    principal: Principal,
}

pub struct SessionLocks {
    table: Mutex<LockTable>,
    /// With several services on one database: the locks live there (`crate::db_locks`), not in `table`.
    shared: Option<Arc<crate::MdsNamespace>>,
    /// Each session holding locks (only those: a lookup per call, skipped while none do).
    seen: Mutex<HashMap<u64, Holder>>,
    holders: AtomicUsize,
    grace_ms: u64,
    /// Sessions whose locks another session adopted: they may lock no more (bounded, FIFO).
    ended: Mutex<(VecDeque<u64>, HashSet<u64>)>,
    /// Lock entries one session of a per-client key may hold (issue 31: one client cannot fill the table for
    /// everyone); sessions of the cluster key (mounts, gateways, servers) are bounded by `locks_max` only.
    per_client_session_max: usize,
}

fn adopter_holds(session: u64) -> WireError {
    WireError::new(
        ErrorCode::Invalid,
        format!("session {session:#x} already holds locks: only a session holding none adopts"),
    )
}

/// A shared-store lock call's refusal, for the wire.
fn refused(e: db_locks::Refused) -> WireError {
    match e {
        db_locks::Refused::Lock(e) => lock_error(e),
        db_locks::Refused::Store(e) => WireError::new(ErrorCode::Io, format!("the lock records: {e}")),
        db_locks::Refused::Quota { held } => {
            WireError::new(ErrorCode::NoLocks, format!("the session holds {held} locks, its quota"))
        }
        db_locks::Refused::OtherPrincipal(p) => WireError::new(
            ErrorCode::AdoptRefused,
            format!("the session took its locks as {p:?}, not as this connection"),
        ),
    }
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
            shared: None,
            seen: Mutex::new(HashMap::new()),
            holders: AtomicUsize::new(0),
            grace_ms,
            ended: Mutex::new((VecDeque::new(), HashSet::new())),
            per_client_session_max: locks_max,
        }
    }

    /// At most `n` lock entries per session of a per-client key (`locks_per_client_session_max`).
    pub fn with_per_client_session_max(mut self, n: usize) -> SessionLocks {
        self.per_client_session_max = n.max(1);
        self
    }

    /// The most lock entries a session of `principal` may hold: a per-client key's quota; `None` for the cluster key
    /// (and with authentication off), whose sessions are bounded by `locks_max` only.
    fn quota_of(&self, principal: &Principal) -> Option<usize> {
        (matches!(principal, Principal::Key { .. }) && !principal.is_cluster()).then_some(self.per_client_session_max)
    }

    /// Refuses a new lock of a per-client key's session that holds its quota already (ENOLCK, naming the key).
    fn check_client_quota(&self, table: &LockTable, principal: &Principal, session: u64) -> Result<(), WireError> {
        match self.quota_of(principal) {
            Some(quota) if table.held_by(session) >= quota => {
                Err(Self::over_quota(principal, session, table.held_by(session)))
            }
            _ => Ok(()),
        }
    }

    /// The refusal of a lock past a session's quota, logged.
    fn over_quota(principal: &Principal, session: u64, held: usize) -> WireError {
        tracing::warn!(
            key = principal.name(),
            session = format_args!("{session:#x}"),
            held,
            "lock refused: the session holds its quota (locks_per_client_session_max)"
        );
        WireError::new(
            ErrorCode::NoLocks,
            format!(
                "key {:?}'s session holds {held} locks, its quota (locks_per_client_session_max)",
                principal.name()
            ),
        )
    }

    /// Keeps the locks in `ns`'s store (docs/format.md §30), which other services share.
    pub fn shared(mut self, ns: Arc<crate::MdsNamespace>) -> SessionLocks {
        self.shared = Some(ns);
        self
    }

    /// Locks held now, all clients (in this service's memory: 0 when they live in a shared store).
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
        if let Some(h) = self.seen.lock().expect("lock sessions").get_mut(&session) {
            h.at = Instant::now();
        }
    }

    /// Keeps `seen` to exactly the sessions holding locks; `principal` is the caller's when it was granted one.
    fn note(&self, session: u64, holds: bool, principal: Option<&Principal>) {
        let mut seen = self.seen.lock().expect("lock sessions");
        if holds {
            let at = Instant::now();
            match (seen.get_mut(&session), principal) {
                (Some(h), _) => h.at = at,
                (None, Some(p)) => {
                    seen.insert(session, Holder { at, principal: p.clone() });
                }
                // Only a grant (with its principal) or an adoption (see `adopt`) makes a holder.
                (None, None) => unreachable!("a lock holder with no recorded principal"),
            }
        } else {
            seen.remove(&session);
        }
        self.holders.store(seen.len(), Ordering::Relaxed);
    }

    fn check_not_ended(&self, session: u64) -> Result<(), WireError> {
        if self.ended.lock().expect("ended sessions").1.contains(&session) {
            return Err(WireError::new(
                ErrorCode::LocksAdopted,
                format!("session {session:#x}'s locks were adopted by another session: it may lock no more"),
            ));
        }
        Ok(())
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
        principal: &Principal,
        session: u64,
        r: &SetLockReq,
    ) -> Result<Option<LockHolder>, WireError> {
        if let Some(kind) = r.kind {
            self.check_not_ended(session)?;
            Self::check(ns, cred, r.ino, r.class, kind)?;
        }
        let owner = Owner { session, owner: r.owner };
        let op = LockOp { class: r.class, kind: r.kind, start: r.start, end: r.end, pid: r.pid };
        if let Some(ns) = &self.shared {
            let quota = self.quota_of(principal).map(|q| u32::try_from(q).unwrap_or(u32::MAX));
            let who = db_locks::Caller { session, principal: principal.name(), service: ns.instance(), quota };
            return match db_locks::set(ns.store(), who, r.ino, r.owner, op) {
                Ok(holds) => {
                    self.note(session, holds, Some(principal));
                    Ok(None)
                }
                Err(db_locks::Refused::Lock(LockError::Conflict(h))) => Ok(Some(h)),
                Err(db_locks::Refused::Quota { held }) => Err(Self::over_quota(principal, session, held as usize)),
                Err(e) => Err(refused(e)),
            };
        }
        let mut table = self.table.lock().expect("lock table");
        if r.kind.is_some() {
            self.check_client_quota(&table, principal, session)?;
        }
        let out = match table.set(r.ino, owner, op) {
            Ok(()) => None,
            Err(LockError::Conflict(h)) => Some(h),
            Err(e) => return Err(lock_error(e)),
        };
        self.note(session, table.session_holds(session), Some(principal));
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
        self.check_not_ended(session)?;
        Self::check(ns, cred, r.ino, r.class, r.kind)?;
        let owner = Owner { session, owner: r.owner };
        let (start, end) = if r.class == LockClass::Flock { (0, u64::MAX) } else { (r.start, r.end) };
        if let Some(ns) = &self.shared {
            return db_locks::get(ns.store(), session, r.ino, r.owner, r.class, r.kind, (start, end)).map_err(refused);
        }
        self.table.lock().expect("lock table").get(r.ino, r.class, owner, r.kind, start, end).map_err(lock_error)
    }

    /// `ReleaseLocks`: only ever the caller's own session's.
    pub fn release(&self, session: u64, r: &ReleaseLocksReq) -> Result<u32, WireError> {
        let (n, holds) = match &self.shared {
            Some(ns) => db_locks::release(ns.store(), session, r.ino, r.owner).map_err(refused)?,
            None => {
                let mut table = self.table.lock().expect("lock table");
                let n = table.release(session, r.ino, r.owner);
                (n, table.session_holds(session))
            }
        };
        self.note(session, holds, None);
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// `AdoptLocks` for `session` (authenticated as `principal`): moves `previous_session`'s locks here if it took
    /// them as the same principal, and ends it for locks (docs/format.md §22).
    pub fn adopt(&self, principal: &Principal, session: u64, r: &AdoptLocksReq) -> Result<AdoptLocksResp, WireError> {
        let from = r.previous_session;
        if from == session {
            return Err(WireError::new(ErrorCode::Invalid, "a session cannot adopt its own locks"));
        }
        if let Some(ns) = &self.shared {
            // An adoption moves what was granted already: no quota (a lock past it is refused afterwards).
            let who = db_locks::Caller { session, principal: principal.name(), service: ns.instance(), quota: None };
            let moved = db_locks::adopt(ns.store(), who, from).map_err(refused)?;
            return Ok(self.adopted(principal, from, session, moved));
        }
        let mut table = self.table.lock().expect("lock table");
        if table.session_holds(session) {
            return Err(adopter_holds(session));
        }
        {
            let seen = self.seen.lock().expect("lock sessions");
            if let Some(h) = seen.get(&from)
                && h.principal != *principal
            {
                return Err(WireError::new(
                    ErrorCode::AdoptRefused,
                    format!(
                        "session {from:#x} took its locks as {:?}, not as this connection's {:?}",
                        h.principal.name(),
                        principal.name()
                    ),
                ));
            }
        }
        let moved = table.adopt(from, session);
        drop(table);
        Ok(self.adopted(principal, from, session, moved))
    }

    /// After an adoption: `session` is the holder now (if anything moved), `from` may lock no more; the reply.
    fn adopted(&self, principal: &Principal, from: u64, session: u64, moved: Vec<AdoptedLock>) -> AdoptLocksResp {
        {
            let mut seen = self.seen.lock().expect("lock sessions");
            let had = seen.remove(&from).map(|h| h.principal);
            if let Some(p) = had.or_else(|| (!moved.is_empty()).then(|| principal.clone())) {
                seen.insert(session, Holder { at: Instant::now(), principal: p });
            }
            self.holders.store(seen.len(), Ordering::Relaxed);
        }
        let mut ended = self.ended.lock().expect("ended sessions");
        if ended.1.insert(from) {
            ended.0.push_back(from);
            while ended.0.len() > ENDED_SESSIONS_MAX {
                if let Some(old) = ended.0.pop_front() {
                    ended.1.remove(&old);
                }
            }
        }
        drop(ended);
        let total = moved.len() as u64;
        tracing::info!(
            from = format_args!("{from:#x}"),
            to = format_args!("{session:#x}"),
            principal = principal.name(),
            locks = total,
            "adopted the locks of a previous session (a restarted NFS gateway)"
        );
        let mut locks = moved;
        locks.truncate(ADOPTED_LIST_MAX);
        AdoptLocksResp { locks, total }
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
            let back = self.seen.lock().expect("lock sessions").get(&session).is_none_or(|h| h.at >= closed_at);
            if back {
                continue;
            }
            let n = match &self.shared {
                Some(ns) => match db_locks::release(ns.store(), session, None, None) {
                    Ok((n, holds)) => {
                        self.note(session, holds, None);
                        n
                    }
                    Err(e) => {
                        // Tried again at the next close of a connection it used, or adopted by its client.
                        tracing::warn!(
                            session = format_args!("{session:#x}"),
                            "releasing a gone session's locks: {e:?}"
                        );
                        continue;
                    }
                },
                None => {
                    let mut table = self.table.lock().expect("lock table");
                    let n = table.release(session, None, None);
                    self.note(session, table.session_holds(session), None);
                    n
                }
            };
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

    const P: Principal = Principal::Anonymous;

    fn ns_with_dir() -> (Namespace<MemStore, Arc<ManualClock>>, u64) {
        let ns = Namespace::new(MemStore::new(), Arc::new(ManualClock::new(0)), DEFAULT_LIVENESS_MS).unwrap();
        let mkdir = weft_proto::Request::Mkdir(MkdirReq { parent: ROOT_INO, name: "d".into(), mode: 0o700 });
        let ino = match ns.execute_as(&Cred::root(), &mkdir).unwrap() {
            weft_proto::Response::Mkdir(a) => a.ino,
            other => panic!("{other:?}"),
        };
        (ns, ino)
    }

    #[test]
    fn adopt_takes_the_same_principals_locks_refuses_another_and_is_bounded() {
        let (ns, ino) = ns_with_dir();
        let root = Cred::root();
        let key = |id: &str| Principal::Key { key_id: id.into(), policy: weft_rpc::KeyPolicy::Cluster };
        let (gw, other) = (key("gateway"), key("other"));
        let n = ADOPTED_LIST_MAX + 1;
        let locks = SessionLocks::new(n, 10_000);
        // Session 1 (the killed gateway) holds n one-byte locks, apart so none merge.
        for i in 0..n as u64 {
            let r = SetLockReq {
                ino,
                class: LockClass::Posix,
                kind: Some(LockKind::Exclusive),
                start: 2 * i,
                end: 2 * i,
                owner: 40 + i % 3,
                pid: 1,
            };
            assert_eq!(locks.set(&ns, &root, &gw, 1, &r).unwrap(), None);
        }
        // Another principal may not take them, nor adopt into itself, and nothing moved.
        let e = locks.adopt(&other, 2, &AdoptLocksReq { previous_session: 1 }).unwrap_err();
        assert_eq!(e.code, ErrorCode::AdoptRefused);
        assert_eq!(locks.adopt(&gw, 1, &AdoptLocksReq { previous_session: 1 }).unwrap_err().code, ErrorCode::Invalid);
        let probe = |owner, session| {
            let q = GetLockReq { ino, class: LockClass::Posix, kind: LockKind::Shared, start: 0, end: 0, owner };
            locks.get(&ns, &root, session, &q)
        };
        assert!(probe(40, 1).unwrap().is_none(), "still session 1's");
        // The same principal does: every lock moves, the list stops at its bound, the total counts them all.
        let r = locks.adopt(&gw, 3, &AdoptLocksReq { previous_session: 1 }).unwrap();
        assert_eq!((r.locks.len(), r.total), (ADOPTED_LIST_MAX, n as u64));
        assert!(
            r.locks
                .iter()
                .all(|l| l.ino == ino && l.start == l.end && l.start % 2 == 0 && l.kind == LockKind::Exclusive)
        );
        assert_eq!(locks.len(), n);
        assert!(probe(40, 3).unwrap().is_none(), "owner 40 of session 3 holds byte 0 now");
        assert!(probe(40, 4).unwrap().is_some(), "and anyone else still conflicts");
        // Session 1 is ended for locks; the table's bound still holds.
        assert_eq!(probe(40, 1).unwrap_err().code, ErrorCode::LocksAdopted);
        let one = |kind, start| SetLockReq { ino, class: LockClass::Posix, kind, start, end: start, owner: 9, pid: 1 };
        assert_eq!(
            locks.set(&ns, &root, &gw, 1, &one(Some(LockKind::Shared), 1)).unwrap_err().code,
            ErrorCode::LocksAdopted
        );
        assert_eq!(
            locks.set(&ns, &root, &gw, 5, &one(Some(LockKind::Shared), 1)).unwrap_err().code,
            ErrorCode::NoLocks
        );
        // A session holding nothing gives nothing; the adopted session is watched as a holder.
        let r = locks.adopt(&gw, 6, &AdoptLocksReq { previous_session: 77 }).unwrap();
        assert_eq!((r.locks.len(), r.total), (0, 0));
        assert_eq!(locks.holders.load(Ordering::Relaxed), 1);
        assert_eq!(locks.release(3, &ReleaseLocksReq { ino: None, owner: None }).unwrap(), n as u32);
        assert!(locks.is_empty());
    }

    /// One per-client key's session cannot fill the lock table for everyone (issue 31): past its quota its new
    /// locks are ENOLCK naming the key, while an unlock and the cluster key's sessions go on.
    #[test]
    fn a_per_client_keys_session_holds_at_most_its_quota_of_locks() {
        let (ns, ino) = ns_with_dir();
        let root = Cred::root();
        let locks = SessionLocks::new(100, 0).with_per_client_session_max(2);
        let mallory = Principal::Key { key_id: "mallory".into(), policy: weft_rpc::KeyPolicy::Trusted };
        let cluster = Principal::Key { key_id: "cluster".into(), policy: weft_rpc::KeyPolicy::Cluster };
        let byte = |kind, at| SetLockReq { ino, class: LockClass::Posix, kind, start: at, end: at, owner: 1, pid: 1 };
        for at in [0, 2] {
            assert_eq!(locks.set(&ns, &root, &mallory, 7, &byte(Some(LockKind::Shared), at)).unwrap(), None);
        }
        let e = locks.set(&ns, &root, &mallory, 7, &byte(Some(LockKind::Shared), 4)).unwrap_err();
        assert_eq!(e.code, ErrorCode::NoLocks);
        assert!(e.message.contains("mallory") && e.message.contains("locks_per_client_session_max"), "{}", e.message);
        assert_eq!(locks.set(&ns, &root, &mallory, 7, &byte(None, 0)).unwrap(), None, "an unlock is never refused");
        assert_eq!(locks.set(&ns, &root, &mallory, 7, &byte(Some(LockKind::Shared), 4)).unwrap(), None);
        for at in [10, 12, 14] {
            assert_eq!(locks.set(&ns, &root, &cluster, 8, &byte(Some(LockKind::Shared), at)).unwrap(), None);
        }
    }

    #[test]
    fn permission_then_the_table_and_only_sessions_that_stay_away_lose_their_locks() {
        let (ns, ino) = ns_with_dir();
        let root = Cred::root();
        let locks = SessionLocks::new(10, 0);
        let req = |kind, owner| SetLockReq { ino, class: LockClass::Posix, kind, start: 0, end: 9, owner, pid: 1 };
        let alice = Cred::new(1000, 1000, vec![]);
        let e = locks.set(&ns, &alice, &P, 7, &req(Some(LockKind::Shared), 1)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Permission, "a 0700 directory of root's: alice may not read it");
        assert_eq!(locks.set(&ns, &alice, &P, 7, &req(None, 1)).unwrap(), None, "an unlock needs no permission");
        assert_eq!(locks.set(&ns, &root, &P, 1, &req(Some(LockKind::Shared), 1)).unwrap(), None);
        assert_eq!(locks.set(&ns, &root, &P, 2, &req(Some(LockKind::Shared), 1)).unwrap(), None);
        let h = locks.set(&ns, &root, &P, 3, &req(Some(LockKind::Exclusive), 1)).unwrap().expect("a conflict");
        assert_eq!((h.kind, h.start, h.end), (LockKind::Shared, 0, 9));
        assert_eq!(locks.holders.load(Ordering::Relaxed), 2, "only sessions 1 and 2 are watched");

        // Both connections close; session 1 calls again (a reconnect), session 2 does not.
        let closed_at = Instant::now();
        locks.touch(1);
        assert_eq!(locks.expire(&[1, 2, 9], closed_at), 1);
        assert_eq!(locks.len(), 1, "session 2's lock went, session 1's stayed");
        let q = GetLockReq { ino, class: LockClass::Posix, kind: LockKind::Exclusive, start: 0, end: 0, owner: 1 };
        assert!(locks.get(&ns, &root, 3, &q).unwrap().is_some());
        assert_eq!(locks.release(1, &ReleaseLocksReq { ino: None, owner: None }).unwrap(), 1);
        assert!(locks.is_empty());
        assert_eq!(locks.holders.load(Ordering::Relaxed), 0, "nobody watched: touch is one atomic load");
    }
}
