//! `weft bench throughput`: sequential write, then sequential read, of one file per point through the native
//! client library, for each data-server count and record size; beside it, iperf3 loopback and memcpy from the
//! same run.
//!
//! Each record is one `File::write_at`/`read_at` call; `--window` records are kept in flight (a client that
//! issues one record at a time leaves all but one data server idle; the window is reported in the results).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use clap::Args;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use weft_client::{Client, OpenMode};

use crate::ceilings;
use crate::common::{self, Targets, round1, round3};
use crate::doc::Document;
use crate::stats::summarize;

#[derive(Args, Clone, Debug)]
pub struct ThroughputArgs {
    /// Data-server counts to measure, e.g. `1,2,4` (ignored with --cluster).
    #[arg(long, default_value = "1,2,4")]
    pub servers: String,
    /// Record sizes, e.g. `64K,1M`.
    #[arg(long, default_value = "1M")]
    pub record: String,
    /// Bytes written then read per run.
    #[arg(long, default_value = "2G")]
    pub size: String,
    /// Records in flight at once.
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// Seconds per iperf3 measurement.
    #[arg(long, default_value_t = 3)]
    pub iperf_seconds: u32,
    /// Skip the iperf3 ceiling (e.g. where iperf3 is not installed).
    #[arg(long)]
    pub no_iperf: bool,
    /// Include an fsync of every object in the write time (IOzone's -e); without it a write pass ends with the
    /// commit that makes it visible to the next open, and the data may still be in the servers' page cache.
    #[arg(long)]
    pub fsync: bool,
    /// Aggregate mode: this many client processes (`weft bench worker`), each writing then reading its own file
    /// of --size; 0 measures from this process, as one client.
    #[arg(long, default_value_t = 0)]
    pub procs: usize,
    #[command(flatten)]
    pub common: common::SharedArgs,
}

pub(crate) struct Point {
    /// The fabric the client actually used (see [`common::fabric_used`]).
    pub(crate) fabric: String,
    /// The cluster's security mode (`--auth`).
    auth: &'static str,
    /// 4 KiB reads one at a time (record 4K only): (p50, p99) µs.
    latency_us: Option<(f64, f64)>,
    servers: u32,
    record: u64,
    write_mib: Vec<f64>,
    write_cpu: Vec<f64>,
    read_mib: Vec<f64>,
    read_cpu: Vec<f64>,
    pub(crate) loads: common::Loads,
}

