//! Data-server faults on files without redundancy (issue 13, item 7): a full disk on one data server fails the
//! writer with ENOSPC and loses no acknowledged byte, through the library, `weft put` and the FUSE mount; a file on
//! a killed server fails with an error naming the file, the offset and the server; what was fsynced survives
//! `kill -9`; bytes a restarted server lost read as an error, never as zeros. Close makes a handle's writes durable
//! before committing the size (close-to-open with COMMIT): exactly the objects it wrote are fsynced, a failed fsync
//! fails the close (library and mount) and leaves the size as it was.

use crate::common;

use std::io::Write;
use std::process::Command;

use bytes::{Bytes, BytesMut};
use common::mount::Mount;
use common::scrape::{parse, scrape, sum};
use common::tmpfs::Tmpfs;
use common::*;
use weft_client::{Client, ClientError, File, OpenMode};
use weft_proto::{DataRedundancy, ErrorCode, ROOT_INO};
use weft_rpc::RpcError;

const UNIT: u32 = 64 << 10;
const CHUNK: usize = 256 << 10;

/// A 2-server cluster whose data server 1 keeps its objects on an 8 MiB tmpfs (mounted while it was stopped), and
/// a directory `/d` striped over both servers in 64 KiB units.
async fn cluster_with_small_server(name: &str) -> (TestCluster, Tmpfs) {
    let mut cl = start(name, 2).await;
    cl.stop_data_server(1).await;
    let fs = Tmpfs::mount(&cl.data_root(1), "8m");
    cl.restart_data_server(1).await.unwrap();
    let c = cl.client().await;
    let d = c.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    c.set_layout(d.ino, UNIT, 2).await.unwrap();
    c.close().await;
    (cl, fs)
}

/// Reads `[0, len)` of `path` with a fresh open.
async fn read_back(c: &Client, path: &str, len: usize) -> Result<Vec<u8>, ClientError> {
    let f = c.open(path, OpenMode::Read).await?;
    Ok(f.read_at(0, BytesMut::zeroed(len)).await?.to_vec())
}

/// The layout position (object index) of data server `server` in `f`'s layout.
fn position_of(f: &File, server: u32) -> u64 {
    f.layout().servers.iter().position(|&s| s == server).expect("the server holds an object of the file") as u64
}

/// Whether file offset `o` lies in the object at `position` (stripe unit `UNIT`, 2 objects).
fn on_position(o: u64, position: u64) -> bool {
    (o / u64::from(UNIT)) % 2 == position
}

