//! `weft bench nfs`: Weft's NFS gateway (`weft nfs`, crate weft-nfs) and nfs-ganesha (VFS backend) over the same
//! disk, measured in one run by the same client code: libnfs as a library ([`libnfs`], its synchronous API on one
//! thread, NFSv3, one TCP connection per server). Workloads, each `--runs` times: sequential 1 MiB writes of a
//! `--size` file (COMMIT included: `nfs_fsync` before close), sequential 1 MiB reads of it, and a loop creating,
//! stat'ing and removing `--files` empty files in the export's root (one RPC round trip per call, as a `creat`,
//! `stat` or `unlink` of a program on a mount; the loop runs in the bench process, so no process start-up is
//! measured). Every byte read is checked against what was written once per system, outside the timing.
//!
//! Reported per system and figure: the median over the runs with min and max, the client's CPU (the thread that
//! runs libnfs) and the server's CPU (utime+stime from /proc/PID/stat before and after each run: for Weft the
//! gateway, the MDS and every data server; for ganesha its one process) per GiB moved or per operation; and
//! Weft's `ratio_to_ganesha` with the issue's target (≥ 1.0× for sequential read and write, ≥ 1.5× for creates
//! and stats).
//!
//! How both servers are reached the same way: NFSv3 is the common ground. libnfs 4.0's NFSv4 WRITE fails against
//! ganesha ("ZDR error: Failed to encode COMPOUND4args"), and Weft's gateway serves NFSv3 and NFSv4.1 only, so
//! both are mounted with `nfs://127.0.0.1/PATH?version=3&nfsport=N&mountport=M`: the ports are given, the client
//! never asks a portmapper. Weft's gateway serves NFS and MOUNT on one port and needs no rpcbind. ganesha (4.3)
//! binds NFS_Port and MNT_Port as configured, but it registers every program with rpcbind at start-up and exits
//! when that fails ("Cannot register NFS V3 on TCP"), and there is no switch to skip registration. So it is
//! started with a private rpcbind that leaves the host alone:
//!
//! ```text
//! unshare --pid --fork --kill-child --mount --propagation private -- sh -c '
//!     mount -t tmpfs weft-bench-run /run            # a private /run: rpcbind's socket and lock live here
//!     unshare --net rpcbind -f -w &                 # its own network namespace: port 111 is not the host's
//!     (wait for /run/rpcbind.sock)
//!     exec ganesha.nfsd -F -f CONF ...'             # host network, private /run: registers over the socket
//! ```
//!
//! ganesha registers through rpcbind's unix socket (`/run/rpcbind.sock`, found through the private /run) and
//! serves NFS and MOUNT on 127.0.0.1 in the host's network namespace. Its pid namespace makes it init there, so
//! when it is killed the kernel kills rpcbind too. This needs root (mount and network namespaces) and the
//! packages nfs-ganesha, nfs-ganesha-vfs and rpcbind: without any of them ganesha is skipped with a note in the
//! output and in `config.skipped`, and Weft is measured alone. The export is a plain directory under the bench's
//! base directory, beside Weft's cluster directory: the same disk. ganesha is run with `Squash = No_Root_Squash`
//! and Weft's gateway with `--no-root-squash` (the bench calls as root; both then check permissions as root).
//! NFSv3 mounts ganesha's export by its `Path` (ganesha's `Pseudo` path is NFSv4's).

mod client41;
mod libnfs;
mod pnfs;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use crate::ceilings;
use crate::common::{self, Loads, round1, round3};
use crate::doc::Document;
use crate::stats::summarize;

use libnfs::Nfs;

#[derive(Args, Clone, Debug)]
pub struct NfsArgs {
    /// Size of the file written then read sequentially in 1 MiB records.
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// Files created, stat'ed and removed per run.
    #[arg(long, default_value_t = 2000)]
    pub files: u32,
    /// Repetitions per figure (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Systems to measure, of `weft,nfs-ganesha`.
    #[arg(long, default_value = "weft,nfs-ganesha")]
    pub systems: String,
    /// Data servers of the Weft cluster.
    #[arg(long, default_value_t = 2)]
    pub servers: u32,
    /// Base directory on the disk to measure (default: a fresh one under /tmp); each system gets a fresh
    /// subdirectory, all removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write results here (an SVG chart is written beside it).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// pNFS instead (issue 15): for each of `--pnfs-servers`, a fresh cluster with every data server serving
    /// pNFS; 1 MiB writes and reads through pNFS and through the gateway only (the same NFSv4.1 client), and
    /// nfs-ganesha's (libnfs, NFSv3) in the same run. Metadata figures and the NFSv3 gateway are not measured.
    #[arg(long)]
    pub pnfs: bool,
    /// Data-server counts measured with `--pnfs`.
    #[arg(long, default_value = "1,2,4")]
    pub pnfs_servers: String,
    /// Run Weft's gateway with `--no-metadata-leases` (every GETATTR and LOOKUP asks the MDS), to measure what
    /// its lease cache is worth.
    #[arg(long)]
    pub no_metadata_leases: bool,
}

const ALL: [&str; 2] = ["weft", "nfs-ganesha"];
const RECORD_BYTES: usize = 1 << 20;
/// The issue's targets: Weft ÷ ganesha, per figure.
const TARGETS: [(&str, f64); 4] = [("write", 1.0), ("read", 1.0), ("create", 1.5), ("stat", 1.5)];
/// Figures in table order.
const OPS: [&str; 5] = ["write", "read", "create", "stat", "remove"];

