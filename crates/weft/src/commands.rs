//! The user commands: each opens a client on the cluster named by `--cluster` / `WEFT_CLUSTER` and does one thing.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_client::{Client, ClientError, ClusterConfig, OpenMode};
use weft_launch::{LaunchOptions, LocalCluster};
use weft_proto::{Attr, FileKind, ServerState};

/// Bytes moved per client call by put/get/cat: large enough to keep every data server of a file busy.
const COPY_CHUNK_BYTES: usize = 16 << 20;

/// `--fabric`, when given: overrides the cluster file's and WEFT_FABRIC's choice for every client of this process.
pub static FABRIC: std::sync::OnceLock<weft_client::FabricChoice> = std::sync::OnceLock::new();

pub(crate) async fn connect(spec: &str) -> Result<Client> {
    let mut cfg = ClusterConfig::from_spec(spec).map_err(anyhow::Error::msg)?;
    if let Some(f) = FABRIC.get() {
        cfg.client.fabric = *f;
    }
    Client::connect(&cfg).await.with_context(|| format!("connecting to the metadata service at {}", cfg.mds))
}

/// `--log-format json`: children this process starts log as JSON too.
pub static LOG_JSON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

fn log_json() -> bool {
    LOG_JSON.get().copied().unwrap_or(false)
}

/// `weft up --cache N --cache-mib M`: the cache bank's memcached daemons.
pub struct CacheArgs {
    pub daemons: u32,
    pub mib: u32,
}

/// `weft up --nfs PORT --ds-nfs`: the NFS gateway's port, and whether every data server also serves pNFS.
pub struct NfsArgs {
    pub port: Option<u16>,
    pub ds_nfs: bool,
}

/// `weft up --meta redb|postgres --meta-services N --rebuild-after-ms MS`: where the namespace lives, how many
/// services serve it, and the MDS's `rebuild_after_ms`.
pub struct MetaArgs {
    pub postgres: bool,
    pub rebuild_after_ms: Option<u64>,
    pub services: u32,
}

// One argument per group of `weft up` flags, straight from clap.
#[allow(clippy::too_many_arguments)]
pub async fn up(
    data_dir: PathBuf,
    servers: u32,
    mount_dir: Option<PathBuf>,
    auth: weft_rpc::AuthMode,
    mount_args: crate::MountArgs,
    tls: bool,
    cache: CacheArgs,
    metrics: bool,
    nfs: NfsArgs,
    meta: MetaArgs,
) -> Result<()> {
    let nfs_port = nfs.port;
    if servers == 0 {
        bail!("a cluster needs at least one data server");
    }
    std::fs::create_dir_all(&data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    let data_dir = data_dir.canonicalize()?;
    let exe = std::env::current_exe().context("finding the weft binary")?;
    let mut opts = LaunchOptions::new(exe, &data_dir, servers);
    opts.auth = auth;
    opts.tls |= tls;
    opts.cache = cache.daemons;
    opts.cache_mib = cache.mib;
    opts.metrics = metrics;
    opts.rebuild_after_ms = meta.rebuild_after_ms;
    opts.postgres |= meta.postgres;
    if meta.services == 0 || (meta.services > 1 && !opts.postgres) {
        bail!("--meta-services {}: at least 1, and more than 1 only with --meta postgres", meta.services);
    }
    opts.meta_services = meta.services;
    opts.ds_nfs = nfs.ds_nfs;
    // The servers log as this process was asked to (RUST_LOG=debug weft up: every server at debug).
    if let Ok(filter) = std::env::var("RUST_LOG") {
        opts.log_filter = filter;
    }
    if log_json() {
        opts.env.push(("WEFT_LOG_FORMAT".into(), "json".into()));
    }
    let mut mount_args = mount_args;
    if metrics && mount_dir.is_some() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        mount_args.metrics_listen = Some(format!("127.0.0.1:{port}"));
    }
    let mut cluster = LocalCluster::start(opts).await?;
    let cfg = cluster.cluster_file();
    let services = cluster.mds_addrs();
    println!(
        "Weft cluster up: metadata service{} {}, {} data servers ({})",
        if services.len() > 1 { "s" } else { "" },
        services.join(", "),
        servers,
        cluster.data_addrs().join(", ")
    );
    if cluster.tls() {
        println!("tcp runs under TLS: CA and server certificate in {}", data_dir.join("tls").display());
    }
    if cache.daemons > 0 {
        println!(
            "Cache bank: {} memcached daemons of {} MiB on loopback ({})",
            cache.daemons,
            cache.mib,
            cluster.cache_addrs().join(", ")
        );
    }
    if let Some(url) = cluster.postgres_url() {
        println!(
            "Namespace in PostgreSQL: a server of this cluster's own in {} (Unix socket only), db = \"{url}\"",
            data_dir.join("postgres").display()
        );
    }
    println!("Data, logs and client config under {} (client config: {})", data_dir.display(), cfg.display());
    if nfs.ds_nfs {
        let devices =
            cluster.pnfs_devices().await.map_err(|e| anyhow::anyhow!("listing the pNFS data servers: {e}"))?;
        let shown: Vec<String> = devices
            .iter()
            .map(|d| {
                let rdma = d.rdma_addrs.iter().map(|a| format!("rdma:{a}"));
                format!(
                    "{}: {}",
                    d.server,
                    d.addrs.iter().map(ToString::to_string).chain(rdma).collect::<Vec<_>>().join(" ")
                )
            })
            .collect();
        println!("pNFS data servers (NFSv4.1): {}", shown.join(", "));
    }
    if metrics {
        let mut list = cluster.metrics_addrs();
        if let Some(at) = &mount_args.metrics_listen {
            list.push(("mount".into(), at.clone()));
            let text: String = list.iter().map(|(role, addr)| format!("{role} {addr}\n")).collect();
            std::fs::write(cluster.metrics_file(), text).context("writing metrics.txt")?;
        }
        let shown: Vec<String> = list.iter().map(|(role, addr)| format!("{role} http://{addr}/metrics")).collect();
        println!("Metrics (Prometheus): {}; live rates: weft top --from {}", shown.join(", "), data_dir.display());
    }
    let mounted = match &mount_dir {
        Some(dir) => {
            let m = start_mount(&cfg.to_string_lossy(), dir, &mount_args).await;
            match m {
                Ok(m) => {
                    println!("Mounted on {} (FUSE): use it with any tool, e.g. ls -l {}", dir.display(), dir.display());
                    Some(m)
                }
                Err(e) => {
                    cluster.stop().await;
                    return Err(e);
                }
            }
        }
        None => None,
    };
    println!("Try: export WEFT_CLUSTER={}; weft put /etc/hosts /hosts; weft ls -l /; weft status", cfg.display());
    if auth == weft_rpc::AuthMode::Key {
        println!(
            "Per-client keys: weft key add NAME --keyring {} (the servers re-read it when it changes)",
            cluster.clients_keyring().display()
        );
    }
    let mut gateway = match nfs_port {
        Some(port) => {
            // A state directory under the cluster's, so a restarted gateway adopts its predecessor's locks.
            let state_dir = cluster.dir().join("nfs-state").display().to_string();
            let o = weft_launch::NfsOptions {
                listen: format!("127.0.0.1:{port}"),
                extra_args: vec!["--state-dir".into(), state_dir],
                ..Default::default()
            };
            match cluster.start_nfs(&o).await {
                Ok(g) => {
                    println!("NFS gateway on {} (log: {}); mount with:", g.addr(), g.log().display());
                    println!("  {}", crate::nfs::mount_hint(g.port()));
                    Some(g)
                }
                Err(e) => {
                    cluster.stop().await;
                    return Err(e.into());
                }
            }
        }
        None => None,
    };
    println!("Ctrl-C stops the cluster.");
    wait_for_stop(mounted.as_ref()).await?;
    if let Some(g) = gateway.as_mut() {
        println!("Stopping the NFS gateway...");
        g.stop().await;
    }
    if let (Some(m), Some(dir)) = (mounted, &mount_dir) {
        println!("Unmounting {}...", dir.display());
        unmount(m, dir).await;
    }
    println!("Stopping the cluster...");
    cluster.stop().await;
    println!("Stopped.");
    Ok(())
}

