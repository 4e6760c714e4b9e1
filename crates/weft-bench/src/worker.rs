//! Client processes: the bench binary re-executes itself as `weft bench worker` (hidden from `--help`) once per
//! client, so aggregate figures (`--procs N` of throughput and meta, every checkpoint) come from N processes with
//! their own runtimes, sessions and CPU accounting, as mdtest's and IOR's MPI ranks do.
//!
//! Protocol, one line each on the worker's stdin/stdout: the worker connects (and opens its sessions to every data
//! server and cache-bank daemon, `Client::warm_up`, so no phase times them), then for every phase of its spec
//! prints `ready`, waits for `go`, runs the phase and prints one JSON line `{"ops", "bytes", "secs", "cpu_s",
//! "lat_us", "fabric"}` (`fabric`: what its client actually used so far, see `common::fabric_used`). The parent sends `go` to every worker only once all are ready (a barrier across processes) and times
//! the phase from the first `go` to the last result. `cpu_s` is the worker's own getrusage(RUSAGE_SELF) over the
//! phase; the parent also reads getrusage(RUSAGE_CHILDREN) once the workers have been reaped, which includes
//! connecting and setting up.
//!
//! A phase with `"cache_namespace": N` runs on a fresh client whose cache-bank keys are in namespace N (connected
//! and warmed up before `ready`). A `stat` phase resolves its directory before `ready`. A worker whose spec has no cluster (`"cluster": null`) connects nothing and runs only `fs-*` phases (`stat`s
//! and `pread`s through the kernel on a mounted file system, e.g. GlusterFS's FUSE mount in `weft bench cache`);
//! its `fabric` is `fuse`.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use clap::Args;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::task::JoinSet;
use weft_client::{Client, ClusterConfig, OpenMode};

use crate::ceilings;
use crate::common::micros_since;

#[derive(Args, Clone, Debug)]
pub struct WorkerArgs {
    /// The worker's spec: `{"cluster": <ClusterConfig>, "phases": [...]}` as JSON.
    #[arg(long)]
    pub spec: String,
}

/// What one phase of one worker did.
#[derive(Debug, Clone, Default)]
pub struct WorkerPhase {
    pub ops: u64,
    pub bytes: u64,
    /// The worker's own time from `go` to its end.
    pub secs: f64,
    /// The worker's CPU seconds (user + system) over the phase.
    pub cpu_s: f64,
    pub lat_us: Vec<f64>,
    /// The fabric the worker's client actually used (see [`crate::common::fabric_used`]).
    pub fabric: String,
}

/// One phase of all workers.
#[derive(Debug, Clone, Default)]
pub struct PhaseResult {
    /// From the first `go` to the last result.
    pub secs: f64,
    pub workers: Vec<WorkerPhase>,
}

impl PhaseResult {
    pub fn ops(&self) -> u64 {
        self.workers.iter().map(|w| w.ops).sum()
    }
    pub fn bytes(&self) -> u64 {
        self.workers.iter().map(|w| w.bytes).sum()
    }
    pub fn cpu_s(&self) -> f64 {
        self.workers.iter().map(|w| w.cpu_s).sum()
    }
    pub fn lat_us(&self) -> Vec<f64> {
        self.workers.iter().flat_map(|w| w.lat_us.iter().copied()).collect()
    }
    /// The fabric the workers' clients actually used, all of them together.
    pub fn fabric(&self) -> String {
        crate::common::merge_fabrics(self.workers.iter().map(|w| w.fabric.as_str()))
    }
}

struct Proc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// Running worker processes, driven phase by phase.
pub struct Workers {
    procs: Vec<Proc>,
    phases: usize,
    done: usize,
    /// Every worker has said `ready` for the next phase (see [`Workers::wait_ready`]).
    ready: bool,
}

impl Workers {
    /// Starts one worker per entry of `phases` (each its list of phase specs; every list must be as long).
    pub async fn spawn(cfg: &ClusterConfig, phases: Vec<Vec<Value>>) -> Result<Workers> {
        Workers::spawn_each(phases.into_iter().map(|p| (Some(cfg.clone()), p)).collect()).await
    }

