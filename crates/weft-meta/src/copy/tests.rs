//! Copies between every pair of store kinds: what was copied reads back the same, the copy's counters never hand
//! out a number twice, a non-empty target is refused.

use std::sync::Arc;

use weft_proto::msg::{CreateReq, LinkReq, MkdirReq, RegisterServerReq, StaleRange, SymlinkReq};
use weft_proto::{FileKind, Layout, ROOT_INO, Request, Response, SpaceStat};

use super::*;
use crate::test_stores::{TestStore, on_every_store};
use crate::{ManualClock, MemStore, Namespace};

const T0: i64 = 1_700_000_000_000_000_000;

/// A fresh, empty redb store in a directory removed on drop.
struct RedbDir(std::path::PathBuf);

impl RedbDir {
    fn new(tag: &str) -> RedbDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("weft-copy-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        RedbDir(p)
    }
}

impl Drop for RedbDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ino_of(r: Response) -> u64 {
    match r {
        Response::Create(a) | Response::Mkdir(a) | Response::Symlink(a) | Response::Link(a) => a.ino,
        other => panic!("unexpected reply {other:?}"),
    }
}

/// A namespace with one of every kind of record: directories two deep, files, a symlink, a hard link, xattrs (an
/// ACL among them), a once record, a duty lease, stale ranges, an orphan, data servers and a phase.
fn populate<S: MetaStore>(store: S) -> S {
    let ns = Namespace::new(store, Arc::new(ManualClock::new(T0)), crate::DEFAULT_LIVENESS_MS).unwrap();
    let space = SpaceStat { bytes_total: 1 << 40, bytes_free: 1 << 39, objects: 0 };
    let register = RegisterServerReq { id: 3, addr: "ds3:7000".into(), space };
    ns.execute(&Request::RegisterServer(register)).unwrap();
    let run = |r: Request| ino_of(ns.execute(&r).unwrap());
    let dir = run(Request::Mkdir(MkdirReq { parent: ROOT_INO, name: "d".into(), mode: 0o40755 }));
    let sub = run(Request::Mkdir(MkdirReq { parent: dir, name: "sub".into(), mode: 0o40700 }));
    let mut files = Vec::new();
    for i in 0..40 {
        let parent = if i % 2 == 0 { dir } else { sub };
        let name = format!("f{i:03}");
        files.push(run(Request::Create(CreateReq { parent, name, mode: 0o100640, exclusive: true })));
    }
    run(Request::Symlink(SymlinkReq { parent: ROOT_INO, name: "ln".into(), target: "d/f000".into() }));
    run(Request::Link(LinkReq { ino: files[0], new_parent: ROOT_INO, new_name: "hard".into() }));
    let stale = StaleRange { seq: 7, start: 0, end: 3 };
    ns.store()
        .write(|t| {
            t.put_xattr(files[1], "user.k", b"value")?;
            t.put_xattr(sub, "system.posix_acl_access", &[2, 0, 0, 0, 1, 0, 7, 0])?;
            t.put_xattr(0, "once.x", b"reply")?;
            t.put_xattr(0, duty::LEASE_NAME, b"holder")?;
            t.put_xattr(0, "lock.5", b"locks")?;
            t.put_xattr(0, "lsess.00000000000000aa", b"session")?;
            t.put_xattr(0, "svc.00000000000000bb", b"beat")?;
            t.put_stale(files[2], 1, &[stale])?;
            t.put_orphan(999_999, &Layout::plain(1 << 20, vec![3]))?;
            t.put_server_phase(3, 2)?;
            for _ in 0..7 {
                t.next_stale_seq()?;
            }
            Ok::<_, MetaError>(())
        })
        .unwrap();
    ns.into_store()
}

