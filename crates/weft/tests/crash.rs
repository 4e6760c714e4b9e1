//! Crashes and restarts of the cluster's processes. `kill -9` of the metadata service during a stream of creates:
//! after a restart, every create that was acknowledged is present. `kill -9` (or a stop) of one data server: reads
//! that need it fail with its connection refused while it is down, and after a restart on the same address and
//! directory the file reads back byte-exact.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::*;
use weft_client::{Client, ClientError, File, OpenMode};
use weft_proto::ROOT_INO;
use weft_rpc::RpcError;

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
    let f = c.open("/before", OpenMode::ReadWrite).await.unwrap();
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

const STRIPED_BYTES: usize = 1_000_000;
const STRIPE_UNIT: u32 = 64 << 10;

/// A 3-server cluster with `/d/f` striped over every server in 64 KiB units, written with `pattern(5, ..)`.
async fn striped_file(name: &str) -> (TestCluster, Vec<u8>) {
    let cl = start(name, 3).await;
    let c = cl.client().await;
    let d = c.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    c.set_layout(d.ino, STRIPE_UNIT, 3).await.unwrap();
    let f = c.create_path("/d/f", 0o644, true, false).await.unwrap();
    let mut servers = f.layout().servers.clone();
    servers.sort_unstable();
    assert_eq!(servers, [0, 1, 2], "the file is striped over every server");
    let data = pattern(5, 0, STRIPED_BYTES);
    f.write_at(0, Bytes::from(data.clone())).await.unwrap();
    f.close().await.unwrap();
    c.close().await;
    (cl, data)
}

async fn read_all(c: &Client) -> Result<Vec<u8>, ClientError> {
    let f = c.open("/d/f", OpenMode::ReadWrite).await?;
    Ok(f.read_at(0, BytesMut::zeroed(STRIPED_BYTES)).await?.to_vec())
}

/// The first stripe unit that lives on `server`, read alone.
async fn read_unit_on(f: &File, server: u32) -> Result<(u64, Vec<u8>), ClientError> {
    let index = f.layout().servers.iter().position(|&s| s == server).expect("the server holds a stripe") as u64;
    let offset = index * u64::from(STRIPE_UNIT);
    Ok((offset, f.read_at(offset, BytesMut::zeroed(STRIPE_UNIT as usize)).await?.to_vec()))
}

/// While data server `down` is not running: a read of the whole file fails, naming that server, its refused
/// TCP address and a file offset that lies on it (a client that never reached it connects over TCP first); a unit on a server still up reads fine.
async fn assert_reads_need(cl: &TestCluster, down: u32, data: &[u8]) {
    let c = cl.impatient_client().await;
    match read_all(&c).await {
        Err(ClientError::DataAt {
            server,
            addr: named,
            file_offset,
            source: RpcError::Connect { addr, source },
            ..
        }) => {
            assert_eq!(server, down);
            assert_eq!(addr, cl.data_addrs()[down as usize]);
            assert_eq!(named, addr, "the error names the server's address");
            let index = (file_offset / u64::from(STRIPE_UNIT)) % 3;
            let layout_servers = c.open("/d/f", OpenMode::Read).await.unwrap().layout().servers.clone();
            assert_eq!(layout_servers[index as usize], down, "the file offset named lies on the server that is down");
            assert_eq!(source.kind(), std::io::ErrorKind::ConnectionRefused);
        }
        other => panic!("a read that needs data server {down} while it is down: {other:?}"),
    }
    let f = c.open("/d/f", OpenMode::ReadWrite).await.unwrap();
    let up = (down + 1) % 3;
    let (offset, unit) = read_unit_on(&f, up).await.unwrap();
    assert!(unit[..] == data[offset as usize..offset as usize + STRIPE_UNIT as usize], "server {up} still serves");
    c.close().await;
}

/// After data server `back` restarted: its address is the one it had, a client that held a session with the old
/// process (`before`, default tuning) and a new client both read the file byte-exact.
async fn assert_back(cl: &TestCluster, back: u32, addr_before: &str, before: &Client, data: &[u8]) {
    assert_eq!(cl.data_addrs()[back as usize], addr_before, "the server came back on its address");
    // The old client first: its session is unknown to the new process, which it learns and opens a new one.
    assert!(read_all(before).await.unwrap() == data, "a client from before the restart reads the file");
    let c = cl.client().await;
    assert!(read_all(&c).await.unwrap() == data, "a new client reads the file");
    let listed = c.cluster_info().await.unwrap();
    let s = listed.iter().find(|s| s.id == back).expect("the MDS knows the server");
    assert_eq!((s.addr.as_str(), s.state), (addr_before, weft_proto::ServerState::Up));
    c.close().await;
}

#[tokio::test]
async fn a_data_server_killed_with_kill_9_comes_back_with_its_objects() {
    let (mut cl, data) = striped_file("crash-ds-kill").await;
    let victim = 1;
    let addr = cl.data_addrs()[victim as usize].clone();
    let before = cl.client().await;
    assert!(read_all(&before).await.unwrap() == data);

    cl.kill_data_server(victim).await;
    assert_reads_need(&cl, victim, &data).await;

    cl.restart_data_server(victim).await.unwrap();
    assert_back(&cl, victim, &addr, &before, &data).await;
}

#[tokio::test]
async fn a_stopped_data_server_restarts_with_its_objects() {
    let (mut cl, data) = striped_file("crash-ds-stop").await;
    let victim = 2;
    let addr = cl.data_addrs()[victim as usize].clone();
    let before = cl.client().await;
    assert!(read_all(&before).await.unwrap() == data);

    cl.stop_data_server(victim).await;
    assert_reads_need(&cl, victim, &data).await;

    cl.restart_data_server(victim).await.unwrap();
    assert_back(&cl, victim, &addr, &before, &data).await;
}
