//! Hostile peers against the RPC server's connection handling (an in-process server on loopback, so its
//! deadlines and limits can be set short and small): floods of half-open connections, half-sent headers, idle
//! connections and clients that never read their replies. Each is cut off; well-behaved clients keep being served.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use common::wire::{read_reply, request_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use weft_fabric::{Fabric, Listener, TcpFabric};
use weft_proto::msg::{ReadReq, SessionCreateReq};
use weft_proto::{Capability, ErrorCode, FrameLimits, HEADER_LEN, Request, Response, WireError};
use weft_rpc::{CallCtx, ClientConfig, PoolBuf, Reply, RpcClient, RpcServer, ServerConfig, Service};

const OP_NULL: u16 = 1;
const OP_SESSION_CREATE: u16 = 2;
const OP_READ: u16 = weft_proto::Op::Read as u16;

/// Every wait in these tests is bounded by this; reaching it fails the test (nothing is timed).
const BOUND: Duration = Duration::from_secs(60);

/// Serves `Read` with bytes that depend on the offset, from the server's pool.
struct Pattern;

fn pattern_byte(pos: u64) -> u8 {
    (pos % 251) as u8
}

impl Service for Pattern {
    async fn call(&self, ctx: &CallCtx, req: Request, _data: Option<PoolBuf>) -> Result<Reply, WireError> {
        match req {
            Request::Read(r) => {
                let mut buf = ctx.pool.acquire(r.len as usize).await;
                for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
                    *b = pattern_byte(r.offset + i as u64);
                }
                Ok(Reply { resp: Response::Read(()), data: Some(Box::new(buf)) })
            }
            _ => Err(WireError::new(ErrorCode::BadRequest, "not served here")),
        }
    }
}

/// Starts a server on `listen` (port 0) and returns its address.
async fn start(listen: &str, cfg: ServerConfig) -> String {
    let l = TcpFabric::default().listen(listen).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(RpcServer::<TcpFabric, _>::new(cfg, Arc::new(Pattern)).serve(l));
    addr
}

fn frame(op: u16, session: u64, slot: u32, seq: u32, body: &[u8]) -> Vec<u8> {
    request_frame(op, session, slot, seq, body, &[])
}

/// Opens a session on a raw connection; returns its id.
async fn raw_session(s: &mut TcpStream, slots: u32) -> u64 {
    let create = Request::SessionCreate(SessionCreateReq { client_name: "raw".into(), slots });
    s.write_all(&frame(OP_SESSION_CREATE, 0, u32::MAX, 0, &create.encode_body())).await.unwrap();
    let (_, body, _) = read_reply(s).await;
    let Response::SessionCreate(sess) = Response::decode(OP_SESSION_CREATE, &body).unwrap() else {
        panic!("not a session")
    };
    assert_eq!(sess.slots, slots);
    sess.session
}

/// A `Null` round trip on a raw connection.
async fn raw_null(s: &mut TcpStream) {
    s.write_all(&frame(OP_NULL, 0, 0, 0, &[])).await.unwrap();
    let (h, _, _) = read_reply(s).await;
    assert_eq!(h.flags & weft_proto::frame::FLAG_ERROR, 0);
}

/// Waits (bounded) until the server closes `s`: end of file, after any bytes it still had queued.
async fn assert_closed_by_server(s: &mut TcpStream) {
    let drain = async {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => continue,
                Err(e) => return Err(e),
            }
        }
    };
    let r = tokio::time::timeout(BOUND, drain).await.expect("the server never closed the connection");
    r.expect("an orderly close (end of file), not an error");
}

