//! Namespace rules, each store-agnostic test on `MemStore` and on `PgStore` (`on_every_store!`); persistence,
//! crashes and large directories over `RedbStore`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use weft_proto::msg::{
    CommitReq, CreateReq, InoReq, LinkReq, LookupReq, MkdirReq, MknodReq, NameReq, RENAME_EXCHANGE, RENAME_NOREPLACE,
    ReadReq, ReaddirReq, ReaddirResp, RegisterServerDevReq, RegisterServerReq, RenameReq, SessionCreateReq, SetAttrReq,
    SetLayoutReq, SetSizeOpenReq, SymlinkReq,
};
use weft_proto::{
    Attr, Capability, ErrorCode, FileKind, Layout, ROOT_INO, Request, Response, ServerState, SetAttrs, SpaceStat,
    StatFs, TimeSet, WireError,
};

use super::*;
use crate::once::OnceCall;
use crate::test_stores::{TestStore, on_every_store};
use crate::{ManualClock, MemStore, RedbStore};

const T0: i64 = 1_700_000_000_000_000_000;

type Ns<S> = Namespace<S, Arc<ManualClock>>;

fn ns_of<S: TestStore>() -> (Ns<S>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let ns = Namespace::new(S::fresh(), clock.clone(), DEFAULT_LIVENESS_MS).unwrap();
    for id in [10, 20, 30] {
        register(&ns, id, &format!("ds{id}:7000"), 1000);
    }
    (ns, clock)
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "weft-meta-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn redb_ns(dir: &TempDir, clock: Arc<ManualClock>) -> Ns<RedbStore> {
    Namespace::new(RedbStore::open(&dir.0).unwrap(), clock, DEFAULT_LIVENESS_MS).unwrap()
}

fn register<S: MetaStore>(ns: &Ns<S>, id: u32, addr: &str, total: u64) {
    let space = SpaceStat { bytes_total: total, bytes_free: total / 2, objects: 0 };
    let r = ns.execute(&Request::RegisterServer(RegisterServerReq { id, addr: addr.into(), space }));
    assert_eq!(r, Ok(Response::RegisterServer(())));
}

fn code<T: std::fmt::Debug>(r: Result<T, WireError>) -> ErrorCode {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => {
            assert!(!e.message.is_empty());
            e.code
        }
    }
}

fn attr(r: Result<Response, WireError>) -> Result<Attr, WireError> {
    r.map(|resp| resp.attr().cloned().unwrap_or_else(|| panic!("not an attr response: {resp:?}")))
}

fn unit(r: Result<Response, WireError>) -> Result<(), WireError> {
    r.map(|resp| match resp {
        Response::Rmdir(()) | Response::Unlink(()) | Response::Rename(()) | Response::RegisterServer(()) => (),
        other => panic!("not a unit response: {other:?}"),
    })
}

fn create_x<S: MetaStore>(ns: &Ns<S>, parent: u64, name: &str, exclusive: bool) -> Result<Attr, WireError> {
    attr(ns.execute(&Request::Create(CreateReq { parent, name: name.into(), mode: 0o100644, exclusive })))
}

fn create<S: MetaStore>(ns: &Ns<S>, parent: u64, name: &str) -> Result<Attr, WireError> {
    create_x(ns, parent, name, true)
}

fn mkdir<S: MetaStore>(ns: &Ns<S>, parent: u64, name: &str) -> Result<Attr, WireError> {
    attr(ns.execute(&Request::Mkdir(MkdirReq { parent, name: name.into(), mode: 0o40755 })))
}

fn lookup<S: MetaStore>(ns: &Ns<S>, parent: u64, name: &str) -> Result<Attr, WireError> {
    attr(ns.execute(&Request::Lookup(LookupReq { parent, name: name.into() })))
}

fn getattr<S: MetaStore>(ns: &Ns<S>, ino: u64) -> Result<Attr, WireError> {
    attr(ns.execute(&Request::GetAttr(InoReq { ino })))
}

fn rmdir<S: MetaStore>(ns: &Ns<S>, parent: u64, name: &str) -> Result<(), WireError> {
    unit(ns.execute(&Request::Rmdir(NameReq { parent, name: name.into() })))
}

fn unlink<S: MetaStore>(ns: &Ns<S>, parent: u64, name: &str) -> Result<(), WireError> {
    unit(ns.execute(&Request::Unlink(NameReq { parent, name: name.into() })))
}

fn rename_f<S: MetaStore>(ns: &Ns<S>, sp: u64, sn: &str, dp: u64, dn: &str, flags: u32) -> Result<(), WireError> {
    unit(ns.execute(&Request::Rename(RenameReq {
        src_parent: sp,
        src_name: sn.into(),
        dst_parent: dp,
        dst_name: dn.into(),
        flags,
    })))
}

fn rename<S: MetaStore>(ns: &Ns<S>, sp: u64, sn: &str, dp: u64, dn: &str) -> Result<(), WireError> {
    rename_f(ns, sp, sn, dp, dn, 0)
}

fn link<S: MetaStore>(ns: &Ns<S>, ino: u64, parent: u64, name: &str) -> Result<Attr, WireError> {
    attr(ns.execute(&Request::Link(LinkReq { ino, new_parent: parent, new_name: name.into() })))
}

fn symlink<S: MetaStore>(ns: &Ns<S>, parent: u64, name: &str, target: &str) -> Result<Attr, WireError> {
    attr(ns.execute(&Request::Symlink(SymlinkReq { parent, name: name.into(), target: target.into() })))
}

fn readlink<S: MetaStore>(ns: &Ns<S>, ino: u64) -> Result<String, WireError> {
    ns.execute(&Request::Readlink(InoReq { ino })).map(|r| match r {
        Response::Readlink(s) => s,
        other => panic!("{other:?}"),
    })
}

fn readdir<S: MetaStore>(ns: &Ns<S>, ino: u64, after: &str, limit: u32) -> Result<ReaddirResp, WireError> {
    ns.execute(&Request::Readdir(ReaddirReq { ino, after: after.into(), limit })).map(|r| match r {
        Response::Readdir(d) => d,
        other => panic!("{other:?}"),
    })
}

fn readdir_all<S: MetaStore>(ns: &Ns<S>, ino: u64) -> Vec<String> {
    let mut names = Vec::new();
    let mut after = String::new();
    loop {
        let page = readdir(ns, ino, &after, 0).unwrap();
        names.extend(page.entries.iter().map(|e| e.name.clone()));
        if page.eof {
            return names;
        }
        after = page.entries.last().expect("a non-final page has entries").name.clone();
    }
}

fn statfs<S: MetaStore>(ns: &Ns<S>) -> StatFs {
    match ns.execute(&Request::Statfs(())).unwrap() {
        Response::Statfs(s) => s,
        other => panic!("{other:?}"),
    }
}

fn setattr<S: MetaStore>(ns: &Ns<S>, ino: u64, set: SetAttrs) -> Result<Attr, WireError> {
    attr(ns.execute(&Request::SetAttr(SetAttrReq { ino, set })))
}

fn commit<S: MetaStore>(ns: &Ns<S>, ino: u64, size: u64, mtime_ns: i64) -> Result<Attr, WireError> {
    attr(ns.execute(&Request::Commit(CommitReq { ino, size, mtime_ns })))
}

fn set_layout<S: MetaStore>(ns: &Ns<S>, ino: u64, unit: u32, count: u32) -> Result<Attr, WireError> {
    let layout = Layout {
        stripe_unit: unit,
        stripe_count: count,
        servers: vec![],
        redundancy: weft_proto::DataRedundancy::Plain,
        generation: 0,
    };
    attr(ns.execute(&Request::SetLayout(SetLayoutReq { ino, layout })))
}

// ---- tests ----------------------------------------------------------------------------------------------------

fn root_is_created_on_first_open<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let root = getattr(&ns, ROOT_INO).unwrap();
    assert_eq!(root.kind, FileKind::Dir);
    assert_eq!((root.mode, root.uid, root.gid, root.nlink), (0o755, 0, 0, 2));
    assert_eq!(
        root.layout,
        Some(Layout {
            stripe_unit: 1 << 20,
            stripe_count: 0,
            servers: vec![],
            redundancy: weft_proto::DataRedundancy::Plain,
            generation: 0,
        })
    );
    assert_eq!(root.mtime_ns, T0);
    assert_eq!(code(getattr(&ns, 999)), ErrorCode::NotFound);
}

fn names_are_validated<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    for bad in ["", ".", "..", "a/b", "/", "a\0b"] {
        assert_eq!(code(create(&ns, ROOT_INO, bad)), ErrorCode::Invalid, "{bad:?}");
        assert_eq!(code(mkdir(&ns, ROOT_INO, bad)), ErrorCode::Invalid, "{bad:?}");
        if bad != ".." {
            // A lookup of ".." is the parent (`lookup_of_dotdot_is_the_parent`).
            assert_eq!(code(lookup(&ns, ROOT_INO, bad)), ErrorCode::Invalid, "{bad:?}");
        }
    }
    let long = "x".repeat(256);
    assert_eq!(code(create(&ns, ROOT_INO, &long)), ErrorCode::NameTooLong);
    assert_eq!(code(symlink(&ns, ROOT_INO, &long, "t")), ErrorCode::NameTooLong);
    create(&ns, ROOT_INO, &"x".repeat(255)).unwrap();
    // Multi-byte names are measured in bytes: 128 two-byte chars = 256 bytes.
    assert_eq!(code(create(&ns, ROOT_INO, &"é".repeat(128))), ErrorCode::NameTooLong);
    create(&ns, ROOT_INO, "ünïcødé ✓").unwrap();
}

fn parents_must_exist_and_be_directories<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let f = create(&ns, ROOT_INO, "f").unwrap();
    assert_eq!(code(create(&ns, 12345, "a")), ErrorCode::NotFound);
    assert_eq!(code(create(&ns, f.ino, "a")), ErrorCode::NotDir);
    assert_eq!(code(mkdir(&ns, f.ino, "a")), ErrorCode::NotDir);
    assert_eq!(code(lookup(&ns, f.ino, "a")), ErrorCode::NotDir);
    assert_eq!(code(symlink(&ns, f.ino, "a", "t")), ErrorCode::NotDir);
    assert_eq!(code(readdir(&ns, f.ino, "", 10)), ErrorCode::NotDir);
    assert_eq!(code(unlink(&ns, f.ino, "a")), ErrorCode::NotDir);
    assert_eq!(code(lookup(&ns, ROOT_INO, "missing")), ErrorCode::NotFound);
}

fn create_sets_attributes_and_follows_existing_rules<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    clock.set_ns(T0 + 5);
    let a = create(&ns, ROOT_INO, "f").unwrap();
    assert_eq!(a.kind, FileKind::File);
    assert_eq!((a.mode, a.uid, a.gid, a.nlink, a.size), (0o644, 0, 0, 1, 0), "root's, as root made it");
    assert_eq!((a.atime_ns, a.mtime_ns, a.ctime_ns), (T0 + 5, T0 + 5, T0 + 5));
    let root = getattr(&ns, ROOT_INO).unwrap();
    assert_eq!((root.mtime_ns, root.ctime_ns, root.nlink), (T0 + 5, T0 + 5, 2));
    assert_eq!(lookup(&ns, ROOT_INO, "f").unwrap(), a);
    // Existing file: exclusive fails, otherwise it is returned unchanged.
    assert_eq!(code(create(&ns, ROOT_INO, "f")), ErrorCode::Exists);
    clock.set_ns(T0 + 9);
    assert_eq!(create_x(&ns, ROOT_INO, "f", false).unwrap(), a);
    mkdir(&ns, ROOT_INO, "d").unwrap();
    assert_eq!(code(create_x(&ns, ROOT_INO, "d", false)), ErrorCode::IsDir);
    assert_eq!(code(create_x(&ns, ROOT_INO, "d", true)), ErrorCode::Exists);
    symlink(&ns, ROOT_INO, "s", "f").unwrap();
    assert_eq!(code(create_x(&ns, ROOT_INO, "s", false)), ErrorCode::Exists);
    assert_eq!(code(mkdir(&ns, ROOT_INO, "f")), ErrorCode::Exists);
}

fn create_without_servers_fails_and_allocates_nothing<S: TestStore>() {
    let ns = Namespace::new(S::fresh(), Arc::new(ManualClock::new(T0)), DEFAULT_LIVENESS_MS).unwrap();
    assert_eq!(code(create(&ns, ROOT_INO, "f")), ErrorCode::NoServers);
    assert_eq!(code(lookup(&ns, ROOT_INO, "f")), ErrorCode::NotFound);
    // Directories need no server.
    mkdir(&ns, ROOT_INO, "d").unwrap();
    assert_eq!(statfs(&ns).files, 2);
}

fn layouts_are_assigned_round_robin_from_the_directory_policy<S: TestStore>() {
    let (ns, _) = ns_of::<S>(); // servers 10, 20, 30
    let ids = [10u32, 20, 30];
    for i in 0..6 {
        let a = create(&ns, ROOT_INO, &format!("f{i}")).unwrap();
        let l = a.layout.unwrap();
        assert_eq!((l.stripe_unit, l.stripe_count), (1 << 20, 3));
        let start = (a.ino % 3) as usize;
        let want: Vec<u32> = (0..3).map(|k| ids[(start + k) % 3]).collect();
        assert_eq!(l.servers, want);
        l.validate(false).unwrap();
    }
    // A policy of 2 stripes of 64 KiB: mkdir under it inherits it.
    let d = mkdir(&ns, ROOT_INO, "d").unwrap();
    let d2 = set_layout(&ns, d.ino, 65536, 2).unwrap();
    assert_eq!(
        d2.layout,
        Some(Layout {
            stripe_unit: 65536,
            stripe_count: 2,
            servers: vec![],
            redundancy: weft_proto::DataRedundancy::Plain,
            generation: 0,
        })
    );
    let sub = mkdir(&ns, d.ino, "sub").unwrap();
    assert_eq!(sub.layout, d2.layout);
    let mut firsts = std::collections::BTreeSet::new();
    for i in 0..6 {
        let a = create(&ns, sub.ino, &format!("f{i}")).unwrap();
        let l = a.layout.unwrap();
        assert_eq!((l.stripe_unit, l.stripe_count), (65536, 2));
        let start = (a.ino % 3) as usize;
        assert_eq!(l.servers, vec![ids[start], ids[(start + 1) % 3]]);
        firsts.insert(l.servers[0]);
    }
    assert_eq!(firsts.len(), 3, "files spread over every server");
    // More stripes than servers: all servers.
    set_layout(&ns, d.ino, 4096, 200).unwrap();
    let l = create(&ns, d.ino, "wide").unwrap().layout.unwrap();
    assert_eq!(l.stripe_count, 3);
    // A file's layout is fixed: later policy changes do not touch it.
    let before = lookup(&ns, sub.ino, "f0").unwrap().layout;
    set_layout(&ns, sub.ino, 4096, 1).unwrap();
    assert_eq!(lookup(&ns, sub.ino, "f0").unwrap().layout, before);
}

fn set_layout_rules<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let f = create(&ns, ROOT_INO, "f").unwrap();
    assert_eq!(code(set_layout(&ns, f.ino, 65536, 1)), ErrorCode::NotDir);
    assert_eq!(code(set_layout(&ns, ROOT_INO, 1000, 1)), ErrorCode::Invalid);
    assert_eq!(code(set_layout(&ns, ROOT_INO, 65536, 100_000)), ErrorCode::Invalid);
    assert_eq!(code(set_layout(&ns, 4242, 65536, 1)), ErrorCode::NotFound);
    let pinned = Layout {
        stripe_unit: 65536,
        stripe_count: 1,
        servers: vec![10],
        redundancy: weft_proto::DataRedundancy::Plain,
        generation: 0,
    };
    assert_eq!(
        code(attr(ns.execute(&Request::SetLayout(SetLayoutReq { ino: ROOT_INO, layout: pinned })))),
        ErrorCode::Invalid
    );
    set_layout(&ns, ROOT_INO, 65536, 0).unwrap();
}

