//! The one-sided data path (issue 4): every size class round-trips over `tcp` and `shm`, a rogue client whose
//! chunks point outside its registered regions is refused while the server keeps serving, and a client's arena
//! is released when the client is killed.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::{WEFT, pattern, start};
use weft_client::{Client, ClientTuning, ClusterConfig, FabricChoice, OpenMode};
use weft_fabric::{ShmConfig, ShmFabric, TcpFabric};
use weft_proto::msg::{FabricStat, ReadChunksReq, RegionsReq, WriteChunksReq};
use weft_proto::{Chunk, ErrorCode, Region, Request, Response, Rights};
use weft_rpc::RpcClient;

async fn client_over(c: &common::TestCluster, fabric: FabricChoice) -> Client {
    let cfg = ClusterConfig { client: ClientTuning { fabric, ..ClientTuning::default() }, ..c.cluster_config() };
    Client::connect(&cfg).await.unwrap()
}

async fn fabric_stat(c: &common::TestCluster, tcp_addr: &str) -> FabricStat {
    let rpc = RpcClient::connect(TcpFabric::default(), tcp_addr, c.rpc_config()).await.unwrap();
    let r = rpc.call_control(Request::FabricStat(())).await.unwrap();
    rpc.close().await;
    match r {
        Response::FabricStat(s) => s,
        other => panic!("unexpected {other:?}"),
    }
}

