//! The cluster's own PostgreSQL (`LaunchOptions::postgres`, `weft up --meta postgres`): Debian's server, its
//! database in `DIR/postgres/data` (made by `initdb` on first start, kept across restarts), listening only on a
//! Unix socket in `DIR/postgres`, durable as installed (`fsync` and `synchronous_commit` on). The metadata
//! service's `db` names it ([`url`]).
//!
//! `postgres` runs in the foreground as a child of the launcher (not daemonised by `pg_ctl`), so it is stopped
//! with the rest of the cluster and killed with the launcher: a failing test leaves no server behind. PostgreSQL
//! refuses to run as root, so as root it runs as `nobody`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::{LaunchError, io_err};

/// The superuser `initdb` creates; the socket trusts it (only this host's processes that can reach the socket
/// directory, 0700 to the server's user, connect).
pub const DB_USER: &str = "weft";
/// The database the metadata service uses.
const DB_NAME: &str = "weft";
/// The user the server runs as when the launcher runs as root.
const SERVER_USER: &str = "nobody";

/// The connection string of the cluster's database, whose server keeps its socket in `dir`.
pub fn url(dir: &Path) -> String {
    format!("host={} user={DB_USER} dbname={DB_NAME}", dir.display())
}

/// Starts PostgreSQL for the cluster in `dir` (`initdb` first if `dir/data` holds no database), waits until it
/// accepts connections and makes the database if missing. `log` receives the server's output.
pub async fn start(dir: &Path, log: &Path, ready_timeout_ms: u64) -> Result<Child, LaunchError> {
    let bin = weft_meta::pg_bin::bindir().map_err(LaunchError::Postgres)?;
    let owner = server_owner()?;
    private_dir(dir, owner)?;
    let data = dir.join("data");
    if !data.join("PG_VERSION").exists() {
        let mut initdb = command(&bin.join("initdb"), owner);
        initdb.args(["-D", &path(&data), "-U", DB_USER, "-A", "trust", "-E", "UTF8", "--locale=C"]);
        run_tool(initdb, "initdb").await?;
    }
    let mut child = serve(&bin, owner, dir, log)?;
    wait_accepting(&bin, &mut child, dir, log, ready_timeout_ms).await?;
    create_database(&bin, dir).await?;
    Ok(child)
}

/// A streaming-replication standby of the server whose socket is in `primary`, in `dir`: `pg_basebackup -R` into
/// `dir/data` on first start (it then follows the primary read-only), served on a socket in `dir`. With the
/// primary's `synchronous_standby_names` set ([`require_synchronous_standby`]), a commit returns only once this standby has it on disk.
pub async fn start_standby(
    primary: &Path,
    dir: &Path,
    log: &Path,
    ready_timeout_ms: u64,
) -> Result<Child, LaunchError> {
    let bin = weft_meta::pg_bin::bindir().map_err(LaunchError::Postgres)?;
    let owner = server_owner()?;
    private_dir(dir, owner)?;
    let data = dir.join("data");
    if !data.join("PG_VERSION").exists() {
        let mut backup = command(&bin.join("pg_basebackup"), owner);
        backup.args(["-h", &path(primary), "-U", DB_USER, "-D", &path(&data), "-R", "-X", "stream", "-c", "fast"]);
        run_tool(backup, "pg_basebackup").await?;
    }
    let mut child = serve(&bin, owner, dir, log)?;
    wait_accepting(&bin, &mut child, dir, log, ready_timeout_ms).await?;
    Ok(child)
}

/// Makes the server in `dir` wait, at every commit, for a standby to have it on disk (`ALTER SYSTEM SET
/// synchronous_standby_names = '*'`, then a reload). Set once the standby exists: before, every commit (even
/// `createdb`'s) would wait for one forever.
pub async fn require_synchronous_standby(dir: &Path) -> Result<(), LaunchError> {
    let bin = weft_meta::pg_bin::bindir().map_err(LaunchError::Postgres)?;
    let mut psql = Command::new(bin.join("psql"));
    psql.args(["-h", &path(dir), "-U", DB_USER, "-d", "postgres", "-v", "ON_ERROR_STOP=1"]).args([
        "-c",
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
        "-c",
        "SELECT pg_reload_conf()",
    ]);
    run_tool(psql, "psql (synchronous_standby_names)").await
}

/// Promotes the standby in `dir` to a primary (`pg_ctl promote`, waiting until it accepts writes).
pub async fn promote(dir: &Path) -> Result<(), LaunchError> {
    let bin = weft_meta::pg_bin::bindir().map_err(LaunchError::Postgres)?;
    let mut pg_ctl = command(&bin.join("pg_ctl"), server_owner()?);
    pg_ctl.args(["promote", "-w", "-D", &path(&dir.join("data"))]);
    run_tool(pg_ctl, "pg_ctl promote").await
}