fn a_copy_reads_back_the_same<S: TestStore>() {
    let from = populate(MemStore::new());
    let to = S::fresh();
    let copied = copy_store(&from, &to).unwrap();
    assert_eq!(copied, digest(&from).unwrap());
    assert_eq!(copied.inodes, 44, "root, 2 directories, 40 files and a symlink: {copied:?}");
    assert_eq!((copied.stale, copied.orphans, copied.servers), (1, 1, 1));
    to.read(|t| {
        assert_eq!(t.get_xattr(0, duty::LEASE_NAME)?, None, "the duty lease is the source cluster's");
        for name in ["lock.5", "lsess.00000000000000aa", "svc.00000000000000bb"] {
            assert_eq!(t.get_xattr(0, name)?, None, "{name}: locks and services are the source cluster's");
        }
        assert_eq!(t.get_xattr(0, "once.x")?.as_deref(), Some(&b"reply"[..]));
        assert_eq!(t.list_server_phases()?, vec![(3, 2)]);
        Ok::<_, MetaError>(())
    })
    .unwrap();
    // Numbers go on from the source's, never handed out twice.
    let from_counters = from.read(|t| t.counters()).unwrap();
    let next = to.write(|t| Ok::<_, MetaError>((t.next_ino()?, t.next_stale_seq()?))).unwrap();
    assert!(next.0 > from_counters.last_ino && next.1 > from_counters.last_stale_seq, "{next:?} {from_counters:?}");
    // A service opens the copy and serves it.
    let ns = Namespace::new(to, Arc::new(ManualClock::new(T0)), crate::DEFAULT_LIVENESS_MS).unwrap();
    let r = ns.execute(&Request::Create(CreateReq {
        parent: ROOT_INO,
        name: "new".into(),
        mode: 0o100644,
        exclusive: true,
    }));
    assert!(ino_of(r.unwrap()) > from_counters.last_ino);
}

fn a_non_empty_target_is_refused<S: TestStore>() {
    let from = populate(MemStore::new());
    let to = populate(S::fresh());
    let before = digest(&to).unwrap();
    assert!(matches!(copy_store(&from, &to), Err(CopyError::TargetNotEmpty(_))));
    assert_eq!(digest(&to).unwrap(), before, "a refused copy writes nothing");
}

fn a_copy_goes_back_the_other_way<S: TestStore>() {
    let from = populate(S::fresh());
    let to = MemStore::new();
    assert_eq!(copy_store(&from, &to).unwrap(), digest(&from).unwrap());
}

on_every_store!(a_copy_reads_back_the_same, a_non_empty_target_is_refused, a_copy_goes_back_the_other_way);

#[test]
fn a_backup_is_an_embedded_store_that_reopens_with_the_same_namespace() {
    let from = populate(MemStore::new());
    let dir = RedbDir::new("backup");
    let copied = backup_to(&from, &dir.0).unwrap();
    assert!(matches!(backup_to(&from, &dir.0), Err(CopyError::TargetNotEmpty(_))), "a backup never overwrites");
    let reopened = RedbStore::open(&dir.0).unwrap();
    assert_eq!(digest(&reopened).unwrap(), copied);
    let back = MemStore::new();
    assert_eq!(copy_store(&reopened, &back).unwrap(), copied);
    assert_eq!(reopened.read(|t| t.get_dirent(ROOT_INO, "hard")).unwrap().map(|(_, k)| k), Some(FileKind::File));
}

#[test]
fn store_specs_parse_and_hide_passwords() {
    assert_eq!("redb:/srv/meta".parse::<StoreSpec>().unwrap(), StoreSpec::Redb("/srv/meta".into()));
    let pg: StoreSpec = "postgres://weft:secret@db1:5432/weft".parse().unwrap();
    assert_eq!(pg.to_string(), "postgres database weft on db1");
    let kv: StoreSpec = "host=/run/pg user=weft dbname=weft".parse().unwrap();
    assert_eq!(kv.to_string(), "postgres database weft on /run/pg");
    for bad in ["", "redb:", "/srv/meta", "mysql://x"] {
        assert!(matches!(bad.parse::<StoreSpec>(), Err(CopyError::BadSpec(_))), "{bad:?}");
    }
}
