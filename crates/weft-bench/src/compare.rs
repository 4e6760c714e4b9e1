//! `weft bench compare`: the same workloads on Weft and on every peer that can run them, in one run, with Weft's
//! ratio to each.
//!
//! Systems: `weft` (its FUSE mount, through fio and a create/stat loop, as `weft bench mount` does),
//! `weft-native` (the native client library in worker processes: sequential write and read, create and stat),
//! `local` (the local disk the others sit on, through the same fio jobs), `passthrough_ll` (libfuse's FUSE
//! ceiling over that disk), `glusterfs` (a 2-brick distributed volume, FUSE-mounted), `juicefs` and
//! `juicefs-everysec` (JuiceFS 1.4 FUSE-mounted, its metadata in a private Redis with `appendfsync always`, as
//! durable as Weft's, or `everysec`, JuiceFS's common setting; data in a local directory), `nfs-ganesha` (its VFS
//! backend, read with libnfs's `nfs-cat`: fio here has no NFS engine, and libnfs 4.0's NFSv4 writes fail against
//! ganesha, so only the sequential read), and
//! the ceilings `iperf3` (loopback TCP) and `memcpy`.
//!
//! Loads: the 1-minute load average is recorded before and after every run of every system. When the loads
//! before the runs of two systems differ by more than `--load-threshold` (default 1.0: one busy core's worth on
//! this 2-core machine) their ratios were taken under different conditions: the output says so loudly, the JSON
//! carries `"load_mismatch": true`, and with `--refuse-load-mismatch` the command fails instead. The bench's own
//! processes raise the load too (a FUSE daemon plus servers more than one fio), which the threshold tolerates.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use crate::ceilings;
use crate::common::{self, Loads, round1, round3};
use crate::doc::Document;
use crate::mount::{self, FIGURES, Figure, MountArgs, label};
use crate::stats::summarize;
use crate::worker::Workers;

#[derive(Args, Clone, Debug)]
pub struct CompareArgs {
    /// Data servers of the Weft cluster.
    #[arg(long, default_value_t = 2)]
    pub servers: u32,
    /// File size of the sequential jobs (fio, nfs-cat, the native client).
    #[arg(long, default_value = "512M")]
    pub size: String,
    /// Seconds of each random 4 KiB fio job.
    #[arg(long, default_value_t = 3)]
    pub random_seconds: u32,
    /// fio jobs (threads) of the random 4 KiB jobs.
    #[arg(long, default_value_t = 2)]
    pub random_jobs: u32,
    /// File size of each random job.
    #[arg(long, default_value = "64M")]
    pub random_size: String,
    /// Files created then stat'ed by the metadata loop.
    #[arg(long, default_value_t = 2000)]
    pub files: u32,
    /// Threads of the metadata loop (processes for weft-native).
    #[arg(long, default_value_t = 4)]
    pub threads: u32,
    /// Repetitions per figure (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Systems to measure, of `weft,weft-native,local,passthrough_ll,glusterfs,juicefs,juicefs-everysec,
    /// nfs-ganesha,iperf3,memcpy` (`juicefs`: JuiceFS 1.4 on a private Redis with `appendfsync always`;
    /// `juicefs-everysec`: with `everysec`).
    #[arg(
        long,
        default_value = "weft,weft-native,local,passthrough_ll,glusterfs,juicefs,juicefs-everysec,nfs-ganesha,iperf3,memcpy"
    )]
    pub systems: String,
    /// Seconds per iperf3 measurement.
    #[arg(long, default_value_t = 3)]
    pub iperf_seconds: u32,
    /// Largest difference of the 1-minute load average before runs of different systems that still counts as
    /// the same conditions.
    #[arg(long, default_value_t = 1.0)]
    pub load_threshold: f64,
    /// Fail instead of warning when the loads differ by more than --load-threshold.
    #[arg(long)]
    pub refuse_load_mismatch: bool,
    /// The fabric Weft's clients (the FUSE mount, the native workers) reach the data servers by: tcp, shm or rdma
    /// (auto: shm to same-host servers, rdma to others that offer it).
    #[arg(long, env = "WEFT_FABRIC", default_value = "tcp", value_name = "auto|tcp|shm|rdma")]
    pub fabric: weft_client::FabricChoice,
    /// Working directory on the local disk (default: a fresh one under /tmp).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write results here (an SVG chart is written beside it).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