/// `weft key add`: a new key file for client `name` at `out` (0600, never overwritten), added to `keyring`
/// (created 0600 if missing). The key file is written first, so a failure leaves the keyring unchanged.
pub fn key_add(name: &str, policy: weft_rpc::KeyPolicy, keyring: &Path, out: &Path) -> Result<()> {
    weft_rpc::keyring::check_client_name(name)?;
    let mut keys = weft_rpc::ClientKeys::load_or_empty(keyring)?;
    if keys.get(name).is_some() {
        bail!("keyring {} already has a key named {name:?}", keyring.display());
    }
    let key = weft_rpc::Key::create_file(out)?;
    let added = keys.add(name, key, policy, keyring).and_then(|()| keys.save(keyring));
    if let Err(e) = added {
        let _ = std::fs::remove_file(out);
        return Err(e.into());
    }
    let acts_as = match policy {
        weft_rpc::KeyPolicy::Fixed { uid, gid } => format!("always as uid {uid}, gid {gid}"),
        weft_rpc::KeyPolicy::SquashRoot => "as the users it asserts, root squashed to nobody (65534)".into(),
        _ => "as any user it asserts, root included (a trusted host)".into(),
    };
    println!("added client {name:?} to {}: it acts {acts_as}", keyring.display());
    println!(
        "wrote its key to {} (mode 0600); in the client's cluster.toml: key_file = \"{}\" and key_id = \"{name}\"",
        out.display(),
        out.display()
    );
    Ok(())
}

/// `weft key list`: names and policies, never the keys.
pub fn key_list(keyring: &Path, json: bool) -> Result<()> {
    let keys = weft_rpc::ClientKeys::load(keyring)?;
    if json {
        let list: Vec<_> =
            keys.list().map(|(name, p)| serde_json::json!({"name": name, "policy": p.to_text()})).collect();
        return print_json(&serde_json::Value::Array(list));
    }
    if keys.is_empty() {
        println!("{}: no client keys", keyring.display());
    }
    for (name, policy) in keys.list() {
        println!("{name} {}", policy.to_text());
    }
    Ok(())
}

/// `weft key remove`.
pub fn key_remove(name: &str, keyring: &Path) -> Result<()> {
    let mut keys = weft_rpc::ClientKeys::load(keyring)?;
    keys.remove(name, keyring)?;
    keys.save(keyring)?;
    println!("removed client {name:?} from {}: new connections with its key are refused", keyring.display());
    Ok(())
}

/// The line `weft mount` prints on stdout once the file system is mounted (read by `--daemon` and by tests).
pub const MOUNTED_PREFIX: &str = "WEFT-MOUNTED ";

async fn start_mount(spec: &str, dir: &Path, args: &crate::MountArgs) -> Result<weft_fuse::Mounted> {
    let meta = std::fs::metadata(dir).with_context(|| format!("mount point {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("mount point {} is not a directory", dir.display());
    }
    let client = connect(spec).await?;
    let rt = tokio::runtime::Handle::current();
    let mut opts = args.options();
    if let Some(at) = &args.metrics_listen {
        let m = weft_rpc::Metrics::new("mount");
        // Logged by `listen`: stdout carries only the launcher's one line.
        m.listen(at).await.with_context(|| format!("serving metrics on {at}"))?;
        opts.metrics = Some(m);
    }
    let d = dir.to_path_buf();
    tokio::task::spawn_blocking(move || weft_fuse::mount(client, rt, &d, &opts))
        .await
        .context("mount task")?
        .with_context(|| {
            format!(
                "mounting on {} (needs /dev/fuse, and fusermount3 from Debian's fuse3 when not root)",
                dir.display()
            )
        })
}

/// Waits for Ctrl-C or SIGTERM, or for the mount (if any) to be unmounted from outside.
async fn wait_for_stop(mounted: Option<&weft_fuse::Mounted>) -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut check = tokio::time::interval(std::time::Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = term.recv() => return Ok(()),
            _ = check.tick() => {
                if mounted.is_some_and(|m| !m.is_alive()) {
                    tracing::info!("the file system was unmounted from outside");
                    return Ok(());
                }
            }
        }
    }
}

/// Unmounts; if the mount is busy, detaches it lazily so the process can still exit cleanly.
async fn unmount(m: weft_fuse::Mounted, dir: &Path) {
    let alive = m.is_alive();
    match tokio::task::spawn_blocking(move || m.unmount()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if alive => {
            tracing::warn!("unmounting {}: {e}; detaching it lazily", dir.display());
            let _ = std::process::Command::new("umount").arg("-l").arg(dir).status();
        }
        _ => {}
    }
}