/// The measurements of one figure of one system over the runs.
#[derive(Debug, Clone)]
struct Fig {
    system: &'static str,
    op: &'static str,
    /// MiB/s (write, read) or ops/s (create, stat, remove).
    samples: Vec<f64>,
    /// Client and server CPU seconds per GiB (data) or µs per op (metadata), per run.
    client_cpu: Vec<f64>,
    server_cpu: Vec<f64>,
    loads: Loads,
    /// Bytes read back and compared with what was written (once, untimed; the read figure carries it).
    verified_bytes: Option<u64>,
}

impl Fig {
    fn new(system: &'static str, op: &'static str) -> Fig {
        Fig {
            system,
            op,
            samples: vec![],
            client_cpu: vec![],
            server_cpu: vec![],
            loads: Loads::default(),
            verified_bytes: None,
        }
    }
    fn is_data(&self) -> bool {
        matches!(self.op, "write" | "read")
    }
}

/// A server being measured: where libnfs mounts it and whose CPU is its cost.
struct Server {
    system: &'static str,
    url: String,
    pids: Vec<u32>,
}

pub async fn run(a: NfsArgs) -> Result<()> {
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if a.files == 0 {
        bail!("--files must be at least 1");
    }
    let systems: Vec<String> = a.systems.split(',').map(|s| s.trim().to_string()).collect();
    if let Some(bad) = systems.iter().find(|s| !ALL.contains(&s.as_str())) {
        bail!("unknown system {bad:?} (of {})", ALL.join(", "));
    }
    let size = crate::parse_bytes(&a.size).filter(|&s| s > 0).context("--size wants a size like 1G")?;
    if a.pnfs {
        return run_pnfs(&a, &systems, size).await;
    }
    libnfs::available().map_err(|e| anyhow::anyhow!("weft bench nfs needs libnfs: {e}"))?;
    let base = a.dir.clone().unwrap_or_else(std::env::temp_dir).join(format!("weft-bench-nfs-{}", std::process::id()));
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let doc = Document::start("nfs");
    let mut figs: Vec<Fig> = Vec::new();
    let mut skipped = serde_json::Map::new();
    let result = async {
        for sys in &systems {
            eprintln!("measuring {sys} under {}", base.display());
            match sys.as_str() {
                "weft" => {
                    let dir = base.join("weft");
                    let mut opts = weft_launch::LaunchOptions::new(crate::weft_exe()?, &dir, a.servers);
                    opts.log_filter = "warn".into();
                    let mut cluster = weft_launch::LocalCluster::start(opts).await?;
                    let r = async {
                        let client = cluster.client().await?;
                        client.mkdir(1, "bench", 0o777).await?;
                        client.close().await;
                        let mut g = cluster
                            .start_nfs(&weft_launch::NfsOptions {
                                root_squash: false,
                                extra_args: a
                                    .no_metadata_leases
                                    .then(|| "--no-metadata-leases".into())
                                    .into_iter()
                                    .collect(),
                                ..Default::default()
                            })
                            .await?;
                        let mut pids = cluster.pids();
                        pids.extend(g.pid());
                        let p = g.port();
                        let server = Server {
                            system: "weft",
                            url: format!("nfs://127.0.0.1/bench?version=3&nfsport={p}&mountport={p}"),
                            pids,
                        };
                        let r = measure_blocking(server, size, a.files, a.runs, false).await;
                        g.stop().await;
                        r
                    }
                    .await;
                    cluster.stop().await;
                    let _ = std::fs::remove_dir_all(&dir);
                    figs.extend(r?);
                }
                "nfs-ganesha" => match Ganesha::start(&base.join("ganesha"))? {
                    Err(why) => {
                        eprintln!("nfs-ganesha skipped: {why}");
                        skipped.insert("nfs-ganesha".into(), json!(why));
                    }
                    Ok(g) => {
                        let server = Server { system: "nfs-ganesha", url: g.url.clone(), pids: vec![g.pid] };
                        let r = measure_blocking(server, size, a.files, a.runs, false).await;
                        drop(g);
                        let _ = std::fs::remove_dir_all(base.join("ganesha"));
                        figs.extend(r?);
                    }
                },
                _ => unreachable!("checked above"),
            }
        }
        anyhow::Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&base);
    result?;
    let doc = document(doc, &figs, &a, size, Value::Object(skipped));
    common::emit(&doc, &table(&doc), a.json.as_deref(), chart)
}

async fn measure_blocking(server: Server, size: u64, files: u32, runs: usize, data_only: bool) -> Result<Vec<Fig>> {
    tokio::task::spawn_blocking(move || measure(&server, size, files, runs, data_only)).await?
}

/// `--pnfs`: each data-server count's cluster, both ways, then nfs-ganesha's data figures; one document.
async fn run_pnfs(a: &NfsArgs, systems: &[String], size: u64) -> Result<()> {
    let counts: Vec<u32> = a
        .pnfs_servers
        .split(',')
        .map(|s| s.trim().parse::<u32>().ok().filter(|&n| (1..=256).contains(&n)))
        .collect::<Option<_>>()
        .context("--pnfs-servers wants counts like 1,2,4")?;
    let base = a.dir.clone().unwrap_or_else(std::env::temp_dir).join(format!("weft-bench-pnfs-{}", std::process::id()));
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let doc = Document::start("nfs");
    let (mut figs, mut pfigs) = (Vec::new(), Vec::new());
    let mut skipped = serde_json::Map::new();
    let result = async {
        for &n in &counts {
            eprintln!("measuring pNFS and the gateway with {n} data servers under {}", base.display());
            pfigs.extend(pnfs::measure_cluster(&base, n, size, a.runs).await?);
        }
        if systems.iter().any(|s| s == "nfs-ganesha") {
            if let Err(e) = libnfs::available() {
                skipped.insert("nfs-ganesha".into(), json!(format!("libnfs is not available: {e}")));
            } else {
                match Ganesha::start(&base.join("ganesha"))? {
                    Err(why) => {
                        eprintln!("nfs-ganesha skipped: {why}");
                        skipped.insert("nfs-ganesha".into(), json!(why));
                    }
                    Ok(g) => {
                        let server = Server { system: "nfs-ganesha", url: g.url.clone(), pids: vec![g.pid] };
                        let r = measure_blocking(server, size, a.files, a.runs, true).await;
                        drop(g);
                        figs.extend(r?);
                    }
                }
            }
        }
        anyhow::Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&base);
    result?;
    let mut doc = document(doc, &figs, a, size, Value::Object(skipped));
    add_pnfs(&mut doc, &pfigs, size);
    common::emit(&doc, &table(&doc), a.json.as_deref(), chart)
}

