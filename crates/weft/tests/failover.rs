//! Clients and the mount ride out a metadata service that goes away and comes back (issue 29, must-have 3): with
//! the MDS killed (`kill -9`), calls block, trying every address the cluster file names, and resume when a
//! service answers again, as on a hard NFS mount; nothing errors to the application before
//! `mds_failover_timeout_ms`, and nothing acknowledged is lost.
//!
//! Each test first proves the outage outlasted what a call used to survive (five attempts, about 0.3 s): the
//! native test counts retries, the mount's test waits for the mount's "waiting for it" warning, which only a call
//! past its attempts logs. Only then is the MDS started again.

use crate::common;

use std::future::ready;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::members::wait_for;
use common::mount::Mount;
use common::storm::{FILE_BYTES, check};
use common::*;
use weft_client::{Client, ClusterConfig};
use weft_proto::ROOT_INO;

const WRITERS: usize = 4;

/// A loopback address nobody listens on (bound a moment ago, then closed): the cluster file names it before
/// the live MDS, so every connect walks past a dead address first.
fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// The cluster's config with `mds` naming a dead address first, then the MDS.
fn two_address_config(cl: &TestCluster) -> ClusterConfig {
    let mut cfg = cl.cluster_config();
    cfg.mds = format!("{},{}", dead_addr(), cl.mds_addr());
    cfg
}

/// What the writers share: when to stop, and the first error any of them saw (which ends that writer).
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    error: Mutex<Option<String>>,
}

impl Shared {
    fn failed(&self) -> bool {
        self.error.lock().unwrap().is_some()
    }

    /// Panics with the error an application saw, if one did.
    fn assert_no_error(&self) {
        let error = self.error.lock().unwrap().clone();
        if let Some(e) = error {
            panic!("an application saw an error during the failover: {e}");
        }
    }

    fn record(&self, r: Result<(), String>) {
        if let Err(e) = r {
            self.error.lock().unwrap().get_or_insert(e);
        }
    }
}

/// Starts the MDS again, waits until the writers have acknowledged 100 more files (or one failed), and stops them.
async fn restart_and_stop(cl: &mut TestCluster, shared: &Shared, total: impl Fn() -> usize) {
    let during = total();
    cl.restart_mds().await.unwrap();
    wait_for("writes after the restart", || ready(total() >= during + 100 || shared.failed())).await;
    shared.stop.store(true, Ordering::SeqCst);
}

/// Creates (not exclusively: a retry of a create that ran finds its file), writes and closes `w{w}-{i}` until
/// `stop`, counting acknowledged files in `acked`; the first error ends the writer and is returned.
async fn writer(c: Client, dir: u64, w: usize, shared: Arc<Shared>, acked: Arc<AtomicUsize>) -> Result<(), String> {
    for i in 0.. {
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let name = format!("w{w}-{i:05}");
        let step = async {
            let f = c.create_open(dir, &name, 0o644, false).await?;
            f.write_at(0, Bytes::from(pattern((w * 100_000 + i) as u64, 0, FILE_BYTES))).await?;
            f.close().await
        };
        step.await.map_err(|e| format!("writer {w}, file {name}: {e}"))?;
        acked.fetch_add(1, Ordering::SeqCst);
    }
    unreachable!()
}

/// On the embedded store and on PostgreSQL, one after the other (the resends below are counted per client).
#[tokio::test(flavor = "multi_thread")]
async fn native_writers_block_through_an_mds_kill_and_restart_and_lose_nothing() {
    ride_out_a_restart(start_with("failover-native", 2, |o| o.postgres = false).await).await;
    let cl = start_with("failover-native-pg", 2, |o| o.postgres = true).await;
    assert!(cl.postgres_url().is_some());
    ride_out_a_restart(cl).await;
}

