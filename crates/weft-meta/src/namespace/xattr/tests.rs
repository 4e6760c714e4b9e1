//! Extended attributes and ACLs through `Namespace::execute_as`: limits, flags, namespaces, errors, ACL and mode
//! coherence, inheritance, ACL-aware permission checks, removal with the inode, persistence over `RedbStore`;
//! each on `MemStore` and `PgStore` (`on_every_store!`).

use std::sync::Arc;

use weft_proto::msg::{
    CreateReq, InoReq, MkdirReq, NameReq, RegisterServerReq, SetAttrReq, SymlinkReq, XATTR_CREATE, XATTR_REPLACE,
    XattrReq,
};
use weft_proto::{Attr, ErrorCode, ROOT_INO, Request, Response, SetAttrs, SpaceStat, WireError, mode_with_umask};

use crate::acl::{ACCESS_XATTR, ACL_UNDEFINED_ID, Acl, DEFAULT_XATTR, Entry, Tag};
use crate::namespace::{DEFAULT_LIVENESS_MS, Namespace};
use crate::perm::Cred;
use crate::store::MetaStore;
use crate::test_stores::{TestStore, on_every_store};
use crate::{ManualClock, RedbStore};

const ALICE: u32 = 1000;
const BOB: u32 = 1001;
const CAROL: u32 = 1002;
const USERS: u32 = 100;
const STAFF: u32 = 50;

type Ns<S> = Namespace<S, Arc<ManualClock>>;

fn alice() -> Cred {
    Cred::new(ALICE, USERS, vec![])
}
fn bob() -> Cred {
    Cred::new(BOB, USERS, vec![])
}
fn carol() -> Cred {
    Cred::new(CAROL, 7, vec![STAFF])
}
fn root() -> Cred {
    Cred::root()
}

fn ns_on<S: MetaStore>(store: S) -> Ns<S> {
    let ns = Namespace::new(store, Arc::new(ManualClock::new(1)), DEFAULT_LIVENESS_MS).unwrap();
    let space = SpaceStat { bytes_total: 1, bytes_free: 1, objects: 0 };
    ns.execute(&Request::RegisterServer(RegisterServerReq { id: 1, addr: "ds:1".into(), space })).unwrap();
    ns
}

fn code<T: std::fmt::Debug>(r: Result<T, WireError>) -> ErrorCode {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.code,
    }
}

fn attr(r: Response) -> Attr {
    match r {
        Response::Create(a) | Response::Mkdir(a) | Response::GetAttr(a) | Response::SetAttr(a) => a,
        Response::Symlink(a) => a,
        other => panic!("no attributes in {other:?}"),
    }
}

fn create<S: MetaStore>(ns: &Ns<S>, cred: &Cred, parent: u64, name: &str, mode: u32) -> Attr {
    let r = CreateReq { parent, name: name.into(), mode, exclusive: true };
    attr(ns.execute_as(cred, &Request::Create(r)).unwrap())
}

fn mkdir<S: MetaStore>(ns: &Ns<S>, cred: &Cred, parent: u64, name: &str, mode: u32) -> Attr {
    attr(ns.execute_as(cred, &Request::Mkdir(MkdirReq { parent, name: name.into(), mode })).unwrap())
}

fn getattr<S: MetaStore>(ns: &Ns<S>, ino: u64) -> Attr {
    attr(ns.execute(&Request::GetAttr(InoReq { ino })).unwrap())
}

fn chmod<S: MetaStore>(ns: &Ns<S>, cred: &Cred, ino: u64, mode: u32) -> Result<Response, WireError> {
    ns.execute_as(
        cred,
        &Request::SetAttr(SetAttrReq { ino, set: SetAttrs { mode: Some(mode), ..SetAttrs::default() } }),
    )
}