pub async fn mount(spec: &str, dir: &Path, args: &crate::MountArgs) -> Result<()> {
    let m = start_mount(spec, dir, args).await?;
    tracing::info!(dir = %dir.display(), "mounted");
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{MOUNTED_PREFIX}{}", dir.display())?;
        out.flush()?;
    }
    wait_for_stop(Some(&m)).await?;
    tracing::info!(dir = %dir.display(), "unmounting");
    unmount(m, dir).await;
    Ok(())
}

/// `weft mount --daemon`: runs `weft mount` detached (own process group, output to a log file) and returns once
/// it reports the file system mounted.
pub async fn mount_daemon(spec: &str, dir: &Path, args: &crate::MountArgs, log: Option<PathBuf>) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let dir_abs = dir.canonicalize().with_context(|| format!("mount point {}", dir.display()))?;
    let log = log.unwrap_or_else(|| {
        let name = dir_abs.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "root".into());
        dir_abs.with_file_name(format!(".{name}.weft-mount.log"))
    });
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("opening the log {}", log.display()))?;
    let mut cmd = std::process::Command::new(std::env::current_exe().context("finding the weft binary")?);
    cmd.arg("mount")
        .arg("--cluster")
        .arg(spec)
        .arg(&dir_abs)
        .arg("--attr-timeout-ms")
        .arg(args.attr_timeout_ms.to_string())
        .arg("--entry-timeout-ms")
        .arg(args.entry_timeout_ms.to_string())
        .arg("--lease-timeout-ms")
        .arg(args.lease_timeout_ms.to_string())
        .arg("--threads")
        .arg(args.threads.to_string())
        .arg("--readahead-kib")
        .arg(args.readahead_kib.to_string());
    if args.allow_other {
        cmd.arg("--allow-other");
    }
    if args.direct_io {
        cmd.arg("--direct-io");
    }
    if args.writeback_cache {
        cmd.arg("--writeback-cache");
    }
    for (on, flag) in
        [(args.suid, "--suid"), (args.dev, "--dev"), (args.ro, "--ro"), (args.no_killpriv, "--no-killpriv")]
    {
        if on {
            cmd.arg(flag);
        }
    }
    if let Some(f) = FABRIC.get() {
        cmd.arg("--fabric").arg(f.name());
    }
    if let Some(at) = &args.metrics_listen {
        cmd.arg("--metrics-listen").arg(at);
    }
    if log_json() {
        cmd.arg("--log-format").arg("json");
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::from(log_file))
        .process_group(0);
    let mut child = cmd.spawn().context("starting the mount daemon")?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).map(|_| line)
    })
    .await
    .context("waiting for the mount daemon")??;
    if !line.starts_with(MOUNTED_PREFIX) {
        let _ = child.wait();
        bail!("the mount daemon failed; see {}", log.display());
    }
    println!("Mounted {} on {} (daemon pid {}, log {})", spec, dir_abs.display(), child.id(), log.display());
    Ok(())
}

fn kind_char(k: FileKind) -> char {
    match k {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::File => '-',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::CharDev => 'c',
        FileKind::BlockDev => 'b',
    }
}

/// Prints one JSON document on stdout.
pub(crate) fn print_json(v: &serde_json::Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::File => "file",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDev => "char_device",
        FileKind::BlockDev => "block_device",
    }
}

/// The fields of `ls --json` and `stat --json` (stable names; units in the names).
fn attr_json(name: &str, a: &Attr) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "ino": a.ino,
        "kind": kind_name(a.kind),
        "mode": a.mode,
        "mode_octal": format!("{:04o}", a.mode),
        "uid": a.uid,
        "gid": a.gid,
        "nlink": a.nlink,
        "size_bytes": a.size,
        "atime_ns": a.atime_ns,
        "mtime_ns": a.mtime_ns,
        "ctime_ns": a.ctime_ns,
    })
}

/// Every entry of directory `ino` with its attributes, page by page (readdirplus: one round trip a page).
async fn list_plus(c: &Client, ino: u64) -> Result<Vec<(String, Attr)>, ClientError> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let page = c.readdir_plus_page(ino, &after, weft_proto::READDIRPLUS_ENTRIES_MAX).await?;
        if let Some((last, _)) = page.entries.last() {
            after = last.clone();
        }
        let eof = page.eof || page.entries.is_empty();
        out.extend(page.entries);
        if eof {
            return Ok(out);
        }
    }
}

pub async fn ls(spec: &str, path: &str, long: bool, all: bool, json: bool) -> Result<()> {
    let c = connect(spec).await?;
    let attr = c.resolve(path).await?;
    let entries = if attr.kind != FileKind::Dir {
        vec![(path.to_string(), attr)]
    } else {
        let mut v = Vec::new();
        if all {
            v.push((".".to_string(), attr.clone()));
            let parent = c.lookup(attr.ino, "..").await.map_err(|e| e.with_path(path))?;
            v.push(("..".to_string(), parent));
        }
        v.extend(list_plus(&c, attr.ino).await?);
        v
    };
    if json {
        return print_json(&serde_json::Value::Array(entries.iter().map(|(n, a)| attr_json(n, a)).collect()));
    }
    let mut out = std::io::stdout().lock();
    for (name, a) in &entries {
        if long {
            let mtime = crate::human::iso8601_ns(a.mtime_ns);
            writeln!(
                out,
                "{}{:04o} {:>3} {:>6} {:>6} {:>12} {} {:>10} {name}",
                kind_char(a.kind),
                a.mode,
                a.nlink,
                a.uid,
                a.gid,
                a.size,
                &mtime[..19],
                a.ino,
            )?;
        } else {
            writeln!(out, "{name}")?;
        }
    }
    Ok(())
}

