//! `kill -9` of the metadata service during a stream of creates: after a restart, every create that was
//! acknowledged is present.

mod common;

use common::*;
use weft_proto::ROOT_INO;

#[tokio::test]
async fn acknowledged_creates_survive_kill_9_of_the_mds() {
    let mut cl = start("crash", 2).await;
    let setup = cl.client().await;
    let d = setup.mkdir(ROOT_INO, "stream", 0o755).await.unwrap();
    let f = setup.create_path("/before", 0o644, true, false).await.unwrap();
    f.write_at(0, bytes::Bytes::from(pattern(11, 0, 100_000))).await.unwrap();
    f.close().await.unwrap();

    let c = cl.impatient_client().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut i = 0u32;
        loop {
            let name = format!("f{i:06}");
            match c.create(d.ino, &name, 0o644, true).await {
                Ok(_) => {
                    if tx.send(name).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
            i += 1;
        }
    });
    let mut acked = Vec::new();
    // Let a good number of creates be acknowledged, then kill the MDS in the middle of the stream.
    while acked.len() < 300 {
        acked.push(rx.recv().await.expect("creates are acknowledged"));
    }
    cl.kill_mds().await;
    writer.await.unwrap();
    while let Ok(name) = rx.try_recv() {
        acked.push(name);
    }

    cl.restart_mds().await.unwrap();
    let c = cl.client().await;
    let present: std::collections::HashSet<String> =
        c.readdir(d.ino).await.unwrap().into_iter().map(|e| e.name).collect();
    for name in &acked {
        assert!(present.contains(name), "acknowledged create {name} was lost");
    }
    // The file written before the crash is intact.
    let f = c.open("/before").await.unwrap();
    let buf = f.read_at(0, bytes::BytesMut::zeroed(100_000)).await.unwrap();
    assert_eq!(&buf[..], &pattern(11, 0, 100_000)[..]);
}

/// The metadata journal's group commit under load: many clients create concurrently, the MDS is killed with
/// `kill -9` mid-stream, and after the restart (which replays the journal) every acknowledged create is present.
#[tokio::test]
async fn concurrent_acknowledged_creates_survive_kill_9_of_the_mds() {
    const WRITERS: usize = 8;
    let mut cl = start("crash-concurrent", 2).await;
    let setup = cl.client().await;
    let shared = setup.mkdir(ROOT_INO, "shared", 0o755).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, String, u64)>();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let c = cl.impatient_client().await;
        let own = setup.mkdir(ROOT_INO, &format!("own-{w}"), 0o755).await.unwrap();
        let tx = tx.clone();
        writers.push(tokio::spawn(async move {
            for i in 0u32.. {
                // Alternate between a private and the shared directory.
                let parent = if i % 2 == 0 { own.ino } else { shared.ino };
                let name = format!("w{w}-{i:06}");
                let Ok(attr) = c.create(parent, &name, 0o644, true).await else { return };
                if tx.send((parent, name, attr.ino)).is_err() {
                    return;
                }
            }
        }));
    }
    drop(tx);
    let mut acked = Vec::new();
    while acked.len() < 2000 {
        acked.push(rx.recv().await.expect("creates are acknowledged"));
    }
    cl.kill_mds().await;
    for w in writers {
        w.await.unwrap();
    }
    while let Ok(a) = rx.try_recv() {
        acked.push(a);
    }

    cl.restart_mds().await.unwrap();
    let c = cl.client().await;
    let mut present = std::collections::HashSet::new();
    let mut dirs: Vec<u64> = acked.iter().map(|a| a.0).collect();
    dirs.sort_unstable();
    dirs.dedup();
    for d in dirs {
        for e in c.readdir(d).await.unwrap() {
            present.insert((d, e.name, e.ino));
        }
    }
    for a in &acked {
        assert!(present.contains(a), "acknowledged create {a:?} was lost");
    }
    // The namespace still takes creates after the replay, and the replayed inode counter never reuses a number.
    let after = c.create(shared.ino, "after-restart", 0o644, true).await.unwrap();
    assert!(acked.iter().all(|a| a.2 < after.ino));
}
