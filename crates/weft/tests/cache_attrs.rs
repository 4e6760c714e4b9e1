//! Attributes and lookups through the cache bank (issue 16), against real memcached daemons and real servers: the
//! MDS publishes every change before it replies, so a second client reading from the bank sees chmod, truncate,
//! rename, link and unlink at once; a removed name is NotFound; garbage and hash collisions are misses; a killed
//! daemon costs only speed; a lookup through the bank still needs search permission on the parent; and
//! `attrs = false` turns it all off.
//!
//! Ground truth is a client without a bank (every answer from the MDS). That an answer came from the bank is
//! proven by the bank's own hit counter of the client that asked, which counts only checked items.

use crate::common;

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use weft_cache::value::encode_value;
use weft_cache::{AttrItem, Bank, CacheKey, ItemKind, LookupItem};
use weft_client::{Client, ClientError, ClusterConfig};
use weft_proto::{Attr, ErrorCode, ROOT_INO, SetAttrs, UserCred};

use common::memcached::raw_set;
use common::{TestCluster, start_with};

/// A bank deadline long enough that a loaded test machine never turns a hit, a push or a delete into a timeout.
const PATIENT_MS: u64 = 10_000;

async fn start_bank_cluster(name: &str, daemons: u32, attrs: bool) -> TestCluster {
    start_with(name, 1, |o| {
        o.cache = daemons;
        o.cache_mib = 16;
        o.cache_attrs = attrs;
        o.cache_timeout_ms = PATIENT_MS;
    })
    .await
}

/// A client with its own bank (its own counters).
async fn bank_client(cl: &TestCluster) -> Client {
    let cfg = ClusterConfig::from_spec(&cl.cluster_file().to_string_lossy()).unwrap();
    assert!(cfg.cache.is_some(), "cluster.toml names the bank");
    Client::connect(&cfg).await.unwrap()
}

/// A client without a bank: the MDS's answer.
async fn truth_client(cl: &TestCluster) -> Client {
    let cfg = ClusterConfig { cache: None, ..ClusterConfig::from_spec(&cl.cluster_file().to_string_lossy()).unwrap() };
    Client::connect(&cfg).await.unwrap()
}

fn hits(c: &Client) -> u64 {
    c.bank_stats().expect("a client with a bank").hits
}

fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.code().unwrap_or_else(|| panic!("an error without a code: {e}")),
    }
}

/// `getattr` by `b` is served by its bank (`hits` grows by one) and equals the MDS's answer.
async fn getattr_from_bank(b: &Client, truth: &Client, ino: u64) -> Attr {
    let before = hits(b);
    let got = b.getattr(ino).await.unwrap();
    assert_eq!(hits(b), before + 1, "inode {ino}'s attributes came from the bank");
    assert_eq!(got, truth.getattr(ino).await.unwrap(), "the bank's copy of inode {ino} is the MDS's");
    got
}

/// `lookup` by `b` is served by its bank (the parent's attributes and the entry, which carries the child's
/// attributes for a sole name; else also the child's attributes item) and equals the MDS's answer.
async fn lookup_from_bank(b: &Client, truth: &Client, parent: u64, name: &str) -> Attr {
    let before = hits(b);
    let got = b.lookup(parent, name).await.unwrap();
    let found = hits(b) - before;
    assert!(found == 2 || found == 3, "{name:?} was looked up in the bank ({found} items)");
    assert_eq!(got, truth.lookup(parent, name).await.unwrap(), "the bank's {name:?} is the MDS's");
    got
}

