//! `weft bench checkpoint`: N client processes write a checkpoint together, as an HPC application does between
//! compute phases. N-N: every process writes its own file of `--size` and fsyncs it. N-1: every process writes
//! its disjoint `--size` slice of one shared file (offset rank × size) and fsyncs it. Files inherit a stripe count
//! (1–4) from their directory (`setstripe`). The time of a checkpoint runs from the release of the processes
//! (a barrier across processes, see `worker`) to the last one's fsync; reported as seconds per checkpoint and the
//! aggregate MiB/s, with the client processes' CPU seconds per GiB.

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use weft_client::{Client, OpenMode};

use crate::common::{self, Loads, Target, Targets, round1, round3};
use crate::doc::Document;
use crate::stats::summarize;
use crate::worker::Workers;

#[derive(Args, Clone, Debug)]
pub struct CheckpointArgs {
    /// Data-server counts to measure, e.g. `1,4` (ignored with --cluster).
    #[arg(long, default_value = "4")]
    pub servers: String,
    /// Client process counts, e.g. `1,2,4`.
    #[arg(long, default_value = "1,2,4")]
    pub procs: String,
    /// Bytes each process writes per checkpoint.
    #[arg(long, default_value = "64M")]
    pub size: String,
    /// Patterns: `n-n` (a file per process), `n-1` (one shared file), or both.
    #[arg(long, default_value = "n-n,n-1")]
    pub mode: String,
    /// Stripe counts of the checkpoint files, e.g. `1,2,4` (counts above the data servers are skipped).
    #[arg(long, default_value = "1,2,4")]
    pub stripes: String,
    /// Stripe unit of the checkpoint files.
    #[arg(long, default_value = "1M")]
    pub stripe_unit: String,
    /// Bytes per write call.
    #[arg(long, default_value = "1M")]
    pub record: String,
    /// Writes in flight per process.
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    #[command(flatten)]
    pub common: common::SharedArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    NN,
    N1,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::NN => "n-n",
            Mode::N1 => "n-1",
        }
    }
}

struct Params {
    size: u64,
    record: u64,
    unit: u32,
}

pub async fn run(a: CheckpointArgs) -> Result<()> {
    let procs: Vec<usize> =
        crate::parse_list(&a.procs, |x| x.parse().ok()).context("--procs wants a list like 1,2,4")?;
    let stripes: Vec<u32> =
        crate::parse_list(&a.stripes, |x| x.parse().ok()).context("--stripes wants a list like 1,2,4")?;
    let modes: Vec<Mode> = crate::parse_list(&a.mode, |x| match x {
        "n-n" | "N-N" => Some(Mode::NN),
        "n-1" | "N-1" => Some(Mode::N1),
        _ => None,
    })
    .context("--mode wants n-n, n-1 or both")?;
    let size = crate::parse_bytes(&a.size).context("--size wants a size like 64M")?;
    let record = crate::parse_bytes(&a.record).context("--record wants a size like 1M")?;
    let unit = crate::parse_bytes(&a.stripe_unit).context("--stripe-unit wants a size like 1M")?;
    if a.common.runs == 0 || a.window == 0 || size == 0 || procs.contains(&0) || stripes.contains(&0) {
        bail!("--runs, --window, --size, --procs and --stripes must be at least 1");
    }
    if record == 0 || record > 64 << 20 {
        bail!("--record must be between 1 byte and 64M");
    }
    let unit = u32::try_from(unit).ok().filter(|u| *u >= 4096 && u % 4096 == 0).context("--stripe-unit: 4K..4G")?;
    let p = Params { size, record, unit };
    let fabrics = common::fabric_choices(&a.common.fabric)?;
    let doc = Document::start("checkpoint");
    let targets = Targets::new(&a.servers, a.common.cluster.as_deref(), a.common.dir.as_deref())?.tuned(&a.common)?;
    let points = targets.points();
    let steps = (points.len() * fabrics.len() * stripes.len() * modes.len() * procs.len() * a.common.runs) as u64;
    let pb = common::progress(steps, "checkpoint");
    let mut results = Vec::new();
    for sp in points {
        let mut target = targets.start(sp).await?;
        for &fabric in &fabrics {
            target.cfg.client.fabric = fabric;
            for &k in &stripes {
                if k > target.servers {
                    pb.suspend(|| eprintln!("stripes {k} > {} data servers: skipped", target.servers));
                    pb.inc((modes.len() * procs.len() * a.common.runs) as u64);
                    continue;
                }
                for &m in &modes {
                    for &n in &procs {
                        let r = point(&target, k, m, n, &p, &a, &pb).await?;
                        pb.suspend(|| {
                            eprintln!(
                                "{} servers {} stripes {k} {} procs {n}: {} s per checkpoint, {} MiB/s",
                                r["fabric"].as_str().unwrap_or("?"),
                                target.servers,
                                m.name(),
                                r["checkpoint_s"],
                                r["mib_per_s"]
                            )
                        });
                        results.push(r);
                    }
                }
            }
        }
        target.stop().await;
    }
    pb.finish_and_clear();
    targets.finish();
    let config = json!({
        "size_bytes_per_proc": size,
        "record_bytes": record,
        "stripe_unit_bytes": unit,
        "window": a.window,
        "runs": a.common.runs,
        "clients_are": "processes (weft bench worker), each with its own Client",
        "checkpoint_time": "from the release of a barrier across the processes to the last process's fsync",
    });
    let doc = doc.finish(config, json!({}), results);
    common::emit(&doc, &table(&doc), a.common.json.as_deref(), crate::chart::checkpoint_svg)
}