fn get<S: MetaStore>(ns: &Ns<S>, cred: &Cred, ino: u64, name: &str) -> Result<Vec<u8>, WireError> {
    match ns.execute_as(cred, &Request::GetXattr(XattrReq { ino, name: name.into() }))? {
        Response::GetXattr(v) => Ok(v),
        other => panic!("{other:?}"),
    }
}

fn set<S: MetaStore>(ns: &Ns<S>, cred: &Cred, ino: u64, name: &str, value: &[u8], flags: u32) -> Result<(), WireError> {
    let r = weft_proto::msg::SetXattrReq { ino, name: name.into(), value: value.to_vec(), flags };
    ns.execute_as(cred, &Request::SetXattr(r)).map(|_| ())
}

fn list<S: MetaStore>(ns: &Ns<S>, cred: &Cred, ino: u64) -> Vec<String> {
    match ns.execute_as(cred, &Request::ListXattr(InoReq { ino })).unwrap() {
        Response::ListXattr(v) => v,
        other => panic!("{other:?}"),
    }
}

fn remove<S: MetaStore>(ns: &Ns<S>, cred: &Cred, ino: u64, name: &str) -> Result<(), WireError> {
    ns.execute_as(cred, &Request::RemoveXattr(XattrReq { ino, name: name.into() })).map(|_| ())
}

fn e(tag: Tag, perm: u32, id: u32) -> Entry {
    Entry { tag, perm, id }
}

/// user::rw-, user:BOB:r--, group::---, mask::r--, other::---
fn bob_may_read() -> Vec<u8> {
    let u = ACL_UNDEFINED_ID;
    Acl::new(vec![
        e(Tag::UserObj, 6, u),
        e(Tag::User, 4, BOB),
        e(Tag::GroupObj, 0, u),
        e(Tag::Mask, 4, u),
        e(Tag::Other, 0, u),
    ])
    .unwrap()
    .encode()
}

/// A world-writable directory for the users' files.
fn shared<S: MetaStore>(ns: &Ns<S>) -> u64 {
    let d = mkdir(ns, &root(), ROOT_INO, "shared", 0o777);
    d.ino
}

fn values_round_trip_and_flags_and_limits_are_linuxs<S: TestStore>() {
    let ns = ns_on(S::fresh());
    let f = create(&ns, &alice(), shared(&ns), "f", 0o644).ino;
    set(&ns, &alice(), f, "user.a", b"1", 0).unwrap();
    set(&ns, &alice(), f, "user.empty", b"", XATTR_CREATE).unwrap();
    assert_eq!(get(&ns, &alice(), f, "user.a").unwrap(), b"1");
    assert_eq!(get(&ns, &alice(), f, "user.empty").unwrap(), b"");
    assert_eq!(code(set(&ns, &alice(), f, "user.a", b"2", XATTR_CREATE)), ErrorCode::Exists);
    assert_eq!(code(set(&ns, &alice(), f, "user.b", b"2", XATTR_REPLACE)), ErrorCode::NoData);
    set(&ns, &alice(), f, "user.a", b"2", XATTR_REPLACE).unwrap();
    assert_eq!(get(&ns, &alice(), f, "user.a").unwrap(), b"2");
    assert_eq!(code(set(&ns, &alice(), f, "user.a", b"", 3)), ErrorCode::Invalid, "both flags");
    assert_eq!(code(set(&ns, &alice(), f, "user.a", b"", 4)), ErrorCode::Invalid, "unknown flag");
    assert_eq!(list(&ns, &alice(), f), ["user.a", "user.empty"]);
    assert_eq!(code(get(&ns, &alice(), f, "user.none")), ErrorCode::NoData);
    assert_eq!(code(remove(&ns, &alice(), f, "user.none")), ErrorCode::NoData);
    remove(&ns, &alice(), f, "user.empty").unwrap();
    assert_eq!(list(&ns, &alice(), f), ["user.a"]);
    // Names: 1..=255 bytes (ERANGE), a known namespace (EOPNOTSUPP), more than the prefix (EINVAL).
    let long = format!("user.{}", "n".repeat(250));
    set(&ns, &alice(), f, &long, b"", 0).unwrap();
    assert_eq!(code(set(&ns, &alice(), f, &format!("{long}n"), b"", 0)), ErrorCode::Range);
    assert_eq!(code(set(&ns, &alice(), f, "", b"", 0)), ErrorCode::Range);
    assert_eq!(code(set(&ns, &alice(), f, "os2.x", b"", 0)), ErrorCode::NotSupported);
    assert_eq!(code(set(&ns, &alice(), f, "system.other", b"", 0)), ErrorCode::NotSupported);
    assert_eq!(code(get(&ns, &alice(), f, "nonamespace")), ErrorCode::NotSupported);
    assert_eq!(code(set(&ns, &alice(), f, "user.", b"", 0)), ErrorCode::Invalid);
    // Values: at most 64 KiB (E2BIG).
    set(&ns, &alice(), f, "user.big", &vec![7; 64 << 10], 0).unwrap();
    assert_eq!(code(set(&ns, &alice(), f, "user.big2", &vec![7; (64 << 10) + 1], 0)), ErrorCode::TooBig);
    assert_eq!(code(get(&ns, &alice(), 999, "user.a")), ErrorCode::NotFound);
}

