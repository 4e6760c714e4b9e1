//! The RPC layer over real TCP sockets on loopback: payloads both ways, exactly-once replays, credits, and
//! refusal of malformed frames without harm to other clients.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::{Bytes, BytesMut};
use common::wire::{read_reply, request_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft_fabric::{Fabric, Listener, TcpFabric};
use weft_proto::frame::{FLAG_CACHED, FLAG_ERROR, FLAG_USER};
use weft_proto::msg::{ReadReq, SessionCreateReq, WriteReq, decode};
use weft_proto::{Capability, ErrorCode, Op, Request, Response, UserCred, WireError};
use weft_rpc::{CallCtx, ClientConfig, PoolBuf, Reply, RpcClient, RpcServer, ServerConfig, Service};

const OP_WRITE: u16 = weft_proto::Op::Write as u16;

#[derive(Default)]
struct Counting {
    /// The user block of every call, in order.
    users: std::sync::Mutex<Vec<Option<UserCred>>>,
    writes: AtomicU32,
    in_flight: AtomicU32,
    in_flight_max: AtomicU32,
}

impl Service for Counting {
    async fn call(&self, ctx: &CallCtx, req: Request, data: Option<PoolBuf>) -> Result<Reply, WireError> {
        self.users.lock().unwrap().push(ctx.user.clone());
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.in_flight_max.fetch_max(now, Ordering::SeqCst);
        tokio::task::yield_now().await;
        let out = match req {
            Request::Write(_) => {
                self.writes.fetch_add(1, Ordering::SeqCst);
                Ok(Response::Write(data.map(|d| d.len() as u32).unwrap_or(0)).into())
            }
            Request::Read(r) => {
                let mut buf = ctx.pool.acquire(r.len as usize).await;
                for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
                    *b = (r.offset as usize + i) as u8;
                }
                Ok(Reply { resp: Response::Read(()), data: Some(Box::new(buf)) })
            }
            _ => Err(WireError::new(ErrorCode::BadRequest, "not served here")),
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

async fn start(svc: Arc<Counting>) -> String {
    let f = TcpFabric::default();
    let l = f.listen("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let srv = RpcServer::<TcpFabric, _>::new(ServerConfig::default(), svc);
    tokio::spawn(srv.serve(l));
    addr
}

#[tokio::test]
async fn payloads_round_trip_into_caller_buffers() {
    let svc = Arc::new(Counting::default());
    let addr = start(svc.clone()).await;
    let c = RpcClient::connect(TcpFabric::default(), &addr, ClientConfig::default()).await.unwrap();
    let data = vec![Bytes::from(vec![7u8; 1000]), Bytes::from(vec![8u8; 24])];
    let (r, _) =
        c.call(Request::Write(WriteReq { ino: 1, offset: 0, cap: Capability::none() }), data, vec![]).await.unwrap();
    assert_eq!(r, Response::Write(1024));
    // The reply's payload lands in two caller segments, in order.
    let dest = vec![BytesMut::zeroed(100), BytesMut::zeroed(156)];
    let (r, dest) = c
        .call(Request::Read(ReadReq { ino: 1, offset: 0, len: 256, cap: Capability::none(), fill: None }), vec![], dest)
        .await
        .unwrap();
    assert_eq!(r, Response::Read(()));
    assert_eq!(dest[0][99], 99);
    assert_eq!(dest[1][0], 100);
    assert_eq!(dest[1][155], 255);
    // A reply payload that does not match the caller's buffers is a protocol error, not a silent truncation.
    let short = vec![BytesMut::zeroed(10)];
    assert!(
        c.call(
            Request::Read(ReadReq { ino: 1, offset: 0, len: 256, cap: Capability::none(), fill: None }),
            vec![],
            short
        )
        .await
        .is_err()
    );
}

#[tokio::test]
async fn credits_bound_requests_in_flight() {
    let svc = Arc::new(Counting::default());
    let addr = start(svc.clone()).await;
    let cfg = ClientConfig { slots: 2, ..ClientConfig::default() };
    let c = RpcClient::connect(TcpFabric::default(), &addr, cfg).await.unwrap();
    assert_eq!(c.slots(), 2);
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.call(
                Request::Write(WriteReq { ino: i, offset: 0, cap: Capability::none() }),
                vec![Bytes::from_static(b"x")],
                vec![],
            )
            .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(svc.writes.load(Ordering::SeqCst), 32);
    assert!(svc.in_flight_max.load(Ordering::SeqCst) <= 2);
}

#[tokio::test]
async fn retransmission_is_answered_from_cache_not_executed() {
    let svc = Arc::new(Counting::default());
    let addr = start(svc.clone()).await;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let create = Request::SessionCreate(SessionCreateReq { client_name: "raw".into(), slots: 4 });
    s.write_all(&request_frame(2, 0, u32::MAX, 0, &create.encode_body(), &[])).await.unwrap();
    let (_, body, _) = read_reply(&mut s).await;
    let Response::SessionCreate(sess) = Response::decode(2, &body).unwrap() else { panic!() };
    let w = Request::Write(WriteReq { ino: 5, offset: 0, cap: Capability::none() }).encode_body();
    s.write_all(&request_frame(OP_WRITE, sess.session, 1, 1, &w, b"abc")).await.unwrap();
    let (h1, b1, _) = read_reply(&mut s).await;
    // The same slot and sequence again: a retransmission, possibly on a new connection.
    let mut s2 = TcpStream::connect(&addr).await.unwrap();
    s2.write_all(&request_frame(OP_WRITE, sess.session, 1, 1, &w, b"abc")).await.unwrap();
    let (h2, b2, _) = read_reply(&mut s2).await;
    assert_eq!(svc.writes.load(Ordering::SeqCst), 1, "a retransmitted write ran twice");
    assert_eq!(b1, b2);
    assert_eq!(h1.flags & FLAG_CACHED, 0);
    assert_ne!(h2.flags & FLAG_CACHED, 0);
    // A sequence that skips ahead is refused.
    s2.write_all(&request_frame(OP_WRITE, sess.session, 1, 7, &w, b"abc")).await.unwrap();
    let (h3, b3, _) = read_reply(&mut s2).await;
    assert_ne!(h3.flags & FLAG_ERROR, 0);
    assert_eq!(decode::<WireError>(OP_WRITE, &b3).unwrap().code, ErrorCode::SeqMisordered);
    // An unknown session is refused.
    s2.write_all(&request_frame(OP_WRITE, sess.session ^ 0xff, 1, 1, &w, b"abc")).await.unwrap();
    let (_, b4, _) = read_reply(&mut s2).await;
    assert_eq!(decode::<WireError>(OP_WRITE, &b4).unwrap().code, ErrorCode::StaleSession);
    assert_eq!(svc.writes.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn malformed_frames_get_errors_and_others_keep_being_served() {
    let svc = Arc::new(Counting::default());
    let addr = start(svc.clone()).await;
    let good = RpcClient::connect(TcpFabric::default(), &addr, ClientConfig::default()).await.unwrap();

    // Garbage: an error frame, then the connection closes.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&[0xAB; 64]).await.unwrap();
    let (h, body, _) = read_reply(&mut s).await;
    assert_ne!(h.flags & FLAG_ERROR, 0);
    assert!(decode::<WireError>(0, &body).unwrap().message.contains("magic"));
    assert_eq!(s.read(&mut [0u8; 1]).await.unwrap(), 0);

    // Oversized data length: refused before anything is allocated.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let mut f = request_frame(OP_WRITE, 1, 0, 1, &[], &[]);
    f[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
    s.write_all(&f).await.unwrap();
    let (_, body, _) = read_reply(&mut s).await;
    assert!(decode::<WireError>(0, &body).unwrap().message.contains("exceeds"));

    // Truncated header then close: answered with an error naming the truncation, then closed.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&request_frame(1, 0, 0, 0, &[], &[])[..20]).await.unwrap();
    s.shutdown().await.unwrap();
    let (_, body, _) = read_reply(&mut s).await;
    assert!(decode::<WireError>(0, &body).unwrap().message.contains("truncated"));
    assert_eq!(s.read(&mut [0u8; 64]).await.unwrap(), 0);

    // Sound lengths, bad body: an error, and the same connection goes on.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&request_frame(100, 0, 0, 1, &[0xff, 0xff, 0xff], &[])).await.unwrap();
    let (h, _, _) = read_reply(&mut s).await;
    assert_ne!(h.flags & FLAG_ERROR, 0);
    let mut bad_crc = request_frame(1, 0, 0, 0, &[], &[]);
    bad_crc[36] ^= 1;
    s.write_all(&bad_crc).await.unwrap();
    let (h, _, _) = read_reply(&mut s).await;
    assert_ne!(h.flags & FLAG_ERROR, 0);
    // Data on an op that carries none: refused, the payload skipped, the stream still in step.
    s.write_all(&request_frame(1, 0, 0, 0, &[], b"unexpected")).await.unwrap();
    let (h, _, _) = read_reply(&mut s).await;
    assert_ne!(h.flags & FLAG_ERROR, 0);
    s.write_all(&request_frame(1, 0, 0, 0, &[], &[])).await.unwrap();
    let (h, _, _) = read_reply(&mut s).await;
    assert_eq!(h.flags & FLAG_ERROR, 0, "the connection should still serve a good frame");

    // The well-behaved client never noticed.
    let (r, _) = good
        .call(
            Request::Write(WriteReq { ino: 1, offset: 0, cap: Capability::none() }),
            vec![Bytes::from_static(b"ok")],
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(r, Response::Write(2));
}

#[tokio::test]
async fn client_reconnects_after_the_connection_dies() {
    let svc = Arc::new(Counting::default());
    let f = TcpFabric::default();
    // A proxy we can cut: the client talks to it, it forwards to the server.
    let addr = start(svc.clone()).await;
    let mut proxy = f.listen("127.0.0.1:0").await.unwrap();
    let paddr = proxy.local_addr().unwrap();
    let cut = Arc::new(tokio::sync::Notify::new());
    let cut2 = cut.clone();
    tokio::spawn(async move {
        loop {
            let c = proxy.accept().await.unwrap();
            let up = TcpFabric::default().connect(&addr).await.unwrap();
            let cut = cut2.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = (c.reader, c.writer);
                let (mut ur, mut uw) = (up.reader, up.writer);
                tokio::select! {
                    _ = tokio::io::copy(&mut cr, &mut uw) => {}
                    _ = tokio::io::copy(&mut ur, &mut cw) => {}
                    _ = cut.notified() => {}
                }
            });
        }
    });
    let c = RpcClient::connect(TcpFabric::default(), &paddr, ClientConfig::default()).await.unwrap();
    c.call(
        Request::Write(WriteReq { ino: 1, offset: 0, cap: Capability::none() }),
        vec![Bytes::from_static(b"a")],
        vec![],
    )
    .await
    .unwrap();
    cut.notify_waiters();
    let (r, _) = c
        .call(
            Request::Write(WriteReq { ino: 1, offset: 0, cap: Capability::none() }),
            vec![Bytes::from_static(b"bb")],
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(r, Response::Write(2));
    assert_eq!(svc.writes.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn user_blocks_reach_the_service_survive_replays_and_bad_ones_are_refused() {
    let svc = Arc::new(Counting::default());
    let addr = start(svc.clone()).await;
    let alice = UserCred::new(1000, 100, vec![4, 27]).unwrap();
    let write = Request::Write(WriteReq { ino: 5, offset: 0, cap: Capability::none() });
    // Through the client: with and without a user.
    let c = RpcClient::connect(TcpFabric::default(), &addr, ClientConfig::default()).await.unwrap();
    c.call_simple_as(Some(&alice), write.clone()).await.unwrap();
    c.call_simple(write.clone()).await.unwrap();
    assert_eq!(*svc.users.lock().unwrap(), vec![Some(alice.clone()), None]);
    let too_many = UserCred { uid: 1, gid: 1, groups: vec![0; 33] };
    assert!(c.call_simple_as(Some(&too_many), write.clone()).await.is_err(), "the client never sends 33 groups");

    // By hand: the block is the start of the body, covered by its CRC; a retransmission is answered from the cache.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let create = Request::SessionCreate(SessionCreateReq { client_name: "raw".into(), slots: 2 });
    s.write_all(&request_frame(2, 0, u32::MAX, 0, &create.encode_body(), &[])).await.unwrap();
    let (_, body, _) = read_reply(&mut s).await;
    let Response::SessionCreate(sess) = Response::decode(2, &body).unwrap() else { panic!() };
    let with_user = |body: &[u8], slot, seq, data: &[u8]| {
        let mut f = request_frame(Op::Write as u16, sess.session, slot, seq, body, data);
        f[6] |= FLAG_USER;
        f
    };
    let mut b = Vec::new();
    alice.encode_into(&mut b).unwrap();
    b.extend_from_slice(&write.encode_body());
    let writes_before = svc.writes.load(Ordering::SeqCst);
    for _ in 0..2 {
        s.write_all(&with_user(&b, 0, 1, b"abc")).await.unwrap();
        let (h, body, _) = read_reply(&mut s).await;
        assert_eq!((h.flags & FLAG_ERROR, Response::decode(Op::Write as u16, &body).unwrap()), (0, Response::Write(3)));
    }
    assert_eq!(svc.writes.load(Ordering::SeqCst), writes_before + 1, "a retransmission with a user block ran twice");
    assert_eq!(svc.users.lock().unwrap().last().unwrap().as_ref(), Some(&alice));
    // A truncated block, too many groups, a reserved field set: refused before the service runs; the
    // connection goes on.
    let calls = svc.users.lock().unwrap().len();
    let mut many = vec![1, 0, 0, 0, 1, 0, 0, 0, 33, 0, 0, 0];
    many.extend_from_slice(&[0; 33 * 4]);
    let mut reserved = b[..12].to_vec();
    reserved[10] = 1;
    for (i, bad) in [b[..10].to_vec(), b[..14].to_vec(), many, reserved].into_iter().enumerate() {
        s.write_all(&with_user(&bad, 1, 1 + i as u32, &[])).await.unwrap();
        let (h, body, _) = read_reply(&mut s).await;
        assert_ne!(h.flags & FLAG_ERROR, 0);
        let e = decode::<WireError>(Op::Write as u16, &body).unwrap();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert!(e.message.contains("user block"), "{e:?}");
    }
    assert_eq!(svc.users.lock().unwrap().len(), calls, "the service never saw a bad block");
    s.write_all(&with_user(&b, 0, 2, b"abcd")).await.unwrap();
    let (_, body, _) = read_reply(&mut s).await;
    assert_eq!(Response::decode(Op::Write as u16, &body).unwrap(), Response::Write(4));
}