/// One (stripes, mode, processes) point: a warm-up checkpoint, then `runs` timed ones.
async fn point(
    target: &Target,
    stripes: u32,
    mode: Mode,
    n: usize,
    p: &Params,
    a: &CheckpointArgs,
    pb: &indicatif::ProgressBar,
) -> Result<Value> {
    let client = Client::connect(&target.cfg).await?;
    let dir = format!("/ckpt-{}-s{stripes}-{}-n{n}", std::process::id(), mode.name());
    let root = client.resolve("/").await?.ino;
    let d = client.mkdir(root, &dir[1..], 0o755).await.with_context(|| format!("mkdir {dir}"))?;
    client.set_layout(d.ino, p.unit, stripes).await.context("setstripe")?;
    // Run 0 is the warm-up (a small checkpoint: sessions, connections, the servers' object files).
    let warm = p.size.min(4 << 20);
    let file = |run: usize, rank: usize| match mode {
        Mode::NN => format!("{dir}/rank{rank}.run{run}"),
        Mode::N1 => format!("{dir}/shared.run{run}"),
    };
    let phases: Vec<Vec<Value>> = (0..n)
        .map(|rank| {
            (0..=a.common.runs)
                .map(|run| {
                    let bytes = if run == 0 { warm } else { p.size };
                    let offset = if mode == Mode::N1 { rank as u64 * bytes } else { 0 };
                    json!({"op": "write", "path": file(run, rank), "offset": offset, "bytes": bytes,
                        "record": p.record, "window": a.window, "fsync": true, "create": mode == Mode::NN})
                })
                .collect()
        })
        .collect();
    if mode == Mode::N1 {
        for run in 0..=a.common.runs {
            client.create_path(&file(run, 0), 0o644, true, false).await?;
        }
    }
    let mut w = Workers::spawn(&target.cfg, phases).await?;
    w.phase().await?;
    let (mut secs, mut mib, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    let mut loads = Loads::default();
    let mut fabrics = Vec::new();
    for _ in 0..a.common.runs {
        loads.start();
        let r = w.phase().await?;
        loads.end();
        fabrics.push(r.fabric());
        pb.inc(1);
        let bytes = r.bytes();
        if bytes != p.size * n as u64 {
            bail!("a checkpoint wrote {bytes} bytes, {} expected", p.size * n as u64);
        }
        secs.push(r.secs);
        mib.push(bytes as f64 / (1u64 << 20) as f64 / r.secs);
        cpu.push(r.cpu_s() / (bytes as f64 / (1u64 << 30) as f64));
    }
    let children_cpu = w.finish().await?;
    // Every byte is where it belongs: the shared file is N slices long, each private one a slice.
    for run in 1..=a.common.runs {
        let expect = if mode == Mode::N1 { p.size * n as u64 } else { p.size };
        let f = client.open(&file(run, 0), OpenMode::Read).await?;
        if f.size() != expect {
            bail!("{}: size {} after a checkpoint of {expect} bytes", file(run, 0), f.size());
        }
    }
    for run in 0..=a.common.runs {
        let ranks = if mode == Mode::N1 { 1 } else { n };
        for rank in 0..ranks {
            let path = file(run, rank);
            client.unlink(d.ino, path.rsplit('/').next().unwrap_or_default()).await?;
        }
    }
    client.rmdir(root, &dir[1..]).await?;
    client.close().await;

    let (s, m, c) = (summarize(&secs), summarize(&mib), summarize(&cpu));
    let (s, m, c) = (s.expect("runs >= 1"), m.expect("runs >= 1"), c.expect("runs >= 1"));
    let mut r = json!({
        "system": "weft",
        "fabric": common::merge_fabrics(fabrics.iter().map(String::as_str)),
        "servers": target.servers,
        "clients": n,
        "procs": n,
        "mode": mode.name(),
        "stripes": stripes,
        "size_bytes_per_proc": p.size,
        "record_bytes": p.record,
        "op": "checkpoint",
        "checkpoint_s": round3(s.median),
        "checkpoint_s_min": round3(s.min),
        "checkpoint_s_max": round3(s.max),
        "mib_per_s": round1(m.median),
        "ops_per_s": round3(1.0 / s.median),
        "client_cpu_s_per_gib": round3(c.median),
        "client_cpu_s_children_total": round3(children_cpu),
        "runs": m.runs,
        "min": round1(m.min),
        "max": round1(m.max),
    });
    loads.annotate(&mut r);
    Ok(r)
}

/// A Markdown table of a checkpoint document.
pub fn table(doc: &Value) -> String {
    let mut s = format!(
        "checkpoint: every process writes {} and fsyncs; time from a barrier across processes to the last fsync\n\n",
        crate::tables::human_bytes(doc.pointer("/config/size_bytes_per_proc").and_then(Value::as_u64).unwrap_or(0))
    );
    s.push_str("| servers | stripes | mode | procs | s per checkpoint (median) | min–max s | MiB/s | client CPU s/GiB | runs |\n");
    s.push_str("|---:|---:|---|---:|---:|---|---:|---:|---:|\n");
    for r in doc["results"].as_array().into_iter().flatten() {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.3} | {:.3}–{:.3} | {:.0} | {:.3} | {} |\n",
            r["servers"],
            r["stripes"],
            r["mode"].as_str().unwrap_or("?"),
            r["procs"],
            f("checkpoint_s"),
            f("checkpoint_s_min"),
            f("checkpoint_s_max"),
            f("mib_per_s"),
            f("client_cpu_s_per_gib"),
            r["runs"],
        ));
    }
    s
}
