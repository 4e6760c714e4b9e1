//! `weft bench cache`: the cache bank's experiments (issue 16; IMCa, seed 001, and chapter 7 of seed 000), with
//! `--cache 0,1,2,4` memcached daemons and `--block 256,2K,8K` bank block sizes in one run, one fresh cluster per
//! (daemons, block) point (daemons 0, the baseline, once: without a bank the block size means nothing).
//!
//! Workloads (`--workload`), each with a warm-up run then `--runs` runs, medians reported:
//! - `storm`: IMCa's stat storm. `--procs` client processes (`weft bench worker`) each stat the same `--files`
//!   files; the headline is the time of the slowest process (`slowest_s`). With `--fuse` also through a Weft FUSE
//!   mount of the same cluster (kernel attribute and entry caching off, so every stat reaches the client).
//! - `latency`: single reads of each `--record` size at seeded random offsets of one `--size` file, one call at a
//!   time on a current-thread runtime, after sequential passes over the file that warm the bank (until one finds
//!   every block); p50/p99 per size. Every read is checked against the bytes written.
//! - `shared`: `--procs` processes each read the same `--size` file sequentially (`--shared-record`), released
//!   together; aggregate MiB/s and client CPU s/GiB.
//! - `iozone`: one process reads the file sequentially by each `--iozone-record` size; MiB/s, CPU s/GiB.
//!
//! Every bank point measures its modes (`--unused`, the bank, `--miss`) interleaved: each run of a workload runs
//! every mode in turn, so the drift of a shared machine falls on them alike.
//!
//! `--unused` measures every bank point with clients that do not use the bank (no `[cache]` in their config) as
//! well: a baseline on the same cluster at the same time, steadier than the no-bank cluster measured minutes
//! earlier (`ratio_to_unused`, `speedup_vs_unused`).
//!
//! `--miss` measures every bank point a second time with every bank lookup missing: each client of a run gets
//! its own fresh key namespace (the bank's `namespace`, which every key carries), so the servers still fill the
//! bank under the cluster's namespace and the clients pay the lookups but never find anything (the "no workload
//! slower by more than 10 % when every lookup misses" target).
//!
//! GlusterFS (the papers' baseline; a 2-brick volume on loopback, FUSE-mounted with attribute and entry caching
//! off) runs `storm`, `shared` and `iozone` in the same run unless `--no-glusterfs`; without glusterd it is
//! skipped with a note in `config.glusterfs`. Every result carries `ratio_to_cache0` (its headline over the same
//! workload's without a bank) and `speedup_vs_cache0` (how many times faster: > 1 is better); `targets` checks the
//! issue's three targets.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use clap::Args;
use serde_json::{Value, json};
use weft_client::{Client, ClusterConfig, FabricChoice, OpenMode};

use crate::ceilings;
use crate::common::{self, Headline, Loads, OpRuns, Target, Targets, micros_since, round3};
use crate::doc::Document;
use crate::rng::SplitMix64;
use crate::stats::summarize;
use crate::worker::{PhaseResult, Workers};

#[derive(Args, Clone, Debug)]
#[command(after_help = "Example (the issue's parameters, `make bench-cache`): weft bench cache --cache 0,1,2,4 \
    --block 256,2K,8K --procs 8 --miss --json docs/bench/cache.json")]
pub struct CacheArgs {
    /// Data servers of every cluster.
    #[arg(long, default_value_t = 2)]
    pub servers: u32,
    /// memcached daemons of the bank, one cluster per value; 0 is no bank, the baseline of every ratio.
    #[arg(long, default_value = "0,1,2,4")]
    pub cache: String,
    /// The bank's data block sizes (`block_bytes` of `[cache]`), one cluster per value and daemon count above 0.
    #[arg(long, default_value = "256,2K,8K")]
    pub block: String,
    /// Memory of each memcached daemon, MiB.
    #[arg(long, default_value_t = 64)]
    pub cache_mib: u32,
    /// Workloads to run, of `storm,latency,shared,iozone`.
    #[arg(long, default_value = "storm,latency,shared,iozone")]
    pub workload: String,
    /// Client processes of the stat storm and of the shared-file reads.
    #[arg(long, default_value_t = 8)]
    pub procs: usize,
    /// Files every process of the stat storm stats.
    #[arg(long, default_value_t = 1000)]
    pub files: u64,
    /// Record sizes of the read-latency workload.
    #[arg(long, default_value = "1,16,256,1K,4K,16K,64K")]
    pub record: String,
    /// Single reads per record size and run of the read-latency workload.
    #[arg(long, default_value_t = 256)]
    pub count: u64,
    /// Size of the file the latency, shared and iozone workloads read.
    #[arg(long, default_value = "4M")]
    pub size: String,
    /// Record of the shared-file reads.
    #[arg(long, default_value = "64K")]
    pub shared_record: String,
    /// Record sizes of the IOzone-style sequential read.
    #[arg(long, default_value = "4K,64K,1M")]
    pub iozone_record: String,
    /// Seed of the read-latency workload's offsets (the same offsets at every point).
    #[arg(long, default_value_t = 16)]
    pub seed: u64,
    /// Also measure every bank point with every bank lookup missing (each client in a fresh key namespace).
    #[arg(long)]
    pub miss: bool,
    /// Also measure every bank point with clients that do not use the bank (no `[cache]` in their config; the
    /// servers still fill it): a baseline on the same cluster, interleaved run by run with the other modes.
    #[arg(long)]
    pub unused: bool,
    /// Also run the stat storm through a Weft FUSE mount of each cluster (not in --miss mode).
    #[arg(long)]
    pub fuse: bool,
    /// Leave GlusterFS out.
    #[arg(long)]
    pub no_glusterfs: bool,
    #[command(flatten)]
    pub common: common::SharedArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Storm,
    Latency,
    Shared,
    Iozone,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Storm => "storm",
            Workload::Latency => "latency",
            Workload::Shared => "shared",
            Workload::Iozone => "iozone",
        }
    }

    fn parse(s: &str) -> Option<Workload> {
        [Workload::Storm, Workload::Latency, Workload::Shared, Workload::Iozone].into_iter().find(|w| w.name() == s)
    }

    /// The figure a result is judged by, and whether lower is better.
    fn headline(self) -> (&'static str, bool) {
        match self {
            Workload::Storm => ("slowest_s", true),
            Workload::Latency => ("p50_us", true),
            Workload::Shared | Workload::Iozone => ("mib_per_s", false),
        }
    }
}

