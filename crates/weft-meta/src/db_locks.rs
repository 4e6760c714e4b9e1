//! Advisory locks in a shared store (docs/format.md §30): with several metadata services on one database, a lock
//! granted at one must exclude at every other and outlive the service that granted it. Each inode's locks are one
//! record (`lock.<ino>`), each lock-holding session one more (`lsess.<session>`: the inodes it holds locks on,
//! the key it proved, the service it was granted at), both extended attributes of inode 0 like §27's and §28's
//! records. Every change reads the inode's record into a one-inode [`LockTable`] — the same rules as the
//! in-memory table — applies the request and writes it back in one SERIALIZABLE transaction: two services racing
//! on one inode serialize, and a refusal (a conflict, a full record) writes nothing.
//!
//! A client whose service died comes back on a new session at another; its locks still exclude meanwhile (held by
//! the old session), and it takes them over with `AdoptLocks` before its next lock call (weft-client does so when
//! it sees its session change): the same owner ids then never conflict with themselves.

use weft_proto::msg::{AdoptedLock, LockClass, LockKind};

use crate::error::MetaError;
use crate::locks::{LockError, LockOp, LockTable, Owner, StoredLock};
use crate::store::{MetaStore, MetaTxn};

/// Most locks one inode's record holds (all owners): past it a new lock is refused with ENOLCK.
pub const LOCKS_PER_INODE_MAX: usize = 4096;
/// Most inodes one session holds locks on at once: past it a lock on another inode is refused with ENOLCK.
pub const LOCKED_INODES_PER_SESSION_MAX: usize = 4096;
/// Longest principal (key id) a session record keeps.
const PRINCIPAL_BYTES_MAX: usize = 255;

const VERSION: u8 = 1;
/// Session records: version 2 adds `entries` (issue 31); version 1 still reads.
const SESSION_VERSION: u8 = 2;
const LOCK_BYTES: usize = 38;

/// The start of every lock record's name at inode 0 (`lock.<ino>`).
pub(crate) const LOCK_PREFIX: &str = "lock.";
/// The start of every lock session record's name at inode 0 (`lsess.<session>`).
pub(crate) const SESSION_PREFIX: &str = "lsess.";

fn lock_name(ino: u64) -> String {
    format!("{LOCK_PREFIX}{ino}")
}

fn session_name(session: u64) -> String {
    format!("{SESSION_PREFIX}{session:016x}")
}

/// A session holding locks, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// The instance id of the service the session lives at.
    pub service: u64,
    /// The key its connection proved when it took its locks (an adoption must prove the same).
    pub principal: String,
    /// The inodes it holds locks on, ascending, without repeats.
    pub inodes: Vec<u64>,
    /// The lock entries it holds on them all (ranges and flock locks, as `LockTable` counts them), at least one
    /// per inode: what a per-client key's quota counts (`locks_per_client_session_max`).
    pub entries: u32,
}

/// Why a shared-store lock call changed nothing.
#[derive(Debug)]
pub enum Refused {
    Store(MetaError),
    Lock(LockError),
    /// `AdoptLocks` of a session that took its locks under another key.
    OtherPrincipal(String),
    /// A new lock of a session that holds its quota (`Caller::quota`) already.
    Quota {
        held: u32,
    },
}

impl From<MetaError> for Refused {
    fn from(e: MetaError) -> Refused {
        Refused::Store(e)
    }
}

fn corrupt(what: &str) -> MetaError {
    MetaError::Corrupt(format!("lock record: {what}"))
}

pub fn encode_locks(locks: &[StoredLock]) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + locks.len() * LOCK_BYTES);
    v.push(VERSION);
    v.extend_from_slice(&(locks.len() as u32).to_le_bytes());
    for l in locks {
        v.extend_from_slice(&l.owner.session.to_le_bytes());
        v.extend_from_slice(&l.owner.owner.to_le_bytes());
        v.push(match l.class {
            LockClass::Posix => 0,
            LockClass::Flock => 1,
        });
        v.push(match l.kind {
            LockKind::Shared => 0,
            LockKind::Exclusive => 1,
        });
        v.extend_from_slice(&l.start.to_le_bytes());
        v.extend_from_slice(&l.end.to_le_bytes());
        v.extend_from_slice(&l.pid.to_le_bytes());
    }
    v
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

