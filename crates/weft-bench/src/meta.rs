//! `weft bench meta`: metadata operations in the manner of mdtest, through the native client library.
//!
//! Per point (data servers × clients) and per run: every client creates its share of `--files` empty files in its
//! own directory (or all in one with `--shared`), then looks each one up (lookup returns the attributes: stat),
//! then lists its directory page by page, then removes its files. Each phase starts for every client at once (a
//! barrier) and is timed from the release to the last client's end; ops/s is the phase's operations over that
//! time, readdir counting entries returned. Every client is a task of this process with its own `Client`, that
//! is its own sessions with the MDS; each issues one operation at a time.
//!
//! `--stat-storm` (IMCa's stat storm): the files are created once, then every client looks up all of them at the
//! same moment; reported are the aggregate rate and each client's own rate, the slowest one separately.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use tokio::sync::Barrier;
use weft_client::Client;

use crate::ceilings;
use crate::common::{self, Headline, OpRuns, Target, Targets, micros_since, round1};
use crate::doc::Document;
use crate::stats::summarize;
use crate::worker::Workers;

#[derive(Args, Clone, Debug)]
#[command(after_help = "Clients are tasks of the one bench process, each with its own Client (its own sessions \
    with the MDS and data servers); with --procs N they are N processes instead (mdtest's MPI ranks).")]
pub struct MetaArgs {
    /// Data-server counts to measure, e.g. `1,4` (ignored with --cluster); the MDS is one process either way.
    #[arg(long, default_value = "4")]
    pub servers: String,
    /// Where the MDS keeps the namespace, each measured in turn on clusters the bench starts: `redb` (the
    /// embedded store), `postgres` (a PostgreSQL server of the cluster's own, as `weft up --meta postgres`), or
    /// both: `redb,postgres`. Ignored with --cluster.
    #[arg(long, default_value = "redb")]
    pub meta: String,
    /// Metadata-service counts to measure on `postgres`, e.g. `1,2`: that many services on the one database
    /// (as `weft up --meta-services N`), client i starting at service i mod N. Ignored with --cluster.
    #[arg(long, default_value = "1")]
    pub meta_services: String,
    /// Client counts to measure, e.g. `1,4,8`. Each client is a task with its own Client (separate sessions),
    /// issuing one operation at a time (see --procs for one process per client).
    #[arg(long, default_value = "8")]
    pub threads: String,
    /// Files per run, split evenly among the clients. With --stat-storm: the files every client stats.
    #[arg(long, default_value_t = 20_000)]
    pub files: u64,
    /// Put every client's files in one shared directory instead of one private directory per client (every
    /// client then lists the whole shared directory).
    #[arg(long)]
    pub shared: bool,
    /// IMCa's stat storm: create the files once, then every client stats all of them at the same time.
    #[arg(long, conflicts_with = "shared")]
    pub stat_storm: bool,
    /// Run the clients as this many processes (`weft bench worker`, one Client each) instead of --threads tasks
    /// of this process; 0 keeps tasks. Not with --stat-storm.
    #[arg(long, default_value_t = 0, conflicts_with = "stat_storm")]
    pub procs: usize,
    /// Failover time instead of the mdtest phases: the clients create files without pause, every one starting
    /// at one service, which is killed with SIGKILL; reported is each client's time from the kill to the end of
    /// its first create issued after it (p50, p99, max over clients and runs), with every acknowledged create
    /// checked present. Each run kills the next service (then restarts it). Needs --meta postgres and
    /// --meta-services 2 or more.
    #[arg(long, conflicts_with_all = ["stat_storm", "procs", "shared"])]
    pub failover: bool,
    /// After the mdtest phases on `postgres` with one service: a create/stat loop on Weft's FUSE mount of that
    /// cluster, on JuiceFS with its metadata in the same PostgreSQL, and on JuiceFS with Redis (`appendfsync
    /// always`); the peers come from `make bench-deps`.
    #[arg(long, conflicts_with_all = ["stat_storm", "procs", "failover", "cluster"])]
    pub juicefs: bool,
    #[command(flatten)]
    pub common: common::SharedArgs,
}

/// One phase of one run, all clients together.
struct Phase {
    secs: f64,
    cpu_s: f64,
    ops: u64,
    /// Per-call latencies of every client, µs (empty for readdir, whose calls return pages of entries).
    lat_us: Vec<f64>,
    /// Each client's operations and its own seconds from the barrier to its last operation.
    per_client: Vec<(u64, f64)>,
}

/// Runs one task per future, released together by a barrier; times the phase from just before the release to
/// the last task's end (the few microseconds tasks take to reach the barrier can only make it look slower).
/// Every task returns (operations, latencies in µs).
async fn phase<F>(tasks: Vec<F>) -> Result<Phase>
where
    F: Future<Output = Result<(u64, Vec<f64>)>> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(tasks.len() + 1));
    let handles: Vec<_> = tasks
        .into_iter()
        .map(|task| {
            let b = barrier.clone();
            tokio::spawn(async move {
                b.wait().await;
                let t = Instant::now();
                let (ops, lat) = task.await?;
                anyhow::Ok((ops, lat, t.elapsed().as_secs_f64()))
            })
        })
        .collect();
    let (t0, c0) = (Instant::now(), ceilings::cpu_seconds());
    barrier.wait().await;
    let mut p = Phase { secs: 0.0, cpu_s: 0.0, ops: 0, lat_us: Vec::new(), per_client: Vec::new() };
    for h in handles {
        let (ops, lat, secs) = h.await.context("a client task failed")??;
        p.ops += ops;
        p.lat_us.extend(lat);
        p.per_client.push((ops, secs));
    }
    p.secs = t0.elapsed().as_secs_f64();
    p.cpu_s = ceilings::cpu_seconds() - c0;
    Ok(p)
}

