//! Several clients at once: concurrent writers from separate processes, close-to-open consistency between two
//! clients, and the largest size winning among concurrent writers of one file.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::*;
use weft_client::OpenMode;

#[tokio::test]
async fn concurrent_writers_from_several_processes() {
    let cl = start("conc-procs", 3).await;
    let dir = test_dir("conc-local");
    let mut children = Vec::new();
    for i in 0..4u64 {
        let p = dir.join(format!("in{i}"));
        std::fs::write(&p, pattern(100 + i, 0, 5_000_000 + i as usize * 1000)).unwrap();
        children.push(
            std::process::Command::new(WEFT)
                .args(["put", p.to_str().unwrap(), &format!("/f{i}")])
                .env("WEFT_CLUSTER", cl.cluster_file())
                .spawn()
                .unwrap(),
        );
    }
    for mut ch in children {
        assert!(ch.wait().unwrap().success());
    }
    let c = cl.client().await;
    for i in 0..4u64 {
        let want = pattern(100 + i, 0, 5_000_000 + i as usize * 1000);
        let f = c.open(&format!("/f{i}"), OpenMode::ReadWrite).await.unwrap();
        assert_eq!(f.size(), want.len() as u64);
        let got = f.read_at(0, BytesMut::zeroed(want.len())).await.unwrap();
        assert!(got[..] == want[..], "file {i} differs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn close_to_open_between_two_clients() {
    let cl = start("conc-cto", 2).await;
    let a = cl.client().await;
    let b = cl.client().await;
    let fa = a.create_path("/shared", 0o644, true, false).await.unwrap();
    fa.write_at(0, Bytes::from(pattern(1, 0, 200_000))).await.unwrap();
    fa.close().await.unwrap();
    let fb = b.open("/shared", OpenMode::ReadWrite).await.unwrap();
    assert_eq!(fb.size(), 200_000);
    assert_eq!(&fb.read_at(0, BytesMut::zeroed(200_000)).await.unwrap()[..], &pattern(1, 0, 200_000)[..]);

    // A rewrite and extension by A after B opened: B sees it on its next open.
    let fa = a.open("/shared", OpenMode::ReadWrite).await.unwrap();
    fa.write_at(150_000, Bytes::from(pattern(2, 0, 100_000))).await.unwrap();
    fa.close().await.unwrap();
    let fb = b.open("/shared", OpenMode::ReadWrite).await.unwrap();
    assert_eq!(fb.size(), 250_000);
    let got = fb.read_at(0, BytesMut::zeroed(250_000)).await.unwrap();
    assert_eq!(&got[..150_000], &pattern(1, 0, 150_000)[..]);
    assert_eq!(&got[150_000..], &pattern(2, 0, 100_000)[..]);
}

#[tokio::test]
async fn the_largest_size_wins_among_concurrent_writers() {
    let cl = start("conc-size", 2).await;
    let a = cl.client().await;
    let b = cl.client().await;
    a.create_path("/one", 0o644, true, false).await.unwrap().close().await.unwrap();
    let fa = a.open("/one", OpenMode::ReadWrite).await.unwrap();
    let fb = b.open("/one", OpenMode::ReadWrite).await.unwrap();
    fa.write_at(0, Bytes::from(vec![1u8; 500_000])).await.unwrap();
    fb.write_at(0, Bytes::from(vec![2u8; 100])).await.unwrap();
    // The longer writer commits first; the shorter commit must not shrink the file.
    fa.close().await.unwrap();
    fb.close().await.unwrap();
    let f = a.open("/one", OpenMode::ReadWrite).await.unwrap();
    assert_eq!(f.size(), 500_000);
}