/// How a point's clients use the bank: none there (`off`), there but not used by the clients (`unused`: their
/// config has no `[cache]`), as configured (`hit`), or every lookup missing (`miss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bank {
    Off,
    Unused,
    Hit,
    Miss,
}

impl Bank {
    fn name(self) -> &'static str {
        match self {
            Bank::Off => "off",
            Bank::Unused => "unused",
            Bank::Hit => "hit",
            Bank::Miss => "miss",
        }
    }
}

/// Parsed arguments.
struct Plan {
    workloads: Vec<Workload>,
    size: u64,
    records: Vec<u64>,
    shared_record: u64,
    iozone_records: Vec<u64>,
    fabric: FabricChoice,
}

/// Where the workloads' files live, in Weft and on a mount.
const STORM_DIR: &str = "storm";
const DATA_FILE: &str = "data";
/// Mount options that make the kernel ask the file system for every stat (no attribute or entry caching).
const WEFT_FUSE_ARGS: [&str; 4] = ["--attr-timeout-ms", "0", "--entry-timeout-ms", "0"];
const GLUSTER_FUSE_OPTIONS: &str = "attribute-timeout=0,entry-timeout=0,negative-timeout=0";

/// The byte at `offset` of the data file: position-dependent, so a read at any offset can be checked.
fn byte_at(offset: u64) -> u8 {
    ((offset % 251) as u8) ^ ((offset >> 9) as u8)
}

fn expected(offset: u64, len: usize) -> Vec<u8> {
    (offset..offset + len as u64).map(byte_at).collect()
}

/// A fresh key namespace for one client of a `--miss` run: never the cluster's, never one handed out before in
/// this process, below 2^63 as the config wants.
fn miss_config(cfg: &ClusterConfig) -> ClusterConfig {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut cfg = cfg.clone();
    if let Some(c) = cfg.cache.as_mut() {
        c.namespace = (c.namespace ^ NEXT.fetch_add(1, Ordering::Relaxed)) & (i64::MAX as u64);
    }
    cfg
}

/// The config of one client of one run: the cluster's; with `Bank::Miss` a fresh namespace each call; with
/// `Bank::Unused` no bank.
fn client_config(cfg: &ClusterConfig, bank: Bank) -> ClusterConfig {
    match bank {
        Bank::Miss => miss_config(cfg),
        Bank::Unused => ClusterConfig { cache: None, ..cfg.clone() },
        Bank::Off | Bank::Hit => cfg.clone(),
    }
}

