//! `weft bench mount`: fio and a metadata loop on a Weft FUSE mount and, in the same run, on the FUSE ceiling of
//! this machine (libfuse's `passthrough_ll` over the same local disk) and on a real clustered peer (a GlusterFS
//! 2-brick distributed volume on loopback, FUSE-mounted). Every figure is reported with its ratio to both.
//!
//! The peers come from Debian's packages (`make bench-deps` installs fio, libfuse3-dev, gcc and glusterfs-server);
//! `passthrough_ll` is compiled from the example source libfuse3-dev ships. Everything lives under one temporary
//! directory on the local disk and is unmounted and stopped at the end, also on failure.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use weft_client::FabricChoice;
use weft_launch::{LaunchOptions, LocalCluster};

use crate::ceilings;
use crate::common::{Loads, round1, round3};
use crate::doc::Document;
use crate::stats::summarize;

#[derive(Args, Clone, Debug)]
pub struct MountArgs {
    /// Data servers of the Weft cluster.
    #[arg(long, default_value_t = 4)]
    pub servers: u32,
    /// File size of the sequential fio jobs.
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// Seconds of each random 4 KiB fio job.
    #[arg(long, default_value_t = 5)]
    pub random_seconds: u32,
    /// fio jobs (threads) of the random 4 KiB jobs.
    #[arg(long, default_value_t = 4)]
    pub random_jobs: u32,
    /// File size of each random job.
    #[arg(long, default_value = "256M")]
    pub random_size: String,
    /// Files created then stat'ed by the metadata loop.
    #[arg(long, default_value_t = 2000)]
    pub files: u32,
    /// Threads of the metadata loop.
    #[arg(long, default_value_t = 4)]
    pub threads: u32,
    /// Repetitions per figure (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Systems to measure, of `weft,weft-ec4+2,weft-no-leases,passthrough_ll,glusterfs,juicefs,juicefs-everysec`
    /// (`weft-ec4+2`: every file `ec 4+2`, at least 6 servers; `weft-no-leases`: the mount without metadata
    /// leases; `juicefs`: JuiceFS 1.4 on a private Redis with `appendfsync always`, `juicefs-everysec` with
    /// `everysec`, data in a local directory).
    #[arg(long, default_value = "weft,passthrough_ll,glusterfs,juicefs,juicefs-everysec")]
    pub systems: String,
    /// The fabric the Weft mount reaches its data servers by: tcp, shm or rdma (auto: shm to same-host servers,
    /// rdma to others that offer it; recorded as `auto`, which one the mount process chose is not seen from here).
    #[arg(long, env = "WEFT_FABRIC", default_value = "tcp", value_name = "auto|tcp|shm|rdma")]
    pub fabric: FabricChoice,
    /// Working directory on the local disk (default: a fresh one under /tmp).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write results here (an SVG chart is written beside it).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// A mounted system under test; unmounted and stopped on drop.
pub(crate) struct Target {
    pub(crate) system: &'static str,
    pub(crate) mnt: PathBuf,
    pub(crate) procs: Vec<Child>,
    pub(crate) cluster: Option<LocalCluster>,
    pub(crate) gluster: Option<PathBuf>,
}

impl Drop for Target {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        for p in &mut self.procs {
            // A child started as its process group's leader (juicefs: its supervisor forks the mount process) is
            // stopped with its whole group; for any other child there is no such group and this does nothing.
            if let Ok(pid) = i32::try_from(p.id()) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
            let _ = p.kill();
            let _ = p.wait();
        }
        if self.gluster.is_some() {
            let _ = gluster(&["volume", "stop", GLUSTER_VOLUME, "force"]);
            let _ = gluster(&["volume", "delete", GLUSTER_VOLUME]);
            let _ = Command::new("pkill").arg("-x").arg("glusterd").status();
            let _ = Command::new("pkill").arg("-x").arg("glusterfsd").status();
        }
        // The local cluster is stopped by its own drop (kill on drop).
        drop(self.cluster.take());
    }
}

