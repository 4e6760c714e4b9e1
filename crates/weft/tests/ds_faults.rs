//! Data-server faults on files without redundancy (issue 13, item 7): a full disk on one data server fails the
//! writer with ENOSPC and loses no acknowledged byte, through the library, `weft put` and the FUSE mount; a file on
//! a killed server fails with an error naming the file, the offset and the server; what was fsynced survives
//! `kill -9`; bytes a restarted server lost read as an error, never as zeros.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::{Bytes, BytesMut};
use common::mount::Mount;
use common::*;
use weft_client::{Client, ClientError, File, OpenMode};
use weft_proto::{ErrorCode, ROOT_INO};
use weft_rpc::RpcError;

const UNIT: u32 = 64 << 10;
const CHUNK: usize = 256 << 10;

/// A size-limited tmpfs mounted over a data server's root; unmounted on drop (lazily, so a server still holding
/// files open, or a failed test, never leaves it behind).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(ok.success(), "mounting a tmpfs on {} (the tests run as root)", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

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
