//! The cache bank against real memcached daemons started by the launcher (`LaunchOptions::cache`): round trips,
//! multi-gets, hits counted by memcached's own `stats`, garbage planted under a valid key, and a daemon killed
//! with SIGKILL during a loop of gets, then restarted empty.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;
use weft_cache::value::{PAYLOAD_BYTES_MAX, encode_value};
use weft_cache::{Bank, CacheConfig, CacheKey, HealthState, ItemKind};
use weft_client::ClusterConfig;

use common::memcached::{raw, raw_set};
use common::{TestCluster, pattern, start_with};

async fn start_bank_cluster(name: &str, daemons: u32) -> TestCluster {
    start_with(name, 1, |o| {
        o.cache = daemons;
        o.cache_mib = 16;
    })
    .await
}

/// The bank as `cluster.toml` names it, with a deadline long enough that a loaded test machine never turns a
/// hit into a miss (the kill test shortens it where misses are expected).
fn bank_config(cl: &TestCluster) -> CacheConfig {
    let cfg = ClusterConfig::from_spec(&cl.cluster_file().to_string_lossy()).unwrap();
    let cache = cfg.cache.expect("cluster.toml has a [cache] table");
    assert_eq!(cache.servers, cl.cache_addrs());
    CacheConfig { request_timeout_ms: 5_000, connect_timeout_ms: 5_000, ..cache }
}

fn block(index: u64) -> CacheKey {
    CacheKey::Block { ino: 42, data_version: 1, server: 0, block: index }
}

fn payload(index: u64, len: usize) -> Vec<u8> {
    pattern(index, 0, len)
}

/// A counter from memcached's own `stats`.
async fn stat(addr: &str, name: &str) -> u64 {
    let text = raw(addr, b"stats\r\n", &["END"]).await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")).map(|v| v.trim().parse().unwrap()))
        .unwrap_or_else(|| panic!("no {name} in stats of {addr}"))
}

async fn total_stat(cl: &TestCluster, name: &str) -> u64 {
    let mut sum = 0;
    for a in cl.cache_addrs() {
        sum += stat(&a, name).await;
    }
    sum
}

#[tokio::test]
async fn set_get_and_multi_get_round_trip_counted_by_memcached() {
    let cl = start_bank_cluster("cache-rt", 3).await;
    let bank = Bank::new(bank_config(&cl), cl.bank_key()).unwrap();
    let n = 64u64;
    let len = bank.config().block_bytes as usize;
    for i in 0..n {
        assert!(bank.set(&block(i), &payload(i, len)).await, "block {i} stored: {:?}", bank.stats());
    }
    // The blocks spread over the daemons (consistent hashing, not all on one).
    let mut owners = std::collections::BTreeSet::new();
    for i in 0..n {
        owners.insert(bank.owner(&block(i)).unwrap());
    }
    assert_eq!(owners.len(), 3, "64 keys land on every one of 3 daemons");

    assert_eq!(total_stat(&cl, "get_hits").await, 0);
    for i in 0..n {
        assert_eq!(bank.get(&block(i)).await.as_deref(), Some(&payload(i, len)[..]), "block {i}");
    }
    assert_eq!(total_stat(&cl, "get_hits").await, n, "every get was a memcached hit");

    // One multi-get: present and absent keys, answers in the order asked.
    let mut keys: Vec<CacheKey> = (0..n).map(block).collect();
    keys.push(block(1000));
    keys.push(CacheKey::Block { ino: 42, data_version: 2, server: 0, block: 0 }); // another data version: another key
    let got = bank.get_many(&keys).await;
    assert_eq!(got.len(), keys.len());
    for (i, v) in got.iter().take(n as usize).enumerate() {
        assert_eq!(v.as_deref(), Some(&payload(i as u64, len)[..]), "multi-get block {i}");
    }
    assert_eq!((got[n as usize].as_ref(), got[n as usize + 1].as_ref()), (None, None));
    assert_eq!(total_stat(&cl, "get_hits").await, 2 * n);
    assert_eq!(total_stat(&cl, "get_misses").await, 2, "the two absent keys, as memcached counts them");

    // Delete, a payload of the largest size, and one over memcached's item limit.
    assert!(bank.delete(&block(0)).await);
    assert_eq!(bank.get(&block(0)).await, None);
    let big = vec![7u8; PAYLOAD_BYTES_MAX];
    assert!(bank.set(&block(2000), &big).await, "a payload at the limit fits memcached's 1 MiB item");
    assert_eq!(bank.get(&block(2000)).await.map(|b| b.len()), Some(PAYLOAD_BYTES_MAX));
    assert!(!bank.set(&block(2001), &vec![7u8; PAYLOAD_BYTES_MAX + 1]).await, "over the limit: not stored");
    let stats = bank.stats();
    assert_eq!((stats.failures, stats.timeouts, stats.refused_items), (0, 0, 0), "{stats:?}");
}

