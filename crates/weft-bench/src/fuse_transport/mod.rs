//! `weft bench fuse-transport`: the FUSE kernel transport alone, `/dev/fuse` reads against FUSE over io_uring
//! (issue 33 item 2: measure before committing to it). A minimal server in memory ([`server`]) answers each
//! request at once, so what is measured is the kernel path and its wake-ups, the ceiling either transport
//! allows any FUSE file system here.
//!
//! Per run and dispatch ([`Dispatch`]: requests served inline, or on a tokio pool as weft-fuse serves them),
//! each transport is mounted in turn (the order alternates between runs), warmed up, and measured with
//! 1 and more caller threads, each doing one call at a time: `fstat` (a GETATTR each: the server grants no
//! attribute time) and 4 KiB `pread` at random offsets (a READ each: the file is opened with direct I/O), every
//! byte read checked. Reported per point: ops/s, p50 and p99 latency, and CPU µs per op of the whole process
//! (callers and server threads together), medians over the runs; and the ring's ratio to `/dev/fuse`.
//! Root only; `enable_uring` is set for the run and put back after (by the next run if this one is killed first,
//! which also detaches the mounts a killed run left: [`server::put_right_leftovers`]).

mod ring;
pub mod server;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use crate::ceilings;
use crate::common::{self, Headline, OpRuns, micros_since};
use crate::doc::Document;
use server::{Dispatch, FILE_BYTES, Transport, byte_at};

#[derive(Args, Clone, Debug)]
pub struct FuseTransportArgs {
    /// Caller threads per point, each one call at a time, e.g. `1,4`.
    #[arg(long, default_value = "1,4")]
    pub threads: String,
    /// Calls per thread, op and run.
    #[arg(long, default_value_t = 20_000)]
    pub count: u64,
    /// `/dev/fuse` reader threads of the server (the ring has one thread per CPU, as the kernel has one queue).
    #[arg(long, default_value_t = 2)]
    pub readers: usize,
    /// Where requests are served: `inline` (on the thread that received them: the transport's best case), `pool`
    /// (on a tokio runtime, as weft-fuse serves them; the ring's commit handed back to its thread) and
    /// `pool-submits` (the worker submits the ring's commit itself, as libfuse does), e.g. `inline,pool`.
    #[arg(long, default_value = "inline,pool,pool-submits")]
    pub dispatch: String,
    /// Repetitions per point (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Where to make the mountpoint (a subdirectory removed when done; default: a fresh one under /tmp).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write results here (an SVG chart is written beside it).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

const OPS: [&str; 2] = ["stat", "read4k"];
const TRANSPORTS: [Transport; 2] = [Transport::DevFuse, Transport::Uring];

fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::DevFuse => "dev-fuse",
        Transport::Uring => "io-uring",
    }
}

pub async fn run(a: FuseTransportArgs) -> Result<()> {
    let threads = crate::parse_list(&a.threads, |x| x.parse::<usize>().ok()).context("--threads wants e.g. 1,4")?;
    if a.runs == 0 || a.count == 0 || threads.iter().any(|&t| t == 0 || t > 256) {
        bail!("--runs and --count must be at least 1, --threads between 1 and 256");
    }
    let pool = tokio::runtime::Handle::current();
    let dispatches = crate::parse_list(&a.dispatch, |x| match x {
        "inline" => Some(Dispatch::Inline),
        "pool" => Some(Dispatch::Pool(pool.clone())),
        "pool-submits" => Some(Dispatch::PoolSubmits(pool.clone())),
        _ => None,
    })
    .context("--dispatch wants inline, pool and/or pool-submits")?;
    let doc = Document::start("fuse-transport");
    let was = std::fs::read_to_string(server::ENABLE_URING).map(|s| s.trim().to_string()).ok();
    let a2 = a.clone();
    let runs = tokio::task::spawn_blocking(move || measure_all(&a2, &threads, &dispatches)).await??;
    let mut results = Vec::new();
    for ((t, d, threads, op), r) in &runs {
        let base = json!({ "system": "fuse", "transport": transport_name(*t), "dispatch": d, "threads": threads,
            "record_bytes": if *op == "read4k" { 4096 } else { 0 } });
        results.push(r.result(&base, op, Headline::OpsPerS));
    }
    add_ratios(&mut results);
    let config = json!({
        "count": a.count, "runs": a.runs, "readers": a.readers,
        "enable_uring_before": was,
        "cpu": "user+system CPU of the whole bench process (callers and server threads) per op",
    });
    let doc = doc.finish(config, json!({}), results);
    common::emit(&doc, &table(&doc), a.json.as_deref(), svg)
}