/// One op's measurements over the runs, with each client's own rate (for the stat storm).
#[derive(Default)]
struct MetaRuns {
    all: OpRuns,
    /// Per run: every client's rate, and the slowest one.
    per_client: Vec<Vec<f64>>,
    slowest: Vec<f64>,
}

impl MetaRuns {
    fn push(&mut self, mut p: Phase) -> Result<()> {
        self.all.push(p.ops, 0, p.secs, p.cpu_s, &mut p.lat_us)?;
        let rates: Vec<f64> = p.per_client.iter().map(|&(ops, secs)| ops as f64 / secs.max(1e-9)).collect();
        self.slowest.push(rates.iter().copied().fold(f64::INFINITY, f64::min));
        self.per_client.push(rates);
        Ok(())
    }
}

pub async fn run(a: MetaArgs) -> Result<()> {
    let threads: Vec<usize> =
        crate::parse_list(&a.threads, |x| x.parse().ok()).context("--threads wants a list like 1,4,8")?;
    if a.common.runs == 0 || a.files == 0 || threads.contains(&0) {
        bail!("--runs, --files and every --threads value must be at least 1");
    }
    if !a.stat_storm && threads.iter().any(|&t| t as u64 > a.files) {
        bail!("--files must be at least the number of clients (every client gets a share)");
    }
    let fabrics = common::fabric_choices(&a.common.fabric)?;
    let metas: Vec<&str> = a.meta.split(',').map(str::trim).collect();
    if let Some(bad) = metas.iter().find(|m| !matches!(**m, "redb" | "postgres")) {
        bail!("--meta {bad:?}: redb, postgres, or both (redb,postgres)");
    }
    let service_counts: Vec<u32> = crate::parse_list(&a.meta_services, |x| x.parse().ok().filter(|&n: &u32| n > 0))
        .context("--meta-services wants a list like 1,2")?;
    if service_counts.iter().any(|&n| n > 1) && !metas.contains(&"postgres") {
        bail!("--meta-services above 1 needs --meta postgres: the embedded store serves one service");
    }
    if a.failover && (a.common.cluster.is_some() || !metas.contains(&"postgres")) {
        bail!("--failover needs --meta postgres and --meta-services 2 or more on a cluster the bench starts");
    }
    if a.common.cluster.is_some() && metas.len() > 1 {
        bail!("--meta names one store with --cluster: the running cluster's MDS has chosen its own");
    }
    let doc = Document::start("meta");
    let targets = Targets::new(&a.servers, a.common.cluster.as_deref(), a.common.dir.as_deref())?.tuned(&a.common)?;
    let mut results = Vec::new();
    // Several services only on PostgreSQL; the embedded store is measured with one.
    let runs: Vec<(&str, u32)> = metas
        .iter()
        .flat_map(|&m| service_counts.iter().filter(move |&&n| m == "postgres" || n == 1).map(move |&n| (m, n)))
        .filter(|&(_, n)| !a.failover || n > 1)
        .collect();
    if runs.is_empty() {
        bail!("--failover: no point with --meta postgres and 2 or more --meta-services");
    }
    let points = targets.points().len() * runs.len();
    let pb = common::progress((points * fabrics.len() * threads.len()) as u64, "meta");
    for sp in targets.points() {
        for &(meta, services) in &runs {
            let tag = format!("-meta-{meta}-{services}");
            let mut target = targets
                .start_with(sp, &tag, |o| {
                    o.postgres = meta == "postgres";
                    o.meta_services = services;
                })
                .await?;
            let mut point = Vec::new();
            for &fabric in &fabrics {
                target.cfg.client.fabric = fabric;
                if a.procs > 0 {
                    point.extend(measure_aggregate(&target, &a).await?);
                    pb.inc(threads.len() as u64);
                    continue;
                }
                for &n in &threads {
                    if a.failover {
                        point.push(crate::failover::measure(&mut target, n, services, a.common.runs).await?);
                        pb.inc(1);
                        continue;
                    }
                    // On an error the cluster's processes die with `target` (kill on drop).
                    point.extend(if a.stat_storm {
                        storm(&target, n, &a).await?
                    } else {
                        mdtest(&target, n, &a).await?
                    });
                    pb.inc(1);
                }
            }
            if a.juicefs && meta == "postgres" && services == 1 {
                for &n in &threads {
                    point.extend(crate::juicefs::measure(&target, n, a.files, a.common.runs).await?);
                }
            }
            target.stop().await;
            let label = match services {
                1 => meta.to_string(),
                n => format!("{meta}, {n} services"),
            };
            for r in point.iter_mut().filter(|r| r.get("meta").is_none()) {
                r["meta"] = json!(if a.common.cluster.is_some() { "as the cluster runs" } else { label.as_str() });
                r["meta_services"] = json!(services);
            }
            results.extend(point);
        }
    }
    pb.finish_and_clear();
    targets.finish();

    let config = json!({
        "mode": if a.failover { "failover" } else if a.stat_storm { "stat-storm" } else if a.shared { "shared" } else { "private" },
        "files": a.files,
        "runs": a.common.runs,
        "clients_are": if a.procs > 0 { "processes (weft bench worker), one Client each, one operation at a time" }
            else { "tasks of one process, one Client (own sessions) each, one operation at a time" },
        "procs": a.procs,
        "phase_time": "from the release of a barrier all clients wait at to the last client's last reply",
        "per_client_rate": "a client's operations over its own time from the release to its last reply",
    });
    let doc = doc.finish(config, json!({}), results);
    common::emit(&doc, &crate::tables::meta_table(&doc), a.common.json.as_deref(), crate::chart::meta_svg)
}