/// The pNFS figures into the document: `system` `weft-pnfs` or `weft-gateway` (NFSv4.1, the same client), each
/// with the gateway's, the MDS's and the data servers' CPU apart, `ratio_to_gateway` (pNFS ÷ gateway-only at the
/// same server count) and `ratio_to_ganesha`; the issue's targets on pNFS reads.
fn add_pnfs(doc: &mut Value, figs: &[pnfs::PFig], size: u64) {
    let med = |v: &[f64]| summarize(v).map(|s| round3(s.median));
    let mut out: Vec<Value> = Vec::new();
    for f in figs {
        let Some(s) = summarize(&f.samples) else { continue };
        let mut r = json!({
            "system": format!("weft-{}", f.path),
            "fabric": "tcp",
            "servers": f.servers,
            "clients": 1,
            "protocol": "nfs4.1",
            "op": f.op,
            "pattern": "sequential",
            "record_bytes": RECORD_BYTES,
            "stripe_unit": pnfs::STRIPE_UNIT,
            "window_per_server": pnfs::WINDOW,
            "size_bytes": size,
            "mib_per_s": round1(s.median),
            "runs": s.runs,
            "min": round1(s.min),
            "max": round1(s.max),
            "client_cpu_s_per_gib": med(&f.client_cpu),
            "gateway_cpu_s_per_gib": med(&f.gateway_cpu),
            "mds_cpu_s_per_gib": med(&f.mds_cpu),
            "ds_cpu_s_per_gib": med(&f.ds_cpu),
        });
        if let Some(v) = f.verified_bytes {
            r["verified_bytes"] = json!(v);
        }
        f.loads.annotate(&mut r);
        out.push(r);
    }
    let results = doc["results"].as_array().cloned().unwrap_or_default();
    let ganesha =
        |op: &Value| results.iter().find(|r| r["system"] == "nfs-ganesha" && r["op"] == *op).and_then(headline);
    let snapshot = out.clone();
    for r in out.iter_mut() {
        let gw = snapshot
            .iter()
            .find(|g| g["system"] == "weft-gateway" && g["servers"] == r["servers"] && g["op"] == r["op"])
            .and_then(headline);
        if r["system"] == "weft-pnfs"
            && let (Some(x), Some(y)) = (headline(r), gw)
            && y > 0.0
        {
            let ratio = round3(x / y);
            r["ratio_to_gateway"] = json!(ratio);
            if r["op"] == "read" && r["servers"] == 4 {
                r["target_ratio_to_gateway"] = json!(PNFS_READ_TARGET);
                r["meets_target"] = json!(ratio >= PNFS_READ_TARGET);
            }
        }
        if let (Some(x), Some(y)) = (headline(r), ganesha(&r["op"]))
            && y > 0.0
        {
            r["ratio_to_ganesha"] = json!(round3(x / y));
        }
    }
    if let Some(a) = doc["results"].as_array_mut() {
        a.extend(out);
    }
    doc["config"]["pnfs"] = json!({
        "servers": figs.iter().map(|f| f.servers).collect::<std::collections::BTreeSet<_>>(),
        "stripe_unit": pnfs::STRIPE_UNIT,
        "window_per_server": pnfs::WINDOW,
        "client": "weft-bench's NFSv4.1 client (crate weft-nfs's XDR and layout code), one session per server, \
                   requests pipelined on one TCP connection each",
        "targets": { "read_4_servers_ratio_to_gateway": PNFS_READ_TARGET, "gateway_cpu_s_per_gib_with_pnfs": "near 0" },
        "notes": "weft-pnfs = OPEN, LAYOUTGET, GETDEVICEINFO, READ/WRITE at the data servers in parallel (UNSTABLE, \
                  COMMIT at each), LAYOUTCOMMIT, LAYOUTRETURN, CLOSE; weft-gateway = the same client's READ/WRITE \
                  at the gateway (no LAYOUTGET), COMMIT, CLOSE; nfs-ganesha = libnfs NFSv3 as in the plain bench",
    });
}

/// The issue's target: pNFS 1 MiB reads over 4 data servers ÷ the gateway-only path.
const PNFS_READ_TARGET: f64 = 1.5;

/// CPU seconds of the server's processes so far (a process that is gone counts nothing: the figures then
/// undercount, never fail).
fn server_cpu(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|&p| ceilings::process_cpu_seconds(p)).sum()
}

