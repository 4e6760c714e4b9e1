//! Data blocks through the cache bank (issue 16), against real memcached daemons and real data servers: a block
//! served from the bank on a second read (memcached's own `get_hits`), close-to-open across two clients when a
//! file is rewritten in place (bank up, a daemon killed, a daemon restarted empty, invalidations lost), garbage
//! planted under a valid key, a daemon killed during a storm of random reads, and a client reading its own writes.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::net::TcpStream;
use weft_cache::config::DATA_READ_BLOCKS_MAX;
use weft_cache::value::encode_value;
use weft_cache::{Bank, CacheConfig, CacheKey, ItemKind};
use weft_client::{Client, ClusterConfig, File, OpenMode};

use common::memcached::{raw, raw_set};
use common::{TestCluster, pattern, start_with};

/// Bank blocks of 4 KiB: the default 1 MiB stripe unit is a multiple, so every file uses the bank.
const BLOCK: usize = 4096;

async fn start_bank_cluster(name: &str, servers: u32, daemons: u32) -> TestCluster {
    start_with(name, servers, |o| {
        o.cache = daemons;
        o.cache_mib = 16;
        o.cache_block_bytes = BLOCK as u32;
    })
    .await
}

/// The bank as `cluster.toml` names it, with deadlines long enough that a loaded test machine never turns a hit
/// into a miss (tests that kill daemons want misses quickly: `fast`).
fn bank_config(cl: &TestCluster, fast: bool) -> CacheConfig {
    let cache = cl.cluster_config().cache.expect("cluster.toml has a [cache] table");
    let timeout_ms = if fast { 500 } else { 5_000 };
    // Data blocks only: the counts below are of block items (attributes and lookups are cache_attrs.rs's). The
    // tests read whole files through the bank, and every read asks it (the cheap-miss limits have their own test).
    CacheConfig {
        request_timeout_ms: timeout_ms,
        connect_timeout_ms: timeout_ms,
        attrs: false,
        data_read_blocks_max: DATA_READ_BLOCKS_MAX,
        data_miss_streak_max: 0,
        ..cache
    }
}

/// A client with the bank `cache` (or none).
async fn client_with(cl: &TestCluster, cache: Option<CacheConfig>) -> Client {
    let cfg = ClusterConfig { cache, ..cl.cluster_config() };
    Client::connect(&cfg).await.unwrap()
}

/// Writes `data` as the whole content of `path` (created if absent) and closes (commits).
async fn write_file(c: &Client, path: &str, data: &[u8]) -> u64 {
    let f = c.create_path(path, 0o644, false, false).await.unwrap();
    f.write_at(0, data.to_vec().into()).await.unwrap();
    let ino = f.ino();
    f.close().await.unwrap();
    ino
}

async fn read_all(f: &File) -> Vec<u8> {
    f.read_at(0, BytesMut::zeroed(f.size() as usize)).await.unwrap().to_vec()
}

/// A counter from memcached's own `stats`, summed over the daemons that answer.
async fn total_stat(addrs: &[String], name: &str) -> u64 {
    let mut sum = 0;
    for a in addrs {
        if TcpStream::connect(a).await.is_err() {
            continue;
        }
        let text = raw(a, b"stats\r\n", &["END"]).await;
        sum += text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("STAT {name} ")).map(|v| v.trim().parse::<u64>().unwrap()))
            .unwrap_or_else(|| panic!("no {name} in stats of {a}"));
    }
    sum
}

/// The bank keys of file `f` (one object: on the layout's first server) for its first `blocks` blocks at
/// `data_version`.
fn keys(f: &File, data_version: u64, blocks: u64) -> Vec<CacheKey> {
    let server = f.layout().servers[0];
    (0..blocks).map(|block| CacheKey::Block { ino: f.ino(), data_version, server, block }).collect()
}