/// The fabric `clients` actually used, all of them together.
async fn fabric_used(clients: &[Client]) -> String {
    let mut names = Vec::with_capacity(clients.len());
    for c in clients {
        names.push(common::fabric_used(c).await);
    }
    common::merge_fabrics(names.iter().map(String::as_str))
}

/// Connects `n` clients, each with its own sessions; with several metadata services, client i starts at service
/// i mod their number (each fails over to the others).
async fn clients(target: &Target, n: usize) -> Result<Vec<Client>> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let mut cfg = target.cfg.clone();
        cfg.mds = common::starting_at(&target.cfg.mds, i);
        v.push(Client::connect(&cfg).await?);
    }
    Ok(v)
}

async fn close_all(clients: &[Client]) {
    for c in clients {
        c.close().await;
    }
}

/// A fresh directory for this bench at the root of the file system.
async fn bench_dir(client: &Client, name: &str) -> Result<u64> {
    let root = client.resolve("/").await?.ino;
    let name = format!("bench-{name}-{}", std::process::id());
    Ok(client.mkdir(root, &name, 0o755).await.with_context(|| format!("mkdir /{name}"))?.ino)
}

async fn remove_bench_dir(client: &Client, name: &str) -> Result<()> {
    let root = client.resolve("/").await?.ino;
    client.rmdir(root, &format!("bench-{name}-{}", std::process::id())).await?;
    Ok(())
}

/// The names of client `i`'s files: `share` of `files`, the first `files % n` clients taking one more.
fn file_names(i: usize, n: usize, files: u64) -> Vec<String> {
    let share = files / n as u64 + u64::from((i as u64) < files % n as u64);
    (0..share).map(|j| format!("f{i}.{j}")).collect()
}