fn mkdir_and_rmdir_keep_link_counts<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let a = mkdir(&ns, ROOT_INO, "a").unwrap();
    assert_eq!((a.kind, a.mode, a.nlink, a.uid, a.gid), (FileKind::Dir, 0o755, 2, 0, 0));
    assert_eq!(getattr(&ns, ROOT_INO).unwrap().nlink, 3);
    let b = mkdir(&ns, a.ino, "b").unwrap();
    assert_eq!(getattr(&ns, a.ino).unwrap().nlink, 3);
    assert_eq!(code(mkdir(&ns, ROOT_INO, "a")), ErrorCode::Exists);
    assert_eq!(code(rmdir(&ns, ROOT_INO, "a")), ErrorCode::NotEmpty);
    create(&ns, b.ino, "f").unwrap();
    assert_eq!(code(rmdir(&ns, b.ino, "f")), ErrorCode::NotDir);
    assert_eq!(code(rmdir(&ns, b.ino, "nope")), ErrorCode::NotFound);
    assert_eq!(code(rmdir(&ns, a.ino, "b")), ErrorCode::NotEmpty);
    unlink(&ns, b.ino, "f").unwrap();
    clock.set_ns(T0 + 77);
    rmdir(&ns, a.ino, "b").unwrap();
    let a2 = getattr(&ns, a.ino).unwrap();
    assert_eq!((a2.nlink, a2.mtime_ns, a2.ctime_ns), (2, T0 + 77, T0 + 77));
    assert_eq!(code(getattr(&ns, b.ino)), ErrorCode::NotFound);
    rmdir(&ns, ROOT_INO, "a").unwrap();
    assert_eq!(getattr(&ns, ROOT_INO).unwrap().nlink, 2);
    assert_eq!(statfs(&ns).files, 1);
}

fn unlink_orphans_files_at_their_last_link<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    mkdir(&ns, ROOT_INO, "d").unwrap();
    assert_eq!(code(unlink(&ns, ROOT_INO, "d")), ErrorCode::IsDir);
    assert_eq!(code(unlink(&ns, ROOT_INO, "missing")), ErrorCode::NotFound);
    let f = create(&ns, ROOT_INO, "f").unwrap();
    let l = link(&ns, f.ino, ROOT_INO, "g").unwrap();
    assert_eq!(l.nlink, 2);
    unlink(&ns, ROOT_INO, "f").unwrap();
    assert_eq!(getattr(&ns, f.ino).unwrap().nlink, 1);
    assert!(ns.orphans(10).is_empty());
    unlink(&ns, ROOT_INO, "g").unwrap();
    assert_eq!(code(getattr(&ns, f.ino)), ErrorCode::NotFound);
    assert_eq!(ns.orphans(10), vec![(f.ino, f.layout.clone().unwrap())]);
    // Symlinks have no objects.
    symlink(&ns, ROOT_INO, "s", "x").unwrap();
    unlink(&ns, ROOT_INO, "s").unwrap();
    assert_eq!(ns.orphans(10).len(), 1);
    ns.orphan_done(f.ino).unwrap();
    assert!(ns.orphans(10).is_empty());
    assert_eq!(readdir_all(&ns, ROOT_INO), vec!["d"]);
}

fn hard_links<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let d = mkdir(&ns, ROOT_INO, "d").unwrap();
    let f = create(&ns, ROOT_INO, "f").unwrap();
    assert_eq!(code(link(&ns, d.ino, ROOT_INO, "d2")), ErrorCode::Permission);
    assert_eq!(code(link(&ns, f.ino, ROOT_INO, "d")), ErrorCode::Exists);
    assert_eq!(code(link(&ns, 999, ROOT_INO, "x")), ErrorCode::NotFound);
    assert_eq!(code(link(&ns, f.ino, f.ino, "x")), ErrorCode::NotDir);
    assert_eq!(code(link(&ns, f.ino, ROOT_INO, "..")), ErrorCode::Invalid);
    clock.set_ns(T0 + 3);
    let l = link(&ns, f.ino, d.ino, "f2").unwrap();
    assert_eq!((l.ino, l.nlink, l.ctime_ns), (f.ino, 2, T0 + 3));
    assert_eq!(lookup(&ns, d.ino, "f2").unwrap().ino, f.ino);
    assert_eq!(getattr(&ns, d.ino).unwrap().mtime_ns, T0 + 3);
    let s = symlink(&ns, ROOT_INO, "s", "f").unwrap();
    assert_eq!(link(&ns, s.ino, ROOT_INO, "s2").unwrap().nlink, 2);
}

fn symlinks<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let s = symlink(&ns, ROOT_INO, "s", "../some/where").unwrap();
    assert_eq!((s.kind, s.mode, s.size, s.nlink, s.uid), (FileKind::Symlink, 0o777, 13, 1, 0));
    assert_eq!(readlink(&ns, s.ino).unwrap(), "../some/where");
    let f = create(&ns, ROOT_INO, "f").unwrap();
    assert_eq!(code(readlink(&ns, f.ino)), ErrorCode::NotSymlink);
    assert_eq!(code(readlink(&ns, ROOT_INO)), ErrorCode::NotSymlink);
    assert_eq!(code(readlink(&ns, 999)), ErrorCode::NotFound);
    assert_eq!(code(symlink(&ns, ROOT_INO, "long", &"a".repeat(4097))), ErrorCode::NameTooLong);
    symlink(&ns, ROOT_INO, "max", &"a".repeat(4096)).unwrap();
    assert_eq!(code(symlink(&ns, ROOT_INO, "e", "")), ErrorCode::Invalid);
    assert_eq!(code(symlink(&ns, ROOT_INO, "s", "x")), ErrorCode::Exists);
    assert_eq!(code(setattr(&ns, s.ino, SetAttrs { size: Some(1), ..Default::default() })), ErrorCode::Invalid);
}

fn readdir_plus_pages_carry_each_entrys_attributes<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let d = mkdir(&ns, ROOT_INO, "d").unwrap();
    let sub = mkdir(&ns, d.ino, "a-dir").unwrap();
    let f = create(&ns, d.ino, "b-file").unwrap();
    commit(&ns, f.ino, 4242, 7).unwrap();
    let l = link(&ns, f.ino, d.ino, "c-link").unwrap();
    let plus = |after: &str, limit: u32| match ns
        .execute(&Request::ReaddirPlus(ReaddirReq { ino: d.ino, after: after.into(), limit }))
        .unwrap()
    {
        Response::ReaddirPlus(p) => p,
        other => panic!("{other:?}"),
    };
    let p1 = plus("", 2);
    assert!(!p1.eof);
    let names: Vec<_> = p1.entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a-dir", "b-file"]);
    assert_eq!(p1.entries[0].1.ino, sub.ino);
    assert_eq!(p1.entries[0].1.kind, FileKind::Dir);
    // The attributes are the inode's current ones (committed size, both links counted), not the entry's kind only.
    assert_eq!(p1.entries[1].1.size, 4242);
    assert_eq!(p1.entries[1].1.nlink, 2);
    let p2 = plus("b-file", 0);
    assert!(p2.eof);
    assert_eq!(p2.entries.len(), 1);
    assert_eq!(p2.entries[0].0, "c-link");
    assert_eq!(p2.entries[0].1.ino, l.ino);
    // Not a directory: the same errors as readdir.
    let e = ns.execute(&Request::ReaddirPlus(ReaddirReq { ino: f.ino, after: String::new(), limit: 0 })).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotDir);
}

fn commit_wcc_reports_the_attributes_it_replaced<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let f = create(&ns, ROOT_INO, "f").unwrap();
    let wcc = |size, mtime_ns| match ns.execute(&Request::CommitWcc(CommitReq { ino: f.ino, size, mtime_ns })).unwrap()
    {
        Response::CommitWcc(w) => w,
        other => panic!("{other:?}"),
    };
    let w1 = wcc(100, T0 + 50);
    assert_eq!((w1.pre_mtime_ns, w1.pre_size), (f.mtime_ns, 0));
    assert_eq!((w1.attr.mtime_ns, w1.attr.size), (T0 + 50, 100));
    // The next commit's "before" is the previous commit's "after"; sizes never shrink by a commit.
    let w2 = wcc(10, T0 + 60);
    assert_eq!((w2.pre_mtime_ns, w2.pre_size), (T0 + 50, 100));
    assert_eq!((w2.attr.mtime_ns, w2.attr.size), (T0 + 60, 100));
}

fn mknod<S: MetaStore>(ns: &Ns<S>, parent: u64, name: &str, kind: FileKind, rdev: u32) -> Result<Attr, WireError> {
    let req = MknodReq { parent, name: name.into(), kind, mode: 0o640, rdev };
    attr(ns.execute(&Request::Mknod(req)))
}

fn special_files_are_metadata_only<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let f = mknod(&ns, ROOT_INO, "fifo", FileKind::Fifo, 99).unwrap();
    assert_eq!((f.kind, f.mode, f.uid, f.gid, f.rdev, f.layout), (FileKind::Fifo, 0o640, 0, 0, 0, None));
    let c = mknod(&ns, ROOT_INO, "tty", FileKind::CharDev, 0x0501).unwrap();
    assert_eq!((c.kind, c.rdev), (FileKind::CharDev, 0x0501));
    assert_eq!(lookup(&ns, ROOT_INO, "tty").unwrap(), c);
    assert_eq!(code(mknod(&ns, ROOT_INO, "tty", FileKind::Socket, 0)), ErrorCode::Exists);
    assert_eq!(code(mknod(&ns, ROOT_INO, "file", FileKind::File, 0)), ErrorCode::Invalid);
    assert_eq!(code(create_x(&ns, ROOT_INO, "fifo", false)), ErrorCode::Exists);
    let set = SetAttrs { size: Some(0), ..Default::default() };
    assert_eq!(code(setattr(&ns, f.ino, set)), ErrorCode::Invalid);
    assert_eq!(code(commit(&ns, c.ino, 10, T0)), ErrorCode::Invalid);
    // Removing them leaves nothing for the data servers to delete.
    unlink(&ns, ROOT_INO, "fifo").unwrap();
    unlink(&ns, ROOT_INO, "tty").unwrap();
    let orphans = ns.store().read(|t| t.list_orphans(10)).unwrap();
    assert!(orphans.is_empty(), "{orphans:?}");
}

fn set_group_id_directories_pass_on_their_group<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let d = mkdir(&ns, ROOT_INO, "d").unwrap();
    setattr(&ns, d.ino, SetAttrs { mode: Some(0o2775), gid: Some(77), ..Default::default() }).unwrap();
    let f = create(&ns, d.ino, "f").unwrap();
    let sub = mkdir(&ns, d.ino, "sub").unwrap();
    let l = symlink(&ns, d.ino, "l", "f").unwrap();
    let n = mknod(&ns, d.ino, "n", FileKind::Fifo, 0).unwrap();
    assert_eq!((f.gid, f.mode & 0o2000), (77, 0), "files take the group, not the bit");
    assert_eq!((sub.gid, sub.mode & 0o2000), (77, 0o2000), "directories take both");
    assert_eq!((l.gid, n.gid), (77, 77));
    // Elsewhere the caller's group stays.
    assert_ne!(create(&ns, ROOT_INO, "g").unwrap().gid, 77);
}

fn rename_exchange_swaps_two_names_atomically<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let d1 = mkdir(&ns, ROOT_INO, "d1").unwrap();
    let d2 = mkdir(&ns, ROOT_INO, "d2").unwrap();
    let f = create(&ns, d1.ino, "f").unwrap();
    let sub = mkdir(&ns, d2.ino, "sub").unwrap();
    let inner = mkdir(&ns, sub.ino, "inner").unwrap();
    // A file and a directory across parents: entries swap, link counts and the directory's parent follow.
    rename_f(&ns, d1.ino, "f", d2.ino, "sub", RENAME_EXCHANGE).unwrap();
    assert_eq!(lookup(&ns, d1.ino, "f").unwrap().ino, sub.ino);
    assert_eq!(lookup(&ns, d2.ino, "sub").unwrap().ino, f.ino);
    assert_eq!(getattr(&ns, d1.ino).unwrap().nlink, 3, "d1 gained a subdirectory");
    assert_eq!(getattr(&ns, d2.ino).unwrap().nlink, 2, "d2 lost one");
    // The moved directory's parent pointer moved: putting d1 under it is now a loop, d2 under it is not.
    assert_eq!(code(rename(&ns, ROOT_INO, "d1", sub.ino, "x")), ErrorCode::Invalid);
    // Exchanging a directory with an entry inside its own subtree is refused as well.
    assert_eq!(code(rename_f(&ns, d1.ino, "f", sub.ino, "inner", RENAME_EXCHANGE)), ErrorCode::Invalid);
    assert_eq!(lookup(&ns, sub.ino, "inner").unwrap().ino, inner.ino, "nothing changed");
    // Both names must exist; NOREPLACE and EXCHANGE together are refused; a name with itself is a no-op.
    assert_eq!(code(rename_f(&ns, d1.ino, "f", d2.ino, "none", RENAME_EXCHANGE)), ErrorCode::NotFound);
    assert_eq!(code(rename_f(&ns, d1.ino, "f", d2.ino, "sub", RENAME_EXCHANGE | RENAME_NOREPLACE)), ErrorCode::Invalid);
    rename_f(&ns, d1.ino, "f", d1.ino, "f", RENAME_EXCHANGE).unwrap();
}

fn readdir_pages_by_name<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let d = mkdir(&ns, ROOT_INO, "d").unwrap();
    let empty = readdir(&ns, d.ino, "", 10).unwrap();
    assert!(empty.entries.is_empty() && empty.eof);
    let mut want = Vec::new();
    for i in 0..25 {
        let name = format!("n{i:03}");
        if i % 5 == 0 {
            mkdir(&ns, d.ino, &name).unwrap();
        } else {
            create(&ns, d.ino, &name).unwrap();
        }
        want.push(name);
    }
    // A sibling directory's entries never leak in.
    create(&ns, ROOT_INO, "zzz").unwrap();
    let p1 = readdir(&ns, d.ino, "", 10).unwrap();
    assert_eq!(p1.entries.len(), 10);
    assert!(!p1.eof);
    assert_eq!(p1.entries[0].name, "n000");
    assert_eq!(p1.entries[0].kind, FileKind::Dir);
    assert_eq!(p1.entries[1].kind, FileKind::File);
    assert_eq!(p1.entries[1].ino, lookup(&ns, d.ino, "n001").unwrap().ino);
    let p2 = readdir(&ns, d.ino, "n009", 10).unwrap();
    assert_eq!(p2.entries[0].name, "n010");
    // Exactly the remaining count: eof is reported on this page.
    let p3 = readdir(&ns, d.ino, "n014", 10).unwrap();
    assert_eq!((p3.entries.len(), p3.eof), (10, true));
    // A cursor that is not an existing name still works.
    let p4 = readdir(&ns, d.ino, "n0125", 3).unwrap();
    assert_eq!(p4.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["n013", "n014", "n015"]);
    assert_eq!(readdir_all(&ns, d.ino), want);
    assert_eq!(code(readdir(&ns, 999, "", 1)), ErrorCode::NotFound);
}

fn readdir_limit_is_capped<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let d = mkdir(&ns, ROOT_INO, "d").unwrap();
    ns.store()
        .write(|t| {
            for i in 0..5000 {
                super::create(t, &Cred::root(), &file_req(d.ino, &format!("{i:05}")), T0, &Default::default(), false)?;
            }
            Ok::<_, WireError>(())
        })
        .unwrap();
    let p = readdir(&ns, d.ino, "", 1_000_000).unwrap();
    assert_eq!((p.entries.len(), p.eof), (4096, false));
    let p = readdir(&ns, d.ino, "", 0).unwrap();
    assert_eq!((p.entries.len(), p.eof), (4096, false));
    let p = readdir(&ns, d.ino, &p.entries[4095].name, 0).unwrap();
    assert_eq!((p.entries.len(), p.eof), (904, true));
}