    /// Starts one worker per entry, each with its own cluster config (`None`: no client, only `fs-*` phases on a
    /// mounted file system) and list of phase specs (every list as long).
    pub async fn spawn_each(workers: Vec<(Option<ClusterConfig>, Vec<Value>)>) -> Result<Workers> {
        let count = workers.first().map_or(0, |(_, p)| p.len());
        if workers.iter().any(|(_, p)| p.len() != count) {
            bail!("every worker needs the same number of phases");
        }
        let exe = std::env::current_exe()?;
        let mut procs = Vec::with_capacity(workers.len());
        for (cfg, p) in workers {
            let spec = json!({"cluster": cfg, "phases": p});
            let mut child = tokio::process::Command::new(&exe)
                .args(["worker", "--spec"])
                .arg(spec.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .context("starting a bench worker process")?;
            let stdin = child.stdin.take().context("worker stdin")?;
            let stdout = BufReader::new(child.stdout.take().context("worker stdout")?);
            procs.push(Proc { child, stdin, stdout });
        }
        Ok(Workers { procs, phases: count, done: 0, ready: false })
    }

    /// Waits until every worker is ready for the next phase (its set-up done, e.g. a fresh client connected), so
    /// that set-up does not overlap what the caller times next; a no-op once no phase is left.
    pub async fn wait_ready(&mut self) -> Result<()> {
        if self.ready || self.done >= self.phases {
            return Ok(());
        }
        for p in &mut self.procs {
            let line = read_line(&mut p.stdout).await?;
            if line != "ready" {
                bail!("a worker said {line:?} instead of ready");
            }
        }
        self.ready = true;
        Ok(())
    }

    /// Runs the next phase on every worker at once.
    pub async fn phase(&mut self) -> Result<PhaseResult> {
        if self.done >= self.phases {
            bail!("no phase left");
        }
        self.wait_ready().await?;
        self.ready = false;
        let t = Instant::now();
        for p in &mut self.procs {
            p.stdin.write_all(b"go\n").await?;
            p.stdin.flush().await?;
        }
        let mut workers = Vec::with_capacity(self.procs.len());
        for p in &mut self.procs {
            let line = read_line(&mut p.stdout).await?;
            let v: Value = serde_json::from_str(&line).with_context(|| format!("a worker's result {line:?}"))?;
            workers.push(WorkerPhase {
                ops: v["ops"].as_u64().unwrap_or(0),
                bytes: v["bytes"].as_u64().unwrap_or(0),
                secs: v["secs"].as_f64().unwrap_or(0.0),
                cpu_s: v["cpu_s"].as_f64().unwrap_or(0.0),
                lat_us: v["lat_us"].as_array().into_iter().flatten().filter_map(Value::as_f64).collect(),
                fabric: v["fabric"].as_str().unwrap_or_default().to_string(),
            });
        }
        self.done += 1;
        Ok(PhaseResult { secs: t.elapsed().as_secs_f64(), workers })
    }

    /// Waits for every worker to exit; returns the CPU seconds of all reaped children (RUSAGE_CHILDREN delta).
    pub async fn finish(mut self) -> Result<f64> {
        let c0 = ceilings::children_cpu_seconds();
        for p in &mut self.procs {
            let status = p.child.wait().await?;
            if !status.success() {
                bail!("a bench worker failed: {status}");
            }
        }
        Ok(ceilings::children_cpu_seconds() - c0)
    }
}

async fn read_line(r: &mut BufReader<ChildStdout>) -> Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        bail!("a bench worker exited early (see its error above)");
    }
    Ok(line.trim_end().to_string())
}

