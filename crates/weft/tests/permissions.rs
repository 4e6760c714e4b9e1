//! Who may do what, against real server processes: every metadata request acts as the user it carries, mapped by
//! the key its connection proved (cluster key: the asserted user; per-client keys: pinned or root-squashed), and
//! the MDS applies the POSIX rules to that identity, through the library, the CLI and the mount.

use crate::common;

use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use common::mount::Mount;
use common::*;
use weft_client::{Client, ClientError, ClusterConfig, OpenMode};
use weft_proto::{Capability, ErrorCode, FileKind, Rights, SetAttrs, UserCred};

const ALICE: u32 = 1000;
const BOB: u32 = 1001;
const USERS: u32 = 100;
const NOBODY: u32 = 65534;

fn alice() -> UserCred {
    UserCred::new(ALICE, USERS, vec![]).unwrap()
}

fn bob() -> UserCred {
    UserCred::new(BOB, USERS, vec![]).unwrap()
}

fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.code().unwrap_or_else(|| panic!("an error without a code: {e}")),
    }
}

/// `weft key add NAME FLAGS` into the cluster's keyring; returns the client's key file.
fn key_add(cl: &TestCluster, name: &str, flags: &[&str]) -> PathBuf {
    let out = cl.dir().join(format!("{name}.key"));
    let keyring = cl.clients_keyring();
    let mut args = vec!["key", "add", name, "--keyring", keyring.to_str().unwrap(), "--out", out.to_str().unwrap()];
    args.extend_from_slice(flags);
    let (ok, stdout, stderr) = weft(cl, &args);
    assert!(ok, "weft key add {name}: {stderr}");
    assert!(stdout.contains(name), "it says what it did: {stdout}");
    out
}

/// The cluster's config with a per-client key instead of the cluster key.
fn config_with_key(cl: &TestCluster, name: &str, key_file: &Path) -> ClusterConfig {
    ClusterConfig { key_file: Some(key_file.to_path_buf()), key_id: name.into(), ..cl.cluster_config() }
}

/// A directory anyone may create in, made by root.
async fn shared_dir(root: &Client) -> u64 {
    let d = root.mkdir(weft_proto::ROOT_INO, "shared", 0o777).await.unwrap();
    assert_eq!((d.uid, d.mode & 0o7777), (0, 0o777));
    d.ino
}

