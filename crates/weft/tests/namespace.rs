//! Namespace semantics against a real cluster: every operation and its error cases.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::*;
use weft_client::{Client, OpenMode};
use weft_proto::msg::RENAME_NOREPLACE;
use weft_proto::{ErrorCode, FileKind, ROOT_INO, SetAttrs, TimeSet};

async fn code<T: std::fmt::Debug>(r: Result<T, weft_client::ClientError>) -> ErrorCode {
    r.unwrap_err().code().expect("a server error code")
}

async fn names(c: &Client, dir: u64) -> Vec<String> {
    c.readdir(dir).await.unwrap().into_iter().map(|e| e.name).collect()
}

#[tokio::test]
async fn create_lookup_getattr_setattr() {
    let cl = start("ns-attr", 1).await;
    let c = cl.client().await;
    let f = c.create(ROOT_INO, "f", 0o640, true).await.unwrap();
    assert_eq!((f.kind, f.mode, f.nlink, f.size), (FileKind::File, 0o640, 1, 0));
    assert_eq!(c.lookup(ROOT_INO, "f").await.unwrap().ino, f.ino);
    assert_eq!(code(c.create(ROOT_INO, "f", 0o640, true).await).await, ErrorCode::Exists);
    // Non-exclusive create of an existing file opens it.
    assert_eq!(c.create(ROOT_INO, "f", 0o600, false).await.unwrap().ino, f.ino);
    assert_eq!(code(c.lookup(ROOT_INO, "missing").await).await, ErrorCode::NotFound);
    assert_eq!(code(c.getattr(987_654).await).await, ErrorCode::NotFound);

    let a = c
        .setattr(
            f.ino,
            SetAttrs {
                mode: Some(0o4755),
                uid: Some(1234),
                gid: Some(99),
                atime: Some(TimeSet::AtNs(1_000_000_000)),
                mtime: Some(TimeSet::AtNs(2_000_000_000)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((a.mode, a.uid, a.gid, a.atime_ns, a.mtime_ns), (0o4755, 1234, 99, 1_000_000_000, 2_000_000_000));
    let a = c.setattr(f.ino, SetAttrs { mtime: Some(TimeSet::Now), ..Default::default() }).await.unwrap();
    assert!(a.mtime_ns > 2_000_000_000);
    assert_eq!(c.getattr(f.ino).await.unwrap(), a);

    // Names: too long, or not names at all.
    let long = "x".repeat(256);
    assert_eq!(code(c.create(ROOT_INO, &long, 0o644, true).await).await, ErrorCode::NameTooLong);
    assert!(c.create(ROOT_INO, &"y".repeat(255), 0o644, true).await.is_ok());
    for bad in ["", ".", "..", "a/b"] {
        assert_eq!(code(c.create(ROOT_INO, bad, 0o644, true).await).await, ErrorCode::Invalid, "{bad:?}");
    }
    // A file is not a directory.
    assert_eq!(code(c.create(f.ino, "child", 0o644, true).await).await, ErrorCode::NotDir);
    let fs = c.statfs().await.unwrap();
    assert_eq!((fs.servers_up, fs.servers_total), (1, 1));
    assert!(fs.files >= 3);
}

#[tokio::test]
async fn directories_and_rmdir() {
    let cl = start("ns-dirs", 1).await;
    let c = cl.client().await;
    let d = c.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    assert_eq!((d.kind, d.nlink), (FileKind::Dir, 2));
    assert_eq!(code(c.mkdir(ROOT_INO, "d", 0o755).await).await, ErrorCode::Exists);
    let sub = c.mkdir(d.ino, "sub", 0o700).await.unwrap();
    assert_eq!(c.getattr(d.ino).await.unwrap().nlink, 3, "a subdirectory links its parent");
    c.create(d.ino, "file", 0o644, true).await.unwrap();
    assert_eq!(names(&c, d.ino).await, vec!["file", "sub"]);
    assert_eq!(code(c.rmdir(ROOT_INO, "d").await).await, ErrorCode::NotEmpty);
    assert_eq!(code(c.rmdir(d.ino, "file").await).await, ErrorCode::NotDir);
    assert_eq!(code(c.unlink(d.ino, "sub").await).await, ErrorCode::IsDir);
    assert_eq!(code(c.rmdir(d.ino, "nope").await).await, ErrorCode::NotFound);
    c.rmdir(d.ino, "sub").await.unwrap();
    assert_eq!(code(c.getattr(sub.ino).await).await, ErrorCode::NotFound);
    c.unlink(d.ino, "file").await.unwrap();
    c.rmdir(ROOT_INO, "d").await.unwrap();
    assert!(names(&c, ROOT_INO).await.is_empty());
}

#[tokio::test]
async fn rename_semantics() {
    let cl = start("ns-rename", 1).await;
    let c = cl.client().await;
    let a = c.mkdir(ROOT_INO, "a", 0o755).await.unwrap();
    let b = c.mkdir(ROOT_INO, "b", 0o755).await.unwrap();
    let f1 = c.create(a.ino, "f1", 0o644, true).await.unwrap();
    let f2 = c.create(b.ino, "f2", 0o644, true).await.unwrap();

    // Across directories, replacing an existing file.
    c.rename(a.ino, "f1", b.ino, "f2", 0).await.unwrap();
    assert_eq!(c.lookup(b.ino, "f2").await.unwrap().ino, f1.ino);
    assert_eq!(code(c.lookup(a.ino, "f1").await).await, ErrorCode::NotFound);
    assert_eq!(code(c.getattr(f2.ino).await).await, ErrorCode::NotFound, "the replaced file is gone");

    // NOREPLACE refuses an existing target.
    c.create(a.ino, "g", 0o644, true).await.unwrap();
    assert_eq!(code(c.rename(a.ino, "g", b.ino, "f2", RENAME_NOREPLACE).await).await, ErrorCode::Exists);
    c.rename(a.ino, "g", b.ino, "g2", RENAME_NOREPLACE).await.unwrap();

    // Directories: moving one under itself is refused; over an empty dir is fine; over a non-empty one is not.
    let inner = c.mkdir(a.ino, "inner", 0o755).await.unwrap();
    assert_eq!(code(c.rename(ROOT_INO, "a", inner.ino, "x", 0).await).await, ErrorCode::Invalid);
    assert_eq!(code(c.rename(ROOT_INO, "a", a.ino, "self", 0).await).await, ErrorCode::Invalid);
    let empty = c.mkdir(ROOT_INO, "empty", 0o755).await.unwrap();
    c.rename(a.ino, "inner", ROOT_INO, "empty", 0).await.unwrap();
    assert_eq!(c.lookup(ROOT_INO, "empty").await.unwrap().ino, inner.ino);
    assert_eq!(code(c.getattr(empty.ino).await).await, ErrorCode::NotFound);
    assert_eq!(code(c.rename(ROOT_INO, "empty", ROOT_INO, "b", 0).await).await, ErrorCode::NotEmpty);
    // File over directory and directory over file.
    assert_eq!(code(c.rename(b.ino, "g2", ROOT_INO, "empty", 0).await).await, ErrorCode::IsDir);
    assert_eq!(code(c.rename(ROOT_INO, "empty", b.ino, "g2", 0).await).await, ErrorCode::NotDir);
    // A missing source.
    assert_eq!(code(c.rename(ROOT_INO, "nope", ROOT_INO, "x", 0).await).await, ErrorCode::NotFound);
    // Moving a directory fixes both parents' link counts.
    let before_root = c.getattr(ROOT_INO).await.unwrap().nlink;
    c.rename(ROOT_INO, "empty", b.ino, "moved", 0).await.unwrap();
    assert_eq!(c.getattr(ROOT_INO).await.unwrap().nlink, before_root - 1);
    assert_eq!(c.getattr(b.ino).await.unwrap().nlink, 3);
    // Renaming onto itself changes nothing.
    c.rename(b.ino, "g2", b.ino, "g2", 0).await.unwrap();
    assert!(c.lookup(b.ino, "g2").await.is_ok());
}

#[tokio::test]
async fn links_symlinks_and_unlink_collects_objects() {
    let cl = start("ns-links", 2).await;
    let c = cl.client().await;
    let f = c.create_path("/orig", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::from(pattern(3, 0, 300_000))).await.unwrap();
    let ino = f.ino();
    f.close().await.unwrap();

    let l = c.link(ino, ROOT_INO, "hard").await.unwrap();
    assert_eq!((l.ino, l.nlink), (ino, 2));
    assert_eq!(code(c.link(ino, ROOT_INO, "hard").await).await, ErrorCode::Exists);
    let d = c.mkdir(ROOT_INO, "dir", 0o755).await.unwrap();
    assert!(c.link(d.ino, ROOT_INO, "dirlink").await.is_err(), "hard links to directories are refused");

    c.unlink(ROOT_INO, "orig").await.unwrap();
    let g = c.open("/hard", OpenMode::ReadWrite).await.unwrap();
    assert_eq!(g.size(), 300_000);
    let buf = g.read_at(0, BytesMut::zeroed(300_000)).await.unwrap();
    assert_eq!(&buf[..], &pattern(3, 0, 300_000)[..], "the data survives through the other link");

    let s = c.symlink(ROOT_INO, "sym", "/hard").await.unwrap();
    assert_eq!(s.kind, FileKind::Symlink);
    assert_eq!(c.readlink(s.ino).await.unwrap(), "/hard");
    assert_eq!(code(c.readlink(ino).await).await, ErrorCode::NotSymlink);
    assert_eq!(code(c.symlink(ROOT_INO, "long", &"t".repeat(5000)).await).await, ErrorCode::NameTooLong);

    // The last unlink removes the inode, and the MDS collects the objects from the data servers.
    let objects: Vec<_> = g.layout().servers.iter().map(|&s| object_path(&cl.data_root(s), ino)).collect();
    assert!(objects.iter().any(|p| p.exists()));
    c.unlink(ROOT_INO, "hard").await.unwrap();
    assert_eq!(code(c.getattr(ino).await).await, ErrorCode::NotFound);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while objects.iter().any(|p| p.exists()) {
        assert!(std::time::Instant::now() < deadline, "objects of a removed file were never collected");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn large_directory_lists_completely_through_pages() {
    let cl = start("ns-bigdir", 1).await;
    let c = cl.client().await;
    let d = c.mkdir(ROOT_INO, "big", 0o755).await.unwrap();
    let n = 100_000u32;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..16u32 {
        let c = c.clone();
        tasks.spawn(async move {
            for i in (w..n).step_by(16) {
                c.create(d.ino, &format!("entry-{i:06}"), 0o644, true).await.unwrap();
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    // Page by hand with a small limit, and in full.
    let mut seen = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let p = c.readdir_page(d.ino, &after, 1000).await.unwrap();
        pages += 1;
        assert!(p.entries.len() <= 1000);
        seen.extend(p.entries.iter().map(|e| e.name.clone()));
        if p.eof {
            break;
        }
        after = p.entries.last().unwrap().name.clone();
    }
    assert!(pages >= 20);
    let expected: Vec<String> = (0..n).map(|i| format!("entry-{i:06}")).collect();
    assert_eq!(seen, expected);
    assert_eq!(c.readdir(d.ino).await.unwrap().len(), n as usize);
}
