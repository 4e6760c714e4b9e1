//! Where a bank lookup's time goes (issue 16's speed targets): the pieces of a stat and of a 1-byte read timed in
//! isolation against real memcached daemons and real servers, printed, never asserted (`#[ignore]`: run by hand
//! with `cargo test --release -p weft --test integration cache_perf:: -- --ignored --nocapture`). The only assertions are that
//! every answer is right, so a figure printed here is the cost of a correct answer.

use crate::common;

use std::time::Instant;

use bytes::BytesMut;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use weft_cache::{Bank, CacheKey};
use weft_client::{Client, ClusterConfig, OpenMode};

use common::{TestCluster, start_with};

const FILES: u64 = 200;
const ROUNDS: u64 = 30;

async fn cluster(name: &str, daemons: u32) -> TestCluster {
    start_with(name, 2, |o| {
        o.cache = daemons;
        o.cache_mib = 16;
        o.cache_timeout_ms = 10_000;
    })
    .await
}

fn config(cl: &TestCluster, bank: bool) -> ClusterConfig {
    let cfg = ClusterConfig::from_spec(&cl.cluster_file().to_string_lossy()).unwrap();
    if bank { cfg } else { ClusterConfig { cache: None, ..cfg } }
}

/// This process's user + system CPU seconds, from /proc/self/stat (clock ticks of 10 ms: read over many calls).
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after_name.split(' ').collect();
    // Fields 14 and 15 of proc(5) (utime, stime) are the 12th and 13th after the name.
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

/// Median µs per call of `rounds` timed batches of `n` calls of `f`, and this process's CPU µs per call.
async fn time<F: AsyncFnMut(u64)>(label: &str, n: u64, mut f: F) {
    let mut per = Vec::new();
    let cpu = cpu_s();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for i in 0..n {
            f(i).await;
        }
        per.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    let cpu_us = (cpu_s() - cpu) * 1e6 / (n * ROUNDS) as f64;
    per.sort_by(f64::total_cmp);
    println!("{label:<55} {:>7.1} µs/call (min {:>6.1}), client CPU {cpu_us:>6.1} µs/call", per[per.len() / 2], per[0]);
}

/// One raw `get` on a kept connection with TCP_NODELAY: the floor of a bank hit.
async fn raw_get(s: &mut BufReader<TcpStream>, key: &str) -> usize {
    s.get_mut().write_all(format!("get {key}\r\n").as_bytes()).await.unwrap();
    let mut line = String::new();
    s.read_line(&mut line).await.unwrap();
    let len: usize = line.split(' ').nth(3).map_or(0, |x| x.trim().parse().unwrap());
    let mut body = vec![0u8; len + 2];
    s.read_exact(&mut body).await.unwrap();
    line.clear();
    s.read_line(&mut line).await.unwrap();
    assert_eq!(line.trim_end(), "END");
    len
}

