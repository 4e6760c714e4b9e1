//! `weft bench throughput`: sequential write, then sequential read, of one file per point through the native
//! client library, for each data-server count and record size; beside it, iperf3 loopback and memcpy from the
//! same run.
//!
//! Each record is one `File::write_at`/`read_at` call; `--window` records are kept in flight (a client that
//! issues one record at a time leaves all but one data server idle; the window is reported in the results).
//!
//! `--layout plain,ec4+2,mirror2` measures each layout on the same cluster in the same run (a file per layout, in
//! a directory given that layout; plain stays at the root, as before `--layout`), every result naming its
//! `layout` with `ratio_to_plain`. `--degraded` then stops one data server holding a chunk of each redundant file
//! and reads it again (`degraded-read`, with `ratio_to_healthy`, every record compared with what was written),
//! under a `rebuild_after_ms` long enough that no rebuild starts meanwhile (checked and reported).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use clap::Args;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use weft_client::{Client, ClusterConfig, OpenMode};

use crate::ceilings;
use crate::common::{self, Targets, round1, round3};
use crate::doc::Document;
use crate::layouts::LayoutChoice;
use crate::stats::summarize;
use crate::worker::Workers;

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
    /// Layouts to measure on each cluster, e.g. `plain,ec4+2,mirror2` (`ecK+M`, `mirrorN`); a redundant layout
    /// wider than a cluster's data servers is skipped there.
    #[arg(long, default_value = "plain")]
    pub layout: String,
    /// Stripe unit of the redundant layouts' directories (`weft setstripe`'s default: 1M).
    #[arg(long, default_value = "1M")]
    pub stripe_unit: String,
    /// After the healthy runs of each redundant layout, stop one data server holding a chunk of its file and read
    /// the file again `--runs` times (op `degraded-read`); the server is restarted afterwards.
    #[arg(long)]
    pub degraded: bool,
    /// Bytes of the file each degraded read reads, from its start (0: all of it); it keeps the degraded runs of a
    /// large --size within minutes while every request still meets the stopped server's chunks.
    #[arg(long, default_value = "512M")]
    pub degraded_size: String,
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
    layout: LayoutChoice,
    write_mib: Vec<f64>,
    write_cpu: Vec<f64>,
    read_mib: Vec<f64>,
    read_cpu: Vec<f64>,
    pub(crate) loads: common::Loads,
    /// The read with one server down (`--degraded`, redundant layouts only).
    degraded: Option<Degraded>,
}

/// The degraded reads of one point.
struct Degraded {
    /// The data server stopped (it held a chunk of the file: ec data chunk 0, or the mirror copy read first).
    stopped_server: u32,
    mib: Vec<f64>,
    cpu: Vec<f64>,
    loads: common::Loads,
    /// Layout changes the MDS made while the server was down (0: no rebuild started during the reads).
    layouts_changed: u64,
    /// Bytes compared with what was written (every record of every run).
    bytes_verified: u64,
}

/// The `rebuild_after_ms` of clusters started with `--degraded`: far longer than the degraded reads, so the MDS
/// never declares the stopped server failed and no rebuild competes with them for bandwidth.
const DEGRADED_REBUILD_AFTER_MS: u64 = 3_600_000;