async fn ride_out_a_restart(mut cl: TestCluster) {
    let dir = cl.client().await.mkdir(ROOT_INO, "d", 0o755).await.unwrap().ino;
    let mut cfg = two_address_config(&cl);
    let shared = Arc::new(Shared::default());
    let acked: Vec<Arc<AtomicUsize>> = (0..WRITERS).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let (mut tasks, mut clients) = (Vec::new(), Vec::new());
    for (w, a) in acked.iter().enumerate() {
        let c = Client::connect(&cfg).await.unwrap();
        clients.push(c.clone());
        let (shared, a) = (shared.clone(), a.clone());
        tasks.push(tokio::spawn(async move { shared.record(writer(c, dir, w, shared.clone(), a).await) }));
    }
    let total = || acked.iter().map(|a| a.load(Ordering::SeqCst)).sum::<usize>();
    wait_for("writes before the kill", || ready(total() >= 100 || shared.failed())).await;
    shared.assert_no_error();

    cl.kill_mds().await;
    // Four writers blocked in one call each: 6 retries per writer means at least one call went past five
    // attempts, where it used to fail. Counted per client: other tests' clients in this process retry too.
    let resends = || clients.iter().map(|c| c.mds_resends()).sum::<u64>();
    let before = resends();
    let blocked = || ready(resends() >= before + 6 * WRITERS as u64 || shared.failed());
    wait_for("the writers to retry past their attempts", blocked).await;
    shared.assert_no_error();
    restart_and_stop(&mut cl, &shared, total).await;
    for t in tasks {
        t.await.unwrap();
    }
    shared.assert_no_error();
    let counts: Vec<usize> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    check(&cl.client().await, "d", &counts).await;

    // An MDS gone for good: a call errors once the failover window closes, naming the addresses it tried.
    cfg.client.mds_failover_timeout_ms = 1_500;
    let c = Client::connect(&cfg).await.unwrap();
    assert_eq!(c.getattr(ROOT_INO).await.unwrap().ino, ROOT_INO);
    cl.kill_mds().await;
    let began = std::time::Instant::now();
    let err = c.getattr(ROOT_INO).await.unwrap_err();
    // Not a timing assertion: a floor the retry machine guarantees (it attempts until the window closes).
    assert!(began.elapsed().as_millis() >= 1_500, "gave up after {:?}: {err}", began.elapsed());
    assert!(err.to_string().contains(&cfg.mds), "the error names the addresses tried: {err}");
}

/// Writes `w{w}-{i}` through the mount until `stop`; the first error ends the thread and is returned.
fn mount_writer(root: &Path, w: usize, shared: &Shared, acked: &AtomicUsize) -> Result<(), String> {
    for i in 0.. {
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let path = root.join(format!("w{w}-{i:05}"));
        std::fs::write(&path, pattern((w * 100_000 + i) as u64, 0, FILE_BYTES))
            .map_err(|e| format!("writer {w}: {}: {e}", path.display()))?;
        acked.fetch_add(1, Ordering::SeqCst);
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread")]
async fn creators_on_the_mount_block_through_an_mds_kill_and_restart_and_see_no_error() {
    let mut cl = start("failover-fuse", 2).await;
    cl.client().await.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    let work = test_dir("failover-fuse-mnt");
    let cluster_file = work.join("cluster.toml");
    std::fs::write(&cluster_file, two_address_config(&cl).to_toml()).unwrap();
    let log = work.join("mount.log");
    let m = Mount::start_from(&cluster_file, &work.join("mnt"), &[], Some(&log));
    let root = m.path("d");
    let shared = Arc::new(Shared::default());
    let acked: Arc<Vec<AtomicUsize>> = Arc::new((0..WRITERS).map(|_| AtomicUsize::new(0)).collect());
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (root, shared, acked) = (root.clone(), shared.clone(), acked.clone());
            std::thread::spawn(move || shared.record(mount_writer(&root, w, &shared, &acked[w])))
        })
        .collect();
    let total = || acked.iter().map(|a| a.load(Ordering::SeqCst)).sum::<usize>();
    wait_for("writes before the kill", || ready(total() >= 100 || shared.failed())).await;
    shared.assert_no_error();

    cl.kill_mds().await;
    let waiting = || {
        let logged = std::fs::read_to_string(&log).unwrap_or_default().contains("does not answer; waiting");
        ready(logged || shared.failed())
    };
    wait_for("the mount to wait for the MDS past a call's attempts", waiting).await;
    shared.assert_no_error();
    restart_and_stop(&mut cl, &shared, total).await;
    for t in threads {
        t.join().unwrap();
    }
    shared.assert_no_error();
    let counts: Vec<usize> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    // Read back through the mount (its close-to-open view) and through a fresh native client.
    for (w, &n) in counts.iter().enumerate() {
        for i in 0..n {
            let path = root.join(format!("w{w}-{i:05}"));
            assert_eq!(std::fs::read(&path).unwrap(), pattern((w * 100_000 + i) as u64, 0, FILE_BYTES));
        }
    }
    check(&cl.client().await, "d", &counts).await;
    drop(m);
    let _ = std::fs::remove_dir_all(&work);
}

