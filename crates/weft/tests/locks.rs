//! Advisory locks (docs/format.md §14) between two real FUSE mounts of one cluster, taken by real processes
//! (python3's `fcntl` for POSIX record locks, util-linux `flock(1)`), and through the client library: conflicts,
//! shared locks, independent ranges, F_GETLK, a blocked F_SETLKW granted at unlock, release when the holder or its
//! whole mount is killed, the permission check and the table's bound. SQLite's own locking (python3's `sqlite3`:
//! fcntl byte-range locks at 2^30, PENDING/RESERVED/SHARED) between processes of one mount and of two.
//!
//! No sleeps: a waiter first reports that it was refused (`BLOCKED`), then blocks; the test releases the holder and
//! waits for the waiter's `GOT` line and exit.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use common::mount::*;
use common::*;
use weft_proto::ErrorCode;
use weft_proto::msg::{GetLockReq, LockClass, LockKind, SetLockReq};

/// `lock.py MODE PATH TYPE START LEN`, TYPE `r`/`w`, LEN 0 = to EOF:
/// - `hold`: F_SETLKW, print `LOCKED`, then per stdin line `unlock` unlock everything and print `UNLOCKED`; exit
///   at EOF;
/// - `try`: F_SETLK, exit 0 if granted, 11 if refused (EAGAIN/EACCES);
/// - `wait`: F_SETLK; if refused print `BLOCKED`, then F_SETLKW; print `GOT`;
/// - `getlk`: F_GETLK, print `TYPE START LEN PID` (`u` when nothing conflicts).
const LOCK_PY: &str = r#"
import errno, fcntl, os, struct, sys
mode, path, typ, start, length = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
fd = os.open(path, os.O_RDWR)
t = fcntl.F_RDLCK if typ == 'r' else fcntl.F_WRLCK
FMT = '@hhqqi4x'
def fl(kind):
    return struct.pack(FMT, kind, 0, start, length, 0)
def out(s):
    sys.stdout.write(s + '\n'); sys.stdout.flush()
if mode == 'hold':
    fcntl.fcntl(fd, fcntl.F_SETLKW, fl(t))
    out('LOCKED')
    for line in sys.stdin:
        if line.strip() == 'unlock':
            fcntl.fcntl(fd, fcntl.F_SETLK, fl(fcntl.F_UNLCK))
            out('UNLOCKED')
elif mode == 'try':
    try:
        fcntl.fcntl(fd, fcntl.F_SETLK, fl(t))
    except OSError as e:
        sys.exit(11 if e.errno in (errno.EAGAIN, errno.EACCES) else 1)
elif mode == 'wait':
    try:
        fcntl.fcntl(fd, fcntl.F_SETLK, fl(t))
        out('FREE')
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        out('BLOCKED')
        fcntl.fcntl(fd, fcntl.F_SETLKW, fl(t))
    out('GOT')
elif mode == 'getlk':
    k, _, s, l, pid = struct.unpack(FMT, fcntl.fcntl(fd, fcntl.F_GETLK, fl(t)))
    name = {fcntl.F_RDLCK: 'r', fcntl.F_WRLCK: 'w', fcntl.F_UNLCK: 'u'}[k]
    out('%s %d %d %d' % (name, s, l, pid))
"#;

/// A helper process with its stdin and stdout lines.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Proc {
    fn spawn(cmd: &mut Command) -> Proc {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawning a lock helper");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Proc { child, stdin, stdout }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        l.trim_end().to_string()
    }

    fn say(&mut self, s: &str) {
        writeln!(self.stdin.as_mut().unwrap(), "{s}").unwrap();
    }

    /// Closes stdin (a holder exits, dropping its locks) and reaps it.
    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().unwrap()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Py(PathBuf);

impl Py {
    fn new(dir: &Path) -> Py {
        let p = dir.join("lock.py");
        std::fs::write(&p, LOCK_PY).unwrap();
        Py(p)
    }

    fn cmd(&self, mode: &str, file: &Path, typ: &str, start: u64, len: u64) -> Command {
        let mut c = Command::new("python3");
        c.arg(&self.0).arg(mode).arg(file).arg(typ).arg(start.to_string()).arg(len.to_string());
        c
    }