pub async fn stat(spec: &str, path: &str, raw: bool, json: bool) -> Result<()> {
    let c = connect(spec).await?;
    let a = c.resolve(path).await?;
    let target = if a.kind == FileKind::Symlink { Some(c.readlink(a.ino).await?) } else { None };
    let time = |ns: i64| if raw { format!("{ns} ns") } else { crate::human::iso8601_ns(ns) };
    if json {
        let mut v = attr_json(path, &a);
        v["path"] = path.into();
        for (k, ns) in [("atime", a.atime_ns), ("mtime", a.mtime_ns), ("ctime", a.ctime_ns)] {
            v[k] = crate::human::iso8601_ns(ns).into();
        }
        if let Some(t) = &target {
            v["target"] = t.as_str().into();
        }
        if let Some(l) = &a.layout {
            v["layout"] = serde_json::json!({
                "stripe_unit_bytes": l.stripe_unit,
                "stripe_count": l.stripe_count,
                "servers": l.servers,
                "redundancy": l.redundancy.to_string(),
                "generation": l.generation,
            });
        }
        return print_json(&v);
    }
    println!("  path: {path}");
    println!(" inode: {}", a.ino);
    println!("  kind: {:?}", a.kind);
    println!("  mode: {:04o}  uid: {}  gid: {}  links: {}", a.mode, a.uid, a.gid, a.nlink);
    println!("  size: {}", a.size);
    println!(" atime: {}", time(a.atime_ns));
    println!(" mtime: {}", time(a.mtime_ns));
    println!(" ctime: {}", time(a.ctime_ns));
    if let Some(t) = target {
        println!("target: {t}");
    }
    match (&a.layout, a.kind) {
        (Some(l), FileKind::File) => {
            println!(
                "layout: {}, stripe unit {} bytes, stripe count {}, data servers {:?}, generation {}",
                l.redundancy, l.stripe_unit, l.stripe_count, l.servers, l.generation
            )
        }
        (Some(l), FileKind::Dir) => {
            let count = if l.stripe_count == 0 { "all".to_string() } else { l.stripe_count.to_string() };
            println!(
                "layout policy for new files: {}, stripe unit {} bytes, stripe count {count}",
                l.redundancy, l.stripe_unit
            )
        }
        _ => {}
    }
    Ok(())
}

/// Applies `f` to `path` and, with `recursive`, to every entry below it (depth first; symlinks are handed to `f`
/// but never followed). `f` gets the entry's inode and attributes.
async fn walk_apply<F, Fut>(c: &Client, path: &str, recursive: bool, f: &F) -> Result<()>
where
    F: Fn(u64, Attr, String) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let top = c.resolve(path).await?;
    let is_dir = top.kind == FileKind::Dir;
    let ino = top.ino;
    f(ino, top, path.to_string()).await?;
    if recursive && is_dir {
        // An explicit stack, so a deep tree needs no deep recursion; it holds directories not yet listed.
        let mut dirs = vec![(ino, path.trim_end_matches('/').to_string())];
        while let Some((dir, dir_path)) = dirs.pop() {
            for (name, a) in list_plus(c, dir).await.map_err(|e| e.with_path(&dir_path))? {
                let p = format!("{dir_path}/{name}");
                let (ino, is_dir) = (a.ino, a.kind == FileKind::Dir);
                f(ino, a, p.clone()).await?;
                if is_dir {
                    dirs.push((ino, p));
                }
            }
        }
    }
    Ok(())
}

pub async fn xattr_list(spec: &str, path: &str) -> Result<()> {
    let c = connect(spec).await?;
    let a = c.resolve(path).await?;
    let mut out = std::io::stdout().lock();
    for name in c.listxattr(a.ino).await? {
        writeln!(out, "{name}")?;
    }
    Ok(())
}

pub async fn xattr_get(spec: &str, path: &str, name: &str) -> Result<()> {
    let c = connect(spec).await?;
    let a = c.resolve(path).await?;
    let v = c.getxattr(a.ino, name).await.with_context(|| format!("{path}: {name}"))?;
    std::io::stdout().lock().write_all(&v)?;
    Ok(())
}

pub async fn xattr_set(spec: &str, path: &str, name: &str, value: &[u8], flags: u32) -> Result<()> {
    let c = connect(spec).await?;
    let a = c.resolve(path).await?;
    c.setxattr(a.ino, name, value, flags).await.with_context(|| format!("{path}: {name}"))?;
    Ok(())
}

pub async fn xattr_rm(spec: &str, path: &str, name: &str) -> Result<()> {
    let c = connect(spec).await?;
    let a = c.resolve(path).await?;
    c.removexattr(a.ino, name).await.with_context(|| format!("{path}: {name}"))?;
    Ok(())
}

pub async fn chmod(spec: &str, mode: &str, path: &str, recursive: bool) -> Result<()> {
    // Checked once up front, so a bad MODE fails before anything changes.
    crate::mode::apply(mode, 0, false).map_err(anyhow::Error::msg)?;
    let c = connect(spec).await?;
    let c = &c;
    walk_apply(c, path, recursive, &|ino, a: Attr, p: String| async move {
        if a.kind == FileKind::Symlink {
            // A symlink's own mode means nothing (chmod(1) skips them too).
            return Ok(());
        }
        let new = crate::mode::apply(mode, a.mode, a.kind == FileKind::Dir).map_err(anyhow::Error::msg)?;
        if new != a.mode {
            let set = weft_proto::SetAttrs { mode: Some(new), ..Default::default() };
            c.setattr(ino, set).await.map_err(|e| e.with_path(&p))?;
        }
        Ok(())
    })
    .await
}

pub async fn chown(spec: &str, uid: Option<u32>, gid: Option<u32>, path: &str, recursive: bool) -> Result<()> {
    let c = connect(spec).await?;
    let c = &c;
    walk_apply(c, path, recursive, &|ino, _a: Attr, p: String| async move {
        let set = weft_proto::SetAttrs { uid, gid, ..Default::default() };
        c.setattr(ino, set).await.map_err(|e| e.with_path(&p))?;
        Ok(())
    })
    .await
}

pub async fn df(spec: &str, json: bool) -> Result<()> {
    let c = connect(spec).await?;
    let fs = c.statfs().await?;
    let used = fs.bytes_total.saturating_sub(fs.bytes_free);
    // As df: used / (used + available), rounded up.
    let denom = used.saturating_add(fs.bytes_free);
    let pct = if denom == 0 { 0 } else { (u128::from(used) * 100).div_ceil(u128::from(denom)) as u64 };
    if json {
        return print_json(&serde_json::json!({
            "size_bytes": fs.bytes_total,
            "used_bytes": used,
            "avail_bytes": fs.bytes_free,
            "use_percent": pct,
            "files": fs.files,
            "servers_up": fs.servers_up,
            "servers_total": fs.servers_total,
        }));
    }
    use crate::human::size;
    println!("{:<10} {:>6} {:>6} {:>6} {:>4} servers up", "Filesystem", "Size", "Used", "Avail", "Use%");
    println!(
        "{:<10} {:>6} {:>6} {:>6} {:>3}% {}/{}",
        "weft",
        size(fs.bytes_total),
        size(used),
        size(fs.bytes_free),
        pct,
        fs.servers_up,
        fs.servers_total
    );
    Ok(())
}

