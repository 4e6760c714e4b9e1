//! The user commands: each opens a client on the cluster named by `--cluster` / `WEFT_CLUSTER` and does one thing.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_client::{Client, ClientError, ClusterConfig, OpenMode};
use weft_launch::{LaunchOptions, LocalCluster};
use weft_proto::{FileKind, ServerState};

/// Bytes moved per client call by put/get/cat: large enough to keep every data server of a file busy.
const COPY_CHUNK_BYTES: usize = 16 << 20;

/// `--fabric`, when given: overrides the cluster file's and WEFT_FABRIC's choice for every client of this process.
pub static FABRIC: std::sync::OnceLock<weft_client::FabricChoice> = std::sync::OnceLock::new();

async fn connect(spec: &str) -> Result<Client> {
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
) -> Result<()> {
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
    println!(
        "Weft cluster up: metadata service {}, {} data servers ({})",
        cluster.mds_addr(),
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
    println!("Data, logs and client config under {} (client config: {})", data_dir.display(), cfg.display());
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
    println!("Ctrl-C stops the cluster.");
    wait_for_stop(mounted.as_ref()).await?;
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
pub fn key_list(keyring: &Path) -> Result<()> {
    let keys = weft_rpc::ClientKeys::load(keyring)?;
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

pub async fn ls(spec: &str, path: &str, long: bool) -> Result<()> {
    let c = connect(spec).await?;
    let attr = c.resolve(path).await?;
    let mut out = std::io::stdout().lock();
    if attr.kind != FileKind::Dir {
        writeln!(out, "{path}")?;
        return Ok(());
    }
    for e in c.readdir(attr.ino).await? {
        if long {
            let a = c.getattr(e.ino).await?;
            writeln!(
                out,
                "{}{:04o} {:>3} {:>12} {:>10} {}",
                kind_char(a.kind),
                a.mode,
                a.nlink,
                a.size,
                a.ino,
                e.name
            )?;
        } else {
            writeln!(out, "{}", e.name)?;
        }
    }
    Ok(())
}

pub async fn stat(spec: &str, path: &str) -> Result<()> {
    let c = connect(spec).await?;
    let a = c.resolve(path).await?;
    println!("  path: {path}");
    println!(" inode: {}", a.ino);
    println!("  kind: {:?}", a.kind);
    println!("  mode: {:04o}  uid: {}  gid: {}  links: {}", a.mode, a.uid, a.gid, a.nlink);
    println!("  size: {}", a.size);
    println!(" mtime: {} ns  ctime: {} ns  atime: {} ns", a.mtime_ns, a.ctime_ns, a.atime_ns);
    if a.kind == FileKind::Symlink {
        println!("target: {}", c.readlink(a.ino).await?);
    }
    match (&a.layout, a.kind) {
        (Some(l), FileKind::File) => {
            println!(
                "layout: stripe unit {} bytes, stripe count {}, data servers {:?}",
                l.stripe_unit, l.stripe_count, l.servers
            )
        }
        (Some(l), FileKind::Dir) => {
            let count = if l.stripe_count == 0 { "all".to_string() } else { l.stripe_count.to_string() };
            println!("layout policy for new files: stripe unit {} bytes, stripe count {count}", l.stripe_unit)
        }
        _ => {}
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
        f.write_at(offset, buf.freeze()).await?;
        offset += filled as u64;
    }
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

pub async fn setstripe(spec: &str, dir: &str, unit: u32, count: u32) -> Result<()> {
    let c = connect(spec).await?;
    let d = c.resolve(dir).await?;
    c.set_layout(d.ino, unit, count).await.map_err(|e| e.with_path(dir))?;
    Ok(())
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

pub async fn status(spec: &str) -> Result<()> {
    let c = connect(spec).await?;
    let servers = c.cluster_info().await?;
    let fs = c.statfs().await?;
    println!("metadata service: up ({} files)", fs.files);
    println!(
        "{:>4}  {:<22} {:<5} {:>10} {:>10} {:>12}",
        "id", "address", "state", "size GiB", "free GiB", "heartbeat ms"
    );
    for s in &servers {
        let state = match s.state {
            ServerState::Up => "up",
            ServerState::Down => "DOWN",
        };
        let age = if s.heartbeat_age_ms == u64::MAX { "never".to_string() } else { s.heartbeat_age_ms.to_string() };
        println!(
            "{:>4}  {:<22} {:<5} {:>10.1} {:>10.1} {:>12}",
            s.id,
            s.addr,
            state,
            gib(s.bytes_total),
            gib(s.bytes_free),
            age
        );
    }
    println!(
        "total: {:.1} GiB, free {:.1} GiB, {} of {} data servers up",
        gib(fs.bytes_total),
        gib(fs.bytes_free),
        fs.servers_up,
        fs.servers_total
    );
    Ok(())
}