    /// A process holding a lock (it answers `LOCKED` once it has it).
    fn hold(&self, file: &Path, typ: &str, start: u64, len: u64) -> Proc {
        let mut p = Proc::spawn(&mut self.cmd("hold", file, typ, start, len));
        assert_eq!(p.line(), "LOCKED");
        p
    }

    /// Whether a non-blocking lock is granted (the trying process exits, dropping it again).
    fn granted(&self, file: &Path, typ: &str, start: u64, len: u64) -> bool {
        let s = self.cmd("try", file, typ, start, len).status().unwrap();
        match s.code() {
            Some(0) => true,
            Some(11) => false,
            other => panic!("lock helper failed: {other:?}"),
        }
    }

    fn getlk(&self, file: &Path, typ: &str, start: u64, len: u64) -> String {
        let out = self.cmd("getlk", file, typ, start, len).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim_end().to_string()
    }

    /// A waiter that was refused and now blocks in F_SETLKW.
    fn blocked_waiter(&self, file: &Path, typ: &str, start: u64, len: u64) -> Proc {
        let mut w = Proc::spawn(&mut self.cmd("wait", file, typ, start, len));
        assert_eq!(w.line(), "BLOCKED", "the lock is held elsewhere");
        w
    }
}

/// `sql.py MODE DB`, SQLite through python3's `sqlite3` module (the unix VFS: fcntl locks at offset 2^30), no busy
/// timeout:
/// - `hold BEGIN`: run `BEGIN` (e.g. `BEGIN EXCLUSIVE`), print `LOCKED`; at the stdin line `commit` insert a row,
///   commit and print `COMMITTED`; exit at EOF;
/// - `write N`: `BEGIN IMMEDIATE`, insert N, commit: exit 0, or 11 if the database is locked;
/// - `read`: print the row count, or exit 11 if the database is locked.
const SQL_PY: &str = r#"
import sqlite3, sys
mode, path, arg = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ''
db = sqlite3.connect(path, timeout=0, isolation_level=None)
def out(s):
    sys.stdout.write(s + '\n'); sys.stdout.flush()
def busy(e):
    return 'locked' in str(e) or 'busy' in str(e)
if mode == 'hold':
    db.execute(arg)
    out('LOCKED')
    for line in sys.stdin:
        if line.strip() == 'commit':
            db.execute('INSERT INTO t VALUES (-1)')
            db.execute('COMMIT')
            out('COMMITTED')
elif mode == 'write':
    try:
        db.execute('BEGIN IMMEDIATE')
        db.execute('INSERT INTO t VALUES (?)', (int(arg),))
        db.execute('COMMIT')
    except sqlite3.OperationalError as e:
        sys.exit(11 if busy(e) else 1)
elif mode == 'read':
    try:
        out(str(db.execute('SELECT count(*) FROM t').fetchone()[0]))
    except sqlite3.OperationalError as e:
        sys.exit(11 if busy(e) else 1)
"#;

struct Sql(PathBuf);

impl Sql {
    fn new(dir: &Path) -> Sql {
        let p = dir.join("sql.py");
        std::fs::write(&p, SQL_PY).unwrap();
        Sql(p)
    }

    fn cmd(&self, mode: &str, db: &Path, arg: &str) -> Command {
        let mut c = Command::new("python3");
        c.arg(&self.0).arg(mode).arg(db).arg(arg);
        c
    }

    /// A process inside a transaction begun with `begin`.
    fn hold(&self, db: &Path, begin: &str) -> Proc {
        let mut p = Proc::spawn(&mut self.cmd("hold", db, begin));
        assert_eq!(p.line(), "LOCKED", "{begin} on {}", db.display());
        p
    }

    /// Whether a write transaction commits (false: the database is locked).
    fn write(&self, db: &Path, n: u32) -> bool {
        match self.cmd("write", db, &n.to_string()).status().unwrap().code() {
            Some(0) => true,
            Some(11) => false,
            other => panic!("sql.py write failed: {other:?}"),
        }
    }