/// `weft du`'s walk: the total of the tree under `ino` at `path`; directories' totals are pushed to `out`
/// deepest first (as du prints them). `seen` holds hard-linked files already counted.
async fn du_tree(
    c: &Client,
    ino: u64,
    path: &str,
    seen: &mut std::collections::HashSet<u64>,
    out: &mut Vec<(String, u64)>,
) -> Result<u64> {
    let mut total = 0u64;
    for (name, a) in list_plus(c, ino).await.map_err(|e| e.with_path(path))? {
        let p = format!("{}/{name}", path.trim_end_matches('/'));
        if a.kind == FileKind::Dir {
            // Boxed: an async fn cannot recurse into itself unboxed.
            total = total.saturating_add(Box::pin(du_tree(c, a.ino, &p, seen, out)).await?);
        } else if a.nlink <= 1 || seen.insert(a.ino) {
            total = total.saturating_add(a.size);
        }
    }
    out.push((path.to_string(), total));
    Ok(total)
}

pub async fn du(spec: &str, path: &str, summarize: bool, human: bool, json: bool) -> Result<()> {
    let c = connect(spec).await?;
    let top = c.resolve(path).await?;
    let mut dirs = Vec::new();
    if top.kind == FileKind::Dir {
        du_tree(&c, top.ino, path, &mut std::collections::HashSet::new(), &mut dirs).await?;
    } else {
        dirs.push((path.to_string(), top.size));
    }
    if summarize {
        dirs.drain(..dirs.len() - 1);
    }
    if json {
        let v = dirs.iter().map(|(p, b)| serde_json::json!({"path": p, "size_bytes": b})).collect();
        return print_json(&serde_json::Value::Array(v));
    }
    let mut out = std::io::stdout().lock();
    for (p, b) in &dirs {
        let n = if human { crate::human::size(*b) } else { b.to_string() };
        writeln!(out, "{n}\t{p}")?;
    }
    Ok(())
}

pub async fn put(spec: &str, local: &Path, remote: &str) -> Result<()> {
    let c = connect(spec).await?;
    let mut src = tokio::fs::File::open(local).await.with_context(|| format!("opening {}", local.display()))?;
    let f = c.create_path(remote, 0o644, false, true).await?;
    let mut offset = 0u64;
    loop {
        let mut buf = BytesMut::zeroed(COPY_CHUNK_BYTES);
        let mut filled = 0;
        while filled < buf.len() {
            let n = src.read(&mut buf[filled..]).await.with_context(|| format!("reading {}", local.display()))?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            break;
        }
        buf.truncate(filled);
        // The error names the file, the offset and the data server (a full disk, a server down).
        f.write_at(offset, buf.freeze()).await.map_err(|e| e.with_path(remote))?;
        offset += filled as u64;
    }
    // Like fsync(2) at the end of a copy: the data servers sync every object before the size is committed, so a
    // `put` that succeeded survives a data server's crash.
    f.sync().await.map_err(|e| e.with_path(remote))?;
    f.close().await?;
    Ok(())
}

async fn copy_out(c: &Client, remote: &str, out: &mut (impl AsyncWriteExt + Unpin)) -> Result<()> {
    let f = c.open(remote, OpenMode::Read).await?;
    let mut offset = 0u64;
    while offset < f.size() {
        let buf = f.read_at(offset, BytesMut::zeroed(COPY_CHUNK_BYTES)).await.map_err(|e| e.with_path(remote))?;
        if buf.is_empty() {
            break;
        }
        out.write_all(&buf).await?;
        offset += buf.len() as u64;
    }
    out.flush().await?;
    Ok(())
}

pub async fn get(spec: &str, remote: &str, local: &Path) -> Result<()> {
    let c = connect(spec).await?;
    let mut dst = tokio::fs::File::create(local).await.with_context(|| format!("creating {}", local.display()))?;
    copy_out(&c, remote, &mut dst).await?;
    dst.sync_all().await?;
    Ok(())
}

pub async fn cat(spec: &str, path: &str) -> Result<()> {
    let c = connect(spec).await?;
    copy_out(&c, path, &mut tokio::io::stdout()).await
}

pub async fn rm(spec: &str, path: &str, recursive: bool) -> Result<()> {
    let c = connect(spec).await?;
    let (parent, name) = c.resolve_parent(path).await?;
    let attr = c.lookup(parent.ino, name).await.map_err(|e| e.with_path(path))?;
    if attr.kind == FileKind::Dir {
        if !recursive {
            bail!("{path} is a directory (use -r, or rmdir)");
        }
        remove_tree(&c, attr.ino).await?;
        c.rmdir(parent.ino, name).await.map_err(|e| e.with_path(path))?;
    } else {
        c.unlink(parent.ino, name).await.map_err(|e| e.with_path(path))?;
    }
    Ok(())
}

async fn remove_tree(c: &Client, dir: u64) -> Result<(), ClientError> {
    for e in c.readdir(dir).await? {
        if e.kind == FileKind::Dir {
            // Boxed: an async fn cannot recurse into itself unboxed.
            Box::pin(remove_tree(c, e.ino)).await?;
            c.rmdir(dir, &e.name).await?;
        } else {
            c.unlink(dir, &e.name).await?;
        }
    }
    Ok(())
}

pub async fn mkdir(spec: &str, path: &str, parents: bool) -> Result<()> {
    let c = connect(spec).await?;
    if !parents {
        let (parent, name) = c.resolve_parent(path).await?;
        c.mkdir(parent.ino, name, 0o755).await.map_err(|e| e.with_path(path))?;
        return Ok(());
    }
    let mut ino = weft_proto::ROOT_INO;
    for name in weft_client::components(path)? {
        ino = match c.mkdir(ino, name, 0o755).await {
            Ok(a) => a.ino,
            Err(e) if e.code() == Some(weft_proto::ErrorCode::Exists) => c.lookup(ino, name).await?.ino,
            Err(e) => return Err(e.with_path(path).into()),
        };
    }
    Ok(())
}

