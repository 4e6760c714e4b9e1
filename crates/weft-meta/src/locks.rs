//! The MDS's advisory lock table: POSIX record locks (`fcntl` F_SETLK/F_GETLK, NFSv4 LOCK/LOCKT/LOCKU) and
//! `flock` whole-file locks, as Linux's `fs/locks.c` keeps them. A pure data structure: no I/O, no clocks.
//!
//! An owner is (the caller's authenticated session, an owner id the caller chooses: a FUSE `lock_owner`, an NFSv4
//! lock-owner): two owners conflict, the same owner never conflicts with itself. Ranges are inclusive byte ranges
//! `[start, end]`, `end = u64::MAX` meaning "to the end of the file, however it grows".
//!
//! POSIX locks follow `posix_lock_inode`: a new lock replaces whatever the same owner held under its range (an
//! upgrade or a downgrade is atomic: refused as a whole or applied as a whole), splitting older ranges around it;
//! ranges of one owner and one kind that touch or overlap are merged; an unlock of the middle of a range splits
//! it. `flock` locks are a separate class (one per owner and inode, whole file) that never conflicts with POSIX
//! locks, as on Linux. A conversion of a `flock` lock that conflicts keeps the old lock (Linux may drop it first:
//! "not guaranteed to be atomic"; keeping it is the kinder of the allowed outcomes).
//!
//! Invariant: an owner's POSIX ranges on one inode are disjoint, sorted by start and never adjacent with the same
//! kind; no two owners hold overlapping ranges (or `flock` locks) of which one is exclusive; the table never holds
//! more than `locks_max` entries (a request that would pass it is refused with `NoLocks`, ENOLCK).

use std::collections::HashMap;

use weft_proto::msg::{AdoptedLock, LockClass, LockHolder, LockKind};

/// Default for `locks_orphan_ms`: two client keepalives (60 s each) and two duty leases, so a client that failed
/// over adopts its locks well before.
pub const DEFAULT_LOCKS_ORPHAN_MS: u64 = 150_000;

/// Default for `locks_max` (meta config): locks held at once across all clients.
pub const DEFAULT_LOCKS_MAX: usize = 65536;

/// Who holds a lock: the authenticated session it was taken on and the caller's owner id within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    pub session: u64,
    pub owner: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    owner: Owner,
    kind: LockKind,
    start: u64,
    end: u64,
    /// The holder's process id as its client named it, for F_GETLK reports only.
    pid: u32,
}

impl Entry {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    fn holder(&self, class: LockClass) -> LockHolder {
        LockHolder { class, kind: self.kind, start: self.start, end: self.end, pid: self.pid }
    }
}

/// Why a lock was not set.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockError {
    /// Another owner holds a conflicting lock (the first found): EAGAIN for a non-blocking request.
    Conflict(LockHolder),
    /// The table would pass `locks_max`: ENOLCK.
    NoLocks { locks_max: usize },
    /// `start > end`: EINVAL.
    BadRange { start: u64, end: u64 },
}

/// A requested change: set a shared or exclusive lock, or unlock (`kind = None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockOp {
    pub class: LockClass,
    pub kind: Option<LockKind>,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

#[derive(Default)]
struct InodeLocks {
    /// Sorted by (owner, start): each owner's ranges are contiguous in the vector.
    posix: Vec<Entry>,
    flock: Vec<Entry>,
}

impl InodeLocks {
    fn len(&self) -> usize {
        self.posix.len() + self.flock.len()
    }
    fn list(&mut self, class: LockClass) -> &mut Vec<Entry> {
        match class {
            LockClass::Posix => &mut self.posix,
            LockClass::Flock => &mut self.flock,
        }
    }
}

/// The lock table of one MDS (in memory, not journaled: a restart drops every lock).
pub struct LockTable {
    inodes: HashMap<u64, InodeLocks>,
    count: usize,
    /// Locks held per session (sessions holding none are absent), so "does it hold any" is one lookup.
    per_session: HashMap<u64, usize>,
    locks_max: usize,
}

fn conflicts(a: LockKind, b: LockKind) -> bool {
    a == LockKind::Exclusive || b == LockKind::Exclusive
}

impl LockTable {
    pub fn new(locks_max: usize) -> LockTable {
        LockTable { inodes: HashMap::new(), count: 0, per_session: HashMap::new(), locks_max }
    }

