//! Moving and keeping a namespace (issue 29, docs/format.md §29), with real processes: `weft meta backup` taken
//! from a running service while a client creates files is a consistent snapshot; `weft meta restore` serves it
//! again; `weft meta migrate` moves it to PostgreSQL and back. Every step is checked by comparing a full listing
//! (names, inode numbers, attributes, extended attributes and ACLs, layouts, symlink targets, file contents).

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use common::*;
use weft_client::{Client, OpenMode};
use weft_proto::{DataRedundancy, FileKind, ROOT_INO};

async fn write_file(c: &Client, path: &str, seed: u64, len: usize) {
    let f = c.create_path(path, 0o640, true, false).await.unwrap_or_else(|e| panic!("create {path}: {e}"));
    f.write_at(0, Bytes::from(pattern(seed, 0, len))).await.unwrap();
    f.close().await.unwrap();
}

/// One of each thing a namespace holds: directories, files of several sizes, a symlink, a hard link, user
/// xattrs, access and default ACLs, and an erasure-coded directory with a file in it.
async fn populate(c: &Client) {
    let a = c.mkdir(ROOT_INO, "a", 0o755).await.unwrap().ino;
    let b = c.mkdir(a, "b", 0o750).await.unwrap().ino;
    for i in 0..24u64 {
        write_file(c, &format!("/a/f{i:02}"), i, (i as usize) * 1000 + 1).await;
    }
    write_file(c, "/a/b/deep", 99, 5000).await;
    c.symlink(a, "ln", "f01").await.unwrap();
    let f0 = c.resolve("/a/f00").await.unwrap().ino;
    c.link(f0, ROOT_INO, "hard").await.unwrap();
    let f1 = c.resolve("/a/f01").await.unwrap().ino;
    c.setxattr(f1, "user.colour", b"blue", 0).await.unwrap();
    c.setxattr(f1, "trusted.note", b"root's", 0).await.unwrap();
    let acl = acl_value(&[
        (0x01, 7, u32::MAX),
        (0x02, 5, 1234),
        (0x04, 5, u32::MAX),
        (0x10, 5, u32::MAX),
        (0x20, 0, u32::MAX),
    ]);
    c.setxattr(b, "system.posix_acl_access", &acl, 0).await.unwrap();
    c.setxattr(b, "system.posix_acl_default", &acl, 0).await.unwrap();
    let ec = c.mkdir(ROOT_INO, "ec", 0o755).await.unwrap().ino;
    c.set_layout_with(ec, 64 << 10, 0, DataRedundancy::Ec { k: 2, m: 1 }).await.unwrap();
    write_file(c, "/ec/striped", 7, 300 << 10).await;
}

/// Every name under the root but `/live`, with what it is: attributes (atime aside: reading a file may move
/// it), layout, xattrs with values, symlink target, and for files a CRC of the contents.
async fn listing(c: &Client) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![(String::new(), ROOT_INO)];
    while let Some((path, ino)) = dirs.pop() {
        for e in c.readdir(ino).await.unwrap() {
            let p = format!("{path}/{}", e.name);
            if p == "/live" {
                continue;
            }
            let a = c.getattr(e.ino).await.unwrap();
            let mut what = format!(
                "ino {} {:?} mode {:o} uid {} gid {} nlink {} size {} mtime {} ctime {} dv {} layout {:?}",
                a.ino, a.kind, a.mode, a.uid, a.gid, a.nlink, a.size, a.mtime_ns, a.ctime_ns, a.data_version, a.layout
            );
            for name in c.listxattr(e.ino).await.unwrap() {
                let v = c.getxattr(e.ino, &name).await.unwrap();
                what.push_str(&format!(" xattr {name}={v:02x?}"));
            }
            match a.kind {
                FileKind::Dir => dirs.push((p.clone(), e.ino)),
                FileKind::Symlink => what.push_str(&format!(" -> {}", c.readlink(e.ino).await.unwrap())),
                FileKind::File => {
                    let f = c.open_ino(e.ino, OpenMode::Read).await.unwrap();
                    let bytes = f.read_at(0, BytesMut::zeroed(a.size as usize)).await.unwrap();
                    f.close().await.unwrap();
                    what.push_str(&format!(" crc {:08x}", crc32c::crc32c(&bytes)));
                }
                _ => {}
            }
            out.insert(p, what);
        }
    }
    out
}

/// A client creating `/live/nNNNNN` one after another until told to stop, counting what was acknowledged.
struct Creator {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Creator {
    fn start(c: Client, dir: u64) -> Creator {
        let (stop, acked) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (s, n) = (stop.clone(), acked.clone());
        let task = tokio::spawn(async move {
            for i in 0.. {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                c.create(dir, &format!("n{i:06}"), 0o644, true).await.unwrap();
                n.fetch_add(1, Ordering::SeqCst);
            }
        });
        Creator { stop, acked, task }
    }

    /// Waits until at least `n` creates were acknowledged (each one yields to the runtime: no timing).
    async fn wait_for(&self, n: usize) {
        while self.acked.load(Ordering::SeqCst) < n {
            assert!(!self.task.is_finished(), "the creator failed");
            tokio::task::yield_now().await;
        }
    }