/// Raises this process's soft descriptor limit to `want` (up to the hard limit) so the floods fit.
#[allow(unsafe_code)]
fn raise_descriptor_limit(want: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into a valid, exclusively borrowed struct.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    assert!(lim.rlim_max >= want, "the hard descriptor limit {} is below the {want} this test needs", lim.rlim_max);
    if lim.rlim_cur < want {
        lim.rlim_cur = want;
        // SAFETY: setrlimit reads one valid rlimit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    }
}

/// Opens `n` connections to `addr` that each send 10 bytes of a header and stop. Connections the server refuses
/// are closed by it at once; a write to one may fail, which is fine.
async fn half_open_flood(addr: &str, n: usize) -> Vec<TcpStream> {
    let head = frame(OP_NULL, 0, 0, 0, &[]);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(&head[..10]).await;
        v.push(s);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_half_open_connections_do_not_stop_a_client_from_another_address() {
    raise_descriptor_limit(8192);
    // The default limits and deadlines: the per-peer cap (1024) stops the flood, which all comes from 127.0.0.1.
    let addr = start("127.0.0.1:0", ServerConfig::default()).await;
    let flood = half_open_flood(&addr, 2000).await;
    // The flood's peer is over its limit: a further connection from it is closed at once, unanswered.
    let mut over = TcpStream::connect(&addr).await.unwrap();
    let _ = over.write_all(&frame(OP_NULL, 0, 0, 0, &[])).await;
    let mut hb = [0u8; HEADER_LEN];
    let answered = tokio::time::timeout(BOUND, over.read_exact(&mut hb)).await.expect("neither answered nor closed");
    assert!(answered.is_err(), "a connection over the per-peer limit was served");

    // A well-behaved client from another loopback address (Linux routes all of 127/8 to lo).
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut s = tokio::time::timeout(BOUND, sock.connect(addr.parse().unwrap())).await.unwrap().unwrap();
    let served = async {
        let session = raw_session(&mut s, 4).await;
        for i in 0..8u32 {
            let read = Request::Read(ReadReq {
                ino: 1,
                offset: u64::from(i) * 1000,
                len: 100_000,
                cap: Capability::none(),
                fill: None,
            });
            s.write_all(&frame(OP_READ, session, 0, i + 1, &read.encode_body())).await.unwrap();
            let (h, _, data) = read_reply(&mut s).await;
            assert_eq!(h.flags & weft_proto::frame::FLAG_ERROR, 0);
            assert_eq!(data.len(), 100_000);
            assert!(data.iter().enumerate().all(|(j, b)| *b == pattern_byte(u64::from(i) * 1000 + j as u64)));
        }
    };
    tokio::time::timeout(BOUND, served).await.expect("the well-behaved client was not served");
    drop(flood);
}

#[tokio::test]
async fn at_the_global_cap_unproven_connections_make_room_and_proven_ones_stay() {
    let cfg = ServerConfig { connections_max: 32, ..ServerConfig::default() };
    let addr = start("127.0.0.1:0", cfg).await;
    // A connection that has done real work (as a registered server's heartbeat has) ...
    let mut proven = TcpStream::connect(&addr).await.unwrap();
    raw_session(&mut proven, 1).await;
    // ... then a flood that fills the table many times over ...
    let flood = half_open_flood(&addr, 200).await;
    // ... a new client still gets in (the oldest half-open connections make room) ...
    let served = async {
        let c = RpcClient::connect(TcpFabric::default(), &addr, ClientConfig::default()).await.unwrap();
        let dest = vec![BytesMut::zeroed(4096)];
        let (r, dest) = c
            .call(
                Request::Read(ReadReq { ino: 1, offset: 7, len: 4096, cap: Capability::none(), fill: None }),
                vec![],
                dest,
            )
            .await
            .unwrap();
        assert_eq!(r, Response::Read(()));
        assert!(dest[0].iter().enumerate().all(|(j, b)| *b == pattern_byte(7 + j as u64)));
    };
    tokio::time::timeout(BOUND, served).await.expect("a new client was locked out at the global cap");
    // ... and the proven connection was never evicted.
    tokio::time::timeout(BOUND, raw_null(&mut proven)).await.unwrap();
    drop(flood);
}

/// Connections that answer `Null` and nothing else prove nothing (issue 31): a table filled with them still makes
/// room for a new client, closing the oldest of them; a connection that opened a session stays.
#[tokio::test]
async fn connections_that_only_ping_stay_evictable() {
    let cfg = ServerConfig { connections_max: 16, ..ServerConfig::default() };
    let addr = start("127.0.0.1:0", cfg).await;
    let mut worker = TcpStream::connect(&addr).await.unwrap();
    raw_session(&mut worker, 1).await;
    let mut pingers = Vec::new();
    for _ in 0..15 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        raw_null(&mut s).await;
        pingers.push(s);
    }
    // The table is full of pingers and one worker; a new client still gets in.
    let served = async {
        let c = RpcClient::connect(TcpFabric::default(), &addr, ClientConfig::default()).await.unwrap();
        let read = Request::Read(ReadReq { ino: 1, offset: 3, len: 64, cap: Capability::none(), fill: None });
        let (_, dest) = c.call(read, vec![], vec![BytesMut::zeroed(64)]).await.unwrap();
        assert_eq!(dest[0][0], pattern_byte(3));
    };
    tokio::time::timeout(BOUND, served).await.expect("connections that only ping locked a new client out");
    // The oldest pinger made room; the worker did not.
    assert_closed_by_server(&mut pingers[0]).await;
    tokio::time::timeout(BOUND, raw_null(&mut worker)).await.unwrap();
}

#[tokio::test]
async fn a_half_sent_header_is_dropped_after_the_frame_deadline() {
    let cfg = ServerConfig { frame_timeout_ms: 200, ..ServerConfig::default() };
    let addr = start("127.0.0.1:0", cfg).await;
    let head = frame(OP_NULL, 0, 0, 0, &[]);
    // On a new connection.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&head[..10]).await.unwrap();
    assert_closed_by_server(&mut s).await;
    // On a connection that has completed frames before.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    raw_null(&mut s).await;
    s.write_all(&head[..10]).await.unwrap();
    assert_closed_by_server(&mut s).await;
    // A connection that never sends a byte has the same deadline for its first frame.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    assert_closed_by_server(&mut s).await;
}

#[tokio::test]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let cfg = ServerConfig { idle_timeout_ms: 200, ..ServerConfig::default() };
    let addr = start("127.0.0.1:0", cfg).await;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    raw_null(&mut s).await;
    assert_closed_by_server(&mut s).await;
    // A client whose connection was closed for idleness reconnects on its next call.
    let c = RpcClient::connect(TcpFabric::default(), &addr, ClientConfig::default()).await.unwrap();
    let read = || Request::Read(ReadReq { ino: 1, offset: 0, len: 10, cap: Capability::none(), fill: None });
    c.call(read(), vec![], vec![BytesMut::zeroed(10)]).await.unwrap();
    let mut probe = TcpStream::connect(&addr).await.unwrap();
    raw_null(&mut probe).await;
    assert_closed_by_server(&mut probe).await;
    let (_, dest) =
        tokio::time::timeout(BOUND, c.call(read(), vec![], vec![BytesMut::zeroed(10)])).await.unwrap().unwrap();
    assert_eq!(dest[0][9], pattern_byte(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_replies_does_not_stop_another_clients_reads() {
    const MIB: u32 = 1 << 20;
    // Four 1 MiB buffers: the stuck client's replies take them all until its sends expire.
    let cfg = ServerConfig {
        limits: FrameLimits { body_bytes_max: 1 << 20, data_bytes_max: MIB },
        pool_buffers: 4,
        send_timeout_ms: 500,
        ..ServerConfig::default()
    };
    let addr = start("127.0.0.1:0", cfg).await;
    // The stuck client: a tiny receive buffer, 64 reads of 1 MiB in flight, and it never reads a reply.
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut stuck = sock.connect(addr.parse().unwrap()).await.unwrap();
    let session = raw_session(&mut stuck, 64).await;
    let mut requests = Vec::new();
    for slot in 0..64u32 {
        let read = Request::Read(ReadReq {
            ino: 9,
            offset: u64::from(slot) * u64::from(MIB),
            len: MIB,
            cap: Capability::none(),
            fill: None,
        });
        requests.extend_from_slice(&frame(OP_READ, session, slot, 1, &read.encode_body()));
    }
    stuck.write_all(&requests).await.unwrap();

    // Another client's reads complete, with the right bytes.
    let reads = async {
        let c = RpcClient::connect(TcpFabric::default(), &addr, ClientConfig::default()).await.unwrap();
        for i in 0..16u64 {
            let offset = i * 12_345;
            let dest = vec![BytesMut::zeroed(MIB as usize)];
            let (r, dest) = c
                .call(
                    Request::Read(ReadReq { ino: 1, offset, len: MIB, cap: Capability::none(), fill: None }),
                    vec![],
                    dest,
                )
                .await
                .unwrap();
            assert_eq!(r, Response::Read(()));
            assert!(dest[0].iter().enumerate().all(|(j, b)| *b == pattern_byte(offset + j as u64)), "read {i}");
        }
    };
    tokio::time::timeout(BOUND, reads).await.expect("a client that never reads stopped another client's reads");
    // The stuck client's connection was closed by the server.
    assert_closed_by_server(&mut stuck).await;
}