/// `weft bench worker`: runs inside a client process.
pub async fn run(a: WorkerArgs) -> Result<()> {
    let spec: Value = serde_json::from_str(&a.spec).context("--spec is not JSON")?;
    let phases = spec["phases"].as_array().cloned().unwrap_or_default();
    // No cluster: the phases are all `fs-*` ones, on a mounted file system (e.g. GlusterFS's FUSE mount).
    let cfg: Option<ClusterConfig> = match &spec["cluster"] {
        Value::Null => None,
        c => Some(serde_json::from_value(c.clone()).context("spec.cluster")?),
    };
    let mut client = match &cfg {
        Some(cfg) => Some(connect_warm(cfg).await?),
        None => None,
    };
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut out = tokio::io::stdout();
    for ph in &phases {
        if let (Some(ns), Some(cfg)) = (ph["cache_namespace"].as_u64(), &cfg) {
            // A phase in a key namespace of its own (`weft bench cache --miss`): a fresh client, connected before
            // `ready`, so outside the phase's time.
            let mut cfg = cfg.clone();
            if let Some(cache) = cfg.cache.as_mut() {
                cache.namespace = ns;
            }
            if let Some(old) = client.replace(connect_warm(&cfg).await?) {
                old.close().await;
            }
        }
        // A stat phase's directory is resolved before `ready`: the phase times its stats only.
        let stat_dir = match (&client, ph["op"].as_str()) {
            (Some(client), Some("stat")) => Some(client.resolve(field_str(ph, "dir")?).await?.ino),
            _ => None,
        };
        out.write_all(b"ready\n").await?;
        out.flush().await?;
        let mut line = String::new();
        if stdin.read_line(&mut line).await? == 0 || line.trim() != "go" {
            bail!("the parent went away");
        }
        let (t, c) = (Instant::now(), ceilings::cpu_seconds());
        let (ops, bytes, lat) = match (&client, field_str(ph, "op")?) {
            (_, op) if op.starts_with("fs-") => fs_phase(ph).await?,
            (Some(client), _) => one_phase(client, ph, stat_dir).await?,
            (None, op) => bail!("phase {op:?} needs a cluster in the spec"),
        };
        let (secs, cpu_s) = (t.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c);
        let fabric = match &client {
            Some(client) => crate::common::fabric_used(client).await,
            None => "fuse".to_string(),
        };
        let r = json!({"ops": ops, "bytes": bytes, "secs": secs, "cpu_s": cpu_s, "lat_us": lat, "fabric": fabric});
        out.write_all(format!("{r}\n").as_bytes()).await?;
        out.flush().await?;
    }
    if let Some(client) = client {
        client.close().await;
    }
    Ok(())
}

/// A connected client with its one-time costs paid: a session to every data server and a connection to every
/// cache-bank daemon (else the first phase, or every phase of a fresh `cache_namespace` client, would time them).
async fn connect_warm(cfg: &ClusterConfig) -> Result<Client> {
    let client = Client::connect(cfg).await?;
    client.warm_up().await?;
    Ok(client)
}

/// A phase on a mounted file system, through the kernel (std::fs, on a blocking thread):
/// - `fs-stat`: `stat` of `dir/prefix{i}` for i in 0..count;
/// - `fs-read`: sequential `pread`s of `record` bytes over [offset, offset + bytes) of `path`, one at a time.
async fn fs_phase(ph: &Value) -> Result<(u64, u64, Vec<f64>)> {
    let ph = ph.clone();
    tokio::task::spawn_blocking(move || match field_str(&ph, "op")? {
        "fs-stat" => {
            let dir = std::path::Path::new(field_str(&ph, "dir")?);
            let (prefix, count) = (field_str(&ph, "prefix")?, field_u64(&ph, "count")?);
            let mut lat = Vec::with_capacity(count as usize);
            for i in 0..count {
                let p = dir.join(format!("{prefix}{i}"));
                let t = Instant::now();
                std::fs::metadata(&p).with_context(|| format!("stat {}", p.display()))?;
                lat.push(micros_since(t));
            }
            Ok((count, 0, lat))
        }
        "fs-read" => {
            use std::os::unix::fs::FileExt;
            let path = field_str(&ph, "path")?;
            let (offset, bytes, record) =
                (field_u64(&ph, "offset")?, field_u64(&ph, "bytes")?, field_u64(&ph, "record")?);
            if record == 0 || record > 64 << 20 {
                bail!("record {record} out of range");
            }
            let f = std::fs::File::open(path).with_context(|| format!("open {path}"))?;
            // Pre-faulted destination buffer, reused.
            let mut buf = vec![0u8; record as usize];
            let (mut got, mut ops) = (0u64, 0u64);
            while got < bytes {
                let len = record.min(bytes - got) as usize;
                let n = f.read_at(&mut buf[..len], offset + got)?;
                if n == 0 {
                    bail!("{path}: end of file after {got} of {bytes} bytes");
                }
                got += n as u64;
                ops += 1;
            }
            Ok((ops, got, Vec::new()))
        }
        other => bail!("unknown worker phase {other:?}"),
    })
    .await?
}

fn field_u64(ph: &Value, k: &str) -> Result<u64> {
    ph[k].as_u64().with_context(|| format!("phase {ph}: no {k}"))
}

fn field_str<'a>(ph: &'a Value, k: &str) -> Result<&'a str> {
    ph[k].as_str().with_context(|| format!("phase {ph}: no {k}"))
}