const ALL: [&str; 10] = [
    "weft",
    "weft-native",
    "local",
    "passthrough_ll",
    "glusterfs",
    "juicefs",
    "juicefs-everysec",
    "nfs-ganesha",
    "iperf3",
    "memcpy",
];

/// The peers Weft's figures are divided by, in table order.
const PEERS: [&str; 8] =
    ["local", "passthrough_ll", "glusterfs", "juicefs", "juicefs-everysec", "nfs-ganesha", "iperf3", "memcpy"];

pub async fn run(a: CompareArgs) -> Result<()> {
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let systems: Vec<String> = a.systems.split(',').map(|s| s.trim().to_string()).collect();
    if let Some(bad) = systems.iter().find(|s| !ALL.contains(&s.as_str())) {
        bail!("unknown system {bad:?} (of {})", ALL.join(", "));
    }
    let size = crate::parse_bytes(&a.size).context("--size wants a size like 512M")?;
    let base =
        a.dir.clone().unwrap_or_else(std::env::temp_dir).join(format!("weft-bench-compare-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    let margs = MountArgs {
        servers: a.servers,
        size: a.size.clone(),
        random_seconds: a.random_seconds,
        random_jobs: a.random_jobs,
        random_size: a.random_size.clone(),
        files: a.files,
        threads: a.threads,
        runs: a.runs,
        systems: String::new(),
        fabric: a.fabric,
        dir: None,
        json: None,
    };
    let doc = Document::start("compare");
    let pb = common::progress(systems.len() as u64, "compare");
    let mut figs: Vec<(Figure, Loads)> = Vec::new();
    let result = async {
        for sys in &systems {
            pb.set_message(sys.clone());
            pb.suspend(|| eprintln!("measuring {sys} under {}", base.display()));
            match sys.as_str() {
                "weft" | "local" | "passthrough_ll" | "glusterfs" | "juicefs" | "juicefs-everysec" => {
                    mount::need("fio")?;
                    let target = match sys.as_str() {
                        "weft" => mount::start_weft(&base, a.servers, a.fabric).await?,
                        "local" => start_local(&base)?,
                        "passthrough_ll" => mount::start_passthrough(&base)?,
                        "juicefs" => crate::juicefs::start_on_redis(&base, "always")?,
                        "juicefs-everysec" => crate::juicefs::start_on_redis(&base, "everysec")?,
                        _ => mount::start_gluster(&base)?,
                    };
                    let m = margs.clone();
                    let (target, r) = tokio::task::spawn_blocking(move || {
                        let mut loads = Loads::default();
                        let r = mount::measure(&target, &m, &mut loads);
                        (target, r.map(|f| (f, loads)))
                    })
                    .await?;
                    drop(target);
                    let (f, loads) = r?;
                    figs.extend(f.into_iter().map(|f| (f, loads.clone())));
                }
                "weft-native" => figs.extend(native(&base, size, &a).await?),
                "nfs-ganesha" => figs.extend(ganesha(&base, size, &a)?),
                "iperf3" => {
                    let mut f = figure("iperf3", "read", Some("sequential"), None, "mib_per_s");
                    let mut loads = Loads::default();
                    for _ in 0..a.runs {
                        loads.start();
                        f.samples.push(ceilings::iperf3_mib_per_s(a.iperf_seconds).await?);
                        loads.end();
                    }
                    figs.push((f, loads));
                }
                "memcpy" => {
                    let mut f = figure("memcpy", "read", Some("sequential"), None, "mib_per_s");
                    let mut loads = Loads::default();
                    for _ in 0..a.runs {
                        loads.start();
                        f.samples.push(ceilings::memcpy_mib_per_s(256 << 20));
                        loads.end();
                    }
                    figs.push((f, loads));
                }
                _ => unreachable!("checked above"),
            }
            pb.inc(1);
        }
        anyhow::Ok(())
    }
    .await;
    pb.finish_and_clear();
    let _ = std::fs::remove_dir_all(&base);
    result?;

    let doc = document(doc, &figs, &a);
    let mismatch = doc.pointer("/config/load_check/mismatch").and_then(Value::as_bool).unwrap_or(false);
    let table = table(&doc);
    if mismatch {
        let msg = format!(
            "WARNING: the systems were measured under different loads (1-min load average before runs from {} to \
             {}, more than --load-threshold {} apart): the ratios below compare unlike conditions",
            doc.pointer("/config/load_check/min_before").unwrap_or(&Value::Null),
            doc.pointer("/config/load_check/max_before").unwrap_or(&Value::Null),
            a.load_threshold
        );
        eprintln!("{msg}");
        if a.refuse_load_mismatch {
            println!("{table}");
            bail!("{msg} (--refuse-load-mismatch)");
        }
    }
    common::emit(&doc, &table, a.json.as_deref(), chart)
}

fn figure(
    system: &'static str,
    op: &'static str,
    pattern: Option<&'static str>,
    record: Option<u64>,
    unit: &'static str,
) -> Figure {
    // The native client's fabric is what its workers report (see `native`); the peers' is tcp.
    let fabric = if system == "weft-native" { String::new() } else { "tcp".to_string() };
    Figure { system, fabric, op, pattern, record_bytes: record, unit, samples: vec![], cpu_s: vec![] }
}

/// The local disk itself: a plain directory (no mount).
fn start_local(base: &Path) -> Result<mount::Target> {
    let mnt = base.join("local");
    std::fs::create_dir_all(&mnt)?;
    Ok(mount::Target { system: "local", mnt, procs: vec![], cluster: None, gluster: None })
}

/// Weft's native client library, in worker processes: sequential write (fsync'ed) and read of `size` by one
/// process, then `--threads` processes creating and stat'ing `--files` files.
async fn native(base: &Path, size: u64, a: &CompareArgs) -> Result<Vec<(Figure, Loads)>> {
    let mut opts = weft_launch::LaunchOptions::new(crate::weft_exe()?, base.join("weft-native"), a.servers);
    opts.log_filter = "warn".into();
    let mut cluster = weft_launch::LocalCluster::start(opts).await?;
    let mut cfg = cluster.cluster_config();
    cfg.client.fabric = a.fabric;
    let r = async {
        let (mut w, mut r) = (
            figure("weft-native", "write", Some("sequential"), Some(1 << 20), "mib_per_s"),
            figure("weft-native", "read", Some("sequential"), Some(1 << 20), "mib_per_s"),
        );
        let mut loads = Loads::default();
        let data = |op: &str, path: &str, bytes: u64| {
            json!({"op": op, "path": path, "offset": 0, "bytes": bytes, "record": 1 << 20, "window": 8,
                "fsync": true, "create": true})
        };
        // Warm-up pass on a small file, then the runs.
        let mut phases = vec![data("write", "/warm", size.min(16 << 20)), data("read", "/warm", size.min(16 << 20))];
        for run in 0..a.runs {
            let p = format!("/seq{run}");
            phases.push(data("write", &p, size));
            phases.push(data("read", &p, size));
        }
        let mut workers = Workers::spawn(&cfg, vec![phases]).await?;
        workers.phase().await?;
        workers.phase().await?;
        for _ in 0..a.runs {
            loads.start();
            for f in [&mut w, &mut r] {
                let p = workers.phase().await?;
                f.fabric = common::merge_fabrics([f.fabric.as_str(), &p.fabric()]);
                let gib = p.bytes() as f64 / (1u64 << 30) as f64;
                f.samples.push(gib * 1024.0 / p.secs);
                f.cpu_s.push(p.cpu_s() / gib);
            }
            loads.end();
        }
        workers.finish().await?;

        // Metadata: `threads` processes, each its share of the files in one private directory.
        let (mut c, mut s) = (
            figure("weft-native", "create", None, None, "ops_per_s"),
            figure("weft-native", "stat", None, None, "ops_per_s"),
        );
        let procs = a.threads.max(1) as usize;
        let per = u64::from(a.files).div_ceil(procs as u64);
        let client = weft_client::Client::connect(&cfg).await?;
        let root = client.resolve("/").await?.ino;
        let mut phases: Vec<Vec<Value>> = vec![Vec::new(); procs];
        for run in 0..=a.runs {
            client.mkdir(root, &format!("meta{run}"), 0o755).await?;
            for (i, ph) in phases.iter_mut().enumerate() {
                let count = if run == 0 { per.min(64) } else { per };
                let m = |op: &str| json!({"op": op, "dir": format!("/meta{run}"), "prefix": format!("p{i}."), "count": count});
                ph.extend([m("create"), m("stat"), m("remove")]);
            }
        }
        let mut workers = Workers::spawn(&cfg, phases).await?;
        for run in 0..=a.runs {
            if run > 0 {
                loads.start();
            }
            // create, stat, then remove (not reported: it clears the directory).
            for f in [Some(&mut c), Some(&mut s), None] {
                let p = workers.phase().await?;
                if run > 0
                    && let Some(f) = f
                {
                    f.fabric = common::merge_fabrics([f.fabric.as_str(), &p.fabric()]);
                    f.samples.push(p.ops() as f64 / p.secs);
                    f.cpu_s.push(p.cpu_s() * 1e6 / p.ops().max(1) as f64);
                }
            }
            if run > 0 {
                loads.end();
            }
        }
        workers.finish().await?;
        client.close().await;
        anyhow::Ok(vec![(w, loads.clone()), (r, loads.clone()), (c, loads.clone()), (s, loads)])
    }
    .await;
    cluster.stop().await;
    r
}

/// nfs-ganesha with its VFS backend as a plain process (NFSv4 on a free loopback port, no rpcbind), read with
/// libnfs's `nfs-cat`; stopped on drop.
struct Ganesha {
    child: Child,
    url: String,
    export: PathBuf,
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_ganesha(base: &Path) -> Result<Ganesha> {
    mount::need("ganesha.nfsd").context("nfs-ganesha: Debian packages nfs-ganesha nfs-ganesha-vfs")?;
    mount::need("nfs-cat").context("nfs-cat: Debian package libnfs-utils")?;
    let dir = base.join("ganesha");
    let export = dir.join("export");
    std::fs::create_dir_all(&export)?;
    std::fs::create_dir_all(dir.join("recov"))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let conf = dir.join("ganesha.conf");
    std::fs::write(
        &conf,
        format!(
            "NFS_CORE_PARAM {{ Protocols = 4; NFS_Port = {port}; Bind_addr = 127.0.0.1; Enable_RQUOTA = false; \
             Enable_NLM = false; }}\n\
             NFSV4 {{ Graceless = true; RecoveryBackend = fs; RecoveryRoot = {recov}; }}\n\
             EXPORT_DEFAULTS {{ Access_Type = RW; Squash = No_Root_Squash; SecType = sys; }}\n\
             EXPORT {{ Export_Id = 1; Path = {export}; Pseudo = /export; Protocols = 4; Transports = TCP; \
             FSAL {{ Name = VFS; }} }}\n\
             LOG {{ Default_Log_Level = EVENT; }}\n",
            recov = dir.join("recov").display(),
            export = export.display()
        ),
    )?;
    let child = Command::new("ganesha.nfsd")
        .arg("-F")
        .arg("-f")
        .arg(&conf)
        .arg("-L")
        .arg(dir.join("ganesha.log"))
        .arg("-p")
        .arg(dir.join("ganesha.pid"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting ganesha.nfsd")?;
    let g = Ganesha { child, url: format!("nfs://127.0.0.1/export/%s?version=4&nfsport={port}"), export };
    // Ready once its port accepts and nfs-ls lists the export.
    let t = Instant::now();
    loop {
        let ok = Command::new("nfs-ls")
            .arg(g.url.replace("%s", ""))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(g);
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("nfs-ganesha did not serve {} within 30 s (log: {})", g.url, dir.join("ganesha.log").display());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Sequential read of a `size` file through libnfs (`nfs-cat` into /dev/null); the time of each read is its
/// process's wall time (connecting included: a few ms against the transfer), the CPU that of the reaped `nfs-cat`.
///
/// Writes are not measured: libnfs 4.0.0 (Debian 12's) fails every NFSv4 WRITE to ganesha with "ZDR error:
/// Failed to encode COMPOUND4args" (nfs-cp creates the file, then writes nothing), and NFSv3 needs rpcbind. The
/// file read is therefore laid down directly in the export directory, beneath the server.
fn ganesha(base: &Path, size: u64, a: &CompareArgs) -> Result<Vec<(Figure, Loads)>> {
    let g = start_ganesha(base)?;
    {
        let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        let mut f = std::fs::File::create(g.export.join("seq"))?;
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            std::io::Write::write_all(&mut f, &chunk[..n])?;
            left -= n as u64;
        }
        f.sync_all()?;
    }
    let url = g.url.replace("%s", "seq");
    let cat = || -> Result<(f64, f64)> {
        let (t, c) = (Instant::now(), ceilings::children_cpu_seconds());
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
        let status = Command::new("nfs-cat").arg(&url).stdout(null).status().context("running nfs-cat")?;
        if !status.success() {
            bail!("nfs-cat {url}: {status}");
        }
        Ok((t.elapsed().as_secs_f64(), ceilings::children_cpu_seconds() - c))
    };
    let mut r = figure("nfs-ganesha", "read", Some("sequential"), None, "mib_per_s");
    let gib = size as f64 / (1u64 << 30) as f64;
    let mut loads = Loads::default();
    cat()?; // warm-up
    for _ in 0..a.runs {
        loads.start();
        let (secs, cpu) = cat()?;
        loads.end();
        r.samples.push(gib * 1024.0 / secs);
        r.cpu_s.push(cpu / gib);
    }
    drop(g);
    Ok(vec![(r, loads)])
}

/// The key of a figure in tables: `write`, `read`, `randread`, ...
fn key(r: &Value) -> String {
    label(r["op"].as_str().unwrap_or(""), r["pattern"].as_str())
}

fn headline(r: &Value) -> Option<f64> {
    r.get("mib_per_s").or_else(|| r.get("ops_per_s")).and_then(Value::as_f64)
}

/// Builds the result document: one result per system and figure, Weft's ratios to each peer, the load check.
fn document(doc: Document, figs: &[(Figure, Loads)], a: &CompareArgs) -> Value {
    let mut results = Vec::new();
    for (f, loads) in figs {
        let Some(s) = summarize(&f.samples) else { continue };
        let mut r = json!({
            "system": f.system,
            "fabric": f.fabric,
            "servers": match f.system { "weft" | "weft-native" => a.servers, "glusterfs" => 2, _ => 1 },
            "clients": 1,
            "op": f.op,
            "pattern": f.pattern,
            "record_bytes": f.record_bytes,
            f.unit: round1(s.median),
            "runs": s.runs,
            "min": round1(s.min),
            "max": round1(s.max),
        });
        mount::add_cpu(&mut r, f);
        loads.annotate(&mut r);
        results.push(r);
    }
    // Ratios: Weft's FUSE mount to every peer with the same figure, and the native client to the peers it can
    // be compared with (a user-space NFS client, the ceilings).
    let mut ratios = Vec::new();
    for weft in ["weft", "weft-native"] {
        for w in results.iter().filter(|r| r["system"] == weft) {
            for peer in PEERS {
                let same = |r: &&Value| {
                    r["system"] == peer
                        && (key(r) == key(w) || (matches!(peer, "iperf3" | "memcpy") && w["pattern"] == "sequential"))
                };
                if let (Some(p), Some(x)) = (results.iter().find(same).and_then(headline), headline(w))
                    && p > 0.0
                {
                    ratios.push(json!({"system": weft, "figure": key(w), "peer": peer, "ratio": round3(x / p)}));
                }
            }
        }
    }
    // Every load seen before a run, per system.
    let befores: Vec<f64> = figs.iter().flat_map(|(_, l)| l.before.iter().copied()).collect();
    let (lo, hi) = (befores.iter().copied().fold(f64::INFINITY, f64::min), befores.iter().copied().fold(0.0, f64::max));
    let mismatch = !befores.is_empty() && hi - lo > a.load_threshold;
    let config = json!({
        "seq_size": a.size,
        "random_seconds": a.random_seconds,
        "random_jobs": a.random_jobs,
        "random_size": a.random_size,
        "files": a.files,
        "threads": a.threads,
        "runs": a.runs,
        "servers": a.servers,
        "load_check": {
            "threshold": a.load_threshold,
            "min_before": if befores.is_empty() { Value::Null } else { json!(lo) },
            "max_before": if befores.is_empty() { Value::Null } else { json!(hi) },
            "mismatch": mismatch,
        },
        "notes": "weft = Weft's FUSE mount under fio; weft-native = the client library in a worker process \
                  (writes fsync'ed); nfs-ganesha = nfs-cat reads (libnfs 4.0 NFSv4 writes fail); iperf3/memcpy are \
                  ceilings, compared with sequential figures",
    });
    let mut doc = doc.finish(config, json!({}), results);
    doc["load_mismatch"] = json!(mismatch);
    doc["ratios"] = json!(ratios);
    doc
}

/// A Markdown table: one row per figure, one column per system, then Weft's ratios.
pub fn table(doc: &Value) -> String {
    let results = doc["results"].as_array().cloned().unwrap_or_default();
    let ratios = doc["ratios"].as_array().cloned().unwrap_or_default();
    let systems: Vec<&str> =
        ALL.iter().copied().filter(|s| results.iter().any(|r| r["system"] == *s)).collect::<Vec<_>>();
    let mut s = String::new();
    if doc["load_mismatch"] == true {
        s.push_str("**WARNING: measured under different loads (see config.load_check); ratios are suspect.**\n\n");
    }
    s.push_str("| figure | unit |");
    for sys in &systems {
        s.push_str(&format!(" {sys} |"));
    }
    s.push_str("\n|---|---|");
    s.push_str(&"---:|".repeat(systems.len()));
    s.push('\n');
    let mut figures: Vec<String> = FIGURES.iter().map(|&(op, p, _, _)| label(op, p)).collect();
    figures.dedup();
    for fig in &figures {
        let row: Vec<&Value> = results.iter().filter(|r| key(r) == *fig).collect();
        if row.is_empty() {
            continue;
        }
        let unit = if row[0].get("mib_per_s").is_some() { "MiB/s" } else { "ops/s" };
        s.push_str(&format!("| {fig} | {unit} |"));
        for sys in &systems {
            let cell = row
                .iter()
                .find(|r| r["system"] == *sys)
                .and_then(|r| headline(r))
                .map(|x| format!("{x:.0}"))
                .unwrap_or("-".into());
            s.push_str(&format!(" {cell} |"));
        }
        s.push('\n');
    }
    for (name, unit) in [("iperf3", "MiB/s"), ("memcpy", "MiB/s")] {
        if let Some(r) = results.iter().find(|r| r["system"] == name) {
            s.push_str(&format!("\nceiling {name}: {:.0} {unit}", headline(r).unwrap_or(f64::NAN)));
        }
    }
    s.push_str("\n\n| Weft | figure | ÷ peer | ratio |\n|---|---|---|---:|\n");
    for r in &ratios {
        s.push_str(&format!(
            "| {} | {} | {} | {:.2} |\n",
            r["system"].as_str().unwrap_or("?"),
            r["figure"].as_str().unwrap_or("?"),
            r["peer"].as_str().unwrap_or("?"),
            r["ratio"].as_f64().unwrap_or(f64::NAN)
        ));
    }
    s
}

/// Weft's ratios to its peers, one bar each (1.0 = parity).
pub fn chart(doc: &Value) -> String {
    let bars: Vec<crate::chart::Bar> = doc["ratios"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| crate::chart::Bar {
            value: r["ratio"].as_f64().unwrap_or(0.0),
            min: None,
            max: None,
            label: r["figure"].as_str().unwrap_or("").to_string(),
            sublabel: format!(
                "{}÷{}",
                if r["system"] == "weft" { "fuse" } else { "native" },
                r["peer"].as_str().unwrap_or("")
            ),
            color: if r["system"] == "weft" { "#3b7dd8" } else { "#e08a2c" },
        })
        .collect();
    crate::chart::bars_svg("weft bench compare: Weft ÷ peer (1.0 = parity)", &bars)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(system: &'static str, op: &'static str, x: f64, unit: &'static str) -> (Figure, Loads) {
        let mut f = figure(system, op, if unit == "mib_per_s" { Some("sequential") } else { None }, None, unit);
        f.samples = vec![x, x * 1.1, x * 0.9];
        f.cpu_s = vec![1.0, 1.0, 1.0];
        (f, Loads::default())
    }

    fn args(threshold: f64) -> CompareArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            a: CompareArgs,
        }
        P::parse_from(["x", "--load-threshold", &threshold.to_string()]).a
    }

    #[test]
    fn ratios_and_load_check() {
        let mut figs = vec![
            fig("weft", "write", 300.0, "mib_per_s"),
            fig("glusterfs", "write", 100.0, "mib_per_s"),
            fig("weft", "create", 1000.0, "ops_per_s"),
            fig("glusterfs", "create", 500.0, "ops_per_s"),
            fig("iperf3", "read", 3000.0, "mib_per_s"),
        ];
        figs[0].1.before = vec![1.0, 1.2];
        figs[1].1.before = vec![3.5];
        let doc = document(Document::start("compare"), &figs, &args(1.0));
        let ratio = |peer: &str, figure: &str| {
            doc["ratios"].as_array().unwrap().iter().find(|r| r["peer"] == peer && r["figure"] == figure).unwrap()
                ["ratio"]
                .as_f64()
                .unwrap()
        };
        assert_eq!(ratio("glusterfs", "write"), 3.0);
        assert_eq!(ratio("glusterfs", "create"), 2.0);
        assert_eq!(ratio("iperf3", "write"), 0.1);
        assert_eq!(doc["load_mismatch"], true);
        assert!(table(&doc).contains("WARNING"));
        assert!(chart(&doc).starts_with("<svg"));
        let calm = document(Document::start("compare"), &figs, &args(5.0));
        assert_eq!(calm["load_mismatch"], false);
        assert!(!table(&calm).contains("WARNING"));
    }
}
