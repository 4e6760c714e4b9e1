//! Shared-store locks on every store: exclusion between sessions of different services, refusals that write
//! nothing, adoption, release, and the records' codecs (round trip; garbage is an error, never a panic).

use weft_proto::msg::{LockClass, LockKind};

use super::*;
use crate::test_stores::{TestStore, on_every_store};

const A: Caller<'static> = Caller { session: 0xa, principal: "client-a", service: 1, quota: None };
const B: Caller<'static> = Caller { session: 0xb, principal: "client-b", service: 2, quota: None };

fn lock(kind: Option<LockKind>, start: u64, end: u64) -> LockOp {
    LockOp { class: LockClass::Posix, kind, start, end, pid: 42 }
}

/// Every lock record at inode 0, by name.
fn records<S: MetaStore>(s: &S) -> Vec<String> {
    let names = s.read(|t| t.list_xattrs(0)).unwrap();
    names.into_iter().map(|(n, _)| n).filter(|n| n.starts_with("lock.") || n.starts_with("lsess.")).collect()
}

fn locks_exclude_across_services_and_a_refusal_writes_nothing<S: TestStore>() {
    let s = S::fresh();
    assert!(set(&s, A, 7, 1, lock(Some(LockKind::Exclusive), 0, 99)).unwrap());
    let before = records(&s);
    let r = set(&s, B, 7, 1, lock(Some(LockKind::Shared), 50, 50));
    assert!(matches!(r, Err(Refused::Lock(LockError::Conflict(h))) if h.start == 0 && h.end == 99 && h.pid == 42));
    assert_eq!(records(&s), before, "a conflict changed nothing");
    let seen = get(&s, B.session, 7, 1, LockClass::Posix, LockKind::Shared, (0, 10)).unwrap();
    assert_eq!(seen.map(|h| h.kind), Some(LockKind::Exclusive));
    // Another range, another inode, another class are free.
    assert!(set(&s, B, 7, 1, lock(Some(LockKind::Exclusive), 100, 199)).unwrap());
    assert!(set(&s, B, 8, 1, lock(Some(LockKind::Exclusive), 0, 99)).unwrap());
    let flock = LockOp { class: LockClass::Flock, ..lock(Some(LockKind::Exclusive), 0, 0) };
    assert!(set(&s, B, 7, 2, flock).unwrap());
    // An unlock of part of A's range splits it; A's last unlock ends its session record.
    assert!(set(&s, A, 7, 1, lock(None, 10, 19)).unwrap());
    assert!(get(&s, B.session, 7, 1, LockClass::Posix, LockKind::Exclusive, (10, 19)).unwrap().is_none());
    assert!(!set(&s, A, 7, 1, lock(None, 0, u64::MAX)).unwrap());
    assert_eq!(release(&s, B.session, None, None).unwrap(), (3, false));
    assert_eq!(records(&s), Vec::<String>::new(), "no record outlives its last lock");
}

fn adoption_moves_locks_to_the_new_session_of_the_same_key_only<S: TestStore>() {
    let s = S::fresh();
    set(&s, A, 7, 1, lock(Some(LockKind::Exclusive), 0, 99)).unwrap();
    set(&s, A, 9, 3, lock(Some(LockKind::Shared), 5, 5)).unwrap();
    // The same client on a new session at another service: its old locks still exclude it ...
    let a2 = Caller { session: 0xa2, service: 2, ..A };
    assert!(matches!(set(&s, a2, 7, 1, lock(Some(LockKind::Exclusive), 0, 0)), Err(Refused::Lock(_))));
    // ... another key may not take them ...
    let thief = Caller { session: 0xc, ..B };
    assert!(matches!(adopt(&s, thief, A.session), Err(Refused::OtherPrincipal(p)) if p == "client-a"));
    // ... the same key does, even after it took a lock on its new session: where one owner holds ranges under
    // both sessions the new session's (newer) win, the rest move unchanged.
    assert!(set(&s, a2, 7, 1, lock(Some(LockKind::Shared), 200, 299)).unwrap());
    assert!(set(&s, a2, 9, 3, lock(Some(LockKind::Shared), 5, 6)).unwrap());
    let moved = adopt(&s, a2, A.session).unwrap();
    assert_eq!(moved.len(), 2);
    let held = |ino, range| get(&s, B.session, ino, 1, LockClass::Posix, LockKind::Shared, range).unwrap();
    assert_eq!(held(7, (0, 99)).map(|h| h.kind), Some(LockKind::Exclusive), "moved unchanged");
    assert!(held(7, (200, 299)).is_none(), "a shared lock lets another share");
    let held3 = get(&s, B.session, 9, 3, LockClass::Posix, LockKind::Exclusive, (6, 6)).unwrap();
    assert_eq!(held3.map(|h| (h.start, h.end)), Some((5, 6)), "one owner's ranges of both sessions merged");
    // The same owner then never conflicts with itself.
    assert!(set(&s, a2, 7, 1, lock(Some(LockKind::Exclusive), 0, 0)).unwrap());
    assert_eq!(adopt(&s, a2, A.session).unwrap(), vec![], "the old session holds nothing now");
    assert!(matches!(set(&s, B, 7, 1, lock(Some(LockKind::Shared), 0, 0)), Err(Refused::Lock(_))), "still held");
    assert_eq!(release(&s, a2.session, Some(9), None).unwrap(), (1, true));
}