    async fn stop(self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        self.acked.load(Ordering::SeqCst)
    }
}

/// `weft ARGS`, off the runtime; panics with its output unless it succeeds.
async fn weft_ok(t: &TestCluster, args: &[&str]) -> String {
    let (ok, out, err) = weft_status(t, args).await;
    assert!(ok, "weft {args:?} failed: {out}{err}");
    out
}

/// `weft meta check --store SPEC --json`, which must pass.
async fn check_tree(t: &TestCluster, spec: &str) -> serde_json::Value {
    let out = weft_ok(t, &["meta", "check", "--store", spec, "--json"]).await;
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("weft meta check printed {out:?}: {e}"))
}

async fn weft_status(t: &TestCluster, args: &[&str]) -> (bool, String, String) {
    let file = t.cluster_file();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(WEFT).args(&args).env("WEFT_CLUSTER", file).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
    })
    .await
    .unwrap()
}

fn edit_meta_config(dir: &Path, edit: impl FnOnce(String) -> String) {
    let path = dir.join("config/meta.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, edit(text)).unwrap();
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn backup_restore_and_migrate_keep_the_whole_namespace() {
    let mut t = start_with("meta-backup", 3, |o| o.postgres = false).await;
    let c = t.client().await;
    populate(&c).await;
    let before = listing(&c).await;
    assert_eq!(before.len(), 31, "{before:#?}");

    // Online: a client creates names one after another while the backup runs.
    let live = c.mkdir(ROOT_INO, "live", 0o755).await.unwrap().ino;
    let creator = Creator::start(t.client().await, live);
    creator.wait_for(20).await;
    let acked_before = creator.acked.load(Ordering::SeqCst);
    let backup = t.dir.join("backup");
    let out = weft_ok(&t, &["meta", "backup", path_str(&backup), "--json"]).await;
    let acked_after = creator.acked.load(Ordering::SeqCst);
    let acked = creator.stop().await;
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(report["inodes"].as_u64().unwrap() >= 30 + acked_before as u64, "{report}");
    let (ok, _, err) = weft_status(&t, &["meta", "backup", path_str(&backup)]).await;
    assert!(!ok && err.contains("not empty"), "a second backup into the same directory: {err}");
    // The backup is a tree as the service's own checker sees it, with every inode the report counted.
    let checked = check_tree(&t, &format!("redb:{}", backup.display())).await;
    assert_eq!(checked["inodes"], report["inodes"], "{checked}");

    // Restore into the service's data_dir (offline) and serve it again.
    t.stop_mds().await;
    std::fs::rename(t.dir.join("meta"), t.dir.join("meta.before")).unwrap();
    let restored = t.dir.join("meta");
    weft_ok(&t, &["meta", "restore", path_str(&backup), "--to", &format!("redb:{}", restored.display())]).await;
    t.restart_mds().await.unwrap();
    let c = t.client().await;
    assert_eq!(listing(&c).await, before, "the restored namespace");
    // A consistent snapshot of a sequential creator: a prefix of its names, with every one acknowledged before
    // the backup began.
    let names: Vec<String> = c.readdir(live).await.unwrap().into_iter().map(|e| e.name).collect();
    let k = names.len();
    assert!(acked_before <= k && k <= acked_after.max(acked), "{k} names; {acked_before}..{acked_after} acked");
    assert_eq!(names, (0..k).map(|i| format!("n{i:06}")).collect::<Vec<_>>(), "a prefix of the creates");
    // Numbers go on past every one the source handed out (those after the snapshot included).
    let fresh = c.create(ROOT_INO, "after-restore", 0o644, true).await.unwrap().ino;
    let biggest = before.values().map(|v| v.split(' ').nth(1).unwrap().parse::<u64>().unwrap()).max().unwrap();
    assert!(fresh > biggest, "a new inode {fresh} after a restore of inodes up to {biggest}");
    c.unlink(ROOT_INO, "after-restore").await.unwrap();
    let before = listing(&c).await;

    // Migrate to PostgreSQL and serve from it.
    let pg_dir = t.dir.join("pg");
    let mut pg = weft_launch::postgres::start(&pg_dir, &t.dir.join("logs/pg.log"), 60_000).await.unwrap();
    let url = weft_launch::postgres::url(&pg_dir);
    t.stop_mds().await;
    weft_ok(&t, &["meta", "migrate", "--from", &format!("redb:{}", restored.display()), "--to", &url]).await;
    edit_meta_config(&t.dir, |text| format!("{text}\ndb = {url:?}\n"));
    t.restart_mds().await.unwrap();
    let c = t.client().await;
    assert_eq!(listing(&c).await, before, "the namespace on PostgreSQL");
    // Checked while its service runs (PostgreSQL: one snapshot).
    assert_eq!(check_tree(&t, &url).await["ok"], true);
    let from = format!("redb:{}", restored.display());
    let (ok, _, err) = weft_status(&t, &["meta", "migrate", "--from", &from, "--to", &url]).await;
    assert!(!ok && err.contains("not empty"), "a migration into a database in use: {err}");

    // And back to a new embedded store.
    t.stop_mds().await;
    let back = t.dir.join("meta.back");
    weft_ok(&t, &["meta", "migrate", "--from", &url, "--to", &format!("redb:{}", back.display())]).await;
    edit_meta_config(&t.dir, |text| {
        text.lines()
            .filter(|l| !l.starts_with("db ="))
            .map(|l| if l.starts_with("data_dir") { format!("data_dir = {back:?}") } else { l.to_string() })
            .collect::<Vec<_>>()
            .join("\n")
    });
    t.restart_mds().await.unwrap();
    let c = t.client().await;
    assert_eq!(listing(&c).await, before, "the namespace back in redb");

    t.stop().await;
    let pid = pg.id().unwrap();
    std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
    pg.wait().await.unwrap();
}