    /// Locks held, all inodes and owners.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The first lock of another owner that conflicts with `kind` on `[start, end]` of `class`, if any (F_GETLK).
    pub fn get(
        &self,
        ino: u64,
        class: LockClass,
        owner: Owner,
        kind: LockKind,
        start: u64,
        end: u64,
    ) -> Result<Option<LockHolder>, LockError> {
        if start > end {
            return Err(LockError::BadRange { start, end });
        }
        let Some(locks) = self.inodes.get(&ino) else { return Ok(None) };
        let list = match class {
            LockClass::Posix => &locks.posix,
            LockClass::Flock => &locks.flock,
        };
        Ok(list
            .iter()
            .find(|e| e.owner != owner && e.overlaps(start, end) && conflicts(e.kind, kind))
            .map(|e| e.holder(class)))
    }

    /// Sets or clears a lock for `owner` (F_SETLK, flock(2)): all or nothing.
    pub fn set(&mut self, ino: u64, owner: Owner, op: LockOp) -> Result<(), LockError> {
        let (start, end) = match op.class {
            LockClass::Posix => (op.start, op.end),
            LockClass::Flock => (0, u64::MAX),
        };
        if start > end {
            return Err(LockError::BadRange { start, end });
        }
        if let Some(kind) = op.kind
            && let Some(h) = self.get(ino, op.class, owner, kind, start, end)?
        {
            return Err(LockError::Conflict(h));
        }
        let locks = self.inodes.entry(ino).or_default();
        let before = locks.len();
        let list = locks.list(op.class);
        // The owner's entries after the change, computed beside the table so a refusal changes nothing.
        let mine: Vec<Entry> = list.iter().filter(|e| e.owner == owner).copied().collect();
        let next = match op.class {
            LockClass::Posix => posix_apply(&mine, owner, op.kind, start, end, op.pid),
            LockClass::Flock => {
                op.kind.map(|kind| vec![Entry { owner, kind, start, end, pid: op.pid }]).unwrap_or_default()
            }
        };
        let count_after = self.count - mine.len() + next.len();
        if next.len() > mine.len() && count_after > self.locks_max {
            if before == 0 {
                self.inodes.remove(&ino);
            }
            return Err(LockError::NoLocks { locks_max: self.locks_max });
        }
        // Keep the owner's entries contiguous: take them out, put the new ones where they were (or at the end).
        let at = list.iter().position(|e| e.owner == owner).unwrap_or(list.len());
        list.retain(|e| e.owner != owner);
        let at = at.min(list.len());
        let (removed, added) = (mine.len(), next.len());
        // An owner's POSIX ranges are disjoint and in order; no other owner holds one that conflicts (ARCHITECTURE).
        weft_rpc::invariant!(
            op.class == LockClass::Flock || next.windows(2).all(|w| w[0].end < w[1].start),
            "owner {owner:?}: ranges overlap"
        );
        weft_rpc::invariant!(
            op.kind.is_none_or(|k| !list.iter().any(|e| e.overlaps(start, end) && conflicts(e.kind, k)))
        );
        list.splice(at..at, next);
        self.count = count_after;
        self.account(owner.session, removed, added);
        if self.inodes.get(&ino).is_some_and(|l| l.len() == 0) {
            self.inodes.remove(&ino);
        }
        Ok(())
    }

    /// Removes every lock of `owner.session` matching `ino` (all inodes if `None`) and `owner.owner` (every owner of
    /// the session if `None`), both classes. Returns how many were removed.
    pub fn release(&mut self, session: u64, ino: Option<u64>, owner: Option<u64>) -> usize {
        if !self.per_session.contains_key(&session) {
            return 0;
        }
        let matches = |e: &Entry| e.owner.session == session && owner.is_none_or(|o| e.owner.owner == o);
        let mut removed = 0;
        let mut release_in = |locks: &mut InodeLocks| {
            let before = locks.len();
            locks.posix.retain(|e| !matches(e));
            locks.flock.retain(|e| !matches(e));
            removed += before - locks.len();
        };
        match ino {
            Some(ino) => {
                if let Some(l) = self.inodes.get_mut(&ino) {
                    release_in(l);
                }
            }
            None => self.inodes.values_mut().for_each(&mut release_in),
        }
        self.inodes.retain(|_, l| l.len() > 0);
        self.count -= removed;
        self.account(session, removed, 0);
        removed
    }