/// Arms the restarted MDS to exit right after executing its next `op` (committed, never answered), or disarms it.
fn arm_exit_after(cl: &mut TestCluster, op: Option<weft_proto::Op>) {
    // Without the hook the MDS never exits and the test would wait for it forever.
    if !cfg!(feature = "fault-injection") {
        panic!("this test needs the servers' fault hook: cargo test --features weft/fault-injection (make does)");
    }
    let env = op.map(|op| ("WEFT_FAULT".to_string(), format!("exit-after-execute:{}:1", op as u16)));
    cl.set_env(env.into_iter().collect());
}

/// Issue 29's exactly-once across a failover: an exclusive create and a rename commit, and the MDS dies before it
/// replies (a fault plan makes it exit there, as `kill -9` at the worst moment would). The client's retry goes to
/// the restarted service on a new session; its once block finds the recorded outcome, so the create returns the
/// file it made (not EEXIST, not "maybe applied") and the rename succeeds (not ENOENT), each applied once.
#[tokio::test(flavor = "multi_thread")]
async fn a_create_and_a_rename_whose_replies_died_with_the_mds_are_answered_once() {
    for postgres in [false, true] {
        let mut cl = start_with(&format!("failover-once-{postgres}"), 1, |o| o.postgres = postgres).await;
        let c = Arc::new(cl.client().await);
        let d = c.mkdir(ROOT_INO, "d", 0o755).await.unwrap().ino;

        cl.stop_mds().await;
        arm_exit_after(&mut cl, Some(weft_proto::Op::Create));
        cl.restart_mds().await.unwrap();
        let creator = c.clone();
        let create = tokio::spawn(async move { creator.create(d, "x", 0o644, true).await });
        assert_eq!(cl.wait_mds_exit().await, Some(137), "the MDS ran the create and exited before replying");
        arm_exit_after(&mut cl, Some(weft_proto::Op::Rename));
        cl.restart_mds().await.unwrap();
        let made = create.await.unwrap().unwrap_or_else(|e| panic!("postgres={postgres}: the retried create: {e}"));
        assert_eq!(c.lookup(d, "x").await.unwrap().ino, made.ino, "the reply names the file the first attempt made");

        let renamer = c.clone();
        let rename = tokio::spawn(async move { renamer.rename(d, "x", d, "y", 0).await });
        assert_eq!(cl.wait_mds_exit().await, Some(137), "the MDS ran the rename and exited before replying");
        arm_exit_after(&mut cl, None);
        cl.restart_mds().await.unwrap();
        rename.await.unwrap().unwrap_or_else(|e| panic!("postgres={postgres}: the retried rename: {e}"));
        assert_eq!(c.lookup(d, "y").await.unwrap().ino, made.ino);
        assert!(c.lookup(d, "x").await.is_err(), "the old name is gone");
        let mut names: Vec<String> = c.readdir(d).await.unwrap().into_iter().map(|e| e.name).collect();
        names.retain(|n| n != "." && n != "..");
        assert_eq!(names, ["y"], "one file, made once");
    }
}
