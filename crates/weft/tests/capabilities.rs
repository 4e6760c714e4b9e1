//! Capabilities on the data servers (docs/format.md §10), against real processes: a data server serves a request
//! on an inode only with a capability the MDS sealed for it, with the right rights, unexpired, for the connection's
//! key; every refusal reads and writes nothing (the object's bytes on disk are checked); a file held open past the
//! capability's lifetime keeps working through the library (renewal); and old capabilities stop working within the
//! bound ARCHITECTURE.md states, after a chmod and after an unlink.
//!
//! The requests go out as the client library's frames would (an `RpcClient` proving the cluster key, the same
//! bytes on the wire), with the capability changed by hand.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::*;
use weft_client::{Client, OpenMode};
use weft_fabric::TcpFabric;
use weft_proto::msg::{ReadChunkRangeReq, ReadReq, RowWrite, TruncateReq, WriteChunkRangeReq, WriteReq, WriteRowsReq};
use weft_proto::{Capability, ErrorCode, ROOT_INO, Request, Rights, SetAttrs};
use weft_rpc::RpcClient;
use weft_rpc::capability::unix_now_ms;

/// Every wait for a condition here is bounded by this (nothing is timed).
const BOUND_MS: u64 = 60_000;

type Ds = RpcClient<TcpFabric>;

async fn data_server(c: &TestCluster) -> Ds {
    RpcClient::connect(TcpFabric::default(), &c.data_addrs()[0], c.rpc_config()).await.unwrap()
}

/// A file of `len` pattern bytes on one data server; returns its inode.
async fn file_with_bytes(client: &Client, path: &str, len: usize) -> u64 {
    let f = client.create_path(path, 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::from(pattern(3, 0, len))).await.unwrap();
    let ino = f.ino();
    f.close().await.unwrap();
    ino
}

async fn write(ds: &Ds, ino: u64, cap: Capability) -> Result<u32, weft_rpc::RpcError> {
    let req = Request::Write(WriteReq { ino, offset: 0, cap });
    ds.call(req, vec![Bytes::from_static(b"overwritten!")], vec![]).await.map(|(r, _)| match r {
        weft_proto::Response::Write(n) => n,
        other => panic!("unexpected {other:?}"),
    })
}

/// Asserts a capability refusal with `code` whose message contains `reason`.
fn assert_refused<T: std::fmt::Debug>(r: Result<T, weft_rpc::RpcError>, code: ErrorCode, reason: &str, what: &str) {
    let e = r.expect_err(what);
    let w = e.remote().unwrap_or_else(|| panic!("{what}: not a server refusal: {e}"));
    assert_eq!(w.code, code, "{what}: {w}");
    assert!(w.message.contains(reason), "{what}: {w}");
}

