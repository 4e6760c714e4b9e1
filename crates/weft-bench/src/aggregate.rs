//! Aggregate mode of `weft bench throughput` (`--procs N`): N client processes (`weft bench worker`), each
//! writing then reading its own file of `--size`, released together; the aggregate rate is all bytes over the
//! time from the release to the last process's end, the CPU that of the workers (their own getrusage over each
//! phase).

use anyhow::Result;
use serde_json::json;
use weft_client::{Client, ClusterConfig};

use crate::throughput::{Point, ThroughputArgs};
use crate::worker::Workers;

pub(crate) async fn measure(
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

/// `weft bench meta --procs N`: mdtest's create, stat, readdir and remove with N client processes, each with its
/// share of `--files` in its own directory (or all in one with `--shared`); ops/s is a phase's operations over
/// the time from the release of the processes to the last one's end (readdir counts entries).
pub(crate) async fn meta(target: &crate::common::Target, a: &crate::meta::MetaArgs) -> Result<Vec<serde_json::Value>> {
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