#[tokio::test]
async fn changes_by_one_client_are_seen_through_the_bank_by_another() {
    let cl = start_bank_cluster("cattr-changes", 2, true).await;
    let (a, b, truth) = (bank_client(&cl).await, bank_client(&cl).await, truth_client(&cl).await);
    let d = a.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    let f = a.create_path("/d/f", 0o644, true, false).await.unwrap();
    let ino = f.ino();
    f.write_at(0, Bytes::from(vec![7u8; 1000])).await.unwrap();
    f.close().await.unwrap();

    // The create, the write's commit: all published.
    assert_eq!(lookup_from_bank(&b, &truth, d.ino, "f").await.ino, ino);
    assert_eq!(getattr_from_bank(&b, &truth, ino).await.size, 1000);
    getattr_from_bank(&b, &truth, d.ino).await;

    // chmod
    a.setattr(ino, SetAttrs { mode: Some(0o600), ..SetAttrs::default() }).await.unwrap();
    assert_eq!(getattr_from_bank(&b, &truth, ino).await.mode, 0o600);
    assert_eq!(lookup_from_bank(&b, &truth, d.ino, "f").await.mode & 0o7777, 0o600, "the entry's copy too");
    // truncate
    a.setattr(ino, SetAttrs { size: Some(10), ..SetAttrs::default() }).await.unwrap();
    assert_eq!(getattr_from_bank(&b, &truth, ino).await.size, 10);
    assert_eq!(lookup_from_bank(&b, &truth, d.ino, "f").await.size, 10, "the entry's copy too");
    // chown (root may), utimes
    a.setattr(ino, SetAttrs { uid: Some(1234), gid: Some(99), ..SetAttrs::default() }).await.unwrap();
    let after = getattr_from_bank(&b, &truth, ino).await;
    assert_eq!((after.uid, after.gid), (1234, 99));
    a.setattr(ino, SetAttrs { mtime: Some(weft_proto::TimeSet::AtNs(5_000_000_000)), ..SetAttrs::default() })
        .await
        .unwrap();
    assert_eq!(getattr_from_bank(&b, &truth, ino).await.mtime_ns, 5_000_000_000);

    // rename: the old name is gone (the MDS says so: the bank has no entry for it), the new one is in the bank,
    // and the directory's times moved on in the bank too.
    let e = a.mkdir(ROOT_INO, "e", 0o755).await.unwrap();
    a.rename(d.ino, "f", e.ino, "g", 0).await.unwrap();
    assert_eq!(code(b.lookup(d.ino, "f").await), ErrorCode::NotFound);
    assert_eq!(lookup_from_bank(&b, &truth, e.ino, "g").await.ino, ino);
    getattr_from_bank(&b, &truth, d.ino).await;
    getattr_from_bank(&b, &truth, e.ino).await;

    // rename over an existing file: the replaced file's inode is gone, its name now names the moved one.
    let victim = a.create(e.ino, "victim", 0o644, true).await.unwrap();
    assert_eq!(lookup_from_bank(&b, &truth, e.ino, "victim").await.ino, victim.ino);
    a.rename(e.ino, "g", e.ino, "victim", 0).await.unwrap();
    assert_eq!(code(b.lookup(e.ino, "g").await), ErrorCode::NotFound);
    assert_eq!(lookup_from_bank(&b, &truth, e.ino, "victim").await.ino, ino);
    assert_eq!(code(b.getattr(victim.ino).await), ErrorCode::NotFound, "the replaced inode is gone");

    // link: a second name, the link count in the bank; unlink one name: the other stays, the count drops.
    a.link(ino, d.ino, "again").await.unwrap();
    assert_eq!(lookup_from_bank(&b, &truth, d.ino, "again").await.nlink, 2);
    a.unlink(e.ino, "victim").await.unwrap();
    assert_eq!(code(b.lookup(e.ino, "victim").await), ErrorCode::NotFound);
    assert_eq!(getattr_from_bank(&b, &truth, ino).await.nlink, 1);
    // The last name: the inode's attributes leave the bank with it.
    a.unlink(d.ino, "again").await.unwrap();
    assert_eq!(code(b.lookup(d.ino, "again").await), ErrorCode::NotFound);
    assert_eq!(code(b.getattr(ino).await), ErrorCode::NotFound);

    // rmdir
    a.rmdir(ROOT_INO, "e").await.unwrap();
    assert_eq!(code(b.lookup(ROOT_INO, "e").await), ErrorCode::NotFound);
    assert_eq!(code(b.getattr(e.ino).await), ErrorCode::NotFound);
    getattr_from_bank(&b, &truth, ROOT_INO).await;
    let stats = b.bank_stats().unwrap();
    assert_eq!((stats.refused_items, stats.failures, stats.timeouts), (0, 0, 0), "{stats:?}");
}