fn setattr_fields<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let f = create(&ns, ROOT_INO, "f").unwrap();
    clock.set_ns(T0 + 100);
    let a = setattr(&ns, f.ino, SetAttrs { mode: Some(0o104777), uid: Some(11), gid: Some(12), ..Default::default() })
        .unwrap();
    assert_eq!((a.mode, a.uid, a.gid, a.ctime_ns, a.mtime_ns), (0o4777, 11, 12, T0 + 100, T0));
    clock.set_ns(T0 + 200);
    let a = setattr(&ns, f.ino, SetAttrs { size: Some(12345), ..Default::default() }).unwrap();
    assert_eq!((a.size, a.mtime_ns, a.ctime_ns), (12345, T0 + 200, T0 + 200));
    let a = setattr(
        &ns,
        f.ino,
        SetAttrs { atime: Some(TimeSet::AtNs(5)), mtime: Some(TimeSet::Now), size: Some(10), ..Default::default() },
    )
    .unwrap();
    assert_eq!((a.atime_ns, a.mtime_ns, a.size), (5, T0 + 200, 10));
    let a = setattr(&ns, f.ino, SetAttrs { mtime: Some(TimeSet::AtNs(-7)), ..Default::default() }).unwrap();
    assert_eq!(a.mtime_ns, -7);
    assert_eq!(getattr(&ns, f.ino).unwrap(), a);
    assert_eq!(code(setattr(&ns, ROOT_INO, SetAttrs { size: Some(0), ..Default::default() })), ErrorCode::IsDir);
    assert_eq!(code(setattr(&ns, 999, SetAttrs::default())), ErrorCode::NotFound);
    let r = setattr(&ns, ROOT_INO, SetAttrs { mode: Some(0o700), ..Default::default() }).unwrap();
    assert_eq!((r.mode, r.kind), (0o700, FileKind::Dir));
}

fn commit_largest_size_wins<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let f = create(&ns, ROOT_INO, "f").unwrap();
    let a = commit(&ns, f.ino, 1000, T0 + 50).unwrap();
    assert_eq!((a.size, a.mtime_ns), (1000, T0 + 50));
    // A slower writer commits a smaller size and an older mtime: neither goes back.
    let a = commit(&ns, f.ino, 400, T0 + 10).unwrap();
    assert_eq!((a.size, a.mtime_ns), (1000, T0 + 50));
    let a = commit(&ns, f.ino, 5000, T0 + 60).unwrap();
    assert_eq!((a.size, a.mtime_ns), (5000, T0 + 60));
    assert_eq!(getattr(&ns, f.ino).unwrap().size, 5000);
    assert_eq!(code(commit(&ns, ROOT_INO, 1, 1)), ErrorCode::IsDir);
    assert_eq!(code(commit(&ns, 999, 1, 1)), ErrorCode::NotFound);
}

fn rename_within_and_across_directories<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let a = mkdir(&ns, ROOT_INO, "a").unwrap();
    let b = mkdir(&ns, ROOT_INO, "b").unwrap();
    let f = create(&ns, a.ino, "f").unwrap();
    clock.set_ns(T0 + 1);
    rename(&ns, a.ino, "f", a.ino, "g").unwrap();
    assert_eq!(code(lookup(&ns, a.ino, "f")), ErrorCode::NotFound);
    let g = lookup(&ns, a.ino, "g").unwrap();
    assert_eq!((g.ino, g.ctime_ns), (f.ino, T0 + 1));
    rename(&ns, a.ino, "g", b.ino, "h").unwrap();
    assert_eq!(lookup(&ns, b.ino, "h").unwrap().ino, f.ino);
    assert_eq!(getattr(&ns, a.ino).unwrap().nlink, 2);
    // Directory across parents: link counts and the parent pointer follow.
    let sub = mkdir(&ns, a.ino, "sub").unwrap();
    assert_eq!(getattr(&ns, a.ino).unwrap().nlink, 3);
    rename(&ns, a.ino, "sub", b.ino, "sub2").unwrap();
    assert_eq!(getattr(&ns, a.ino).unwrap().nlink, 2);
    assert_eq!(getattr(&ns, b.ino).unwrap().nlink, 3);
    assert_eq!(getattr(&ns, ROOT_INO).unwrap().nlink, 4);
    // Now under b: moving b into sub2 must fail (the parent pointer was updated).
    assert_eq!(code(rename(&ns, ROOT_INO, "b", sub.ino, "loop")), ErrorCode::Invalid);
    // Directory within one parent: link counts unchanged.
    rename(&ns, b.ino, "sub2", b.ino, "sub3").unwrap();
    assert_eq!(getattr(&ns, b.ino).unwrap().nlink, 3);
    assert_eq!(code(rename(&ns, b.ino, "nope", a.ino, "x")), ErrorCode::NotFound);
    assert_eq!(code(rename(&ns, 999, "x", a.ino, "x")), ErrorCode::NotFound);
    assert_eq!(code(rename(&ns, b.ino, "h", f.ino, "x")), ErrorCode::NotDir);
    assert_eq!(code(rename(&ns, b.ino, "h", a.ino, "..")), ErrorCode::Invalid);
    assert_eq!(code(rename_f(&ns, b.ino, "h", a.ino, "x", 0x80)), ErrorCode::Invalid);
    assert_eq!(getattr(&ns, b.ino).unwrap().mtime_ns, T0 + 1);
}

fn rename_refuses_moving_a_directory_under_itself<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let a = mkdir(&ns, ROOT_INO, "a").unwrap();
    let b = mkdir(&ns, a.ino, "b").unwrap();
    let c = mkdir(&ns, b.ino, "c").unwrap();
    assert_eq!(code(rename(&ns, ROOT_INO, "a", a.ino, "x")), ErrorCode::Invalid);
    assert_eq!(code(rename(&ns, ROOT_INO, "a", c.ino, "x")), ErrorCode::Invalid);
    assert_eq!(code(rename(&ns, a.ino, "b", b.ino, "x")), ErrorCode::Invalid);
    // Moving up is fine.
    rename(&ns, b.ino, "c", ROOT_INO, "c").unwrap();
    assert_eq!(getattr(&ns, ROOT_INO).unwrap().nlink, 4);
    assert_eq!(getattr(&ns, b.ino).unwrap().nlink, 2);
}

fn rename_replacing_targets<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let f1 = create(&ns, ROOT_INO, "f1").unwrap();
    let f2 = create(&ns, ROOT_INO, "f2").unwrap();
    let d1 = mkdir(&ns, ROOT_INO, "d1").unwrap();
    let d2 = mkdir(&ns, ROOT_INO, "d2").unwrap();
    let full = mkdir(&ns, ROOT_INO, "full").unwrap();
    create(&ns, full.ino, "x").unwrap();
    assert_eq!(code(rename(&ns, ROOT_INO, "f1", ROOT_INO, "d1")), ErrorCode::IsDir);
    assert_eq!(code(rename(&ns, ROOT_INO, "d1", ROOT_INO, "f1")), ErrorCode::NotDir);
    assert_eq!(code(rename(&ns, ROOT_INO, "d1", ROOT_INO, "full")), ErrorCode::NotEmpty);
    assert_eq!(code(rename_f(&ns, ROOT_INO, "f1", ROOT_INO, "f2", RENAME_NOREPLACE)), ErrorCode::Exists);
    assert_eq!(getattr(&ns, ROOT_INO).unwrap().nlink, 5);
    // File over file: the target loses its only link and becomes an orphan.
    rename(&ns, ROOT_INO, "f1", ROOT_INO, "f2").unwrap();
    assert_eq!(lookup(&ns, ROOT_INO, "f2").unwrap().ino, f1.ino);
    assert_eq!(code(getattr(&ns, f2.ino)), ErrorCode::NotFound);
    assert_eq!(ns.orphans(10), vec![(f2.ino, f2.layout.clone().unwrap())]);
    // File over a file with another link: it only loses one.
    let f3 = create(&ns, ROOT_INO, "f3").unwrap();
    link(&ns, f3.ino, d1.ino, "keep").unwrap();
    rename(&ns, ROOT_INO, "f2", ROOT_INO, "f3").unwrap();
    assert_eq!(getattr(&ns, f3.ino).unwrap().nlink, 1);
    assert_eq!(ns.orphans(10).len(), 1);
    // Dir over empty dir (same parent): one directory fewer.
    rename(&ns, ROOT_INO, "d1", ROOT_INO, "d2").unwrap();
    assert_eq!(code(getattr(&ns, d2.ino)), ErrorCode::NotFound);
    assert_eq!(lookup(&ns, ROOT_INO, "d2").unwrap().ino, d1.ino);
    assert_eq!(getattr(&ns, ROOT_INO).unwrap().nlink, 4);
    // Dir over empty dir across parents.
    let e = mkdir(&ns, full.ino, "e").unwrap();
    assert_eq!(getattr(&ns, full.ino).unwrap().nlink, 3);
    rename(&ns, ROOT_INO, "d2", full.ino, "e").unwrap();
    assert_eq!(code(getattr(&ns, e.ino)), ErrorCode::NotFound);
    assert_eq!(getattr(&ns, full.ino).unwrap().nlink, 3);
    assert_eq!(getattr(&ns, ROOT_INO).unwrap().nlink, 3);
    assert_eq!(lookup(&ns, d1.ino, "keep").unwrap().ino, f3.ino);
    assert_eq!(readdir_all(&ns, ROOT_INO), vec!["f3", "full"]);
    assert_eq!(readdir_all(&ns, full.ino), vec!["e", "x"]);
}

fn rename_onto_the_same_inode_is_a_no_op<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let f = create(&ns, ROOT_INO, "f").unwrap();
    let d = mkdir(&ns, ROOT_INO, "d").unwrap();
    clock.set_ns(T0 + 10);
    rename(&ns, ROOT_INO, "f", ROOT_INO, "f").unwrap();
    rename(&ns, ROOT_INO, "d", ROOT_INO, "d").unwrap();
    link(&ns, f.ino, ROOT_INO, "g").unwrap();
    rename(&ns, ROOT_INO, "f", ROOT_INO, "g").unwrap();
    assert_eq!(lookup(&ns, ROOT_INO, "f").unwrap().ino, f.ino);
    assert_eq!(lookup(&ns, ROOT_INO, "g").unwrap().nlink, 2);
    assert_eq!(getattr(&ns, d.ino).unwrap().ctime_ns, T0);
    assert_eq!(code(rename_f(&ns, ROOT_INO, "f", ROOT_INO, "f", RENAME_NOREPLACE)), ErrorCode::Exists);
}

fn servers_statfs_and_liveness<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    create(&ns, ROOT_INO, "f").unwrap();
    let s = statfs(&ns);
    assert_eq!(s, StatFs { bytes_total: 3000, bytes_free: 1500, files: 2, servers_up: 3, servers_total: 3 });
    clock.advance_ms(3000);
    register(&ns, 20, "ds20-new:7000", 4000);
    clock.advance_ms(2500);
    let info = match ns.execute(&Request::ClusterInfo(())).unwrap() {
        Response::ClusterInfo(v) => v,
        other => panic!("{other:?}"),
    };
    assert_eq!(info, ns.servers());
    assert_eq!(info.iter().map(|s| s.id).collect::<Vec<_>>(), [10, 20, 30]);
    assert_eq!((info[0].state, info[0].heartbeat_age_ms), (ServerState::Down, 5500));
    assert_eq!((info[1].state, info[1].heartbeat_age_ms), (ServerState::Up, 2500));
    assert_eq!((info[1].addr.as_str(), info[1].bytes_total), ("ds20-new:7000", 4000));
    let s = statfs(&ns);
    assert_eq!((s.servers_up, s.servers_total, s.bytes_total), (1, 3, 6000));
    let bad = RegisterServerReq { id: 1, addr: String::new(), space: SpaceStat::default() };
    assert_eq!(code(ns.execute(&Request::RegisterServer(bad))), ErrorCode::Invalid);
}

fn statfs_counts_a_shared_file_system_once<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let reg = |id: u32, dev: u64, free: u64| {
        let space = weft_proto::SpaceStatDev {
            space: SpaceStat { bytes_total: 1000, bytes_free: free, objects: 0 },
            device: weft_proto::DeviceId { host_id: "host-a".into(), dev, fsid: 0 },
        };
        let r = ns.execute(&Request::RegisterServerDev(RegisterServerDevReq { id, addr: format!("ds{id}:1"), space }));
        let up = weft_proto::msg::HeartbeatResp { state: ServerState::Up, rebuild_after_ms: DEFAULT_REBUILD_AFTER_MS };
        assert_eq!(r, Ok(Response::RegisterServerDev(up)), "the heartbeat reply says Up: the server may serve");
    };
    // ns_of registered 10, 20, 30 with plain RegisterServer (1000 bytes each, no device: counted alone). Now 10
    // and 20 report the same device and 30 another: two file systems.
    reg(10, 7, 600);
    reg(20, 7, 500);
    reg(30, 8, 400);
    let s = statfs(&ns);
    assert_eq!((s.bytes_total, s.bytes_free, s.servers_total), (2000, 900, 3), "device 7 once (smallest free)");
    // A host id past the bound is refused before anything is recorded.
    let space = weft_proto::SpaceStatDev {
        space: SpaceStat::default(),
        device: weft_proto::DeviceId { host_id: "h".repeat(65), dev: 1, fsid: 1 },
    };
    let bad = RegisterServerDevReq { id: 40, addr: "ds40:1".into(), space };
    assert_eq!(code(ns.execute(&Request::RegisterServerDev(bad))), ErrorCode::Invalid);
    assert_eq!(statfs(&ns).servers_total, 3);
}

fn lookup_of_dotdot_is_the_parent<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let a = mkdir(&ns, ROOT_INO, "a").unwrap();
    let b = mkdir(&ns, a.ino, "b").unwrap();
    let up = |dir: u64| match ns.execute(&Request::Lookup(LookupReq { parent: dir, name: "..".into() })) {
        Ok(Response::Lookup(attr)) => attr.ino,
        other => panic!("{other:?}"),
    };
    assert_eq!((up(b.ino), up(a.ino), up(ROOT_INO)), (a.ino, ROOT_INO, ROOT_INO));
    let f = create(&ns, ROOT_INO, "f").unwrap();
    let r = ns.execute(&Request::Lookup(LookupReq { parent: f.ino, name: "..".into() }));
    assert_eq!(code(r), ErrorCode::NotDir, "a file has no ..");
}

fn other_services_ops_are_refused<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    for req in [
        Request::Read(ReadReq { ino: 2, offset: 0, len: 1, cap: weft_proto::Capability::none(), fill: None }),
        Request::RemoveObject(InoReq { ino: 2 }),
        Request::SpaceStat(()),
        Request::SpaceStatDev(()),
        Request::SessionCreate(SessionCreateReq { client_name: "c".into(), slots: 1 }),
        Request::SessionDestroy(()),
    ] {
        assert_eq!(code(ns.execute(&req)), ErrorCode::BadRequest, "{req:?}");
    }
    assert_eq!(ns.execute(&Request::Null(())), Ok(Response::Null(())));
}

fn failed_transactions_apply_nothing<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let before = statfs(&ns).files;
    let r: Result<(), WireError> = ns.store().write(|t| {
        super::create(t, &Cred::root(), &file_req(ROOT_INO, "a"), T0, &Default::default(), false)?;
        super::mkdir(t, &Cred::root(), &dir_req(ROOT_INO, "b"), T0)?;
        Err(WireError::new(ErrorCode::Internal, "abort"))
    });
    assert!(r.is_err());
    assert_eq!(statfs(&ns).files, before);
    assert!(readdir_all(&ns, ROOT_INO).is_empty());
    assert_eq!(getattr(&ns, ROOT_INO).unwrap().nlink, 2);
    // Inode numbers allocated by the aborted transaction are reused where the counter rolled back too (a
    // PostgreSQL sequence skips them instead).
    let a = create(&ns, ROOT_INO, "a").unwrap();
    assert!(a.ino == 2 || !S::REUSES_ABORTED_INOS && a.ino > 2, "{}", a.ino);
    // A read transaction refuses writes.
    let r = ns.store().read(|t| t.del_inode(ROOT_INO));
    assert!(matches!(r, Err(MetaError::ReadOnly)));
}

fn file_req(parent: u64, name: &str) -> CreateReq {
    CreateReq { parent, name: name.into(), mode: 0o644, exclusive: true }
}