/// Waits (bounded) until the wall clock is past `ms`.
async fn wait_until_past(ms: u64) {
    let start = unix_now_ms();
    while unix_now_ms() <= ms {
        assert!(unix_now_ms() - start < BOUND_MS, "the clock never passed {ms}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn forged_read_only_wrong_inode_and_missing_capabilities_are_refused_and_nothing_changes() {
    let c = start("caps-refused", 1).await;
    let client = c.client().await;
    let ino = file_with_bytes(&client, "/f", 8192).await;
    let other = file_with_bytes(&client, "/g", 10).await;
    let object = object_path(&c.data_root(0), ino);
    let before = std::fs::read(&object).unwrap();
    let ds = data_server(&c).await;

    let rw = client.open_capability(ino, Rights::READ_WRITE).await.unwrap().cap;
    let ro = client.open_capability(ino, Rights::READ).await.unwrap().cap;
    assert_eq!((rw.version, rw.ino, rw.rights, &*rw.key_id), (2, ino, Rights::READ_WRITE, "cluster"));
    let mut forged = rw.clone();
    forged.mac[7] ^= 0x01;
    assert_refused(write(&ds, ino, forged).await, ErrorCode::CapabilityRefused, "forged", "a flipped MAC byte");
    let mut widened = ro.clone();
    widened.rights = Rights::READ_WRITE;
    assert_refused(write(&ds, ino, widened).await, ErrorCode::CapabilityRefused, "forged", "rights widened by hand");
    assert_refused(write(&ds, ino, ro.clone()).await, ErrorCode::CapabilityRefused, "needs write", "read-only");
    let truncate = Request::Truncate(TruncateReq { ino, size: 0, cap: ro.clone() });
    assert_refused(ds.call_simple(truncate).await, ErrorCode::CapabilityRefused, "needs write", "truncate, read-only");
    // The ec ops: whole rows and ranges of a chunk (docs/format.md §17) need write rights to write, any to read.
    let row = RowWrite { expect: 0, version: 1, parity_of: Vec::new() };
    let rows =
        Request::WriteRows(WriteRowsReq { ino, unit: 4096, first_row: 0, rows: vec![row.clone()], cap: ro.clone() });
    let refused = ds.call(rows, vec![Bytes::from(vec![7u8; 4096])], vec![]).await;
    assert_refused(refused, ErrorCode::CapabilityRefused, "needs write", "WriteRows, read-only");
    let range = WriteChunkRangeReq { ino, unit: 4096, row: 0, offset: 0, write: row, cap: ro.clone() };
    let refused = ds.call(Request::WriteChunkRange(range), vec![Bytes::from(vec![7u8; 16])], vec![]).await;
    assert_refused(refused, ErrorCode::CapabilityRefused, "needs write", "WriteChunkRange, read-only");
    let read_range = ReadChunkRangeReq { ino, unit: 4096, row: 0, offset: 0, len: 16, cap: Capability::none() };
    let refused = ds.call(Request::ReadChunkRange(read_range), vec![], vec![BytesMut::zeroed(16)]).await;
    assert_refused(refused, ErrorCode::CapabilityRefused, "no capability", "ReadChunkRange, none");
    let for_other = client.open_capability(other, Rights::READ_WRITE).await.unwrap().cap;
    assert_refused(write(&ds, ino, for_other).await, ErrorCode::CapabilityRefused, "inode", "another inode's");
    assert_refused(write(&ds, ino, Capability::none()).await, ErrorCode::CapabilityRefused, "no capability", "none");
    for version in [1, 3] {
        let mut other_version = rw.clone();
        other_version.version = version;
        let refused = write(&ds, ino, other_version).await;
        assert_refused(refused, ErrorCode::CapabilityRefused, "version", "another version");
    }
    // A capability the MDS sealed for a connection of another key is refused on this one (only the cluster key
    // exists yet, so the key id is changed by hand: the MAC then no longer matches, caught first).
    let mut other_key = rw.clone();
    other_key.key_id = "alice".into();
    assert_refused(write(&ds, ino, other_key).await, ErrorCode::CapabilityRefused, "forged", "another key's");

    assert_eq!(std::fs::read(&object).unwrap(), before, "a refused request changed the object");
    // A read capability reads, and the refusals were logged naming the peer, inode and reason.
    let read = Request::Read(ReadReq { ino, offset: 0, len: 8192, cap: ro, fill: None });
    let (_, back) = ds.call(read, vec![], vec![BytesMut::zeroed(8192)]).await.unwrap();
    assert_eq!(&back[0][..], &before[..]);
    let log = c.log("data0");
    assert!(log.contains("refusing a request's capability"), "no refusal logged");
    assert!(log.contains(&format!("ino={ino}")) && log.contains("forged"), "the log line names both");
    // The write capability writes.
    assert_eq!(write(&ds, ino, rw).await.unwrap(), 12);
    assert_eq!(&std::fs::read(&object).unwrap()[..12], b"overwritten!");
}

/// With a 2 s lifetime: a capability is refused once expired (skew 0 here) and nothing is written; a file held
/// open for several lifetimes still reads and writes through the library, which renews; after a chmod that takes
/// write away, the old write capability stops at its expiry.
#[tokio::test]
async fn expired_capabilities_are_refused_and_open_files_renew() {
    const TTL_MS: u64 = 2000;
    let c = start_with("caps-expiry", 1, |o| {
        o.meta_extra_toml = format!("capability_ttl_ms = {TTL_MS}");
        o.data_extra_toml = "capability_clock_skew_ms = 0".into();
    })
    .await;
    let client = c.client().await;
    let ino = file_with_bytes(&client, "/f", 4096).await;
    let object = object_path(&c.data_root(0), ino);
    let before = std::fs::read(&object).unwrap();
    let ds = data_server(&c).await;

    let opened = client.open_capability(ino, Rights::READ_WRITE).await.unwrap();
    assert_eq!(opened.ttl_ms, TTL_MS);
    assert!(opened.cap.expiry_ms <= unix_now_ms() + TTL_MS, "the expiry follows the configured lifetime");
    // Held open across the expiry of its first capability (and the next).
    let held = client.open("/f", OpenMode::ReadWrite).await.unwrap();
    // chmod: write permission gone (root still may write, so renewals still get one; the MDS's refusal of a new
    // write capability to a user without write permission is a unit test of weft-meta's namespace).
    client.setattr(ino, SetAttrs { mode: Some(0o444), ..Default::default() }).await.unwrap();
    wait_until_past(opened.cap.expiry_ms + TTL_MS).await;
    assert_refused(
        write(&ds, ino, opened.cap.clone()).await,
        ErrorCode::CapabilityExpired,
        "expired",
        "an expired capability",
    );
    assert_eq!(std::fs::read(&object).unwrap(), before, "an expired capability wrote");

    // The held file renews on its next I/O, for many I/Os at once (single flight).
    let mut tasks = tokio::task::JoinSet::new();
    let held = std::sync::Arc::new(held);
    for i in 0..16u64 {
        let f = held.clone();
        tasks.spawn(async move { f.read_at(i * 256, BytesMut::zeroed(256)).await.map(|b| (i, b)) });
    }
    while let Some(r) = tasks.join_next().await {
        let (i, got) = r.unwrap().expect("a read after the capability expired");
        assert_eq!(&got[..], &before[(i * 256) as usize..(i * 256 + 256) as usize]);
    }
    held.write_at(0, Bytes::from_static(b"renewed")).await.expect("a write after the capability expired");
    held.sync().await.unwrap();
    assert_eq!(&std::fs::read(&object).unwrap()[..7], b"renewed");
    // And once more past another lifetime: renewal is not a one-off.
    let now = unix_now_ms();
    wait_until_past(now + TTL_MS + 100).await;
    let got = held.read_at(0, BytesMut::zeroed(7)).await.unwrap();
    assert_eq!(&got[..], b"renewed");
}

/// After an unlink, the orphan collector removes the object; the data server remembers the inode, so a write
/// with a capability issued before the unlink (and not yet expired) is refused and does not recreate the object.
#[tokio::test]
async fn an_unlinked_files_old_capability_cannot_recreate_its_object() {
    let c = start("caps-unlink", 1).await;
    let client = c.client().await;
    let ino = file_with_bytes(&client, "/doomed", 4096).await;
    let object = object_path(&c.data_root(0), ino);
    assert!(object.exists());
    let cap = client.open_capability(ino, Rights::READ_WRITE).await.unwrap().cap;
    let ds = data_server(&c).await;
    assert_eq!(write(&ds, ino, cap.clone()).await.unwrap(), 12, "valid before the unlink");
    client.unlink(ROOT_INO, "doomed").await.unwrap();
    let start = unix_now_ms();
    while object.exists() {
        assert!(unix_now_ms() - start < BOUND_MS, "the orphan collector never removed the object");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(unix_now_ms() < cap.expiry_ms, "the capability is still unexpired: only the removal can refuse it");
    assert_refused(write(&ds, ino, cap.clone()).await, ErrorCode::CapabilityRefused, "removed", "after the unlink");
    let read = Request::Read(ReadReq { ino, offset: 0, len: 10, cap, fill: None });
    assert_refused(
        ds.call(read, vec![], vec![BytesMut::zeroed(10)]).await,
        ErrorCode::CapabilityRefused,
        "removed",
        "a read after the unlink",
    );
    assert!(!object.exists(), "a refused write recreated the object");
    // The MDS no longer opens it either.
    let e = client.open_capability(ino, Rights::READ).await.map(|_| ()).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
}

/// With authentication off the MDS issues empty capabilities and the data servers check nothing.
#[tokio::test]
async fn with_authentication_off_capabilities_are_empty_and_unchecked() {
    let c = start_with("caps-auth-off", 1, |o| o.auth = weft_rpc::AuthMode::None).await;
    let client = c.client().await;
    let ino = file_with_bytes(&client, "/f", 100).await;
    let opened = client.open_capability(ino, Rights::READ).await.unwrap();
    assert!(opened.cap.is_none());
    let ds = data_server(&c).await;
    assert_eq!(write(&ds, ino, Capability::none()).await.unwrap(), 12);
    let f = client.open("/f", OpenMode::Read).await.unwrap();
    let got = f.read_at(0, BytesMut::zeroed(12)).await.unwrap();
    assert_eq!(&got[..], b"overwritten!");
}

/// Open refuses what has no data: a directory (`IsDir`), a FIFO (`Invalid`).
#[tokio::test]
async fn open_refuses_directories_and_special_files() {
    let c = start("caps-open-kinds", 1).await;
    let client = c.client().await;
    let d = client.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    let e = client.open_ino(d.ino, OpenMode::Read).await.map(|_| ()).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::IsDir), "{e}");
    let fifo = client.mknod(ROOT_INO, "p", weft_proto::FileKind::Fifo, 0o644, 0).await.unwrap();
    let e = client.open_ino(fifo.ino, OpenMode::Read).await.map(|_| ()).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Invalid), "{e}");
}

