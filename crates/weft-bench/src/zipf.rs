//! `weft bench zipf`: reads and overwrites of single records at Zipf-distributed offsets of one file, the skewed
//! access of caches, key-value stores and most real working sets.
//!
//! Per point (data servers × record size): one file of `--size` is written in full (not timed), then every run
//! replays the same `--ops` operations: record rank `k` is drawn with `P(k) ∝ 1/k^alpha`, the operation is a read
//! with probability `--read-fraction`, else an overwrite of the record (op "rewrite"). Ranks map to record slots
//! through a fixed bijection that scatters them over the file (so the hottest records are not all in the first
//! stripe unit, on one server); `--hot-start` maps rank k to slot k-1 instead. The sequence comes from `--seed`
//! alone, so every run and every rerun issues the same operations. `--window` operations are in flight at once
//! (default 1: each call's time is its latency).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use clap::Args;
use serde_json::json;
use tokio::task::JoinSet;
use weft_client::{Client, File, OpenMode};

use crate::ceilings;
use crate::common::{self, Headline, OpRuns, Targets, micros_since, round1, round3};
use crate::doc::Document;
use crate::latency::pattern;
use crate::rng::{SplitMix64, Zipf};
use crate::stats::summarize;

#[derive(Args, Clone, Debug)]
pub struct ZipfArgs {
    /// Data-server counts to measure, e.g. `1,4` (ignored with --cluster).
    #[arg(long, default_value = "4")]
    pub servers: String,
    /// Record sizes: the unit of the distribution and of every call, e.g. `4K,64K`.
    #[arg(long, default_value = "4K")]
    pub record: String,
    /// Size of the file (written in full before the runs); it holds size/record records.
    #[arg(long, default_value = "256M")]
    pub size: String,
    /// Operations per run.
    #[arg(long, default_value_t = 20_000)]
    pub ops: u64,
    /// Zipf exponent: P(rank k) ∝ 1/k^alpha (> 0; 0.9 to 1.2 is typical of real workloads).
    #[arg(long, default_value_t = 0.9)]
    pub alpha: f64,
    /// Seed of the operation sequence.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Fraction of operations that are reads; the others overwrite a record.
    #[arg(long, default_value_t = 0.8)]
    pub read_fraction: f64,
    /// Operations in flight at once.
    #[arg(long, default_value_t = 1)]
    pub window: usize,
    /// Map rank k to record k-1 (the hottest records together at the start of the file) instead of scattering.
    #[arg(long)]
    pub hot_start: bool,
    #[command(flatten)]
    pub common: common::SharedArgs,
}

/// One operation: read or overwrite record `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    pub read: bool,
    pub slot: u64,
}

/// A multiplier coprime with `n`, so that `k ↦ k·m mod n` is a bijection of `0..n`; near n/φ so that neighbouring
/// ranks land far apart.
fn scatter_multiplier(n: u64) -> u64 {
    if n <= 2 {
        return 1;
    }
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let mut m = ((n as f64 / 1.618_033_988_749_895) as u64).max(1);
    while gcd(m, n) != 1 {
        m += 1; // terminates: n - 1 is coprime with n
    }
    m
}

/// The operation sequence: `ops` operations over `n` records.
pub fn plan(n: u64, ops: u64, alpha: f64, seed: u64, read_fraction: f64, hot_start: bool) -> Option<Vec<Op>> {
    let zipf = Zipf::new(n, alpha)?;
    let m = scatter_multiplier(n);
    let mut rng = SplitMix64::new(seed);
    Some(
        (0..ops)
            .map(|_| {
                let k = zipf.sample(&mut rng) - 1;
                let slot = if hot_start { k } else { ((u128::from(k) * u128::from(m)) % u128::from(n)) as u64 };
                Op { read: rng.next_f64() < read_fraction, slot }
            })
            .collect(),
    )
}

pub async fn run(a: ZipfArgs) -> Result<()> {
    let records = crate::parse_list(&a.record, crate::parse_bytes).context("--record wants sizes like 4K,64K")?;
    let size = crate::parse_bytes(&a.size).context("--size wants a size like 256M")?;
    if a.common.runs == 0 || a.ops == 0 || a.window == 0 || records.iter().any(|&r| r == 0 || r > 64 << 20) {
        bail!("--runs, --ops and --window must be at least 1, records between 1 byte and 64M");
    }
    if records.iter().any(|&r| r > size) {
        bail!("--size must hold at least one record");
    }
    if !(0.0..=1.0).contains(&a.read_fraction) {
        bail!("--read-fraction must be between 0 and 1");
    }
    if !a.alpha.is_finite() || a.alpha <= 0.0 {
        bail!("--alpha must be a positive number");
    }
    let fabrics = common::fabric_choices(&a.common.fabric)?;
    let doc = Document::start("zipf");
    let targets = Targets::new(&a.servers, a.common.cluster.as_deref(), a.common.dir.as_deref())?.tuned(&a.common)?;
    let mut results = Vec::new();
    let pb = common::progress((targets.points().len() * fabrics.len() * records.len()) as u64, "zipf");
    for sp in targets.points() {
        let mut target = targets.start(sp).await?;
        for &fabric in &fabrics {
            target.cfg.client.fabric = fabric;
            let client = Client::connect(&target.cfg).await?;
            for &record in &records {
                results.extend(measure(&client, target.servers, record, size, &a).await?);
                pb.inc(1);
            }
            client.close().await;
        }
        target.stop().await;
    }
    pb.finish_and_clear();
    targets.finish();

    let config = json!({
        "size_bytes": size,
        "ops": a.ops,
        "alpha": a.alpha,
        "seed": a.seed,
        "read_fraction": a.read_fraction,
        "window": a.window,
        "placement": if a.hot_start { "hot-start" } else { "scattered" },
        "runs": a.common.runs,
        "client_cpu_us_per_op": "of the whole mix (reads and writes share the process's CPU time)",
    });
    let doc = doc.finish(config, json!({}), results);
    common::emit(&doc, &crate::tables::zipf_table(&doc), a.common.json.as_deref(), crate::chart::zipf_svg)
}