/// Reads all of `f` (asserting `expected` every time) until the bank holds every one of `keys`: the data servers
/// fill it after answering, off the reply path, and a fill sent to a daemon that just died is lost, so reading
/// again offers it again. Not a timing assumption: the condition is polled, and only a bank that never fills fails.
async fn read_until_cached(f: &File, expected: &[u8], bank: &Bank, keys: &[CacheKey]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert_eq!(read_all(f).await, expected, "every read right while the bank fills");
        if bank.get_many(keys).await.iter().all(Option::is_some) {
            return;
        }
        assert!(Instant::now() < deadline, "the data servers never filled the bank: {:?}", bank.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Stores `payload` under `key` as a well-formed item, the way a data server would.
async fn plant(cl: &TestCluster, bank: &Bank, key: &CacheKey, payload: &[u8]) {
    let encoded = key.encode(bank.config().namespace);
    let item = encode_value(encoded.as_bytes(), ItemKind::Block, payload, &cl.bank_key()).unwrap();
    let addr = &cl.cache_addrs()[bank.owner(key).unwrap()];
    raw_set(addr, &encoded, &item).await;
}

#[tokio::test]
async fn a_block_is_served_from_the_bank_on_the_second_read() {
    let cl = start_bank_cluster("cdata-hit", 1, 2).await;
    let writer = client_with(&cl, None).await;
    // 16 whole blocks and a short last one.
    let data = pattern(1, 0, 16 * BLOCK + 100);
    write_file(&writer, "/f", &data).await;

    let reader = client_with(&cl, Some(bank_config(&cl, false))).await;
    let bank = reader.bank().expect("the reader has a bank").clone();
    let f = reader.open("/f", OpenMode::Read).await.unwrap();
    let ks = keys(&f, f.data_version(), 17);
    read_until_cached(&f, &data, &bank, &ks).await;

    let hits_before = total_stat(&cl.cache_addrs(), "get_hits").await;
    let bank_hits = bank.stats().hits;
    let f2 = reader.open("/f", OpenMode::Read).await.unwrap();
    assert_eq!(f2.data_version(), f.data_version(), "no writer: same version");
    assert_eq!(read_all(&f2).await, data, "second read, from the bank");
    assert_eq!(total_stat(&cl.cache_addrs(), "get_hits").await - hits_before, 17, "memcached served all 17 blocks");
    assert_eq!(bank.stats().hits - bank_hits, 17);
    // A small read inside one block: one key, one hit, the right bytes (the short last block included).
    let got = f2.read_at(16 * BLOCK as u64 + 10, BytesMut::zeroed(200)).await.unwrap();
    assert_eq!(&got[..], &data[16 * BLOCK + 10..], "cut at the end of the file");
    let got = f2.read_at(5000, BytesMut::zeroed(3)).await.unwrap();
    assert_eq!(&got[..], &data[5000..5003]);
    assert_eq!(bank.stats().hits - bank_hits, 19);
}

/// How the bank is disturbed between the writer's close and the reader's open.
#[derive(Debug, Clone, Copy)]
enum Disturb {
    None,
    /// The old blocks are stored again under the old version: every invalidation was lost.
    InvalidationsLost,
    KillDaemon,
    RestartDaemonEmpty,
}

async fn rewrite_in_place(name: &str, disturb: Disturb) {
    let mut cl = start_bank_cluster(name, 2, 2).await;
    let cache = bank_config(&cl, true);
    let writer = client_with(&cl, Some(cache.clone())).await;
    let reader = client_with(&cl, Some(cache)).await;
    let bank = reader.bank().unwrap().clone();
    // Two stripes of 1 MiB over two servers, and a bit: every block is read through the bank.
    let len = (2 << 20) + 3 * BLOCK + 7;
    let old = pattern(10, 0, len);
    let new = pattern(20, 0, len);
    write_file(&writer, "/f", &old).await;

    let before = reader.open("/f", OpenMode::Read).await.unwrap();
    let v_old = before.data_version();
    // The old bytes are in the bank (first blocks of the first object).
    read_until_cached(&before, &old, &bank, &keys(&before, v_old, 8)).await;
    assert_eq!(read_all(&before).await, old, "read again, partly from the bank");

    // The rewrite: same size, same second, closed.
    let w = writer.open("/f", OpenMode::ReadWrite).await.unwrap();
    w.write_at(0, new.clone().into()).await.unwrap();
    w.close().await.unwrap();

    match disturb {
        Disturb::None => {}
        Disturb::InvalidationsLost => {
            // The write's deletes run on the data server after its reply: wait until they did (the items are gone,
            // which also shows they work), then undo them.
            let deadline = Instant::now() + Duration::from_secs(60);
            while bank.get_many(&keys(&before, v_old, 8)).await.iter().any(Option::is_some) {
                assert!(Instant::now() < deadline, "the write never deleted the old blocks");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            for (i, k) in keys(&before, v_old, 8).iter().enumerate() {
                plant(&cl, &bank, k, &old[i * BLOCK..(i + 1) * BLOCK]).await;
            }
            assert!(bank.get_many(&keys(&before, v_old, 8)).await.iter().all(Option::is_some));
        }
        Disturb::KillDaemon => cl.kill_cache(0).await,
        Disturb::RestartDaemonEmpty => cl.restart_cache(0).await.unwrap(),
    }

    let after = reader.open("/f", OpenMode::Read).await.unwrap();
    assert!(after.data_version() > v_old, "the writer's open and close took new versions");
    assert_eq!(read_all(&after).await, new, "{disturb:?}: never the old bytes after the writer's close");
    // Read again until the new version's blocks are in the bank, then once more from it: still the new bytes.
    read_until_cached(&after, &new, &bank, &keys(&after, after.data_version(), 4)).await;
    assert_eq!(read_all(&after).await, new, "{disturb:?}: the new bytes from the bank");
    // Random small reads too.
    for (i, off) in [0usize, 4095, 4096, 1 << 20, (1 << 20) + 5000, len - 7].into_iter().enumerate() {
        let got = after.read_at(off as u64, BytesMut::zeroed(3000)).await.unwrap();
        assert_eq!(&got[..], &new[off..(off + 3000).min(len)], "{disturb:?}: small read {i} at {off}");
    }
}

#[tokio::test]
async fn a_rewrite_in_place_is_seen_after_close_with_the_bank_on() {
    rewrite_in_place("cdata-c2o", Disturb::None).await;
}

#[tokio::test]
async fn a_rewrite_in_place_is_seen_after_close_when_invalidations_were_lost() {
    rewrite_in_place("cdata-c2o-lost", Disturb::InvalidationsLost).await;
}

#[tokio::test]
async fn a_rewrite_in_place_is_seen_after_close_with_a_daemon_killed() {
    rewrite_in_place("cdata-c2o-kill", Disturb::KillDaemon).await;
}

#[tokio::test]
async fn a_rewrite_in_place_is_seen_after_close_with_a_daemon_restarted_empty() {
    rewrite_in_place("cdata-c2o-restart", Disturb::RestartDaemonEmpty).await;
}

#[tokio::test]
async fn garbage_planted_under_a_valid_block_key_is_ignored() {
    let cl = start_bank_cluster("cdata-garbage", 1, 2).await;
    let writer = client_with(&cl, None).await;
    let data = pattern(3, 0, 4 * BLOCK);
    write_file(&writer, "/f", &data).await;
    let reader = client_with(&cl, Some(bank_config(&cl, false))).await;
    let bank = reader.bank().unwrap().clone();
    let f = reader.open("/f", OpenMode::Read).await.unwrap();
    let ks = keys(&f, f.data_version(), 4);
    let ns = bank.config().namespace;
    let addr = |k: &CacheKey| cl.cache_addrs()[bank.owner(k).unwrap()].clone();
    // Block 0: plain garbage; 1: a well-formed value of another key; 2: a flipped bit; 3: a value longer than a
    // block (well-formed, so only the length check refuses it).
    raw_set(&addr(&ks[0]), &ks[0].encode(ns), b"not a weft value at all").await;
    let other = ks[2].encode(ns);
    raw_set(
        &addr(&ks[1]),
        &ks[1].encode(ns),
        &encode_value(other.as_bytes(), ItemKind::Block, &[0; BLOCK], &cl.bank_key()).unwrap(),
    )
    .await;
    let mut flipped = encode_value(ks[2].encode(ns).as_bytes(), ItemKind::Block, &[0; BLOCK], &cl.bank_key()).unwrap();
    *flipped.last_mut().unwrap() ^= 1;
    raw_set(&addr(&ks[2]), &ks[2].encode(ns), &flipped).await;
    plant(&cl, &bank, &ks[3], &[0; BLOCK + 1]).await;

    assert_eq!(read_all(&f).await, data, "the file's bytes, not the planted ones");
    assert_eq!(bank.stats().refused_items, 3, "three refused by the value checks: {:?}", bank.stats());
    assert_eq!(bank.stats().hits, 1, "the over-long value checked but is not a block");
}

#[tokio::test]
async fn a_daemon_killed_during_a_read_storm_costs_no_wrong_byte() {
    let mut cl = start_bank_cluster("cdata-storm", 2, 3).await;
    let cache = bank_config(&cl, true);
    let writer = client_with(&cl, None).await;
    let len = (3 << 20) + 1234;
    let data = Arc::new(pattern(7, 0, len));
    write_file(&writer, "/f", &data).await;
    let reader = client_with(&cl, Some(cache)).await;

    let tasks = 8;
    let reads_per_task = 60;
    let done = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let reader = reader.clone();
        let data = data.clone();
        let done = done.clone();
        set.spawn(async move {
            // xorshift64, seeded per task.
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1);
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut f = reader.open("/f", OpenMode::Read).await.unwrap();
            for i in 0..reads_per_task {
                if i % 10 == 0 {
                    f = reader.open("/f", OpenMode::Read).await.unwrap();
                }
                let off = (next() % len as u64) as usize;
                let n = 1 + (next() % (3 * BLOCK as u64 * 8)) as usize;
                let got = f.read_at(off as u64, BytesMut::zeroed(n)).await.unwrap();
                assert_eq!(&got[..], &data[off..(off + n).min(len)], "task {t} read {i} at {off} of {n}");
                done.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    // Kill a daemon once a third of the reads are done (the bank is warm by then).
    let deadline = Instant::now() + Duration::from_secs(120);
    while done.load(Ordering::SeqCst) < tasks * reads_per_task / 3 {
        assert!(Instant::now() < deadline, "the storm made no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cl.kill_cache(1).await;
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), tasks * reads_per_task);
    let stats = reader.bank().unwrap().stats();
    assert!(stats.hits > 0, "the bank served some of the storm: {stats:?}");
}

#[tokio::test]
async fn a_client_reads_its_own_writes_with_the_bank_on() {
    let cl = start_bank_cluster("cdata-own", 1, 2).await;
    let c = client_with(&cl, Some(bank_config(&cl, false))).await;
    let bank = c.bank().unwrap().clone();
    let old = pattern(4, 0, 8 * BLOCK);
    write_file(&c, "/f", &old).await;

    let w = c.open("/f", OpenMode::ReadWrite).await.unwrap();
    // As if a reader that opened after this writer had filled the bank with the bytes before the write (a fill
    // whose delete was lost): items of the writer's own version.
    for (i, k) in keys(&w, w.data_version(), 8).iter().enumerate() {
        plant(&cl, &bank, k, &old[i * BLOCK..(i + 1) * BLOCK]).await;
    }
    let new = pattern(5, 0, 3 * BLOCK);
    w.write_at(BLOCK as u64, new.clone().into()).await.unwrap();
    let hits = bank.stats().hits;
    let got = read_all(&w).await;
    assert_eq!(&got[BLOCK..4 * BLOCK], &new[..], "the writer reads its own writes, not the bank");
    assert_eq!((&got[..BLOCK], &got[4 * BLOCK..]), (&old[..BLOCK], &old[4 * BLOCK..]));
    assert_eq!(bank.stats().hits, hits, "a file that wrote does not ask the bank");
    w.close().await.unwrap();

    // After the close, a new open reads everything right, through the bank.
    let r = c.open("/f", OpenMode::Read).await.unwrap();
    let got = read_all(&r).await;
    assert_eq!((&got[BLOCK..4 * BLOCK], &got[..BLOCK]), (&new[..], &old[..BLOCK]));
}

/// Polls until the bank holds every one of `keys` (the data servers fill after answering, off the reply path).
async fn until_cached(bank: &Bank, keys: &[CacheKey]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !bank.get_many(keys).await.iter().all(Option::is_some) {
        assert!(Instant::now() < deadline, "the data server never filled {} keys: {:?}", keys.len(), bank.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Cheap misses: a read larger than `data_read_blocks_max` blocks neither looks up nor asks for fills; a file
/// whose reads keep missing (a client in another namespace: every lookup misses) pauses its lookups with
/// doubling probes, while its reads still fill the bank; and a data server stores a block it stored lately only
/// once, however often it is read. Every read is checked against the file's bytes.
#[tokio::test]
async fn misses_are_cheap() {
    let cl = start_with("cdata-cheap", 1, |o| {
        o.cache = 1;
        o.cache_mib = 16;
        o.cache_block_bytes = BLOCK as u32;
        // Only data items: memcached's set count below is the data server's.
        o.cache_attrs = false;
    })
    .await;
    let writer = client_with(&cl, None).await;
    let data = pattern(3, 0, 64 * BLOCK);
    write_file(&writer, "/f", &data).await;
    let look = Bank::new(bank_config(&cl, false), cl.bank_key()).unwrap();
    let addrs = cl.cache_addrs();

    // A read of 5 blocks with a limit of 4: not looked up, not filled. (One data server, one FIFO fill queue:
    // once a later fill is in the bank, an earlier one would be too.)
    let small = CacheConfig { data_read_blocks_max: 4, ..bank_config(&cl, false) };
    let reader = client_with(&cl, Some(small)).await;
    let bank = reader.bank().unwrap().clone();
    let f = reader.open("/f", OpenMode::Read).await.unwrap();
    let ks = keys(&f, f.data_version(), 64);
    let got = f.read_at(0, BytesMut::zeroed(5 * BLOCK)).await.unwrap();
    assert_eq!(&got[..], &data[..5 * BLOCK]);
    assert_eq!((bank.stats().hits, bank.stats().misses), (0, 0), "a large read does not look up");
    let got = f.read_at(8 * BLOCK as u64, BytesMut::zeroed(4 * BLOCK)).await.unwrap();
    assert_eq!(&got[..], &data[8 * BLOCK..12 * BLOCK]);
    assert_eq!(bank.stats().misses, 4, "a read of 4 blocks looks them up");
    until_cached(&look, &ks[8..12]).await;
    assert!(look.get_many(&ks[..5]).await.iter().all(Option::is_none), "the large read asked for no fill");

    // A client whose every lookup misses: 40 one-block reads ask the bank 9 times (4 misses, then probes after
    // pauses of 1, 2, 4, 8, 16 reads), and every read still asks the data server to fill.
    let foreign = CacheConfig {
        namespace: bank_config(&cl, false).namespace ^ 1,
        data_miss_streak_max: 4,
        data_miss_skip_reads_max: 64,
        ..bank_config(&cl, false)
    };
    let missing = client_with(&cl, Some(foreign)).await;
    let mbank = missing.bank().unwrap().clone();
    let f = missing.open("/f", OpenMode::Read).await.unwrap();
    for b in 20..60 {
        let got = f.read_at((b * BLOCK) as u64, BytesMut::zeroed(BLOCK)).await.unwrap();
        assert_eq!(&got[..], &data[b * BLOCK..(b + 1) * BLOCK], "block {b}");
    }
    assert_eq!((mbank.stats().hits, mbank.stats().misses), (0, 9), "lookups paused: {:?}", mbank.stats());
    until_cached(&look, &ks[20..60]).await;

    // Read again, the server stores none of those blocks a second time: memcached's own set count moves only
    // for the one new block read last (the same FIFO orders it after the others).
    let sets = total_stat(&addrs, "cmd_set").await;
    for b in 20..60 {
        let got = f.read_at((b * BLOCK) as u64, BytesMut::zeroed(BLOCK)).await.unwrap();
        assert_eq!(&got[..], &data[b * BLOCK..(b + 1) * BLOCK], "block {b} again");
    }
    let f2 = missing.open("/f", OpenMode::Read).await.unwrap();
    assert_eq!(f2.read_at((62 * BLOCK) as u64, BytesMut::zeroed(10)).await.unwrap()[..], data[62 * BLOCK..][..10]);
    until_cached(&look, &ks[62..63]).await;
    assert_eq!(total_stat(&addrs, "cmd_set").await - sets, 1, "blocks stored lately are not stored again");
}

/// What the old, unsealed value format (version 1) made of a payload: a header anyone could compute (magic,
/// key hash, length, CRC-32C). The adversary's script of issue 31 wrote these.
fn unsealed_v1(key: &str, kind: ItemKind, payload: &[u8]) -> Vec<u8> {
    let mut v = b"WFCV".to_vec();
    v.extend_from_slice(&[1, kind as u8, 0, 0]);
    v.extend_from_slice(&weft_cache::value::key_hash(key.as_bytes()).to_le_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&v[..20]), payload);
    v.extend_from_slice(&crc.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Every key daemon `addr` holds, from memcached's own `lru_crawler metadump all` (one `key=… exp=…` line per
/// item, then `END`; keys are URL-encoded there, and ours have only `/` to encode).
async fn listed_keys(addr: &str) -> Vec<String> {
    let dump = raw(addr, b"lru_crawler metadump all\r\n", &["END"]).await;
    let keys = dump.lines().filter_map(|l| l.strip_prefix("key=")?.split(' ').next());
    keys.map(|k| k.replace("%2F", "/").replace("%2f", "/")).collect()
}

/// One item's raw bytes, read as anyone who reaches the port can (empty when the daemon holds none).
async fn raw_get(addr: &str, key: &str) -> Vec<u8> {
    let mut s = tokio::io::BufReader::new(TcpStream::connect(addr).await.unwrap());
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    s.get_mut().write_all(format!("get {key}\r\n").as_bytes()).await.unwrap();
    let mut line = String::new();
    s.read_line(&mut line).await.unwrap();
    if line.trim_end() == "END" {
        return Vec::new();
    }
    let len: usize = line.trim_end().rsplit(' ').next().unwrap().parse().unwrap_or_else(|_| panic!("{line}"));
    let mut value = vec![0; len + 2];
    s.read_exact(&mut value).await.unwrap();
    value.truncate(len);
    value
}

/// The bank against a bystander who reaches the memcached port without any key, making the moves of issue 31's
/// script: list every key, read every item, then rewrite every block, attributes and entry item the way the old
/// format described them, sealed under a key of its own, or copied from another key. No file byte, name or
/// attribute is readable, and every forged item is a miss: readers get the file's own bytes, attributes and entry.
#[tokio::test]
async fn a_bystander_at_the_memcached_port_reads_nothing_and_forges_nothing() {
    let cl = start_bank_cluster("cache-bystander", 1, 1).await;
    let addr = cl.cache_addrs()[0].clone();
    let cache = CacheConfig { attrs: true, ..bank_config(&cl, false) };
    let writer = client_with(&cl, None).await;
    let name = "payroll-2026.txt";
    let data = b"SECRET-SALARY-".repeat(4 * BLOCK / 14 + 1)[..4 * BLOCK].to_vec();
    let other = write_file(&writer, "/other", b"other file").await;
    write_file(&writer, &format!("/{name}"), &data).await;
    let reader = client_with(&cl, Some(cache.clone())).await;
    let bank = reader.bank().unwrap().clone();
    let f = reader.open(&format!("/{name}"), OpenMode::Read).await.unwrap();
    let ino = f.ino();
    let ks = keys(&f, f.data_version(), 4);
    read_until_cached(&f, &data, &bank, &ks).await;
    let truth = reader.lookup(weft_proto::ROOT_INO, name).await.unwrap();
    assert!(bank.get_attr(ino).await.is_some(), "the MDS published the file's attributes");

    // List and read: the keys hide the name, the items hide the bytes, the name and the attributes. memcached's
    // listing walks its LRUs as they are and may show only part of them, so the keys this test knows are added:
    // a bystander listing long enough sees them all.
    let mut listed = listed_keys(&addr).await;
    assert!(!listed.is_empty(), "memcached lists the keys it holds");
    let ns = cache.namespace;
    let known =
        [CacheKey::Attrs { ino }, CacheKey::Attrs { ino: other }, CacheKey::Attrs { ino: weft_proto::ROOT_INO }]
            .into_iter()
            .chain([bank.lookup_key(weft_proto::ROOT_INO, name), bank.lookup_key(weft_proto::ROOT_INO, "other")])
            .chain(ks.iter().copied());
    listed.extend(known.map(|k| k.encode(ns)));
    listed.sort();
    listed.dedup();
    let kinds =
        |letter: &str| listed.iter().filter(|k| k.split('/').nth(2) == Some(letter)).cloned().collect::<Vec<_>>();
    let (blocks, attrs, entries) = (kinds("b"), kinds("a"), kinds("l"));
    assert!(blocks.len() >= 4 && attrs.len() >= 3 && entries.len() >= 2, "{listed:?}");
    let plain_hash = plain_sha256_prefix(name);
    for key in &listed {
        assert!(!key.contains(name) && !key.contains(&plain_hash), "a key gives the name away: {key}");
        let item = raw_get(&addr, key).await;
        for secret in [&b"SECRET-SALARY"[..], name.as_bytes(), b"other file"] {
            assert!(
                !item.windows(secret.len()).any(|w| w == secret),
                "{key} shows {:?}",
                String::from_utf8_lossy(secret)
            );
        }
    }

    // Forge: the old format with a valid CRC, a seal under the bystander's own key, and a sealed item moved
    // from another key, for every block, attributes and entry item there is.
    let stranger = weft_cache::BankKey::from_secret(&[0xee; 32]);
    let mut lie = truth.clone();
    (lie.mode, lie.size, lie.uid) = (0o104777, 3, 0);
    let lie_attrs = weft_cache::AttrItem(lie.clone()).encode();
    let lie_entry = weft_cache::LookupItem { name: name.into(), ino: other, attr: None }.encode();
    let moved = raw_get(&addr, &blocks[0]).await;
    let mut forged = 0u64;
    for (round, forge) in ["unsealed", "stranger", "moved"].iter().enumerate() {
        for (keys, kind, payload) in [
            (&blocks, ItemKind::Block, &b"FORGED!".repeat(BLOCK / 7)[..]),
            (&attrs, ItemKind::Attrs, &lie_attrs[..]),
            (&entries, ItemKind::Lookup, &lie_entry[..]),
        ] {
            for key in keys.iter() {
                let item = match *forge {
                    "unsealed" => unsealed_v1(key, kind, payload),
                    "stranger" => encode_value(key.as_bytes(), kind, payload, &stranger).unwrap(),
                    _ if key == &blocks[0] => continue,
                    _ => moved.clone(),
                };
                raw_set(&addr, key, &item).await;
            }
        }
        let fresh = client_with(&cl, Some(cache.clone())).await;
        let g = fresh.open(&format!("/{name}"), OpenMode::Read).await.unwrap();
        assert_eq!(read_all(&g).await, data, "{forge}: the file's bytes, not the forged ones");
        assert_eq!(fresh.getattr(ino).await.unwrap().mode, truth.mode, "{forge}: the real attributes");
        assert_eq!(fresh.lookup(weft_proto::ROOT_INO, name).await.unwrap().ino, ino, "{forge}: the real entry");
        let refused = fresh.bank_stats().unwrap().refused_items;
        assert!(refused >= 4, "{forge} round {round}: the forged blocks were seen and refused ({refused})");
        forged += refused;
    }
    assert!(forged >= 12);
}

/// The first 16 bytes of SHA-256(name) in hex: what the old keys carried for a name, which a dictionary could
/// match (written with `sha256sum` so the test does not share the code under test).
fn plain_sha256_prefix(name: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(name.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..32].to_string()
}

/// A reader names nothing a data server fills (issue 31 item 2). A read asks a server to fill the bank while
/// claiming a data version ahead of the file's: the server stores what it read only under the version the MDS
/// sealed into the read's capability and under its own id, so a reader can plant neither one object's bytes as
/// another's nor bytes under the version a later writer's readers will ask for. The requests go out as the
/// client library's would (an `RpcClient` proving the cluster key), with the hint chosen by hand.
#[tokio::test]
async fn a_reader_cannot_name_what_a_data_server_fills() {
    let cl = start_bank_cluster("cache-planted", 2, 1).await;
    let unit = 1 << 20;
    let data = pattern(11, 0, 2 * unit);
    let writer = client_with(&cl, None).await;
    let ino = write_file(&writer, "/f", &data).await;
    let reader = client_with(&cl, Some(bank_config(&cl, false))).await;
    let bank = reader.bank().unwrap().clone();
    let opened = reader.open_capability(ino, weft_proto::Rights::READ).await.unwrap();
    let layout = opened.attr.layout.clone().unwrap();
    assert_eq!((layout.servers.len(), layout.stripe_unit as usize), (2, unit), "{layout:?}");
    let sealed = opened.cap.data_version;
    assert_eq!(sealed, opened.attr.data_version, "the capability carries the file's data version");
    let claimed = sealed + 7;
    for &server in &layout.servers {
        let ds = weft_rpc::RpcClient::connect(cl.tcp_fabric(), &cl.data_addrs()[server as usize], cl.rpc_config())
            .await
            .unwrap();
        let read = weft_proto::msg::ReadReq {
            ino,
            offset: 0,
            len: BLOCK as u32,
            cap: opened.cap.clone(),
            fill: Some(weft_proto::msg::FillHint { data_version: claimed }),
        };
        ds.call(weft_proto::Request::Read(read), vec![], vec![BytesMut::zeroed(BLOCK)]).await.unwrap();
    }
    let key = |data_version, server| CacheKey::Block { ino, data_version, server, block: 0 };
    let deadline = Instant::now() + Duration::from_secs(60);
    for (position, &server) in layout.servers.iter().enumerate() {
        let stored = loop {
            if let Some(b) = bank.get(&key(sealed, server)).await {
                break b;
            }
            assert!(Instant::now() < deadline, "server {server} never filled the bank: {:?}", bank.stats());
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let own = &data[position * unit..position * unit + BLOCK];
        assert_eq!(&stored[..], own, "server {server}'s block 0 holds its own object's bytes");
        assert_eq!(bank.get(&key(claimed, server)).await, None, "nothing under the version the reader claimed");
    }
}

/// `weft key rotate --bank` (issue 31): one new `key_generation` in every config named. A data server restarted on
/// its rotated config fills under the new bank key; a client of the rotated `cluster.toml` refuses what the old
/// key sealed and reads the new fills; a client still on the old generation refuses those. Every read returns the
/// file's own bytes.
#[tokio::test]
async fn rotating_the_bank_key_turns_old_items_into_misses() {
    let mut cl = start_bank_cluster("cache-rotate", 1, 1).await;
    let data = pattern(5, 0, 4 * BLOCK);
    let writer = client_with(&cl, None).await;
    write_file(&writer, "/f", &data).await;
    let old = client_with(&cl, Some(bank_config(&cl, false))).await;
    let old_bank = old.bank().unwrap().clone();
    let f = old.open("/f", OpenMode::Read).await.unwrap();
    let ks = keys(&f, f.data_version(), 4);
    read_until_cached(&f, &data, &old_bank, &ks).await;

    let configs = [cl.cluster_file(), cl.dir().join("config/meta.toml"), cl.dir().join("config/data0.toml")];
    let out =
        std::process::Command::new(common::WEFT).args(["key", "rotate", "--bank"]).args(&configs).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("generation 1"));
    let rotated = ClusterConfig::from_spec(&cl.cluster_file().to_string_lossy()).unwrap().cache.unwrap();
    assert_eq!(rotated.key_generation, 1, "cluster.toml carries the new generation");
    cl.restart_data_server(0).await.unwrap();

    let new = client_with(&cl, Some(CacheConfig { key_generation: 1, ..bank_config(&cl, false) })).await;
    let new_bank = new.bank().unwrap().clone();
    assert!(new_bank.get_many(&ks).await.iter().all(Option::is_none), "the old key's items are misses");
    assert_eq!(new_bank.stats().refused_items, 4, "seen and refused: {:?}", new_bank.stats());
    let g = new.open("/f", OpenMode::Read).await.unwrap();
    read_until_cached(&g, &data, &new_bank, &ks).await;
    let refused = old_bank.stats().refused_items;
    assert!(old_bank.get_many(&ks).await.iter().all(Option::is_none), "the new key's items are misses to the old");
    assert_eq!(old_bank.stats().refused_items, refused + 4);
    assert_eq!(read_all(&f).await, data, "the old client still reads the file's bytes");
}