#[tokio::test]
async fn garbage_and_foreign_items_under_valid_keys_are_misses() {
    let cl = start_bank_cluster("cattr-garbage", 2, true).await;
    let (a, b, truth) = (bank_client(&cl).await, bank_client(&cl).await, truth_client(&cl).await);
    let cfg = ClusterConfig::from_spec(&cl.cluster_file().to_string_lossy()).unwrap().cache.unwrap();
    let seal = cl.bank_key();
    let bank = Bank::new(cfg.clone(), cl.bank_key()).unwrap();
    let f = a.create(ROOT_INO, "f", 0o640, true).await.unwrap();
    let other = a.create(ROOT_INO, "other", 0o600, true).await.unwrap();
    let right = getattr_from_bank(&b, &truth, f.ino).await;

    let key = CacheKey::Attrs { ino: f.ino };
    let encoded = key.encode(cfg.namespace);
    let addr = &cl.cache_addrs()[bank.owner(&key).unwrap()];
    let mut liar = right.clone();
    liar.mode = 0o777;
    let mut flipped =
        encode_value(encoded.as_bytes(), ItemKind::Attrs, &AttrItem(liar.clone()).encode(), &seal).unwrap();
    *flipped.last_mut().unwrap() ^= 1;
    let plants: Vec<(&str, Vec<u8>, bool)> = vec![
        ("plain text", b"mode=0777".to_vec(), true),
        ("a flipped bit", flipped, true),
        (
            "another inode's attributes, well formed",
            {
                let payload = AttrItem(truth.getattr(other.ino).await.unwrap()).encode();
                encode_value(encoded.as_bytes(), ItemKind::Attrs, &payload, &seal).unwrap()
            },
            false,
        ),
        (
            "a lookup item under an attributes key",
            {
                let payload = LookupItem { name: "f".into(), ino: f.ino, attr: None }.encode();
                encode_value(encoded.as_bytes(), ItemKind::Lookup, &payload, &seal).unwrap()
            },
            true,
        ),
        (
            "garbage behind a good header",
            encode_value(encoded.as_bytes(), ItemKind::Attrs, b"\x01\xff\xff", &seal).unwrap(),
            false,
        ),
    ];
    for (what, item, refused_by_header) in plants {
        raw_set(addr, &encoded, &item).await;
        let before = b.bank_stats().unwrap();
        assert_eq!(b.getattr(f.ino).await.unwrap(), right, "{what}: the MDS's attributes, not the plant");
        let after = b.bank_stats().unwrap();
        assert_eq!(after.refused_items - before.refused_items, u64::from(refused_by_header), "{what}");
    }

    // A lookup entry naming another name under this name's key (what a hash collision would look like) is a
    // miss: the MDS answers, here NotFound for a name that does not exist.
    let ghost = bank.lookup_key(ROOT_INO, "ghost");
    let ghost_addr = &cl.cache_addrs()[bank.owner(&ghost).unwrap()];
    let payload = LookupItem { name: "f".into(), ino: f.ino, attr: None }.encode();
    let ghost_key = ghost.encode(cfg.namespace);
    raw_set(ghost_addr, &ghost_key, &encode_value(ghost_key.as_bytes(), ItemKind::Lookup, &payload, &seal).unwrap())
        .await;
    assert_eq!(code(b.lookup(ROOT_INO, "ghost").await), ErrorCode::NotFound);
    // A real entry still works, and the planted attributes were replaced by the MDS's fill or next push.
    assert_eq!(lookup_from_bank(&b, &truth, ROOT_INO, "other").await.ino, other.ino);
}

