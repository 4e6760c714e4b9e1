//! `weft bench rebuild`: how fast a redundant layout is rebuilt onto spares after a data server is lost, and
//! GlusterFS disperse's self-heal beside it in the same run.
//!
//! Per rebuild throttle (`--rebuild-mib-s`, the MDS's `rebuild_mib_per_s`; 0 is unthrottled there) and run, a
//! fresh cluster: `--size` bytes are written in `--files` files of a directory set to `--layout` (1 MiB records,
//! `--window` in flight: the `write` result), the data server holding the most data chunks is killed with
//! SIGKILL, and the bench polls the MDS (`MemberStatus`, each file's layout generation, `ListStale`) until the
//! server is declared failed (`detect_s`: the silence of `rebuild_after_ms` plus a membership tick) and then until
//! every moved slot is healed (`rebuild_s`: the stale table empty and each moved slot's object on its new server
//! at least as long as the lost one). The headline is MiB/s of rebuilt data: bytes the spares received (their
//! object files' growth) over `rebuild_s`. Then every file is read back and compared with what was written (the
//! `read` result) and scrubbed without repair (parity and checksums of every row, the rebuilt chunks included):
//! any difference fails the run, so a fast wrong rebuild is never reported.
//!
//! GlusterFS (`--no-glusterfs` skips it): a `disperse 4 redundancy 2` volume on 6 loopback bricks, FUSE-mounted;
//! `--runs` sequential writes and reads of `--size` bytes in 1 MiB records; then one brick process is killed, the
//! same amount is written while it is down, the brick is brought back (`gluster volume start VOL force`), the heal
//! is triggered (`gluster volume heal VOL`) and timed until `heal info` shows 0 entries. Its rate is bytes the
//! brick received over that time, the same measure as Weft's (with 4+2 on both, a lost server's share is a
//! quarter of the file bytes on each side, so the ratio is the same counted in file bytes).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use clap::Args;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use weft_client::{Client, OpenMode};
use weft_launch::LocalCluster;
use weft_proto::DataRedundancy;

use crate::ceilings;
use crate::chart::{Bar, bars_svg};
use crate::common::{self, Loads, Targets, round1, round3};
use crate::doc::Document;
use crate::gluster_ec::{self, Disperse};
use crate::layouts::{LayoutChoice, fill_pattern, object_bytes, pattern_mismatch};
use crate::stats::summarize;

#[derive(Args, Clone, Debug)]
pub struct RebuildArgs {
    /// Bytes written before the kill, spread over --files files (and written to GlusterFS likewise).
    #[arg(long, default_value = "2G")]
    pub size: String,
    /// Files the bytes are spread over.
    #[arg(long, default_value_t = 4)]
    pub files: u32,
    /// The redundant layout of the files: `ecK+M` or `mirrorN`.
    #[arg(long, default_value = "ec4+2")]
    pub layout: String,
    /// Data servers of each cluster (at least the layout's width plus one spare).
    #[arg(long, default_value_t = 7)]
    pub servers: u32,
    /// Rebuild throttles to measure (the MDS's `rebuild_mib_per_s`; 0: unthrottled), a fresh cluster each.
    #[arg(long, default_value = "0,200")]
    pub rebuild_mib_s: String,
    /// Rebuilds per throttle (each fills a fresh cluster).
    #[arg(long, default_value_t = 1)]
    pub rebuild_runs: usize,
    /// Record size of Weft's fill and read-back: `row` (a whole stripe row, k × the stripe unit: encoded without a
    /// read–modify–write, so the fill is quick) or a size. GlusterFS's writes and reads use 1 MiB records.
    #[arg(long, default_value = "row")]
    pub record: String,
    /// Stripe unit of the layout's directory (`weft setstripe`'s default: 1M).
    #[arg(long, default_value = "1M")]
    pub stripe_unit: String,
    /// Records in flight at once (Weft).
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// The MDS's `rebuild_after_ms`: how long a silent server stays down before it is declared failed.
    #[arg(long, default_value_t = 5000)]
    pub rebuild_after_ms: u64,
    /// Give up on a rebuild (or a GlusterFS heal) after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
    /// Skip GlusterFS.
    #[arg(long)]
    pub no_glusterfs: bool,
    #[command(flatten)]
    pub common: common::SharedArgs,
}

/// GlusterFS's record size (the 1 MiB records).
const GLUSTER_RECORD_BYTES: u64 = 1 << 20;

/// How often the MDS is polled while a server is being declared failed and rebuilt.
const POLL_MS: u64 = 20;

/// What one file held on the killed server.
struct Lost {
    path: String,
    ino: u64,
    slot: usize,
    /// Length of its object on the killed server.
    object_bytes: u64,
    size: u64,
}

/// One rebuild run.
struct Run {
    write_mib: f64,
    write_cpu_s_per_gib: f64,
    read_mib: f64,
    victim: u32,
    detect_s: f64,
    rebuild_s: f64,
    /// Bytes the surviving servers' objects grew by during the rebuild.
    received: u64,
    /// Bytes of the killed server's objects (what had to be rebuilt).
    lost: u64,
    /// The healer's own count of bytes written.
    healer: u64,
    /// File bytes of the files that lost a chunk.
    file_bytes: u64,
    files_moved: usize,
    scrubbed_chunks: u64,
    verified: u64,
    loads: Loads,
}