pub async fn run(a: ThroughputArgs) -> Result<()> {
    let records = crate::parse_list(&a.record, crate::parse_bytes).context("--record wants sizes like 64K,1M")?;
    let size = crate::parse_bytes(&a.size).context("--size wants a size like 2G")?;
    if a.common.runs == 0 || a.window == 0 || records.iter().any(|&r| r == 0 || r > 64 << 20) {
        bail!("--runs and --window must be at least 1, records between 1 byte and 64M");
    }
    let fabrics = common::fabric_choices(&a.common.fabric)?;
    let doc = Document::start("throughput");
    eprintln!("measuring ceilings (memcpy, process_vm_readv, iperf3 loopback)...");
    let memcpy = ceilings::memcpy_mib_per_s(256 << 20);
    let vm_readv = ceilings::process_vm_readv_mib_per_s(1 << 20, 4 << 30)?;
    let mut iperf = Vec::new();
    if !a.no_iperf {
        for _ in 0..a.common.runs {
            iperf.push(ceilings::iperf3_mib_per_s(a.iperf_seconds).await?);
        }
    }
    let iperf_median = summarize(&iperf).map(|s| s.median);

    let mut points = Vec::new();
    let targets = Targets::new(&a.servers, a.common.cluster.as_deref(), a.common.dir.as_deref())?.tuned(&a.common)?;
    let pb = common::progress((targets.points().len() * records.len() * fabrics.len()) as u64, "throughput");
    for sp in targets.points() {
        let target = targets.start(sp).await?;
        let n = target.servers;
        let auth = target.auth;
        for &fabric in &fabrics {
            let mut cfg = target.cfg.clone();
            cfg.client.fabric = fabric;
            let client = Client::connect(&cfg).await?;
            for &record in &records {
                let p = if a.procs > 0 {
                    crate::aggregate::measure(&cfg, n, record, size, &a).await?
                } else {
                    measure(&client, n, record, size, &a).await?
                };
                let p = Point { auth, ..p };
                eprintln!(
                    "{} auth {auth} servers {n} record {record}: write {:.0} MiB/s, read {:.0} MiB/s",
                    p.fabric,
                    summarize(&p.write_mib).map(|s| s.median).unwrap_or(0.0),
                    summarize(&p.read_mib).map(|s| s.median).unwrap_or(0.0)
                );
                points.push(p);
                pb.inc(1);
            }
            client.close().await;
        }
        target.stop().await;
    }
    pb.finish_and_clear();
    targets.finish();

    let mut results = Vec::new();
    for p in &points {
        for (op, mib, cpu) in [("write", &p.write_mib, &p.write_cpu), ("read", &p.read_mib, &p.read_cpu)] {
            let s = summarize(mib).expect("runs >= 1");
            let c = summarize(cpu).expect("runs >= 1");
            let lat = p.latency_us.filter(|_| op == "read");
            let mut r = json!({
                "system": "weft",
                "fabric": p.fabric,
                "auth": p.auth,
                "read_4k_latency_p50_us": lat.map(|l| round1(l.0)),
                "read_4k_latency_p99_us": lat.map(|l| round1(l.1)),
                "servers": p.servers,
                "clients": a.procs.max(1),
                "procs": a.procs,
                "threads": 1,
                "window": a.window,
                "record_bytes": p.record,
                "op": op,
                "mib_per_s": round1(s.median),
                "client_cpu_s_per_gib": round3(c.median),
                "runs": s.runs,
                "min": round1(s.min),
                "max": round1(s.max),
                "ratio_to_iperf3": iperf_median.map(|i| round3(s.median / i)),
            });
            p.loads.annotate(&mut r);
            results.push(r);
        }
    }
    let mut ceil = serde_json::Map::new();
    ceil.insert("memcpy_mib_per_s".into(), json!(round1(memcpy)));
    ceil.insert("process_vm_readv_1m_mib_per_s".into(), json!(round1(vm_readv)));
    if let Some(s) = summarize(&iperf) {
        ceil.insert("iperf3_mib_per_s".into(), json!(round1(s.median)));
        ceil.insert("iperf3_min".into(), json!(round1(s.min)));
        ceil.insert("iperf3_max".into(), json!(round1(s.max)));
    }
    let config = json!({
        "size_bytes": size,
        "window": a.window,
        "fsync": a.fsync,
        "procs": a.procs,
        "runs": a.common.runs,
    });
    let doc = doc.finish(config, Value::Object(ceil), results);
    common::emit(&doc, &crate::report::markdown_table(&doc), a.common.json.as_deref(), crate::chart::throughput_svg)
}

impl Point {
    pub(crate) fn new(servers: u32, record: u64) -> Point {
        let (write_mib, write_cpu, read_mib, read_cpu) = (vec![], vec![], vec![], vec![]);
        Point {
            fabric: String::new(),
            auth: "key",
            latency_us: None,
            servers,
            record,
            write_mib,
            write_cpu,
            read_mib,
            read_cpu,
            loads: common::Loads::default(),
        }
    }

    /// One run that moved `gib` each way: (write secs, write CPU secs, read secs, read CPU secs).
    pub(crate) fn push(&mut self, gib: f64, (w, wc, r, rc): (f64, f64, f64, f64)) {
        self.write_mib.push(gib * 1024.0 / w);
        self.write_cpu.push(wc / gib);
        self.read_mib.push(gib * 1024.0 / r);
        self.read_cpu.push(rc / gib);
    }
}