fn dir_req(parent: u64, name: &str) -> MkdirReq {
    MkdirReq { parent, name: name.into(), mode: 0o755 }
}

// ---- RedbStore ------------------------------------------------------------------------------------------------

#[test]
fn redb_survives_reopen() {
    let dir = TempDir::new("reopen");
    let clock = Arc::new(ManualClock::new(T0));
    let (f, d, s);
    {
        let ns = redb_ns(&dir, clock.clone());
        register(&ns, 1, "a:1", 100);
        register(&ns, 2, "b:1", 100);
        f = create(&ns, ROOT_INO, "f").unwrap();
        d = mkdir(&ns, ROOT_INO, "d").unwrap();
        s = symlink(&ns, d.ino, "s", "../f").unwrap();
        commit(&ns, f.ino, 777, T0 + 1).unwrap();
        let gone = create(&ns, d.ino, "gone").unwrap();
        unlink(&ns, d.ino, "gone").unwrap();
        assert_eq!(ns.orphans(10), vec![(gone.ino, gone.layout.unwrap())]);
        // A failed op leaves nothing behind on disk either.
        assert_eq!(code(rename(&ns, ROOT_INO, "d", d.ino, "x")), ErrorCode::Invalid);
    }
    assert!(dir.0.join("meta.redb").exists());
    clock.advance_ms(60_000);
    let ns = redb_ns(&dir, clock.clone());
    assert_eq!(lookup(&ns, ROOT_INO, "f").unwrap().size, 777);
    assert_eq!(lookup(&ns, ROOT_INO, "d").unwrap(), getattr(&ns, d.ino).unwrap());
    assert_eq!(readlink(&ns, s.ino).unwrap(), "../f");
    assert_eq!(getattr(&ns, ROOT_INO).unwrap().nlink, 3);
    assert_eq!(readdir_all(&ns, d.ino), vec!["s"]);
    assert_eq!(ns.orphans(10).len(), 1);
    assert_eq!(statfs(&ns).files, 4);
    // Servers are remembered but not heard from since the restart.
    let info = ns.servers();
    assert_eq!(info.iter().map(|s| (s.id, s.addr.as_str())).collect::<Vec<_>>(), [(1, "a:1"), (2, "b:1")]);
    assert!(info.iter().all(|s| s.state == ServerState::Down && s.heartbeat_age_ms == u64::MAX));
    // Creates still work off the persisted registry, and inode numbers are never reused.
    let g = create(&ns, ROOT_INO, "g").unwrap();
    assert!(g.ino > s.ino + 1);
    assert_eq!(g.layout.unwrap().stripe_count, 2);
    // The file is locked while open.
    assert!(RedbStore::open(&dir.0).is_err());
}

fn redb_matches_the_other_store_on_a_scenario<S: TestStore>() {
    fn scenario<S: MetaStore>(ns: &Ns<S>) -> Vec<(String, Vec<String>)> {
        register(ns, 5, "x:1", 10);
        let a = mkdir(ns, ROOT_INO, "a").unwrap();
        let b = mkdir(ns, a.ino, "b").unwrap();
        for i in 0..20 {
            create(ns, b.ino, &format!("f{i}")).unwrap();
        }
        rename(ns, a.ino, "b", ROOT_INO, "b").unwrap();
        rename(ns, b.ino, "f3", b.ino, "f4").unwrap();
        unlink(ns, b.ino, "f5").unwrap();
        assert_eq!(code(rmdir(ns, ROOT_INO, "b")), ErrorCode::NotEmpty);
        rmdir(ns, ROOT_INO, "a").unwrap();
        vec![("root".into(), readdir_all(ns, ROOT_INO)), ("b".into(), readdir_all(ns, b.ino))]
    }
    let dir = TempDir::new("scenario");
    let clock = Arc::new(ManualClock::new(T0));
    let mem = Namespace::new(S::fresh(), clock.clone(), DEFAULT_LIVENESS_MS).unwrap();
    let red = redb_ns(&dir, clock);
    assert_eq!(scenario(&mem), scenario(&red));
    assert_eq!(statfs(&mem), statfs(&red));
    assert_eq!(mem.orphans(100), red.orphans(100));
    let r = red.store().read(|t| t.put_server(1, "x"));
    assert!(matches!(r, Err(MetaError::ReadOnly)));
}

#[test]
fn redb_readdir_pages_through_100k_entries() {
    const N: usize = 100_000;
    let dir = TempDir::new("big");
    let clock = Arc::new(ManualClock::new(T0));
    let ns = redb_ns(&dir, clock);
    register(&ns, 1, "a:1", 100);
    let d = mkdir(&ns, ROOT_INO, "big").unwrap();
    let started = std::time::Instant::now();
    // Through the namespace's own create, batched into a few transactions (one fsync each).
    for batch in 0..10 {
        ns.store()
            .write(|t| {
                for i in (batch * N / 10)..((batch + 1) * N / 10) {
                    super::create(
                        t,
                        &Cred::root(),
                        &file_req(d.ino, &format!("file-{:08}", (i * 7919) % N)),
                        T0,
                        &Default::default(),
                        false,
                    )?;
                }
                Ok::<_, WireError>(())
            })
            .unwrap();
    }
    let inserted = started.elapsed();
    let names = readdir_all(&ns, d.ino);
    eprintln!("100k creates: {inserted:?}, readdir: {:?}", started.elapsed() - inserted);
    assert_eq!(names.len(), N);
    for (i, n) in names.iter().enumerate() {
        assert_eq!(*n, format!("file-{i:08}"));
    }
    assert_eq!(statfs(&ns).files, N as u64 + 2);
    // A sibling created after still does not show up inside.
    create(&ns, ROOT_INO, "big-sibling").unwrap();
    let last = readdir(&ns, d.ino, "file-00099990", 100).unwrap();
    assert_eq!((last.entries.len(), last.eof), (9, true));
}

#[test]
fn the_service_type_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Namespace<RedbStore, crate::SystemClock>>();
    assert_send_sync::<Namespace<MemStore, Arc<ManualClock>>>();
}

/// Child half of `redb_acknowledged_ops_survive_abort`: does nothing unless the parent test set the variable.
#[test]
fn redb_crash_child() {
    let Ok(dir) = std::env::var("WEFT_META_CRASH_DIR") else {
        return;
    };
    let ns =
        Namespace::new(RedbStore::open(&dir).unwrap(), Arc::new(ManualClock::new(T0)), DEFAULT_LIVENESS_MS).unwrap();
    register(&ns, 1, "a:1", 100);
    for i in 0..50 {
        create(&ns, ROOT_INO, &format!("acked-{i:02}")).unwrap();
    }
    // Concurrent writers share group commits; each is acknowledged only once durable.
    std::thread::scope(|sc| {
        for t in 0..4 {
            let ns = &ns;
            sc.spawn(move || {
                for i in 0..25 {
                    create(ns, ROOT_INO, &format!("z{t}-{i:02}")).unwrap();
                }
            });
        }
    });
    println!("ACKED 150");
    // Like kill -9: no destructors, no clean close of the database.
    std::process::abort();
}

#[test]
fn redb_acknowledged_ops_survive_abort() {
    let dir = TempDir::new("crash");
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "namespace::tests::redb_crash_child", "--nocapture", "--test-threads=1"])
        .env("WEFT_META_CRASH_DIR", &dir.0)
        .output()
        .unwrap();
    assert!(!out.status.success(), "the child must die by abort");
    assert!(String::from_utf8_lossy(&out.stdout).contains("ACKED 150"), "{out:?}");
    let ns = redb_ns(&dir, Arc::new(ManualClock::new(T0)));
    let names = readdir_all(&ns, ROOT_INO);
    let mut expected: Vec<String> = (0..50).map(|i| format!("acked-{i:02}")).collect();
    expected.extend((0..4).flat_map(|t| (0..25).map(move |i| format!("z{t}-{i:02}"))));
    assert_eq!(names, expected);
    assert_eq!(ns.servers().len(), 1);
}

// ---- permissions (execute_as) ---------------------------------------------------------------------------------

const ALICE: u32 = 1000;
const BOB: u32 = 1001;
const USERS: u32 = 100;
const STAFF: u32 = 50;
const WHEEL: u32 = 10;

/// Alice: primary group users, also in staff.
fn alice() -> Cred {
    Cred::new(ALICE, USERS, vec![STAFF])
}

/// Bob: users only.
fn bob() -> Cred {
    Cred::new(BOB, USERS, vec![])
}

/// Everything a client could observe, read as root: every reachable entry with its attributes, the inode count,
/// the orphans and the servers.
#[derive(Debug, PartialEq)]
struct Snapshot {
    entries: Vec<(String, Attr)>,
    inodes: u64,
    orphans: Vec<(u64, Layout)>,
    servers: Vec<(u32, String)>,
}

fn snapshot<S: MetaStore>(ns: &Ns<S>) -> Snapshot {
    fn walk<S: MetaStore>(ns: &Ns<S>, ino: u64, path: &str, out: &mut Vec<(String, Attr)>) {
        let Response::ReaddirPlus(page) =
            ns.execute(&Request::ReaddirPlus(ReaddirReq { ino, after: String::new(), limit: 0 })).unwrap()
        else {
            panic!("not a readdirplus reply")
        };
        assert!(page.eof, "test directories fit in one page");
        for (name, a) in page.entries {
            let p = format!("{path}/{name}");
            out.push((p.clone(), a.clone()));
            if a.kind == FileKind::Dir {
                walk(ns, a.ino, &p, out);
            }
        }
    }
    let mut entries = vec![(String::from("/"), getattr(ns, ROOT_INO).unwrap())];
    walk(ns, ROOT_INO, "", &mut entries);
    let servers = ns.servers().into_iter().map(|s| (s.id, s.addr)).collect();
    Snapshot { entries, inodes: statfs(ns).files, orphans: ns.store().read(|t| t.list_orphans(100)).unwrap(), servers }
}

/// Runs `req` as `cred`, expects `want`, and checks that nothing changed (the clock moves first, so a stray
/// timestamp update would show).
fn refused<S: MetaStore>(ns: &Ns<S>, clock: &ManualClock, cred: &Cred, req: Request, want: ErrorCode) {
    let before = snapshot(ns);
    clock.advance_ms(1);
    let r = ns.execute_as(cred, &req);
    assert_eq!(code(r), want, "{req:?} as uid {}", cred.uid);
    assert_eq!(snapshot(ns), before, "{req:?} as uid {} was refused but changed something", cred.uid);
}

fn as_attr<S: MetaStore>(ns: &Ns<S>, cred: &Cred, req: Request) -> Attr {
    attr(ns.execute_as(cred, &req)).unwrap_or_else(|e| panic!("{req:?} as uid {}: {e}", cred.uid))
}

fn as_unit<S: MetaStore>(ns: &Ns<S>, cred: &Cred, req: Request) {
    unit(ns.execute_as(cred, &req)).unwrap_or_else(|e| panic!("{req:?} as uid {}: {e}", cred.uid))
}

/// A directory made by root and given to `uid`:`gid`, with `mode`.
fn dir_of<S: MetaStore>(ns: &Ns<S>, parent: u64, name: &str, mode: u32, uid: u32, gid: u32) -> Attr {
    let d = attr(ns.execute(&Request::Mkdir(MkdirReq { parent, name: name.into(), mode }))).unwrap();
    chown_to(ns, d.ino, mode, uid, gid)
}

/// A file made by root and given to `uid`:`gid`, with `mode`.
fn file_of<S: MetaStore>(ns: &Ns<S>, parent: u64, name: &str, mode: u32, uid: u32, gid: u32) -> Attr {
    let req = CreateReq { parent, name: name.into(), mode, exclusive: true };
    let f = attr(ns.execute(&Request::Create(req))).unwrap();
    chown_to(ns, f.ino, mode, uid, gid)
}

/// Root's chown (which keeps every mode bit), with the mode set again as asked.
fn chown_to<S: MetaStore>(ns: &Ns<S>, ino: u64, mode: u32, uid: u32, gid: u32) -> Attr {
    let set = SetAttrs { uid: Some(uid), gid: Some(gid), mode: Some(mode), ..SetAttrs::default() };
    attr(ns.execute(&Request::SetAttr(SetAttrReq { ino, set }))).unwrap()
}

fn create_req(parent: u64, name: &str) -> Request {
    Request::Create(CreateReq { parent, name: name.into(), mode: 0o644, exclusive: true })
}

fn mkdir_req(parent: u64, name: &str) -> Request {
    Request::Mkdir(MkdirReq { parent, name: name.into(), mode: 0o755 })
}

fn mknod_req(parent: u64, name: &str, kind: FileKind) -> Request {
    Request::Mknod(MknodReq { parent, name: name.into(), kind, mode: 0o666, rdev: 0x0501 })
}

fn name_req(parent: u64, name: &str) -> NameReq {
    NameReq { parent, name: name.into() }
}

fn rename_req(sp: u64, sn: &str, dp: u64, dn: &str, flags: u32) -> Request {
    Request::Rename(RenameReq { src_parent: sp, src_name: sn.into(), dst_parent: dp, dst_name: dn.into(), flags })
}

fn readdir_req(ino: u64) -> ReaddirReq {
    ReaddirReq { ino, after: String::new(), limit: 0 }
}

fn setattr_req(ino: u64, set: SetAttrs) -> Request {
    Request::SetAttr(SetAttrReq { ino, set })
}

fn commit_req(ino: u64, size: u64) -> Request {
    Request::Commit(CommitReq { ino, size, mtime_ns: T0 + 1_000_000_000 })
}

fn a_private_directory_cannot_be_searched_or_listed_by_others<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let b = dir_of(&ns, ROOT_INO, "b", 0o700, BOB, USERS);
    let f = file_of(&ns, b.ino, "f", 0o644, BOB, USERS);
    for req in [
        Request::Lookup(LookupReq { parent: b.ino, name: "f".into() }),
        Request::Readdir(readdir_req(b.ino)),
        Request::ReaddirPlus(readdir_req(b.ino)),
    ] {
        refused(&ns, &clock, &alice(), req.clone(), ErrorCode::Permission);
        assert!(ns.execute_as(&bob(), &req).is_ok(), "the owner: {req:?}");
        assert!(ns.execute_as(&Cred::root(), &req).is_ok(), "root: {req:?}");
    }
    // Search only (0711): names can be looked up, not listed.
    setattr(&ns, b.ino, SetAttrs { mode: Some(0o711), ..Default::default() }).unwrap();
    assert_eq!(as_attr(&ns, &alice(), Request::Lookup(LookupReq { parent: b.ino, name: "f".into() })), f);
    refused(&ns, &clock, &alice(), Request::Readdir(readdir_req(b.ino)), ErrorCode::Permission);
    refused(&ns, &clock, &alice(), Request::ReaddirPlus(readdir_req(b.ino)), ErrorCode::Permission);
    // Read only (0744): names can be listed, but neither looked up nor listed with their attributes.
    setattr(&ns, b.ino, SetAttrs { mode: Some(0o744), ..Default::default() }).unwrap();
    let Ok(Response::Readdir(names)) = ns.execute_as(&alice(), &Request::Readdir(readdir_req(b.ino))) else {
        panic!("readdir of a readable directory")
    };
    assert_eq!(names.entries.len(), 1);
    refused(&ns, &clock, &alice(), Request::ReaddirPlus(readdir_req(b.ino)), ErrorCode::Permission);
    refused(
        &ns,
        &clock,
        &alice(),
        Request::Lookup(LookupReq { parent: b.ino, name: "f".into() }),
        ErrorCode::Permission,
    );
    // Group members use the group bits (alice is in staff).
    let s = dir_of(&ns, ROOT_INO, "s", 0o750, BOB, STAFF);
    assert!(ns.execute_as(&alice(), &Request::ReaddirPlus(readdir_req(s.ino))).is_ok());
}