/// Runs a PostgreSQL tool to its end; a failure names it and carries its stderr.
async fn run_tool(mut cmd: Command, what: &str) -> Result<(), LaunchError> {
    let out =
        cmd.stdin(Stdio::null()).output().await.map_err(|e| LaunchError::Postgres(format!("running {what}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LaunchError::Postgres(format!("{what} failed: {}", String::from_utf8_lossy(&out.stderr))))
    }
}

/// `dir`, made if missing, 0700 and owned by the server's user (PostgreSQL insists on both).
fn private_dir(dir: &Path, owner: Option<(u32, u32)>) -> Result<(), LaunchError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).map_err(io_err(dir))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(io_err(dir))?;
    }
    Ok(())
}

/// `postgres` on `dir/data` in the foreground, on a socket in `dir` only.
fn serve(bin: &Path, owner: Option<(u32, u32)>, dir: &Path, log: &Path) -> Result<Child, LaunchError> {
    let log_file = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(io_err(log))?;
    let mut cmd = command(&bin.join("postgres"), owner);
    cmd.args([
        "-D",
        &path(&dir.join("data")),
        "-k",
        &path(dir),
        "-c",
        "listen_addresses=",
        "-c",
        "max_connections=200",
    ]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| LaunchError::Spawn { role: "postgres".into(), source })
}

/// Polls the server with `pg_isready` until it accepts sessions. A socket that accepts a connection is not
/// enough: while the server replays its log it answers "the database system is starting up" (a CI flake).
async fn wait_accepting(
    bin: &Path,
    child: &mut Child,
    dir: &Path,
    log: &Path,
    ready_timeout_ms: u64,
) -> Result<(), LaunchError> {
    let socket = dir.join(".s.PGSQL.5432");
    let deadline = tokio::time::Instant::now() + Duration::from_millis(ready_timeout_ms);
    loop {
        if accepts_sessions(bin, dir).await? {
            return Ok(());
        }
        if !matches!(child.try_wait(), Ok(None)) {
            return Err(LaunchError::Died { role: "postgres".into(), log: log.to_path_buf() });
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(LaunchError::NotReady {
                waited_ms: ready_timeout_ms,
                detail: format!("PostgreSQL did not accept connections on {}; see {}", socket.display(), log.display()),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the server on `dir`'s socket accepts sessions (`pg_isready` exits 0; 1 is "rejecting", starting up
/// or shutting down; 2 is no answer yet).
async fn accepts_sessions(bin: &Path, dir: &Path) -> Result<bool, LaunchError> {
    let status = Command::new(bin.join("pg_isready"))
        .args(["-q", "-h", &path(dir), "-U", DB_USER])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .map_err(|e| LaunchError::Postgres(format!("running pg_isready: {e}")))?;
    Ok(status.success())
}

/// Makes database `name` on the server whose socket is in `dir` (unless it exists), for a peer sharing the
/// cluster's server (`weft bench meta --juicefs`), owned by [`DB_USER`].
pub async fn create_database_named(dir: &Path, name: &str) -> Result<(), LaunchError> {
    let bin = weft_meta::pg_bin::bindir().map_err(LaunchError::Postgres)?;
    create_database_as(&bin, dir, name).await
}

/// `createdb`, unless the database exists (a restarted cluster).
async fn create_database(bin: &Path, dir: &Path) -> Result<(), LaunchError> {
    create_database_as(bin, dir, DB_NAME).await
}

async fn create_database_as(bin: &Path, dir: &Path, name: &str) -> Result<(), LaunchError> {
    let out = Command::new(bin.join("createdb"))
        .args(["-h", &path(dir), "-U", DB_USER, name])
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| LaunchError::Postgres(format!("running createdb: {e}")))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || stderr.contains("already exists") {
        Ok(())
    } else {
        Err(LaunchError::Postgres(format!("createdb failed: {stderr}")))
    }
}

/// As root: the uid and gid of [`SERVER_USER`]; otherwise `None` (the server runs as the launcher's user).
fn server_owner() -> Result<Option<(u32, u32)>, LaunchError> {
    let root = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
    if !root {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(io_err(Path::new("/etc/passwd")))?;
    let ids = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 3 && f[0] == SERVER_USER).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    });
    match ids {
        Some(ids) => Ok(Some(ids)),
        None => Err(LaunchError::Postgres(format!(
            "PostgreSQL refuses to run as root, and there is no user {SERVER_USER:?} to run it as"
        ))),
    }
}

fn command(program: &Path, owner: Option<(u32, u32)>) -> Command {
    let mut c = Command::new(program);
    if let Some((uid, gid)) = owner {
        c.uid(uid).gid(gid);
    }
    c
}

fn path(p: &Path) -> String {
    p.display().to_string()
}