fn dispatch_name(d: &Dispatch) -> &'static str {
    match d {
        Dispatch::Inline => "inline",
        Dispatch::Pool(_) => "pool",
        Dispatch::PoolSubmits(_) => "pool-submits",
    }
}

type Measured = Vec<((Transport, &'static str, usize, &'static str), OpRuns)>;

fn measure_all(a: &FuseTransportArgs, threads: &[usize], dispatches: &[Dispatch]) -> Result<Measured> {
    for line in server::put_right_leftovers() {
        eprintln!("fuse-transport: {line}");
    }
    let _enabled = server::UringEnabled::new()
        .context("setting /sys/module/fuse/parameters/enable_uring (root, and a kernel with FUSE over io_uring)")?;
    let parent = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = parent.join(format!("{}{}", server::MOUNT_DIR_PREFIX, std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut out: Measured = Vec::new();
    for run in 0..a.runs {
        let order = if run % 2 == 0 { TRANSPORTS } else { [TRANSPORTS[1], TRANSPORTS[0]] };
        for d in dispatches {
            for t in order {
                let mounted =
                    server::mount(&dir, t, a.readers, d.clone()).with_context(|| format!("mounting over {t:?}"))?;
                if mounted.transport != t {
                    bail!("asked for {t:?}, the kernel uses {:?}", mounted.transport);
                }
                calls(&dir, 1, a.count.min(2_000), "stat")?;
                calls(&dir, 1, a.count.min(2_000), "read4k")?;
                for &n in threads {
                    for op in OPS {
                        let load = ceilings::load1();
                        let (secs, cpu, mut lat) = calls(&dir, n, a.count, op)?;
                        let runs = entry(&mut out, (t, dispatch_name(d), n, op));
                        let ops = a.count * n as u64;
                        runs.push(ops, if op == "read4k" { ops * 4096 } else { 0 }, secs, cpu, &mut lat)?;
                        runs.push_load(load);
                        let (tn, dn) = (transport_name(t), dispatch_name(d));
                        eprintln!("run {run} {tn} {dn} threads {n} {op}: {:.0} ops/s", ops as f64 / secs);
                    }
                }
                drop(mounted);
            }
        }
    }
    std::fs::remove_dir(&dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(out)
}

fn entry<'a>(out: &'a mut Measured, key: (Transport, &'static str, usize, &'static str)) -> &'a mut OpRuns {
    let i = match out.iter().position(|(k, _)| *k == key) {
        Some(i) => i,
        None => {
            out.push((key, OpRuns::default()));
            out.len() - 1
        }
    };
    &mut out[i].1
}

/// `count` calls of `op` on each of `threads` threads; returns (seconds, process CPU seconds, latencies µs).
fn calls(dir: &Path, threads: usize, count: u64, op: &str) -> Result<(f64, f64, Vec<f64>)> {
    let path = dir.join("f");
    let (t0, c0) = (Instant::now(), ceilings::cpu_seconds());
    let lat = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let path = &path;
                s.spawn(move || thread_calls(path, t as u64, count, op))
            })
            .collect();
        let mut all = Vec::with_capacity(threads * count as usize);
        for h in handles {
            all.extend(h.join().map_err(|_| anyhow::anyhow!("a caller thread panicked"))??);
        }
        Ok::<_, anyhow::Error>(all)
    })?;
    Ok((t0.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c0, lat))
}