#[tokio::test]
async fn garbage_planted_under_a_valid_key_is_a_miss() {
    let cl = start_bank_cluster("cache-garbage", 2).await;
    let cfg = bank_config(&cl);
    let bank = Bank::new(cfg.clone(), cl.bank_key()).unwrap();
    let key = block(5);
    let encoded = key.encode(cfg.namespace);
    let addr = &cl.cache_addrs()[bank.owner(&key).unwrap()];
    let seal = cl.bank_key();
    let good = encode_value(encoded.as_bytes(), ItemKind::Block, b"the real block", &seal).unwrap();

    let foreign_key = block(6).encode(cfg.namespace);
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 1;
    let plants: Vec<(&str, Vec<u8>)> = vec![
        ("plain text", b"hello, I am not a weft value".to_vec()),
        ("empty", Vec::new()),
        (
            "another key's value",
            encode_value(foreign_key.as_bytes(), ItemKind::Block, b"the real block", &seal).unwrap(),
        ),
        ("another kind", encode_value(encoded.as_bytes(), ItemKind::Attrs, b"the real block", &seal).unwrap()),
        ("a flipped bit", flipped),
        ("truncated", good[..good.len() - 3].to_vec()),
    ];
    for (i, (what, item)) in plants.iter().enumerate() {
        raw_set(addr, &encoded, item).await;
        assert_eq!(bank.get(&key).await, None, "{what} is a miss");
        assert_eq!(bank.get_many(&[key, block(7)]).await, vec![None, None], "{what} is a miss in a multi-get");
        assert_eq!(bank.stats().refused_items, 2 * (i as u64 + 1), "{what} was seen and refused");
    }
    // The real value under the same key is a hit, byte for byte.
    raw_set(addr, &encoded, &good).await;
    assert_eq!(bank.get(&key).await, Some(Bytes::from_static(b"the real block")));
    // None of that was a daemon failure.
    assert_eq!(bank.daemon_state(bank.owner(&key).unwrap()), Some(HealthState::Up));
    assert_eq!(bank.stats().failures, 0);
}