pub async fn run(a: RebuildArgs) -> Result<()> {
    let size = crate::parse_bytes(&a.size).context("--size wants a size like 2G")?;
    let unit = crate::parse_bytes(&a.stripe_unit)
        .and_then(|u| u32::try_from(u).ok())
        .filter(|u| *u > 0 && u % 4096 == 0)
        .context("--stripe-unit wants a multiple of 4K below 4G, like 1M")?;
    let layout = LayoutChoice::parse(&a.layout).context("--layout wants ecK+M or mirrorN")?;
    let row = match layout.0 {
        DataRedundancy::Ec { k, .. } => u64::from(k) * u64::from(unit),
        _ => u64::from(unit),
    };
    let record = match a.record.as_str() {
        "row" => Some(row),
        r => crate::parse_bytes(r),
    }
    .filter(|r| (1..=64 << 20).contains(r))
    .context("--record: `row` or a size up to 64M")?;
    let Some(width) = layout.width() else { bail!("--layout {}: a plain file has nothing to rebuild", a.layout) };
    if a.servers <= width {
        bail!(
            "--servers {}: a {} layout needs at least {} (its width and a spare)",
            a.servers,
            layout.name(),
            width + 1
        );
    }
    let throttles: Vec<u64> =
        crate::parse_list(&a.rebuild_mib_s, |x| x.parse().ok()).context("--rebuild-mib-s wants a list like 0,200")?;
    if a.files == 0 || size < u64::from(a.files) || a.window == 0 || a.common.runs == 0 || a.rebuild_runs == 0 {
        bail!("--files, --window, --runs and --rebuild-runs must be at least 1, --size at least a byte per file");
    }
    if a.common.cluster.is_some() {
        bail!("weft bench rebuild kills a data server: it needs clusters it starts (not --cluster)");
    }
    let fabrics = common::fabric_choices(&a.common.fabric)?;
    let &[fabric] = &fabrics[..] else { bail!("weft bench rebuild measures one --fabric at a time") };
    let doc = Document::start("rebuild");
    let targets = Targets::new(&a.servers.to_string(), None, a.common.dir.as_deref())?.tuned(&a.common)?;
    let mut results = Vec::new();
    let mut used_fabric = String::new();
    for sp in targets.points() {
        for &mib_s in &throttles {
            let mut runs = Vec::new();
            for r in 0..a.rebuild_runs {
                eprintln!(
                    "rebuild: {} on {} servers, throttle {}, run {} of {}",
                    layout.name(),
                    a.servers,
                    throttle_name(mib_s),
                    r + 1,
                    a.rebuild_runs
                );
                let meta = format!(
                    "liveness_ms = {}\nheal_interval_ms = 1000\nscrub_mib_per_s = 0\nrebuild_mib_per_s = {mib_s}\n",
                    (a.rebuild_after_ms / 2).max(1)
                );
                let tag = format!("-rebuild-{mib_s}-{r}");
                let mut target = targets
                    .start_with(sp, &tag, |o| {
                        o.rebuild_after_ms = Some(a.rebuild_after_ms);
                        o.meta_extra_toml.push_str(&meta);
                        o.data_extra_toml.push_str("heartbeat_ms = 250\n");
                    })
                    .await?;
                let mut cfg = target.cfg.clone();
                cfg.client.fabric = fabric;
                let client = Client::connect(&cfg).await?;
                let cluster = target.cluster_mut().context("a cluster the bench started")?;
                let out = one_run(&client, cluster, &a, layout, unit, size, record, r as u64).await;
                used_fabric = common::fabric_used(&client).await;
                client.close().await;
                target.stop().await;
                let run = out?;
                eprintln!(
                    "  killed server {}: declared failed after {:.1} s, rebuilt {} MiB in {:.2} s = {:.0} MiB/s; \
                     write {:.0} MiB/s, read back {:.0} MiB/s, {} bytes verified",
                    run.victim,
                    run.detect_s,
                    run.received >> 20,
                    run.rebuild_s,
                    mib(run.received) / run.rebuild_s,
                    run.write_mib,
                    run.read_mib,
                    run.verified
                );
                runs.push(run);
            }
            results.extend(weft_results(&runs, &a, layout, unit, record, size, mib_s, &used_fabric, &sp));
        }
    }
    targets.finish();

    let glusterfs = if a.no_glusterfs {
        json!("not measured (--no-glusterfs)")
    } else {
        match glusterfs(&a, size, GLUSTER_RECORD_BYTES) {
            Ok(r) => {
                results.extend(r);
                json!("measured")
            }
            Err(e) => {
                eprintln!("GlusterFS not measured: {e:#}");
                json!(format!("not measured: {e:#}"))
            }
        }
    };
    add_ratios(&mut results);
    let targets = targets_block(&results);
    let config = json!({
        "size_bytes": size,
        "files": a.files,
        "layout": layout.name(),
        "servers": a.servers,
        "stripe_unit_bytes": unit,
        "record_bytes": record,
        "glusterfs_record_bytes": GLUSTER_RECORD_BYTES,
        "window": a.window,
        "rebuild_mib_per_s": throttles,
        "rebuild_runs": a.rebuild_runs,
        "runs": a.common.runs,
        "rebuild_after_ms": a.rebuild_after_ms,
        "liveness_ms": (a.rebuild_after_ms / 2).max(1),
        "heal_interval_ms": 1000,
        "background_scrub": "off (scrub_mib_per_s = 0): it would compete with the rebuild and repair what the check must see",
        "throttle_zero": "rebuild_mib_per_s = 0 is unthrottled (weft-heal's Throttle)",
        "kill": "SIGKILL of the data server holding the most data chunks of the files (ties: the lowest id)",
        "rebuild_clock": "from the first poll (every 20 ms) that sees the MDS move a layout to a spare, then `HealNow` \
            (as `weft heal --now`), until the stale table is empty and every moved slot's object on its new server \
            is at least as long as the lost one",
        "runs_note": "each rebuild run fills a fresh cluster: rebuild_runs per throttle (1 by default, as a run takes \
            a fill, a detection and a rebuild); GlusterFS's write and read run --runs times, its heal once",
        "verification": "every file read back and compared with the bytes written, then scrubbed without repair \
            (checksums of every chunk and the parity of every row): a difference fails the run",
        "glusterfs": glusterfs,
    });
    let doc = doc.finish(config, json!({}), results);
    let doc = with_targets(doc, targets);
    common::emit(&doc, &table(&doc), a.common.json.as_deref(), chart)
}

