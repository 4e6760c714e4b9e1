//! Hostile input against real server processes: malformed, truncated and oversized frames, and out-of-range
//! offsets and lengths. Each gets an error; the server keeps serving everyone else.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft_client::OpenMode;
use weft_fabric::TcpFabric;
use weft_proto::frame::FLAG_ERROR;
use weft_proto::msg::{ReadReq, TruncateReq, WriteReq, decode};
use weft_proto::{ErrorCode, FrameLimits, HEADER_LEN, Header, ROOT_INO, Request, Rights, WireError};
use weft_rpc::RpcClient;

/// A request outside any session whose header announces `data_len` payload bytes (none follow).
fn frame(op: u16, body: &[u8], data_len: u32) -> Vec<u8> {
    wire::request_head(op, 0, 0, 0, body, data_len)
}

/// Sends raw bytes, expects one error reply, and returns its message.
async fn refused(addr: &str, bytes: &[u8], close: bool) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    if close {
        s.shutdown().await.unwrap();
    }
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).await.expect("an error reply, not a silent close");
    let h = Header::decode(&hb, &FrameLimits::default()).unwrap();
    assert_ne!(h.flags & FLAG_ERROR, 0);
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).await.unwrap();
    decode::<WireError>(h.op, &body).unwrap().message
}

#[tokio::test]
async fn malformed_frames_are_refused_and_servers_keep_serving() {
    let cl = start("hostile-frames", 1).await;
    let good = cl.client().await;
    let ds_addr = cl.data_addrs()[0].clone();
    for addr in [cl.mds_addr().to_string(), ds_addr] {
        assert!(refused(&addr, &[0x42; 100], false).await.contains("magic"));
        let mut f = frame(1, &[], 0);
        f[5] = 9;
        assert!(refused(&addr, &f, false).await.contains("kind"));
        let mut f = frame(100, &[], 0);
        f[28..32].copy_from_slice(&(512u32 << 20).to_le_bytes());
        assert!(refused(&addr, &f, false).await.contains("exceeds"), "oversized body");
        let f = frame(weft_proto::Op::Write as u16, &[], u32::MAX);
        assert!(refused(&addr, &f, false).await.contains("exceeds"), "oversized payload");
        assert!(refused(&addr, &frame(1, &[], 0)[..17], true).await.contains("truncated"));
        assert!(refused(&addr, &frame(4242, &[], 0), false).await.contains("unknown op"));
        assert!(!refused(&addr, &frame(100, &[0xff; 7], 0), false).await.is_empty(), "undecodable body");
        // A body cut short by a close: the server drops the connection without harm.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let mut f = frame(100, &[0u8; 10], 0);
        f.truncate(HEADER_LEN + 3);
        s.write_all(&f).await.unwrap();
        s.shutdown().await.unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
        // Meanwhile, a well-behaved client is served as usual.
        let name = format!("still-served-{}", addr.replace([':', '.'], "-"));
        good.create(ROOT_INO, &name, 0o644, true).await.unwrap();
    }
    let f = good.create_path("/data", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::from_static(b"still fine")).await.unwrap();
    f.close().await.unwrap();
    let g = good.open("/data", OpenMode::ReadWrite).await.unwrap();
    assert_eq!(&g.read_at(0, BytesMut::zeroed(10)).await.unwrap()[..], b"still fine");
}

/// The error code a server answered a call with.
fn code<T>(r: Result<T, weft_rpc::RpcError>) -> Option<ErrorCode> {
    r.map(|_| ()).unwrap_err().remote().map(|w| w.code)
}

#[tokio::test]
async fn out_of_range_offsets_and_lengths_are_refused() {
    let cl = start("hostile-ranges", 1).await;
    let ds = RpcClient::connect(TcpFabric::default(), &cl.data_addrs()[0], cl.rpc_config()).await.unwrap();
    let cap = cl.capability(5, Rights::READ_WRITE, 600_000);

    // A read larger than a transfer unit.
    let r = ds
        .call(
            Request::Read(ReadReq { ino: 5, offset: 0, len: 64 << 20, cap: cap.clone(), fill: None }),
            vec![],
            vec![BytesMut::zeroed(64 << 20)],
        )
        .await;
    assert_eq!(code(r), Some(ErrorCode::OutOfRange));
    // Offsets whose end overflows or lies beyond what an object may hold.
    let r = ds
        .call(
            Request::Read(ReadReq { ino: 5, offset: u64::MAX - 10, len: 100, cap: cap.clone(), fill: None }),
            vec![],
            vec![BytesMut::zeroed(100)],
        )
        .await;
    assert_eq!(code(r), Some(ErrorCode::OutOfRange));
    let r = ds
        .call(
            Request::Write(WriteReq { ino: 5, offset: 1 << 62, cap: cap.clone() }),
            vec![Bytes::from_static(b"x")],
            vec![],
        )
        .await;
    assert_eq!(code(r), Some(ErrorCode::OutOfRange));
    let r = ds.call_simple(Request::Truncate(TruncateReq { ino: 5, size: u64::MAX, cap: cap.clone() })).await;
    assert_eq!(code(r), Some(ErrorCode::OutOfRange));
    // An op that data servers do not serve.
    let r = ds.call_simple(Request::Statfs(())).await;
    assert_eq!(code(r), Some(ErrorCode::BadRequest));
    // And the same session still works.
    let (resp, _) = ds
        .call(Request::Write(WriteReq { ino: 5, offset: 0, cap: cap.clone() }), vec![Bytes::from_static(b"ok")], vec![])
        .await
        .unwrap();
    assert_eq!(resp, weft_proto::Response::Write(2));
    let (_, back) = ds
        .call(
            Request::Read(ReadReq { ino: 5, offset: 0, len: 2, cap: cap.clone(), fill: None }),
            vec![],
            vec![BytesMut::zeroed(2)],
        )
        .await
        .unwrap();
    assert_eq!(&back[0][..], b"ok");
}