/// The bytes of the `record`-th 1 MiB record of the sequential file: a seeded pattern with the record's index in
/// its first 8 bytes, so a record read from the wrong place differs.
fn stamp(buf: &mut [u8], record: u64) {
    buf[..8].copy_from_slice(&record.to_le_bytes());
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// One timed run: the wall time, the client thread's and the server's CPU seconds.
struct Timed {
    secs: f64,
    client_cpu_s: f64,
    server_cpu_s: f64,
}

fn timed(pids: &[u32], f: impl FnOnce() -> Result<()>) -> Result<Timed> {
    let (c0, s0, t) = (ceilings::thread_cpu_seconds(), server_cpu(pids), Instant::now());
    f()?;
    let secs = t.elapsed().as_secs_f64();
    Ok(Timed {
        secs,
        client_cpu_s: ceilings::thread_cpu_seconds() - c0,
        server_cpu_s: (server_cpu(pids) - s0).max(0.0),
    })
}

fn nfs_err(e: String) -> anyhow::Error {
    anyhow::anyhow!(e)
}

/// Writes `size` bytes to `path` in 1 MiB records, then COMMITs.
fn write_file(nfs: &mut Nfs, path: &str, size: u64, buf: &mut [u8]) -> Result<()> {
    let f = nfs.create(path, libc::O_RDWR | libc::O_TRUNC, 0o644).map_err(nfs_err)?;
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(buf.len() as u64) as usize;
        stamp(buf, off / RECORD_BYTES as u64);
        nfs.pwrite(&f, off, &buf[..n]).map_err(nfs_err)?;
        off += n as u64;
    }
    nfs.fsync(&f).map_err(nfs_err)?;
    nfs.close(f).map_err(nfs_err)
}

/// Reads `path` in 1 MiB records; `check` sees each record with its offset. Fails unless exactly `size` bytes
/// come back.
fn read_file(
    nfs: &mut Nfs,
    path: &str,
    size: u64,
    buf: &mut [u8],
    mut check: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let f = nfs.open(path, libc::O_RDONLY).map_err(nfs_err)?;
    let mut off = 0u64;
    loop {
        let n = nfs.pread(&f, off, buf).map_err(nfs_err)?;
        if n == 0 {
            break;
        }
        check(off, &buf[..n])?;
        off += n as u64;
        if off > size {
            break;
        }
    }
    nfs.close(f).map_err(nfs_err)?;
    if off != size {
        bail!("read {off} bytes of {path}, wrote {size}");
    }
    Ok(())
}

/// Every workload against one server, on this thread.
fn measure(s: &Server, size: u64, files: u32, runs: usize, data_only: bool) -> Result<Vec<Fig>> {
    let mut nfs = Nfs::mount(&s.url).map_err(|e| anyhow::anyhow!("{}: {e}", s.system))?;
    let (rmax, wmax) = nfs.rwmax();
    eprintln!("{}: mounted {} (rtmax {rmax}, wtmax {wmax})", s.system, s.url);
    let gib = size as f64 / (1u64 << 30) as f64;
    let mut buf = pattern(RECORD_BYTES, 0x5eed);
    let mut rbuf = vec![0u8; RECORD_BYTES];
    // Warm-up (connections, caches, the servers' first allocations): a small file written, read and removed.
    let warm = size.min(16 << 20);
    write_file(&mut nfs, "/warm", warm, &mut buf)?;
    read_file(&mut nfs, "/warm", warm, &mut rbuf, |_, _| Ok(()))?;
    nfs.unlink("/warm").map_err(nfs_err)?;

    let (mut w, mut r) = (Fig::new(s.system, "write"), Fig::new(s.system, "read"));
    for _ in 0..runs {
        for f in [&mut w, &mut r] {
            f.loads.start();
            let t = if f.op == "write" {
                timed(&s.pids, || write_file(&mut nfs, "/seq", size, &mut buf))?
            } else {
                timed(&s.pids, || read_file(&mut nfs, "/seq", size, &mut rbuf, |_, _| Ok(())))?
            };
            f.loads.end();
            f.samples.push(gib * 1024.0 / t.secs);
            f.client_cpu.push(t.client_cpu_s / gib);
            f.server_cpu.push(t.server_cpu_s / gib);
        }
    }
    // Once, untimed: every byte of the last file written is what was written.
    let mut want = buf.clone();
    read_file(&mut nfs, "/seq", size, &mut rbuf, |off, got| {
        stamp(&mut want, off / RECORD_BYTES as u64);
        if got != &want[..got.len()] {
            bail!("{}: the record at offset {off} of /seq came back different", s.system);
        }
        Ok(())
    })?;
    r.verified_bytes = Some(size);
    nfs.unlink("/seq").map_err(nfs_err)?;
    if data_only {
        return Ok(vec![w, r]);
    }

    // Metadata: a warm-up round of a few files, then the runs; names unique per round.
    let (mut c, mut st, mut rm) =
        (Fig::new(s.system, "create"), Fig::new(s.system, "stat"), Fig::new(s.system, "remove"));
    for round in 0..=runs {
        let count = if round == 0 { files.min(64) } else { files };
        let names: Vec<String> = (0..count).map(|i| format!("/m{round}.{i}")).collect();
        for f in [&mut c, &mut st, &mut rm] {
            let t = timed(&s.pids, || {
                for n in &names {
                    match f.op {
                        "create" => {
                            let h = nfs.create(n, libc::O_RDWR, 0o644).map_err(nfs_err)?;
                            nfs.close(h).map_err(nfs_err)?;
                        }
                        "stat" => {
                            let a = nfs.stat(n).map_err(nfs_err)?;
                            if a.size != 0 {
                                bail!("{}: {n} has size {} after an empty create", s.system, a.size);
                            }
                        }
                        _ => nfs.unlink(n).map_err(nfs_err)?,
                    }
                }
                Ok(())
            })?;
            if round > 0 {
                let ops = f64::from(count);
                f.samples.push(ops / t.secs);
                f.client_cpu.push(t.client_cpu_s * 1e6 / ops);
                f.server_cpu.push(t.server_cpu_s * 1e6 / ops);
                f.loads.before.push(ceilings::load1());
                f.loads.end();
            }
        }
        if round == 0 {
            // The warm-up's files are gone: a stat of one must fail.
            if nfs.stat(&names[0]).is_ok() {
                bail!("{}: {} is still there after its remove", s.system, names[0]);
            }
        }
    }
    drop(nfs);
    Ok(vec![w, r, c, st, rm])
}