async fn mdtest(target: &Target, n: usize, a: &MetaArgs) -> Result<Vec<Value>> {
    let clients = clients(target, n).await?;
    let tag = format!("meta-s{}-c{n}", target.servers);
    let top = bench_dir(&clients[0], &tag).await?;
    // Warm-up: a small cycle (sessions, the MDS's tables and caches).
    cycle(&clients, top, "warm-up", (64 * n as u64).min(a.files), a.shared).await?;
    let mut ops: [MetaRuns; 4] = Default::default();
    for run in 0..a.common.runs {
        let load = ceilings::load1();
        let phases = cycle(&clients, top, &format!("run{run}"), a.files, a.shared).await?;
        for (o, p) in ops.iter_mut().zip(phases) {
            o.push(p)?;
            o.all.push_load(load);
        }
    }
    remove_bench_dir(&clients[0], &tag).await?;
    let fabric = fabric_used(&clients).await;
    close_all(&clients).await;
    let dirs = if a.shared { 1 } else { n };
    let base = json!({
        "system": "weft",
        "fabric": fabric,
        "mode": if a.shared { "shared" } else { "private" },
        "servers": target.servers,
        "clients": n,
        "threads": n,
        "files": a.files,
        "directories": dirs,
    });
    let mut out = Vec::new();
    for (o, op) in ops.iter().zip(["create", "stat", "readdir", "remove"]) {
        let r = o.all.result(&base, op, Headline::OpsPerS);
        eprintln!("servers {} clients {n}: {op} {} ops/s", target.servers, r["ops_per_s"]);
        out.push(r);
    }
    Ok(out)
}

/// One task per client: `f(its client, its directory, its names, the entries its listing must return)`.
fn per_client<F, Fut>(clients: &[Client], dirs: &[u64], names: &[Arc<Vec<String>>], expect: &[u64], f: F) -> Vec<Fut>
where
    F: Fn(Client, u64, Arc<Vec<String>>, u64) -> Fut,
{
    (0..clients.len()).map(|i| f(clients[i].clone(), dirs[i], names[i].clone(), expect[i])).collect()
}

/// One create, stat, readdir, remove cycle of `files` files under a new directory `name` of `top`.
async fn cycle(clients: &[Client], top: u64, name: &str, files: u64, shared: bool) -> Result<[Phase; 4]> {
    let n = clients.len();
    let c0 = &clients[0];
    let run_dir = c0.mkdir(top, name, 0o755).await?.ino;
    let dirs: Vec<u64> = if shared {
        vec![c0.mkdir(run_dir, "shared", 0o755).await?.ino; n]
    } else {
        let mut v = Vec::with_capacity(n);
        for i in 0..n {
            v.push(c0.mkdir(run_dir, &format!("c{i}"), 0o755).await?.ino);
        }
        v
    };
    let names: Vec<Arc<Vec<String>>> = (0..n).map(|i| Arc::new(file_names(i, n, files))).collect();
    // The entries one client's listing must return.
    let expect_entries = |i: usize| if shared { files } else { names[i].len() as u64 };

    let expect: Vec<u64> = (0..n).map(expect_entries).collect();
    let create = phase(per_client(clients, &dirs, &names, &expect, |c, dir, names, _| async move {
        let mut lat = Vec::with_capacity(names.len());
        for name in names.iter() {
            let t = Instant::now();
            c.create(dir, name, 0o644, true).await.with_context(|| format!("create {name}"))?;
            lat.push(micros_since(t));
        }
        Ok((names.len() as u64, lat))
    }))
    .await?;
    let stat = phase(per_client(clients, &dirs, &names, &expect, |c, dir, names, _| async move {
        let mut lat = Vec::with_capacity(names.len());
        for name in names.iter() {
            let t = Instant::now();
            let attr = c.lookup(dir, name).await.with_context(|| format!("stat {name}"))?;
            lat.push(micros_since(t));
            if attr.size != 0 {
                bail!("stat {name}: size {} of an empty file", attr.size);
            }
        }
        Ok((names.len() as u64, lat))
    }))
    .await?;
    let readdir = phase(per_client(clients, &dirs, &names, &expect, |c, dir, _, expect| async move {
        let entries = c.readdir(dir).await.context("readdir")?.len() as u64;
        if entries != expect {
            bail!("readdir: {entries} entries, {expect} expected");
        }
        Ok((entries, Vec::new()))
    }))
    .await?;
    let remove = phase(per_client(clients, &dirs, &names, &expect, |c, dir, names, _| async move {
        let mut lat = Vec::with_capacity(names.len());
        for name in names.iter() {
            let t = Instant::now();
            c.unlink(dir, name).await.with_context(|| format!("remove {name}"))?;
            lat.push(micros_since(t));
        }
        Ok((names.len() as u64, lat))
    }))
    .await?;

    if shared {
        c0.rmdir(run_dir, "shared").await?;
    } else {
        for i in 0..n {
            c0.rmdir(run_dir, &format!("c{i}")).await?;
        }
    }
    c0.rmdir(top, name).await?;
    Ok([create, stat, readdir, remove])
}