fn access_checks_the_mode_bits_of_one_inode<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let f = file_of(&ns, ROOT_INO, "f", 0o640, BOB, STAFF);
    assert_eq!(ns.access(&bob(), f.ino, Mask::READ | Mask::WRITE), Ok(()));
    assert_eq!(ns.access(&alice(), f.ino, Mask::READ), Ok(()), "through staff");
    assert_eq!(ns.access(&alice(), f.ino, Mask::WRITE).unwrap_err().code, ErrorCode::Permission);
    assert_eq!(ns.access(&Cred::new(2000, 2000, vec![]), f.ino, Mask::READ).unwrap_err().code, ErrorCode::Permission);
    assert_eq!(ns.access(&Cred::new(2000, 2000, vec![]), f.ino, Mask::NONE), Ok(()), "existence only");
    assert_eq!(ns.access(&Cred::root(), f.ino, Mask::READ | Mask::WRITE), Ok(()));
    assert_eq!(ns.access(&Cred::root(), f.ino, Mask::EXEC).unwrap_err().code, ErrorCode::Permission, "no x bit");
    assert_eq!(ns.access(&Cred::root(), ROOT_INO, Mask::EXEC), Ok(()));
    assert_eq!(ns.access(&alice(), 999, Mask::READ).unwrap_err().code, ErrorCode::NotFound);
}

fn entries_are_added_only_with_write_and_search_on_the_directory<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let b = dir_of(&ns, ROOT_INO, "b", 0o755, BOB, USERS);
    file_of(&ns, b.ino, "f", 0o644, BOB, USERS);
    let tmp = dir_of(&ns, ROOT_INO, "tmp", 0o1777, 0, 0);
    let mine = as_attr(&ns, &alice(), create_req(tmp.ino, "mine"));
    for req in [
        create_req(b.ino, "new"),
        mkdir_req(b.ino, "new"),
        mknod_req(b.ino, "new", FileKind::Fifo),
        Request::Symlink(SymlinkReq { parent: b.ino, name: "new".into(), target: "x".into() }),
        Request::Link(LinkReq { ino: mine.ino, new_parent: b.ino, new_name: "new".into() }),
        rename_req(tmp.ino, "mine", b.ino, "new", 0),
    ] {
        refused(&ns, &clock, &alice(), req, ErrorCode::Permission);
    }
    // An existing name answers without write permission, as open(O_CREAT) does.
    refused(&ns, &clock, &alice(), create_req(b.ino, "f"), ErrorCode::Exists);
    let existing = Request::Create(CreateReq { parent: b.ino, name: "f".into(), mode: 0o644, exclusive: false });
    assert_eq!(as_attr(&ns, &alice(), existing).uid, BOB);
    refused(&ns, &clock, &alice(), mkdir_req(b.ino, "f"), ErrorCode::Exists);
    // Without search permission, not even that.
    let x = dir_of(&ns, ROOT_INO, "x", 0o776, BOB, WHEEL);
    refused(&ns, &clock, &alice(), create_req(x.ino, "new"), ErrorCode::Permission);
    // The owner may; what a user creates is theirs, in their primary group.
    assert_eq!(as_attr(&ns, &bob(), create_req(b.ino, "new")).uid, BOB);
    let a = as_attr(&ns, &alice(), mkdir_req(tmp.ino, "a"));
    assert_eq!((a.uid, a.gid, a.mode), (ALICE, USERS, 0o755));
}

fn a_sticky_directory_protects_other_users_entries<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let tmp = dir_of(&ns, ROOT_INO, "tmp", 0o1777, 0, 0);
    as_attr(&ns, &bob(), create_req(tmp.ino, "bobs"));
    as_attr(&ns, &bob(), mkdir_req(tmp.ino, "bobs-dir"));
    as_attr(&ns, &alice(), create_req(tmp.ino, "alices"));
    for req in [
        Request::Unlink(name_req(tmp.ino, "bobs")),
        Request::Rmdir(name_req(tmp.ino, "bobs-dir")),
        rename_req(tmp.ino, "bobs", tmp.ino, "stolen", 0),
        rename_req(tmp.ino, "alices", tmp.ino, "bobs", 0),
        rename_req(tmp.ino, "alices", tmp.ino, "bobs", RENAME_EXCHANGE),
    ] {
        refused(&ns, &clock, &alice(), req, ErrorCode::NotPermitted);
    }
    // Her own entries, yes; and root and the directory's owner may remove anyone's.
    as_unit(&ns, &alice(), rename_req(tmp.ino, "alices", tmp.ino, "alices2", 0));
    as_unit(&ns, &alice(), Request::Unlink(name_req(tmp.ino, "alices2")));
    as_unit(&ns, &Cred::root(), Request::Unlink(name_req(tmp.ino, "bobs")));
    let own = dir_of(&ns, ROOT_INO, "own", 0o1777, ALICE, USERS);
    as_attr(&ns, &bob(), create_req(own.ino, "bobs"));
    as_unit(&ns, &alice(), Request::Unlink(name_req(own.ino, "bobs")));
    assert_eq!(readdir_all(&ns, tmp.ino), ["bobs-dir"]);
    // Outside a sticky directory, write permission on the directory is what counts.
    let b = dir_of(&ns, ROOT_INO, "b", 0o755, BOB, USERS);
    file_of(&ns, b.ino, "f", 0o666, BOB, USERS);
    refused(&ns, &clock, &alice(), Request::Unlink(name_req(b.ino, "f")), ErrorCode::Permission);
    let shared = dir_of(&ns, ROOT_INO, "shared", 0o777, 0, 0);
    file_of(&ns, shared.ino, "f", 0o600, BOB, USERS);
    as_unit(&ns, &alice(), Request::Unlink(name_req(shared.ino, "f")));
}

fn a_directory_moving_to_another_parent_needs_write_permission_on_itself<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let x = dir_of(&ns, ROOT_INO, "x", 0o777, 0, 0);
    let y = dir_of(&ns, ROOT_INO, "y", 0o777, 0, 0);
    dir_of(&ns, x.ino, "d", 0o755, BOB, USERS);
    file_of(&ns, x.ino, "f", 0o644, BOB, USERS);
    as_attr(&ns, &alice(), mkdir_req(y.ino, "mine"));
    refused(&ns, &clock, &alice(), rename_req(x.ino, "d", y.ino, "d", 0), ErrorCode::Permission);
    refused(&ns, &clock, &alice(), rename_req(x.ino, "d", y.ino, "mine", RENAME_EXCHANGE), ErrorCode::Permission);
    // Within its directory, or a file (no `..`), or her own directory: allowed.
    as_unit(&ns, &alice(), rename_req(x.ino, "d", x.ino, "d2", 0));
    as_unit(&ns, &alice(), rename_req(x.ino, "f", y.ino, "f", 0));
    as_unit(&ns, &alice(), rename_req(y.ino, "mine", x.ino, "mine", 0));
    // The destination directory needs write permission too.
    let ro = dir_of(&ns, ROOT_INO, "ro", 0o755, 0, 0);
    refused(&ns, &clock, &alice(), rename_req(x.ino, "mine", ro.ino, "mine", 0), ErrorCode::Permission);
}

fn chmod_chown_and_times_of_someone_elses_file_are_refused<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let f = file_of(&ns, ROOT_INO, "f", 0o644, BOB, USERS);
    let set = |s: SetAttrs| setattr_req(f.ino, s);
    for (req, want) in [
        (set(SetAttrs { mode: Some(0o666), ..Default::default() }), ErrorCode::NotPermitted),
        (set(SetAttrs { uid: Some(ALICE), ..Default::default() }), ErrorCode::NotPermitted),
        (set(SetAttrs { gid: Some(STAFF), ..Default::default() }), ErrorCode::NotPermitted),
        (set(SetAttrs { mtime: Some(TimeSet::AtNs(5)), ..Default::default() }), ErrorCode::NotPermitted),
        (
            set(SetAttrs { atime: Some(TimeSet::Now), mtime: Some(TimeSet::Now), ..Default::default() }),
            ErrorCode::Permission,
        ),
        (set(SetAttrs { size: Some(0), ..Default::default() }), ErrorCode::Permission),
    ] {
        refused(&ns, &clock, &alice(), req, want);
    }
    // The owner may not give the file away, nor give it a group that is not theirs.
    refused(&ns, &clock, &bob(), set(SetAttrs { uid: Some(ALICE), ..Default::default() }), ErrorCode::NotPermitted);
    refused(&ns, &clock, &bob(), set(SetAttrs { gid: Some(STAFF), ..Default::default() }), ErrorCode::NotPermitted);
    // With write permission, "touch" and truncate are allowed, explicit times are not.
    let w = file_of(&ns, ROOT_INO, "w", 0o666, BOB, USERS);
    clock.advance_ms(1);
    let touch = SetAttrs { atime: Some(TimeSet::Now), mtime: Some(TimeSet::Now), ..Default::default() };
    let t = as_attr(&ns, &alice(), setattr_req(w.ino, touch));
    assert!(t.mtime_ns > w.mtime_ns);
    assert_eq!(as_attr(&ns, &alice(), setattr_req(w.ino, SetAttrs { size: Some(9), ..Default::default() })).size, 9);
    let explicit = SetAttrs { atime: Some(TimeSet::AtNs(1)), mtime: Some(TimeSet::AtNs(1)), ..Default::default() };
    refused(&ns, &clock, &alice(), setattr_req(w.ino, explicit.clone()), ErrorCode::NotPermitted);
    let by_owner = as_attr(&ns, &bob(), setattr_req(w.ino, explicit));
    assert_eq!((by_owner.atime_ns, by_owner.mtime_ns), (1, 1));
    // Root may do it all.
    let all = SetAttrs { mode: Some(0o600), uid: Some(ALICE), gid: Some(WHEEL), ..Default::default() };
    let r = as_attr(&ns, &Cred::root(), setattr_req(f.ino, all));
    assert_eq!((r.mode, r.uid, r.gid), (0o600, ALICE, WHEEL));
}

fn the_owner_may_chgrp_to_their_own_groups_only<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let f = file_of(&ns, ROOT_INO, "f", 0o644, ALICE, USERS);
    let to = |gid| setattr_req(f.ino, SetAttrs { gid: Some(gid), ..Default::default() });
    assert_eq!(as_attr(&ns, &alice(), to(STAFF)).gid, STAFF);
    refused(&ns, &clock, &alice(), to(WHEEL), ErrorCode::NotPermitted);
    assert_eq!(getattr(&ns, f.ino).unwrap().gid, STAFF);
    // chmod by the owner works; set-group-ID survives only for a group she is in.
    let m = as_attr(&ns, &alice(), setattr_req(f.ino, SetAttrs { mode: Some(0o2755), ..Default::default() }));
    assert_eq!(m.mode, 0o2755);
    setattr(&ns, f.ino, SetAttrs { gid: Some(WHEEL), ..Default::default() }).unwrap();
    let m = as_attr(&ns, &alice(), setattr_req(f.ino, SetAttrs { mode: Some(0o2755), ..Default::default() }));
    assert_eq!(m.mode, 0o755);
}

fn device_nodes_are_made_by_root_only<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let tmp = dir_of(&ns, ROOT_INO, "tmp", 0o1777, 0, 0);
    refused(&ns, &clock, &alice(), mknod_req(tmp.ino, "tty", FileKind::CharDev), ErrorCode::NotPermitted);
    refused(&ns, &clock, &alice(), mknod_req(tmp.ino, "sda", FileKind::BlockDev), ErrorCode::NotPermitted);
    // Write permission is checked first (EACCES before EPERM, as Linux).
    refused(&ns, &clock, &alice(), mknod_req(ROOT_INO, "tty", FileKind::CharDev), ErrorCode::Permission);
    let fifo = as_attr(&ns, &alice(), mknod_req(tmp.ino, "fifo", FileKind::Fifo));
    assert_eq!((fifo.uid, fifo.kind), (ALICE, FileKind::Fifo));
    as_attr(&ns, &alice(), mknod_req(tmp.ino, "sock", FileKind::Socket));
    let tty = as_attr(&ns, &Cred::root(), mknod_req(tmp.ino, "tty", FileKind::CharDev));
    assert_eq!((tty.kind, tty.rdev), (FileKind::CharDev, 0x0501));
}

fn a_non_root_commit_clears_set_id_bits<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    // Alice writes through the staff group bits; bob owns the file.
    let f = file_of(&ns, ROOT_INO, "f", 0o6775, BOB, STAFF);
    let c = as_attr(&ns, &alice(), commit_req(f.ino, 10));
    assert_eq!((c.mode, c.size), (0o775, 10));
    // The owner's own write clears them too (Linux: everyone without CAP_FSETID); root's does not.
    setattr(&ns, f.ino, SetAttrs { mode: Some(0o4755), ..Default::default() }).unwrap();
    assert_eq!(as_attr(&ns, &Cred::root(), commit_req(f.ino, 20)).mode, 0o4755);
    assert_eq!(as_attr(&ns, &bob(), commit_req(f.ino, 30)).mode, 0o755);
    // Set-group-ID without group exec stays for a writer in the group.
    let g = file_of(&ns, ROOT_INO, "g", 0o2664, BOB, STAFF);
    assert_eq!(as_attr(&ns, &alice(), commit_req(g.ino, 1)).mode, 0o2664);
    // No write permission and not the owner: refused, nothing changes.
    let h = file_of(&ns, ROOT_INO, "h", 0o4755, BOB, USERS);
    refused(&ns, &clock, &alice(), commit_req(h.ino, 10), ErrorCode::Permission);
    let wcc = Request::CommitWcc(CommitReq { ino: h.ino, size: 10, mtime_ns: T0 });
    refused(&ns, &clock, &alice(), wcc, ErrorCode::Permission);
    // The owner of a file made read-only after opening it may still commit.
    let ro = file_of(&ns, ROOT_INO, "ro", 0o444, BOB, USERS);
    assert_eq!(as_attr(&ns, &bob(), commit_req(ro.ino, 5)).size, 5);
    // A non-root chown/chgrp and a truncate clear them as a write does.
    let k = file_of(&ns, ROOT_INO, "k", 0o6775, ALICE, STAFF);
    let k2 = as_attr(&ns, &alice(), setattr_req(k.ino, SetAttrs { gid: Some(USERS), ..Default::default() }));
    assert_eq!((k2.mode, k2.gid), (0o775, USERS));
    let t = file_of(&ns, ROOT_INO, "t", 0o4777, BOB, USERS);
    assert_eq!(
        as_attr(&ns, &alice(), setattr_req(t.ino, SetAttrs { size: Some(0), ..Default::default() })).mode,
        0o777
    );
}

fn a_size_change_through_an_open_needs_no_mode_bit_but_drops_set_id_bits<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    // ftruncate of a file created O_CREAT|O_RDWR with mode 0: the service verified the open's capability.
    let zero = file_of(&ns, ROOT_INO, "zero", 0o000, ALICE, USERS);
    let by_open = |ino: u64, size: u64| SetSizeOpenReq { ino, size, cap: Capability::none() };
    let a = ns.set_size_open(&alice(), &by_open(zero.ino, 10), None).unwrap();
    assert_eq!((a.size, a.mode), (10, 0o000));
    // Otherwise as SetAttr's size change: set-ID bits go for a caller who is not root, stay for root.
    let s = file_of(&ns, ROOT_INO, "s", 0o6777, BOB, USERS);
    assert_eq!(ns.set_size_open(&Cred::root(), &by_open(s.ino, 1), None).unwrap().mode, 0o6777);
    assert_eq!(ns.set_size_open(&alice(), &by_open(s.ino, 2), None).unwrap().mode, 0o777);
    let d = dir_of(&ns, ROOT_INO, "d", 0o777, ALICE, USERS);
    assert_eq!(code(ns.set_size_open(&alice(), &by_open(d.ino, 0), None)), ErrorCode::IsDir);
    // Never served as a plain request: only the service, which checks the capability, calls it.
    refused(&ns, &clock, &alice(), Request::SetSizeOpen(by_open(zero.ino, 0)), ErrorCode::BadRequest);
}

