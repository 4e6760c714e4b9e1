//! A real PostgreSQL server for tests: one per test process, started on first use, each test in a fresh
//! database of its own ([`fresh_url`]).
//!
//! The server (`initdb` and `pg_ctl` from `WEFT_PG_BINDIR`, `pg_config --bindir`, or the newest
//! `/usr/lib/postgresql/*/bin`) lives in a temporary directory and listens only on a Unix socket there, with
//! `fsync` off. PostgreSQL refuses to run as root, so as root it runs as `nobody` (`runuser`, util-linux). A
//! watchdog shell, started before the server, holds the read end of a pipe whose write end only this process
//! holds: when the process exits, however it exits, the watchdog reads end-of-file, stops the server
//! (`pg_ctl stop -m immediate`) and removes the directory. No PostgreSQL installed fails the test, by name.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::PgStore;

/// The user the server runs as when the tests run as root.
const SERVER_USER: &str = "nobody";
/// The superuser `initdb` creates; connections trust the socket.
const DB_USER: &str = "weft";

struct Server {
    /// Holds the socket and the data directory.
    dir: PathBuf,
    /// Kept open for the process's life: its end tells the watchdog to stop the server.
    _watchdog: Child,
}

/// A connection string to a new, empty database on the shared test server.
pub(crate) fn fresh_url() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let server = server();
    let name = format!("t_{}", N.fetch_add(1, Ordering::SeqCst));
    let url = |db: &str| format!("host={} user={DB_USER} dbname={db}", server.dir.display());
    execute(&url("postgres"), &format!("CREATE DATABASE {name}"));
    url(&name)
}

/// Runs `sql` (statements without parameters) on the database at `url`, outside any store.
pub(crate) fn execute(url: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("test database");
        let driver = tokio::spawn(conn);
        client.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        drop(client);
        let _ = driver.await;
    });
}

/// A [`PgStore`] on a new database.
pub(crate) fn fresh_store() -> PgStore {
    PgStore::connect(&fresh_url()).expect("connecting to the test database")
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(start)
}

fn start() -> Server {
    let bin = bindir();
    let as_root = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
    let dir = std::env::temp_dir().join(format!("weft-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).expect("creating the test server's directory");
    if as_root {
        let ok = Command::new("chown").args([&format!("{SERVER_USER}:"), dir.to_str().unwrap_or("")]).status();
        assert!(ok.is_ok_and(|s| s.success()), "chown {SERVER_USER} {}", dir.display());
    }
    let watchdog = watchdog(&bin, &dir, as_root);
    let data = dir.join("data");
    let out = server_cmd(as_root, &bin.join("initdb"))
        .args(["-D", path(&data), "-U", DB_USER, "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
        .stdin(Stdio::null())
        .output()
        .expect("running initdb");
    assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
    let opts = format!(
        "-c listen_addresses='' -k {} -c fsync=off -c full_page_writes=off -c synchronous_commit=off \
         -c max_connections=300",
        path(&dir)
    );
    let log = dir.join("server.log");
    let status = server_cmd(as_root, &bin.join("pg_ctl"))
        .args(["start", "-w", "-t", "60", "-D", path(&data), "-l", path(&log), "-o", &opts])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("running pg_ctl start");
    if !status.success() {
        let mut text = String::new();
        let _ = std::fs::File::open(&log).and_then(|mut f| f.read_to_string(&mut text));
        panic!("the test PostgreSQL server did not start:\n{text}");
    }
    Server { dir, _watchdog: watchdog }
}

/// The shell that stops the server and removes `dir` once this process is gone (its stdin reaches end-of-file).
/// In its own process group, so a Ctrl-C to the test run does not kill it before it has cleaned up.
fn watchdog(bin: &Path, dir: &Path, as_root: bool) -> Child {
    let pg_ctl = bin.join("pg_ctl");
    let stop = if as_root { format!("runuser -u {SERVER_USER} -- \"$1\"") } else { "\"$1\"".to_string() };
    let script = format!("cat >/dev/null; {stop} stop -D \"$2/data\" -m immediate >/dev/null 2>&1; rm -rf \"$2\"");
    Command::new("sh")
        .args(["-c", &script, "weft-pg-watchdog", path(&pg_ctl), path(dir)])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("starting the test server's watchdog")
}

fn server_cmd(as_root: bool, program: &Path) -> Command {
    if as_root {
        let mut c = Command::new("runuser");
        c.args(["-u", SERVER_USER, "--", path(program)]);
        c
    } else {
        Command::new(program)
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// Where `initdb` and `pg_ctl` are ([`crate::pg_bin::bindir`]); none fails the test, by name.
fn bindir() -> PathBuf {
    crate::pg_bin::bindir().unwrap_or_else(|e| panic!("the PgStore tests need initdb and pg_ctl: {e}"))
}