async fn write_file(c: &Client, path: &str, mode: u32, data: &'static [u8]) -> u64 {
    let f = c.create_path(path, mode, true, false).await.unwrap();
    let ino = f.ino();
    f.write_at(0, Bytes::from_static(data)).await.unwrap();
    f.close().await.unwrap();
    ino
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_cannot_read_chmod_or_chown_another_users_private_file() {
    let cl = start("perm-users", 2).await;
    let root = cl.client().await;
    shared_dir(&root).await;
    let (a, b) = (root.with_user(alice()), root.with_user(bob()));
    let ino = write_file(&b, "/shared/b", 0o600, b"bob's secret").await;
    let attr = root.getattr(ino).await.unwrap();
    assert_eq!((attr.uid, attr.gid, attr.mode & 0o7777), (BOB, USERS, 0o600), "owned by its creator's credential");

    // Bob reads his own file; Alice may not open it.
    let f = b.open("/shared/b", OpenMode::Read).await.unwrap();
    assert_eq!(&f.read_at(0, BytesMut::zeroed(12)).await.unwrap()[..], b"bob's secret");
    assert_eq!(code(a.open("/shared/b", OpenMode::Read).await.map(|f| f.ino())), ErrorCode::Permission, "EACCES");
    // Nor chmod it, chown it, or give it to herself (EPERM: reserved to the owner or root).
    let chmod = SetAttrs { mode: Some(0o644), ..SetAttrs::default() };
    assert_eq!(code(a.setattr(ino, chmod.clone()).await), ErrorCode::NotPermitted);
    let chown = SetAttrs { uid: Some(ALICE), ..SetAttrs::default() };
    assert_eq!(code(a.setattr(ino, chown).await), ErrorCode::NotPermitted);
    // Truncating needs write permission (EACCES).
    assert_eq!(code(a.setattr(ino, SetAttrs { size: Some(0), ..SetAttrs::default() }).await), ErrorCode::Permission);
    assert_eq!(root.getattr(ino).await.unwrap(), attr, "nothing changed");
    // Bob may chmod his file; root may chown it.
    assert_eq!(b.setattr(ino, chmod).await.unwrap().mode & 0o7777, 0o644);
    let a_open = a.open("/shared/b", OpenMode::Read).await.unwrap();
    assert_eq!(&a_open.read_at(0, BytesMut::zeroed(5)).await.unwrap()[..], b"bob's");
    assert_eq!(root.setattr(ino, SetAttrs { uid: Some(ALICE), ..SetAttrs::default() }).await.unwrap().uid, ALICE);
}

#[tokio::test(flavor = "multi_thread")]
async fn set_user_id_is_cleared_by_a_non_owners_write_and_device_nodes_are_roots() {
    let cl = start("perm-suid", 2).await;
    let root = cl.client().await;
    let shared = shared_dir(&root).await;
    let a = root.with_user(alice());
    let suid = root.create(shared, "suid", 0o4777, true).await.unwrap();
    assert_eq!(suid.mode & 0o7777, 0o4777);
    // Alice may write (mode 777): her write, committed at close, clears set-user-ID.
    let f = a.open("/shared/suid", OpenMode::ReadWrite).await.unwrap();
    f.write_at(0, Bytes::from_static(b"#!/bin/sh\n")).await.unwrap();
    f.close().await.unwrap();
    let after = root.getattr(suid.ino).await.unwrap();
    assert_eq!((after.mode & 0o7777, after.size), (0o777, 10), "set-user-ID dropped on a non-owner's write");
    // Root's own write keeps it.
    root.setattr(suid.ino, SetAttrs { mode: Some(0o4755), ..SetAttrs::default() }).await.unwrap();
    let f = root.open("/shared/suid", OpenMode::ReadWrite).await.unwrap();
    f.write_at(0, Bytes::from_static(b"#")).await.unwrap();
    f.close().await.unwrap();
    assert_eq!(root.getattr(suid.ino).await.unwrap().mode & 0o7777, 0o4755);

    // Device nodes: root only (EPERM); a FIFO is anyone's, and theirs.
    assert_eq!(code(a.mknod(shared, "tty", FileKind::CharDev, 0o666, 0x0501).await), ErrorCode::NotPermitted);
    assert_eq!(code(a.mknod(shared, "sda", FileKind::BlockDev, 0o666, 0x0800).await), ErrorCode::NotPermitted);
    assert!(code(root.lookup(shared, "tty").await) == ErrorCode::NotFound);
    let fifo = a.mknod(shared, "pipe", FileKind::Fifo, 0o644, 0).await.unwrap();
    assert_eq!((fifo.uid, fifo.gid), (ALICE, USERS));
    let dev = root.mknod(shared, "tty", FileKind::CharDev, 0o666, 0x0501).await.unwrap();
    assert_eq!((dev.uid, dev.rdev), (0, 0x0501));
}

#[tokio::test(flavor = "multi_thread")]
async fn per_client_keys_pin_or_squash_the_user_and_unknown_keys_are_refused() {
    let cl = start("perm-keys", 2).await;
    let root = cl.client().await;
    let shared = shared_dir(&root).await;
    let secret = write_file(&root, "/shared/root-only", 0o600, b"root's").await;

    // Keys added while the cluster runs work at once (the servers re-read the keyring).
    let squash_key = key_add(&cl, "lab", &["--squash-root"]);
    let fixed_key = key_add(&cl, "alice-laptop", &["--uid", "4242", "--gid", "4343"]);
    let (_, listed, _) = weft(&cl, &["key", "list", "--keyring", cl.clients_keyring().to_str().unwrap()]);
    assert_eq!(listed, "alice-laptop uid=4242,gid=4343\nlab squash-root\n");
    assert!(!listed.contains(&std::fs::read_to_string(&fixed_key).unwrap()[12..40]), "keys are never printed");

    // Root squash: this process asserts uid 0; the MDS makes it nobody.
    let squashed = Client::connect(&config_with_key(&cl, "lab", &squash_key)).await.unwrap();
    assert_eq!(squashed.user().uid, 0, "the process asserts root");
    let made = squashed.create(shared, "by-squashed-root", 0o644, true).await.unwrap();
    assert_eq!((made.uid, made.gid), (NOBODY, NOBODY));
    let as_root_asserted = squashed.with_user(UserCred::new(0, 0, vec![0]).unwrap());
    let chmod = SetAttrs { mode: Some(0o644), ..SetAttrs::default() };
    assert_eq!(code(as_root_asserted.setattr(secret, chmod.clone()).await), ErrorCode::NotPermitted);
    assert_eq!(code(as_root_asserted.unlink(weft_proto::ROOT_INO, "shared").await), ErrorCode::Permission);
    assert_eq!(code(as_root_asserted.mknod(shared, "tty", FileKind::CharDev, 0o666, 1).await), ErrorCode::NotPermitted);
    // Nor may a squashed root read root's 0600 file: the MDS refuses the capability, so no data server serves it.
    assert_eq!(
        code(as_root_asserted.open("/shared/root-only", OpenMode::Read).await.map(|f| f.ino())),
        ErrorCode::Permission
    );
    // Other users pass through as they are.
    let a = squashed.with_user(alice()).create(shared, "by-alice", 0o644, true).await.unwrap();
    assert_eq!((a.uid, a.gid), (ALICE, USERS));

    // A fixed identity: whatever the process asserts, it acts as 4242:4343.
    let fixed = Client::connect(&config_with_key(&cl, "alice-laptop", &fixed_key)).await.unwrap();
    for asserted in [UserCred::new(0, 0, vec![]).unwrap(), bob()] {
        let name = format!("fixed-{}", asserted.uid);
        let made = fixed.with_user(asserted).create(shared, &name, 0o644, true).await.unwrap();
        assert_eq!((made.uid, made.gid), (4242, 4343));
    }
    assert_eq!(code(fixed.setattr(secret, chmod).await), ErrorCode::NotPermitted);
    assert_eq!(code(fixed.open("/shared/root-only", OpenMode::Read).await.map(|f| f.ino())), ErrorCode::Permission);
    let chown = SetAttrs { uid: Some(4242), ..SetAttrs::default() };
    assert_eq!(code(fixed.setattr(secret, chown).await), ErrorCode::NotPermitted);
    assert_eq!(root.getattr(secret).await.unwrap().mode & 0o7777, 0o600);

    // A key that was never added, and a removed one, open no session.
    let stranger_key = cl.dir().join("stranger.key");
    weft_rpc::Key::create_file(&stranger_key).unwrap();
    let e = Client::connect(&config_with_key(&cl, "stranger", &stranger_key)).await.err().expect("refused");
    assert!(e.to_string().contains("unknown key id \"stranger\""), "{e}");
    let (ok, _, stderr) = weft(&cl, &["key", "remove", "lab", "--keyring", cl.clients_keyring().to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let e = Client::connect(&config_with_key(&cl, "lab", &squash_key)).await.err().expect("refused once removed");
    assert!(e.to_string().contains("unknown key id \"lab\""), "{e}");
    // Someone else's key file (the cluster key) under a client's name proves nothing.
    let e = Client::connect(&config_with_key(&cl, "alice-laptop", &cl.key_file())).await.err().expect("refused");
    assert!(e.to_string().contains("could not prove it holds key \"alice-laptop\""), "{e}");
    // Duplicate names and bad names are refused by `weft key add`.
    let keyring = cl.clients_keyring();
    let other = cl.dir().join("dup.key");
    let args = ["key", "add", "alice-laptop", "--keyring", keyring.to_str().unwrap(), "--out", other.to_str().unwrap()];
    let (ok, _, stderr) = weft(&cl, &args);
    assert!(!ok && stderr.contains("already has"), "{stderr}");
    assert!(!other.exists(), "no key file is left behind");
    let (ok, _, _) = weft(&cl, &["key", "add", "cluster", "--keyring", keyring.to_str().unwrap()]);
    assert!(!ok, "\"cluster\" is the cluster key's name");
}

/// Inode numbers are sequential, so an unprivileged client walks them (issue 31): every request that names an
/// inode by number (getattr, readlink, open, readdir, lookup in it, xattrs, a lock) needs search permission on
/// the directories above it, as a path walk would. Bob, on a key pinned to his uid (and a root-squashed host
/// asserting him), reaches nothing under Alice's 0700 home; what lies in a public directory he reaches; a
/// trusted host (the cluster key: a mount's kernel walks paths itself) is not confined.
#[tokio::test(flavor = "multi_thread")]
async fn a_walk_of_inode_numbers_by_another_user_reaches_nothing_behind_a_private_directory() {
    let cl = start("perm-walk", 2).await;
    let root = cl.client().await;
    let home = root.mkdir(weft_proto::ROOT_INO, "alice", 0o700).await.unwrap().ino;
    let own = SetAttrs { uid: Some(ALICE), gid: Some(USERS), ..SetAttrs::default() };
    root.setattr(home, own.clone()).await.unwrap();
    let a = root.with_user(alice());
    let docs = a.mkdir(home, "docs", 0o755).await.unwrap().ino;
    let hidden = write_file(&a, "/alice/docs/diary", 0o644, b"dear diary").await;
    let link = a.symlink(docs, "latest", "diary").await.unwrap().ino;
    let public = shared_dir(&root).await;
    let open = write_file(&a, "/shared/notes", 0o644, b"for all").await;
    let behind = [docs, hidden, link];

    let bob_key = key_add(&cl, "bob-laptop", &["--uid", &BOB.to_string(), "--gid", &USERS.to_string()]);
    let lab_key = key_add(&cl, "lab", &["--squash-root"]);
    let pinned = Client::connect(&config_with_key(&cl, "bob-laptop", &bob_key)).await.unwrap();
    let squashed = Client::connect(&config_with_key(&cl, "lab", &lab_key)).await.unwrap().with_user(bob());
    let last = root.create(public, "last", 0o644, true).await.unwrap().ino;
    for (who, c) in [("pinned", &pinned), ("squashed", &squashed)] {
        let mut reached = Vec::new();
        for ino in 1..=last {
            match c.getattr(ino).await {
                Ok(_) => reached.push(ino),
                Err(e) => assert!(
                    matches!(e.code(), Some(ErrorCode::Permission | ErrorCode::NotFound)),
                    "{who}: getattr {ino}: {e}"
                ),
            }
        }
        assert!(behind.iter().all(|i| !reached.contains(i)), "{who} reached {reached:?}, behind {behind:?}");
        // The home itself is in the root, which Bob may search: he sees it (stat /alice works; ls does not).
        for ino in [weft_proto::ROOT_INO, home, public, open, last] {
            assert!(reached.contains(&ino), "{who} reaches {ino}: {reached:?}");
        }
        // Every other way of naming an inode is refused the same way.
        assert_eq!(code(c.readlink(link).await), ErrorCode::Permission, "{who}");
        assert_eq!(code(c.open_ino(hidden, OpenMode::Read).await.map(|f| f.ino())), ErrorCode::Permission, "{who}");
        assert_eq!(code(c.readdir(docs).await), ErrorCode::Permission, "{who}");
        assert_eq!(code(c.lookup(docs, "diary").await), ErrorCode::Permission, "{who}");
        assert_eq!(code(c.listxattr(hidden).await), ErrorCode::Permission, "{who}");
        assert_eq!(code(c.create(docs, "planted", 0o644, true).await), ErrorCode::Permission, "{who}");
        // What Bob may reach he reads.
        let f = c.open_ino(open, OpenMode::Read).await.unwrap();
        let read = f.read_at(0, BytesMut::zeroed(7)).await.unwrap();
        assert_eq!(&read[..], b"for all", "{who}");
    }
    // Opened up, the same inodes are reached by number; Alice reaches her own; a trusted host is not confined.
    a.setattr(home, SetAttrs { mode: Some(0o755), ..SetAttrs::default() }).await.unwrap();
    assert_eq!(pinned.readlink(link).await.unwrap(), "diary");
    let pinned_alice = key_add(&cl, "alice-laptop", &["--uid", &ALICE.to_string(), "--gid", &USERS.to_string()]);
    let pinned_alice = Client::connect(&config_with_key(&cl, "alice-laptop", &pinned_alice)).await.unwrap();
    a.setattr(home, SetAttrs { mode: Some(0o700), ..SetAttrs::default() }).await.unwrap();
    assert_eq!(pinned.getattr(hidden).await.map(|a| a.ino).map_err(|e| e.code()), Err(Some(ErrorCode::Permission)));
    assert_eq!(pinned_alice.getattr(hidden).await.unwrap().ino, hidden);
    assert_eq!(root.with_user(bob()).getattr(hidden).await.unwrap().ino, hidden, "the cluster key is a trusted host");
}

/// A capability renewed for a file held open (`RenewOpen`): its owner keeps the open's rights whatever the mode, as
/// knfsd's owner override (`cp` of a 0444 file creates it 0444 and may write for minutes), while a non-owner's
/// right taken away by a chmod ends at the next renewal. Capabilities live 1.5 s here (renewed after 1 s); each
/// wait is past the renewal point of the capability the write before it used.
#[tokio::test(flavor = "multi_thread")]
async fn an_owner_keeps_writing_a_read_only_file_it_holds_open_past_renewals_and_others_do_not() {
    const TTL_MS: u64 = 1_500;
    let cl =
        common::start_with("perm-renew", 2, |o| o.meta_extra_toml = format!("capability_ttl_ms = {TTL_MS}\n")).await;
    let root = cl.client().await;
    let shared = shared_dir(&root).await;
    let a = root.with_user(alice());
    let past_renewal = || tokio::time::sleep(std::time::Duration::from_millis(TTL_MS));

    // Created 0444 and written across three renewals by its owner.
    let f = a.create_path("/shared/ro", 0o444, true, false).await.unwrap();
    for (i, part) in [b"one ", b"two ", b"six "].iter().enumerate() {
        f.write_at(i as u64 * 4, Bytes::from_static(*part)).await.unwrap_or_else(|e| panic!("write {i}: {e}"));
        past_renewal().await;
    }
    f.close().await.unwrap();
    let back = a.open("/shared/ro", OpenMode::Read).await.unwrap();
    assert_eq!(&back.read_at(0, BytesMut::zeroed(12)).await.unwrap()[..], b"one two six ");
    assert_eq!(code(a.open("/shared/ro", OpenMode::Write).await.map(|f| f.ino())), ErrorCode::Permission, "a new open");
    // A renewal without a genuine capability of that open proves nothing: the mode decides.
    let forged = Capability { ino: back.ino(), rights: Rights::READ_WRITE, ..Capability::none() };
    assert_eq!(code(a.renew_capability(back.ino(), Rights::READ_WRITE, &forged).await), ErrorCode::Permission);

    // Bob writes through the group's right until Alice takes it away: then his renewal is refused.
    let g = a.create(shared, "group", 0o664, true).await.unwrap();
    let b = root.with_user(bob());
    let bf = b.open_ino(g.ino, OpenMode::Write).await.unwrap();
    bf.write_at(0, Bytes::from_static(b"bob")).await.unwrap();
    a.setattr(g.ino, SetAttrs { mode: Some(0o644), ..SetAttrs::default() }).await.unwrap();
    past_renewal().await;
    let e = bf.write_at(3, Bytes::from_static(b"!")).await.expect_err("a right taken away ends at renewal");
    assert_eq!(e.code(), Some(ErrorCode::Permission), "{e}");
}

/// One per-client key cannot fill the MDS's shared tables (issue 31): past `sessions_per_key_max` (4 here) its next
/// session is refused naming the key, and a session of it past `locks_per_client_session_max` (8 here) gets ENOLCK
/// naming the key, while the cluster key's clients connect and lock as before. On one service (locks in its
/// memory) and on two services sharing PostgreSQL (locks in the database, counted in the session's record).
async fn one_client_key_cannot_fill_the_session_and_lock_tables(name: &str, shared_db: bool) {
    let cl = common::start_with(name, 1, |o| {
        o.meta_extra_toml = "sessions_per_key_max = 4\nlocks_per_client_session_max = 8\n".into();
        if shared_db {
            (o.postgres, o.meta_services) = (true, 2);
        }
    })
    .await;
    let root = cl.client().await;
    let shared = shared_dir(&root).await;
    let lab_key = key_add(&cl, "lab", &["--squash-root"]);
    let mut lab = Vec::new();
    for _ in 0..4 {
        lab.push(Client::connect(&config_with_key(&cl, "lab", &lab_key)).await.unwrap().with_user(alice()));
    }
    // The session quota is each service's (sessions live in its memory): checked where one service serves them all.
    if !shared_db {
        let e = Client::connect(&config_with_key(&cl, "lab", &lab_key)).await.err().expect("a fifth session");
        assert!(e.to_string().contains("lab"), "the refusal names the key: {e}");
    }
    let others = cl.client().await;

    let f = lab[0].create(shared, "locked", 0o666, true).await.unwrap();
    let lock = |start: u64| weft_proto::msg::SetLockReq {
        ino: f.ino,
        class: weft_proto::msg::LockClass::Posix,
        kind: Some(weft_proto::msg::LockKind::Exclusive),
        start,
        end: start,
        owner: 7,
        pid: 1,
    };
    for i in 0..8 {
        assert_eq!(lab[0].set_lock(lock(2 * i)).await.unwrap(), None, "lock {i}");
    }
    let e = lab[0].set_lock(lock(100)).await.expect_err("a ninth lock");
    assert_eq!(e.code(), Some(ErrorCode::NoLocks), "{e}");
    assert!(e.to_string().contains("lab"), "the refusal names the key: {e}");
    // An unlock is never refused, and frees room.
    lab[0].set_lock(weft_proto::msg::SetLockReq { kind: None, ..lock(0) }).await.unwrap();
    assert_eq!(lab[0].set_lock(lock(100)).await.unwrap(), None);
    // Another session of the key has a quota of its own; the cluster key's clients are bounded by the table only.
    assert_eq!(lab[1].set_lock(weft_proto::msg::SetLockReq { owner: 8, ..lock(1) }).await.unwrap(), None);
    for i in 0..20 {
        let req = weft_proto::msg::SetLockReq { owner: 9, ..lock(1000 + 2 * i) };
        assert_eq!(others.set_lock(req).await.unwrap(), None, "the cluster key's lock {i}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_client_key_cannot_fill_the_session_and_lock_tables_of_one_service() {
    one_client_key_cannot_fill_the_session_and_lock_tables("perm-quota", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_client_key_cannot_fill_the_lock_records_of_services_sharing_a_database() {
    one_client_key_cannot_fill_the_session_and_lock_tables("perm-quota-pg", true).await;
}

/// Runs `weft ARGS` as uid/gid 1000 with no supplementary groups, over tcp (the shm socket belongs to root).
fn weft_as_1000(cluster_file: &Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", WEFT])
        .args(args)
        .env("WEFT_CLUSTER", cluster_file)
        .env("WEFT_FABRIC", "tcp")
        .output()
        .expect("running setpriv");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_run_by_a_local_user_with_its_own_key_acts_as_that_user() {
    let cl = start("perm-cli", 2).await;
    let root = cl.client().await;
    let shared = shared_dir(&root).await;
    write_file(&root, "/shared/root-only", 0o600, b"root's").await;
    write_file(&root, "/shared/public", 0o644, b"anyone's").await;
    // A trusted-host key for this machine, owned by the local user 1000 (its key file must be theirs, 0600).
    let key = key_add(&cl, "workstation", &[]);
    std::os::unix::fs::chown(&key, Some(1000), Some(1000)).unwrap();
    let cluster_file = cl.dir().join("workstation.toml");
    let cfg = config_with_key(&cl, "workstation", &key);
    std::fs::write(&cluster_file, cfg.to_toml()).unwrap();

    let (ok, out, err) = weft_as_1000(&cluster_file, &["cat", "/shared/public"]);
    assert!(ok, "{err}");
    assert_eq!(out, "anyone's");
    let (ok, _, err) = weft_as_1000(&cluster_file, &["cat", "/shared/root-only"]);
    assert!(!ok, "a 0600 file of root is refused");
    assert!(err.to_lowercase().contains("permission denied"), "{err}");
    let local = cl.dir().join("local.txt");
    std::fs::write(&local, b"mine").unwrap();
    let (ok, _, err) = weft_as_1000(&cluster_file, &["put", local.to_str().unwrap(), "/shared/mine"]);
    assert!(ok, "{err}");
    let mine = root.lookup(shared, "mine").await.unwrap();
    assert_eq!((mine.uid, mine.gid), (1000, 1000), "the CLI acts as whoever runs it");
    let (ok, _, err) = weft_as_1000(&cluster_file, &["rm", "/shared/root-only"]);
    assert!(ok, "a 0777 directory lets anyone remove entries: {err}");
    let (ok, _, _) = weft_as_1000(&cluster_file, &["mkdir", "/not-in-root"]);
    assert!(!ok, "the root directory is root's, 0755");
    // The cluster key file is root's: the user cannot use it.
    let (ok, _, err) = weft_as_1000(&cl.cluster_file(), &["ls", "/"]);
    assert!(!ok && err.contains("cluster.key"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mount_acts_as_each_caller_and_is_nosuid_nodev() {
    let cl = start("perm-fuse", 2).await;
    let root = cl.client().await;
    shared_dir(&root).await;
    write_file(&root, "/shared/root-only", 0o600, b"root's").await;
    write_file(&root, "/shared/public", 0o644, b"anyone's").await;
    let m = Mount::start(&cl, &test_dir("perm-fuse-mnt"), &["--allow-other"]);
    let mnt = m.dir.clone();
    let opts = std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(mnt.to_str().unwrap()))
        .map(|l| l.split(' ').nth(3).unwrap().to_string())
        .expect("mounted");
    assert!(opts.split(',').any(|o| o == "nosuid") && opts.split(',').any(|o| o == "nodev"), "{opts}");

    let as_1000 = |args: &[&str]| {
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=1000", "--regid=1000", "--clear-groups"])
            .args(args)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let path = |rel: &str| mnt.join(rel).to_string_lossy().into_owned();
    assert_eq!(as_1000(&["cat", &path("shared/public")]), (true, "anyone's".to_string()));
    assert!(!as_1000(&["cat", &path("shared/root-only")]).0, "mode 0600 of root refuses uid 1000");
    assert!(as_1000(&["touch", &path("shared/made-by-1000")]).0);
    let made = root.resolve("/shared/made-by-1000").await.unwrap();
    assert_eq!((made.uid, made.gid), (1000, 1000), "the MDS owns it to the caller, not to the mount's process");
    // A set-user-ID copy of `id` on the mount runs as its caller (nosuid).
    let id = std::fs::read("/usr/bin/id").unwrap();
    let suid_id = m.path("shared/suid-id");
    std::fs::write(&suid_id, id).unwrap();
    std::fs::set_permissions(&suid_id, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    assert_eq!(root.resolve("/shared/suid-id").await.unwrap().mode & 0o7777, 0o4755);
    let (ok, out) = as_1000(&[suid_id.to_str().unwrap(), "-u"]);
    assert!(ok);
    assert_eq!(out.trim(), "1000", "set-user-ID is not honoured on a nosuid mount");
    drop(m);
}

/// What a write or truncate by a caller without CAP_FSETID leaves of a regular file's set-ID bits (Linux's
/// `setattr_should_drop_suidgid`): (mode, whether the writer is in the file's group, mode after).
const SET_ID_CASES: [(u32, bool, u32); 5] = [
    (0o4777, false, 0o777),
    // Set-group-ID with group execute goes, even for a member of the group.
    (0o2777, true, 0o777),
    (0o6777, false, 0o777),
    // Without group execute it marks mandatory locking, not a privilege: it stays for a member of the group...
    (0o2767, true, 0o2767),
    // ... and goes for anyone else (Linux since 6.2).
    (0o2767, false, 0o767),
];

/// A file of root's with `mode` and group `gid` in `dir`; its inode.
async fn set_id_file(root: &Client, dir: u64, name: &str, mode: u32, gid: u32) -> u64 {
    let ino = root.create(dir, name, 0o644, true).await.unwrap().ino;
    let set = SetAttrs { mode: Some(mode), gid: Some(gid), ..SetAttrs::default() };
    assert_eq!(root.setattr(ino, set).await.unwrap().mode & 0o7777, mode);
    ino
}

#[tokio::test(flavor = "multi_thread")]
async fn set_id_bits_go_when_a_non_owner_writes_or_truncates_through_the_library() {
    let cl = start("perm-setid-lib", 2).await;
    let root = cl.client().await;
    let shared = shared_dir(&root).await;
    let a = root.with_user(alice());
    for (n, &(mode, in_group, after)) in SET_ID_CASES.iter().enumerate() {
        let gid = if in_group { USERS } else { 0 };
        for how in ["write", "ftruncate", "truncate"] {
            let name = format!("f{n}-{how}");
            let ino = set_id_file(&root, shared, &name, mode, gid).await;
            let path = format!("/shared/{name}");
            match how {
                // Dropped when the write is committed (close).
                "write" => {
                    let f = a.open(&path, OpenMode::ReadWrite).await.unwrap();
                    f.write_at(0, Bytes::from_static(b"x")).await.unwrap();
                    f.close().await.unwrap();
                }
                // Through the open file: its write capability is the right (SetSizeOpen).
                "ftruncate" => {
                    let f = a.open(&path, OpenMode::Write).await.unwrap();
                    f.truncate(1).await.unwrap();
                    f.close().await.unwrap();
                }
                // By path: write permission by the mode (SetAttr).
                _ => {
                    a.setattr(ino, SetAttrs { size: Some(1), ..SetAttrs::default() }).await.unwrap();
                }
            }
            let got = root.getattr(ino).await.unwrap().mode & 0o7777;
            assert_eq!(got, after, "{how} of a {mode:o} file (in its group: {in_group}) by uid {ALICE}");
        }
    }
    // Root (CAP_FSETID) keeps them, writing or truncating.
    let ino = set_id_file(&root, shared, "roots", 0o6777, 0).await;
    let f = root.open("/shared/roots", OpenMode::ReadWrite).await.unwrap();
    f.write_at(0, Bytes::from_static(b"#!")).await.unwrap();
    f.truncate(1).await.unwrap();
    f.close().await.unwrap();
    assert_eq!(root.getattr(ino).await.unwrap().mode & 0o7777, 0o6777);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_truncate_through_an_open_file_has_the_opens_right_and_needs_its_write_capability() {
    let cl = start("perm-setsize", 2).await;
    let root = cl.client().await;
    shared_dir(&root).await;
    let a = root.with_user(alice());
    // open(O_CREAT|O_RDWR, 0) then ftruncate: the creator's open may write, whatever the mode.
    let f = a.create_path("/shared/zero", 0, true, false).await.unwrap();
    f.truncate(10).await.unwrap();
    f.write_at(0, Bytes::from_static(b"abc")).await.unwrap();
    f.close().await.unwrap();
    let zero = root.resolve("/shared/zero").await.unwrap();
    assert_eq!((zero.mode & 0o7777, zero.size, zero.uid), (0, 10, ALICE));
    // A path truncate checks the mode now: EACCES, even for the owner.
    let trunc = SetAttrs { size: Some(5), ..SetAttrs::default() };
    assert_eq!(code(a.setattr(zero.ino, trunc).await), ErrorCode::Permission);

    // The MDS believes no claim: no capability, a read one, another file's, or one whose inode was changed.
    let ino = write_file(&root, "/shared/roots", 0o644, b"root's bytes").await;
    let hers = write_file(&a, "/shared/hers", 0o600, b"hers").await;
    assert_eq!(code(a.set_size_open(ino, 0, Capability::none()).await), ErrorCode::CapabilityRefused);
    let read = a.open_capability(ino, Rights::READ).await.unwrap().cap;
    assert_eq!(code(a.set_size_open(ino, 0, read).await), ErrorCode::CapabilityRefused);
    let write = a.open_capability(hers, Rights::WRITE).await.unwrap().cap;
    assert_eq!(code(a.set_size_open(ino, 0, write.clone()).await), ErrorCode::CapabilityRefused);
    let forged = Capability { ino, ..write.clone() };
    assert_eq!(code(a.set_size_open(ino, 0, forged).await), ErrorCode::CapabilityRefused);
    assert_eq!(root.getattr(ino).await.unwrap().size, 12, "nothing was cut");
    // Her write capability works for her file, though its mode no longer grants writing.
    root.setattr(hers, SetAttrs { mode: Some(0o400), ..SetAttrs::default() }).await.unwrap();
    assert_eq!(a.set_size_open(hers, 2, write).await.unwrap().size, 2);
}

/// Runs python3 `code` (argv[1:] = `args`) as uid/gid 1000 with no supplementary groups; its stdout, trimmed,
/// or its stderr as the error.
fn py_as_1000(code: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", "/usr/bin/python3", "-c", code])
        .args(args)
        .output()
        .expect("running setpriv python3");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Each prints the mode (octal) seen through the descriptor right after the change, then by path after close.
const PY_WRITE: &str = "import os,sys\np=sys.argv[1]\nfd=os.open(p,os.O_WRONLY)\nos.write(fd,b'x')\n\
    m=os.fstat(fd).st_mode\nos.close(fd)\nprint('%o %o'%(m&0o7777,os.stat(p).st_mode&0o7777))";
const PY_FTRUNCATE: &str = "import os,sys\np=sys.argv[1]\nfd=os.open(p,os.O_WRONLY)\nos.ftruncate(fd,1)\n\
    m=os.fstat(fd).st_mode\nos.close(fd)\nprint('%o %o'%(m&0o7777,os.stat(p).st_mode&0o7777))";
const PY_O_TRUNC: &str = "import os,sys\np=sys.argv[1]\nfd=os.open(p,os.O_WRONLY|os.O_TRUNC)\n\
    m=os.fstat(fd).st_mode\nos.close(fd)\nprint('%o %o'%(m&0o7777,os.stat(p).st_mode&0o7777))";
const PY_TRUNCATE: &str = "import os,sys\np=sys.argv[1]\nos.truncate(p,1)\nm=os.stat(p).st_mode\n\
    print('%o %o'%(m&0o7777,m&0o7777))";

/// Every way a file's size or bytes change through the mount, as a script run by uid 1000 (one per path).
const SET_ID_WAYS: [(&str, &str); 4] =
    [("write", PY_WRITE), ("ftruncate", PY_FTRUNCATE), ("o_trunc", PY_O_TRUNC), ("truncate", PY_TRUNCATE)];

#[tokio::test(flavor = "multi_thread")]
async fn set_id_bits_go_when_a_non_owner_writes_or_truncates_through_the_mount() {
    let cl = start("perm-setid-fuse", 2).await;
    let root = cl.client().await;
    let shared = shared_dir(&root).await;
    let m = Mount::start(&cl, &test_dir("perm-setid-fuse-mnt"), &["--allow-other"]);
    for (n, &(mode, in_group, after)) in SET_ID_CASES.iter().enumerate() {
        // The writer is uid 1000 in group 1000 only.
        let gid = if in_group { 1000 } else { 0 };
        for (how, code) in SET_ID_WAYS {
            let name = format!("f{n}-{how}");
            let ino = set_id_file(&root, shared, &name, mode, gid).await;
            let seen = py_as_1000(code, &[m.path(&format!("shared/{name}")).to_str().unwrap()]);
            // The kernel sees the bits gone at once (FUSE_HANDLE_KILLPRIV_V2 leaves them to the server).
            let want = format!("{after:o} {after:o}");
            assert_eq!(seen, Ok(want), "{how} of a {mode:o} file (in its group: {in_group}) by uid 1000");
            assert_eq!(root.getattr(ino).await.unwrap().mode & 0o7777, after, "{how}: the MDS agrees");
        }
    }
    // Root (CAP_FSETID: the kernel does not flag its writes) keeps them.
    let ino = set_id_file(&root, shared, "roots", 0o6777, 0).await;
    let mut f = std::fs::OpenOptions::new().write(true).open(m.path("shared/roots")).unwrap();
    std::io::Write::write_all(&mut f, b"#!").unwrap();
    f.set_len(1).unwrap();
    drop(f);
    assert_eq!(root.getattr(ino).await.unwrap().mode & 0o7777, 0o6777);
    drop(m);
}

#[tokio::test(flavor = "multi_thread")]
async fn ftruncate_on_the_mount_has_the_right_of_the_open() {
    let cl = start("perm-ftrunc-fuse", 2).await;
    let root = cl.client().await;
    shared_dir(&root).await;
    let m = Mount::start(&cl, &test_dir("perm-ftrunc-fuse-mnt"), &["--allow-other"]);
    // Created O_CREAT|O_RDWR with mode 0: ftruncate and write through the descriptor work, truncate(2) of the
    // path does not (the right comes from the open, as on Linux).
    let code = "import os,sys\np=sys.argv[1]\nfd=os.open(p,os.O_CREAT|os.O_RDWR,0)\nos.ftruncate(fd,10)\n\
        os.write(fd,b'abc')\ns=os.fstat(fd)\nos.close(fd)\n\
        try:\n    os.truncate(p,5)\n    t='truncated'\nexcept PermissionError:\n    t='EACCES'\n\
        print(s.st_size,'%o'%(s.st_mode&0o7777),t)";
    let seen = py_as_1000(code, &[m.path("shared/zero").to_str().unwrap()]);
    assert_eq!(seen, Ok("10 0 EACCES".to_string()));
    let zero = root.resolve("/shared/zero").await.unwrap();
    assert_eq!((zero.size, zero.mode & 0o7777, zero.uid), (10, 0, 1000));
    let f = root.open("/shared/zero", OpenMode::Read).await.unwrap();
    assert_eq!(&f.read_at(0, BytesMut::zeroed(10)).await.unwrap()[..], b"abc\0\0\0\0\0\0\0");
    drop(m);
}

#[tokio::test(flavor = "multi_thread")]
async fn set_id_bits_go_through_a_mount_without_killpriv() {
    let cl = start("perm-setid-nokp", 2).await;
    let root = cl.client().await;
    let shared = shared_dir(&root).await;
    // The kernel drops the bits itself, by a chmod as the writer, which the mount turns into the MDS's drop.
    let extra = ["--allow-other", "--no-killpriv", "--attr-timeout-ms", "0"];
    let m = Mount::start(&cl, &test_dir("perm-setid-nokp-mnt"), &extra);
    for (n, &(mode, in_group, after)) in SET_ID_CASES.iter().enumerate() {
        let gid = if in_group { 1000 } else { 0 };
        for (how, code) in SET_ID_WAYS {
            let name = format!("f{n}-{how}");
            let ino = set_id_file(&root, shared, &name, mode, gid).await;
            let seen = py_as_1000(code, &[m.path(&format!("shared/{name}")).to_str().unwrap()]);
            // Once closed (the kernel's own rule may leave a bit the MDS drops at the commit).
            let closed = seen.map(|s| s.split(' ').next_back().unwrap_or_default().to_string());
            assert_eq!(closed, Ok(format!("{after:o}")), "{how} of a {mode:o} file (in its group: {in_group})");
            assert_eq!(root.getattr(ino).await.unwrap().mode & 0o7777, after, "{how}: the MDS agrees");
        }
    }
    drop(m);
}