/// Taking write permission away from a user: a new write open is refused at once, and the user's file already
/// open for writing keeps its old capability only until that expires (the bound ARCHITECTURE.md states); its
/// renewal is refused, so its next write fails and nothing reaches the disk. The user here is not the file's
/// owner: an owner keeps the rights of an open it holds (`RenewOpen`, knfsd's owner override; it could chmod the
/// file back anyway), and writes on.
#[tokio::test]
async fn a_chmod_revokes_a_users_open_write_capability_within_its_lifetime() {
    const TTL_MS: u64 = 2000;
    let c = start_with("caps-chmod", 1, |o| {
        o.meta_extra_toml = format!("capability_ttl_ms = {TTL_MS}");
        o.data_extra_toml = "capability_clock_skew_ms = 0".into();
    })
    .await;
    let root = c.client().await;
    let shared = root.mkdir(ROOT_INO, "shared", 0o777).await.unwrap().ino;
    root.setattr(shared, SetAttrs { mode: Some(0o777), ..Default::default() }).await.unwrap();
    let alice = root.with_user(weft_proto::UserCred { uid: 1000, gid: 100, groups: vec![] });
    let bob = root.with_user(weft_proto::UserCred { uid: 1001, gid: 100, groups: vec![] });
    let own = alice.create_path("/shared/a", 0o666, true, false).await.unwrap();
    let ino = own.ino();
    let f = bob.open("/shared/a", OpenMode::Write).await.unwrap();
    f.write_at(0, Bytes::from_static(b"first")).await.unwrap();
    f.sync().await.unwrap();
    let issued_ms = unix_now_ms();

    root.setattr(ino, SetAttrs { mode: Some(0o644), ..Default::default() }).await.unwrap();
    let refused = bob.open("/shared/a", OpenMode::Write).await.map(|_| ()).unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Permission), "a new write open after the chmod: {refused}");

    // Past the old capability's lifetime, the open file must renew, and the MDS refuses bob a write capability.
    wait_until_past(issued_ms + TTL_MS).await;
    let late = f.write_at(0, Bytes::from_static(b"later")).await.expect_err("a write past the lifetime, revoked");
    assert_eq!(late.code(), Some(ErrorCode::Permission), "the renewal is refused: {late}");
    let object = object_path(&c.data_root(0), ino);
    assert_eq!(&std::fs::read(&object).unwrap()[..5], b"first", "the revoked write reached the disk");
    // The owner's open, as old, renews: it writes on.
    own.write_at(5, Bytes::from_static(b"+owner")).await.unwrap();
    own.close().await.unwrap();
    // Reading is still allowed (mode 0444): the renewal for reading succeeds.
    let r = bob.open("/shared/a", OpenMode::Read).await.unwrap();
    assert_eq!(&r.read_at(0, BytesMut::zeroed(11)).await.unwrap()[..], b"first+owner");
}