async fn storm(target: &Target, n: usize, a: &MetaArgs) -> Result<Vec<Value>> {
    let clients = clients(target, n).await?;
    let tag = format!("storm-s{}-c{n}", target.servers);
    let top = bench_dir(&clients[0], &tag).await?;
    let dir = clients[0].mkdir(top, "storm", 0o755).await?.ino;
    // The files, created once (split among the clients, not timed).
    let all: Arc<Vec<String>> = Arc::new((0..a.files).map(|j| format!("f{j}")).collect());
    let share = |i: usize| all.iter().skip(i).step_by(n).cloned().collect::<Vec<String>>();
    phase(
        (0..n)
            .map(|i| {
                let (c, mine) = (clients[i].clone(), share(i));
                async move {
                    for name in &mine {
                        c.create(dir, name, 0o644, true).await.with_context(|| format!("create {name}"))?;
                    }
                    Ok((mine.len() as u64, Vec::new()))
                }
            })
            .collect(),
    )
    .await?;
    let stat_all = |count: usize| {
        (0..n)
            .map(|i| {
                let (c, all) = (clients[i].clone(), all.clone());
                async move {
                    let mut lat = Vec::with_capacity(count);
                    for name in all.iter().take(count) {
                        let t = Instant::now();
                        c.lookup(dir, name).await.with_context(|| format!("stat {name}"))?;
                        lat.push(micros_since(t));
                    }
                    Ok((count as u64, lat))
                }
            })
            .collect::<Vec<_>>()
    };
    // Warm-up: every client stats a few of the files.
    phase(stat_all(all.len().min(256))).await?;
    let mut o = MetaRuns::default();
    for _ in 0..a.common.runs {
        let load = ceilings::load1();
        o.push(phase(stat_all(all.len())).await?)?;
        o.all.push_load(load);
    }
    // Clean up (not timed).
    phase(
        (0..n)
            .map(|i| {
                let (c, mine) = (clients[i].clone(), share(i));
                async move {
                    for name in &mine {
                        c.unlink(dir, name).await.with_context(|| format!("remove {name}"))?;
                    }
                    Ok((mine.len() as u64, Vec::new()))
                }
            })
            .collect(),
    )
    .await?;
    clients[0].rmdir(top, "storm").await?;
    remove_bench_dir(&clients[0], &tag).await?;
    let fabric = fabric_used(&clients).await;
    close_all(&clients).await;

    let base = json!({
        "system": "weft",
        "fabric": fabric,
        "mode": "stat-storm",
        "servers": target.servers,
        "clients": n,
        "threads": n,
        "files": a.files,
        "directories": 1,
    });
    let mut r = o.all.result(&base, "stat", Headline::OpsPerS);
    let slow = summarize(&o.slowest).expect("runs >= 1");
    // Each client's rate: its median over the runs.
    let per_client: Vec<f64> = (0..n)
        .map(|i| round1(summarize(&o.per_client.iter().map(|run| run[i]).collect::<Vec<_>>()).expect("runs").median))
        .collect();
    let m = r.as_object_mut().expect("an object");
    m.insert("stats_per_client".into(), json!(a.files));
    m.insert("slowest_client_ops_per_s".into(), json!(round1(slow.median)));
    m.insert("slowest_client_min".into(), json!(round1(slow.min)));
    m.insert("slowest_client_max".into(), json!(round1(slow.max)));
    m.insert("per_client_ops_per_s".into(), json!(per_client));
    eprintln!(
        "servers {} clients {n}: stat storm {} ops/s, slowest client {} ops/s",
        target.servers, r["ops_per_s"], r["slowest_client_ops_per_s"]
    );
    Ok(vec![r])
}