pub fn decode_locks(b: &[u8]) -> Result<Vec<StoredLock>, MetaError> {
    if b.len() < 5 || b[0] != VERSION {
        return Err(corrupt("no version 1 header"));
    }
    let n = u32::from_le_bytes(b[1..5].try_into().expect("4 bytes")) as usize;
    if n > LOCKS_PER_INODE_MAX || b.len() != 5 + n * LOCK_BYTES {
        return Err(corrupt(&format!("{} bytes for {n} locks", b.len())));
    }
    b[5..]
        .chunks_exact(LOCK_BYTES)
        .map(|e| {
            let class = match e[16] {
                0 => LockClass::Posix,
                1 => LockClass::Flock,
                c => return Err(corrupt(&format!("class {c}"))),
            };
            let kind = match e[17] {
                0 => LockKind::Shared,
                1 => LockKind::Exclusive,
                k => return Err(corrupt(&format!("kind {k}"))),
            };
            let pid = u32::from_le_bytes(e[34..38].try_into().expect("4 bytes"));
            let owner = Owner { session: u64_at(e, 0), owner: u64_at(e, 8) };
            Ok(StoredLock { owner, class, kind, start: u64_at(e, 18), end: u64_at(e, 26), pid })
        })
        .collect()
}

pub fn encode_session(r: &SessionRecord) -> Vec<u8> {
    let p = &r.principal.as_bytes()[..r.principal.len().min(PRINCIPAL_BYTES_MAX)];
    let mut v = Vec::with_capacity(19 + p.len() + 8 * r.inodes.len());
    v.push(SESSION_VERSION);
    v.extend_from_slice(&r.service.to_le_bytes());
    v.extend_from_slice(&(p.len() as u16).to_le_bytes());
    v.extend_from_slice(p);
    v.extend_from_slice(&(r.inodes.len() as u32).to_le_bytes());
    r.inodes.iter().for_each(|i| v.extend_from_slice(&i.to_le_bytes()));
    v.extend_from_slice(&r.entries.to_le_bytes());
    v
}

pub fn decode_session(b: &[u8]) -> Result<SessionRecord, MetaError> {
    if b.len() < 11 || !(b[0] == 1 || b[0] == SESSION_VERSION) {
        return Err(corrupt("session: no version 1 or 2 header"));
    }
    let tail = if b[0] == 1 { 0 } else { 4 };
    let p = u16::from_le_bytes([b[9], b[10]]) as usize;
    if p > PRINCIPAL_BYTES_MAX || b.len() < 15 + p {
        return Err(corrupt("session: short"));
    }
    let principal = String::from_utf8(b[11..11 + p].to_vec()).map_err(|_| corrupt("session: principal"))?;
    let n = u32::from_le_bytes(b[11 + p..15 + p].try_into().expect("4 bytes")) as usize;
    if n > LOCKED_INODES_PER_SESSION_MAX || b.len() != 15 + p + 8 * n + tail {
        return Err(corrupt(&format!("session: {} bytes for {n} inodes", b.len())));
    }
    let inodes: Vec<u64> = b[15 + p..15 + p + 8 * n].chunks_exact(8).map(|c| u64_at(c, 0)).collect();
    if inodes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(corrupt("session: inodes not ascending"));
    }
    // Version 1 did not count: each inode holds at least one entry.
    let entries = match tail {
        0 => n as u32,
        _ => u32::from_le_bytes(b[b.len() - 4..].try_into().expect("4 bytes")),
    };
    if (entries as usize) < n {
        return Err(corrupt(&format!("session: {entries} entries on {n} inodes")));
    }
    Ok(SessionRecord { service: u64_at(b, 1), principal, inodes, entries })
}