fn the_total_per_inode_and_the_name_list_are_bounded<S: TestStore>() {
    let ns = ns_on(S::fresh()).with_xattr_bytes_max(0);
    // Raised to the smallest useful bound: one largest value with a longest name.
    let max = (64 << 10) + 255;
    let f = create(&ns, &alice(), shared(&ns), "f", 0o644).ino;
    set(&ns, &alice(), f, "user.a", &vec![1; 64 << 10], 0).unwrap();
    let room = max - (6 + (64 << 10)) - 6;
    set(&ns, &alice(), f, "user.b", &vec![1; room], 0).unwrap();
    assert_eq!(code(set(&ns, &alice(), f, "user.c", b"", 0)), ErrorCode::NoSpace, "full");
    // Replacing a value counts the old one as gone; removing frees room.
    set(&ns, &alice(), f, "user.b", &vec![2; room], 0).unwrap();
    remove(&ns, &alice(), f, "user.a").unwrap();
    set(&ns, &alice(), f, "user.c", b"x", 0).unwrap();
    // The list of names stays within 64 KiB.
    let g = create(&ns, &alice(), shared_ino(&ns), "g", 0o644).ino;
    let mut n = 0;
    let err = loop {
        match set(&ns, &alice(), g, &format!("user.{n:0>250}"), b"", 0) {
            Ok(()) => n += 1,
            Err(e) => break e.code,
        }
    };
    assert_eq!((err, n), (ErrorCode::TooBig, (64 << 10) / 256));
}

fn shared_ino<S: MetaStore>(ns: &Ns<S>) -> u64 {
    match ns.execute(&Request::Lookup(weft_proto::msg::LookupReq { parent: ROOT_INO, name: "shared".into() })).unwrap()
    {
        Response::Lookup(a) => a.ino,
        other => panic!("{other:?}"),
    }
}