/// nfs-ganesha (VFS backend) serving NFSv3 and MOUNT on 127.0.0.1, with a private rpcbind (see the module doc);
/// killed on drop.
struct Ganesha {
    /// `unshare`, whose child (pid 1 of the new pid namespace) is ganesha.
    child: Child,
    /// ganesha's pid in the host's pid namespace.
    pid: u32,
    url: String,
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        // SIGKILL: ganesha is init of its pid namespace, which ignores other signals from outside; its death
        // kills rpcbind, and `unshare` (waiting for it) exits and reaps it.
        if self.pid != 0 {
            let _ = Command::new("kill").arg("-KILL").arg(self.pid.to_string()).status();
            // Let `unshare` reap it (killing `unshare` first would leave ganesha a zombie of init).
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Effective uid 0 (read from /proc/self/status: no FFI).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// `tool` is on the PATH, or in /usr/sbin or /sbin (where rpcbind lives, off a plain user's PATH).
fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("PATH=\"$PATH:/usr/sbin:/sbin\"; command -v {tool}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

const GANESHA_SCRIPT: &str = r#"set -e
PATH="$PATH:/usr/sbin:/sbin"
mount -t tmpfs -o mode=755 weft-bench-run /run
mkdir -p /run/rpcbind
unshare --net rpcbind -f -w &
i=0
while [ ! -S /run/rpcbind.sock ]; do
    i=$((i + 1)); [ "$i" -le 200 ] || { echo "rpcbind did not start" >&2; exit 1; }
    sleep 0.05
done
exec ganesha.nfsd -F -f "$1" -L "$2" -p "$3"
"#;

impl Ganesha {
    /// `Ok(Err(why))` when this machine cannot run it (not root, a package missing): the caller skips it.
    fn start(dir: &Path) -> Result<std::result::Result<Ganesha, String>> {
        if !is_root() {
            return Ok(Err("needs root (its private rpcbind runs in mount and network namespaces)".into()));
        }
        for (tool, pkg) in [("ganesha.nfsd", "nfs-ganesha"), ("rpcbind", "rpcbind"), ("unshare", "util-linux")] {
            if !have(tool) {
                return Ok(Err(format!("{tool} is not installed (Debian package {pkg}: make bench-deps)")));
            }
        }
        let vfs = ["/usr/lib/x86_64-linux-gnu/ganesha", "/usr/lib/aarch64-linux-gnu/ganesha", "/usr/lib64/ganesha"]
            .iter()
            .any(|d| Path::new(d).join("libfsalvfs.so").exists());
        if !vfs {
            return Ok(Err("its VFS backend libfsalvfs.so is not installed (Debian package nfs-ganesha-vfs)".into()));
        }
        let export = dir.join("export");
        std::fs::create_dir_all(&export)?;
        std::fs::create_dir_all(dir.join("recov"))?;
        let (nfs_port, mnt_port) = (free_port()?, free_port()?);
        if nfs_port == mnt_port {
            bail!("two free ports came out the same; run again");
        }
        let conf = dir.join("ganesha.conf");
        std::fs::write(
            &conf,
            format!(
                "NFS_CORE_PARAM {{ Protocols = 3; NFS_Port = {nfs_port}; MNT_Port = {mnt_port}; \
                 Bind_addr = 127.0.0.1; Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false; }}\n\
                 NFSV4 {{ Graceless = true; RecoveryBackend = fs; RecoveryRoot = {recov}; }}\n\
                 EXPORT_DEFAULTS {{ Access_Type = RW; Squash = No_Root_Squash; SecType = sys; }}\n\
                 EXPORT {{ Export_Id = 1; Path = {export}; Pseudo = /export; Protocols = 3; Transports = TCP; \
                 FSAL {{ Name = VFS; }} }}\n\
                 LOG {{ Default_Log_Level = EVENT; }}\n",
                recov = dir.join("recov").display(),
                export = export.display()
            ),
        )?;
        let log = dir.join("ganesha.log");
        let out = std::fs::File::create(dir.join("ganesha.out"))?;
        let child = Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", "--mount", "--propagation", "private", "--"])
            .args(["sh", "-c", GANESHA_SCRIPT, "ganesha"])
            .arg(&conf)
            .arg(&log)
            .arg(dir.join("ganesha.pid"))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting unshare for nfs-ganesha")?;
        let mut g = Ganesha {
            child,
            pid: 0,
            url: format!("nfs://127.0.0.1{}?version=3&nfsport={nfs_port}&mountport={mnt_port}", export.display()),
        };
        // Ready once ganesha (the child of `unshare`) mounts through libnfs.
        let t = Instant::now();
        loop {
            if let Some(status) = g.child.try_wait()? {
                bail!(
                    "nfs-ganesha exited ({status}) before serving; see {} and {}",
                    log.display(),
                    dir.join("ganesha.out").display()
                );
            }
            let cpid = g.child.id();
            if g.pid == 0
                && let Ok(c) = std::fs::read_to_string(format!("/proc/{cpid}/task/{cpid}/children"))
                && let Some(p) = c.split_whitespace().next().and_then(|p| p.parse::<u32>().ok())
                && std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "ganesha.nfsd")
            {
                g.pid = p;
            }
            if g.pid != 0 && Nfs::mount(&g.url).is_ok() {
                return Ok(Ok(g));
            }
            if t.elapsed() > Duration::from_secs(60) {
                bail!("nfs-ganesha did not serve {} within 60 s; see {}", g.url, log.display());
            }
            // Polling a starting server's readiness, not a timing assumption.
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn headline(r: &Value) -> Option<f64> {
    r.get("mib_per_s").or_else(|| r.get("ops_per_s")).and_then(Value::as_f64)
}

/// The result document: one result per system and figure, Weft's with its ratio to ganesha and the target.
fn document(doc: Document, figs: &[Fig], a: &NfsArgs, size: u64, skipped: Value) -> Value {
    let med = |v: &[f64]| summarize(v).map(|s| s.median);
    let mut results: Vec<Value> = Vec::new();
    for f in figs {
        let Some(s) = summarize(&f.samples) else { continue };
        let (unit, cpu_unit) = if f.is_data() { ("mib_per_s", "s_per_gib") } else { ("ops_per_s", "us_per_op") };
        let cpu = |v: &[f64]| med(v).map(|x| if f.is_data() { round3(x) } else { round1(x) });
        let mut r = json!({
            "system": f.system,
            "fabric": "tcp",
            "servers": if f.system == "weft" { a.servers } else { 1 },
            "clients": 1,
            "protocol": "nfs3",
            "op": f.op,
            "pattern": if f.is_data() { Some("sequential") } else { None },
            "record_bytes": if f.is_data() { Some(RECORD_BYTES) } else { None },
            unit: round1(s.median),
            "runs": s.runs,
            "min": round1(s.min),
            "max": round1(s.max),
        });
        r[format!("client_cpu_{cpu_unit}")] = json!(cpu(&f.client_cpu));
        r[format!("server_cpu_{cpu_unit}")] = json!(cpu(&f.server_cpu));
        if !f.is_data() {
            r["files"] = json!(a.files);
        } else {
            r["size_bytes"] = json!(size);
        }
        if let Some(v) = f.verified_bytes {
            r["verified_bytes"] = json!(v);
        }
        f.loads.annotate(&mut r);
        results.push(r);
    }
    // Weft's ratio to ganesha, figure by figure, with the issue's target where it names one.
    let peers: Vec<Value> = results.iter().filter(|r| r["system"] == "nfs-ganesha").cloned().collect();
    for r in results.iter_mut().filter(|r| r["system"] == "weft") {
        let Some(p) = peers.iter().find(|p| p["op"] == r["op"]) else { continue };
        if let (Some(x), Some(y)) = (headline(r), headline(p))
            && y > 0.0
        {
            let ratio = round3(x / y);
            r["ratio_to_ganesha"] = json!(ratio);
            if let Some((_, t)) = TARGETS.iter().find(|(op, _)| r["op"] == *op) {
                r["target_ratio"] = json!(t);
                r["meets_target"] = json!(ratio >= *t);
            }
        }
    }
    let config = json!({
        "size": a.size,
        "size_bytes": size,
        "record_bytes": RECORD_BYTES,
        "files": a.files,
        "runs": a.runs,
        "servers": a.servers,
        "systems": a.systems,
        "gateway_metadata_leases": !a.no_metadata_leases,
        "client": "libnfs 4.0 (libnfs.so.13) as a library, synchronous calls on one thread, NFSv3 over TCP, \
                   ports given in the URL (no portmapper)",
        "targets": TARGETS.iter().map(|(op, t)| (op.to_string(), json!(t))).collect::<serde_json::Map<_, _>>(),
        "skipped": skipped,
        "notes": "write = 1 MiB UNSTABLE WRITEs then COMMIT (nfs_fsync); read = 1 MiB READs; create = CREATE of an \
                  empty file; stat = LOOKUP+GETATTR; remove = REMOVE; server CPU: weft = gateway + MDS + data \
                  servers, nfs-ganesha = its process; ganesha runs with a private rpcbind (see nfs.rs)",
    });
    doc.finish(config, json!({}), results)
}

/// A Markdown table: one row per figure, both systems side by side, Weft's ratio and the target.
pub fn table(doc: &Value) -> String {
    let results = doc["results"].as_array().cloned().unwrap_or_default();
    if results.iter().any(|r| r["system"] == "weft-pnfs") {
        return pnfs_table(doc, &results);
    }
    let get = |sys: &str, op: &str| results.iter().find(|r| r["system"] == sys && r["op"] == op).cloned();
    let num = |v: Option<&Value>, digits: usize| {
        v.and_then(Value::as_f64).map_or("-".to_string(), |x| format!("{x:.digits$}"))
    };
    let mut s = String::new();
    if let Some(sk) = doc.pointer("/config/skipped").and_then(Value::as_object) {
        for (sys, why) in sk {
            s.push_str(&format!("**{sys} skipped**: {}\n\n", why.as_str().unwrap_or("?")));
        }
    }
    s.push_str(
        "| figure | unit | weft | nfs-ganesha | weft ÷ ganesha | target | client CPU weft / ganesha | \
         server CPU weft / ganesha | cpu unit |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for op in OPS {
        let (w, g) = (get("weft", op), get("nfs-ganesha", op));
        if w.is_none() && g.is_none() {
            continue;
        }
        let data = matches!(op, "write" | "read");
        let (unit, cpu_unit, digits) = if data { ("MiB/s", "s_per_gib", 3) } else { ("ops/s", "us_per_op", 1) };
        let cell = |r: &Option<Value>, k: &str, d: usize| num(r.as_ref().and_then(|r| r.get(k)), d);
        let head = |r: &Option<Value>| num(r.as_ref().and_then(headline).map(Value::from).as_ref(), 0);
        let target = TARGETS.iter().find(|(o, _)| *o == op).map_or("-".to_string(), |(_, t)| format!("≥ {t:.1}"));
        s.push_str(&format!(
            "| {op} | {unit} | {} | {} | {} | {target} | {} / {} | {} / {} | {} |\n",
            head(&w),
            head(&g),
            cell(&w, "ratio_to_ganesha", 2),
            cell(&w, &format!("client_cpu_{cpu_unit}"), digits),
            cell(&g, &format!("client_cpu_{cpu_unit}"), digits),
            cell(&w, &format!("server_cpu_{cpu_unit}"), digits),
            cell(&g, &format!("server_cpu_{cpu_unit}"), digits),
            if data { "CPU s/GiB" } else { "CPU µs/op" },
        ));
    }
    s
}

/// `--pnfs`'s table: per op and data-server count, pNFS beside the gateway-only path and nfs-ganesha, with the
/// CPU of the client, the gateway, the data servers and the MDS apart (pNFS / gateway-only).
fn pnfs_table(doc: &Value, results: &[Value]) -> String {
    let mut s = String::new();
    if let Some(sk) = doc.pointer("/config/skipped").and_then(Value::as_object) {
        for (sys, why) in sk {
            s.push_str(&format!("**{sys} skipped**: {}\n\n", why.as_str().unwrap_or("?")));
        }
    }
    s.push_str(
        "| op | data servers | pNFS MiB/s | gateway MiB/s | nfs-ganesha MiB/s | pNFS ÷ gateway | pNFS ÷ ganesha | \
         client CPU s/GiB pNFS / gw | gateway CPU s/GiB pNFS / gw | DS CPU s/GiB pNFS / gw | \
         MDS CPU s/GiB pNFS / gw |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let num = |v: Option<&Value>, d: usize| v.and_then(Value::as_f64).map_or("-".to_string(), |x| format!("{x:.d$}"));
    let ganesha = |op: &str| results.iter().find(|r| r["system"] == "nfs-ganesha" && r["op"] == op);
    for r in results.iter().filter(|r| r["system"] == "weft-pnfs") {
        let op = r["op"].as_str().unwrap_or("?");
        let g = results.iter().find(|g| g["system"] == "weft-gateway" && g["servers"] == r["servers"] && g["op"] == op);
        let pair = |k: &str| format!("{} / {}", num(r.get(k), 3), num(g.and_then(|g| g.get(k)), 3));
        s.push_str(&format!(
            "| {op} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["servers"],
            num(r.get("mib_per_s"), 0),
            num(g.and_then(|g| g.get("mib_per_s")), 0),
            num(ganesha(op).and_then(|g| g.get("mib_per_s")), 0),
            num(r.get("ratio_to_gateway"), 2),
            num(r.get("ratio_to_ganesha"), 2),
            pair("client_cpu_s_per_gib"),
            pair("gateway_cpu_s_per_gib"),
            pair("ds_cpu_s_per_gib"),
            pair("mds_cpu_s_per_gib"),
        ));
    }
    s
}

/// Weft's ratio to ganesha per figure (1.0 = parity); without ganesha, Weft's own figures. With `--pnfs`, pNFS ÷
/// the gateway-only path per op and data-server count.
pub fn chart(doc: &Value) -> String {
    let results = doc["results"].as_array().cloned().unwrap_or_default();
    let pnfs: Vec<crate::chart::Bar> = results
        .iter()
        .filter(|r| r["system"] == "weft-pnfs" && r.get("ratio_to_gateway").is_some())
        .map(|r| crate::chart::Bar {
            value: r["ratio_to_gateway"].as_f64().unwrap_or(0.0),
            min: None,
            max: None,
            label: format!("{} ×{}", r["op"].as_str().unwrap_or(""), r["servers"]),
            sublabel: r["target_ratio_to_gateway"].as_f64().map_or("".to_string(), |t| format!("target {t}")),
            color: if r["meets_target"] == false { "#d84b3b" } else { "#3b7dd8" },
        })
        .collect();
    if !pnfs.is_empty() {
        return crate::chart::bars_svg("weft bench nfs --pnfs: pNFS ÷ the gateway-only path (1.0 = parity)", &pnfs);
    }
    let ratios: Vec<crate::chart::Bar> = results
        .iter()
        .filter(|r| r["system"] == "weft" && r.get("ratio_to_ganesha").is_some())
        .map(|r| crate::chart::Bar {
            value: r["ratio_to_ganesha"].as_f64().unwrap_or(0.0),
            min: None,
            max: None,
            label: r["op"].as_str().unwrap_or("").to_string(),
            sublabel: r["target_ratio"].as_f64().map_or("".to_string(), |t| format!("target {t}")),
            color: if r["meets_target"] == false { "#d84b3b" } else { "#3b7dd8" },
        })
        .collect();
    if !ratios.is_empty() {
        return crate::chart::bars_svg("weft bench nfs: Weft's gateway ÷ nfs-ganesha (1.0 = parity)", &ratios);
    }
    let bars: Vec<crate::chart::Bar> = results
        .iter()
        .map(|r| crate::chart::Bar {
            value: headline(r).unwrap_or(0.0),
            min: r["min"].as_f64(),
            max: r["max"].as_f64(),
            label: r["op"].as_str().unwrap_or("").to_string(),
            sublabel: if r.get("mib_per_s").is_some() { "MiB/s".into() } else { "ops/s".into() },
            color: "#3b7dd8",
        })
        .collect();
    crate::chart::bars_svg("weft bench nfs: Weft's gateway (nfs-ganesha not measured)", &bars)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(system: &'static str, op: &'static str, x: f64) -> Fig {
        let mut f = Fig::new(system, op);
        f.samples = vec![x, x * 1.1, x * 0.9];
        f.client_cpu = vec![1.0, 2.0, 3.0];
        f.server_cpu = vec![4.0, 5.0, 6.0];
        f
    }

    fn args() -> NfsArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            a: NfsArgs,
        }
        P::parse_from(["x", "--files", "10"]).a
    }

    #[test]
    fn ratios_targets_and_tables() {
        let figs = vec![
            fig("weft", "write", 300.0),
            fig("weft", "create", 1000.0),
            fig("weft", "stat", 1000.0),
            fig("nfs-ganesha", "write", 200.0),
            fig("nfs-ganesha", "create", 500.0),
            fig("nfs-ganesha", "stat", 800.0),
        ];
        let doc = document(Document::start("nfs"), &figs, &args(), 1 << 30, json!({}));
        let r = |sys: &str, op: &str| {
            doc["results"].as_array().unwrap().iter().find(|r| r["system"] == sys && r["op"] == op).unwrap().clone()
        };
        assert_eq!(r("weft", "write")["ratio_to_ganesha"], 1.5);
        assert_eq!(r("weft", "write")["meets_target"], true);
        assert_eq!(r("weft", "create")["ratio_to_ganesha"], 2.0);
        assert_eq!(r("weft", "stat")["ratio_to_ganesha"], 1.25);
        assert_eq!(r("weft", "stat")["meets_target"], false);
        assert_eq!(r("weft", "write")["client_cpu_s_per_gib"], 2.0);
        assert_eq!(r("weft", "write")["server_cpu_s_per_gib"], 5.0);
        assert_eq!(r("weft", "create")["server_cpu_us_per_op"], 5.0);
        assert!(r("nfs-ganesha", "write").get("ratio_to_ganesha").is_none());
        let t = table(&doc);
        assert!(t.contains("| write | MiB/s | 300 | 200 | 1.50 | ≥ 1.0 |"), "{t}");
        assert!(t.contains("| stat | ops/s | 1000 | 800 | 1.25 | ≥ 1.5 |"), "{t}");
        assert!(chart(&doc).starts_with("<svg"));
        // Without ganesha: a note, Weft's own figures, no ratios.
        let alone =
            document(Document::start("nfs"), &figs[..3], &args(), 1 << 30, json!({"nfs-ganesha": "not installed"}));
        assert!(table(&alone).contains("**nfs-ganesha skipped**: not installed"));
        assert!(alone["results"].as_array().unwrap().iter().all(|r| r.get("ratio_to_ganesha").is_none()));
        assert!(chart(&alone).contains("not measured"));
    }

    #[test]
    fn records_carry_their_index() {
        let mut a = pattern(RECORD_BYTES, 1);
        let mut b = a.clone();
        stamp(&mut a, 3);
        stamp(&mut b, 4);
        assert_ne!(a, b);
        assert_eq!(a[8..], b[8..]);
        assert_eq!(pattern(100, 7), pattern(100, 7));
    }
    #[test]
    fn pnfs_ratios_cpu_apart_table_and_chart() {
        let pf = |path: &'static str, n: u32, op: &'static str, x: f64| {
            let mut f = pnfs::PFig::new(path, n, op);
            f.samples = vec![x, x * 1.2, x * 0.8];
            f.client_cpu = vec![0.5; 3];
            f.gateway_cpu = if path == "pnfs" { vec![0.01; 3] } else { vec![2.0; 3] };
            f.mds_cpu = vec![0.1; 3];
            f.ds_cpu = vec![1.0, 3.0, 2.0];
            f
        };
        let pfigs = vec![
            pf("pnfs", 4, "read", 1600.0),
            pf("gateway", 4, "read", 800.0),
            pf("pnfs", 4, "write", 900.0),
            pf("gateway", 4, "write", 1000.0),
            pf("pnfs", 1, "read", 500.0),
            pf("gateway", 1, "read", 500.0),
        ];
        let figs = vec![fig("nfs-ganesha", "read", 400.0), fig("nfs-ganesha", "write", 300.0)];
        let mut doc = document(Document::start("nfs"), &figs, &args(), 1 << 30, json!({}));
        add_pnfs(&mut doc, &pfigs, 1 << 30);
        let r = |sys: &str, n: u32, op: &str| {
            doc["results"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["system"] == sys && r["servers"] == n && r["op"] == op)
                .unwrap()
                .clone()
        };
        let read4 = r("weft-pnfs", 4, "read");
        assert_eq!(read4["ratio_to_gateway"], 2.0);
        assert_eq!(read4["ratio_to_ganesha"], 4.0);
        assert_eq!(read4["meets_target"], true);
        assert_eq!(read4["gateway_cpu_s_per_gib"], 0.01);
        assert_eq!(read4["ds_cpu_s_per_gib"], 2.0);
        assert_eq!(read4["mds_cpu_s_per_gib"], 0.1);
        assert_eq!(read4["protocol"], "nfs4.1");
        assert_eq!(r("weft-pnfs", 4, "write")["ratio_to_gateway"], 0.9);
        assert!(r("weft-pnfs", 4, "write").get("meets_target").is_none(), "the target is on 4-server reads");
        assert!(r("weft-pnfs", 1, "read").get("meets_target").is_none());
        assert!(r("weft-gateway", 4, "read").get("ratio_to_gateway").is_none());
        assert_eq!(r("weft-gateway", 4, "read")["ratio_to_ganesha"], 2.0);
        let t = table(&doc);
        assert!(t.contains("| read | 4 | 1600 | 800 | 400 | 2.00 | 4.00 | 0.500 / 0.500 | 0.010 / 2.000 |"), "{t}");
        let svg = chart(&doc);
        assert!(svg.contains("pNFS") && svg.contains("target 1.5"), "{svg}");
    }
}