fn hard_links_to_files_one_may_not_write_are_refused<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let tmp = dir_of(&ns, ROOT_INO, "tmp", 0o1777, 0, 0);
    let ro = file_of(&ns, ROOT_INO, "ro", 0o644, BOB, USERS);
    let suid = file_of(&ns, ROOT_INO, "suid", 0o4777, BOB, USERS);
    let rw = file_of(&ns, ROOT_INO, "rw", 0o666, BOB, USERS);
    for ino in [ro.ino, suid.ino] {
        let req = Request::Link(LinkReq { ino, new_parent: tmp.ino, new_name: "l".into() });
        refused(&ns, &clock, &alice(), req, ErrorCode::NotPermitted);
    }
    let l = as_attr(&ns, &alice(), Request::Link(LinkReq { ino: rw.ino, new_parent: tmp.ino, new_name: "l".into() }));
    assert_eq!(l.nlink, 2);
}

fn layout_policy_and_server_registration_are_privileged<S: TestStore>() {
    let (ns, clock) = ns_of::<S>();
    let d = dir_of(&ns, ROOT_INO, "d", 0o777, BOB, USERS);
    let layout = Layout {
        stripe_unit: 1 << 16,
        stripe_count: 1,
        servers: vec![],
        redundancy: weft_proto::DataRedundancy::Plain,
        generation: 0,
    };
    let req = Request::SetLayout(SetLayoutReq { ino: d.ino, layout });
    refused(&ns, &clock, &alice(), req.clone(), ErrorCode::NotPermitted);
    assert_eq!(as_attr(&ns, &bob(), req).layout.unwrap().stripe_count, 1);
    let space = SpaceStat { bytes_total: 1, bytes_free: 1, objects: 0 };
    let reg = Request::RegisterServer(RegisterServerReq { id: 99, addr: "evil:1".into(), space });
    refused(&ns, &clock, &alice(), reg, ErrorCode::NotPermitted);
}

fn root_may_do_everything<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let root = Cred::root();
    let b = dir_of(&ns, ROOT_INO, "b", 0o1000, BOB, USERS);
    let f = file_of(&ns, b.ino, "f", 0o6000, BOB, USERS);
    assert_eq!(as_attr(&ns, &root, Request::Lookup(LookupReq { parent: b.ino, name: "f".into() })), f);
    assert!(ns.execute_as(&root, &Request::Readdir(readdir_req(b.ino))).is_ok());
    assert!(ns.execute_as(&root, &Request::ReaddirPlus(readdir_req(b.ino))).is_ok());
    as_attr(&ns, &root, create_req(b.ino, "g"));
    as_attr(&ns, &root, mkdir_req(b.ino, "sub"));
    as_attr(&ns, &root, mknod_req(b.ino, "tty", FileKind::CharDev));
    as_attr(&ns, &root, Request::Link(LinkReq { ino: f.ino, new_parent: b.ino, new_name: "l".into() }));
    as_unit(&ns, &root, rename_req(b.ino, "sub", ROOT_INO, "sub", 0));
    let c = as_attr(&ns, &root, commit_req(f.ino, 4));
    assert_eq!(c.mode, 0o6000, "root's writes keep set-ID bits");
    let all = SetAttrs {
        mode: Some(0o4700),
        uid: Some(ALICE),
        gid: Some(WHEEL),
        size: Some(1),
        atime: Some(TimeSet::AtNs(3)),
        mtime: Some(TimeSet::AtNs(3)),
    };
    let s = as_attr(&ns, &root, setattr_req(f.ino, all));
    assert_eq!((s.mode, s.uid, s.gid, s.size, s.mtime_ns), (0o4700, ALICE, WHEEL, 1, 3));
    as_unit(&ns, &root, Request::Unlink(name_req(b.ino, "f")));
    as_unit(&ns, &root, Request::Unlink(name_req(b.ino, "l")));
    let layout = Layout {
        stripe_unit: 1 << 16,
        stripe_count: 1,
        servers: vec![],
        redundancy: weft_proto::DataRedundancy::Plain,
        generation: 0,
    };
    as_attr(&ns, &root, Request::SetLayout(SetLayoutReq { ino: b.ino, layout }));
    // `execute` is `execute_as(root)`.
    assert_eq!(ns.execute(&create_req(b.ino, "h")).map(|_| ()), Ok(()));
    assert_eq!(getattr(&ns, lookup(&ns, b.ino, "h").unwrap().ino).unwrap().uid, 0, "root's file is root's");
}

/// `Open` (the check behind a capability): read needs R, write W, both both; directories and special files have no
/// data to open. This is what takes write away from the data servers after a chmod: no new write capability.
fn open_checks_the_callers_access_for_the_rights_asked<S: TestStore>() {
    use weft_proto::Rights;
    let (ns, _clock) = ns_of::<S>();
    let f = file_of(&ns, ROOT_INO, "f", 0o640, BOB, USERS);
    assert_eq!(ns.open(&bob(), f.ino, Rights::READ_WRITE).unwrap(), Attr { data_version: f.data_version + 1, ..f });
    assert!(ns.open(&alice(), f.ino, Rights::READ).is_ok(), "group read");
    assert_eq!(code(ns.open(&alice(), f.ino, Rights::WRITE)), ErrorCode::Permission);
    assert_eq!(code(ns.open(&alice(), f.ino, Rights::READ_WRITE)), ErrorCode::Permission);
    // chmod a-w: the owner no longer gets a write capability; root still does.
    setattr(&ns, f.ino, SetAttrs { mode: Some(0o444), ..Default::default() }).unwrap();
    assert_eq!(code(ns.open(&bob(), f.ino, Rights::WRITE)), ErrorCode::Permission);
    assert!(ns.open(&bob(), f.ino, Rights::READ).is_ok());
    assert!(ns.open(&Cred::root(), f.ino, Rights::READ_WRITE).is_ok());
    // A renewal of a proven open: the owner keeps writing (knfsd's owner override); others are checked.
    assert!(ns.renew_open(&bob(), f.ino, Rights::READ_WRITE, true).is_ok());
    assert_eq!(code(ns.renew_open(&bob(), f.ino, Rights::WRITE, false)), ErrorCode::Permission, "unproven");
    assert_eq!(code(ns.renew_open(&alice(), f.ino, Rights::WRITE, true)), ErrorCode::Permission, "not the owner");
    assert_eq!(code(ns.open(&bob(), f.ino, Rights::NONE)), ErrorCode::Invalid);
    let d = dir_of(&ns, ROOT_INO, "d", 0o755, BOB, USERS);
    assert_eq!(code(ns.open(&bob(), d.ino, Rights::READ)), ErrorCode::IsDir);
    let p = attr(ns.execute(&mknod_req(ROOT_INO, "p", FileKind::Fifo))).unwrap();
    assert_eq!(code(ns.open(&Cred::root(), p.ino, Rights::READ)), ErrorCode::Invalid);
    assert_eq!(code(ns.open(&bob(), 999_999, Rights::READ)), ErrorCode::NotFound);
}

/// `CreateOpen` in one change: a file it makes is its creator's to write whatever its mode (open(2) with `O_CREAT`,
/// no second version); a file it finds is checked for read and write and takes a new data version, once per call.
fn create_open_makes_or_opens_a_file_in_one_change<S: TestStore>() {
    let (ns, _clock) = ns_of::<S>();
    let d = dir_of(&ns, ROOT_INO, "d", 0o777, BOB, USERS);
    let req = |name: &str, mode: u32, exclusive: bool| CreateReq { parent: d.ino, name: name.into(), mode, exclusive };
    let ro = ns.create_open(&bob(), &req("ro", 0o100444, false), None).unwrap();
    assert_eq!((ro.uid, ro.mode & 0o7777, ro.data_version), (BOB, 0o444, 1), "made, writable by its creator");
    assert_eq!(getattr(&ns, ro.ino).unwrap(), ro);
    assert_eq!(code(ns.create_open(&bob(), &req("ro", 0o100644, false), None)), ErrorCode::Permission);
    assert_eq!(code(ns.create_open(&bob(), &req("ro", 0o100644, true), None)), ErrorCode::Exists);
    let f = ns.create_open(&bob(), &req("f", 0o100644, true), None).unwrap();
    let again = ns.create_open(&bob(), &req("f", 0o100644, false), None).unwrap();
    assert_eq!(again, Attr { data_version: f.data_version + 1, ..f }, "found and opened for writing");
    assert_eq!(code(ns.create_open(&alice(), &req("f", 0o100644, false), None)), ErrorCode::Permission);
    assert_eq!(getattr(&ns, f.ino).unwrap().data_version, f.data_version + 1, "a refused open takes no version");
    dir_of(&ns, d.ino, "sub", 0o755, BOB, USERS);
    assert_eq!(code(ns.create_open(&bob(), &req("sub", 0o100644, false), None)), ErrorCode::IsDir);
    // Retried with its once block: the first reply, one new version.
    let once = OnceCall { uid: BOB, ..once_call(7) };
    let first = ns.create_open(&bob(), &req("f", 0o100644, false), Some(&once)).unwrap();
    assert_eq!(ns.create_open(&bob(), &req("f", 0o100644, false), Some(&once)).unwrap(), first);
    assert_eq!(getattr(&ns, f.ino).unwrap().data_version, f.data_version + 2);
}

/// The data version (docs/format.md §8, §12): a file's bytes get a new version at every open for writing, commit
/// and size change, in the same transaction; reads, opens for reading and attribute-only changes keep it. A
/// refused open takes none. It survives a restart of the store.
#[test]
fn the_data_version_advances_at_write_opens_commits_and_size_changes() {
    use weft_proto::Rights;
    let dir = TempDir::new("data-version");
    let clock = Arc::new(ManualClock::new(T0));
    let ns = redb_ns(&dir, clock.clone());
    register(&ns, 10, "ds10:7000", 1000);
    let f = file_of(&ns, ROOT_INO, "f", 0o640, BOB, USERS);
    let v = |ns: &Ns<RedbStore>| getattr(ns, f.ino).unwrap().data_version;
    assert_eq!(attr(ns.execute(&create_req(ROOT_INO, "g"))).unwrap().data_version, 1, "a new file is version 1");
    let v0 = v(&ns);
    assert_eq!(v0, 1, "chown and chmod at creation keep it");
    // Reading changes nothing.
    assert_eq!(ns.open(&bob(), f.ino, Rights::READ).unwrap().data_version, v0);
    assert_eq!(v(&ns), v0);
    // An open for writing: a new version, answered and stored.
    assert_eq!(ns.open(&bob(), f.ino, Rights::WRITE).unwrap().data_version, v0 + 1);
    assert_eq!(ns.open(&bob(), f.ino, Rights::READ_WRITE).unwrap().data_version, v0 + 2);
    assert_eq!(v(&ns), v0 + 2);
    // A refused one takes none.
    assert_eq!(code(ns.open(&alice(), f.ino, Rights::WRITE)), ErrorCode::Permission);
    assert_eq!(v(&ns), v0 + 2);
    // A commit, even of the same size and mtime (a rewrite in place in the same second).
    let commit = CommitReq { ino: f.ino, size: 0, mtime_ns: 0 };
    assert_eq!(as_attr(&ns, &bob(), Request::Commit(commit.clone())).data_version, v0 + 3);
    let wcc = ns.execute_as(&bob(), &Request::CommitWcc(commit)).unwrap();
    let Response::CommitWcc(w) = wcc else { panic!("{wcc:?}") };
    assert_eq!(w.attr.data_version, v0 + 4);
    // A size change does; a setattr of the same size, a chmod or a utimes does not.
    assert_eq!(setattr(&ns, f.ino, SetAttrs { size: Some(10), ..Default::default() }).unwrap().data_version, v0 + 5);
    assert_eq!(setattr(&ns, f.ino, SetAttrs { size: Some(10), ..Default::default() }).unwrap().data_version, v0 + 5);
    let chmod = SetAttrs { mode: Some(0o600), mtime: Some(TimeSet::Now), ..Default::default() };
    assert_eq!(setattr(&ns, f.ino, chmod).unwrap().data_version, v0 + 5);
    // Lookups and readdirplus carry it too; directories have none.
    assert_eq!(lookup(&ns, ROOT_INO, "f").unwrap().data_version, v0 + 5);
    assert_eq!(getattr(&ns, ROOT_INO).unwrap().data_version, 0);
    // Stored: a restart reads it back.
    drop(ns);
    let ns = redb_ns(&dir, clock);
    assert_eq!(v(&ns), v0 + 5);
}

/// Membership (docs/format.md §19) over a real store, the clock driven by the test.
mod membership {
    use super::*;
    use weft_proto::DataRedundancy;

    const REBUILD_MS: u64 = 60_000;

    fn ec_policy<S: MetaStore>(ns: &Ns<S>, ino: u64) {
        let layout = Layout {
            stripe_unit: 4096,
            stripe_count: 3,
            servers: vec![],
            redundancy: DataRedundancy::Ec { k: 2, m: 1 },
            generation: 0,
        };
        attr(ns.execute(&Request::SetLayout(SetLayoutReq { ino, layout }))).unwrap();
    }

    fn state_of<S: MetaStore>(ns: &Ns<S>, id: u32) -> ServerState {
        ns.servers().into_iter().find(|s| s.id == id).unwrap().state
    }

    /// Keeps every server but `silent` heard while the clock moves `ms` forward in steps below the liveness window.
    fn pass_time<S: MetaStore>(ns: &Ns<S>, clock: &ManualClock, ms: u64, ids: &[u32], silent: u32) {
        let mut left = ms;
        while left > 0 {
            let step = left.min(1000);
            clock.advance_ms(step);
            left -= step;
            for id in ids.iter().filter(|&&i| i != silent) {
                register(ns, *id, &format!("ds{id}:7000"), 1000);
            }
        }
    }