#[tokio::test]
async fn a_daemon_killed_during_gets_costs_only_misses_then_returns_empty() {
    let mut cl = start_bank_cluster("cache-kill", 3).await;
    let cfg = CacheConfig { request_timeout_ms: 1_000, errors_to_eject: 2, eject_ms: 200, ..bank_config(&cl) };
    let bank = Bank::new(cfg, cl.bank_key()).unwrap();
    let n = 300u64;
    let len = 512;
    let keys: Vec<CacheKey> = (0..n).map(block).collect();
    for (i, k) in keys.iter().enumerate() {
        assert!(bank.set(k, &payload(i as u64, len)).await);
    }
    let victim = 1usize;
    let victim_keys: Vec<usize> = (0..n as usize).filter(|&i| bank.owner(&keys[i]) == Some(victim)).collect();
    assert!(!victim_keys.is_empty());

    let check = |got: &[Option<Bytes>]| {
        let mut hits = 0;
        for (i, v) in got.iter().enumerate() {
            if let Some(v) = v {
                assert_eq!(&v[..], &payload(i as u64, len)[..], "block {i}: a wrong value, not a miss");
                hits += 1;
            }
        }
        hits
    };
    for round in 0..30 {
        if round == 5 {
            cl.kill_cache(victim as u32).await;
        }
        let got = bank.get_many(&keys).await;
        let hits = check(&got);
        if round < 5 {
            assert_eq!(hits, n as usize, "all daemons up: every key hits");
        } else {
            // Every key of a live daemon still hits; the dead daemon's keys are misses.
            assert!(hits >= (n as usize - victim_keys.len()), "round {round}: only {hits} hits");
            for &i in &victim_keys {
                assert!(got[i].is_none());
            }
        }
        // Single gets too, through the same failure.
        for &i in victim_keys.iter().take(3) {
            let got = bank.get(&keys[i]).await;
            if round < 5 {
                assert_eq!(got.as_deref(), Some(&payload(i as u64, len)[..]));
            } else {
                assert_eq!(got, None);
            }
        }
    }
    let state = bank.daemon_state(victim).unwrap();
    assert!(matches!(state, HealthState::Ejected { .. } | HealthState::Probing), "victim is {state:?}");
    let stats = bank.stats();
    assert!(stats.failures + stats.timeouts >= 2, "{stats:?}");

    // Restarted empty on the same port: the probe brings it back, its keys are misses there, then hits once set.
    cl.restart_cache(victim as u32).await.unwrap();
    let victim_addr = cl.cache_addrs()[victim].clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while bank.daemon_state(victim) != Some(HealthState::Up) {
        assert!(tokio::time::Instant::now() < deadline, "the restarted daemon was never probed back up");
        check(&bank.get_many(&keys).await);
        // Polling for the probe after eject_ms; not a timing assertion.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = bank.get_many(&keys).await;
    check(&got);
    for &i in &victim_keys {
        assert!(got[i].is_none(), "block {i}: a restarted daemon is empty");
    }
    assert_eq!(stat(&victim_addr, "get_hits").await, 0);
    assert!(stat(&victim_addr, "get_misses").await >= victim_keys.len() as u64);
    for &i in &victim_keys {
        assert!(bank.set(&keys[i], &payload(i as u64, len)).await);
    }
    let got = bank.get_many(&keys).await;
    assert_eq!(check(&got), n as usize, "every key hits again");
    assert_eq!(stat(&victim_addr, "get_hits").await, victim_keys.len() as u64);
}

#[tokio::test]
async fn a_bank_whose_daemons_are_all_gone_is_only_slower() {
    let mut cl = start_bank_cluster("cache-none", 1).await;
    let cfg = CacheConfig { request_timeout_ms: 500, errors_to_eject: 1, eject_ms: 60_000, ..bank_config(&cl) };
    let bank = Bank::new(cfg, cl.bank_key()).unwrap();
    assert!(bank.set(&block(1), b"x").await);
    cl.stop_cache(0).await;
    assert_eq!(bank.get(&block(1)).await, None);
    assert!(matches!(bank.daemon_state(0), Some(HealthState::Ejected { .. })));
    // Ejected: nothing is asked any more (no connect, no timeout), and nothing fails.
    let before = bank.stats();
    assert_eq!(bank.get_many(&[block(1), block(2)]).await, vec![None, None]);
    assert!(!bank.set(&block(3), b"y").await);
    let after = bank.stats();
    assert_eq!((after.failures, after.timeouts), (before.failures, before.timeouts));
    assert_eq!(after.routed_around, before.routed_around + 2);
    // The daemon really is gone (the test would prove nothing if it were not).
    assert!(TcpStream::connect(&cl.cache_addrs()[0]).await.is_err());
}
