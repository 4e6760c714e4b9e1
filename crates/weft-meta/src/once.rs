//! The outcome of each tagged call, kept in the store (docs/format.md §27): what makes a create, rename or any
//! other change exactly-once across the loss of the session that ran it (a service killed and restarted, or a
//! client moved to another service of the same database).
//!
//! A request with a once block ([`OnceTag`]: client instance, call number) names its call independently of
//! sessions. Before it runs, the record of the caller's (client, slot) is read (in a snapshot of its own: format
//! §27 says why not in the change's transaction): the same call recorded means it ran already, and its recorded
//! reply is the answer (nothing runs again); a later call recorded means this one is a stale duplicate (a service
//! that kept running an old attempt), refused. Otherwise the change runs and its reply is recorded in the change's
//! own transaction, so "applied" and "recorded" are one commit.
//!
//! Where: the extended attributes of inode [`ONCE_INO`] (0, which no file ever has), one per (client, slot), named
//! `once.<client as 16 hex digits>.<slot>`. Every store already keeps xattrs transactionally (redb's journal,
//! PostgreSQL's rows), so the records need no table, journal record or schema version of their own. One record
//! per slot of each client instance, overwritten by the slot's next call; [`sweep`] removes those older than
//! [`ONCE_KEEP_MS`].
//!
//! Record (little-endian): `version u8 (1) | call u64 | op u16 | uid u32 | at_ms u64 | key_len u8 | key_id |
//! reply` (the reply's body as the op encodes it, the rest of the value).

use weft_proto::{ErrorCode, OnceTag, Op, Response, WireError};

use crate::error::MetaError;
use crate::store::MetaTxn;

/// The inode whose extended attributes hold the records: 0, never a file (inode numbers start at the root, 1).
pub const ONCE_INO: u64 = 0;
/// Records untouched this long are swept: far beyond any retry (a call gives up after `mds_failover_timeout_ms`,
/// a minute by default).
pub const ONCE_KEEP_MS: u64 = 3_600_000;
const VERSION: u8 = 1;
const FIXED_BYTES: usize = 1 + 8 + 2 + 4 + 8 + 1;
const PREFIX: &str = "once.";

/// A tagged call as the service saw it: its once block, the slot it came on, and who sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnceCall {
    pub tag: OnceTag,
    pub slot: u32,
    /// The key the connection proved (`-` with authentication off).
    pub key_id: String,
    /// The user the call runs as.
    pub uid: u32,
}

/// A stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    call: u64,
    op: u16,
    uid: u32,
    at_ms: u64,
    key_id: String,
    reply: Vec<u8>,
}

fn name(c: &OnceCall) -> String {
    format!("{PREFIX}{:016x}.{}", c.tag.client, c.slot)
}

fn encode(r: &Record) -> Result<Vec<u8>, MetaError> {
    let key = r.key_id.as_bytes();
    let key_len = u8::try_from(key.len()).map_err(|_| MetaError::Store(format!("key id {:?} too long", r.key_id)))?;
    let mut v = Vec::with_capacity(FIXED_BYTES + key.len() + r.reply.len());
    v.push(VERSION);
    v.extend_from_slice(&r.call.to_le_bytes());
    v.extend_from_slice(&r.op.to_le_bytes());
    v.extend_from_slice(&r.uid.to_le_bytes());
    v.extend_from_slice(&r.at_ms.to_le_bytes());
    v.push(key_len);
    v.extend_from_slice(key);
    v.extend_from_slice(&r.reply);
    Ok(v)
}

/// Decodes a record; anything malformed is `Corrupt`, naming `what`.
fn decode(what: &str, v: &[u8]) -> Result<Record, MetaError> {
    let bad = |why: &str| MetaError::Corrupt(format!("once record {what}: {why}"));
    if v.len() < FIXED_BYTES {
        return Err(bad("truncated"));
    }
    if v[0] != VERSION {
        return Err(bad(&format!("unknown version {}", v[0])));
    }
    let u64_at = |i: usize| u64::from_le_bytes(v[i..i + 8].try_into().expect("8 bytes"));
    let key_len = usize::from(v[FIXED_BYTES - 1]);
    let key = v.get(FIXED_BYTES..FIXED_BYTES + key_len).ok_or_else(|| bad("key id truncated"))?;
    Ok(Record {
        call: u64_at(1),
        op: u16::from_le_bytes([v[9], v[10]]),
        uid: u32::from_le_bytes(v[11..15].try_into().expect("4 bytes")),
        at_ms: u64_at(15),
        key_id: String::from_utf8(key.to_vec()).map_err(|_| bad("key id is not UTF-8"))?,
        reply: v[FIXED_BYTES + key_len..].to_vec(),
    })
}

/// Asks `t` to read `c`'s record apart from its own reads ([`MetaTxn::read_xattr_apart`]), for [`lookup`].
pub fn ask(t: &mut dyn MetaTxn, c: &OnceCall) {
    t.read_xattr_apart(ONCE_INO, &name(c));
}

