//! Exactly-once: the server executes a request, then (fault injection) drops the connection instead of replying.
//! The client reconnects and retries on the same slot and sequence; the reply cache answers, and the request is
//! not executed a second time.

use crate::common;

use common::*;
use weft_client::OpenMode;
use weft_proto::{Op, ROOT_INO};

#[tokio::test]
async fn a_retried_exclusive_create_succeeds_once() {
    let cl = start_with("eo-create", 1, |o| {
        o.env.push(("WEFT_FAULT".into(), format!("drop-after-execute:{}:1", Op::Create as u16)));
    })
    .await;
    let c = cl.client().await;
    // Exclusive: a second execution would fail with Exists.
    let a = c.create(ROOT_INO, "once", 0o644, true).await.expect("the retry is answered from the reply cache");
    let entries = c.readdir(ROOT_INO).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!((entries[0].name.as_str(), entries[0].ino), ("once", a.ino));
    let log = cl.log("meta");
    assert!(log.contains("fault injection: dropping the connection"), "the fault never fired:\n{log}");
    assert!(log.contains("retransmission answered from the reply cache"), "{log}");
}

#[tokio::test]
async fn a_retried_rename_is_not_executed_twice() {
    let cl = start_with("eo-rename", 1, |o| {
        o.env.push(("WEFT_FAULT".into(), format!("drop-after-execute:{}:1", Op::Rename as u16)));
    })
    .await;
    let c = cl.client().await;
    let f = c.create(ROOT_INO, "a", 0o644, true).await.unwrap();
    // Executed twice, the second rename would find no "a" and fail with NotFound.
    c.rename(ROOT_INO, "a", ROOT_INO, "b", 0).await.expect("rename answered from the reply cache");
    assert_eq!(c.lookup(ROOT_INO, "b").await.unwrap().ino, f.ino);
    assert!(c.lookup(ROOT_INO, "a").await.is_err());
    assert!(cl.log("meta").contains("fault injection: dropping the connection"));
}

#[tokio::test]
async fn a_retried_write_to_a_data_server_is_answered_from_cache() {
    // A 10 000-byte write is `Write` over tcp and `WriteChunks` (through the arena) over shm.
    let op = match weft_client::FabricChoice::from_env() {
        weft_client::FabricChoice::Tcp => Op::Write,
        _ => Op::WriteChunks,
    };
    let cl = start_with("eo-write", 1, |o| {
        o.env.push(("WEFT_FAULT".into(), format!("drop-after-execute:{}:1", op as u16)));
    })
    .await;
    let c = cl.client().await;
    let f = c.create_path("/w", 0o644, true, false).await.unwrap();
    f.write_at(0, bytes::Bytes::from(pattern(5, 0, 10_000))).await.unwrap();
    f.close().await.unwrap();
    let g = c.open("/w", OpenMode::ReadWrite).await.unwrap();
    let buf = g.read_at(0, bytes::BytesMut::zeroed(10_000)).await.unwrap();
    assert_eq!(&buf[..], &pattern(5, 0, 10_000)[..]);
    let log = cl.log("data0");
    assert!(log.contains("fault injection: dropping the connection"), "{log}");
    assert!(log.contains("retransmission answered from the reply cache"), "{log}");
}