    /// The row count, or None while the database is locked against readers.
    fn read(&self, db: &Path) -> Option<u64> {
        let out = self.cmd("read", db, "").output().unwrap();
        match out.status.code() {
            Some(0) => Some(String::from_utf8(out.stdout).unwrap().trim().parse().unwrap()),
            Some(11) => None,
            other => panic!("sql.py read failed: {other:?} {}", String::from_utf8_lossy(&out.stderr)),
        }
    }
}

fn two_mounts(cl: &TestCluster, name: &str) -> (Mount, Mount) {
    let a = Mount::start(cl, &test_dir(&format!("{name}-a")), &[]);
    let b = Mount::start(cl, &test_dir(&format!("{name}-b")), &[]);
    (a, b)
}

#[tokio::test(flavor = "multi_thread")]
async fn fcntl_locks_contend_between_two_mounts() {
    let cl = start("locks-fcntl", 1).await;
    let (a, b) = two_mounts(&cl, "locks-fcntl");
    let py = Py::new(&test_dir("locks-fcntl-py"));
    tokio::task::spawn_blocking(move || {
        std::fs::write(a.path("f"), vec![1u8; 4096]).unwrap();
        let (fa, fb) = (a.path("f"), b.path("f"));

        // Exclusive [0, 100) on A: B is refused an overlapping lock of either kind, granted [100, 200).
        let mut holder = py.hold(&fa, "w", 0, 100);
        assert!(!py.granted(&fb, "w", 0, 100), "exclusive vs exclusive");
        assert!(!py.granted(&fb, "r", 99, 1), "exclusive vs shared, one byte of overlap");
        assert!(py.granted(&fb, "w", 100, 100), "[100, 200) does not touch [0, 100)");
        // F_GETLK from B names A's lock: kind, range and holder pid.
        let pid = holder.child.id();
        assert_eq!(py.getlk(&fb, "r", 50, 0), format!("w 0 100 {pid}"));
        assert_eq!(py.getlk(&fb, "w", 100, 50), "u 100 50 0", "nothing in the way");
        assert_eq!(py.getlk(&fa, "w", 0, 0), format!("w 0 100 {pid}"), "another process on the same mount too");

        // Unlock releases: B now gets it.
        holder.say("unlock");
        assert_eq!(holder.line(), "UNLOCKED");
        assert!(py.granted(&fb, "w", 0, 100));
        assert!(holder.finish().success());

        // Shared vs shared is granted, shared vs exclusive refused.
        let reader = py.hold(&fa, "r", 0, 0);
        assert!(py.granted(&fb, "r", 0, 50));
        assert!(!py.granted(&fb, "w", 1000, 1));
        assert!(reader.finish().success());
        assert!(py.granted(&fb, "w", 0, 0), "the holder's exit released its lock");

        // A blocked F_SETLKW on B is granted once A unlocks.
        let mut holder = py.hold(&fa, "w", 0, 0);
        let mut waiter = py.blocked_waiter(&fb, "w", 10, 10);
        holder.say("unlock");
        assert_eq!(holder.line(), "UNLOCKED");
        assert_eq!(waiter.line(), "GOT");
        assert!(waiter.finish().success());
        assert!(holder.finish().success());
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn flock_contends_between_two_mounts() {
    let cl = start("locks-flock", 1).await;
    let (a, b) = two_mounts(&cl, "locks-flock");
    tokio::task::spawn_blocking(move || {
        std::fs::write(a.path("f"), b"x").unwrap();
        let (fa, fb) = (a.path("f"), b.path("f"));
        let flock_n = |mode: &str, f: &Path| {
            let s = Command::new("flock").arg(mode).arg("-n").arg(f).arg("true").status().unwrap();
            match s.code() {
                Some(0) => true,
                Some(1) => false,
                other => panic!("flock(1) failed: {other:?}"),
            }
        };
        let hold = |mode: &str, f: &Path| {
            let mut p =
                Proc::spawn(Command::new("flock").arg(mode).arg(f).args(["sh", "-c", "echo LOCKED; read x || true"]));
            assert_eq!(p.line(), "LOCKED");
            p
        };
        let holder = hold("-x", &fa);
        assert!(!flock_n("-x", &fb), "exclusive vs exclusive");
        assert!(!flock_n("-s", &fb), "exclusive vs shared");
        assert!(holder.finish().success());
        // The kernel hands the holder's release to its mount asynchronously (the process's exit does not wait for
        // it): polled, bounded at ten seconds.
        let released = (0..200).any(|_| {
            flock_n("-x", &fb) || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                false
            }
        });
        assert!(released, "released when the holder exits");
        let holder = hold("-s", &fa);
        assert!(flock_n("-s", &fb), "shared vs shared");
        assert!(!flock_n("-x", &fb));
        assert!(holder.finish().success());
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_holder_or_mount_loses_its_locks() {
    // A session whose connection closed gets 200 ms to come back before its locks go.
    let cl = start_with("locks-kill", 1, |o| o.meta_extra_toml = "locks_grace_ms = 200".into()).await;
    let (a, b) = two_mounts(&cl, "locks-kill");
    let py = Py::new(&test_dir("locks-kill-py"));
    tokio::task::spawn_blocking(move || {
        std::fs::write(a.path("f"), b"x").unwrap();
        let (fa, fb) = (a.path("f"), b.path("f"));

        // kill -9 of the holding process: the kernel closes its files, the mount releases its locks.
        let mut holder = py.hold(&fa, "w", 0, 0);
        let mut waiter = py.blocked_waiter(&fb, "w", 0, 0);
        holder.child.kill().unwrap();
        holder.child.wait().unwrap();
        assert_eq!(waiter.line(), "GOT");
        assert!(waiter.finish().success());

        // kill -9 of the whole mount daemon holding a lock: its MDS connection closes, the session does not come
        // back, and the MDS releases its locks after the grace period.
        let mut a = a;
        let holder = py.hold(&fa, "w", 0, 0);
        let mut waiter = py.blocked_waiter(&fb, "w", 0, 0);
        a.child.kill().unwrap();
        a.child.wait().unwrap();
        assert_eq!(waiter.line(), "GOT");
        assert!(waiter.finish().success());
        drop(holder);
        drop(a);
    })
    .await
    .unwrap();
    assert!(cl.log("meta").contains("released the locks of a session"), "the MDS says why");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_api_checks_permission_and_bounds_the_table() {
    let cl = start_with("locks-api", 1, |o| o.meta_extra_toml = "locks_max = 2".into()).await;
    let (c1, c2) = (cl.client().await, cl.client().await);
    let root = c1.resolve("/").await.unwrap().ino;
    let f = c1.create(root, "f", 0o600, true).await.unwrap().ino;
    let g = c1.create(root, "g", 0o644, true).await.unwrap().ino;
    let set =
        |ino, kind, start, end, owner| SetLockReq { ino, class: LockClass::Posix, kind, start, end, owner, pid: 1 };
    use LockKind::{Exclusive as X, Shared as S};
    assert_eq!(c1.set_lock(set(f, Some(X), 0, 9, 1)).await.unwrap(), None);
    let h = c2.set_lock(set(f, Some(S), 5, 5, 1)).await.unwrap().expect("a conflict");
    assert_eq!((h.kind, h.start, h.end), (X, 0, 9), "another session is another owner");
    assert_eq!(c1.set_lock(set(f, Some(S), 5, 5, 2)).await.unwrap().map(|h| h.kind), Some(X), "so is another owner id");
    let q = GetLockReq { ino: f, class: LockClass::Flock, kind: X, start: 0, end: u64::MAX, owner: 1 };
    assert_eq!(c2.get_lock(q).await.unwrap(), None, "flock locks do not see POSIX locks");

    // The keepalive of a lock holder (`ping_mds`) spends no slot sequence: the calls after it run on the same
    // session, so its locks stay (a slotted Null made the MDS refuse the next call and the client open a new
    // session, leaving every lock behind in the old one).
    let session = c1.mds_session();
    for _ in 0..3 {
        c1.ping_mds().await.unwrap();
        c1.getattr(f).await.unwrap();
    }
    assert_eq!(c1.mds_session(), session, "a keepalive cost the session");
    assert!(c2.set_lock(set(f, Some(S), 5, 5, 1)).await.unwrap().is_some(), "c1 still holds its lock");

    // The bound: two locks held, a third is ENOLCK; unlocking makes room.
    assert_eq!(c2.set_lock(set(g, Some(S), 0, 0, 1)).await.unwrap(), None);
    let full = c2.set_lock(set(g, Some(S), 5, 5, 1)).await.unwrap_err();
    assert_eq!(full.code(), Some(ErrorCode::NoLocks), "{full}");
    assert_eq!(c2.release_locks(None, None).await.unwrap(), 1);
    assert_eq!(c2.set_lock(set(g, Some(S), 5, 5, 1)).await.unwrap(), None);
    assert_eq!(c2.release_locks(Some(g), Some(1)).await.unwrap(), 1);

    // Permission: a shared lock needs read access, an exclusive one write access (f is 0600, g 0644, both root's).
    let alice = c2.with_user(weft_proto::UserCred::new(1000, 1000, vec![]).unwrap());
    let refused = alice.set_lock(set(f, Some(S), 100, 100, 9)).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Permission), "{refused}");
    assert_eq!(alice.set_lock(set(g, Some(S), 0, 0, 9)).await.unwrap(), None);
    let refused = alice.set_lock(set(g, Some(X), 1, 1, 9)).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Permission), "{refused}");
    let bad = c1.set_lock(set(g, Some(S), 9, 8, 1)).await.unwrap_err();
    assert_eq!(bad.code(), Some(ErrorCode::Invalid), "{bad}");
}

/// SQLite's locking (fcntl byte ranges at 2^30: PENDING, RESERVED, the SHARED range; read locks upgraded to write
/// locks and split again at commit) between two processes of one mount and of two mounts: an EXCLUSIVE transaction
/// keeps out readers and writers, a RESERVED one (BEGIN IMMEDIATE) keeps out writers only, and what one commits
/// the other reads.
#[tokio::test(flavor = "multi_thread")]
async fn sqlite_transactions_contend_on_one_mount_and_across_two() {
    let cl = start("locks-sqlite", 1).await;
    let (a, b) = two_mounts(&cl, "locks-sqlite");
    let sql = Sql::new(&test_dir("locks-sqlite-py"));
    tokio::task::spawn_blocking(move || {
        let (da, db) = (a.path("s.db"), b.path("s.db"));
        let s = Command::new("sqlite3").arg(&da).arg("CREATE TABLE t(x INTEGER);").status().unwrap();
        assert!(s.success(), "sqlite3 create");
        for (other, what) in [(&da, "the same mount"), (&db, "another mount")] {
            let before = sql.read(other).expect("nothing holds the database");
            let mut holder = sql.hold(&da, "BEGIN EXCLUSIVE");
            assert!(!sql.write(other, 1), "a writer on {what} got past BEGIN EXCLUSIVE");
            assert_eq!(sql.read(other), None, "a reader on {what} got past BEGIN EXCLUSIVE");
            holder.say("commit");
            assert_eq!(holder.line(), "COMMITTED");
            assert!(holder.finish().success());
            assert_eq!(sql.read(other), Some(before + 1), "{what} reads the committed row");
            assert!(sql.write(other, 2), "a writer on {what} after the commit");

            let mut holder = sql.hold(&da, "BEGIN IMMEDIATE");
            assert!(!sql.write(other, 3), "a writer on {what} got past BEGIN IMMEDIATE");
            assert_eq!(sql.read(other), Some(before + 2), "a reader on {what} is fine beside a RESERVED lock");
            holder.say("commit");
            assert_eq!(holder.line(), "COMMITTED");
            assert!(holder.finish().success());
            assert_eq!(sql.read(other), Some(before + 3));
        }
        let check = Command::new("sqlite3").arg(&db).arg("PRAGMA integrity_check;").output().unwrap();
        assert_eq!(String::from_utf8_lossy(&check.stdout).trim(), "ok");
    })
    .await
    .unwrap();
}