fn namespaces_follow_linux_rules<S: TestStore>() {
    let ns = ns_on(S::fresh());
    let dir = shared(&ns);
    let f = create(&ns, &alice(), dir, "f", 0o640).ino;
    // user.*: read needs read permission, write needs write permission.
    set(&ns, &alice(), f, "user.a", b"1", 0).unwrap();
    assert_eq!(get(&ns, &bob(), f, "user.a").unwrap(), b"1", "bob is in alice's group: r");
    assert_eq!(code(set(&ns, &bob(), f, "user.a", b"2", 0)), ErrorCode::Permission);
    assert_eq!(code(get(&ns, &carol(), f, "user.a")), ErrorCode::Permission, "carol: other class, no bits");
    assert_eq!(code(remove(&ns, &bob(), f, "user.a")), ErrorCode::Permission);
    set(&ns, &root(), f, "user.r", b"", 0).unwrap();
    // user.* only on regular files and directories.
    let l = attr(
        ns.execute_as(&alice(), &Request::Symlink(SymlinkReq { parent: dir, name: "l".into(), target: "f".into() }))
            .unwrap(),
    )
    .ino;
    assert_eq!(code(set(&ns, &alice(), l, "user.a", b"", 0)), ErrorCode::NotPermitted);
    assert_eq!(code(get(&ns, &alice(), l, "user.a")), ErrorCode::NoData);
    // A sticky directory's user.* only from its owner or root.
    let sticky = mkdir(&ns, &root(), ROOT_INO, "tmp", 0o1777).ino;
    assert_eq!(code(set(&ns, &alice(), sticky, "user.a", b"", 0)), ErrorCode::NotPermitted);
    set(&ns, &root(), sticky, "user.a", b"", 0).unwrap();
    // trusted.*: root only; others neither see nor read nor set it.
    set(&ns, &root(), f, "trusted.t", b"x", 0).unwrap();
    assert_eq!(code(set(&ns, &alice(), f, "trusted.t", b"y", 0)), ErrorCode::NotPermitted);
    assert_eq!(code(get(&ns, &alice(), f, "trusted.t")), ErrorCode::NoData);
    assert_eq!(code(remove(&ns, &alice(), f, "trusted.t")), ErrorCode::NotPermitted);
    assert_eq!(list(&ns, &alice(), f), ["user.a", "user.r"]);
    assert_eq!(list(&ns, &root(), f), ["trusted.t", "user.a", "user.r"]);
    // security.*: anyone reads, the owner or root writes.
    set(&ns, &alice(), f, "security.s", b"lbl", 0).unwrap();
    assert_eq!(get(&ns, &carol(), f, "security.s").unwrap(), b"lbl");
    assert_eq!(code(set(&ns, &bob(), f, "security.s", b"x", 0)), ErrorCode::NotPermitted);
    set(&ns, &root(), f, "security.s", b"x", 0).unwrap();
}

fn an_access_acl_sets_the_mode_and_is_honoured_by_every_check<S: TestStore>() {
    let ns = ns_on(S::fresh());
    let f = create(&ns, &alice(), shared(&ns), "f", 0o600).ino;
    assert_eq!(code(get(&ns, &bob(), f, "user.x")), ErrorCode::Permission, "permission is checked first");
    set(&ns, &alice(), f, "user.x", b"v", 0).unwrap();
    assert_eq!(code(get(&ns, &bob(), f, "user.x")), ErrorCode::Permission);
    // Only the owner or root sets an ACL.
    assert_eq!(code(set(&ns, &bob(), f, ACCESS_XATTR, &bob_may_read(), 0)), ErrorCode::NotPermitted);
    set(&ns, &alice(), f, ACCESS_XATTR, &bob_may_read(), 0).unwrap();
    assert_eq!(getattr(&ns, f).mode & 0o777, 0o640, "owner rw, group bits = mask r, other none");
    assert_eq!(get(&ns, &carol(), f, ACCESS_XATTR).unwrap(), bob_may_read());
    // Bob, a named user, may read; not write; carol (other) nothing; bob's group (USERS) is GROUP_OBJ --- but bob
    // is matched by his own entry first.
    assert_eq!(get(&ns, &bob(), f, "user.x").unwrap(), b"v");
    assert_eq!(code(set(&ns, &bob(), f, "user.x", b"w", 0)), ErrorCode::Permission);
    assert_eq!(code(get(&ns, &carol(), f, "user.x")), ErrorCode::Permission);
    let member = Cred::new(4242, USERS, vec![]);
    assert_eq!(code(get(&ns, &member, f, "user.x")), ErrorCode::Permission, "GROUP_OBJ ---, though mode g=r");
    // The Open check honours it too.
    assert!(ns.open(&bob(), f, weft_proto::Rights::READ).is_ok());
    assert_eq!(code(ns.open(&bob(), f, weft_proto::Rights::WRITE)), ErrorCode::Permission);
    assert_eq!(code(ns.open(&member, f, weft_proto::Rights::READ)), ErrorCode::Permission);
    // Bad values are EINVAL and change nothing.
    let mut bad = bob_may_read();
    bad.truncate(bad.len() - 8);
    assert_eq!(code(set(&ns, &alice(), f, ACCESS_XATTR, &bad, 0)), ErrorCode::Invalid, "mask without other");
    assert_eq!(get(&ns, &alice(), f, ACCESS_XATTR).unwrap(), bob_may_read());
    // A minimal ACL is kept as mode bits only; an empty one removes the ACL and keeps the mode.
    set(&ns, &alice(), f, ACCESS_XATTR, &Acl::from_mode(0o604).encode(), 0).unwrap();
    assert_eq!(getattr(&ns, f).mode & 0o777, 0o604);
    assert_eq!(code(get(&ns, &alice(), f, ACCESS_XATTR)), ErrorCode::NoData);
    set(&ns, &alice(), f, ACCESS_XATTR, &bob_may_read(), 0).unwrap();
    set(&ns, &alice(), f, ACCESS_XATTR, &2u32.to_le_bytes(), 0).unwrap();
    assert_eq!((getattr(&ns, f).mode & 0o777, list(&ns, &alice(), f)), (0o640, vec!["user.x".to_string()]));
    // Default ACLs only on directories.
    assert_eq!(code(set(&ns, &alice(), f, DEFAULT_XATTR, &bob_may_read(), 0)), ErrorCode::Permission);
}