    fn account(&mut self, session: u64, removed: usize, added: usize) {
        let n = self.per_session.entry(session).or_default();
        *n = *n + added - removed;
        if *n == 0 {
            self.per_session.remove(&session);
        }
    }

    /// Moves every lock of session `from` to session `to`, unchanged (owner id, range, kind, pid), and returns
    /// them. `to` must hold no locks (asserted by the caller): then no range of `to` can meet a moved one, so
    /// nothing merges, splits or conflicts, and the count stays.
    pub fn adopt(&mut self, from: u64, to: u64) -> Vec<AdoptedLock> {
        assert!(!self.session_holds(to) && from != to, "adopting into a session that holds locks");
        let Some(n) = self.per_session.remove(&from) else { return Vec::new() };
        let mut moved = Vec::with_capacity(n);
        for (&ino, locks) in self.inodes.iter_mut() {
            for (class, list) in [(LockClass::Posix, &mut locks.posix), (LockClass::Flock, &mut locks.flock)] {
                for e in list.iter_mut().filter(|e| e.owner.session == from) {
                    e.owner.session = to;
                    moved.push(AdoptedLock {
                        ino,
                        owner: e.owner.owner,
                        class,
                        kind: e.kind,
                        start: e.start,
                        end: e.end,
                    });
                }
            }
        }
        debug_assert_eq!(moved.len(), n);
        self.per_session.insert(to, n);
        moved
    }

    /// Whether `session` holds any lock.
    pub fn session_holds(&self, session: u64) -> bool {
        self.per_session.contains_key(&session)
    }

    /// How many lock entries `session` holds.
    pub fn held_by(&self, session: u64) -> usize {
        self.per_session.get(&session).copied().unwrap_or(0)
    }
}

/// One lock as a shared store keeps it (docs/format.md §30): the table's entry with its class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredLock {
    pub owner: Owner,
    pub class: LockClass,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

impl LockTable {
    /// A table holding only `ino`'s locks, from what [`LockTable::stored`] gave (so in table order: each owner's
    /// ranges contiguous and sorted). Fails on a list that breaks the table's invariant (a damaged record).
    pub fn of_inode(ino: u64, stored: &[StoredLock], locks_max: usize) -> Result<LockTable, String> {
        let mut t = LockTable::new(locks_max);
        let mut locks = InodeLocks::default();
        for l in stored {
            if l.start > l.end {
                return Err(format!("lock range {}..={} of inode {ino} is reversed", l.start, l.end));
            }
            let e = Entry { owner: l.owner, kind: l.kind, start: l.start, end: l.end, pid: l.pid };
            let (start, end) = if l.class == LockClass::Flock { (0, u64::MAX) } else { (e.start, e.end) };
            let list = locks.list(l.class);
            if list.iter().any(|o| o.owner != e.owner && o.overlaps(start, end) && conflicts(o.kind, e.kind)) {
                return Err(format!("two owners hold conflicting locks on inode {ino}"));
            }
            // An owner's entries: contiguous; POSIX ones ascending, disjoint, never touching with one kind; one
            // flock lock.
            let follows = list.last().is_some_and(|p| p.owner == e.owner);
            let in_order = |p: &Entry| p.end < e.start && !(p.kind == e.kind && p.end + 1 == e.start);
            let fits = match l.class {
                LockClass::Posix => list.last().filter(|_| follows).is_none_or(in_order),
                LockClass::Flock => !follows,
            };
            if !fits || (!follows && list.iter().any(|o| o.owner == e.owner)) {
                return Err(format!("an owner's locks on inode {ino} are out of order"));
            }
            list.push(e);
            t.account(l.owner.session, 0, 1);
        }
        t.count = locks.len();
        if t.count > 0 {
            t.inodes.insert(ino, locks);
        }
        Ok(t)
    }