async fn measure(
    client: &Client,
    servers: u32,
    record: u64,
    size: u64,
    a: &ZipfArgs,
) -> Result<Vec<serde_json::Value>> {
    let n = size / record;
    let path = format!("/bench-zipf-{}-s{servers}-r{record}", std::process::id());
    let ops = plan(n, a.ops, a.alpha, a.seed, a.read_fraction, a.hot_start).context("zipf parameters")?;
    let reads = ops.iter().filter(|o| o.read).count() as u64;
    let writes = a.ops - reads;
    let distinct = {
        let mut s: Vec<u64> = ops.iter().map(|o| o.slot).collect();
        s.sort_unstable();
        s.dedup();
        s.len()
    };
    // Rank 1 is slot 0 in both placements (0 · m mod n = 0).
    let hottest = ops.iter().filter(|o| o.slot == 0).count();
    eprintln!("servers {servers} record {record}: writing the {} MiB file", (n * record) >> 20);
    let src = pattern(record);
    fill(client, &path, record, n, &src).await?;
    let f = Arc::new(client.open(&path, OpenMode::ReadWrite).await?);
    if f.size() != n * record {
        bail!("{path}: size {} after writing {} bytes", f.size(), n * record);
    }
    // Pre-faulted destination buffers, one per operation in flight, reused.
    let mut bufs: Vec<BytesMut> = (0..a.window).map(|_| BytesMut::zeroed(record as usize)).collect();
    // Warm-up: the start of the sequence, every read checked.
    mixed(&f, &ops[..ops.len().min(512)], record, &src, &mut bufs, a.window, true).await?;
    let (mut r, mut w, mut mix) = (OpRuns::default(), OpRuns::default(), Vec::new());
    for _ in 0..a.common.runs {
        let load = crate::ceilings::load1();
        let (secs, cpu, mut rl, mut wl) = mixed(&f, &ops, record, &src, &mut bufs, a.window, false).await?;
        // CPU time cannot be split between reads and writes: each gets its share, i.e. the mix's CPU per op.
        let share = |k: u64| cpu * k as f64 / a.ops as f64;
        if reads > 0 {
            r.push(reads, reads * record, secs, share(reads), &mut rl)?;
        }
        if writes > 0 {
            w.push(writes, writes * record, secs, share(writes), &mut wl)?;
        }
        mix.push(a.ops as f64 / secs);
        r.push_load(load);
        w.push_load(load);
    }
    f.commit().await?;
    let (parent, name) = client.resolve_parent(&path).await?;
    client.unlink(parent.ino, name).await?;

    let mix = summarize(&mix).expect("runs >= 1");
    let fabric = common::fabric_used(client).await;
    let base = json!({
        "system": "weft",
        "fabric": fabric,
        "servers": servers,
        "clients": 1,
        "threads": 1,
        "window": a.window,
        "record_bytes": record,
        "file_bytes": n * record,
        "alpha": a.alpha,
        "seed": a.seed,
        "read_fraction": a.read_fraction,
        "distinct_records": distinct,
        "hottest_record_share": round3(hottest as f64 / a.ops as f64),
        "mix_ops_per_s": round1(mix.median),
        "mix_mib_per_s": round1(mix.median * record as f64 / (1u64 << 20) as f64),
    });
    let mut out = Vec::new();
    for (o, op, count) in [(&r, "read", reads), (&w, "rewrite", writes)] {
        if count > 0 {
            let res = o.result(&base, op, Headline::OpsPerS);
            eprintln!(
                "{fabric} servers {servers} record {record}: {op} {} ops/s, p50 {} µs, p99 {} µs",
                res["ops_per_s"], res["p50_us"], res["p99_us"]
            );
            out.push(res);
        }
    }
    Ok(out)
}

