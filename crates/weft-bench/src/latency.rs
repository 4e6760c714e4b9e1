//! `weft bench latency`: the latency of single calls through the native client library, one at a time.
//!
//! Per point (data servers × record size) and per run: `--count` calls of `File::write_at`, each one record at
//! the next offset of a fresh (truncated) file, then a commit and an open, then `--count` calls of
//! `File::read_at` of those records, in order. Nothing else is in flight, so each call's time is its latency:
//! reported are the mean, p50 and p99 (nearest rank) of each run, as medians over the runs (the min and max are
//! those of p50), and ops/s and client CPU per call over the whole pass.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use clap::Args;
use serde_json::json;
use weft_client::{Client, OpenMode};

use crate::ceilings;
use crate::common::{self, Headline, OpRuns, Targets, micros_since};
use crate::doc::Document;

#[derive(Args, Clone, Debug)]
pub struct LatencyArgs {
    /// Data-server counts to measure, e.g. `1,4` (ignored with --cluster).
    #[arg(long, default_value = "4")]
    pub servers: String,
    /// Record sizes: one call moves one record, e.g. `1,16,256,4K,16K,64K`.
    #[arg(long, default_value = "1,16,256,4K,16K,64K")]
    pub record: String,
    /// Calls per op and run (writes, then as many reads).
    #[arg(long, default_value_t = 1024)]
    pub count: u64,
    #[command(flatten)]
    pub common: common::SharedArgs,
}

pub async fn run(a: LatencyArgs) -> Result<()> {
    let records = crate::parse_list(&a.record, crate::parse_bytes).context("--record wants sizes like 1,4K,64K")?;
    if a.common.runs == 0 || a.count == 0 || records.iter().any(|&r| r == 0 || r > 64 << 20) {
        bail!("--runs and --count must be at least 1, records between 1 byte and 64M");
    }
    let fabrics = common::fabric_choices(&a.common.fabric)?;
    let doc = Document::start("latency");
    let targets = Targets::new(&a.servers, a.common.cluster.as_deref(), a.common.dir.as_deref())?.tuned(&a.common)?;
    let mut results = Vec::new();
    let pb = common::progress((targets.points().len() * fabrics.len() * records.len()) as u64, "latency");
    for sp in targets.points() {
        let mut target = targets.start(sp).await?;
        let n = target.servers;
        let auth = target.auth;
        for &fabric in &fabrics {
            target.cfg.client.fabric = fabric;
            let client = Client::connect(&target.cfg).await?;
            for &record in &records {
                let [w, r] = measure(&client, n, record, &a).await?;
                let fabric = common::fabric_used(&client).await;
                let base = json!({
                    "system": "weft",
                    "fabric": fabric,
                    "auth": auth,
                    "servers": n,
                    "clients": 1,
                    "threads": 1,
                    "window": 1,
                    "record_bytes": record,
                });
                for (o, op) in [(w, "write"), (r, "read")] {
                    let res = o.result(&base, op, Headline::P50);
                    eprintln!(
                        "{fabric} auth {auth} servers {n} record {record}: {op} p50 {} µs, p99 {} µs",
                        res["p50_us"], res["p99_us"]
                    );
                    results.push(res);
                }
                pb.inc(1);
            }
            client.close().await;
        }
        target.stop().await;
    }
    pb.finish_and_clear();
    targets.finish();

    let config = json!({
        "count": a.count,
        "runs": a.common.runs,
        "percentiles": "nearest rank, per run; medians over the runs",
    });
    let doc = doc.finish(config, json!({}), results);
    common::emit(&doc, &crate::tables::latency_table(&doc), a.common.json.as_deref(), crate::chart::latency_svg)
}

/// The record every call writes, and every read must return.
pub(crate) fn pattern(record: u64) -> Bytes {
    Bytes::from((0..record).map(|i| (i % 251) as u8 ^ 0x5a).collect::<Vec<u8>>())
}

async fn measure(client: &Client, servers: u32, record: u64, a: &LatencyArgs) -> Result<[OpRuns; 2]> {
    let path = format!("/bench-latency-{}-s{servers}-r{record}", std::process::id());
    // Pre-faulted: the source record (shared by every write) and the one destination buffer, reused.
    let src = pattern(record);
    let mut buf = BytesMut::zeroed(record as usize);
    // Warm-up: a short pass, every read checked.
    pass(client, &path, record, a.count.min(64), &src, &mut buf, true).await?;
    let (mut w, mut r) = (OpRuns::default(), OpRuns::default());
    for _ in 0..a.common.runs {
        let load = crate::ceilings::load1();
        let (mut wl, ws, wc, mut rl, rs, rc) = pass(client, &path, record, a.count, &src, &mut buf, false).await?;
        w.push(a.count, a.count * record, ws, wc, &mut wl)?;
        r.push(a.count, a.count * record, rs, rc, &mut rl)?;
        w.push_load(load);
        r.push_load(load);
    }
    let (parent, name) = client.resolve_parent(&path).await?;
    client.unlink(parent.ino, name).await?;
    Ok([w, r])
}

type Pass = (Vec<f64>, f64, f64, Vec<f64>, f64, f64);

/// `count` writes, then `count` reads, one call at a time; returns (write latencies µs, write secs, write CPU
/// secs, read latencies µs, read secs, read CPU secs). With `check`, every read is compared with what was written
/// (outside the timed calls).
async fn pass(
    client: &Client,
    path: &str,
    record: u64,
    count: u64,
    src: &Bytes,
    buf: &mut BytesMut,
    check: bool,
) -> Result<Pass> {
    let f = client.create_path(path, 0o644, false, true).await?;
    let mut wl = Vec::with_capacity(count as usize);
    let (t0, c0) = (Instant::now(), ceilings::cpu_seconds());
    for i in 0..count {
        let t = Instant::now();
        f.write_at(i * record, src.clone()).await?;
        wl.push(micros_since(t));
    }
    let (ws, wc) = (t0.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c0);
    f.close().await?;

    let f = client.open(path, OpenMode::Read).await?;
    if f.size() != count * record {
        bail!("{path}: size {} after writing {} bytes", f.size(), count * record);
    }
    let mut rl = Vec::with_capacity(count as usize);
    let mut b = std::mem::take(buf);
    let (t0, c0) = (Instant::now(), ceilings::cpu_seconds());
    for i in 0..count {
        let t = Instant::now();
        b = f.read_at(i * record, b).await?;
        rl.push(micros_since(t));
        if b.len() as u64 != record {
            bail!("{path}: read of record {i} returned {} bytes, not {record}", b.len());
        }
        if check && b[..] != src[..] {
            bail!("{path}: record {i} read back differs from what was written");
        }
    }
    let (rs, rc) = (t0.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c0);
    *buf = b;
    Ok((wl, ws, wc, rl, rs, rc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_the_record_size() {
        assert_eq!(pattern(1).len(), 1);
        assert_eq!(pattern(4096).len(), 4096);
        assert_ne!(pattern(300)[0], pattern(300)[251 - 1]);
    }
}
