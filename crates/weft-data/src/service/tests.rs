//! The pipelined one-sided path against a client memory held in this process, so a test can see every `get`
//! and `put`, make one fail, and check that rdma-style transfers only touch buffers inside announced zones.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use weft_fabric::MemoryError;
use weft_proto::{ChunkError, Region};

use super::*;
use crate::{DataConfig, PoolClassConfig};

const K: usize = 1024;
const REGION_BYTES: usize = 4 << 20;

/// Two regions of "client memory"; `get`/`put` number `fail_at` fails.
struct FakeMemory {
    regions: Mutex<[Vec<u8>; 2]>,
    zone: bool,
    fail_get_at: Option<usize>,
    fail_put_at: Option<usize>,
    gets: AtomicUsize,
    puts: AtomicUsize,
    /// Transfers whose server-side buffer lay outside every announced zone.
    unzoned: AtomicUsize,
}

impl FakeMemory {
    fn new(zone: bool) -> FakeMemory {
        FakeMemory {
            regions: Mutex::new([vec![0; REGION_BYTES], vec![0; REGION_BYTES]]),
            zone,
            fail_get_at: None,
            fail_put_at: None,
            gets: AtomicUsize::new(0),
            puts: AtomicUsize::new(0),
            unzoned: AtomicUsize::new(0),
        }
    }
    fn note_zone(&self, buf: &[u8]) {
        if weft_fabric::zones::find(buf.as_ptr(), buf.len()).is_none() {
            self.unzoned.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn region(&self, id: usize) -> Vec<u8> {
        self.regions.lock().unwrap()[id].clone()
    }
}

fn injected() -> MemoryError {
    MemoryError::Io(std::io::Error::other("injected failure"))
}

impl PeerMemory for FakeMemory {
    fn register(&self, _add: &[Region], _remove: &[u32]) -> Result<(), ChunkError> {
        Ok(())
    }
    fn check(&self, chunks: &[Chunk], want: u64) -> Result<(), ChunkError> {
        for (index, c) in chunks.iter().enumerate() {
            if c.region > 1 || c.offset + u64::from(c.len) > REGION_BYTES as u64 {
                return Err(ChunkError::UnknownRegion { index, region: c.region });
            }
        }
        let have = chunks.iter().map(|c| u64::from(c.len)).sum();
        if have != want {
            return Err(ChunkError::LengthMismatch { have, want });
        }
        Ok(())
    }
    fn get(&self, chunks: &[Chunk], dst: &mut [u8]) -> Result<(), MemoryError> {
        if Some(self.gets.fetch_add(1, Ordering::SeqCst)) == self.fail_get_at {
            return Err(injected());
        }
        self.note_zone(dst);
        let r = self.regions.lock().unwrap();
        let mut at = 0;
        for c in chunks {
            let (o, n) = (c.offset as usize, c.len as usize);
            dst[at..at + n].copy_from_slice(&r[c.region as usize][o..o + n]);
            at += n;
        }
        assert_eq!(at, dst.len(), "a piece's chunks add up to its buffer");
        Ok(())
    }
    fn put(&self, chunks: &[Chunk], src: &[u8]) -> Result<(), MemoryError> {
        if Some(self.puts.fetch_add(1, Ordering::SeqCst)) == self.fail_put_at {
            return Err(injected());
        }
        if self.zone {
            self.note_zone(src);
        }
        let mut r = self.regions.lock().unwrap();
        let mut at = 0;
        for c in chunks {
            let (o, n) = (c.offset as usize, c.len as usize);
            r[c.region as usize][o..o + n].copy_from_slice(&src[at..at + n]);
            at += n;
        }
        assert_eq!(at, src.len(), "a piece's chunks add up to its bytes");
        Ok(())
    }
    fn revoke(&self) {}
    fn wants_zone_buffers(&self) -> bool {
        self.zone
    }
}

fn setup(name: &str) -> (DataService, BufferPool, PathBuf) {
    let dir = std::env::temp_dir().join(format!("weft-data-pipe-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Arc::new(ObjectStore::open(&dir).unwrap());
    let cfg = DataConfig {
        id: 1,
        listen: String::new(),
        advertise: None,
        root: dir.clone(),
        mds: String::new(),
        heartbeat_ms: 1000,
        transfer_unit_bytes: 2 << 20,
        pool_buffers: 2,
        pool_classes: vec![PoolClassConfig { buf_bytes: 64 << 10, buffers: 4 }],
        pipeline_piece_bytes: 64 << 10,
        rdma_pipeline_piece_bytes: 64 << 10,
        slots_max: 4,
        sessions_max: 4,
        short_circuit: false,
        shm: false,
        shm_socket: None,
        rdma: false,
        rdma_port: 0,
    };
    let pool = BufferPool::with_classes(&cfg.pool_classes()).unwrap();
    let svc = DataService::new(store, 4)
        .with_pipeline_piece_bytes(cfg.pipeline_piece_bytes)
        .with_rdma_pipeline_piece_bytes(cfg.rdma_pipeline_piece_bytes);
    (svc, pool, dir)
}

fn ctx(pool: &BufferPool, memory: &Arc<FakeMemory>) -> CallCtx {
    CallCtx { session: 1, peer: "test".into(), pool: pool.clone(), memory: Some(memory.clone()) }
}

/// Odd-sized chunks laid out backwards in `region` from `start`, so bytes cut into the wrong piece, or
/// pieces taken in the wrong order, land in the wrong place.
fn scattered(region: u32, start: u64, total: usize) -> Vec<Chunk> {
    let sizes = [7 * K + 13, 333, 70 * K + 1, 4096, 1, 19 * K + 7];
    let mut chunks = Vec::new();
    let mut left = total;
    let mut end = start + 2 * total as u64;
    let mut i = 0;
    while left > 0 {
        let n = sizes[i % sizes.len()].min(left);
        // Leave a one-byte gap between chunks.
        end -= n as u64 + 1;
        chunks.push(Chunk { region, offset: end, len: n as u32 });
        left -= n;
        i += 1;
    }
    chunks
}

fn gather(mem: &[u8], chunks: &[Chunk]) -> Vec<u8> {
    chunks.iter().flat_map(|c| mem[c.offset as usize..c.offset as usize + c.len as usize].to_vec()).collect()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 7 + i / 4099) as u8).wrapping_add(seed)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_transfers_with_straddling_chunks_round_trip() {
    for zone in [false, true] {
        let (svc, pool, dir) = setup(if zone { "zone" } else { "map" });
        let mem = Arc::new(FakeMemory::new(zone));
        let data = pattern(3, 700 * K + 77);
        let wchunks = scattered(0, 1001, data.len());
        {
            let mut r = mem.regions.lock().unwrap();
            let mut at = 0;
            for c in &wchunks {
                let (o, n) = (c.offset as usize, c.len as usize);
                r[0][o..o + n].copy_from_slice(&data[at..at + n]);
                at += n;
            }
        }
        let offset = 3 * 4096 + 1234;
        let req = Request::WriteChunks(WriteChunksReq { ino: 7, offset, chunks: wchunks.clone() });
        let reply = svc.call(&ctx(&pool, &mem), req, None).await.unwrap();
        assert!(matches!(reply.resp, Response::WriteChunks(n) if n as usize == data.len()));
        let pieces = pipeline::split(&wchunks, offset, 64 << 10).unwrap().len();
        assert!(pieces > 10);
        assert_eq!(mem.gets.load(Ordering::SeqCst), pieces);
        let mut disk = vec![0u8; data.len()];
        svc.store.read(7, offset, &mut disk).unwrap();
        assert!(disk == data, "zone={zone}: the object holds the bytes in chunk order");

        // Read back a range that starts before the data and runs past the object's end (zeros there).
        let read_off = offset - 5000;
        let read_len = data.len() + 5000 + 9000;
        let rchunks = scattered(1, 17, read_len);
        let req = Request::ReadChunks(ReadChunksReq { ino: 7, offset: read_off, chunks: rchunks.clone() });
        svc.call(&ctx(&pool, &mem), req, None).await.unwrap();
        let got = gather(&mem.region(1), &rchunks);
        assert!(got[..5000].iter().all(|&b| b == 0), "zone={zone}: before the data");
        assert!(got[5000..5000 + data.len()] == data[..], "zone={zone}: the data, in chunk order");
        assert!(got[5000 + data.len()..].iter().all(|&b| b == 0), "zone={zone}: past the end");
        assert_eq!(mem.unzoned.load(Ordering::SeqCst), 0, "zone={zone}: every buffer came from a zone");
        assert_eq!(pool.available(), 6, "every buffer went back");
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_get_in_the_second_piece_fails_the_write() {
    let (svc, pool, dir) = setup("failget");
    let mut mem = FakeMemory::new(true);
    mem.fail_get_at = Some(1);
    let mem = Arc::new(mem);
    let chunks = vec![Chunk { region: 0, offset: 5, len: 300 << 10 }];
    let req = Request::WriteChunks(WriteChunksReq { ino: 8, offset: 100, chunks });
    let err = svc.call(&ctx(&pool, &mem), req, None).await.err().expect("the write fails");
    assert_eq!(err.code, ErrorCode::Io, "{err:?}");
    assert_eq!(mem.gets.load(Ordering::SeqCst), 2, "nothing is fetched after the failed piece");
    assert_eq!(pool.available(), 6);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_or_put_stops_the_puts() {
    for zone in [false, true] {
        let (svc, pool, dir) = setup(if zone { "failz" } else { "failm" });
        let data = pattern(5, 400 << 10);
        svc.store.write(9, 0, &data).unwrap();
        // Corrupt a byte in the third piece: the read of that piece fails its checksum.
        let path = svc.store.object_path(9);
        let mut raw = std::fs::read(&path).unwrap();
        raw[(128 << 10) + 10] ^= 1;
        std::fs::write(&path, &raw).unwrap();
        let mem = Arc::new(FakeMemory::new(zone));
        let chunks = vec![Chunk { region: 1, offset: 0, len: 400 << 10 }];
        let req = Request::ReadChunks(ReadChunksReq { ino: 9, offset: 0, chunks: chunks.clone() });
        let err = svc.call(&ctx(&pool, &mem), req, None).await.err().expect("the read fails");
        assert_eq!(err.code, ErrorCode::Corrupt, "{err:?}");
        assert_eq!(mem.puts.load(Ordering::SeqCst), 2, "zone={zone}: pieces after the bad one are not put");
        let got = mem.region(1);
        assert!(got[..128 << 10] == data[..128 << 10], "zone={zone}");
        assert!(got[128 << 10..].iter().all(|&b| b == 0), "zone={zone}: nothing after the failure");

        // A put that fails ends the transfer: the piece being read meanwhile is never put.
        let mut mem = FakeMemory::new(zone);
        mem.fail_put_at = Some(0);
        let mem = Arc::new(mem);
        let req = Request::ReadChunks(ReadChunksReq { ino: 9, offset: 0, chunks: chunks.clone() });
        let err = svc.call(&ctx(&pool, &mem), req, None).await.err().expect("the read fails");
        assert_eq!(err.code, ErrorCode::Io, "{err:?}");
        assert_eq!(mem.puts.load(Ordering::SeqCst), 1);
        assert!(mem.region(1).iter().all(|&b| b == 0));
        assert_eq!(pool.available(), 6);
        let _ = std::fs::remove_dir_all(dir);
    }
}