    #[test]
    fn a_failed_server_is_replaced_in_redundant_layouts_then_drained_when_it_returns() {
        let dir = TempDir::new("membership");
        let clock = Arc::new(ManualClock::new(T0));
        let ns = redb_ns(&dir, clock.clone()).with_rebuild_after_ms(REBUILD_MS);
        let ids = [10, 20, 30, 40];
        for id in ids {
            register(&ns, id, &format!("ds{id}:7000"), 1000);
        }
        let plain_dir = mkdir(&ns, ROOT_INO, "plain").unwrap();
        ec_policy(&ns, ROOT_INO);
        let files: Vec<Attr> = (0..8).map(|i| create(&ns, ROOT_INO, &format!("f{i}")).unwrap()).collect();
        let plains: Vec<Attr> = (0..4).map(|i| create(&ns, plain_dir.ino, &format!("p{i}")).unwrap()).collect();
        let names_20 = |a: &Attr| a.layout.as_ref().unwrap().servers.contains(&20);
        assert!(files.iter().filter(|a| names_20(a)).count() >= 2, "ec files on 20 to move");
        assert!(plains.iter().any(names_20), "a plain file on 20");

        // Silent for less than rebuild_after_ms: down, not failed, nothing moves.
        pass_time(&ns, &clock, REBUILD_MS, &ids, 20);
        assert_eq!(state_of(&ns, 20), ServerState::Down);
        ns.membership_tick(3).unwrap();
        assert_eq!(state_of(&ns, 20), ServerState::Down);
        assert!(files.iter().all(|a| getattr(&ns, a.ino).unwrap().layout == a.layout));

        // Past it: failed; the scan (3 inodes per tick) moves every ec slot of 20 to a spare.
        pass_time(&ns, &clock, 1, &ids, 20);
        ns.membership_tick(3).unwrap();
        assert_eq!(state_of(&ns, 20), ServerState::Failed);
        let mut ticks = 1;
        while state_of(&ns, 20) == ServerState::Failed {
            ns.membership_tick(3).unwrap();
            ticks += 1;
            assert!(ticks < 20, "the scan ends");
        }
        assert_eq!(state_of(&ns, 20), ServerState::Replaced);
        assert!(ticks > 2, "bounded batches: the scan took several ticks ({ticks})");
        for a in &files {
            let now = getattr(&ns, a.ino).unwrap().layout.unwrap();
            let before = a.layout.clone().unwrap();
            if before.servers.contains(&20) {
                assert!(!now.servers.contains(&20), "inode {}: {now:?}", a.ino);
                assert_eq!(now.generation, 1);
                let slot = before.servers.iter().position(|&s| s == 20).unwrap();
                let mut expect = before.servers.clone();
                expect[slot] = now.servers[slot];
                assert_eq!(now.servers, expect, "only the failed slot moved");
                assert!(!before.servers.contains(&now.servers[slot]), "the spare was not in the layout");
            } else {
                assert_eq!(now, before, "a layout without the failed server is untouched");
            }
        }
        // Plain files keep their layout: their bytes exist once.
        for p in &plains {
            assert_eq!(getattr(&ns, p.ino).unwrap().layout, p.layout);
        }
        let st = ns.member_status();
        assert_eq!((st.layouts_pending, st.layouts_changed), (0, files.iter().filter(|a| names_20(a)).count() as u64));
        assert_eq!(st.rebuild_bytes_left, None);
        // No new file lands on a replaced server.
        let g = create(&ns, ROOT_INO, "new").unwrap();
        assert!(!names_20(&g));
        // The phase survives an MDS restart (format §6 `server_phases`): reopened, 20 is still replaced, so its
        // return below drains it instead of taking it back as a member that serves.
        drop(ns);
        let ns = redb_ns(&dir, clock.clone()).with_rebuild_after_ms(REBUILD_MS);
        assert_eq!(state_of(&ns, 20), ServerState::Replaced);

        // It returns: drained of what it no longer owns, then a spare. Its heartbeat's reply says Draining, so it
        // serves no client until then (its lease, weft-data/src/lease.rs).
        let heartbeat = |ns: &Ns<_>| {
            let space = weft_proto::SpaceStatDev {
                space: SpaceStat { bytes_total: 1000, bytes_free: 1000, objects: 0 },
                device: weft_proto::DeviceId::default(),
            };
            let req = RegisterServerDevReq { id: 20, addr: "ds20:7000".into(), space };
            match ns.execute(&Request::RegisterServerDev(req)) {
                Ok(Response::RegisterServerDev(r)) => r,
                other => panic!("{other:?}"),
            }
        };
        let reply = heartbeat(&ns);
        assert_eq!((reply.state, reply.rebuild_after_ms), (ServerState::Draining, REBUILD_MS));
        assert_eq!(state_of(&ns, 20), ServerState::Draining);
        assert_eq!(ns.draining_servers(), vec![(20, "ds20:7000".to_string())]);
        for a in files.iter().filter(|a| names_20(a)) {
            assert!(!ns.object_owned(a.ino, 20).unwrap());
        }
        for p in plains.iter().filter(|a| names_20(a)) {
            assert!(ns.object_owned(p.ino, 20).unwrap(), "a plain file still on 20 keeps its object");
        }
        assert!(!ns.object_owned(999_999, 20).unwrap(), "no such inode: not owned");
        ns.drained(20);
        assert_eq!(state_of(&ns, 20), ServerState::Spare);
        assert_eq!(heartbeat(&ns).state, ServerState::Spare, "a spare serves again");
        assert!(ns.draining_servers().is_empty());
        // The generation survives a reopen of the store (inode record version 5).
        drop(ns);
        let ns = redb_ns(&dir, clock.clone()).with_rebuild_after_ms(REBUILD_MS);
        let moved = files.iter().find(|a| names_20(a)).unwrap();
        assert_eq!(getattr(&ns, moved.ino).unwrap().layout.unwrap().generation, 1);
        assert_eq!(heartbeat(&ns).state, ServerState::Spare, "the spare phase survives a restart too");
    }

    fn without_a_spare_the_file_stays_degraded_and_the_server_failed<S: TestStore>() {
        let clock = Arc::new(ManualClock::new(T0));
        let ns =
            Namespace::new(S::fresh(), clock.clone(), DEFAULT_LIVENESS_MS).unwrap().with_rebuild_after_ms(REBUILD_MS);
        let ids = [10, 20, 30];
        for id in ids {
            register(&ns, id, &format!("ds{id}:7000"), 1000);
        }
        ec_policy(&ns, ROOT_INO);
        let f = create(&ns, ROOT_INO, "f").unwrap();
        pass_time(&ns, &clock, REBUILD_MS + 1, &ids, 20);
        for _ in 0..3 {
            ns.membership_tick(16).unwrap();
        }
        assert_eq!(state_of(&ns, 20), ServerState::Failed, "not replaced: a layout still names it");
        assert_eq!(getattr(&ns, f.ino).unwrap().layout, f.layout, "unchanged, degraded");
        assert_eq!(ns.member_status().layouts_pending, 1);
        // A server returning while failed is drained (some layouts may have moved), never replaced after that.
        register(&ns, 20, "ds20:7000", 1000);
        assert_eq!(state_of(&ns, 20), ServerState::Draining);
        assert!(ns.object_owned(f.ino, 20).unwrap());
    }

    fn a_move_that_would_overflow_the_stale_table_waits_for_room<S: TestStore>() {
        use weft_proto::msg::{ClearStaleReq, ListStaleReq, MarkStaleReq};
        let clock = Arc::new(ManualClock::new(T0));
        let ns = Namespace::new(S::fresh(), clock.clone(), DEFAULT_LIVENESS_MS)
            .unwrap()
            .with_rebuild_after_ms(REBUILD_MS)
            .with_stale_limits(64, 1);
        let ids = [10, 20, 30, 40];
        for id in ids {
            register(&ns, id, &format!("ds{id}:7000"), 1000);
        }
        ec_policy(&ns, ROOT_INO);
        // Files until one is on 20 (the earlier ones are not, so only this one has a slot to move).
        let f = (0..32)
            .map(|i| create(&ns, ROOT_INO, &format!("f{i}")).unwrap())
            .find(|a| a.layout.as_ref().unwrap().servers.contains(&20))
            .expect("a file placed on server 20");
        let layout = f.layout.clone().unwrap();
        let slot_20 = layout.servers.iter().position(|&s| s == 20).unwrap() as u32;
        let other = (slot_20 + 1) % layout.stripe_count;
        // The one entry the table may hold: another slot of the same file.
        let filler = MarkStaleReq { ino: f.ino, slot: other, start: 0, end: 1 };
        let r = ns.mark_stale(&crate::perm::Cred::root(), true, &filler).unwrap();

        pass_time(&ns, &clock, REBUILD_MS + 1, &ids, 20);
        for _ in 0..3 {
            ns.membership_tick(16).unwrap();
        }
        assert_eq!(getattr(&ns, f.ino).unwrap().layout.unwrap(), layout, "no room for the spare's stale entry");
        assert_eq!(state_of(&ns, 20), ServerState::Failed);
        assert_eq!(ns.member_status().layouts_pending, 1);
        let listed = ns.list_stale(&ListStaleReq { ino: None, after: None, limit: 0 }).unwrap();
        assert_eq!((listed.total_entries, listed.entries[0].slot), (1, other), "the table stayed within its bound");

        // Room again: the next pass moves the slot and records it stale whole.
        let clear = ClearStaleReq { ino: f.ino, slot: other, start: 0, end: 1, seq: r.seq };
        assert!(ns.clear_stale(true, &clear).unwrap());
        for _ in 0..3 {
            ns.membership_tick(16).unwrap();
        }
        let now = getattr(&ns, f.ino).unwrap().layout.unwrap();
        assert!(!now.servers.contains(&20) && now.generation == 1, "{now:?}");
        let listed = ns.list_stale(&ListStaleReq { ino: None, after: None, limit: 0 }).unwrap();
        assert_eq!(listed.total_entries, 1);
        let e = &listed.entries[0];
        assert_eq!((e.ino, e.slot, e.ranges[0].start, e.ranges[0].end), (f.ino, slot_20, 0, crate::stale::WHOLE));
    }

    fn a_server_back_before_rebuild_after_ms_is_simply_up<S: TestStore>() {
        let (ns, clock) = ns_of::<S>();
        let ns = ns.with_rebuild_after_ms(REBUILD_MS);
        pass_time(&ns, &clock, REBUILD_MS - 1000, &[10, 20, 30], 20);
        ns.membership_tick(16).unwrap();
        assert_eq!(state_of(&ns, 20), ServerState::Down);
        register(&ns, 20, "ds20:7000", 1000);
        ns.membership_tick(16).unwrap();
        assert_eq!(state_of(&ns, 20), ServerState::Up);
    }

    on_every_store!(
        without_a_spare_the_file_stays_degraded_and_the_server_failed,
        a_move_that_would_overflow_the_stale_table_waits_for_room,
        a_server_back_before_rebuild_after_ms_is_simply_up
    );
}

/// Op 140 records a data server's NFS addresses (in memory, across heartbeats, dropped when it moves) and op 138
/// lists them; bad addresses, unknown servers and non-root callers are refused (docs/format.md §23).
fn pnfs_addresses_are_registered_and_listed<S: TestStore>() {
    use weft_proto::msg::{PnfsDeviceInfo, RegisterPnfsReq};
    let (ns, _) = ns_of::<S>();
    let devices = |ns: &Ns<_>| match ns.execute(&Request::PnfsDevices(())).unwrap() {
        Response::PnfsDevices(d) => d,
        other => panic!("{other:?}"),
    };
    let announce = |id: u32, addrs: &[&str]| {
        ns.execute(&Request::RegisterPnfs(RegisterPnfsReq { id, addrs: addrs.iter().map(|a| a.to_string()).collect() }))
    };
    assert!(devices(&ns).is_empty(), "nobody announced NFS yet");
    assert_eq!(announce(20, &["127.0.0.1:2049", "[::1]:2049"]), Ok(Response::RegisterPnfs(())));
    assert_eq!(announce(10, &["10.0.2.2:4000"]), Ok(Response::RegisterPnfs(())));
    let want = vec![
        PnfsDeviceInfo { server: 10, addrs: vec!["10.0.2.2:4000".into()] },
        PnfsDeviceInfo { server: 20, addrs: vec!["127.0.0.1:2049".into(), "[::1]:2049".into()] },
    ];
    assert_eq!(devices(&ns), want);
    assert_eq!(code(announce(20, &["host:2049"])), ErrorCode::Invalid, "not ip:port");
    assert_eq!(code(announce(20, &["rdma:host:20049"])), ErrorCode::Invalid, "rdma: then not ip:port");
    assert_eq!(code(announce(20, &["tcp:127.0.0.1:2049"])), ErrorCode::Invalid, "no netid prefix but rdma:");
    assert_eq!(code(announce(20, &vec!["127.0.0.1:1"; 17])), ErrorCode::Invalid, "too many");
    assert_eq!(code(announce(99, &["127.0.0.1:1"])), ErrorCode::NotFound, "not registered");
    let alice = Cred::new(1000, 1000, vec![]);
    let req = Request::RegisterPnfs(RegisterPnfsReq { id: 10, addrs: vec![] });
    assert_eq!(code(ns.execute_as(&alice, &req)), ErrorCode::NotPermitted);
    assert_eq!(devices(&ns), want, "refusals changed nothing");
    // A heartbeat keeps them; a move to another address forgets them until announced again.
    register(&ns, 10, "ds10:7000", 1000);
    assert_eq!(devices(&ns), want);
    register(&ns, 10, "ds10-moved:7000", 1000);
    assert_eq!(devices(&ns), want[1..].to_vec());
    // RPC-over-RDMA addresses ride in the same list, prefixed (the netid GETDEVICEINFO gives them).
    assert_eq!(announce(20, &["127.0.0.1:2049", "rdma:10.0.2.15:20049"]), Ok(Response::RegisterPnfs(())));
    assert_eq!(devices(&ns)[0].addrs, vec!["127.0.0.1:2049".to_string(), "rdma:10.0.2.15:20049".to_string()]);
    // An empty list withdraws them.
    assert_eq!(announce(20, &[]), Ok(Response::RegisterPnfs(())));
    assert!(devices(&ns).is_empty());
}

/// The sole name (docs/format.md §6) the cache bank's entries rely on: set at creation, moved by rename (a
/// directory's always), cleared by a second link and never guessed back.
fn an_inode_knows_its_sole_name_until_it_has_two<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let sole = |ino: u64| ns.store().read(|t| t.get_inode(ino)).unwrap().unwrap().sole_name;
    let d = mkdir(&ns, ROOT_INO, "d").unwrap();
    let e = mkdir(&ns, ROOT_INO, "e").unwrap();
    let f = create(&ns, d.ino, "f").unwrap();
    let s = symlink(&ns, d.ino, "s", "f").unwrap();
    assert_eq!(sole(d.ino), Some((ROOT_INO, "d".into())));
    assert_eq!(sole(f.ino), Some((d.ino, "f".into())));
    assert_eq!(sole(s.ino), Some((d.ino, "s".into())));
    assert_eq!(sole(ROOT_INO), None);
    rename(&ns, d.ino, "f", e.ino, "g").unwrap();
    assert_eq!(sole(f.ino), Some((e.ino, "g".into())));
    rename(&ns, ROOT_INO, "d", e.ino, "d2").unwrap();
    assert_eq!(sole(d.ino), Some((e.ino, "d2".into())));
    // An exchange swaps the names.
    rename_f(&ns, e.ino, "g", e.ino, "d2", RENAME_EXCHANGE).unwrap();
    assert_eq!((sole(f.ino), sole(d.ino)), (Some((e.ino, "d2".into())), Some((e.ino, "g".into()))));
    // A second link: no sole name, also once one of the names is gone again.
    link(&ns, f.ino, e.ino, "h").unwrap();
    assert_eq!(sole(f.ino), None);
    unlink(&ns, e.ino, "h").unwrap();
    assert_eq!(sole(f.ino), None);
    rename(&ns, e.ino, "d2", e.ino, "k").unwrap();
    assert_eq!(sole(f.ino), None, "a renamed name of a once-linked file is not known to be its only one");
    // Written to disk and read back (record version 6).
    let g = create(&ns, e.ino, "g2").unwrap();
    let stored = ns.store().read(|t| t.get_inode(g.ino)).unwrap().unwrap();
    let back = crate::store::decode_inode("g2", &crate::store::encode_inode(&stored).unwrap()).unwrap();
    assert_eq!(back.sole_name, Some((e.ino, "g2".into())));
}

/// Reaching an inode by number (what the MDS asks of confined callers, issue 31): search permission on every
/// directory from the inode's primary directory up to the root. A hard-linked file's primary directory is its
/// newest name's, followed by renames; one whose directory is not recorded is its owner's to reach.
fn reaching_an_inode_by_number_needs_search_on_its_primary_path<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let reach = |cred: &Cred, ino: u64| ns.may_reach(cred, &[ino]);
    let public = dir_of(&ns, ROOT_INO, "pub", 0o755, 0, 0);
    let private = dir_of(&ns, ROOT_INO, "priv", 0o700, ALICE, USERS);
    let sub = dir_of(&ns, private.ino, "sub", 0o755, ALICE, USERS);
    let f = file_of(&ns, sub.ino, "f", 0o644, ALICE, USERS);
    let s = symlink(&ns, private.ino, "s", "sub/f").unwrap();
    let open = file_of(&ns, public.ino, "open", 0o644, ALICE, USERS);
    for ino in [ROOT_INO, public.ino, private.ino, open.ino] {
        reach(&bob(), ino).unwrap();
    }
    for ino in [sub.ino, f.ino, s.ino] {
        let e = reach(&bob(), ino).unwrap_err();
        assert_eq!(e.code, ErrorCode::Permission, "{ino}");
        assert!(e.message.contains(&format!("inode {ino}")), "the refusal names the inode: {}", e.message);
        reach(&alice(), ino).unwrap();
        reach(&Cred::root(), ino).unwrap();
    }
    // Every directory on the way counts, not only the nearest: the root too.
    chown_to(&ns, ROOT_INO, 0o700, 0, 0);
    assert_eq!(code(reach(&bob(), open.ino)), ErrorCode::Permission);
    reach(&bob(), ROOT_INO).unwrap();
    chown_to(&ns, ROOT_INO, 0o755, 0, 0);
    // A second name in a public directory makes the file reachable; renamed into the private one, it is not.
    link(&ns, f.ino, public.ino, "f2").unwrap();
    reach(&bob(), f.ino).unwrap();
    rename(&ns, public.ino, "f2", private.ino, "f3").unwrap();
    assert_eq!(code(reach(&bob(), f.ino)), ErrorCode::Permission);
    // A missing inode is NotFound, as the request itself would be.
    assert_eq!(code(reach(&bob(), 999_999)), ErrorCode::NotFound);
    // A record without a recorded directory (links made before it was kept): the owner only.
    ns.store()
        .write(|t| {
            let mut i = t.get_inode(open.ino)?.unwrap();
            (i.sole_name, i.parent) = (None, 0);
            t.put_inode(&i)
        })
        .unwrap();
    assert_eq!(code(reach(&bob(), open.ino)), ErrorCode::Permission);
    reach(&alice(), open.ino).unwrap();
}