/// For the fuzz target: decodes arbitrary bytes as both records; what decodes encodes back to the same bytes, and
/// a decoded lock list becomes a table (or a `Corrupt` refusal) without a panic.
pub fn fuzz_decode(v: &[u8]) {
    if let Ok(locks) = decode_locks(v) {
        assert_eq!(encode_locks(&locks), v, "lock record round trip");
        if let Ok(table) = LockTable::of_inode(1, &locks, LOCKS_PER_INODE_MAX) {
            assert_eq!(table.stored(1).len(), locks.len());
        }
    }
    if let Ok(r) = decode_session(v) {
        let again = encode_session(&r);
        if v[0] == SESSION_VERSION {
            assert_eq!(again, v, "session record round trip");
        }
        assert_eq!(decode_session(&again).expect("what it wrote reads back"), r, "an old record upgraded");
    }
}

fn load_table(t: &mut dyn MetaTxn, ino: u64) -> Result<LockTable, MetaError> {
    let stored = match t.get_xattr(0, &lock_name(ino))? {
        Some(b) => decode_locks(&b)?,
        None => Vec::new(),
    };
    LockTable::of_inode(ino, &stored, LOCKS_PER_INODE_MAX).map_err(|e| corrupt(&e))
}

fn save_table(t: &mut dyn MetaTxn, ino: u64, table: &LockTable) -> Result<(), MetaError> {
    let stored = table.stored(ino);
    if stored.is_empty() {
        t.del_xattr(0, &lock_name(ino))
    } else {
        t.put_xattr(0, &lock_name(ino), &encode_locks(&stored))
    }
}

fn load_session(t: &mut dyn MetaTxn, session: u64) -> Result<Option<SessionRecord>, MetaError> {
    t.get_xattr(0, &session_name(session))?.map(|b| decode_session(&b)).transpose()
}

fn save_session(t: &mut dyn MetaTxn, session: u64, r: &SessionRecord) -> Result<(), MetaError> {
    if r.inodes.is_empty() {
        t.del_xattr(0, &session_name(session))
    } else {
        t.put_xattr(0, &session_name(session), &encode_session(r))
    }
}

/// Who is asking: its session, the key its connection proved, the service it reached, and the most lock entries
/// its session may hold (`None`: the cluster key's sessions, bounded by the records' own limits only).
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub session: u64,
    pub principal: &'a str,
    pub service: u64,
    pub quota: Option<u32>,
}

/// `SetLock` on `ino` for (`who.session`, `owner`): applied, or refused with nothing written. Answers whether
/// the session holds any lock afterwards.
pub fn set<S: MetaStore>(store: &S, who: Caller<'_>, ino: u64, owner: u64, op: LockOp) -> Result<bool, Refused> {
    store.write(|t| {
        let mut rec = load_session(t, who.session)?.unwrap_or_else(|| SessionRecord {
            service: who.service,
            principal: who.principal.to_string(),
            inodes: Vec::new(),
            entries: 0,
        });
        if op.kind.is_some() && who.quota.is_some_and(|q| rec.entries >= q) {
            return Err(Refused::Quota { held: rec.entries });
        }
        let mut table = load_table(t, ino)?;
        let before = table.held_by(who.session);
        table.set(ino, Owner { session: who.session, owner }, op).map_err(Refused::Lock)?;
        save_table(t, ino, &table)?;
        rec.entries = count_after(rec.entries, before, table.held_by(who.session));
        let at = rec.inodes.binary_search(&ino);
        match (table.session_holds(who.session), at) {
            (true, Err(i)) => {
                if rec.inodes.len() >= LOCKED_INODES_PER_SESSION_MAX {
                    return Err(Refused::Lock(LockError::NoLocks { locks_max: LOCKED_INODES_PER_SESSION_MAX }));
                }
                rec.inodes.insert(i, ino);
            }
            (false, Ok(i)) => {
                rec.inodes.remove(i);
            }
            _ => {}
        }
        save_session(t, who.session, &rec)?;
        Ok(!rec.inodes.is_empty())
    })
}