/// `weft bench meta --procs N`: mdtest's create, stat, readdir and remove with N client processes, each with its
/// share of `--files` in its own directory (or all in one with `--shared`); ops/s is a phase's operations over
/// the time from the release of the processes to the last one's end (readdir counts entries).
async fn measure_aggregate(target: &crate::common::Target, a: &MetaArgs) -> Result<Vec<serde_json::Value>> {
    use crate::common::{Headline, OpRuns};
    let n = a.procs;
    let client = Client::connect(&target.cfg).await?;
    let root = client.resolve("/").await?.ino;
    let top = format!("bench-metap-{}-s{}-p{n}", std::process::id(), target.servers);
    let top_ino = client.mkdir(root, &top, 0o755).await?.ino;
    let share = |i: usize, files: u64| files / n as u64 + u64::from((i as u64) < files % n as u64);
    // Run 0 is the warm-up, with at most 64 files per process.
    let files_of = |run: usize| if run == 0 { (64 * n as u64).min(a.files) } else { a.files };
    let mut phases: Vec<Vec<serde_json::Value>> = vec![Vec::new(); n];
    for run in 0..=a.common.runs {
        let run_ino = client.mkdir(top_ino, &format!("run{run}"), 0o755).await?.ino;
        let files = files_of(run);
        for (i, ph) in phases.iter_mut().enumerate() {
            let dir = if a.shared { "shared".to_string() } else { format!("c{i}") };
            if !a.shared || i == 0 {
                client.mkdir(run_ino, &dir, 0o755).await?;
            }
            let path = format!("/{top}/run{run}/{dir}");
            let m = |op: &str| json!({"op": op, "dir": path, "prefix": format!("f{i}."), "count": share(i, files)});
            let expect = if a.shared { files } else { share(i, files) };
            ph.extend([m("create"), m("stat"), json!({"op": "readdir", "dir": path, "expect": expect}), m("remove")]);
        }
    }
    let mut w = Workers::spawn(&target.cfg, phases).await?;
    let mut ops: [OpRuns; 4] = Default::default();
    let mut fabrics = Vec::new();
    for run in 0..=a.common.runs {
        let load = crate::ceilings::load1();
        for o in ops.iter_mut() {
            let p = w.phase().await?;
            fabrics.push(p.fabric());
            if run > 0 {
                let bytes = p.bytes();
                o.push(p.ops(), bytes, p.secs, p.cpu_s(), &mut p.lat_us())?;
                o.push_load(load);
            }
        }
    }
    w.finish().await?;
    for run in 0..=a.common.runs {
        let run_ino = client.resolve(&format!("/{top}/run{run}")).await?.ino;
        for i in 0..if a.shared { 1 } else { n } {
            client.rmdir(run_ino, &if a.shared { "shared".to_string() } else { format!("c{i}") }).await?;
        }
        client.rmdir(top_ino, &format!("run{run}")).await?;
    }
    client.rmdir(root, &top).await?;
    client.close().await;
    let base = json!({
        "system": "weft",
        "fabric": crate::common::merge_fabrics(fabrics.iter().map(String::as_str)),
        "mode": if a.shared { "shared" } else { "private" },
        "servers": target.servers,
        "clients": n,
        "procs": n,
        "threads": 1,
        "files": a.files,
        "directories": if a.shared { 1 } else { n },
    });
    Ok(ops
        .iter()
        .zip(["create", "stat", "readdir", "remove"])
        .map(|(o, op)| o.result(&base, op, Headline::OpsPerS))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_starts_at_its_service_and_goes_on_with_the_others_in_order() {
        assert_eq!(common::starting_at("a:1, b:2,c:3", 0), "a:1,b:2,c:3");
        assert_eq!(common::starting_at("a:1,b:2,c:3", 1), "b:2,c:3,a:1");
        assert_eq!(common::starting_at("a:1,b:2,c:3", 5), "c:3,a:1,b:2");
        assert_eq!(common::starting_at("a:1", 7), "a:1");
    }

    #[test]
    fn shares_cover_every_file_once() {
        for (files, n) in [(10u64, 3usize), (9, 3), (1, 1), (20_000, 8), (7, 7)] {
            let all: Vec<String> = (0..n).flat_map(|i| file_names(i, n, files)).collect();
            assert_eq!(all.len() as u64, files);
            let mut dedup = all.clone();
            dedup.sort();
            dedup.dedup();
            assert_eq!(dedup.len(), all.len(), "names are unique across clients");
            let sizes: Vec<usize> = (0..n).map(|i| file_names(i, n, files).len()).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }
    }
}