    /// Moves every lock of session `from` on `ino` to session `to`, which may hold locks there already (a client
    /// that took a lock on its new session before it adopted its old one's): where an owner id holds ranges under
    /// both, `to`'s win (they are newer). No moved lock can conflict with one of `to`'s: `to`'s were granted
    /// while `from`'s were held. Returns the moved locks as they were.
    pub fn adopt_merge(&mut self, ino: u64, from: u64, to: u64) -> Result<Vec<AdoptedLock>, LockError> {
        let all = self.stored(ino);
        let (moved, rest): (Vec<StoredLock>, Vec<StoredLock>) = all.into_iter().partition(|l| l.owner.session == from);
        if moved.is_empty() {
            return Ok(Vec::new());
        }
        let (mine, others): (Vec<StoredLock>, Vec<StoredLock>) = rest.into_iter().partition(|l| l.owner.session == to);
        let mut table = LockTable::of_inode(ino, &others, self.locks_max).expect("a subset of a valid table is valid");
        for l in moved.iter().chain(&mine) {
            let op = LockOp { class: l.class, kind: Some(l.kind), start: l.start, end: l.end, pid: l.pid };
            table.set(ino, Owner { session: to, owner: l.owner.owner }, op)?;
        }
        *self = table;
        let adopted = |l: &StoredLock| AdoptedLock {
            ino,
            owner: l.owner.owner,
            class: l.class,
            kind: l.kind,
            start: l.start,
            end: l.end,
        };
        Ok(moved.iter().map(adopted).collect())
    }

    /// `ino`'s locks, POSIX first, each class in table order.
    pub fn stored(&self, ino: u64) -> Vec<StoredLock> {
        let Some(locks) = self.inodes.get(&ino) else { return Vec::new() };
        let with = |class: LockClass, e: &Entry| StoredLock {
            owner: e.owner,
            class,
            kind: e.kind,
            start: e.start,
            end: e.end,
            pid: e.pid,
        };
        let posix = locks.posix.iter().map(|e| with(LockClass::Posix, e));
        posix.chain(locks.flock.iter().map(|e| with(LockClass::Flock, e))).collect()
    }
}