/// Issue 30 item 2's clock fault: a data server whose clock runs ahead. Within the allowed skew (3 s of the
/// default 5) nothing changes. Past a capability's whole lifetime (10 min ahead) every capability looks expired
/// there: a write and a read fail with the server's refusal, which names the expiry, its own clock and the skew
/// allowed (so the operator sees the clock), and no byte is lost or wrong once the clock is right again.
#[tokio::test]
async fn a_data_server_whose_clock_runs_ahead_refuses_clearly_past_the_skew_and_loses_nothing() {
    let mut c = start("clock-ahead", 1).await;
    let client = c.client().await;
    file_with_bytes(&client, "/f", 100_000).await;
    let restart_with = |c: &mut TestCluster, ahead_ms: u64| {
        c.set_env(if ahead_ms == 0 { vec![] } else { vec![("WEFT_FAULT".into(), format!("clock-ahead:{ahead_ms}"))] });
    };
    let read_f = |client: Client| async move {
        let f = client.open("/f", OpenMode::Read).await?;
        let got = f.read_at(0, BytesMut::zeroed(100_000)).await?;
        Ok::<_, weft_client::ClientError>(got.to_vec())
    };

    restart_with(&mut c, 3_000);
    c.restart_data_server(0).await.unwrap();
    let client = c.client().await;
    file_with_bytes(&client, "/g", 50_000).await;
    assert!(c.log("data0").contains("the wall clock runs ahead"), "the fault was armed");
    assert_eq!(read_f(client.clone()).await.unwrap(), pattern(3, 0, 100_000), "3 s ahead: within the skew");

    restart_with(&mut c, 600_000);
    c.restart_data_server(0).await.unwrap();
    let client = c.client().await;
    let f = client.create_path("/h", 0o644, true, false).await.unwrap();
    let write = f.write_at(0, Bytes::from(vec![1u8; 4096])).await;
    let e = match write {
        Err(e) => e.to_string(),
        Ok(()) => f.close().await.expect_err("10 min ahead: the write or its close fails").to_string(),
    };
    assert!(e.contains("expired") && e.contains("skew"), "the refusal names the clock: {e}");
    eprintln!("10 min ahead, a write: {e}");
    let e = read_f(client.clone()).await.expect_err("10 min ahead: the read fails, never returns bytes").to_string();
    assert!(e.contains("expired") && e.contains("skew"), "the refusal names the clock: {e}");

    restart_with(&mut c, 0);
    c.restart_data_server(0).await.unwrap();
    let client = c.client().await;
    assert_eq!(read_f(client.clone()).await.unwrap(), pattern(3, 0, 100_000), "nothing lost");
    let g = client.open("/g", OpenMode::Read).await.unwrap();
    assert_eq!(g.read_at(0, BytesMut::zeroed(50_000)).await.unwrap().to_vec(), pattern(3, 0, 50_000));
}