/// Runs one phase (a `stat` phase in `stat_dir`, resolved beforehand); returns (operations, bytes moved, per-call
/// latencies in µs).
async fn one_phase(client: &Client, ph: &Value, stat_dir: Option<u64>) -> Result<(u64, u64, Vec<f64>)> {
    match field_str(ph, "op")? {
        "write" | "read" => data_phase(client, ph).await,
        "create" | "stat" | "remove" => {
            let op = field_str(ph, "op")?;
            let dir = match stat_dir {
                Some(dir) => dir,
                None => client.resolve(field_str(ph, "dir")?).await?.ino,
            };
            let (prefix, count) = (field_str(ph, "prefix")?, field_u64(ph, "count")?);
            let mut lat = Vec::with_capacity(count as usize);
            for i in 0..count {
                let name = format!("{prefix}{i}");
                let t = Instant::now();
                match op {
                    "create" => {
                        drop(client.create(dir, &name, 0o644, true).await.with_context(|| format!("create {name}"))?)
                    }
                    "stat" => drop(client.lookup(dir, &name).await.with_context(|| format!("stat {name}"))?),
                    _ => client.unlink(dir, &name).await.with_context(|| format!("remove {name}"))?,
                }
                lat.push(micros_since(t));
            }
            Ok((count, 0, lat))
        }
        "readdir" => {
            let dir = client.resolve(field_str(ph, "dir")?).await?.ino;
            let entries = client.readdir(dir).await?.len() as u64;
            let expect = field_u64(ph, "expect")?;
            if entries != expect {
                bail!("readdir: {entries} entries, {expect} expected");
            }
            Ok((entries, 0, Vec::new()))
        }
        other => bail!("unknown worker phase {other:?}"),
    }
}

/// Sequential records of `record` bytes over [offset, offset + bytes) of `path`, `window` in flight. A write ends
/// with fsync (`"fsync": true`) or a commit; a `"create": true` write creates the file first.
async fn data_phase(client: &Client, ph: &Value) -> Result<(u64, u64, Vec<f64>)> {
    let path = field_str(ph, "path")?;
    let (offset, bytes, record) = (field_u64(ph, "offset")?, field_u64(ph, "bytes")?, field_u64(ph, "record")?);
    let window = field_u64(ph, "window")?.max(1) as usize;
    if record == 0 || record > 64 << 20 {
        bail!("record {record} out of range");
    }
    let records = bytes.div_ceil(record);
    if ph["op"] == "write" {
        let f = if ph["create"].as_bool().unwrap_or(false) {
            client.create_path(path, 0o644, false, false).await?
        } else {
            client.open(path, OpenMode::Write).await?
        };
        let f = Arc::new(f);
        // Pre-faulted source record, shared by every write.
        let src = Bytes::from((0..record).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let mut tasks = JoinSet::new();
        for i in 0..records {
            if tasks.len() >= window {
                tasks.join_next().await.expect("non-empty")??;
            }
            let (f, data) = (f.clone(), src.clone());
            let len = record.min(bytes - i * record) as usize;
            tasks.spawn(async move { f.write_at(offset + i * record, data.slice(..len)).await });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        if ph["fsync"].as_bool().unwrap_or(false) {
            f.sync().await?;
        } else {
            f.commit().await?;
        }
        Ok((records, bytes, Vec::new()))
    } else {
        let f = Arc::new(client.open(path, OpenMode::Read).await?);
        // Pre-faulted destination buffers, one per record in flight, reused.
        let mut bufs: Vec<BytesMut> = (0..window).map(|_| BytesMut::zeroed(record as usize)).collect();
        let mut got = 0u64;
        let mut tasks: JoinSet<Result<BytesMut, weft_client::ClientError>> = JoinSet::new();
        for i in 0..records {
            let mut buf = match bufs.pop() {
                Some(b) => b,
                None => {
                    let b = tasks.join_next().await.expect("window full")??;
                    got += b.len() as u64;
                    b
                }
            };
            buf.resize(record.min(bytes - i * record) as usize, 0);
            let f = f.clone();
            tasks.spawn(async move { f.read_at(offset + i * record, buf).await });
        }
        while let Some(r) = tasks.join_next().await {
            got += r??.len() as u64;
        }
        if got != bytes {
            bail!("{path}: read {got} of {bytes} bytes");
        }
        Ok((records, bytes, Vec::new()))
    }
}