pub async fn rmdir(spec: &str, path: &str) -> Result<()> {
    let c = connect(spec).await?;
    let (parent, name) = c.resolve_parent(path).await?;
    c.rmdir(parent.ino, name).await.map_err(|e| e.with_path(path))?;
    Ok(())
}

pub async fn mv(spec: &str, src: &str, dst: &str, no_clobber: bool) -> Result<()> {
    let c = connect(spec).await?;
    let (sp, sn) = c.resolve_parent(src).await?;
    let (dp, dn) = c.resolve_parent(dst).await?;
    let flags = if no_clobber { weft_proto::msg::RENAME_NOREPLACE } else { 0 };
    c.rename(sp.ino, sn, dp.ino, dn, flags).await.map_err(|e| e.with_path(src))?;
    Ok(())
}

pub async fn ln(spec: &str, target: &str, link: &str, symbolic: bool) -> Result<()> {
    let c = connect(spec).await?;
    let (parent, name) = c.resolve_parent(link).await?;
    if symbolic {
        c.symlink(parent.ino, name, target).await.map_err(|e| e.with_path(link))?;
    } else {
        let t = c.resolve(target).await?;
        c.link(t.ino, parent.ino, name).await.map_err(|e| e.with_path(link))?;
    }
    Ok(())
}

pub async fn truncate(spec: &str, path: &str, size: u64) -> Result<()> {
    let c = connect(spec).await?;
    let f = c.open(path, OpenMode::Write).await?;
    f.truncate(size).await?;
    Ok(())
}

pub async fn setstripe(
    spec: &str,
    dir: &str,
    unit: u32,
    count: u32,
    redundancy: weft_proto::DataRedundancy,
) -> Result<()> {
    let c = connect(spec).await?;
    let d = c.resolve(dir).await?;
    c.set_layout_with(d.ino, unit, count, redundancy).await.map_err(|e| e.with_path(dir))?;
    Ok(())
}

/// `weft scrub`: verifies and repairs the files under `path`, prints what it found and a summary; fails when
/// anything could not be repaired.
pub async fn scrub(spec: &str, path: &str, opts: weft_client::scrub::ScrubOptions) -> Result<()> {
    let c = connect(spec).await?;
    let r = weft_client::scrub::scrub_path(&c, path, opts).await.map_err(|e| e.with_path(path))?;
    for f in &r.findings {
        println!("{f}");
    }
    if (r.findings.len() as u64) < r.inconsistencies {
        println!("... {} more findings not listed", r.inconsistencies - r.findings.len() as u64);
    }
    println!(
        "scrubbed {} files, {} bytes, {} chunks: {} inconsistencies, {} repaired, {} left (dry run), {} unrepairable",
        r.files, r.bytes, r.chunks, r.inconsistencies, r.repaired, r.dry_run, r.unrepairable
    );
    if r.unrepairable > 0 {
        anyhow::bail!("{} inconsistencies could not be repaired", r.unrepairable);
    }
    Ok(())
}

/// Parses `setstripe`'s `--ec K+M` / `--mirror N` (at most one of them) into a redundancy.
pub fn parse_redundancy(ec: Option<&str>, mirror: Option<u8>) -> Result<weft_proto::DataRedundancy> {
    use weft_proto::DataRedundancy;
    let r = match (ec, mirror) {
        (Some(_), Some(_)) => anyhow::bail!("--ec and --mirror exclude each other"),
        (Some(spec), None) => {
            let (k, m) = spec.split_once('+').with_context(|| format!("--ec {spec}: expected K+M, e.g. 4+2"))?;
            let k: u8 = k.trim().parse().with_context(|| format!("--ec {spec}: K is not a number"))?;
            let m: u8 = m.trim().parse().with_context(|| format!("--ec {spec}: M is not a number"))?;
            DataRedundancy::Ec { k, m }
        }
        (None, Some(n)) => DataRedundancy::Mirror { n },
        (None, None) => DataRedundancy::Plain,
    };
    r.validate().map_err(|e| anyhow::anyhow!(e))?;
    Ok(r)
}

/// How long `weft status` waits for one data server's `SpaceStatDev` before showing its last heartbeat's space.
const SPACE_TIMEOUT_MS: u64 = 3000;