fn once_call(call: u64) -> OnceCall {
    OnceCall { tag: weft_proto::OnceTag { client: 0x5eed, call }, slot: 2, key_id: "cluster".into(), uid: 0 }
}

/// A change whose reply was lost with its session, retried with the same once block (format §27): answered with
/// the first reply, run once; a failed call records nothing; a stale duplicate of an older call is refused.
fn a_retried_change_is_answered_with_its_first_reply<S: TestStore>() {
    let (ns, _) = ns_of::<S>();
    let root = Cred::root();
    let create = Request::Create(CreateReq { parent: ROOT_INO, name: "f".into(), mode: 0o100644, exclusive: true });
    let first = ns.execute_once(&root, &create, Some(&once_call(1))).unwrap();
    assert_eq!(ns.execute_once(&root, &create, Some(&once_call(1))).unwrap(), first, "the retry's reply");
    assert_eq!(code(ns.execute(&create)), ErrorCode::Exists, "untagged, the same create is a second one");
    let ino = attr(Ok(first)).unwrap().ino;
    let mv = rename_req(ROOT_INO, "f", ROOT_INO, "g", 0);
    ns.execute_once(&root, &mv, Some(&once_call(2))).unwrap();
    assert_eq!(ns.execute_once(&root, &mv, Some(&once_call(2))).unwrap(), Response::Rename(()), "not ENOENT");
    assert_eq!(lookup(&ns, ROOT_INO, "g").unwrap().ino, ino);
    // Call 3 fails (no "f" now) and records nothing: once "f" exists, its retry runs and succeeds.
    assert_eq!(code(ns.execute_once(&root, &mv, Some(&once_call(3)))), ErrorCode::NotFound);
    create_x(&ns, ROOT_INO, "f", true).unwrap();
    ns.execute_once(&root, &mv, Some(&once_call(3))).unwrap();
    // Call 2 arriving after call 3 ran (an old attempt a service kept running) is refused, not run.
    assert_eq!(code(ns.execute_once(&root, &mv, Some(&once_call(2)))), ErrorCode::BadRequest);
    // Another user cannot take a call's recorded reply.
    let other = OnceCall { uid: 1000, ..once_call(3) };
    assert_eq!(code(ns.execute_once(&Cred::new(1000, 1000, vec![]), &mv, Some(&other))), ErrorCode::Permission);
}

on_every_store!(
    a_retried_change_is_answered_with_its_first_reply,
    root_is_created_on_first_open,
    names_are_validated,
    parents_must_exist_and_be_directories,
    create_sets_attributes_and_follows_existing_rules,
    create_without_servers_fails_and_allocates_nothing,
    layouts_are_assigned_round_robin_from_the_directory_policy,
    set_layout_rules,
    mkdir_and_rmdir_keep_link_counts,
    unlink_orphans_files_at_their_last_link,
    hard_links,
    symlinks,
    readdir_plus_pages_carry_each_entrys_attributes,
    commit_wcc_reports_the_attributes_it_replaced,
    special_files_are_metadata_only,
    set_group_id_directories_pass_on_their_group,
    rename_exchange_swaps_two_names_atomically,
    readdir_pages_by_name,
    readdir_limit_is_capped,
    setattr_fields,
    commit_largest_size_wins,
    rename_within_and_across_directories,
    rename_refuses_moving_a_directory_under_itself,
    rename_replacing_targets,
    rename_onto_the_same_inode_is_a_no_op,
    servers_statfs_and_liveness,
    statfs_counts_a_shared_file_system_once,
    lookup_of_dotdot_is_the_parent,
    other_services_ops_are_refused,
    failed_transactions_apply_nothing,
    redb_matches_the_other_store_on_a_scenario,
    a_private_directory_cannot_be_searched_or_listed_by_others,
    access_checks_the_mode_bits_of_one_inode,
    entries_are_added_only_with_write_and_search_on_the_directory,
    a_sticky_directory_protects_other_users_entries,
    a_directory_moving_to_another_parent_needs_write_permission_on_itself,
    chmod_chown_and_times_of_someone_elses_file_are_refused,
    the_owner_may_chgrp_to_their_own_groups_only,
    device_nodes_are_made_by_root_only,
    a_non_root_commit_clears_set_id_bits,
    a_size_change_through_an_open_needs_no_mode_bit_but_drops_set_id_bits,
    hard_links_to_files_one_may_not_write_are_refused,
    layout_policy_and_server_registration_are_privileged,
    root_may_do_everything,
    open_checks_the_callers_access_for_the_rights_asked,
    create_open_makes_or_opens_a_file_in_one_change,
    pnfs_addresses_are_registered_and_listed,
    an_inode_knows_its_sole_name_until_it_has_two,
    reaching_an_inode_by_number_needs_search_on_its_primary_path,
);

// ---- PgStore: several services on one database ------------------------------------------------------------------

/// Two namespaces over two `PgStore`s on one database: two metadata services sharing it.
fn two_services() -> (Ns<crate::PgStore>, Ns<crate::PgStore>) {
    let url = crate::pg_testing::fresh_url();
    let open = || {
        let clock = Arc::new(ManualClock::new(T0));
        let ns = Namespace::new(crate::PgStore::connect(&url).unwrap(), clock, DEFAULT_LIVENESS_MS).unwrap();
        register(&ns, 10, "ds10:7000", 1000);
        ns
    };
    (open(), open())
}

/// Runs `a` and `b` at once on two threads (released together by a barrier) and returns both results.
fn race<A: Send, B: Send>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let ta = s.spawn(|| {
            barrier.wait();
            a()
        });
        let tb = s.spawn(|| {
            barrier.wait();
            b()
        });
        (ta.join().unwrap(), tb.join().unwrap())
    })
}

/// The tree's invariants (`check.rs`): every directory reachable from the root once, its parent pointer naming the
/// directory that lists it, every link count what the tree gives, nothing unreachable: the namespace is a tree.
fn assert_tree<S: MetaStore>(ns: &Ns<S>) {
    if let Err(e) = ns.check_tree() {
        panic!("the namespace is broken: {e}");
    }
}

/// The checker can fail: each record broken by hand is found, named by what it breaks.
#[test]
fn the_tree_check_finds_each_broken_record() {
    let broken = |damage: &dyn Fn(&mut dyn MetaTxn, u64, u64, u64)| {
        let (ns, _) = ns_of::<MemStore>();
        let d = mkdir(&ns, ROOT_INO, "d").unwrap().ino;
        let e = mkdir(&ns, d, "e").unwrap().ino;
        let f = create(&ns, d, "f").unwrap().ino;
        link(&ns, f, ROOT_INO, "g").unwrap();
        assert_eq!(ns.check_tree().unwrap(), TreeCount { inodes: 4, dirs: 3, entries: 4 });
        ns.store()
            .write(|t| {
                damage(t, d, e, f);
                Ok::<_, MetaError>(())
            })
            .unwrap();
        match ns.check_tree() {
            Err(CheckError::Fault(fault)) => fault,
            other => panic!("the damage went unseen: {other:?}"),
        }
    };
    let nlink = |t: &mut dyn MetaTxn, ino: u64, n: u32| {
        let mut i = t.get_inode(ino).unwrap().unwrap();
        i.nlink = n;
        t.put_inode(&i).unwrap();
    };
    let f = broken(&|t, _, _, f| nlink(t, f, 1));
    assert!(matches!(f, TreeFault::Links { recorded: 1, counted: 2, .. }), "{f}");
    let f = broken(&|t, d, _, _| nlink(t, d, 2));
    assert!(matches!(f, TreeFault::Links { recorded: 2, counted: 3, .. }), "{f}");
    let f = broken(&|t, _, _, _| t.put_dirent(ROOT_INO, "x", 999, FileKind::File).unwrap());
    assert!(matches!(f, TreeFault::Dangling { ino: 999, .. }), "{f}");
    let f = broken(&|t, _, e, _| t.put_dirent(ROOT_INO, "e2", e, FileKind::Dir).unwrap());
    assert!(matches!(f, TreeFault::DirTwice { .. } | TreeFault::Parent { .. }), "{f}");
    let f = broken(&|t, _, _, f| t.put_dirent(ROOT_INO, "h", f, FileKind::Dir).unwrap());
    assert!(matches!(f, TreeFault::Kind { .. }), "{f}");
    let f = broken(&|t, d, e, _| {
        // e moved out of d by its entry alone: its parent pointer still says d.
        t.del_dirent(d, "e").unwrap();
        t.put_dirent(ROOT_INO, "e", e, FileKind::Dir).unwrap();
    });
    assert!(matches!(f, TreeFault::Parent { holder: ROOT_INO, .. }), "{f}");
    let f = broken(&|t, _, _, _| t.del_dirent(ROOT_INO, "d").unwrap());
    assert!(matches!(f, TreeFault::Unreachable { .. }), "{f}");
    let f = broken(&|t, d, _, _| {
        let mut i = t.get_inode(d).unwrap().unwrap();
        i.sole_name = Some((ROOT_INO, "nothing".into()));
        t.put_inode(&i).unwrap();
    });
    assert!(matches!(f, TreeFault::SoleName { .. }), "{f}");
}

#[test]
fn pg_two_services_racing_creates_of_one_name_make_exactly_one() {
    let (one, two) = two_services();
    for round in 0..20 {
        let name = format!("f{round}");
        let (a, b) = race(|| create(&one, ROOT_INO, &name), || create(&two, ROOT_INO, &name));
        let won = [&a, &b].iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "round {round}: {a:?} {b:?}");
        let lost = if a.is_ok() { b } else { a };
        assert_eq!(code(lost), ErrorCode::Exists, "round {round}");
        let d = format!("d{round}");
        let (a, b) = race(|| mkdir(&one, ROOT_INO, &d), || mkdir(&two, ROOT_INO, &d));
        assert_eq!(a.is_ok() as u32 + b.is_ok() as u32, 1, "round {round}: {a:?} {b:?}");
    }
    assert_eq!(readdir_all(&one, ROOT_INO).len(), 40);
    assert_eq!(getattr(&two, ROOT_INO).unwrap().nlink, 22);
    assert_tree(&one);
}

#[test]
fn pg_two_services_racing_renames_never_make_a_cycle() {
    let (one, two) = two_services();
    for round in 0..20 {
        // a/b and c; one service moves b into c while the other moves c into b: either alone is fine, both
        // would leave b and c each other's parent, cut off from the root.
        let top = mkdir(&one, ROOT_INO, &format!("r{round}")).unwrap().ino;
        let a = mkdir(&one, top, "a").unwrap().ino;
        let b = mkdir(&one, a, "b").unwrap().ino;
        let c = mkdir(&two, top, "c").unwrap().ino;
        let (x, y) = race(|| rename(&one, a, "b", c, "b"), || rename(&two, top, "c", b, "c"));
        assert_eq!(x.is_ok() as u32 + y.is_ok() as u32, 1, "round {round}: {x:?} {y:?}");
        let lost = if x.is_ok() { y } else { x };
        assert_eq!(code(lost), ErrorCode::Invalid, "round {round}: the loser moves a directory under itself");
    }
    assert_tree(&one);
    assert_tree(&two);
}

/// A create whose reply was lost with service one (it committed, then died) is retried on service two of the same
/// database with its once block: service two answers with service one's reply.
#[test]
fn pg_a_create_retried_on_another_service_gets_the_first_reply() {
    let (one, two) = two_services();
    let create = Request::Create(CreateReq { parent: ROOT_INO, name: "x".into(), mode: 0o100644, exclusive: true });
    let first = one.execute_once(&Cred::root(), &create, Some(&once_call(7))).unwrap();
    assert_eq!(two.execute_once(&Cred::root(), &create, Some(&once_call(7))).unwrap(), first);
    assert_eq!(code(two.execute(&create)), ErrorCode::Exists);
}

/// The rename race above made deterministic: service one's rename of b into c reads the tree, then service two
/// moves c into b and commits, then one writes. PostgreSQL refuses one's commit (it read what two changed), the
/// store runs the rename again, and the second run sees the cycle it would make.
#[test]
fn pg_a_rename_overtaken_by_a_conflicting_one_is_run_again_and_refused() {
    let (one, two) = two_services();
    let a = mkdir(&one, ROOT_INO, "a").unwrap().ino;
    let b = mkdir(&one, a, "b").unwrap().ino;
    let c = mkdir(&one, ROOT_INO, "c").unwrap().ino;
    let runs = AtomicU32::new(0);
    let b_into_c = RenameReq { src_parent: a, src_name: "b".into(), dst_parent: c, dst_name: "b".into(), flags: 0 };
    let r = one.store().write(|t| {
        if runs.fetch_add(1, Ordering::SeqCst) == 0 {
            // Takes this transaction's snapshot before the other service's rename commits.
            assert_eq!(t.get_inode(c)?.map(|i| i.parent), Some(ROOT_INO));
            rename(&two, ROOT_INO, "c", b, "c").unwrap();
        }
        super::rename(t, &Cred::root(), &b_into_c, T0)
    });
    assert_eq!(runs.load(Ordering::SeqCst), 2, "run again after the conflict");
    assert_eq!(code(r), ErrorCode::Invalid, "the second run sees the cycle");
    assert_eq!(lookup(&one, b, "c").unwrap().ino, c);
    assert_tree(&one);
}

/// A store whose next `lost` writes lose their commit's outcome (`MetaError::CommitUnknown`, as PostgreSQL's
/// connection dying during `COMMIT`): with `applied`, after applying the write (the commit made it), else without.
struct CommitLost {
    inner: MemStore,
    applied: bool,
    lost: AtomicU32,
}

impl MetaStore for CommitLost {
    fn write<R, E: From<MetaError>>(&self, f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        let lose = self.lost.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if !lose {
            return self.inner.write(f);
        }
        if self.applied {
            self.inner.write(f)?;
        }
        Err(MetaError::CommitUnknown("the connection died during COMMIT (test)".into()).into())
    }

    fn read<R, E: From<MetaError>>(&self, f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        self.inner.read(f)
    }
}

/// A tagged create whose commit outcome was lost is settled by its once record: applied, its recorded reply is the
/// answer (not EEXIST); not applied, it runs again. Either way it is applied once. An untagged change cannot tell,
/// and fails.
#[test]
fn a_lost_commit_outcome_is_settled_by_the_once_record() {
    for applied in [true, false] {
        let store = CommitLost { inner: MemStore::new(), applied, lost: AtomicU32::new(0) };
        let ns = Namespace::new(store, Arc::new(ManualClock::new(T0)), DEFAULT_LIVENESS_MS).unwrap();
        register(&ns, 10, "ds10:7000", 1000);
        let create = Request::Create(CreateReq { parent: ROOT_INO, name: "f".into(), mode: 0o100644, exclusive: true });
        ns.store().lost.store(1, Ordering::SeqCst);
        let made = ns.execute_once(&Cred::root(), &create, Some(&once_call(1)));
        let made = attr(made).unwrap_or_else(|e| panic!("applied={applied}: {e:?}"));
        assert_eq!(lookup(&ns, ROOT_INO, "f").unwrap().ino, made.ino, "applied={applied}");
        let names = readdir_all(&ns, ROOT_INO);
        assert_eq!(names.iter().filter(|n| n.as_str() == "f").count(), 1, "applied={applied}: made once");
        ns.store().lost.store(1, Ordering::SeqCst);
        let untagged = Request::Mkdir(MkdirReq { parent: ROOT_INO, name: "d".into(), mode: 0o40755 });
        assert_eq!(code(ns.execute(&untagged)), ErrorCode::Io, "applied={applied}");
    }
}

mod exerciser;