/// Polls the data server's counters until `ok` holds; bounded, so a leak fails the test instead of hanging it.
async fn wait_for_stat(
    c: &common::TestCluster,
    tcp_addr: &str,
    what: &str,
    ok: impl Fn(&FabricStat) -> bool,
) -> FabricStat {
    let mut last = FabricStat::default();
    for _ in 0..500 {
        last = fabric_stat(c, tcp_addr).await;
        if ok(&last) {
            return last;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{what}: the data server still reports {last:?}");
}

#[tokio::test]
async fn every_size_class_round_trips_over_tcp_and_shm() {
    let c = start("fabric-classes", 2).await;
    // Inline (≤ 4 KiB), arena (≤ 64 KiB), zero-copy (larger): each edge, at an unaligned offset.
    let lens = [100usize, 4096, 4097, 65536, 65537, (3 << 20) + 123];
    for fabric in [FabricChoice::Tcp, FabricChoice::Shm] {
        let client = client_over(&c, fabric).await;
        for (i, &len) in lens.iter().enumerate() {
            let path = format!("/f-{}-{i}", fabric.name());
            let data = pattern(i as u64 + 1, 0, len);
            let f = client.create_path(&path, 0o644, false, true).await.unwrap();
            f.write_at(777, Bytes::from(data.clone())).await.unwrap();
            f.close().await.unwrap();
            let f = client.open(&path, OpenMode::ReadWrite).await.unwrap();
            let got = f.read_at(0, BytesMut::zeroed(len + 777 + 10)).await.unwrap();
            assert_eq!(got.len(), len + 777, "{path}");
            assert!(got[..777].iter().all(|&b| b == 0), "{path}: the hole reads as zeros");
            assert!(got[777..] == data[..], "{path}: {len} bytes over {} differ", fabric.name());
        }
        let used = client.fabrics().await;
        assert!(!used.is_empty() && used.iter().all(|(_, f)| *f == fabric.name()), "{used:?}");
        client.close().await;
    }
}

#[tokio::test]
async fn a_rogue_client_is_refused_and_the_server_keeps_serving() {
    let c = start("fabric-rogue", 1).await;
    let tcp_addr = c.data_addrs()[0].clone();
    let honest = client_over(&c, FabricChoice::Shm).await;
    let data = pattern(9, 0, 256 << 10);
    let f = honest.create_path("/victim", 0o644, false, true).await.unwrap();
    f.write_at(0, Bytes::from(data.clone())).await.unwrap();
    f.close().await.unwrap();
    let ino = honest.open("/victim", OpenMode::ReadWrite).await.unwrap().ino();
    let cap = c.capability(ino, Rights::READ_WRITE, 600_000);

    let probe = RpcClient::connect(TcpFabric::default(), &tcp_addr, c.rpc_config()).await.unwrap();
    let shm_addr = match probe.call_control(Request::FabricInfo(())).await.unwrap() {
        Response::FabricInfo(i) => i.shm_addr.expect("the data server listens on shm"),
        other => panic!("unexpected {other:?}"),
    };
    let arena_bytes = 64 << 10;
    let fabric = ShmFabric::new(ShmConfig { arena_buffers: 1, buffer_bytes: arena_bytes });
    let rogue = RpcClient::connect(fabric, &shm_addr, c.rpc_config()).await.unwrap();
    let refused_before = fabric_stat(&c, &tcp_addr).await.chunks_refused;

    let mine = vec![0u8; 8192];
    let region = Region { id: 5, addr: mine.as_ptr() as u64, len: 8192, rkey: 0 };
    rogue.call_control(Request::Regions(RegionsReq { add: vec![region], remove: vec![] })).await.unwrap();
    let bad: Vec<(&str, Request)> = vec![
        (
            "read past the arena's end",
            Request::ReadChunks(ReadChunksReq {
                cap: cap.clone(),
                ino,
                offset: 0,
                chunks: vec![Chunk { region: 0, offset: arena_bytes as u64 - 100, len: 4096 }],
                fill: None,
            }),
        ),
        (
            "read into a region never registered",
            Request::ReadChunks(ReadChunksReq {
                cap: cap.clone(),
                ino,
                offset: 0,
                chunks: vec![Chunk { region: 77, offset: 0, len: 4096 }],
                fill: None,
            }),
        ),
        (
            "read past a registered region",
            Request::ReadChunks(ReadChunksReq {
                cap: cap.clone(),
                ino,
                offset: 0,
                chunks: vec![Chunk { region: 5, offset: 4096, len: 8192 }],
                fill: None,
            }),
        ),
        (
            "write from outside a registered region",
            Request::WriteChunks(WriteChunksReq {
                cap: cap.clone(),
                ino,
                offset: 0,
                chunks: vec![Chunk { region: 5, offset: u64::MAX - 10, len: 4096 }],
            }),
        ),
    ];
    for (what, req) in bad {
        let err = rogue.call(req, Vec::new(), Vec::new()).await.expect_err(what);
        let w = err.remote().unwrap_or_else(|| panic!("{what}: not a server refusal: {err}"));
        assert_eq!(w.code, ErrorCode::BadRequest, "{what}: {w}");
        assert!(w.message.contains("chunk list refused"), "{what}: {w}");
    }
    assert!(mine.iter().all(|&b| b == 0), "nothing was written into the rogue's memory");
    let stat = fabric_stat(&c, &tcp_addr).await;
    assert!(stat.chunks_refused >= refused_before + 4, "{stat:?}");
    assert!(c.log("data0").contains("refusing a chunk list"), "the refusal is logged");

    // A well-formed request on the same connection is still served, and the file is unchanged.
    let ok = Request::ReadChunks(ReadChunksReq {
        cap: cap.clone(),
        ino,
        offset: 0,
        chunks: vec![Chunk { region: 5, offset: 0, len: 8192 }],
        fill: None,
    });
    rogue.call(ok, Vec::new(), Vec::new()).await.unwrap();
    assert!(std::hint::black_box(&mine)[..] == data[..8192]);
    let f = honest.open("/victim", OpenMode::ReadWrite).await.unwrap();
    let got = f.read_at(0, BytesMut::zeroed(data.len())).await.unwrap();
    assert!(got[..] == data[..], "the victim file is intact and still served");
    rogue.close().await;
    honest.close().await;
}

#[tokio::test]
async fn a_killed_clients_arena_is_released() {
    let c = start("fabric-kill", 1).await;
    let tcp_addr = c.data_addrs()[0].clone();
    // The writer uses tcp, so the only arena the server maps is the victim process's.
    let writer = client_over(&c, FabricChoice::Tcp).await;
    let f = writer.create_path("/big", 0o644, false, true).await.unwrap();
    f.write_at(0, Bytes::from(pattern(3, 0, 4 << 20))).await.unwrap();
    f.close().await.unwrap();
    let base = fabric_stat(&c, &tcp_addr).await;
    assert_eq!(base.arenas, 0, "{base:?}");

    // `weft cat` reads the file over shm, then blocks writing to a pipe nobody reads: alive, connection open.
    let mut child = tokio::process::Command::new(WEFT)
        .args(["cat", "--fabric", "shm", "/big"])
        .env("WEFT_CLUSTER", c.cluster_file())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The arena is mapped at connect, the caller's buffer registered by the first large read after it: wait for
    // both (asserting the second right after seeing the first raced with the client).
    let held =
        wait_for_stat(&c, &tcp_addr, "the client's arena is mapped and its 4 MiB read's buffer registered", |s| {
            s.arenas == 1 && s.regions >= 1
        })
        .await;
    assert_eq!(held.arenas, 1, "{held:?}");
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let after = wait_for_stat(&c, &tcp_addr, "the killed client's arena is released", |s| s.arenas == 0).await;
    assert_eq!(after.regions, 0, "its registrations went with it: {after:?}");

    // The server still serves others.
    let f = writer.open("/big", OpenMode::ReadWrite).await.unwrap();
    assert_eq!(f.read_at(0, BytesMut::zeroed(4 << 20)).await.unwrap().len(), 4 << 20);
    writer.close().await;
}

#[tokio::test]
async fn the_native_io_queue_writes_and_reads_batches_into_its_slots() {
    use weft_client::{IoKind, IoOp, IoQueue};
    let c = start("fabric-ioq", 2).await;
    for fabric in [FabricChoice::Tcp, FabricChoice::Shm] {
        let client = client_over(&c, fabric).await;
        let path = format!("/q-{}", fabric.name());
        let file = std::sync::Arc::new(client.create_path(&path, 0o644, false, true).await.unwrap());
        let (slots, slot_bytes) = (4usize, (1usize << 20) + 512);
        let mut q = IoQueue::new(file.clone(), slots, slot_bytes);
        for s in 0..slots {
            let p = pattern(s as u64 + 40, 0, slot_bytes);
            q.slot_mut(s).unwrap().copy_from_slice(&p);
        }
        let op = |tag: u64, kind, slot: usize| IoOp {
            tag,
            kind,
            file_offset: (tag % 10) * slot_bytes as u64,
            slot,
            len: slot_bytes,
        };
        let writes: Vec<IoOp> = (0..slots).map(|s| op(s as u64, IoKind::Write, s)).collect();
        q.submit(&writes).unwrap();
        // A slot lent to an operation in flight cannot be named again until it is reaped.
        assert!(q.slot(0).is_none());
        assert!(q.submit(&[op(9, IoKind::Read, 0)]).is_err());
        let done = q.reap(slots).await;
        assert_eq!(done.len(), slots);
        assert!(done.iter().all(|c| c.result.as_ref().is_ok_and(|&n| n == slot_bytes)), "{done:?}");
        file.commit().await.unwrap();
        for s in 0..slots {
            q.slot_mut(s).unwrap().fill(0);
        }
        // Read back into other slots (rotated), twice: the second batch reuses the registrations.
        for _ in 0..2 {
            let reads: Vec<IoOp> = (0..slots).map(|s| op(10 + s as u64, IoKind::Read, (s + 1) % slots)).collect();
            q.submit(&reads).unwrap();
            for c in q.reap(slots).await {
                assert_eq!(*c.result.as_ref().unwrap(), slot_bytes);
                let want = pattern((c.tag - 10) + 40, 0, slot_bytes);
                assert!(q.slot(c.slot).unwrap() == &want[..], "{} slot {}", fabric.name(), c.slot);
            }
        }
        client.close().await;
    }
}

/// Process memory whose first half is readable and writable and whose second half is not accessible at all, so a
/// one-sided transfer that reaches the second half fails part way through.
struct HalfAccessible {
    addr: *mut libc::c_void,
    half: usize,
}

impl HalfAccessible {
    fn new(half: usize) -> HalfAccessible {
        #[allow(unsafe_code)]
        // SAFETY: a fresh anonymous private mapping; nothing else refers to it; the result is checked.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * half,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        #[allow(unsafe_code)]
        // SAFETY: the second half lies inside the mapping just made, and no reference into it exists.
        let rc = unsafe { libc::mprotect(addr.cast::<u8>().add(half).cast(), half, libc::PROT_NONE) };
        assert_eq!(rc, 0);
        HalfAccessible { addr, half }
    }
}

impl Drop for HalfAccessible {
    fn drop(&mut self) {
        #[allow(unsafe_code)]
        // SAFETY: unmaps exactly the mapping made in `new`; no reference into it outlives `self`.
        unsafe {
            libc::munmap(self.addr, 2 * self.half);
        }
    }
}

/// Odd-sized chunks laid out backwards in `region` from `start`, one byte apart, so bytes cut into the wrong
/// pipeline piece, or pieces moved in the wrong order, land in the wrong place.
fn scattered(region: u32, start: u64, total: usize) -> Vec<Chunk> {
    let sizes = [(7 << 10) + 13, 333, (70 << 10) + 1, 4096, 1, (190 << 10) + 7];
    let (mut chunks, mut left, mut end, mut i) = (Vec::new(), total, start + 2 * total as u64, 0);
    while left > 0 {
        let n = sizes[i % sizes.len()].min(left);
        end -= n as u64 + 1;
        chunks.push(Chunk { region, offset: end, len: n as u32 });
        left -= n;
        i += 1;
    }
    chunks
}

#[tokio::test]
async fn pipelined_transfers_with_chunks_straddling_pieces_round_trip_over_shm() {
    let c = start("fabric-pieces", 1).await;
    let tcp_addr = c.data_addrs()[0].clone();
    let honest = client_over(&c, FabricChoice::Tcp).await;
    let f = honest.create_path("/pieces", 0o644, false, true).await.unwrap();
    f.close().await.unwrap();
    let ino = honest.open("/pieces", OpenMode::ReadWrite).await.unwrap().ino();
    let cap = c.capability(ino, Rights::READ_WRITE, 600_000);

    let probe = RpcClient::connect(TcpFabric::default(), &tcp_addr, c.rpc_config()).await.unwrap();
    let shm_addr = match probe.call_control(Request::FabricInfo(())).await.unwrap() {
        Response::FabricInfo(i) => i.shm_addr.expect("the data server listens on shm"),
        other => panic!("unexpected {other:?}"),
    };
    let fabric = ShmFabric::new(ShmConfig { arena_buffers: 1, buffer_bytes: 64 << 10 });
    let raw = RpcClient::connect(fabric, &shm_addr, c.rpc_config()).await.unwrap();

    // 1 MiB + 777 bytes at an odd object offset: two pieces (1 MiB by default; edges at multiples of it in the
    // object), both short, and chunks of odd sizes, one straddling the edge.
    let len = (1 << 20) + 777;
    let offset = 3 * 4096 + 1234;
    let data = pattern(21, 0, len);
    let mut src = vec![0u8; 2 * len + 64];
    let wchunks = scattered(5, 3, len);
    let mut at = 0;
    for ch in &wchunks {
        let (o, n) = (ch.offset as usize, ch.len as usize);
        src[o..o + n].copy_from_slice(&data[at..at + n]);
        at += n;
    }
    let mut dst = vec![0u8; 2 * (len + 8000) + 64];
    let add = vec![
        Region { id: 5, addr: src.as_ptr() as u64, len: src.len() as u64, rkey: 0 },
        Region { id: 6, addr: dst.as_mut_ptr() as u64, len: dst.len() as u64, rkey: 0 },
    ];
    raw.call_control(Request::Regions(RegionsReq { add, remove: vec![] })).await.unwrap();
    let req = Request::WriteChunks(WriteChunksReq { cap: cap.clone(), ino, offset, chunks: wchunks });
    match raw.call(req, Vec::new(), Vec::new()).await.unwrap().0 {
        Response::WriteChunks(n) => assert_eq!(n as usize, len),
        other => panic!("unexpected {other:?}"),
    }
    // The object holds the bytes in chunk order: checked on disk (the MDS never heard of this size)...
    let obj = std::fs::read(common::object_path(&c.data_root(0), ino)).unwrap();
    assert_eq!(obj.len(), offset as usize + len);
    assert!(obj[..offset as usize].iter().all(|&b| b == 0));
    assert!(obj[offset as usize..] == data[..], "the written object differs");
    // ...and through a pipelined read scattered differently, starting before the data and ending past it.
    let (before, after) = (5000usize, 3000usize);
    let rchunks = scattered(6, 11, before + len + after);
    let req = Request::ReadChunks(ReadChunksReq {
        cap: cap.clone(),
        ino,
        offset: offset - before as u64,
        chunks: rchunks.clone(),
        fill: None,
    });
    raw.call(req, Vec::new(), Vec::new()).await.unwrap();
    let back: Vec<u8> = std::hint::black_box(&dst)[..].to_vec();
    let back: Vec<u8> =
        rchunks.iter().flat_map(|ch| back[ch.offset as usize..ch.offset as usize + ch.len as usize].to_vec()).collect();
    assert!(back[..before].iter().all(|&b| b == 0), "the hole before the data");
    assert!(back[before..before + len] == data[..], "the data, in chunk order");
    assert!(back[before + len..].iter().all(|&b| b == 0), "past the object's end");

    // A get that fails in the second piece (its memory is not accessible) fails the whole write.
    let half = 2 << 20;
    let bad = HalfAccessible::new(half);
    let region = Region { id: 7, addr: bad.addr as u64, len: 2 * half as u64, rkey: 0 };
    raw.call_control(Request::Regions(RegionsReq { add: vec![region], remove: vec![] })).await.unwrap();
    // 1.6 MiB: the first piece (1 MiB) is readable, the second runs from readable into inaccessible memory.
    let chunks = vec![
        Chunk { region: 7, offset: 0, len: (1 << 20) + (300 << 10) },
        Chunk { region: 7, offset: half as u64, len: 300 << 10 },
    ];
    // Far from the data: the pieces before the failure are written (as a failed pwrite may write a prefix).
    let req = Request::WriteChunks(WriteChunksReq { cap: cap.clone(), ino, offset: 8 << 20, chunks });
    let err = raw.call(req, Vec::new(), Vec::new()).await.expect_err("a write from inaccessible memory fails");
    let w = err.remote().unwrap_or_else(|| panic!("not a server error: {err}"));
    assert_eq!(w.code, ErrorCode::Io, "{w}");
    assert!(c.log("data0").contains("one-sided transfer failed"), "the failure is logged");

    // The connection and the server keep serving.
    let req = Request::ReadChunks(ReadChunksReq {
        cap: cap.clone(),
        ino,
        offset,
        chunks: vec![Chunk { region: 6, offset: 0, len: len as u32 }],
        fill: None,
    });
    raw.call(req, Vec::new(), Vec::new()).await.unwrap();
    assert!(std::hint::black_box(&dst)[..len] == data[..]);
    drop(bad);
    raw.close().await;
    probe.close().await;
    honest.close().await;
}