#[tokio::test]
async fn a_full_data_server_fails_the_writer_with_no_space_and_keeps_every_acknowledged_byte() {
    let (cl, _fs) = cluster_with_small_server("faults-enospc").await;
    let c = cl.client().await;
    let f = c.create_path("/d/f", 0o644, true, false).await.unwrap();
    let small = position_of(&f, 1);
    // Server 1 holds half the file: it fills up before 16 MiB are written. Chunks of 256 KiB, each 2 units on
    // each server.
    let mut acked = 0u64;
    let err = loop {
        assert!(acked < 64 << 20, "server 1's 8 MiB disk never filled");
        match f.write_at(acked, Bytes::from(pattern(21, acked, CHUNK))).await {
            Ok(()) => acked += CHUNK as u64,
            Err(e) => break e,
        }
    };
    assert!(acked >= 4 << 20, "only {acked} bytes written before the disk filled");
    assert_eq!(err.code(), Some(ErrorCode::NoSpace), "{err}");
    match &err {
        ClientError::DataAt { ino, file_offset, server, addr, .. } => {
            assert_eq!((*ino, *server), (f.ino(), 1));
            assert_eq!(addr, &cl.data_addrs()[1]);
            assert!(*file_offset >= acked && on_position(*file_offset, small), "offset {file_offset}");
        }
        other => panic!("expected an error naming the file offset and server: {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("no space left") && text.contains(&cl.data_addrs()[1]), "{text}");
    assert_eq!(err.code().map(|c| c.errno()), Some(ENOSPC), "FUSE answers ENOSPC");
    // The failed write is not acknowledged: the size stays at what was.
    assert_eq!(f.size(), acked);
    f.sync().await.expect("syncing what was acknowledged works on a full disk");
    f.close().await.unwrap();

    // Every acknowledged byte reads back equal, and nothing reads Corrupt, also for a new client.
    let c2 = cl.client().await;
    assert_eq!(c2.resolve("/d/f").await.unwrap().size, acked);
    let back = read_back(&c2, "/d/f", acked as usize).await.unwrap();
    assert!(back == pattern(21, 0, acked as usize), "acknowledged bytes changed after ENOSPC");
    // The half-written chunk did not leave blocks whose data and checksum disagree: reading past the
    // acknowledged size inside the objects (the failed write's range) gives no Corrupt.
    let f2 = c2.open("/d/f", OpenMode::ReadWrite).await.unwrap();
    f2.observe_size(acked + CHUNK as u64);
    match f2.read_at(acked, BytesMut::zeroed(CHUNK)).await {
        Ok(_) => {}
        Err(e) => panic!("the failed write's range must not read as an error: {e}"),
    }
    c.close().await;
    c2.close().await;
}

const ENOSPC: i32 = 28;

#[tokio::test]
async fn weft_put_on_a_full_data_server_names_the_file_and_the_server() {
    let (cl, _fs) = cluster_with_small_server("faults-put").await;
    let local = cl.dir().join("big.bin");
    let mut out = std::fs::File::create(&local).unwrap();
    for i in 0..24u64 {
        out.write_all(&pattern(3, i << 20, 1 << 20)).unwrap();
    }
    drop(out);
    let (ok, _, stderr) = weft(&cl, &["put", local.to_str().unwrap(), "/d/big"]);
    assert!(!ok, "a 24 MiB put onto 8 MiB of server 1 (plus server 0) must fail");
    assert!(stderr.contains("/d/big"), "names the file: {stderr}");
    assert!(stderr.contains("data server 1") && stderr.contains(&cl.data_addrs()[1]), "names the server: {stderr}");
    assert!(stderr.contains("no space left"), "says why: {stderr}");
    assert!(stderr.contains("file offset"), "names the offset: {stderr}");
}

#[tokio::test]
async fn a_full_data_server_is_enospc_through_the_mount() {
    let (cl, _fs) = cluster_with_small_server("faults-fuse").await;
    let m = Mount::start(&cl, &test_dir("faults-fuse-mnt"), &[]);
    let path = m.path("d/f");
    let mut file = std::fs::OpenOptions::new().create_new(true).write(true).open(&path).unwrap();
    let mut acked = 0u64;
    let err = loop {
        assert!(acked < 64 << 20, "server 1's 8 MiB disk never filled");
        let data = pattern(8, acked, CHUNK);
        match file.write(&data) {
            Ok(n) => {
                assert!(n > 0);
                acked += n as u64;
            }
            Err(e) => break e,
        }
    };
    assert_eq!(err.raw_os_error(), Some(ENOSPC), "{err}");
    // fsync(2) waits for the commit and returns its error; close(2)'s RELEASE is not waited for by the kernel, so
    // a failed FLUSH would otherwise leave the size to a commit racing with the checks below.
    file.sync_all().expect("syncing what was acknowledged works on a full disk (fsync through the mount)");
    drop(file);
    let c = cl.client().await;
    assert_eq!(c.resolve("/d/f").await.unwrap().size, acked);
    let back = read_back(&c, "/d/f", acked as usize).await.unwrap();
    assert!(back == pattern(8, 0, acked as usize), "acknowledged bytes changed after ENOSPC");
    assert!(std::fs::read(&path).unwrap() == back, "the mount reads the same bytes");
    c.close().await;
    let mnt = m.dir.clone();
    drop(m);
    let _ = std::fs::remove_dir(mnt);
}

#[tokio::test]
async fn a_file_on_a_killed_data_server_fails_naming_file_offset_and_server() {
    let mut cl = start("faults-dead", 2).await;
    let c = cl.client().await;
    let d = c.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    c.set_layout(d.ino, UNIT, 2).await.unwrap();
    let f = c.create_path("/d/f", 0o644, true, false).await.unwrap();
    let data = pattern(6, 0, 1 << 20);
    f.write_at(0, Bytes::from(data.clone())).await.unwrap();
    f.sync().await.unwrap();
    let dead = position_of(&f, 1);
    cl.kill_data_server(1).await;

    // The client that had a session with the killed process (default, bounded retries), and a fresh one.
    let fresh = cl.impatient_client().await;
    for (who, client) in [("connected", &c), ("fresh", &fresh)] {
        let g = client.open("/d/f", OpenMode::ReadWrite).await.unwrap();
        // A range held by server 0 alone still reads (before the failing write below changes server 0's part).
        let first = if dead == 0 { u64::from(UNIT) } else { 0 };
        let back = g.read_at(first, BytesMut::zeroed(UNIT as usize)).await.unwrap();
        // The first client's failed write did change server 0's part (the write was not atomic across servers).
        let expect = if who == "connected" { data.clone() } else { pattern(7, 0, 1 << 20) };
        assert!(back[..] == expect[first as usize..first as usize + UNIT as usize], "{who}: server 0 still serves");
        for (what, r) in [
            ("read", g.read_at(0, BytesMut::zeroed(1 << 20)).await.map(|_| ())),
            ("write", g.write_at(0, Bytes::from(pattern(7, 0, 1 << 20))).await),
        ] {
            let e = r.expect_err("the file's server 1 is down");
            match &e {
                ClientError::DataAt { ino, file_offset, server, addr, source } => {
                    assert_eq!((*ino, *server), (g.ino(), 1), "{who} {what}: {e}");
                    assert_eq!(addr, &cl.data_addrs()[1], "{who} {what}: {e}");
                    assert!(on_position(*file_offset, dead), "{who} {what}: offset {file_offset} is not on server 1");
                    assert!(
                        matches!(
                            source,
                            RpcError::Connect { .. }
                                | RpcError::ConnectionLost { .. }
                                | RpcError::MaybeApplied { .. }
                                | RpcError::Timeout { .. }
                        ),
                        "{who} {what}: {source:?}"
                    );
                    assert_eq!(e.code(), None, "no server answered: the mount reports EIO");
                }
                other => panic!("{who} {what}: expected an error naming file, offset and server: {other:?}"),
            }
            let text = e.to_string();
            assert!(text.contains("file offset") && text.contains(&cl.data_addrs()[1]), "{text}");
        }
    }
    fresh.close().await;
    c.close().await;
}

#[tokio::test]
async fn fsynced_bytes_survive_kill_9_of_their_data_server() {
    let mut cl = start("faults-fsync", 2).await;
    let c = cl.client().await;
    let d = c.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    c.set_layout(d.ino, UNIT, 2).await.unwrap();
    let f = c.create_path("/d/f", 0o644, true, false).await.unwrap();
    let len = 3 << 20;
    f.write_at(0, Bytes::from(pattern(9, 0, len))).await.unwrap();
    f.sync().await.unwrap();
    // fsync committed the size too: another client sees it before any close.
    let other = cl.client().await;
    assert_eq!(other.resolve("/d/f").await.unwrap().size, len as u64);
    for victim in [0, 1] {
        cl.kill_data_server(victim).await;
        cl.restart_data_server(victim).await.unwrap();
    }
    let fresh = cl.client().await;
    assert!(read_back(&fresh, "/d/f", len).await.unwrap() == pattern(9, 0, len), "fsynced bytes changed");
    assert!(read_back(&other, "/d/f", len).await.unwrap() == pattern(9, 0, len), "an old client reads them too");
    f.close().await.unwrap();
    for x in [c, other, fresh] {
        x.close().await;
    }
}

#[tokio::test]
async fn bytes_a_restarted_server_lost_read_as_an_error_not_zeros() {
    let mut cl = start("faults-lost", 2).await;
    let c = cl.client().await;
    let d = c.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    c.set_layout(d.ino, UNIT, 2).await.unwrap();
    let f = c.create_path("/d/f", 0o644, true, false).await.unwrap();
    let len = 1 << 20;
    let data = pattern(10, 0, len);
    f.write_at(0, Bytes::from(data.clone())).await.unwrap();
    let ino = f.ino();
    let position = position_of(&f, 1);
    f.close().await.unwrap();

    // While server 1 is down, its object loses its tail as a crash before writeback would: cut it at 200_000
    // bytes of its 512 KiB (its checksums survive, as a sidecar synced earlier would).
    cl.stop_data_server(1).await;
    let object = object_path(&cl.data_root(1), ino);
    assert_eq!(std::fs::metadata(&object).unwrap().len(), (len / 2) as u64);
    let cut = 200_000u64;
    std::fs::OpenOptions::new().write(true).open(&object).unwrap().set_len(cut).unwrap();
    cl.restart_data_server(1).await.unwrap();

    let r = cl.client().await;
    match read_back(&r, "/d/f", len).await {
        Err(ClientError::Corrupt { ino: i, file_offset, server, object_offset }) => {
            assert_eq!((i, server), (ino, 1));
            assert!(on_position(file_offset, position), "file offset {file_offset} is on server 1");
            // The block holding the cut, or one past it.
            assert!(object_offset + 4096 > cut, "object offset {object_offset}");
        }
        other => panic!("lost bytes must not read as zeros: {:?}", other.map(|v| v.len())),
    }
    // Every range that lies past the cut on server 1 fails; every one before it reads back equal.
    let g = r.open("/d/f", OpenMode::Read).await.unwrap();
    let unit = u64::from(UNIT);
    for stripe in 0..(len as u64 / unit) {
        let o = stripe * unit;
        let got = g.read_at(o, BytesMut::zeroed(UNIT as usize)).await;
        let object_start = (stripe / 2) * unit;
        let lost = on_position(o, position) && object_start + unit > cut / 4096 * 4096;
        match got {
            Ok(b) => {
                assert!(!lost, "stripe at {o} lies past the cut but read Ok");
                assert!(b[..] == data[o as usize..(o + unit) as usize], "stripe at {o}");
            }
            Err(e) => {
                assert!(lost, "stripe at {o} is intact but failed: {e}");
                assert!(e.to_string().contains(&format!("inode {ino}")), "{e}");
            }
        }
    }
    r.close().await;
    c.close().await;
}

/// `Fsync` requests each data server has served (its `data{id}` metrics endpoint), by server id.
async fn fsyncs(cl: &TestCluster) -> Vec<(u32, f64)> {
    let mut out = Vec::new();
    for (role, addr) in cl.metrics_addrs() {
        let Some(id) = role.strip_prefix("data").and_then(|i| i.parse().ok()) else { continue };
        let text = scrape(&addr).await.unwrap_or_else(|e| panic!("scraping {role} at {addr}: {e}"));
        // A client's sync is `FsyncVerified` (docs/format.md §33); `Fsync` counted too, so neither is missed.
        let parsed = parse(&text);
        let count = |op: &str| sum(&parsed, "weft_rpc_server_requests_total", &[&format!("op=\"{op}\"")]);
        out.push((id, count("Fsync") + count("FsyncVerified")));
    }
    out
}

/// The servers whose `Fsync` count grew between `before` and `after`, each by exactly one (sorted).
fn synced_once(before: &[(u32, f64)], after: &[(u32, f64)]) -> Vec<u32> {
    let mut grew = Vec::new();
    for ((id, b), (id2, a)) in before.iter().zip(after) {
        assert_eq!(id, id2);
        assert!(*a == *b || *a == *b + 1.0, "server {id}: {b} -> {a} fsyncs, at most one per close");
        if a > b {
            grew.push(*id);
        }
    }
    grew.sort_unstable();
    grew
}

#[tokio::test(flavor = "multi_thread")]
async fn close_fsyncs_exactly_the_objects_its_handle_wrote_and_a_reader_none() {
    let cl = start_with("durable-close", 4, |o| o.metrics = true).await;
    let c = cl.client().await;
    let plain = c.mkdir(ROOT_INO, "plain", 0o755).await.unwrap();
    c.set_layout(plain.ino, UNIT, 4).await.unwrap();
    let ec = c.mkdir(ROOT_INO, "ec", 0o755).await.unwrap();
    c.set_layout_with(ec.ino, UNIT, 0, DataRedundancy::Ec { k: 2, m: 1 }).await.unwrap();
    let mirror = c.mkdir(ROOT_INO, "mirror", 0o755).await.unwrap();
    c.set_layout_with(mirror.ino, UNIT, 0, DataRedundancy::Mirror { n: 2 }).await.unwrap();

    // (path, bytes written at 0, the layout positions those bytes change): a plain file over 4 servers written
    // in its first two stripe units; an ec 2+1 file in its first data chunk (and so its parity); a mirror's copies.
    let cases: [(&str, usize, &[usize]); 3] =
        [("/plain/f", 2 * UNIT as usize, &[0, 1]), ("/ec/f", 1000, &[0, 2]), ("/mirror/f", 5000, &[0, 1])];
    for (i, (path, len, positions)) in cases.into_iter().enumerate() {
        let f = c.create_path(path, 0o644, true, false).await.unwrap();
        let servers = f.layout().servers.clone();
        f.write_at(0, Bytes::from(pattern(20 + i as u64, 0, len))).await.unwrap();
        let other = cl.client().await;
        assert_eq!(other.resolve(path).await.unwrap().size, 0, "{path}: nothing committed before close");
        let before = fsyncs(&cl).await;
        f.close().await.unwrap();
        let after = fsyncs(&cl).await;
        let mut expect: Vec<u32> = positions.iter().map(|&p| servers[p]).collect();
        expect.sort_unstable();
        assert_eq!(synced_once(&before, &after), expect, "{path} (layout {servers:?}): the objects it wrote");
        assert_eq!(other.resolve(path).await.unwrap().size, len as u64, "{path}: the size committed after");

        // A handle that only read, and one opened to write that wrote nothing: no fsync anywhere.
        let before = fsyncs(&cl).await;
        let r = other.open(path, OpenMode::Read).await.unwrap();
        let got = r.read_at(0, BytesMut::zeroed(len)).await.unwrap();
        assert!(got[..] == pattern(20 + i as u64, 0, len)[..], "{path}: read back");
        r.close().await.unwrap();
        other.open(path, OpenMode::ReadWrite).await.unwrap().close().await.unwrap();
        assert_eq!(synced_once(&before, &fsyncs(&cl).await), Vec::<u32>::new(), "{path}: nothing written, no fsync");
        other.close().await;
    }
    c.close().await;
}

/// A 2-server cluster whose data server 1 fails its next `count` fsyncs, and `/d` striped over both in `UNIT`s.
async fn cluster_failing_fsync(name: &str, count: u32) -> TestCluster {
    let mut cl = start(name, 2).await;
    cl.set_env(vec![("WEFT_FAULT".into(), format!("fail-fsync:{count}"))]);
    cl.restart_data_server(1).await.unwrap();
    cl.set_env(Vec::new());
    let c = cl.client().await;
    let d = c.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    c.set_layout(d.ino, UNIT, 2).await.unwrap();
    c.close().await;
    cl
}

#[tokio::test]
async fn a_failed_fsync_fails_the_close_and_the_size_stays_old() {
    let cl = cluster_failing_fsync("durable-fail", 1).await;
    let c = cl.client().await;
    let f = c.create_path("/d/f", 0o644, true, false).await.unwrap();
    let len = 2 * UNIT as usize;
    f.write_at(0, Bytes::from(pattern(30, 0, len))).await.unwrap();
    let other = cl.client().await;
    match f.commit().await {
        Err(ClientError::Unsynced { ino, server, addr, source }) => {
            assert_eq!((ino, server, addr.as_str()), (f.ino(), 1, cl.data_addrs()[1].as_str()));
            assert_eq!(source.remote().map(|w| w.code), Some(ErrorCode::Io), "{source}");
            let text = ClientError::Unsynced { ino, server, addr, source }.to_string();
            assert!(text.contains("durable") && text.contains("not committed"), "a clear error: {text}");
        }
        other => panic!("the commit at close must fail when a data server cannot fsync: {other:?}"),
    }
    assert!(cl.log("data1").contains("fail the next fsyncs"), "the fault was armed");
    assert_eq!(other.resolve("/d/f").await.unwrap().size, 0, "no size committed over bytes not durable");
    // The handle keeps what it has not synced: the next close syncs it (the fault is spent) and commits.
    f.close().await.unwrap();
    assert_eq!(other.resolve("/d/f").await.unwrap().size, len as u64);
    assert!(read_back(&other, "/d/f", len).await.unwrap() == pattern(30, 0, len));
    other.close().await;
    c.close().await;
}

#[tokio::test]
async fn a_failed_fsync_fails_close_through_the_mount() {
    let cl = cluster_failing_fsync("durable-fuse", 1000).await;
    let m = Mount::start(&cl, &test_dir("durable-fuse-mnt"), &[]);
    let local = cl.dir().join("src.bin");
    std::fs::write(&local, pattern(31, 0, 2 * UNIT as usize)).unwrap();
    // cp reports close(2)'s error, which is the mount's flush: its commit could not sync server 1.
    let out = Command::new("cp").arg(&local).arg(m.path("d/f")).output().expect("running cp");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the close must fail: {stderr}");
    assert!(stderr.contains("Input/output error"), "EIO: {stderr}");
    let c = cl.client().await;
    assert_eq!(c.resolve("/d/f").await.unwrap().size, 0, "the size stays old");
    c.close().await;
    let mnt = m.dir.clone();
    drop(m);
    let _ = std::fs::remove_dir(mnt);
}