/// A session's entry count after one inode's went from `before` to `after`.
fn count_after(entries: u32, before: usize, after: usize) -> u32 {
    let n = (entries as usize).saturating_sub(before).saturating_add(after);
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// `GetLock`: the first conflicting lock of another owner.
pub fn get<S: MetaStore>(
    store: &S,
    session: u64,
    ino: u64,
    owner: u64,
    class: LockClass,
    kind: LockKind,
    (start, end): (u64, u64),
) -> Result<Option<weft_proto::msg::LockHolder>, Refused> {
    store.read(|t| {
        let table = load_table(t, ino)?;
        table.get(ino, class, Owner { session, owner }, kind, start, end).map_err(Refused::Lock)
    })
}

/// `ReleaseLocks` (and a vanished session's expiry): the session's locks on `ino` (all inodes: `None`) of
/// `owner` (all: `None`). Answers how many went and whether the session still holds any.
pub fn release<S: MetaStore>(
    store: &S,
    session: u64,
    ino: Option<u64>,
    owner: Option<u64>,
) -> Result<(usize, bool), Refused> {
    Ok(store.write(|t| release_in(t, session, ino, owner))?)
}

/// [`release`] inside a transaction the caller runs (the duty holder's fenced one).
pub fn release_in(
    t: &mut dyn MetaTxn,
    session: u64,
    ino: Option<u64>,
    owner: Option<u64>,
) -> Result<(usize, bool), MetaError> {
    let Some(mut rec) = load_session(t, session)? else { return Ok((0, false)) };
    let mut removed = 0;
    let inodes: Vec<u64> = rec.inodes.iter().copied().filter(|i| ino.is_none_or(|x| x == *i)).collect();
    for i in inodes {
        let mut table = load_table(t, i)?;
        let before = table.held_by(session);
        removed += table.release(session, Some(i), owner);
        save_table(t, i, &table)?;
        rec.entries = count_after(rec.entries, before, table.held_by(session));
        if !table.session_holds(session) {
            rec.inodes.retain(|x| *x != i);
        }
    }
    save_session(t, session, &rec)?;
    Ok((removed, !rec.inodes.is_empty()))
}

/// Every session holding locks, with the service it lives at.
pub fn list_sessions(t: &mut dyn MetaTxn) -> Result<Vec<(u64, u64)>, MetaError> {
    let mut out = Vec::new();
    for (name, _) in t.list_xattrs(0)? {
        let Some(hex) = name.strip_prefix(SESSION_PREFIX) else { continue };
        let session = u64::from_str_radix(hex, 16).map_err(|_| corrupt(&format!("session record name {name}")))?;
        if let Some(rec) = load_session(t, session)? {
            out.push((session, rec.service));
        }
    }
    Ok(out)
}

/// `AdoptLocks`: every lock of session `from` becomes `who.session`'s, if `from` took them under the same key.
/// `who.session` may hold locks already (a client that locked on its new session before it adopted): where one
/// owner id has ranges under both, the new session's win. Answers the locks moved.
pub fn adopt<S: MetaStore>(store: &S, who: Caller<'_>, from: u64) -> Result<Vec<AdoptedLock>, Refused> {
    store.write(|t| {
        let Some(rec) = load_session(t, from)? else { return Ok(Vec::new()) };
        if rec.principal != who.principal {
            return Err(Refused::OtherPrincipal(rec.principal.clone()));
        }
        let mut to = load_session(t, who.session)?.unwrap_or_else(|| SessionRecord {
            service: who.service,
            principal: rec.principal.clone(),
            inodes: Vec::new(),
            entries: 0,
        });
        let mut moved = Vec::new();
        for &i in &rec.inodes {
            let mut table = load_table(t, i)?;
            let before = table.held_by(who.session);
            moved.extend(table.adopt_merge(i, from, who.session).map_err(Refused::Lock)?);
            save_table(t, i, &table)?;
            to.entries = count_after(to.entries, before, table.held_by(who.session));
            if let Err(at) = to.inodes.binary_search(&i) {
                to.inodes.insert(at, i);
            }
        }
        if to.inodes.len() > LOCKED_INODES_PER_SESSION_MAX {
            return Err(Refused::Lock(LockError::NoLocks { locks_max: LOCKED_INODES_PER_SESSION_MAX }));
        }
        save_session(t, who.session, &to)?;
        t.del_xattr(0, &session_name(from))?;
        Ok(moved)
    })
}

#[cfg(test)]
mod tests;