fn throttle_name(mib_s: u64) -> String {
    if mib_s == 0 { "unthrottled".to_string() } else { format!("{mib_s} MiB/s") }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// One fill, kill, rebuild and verification on a fresh cluster.
#[allow(clippy::too_many_arguments)]
async fn one_run(
    client: &Client,
    cluster: &mut LocalCluster,
    a: &RebuildArgs,
    layout: LayoutChoice,
    unit: u32,
    size: u64,
    record: u64,
    run: u64,
) -> Result<Run> {
    let dir = layout.prepare_dir(client, unit).await?;
    let mut loads = Loads::default();
    loads.start();
    let per_file = size / u64::from(a.files);
    let files: Vec<(String, u64, u64)> = (0..u64::from(a.files))
        .map(|i| {
            // The last file takes the remainder.
            let len = if i + 1 == u64::from(a.files) { size - per_file * i } else { per_file };
            (format!("{dir}/f{i}"), seed(run, i), len)
        })
        .collect();
    let (t, c) = (Instant::now(), ceilings::cpu_seconds());
    for (path, seed, len) in &files {
        write_file(client, path, *seed, *len, record, a.window).await?;
    }
    let (write_s, write_cpu) = (t.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c);
    let gib = size as f64 / (1u64 << 30) as f64;

    // Which server to kill: the one holding the most data chunks (a lost data chunk is decoded, not copied).
    let k = match layout.0 {
        DataRedundancy::Ec { k, .. } => usize::from(k),
        _ => usize::MAX,
    };
    let mut held: BTreeMap<u32, usize> = BTreeMap::new();
    let mut attrs = Vec::new();
    for (path, _, _) in &files {
        let attr = client.resolve(path).await?;
        let l = attr.layout.clone().context("a file has a layout")?;
        for (slot, &s) in l.servers.iter().enumerate() {
            *held.entry(s).or_default() += usize::from(slot < k) * 2 + 1;
        }
        attrs.push((path.clone(), attr, l));
    }
    let victim =
        held.iter().max_by_key(|&(id, n)| (*n, std::cmp::Reverse(*id))).map(|(id, _)| *id).context("no servers")?;
    let victim_root = cluster.data_root(victim);
    let mut lost = Vec::new();
    for (path, attr, l) in &attrs {
        if let Some(slot) = l.servers.iter().position(|&s| s == victim) {
            let object_bytes = std::fs::metadata(object_path(&victim_root, attr.ino)).map(|m| m.len()).unwrap_or(0);
            lost.push(Lost { path: path.clone(), ino: attr.ino, slot, object_bytes, size: attr.size });
        }
    }
    let lost_bytes: u64 = lost.iter().map(|l| l.object_bytes).sum();
    let survivors: Vec<u32> = (0..a.servers).filter(|&s| s != victim).collect();
    let before: Vec<u64> = survivors.iter().map(|&s| object_bytes(&cluster.data_root(s))).collect();
    let healer_before = client.list_stale(None, None, 0).await?.progress.bytes_healed;
    let changed_before = client.member_status().await?.layouts_changed;
    if changed_before != 0 {
        bail!(
            "the MDS moved {changed_before} layouts before the kill: a server was silent for rebuild_after_ms ({} ms) \
             under this load; rerun with a larger --rebuild-after-ms",
            a.rebuild_after_ms
        );
    }

    eprintln!("  kill -9 of data server {victim} ({} of {} files hold a chunk there)", lost.len(), files.len());
    let killed = Instant::now();
    cluster.kill_data_server(victim).await;
    let timeout = Duration::from_secs(a.timeout_s);
    // Declared failed: the MDS moved the first layout.
    loop {
        if client.member_status().await?.layouts_changed > changed_before {
            break;
        }
        if killed.elapsed() > timeout {
            bail!("the MDS did not declare data server {victim} failed within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    let detected = Instant::now();
    let detect_s = (detected - killed).as_secs_f64();
    client.heal_now().await.context("waking the healer")?;
    let mut last_report = Instant::now();
    let files_moved = loop {
        let moved = rebuilt(client, cluster, &lost, victim).await?;
        if moved == lost.len() && client.list_stale(None, None, 0).await?.total_entries == 0 {
            break moved;
        }
        if detected.elapsed() > timeout {
            let stale = client.list_stale(None, None, 0).await?;
            bail!(
                "the rebuild did not finish within {timeout:?}: {moved} of {} files rebuilt, {} stale entries, \
                 healer {:?}",
                lost.len(),
                stale.total_entries,
                stale.progress
            );
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            let m = client.member_status().await?;
            eprintln!(
                "  rebuilding: {moved} of {} files done, {} MiB left, {} MiB/s",
                lost.len(),
                m.rebuild_bytes_left.unwrap_or(0) >> 20,
                m.rebuild_bytes_per_s.unwrap_or(0) >> 20
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    };
    let rebuild_s = detected.elapsed().as_secs_f64();
    let after: Vec<u64> = survivors.iter().map(|&s| object_bytes(&cluster.data_root(s))).collect();
    let received: u64 = after.iter().zip(&before).map(|(a, b)| a.saturating_sub(*b)).sum();
    let healer = client.list_stale(None, None, 0).await?.progress.bytes_healed.saturating_sub(healer_before);
    if received < lost_bytes {
        bail!("the spares received {received} bytes, the killed server held {lost_bytes}: the rebuild is incomplete");
    }

    // The bytes: every file read back equal (the rebuilt chunks are among the ones read: the killed server is
    // still down), then parity and checksums of every row.
    let t = Instant::now();
    let mut verified = 0;
    for (path, seed, len) in &files {
        verified += read_file(client, path, *seed, *len, record, a.window).await?;
    }
    let read_s = t.elapsed().as_secs_f64();
    let scrub = weft_client::scrub::scrub_path(
        client,
        &dir,
        weft_client::scrub::ScrubOptions { repair: false, rate_mib_per_s: 0 },
    )
    .await
    .context("scrubbing after the rebuild")?;
    if scrub.inconsistencies > 0 || scrub.files != u64::from(a.files) {
        let first: Vec<String> = scrub.findings.iter().take(5).map(|f| f.to_string()).collect();
        bail!(
            "after the rebuild, scrub found {} inconsistencies in {} files (of {}): {}",
            scrub.inconsistencies,
            scrub.files,
            a.files,
            first.join("; ")
        );
    }
    loads.end();
    Ok(Run {
        write_mib: gib * 1024.0 / write_s,
        write_cpu_s_per_gib: write_cpu / gib,
        read_mib: gib * 1024.0 / read_s,
        victim,
        detect_s,
        rebuild_s,
        received,
        lost: lost_bytes,
        healer,
        file_bytes: lost.iter().map(|l| l.size).sum(),
        files_moved,
        scrubbed_chunks: scrub.chunks,
        verified,
        loads,
    })
}

/// The seed of file `i` of run `run` (files of different runs differ, so no stale object can pass for a fresh one).
fn seed(run: u64, i: u64) -> u64 {
    (run << 32) | (i + 1)
}

/// Where data server `root` keeps the object of inode `ino` (docs/format.md §5).
fn object_path(root: &std::path::Path, ino: u64) -> std::path::PathBuf {
    root.join("objects").join(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}"))
}

/// How many of the `lost` slots are rebuilt: moved off `victim` to a server whose object is at least as long as
/// the lost one.
async fn rebuilt(client: &Client, cluster: &LocalCluster, lost: &[Lost], victim: u32) -> Result<usize> {
    let mut n = 0;
    for l in lost {
        let attr = client.getattr(l.ino).await.with_context(|| l.path.clone())?;
        let Some(layout) = attr.layout else { continue };
        let Some(&now) = layout.servers.get(l.slot) else { continue };
        if now == victim || layout.generation == 0 {
            continue;
        }
        let len = std::fs::metadata(object_path(&cluster.data_root(now), l.ino)).map(|m| m.len()).unwrap_or(0);
        n += usize::from(len >= l.object_bytes);
    }
    Ok(n)
}

/// Writes `len` bytes of the pattern of `seed` to `path` with `window` records in flight, and closes it.
async fn write_file(client: &Client, path: &str, seed: u64, len: u64, record: u64, window: usize) -> Result<()> {
    let f = Arc::new(client.create_path(path, 0o644, false, true).await?);
    let mut tasks = JoinSet::new();
    let mut at = 0;
    while at < len {
        if tasks.len() >= window {
            tasks.join_next().await.expect("non-empty")??;
        }
        let n = record.min(len - at);
        let f = f.clone();
        tasks.spawn(async move {
            let mut b = vec![0u8; n as usize];
            fill_pattern(seed, at, &mut b);
            f.write_at(at, bytes::Bytes::from(b)).await
        });
        at += n;
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    f.commit().await?;
    Ok(())
}

/// Reads `path` back with `window` records in flight, comparing every byte with the pattern of `seed`; returns
/// the bytes compared. A difference fails, naming the file and offset.
async fn read_file(client: &Client, path: &str, seed: u64, len: u64, record: u64, window: usize) -> Result<u64> {
    let f = Arc::new(client.open(path, OpenMode::Read).await?);
    if f.size() != len {
        bail!("{path}: size {} after writing {len} bytes", f.size());
    }
    let mut tasks: JoinSet<Result<u64>> = JoinSet::new();
    let mut at = 0;
    let mut done = 0;
    while at < len {
        if tasks.len() >= window {
            done += tasks.join_next().await.expect("non-empty")??;
        }
        let n = record.min(len - at);
        let (f, path) = (f.clone(), path.to_string());
        tasks.spawn(async move {
            let b = f.read_at(at, BytesMut::zeroed(n as usize)).await?;
            if b.len() as u64 != n {
                bail!("{path}: {} bytes read at offset {at}, {n} expected", b.len());
            }
            if let Some(bad) = pattern_mismatch(seed, at, &b) {
                bail!("{path}: wrong bytes at offset {bad} after the rebuild");
            }
            Ok(n)
        });
        at += n;
    }
    while let Some(r) = tasks.join_next().await {
        done += r??;
    }
    Ok(done)
}

/// The results of one throttle's runs: Weft's write and read (from the fills and the read-back) and its rebuild.
#[allow(clippy::too_many_arguments)]
fn weft_results(
    runs: &[Run],
    a: &RebuildArgs,
    layout: LayoutChoice,
    unit: u32,
    record: u64,
    size: u64,
    mib_s: u64,
    fabric: &str,
    sp: &common::Point,
) -> Vec<Value> {
    let base = json!({
        "system": "weft",
        "layout": layout.name(),
        "servers": a.servers,
        "stripe_unit_bytes": unit,
        "fabric": fabric,
        "auth": common::auth_name(sp.auth),
        "tls": sp.tls,
        "record_bytes": record,
        "size_bytes": size,
        "files": a.files,
        "rebuild_mib_per_s_throttle": mib_s,
    });
    let figure = |op: &str, v: Vec<f64>, extra: Value| {
        let s = summarize(&v).expect("runs >= 1");
        let mut r = base.clone();
        let o = r.as_object_mut().expect("an object");
        o.insert("op".into(), json!(op));
        o.insert("mib_per_s".into(), json!(round1(s.median)));
        o.insert("min".into(), json!(round1(s.min)));
        o.insert("max".into(), json!(round1(s.max)));
        o.insert("runs".into(), json!(s.runs));
        if let Value::Object(e) = extra {
            o.extend(e);
        }
        let mut loads = Loads::default();
        for run in runs {
            loads.before.extend(&run.loads.before);
            loads.after.extend(&run.loads.after);
        }
        loads.annotate(&mut r);
        r
    };
    let med = |f: &dyn Fn(&Run) -> f64| summarize(&runs.iter().map(f).collect::<Vec<_>>()).map_or(0.0, |s| s.median);
    let rate = |r: &Run| mib(r.received) / r.rebuild_s;
    let rebuild_mib = med(&rate);
    vec![
        figure(
            "write",
            runs.iter().map(|r| r.write_mib).collect(),
            json!({"client_cpu_s_per_gib": round3(med(&|r| r.write_cpu_s_per_gib)), "note": "the fill before the kill"}),
        ),
        figure(
            "read",
            runs.iter().map(|r| r.read_mib).collect(),
            json!({"note": "the read-back after the rebuild, every byte compared, the killed server still down",
                "bytes_verified": runs.iter().map(|r| r.verified).sum::<u64>()}),
        ),
        figure(
            "rebuild",
            runs.iter().map(rate).collect(),
            json!({
                "headline": "mib_per_s: bytes the spares received over rebuild_s",
                "killed_server": runs.iter().map(|r| r.victim).collect::<Vec<_>>(),
                "detect_s": round3(med(&|r| r.detect_s)),
                "rebuild_s": round3(med(&|r| r.rebuild_s)),
                "rebuild_s_per_run": runs.iter().map(|r| round3(r.rebuild_s)).collect::<Vec<_>>(),
                "bytes_rebuilt": runs.iter().map(|r| r.received).collect::<Vec<_>>(),
                "bytes_lost": runs.iter().map(|r| r.lost).collect::<Vec<_>>(),
                "healer_bytes_written": runs.iter().map(|r| r.healer).collect::<Vec<_>>(),
                "healer_mib_per_s": round1(med(&|r| mib(r.healer) / r.rebuild_s)),
                "file_mib_per_s": round1(med(&|r| mib(r.file_bytes) / r.rebuild_s)),
                "files_rebuilt": runs.iter().map(|r| r.files_moved).collect::<Vec<_>>(),
                "ratio_to_throttle": (mib_s > 0).then(|| round3(rebuild_mib / mib_s as f64)),
                "bytes_verified": runs.iter().map(|r| r.verified).sum::<u64>(),
                "verified": true,
                "scrub_inconsistencies": 0,
                "scrub_chunks": runs.iter().map(|r| r.scrubbed_chunks).sum::<u64>(),
            }),
        ),
    ]
}

/// GlusterFS: write and read `--runs` times, then the heal after a brick is killed.
fn glusterfs(a: &RebuildArgs, size: u64, record: u64) -> Result<Vec<Value>> {
    let base_dir = a.common.dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = base_dir.join(format!("weft-bench-rebuild-gluster-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let r = glusterfs_in(&work, a, size, record);
    let _ = std::fs::remove_dir_all(&work);
    r
}

fn glusterfs_in(work: &std::path::Path, a: &RebuildArgs, size: u64, record: u64) -> Result<Vec<Value>> {
    eprintln!("GlusterFS: disperse {} redundancy {} on 6 bricks", gluster_ec::DATA_BRICKS, gluster_ec::REDUNDANCY);
    let g = Disperse::start(work)?;
    let gib = size as f64 / (1u64 << 30) as f64;
    let (mut w, mut r, mut wc, mut rc) = (vec![], vec![], vec![], vec![]);
    let mut loads = Loads::default();
    let file = g.mnt.join("seq");
    // Warm-up: a small file brings up the mount's connections.
    gluster_ec::write_file(&file, 7, size.min(16 * record), record)?;
    gluster_ec::read_file(&file, 7, size.min(16 * record), record)?;
    for run in 0..a.common.runs {
        eprintln!("  GlusterFS: write and read, run {} of {}", run + 1, a.common.runs);
        loads.start();
        let (ws, wcpu) = gluster_ec::write_file(&file, 100 + run as u64, size, record)?;
        let (rs, rcpu) = gluster_ec::read_file(&file, 100 + run as u64, size, record)?;
        loads.end();
        w.push(gib * 1024.0 / ws);
        r.push(gib * 1024.0 / rs);
        wc.push(wcpu / gib);
        rc.push(rcpu / gib);
    }
    std::fs::remove_file(&file)?;

    // The heal: kill a brick, write while it is down, bring it back, heal.
    let victim = 0;
    eprintln!("  GlusterFS: kill -9 of brick {victim}, then {} MiB written while it is down", size >> 20);
    let old_pid = g.kill_brick(victim)?;
    let per_file = size / u64::from(a.files);
    let mut written = Vec::new();
    for i in 0..u64::from(a.files) {
        let len = if i + 1 == u64::from(a.files) { size - per_file * i } else { per_file };
        let path = g.mnt.join(format!("heal{i}"));
        gluster_ec::write_file(&path, 200 + i, len, record)?;
        written.push((format!("heal{i}"), len));
    }
    g.restart_brick(victim, old_pid)?;
    let t = Instant::now();
    g.trigger_heal()?;
    let heal_s = g.wait_healed(t, Duration::from_secs(a.timeout_s))?;
    // What the brick received: its fragments of the files written while it was down, each as long as the same
    // file's fragment on a brick that was up (else the heal is not complete, whatever `heal info` says).
    let mut received = 0;
    for (name, _) in &written {
        let healed = std::fs::metadata(g.bricks[victim].join(name)).map(|m| m.len()).unwrap_or(0);
        let other = std::fs::metadata(g.bricks[victim + 1].join(name)).map(|m| m.len()).unwrap_or(0);
        if healed != other || other == 0 {
            bail!(
                "GlusterFS heal info shows 0 entries but brick {victim}'s fragment of {name} has {healed} bytes, another brick's {other}"
            );
        }
        received += healed;
    }
    let file_bytes: u64 = written.iter().map(|(_, l)| l).sum();
    eprintln!(
        "  GlusterFS healed {} MiB on the brick in {heal_s:.2} s = {:.1} MiB/s",
        received >> 20,
        mib(received) / heal_s
    );
    drop(g);

    let base = json!({"system": "glusterfs", "layout": format!("disperse {}+{}", gluster_ec::DATA_BRICKS, gluster_ec::REDUNDANCY),
        "servers": gluster_ec::DATA_BRICKS + gluster_ec::REDUNDANCY, "fabric": "tcp", "access": "fuse",
        "record_bytes": record, "size_bytes": size});
    let figure = |op: &str, v: &[f64], cpu: &[f64]| {
        let s = summarize(v).expect("runs >= 1");
        let mut r = base.clone();
        let o = r.as_object_mut().expect("an object");
        o.insert("op".into(), json!(op));
        o.insert("mib_per_s".into(), json!(round1(s.median)));
        o.insert("min".into(), json!(round1(s.min)));
        o.insert("max".into(), json!(round1(s.max)));
        o.insert("runs".into(), json!(s.runs));
        o.insert("client_cpu_s_per_gib".into(), json!(summarize(cpu).map(|c| round3(c.median))));
        loads.annotate(&mut r);
        r
    };
    let mut heal = base.clone();
    let rate = mib(received) / heal_s;
    if let Some(o) = heal.as_object_mut() {
        o.extend(
            json!({
                "op": "heal",
                "headline": "mib_per_s: bytes the brick received over heal_s",
                "mib_per_s": round1(rate), "min": round1(rate), "max": round1(rate), "runs": 1,
                "heal_s": round3(heal_s),
                "bytes_written_while_down": file_bytes,
                "file_mib_per_s": round1(mib(file_bytes) / heal_s),
                "bytes_healed": received,
                "heal_clock": "from the brick's new process running (after `gluster volume start VOL force`), then \
                    `gluster volume heal VOL`, until `heal info` shows 0 entries on every brick, all connected (polled \
                    every 200 ms)",
            })
            .as_object()
            .cloned()
            .unwrap_or_default(),
        );
    }
    let mut read = figure("read", &r, &rc);
    read["bytes_verified"] = json!(size * a.common.runs as u64);
    Ok(vec![figure("write", &w, &wc), read, heal])
}

/// Weft's write and read over GlusterFS's (`ratio_to_glusterfs`, only with the same record size), its rebuild
/// over GlusterFS's heal (`ratio_to_glusterfs_heal`), when GlusterFS was measured.
fn add_ratios(results: &mut [Value]) {
    let peer = |op: &str| {
        results
            .iter()
            .find(|r| r["system"] == "glusterfs" && r["op"] == op)
            .map(|r| (r["mib_per_s"].as_f64(), r["record_bytes"].clone()))
    };
    let (w, rd, heal) = (peer("write"), peer("read"), peer("heal"));
    for r in results.iter_mut().filter(|r| r["system"] == "weft") {
        let Some(x) = r["mib_per_s"].as_f64() else { continue };
        let same_record =
            |p: Option<(Option<f64>, Value)>| p.filter(|(_, rec)| *rec == r["record_bytes"]).and_then(|(m, _)| m);
        let (key, base) = match r["op"].as_str() {
            Some("write") => ("ratio_to_glusterfs", same_record(w.clone())),
            Some("read") => ("ratio_to_glusterfs", same_record(rd.clone())),
            Some("rebuild") => ("ratio_to_glusterfs_heal", heal.clone().and_then(|(m, _)| m)),
            _ => continue,
        };
        r[key] = json!(base.filter(|b| *b > 0.0).map(|b| round3(x / b)));
    }
}

/// The rebuild targets against this run: ≥ 10× GlusterFS's heal rate, and a throttled rebuild at ≥ 50 %
/// of its throttle.
fn targets_block(results: &[Value]) -> Value {
    let rebuilds: Vec<&Value> = results.iter().filter(|r| r["system"] == "weft" && r["op"] == "rebuild").collect();
    let vs_gluster: Vec<Value> = rebuilds
        .iter()
        .map(|r| {
            let x = r["ratio_to_glusterfs_heal"].as_f64();
            json!({"throttle": r["rebuild_mib_per_s_throttle"], "ratio": x, "met": x.map(|x| x >= 10.0)})
        })
        .collect();
    let vs_throttle: Vec<Value> = rebuilds
        .iter()
        .filter(|r| r["rebuild_mib_per_s_throttle"].as_u64().unwrap_or(0) > 0)
        .map(|r| {
            let x = r["ratio_to_throttle"].as_f64();
            json!({"throttle": r["rebuild_mib_per_s_throttle"], "ratio": x, "met": x.map(|x| x >= 0.5)})
        })
        .collect();
    json!({
        "rebuild_vs_glusterfs_heal": {"target": 10.0, "points": vs_gluster},
        "rebuild_vs_throttle": {"target": 0.5, "points": vs_throttle},
    })
}

fn with_targets(mut doc: Value, targets: Value) -> Value {
    if let Some(o) = doc.as_object_mut() {
        o.insert("targets".into(), targets);
    }
    doc
}

/// A Markdown table of a `weft bench rebuild` document.
pub fn table(doc: &Value) -> String {
    let c = &doc["config"];
    let mut s = format!(
        "{} over {} files, {} data servers, kill -9 of one; rebuild_after_ms {}; GlusterFS: {}\n\n",
        crate::tables::human_bytes(c["size_bytes"].as_u64().unwrap_or(0)),
        c["files"],
        c["servers"],
        c["rebuild_after_ms"],
        c["glusterfs"].as_str().unwrap_or("-"),
    );
    s.push_str("| system | layout | op | throttle MiB/s | MiB/s (median) | min–max | detect s | rebuild/heal s | bytes rebuilt | × throttle | × GlusterFS | × GlusterFS heal | bytes verified | runs |\n");
    s.push_str("|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let cell = |v: &Value, d: usize| v.as_f64().map(|x| format!("{x:.d$}")).unwrap_or_else(|| "-".into());
    for r in doc["results"].as_array().into_iter().flatten() {
        let throttle = match r["rebuild_mib_per_s_throttle"].as_u64() {
            Some(0) => "unthrottled".to_string(),
            Some(x) => x.to_string(),
            None => "-".to_string(),
        };
        let rebuilt = match (&r["bytes_rebuilt"], &r["bytes_healed"]) {
            (Value::Array(v), _) => v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "),
            (_, Value::Number(n)) => n.to_string(),
            _ => "-".into(),
        };
        let secs = if r["op"] == "heal" { &r["heal_s"] } else { &r["rebuild_s"] };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {}–{} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["system"].as_str().unwrap_or("?"),
            r["layout"].as_str().unwrap_or("-"),
            r["op"].as_str().unwrap_or("?"),
            throttle,
            cell(&r["mib_per_s"], 1),
            cell(&r["min"], 1),
            cell(&r["max"], 1),
            cell(&r["detect_s"], 2),
            cell(secs, 2),
            rebuilt,
            cell(&r["ratio_to_throttle"], 2),
            cell(&r["ratio_to_glusterfs"], 2),
            cell(&r["ratio_to_glusterfs_heal"], 2),
            r["bytes_verified"].as_u64().map_or("-".to_string(), |b| b.to_string()),
            r["runs"],
        ));
    }
    s
}

/// MiB/s per result: Weft's write, read and rebuild per throttle, GlusterFS's write, read and heal.
pub fn chart(doc: &Value) -> String {
    let bars: Vec<Bar> = doc["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let system = r["system"].as_str().unwrap_or("?");
            let op = r["op"].as_str().unwrap_or("?");
            let sublabel = match r["rebuild_mib_per_s_throttle"].as_u64() {
                Some(0) => "unthrottled".to_string(),
                Some(x) => format!("≤{x} MiB/s"),
                None => "disperse 4+2".to_string(),
            };
            Bar {
                value: r["mib_per_s"].as_f64().unwrap_or(0.0),
                min: r["min"].as_f64(),
                max: r["max"].as_f64(),
                label: format!("{system} {op}"),
                sublabel,
                color: match (system, op) {
                    ("weft", "rebuild") => "#4caf50",
                    ("glusterfs", "heal") => "#795548",
                    (_, "read") => "#3b7dd8",
                    _ => "#e08a2c",
                },
            }
        })
        .collect();
    bars_svg("weft bench rebuild: MiB/s (median; rebuild/heal: bytes the replacement received per second)", &bars)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        let weft = |op: &str, mib: f64, throttle: u64| {
            json!({"system": "weft", "layout": "ec4+2", "op": op, "mib_per_s": mib, "min": mib, "max": mib,
                "record_bytes": if op == "write" { 1u64 << 20 } else { 4 << 20 },
                "runs": 1, "rebuild_mib_per_s_throttle": throttle, "ratio_to_throttle": if throttle > 0 {
                Some(mib / throttle as f64) } else { None }, "rebuild_s": 2.0, "detect_s": 5.5,
                "bytes_rebuilt": [512u64 << 20], "bytes_verified": 2u64 << 30})
        };
        let g = |op: &str, mib: f64| {
            json!({"system": "glusterfs", "layout": "disperse 4+2", "op": op,
            "record_bytes": 1u64 << 20,
            "mib_per_s": mib, "min": mib, "max": mib, "runs": 3, "heal_s": 10.0, "bytes_healed": 1u64 << 29})
        };
        let mut results = vec![
            weft("write", 300.0, 0),
            weft("read", 600.0, 0),
            weft("rebuild", 400.0, 0),
            weft("rebuild", 150.0, 200),
            g("write", 100.0),
            g("read", 200.0),
            g("heal", 20.0),
        ];
        add_ratios(&mut results);
        let targets = targets_block(&results);
        json!({"config": {"size_bytes": 2u64 << 30, "files": 4, "servers": 7, "rebuild_after_ms": 5000,
            "glusterfs": "measured"}, "results": results, "targets": targets})
    }

    #[test]
    fn ratios_and_targets() {
        let d = doc();
        let r = &d["results"];
        assert_eq!(r[0]["ratio_to_glusterfs"], 3.0);
        assert_eq!(r[1]["ratio_to_glusterfs"], Value::Null, "4 MiB records are not compared with 1 MiB ones");
        assert_eq!(r[2]["ratio_to_glusterfs_heal"], 20.0);
        assert_eq!(r[3]["ratio_to_glusterfs_heal"], 7.5);
        assert!(r[4].get("ratio_to_glusterfs").is_none(), "GlusterFS is not compared with itself");
        let t = &d["targets"];
        assert_eq!(t["rebuild_vs_glusterfs_heal"]["points"][0]["met"], true);
        assert_eq!(t["rebuild_vs_glusterfs_heal"]["points"][1]["met"], false);
        assert_eq!(t["rebuild_vs_throttle"]["points"].as_array().unwrap().len(), 1);
        assert_eq!(t["rebuild_vs_throttle"]["points"][0]["met"], true);
    }

    #[test]
    fn table_and_chart_have_a_row_and_a_bar_per_result() {
        let d = doc();
        let t = table(&d);
        assert_eq!(t.lines().filter(|l| l.starts_with("| weft") || l.starts_with("| glusterfs")).count(), 7, "{t}");
        assert!(t.contains("| weft | ec4+2 | rebuild | unthrottled | 400.0 |"), "{t}");
        assert!(t.contains("| glusterfs | disperse 4+2 | heal |"), "{t}");
        let svg = chart(&d);
        assert_eq!(svg.matches("<rect x=").count(), 7, "{svg}");
        assert!(!svg.contains("NaN"));
    }
}