pub async fn status(spec: &str, json: bool) -> Result<()> {
    use weft_proto::space::{Redundancy, count_once, usable_bytes};
    let c = connect(spec).await?;
    let servers = c.cluster_info().await?;
    let fs = c.statfs().await?;
    // An MDS from before op 135 does not answer it: everything it would say is unknown ("—").
    let member = c.member_status().await.ok();
    // Each live server's space and file system, asked of the server itself (all at once, bounded by the number of
    // servers); a server that is down or does not answer in time keeps the space of its last heartbeat and an
    // unknown file system.
    let mut asks = tokio::task::JoinSet::new();
    for (i, sv) in servers.iter().enumerate().filter(|(_, sv)| sv.state.is_up() || sv.state == ServerState::Draining) {
        let (c, id) = (c.clone(), sv.id);
        asks.spawn(async move {
            let t = std::time::Duration::from_millis(SPACE_TIMEOUT_MS);
            (i, tokio::time::timeout(t, c.server_space_dev(id)).await.ok().and_then(Result::ok))
        });
    }
    let mut fresh = vec![None; servers.len()];
    while let Some(r) = asks.join_next().await {
        if let Ok((i, d)) = r {
            fresh[i] = d;
        }
    }
    let rows: Vec<(u32, weft_proto::SpaceStat, Option<weft_proto::DeviceId>)> = servers
        .iter()
        .zip(&fresh)
        .map(|(s, f)| match f {
            Some(d) => (s.id, d.space, Some(d.device.clone())),
            None => {
                (s.id, weft_proto::SpaceStat { bytes_total: s.bytes_total, bytes_free: s.bytes_free, objects: 0 }, None)
            }
        })
        .collect();
    let devices = count_once(&rows);
    let device_of = |id: u32| devices.iter().position(|d| d.servers.contains(&id)).map_or(0, |i| i + 1);
    let total: u64 = devices.iter().fold(0, |a, d| a.saturating_add(d.bytes_total));
    let free: u64 = devices.iter().fold(0, |a, d| a.saturating_add(d.bytes_free));
    let per_device_free: Vec<u64> = devices.iter().map(|d| d.bytes_free).collect();
    let usable: Vec<(Redundancy, u64)> =
        Redundancy::ALL.iter().map(|&p| (p, usable_bytes(p, &per_device_free))).collect();
    let state_name = |s: ServerState| match s {
        ServerState::Up => "up",
        ServerState::Down => "down",
        ServerState::Failed => "failed",
        ServerState::Replaced => "replaced",
        ServerState::Draining => "draining",
        ServerState::Spare => "spare",
    };
    let dash = |v: Option<u64>, f: &dyn Fn(u64) -> String| v.map_or_else(|| "—".to_string(), f);
    if json {
        let server_rows: Vec<_> = servers
            .iter()
            .zip(&rows)
            .map(|(s, (_, space, dev))| {
                let d = device_of(s.id);
                let shares: Vec<u32> = devices[d - 1].servers.iter().copied().filter(|&o| o != s.id).collect();
                serde_json::json!({
                    "id": s.id,
                    "address": s.addr,
                    "state": state_name(s.state),
                    "size_bytes": space.bytes_total,
                    "used_bytes": space.bytes_total.saturating_sub(space.bytes_free),
                    "free_bytes": space.bytes_free,
                    "device": d,
                    "device_known": dev.is_some(),
                    "shares_device_with": shares,
                    "heartbeat_age_ms": (s.heartbeat_age_ms != u64::MAX).then_some(s.heartbeat_age_ms),
                })
            })
            .collect();
        let device_rows: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                serde_json::json!({
                    "device": i + 1,
                    "servers": d.servers,
                    "size_bytes": d.bytes_total,
                    "used_bytes": d.bytes_total.saturating_sub(d.bytes_free),
                    "free_bytes": d.bytes_free,
                })
            })
            .collect();
        let usable_map: serde_json::Map<String, serde_json::Value> =
            usable.iter().map(|(p, b)| (p.name().to_string(), (*b).into())).collect();
        return print_json(&serde_json::json!({
            "metadata": {"state": "up", "files": fs.files},
            "servers": server_rows,
            "devices": device_rows,
            "total": {
                "size_bytes": total,
                "used_bytes": total.saturating_sub(free),
                "free_bytes": free,
                "servers_up": fs.servers_up,
                "servers_total": fs.servers_total,
            },
            "usable_bytes": usable_map,
            "membership": {
                "layouts_pending": member.as_ref().map(|m| m.layouts_pending),
                "layouts_changed": member.as_ref().map(|m| m.layouts_changed),
                "rebuild_bytes_left": member.as_ref().and_then(|m| m.rebuild_bytes_left),
                "rebuild_bytes_per_s": member.as_ref().and_then(|m| m.rebuild_bytes_per_s),
                "rebuild_eta_ms": member.as_ref().and_then(|m| m.rebuild_eta_ms),
            },
        }));
    }
    use crate::human::size;
    println!("metadata service: up ({} files)", fs.files);
    println!(
        "{:>4}  {:<22} {:<14} {:>7} {:>7} {:>7} {:>6}  {:>12}",
        "id", "address", "state", "size", "used", "free", "device", "heartbeat ms"
    );
    for (s, (_, space, dev)) in servers.iter().zip(&rows) {
        let state = match s.state {
            ServerState::Down if s.heartbeat_age_ms != u64::MAX => {
                format!("DOWN for {}s", s.heartbeat_age_ms / 1000)
            }
            ServerState::Down => "DOWN".to_string(),
            ServerState::Failed => "FAILED".to_string(),
            other => state_name(other).to_string(),
        };
        let age = if s.heartbeat_age_ms == u64::MAX { "never".to_string() } else { s.heartbeat_age_ms.to_string() };
        let d = device_of(s.id);
        let dev = if dev.is_some() { format!("d{d}") } else { format!("d{d}?") };
        println!(
            "{:>4}  {:<22} {:<14} {:>7} {:>7} {:>7} {:>6}  {:>12}",
            s.id,
            s.addr,
            state,
            size(space.bytes_total),
            size(space.bytes_total.saturating_sub(space.bytes_free)),
            size(space.bytes_free),
            dev,
            age
        );
    }
    for (i, d) in devices.iter().enumerate().filter(|(_, d)| d.servers.len() > 1) {
        let ids: Vec<String> = d.servers.iter().map(u32::to_string).collect();
        println!("device d{}: servers {} share one file system, counted once", i + 1, ids.join(", "));
    }
    if rows.iter().any(|r| r.2.is_none()) {
        println!("(d?: file system not known, the server is down or did not answer: counted on its own)");
    }
    println!(
        "total: {} in {} file system(s), used {}, free {}; {} of {} data servers up",
        size(total),
        devices.len(),
        size(total.saturating_sub(free)),
        size(free),
        fs.servers_up,
        fs.servers_total
    );
    for (p, b) in &usable {
        println!("usable for new data with {}: {}", p.name(), size(*b));
    }
    let m = member.unwrap_or_default();
    println!(
        "rebuild: {} left, {}/s, ETA {}; files waiting for a spare: {}; layout changes: {}",
        dash(m.rebuild_bytes_left, &|b| size(b)),
        dash(m.rebuild_bytes_per_s, &|b| size(b)),
        dash(m.rebuild_eta_ms, &|ms| format!("{}s", ms.div_ceil(1000))),
        m.layouts_pending,
        m.layouts_changed
    );
    Ok(())
}