/// A per-client key's quota counts the session's lock entries on every inode (issue 31): past it a new lock is
/// refused and writes nothing, an unlock (which may split a range) is not refused, and what is released frees room;
/// a session without a quota (the cluster key) is not counted against one; adoption carries the count.
fn a_sessions_lock_entries_are_counted_against_its_quota<S: TestStore>() {
    let s = S::fresh();
    let hog = Caller { quota: Some(3), ..A };
    let entries = |session| s.read(|t| load_session(t, session)).unwrap().map_or(0, |r| r.entries);
    set(&s, hog, 7, 1, lock(Some(LockKind::Exclusive), 0, 9)).unwrap();
    set(&s, hog, 7, 1, lock(Some(LockKind::Exclusive), 20, 29)).unwrap();
    set(&s, hog, 8, 1, lock(Some(LockKind::Shared), 0, 0)).unwrap();
    assert_eq!(entries(hog.session), 3);
    let before = records(&s);
    assert!(matches!(set(&s, hog, 9, 1, lock(Some(LockKind::Shared), 0, 0)), Err(Refused::Quota { held: 3 })));
    assert_eq!(records(&s), before, "a refusal writes nothing");
    // An unlock inside a range splits it: the session may hold one past its quota that way, as in memory.
    set(&s, hog, 7, 1, lock(None, 3, 4)).unwrap();
    assert_eq!(entries(hog.session), 4);
    assert_eq!(release(&s, hog.session, Some(7), None).unwrap(), (3, true));
    assert_eq!(entries(hog.session), 1);
    set(&s, hog, 9, 1, lock(Some(LockKind::Shared), 0, 0)).unwrap();
    assert_eq!(entries(hog.session), 2);
    // Another key's sessions, without a quota, are not held back by it.
    for i in 0..5 {
        set(&s, B, 100 + i, 1, lock(Some(LockKind::Shared), 0, 0)).unwrap();
    }
    // An adopting session takes over the count.
    let next = Caller { session: 0xa3, quota: Some(3), ..A };
    adopt(&s, Caller { quota: None, ..next }, hog.session).unwrap();
    assert_eq!((entries(hog.session), entries(next.session)), (0, 2));
    set(&s, next, 10, 1, lock(Some(LockKind::Shared), 0, 0)).unwrap();
    assert!(matches!(set(&s, next, 11, 1, lock(Some(LockKind::Shared), 0, 0)), Err(Refused::Quota { held: 3 })));
}

on_every_store!(
    locks_exclude_across_services_and_a_refusal_writes_nothing,
    adoption_moves_locks_to_the_new_session_of_the_same_key_only,
    a_sessions_lock_entries_are_counted_against_its_quota
);

#[test]
fn records_round_trip_and_garbage_is_an_error() {
    let locks = vec![
        StoredLock {
            owner: Owner { session: 1, owner: 2 },
            class: LockClass::Posix,
            kind: LockKind::Shared,
            start: 3,
            end: u64::MAX,
            pid: 4,
        },
        StoredLock {
            owner: Owner { session: 5, owner: 6 },
            class: LockClass::Flock,
            kind: LockKind::Exclusive,
            start: 0,
            end: u64::MAX,
            pid: 7,
        },
    ];
    let b = encode_locks(&locks);
    assert_eq!(b.len(), 5 + 2 * LOCK_BYTES);
    assert_eq!(decode_locks(&b).unwrap(), locks);
    let rec = SessionRecord { service: 9, principal: "cluster".into(), inodes: vec![1, 5, 99], entries: 4 };
    assert_eq!(decode_session(&encode_session(&rec)).unwrap(), rec);
    // Version 1 (before issue 31's count) reads with one entry per inode; fewer entries than inodes is corrupt.
    let mut v1 = encode_session(&rec);
    v1.truncate(v1.len() - 4);
    v1[0] = 1;
    assert_eq!(decode_session(&v1).unwrap(), SessionRecord { entries: 3, ..rec.clone() });
    let short = SessionRecord { entries: 2, ..rec.clone() };
    assert!(decode_session(&encode_session(&short)).is_err());
    // Seeded garbage and every truncation: errors, never panics.
    let mut x: u64 = 0x5eed;
    for len in 0..200 {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        fuzz_decode(&bytes);
    }
    for cut in 0..b.len() {
        assert!(decode_locks(&b[..cut]).is_err(), "cut at {cut}");
    }
    fuzz_decode(&b);
    let s = encode_session(&rec);
    for cut in 0..s.len() {
        assert!(decode_session(&s[..cut]).is_err(), "cut at {cut}");
    }
}