fn setting_an_acl_outside_the_files_group_clears_set_group_id<S: TestStore>() {
    let ns = ns_on(S::fresh());
    let f = create(&ns, &alice(), shared(&ns), "f", 0o2670).ino;
    ns.execute(&Request::SetAttr(SetAttrReq { ino: f, set: SetAttrs { gid: Some(STAFF), ..SetAttrs::default() } }))
        .unwrap();
    chmod(&ns, &root(), f, 0o2670).unwrap();
    set(&ns, &alice(), f, ACCESS_XATTR, &bob_may_read(), 0).unwrap();
    assert_eq!(getattr(&ns, f).mode & 0o7777, 0o640, "alice is not in staff");
    chmod(&ns, &root(), f, 0o2670).unwrap();
    set(&ns, &root(), f, ACCESS_XATTR, &bob_may_read(), 0).unwrap();
    assert_eq!(getattr(&ns, f).mode & 0o7777, 0o2640, "root keeps it");
}

fn chmod_rewrites_the_acl_and_the_acl_follows<S: TestStore>() {
    let ns = ns_on(S::fresh());
    let f = create(&ns, &alice(), shared(&ns), "f", 0o600).ino;
    set(&ns, &alice(), f, ACCESS_XATTR, &bob_may_read(), 0).unwrap();
    chmod(&ns, &alice(), f, 0o705).unwrap();
    let acl = Acl::decode(&get(&ns, &alice(), f, ACCESS_XATTR).unwrap()).unwrap().unwrap();
    let perms: Vec<(Tag, u32)> = acl.entries().iter().map(|e| (e.tag, e.perm)).collect();
    assert_eq!(
        perms,
        [(Tag::UserObj, 7), (Tag::User, 4), (Tag::GroupObj, 0), (Tag::Mask, 0), (Tag::Other, 5)],
        "owner, mask and other from the mode; named entries kept"
    );
    // The mask now hides bob's read; other grants carol read and execute.
    assert_eq!(code(ns.open(&bob(), f, weft_proto::Rights::READ)), ErrorCode::Permission);
    assert!(ns.open(&carol(), f, weft_proto::Rights::READ).is_ok());
    chmod(&ns, &alice(), f, 0o640).unwrap();
    assert!(ns.open(&bob(), f, weft_proto::Rights::READ).is_ok(), "mask r again");
}