/// Writes the whole file, `n` records of `src`, in chunks of about 1 MiB with 8 in flight.
async fn fill(client: &Client, path: &str, record: u64, n: u64, src: &Bytes) -> Result<()> {
    let per_chunk = ((1u64 << 20) / record).max(1);
    let mut chunk = BytesMut::with_capacity((per_chunk * record) as usize);
    for _ in 0..per_chunk {
        chunk.extend_from_slice(src);
    }
    let chunk = chunk.freeze();
    let f = Arc::new(client.create_path(path, 0o644, false, true).await?);
    let mut tasks = JoinSet::new();
    let mut start = 0;
    while start < n {
        if tasks.len() >= 8 {
            tasks.join_next().await.expect("non-empty")??;
        }
        let len = per_chunk.min(n - start);
        let (f, data) = (f.clone(), chunk.slice(..(len * record) as usize));
        tasks.spawn(async move { f.write_at(start * record, data).await });
        start += len;
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    f.commit().await?;
    Ok(())
}

/// Result of one operation: read or not, latency µs, the read buffer to reuse.
type Done = (bool, f64, Option<BytesMut>);

/// Runs `ops` with `window` in flight; returns (secs, client CPU secs, read latencies µs, write latencies µs).
async fn mixed(
    f: &Arc<File>,
    ops: &[Op],
    record: u64,
    src: &Bytes,
    bufs: &mut Vec<BytesMut>,
    window: usize,
    check: bool,
) -> Result<(f64, f64, Vec<f64>, Vec<f64>)> {
    let (mut rl, mut wl) = (Vec::with_capacity(ops.len()), Vec::with_capacity(ops.len()));
    let mut done = |(read, us, buf): Done, bufs: &mut Vec<BytesMut>| -> Result<()> {
        if let Some(b) = buf {
            if b.len() as u64 != record {
                bail!("a read returned {} bytes, not {record}", b.len());
            }
            if check && b[..] != src[..] {
                bail!("a record read back differs from what was written");
            }
            bufs.push(b);
        }
        if read {
            rl.push(us)
        } else {
            wl.push(us)
        }
        Ok(())
    };
    let (t0, c0) = (Instant::now(), ceilings::cpu_seconds());
    if window == 1 {
        // One at a time, without a task per operation in the way.
        for op in ops {
            let t = Instant::now();
            let buf = if op.read {
                Some(f.read_at(op.slot * record, bufs.pop().expect("a buffer per window slot")).await?)
            } else {
                f.write_at(op.slot * record, src.clone()).await?;
                None
            };
            done((op.read, micros_since(t), buf), bufs)?;
        }
    } else {
        let mut tasks: JoinSet<Result<Done, weft_client::ClientError>> = JoinSet::new();
        for &op in ops {
            if tasks.len() >= window {
                done(tasks.join_next().await.expect("non-empty")??, bufs)?;
            }
            let f = f.clone();
            let (offset, data) = (op.slot * record, src.clone());
            // Fewer than `window` operations are in flight, so a buffer is free.
            let buf = if op.read { bufs.pop() } else { None };
            tasks.spawn(async move {
                let t = Instant::now();
                let buf = match buf {
                    Some(b) => Some(f.read_at(offset, b).await?),
                    None => {
                        f.write_at(offset, data).await?;
                        None
                    }
                };
                Ok((op.read, micros_since(t), buf))
            });
        }
        while let Some(r) = tasks.join_next().await {
            done(r??, bufs)?;
        }
    }
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c0);
    Ok((secs, cpu, rl, wl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_is_a_bijection() {
        for n in [1u64, 2, 3, 4, 10, 64, 100, 65_536, 99_991] {
            let m = scatter_multiplier(n);
            let mut seen = vec![false; n as usize];
            for k in 0..n {
                let s = ((u128::from(k) * u128::from(m)) % u128::from(n)) as usize;
                assert!(!seen[s], "n {n}: slot {s} twice");
                seen[s] = true;
            }
        }
    }

    #[test]
    fn plans_are_seeded_in_range_and_mixed() {
        let a = plan(65_536, 10_000, 0.9, 42, 0.8, false).unwrap();
        assert_eq!(a, plan(65_536, 10_000, 0.9, 42, 0.8, false).unwrap());
        assert_ne!(a, plan(65_536, 10_000, 0.9, 43, 0.8, false).unwrap());
        assert!(a.iter().all(|o| o.slot < 65_536));
        // 8,000 reads expected; the binomial standard deviation is 40.
        let reads = a.iter().filter(|o| o.read).count();
        assert!((7_500..8_500).contains(&reads), "{reads} reads");
        // Slot 0 (rank 1) is the most frequent.
        let mut counts = std::collections::HashMap::new();
        for o in &a {
            *counts.entry(o.slot).or_insert(0u32) += 1;
        }
        let top = counts.iter().max_by_key(|(_, c)| **c).map(|(s, _)| *s);
        assert_eq!(top, Some(0));
        assert!(plan(10, 1000, 0.9, 1, 1.0, true).unwrap().iter().all(|o| o.read && o.slot < 10));
        assert!(plan(10, 1000, 0.9, 1, 0.0, true).unwrap().iter().all(|o| !o.read));
        assert!(plan(0, 10, 0.9, 1, 0.5, false).is_none());
    }
}