#[tokio::test]
async fn a_killed_daemon_costs_only_speed() {
    let mut cl = start_bank_cluster("cattr-kill", 3, true).await;
    let (a, b, truth) = (bank_client(&cl).await, bank_client(&cl).await, truth_client(&cl).await);
    let d = a.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    let mut inos = Vec::new();
    for i in 0..30 {
        inos.push(a.create(d.ino, &format!("f{i}"), 0o644, true).await.unwrap().ino);
    }
    for &ino in &inos {
        getattr_from_bank(&b, &truth, ino).await;
    }
    cl.kill_cache(1).await;
    // Every stat is right, whether the bank or the MDS answers it; so is every change made meanwhile.
    for round in 0..3u32 {
        for (i, &ino) in inos.iter().enumerate() {
            let mode = 0o600 | ((round + i as u32) % 8);
            a.setattr(ino, SetAttrs { mode: Some(mode), ..SetAttrs::default() }).await.unwrap();
            let got = b.getattr(ino).await.unwrap();
            assert_eq!(got, truth.getattr(ino).await.unwrap(), "round {round}, inode {ino}");
            assert_eq!(got.mode, mode);
            let by_name = b.lookup(d.ino, &format!("f{i}")).await.unwrap();
            assert_eq!(by_name, got, "round {round}, f{i} by name");
        }
    }
    assert!(b.bank_stats().unwrap().failures + b.bank_stats().unwrap().timeouts > 0, "the dead daemon was asked");
    // Restarted empty: still right, and the bank serves again once changes are pushed to it.
    cl.restart_cache(1).await.unwrap();
    for (i, &ino) in inos.iter().enumerate() {
        a.setattr(ino, SetAttrs { mode: Some(0o640), ..SetAttrs::default() }).await.unwrap();
        let got = b.getattr(ino).await.unwrap();
        assert_eq!((got.ino, got.mode), (ino, 0o640), "f{i} after the restart");
    }
}

const ALICE: u32 = 1000;
const BOB: u32 = 1001;

#[tokio::test]
async fn a_lookup_through_the_bank_still_needs_search_permission() {
    let cl = start_bank_cluster("cattr-perm", 2, true).await;
    let (a, b, truth) = (bank_client(&cl).await, bank_client(&cl).await, truth_client(&cl).await);
    let alice = a.with_user(UserCred::new(ALICE, 100, vec![]).unwrap());
    let bob = b.with_user(UserCred::new(BOB, 200, vec![]).unwrap());
    let private = alice_dir(&a, &alice).await;
    alice.create(private, "secret", 0o644, true).await.unwrap();

    // Alice, the owner, looks up through the bank (and her own `with_user` client shares b's bank counters).
    let alice_b = b.with_user(UserCred::new(ALICE, 100, vec![]).unwrap());
    lookup_from_bank(&alice_b, &truth, private, "secret").await;
    // Bob finds the parent and the entry in the bank, but may not search the directory: the MDS refuses him.
    let before = hits(&bob);
    assert_eq!(code(bob.lookup(private, "secret").await), ErrorCode::Permission);
    // (The parent, and the entry carrying the file's attributes.)
    assert_eq!(hits(&bob), before + 2, "the entry was in the bank, and was not used");
    // Once Alice opens the directory to everyone (a push), Bob looks up through the bank.
    alice.setattr(private, SetAttrs { mode: Some(0o711), ..SetAttrs::default() }).await.unwrap();
    lookup_from_bank(&bob, &truth, private, "secret").await;
    // …and once she closes it again, he is refused again at once.
    alice.setattr(private, SetAttrs { mode: Some(0o700), ..SetAttrs::default() }).await.unwrap();
    assert_eq!(code(bob.lookup(private, "secret").await), ErrorCode::Permission);
}