fn new_entries_inherit_a_default_acl_instead_of_the_umask<S: TestStore>() {
    let ns = ns_on(S::fresh());
    let dir = mkdir(&ns, &alice(), shared(&ns), "d", 0o755).ino;
    let u = ACL_UNDEFINED_ID;
    let default = Acl::new(vec![
        e(Tag::UserObj, 7, u),
        e(Tag::User, 6, BOB),
        e(Tag::GroupObj, 5, u),
        e(Tag::Mask, 7, u),
        e(Tag::Other, 0, u),
    ])
    .unwrap();
    assert_eq!(code(set(&ns, &bob(), dir, DEFAULT_XATTR, &default.encode(), 0)), ErrorCode::NotPermitted);
    set(&ns, &alice(), dir, DEFAULT_XATTR, &default.encode(), 0).unwrap();
    assert_eq!(getattr(&ns, dir).mode & 0o777, 0o755, "a default ACL leaves the directory's own mode");
    // A file created 0666 with umask 022: the umask is ignored, the mode masks the ACL.
    let f = create(&ns, &alice(), dir, "f", mode_with_umask(0o666, 0o022));
    assert_eq!(f.mode & 0o777, 0o660, "owner rw; group = mask rw (rwx ∩ rw-); other ---");
    let got = Acl::decode(&get(&ns, &alice(), f.ino, ACCESS_XATTR).unwrap()).unwrap().unwrap();
    let perms: Vec<(Tag, u32)> = got.entries().iter().map(|e| (e.tag, e.perm)).collect();
    assert_eq!(perms, [(Tag::UserObj, 6), (Tag::User, 6), (Tag::GroupObj, 5), (Tag::Mask, 6), (Tag::Other, 0)]);
    assert_eq!(code(get(&ns, &alice(), f.ino, DEFAULT_XATTR)), ErrorCode::NoData, "files get no default ACL");
    assert!(ns.open(&bob(), f.ino, weft_proto::Rights::WRITE).is_ok(), "bob's inherited rw");
    // A subdirectory takes it as its access and its default ACL.
    let sub = mkdir(&ns, &alice(), dir, "sub", mode_with_umask(0o777, 0o077));
    assert_eq!(sub.mode & 0o777, 0o770);
    assert_eq!(get(&ns, &alice(), sub.ino, DEFAULT_XATTR).unwrap(), default.encode());
    assert!(get(&ns, &alice(), sub.ino, ACCESS_XATTR).is_ok());
    // Without a default ACL the umask applies; without one in the mode the mode is final.
    let plain = create(&ns, &alice(), shared_ino(&ns), "plain", mode_with_umask(0o666, 0o027));
    assert_eq!((plain.mode & 0o777, list(&ns, &alice(), plain.ino).len()), (0o640, 0));
    assert_eq!(create(&ns, &alice(), shared_ino(&ns), "old", 0o606).mode & 0o777, 0o606);
    // Removing the default ACL stops inheritance.
    remove(&ns, &alice(), dir, DEFAULT_XATTR).unwrap();
    let g = create(&ns, &alice(), dir, "g", mode_with_umask(0o666, 0o022));
    assert_eq!((g.mode & 0o777, list(&ns, &alice(), g.ino).len()), (0o644, 0));
}