async fn stat_pieces(daemons: u32) {
    let cl = cluster(&format!("cache-perf-stat-{daemons}"), daemons).await;
    let (bank_client, truth) =
        (Client::connect(&config(&cl, true)).await.unwrap(), Client::connect(&config(&cl, false)).await.unwrap());
    let root = truth.resolve("/").await.unwrap().ino;
    let dir = truth.mkdir(root, "d", 0o755).await.unwrap().ino;
    let mut inos = Vec::new();
    for i in 0..FILES {
        inos.push(truth.create(dir, &format!("f{i}"), 0o644, true).await.unwrap().ino);
    }
    // Warm: the bank's items (pushed at create; a lookup miss fills), connections, guesses.
    for _ in 0..2 {
        for i in 0..FILES {
            bank_client.lookup(dir, &format!("f{i}")).await.unwrap();
        }
    }
    let names: Vec<String> = (0..FILES).map(|i| format!("f{i}")).collect();
    println!("--- {daemons} daemon(s), {FILES} files");
    time("lookup, MDS (client without bank)", FILES, async |i| {
        assert_eq!(truth.lookup(dir, &names[i as usize]).await.unwrap().ino, inos[i as usize]);
    })
    .await;
    let hits = bank_client.bank_stats().unwrap().hits;
    time("lookup, bank client", FILES, async |i| {
        assert_eq!(bank_client.lookup(dir, &names[i as usize]).await.unwrap().ino, inos[i as usize]);
    })
    .await;
    let s = bank_client.bank_stats().unwrap();
    println!("  bank: {} hits over {} lookups, {} gets total", s.hits - hits, FILES * ROUNDS, s.gets);
    time("getattr, MDS", FILES, async |i| {
        assert_eq!(truth.getattr(inos[i as usize]).await.unwrap().ino, inos[i as usize]);
    })
    .await;
    let hits = bank_client.bank_stats().unwrap().hits;
    time("getattr, bank client", FILES, async |i| {
        assert_eq!(bank_client.getattr(inos[i as usize]).await.unwrap().ino, inos[i as usize]);
    })
    .await;
    println!("  bank: {} hits over {} getattrs", bank_client.bank_stats().unwrap().hits - hits, FILES * ROUNDS);
    let bank = Bank::new(config(&cl, true).cache.unwrap(), cl.bank_key()).unwrap();
    time("Bank::get_attr", FILES, async |i| {
        assert!(bank.get_attr(inos[i as usize]).await.is_some());
    })
    .await;
    time("Bank::get_many, 3 attribute keys", FILES, async |i| {
        let keys = [0, 1, 2].map(|k| CacheKey::Attrs { ino: inos[(i as usize + k) % inos.len()] });
        assert!(bank.get_many(&keys).await.iter().all(Option::is_some));
    })
    .await;
    time("Bank::get_lookup (2 keys: the entry carries the attributes)", FILES, async |i| {
        let found = bank.get_lookup(dir, &names[i as usize], None).await;
        assert!(found.dir.is_some() && found.child == Some(inos[i as usize]) && found.carried);
    })
    .await;
    let ns = config(&cl, true).cache.unwrap().namespace;
    let keys: Vec<String> = inos.iter().map(|&ino| CacheKey::Attrs { ino }.encode(ns)).collect();
    time("key encode + SHA-256 key hash", FILES, async |i| {
        let k = CacheKey::Attrs { ino: inos[i as usize] }.encode(ns);
        std::hint::black_box(weft_cache::value::key_hash(k.as_bytes()));
    })
    .await;
    if daemons == 1 {
        let addr = cl.cluster.cache_addrs()[0].clone();
        let tcp = TcpStream::connect(&addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let mut s = BufReader::new(tcp);
        time("raw memcached get, kept connection, same task", FILES, async |i| {
            assert!(raw_get(&mut s, &keys[i as usize]).await > 0);
        })
        .await;
    }
    bank_client.close().await;
    truth.close().await;
}

#[ignore = "timings, printed; run by hand"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_a_stat_through_the_bank_spends_its_time() {
    stat_pieces(1).await;
    stat_pieces(2).await;
}

#[ignore = "timings, printed; run by hand"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_a_one_byte_read_through_the_bank_spends_its_time() {
    let cl = cluster("cache-perf-read", 1).await;
    let truth = Client::connect(&config(&cl, false)).await.unwrap();
    let size = 4u64 << 20;
    let f = truth.create_path("/data", 0o644, true, false).await.unwrap();
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    f.write_at(0, bytes::Bytes::from(data)).await.unwrap();
    f.close().await.unwrap();
    let bank_client = Client::connect(&config(&cl, true)).await.unwrap();
    let (fb, ft) =
        (bank_client.open("/data", OpenMode::Read).await.unwrap(), truth.open("/data", OpenMode::Read).await.unwrap());
    // Warm: one pass in 64 KiB reads fills the bank (the data servers store what they read).
    for _ in 0..2 {
        for off in (0..size).step_by(64 << 10) {
            fb.read_at(off, BytesMut::zeroed(64 << 10)).await.unwrap();
        }
    }
    let offsets: Vec<u64> = (0..256u64).map(|i| (i * 7919 * 4099) % size).collect();
    for record in [1usize, 4096] {
        println!("--- {record}-byte reads");
        time("read, data server (client without bank)", offsets.len() as u64, async |i| {
            let off = offsets[i as usize];
            let b = ft.read_at(off, BytesMut::zeroed(record)).await.unwrap();
            assert_eq!(b[0], (off % 251) as u8);
        })
        .await;
        let hits = bank_client.bank_stats().unwrap().hits;
        time("read, bank client", offsets.len() as u64, async |i| {
            let off = offsets[i as usize];
            let b = fb.read_at(off, BytesMut::zeroed(record)).await.unwrap();
            assert_eq!(b[0], (off % 251) as u8);
        })
        .await;
        println!("  bank: {} hits", bank_client.bank_stats().unwrap().hits - hits);
    }
    let _ = (fb.close().await, ft.close().await);
}