/// `weft heal`: pending stale work per file, slot and server, with the healer's progress; `--now` wakes it.
pub async fn heal(spec: &str, now: bool, json: bool) -> Result<()> {
    let c = connect(spec).await?;
    if now {
        c.heal_now().await.context("waking the healer")?;
    }
    // Every page (bounded by the MDS's table cap), with each file's layout and size for servers and bytes.
    let mut entries = Vec::new();
    let mut after = None;
    let progress = loop {
        let page = c.list_stale(None, after, 0).await?;
        after = page.entries.last().map(|e| (e.ino, e.slot));
        entries.extend(page.entries);
        if !page.more || after.is_none() {
            break page.progress;
        }
    };
    let mut rows_out = Vec::new();
    let mut per_server: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
    for e in &entries {
        let attr = c.getattr(e.ino).await.ok();
        let layout = attr.as_ref().and_then(|a| a.layout.clone());
        let server = layout.as_ref().and_then(|l| l.servers.get(e.slot as usize).copied());
        let (unit, row_bytes, rows_in_file) = match &layout {
            Some(l) => {
                let unit = u64::from(l.stripe_unit);
                let rb = match l.redundancy {
                    weft_proto::DataRedundancy::Ec { k, .. } => unit * u64::from(k),
                    _ => unit,
                };
                (unit, rb, attr.as_ref().map_or(0, |a| a.size.div_ceil(rb)))
            }
            None => (0, 0, 0),
        };
        let _ = row_bytes;
        let rows: u64 = e.ranges.iter().map(|r| r.end.min(rows_in_file).saturating_sub(r.start)).sum();
        let bytes = rows * unit;
        if let Some(s) = server {
            let t = per_server.entry(s).or_default();
            t.0 += 1;
            t.1 += bytes;
        }
        rows_out.push((e, server, rows, bytes));
    }
    if json {
        let files: Vec<serde_json::Value> = rows_out
            .iter()
            .map(|(e, server, rows, bytes)| {
                serde_json::json!({
                    "ino": e.ino,
                    "slot": e.slot,
                    "server": server,
                    "ranges": e.ranges.iter().map(|r| serde_json::json!({"start": r.start, "end": r.end, "seq": r.seq})).collect::<Vec<_>>(),
                    "rows": rows,
                    "bytes": bytes,
                })
            })
            .collect();
        let servers: Vec<serde_json::Value> =
            per_server.iter().map(|(id, (n, b))| serde_json::json!({"server": id, "entries": n, "bytes": b})).collect();
        return print_json(&serde_json::json!({
            "entries": files,
            "servers": servers,
            "healer": {
                "running": progress.running,
                "bytes_left": progress.bytes_left,
                "bytes_healed": progress.bytes_healed,
                "rate_bytes_per_s": progress.rate_bytes_per_s,
                "ranges_healed": progress.ranges_healed,
            },
        }));
    }
    use crate::human::size;
    if entries.is_empty() {
        println!("nothing to heal");
    } else {
        println!("{:>12} {:>5} {:>7} {:>10} {:>8}", "INODE", "SLOT", "SERVER", "ROWS", "BYTES");
        for (e, server, rows, bytes) in &rows_out {
            let server = server.map_or("?".to_string(), |s| s.to_string());
            println!("{:>12} {:>5} {:>7} {:>10} {:>8}", e.ino, e.slot, server, rows, size(*bytes));
        }
        for (id, (n, b)) in &per_server {
            println!("server {id}: {n} stale entries, {} to heal", size(*b));
        }
    }
    if progress.running {
        let eta = if progress.rate_bytes_per_s > 0 && progress.bytes_left > 0 {
            format!(", ETA {} s", progress.bytes_left.div_ceil(progress.rate_bytes_per_s))
        } else {
            String::new()
        };
        println!(
            "healer: {} left, {}/s, {} healed ({} ranges){eta}",
            size(progress.bytes_left),
            size(progress.rate_bytes_per_s),
            size(progress.bytes_healed),
            progress.ranges_healed
        );
    } else {
        println!("healer: not running beside this MDS (heal = false)");
    }
    Ok(())
}

/// The cluster config a service beside the MDS (the healer, the background scrubber) connects with: the MDS's
/// own key, TLS and CA; `mds` is filled in once the MDS listens.
pub fn beside_mds_cluster(cfg: &weft_meta::MetaConfig) -> ClusterConfig {
    ClusterConfig {
        mds: String::new(),
        key_file: cfg.key_file.clone(),
        auth: cfg.auth,
        key_id: weft_rpc::auth::CLUSTER_KEY_ID.to_string(),
        tls: cfg.tls,
        tls_ca_file: cfg.tls_ca_file.clone(),
        client: Default::default(),
        cache: None,
    }
}

/// The cluster config a healer beside the MDS connects with, and its settings.
pub fn healer_config(cfg: &weft_meta::MetaConfig) -> (ClusterConfig, weft_heal::HealConfig) {
    let cluster = beside_mds_cluster(cfg);
    let hc = weft_heal::HealConfig {
        rebuild_mib_per_s: cfg.rebuild_mib_per_s,
        interval_ms: cfg.heal_interval_ms.max(1),
        ..Default::default()
    };
    (cluster, hc)
}

/// Starts the healer against the MDS listening at `addr` (this process's), as root with the cluster key.
pub fn spawn_healer(
    mut cluster: ClusterConfig,
    addr: &str,
    cfg: weft_heal::HealConfig,
    state: std::sync::Arc<weft_heal::HealState>,
    duty: weft_meta::DutyFlag,
) {
    // A wildcard listening address is reached on loopback.
    cluster.mds = addr.replace("0.0.0.0", "127.0.0.1").replace("[::]", "[::1]");
    tokio::spawn(async move {
        let client = match Client::connect(&cluster).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("the healer cannot connect to its MDS at {}: {e}", cluster.mds);
                return;
            }
        };
        let root = match weft_client::user_cred(0, 0, Vec::new()) {
            Ok(u) => u,
            Err(e) => {
                tracing::error!("the healer's credential: {e}");
                return;
            }
        };
        tracing::info!(mds = %cluster.mds, mib_per_s = cfg.rebuild_mib_per_s, "healer started");
        weft_heal::Healer::new(client.with_user(root), cfg, state).run_while(move || duty.held()).await;
    });
}

/// `weft bench ARGS`: replaces this process with `weft-bench ARGS`, from beside this binary (where cargo builds
/// and installs it) or else from `PATH`. The benchmarks are a binary of their own so that `weft` links none of
/// the peers' code they compare with.
pub fn bench(args: &[std::ffi::OsString]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe().context("finding the weft binary")?;
    let beside = me.with_file_name("weft-bench");
    let program = if beside.is_file() { beside.into_os_string() } else { "weft-bench".into() };
    let err = std::process::Command::new(&program).args(args).exec();
    Err(anyhow::anyhow!(
        "running {}: {err} (the benchmarks are the weft-bench binary: `cargo build --release -p weft-bench`, or \
         `make bench-deps`)",
        program.to_string_lossy()
    ))
}