const GLUSTER_VOLUME: &str = "weftbench";
const GLUSTER_HOST: &str = "127.0.0.2";

fn is_mounted(dir: &Path) -> bool {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mounts").unwrap_or_default().lines().any(|l| l.split(' ').nth(1) == Some(&dir))
}

/// Polls until `dir` is a mount point (a freshly started daemon mounts asynchronously).
pub(crate) fn wait_mounted(dir: &Path, what: &str) -> Result<()> {
    for _ in 0..600 {
        if is_mounted(dir) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{what} did not mount {} within 30 s", dir.display())
}

pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn gluster(args: &[&str]) -> Result<String> {
    run(Command::new("gluster").arg("--mode=script").args(args), &format!("gluster {}", args.join(" ")))
}

/// Whether the shell finds `tool`.
pub(crate) fn on_path(tool: &str) -> Result<bool> {
    Ok(Command::new("sh").arg("-c").arg(format!("command -v {tool}")).stdout(Stdio::null()).status()?.success())
}

pub(crate) fn need(tool: &str) -> Result<()> {
    if on_path(tool)? {
        Ok(())
    } else {
        bail!(
            "{tool} is not installed: run `make bench-deps` (Debian packages fio, libfuse3-dev, gcc, glusterfs-server, redis-server, …)"
        )
    }
}

/// A Weft cluster of `servers` data servers under `base`, FUSE-mounted with `--fabric fabric`.
pub(crate) async fn start_weft(base: &Path, servers: u32, fabric: FabricChoice) -> Result<Target> {
    let cluster = launch_weft(&base.join("weft"), servers).await?;
    let mut t = mount_weft(&cluster.cluster_file(), &base.join("weft-mnt"), fabric, &[])?;
    t.cluster = Some(cluster);
    Ok(t)
}

/// A Weft cluster of `servers` data servers in `dir`, logging warnings only.
async fn launch_weft(dir: &Path, servers: u32) -> Result<LocalCluster> {
    let mut opts = LaunchOptions::new(crate::weft_exe()?, dir, servers);
    opts.log_filter = "warn".into();
    Ok(LocalCluster::start(opts).await?)
}

/// [`start_weft`] with the root directory set to `ec 4+2` at the default 1 MiB stripe unit (as `weft setstripe
/// --ec 4+2 /`), so every file the jobs create is erasure-coded: system `weft-ec4+2` (issue 32: a FUSE writer onto
/// an ec directory beside a plain one). Needs at least 6 data servers.
pub(crate) async fn start_weft_ec(base: &Path, servers: u32, fabric: FabricChoice) -> Result<Target> {
    if servers < 6 {
        bail!("weft-ec4+2 needs --servers 6 or more (k + m distinct servers)");
    }
    let cluster = launch_weft(&base.join("weft-ec"), servers).await?;
    let client = weft_client::Client::connect(&cluster.cluster_config()).await?;
    let ec = weft_proto::DataRedundancy::Ec { k: 4, m: 2 };
    client.set_layout_with(weft_proto::ROOT_INO, 1 << 20, 0, ec).await.context("setting the root to ec 4+2")?;
    let mut t = mount_weft(&cluster.cluster_file(), &base.join("weft-ec-mnt"), fabric, &[])?;
    t.system = "weft-ec4+2";
    t.cluster = Some(cluster);
    Ok(t)
}

/// [`start_weft`] with the mount's metadata leases off (`--lease-timeout-ms 0`): the attribute and entry timeouts
/// alone, as before leases (issue 33).
pub(crate) async fn start_weft_no_leases(base: &Path, servers: u32, fabric: FabricChoice) -> Result<Target> {
    let cluster = launch_weft(&base.join("weft-nl"), servers).await?;
    let mut t = mount_weft(&cluster.cluster_file(), &base.join("weft-nl-mnt"), fabric, &["--lease-timeout-ms", "0"])?;
    t.system = "weft-no-leases";
    t.cluster = Some(cluster);
    Ok(t)
}

/// `weft mount` of the cluster `cluster_file` names on `mnt` (made if missing), with `extra` mount arguments
/// (e.g. `--attr-timeout-ms 0`); the cluster itself is the caller's.
pub(crate) fn mount_weft(cluster_file: &Path, mnt: &Path, fabric: FabricChoice, extra: &[&str]) -> Result<Target> {
    std::fs::create_dir_all(mnt)?;
    let child = Command::new(crate::weft_exe()?)
        .arg("mount")
        .arg("--cluster")
        .arg(cluster_file)
        .arg("--fabric")
        .arg(fabric.name())
        .args(extra)
        .arg(mnt)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .context("starting weft mount")?;
    let t = Target { system: "weft", mnt: mnt.to_path_buf(), procs: vec![child], cluster: None, gluster: None };
    wait_mounted(&t.mnt, "weft mount")?;
    Ok(t)
}

/// Builds libfuse's passthrough_ll example from the source Debian's libfuse3-dev ships.
fn build_passthrough(base: &Path) -> Result<PathBuf> {
    need("gcc")?;
    let ex = Path::new("/usr/share/doc/libfuse3-dev/examples");
    let build = base.join("passthrough-build");
    std::fs::create_dir_all(&build)?;
    for f in ["passthrough_ll.c", "passthrough_helpers.h"] {
        let plain = ex.join(f);
        let gz = ex.join(format!("{f}.gz"));
        if plain.exists() {
            std::fs::copy(&plain, build.join(f))?;
        } else if gz.exists() {
            let text = run(Command::new("zcat").arg(&gz), "zcat")?;
            std::fs::write(build.join(f), text)?;
        } else {
            bail!("{} not found: install libfuse3-dev (`make bench-deps`)", plain.display());
        }
    }
    let flags = run(Command::new("pkg-config").args(["--cflags", "--libs", "fuse3"]), "pkg-config fuse3")?;
    let bin = build.join("passthrough_ll");
    run(
        Command::new("gcc")
            .arg("-O2")
            .arg("-o")
            .arg(&bin)
            .arg(build.join("passthrough_ll.c"))
            .args(flags.split_whitespace()),
        "compiling passthrough_ll",
    )?;
    Ok(bin)
}

pub(crate) fn start_passthrough(base: &Path) -> Result<Target> {
    let bin = build_passthrough(base)?;
    let src = base.join("passthrough-src");
    let mnt = base.join("passthrough-mnt");
    std::fs::create_dir_all(&src)?;
    std::fs::create_dir_all(&mnt)?;
    let child = Command::new(&bin)
        .arg("-f")
        .arg("-o")
        .arg(format!("source={},allow_other,default_permissions", src.display()))
        .arg(&mnt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting passthrough_ll")?;
    let t = Target { system: "passthrough_ll", mnt, procs: vec![child], cluster: None, gluster: None };
    wait_mounted(&t.mnt, "passthrough_ll")?;
    Ok(t)
}

pub(crate) fn start_gluster(base: &Path) -> Result<Target> {
    start_gluster_with(base, None)
}

/// [`start_gluster`], the FUSE mount given `-o mount_options` (e.g. `attribute-timeout=0,entry-timeout=0`).
pub(crate) fn start_gluster_with(base: &Path, mount_options: Option<&str>) -> Result<Target> {
    need("glusterd")?;
    let mnt = base.join("gluster-mnt");
    std::fs::create_dir_all(&mnt)?;
    let bricks = [base.join("gluster-b1"), base.join("gluster-b2")];
    for b in &bricks {
        std::fs::create_dir_all(b)?;
    }
    let mut t = Target { system: "glusterfs", mnt, procs: vec![], cluster: None, gluster: Some(base.to_path_buf()) };
    if gluster(&["volume", "list"]).is_err() {
        run(&mut Command::new("glusterd"), "glusterd")?;
    }
    // glusterd answers the CLI a moment after it forks.
    let mut ready = false;
    for _ in 0..100 {
        if gluster(&["volume", "list"]).is_ok() {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !ready {
        bail!("glusterd did not answer");
    }
    let _ = gluster(&["volume", "stop", GLUSTER_VOLUME, "force"]);
    let _ = gluster(&["volume", "delete", GLUSTER_VOLUME]);
    // glusterd refuses 127.0.0.1 and localhost as brick hosts; 127.0.0.2 is loopback too.
    let b: Vec<String> = bricks.iter().map(|b| format!("{GLUSTER_HOST}:{}", b.display())).collect();
    gluster(&["volume", "create", GLUSTER_VOLUME, "transport", "tcp", &b[0], &b[1], "force"])?;
    gluster(&["volume", "start", GLUSTER_VOLUME])?;
    run(
        Command::new("mount")
            .args(["-t", "glusterfs"])
            .args(mount_options.map(|o| ["-o", o]).into_iter().flatten())
            .arg(format!("{GLUSTER_HOST}:/{GLUSTER_VOLUME}"))
            .arg(&t.mnt),
        "mount -t glusterfs",
    )?;
    wait_mounted(&t.mnt, "glusterfs")?;
    t.gluster = Some(base.to_path_buf());
    Ok(t)
}

/// What one fio job did, of its reads or its writes.
pub(crate) struct FioOut {
    pub(crate) mib_per_s: f64,
    pub(crate) iops: f64,
    pub(crate) bytes: f64,
    pub(crate) ios: f64,
}

/// One fio job on `dir`.
pub(crate) fn fio(dir: &Path, args: &str, write: bool) -> Result<FioOut> {
    let out = run(
        Command::new("sh").arg("-c").arg(format!(
            "fio --directory={} --fallocate=none --output-format=json --group_reporting {args}",
            dir.display()
        )),
        &format!("fio {args}"),
    )?;
    let v: Value = serde_json::from_str(&out).context("fio's JSON")?;
    let side = if write { "write" } else { "read" };
    let job = v.pointer("/jobs/0").context("fio reported no job")?;
    if job.get("error").and_then(Value::as_i64).unwrap_or(0) != 0 {
        bail!("fio {args}: job error {}", job["error"]);
    }
    let get = |k: &str| job.pointer(&format!("/{side}/{k}")).and_then(Value::as_f64).unwrap_or(0.0);
    Ok(FioOut {
        mib_per_s: get("bw_bytes") / (1 << 20) as f64,
        iops: get("iops"),
        bytes: get("io_bytes"),
        ios: get("total_ios"),
    })
}

/// One metadata phase: (ops/s, CPU seconds, operations).
pub(crate) type MetaFigure = (f64, f64, f64);

/// Passes of `ls -l` in a listing figure: the first may fill the client's caches, the others use them.
const LISTINGS: u32 = 3;

/// Creates `files` empty files with `threads` threads, then stats them all, then lists the directory with a stat
/// of every entry (`ls -l`) [`LISTINGS`] times on one thread; returns (ops/s, CPU seconds, operations) of each
/// (a listing's operations are its entries).
pub(crate) fn meta_loop(dir: &Path, files: u32, threads: u32) -> Result<(MetaFigure, MetaFigure, MetaFigure)> {
    let d = dir.join(format!("meta-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    let per = files.div_ceil(threads.max(1));
    let phase = |f: &(dyn Fn(PathBuf) -> std::io::Result<()> + Sync)| -> Result<MetaFigure> {
        let (t, c) = (Instant::now(), ceilings::cpu_seconds());
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|th| {
                    let d = &d;
                    s.spawn(move || -> std::io::Result<()> {
                        for i in 0..per {
                            f(d.join(format!("t{th}-{i}")))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| h.join().expect("meta thread"))
        })?;
        let ops = f64::from(per * threads);
        Ok((ops / t.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c, ops))
    };
    let creates = phase(&|p| std::fs::File::create(p).map(drop))?;
    let stats = phase(&|p| std::fs::metadata(p).map(drop))?;
    let (t, c) = (Instant::now(), ceilings::cpu_seconds());
    let mut entries = 0u64;
    for _ in 0..LISTINGS {
        for e in std::fs::read_dir(&d)? {
            std::fs::symlink_metadata(e?.path())?;
            entries += 1;
        }
    }
    let listed = (entries as f64 / t.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c, entries as f64);
    std::fs::remove_dir_all(&d)?;
    Ok((creates, stats, listed))
}

pub(crate) struct Figure {
    pub(crate) system: &'static str,
    /// The fabric of the system's client: what Weft's client used (or, for the FUSE mount, was told to use);
    /// `tcp` for the peers.
    pub(crate) fabric: String,
    /// One of the contract's ops (write, read, create, stat).
    pub(crate) op: &'static str,
    /// `sequential` or `random` for data ops.
    pub(crate) pattern: Option<&'static str>,
    pub(crate) record_bytes: Option<u64>,
    pub(crate) unit: &'static str,
    pub(crate) samples: Vec<f64>,
    /// Client CPU per run (fio and the metadata loop: this process and its reaped children), per GiB for
    /// `mib_per_s` figures, in µs per operation for the others.
    pub(crate) cpu_s: Vec<f64>,
}

/// The figures measured per system: (op, pattern, record bytes, unit).
pub(crate) type FigureSpec = (&'static str, Option<&'static str>, Option<u64>, &'static str);
pub(crate) const FIGURES: [FigureSpec; 7] = [
    ("write", Some("sequential"), Some(1 << 20), "mib_per_s"),
    ("read", Some("sequential"), Some(1 << 20), "mib_per_s"),
    ("read", Some("random"), Some(4096), "ops_per_s"),
    ("write", Some("random"), Some(4096), "ops_per_s"),
    ("create", None, None, "ops_per_s"),
    ("stat", None, None, "ops_per_s"),
    // `ls -l` of the create phase's directory: entries listed and stat'ed per second.
    ("readdir", Some("ls-l"), None, "ops_per_s"),
];

/// Short name of a figure for tables: `write`, `read`, `randread`, `randwrite`, `create`, `stat`.
pub(crate) fn label(op: &str, pattern: Option<&str>) -> String {
    match pattern {
        Some("random") => format!("rand{op}"),
        Some("ls-l") => "ls -l".to_string(),
        _ => op.to_string(),
    }
}

pub(crate) fn measure(t: &Target, a: &MountArgs, loads: &mut Loads) -> Result<Vec<Figure>> {
    let size = &a.size;
    let mut figs: Vec<Figure> = FIGURES
        .iter()
        .map(|&(op, pattern, record_bytes, unit)| Figure {
            system: t.system,
            fabric: if t.system.starts_with("weft") { a.fabric.name() } else { "tcp" }.to_string(),
            op,
            pattern,
            record_bytes,
            unit,
            samples: vec![],
            cpu_s: vec![],
        })
        .collect();
    let rand = format!(
        "--bs=4k --size={} --numjobs={} --time_based --runtime={} --ioengine=psync",
        a.random_size, a.random_jobs, a.random_seconds
    );
    // Warm-up: lay out the files the read jobs use, and bring up sessions and caches.
    fio(&t.mnt, &format!("--name=seq --rw=write --bs=1M --size={size}"), true)?;
    fio(&t.mnt, &format!("--name=rand --rw=randwrite {rand} --runtime=1"), true)?;
    for run in 0..a.runs {
        eprintln!("  {}: run {} of {}", t.system, run + 1, a.runs);
        loads.start();
        let cpu = || ceilings::cpu_seconds() + ceilings::children_cpu_seconds();
        let mut c0 = cpu();
        let mut v = Vec::new();
        // (figure, client CPU seconds, work: GiB moved or operations done)
        let mut step = |o: FioOut, seq: bool| {
            let c1 = cpu();
            let gib = o.bytes / (1u64 << 30) as f64;
            v.push(if seq { (o.mib_per_s, c1 - c0, gib) } else { (o.iops, c1 - c0, o.ios) });
            c0 = c1;
        };
        step(fio(&t.mnt, &format!("--name=seq --rw=write --bs=1M --size={size} --end_fsync=1"), true)?, true);
        step(fio(&t.mnt, &format!("--name=seq --rw=read --bs=1M --size={size}"), false)?, true);
        step(fio(&t.mnt, &format!("--name=rand --rw=randread {rand}"), false)?, false);
        step(fio(&t.mnt, &format!("--name=rand --rw=randwrite {rand}"), true)?, false);
        let (c, s, l) = meta_loop(&t.mnt, a.files, a.threads)?;
        v.extend([c, s, l]);
        loads.end();
        for (f, (x, c, work)) in figs.iter_mut().zip(v) {
            f.samples.push(x);
            // CPU per GiB (data) or per operation in µs (random I/O, metadata).
            f.cpu_s.push(if f.unit == "mib_per_s" { c / work.max(1e-12) } else { c * 1e6 / work.max(1.0) });
        }
    }
    Ok(figs)
}

pub async fn run_bench(a: MountArgs) -> Result<()> {
    need("fio")?;
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let systems: Vec<String> = a.systems.split(',').map(|s| s.trim().to_string()).collect();
    // A given --dir is kept; only the work directory made inside it is removed at the end.
    let base =
        a.dir.clone().unwrap_or_else(std::env::temp_dir).join(format!("weft-bench-mount-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    let doc = Document::start("mount");
    let mut figs = Vec::new();
    let pb = crate::common::progress(systems.len() as u64, "mount");
    for sys in &systems {
        eprintln!("setting up {sys} under {}", base.display());
        let target = match sys.as_str() {
            "weft" => start_weft(&base, a.servers, a.fabric).await?,
            "weft-ec4+2" => start_weft_ec(&base, a.servers, a.fabric).await?,
            "weft-no-leases" => start_weft_no_leases(&base, a.servers, a.fabric).await?,
            "passthrough_ll" => start_passthrough(&base)?,
            "glusterfs" => start_gluster(&base)?,
            "juicefs" => crate::juicefs::start_on_redis(&base, "always")?,
            "juicefs-everysec" => crate::juicefs::start_on_redis(&base, "everysec")?,
            other => bail!(
                "unknown system {other:?} (weft, weft-ec4+2, weft-no-leases, passthrough_ll, glusterfs, juicefs, \
                 juicefs-everysec)"
            ),
        };
        let a2 = a.clone();
        let (target, result) = tokio::task::spawn_blocking(move || {
            let mut loads = Loads::default();
            let r = measure(&target, &a2, &mut loads);
            (target, r.map(|f| (f, loads)))
        })
        .await?;
        drop(target);
        let (f, loads) = result?;
        figs.extend(f.into_iter().map(|f| (f, loads.clone())));
        pb.inc(1);
    }
    pb.finish_and_clear();
    let _ = std::fs::remove_dir_all(&base);

    let median = |system: &str, op: &str, pattern: Option<&str>| {
        figs.iter()
            .map(|(f, _)| f)
            .find(|f| f.system == system && f.op == op && f.pattern == pattern)
            .and_then(|f| summarize(&f.samples))
            .map(|s| s.median)
    };
    let mut results = Vec::new();
    for (f, loads) in &figs {
        let s = summarize(&f.samples).expect("runs >= 1");
        let mut r = json!({
            "system": f.system,
            "fabric": f.fabric,
            "servers": if f.system.starts_with("weft") { json!(a.servers) } else if f.system == "glusterfs" { json!(2) } else { json!(1) },
            "clients": 1,
            "op": f.op,
            "pattern": f.pattern,
            "record_bytes": f.record_bytes,
            f.unit: round1(s.median),
            "runs": s.runs,
            "min": round1(s.min),
            "max": round1(s.max),
        });
        for peer in ["passthrough_ll", "glusterfs", "juicefs", "juicefs-everysec"] {
            if let Some(p) = median(peer, f.op, f.pattern).filter(|p| *p > 0.0) {
                r[format!("ratio_to_{peer}")] = json!(round3(s.median / p));
            }
        }
        add_cpu(&mut r, f);
        loads.annotate(&mut r);
        results.push(r);
    }
    let config = json!({
        "seq_size": a.size,
        "random_seconds": a.random_seconds,
        "random_jobs": a.random_jobs,
        "random_size": a.random_size,
        "files": a.files,
        "threads": a.threads,
        "runs": a.runs,
    });
    let doc = doc.finish(config, json!({}), results);
    crate::common::emit(&doc, &table(&doc), a.json.as_deref(), chart)
}

/// The client's CPU per GiB (data figures) or per operation (metadata figures), median over the runs. fio's CPU
/// is its own (a reaped child); the FUSE daemon's or the servers' is not included.
pub(crate) fn add_cpu(r: &mut Value, f: &Figure) {
    if let Some(s) = summarize(&f.cpu_s) {
        let key = if f.unit == "mib_per_s" { "client_cpu_s_per_gib" } else { "client_cpu_us_per_op" };
        r[key] = json!(round3(s.median));
    }
}

fn headline(r: &Value) -> f64 {
    r.get("mib_per_s").or_else(|| r.get("ops_per_s")).and_then(Value::as_f64).unwrap_or(0.0)
}

/// Systems shown beside Weft when a run measured them, with their column labels.
const EXTRA_COLUMNS: [(&str, &str); 3] = [
    ("weft-no-leases", "weft, no leases"),
    ("juicefs", "JuiceFS (Redis always)"),
    ("juicefs-everysec", "JuiceFS (Redis everysec)"),
];

/// A Markdown table: one row per op, one column per system, and Weft's ratios.
pub fn table(doc: &Value) -> String {
    let results = doc["results"].as_array().cloned().unwrap_or_default();
    // The ec column only when the run measured it (`--systems …,weft-ec4+2`).
    let ec = results.iter().any(|r| r["system"] == "weft-ec4+2");
    // Optional columns, each with Weft's ratio to it, when the run measured that system.
    let extra: Vec<(&str, &str)> =
        EXTRA_COLUMNS.iter().copied().filter(|(sys, _)| results.iter().any(|r| r["system"] == *sys)).collect();
    let mut s = String::from("| op | unit | weft |");
    s.push_str(if ec { " weft ec 4+2 | ec ÷ weft |" } else { "" });
    for (_, label) in &extra {
        s.push_str(&format!(" {label} | weft ÷ {label} |"));
    }
    s.push_str(" passthrough_ll | glusterfs | weft ÷ passthrough_ll | weft ÷ glusterfs |\n|---|---|---:|");
    s.push_str(if ec { "---:|---:|" } else { "" });
    s.push_str(&"---:|---:|".repeat(extra.len()));
    s.push_str("---:|---:|---:|---:|\n");
    for (op, pattern, _, _) in FIGURES {
        let get = |sys: &str| {
            results.iter().find(|r| r["system"] == sys && r["op"] == op && r["pattern"].as_str() == pattern)
        };
        let op = label(op, pattern);
        let Some(w) = get("weft").or_else(|| get("passthrough_ll")).or_else(|| get("glusterfs")) else { continue };
        let unit = if w.get("mib_per_s").is_some() { "MiB/s" } else { "ops/s" };
        let cell = |sys: &str| get(sys).map(|r| format!("{:.0}", headline(r))).unwrap_or("-".into());
        let ratio = |peer: &str| {
            get("weft")
                .and_then(|r| r.get(format!("ratio_to_{peer}")))
                .and_then(Value::as_f64)
                .map(|x| format!("{x:.2}"))
                .unwrap_or("-".into())
        };
        let ec_cells = match (get("weft-ec4+2"), get("weft")) {
            (Some(e), Some(w)) if headline(w) > 0.0 => {
                format!(" {:.0} | {:.2} |", headline(e), headline(e) / headline(w))
            }
            (Some(e), _) => format!(" {:.0} | - |", headline(e)),
            _ => " - | - |".to_string(),
        };
        let extra_cells: String = extra
            .iter()
            .map(|(sys, _)| match (get(sys), get("weft")) {
                (Some(n), Some(w)) if headline(n) > 0.0 => {
                    format!(" {:.0} | {:.2} |", headline(n), headline(w) / headline(n))
                }
                (Some(n), _) => format!(" {:.0} | - |", headline(n)),
                _ => " - | - |".to_string(),
            })
            .collect();
        s.push_str(&format!(
            "| {op} | {unit} | {} |{}{} {} | {} | {} | {} |\n",
            cell("weft"),
            if ec { ec_cells.as_str() } else { "" },
            extra_cells,
            cell("passthrough_ll"),
            cell("glusterfs"),
            ratio("passthrough_ll"),
            ratio("glusterfs")
        ));
    }
    s
}

/// Weft's ratio to each peer per op, as bars (1.0 = parity).
pub fn chart(doc: &Value) -> String {
    let results = doc["results"].as_array().cloned().unwrap_or_default();
    let weft: Vec<&Value> = results.iter().filter(|r| r["system"] == "weft").collect();
    let (w, h, left, top) = (560.0, 320.0, 60.0, 30.0);
    let max = weft
        .iter()
        .flat_map(|r| ["ratio_to_passthrough_ll", "ratio_to_glusterfs"].map(|k| r.get(k).and_then(Value::as_f64)))
        .flatten()
        .fold(1.0f64, f64::max)
        * 1.1;
    let plot_h = h - top - 50.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"DejaVu Sans, sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"18\" font-size=\"13\">weft bench mount: Weft ÷ passthrough_ll (blue), ÷ GlusterFS (orange)</text>\n"
    );
    let y1 = top + plot_h - plot_h / max;
    s.push_str(&format!("<line x1=\"{left}\" x2=\"{}\" y1=\"{y1:.1}\" y2=\"{y1:.1}\" stroke=\"#999\" stroke-dasharray=\"4\"/><text x=\"5\" y=\"{:.1}\">1.0</text>\n", w - 10.0, y1 + 4.0));
    let slot = (w - left - 10.0) / weft.len().max(1) as f64;
    for (i, r) in weft.iter().enumerate() {
        let x = left + i as f64 * slot;
        for (j, (k, color)) in
            [("ratio_to_passthrough_ll", "#4477aa"), ("ratio_to_glusterfs", "#ee7733")].iter().enumerate()
        {
            if let Some(v) = r.get(*k).and_then(Value::as_f64) {
                let bh = plot_h * v / max;
                s.push_str(&format!(
                    "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\">{v:.2}</text>\n",
                    x + 8.0 + j as f64 * slot * 0.4,
                    top + plot_h - bh,
                    slot * 0.35,
                    x + 8.0 + j as f64 * slot * 0.4,
                    top + plot_h - bh - 3.0
                ));
            }
        }
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            x + 8.0,
            top + plot_h + 16.0,
            label(r["op"].as_str().unwrap_or(""), r["pattern"].as_str())
        ));
    }
    s.push_str("</svg>\n");
    s
}