/// An owner's POSIX ranges after setting `kind` (or unlocking, `None`) on `[start, end]`: the old ranges cut
/// around the new one, the new one added, then same-kind neighbours that touch merged. `mine` is sorted and
/// canonical; so is the result.
fn posix_apply(mine: &[Entry], owner: Owner, kind: Option<LockKind>, start: u64, end: u64, pid: u32) -> Vec<Entry> {
    let mut out = Vec::with_capacity(mine.len() + 2);
    for e in mine {
        if !e.overlaps(start, end) {
            out.push(*e);
            continue;
        }
        if e.start < start {
            out.push(Entry { end: start - 1, ..*e });
        }
        if e.end > end {
            out.push(Entry { start: end + 1, ..*e });
        }
    }
    if let Some(kind) = kind {
        out.push(Entry { owner, kind, start, end, pid });
    }
    out.sort_by_key(|e| e.start);
    let mut merged: Vec<Entry> = Vec::with_capacity(out.len());
    for e in out {
        match merged.last_mut() {
            // `last.end + 1 >= e.start` without overflow: last.end == MAX overlaps everything after it.
            Some(last) if last.kind == e.kind && (last.end == u64::MAX || last.end + 1 >= e.start) => {
                last.end = last.end.max(e.end);
                // The newest pid names the merged range, as Linux keeps the new lock's.
                last.pid = pid;
            }
            _ => merged.push(e),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use LockKind::{Exclusive as X, Shared as S};

    const A: Owner = Owner { session: 1, owner: 10 };
    const B: Owner = Owner { session: 2, owner: 10 };
    const A2: Owner = Owner { session: 1, owner: 11 };

    fn op(kind: Option<LockKind>, start: u64, end: u64) -> LockOp {
        LockOp { class: LockClass::Posix, kind, start, end, pid: 7 }
    }

    fn ranges(t: &LockTable, ino: u64, o: Owner) -> Vec<(LockKind, u64, u64)> {
        t.inodes
            .get(&ino)
            .map_or(vec![], |l| l.posix.iter().filter(|e| e.owner == o).map(|e| (e.kind, e.start, e.end)).collect())
    }

    /// Seeded random ops by three owners: after each, the inode's stored list rebuilds the same table (what a
    /// shared store relies on, format §30), and lists that break the invariant are refused.
    #[test]
    fn a_stored_inode_rebuilds_the_same_table_and_bad_lists_are_refused() {
        let mut x: u64 = 0x10c5;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut t = LockTable::new(1000);
        for step in 0..3000 {
            let owner = Owner { session: 1 + next(2), owner: 10 + next(2) };
            let kind = match next(3) {
                0 => None,
                1 => Some(S),
                _ => Some(X),
            };
            let start = next(64);
            let class = if next(5) == 0 { LockClass::Flock } else { LockClass::Posix };
            let op = LockOp { class, kind, start, end: start + next(16), pid: step as u32 };
            let _ = t.set(1, owner, op);
            let stored = t.stored(1);
            let back = LockTable::of_inode(1, &stored, 1000).unwrap_or_else(|e| panic!("step {step}: {e}"));
            assert_eq!(back.stored(1), stored, "step {step}");
            assert_eq!(back.len(), t.len(), "step {step}");
        }
        let l =
            |owner: Owner, kind, start, end| StoredLock { owner, class: LockClass::Posix, kind, start, end, pid: 1 };
        for bad in [
            vec![l(A, X, 5, 4)],
            vec![l(A, X, 0, 9), l(B, S, 5, 5)],
            vec![l(A, S, 0, 9), l(A, S, 10, 19)],
            vec![l(A, S, 5, 9), l(A, X, 0, 1)],
            vec![l(A, S, 0, 1), l(B, S, 0, 1), l(A, S, 5, 6)],
        ] {
            assert!(LockTable::of_inode(1, &bad, 1000).is_err(), "{bad:?}");
        }
        let f = StoredLock { class: LockClass::Flock, ..l(A, S, 0, u64::MAX) };
        assert!(LockTable::of_inode(1, &[f, f], 1000).is_err(), "two flock locks of one owner");
    }

    #[test]
    fn exclusive_conflicts_shared_shares_and_disjoint_ranges_are_independent() {
        let mut t = LockTable::new(100);
        t.set(1, A, op(Some(X), 0, 99)).unwrap();
        let err = t.set(1, B, op(Some(X), 50, 60)).unwrap_err();
        assert_eq!(
            err,
            LockError::Conflict(LockHolder { class: LockClass::Posix, kind: X, start: 0, end: 99, pid: 7 })
        );
        assert!(matches!(t.set(1, B, op(Some(S), 99, 99)), Err(LockError::Conflict(_))));
        t.set(1, B, op(Some(X), 100, 199)).unwrap();
        t.set(2, B, op(Some(X), 0, 10)).unwrap(); // another inode
        // Two owners of one session are two owners.
        assert!(matches!(t.set(1, A2, op(Some(S), 0, 0)), Err(LockError::Conflict(_))));
        let mut t = LockTable::new(100);
        t.set(1, A, op(Some(S), 0, u64::MAX)).unwrap();
        t.set(1, B, op(Some(S), 5, 5)).unwrap();
        assert!(matches!(t.set(1, B, op(Some(X), 5, 5)), Err(LockError::Conflict(_))), "upgrade against a reader");
        assert_eq!(ranges(&t, 1, B), vec![(S, 5, 5)], "a refused upgrade leaves the shared lock");
    }

    #[test]
    fn the_same_owner_upgrades_downgrades_splits_and_merges() {
        let mut t = LockTable::new(100);
        t.set(1, A, op(Some(S), 0, 99)).unwrap();
        t.set(1, A, op(Some(X), 40, 59)).unwrap();
        assert_eq!(ranges(&t, 1, A), vec![(S, 0, 39), (X, 40, 59), (S, 60, 99)]);
        assert_eq!(t.len(), 3);
        t.set(1, A, op(Some(S), 40, 59)).unwrap();
        assert_eq!(ranges(&t, 1, A), vec![(S, 0, 99)], "a downgrade merges with both neighbours");
        t.set(1, A, op(None, 10, 19)).unwrap();
        assert_eq!(ranges(&t, 1, A), vec![(S, 0, 9), (S, 20, 99)], "an unlock in the middle splits");
        t.set(1, A, op(Some(S), 100, 100)).unwrap();
        assert_eq!(ranges(&t, 1, A), vec![(S, 0, 9), (S, 20, 100)], "adjacent ranges of one kind merge");
        t.set(1, A, op(Some(X), 101, u64::MAX)).unwrap();
        assert_eq!(ranges(&t, 1, A), vec![(S, 0, 9), (S, 20, 100), (X, 101, u64::MAX)], "kinds never merge");
        t.set(1, A, op(Some(X), 0, u64::MAX)).unwrap();
        assert_eq!(ranges(&t, 1, A), vec![(X, 0, u64::MAX)]);
        t.set(1, A, op(None, 0, u64::MAX)).unwrap();
        assert!(t.is_empty() && t.inodes.is_empty(), "an empty inode leaves the table");
        assert!(t.set(1, A, op(None, 5, 5)).is_ok(), "unlocking nothing is fine");
        assert_eq!(t.set(1, A, op(Some(S), 9, 8)), Err(LockError::BadRange { start: 9, end: 8 }));
        assert_eq!(t.get(1, LockClass::Posix, A, S, 9, 8), Err(LockError::BadRange { start: 9, end: 8 }));
    }

    #[test]
    fn get_reports_the_first_conflict_of_another_owner_only() {
        let mut t = LockTable::new(100);
        t.set(1, A, LockOp { pid: 42, ..op(Some(S), 10, 19) }).unwrap();
        assert_eq!(t.get(1, LockClass::Posix, B, S, 0, 100).unwrap(), None, "shared vs shared");
        let h = t.get(1, LockClass::Posix, B, X, 0, 100).unwrap().unwrap();
        assert_eq!((h.kind, h.start, h.end, h.pid), (S, 10, 19, 42));
        assert_eq!(t.get(1, LockClass::Posix, A, X, 0, 100).unwrap(), None, "an owner never conflicts with itself");
        assert_eq!(t.get(1, LockClass::Posix, B, X, 20, 30).unwrap(), None);
        assert_eq!(t.get(1, LockClass::Flock, B, X, 0, u64::MAX).unwrap(), None, "classes are separate");
    }

    #[test]
    fn flock_is_whole_file_one_per_owner_and_apart_from_posix() {
        let mut t = LockTable::new(100);
        let fl = |kind| LockOp { class: LockClass::Flock, kind, start: 0, end: u64::MAX, pid: 1 };
        t.set(1, A, fl(Some(S))).unwrap();
        t.set(1, B, fl(Some(S))).unwrap();
        assert!(matches!(t.set(1, B, fl(Some(X))), Err(LockError::Conflict(_))));
        t.set(1, B, op(Some(X), 0, u64::MAX)).unwrap(); // POSIX locks do not see flock locks
        t.set(1, A, fl(None)).unwrap();
        t.set(1, B, fl(Some(X))).unwrap();
        t.set(1, B, fl(Some(S))).unwrap();
        assert_eq!(t.len(), 2, "a conversion replaces the owner's flock lock");
        let h = t.get(1, LockClass::Flock, A, X, 0, u64::MAX).unwrap().unwrap();
        assert_eq!((h.class, h.kind), (LockClass::Flock, S));
    }

    #[test]
    fn the_table_is_bounded_and_release_frees() {
        let mut t = LockTable::new(3);
        t.set(1, A, op(Some(S), 0, 9)).unwrap();
        t.set(1, A, op(Some(S), 20, 29)).unwrap();
        t.set(2, B, op(Some(S), 0, 9)).unwrap();
        assert_eq!(t.set(3, B, op(Some(S), 0, 9)), Err(LockError::NoLocks { locks_max: 3 }));
        assert_eq!(t.set(1, A, op(None, 2, 3)), Err(LockError::NoLocks { locks_max: 3 }), "a split needs room");
        assert!(!t.inodes.contains_key(&3));
        t.set(1, A, op(Some(S), 10, 19)).unwrap(); // a merge needs none
        assert_eq!(ranges(&t, 1, A), vec![(S, 0, 29)]);
        t.set(1, A2, op(Some(S), 50, 50)).unwrap();
        assert_eq!(t.len(), 3);
        assert!(t.session_holds(1));
        assert_eq!(t.release(1, Some(1), Some(11)), 1, "one owner on one inode");
        t.set(3, B, op(Some(X), 0, 0)).unwrap();
        assert_eq!(t.release(2, None, None), 2, "a whole session");
        assert!(!t.session_holds(2));
        assert_eq!(t.release(1, Some(1), None), 1);
        assert!(t.is_empty() && t.inodes.is_empty());
    }

    #[test]
    fn adopt_moves_a_sessions_locks_unchanged_and_they_still_conflict() {
        let mut t = LockTable::new(100);
        t.set(1, A, op(Some(S), 0, 9)).unwrap();
        t.set(1, A, op(Some(X), 20, 29)).unwrap();
        t.set(2, A2, LockOp { class: LockClass::Flock, kind: Some(X), start: 0, end: u64::MAX, pid: 3 }).unwrap();
        t.set(1, B, op(Some(S), 0, 9)).unwrap();
        let mut moved = t.adopt(1, 9);
        moved.sort_by_key(|l| (l.ino, l.start));
        let want = |ino, owner, class, kind, start, end| AdoptedLock { ino, owner, class, kind, start, end };
        assert_eq!(
            moved,
            vec![
                want(1, 10, LockClass::Posix, S, 0, 9),
                want(1, 10, LockClass::Posix, X, 20, 29),
                want(2, 11, LockClass::Flock, X, 0, u64::MAX)
            ]
        );
        let c = Owner { session: 9, owner: 10 };
        assert_eq!(ranges(&t, 1, c), vec![(S, 0, 9), (X, 20, 29)]);
        assert!(!t.session_holds(1) && t.session_holds(9) && t.len() == 4);
        assert!(matches!(t.set(1, B, op(Some(X), 25, 25)), Err(LockError::Conflict(_))), "still held");
        // The same owner in the new session holds it: setting it again is granted as already held.
        t.set(1, c, op(Some(X), 20, 29)).unwrap();
        assert_eq!(t.len(), 4);
        assert!(t.adopt(1, 10).is_empty(), "nothing left to move");
        assert_eq!(t.release(9, None, None), 3);
        assert_eq!(t.len(), 1);
    }

    /// A per-byte model: bytes 0..N (N-1 standing for "to EOF"), each with its holders' kinds; random operations
    /// from a fixed seed must be granted or refused as the model says and leave the same state, in canonical form.
    #[test]
    fn random_operations_match_a_per_byte_model() {
        const N: u64 = 24;
        const OWNERS: [Owner; 3] = [A, B, A2];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for _round in 0..200 {
            let mut t = LockTable::new(1000);
            let mut model = vec![[None::<LockKind>; 3]; N as usize];
            for _step in 0..60 {
                let who = next(3) as usize;
                let a = next(N);
                let b = next(N);
                let (start, end) = (a.min(b), a.max(b));
                // The last byte stands for everything to EOF.
                let end_wire = if end == N - 1 { u64::MAX } else { end };
                let kind = match next(3) {
                    0 => None,
                    1 => Some(S),
                    _ => Some(X),
                };
                let conflict = kind.is_some_and(|k| {
                    (start..=end)
                        .any(|i| (0..3).any(|o| o != who && model[i as usize][o].is_some_and(|h| conflicts(h, k))))
                });
                let r = t.set(5, OWNERS[who], op(kind, start, end_wire));
                assert_eq!(r.is_err(), conflict, "{r:?}");
                if !conflict {
                    for i in start..=end {
                        model[i as usize][who] = kind;
                    }
                }
                for (o, &owner) in OWNERS.iter().enumerate() {
                    let got = ranges(&t, 5, owner);
                    for w in got.windows(2) {
                        assert!(w[0].2 < w[1].1, "sorted and disjoint");
                        assert!(w[0].0 != w[1].0 || w[0].2 + 1 < w[1].1, "same kind never adjacent");
                    }
                    for i in 0..N {
                        let held = got.iter().find(|r| r.1 <= i && (i <= r.2)).map(|r| r.0);
                        assert_eq!(held, model[i as usize][o], "byte {i} owner {o}");
                    }
                    if let Some(last) = got.last() {
                        assert!(last.2 < N - 1 || last.2 == u64::MAX, "to-EOF ranges stay to EOF");
                    }
                }
                let total: usize = OWNERS.iter().map(|&o| ranges(&t, 5, o).len()).sum();
                assert_eq!(t.len(), total);
                let of_session_1: usize = [A, A2].iter().map(|&o| ranges(&t, 5, o).len()).sum();
                assert_eq!(t.per_session.get(&1).copied().unwrap_or(0), of_session_1);
                assert_eq!(t.session_holds(2), !ranges(&t, 5, B).is_empty());
                // F_GETLK agrees with the model too.
                let k = if next(2) == 0 { S } else { X };
                let probe = t.get(5, LockClass::Posix, OWNERS[who], k, start, end_wire).unwrap();
                let expect = (start..=end)
                    .any(|i| (0..3).any(|o| o != who && model[i as usize][o].is_some_and(|h| conflicts(h, k))));
                assert_eq!(probe.is_some(), expect);
            }
        }
    }
}