/// A directory whose mode lets everyone search it but whose ACL refuses Bob by name (issue 31): the client cannot
/// see the ACL in the directory's attributes, so the MDS publishes no attributes for it and Bob's lookup goes to
/// the MDS, which refuses him; Alice's still works. Without the ACL, the directory is in the bank again.
#[tokio::test]
async fn a_lookup_through_the_bank_honours_the_parents_acl() {
    let cl = start_bank_cluster("cattr-acl", 1, true).await;
    let (a, b, truth) = (bank_client(&cl).await, bank_client(&cl).await, truth_client(&cl).await);
    let alice = a.with_user(UserCred::new(ALICE, 100, vec![]).unwrap());
    let bob = b.with_user(UserCred::new(BOB, 200, vec![]).unwrap());
    let dir = alice_dir(&a, &alice).await;
    alice.setattr(dir, SetAttrs { mode: Some(0o755), ..SetAttrs::default() }).await.unwrap();
    alice.create(dir, "doc", 0o644, true).await.unwrap();
    lookup_from_bank(&bob, &truth, dir, "doc").await;
    // user::rwx, user:BOB:---, group::r-x, mask::r-x, other::r-x (Linux's xattr form: version 2, then entries of
    // tag u16, perm u16, id u32, little-endian, in tag and id order).
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in
        [(1u16, 7u16, u32::MAX), (2, 0, BOB), (4, 5, u32::MAX), (0x10, 5, u32::MAX), (0x20, 5, u32::MAX)]
    {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    alice.setxattr(dir, "system.posix_acl_access", &acl, 0).await.unwrap();
    assert_eq!(
        code(truth.with_user(UserCred::new(BOB, 200, vec![]).unwrap()).lookup(dir, "doc").await),
        ErrorCode::Permission
    );
    assert_eq!(code(bob.lookup(dir, "doc").await), ErrorCode::Permission, "the bank let the ACL be bypassed");
    assert_eq!(alice.lookup(dir, "doc").await.unwrap().ino, truth.lookup(dir, "doc").await.unwrap().ino);
    alice.removexattr(dir, "system.posix_acl_access").await.unwrap();
    lookup_from_bank(&bob, &truth, dir, "doc").await;
}

/// A directory only Alice may search, made by root and given to her.
async fn alice_dir(root: &Client, alice: &Client) -> u64 {
    let d = root.mkdir(ROOT_INO, "home", 0o700).await.unwrap();
    root.setattr(d.ino, SetAttrs { uid: Some(ALICE), gid: Some(100), ..SetAttrs::default() }).await.unwrap();
    assert_eq!(alice.getattr(d.ino).await.unwrap().uid, ALICE);
    d.ino
}

#[tokio::test]
async fn attrs_false_turns_the_attribute_cache_off() {
    let cl = start_bank_cluster("cattr-off", 1, false).await;
    let (a, b) = (bank_client(&cl).await, bank_client(&cl).await);
    let f = a.create(ROOT_INO, "f", 0o644, true).await.unwrap();
    a.setattr(f.ino, SetAttrs { mode: Some(0o600), ..SetAttrs::default() }).await.unwrap();
    assert_eq!(b.getattr(f.ino).await.unwrap().mode, 0o600);
    assert_eq!(b.lookup(ROOT_INO, "f").await.unwrap().ino, f.ino);
    let stats = b.bank_stats().unwrap();
    assert_eq!((stats.hits, stats.misses), (0, 0), "the bank was not asked: {stats:?}");
    // …and the MDS published nothing: the daemon holds no item.
    assert_eq!(memcached_stat(&cl.cache_addrs()[0], "curr_items").await, 0);
}

async fn memcached_stat(addr: &str, name: &str) -> u64 {
    let mut s = BufReader::new(TcpStream::connect(addr).await.unwrap());
    s.get_mut().write_all(b"stats\r\n").await.unwrap();
    loop {
        let mut line = String::new();
        assert!(s.read_line(&mut line).await.unwrap() > 0);
        if let Some(v) = line.strip_prefix(&format!("STAT {name} ")) {
            return v.trim().parse().unwrap();
        }
        assert_ne!(line.trim_end(), "END", "no {name} in stats");
    }
}

/// Issue 16, item 7: the FUSE mount's client asks the bank too, so a stat storm through the kernel (its attribute
/// and entry caching off) is served by memcached (its own `get_hits` count it); and what another client changes
/// (chmod, an in-place rewrite of the same size, rename, unlink) is what the mount sees next.
#[tokio::test(flavor = "multi_thread")]
async fn a_stat_storm_through_fuse_is_served_by_the_bank_and_sees_every_change() {
    use common::memcached::get_hits;
    use common::mount::Mount;
    use std::os::unix::fs::PermissionsExt;
    let cl = start_bank_cluster("cattr-fuse", 2, true).await;
    let a = bank_client(&cl).await;
    let d = a.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    const FILES: usize = 20;
    for i in 0..FILES {
        let f = a.create_path(&format!("/d/f{i}"), 0o644, true, false).await.unwrap();
        f.write_at(0, Bytes::from(common::pattern(i as u64, 0, 1000 + i))).await.unwrap();
        f.close().await.unwrap();
    }
    // No leases either (as on a shared store): every stat reaches the client, which asks the bank.
    let no_cache = ["--attr-timeout-ms", "0", "--entry-timeout-ms", "0", "--lease-timeout-ms", "0"];
    let m = Mount::start(&cl, &common::test_dir("cattr-fuse-mnt"), &no_cache);
    let addrs = cl.cache_addrs();
    let before = get_hits(&addrs).await;
    const ROUNDS: usize = 5;
    let m = tokio::task::spawn_blocking(move || {
        for round in 0..ROUNDS {
            for i in 0..FILES {
                let meta = std::fs::metadata(m.path(&format!("d/f{i}"))).unwrap();
                assert_eq!((meta.len(), meta.permissions().mode()), (1000 + i as u64, 0o100644), "round {round}");
            }
        }
        m
    })
    .await
    .unwrap();
    let served = get_hits(&addrs).await - before;
    // A stat through the mount is a LOOKUP (two hits: the parent, the entry carrying the attributes) and a GETATTR
    // (one); the first round may find less.
    assert!(served >= ((ROUNDS - 1) * FILES * 3) as u64, "memcached served {served} items for the storm");

    // Changes by the other client, seen through the mount at once.
    let f0 = a.lookup(d.ino, "f0").await.unwrap().ino;
    a.setattr(f0, SetAttrs { mode: Some(0o600), ..SetAttrs::default() }).await.unwrap();
    let new = common::pattern(99, 0, 1001);
    let w = a.open("/d/f1", weft_client::OpenMode::Write).await.unwrap();
    w.write_at(0, Bytes::from(new.clone())).await.unwrap();
    w.close().await.unwrap();
    a.rename(d.ino, "f2", d.ino, "g2", 0).await.unwrap();
    a.unlink(d.ino, "f3").await.unwrap();
    tokio::task::spawn_blocking(move || {
        assert_eq!(std::fs::metadata(m.path("d/f0")).unwrap().permissions().mode(), 0o100600, "the chmod");
        assert!(std::fs::read(m.path("d/f1")).unwrap() == new, "the rewrite's bytes, not the bank's old ones");
        assert!(std::fs::metadata(m.path("d/f2")).is_err(), "the old name is gone");
        assert_eq!(std::fs::metadata(m.path("d/g2")).unwrap().len(), 1002, "the new name");
        assert!(std::fs::metadata(m.path("d/f3")).is_err(), "the unlinked name is gone");
    })
    .await
    .unwrap();
}

/// A client remembers which inode a name named, and its next lookup of the name fetches the entry and that
/// inode's attributes in one multi-get (one round trip, `gets` counts them); when the name now names another
/// inode (renamed over, the old one still alive under another name), the entry proves the guess wrong and the
/// second round trip fetches the right attributes.
#[tokio::test]
async fn a_sole_names_lookup_is_one_round_trip_and_a_linked_names_guess_costs_only_a_second() {
    let cl = start_bank_cluster("cattr-guess", 2, true).await;
    let (a, b, truth) = (bank_client(&cl).await, bank_client(&cl).await, truth_client(&cl).await);
    let d = a.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    let x = a.create(d.ino, "x", 0o644, true).await.unwrap();
    let y = a.create(d.ino, "y", 0o600, true).await.unwrap();
    let gets = |c: &Client| c.bank_stats().unwrap().gets;

    let before = gets(&b);
    assert_eq!(lookup_from_bank(&b, &truth, d.ino, "x").await.ino, x.ino);
    assert_eq!(gets(&b) - before, 1, "a sole name's entry carries the attributes: one round trip");

    // A second name: no entry of x carries its attributes any more (the MDS could not refresh every name).
    a.link(x.ino, d.ino, "keep").await.unwrap();
    let before = gets(&b);
    assert_eq!(lookup_from_bank(&b, &truth, d.ino, "keep").await.ino, x.ino);
    assert_eq!(gets(&b) - before, 2, "a first lookup of a linked name: the entry, then the child's attributes");
    let before = gets(&b);
    assert_eq!(lookup_from_bank(&b, &truth, d.ino, "keep").await.ino, x.ino);
    assert_eq!(gets(&b) - before, 1, "a repeated lookup: the guessed attributes in the same round trip");
    // A chmod through the inode is seen through both names (the old sole name's entry lost its copy at the link).
    a.setattr(x.ino, SetAttrs { mode: Some(0o640), ..SetAttrs::default() }).await.unwrap();
    assert_eq!(lookup_from_bank(&b, &truth, d.ino, "x").await.mode & 0o7777, 0o640);
    assert_eq!(lookup_from_bank(&b, &truth, d.ino, "keep").await.mode & 0o7777, 0o640);

    // "keep" now names y, which has a second name too: b's guess (x) is alive and in the bank, and wrong.
    a.link(y.ino, d.ino, "y2").await.unwrap();
    a.rename(d.ino, "y", d.ino, "keep", 0).await.unwrap();
    let before = gets(&b);
    let got = b.lookup(d.ino, "keep").await.unwrap();
    assert_eq!((got.ino, got.mode & 0o7777), (y.ino, 0o600), "the inode the name names now, not the guess");
    assert_eq!(got, truth.lookup(d.ino, "keep").await.unwrap());
    assert_eq!(gets(&b) - before, 2, "a wrong guess costs the second round trip");
    let before = gets(&b);
    assert_eq!(lookup_from_bank(&b, &truth, d.ino, "keep").await.ino, y.ino);
    assert_eq!(gets(&b) - before, 1, "and the guess is right again");

    // A renamed sole name: the entry under the new name carries the attributes, and the chmod after it.
    let z = a.create(d.ino, "z", 0o644, true).await.unwrap();
    a.rename(d.ino, "z", d.ino, "z3", 0).await.unwrap();
    a.setattr(z.ino, SetAttrs { mode: Some(0o604), ..SetAttrs::default() }).await.unwrap();
    let before = gets(&b);
    assert_eq!(lookup_from_bank(&b, &truth, d.ino, "z3").await.mode & 0o7777, 0o604);
    assert_eq!(gets(&b) - before, 1, "one round trip");
    assert_eq!(code(b.lookup(d.ino, "z").await), ErrorCode::NotFound);
}

/// Cheap misses for attributes: a client whose every bank lookup misses (another key namespace) pauses asking
/// the bank after 8 misses in a row, probing again after 1, 2, 4, 8… calls; every answer is the MDS's.
#[tokio::test]
async fn a_client_whose_stats_keep_missing_pauses_asking_the_bank() {
    let cl = start_bank_cluster("cattr-miss", 1, true).await;
    let (a, truth) = (bank_client(&cl).await, truth_client(&cl).await);
    let f = a.create(ROOT_INO, "f", 0o644, true).await.unwrap();
    let mut cfg = ClusterConfig::from_spec(&cl.cluster_file().to_string_lossy()).unwrap();
    let cache = cfg.cache.as_mut().unwrap();
    cache.namespace ^= 1;
    (cache.attr_miss_streak_max, cache.attr_miss_skip_max) = (8, 64);
    let b = Client::connect(&cfg).await.unwrap();
    let right = truth.getattr(f.ino).await.unwrap();
    for i in 0..40 {
        assert_eq!(b.getattr(f.ino).await.unwrap(), right, "stat {i}");
    }
    let s = b.bank_stats().unwrap();
    // Calls 0-7 miss; then probes at 9, 12, 17 and 26 (pauses of 1, 2, 4, 8); 27-42 pause for 16.
    assert_eq!((s.gets, s.hits, s.misses), (12, 0, 12), "{s:?}");
    // A lookup is paused alike, and still right.
    assert_eq!(b.lookup(ROOT_INO, "f").await.unwrap(), truth.lookup(ROOT_INO, "f").await.unwrap());
    assert_eq!(b.bank_stats().unwrap().gets, 12);
}