fn a_directory_acl_governs_who_may_create_and_search<S: TestStore>() {
    let ns = ns_on(S::fresh());
    let dir = mkdir(&ns, &alice(), shared(&ns), "d", 0o700).ino;
    let u = ACL_UNDEFINED_ID;
    let acl = Acl::new(vec![
        e(Tag::UserObj, 7, u),
        e(Tag::GroupObj, 0, u),
        e(Tag::Group, 3, STAFF),
        e(Tag::Mask, 7, u),
        e(Tag::Other, 0, u),
    ])
    .unwrap();
    let mk = |cred: &Cred, name: &str| {
        ns.execute_as(
            cred,
            &Request::Create(CreateReq { parent: dir, name: name.into(), mode: 0o600, exclusive: true }),
        )
    };
    assert_eq!(code(mk(&carol(), "c")), ErrorCode::Permission);
    set(&ns, &alice(), dir, ACCESS_XATTR, &acl.encode(), 0).unwrap();
    mk(&carol(), "c").unwrap();
    assert_eq!(code(mk(&bob(), "b")), ErrorCode::Permission, "bob is not in staff");
    assert_eq!(
        code(ns.execute_as(
            &carol(),
            &Request::Readdir(weft_proto::msg::ReaddirReq { ino: dir, after: String::new(), limit: 0 })
        )),
        ErrorCode::Permission,
        "wx, no r"
    );
    ns.execute_as(&carol(), &Request::Unlink(NameReq { parent: dir, name: "c".into() })).unwrap();
}

fn attributes_go_with_their_inode<S: TestStore>() {
    let ns = ns_on(S::fresh());
    let dir = shared(&ns);
    let f = create(&ns, &alice(), dir, "f", 0o644).ino;
    set(&ns, &alice(), f, "user.a", b"1", 0).unwrap();
    set(&ns, &alice(), f, ACCESS_XATTR, &bob_may_read(), 0).unwrap();
    ns.execute_as(&alice(), &Request::Unlink(NameReq { parent: dir, name: "f".into() })).unwrap();
    assert!(ns.store().read(|t| t.list_xattrs(f)).unwrap().is_empty());
    let d = mkdir(&ns, &alice(), dir, "d", 0o755).ino;
    set(&ns, &alice(), d, "user.a", b"1", 0).unwrap();
    ns.execute_as(&alice(), &Request::Rmdir(NameReq { parent: dir, name: "d".into() })).unwrap();
    assert!(ns.store().read(|t| t.list_xattrs(d)).unwrap().is_empty());
    assert_eq!(code(get(&ns, &root(), d, "user.a")), ErrorCode::NotFound);
}

#[test]
fn redb_keeps_attributes_across_a_reopen() {
    let dir = std::env::temp_dir().join(format!("weft-xattr-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (f, d) = {
        let ns = ns_on(RedbStore::open(&dir).unwrap());
        let d = mkdir(&ns, &alice(), shared(&ns), "d", 0o755).ino;
        let f = create(&ns, &alice(), d, "f", 0o644).ino;
        set(&ns, &alice(), f, "user.keep", b"kept", 0).unwrap();
        set(&ns, &alice(), f, "user.gone", b"x", 0).unwrap();
        remove(&ns, &alice(), f, "user.gone").unwrap();
        set(&ns, &alice(), d, DEFAULT_XATTR, &bob_may_read(), 0).unwrap();
        (f, d)
    };
    let ns = ns_on(RedbStore::open(&dir).unwrap());
    assert_eq!(list(&ns, &alice(), f), ["user.keep"]);
    assert_eq!(get(&ns, &alice(), f, "user.keep").unwrap(), b"kept");
    assert_eq!(get(&ns, &alice(), d, DEFAULT_XATTR).unwrap(), bob_may_read());
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
}

on_every_store!(
    values_round_trip_and_flags_and_limits_are_linuxs,
    the_total_per_inode_and_the_name_list_are_bounded,
    namespaces_follow_linux_rules,
    an_access_acl_sets_the_mode_and_is_honoured_by_every_check,
    setting_an_acl_outside_the_files_group_clears_set_group_id,
    chmod_rewrites_the_acl_and_the_acl_follows,
    new_entries_inherit_a_default_acl_instead_of_the_umask,
    a_directory_acl_governs_who_may_create_and_search,
    attributes_go_with_their_inode,
);