/// Looks up `c`'s record as [`ask`] read it: `Some(reply)` if the call ran (answer that; what the transaction did
/// must not commit), `None` if it is new (run it); an error if it must not run.
pub fn lookup(t: &mut dyn MetaTxn, c: &OnceCall, op: Op) -> Result<Option<Response>, WireError> {
    let name = name(c);
    let Some(v) = t.xattr_apart(ONCE_INO, &name)? else { return Ok(None) };
    let r = decode(&name, &v)?;
    match r.call.cmp(&c.tag.call) {
        // A client's slot serves several users in turn (`Client::with_user` shares the session): a newer call runs
        // whoever made the older one.
        std::cmp::Ordering::Less => Ok(None),
        std::cmp::Ordering::Equal if r.key_id != c.key_id || r.uid != c.uid => Err(WireError::new(
            ErrorCode::Permission,
            format!("once block {:#x}/{}: the call belongs to another key or user", c.tag.client, c.slot),
        )),
        // A retry is the same request: a block naming a call that ran as another op is not one.
        std::cmp::Ordering::Equal if r.op != op as u16 => Err(WireError::new(
            ErrorCode::BadRequest,
            format!(
                "once block {:#x}/{}: call {} ran as op {}, not {}",
                c.tag.client,
                c.slot,
                c.tag.call,
                r.op,
                op.name()
            ),
        )),
        std::cmp::Ordering::Equal => Response::decode(r.op, &r.reply)
            .map(Some)
            .map_err(|e| WireError::from(MetaError::Corrupt(format!("once record {name}: the recorded reply: {e}")))),
        std::cmp::Ordering::Greater => Err(WireError::new(
            ErrorCode::BadRequest,
            format!(
                "call {} of client {:#x} slot {} is superseded by its call {}: a stale duplicate, not run",
                c.tag.call, c.tag.client, c.slot, r.call
            ),
        )),
    }
}

/// Records that `c` ran (as op `op`) and answered `reply`, in the transaction that ran it.
pub fn record(t: &mut dyn MetaTxn, c: &OnceCall, op: Op, reply: &Response, at_ms: u64) -> Result<(), MetaError> {
    let r = Record {
        call: c.tag.call,
        op: op as u16,
        uid: c.uid,
        at_ms,
        key_id: c.key_id.clone(),
        reply: reply.encode_body(),
    };
    t.put_xattr(ONCE_INO, &name(c), &encode(&r)?)
}

/// Removes records older than [`ONCE_KEEP_MS`] at `now_ms` (and any that do not decode); returns how many.
pub fn sweep(t: &mut dyn MetaTxn, now_ms: u64) -> Result<usize, MetaError> {
    let mut removed = 0;
    for (name, _) in t.list_xattrs(ONCE_INO)? {
        if !name.starts_with(PREFIX) {
            continue;
        }
        let stale = match t.get_xattr(ONCE_INO, &name)? {
            Some(v) => decode(&name, &v).map_or(true, |r| now_ms.saturating_sub(r.at_ms) > ONCE_KEEP_MS),
            None => false,
        };
        if stale {
            t.del_xattr(ONCE_INO, &name)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// For the fuzz target: decodes arbitrary bytes as a record; what decodes encodes back to the same bytes.
pub fn fuzz_decode(v: &[u8]) {
    if let Ok(r) = decode("fuzz", v) {
        assert_eq!(encode(&r).expect("a decoded record encodes"), v, "once record round trip");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemStore;
    use crate::store::MetaStore;

    fn call(n: u64) -> OnceCall {
        OnceCall { tag: OnceTag { client: 0xabc, call: n }, slot: 3, key_id: "cluster".into(), uid: 1000 }
    }

    #[test]
    fn a_record_round_trips_and_damage_is_corrupt() {
        let r = Record { call: 7, op: 9, uid: 5, at_ms: 11, key_id: "k".into(), reply: vec![1, 2, 3] };
        let v = encode(&r).unwrap();
        assert_eq!(decode("t", &v).unwrap(), r);
        assert!(matches!(decode("t", &v[..FIXED_BYTES - 1]), Err(MetaError::Corrupt(_))));
        let mut bad = v.clone();
        bad[0] = 2;
        assert!(matches!(decode("t", &bad), Err(MetaError::Corrupt(_))));
        let mut long_key = v[..FIXED_BYTES].to_vec();
        long_key[FIXED_BYTES - 1] = 200;
        assert!(matches!(decode("t", &long_key), Err(MetaError::Corrupt(_))));
        fuzz_decode(&v);
    }

    #[test]
    fn a_call_is_new_then_ran_then_a_later_call_supersedes_it() {
        let store = MemStore::new();
        let reply = Response::Rename(());
        assert_eq!(store.write(|t| lookup(t, &call(1), Op::Rename)).unwrap(), None);
        store.write(|t| record(t, &call(1), Op::Rename, &reply, 1_000)).unwrap();
        assert_eq!(store.write(|t| lookup(t, &call(1), Op::Rename)).unwrap(), Some(reply.clone()));
        assert_eq!(store.write(|t| lookup(t, &call(2), Op::Rename)).unwrap(), None, "the slot's next call");
        store.write(|t| record(t, &call(2), Op::Rename, &reply, 1_000)).unwrap();
        let stale = store.write(|t| lookup(t, &call(1), Op::Rename)).unwrap_err();
        assert_eq!(stale.code, ErrorCode::BadRequest, "{stale:?}");
        let other_op = store.write(|t| lookup(t, &call(2), Op::Create)).unwrap_err();
        assert_eq!(other_op.code, ErrorCode::BadRequest, "a block naming a call that ran as another op");
        let other_user = OnceCall { uid: 1001, ..call(2) };
        assert_eq!(store.write(|t| lookup(t, &other_user, Op::Rename)).unwrap_err().code, ErrorCode::Permission);
        // The slot's next call may be another user's (clients share sessions among users): it runs.
        assert_eq!(store.write(|t| lookup(t, &OnceCall { uid: 1001, ..call(3) }, Op::Rename)).unwrap(), None);
        // Swept only once old.
        assert_eq!(store.write(|t| sweep(t, 1_000 + ONCE_KEEP_MS)).unwrap(), 0);
        assert_eq!(store.write(|t| sweep(t, 1_001 + ONCE_KEEP_MS)).unwrap(), 1);
        assert_eq!(store.write(|t| lookup(t, &call(1), Op::Rename)).unwrap(), None);
    }
}