async fn measure(client: &Client, servers: u32, record: u64, size: u64, a: &ThroughputArgs) -> Result<Point> {
    let path = format!("/bench-s{servers}-r{record}");
    let records = size.div_ceil(record).max(1);
    // Pre-faulted source record, shared by every write (Bytes clones share the buffer).
    let src = Bytes::from((0..record).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    // Pre-faulted destination buffers, one per record in flight, reused across runs.
    let mut bufs: Vec<BytesMut> = (0..a.window).map(|_| BytesMut::zeroed(record as usize)).collect();
    let mut p = Point::new(servers, record);
    // Warm-up: one pass of a small file brings up sessions and connections.
    sequential(client, &path, record, records.min(16), &src, &mut bufs, a).await?;
    for _ in 0..a.common.runs {
        p.loads.start();
        let (w, wc, r, rc) = sequential(client, &path, record, records, &src, &mut bufs, a).await?;
        p.loads.end();
        p.push((records * record) as f64 / (1u64 << 30) as f64, (w, wc, r, rc));
    }
    if record == 4096 {
        // One read at a time: the latency of a small read, not the pipeline's throughput.
        let f = client.open(&path, OpenMode::Read).await?;
        let mut lat = Vec::new();
        let mut buf = BytesMut::zeroed(4096);
        for i in 0..2000u64 {
            let t = Instant::now();
            buf = f.read_at((i % records) * 4096, buf).await?;
            lat.push(t.elapsed().as_secs_f64() * 1e6);
            buf.resize(4096, 0);
        }
        lat.sort_by(f64::total_cmp);
        p.latency_us = Some((lat[lat.len() / 2], lat[lat.len() * 99 / 100]));
    }
    let (parent, name) = client.resolve_parent(&path).await?;
    client.unlink(parent.ino, name).await?;
    p.fabric = common::fabric_used(client).await;
    Ok(p)
}

/// One write pass and one read pass; returns (write secs, write cpu secs, read secs, read cpu secs).
async fn sequential(
    client: &Client,
    path: &str,
    record: u64,
    records: u64,
    src: &Bytes,
    bufs: &mut Vec<BytesMut>,
    a: &ThroughputArgs,
) -> Result<(f64, f64, f64, f64)> {
    let (window, fsync) = (a.window, a.fsync);
    let f = Arc::new(client.create_path(path, 0o644, false, true).await?);
    let (t, c) = (Instant::now(), ceilings::cpu_seconds());
    let mut tasks = JoinSet::new();
    for i in 0..records {
        if tasks.len() >= window {
            tasks.join_next().await.expect("non-empty")??;
        }
        let f = f.clone();
        let data = src.clone();
        tasks.spawn(async move { f.write_at(i * record, data).await });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    if fsync {
        f.sync().await?;
    } else {
        f.commit().await?;
    }
    let (w, wc) = (t.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c);

    let f = Arc::new(client.open(path, OpenMode::Read).await?);
    if f.size() != records * record {
        bail!("{path}: size {} after writing {} bytes", f.size(), records * record);
    }
    let (t, c) = (Instant::now(), ceilings::cpu_seconds());
    let mut tasks: JoinSet<Result<BytesMut, weft_client::ClientError>> = JoinSet::new();
    for i in 0..records {
        let buf = match bufs.pop() {
            Some(b) => b,
            None => {
                let mut b = tasks.join_next().await.expect("window full")??;
                b.resize(record as usize, 0);
                b
            }
        };
        let f = f.clone();
        tasks.spawn(async move { f.read_at(i * record, buf).await });
    }
    while let Some(r) = tasks.join_next().await {
        let mut b = r??;
        b.resize(record as usize, 0);
        bufs.push(b);
    }
    let (r, rc) = (t.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c);
    Ok((w, wc, r, rc))
}