pub async fn run(a: ThroughputArgs) -> Result<()> {
    let records = crate::parse_list(&a.record, crate::parse_bytes).context("--record wants sizes like 64K,1M")?;
    let size = crate::parse_bytes(&a.size).context("--size wants a size like 2G")?;
    if a.common.runs == 0 || a.window == 0 || records.iter().any(|&r| r == 0 || r > 64 << 20) {
        bail!("--runs and --window must be at least 1, records between 1 byte and 64M");
    }
    let fabrics = common::fabric_choices(&a.common.fabric)?;
    let layouts = LayoutChoice::parse_list(&a.layout)?;
    let stripe_unit = crate::parse_bytes(&a.stripe_unit)
        .and_then(|u| u32::try_from(u).ok())
        .filter(|u| *u > 0 && u % 4096 == 0)
        .context("--stripe-unit wants a multiple of 4K below 4G, like 1M")?;
    if a.degraded && a.common.cluster.is_some() {
        bail!("--degraded stops a data server: it needs clusters the bench starts (not --cluster)");
    }
    if a.degraded && a.procs > 0 {
        bail!("--degraded measures from this process (--procs 0)");
    }
    if crate::parse_bytes(&a.degraded_size).is_none() {
        bail!("--degraded-size wants a size like 512M (0: the whole file)");
    }
    if a.degraded && layouts.iter().all(|l| l.is_plain()) {
        bail!("--degraded needs a redundant layout (e.g. --layout plain,ec4+2): a plain file has no second copy");
    }
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
    let steps = targets.points().len() * records.len() * fabrics.len() * layouts.len();
    let pb = common::progress(steps as u64, "throughput");
    let mut skipped = Vec::new();
    for sp in targets.points() {
        let mut target = targets
            .start_with(sp, "", |o| {
                if a.degraded {
                    o.rebuild_after_ms = Some(DEGRADED_REBUILD_AFTER_MS);
                }
            })
            .await?;
        let n = target.servers;
        let auth = target.auth;
        for &fabric in &fabrics {
            let mut cfg = target.cfg.clone();
            cfg.client.fabric = fabric;
            let client = Client::connect(&cfg).await?;
            for &record in &records {
                for &layout in &layouts {
                    pb.inc(1);
                    if layout.width().is_some_and(|w| w > n) {
                        eprintln!("{}: wider than {n} data servers, skipped", layout.name());
                        skipped.push(json!({"layout": layout.name(), "servers": n}));
                        continue;
                    }
                    let dir = layout.prepare_dir(&client, stripe_unit).await?;
                    let p = if a.procs > 0 {
                        measure_aggregate(&cfg, n, record, size, &a, &dir).await?
                    } else {
                        let cluster = target.cluster_mut();
                        measure(&client, cluster, n, record, size, &a, &dir).await?
                    };
                    let p = Point { auth, layout, ..p };
                    eprintln!(
                        "{} auth {auth} servers {n} record {record} layout {}: write {:.0} MiB/s, read {:.0} MiB/s{}",
                        p.fabric,
                        layout.name(),
                        summarize(&p.write_mib).map(|s| s.median).unwrap_or(0.0),
                        summarize(&p.read_mib).map(|s| s.median).unwrap_or(0.0),
                        p.degraded.as_ref().map_or(String::new(), |d| format!(
                            ", degraded read {:.0} MiB/s (server {} stopped)",
                            summarize(&d.mib).map(|s| s.median).unwrap_or(0.0),
                            d.stopped_server
                        )),
                    );
                    points.push(p);
                }
            }
            client.close().await;
        }
        target.stop().await;
    }
    pb.finish_and_clear();
    targets.finish();

    let mut results = Vec::new();
    for p in &points {
        let degraded = p.degraded.as_ref().map(|d| ("degraded-read", &d.mib, &d.cpu));
        let healthy = [("write", &p.write_mib, &p.write_cpu), ("read", &p.read_mib, &p.read_cpu)];
        for (op, mib, cpu) in healthy.into_iter().chain(degraded) {
            let s = summarize(mib).expect("runs >= 1");
            let c = summarize(cpu).expect("runs >= 1");
            let lat = p.latency_us.filter(|_| op == "read");
            let mut r = json!({
                "system": "weft",
                "layout": p.layout.name(),
                "stripe_unit_bytes": (!p.layout.is_plain()).then_some(stripe_unit),
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
            match &p.degraded {
                Some(d) if op == "degraded-read" => {
                    d.loads.annotate(&mut r);
                    let healthy = summarize(&p.read_mib).expect("runs >= 1").median;
                    let o = r.as_object_mut().expect("a result is an object");
                    o.insert("servers_down".into(), json!(1));
                    o.insert("stopped_server".into(), json!(d.stopped_server));
                    o.insert("ratio_to_healthy".into(), json!(round3(s.median / healthy)));
                    o.insert("bytes_verified".into(), json!(d.bytes_verified));
                    o.insert("layouts_changed_during_read".into(), json!(d.layouts_changed));
                    o.insert("rebuild_during_read".into(), json!(d.layouts_changed > 0));
                }
                _ => p.loads.annotate(&mut r),
            }
            results.push(r);
        }
    }
    add_ratio_to_plain(&mut results);
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
        "layouts": layouts.iter().map(|l| l.name()).collect::<Vec<_>>(),
        "stripe_unit_bytes": stripe_unit,
        "layouts_skipped": skipped,
        "degraded": a.degraded,
        // The MDS never declared the stopped server failed within this (each degraded result says whether it
        // moved any layout, i.e. whether a rebuild ran beside the read).
        "rebuild_after_ms": a.degraded.then_some(DEGRADED_REBUILD_AFTER_MS),
        "degraded_size_bytes": a.degraded.then(|| match crate::parse_bytes(&a.degraded_size) {
            Some(0) | None => size,
            Some(b) => b.min(size),
        }),
        "degraded_method": a.degraded.then_some(
            "after a layout's healthy runs, the data server holding ec data chunk 0 (mirror: the copy read first) \
             is stopped (SIGTERM) under the same client; --runs sequential reads of the file's first \
             --degraded-size bytes, each record compared with what was written inside the timing; then the server \
             is restarted"
        ),
    });
    let doc = doc.finish(config, Value::Object(ceil), results);
    common::emit(&doc, &crate::tables::markdown_table(&doc), a.common.json.as_deref(), crate::chart::throughput_svg)
}