fn thread_calls(path: &Path, seed: u64, count: u64, op: &str) -> Result<Vec<f64>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 4096];
    let mut rng = crate::rng::SplitMix64::new(seed);
    let mut lat = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let t = Instant::now();
        if op == "stat" {
            let len = f.metadata()?.len();
            lat.push(micros_since(t));
            if len != FILE_BYTES {
                bail!("stat of {} says {len} bytes, not {FILE_BYTES}", path.display());
            }
        } else {
            let offset = rng.next_u64() % (FILE_BYTES / 4096) * 4096;
            f.read_exact_at(&mut buf, offset)?;
            lat.push(micros_since(t));
            if let Some(i) = (0..4096).find(|&i| buf[i] != byte_at(offset + i as u64)) {
                bail!("{}: wrong byte at offset {}", path.display(), offset + i as u64);
            }
        }
    }
    Ok(lat)
}

/// Adds to each io-uring result its ratio to `/dev/fuse` at the same dispatch, threads and op (ops/s and p50).
fn add_ratios(results: &mut [Value]) {
    let find = |rs: &[Value], like: &Value| {
        rs.iter()
            .find(|r| r["transport"] == "dev-fuse" && ["dispatch", "threads", "op"].iter().all(|k| r[*k] == like[*k]))
            .map(|r| (r["ops_per_s"].as_f64(), r["p50_us"].as_f64()))
    };
    for i in 0..results.len() {
        if results[i]["transport"] != "io-uring" {
            continue;
        }
        let Some((Some(ops), Some(p50))) = find(results, &results[i]) else { continue };
        let r = &mut results[i];
        let ratio_ops = r["ops_per_s"].as_f64().unwrap_or(0.0) / ops;
        let ratio_p50 = r["p50_us"].as_f64().unwrap_or(0.0) / p50;
        r["vs_dev_fuse_ops"] = json!(common::round3(ratio_ops));
        r["vs_dev_fuse_p50"] = json!(common::round3(ratio_p50));
    }
}

/// The Markdown table of a `fuse-transport` document (also `weft bench report`'s).
pub fn table(doc: &Value) -> String {
    let mut s = String::from(
        "| op | dispatch | threads | transport | ops/s (min–max) | p50 µs | p99 µs | CPU µs/op | vs /dev/fuse (ops/s, p50) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for r in doc["results"].as_array().into_iter().flatten() {
        let ratio = match (r["vs_dev_fuse_ops"].as_f64(), r["vs_dev_fuse_p50"].as_f64()) {
            (Some(o), Some(p)) => format!("{o:.2}×, {p:.2}×"),
            _ => "–".into(),
        };
        s += &format!(
            "| {} | {} | {} | {} | {:.0} ({:.0}–{:.0}) | {} | {} | {} | {ratio} |\n",
            r["op"].as_str().unwrap_or(""),
            r["dispatch"].as_str().unwrap_or(""),
            r["threads"],
            r["transport"].as_str().unwrap_or(""),
            r["ops_per_s"].as_f64().unwrap_or(0.0),
            r["min"].as_f64().unwrap_or(0.0),
            r["max"].as_f64().unwrap_or(0.0),
            r["p50_us"],
            r["p99_us"],
            r["client_cpu_us_per_op"],
        );
    }
    s
}

/// The chart of a `fuse-transport` document: ops/s per op, threads and transport.
pub fn svg(doc: &Value) -> String {
    let bars: Vec<crate::chart::Bar> = doc["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| crate::chart::Bar {
            value: r["ops_per_s"].as_f64().unwrap_or(0.0),
            min: r["min"].as_f64(),
            max: r["max"].as_f64(),
            label: format!("{} {}t", r["op"].as_str().unwrap_or(""), r["threads"]),
            sublabel: format!("{} {}", r["transport"].as_str().unwrap_or(""), r["dispatch"].as_str().unwrap_or("")),
            color: if r["transport"] == "io-uring" { "#3b7dd8" } else { "#e08a2c" },
        })
        .collect();
    crate::chart::bars_svg("FUSE transport alone: ops/s, /dev/fuse and io_uring", &bars)
}