pub async fn run(a: CacheArgs) -> Result<()> {
    let caches: Vec<u32> =
        crate::parse_list(&a.cache, |x| x.parse().ok()).context("--cache wants a list like 0,1,2,4")?;
    let blocks: Vec<u64> =
        crate::parse_list(&a.block, crate::parse_bytes).context("--block wants sizes like 256,2K,8K")?;
    let workloads: Vec<Workload> = crate::parse_list(&a.workload, Workload::parse)
        .context("--workload wants a list of storm,latency,shared,iozone")?;
    let records = crate::parse_list(&a.record, crate::parse_bytes).context("--record wants sizes like 1,4K,64K")?;
    let iozone_records =
        crate::parse_list(&a.iozone_record, crate::parse_bytes).context("--iozone-record wants sizes like 4K,1M")?;
    let size = crate::parse_bytes(&a.size).context("--size wants a size like 4M")?;
    let shared_record = crate::parse_bytes(&a.shared_record).context("--shared-record wants a size like 64K")?;
    let fabrics = common::fabric_choices(&a.common.fabric)?;
    if a.common.cluster.is_some() {
        bail!("weft bench cache starts its own clusters (each with its bank); --cluster is not for it");
    }
    if fabrics.len() != 1 {
        bail!("weft bench cache measures one --fabric at a time");
    }
    if a.common.runs == 0 || a.procs == 0 || a.files == 0 || a.count == 0 || size == 0 {
        bail!("--runs, --procs, --files, --count and --size must be at least 1");
    }
    if workloads.is_empty() || caches.is_empty() {
        bail!("--workload and --cache need at least one value each");
    }
    if blocks.iter().any(|&b| b == 0 || b > weft_cache::value::PAYLOAD_BYTES_MAX as u64) {
        bail!("--block sizes must be between 1 byte and memcached's item limit");
    }
    if records.iter().chain(&iozone_records).chain([&shared_record]).any(|&r| r == 0 || r > size.min(64 << 20)) {
        bail!("every record size must be between 1 byte and --size (and at most 64M)");
    }
    let plan = Plan { workloads, size, records, shared_record, iozone_records, fabric: fabrics[0] };

    // The points: (daemons, block); the baseline once, with no block.
    let mut points: Vec<(u32, Option<u64>)> = Vec::new();
    for &c in &caches {
        if c == 0 {
            points.push((0, None));
        } else {
            points.extend(blocks.iter().map(|&b| (c, Some(b))));
        }
    }
    let doc = Document::start("cache");
    let targets = Targets::new(&a.servers.to_string(), None, a.common.dir.as_deref())?.tuned(&a.common)?;
    let mut results = Vec::new();
    let pb = common::progress((targets.points().len() * points.len()) as u64, "cache");
    for sp in targets.points() {
        for &(daemons, block) in &points {
            let tag = format!("-cache{daemons}-block{}", block.unwrap_or(0));
            let mut target = targets
                .start_with(sp, &tag, |o| {
                    o.cache = daemons;
                    o.cache_mib = a.cache_mib;
                    if let Some(b) = block {
                        o.cache_block_bytes = b as u32;
                    }
                })
                .await?;
            target.cfg.client.fabric = plan.fabric;
            eprintln!("cache {daemons} block {block:?}: {} data servers, auth {}", target.servers, target.auth);
            // On an error the cluster's processes die with `target` (kill on drop).
            results.extend(point(&target, daemons, block, &plan, &a).await?);
            target.stop().await;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    targets.finish();

    let glusterfs = if a.no_glusterfs {
        json!("not measured (--no-glusterfs)")
    } else {
        match glusterfs(&plan, &a).await {
            Ok(r) => {
                results.extend(r);
                json!(
                    "measured: a 2-brick distributed volume on loopback, FUSE-mounted with -o ".to_string()
                        + GLUSTER_FUSE_OPTIONS
                )
            }
            Err(e) => {
                eprintln!("GlusterFS skipped: {e:#}");
                json!(format!("skipped: {e:#}"))
            }
        }
    };
    add_ratios(&mut results);
    let checks = target_checks(&results, a.procs);

    let config = json!({
        "servers": a.servers,
        "cache": caches,
        "block_bytes": blocks,
        "cache_mib": a.cache_mib,
        "workloads": plan.workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
        "procs": a.procs,
        "files": a.files,
        "records": plan.records,
        "count": a.count,
        "size_bytes": plan.size,
        "shared_record_bytes": plan.shared_record,
        "iozone_records": plan.iozone_records,
        "seed": a.seed,
        "miss": a.miss,
        "unused": a.unused,
        "fuse": a.fuse,
        "runs": a.common.runs,
        "warm_up": "one unreported round before the --runs rounds of every workload and point",
        "interleaving": "each round runs every bank mode of a point in turn (unused, hit, miss; the FUSE storm \
            last), so a shared machine's drift hits them alike",
        "bank_modes": "off: no bank; unused: a bank, the clients not using it (no [cache] in their config); hit: \
            the bank as configured; miss: every client in a fresh key namespace, so every bank lookup misses while \
            the servers still fill the bank",
        "glusterfs": glusterfs,
        "storm_time": "slowest_s: the slowest process's own time from its `go` to its last stat",
        "client_cpu": "the worker processes' (or, for latency, this process's) own CPU; not the FUSE daemon's nor \
            the servers'",
    });
    let mut doc = doc.finish(config, json!({}), results);
    doc["targets"] = checks;
    common::emit(&doc, &table(&doc), a.common.json.as_deref(), chart)
}

/// Every selected workload on one cluster, every bank mode of it interleaved run by run.
async fn point(target: &Target, daemons: u32, block: Option<u64>, plan: &Plan, a: &CacheArgs) -> Result<Vec<Value>> {
    let mut banks = Vec::new();
    if daemons == 0 {
        banks.push(Bank::Off);
    } else {
        if a.unused {
            banks.push(Bank::Unused);
        }
        banks.push(Bank::Hit);
        if a.miss {
            banks.push(Bank::Miss);
        }
    }
    setup_weft(&target.cfg, plan, a).await?;
    let fuse = match (a.fuse && plan.workloads.contains(&Workload::Storm), target.cluster_file()) {
        (true, Some(file)) => {
            let mnt = file.with_file_name("fuse-mnt");
            Some(crate::mount::mount_weft(&file, &mnt, plan.fabric, &WEFT_FUSE_ARGS)?)
        }
        _ => None,
    };
    let base = |bank: Bank, access: &str| {
        json!({
            "system": "weft",
            "access": access,
            "auth": target.auth,
            "servers": target.servers,
            "cache": daemons,
            "block_bytes": block,
            "bank": bank.name(),
        })
    };
    let native: Vec<Arm> =
        banks.iter().map(|&b| Arm { base: base(b, "native"), on: On::Weft(&target.cfg, b) }).collect();
    // The mount reads the cluster's own cluster.toml: its bank as configured (not in --miss or --unused mode).
    let mount_bank = if daemons == 0 { Bank::Off } else { Bank::Hit };
    let mounted: Vec<Arm> =
        fuse.iter().map(|m| Arm { base: base(mount_bank, "fuse"), on: On::Mount(&m.mnt) }).collect();
    let mut out = Vec::new();
    for &w in &plan.workloads {
        let r = match w {
            Workload::Storm => storm(&[&native[..], &mounted[..]].concat(), a).await?,
            Workload::Latency => latency(&native, plan, a).await?,
            Workload::Shared => shared(&native, plan, a).await?,
            Workload::Iozone => iozone(&native, plan, a).await?,
        };
        log(&r);
        out.extend(r);
    }
    drop(fuse);
    Ok(out)
}

fn log(results: &[Value]) {
    for r in results {
        let key = r["workload"].as_str().and_then(Workload::parse).map_or("ops_per_s", |w| w.headline().0);
        eprintln!(
            "  {} {} bank {} {} record {}: {key} {}",
            r["system"].as_str().unwrap_or(""),
            r["access"].as_str().unwrap_or(""),
            r["bank"].as_str().unwrap_or(""),
            r["workload"].as_str().unwrap_or(""),
            r["record_bytes"],
            r[key]
        );
    }
}

/// The storm's files and the data file, written once per cluster (not timed).
async fn setup_weft(cfg: &ClusterConfig, plan: &Plan, a: &CacheArgs) -> Result<()> {
    let client = Client::connect(cfg).await?;
    let root = client.resolve("/").await?.ino;
    if plan.workloads.contains(&Workload::Storm) {
        let dir = client.mkdir(root, STORM_DIR, 0o755).await?.ino;
        for i in 0..a.files {
            client.create(dir, &format!("f{i}"), 0o644, true).await.with_context(|| format!("create f{i}"))?;
        }
    }
    if plan.workloads.iter().any(|&w| w != Workload::Storm) {
        let f = client.create_path(&format!("/{DATA_FILE}"), 0o644, true, false).await?;
        let chunk = 1u64 << 20;
        let mut off = 0;
        while off < plan.size {
            let len = chunk.min(plan.size - off) as usize;
            f.write_at(off, Bytes::from(expected(off, len))).await?;
            off += len as u64;
        }
        f.close().await?;
    }
    client.close().await;
    Ok(())
}

/// Who runs a workload's clients: processes (or this one) through the native client with a bank mode, or
/// processes on a mounted file system.
#[derive(Clone, Copy)]
enum On<'a> {
    Weft(&'a ClusterConfig, Bank),
    Mount(&'a Path),
}

impl On<'_> {
    /// A fresh client config for one client of one run (`None` on a mount).
    fn config(&self) -> Option<ClusterConfig> {
        match self {
            On::Weft(cfg, bank) => Some(client_config(cfg, *bank)),
            On::Mount(_) => None,
        }
    }

    /// A worker phase that stats every file of the storm.
    fn stat_phase(&self, files: u64) -> Value {
        match self {
            On::Weft(..) => json!({"op": "stat", "dir": format!("/{STORM_DIR}"), "prefix": "f", "count": files}),
            On::Mount(mnt) => json!({"op": "fs-stat", "dir": mnt.join(STORM_DIR), "prefix": "f", "count": files}),
        }
    }

    /// A worker phase reading the whole data file sequentially, one `record` at a time.
    fn read_phase(&self, size: u64, record: u64) -> Value {
        match self {
            On::Weft(..) => json!({"op": "read", "path": format!("/{DATA_FILE}"), "offset": 0, "bytes": size,
                "record": record, "window": 1}),
            On::Mount(mnt) => json!({"op": "fs-read", "path": mnt.join(DATA_FILE), "offset": 0, "bytes": size,
                "record": record}),
        }
    }
}

/// One way of measuring at a point: the fields every result of it carries, and who runs the clients.
#[derive(Clone)]
struct Arm<'a> {
    base: Value,
    on: On<'a>,
}

/// Runs `phase(arm)` on `procs` worker processes per arm (all started first, waiting for their `go`): a warm-up
/// round, then `runs` rounds, each round every arm in turn, so the drift of a shared machine hits every arm
/// alike. A `--miss` arm's clients take a fresh key namespace every round (`cache_namespace`: a new client,
/// connected right after the previous round, before the next arm runs). Returns each arm's runs and loads.
async fn worker_runs(
    arms: &[Arm<'_>],
    procs: usize,
    runs: usize,
    phase: impl Fn(&On) -> Value,
) -> Result<Vec<(Vec<PhaseResult>, Loads)>> {
    let mut workers = Vec::with_capacity(arms.len());
    for arm in arms {
        let ph = phase(&arm.on);
        let rounds = |cfg: &Option<ClusterConfig>| -> Vec<Value> {
            (0..=runs)
                .map(|_| match (arm.on, cfg) {
                    (On::Weft(_, Bank::Miss), Some(cfg)) => {
                        let ns = miss_config(cfg).cache.map(|c| c.namespace);
                        with(&ph, json!({"cache_namespace": ns}))
                    }
                    _ => ph.clone(),
                })
                .collect()
        };
        let specs = (0..procs)
            .map(|_| {
                let cfg = arm.on.config();
                let phases = rounds(&cfg);
                (cfg, phases)
            })
            .collect();
        workers.push(Workers::spawn_each(specs).await?);
    }
    let mut out: Vec<(Vec<PhaseResult>, Loads)> = arms.iter().map(|_| Default::default()).collect();
    for run in 0..=runs {
        for (w, (results, loads)) in workers.iter_mut().zip(out.iter_mut()) {
            let load = ceilings::load1();
            let p = w.phase().await?;
            if run > 0 {
                loads.before.push(load);
                loads.end();
                results.push(p);
            }
            // A --miss arm's workers connect their next round's clients now, before the next arm is timed.
            w.wait_ready().await?;
        }
    }
    for w in workers {
        w.finish().await?;
    }
    Ok(out)
}

async fn storm(arms: &[Arm<'_>], a: &CacheArgs) -> Result<Vec<Value>> {
    let runs = worker_runs(arms, a.procs, a.common.runs, |on| on.stat_phase(a.files)).await?;
    let mut out = Vec::new();
    for (arm, (runs, loads)) in arms.iter().zip(runs) {
        let mut o = OpRuns::default();
        let mut slowest = Vec::new();
        for p in &runs {
            if p.ops() != a.files * a.procs as u64 {
                bail!("the storm did {} stats, {} expected", p.ops(), a.files * a.procs as u64);
            }
            o.push(p.ops(), 0, p.secs, p.cpu_s(), &mut p.lat_us())?;
            slowest.push(p.workers.iter().map(|w| w.secs).fold(0.0, f64::max));
        }
        let mut r = o.result(&arm.base, "stat", Headline::OpsPerS);
        r["workload"] = json!("storm");
        r["fabric"] = json!(fabric_of(&runs));
        r["clients"] = json!(a.procs);
        r["procs"] = json!(a.procs);
        r["files"] = json!(a.files);
        r["record_bytes"] = Value::Null;
        set_headline(&mut r, "slowest_s", &slowest, 6);
        loads.annotate(&mut r);
        out.push(r);
    }
    Ok(out)
}

fn fabric_of(runs: &[PhaseResult]) -> String {
    let names: Vec<String> = runs.iter().map(PhaseResult::fabric).collect();
    common::merge_fabrics(names.iter().map(String::as_str))
}

/// Sets the headline figure `key` (the median of `samples`) and `min`/`max` to its range over the runs.
fn set_headline(r: &mut Value, key: &str, samples: &[f64], digits: i32) {
    let round = |x: f64| {
        let m = 10f64.powi(digits);
        (x * m).round() / m
    };
    if let Some(s) = summarize(samples) {
        r[key] = json!(round(s.median));
        r["min"] = json!(round(s.min));
        r["max"] = json!(round(s.max));
        r["runs"] = json!(s.runs);
    }
}

/// Single reads at seeded random offsets, one call at a time, per record size, after a warming pass; the arms
/// (native only) interleaved run by run.
async fn latency(arms: &[Arm<'_>], plan: &Plan, a: &CacheArgs) -> Result<Vec<Value>> {
    let path = format!("/{DATA_FILE}");
    let mut out = Vec::new();
    for &record in &plan.records {
        let mut per_arm: Vec<(OpRuns, String)> = arms.iter().map(|_| Default::default()).collect();
        // Pre-faulted: the destination buffer, reused by every call, and the warming pass's.
        let mut buf = BytesMut::zeroed(record as usize);
        let mut warm = BytesMut::zeroed(plan.size.min(64 << 10) as usize);
        for run in 0..=a.common.runs {
            for (arm, (o, fabric)) in arms.iter().zip(per_arm.iter_mut()) {
                let cfg = arm.on.config().context("the latency workload runs through the native client")?;
                let bank = arm.base["bank"].as_str().unwrap_or("?");
                let (buf, warm) = (&mut buf, &mut warm);
                let (count, seed) = (a.count, a.seed);
                let path = path.as_str();
                let (timed, fabric_name) = common::on_one_thread(|| async move {
                    let client = Client::connect(&cfg).await?;
                    client.warm_up().await?;
                    // The warming pass: every block of the file read once (the data servers fill the bank), in reads
                    // no larger than the bank looks up and fills (`data_read_blocks_max`). The servers fill
                    // asynchronously and drop fills their queue has no room for: a pass that still missed is
                    // followed by another (at most 4), each through a fresh open, as a handle whose lookups missed
                    // pauses them.
                    let warm_max = cfg.cache.as_ref().map_or(64 << 10, |c| {
                        (u64::from(c.block_bytes) * u64::from(c.data_read_blocks_max)).min(64 << 10) as usize
                    });
                    for _ in 0..4 {
                        let misses = client.bank_stats().map(|s| s.misses);
                        let f = client.open(path, OpenMode::Read).await?;
                        if f.size() != plan.size {
                            bail!("{path}: size {} instead of {}", f.size(), plan.size);
                        }
                        let mut off = 0;
                        while off < plan.size {
                            warm.resize(warm_max.min((plan.size - off) as usize), 0);
                            *warm = f.read_at(off, std::mem::take(warm)).await?;
                            if warm.is_empty() {
                                bail!("{path}: nothing read at {off}");
                            }
                            off += warm.len() as u64;
                        }
                        if misses.is_none() || client.bank_stats().map(|s| s.misses) == misses {
                            break;
                        }
                    }
                    // Timed reads through a fresh open.
                    let f = client.open(path, OpenMode::Read).await?;
                    // The same offsets at every point, arm and run: the comparison is of the bank, not of the draw.
                    let mut rng = SplitMix64::new(seed ^ record.rotate_left(32));
                    let mut lat = Vec::with_capacity(count as usize);
                    let load = ceilings::load1();
                    let (t0, c0) = (Instant::now(), ceilings::cpu_seconds());
                    for _ in 0..count {
                        let offset = rng.next_u64() % (plan.size - record + 1);
                        buf.resize(record as usize, 0);
                        let t = Instant::now();
                        *buf = f.read_at(offset, std::mem::take(buf)).await?;
                        lat.push(micros_since(t));
                        // Checked outside the call's own time; it costs the CPU figure a comparison per read, the
                        // same at every point.
                        if buf.len() as u64 != record || buf[..] != expected(offset, record as usize)[..] {
                            bail!("{path}: the {record}-byte read at {offset} returned wrong bytes (bank {bank})");
                        }
                    }
                    let (secs, cpu_s) = (t0.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c0);
                    let fabric_name = common::fabric_used(&client).await;
                    drop(f);
                    client.close().await;
                    Ok(((secs, cpu_s, lat, load), fabric_name))
                })?;
                *fabric = fabric_name;
                let (secs, cpu_s, mut lat, load) = timed;
                if run > 0 {
                    o.push(a.count, a.count * record, secs, cpu_s, &mut lat)?;
                    o.push_load(load);
                }
            }
        }
        for (arm, (o, fabric)) in arms.iter().zip(per_arm) {
            let mut r = o.result(&arm.base, "read", Headline::P50);
            r["workload"] = json!("latency");
            r["fabric"] = json!(fabric);
            r["clients"] = json!(1);
            r["procs"] = json!(1);
            r["record_bytes"] = json!(record);
            out.push(r);
        }
    }
    Ok(out)
}

/// `procs` processes per arm reading the whole data file by `record`: one result per arm.
async fn read_runs(
    arms: &[Arm<'_>],
    workload: Workload,
    procs: usize,
    record: u64,
    plan: &Plan,
    a: &CacheArgs,
) -> Result<Vec<Value>> {
    let runs = worker_runs(arms, procs, a.common.runs, |on| on.read_phase(plan.size, record)).await?;
    let mut out = Vec::new();
    for (arm, (runs, loads)) in arms.iter().zip(runs) {
        let mut o = OpRuns::default();
        let (mut mib, mut cpu_gib) = (Vec::new(), Vec::new());
        for p in &runs {
            if p.bytes() != plan.size * procs as u64 {
                bail!("the readers read {} bytes, {} expected", p.bytes(), plan.size * procs as u64);
            }
            let gib = p.bytes() as f64 / (1u64 << 30) as f64;
            o.push(p.ops(), p.bytes(), p.secs, p.cpu_s(), &mut [])?;
            mib.push(p.bytes() as f64 / (1u64 << 20) as f64 / p.secs);
            cpu_gib.push(p.cpu_s() / gib);
        }
        let mut r = o.result(&arm.base, "read", Headline::OpsPerS);
        r["workload"] = json!(workload.name());
        r["fabric"] = json!(fabric_of(&runs));
        r["clients"] = json!(procs);
        r["procs"] = json!(procs);
        r["record_bytes"] = json!(record);
        r["size_bytes"] = json!(plan.size);
        set_headline(&mut r, "mib_per_s", &mib, 1);
        r["client_cpu_s_per_gib"] = json!(summarize(&cpu_gib).map(|s| round3(s.median)));
        loads.annotate(&mut r);
        out.push(r);
    }
    Ok(out)
}

async fn shared(arms: &[Arm<'_>], plan: &Plan, a: &CacheArgs) -> Result<Vec<Value>> {
    read_runs(arms, Workload::Shared, a.procs, plan.shared_record, plan, a).await
}

async fn iozone(arms: &[Arm<'_>], plan: &Plan, a: &CacheArgs) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for &record in &plan.iozone_records {
        out.extend(read_runs(arms, Workload::Iozone, 1, record, plan, a).await?);
    }
    Ok(out)
}

/// The GlusterFS baseline: storm, shared and iozone on its FUSE mount.
async fn glusterfs(plan: &Plan, a: &CacheArgs) -> Result<Vec<Value>> {
    let base_dir: PathBuf = a.common.dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = base_dir.join(format!("weft-bench-cache-gluster-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let r = async {
        let g = crate::mount::start_gluster_with(&work, Some(GLUSTER_FUSE_OPTIONS))?;
        let mnt = g.mnt.clone();
        if plan.workloads.contains(&Workload::Storm) {
            std::fs::create_dir_all(mnt.join(STORM_DIR))?;
            for i in 0..a.files {
                std::fs::File::create(mnt.join(STORM_DIR).join(format!("f{i}")))?;
            }
        }
        if plan.workloads.iter().any(|w| matches!(w, Workload::Shared | Workload::Iozone)) {
            std::fs::write(mnt.join(DATA_FILE), expected(0, plan.size as usize))?;
        }
        let arms = [Arm {
            base: json!({"system": "glusterfs", "access": "fuse", "auth": "none", "servers": 2, "cache": 0,
                "block_bytes": null, "bank": "off"}),
            on: On::Mount(&mnt),
        }];
        let mut out = Vec::new();
        for &w in &plan.workloads {
            let r = match w {
                Workload::Storm => storm(&arms, a).await?,
                Workload::Shared => shared(&arms, plan, a).await?,
                Workload::Iozone => iozone(&arms, plan, a).await?,
                Workload::Latency => continue,
            };
            log(&r);
            out.extend(r);
        }
        drop(g);
        anyhow::Ok(out)
    }
    .await;
    let _ = std::fs::remove_dir_all(&work);
    r
}

/// Merges `extra`'s fields into a copy of `base`.
fn with(base: &Value, extra: Value) -> Value {
    let mut r = base.clone();
    if let (Some(o), Value::Object(e)) = (r.as_object_mut(), extra) {
        o.extend(e);
    }
    r
}

/// Adds `headline` and, against two baselines, the ratio of the headline (`ratio_to_*`: this ÷ the baseline's)
/// and the speed-up (`speedup_vs_*`: how many times faster, > 1 better):
/// - `cache0`: the same workload, access and record without a bank (the `--cache 0` cluster); GlusterFS's mount
///   results are compared with Weft's native ones;
/// - `unused`: the same on the same cluster with clients not using the bank (`--unused`), measured interleaved.
fn add_ratios(results: &mut [Value]) {
    let measure = |r: &Value| [r["workload"].clone(), r["access"].clone(), r["record_bytes"].clone()];
    let no_bank: Vec<([Value; 3], Value)> = results
        .iter()
        .filter(|r| r["system"] == "weft" && r["bank"] == "off")
        .map(|r| (measure(r), r.clone()))
        .collect();
    let same_point = |r: &Value| (measure(r), r["cache"].clone(), r["block_bytes"].clone());
    let unused: Vec<_> = results.iter().filter(|r| r["bank"] == "unused").map(|r| (same_point(r), r.clone())).collect();
    for r in results.iter_mut() {
        let Some(w) = r["workload"].as_str().and_then(Workload::parse) else { continue };
        let (key, lower_better) = w.headline();
        r["headline"] = json!(key);
        let mut k = measure(r);
        if r["system"] == "glusterfs" {
            k[1] = json!("native");
        }
        let bases = [
            ("cache0", no_bank.iter().find(|(bk, _)| *bk == k).map(|(_, b)| b)),
            ("unused", unused.iter().find(|(bk, _)| *bk == same_point(r)).map(|(_, b)| b)),
        ];
        for (name, base) in bases {
            let Some(base) = base else { continue };
            let (Some(x), Some(b)) = (r[key].as_f64(), base[key].as_f64()) else { continue };
            if x > 0.0 && b > 0.0 {
                r[format!("ratio_to_{name}")] = json!(round3(x / b));
                r[format!("speedup_vs_{name}")] = json!(round3(if lower_better { b / x } else { x / b }));
            }
        }
    }
}

/// The targets, checked against this run's results (against the no-bank cluster; the same-cluster
/// `--unused` figures beside them where measured).
fn target_checks(results: &[Value], procs: usize) -> Value {
    let weft = |bank: &'static str| {
        results.iter().filter(move |r| r["system"] == "weft" && r["access"] == "native" && r["bank"] == bank)
    };
    let point = |r: &Value| json!({"cache": r["cache"], "block_bytes": r["block_bytes"]});
    let storm: Vec<Value> = weft("hit")
        .filter(|r| r["workload"] == "storm")
        .map(|r| {
            with(
                &point(r),
                json!({"speedup": r["speedup_vs_cache0"], "met": r["speedup_vs_cache0"].as_f64().map(|s| s >= 3.0),
                    "speedup_vs_unused": r["speedup_vs_unused"]}),
            )
        })
        .collect();
    let one_byte: Vec<Value> = weft("hit")
        .filter(|r| r["workload"] == "latency" && r["record_bytes"] == 1)
        .map(|r| {
            with(
                &point(r),
                json!({"ratio": r["ratio_to_cache0"], "met": r["ratio_to_cache0"].as_f64().map(|x| x <= 0.5),
                    "ratio_to_unused": r["ratio_to_unused"]}),
            )
        })
        .collect();
    let worst = |key: &str| {
        weft("miss").filter_map(|r| r[key].as_f64().map(|s| (s, r))).min_by(|x, y| x.0.total_cmp(&y.0)).map(|(s, r)| {
            with(
                &point(r),
                json!({"workload": r["workload"], "record_bytes": r["record_bytes"], "slowdown": round3(1.0 / s),
                        "met": 1.0 / s <= 1.1}),
            )
        })
    };
    json!({
        "stat_storm": {"goal": format!("slowest of {procs} processes ≥ 3× faster with the bank"), "points": storm},
        "one_byte_read": {"goal": "1-byte read p50 with the bank ≤ 0.5× without", "points": one_byte},
        "all_miss": {"goal": "no workload > 10 % slower when every lookup misses (worst shown; needs --miss)",
            "worst": worst("speedup_vs_cache0"), "worst_vs_unused": worst("speedup_vs_unused")},
    })
}

/// A Markdown table: one row per result, with its headline, ratio and CPU.
pub fn table(doc: &Value) -> String {
    let mut s = String::from(
        "| system | access | cache | block | bank | workload | record | headline | median | min–max | p99 µs | client CPU | × faster than cache 0 | × faster than unused | runs |\n\
         |---|---|---:|---:|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|\n",
    );
    let size = |v: &Value| v.as_u64().map_or("-".to_string(), crate::tables::human_bytes);
    let num = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x}"));
    for r in doc["results"].as_array().into_iter().flatten() {
        let key = r["headline"].as_str().unwrap_or("ops_per_s");
        let cpu = match (r["client_cpu_s_per_gib"].as_f64(), r["client_cpu_us_per_op"].as_f64()) {
            (Some(g), _) => format!("{g} s/GiB"),
            (None, Some(u)) => format!("{u} µs/op"),
            _ => "-".into(),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {key} | {} | {}–{} | {} | {cpu} | {} | {} | {} |\n",
            r["system"].as_str().unwrap_or("?"),
            r["access"].as_str().unwrap_or("?"),
            r["cache"],
            size(&r["block_bytes"]),
            r["bank"].as_str().unwrap_or("?"),
            r["workload"].as_str().unwrap_or("?"),
            size(&r["record_bytes"]),
            num(&r[key]),
            num(&r["min"]),
            num(&r["max"]),
            num(&r["p99_us"]),
            num(&r["speedup_vs_cache0"]),
            num(&r["speedup_vs_unused"]),
            r["runs"],
        ));
    }
    let t = &doc["targets"];
    s.push_str(&format!(
        "\ntargets: stat storm {}; 1-byte read {}; every lookup missing, worst {} (against unused: {})\n",
        serde_json::to_string(&t["stat_storm"]["points"]).unwrap_or_default(),
        serde_json::to_string(&t["one_byte_read"]["points"]).unwrap_or_default(),
        serde_json::to_string(&t["all_miss"]["worst"]).unwrap_or_default(),
        serde_json::to_string(&t["all_miss"]["worst_vs_unused"]).unwrap_or_default(),
    ));
    s
}

/// The speed-up over no bank of the target figures: the storm, the smallest-record latency, the shared reads and
/// the smallest-record IOzone read, per point and bank mode.
pub fn chart(doc: &Value) -> String {
    let results: Vec<&Value> = doc["results"].as_array().into_iter().flatten().collect();
    let smallest =
        |w: &str| results.iter().filter(|r| r["workload"] == w).filter_map(|r| r["record_bytes"].as_u64()).min();
    let (lat_rec, ioz_rec) = (smallest("latency"), smallest("iozone"));
    let colors = ["#e08a2c", "#3b7dd8", "#4caf50", "#9c27b0"];
    let bars: Vec<crate::chart::Bar> = results
        .iter()
        .filter(|r| match r["workload"].as_str() {
            Some("latency") => r["record_bytes"].as_u64() == lat_rec,
            Some("iozone") => r["record_bytes"].as_u64() == ioz_rec,
            _ => true,
        })
        .map(|r| {
            let w = r["workload"].as_str().unwrap_or("?");
            let block =
                r["block_bytes"].as_u64().map_or(String::new(), |b| format!(" {}", crate::tables::human_bytes(b)));
            let who =
                if r["system"] == "glusterfs" { "gluster".to_string() } else { format!("c{}{block}", r["cache"]) };
            crate::chart::Bar {
                value: r["speedup_vs_cache0"].as_f64().unwrap_or(0.0),
                min: None,
                max: None,
                label: format!("{w}{}", if r["access"] == "fuse" { " fuse" } else { "" }),
                sublabel: format!("{who} {}", r["bank"].as_str().unwrap_or("")),
                color: colors[["storm", "latency", "shared", "iozone"].iter().position(|x| *x == w).unwrap_or(0)],
            }
        })
        .collect();
    crate::chart::bars_svg("weft bench cache: × faster than without the bank (median of runs; > 1 is better)", &bars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn miss_namespaces_are_fresh_and_valid() {
        let mut cfg = ClusterConfig::new("127.0.0.1:1");
        cfg.cache = Some(weft_cache::CacheConfig { namespace: i64::MAX as u64, ..Default::default() });
        let mut seen = std::collections::BTreeSet::new();
        seen.insert(i64::MAX as u64);
        for _ in 0..100 {
            let ns = miss_config(&cfg).cache.unwrap().namespace;
            assert!(ns <= i64::MAX as u64);
            assert!(seen.insert(ns), "namespace {ns} handed out twice");
        }
        assert_eq!(client_config(&cfg, Bank::Hit).cache.unwrap().namespace, i64::MAX as u64);
    }

    #[test]
    fn ratios_are_to_the_same_measurement_without_a_bank() {
        let r = |system: &str, bank: &str, w: &str, rec: Value, key: &str, x: f64| {
            json!({"system": system, "access": if system == "weft" { "native" } else { "fuse" }, "bank": bank,
                "cache": if bank == "off" { 0 } else { 2 }, "block_bytes": null, "workload": w,
                "record_bytes": rec, key: x})
        };
        let mut v = vec![
            r("weft", "off", "storm", Value::Null, "slowest_s", 3.0),
            r("weft", "hit", "storm", Value::Null, "slowest_s", 1.0),
            r("weft", "off", "latency", json!(1), "p50_us", 100.0),
            r("weft", "hit", "latency", json!(1), "p50_us", 40.0),
            r("weft", "miss", "latency", json!(1), "p50_us", 105.0),
            r("weft", "off", "iozone", json!(4096), "mib_per_s", 200.0),
            r("weft", "hit", "iozone", json!(4096), "mib_per_s", 400.0),
            r("glusterfs", "off", "iozone", json!(4096), "mib_per_s", 100.0),
        ];
        add_ratios(&mut v);
        let f = |i: usize, k: &str| v[i][k].as_f64().unwrap();
        assert_eq!((f(1, "ratio_to_cache0"), f(1, "speedup_vs_cache0")), (0.333, 3.0));
        assert_eq!((f(3, "ratio_to_cache0"), f(3, "speedup_vs_cache0")), (0.4, 2.5));
        assert_eq!((f(6, "ratio_to_cache0"), f(6, "speedup_vs_cache0")), (2.0, 2.0));
        assert_eq!(f(7, "speedup_vs_cache0"), 0.5, "GlusterFS is compared with Weft without a bank");
        let t = target_checks(&v, 8);
        assert_eq!(t["stat_storm"]["points"][0]["met"], true);
        assert_eq!(t["one_byte_read"]["points"][0]["met"], true);
        assert_eq!(t["all_miss"]["worst"]["met"], true, "{t}");
        assert_eq!(t["all_miss"]["worst"]["slowdown"], 1.05);
    }

    #[test]
    fn the_data_file_checks_any_offset() {
        assert_eq!(expected(1000, 3), vec![byte_at(1000), byte_at(1001), byte_at(1002)]);
        // Not periodic over a block: a block read from the wrong place shows.
        assert_ne!(expected(0, 256), expected(256, 256));
        assert_ne!(expected(0, 8192), expected(8192, 8192));
    }
}