/// Adds `ratio_to_plain` to every result of a redundant layout whose plain twin (same servers, fabric, auth,
/// record, processes and op) was measured in this run.
fn add_ratio_to_plain(results: &mut [Value]) {
    let key = |r: &Value| {
        [&r["servers"], &r["fabric"], &r["auth"], &r["record_bytes"], &r["procs"], &r["op"]].map(Value::to_string)
    };
    let plain: Vec<_> = results
        .iter()
        .filter(|r| r["layout"] == "plain")
        .filter_map(|r| Some((key(r), r["mib_per_s"].as_f64()?)))
        .collect();
    for r in results.iter_mut() {
        let k = key(r);
        let ratio = plain
            .iter()
            .find(|(pk, _)| *pk == k)
            .and_then(|&(_, base)| Some(r["mib_per_s"].as_f64()? / base))
            .filter(|x| x.is_finite());
        r["ratio_to_plain"] = json!(ratio.map(round3));
    }
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
            layout: LayoutChoice::PLAIN,
            write_mib,
            write_cpu,
            read_mib,
            read_cpu,
            loads: common::Loads::default(),
            degraded: None,
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

async fn measure(
    client: &Client,
    cluster: Option<&mut weft_launch::LocalCluster>,
    servers: u32,
    record: u64,
    size: u64,
    a: &ThroughputArgs,
    dir: &str,
) -> Result<Point> {
    let path = format!("{dir}/bench-s{servers}-r{record}");
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
    if a.degraded && !dir.is_empty() {
        let cluster = cluster.context("--degraded needs a cluster the bench started")?;
        p.degraded = Some(degraded(client, cluster, &path, record, records, &src, &mut bufs, a).await?);
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

    let (r, rc) = read_pass(client, path, record, records, records, bufs, None).await?;
    Ok((w, wc, r, rc))
}

/// One sequential read pass of the first `records` records of the file of `file_records` records, with the
/// buffers `bufs` (one per record in flight); with `expect`, every record is compared with it (a mismatch fails
/// the pass, naming the offset). Returns (secs, cpu secs).
async fn read_pass(
    client: &Client,
    path: &str,
    record: u64,
    file_records: u64,
    records: u64,
    bufs: &mut Vec<BytesMut>,
    expect: Option<&Bytes>,
) -> Result<(f64, f64)> {
    let f = Arc::new(client.open(path, OpenMode::Read).await?);
    if f.size() != file_records * record {
        bail!("{path}: size {} after writing {} bytes", f.size(), file_records * record);
    }
    let check = |i: u64, b: &BytesMut| -> Result<()> {
        if let Some(want) = expect
            && b[..] != want[..]
        {
            let at = b.iter().zip(want.iter()).position(|(x, y)| x != y).unwrap_or(b.len().min(want.len()));
            bail!("{path}: wrong bytes read at offset {} (record {i})", i * record + at as u64);
        }
        Ok(())
    };
    let (t, c) = (Instant::now(), ceilings::cpu_seconds());
    let mut tasks: JoinSet<Result<(u64, BytesMut), weft_client::ClientError>> = JoinSet::new();
    for i in 0..records {
        let buf = match bufs.pop() {
            Some(b) => b,
            None => {
                let (j, mut b) = tasks.join_next().await.expect("window full")??;
                check(j, &b)?;
                b.resize(record as usize, 0);
                b
            }
        };
        let f = f.clone();
        tasks.spawn(async move { Ok((i, f.read_at(i * record, buf).await?)) });
    }
    while let Some(r) = tasks.join_next().await {
        let (j, mut b) = r??;
        check(j, &b)?;
        b.resize(record as usize, 0);
        bufs.push(b);
    }
    Ok((t.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c))
}

/// The degraded reads of the file at `path` (written by the last healthy run, every record `src`): stops the data
/// server holding its first data chunk (ec) or the copy a reader tries first (mirror), reads the file `--runs`
/// times comparing every record, checks whether the MDS moved any layout meanwhile, and restarts the server.
#[allow(clippy::too_many_arguments)]
async fn degraded(
    client: &Client,
    cluster: &mut weft_launch::LocalCluster,
    path: &str,
    record: u64,
    records: u64,
    src: &Bytes,
    bufs: &mut Vec<BytesMut>,
    a: &ThroughputArgs,
) -> Result<Degraded> {
    let f = client.open(path, OpenMode::Read).await?;
    let layout = f.layout().clone();
    let first = match layout.redundancy {
        // A mirror read starts at copy `ino % n` (docs/format.md §16): stop that one, so every read meets it.
        weft_proto::DataRedundancy::Mirror { n } => (f.ino() % u64::from(n.max(1))) as usize,
        _ => 0,
    };
    drop(f);
    let victim = *layout.servers.get(first).context("a redundant file names its servers")?;
    let changed_before = client.member_status().await?.layouts_changed;
    eprintln!("stopping data server {victim} (slot {first} of {path}) for the degraded read");
    cluster.stop_data_server(victim).await;
    let mut d = Degraded {
        stopped_server: victim,
        mib: vec![],
        cpu: vec![],
        loads: common::Loads::default(),
        layouts_changed: 0,
        bytes_verified: 0,
    };
    // The first --degraded-size bytes (all of them with 0).
    let read = match crate::parse_bytes(&a.degraded_size) {
        Some(0) | None => records,
        Some(b) => b.div_ceil(record).clamp(1, records),
    };
    let result = async {
        for _ in 0..a.common.runs {
            d.loads.start();
            let (secs, cpu) = read_pass(client, path, record, records, read, bufs, Some(src)).await?;
            d.loads.end();
            let gib = (read * record) as f64 / (1u64 << 30) as f64;
            d.mib.push(gib * 1024.0 / secs);
            d.cpu.push(cpu / gib);
            d.bytes_verified += read * record;
        }
        anyhow::Ok(())
    }
    .await;
    d.layouts_changed = client.member_status().await?.layouts_changed.saturating_sub(changed_before);
    cluster.restart_data_server(victim).await.with_context(|| format!("restarting data server {victim}"))?;
    result?;
    Ok(d)
}

/// Aggregate mode (`--procs N`): N client processes (`weft bench worker`), each writing then reading its own file
/// of `--size`, released together; the aggregate rate is all bytes over the time from the release to the last
/// process's end, the CPU that of the workers (their own getrusage over each phase).
async fn measure_aggregate(
    cfg: &ClusterConfig,
    servers: u32,
    record: u64,
    size: u64,
    a: &ThroughputArgs,
    dir: &str,
) -> Result<Point> {
    let n = a.procs;
    // In `dir` (a layout's directory, "" for the root): the files inherit its layout.
    let file = |rank: usize| format!("{dir}/bench-agg-{}-s{servers}-r{record}-p{rank}", std::process::id());
    let phase = |op: &str, rank: usize, bytes: u64| {
        json!({"op": op, "path": file(rank), "offset": 0, "bytes": bytes, "record": record, "window": a.window,
            "fsync": a.fsync, "create": true})
    };
    // Warm-up (a small write and read), then write and read per run.
    let phases: Vec<_> = (0..n)
        .map(|rank| {
            let warm = size.min(16 * record);
            let mut v = vec![phase("write", rank, warm), phase("read", rank, warm)];
            for _ in 0..a.common.runs {
                v.push(phase("write", rank, size));
                v.push(phase("read", rank, size));
            }
            v
        })
        .collect();
    let mut w = Workers::spawn(cfg, phases).await?;
    w.phase().await?;
    w.phase().await?;
    let mut p = Point::new(servers, record);
    let mut fabrics = Vec::new();
    for _ in 0..a.common.runs {
        p.loads.start();
        let wr = w.phase().await?;
        let rd = w.phase().await?;
        p.loads.end();
        fabrics.extend([wr.fabric(), rd.fabric()]);
        if wr.bytes() != rd.bytes() || wr.bytes() != size * n as u64 {
            anyhow::bail!(
                "the processes wrote {} and read {} bytes, {} expected",
                wr.bytes(),
                rd.bytes(),
                size * n as u64
            );
        }
        let gib = wr.bytes() as f64 / (1u64 << 30) as f64;
        p.push(gib, (wr.secs, wr.cpu_s(), rd.secs, rd.cpu_s()));
    }
    w.finish().await?;
    p.fabric = crate::common::merge_fabrics(fabrics.iter().map(String::as_str));
    let client = Client::connect(cfg).await?;
    for rank in 0..n {
        let path = file(rank);
        let (parent, name) = client.resolve_parent(&path).await?;
        client.unlink(parent.ino, name).await?;
    }
    client.close().await;
    Ok(p)
}
