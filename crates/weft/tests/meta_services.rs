//! Two metadata services on one PostgreSQL database (issue 29, docs/format.md §28), as real processes: both answer
//! clients; the one holding the duty lease runs the duties; `kill -9` of either loses nothing acknowledged, the
//! clients go on at the other without an error, and the duties move to the survivor, which keeps a data server
//! the dead holder fenced fenced.

use crate::common;

use std::future::ready;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::Bytes;
use common::members::{status_of, wait_for};
use common::mount::Mount;
use common::storm::{FILE_BYTES, Storm, check};
use common::*;
use weft_client::OpenMode;
use weft_proto::ROOT_INO;

const WRITERS: usize = 4;

/// Two services, a short duty lease so the duties move within seconds, and membership in seconds.
async fn two_services(name: &str, servers: u32) -> TestCluster {
    start_with(name, servers, |o| {
        o.postgres = true;
        o.meta_services = 2;
        o.rebuild_after_ms = Some(3000);
        o.meta_extra_toml =
            "liveness_ms = 1500\nduty_lease_ms = 1500\ngc_interval_ms = 200\nlocks_orphan_ms = 3000\n".into();
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn writers_ride_out_the_kill_of_either_service_and_the_duties_move_to_the_survivor() {
    let mut cl = two_services("meta-services-storm", 3).await;
    assert_eq!(cl.mds_addrs().len(), 2);
    let c = cl.client().await;
    let dir = c.mkdir(ROOT_INO, "d", 0o755).await.unwrap().ino;
    let mut clients = Vec::new();
    for _ in 0..WRITERS {
        clients.push(cl.client().await);
    }
    let storm = Storm::start(clients, dir);
    wait_for("writes before any kill", || ready(storm.total() >= 100 || storm.failed())).await;
    // Each service in turn: killed mid-storm, the writers go on at the other; then it comes back.
    for victim in [0, 1] {
        cl.kill_meta_service(victim).await;
        let during = storm.total();
        wait_for("writes with one service dead", || ready(storm.total() >= during + 100 || storm.failed())).await;
        cl.restart_meta_service(victim).await.unwrap();
    }
    let counts = storm.stop().await;
    check(&c, "d", &counts).await;
    namespace_is_a_tree(&cl);

    // The duties follow the survivor, whichever service held them: a removed file's objects are collected,
    // which only the duty holder does, with either service dead.
    for (victim, survivor) in [(0, "meta1"), (1, "meta")] {
        cl.kill_meta_service(victim).await;
        let name = format!("orphan-{victim}");
        let a = c.create(dir, &name, 0o644, false).await.unwrap();
        let f = c.open_ino(a.ino, OpenMode::Write).await.unwrap();
        f.write_at(0, Bytes::from(vec![7u8; 3 << 20])).await.unwrap();
        f.close().await.unwrap();
        let objects = || (0..3).filter(|i| object_path(&cl.data_root(*i), a.ino).exists()).count();
        assert!(objects() > 0, "the file's objects are on the data servers");
        c.unlink(dir, &name).await.unwrap();
        wait_for("the surviving service to collect the removed file's objects", || ready(objects() == 0)).await;
        assert!(cl.log(survivor).contains("holding the duty lease"), "{survivor} says it holds the duties");
        cl.restart_meta_service(victim).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_server_the_holder_declared_failed_stays_fenced_when_the_holder_dies() {
    let mut cl = two_services("meta-services-fence", 3).await;
    let victim = 2;
    cl.stop_data_server(victim).await;
    let lc = &cl;
    wait_for("the holder to declare the victim replaced", || async move { status_of(lc, victim) == "replaced" }).await;
    // The holder (service 0, the first to start) dies; the victim returns and is heard only by service 1, whose
    // memory saw it a member: the phase comes from the database, so it is drained, never served as it was.
    cl.kill_meta_service(0).await;
    cl.restart_data_server(victim).await.unwrap();
    let state = status_of(&cl, victim);
    assert!(state == "draining" || state == "spare", "the returned server is {state}, not served as before");
    // Draining ends only by the duty holder's drain: service 1 took the duties.
    let lc = &cl;
    wait_for("service 1 to drain the victim into a spare", || async move { status_of(lc, victim) == "spare" }).await;
    assert!(cl.log("meta1").contains("holding the duty lease"));
}

/// A client of service `i` only.
async fn pinned(cl: &TestCluster, i: usize) -> weft_client::Client {
    let mut cfg = cl.cluster_config();
    cfg.mds = cl.mds_addrs()[i].clone();
    weft_client::Client::connect(&cfg).await.unwrap()
}

fn outcome<T>(r: &Result<T, weft_client::ClientError>) -> Option<weft_proto::ErrorCode> {
    r.as_ref().err().map(|e| e.code().unwrap_or_else(|| panic!("an error without a code: {e}")))
}

#[tokio::test(flavor = "multi_thread")]
async fn two_services_racing_on_the_same_names_keep_a_tree_and_one_winner() {
    use weft_proto::ErrorCode;
    const ROUNDS: usize = 40;
    let cl = two_services("meta-services-race", 1).await;
    let (a, b) = (pinned(&cl, 0).await, pinned(&cl, 1).await);
    for n in 0..ROUNDS {
        let r = a.mkdir(ROOT_INO, &format!("r{n}"), 0o755).await.unwrap().ino;
        let x = a.mkdir(r, "x", 0o755).await.unwrap().ino;
        let y = b.mkdir(r, "y", 0o755).await.unwrap().ino;
        // x into y at one service, y into x at the other: both applied would detach a cycle from the tree.
        let (ra, rb) = tokio::join!(a.rename(r, "x", y, "x", 0), b.rename(r, "y", x, "y", 0));
        let won = [outcome(&ra), outcome(&rb)];
        assert_eq!(won.iter().filter(|o| o.is_none()).count(), 1, "round {n}: exactly one move wins: {won:?}");
        let loser = won.into_iter().flatten().next().unwrap();
        assert!(matches!(loser, ErrorCode::Invalid | ErrorCode::NotFound), "round {n}: the other fails: {loser:?}");
        let top: Vec<String> = a.readdir(r).await.unwrap().into_iter().map(|e| e.name).collect();
        let (outer, inner, inner_name) = if ra.is_ok() { (y, x, "x") } else { (x, y, "y") };
        assert_eq!(top, [if ra.is_ok() { "y" } else { "x" }], "round {n}");
        let below: Vec<u64> = b.readdir(outer).await.unwrap().into_iter().map(|e| e.ino).collect();
        assert_eq!(below, [inner], "round {n}: {inner_name} sits in the other, reachable");

        // One name created exclusively at both services at once: one create wins, the other sees it.
        let (ca, cb) = tokio::join!(a.create(r, "same", 0o644, true), b.create(r, "same", 0o644, true));
        let codes = [outcome(&ca), outcome(&cb)];
        assert!(codes.contains(&None) && codes.contains(&Some(ErrorCode::Exists)), "round {n}: {codes:?}");
        let winner = ca.as_ref().or(cb.as_ref()).unwrap().ino;
        assert_eq!(b.lookup(r, "same").await.unwrap().ino, winner, "round {n}: the name is the winner's");

        // One file renamed to two names at once: it ends under exactly one of them.
        let f = a.create(r, "f", 0o644, true).await.unwrap().ino;
        let (ma, mb) = tokio::join!(a.rename(r, "f", r, "g", 0), b.rename(r, "f", r, "h", 0));
        assert_eq!([ma.is_ok(), mb.is_ok()].iter().filter(|ok| **ok).count(), 1, "round {n}: one rename of f wins");
        let names: Vec<(String, u64)> = a.readdir(r).await.unwrap().into_iter().map(|e| (e.name, e.ino)).collect();
        assert_eq!(names.iter().filter(|(_, ino)| *ino == f).count(), 1, "round {n}: f under one name: {names:?}");
        assert_eq!(a.getattr(f).await.unwrap().nlink, 1, "round {n}");
    }
    namespace_is_a_tree(&cl);
}

/// `weft meta check` on the cluster's database, while its services run: link counts, parents, reachability.
fn namespace_is_a_tree(cl: &TestCluster) {
    let url = cl.postgres_url().expect("a cluster on PostgreSQL");
    let out = std::process::Command::new(common::WEFT).args(["meta", "check", "--store", url]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("is a tree"), "weft meta check: {text}");
}

/// A writer on the kernel mount: writes `t{w}-{i}` whole, renames it to `w{w}-{i}`, until told to stop; every
/// step a plain system call an application makes (no retry here: an error is the test's failure).
fn mount_writer(dir: std::path::PathBuf, w: usize, stop: &AtomicBool, acked: &AtomicUsize) -> Result<(), String> {
    for i in 0.. {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let (tmp, name) = (dir.join(format!("t{w}-{i:05}")), dir.join(format!("w{w}-{i:05}")));
        let data = pattern((w * 100_000 + i) as u64, 0, FILE_BYTES);
        std::fs::write(&tmp, &data).map_err(|e| format!("write {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &name).map_err(|e| format!("rename {}: {e}", tmp.display()))?;
        acked.fetch_add(1, Ordering::SeqCst);
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread")]
async fn writers_on_the_mount_ride_out_the_kill_of_either_service() {
    let mut cl = two_services("meta-services-mount", 3).await;
    let c = cl.client().await;
    c.mkdir(ROOT_INO, "m", 0o777).await.unwrap();
    let mnt = Mount::start(&cl, &cl.dir.join("mnt"), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Vec<Arc<AtomicUsize>> = (0..WRITERS).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (dir, stop, acked) = (mnt.path("m"), stop.clone(), acked[w].clone());
            std::thread::spawn(move || mount_writer(dir, w, &stop, &acked))
        })
        .collect();
    let total = || acked.iter().map(|a| a.load(Ordering::SeqCst)).sum::<usize>();
    let failed = || threads.iter().any(|t| t.is_finished());
    wait_for("writes on the mount before any kill", || ready(total() >= 50 || failed())).await;
    for victim in [0, 1] {
        cl.kill_meta_service(victim).await;
        let during = total();
        wait_for("writes on the mount with one service dead", || ready(total() >= during + 50 || failed())).await;
        cl.restart_meta_service(victim).await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap().unwrap_or_else(|e| panic!("an application on the mount saw an error: {e}"));
    }
    let counts: Vec<usize> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    // Every acknowledged file, read through the native client and through the mount; no temporary name is left.
    check(&c, "m", &counts).await;
    for (w, &n) in counts.iter().enumerate() {
        for i in 0..n {
            let back = std::fs::read(mnt.path(&format!("m/w{w}-{i:05}"))).unwrap();
            assert_eq!(back, pattern((w * 100_000 + i) as u64, 0, FILE_BYTES), "w{w}-{i:05} through the mount");
        }
    }
    let left: usize = counts.iter().sum();
    let names = std::fs::read_dir(mnt.path("m")).unwrap().count();
    assert_eq!(names, left, "exactly the acknowledged files, no temporary left: {counts:?}");
    drop(mnt);
}

#[tokio::test(flavor = "multi_thread")]
async fn locks_exclude_across_services_and_outlive_the_service_that_granted_them() {
    use weft_proto::msg::{LockClass, LockKind, SetLockReq};
    let mut cl = two_services("meta-services-locks", 1).await;
    let x = cl.client().await; // starts at service 0, fails over to 1
    let y = pinned(&cl, 1).await;
    let f = x.create(ROOT_INO, "f", 0o666, true).await.unwrap().ino;
    let lock =
        |owner, kind, start, end| SetLockReq { ino: f, owner, class: LockClass::Posix, kind, start, end, pid: 1 };
    let flock = |owner, kind| SetLockReq { class: LockClass::Flock, ..lock(owner, kind, 0, u64::MAX) };
    assert_eq!(x.set_lock(lock(1, Some(LockKind::Exclusive), 0, 99)).await.unwrap(), None);
    assert_eq!(x.set_lock(flock(2, Some(LockKind::Exclusive))).await.unwrap(), None);
    let before = x.mds_session();
    // Granted at service 0, they exclude at service 1 ...
    let held = y.set_lock(lock(9, Some(LockKind::Shared), 50, 50)).await.unwrap();
    assert_eq!(held.map(|h| (h.start, h.end)), Some((0, 99)), "a lock granted at one service excludes at the other");
    assert!(y.set_lock(flock(9, Some(LockKind::Shared))).await.unwrap().is_some());
    // ... and still do once it is dead.
    cl.kill_meta_service(0).await;
    assert!(y.set_lock(lock(9, Some(LockKind::Exclusive), 0, 0)).await.unwrap().is_some(), "held after the kill");
    // Its holder comes back on a new session at service 1, takes its locks over and extends them: its own old
    // locks never stand in its way.
    assert_eq!(x.set_lock(lock(1, Some(LockKind::Exclusive), 100, 199)).await.unwrap(), None);
    assert_ne!(x.mds_session(), before, "the holder failed over to a new session");
    for (start, end) in [(50, 50), (150, 150)] {
        let h = y.set_lock(lock(9, Some(LockKind::Shared), start, end)).await.unwrap();
        assert_eq!(h.map(|h| (h.start, h.end)), Some((0, 199)), "[{start}, {end}] after the failover");
    }
    assert!(y.set_lock(flock(9, Some(LockKind::Shared))).await.unwrap().is_some(), "the flock lock moved too");
    // Its unlock reaches the locks it took before the failover.
    assert_eq!(x.release_locks(Some(f), None).await.unwrap(), 2);
    assert_eq!(y.set_lock(lock(9, Some(LockKind::Exclusive), 0, u64::MAX)).await.unwrap(), None);
    assert_eq!(y.set_lock(flock(9, Some(LockKind::Exclusive))).await.unwrap(), None);

    // A client that dies with its service never adopts its locks: they still exclude, until the duty holder
    // sees that service silent for locks_orphan_ms and releases them.
    cl.restart_meta_service(0).await.unwrap();
    let z = pinned(&cl, 0).await;
    let g = z.create(ROOT_INO, "g", 0o666, true).await.unwrap().ino;
    let on_g = SetLockReq { ino: g, ..lock(1, Some(LockKind::Exclusive), 0, u64::MAX) };
    assert_eq!(z.set_lock(on_g.clone()).await.unwrap(), None);
    cl.kill_meta_service(0).await;
    drop(z);
    let mine = SetLockReq { owner: 9, ..on_g };
    assert!(y.set_lock(mine.clone()).await.unwrap().is_some(), "held right after its service died");
    let (yr, req) = (&y, &mine);
    wait_for("the dead service's orphaned lock to be released", || async move {
        yr.set_lock(req.clone()).await.unwrap().is_none()
    })
    .await;
    assert!(cl.log("meta1").contains("whose metadata service is gone"), "the release is logged");
    cl.restart_meta_service(0).await.unwrap();
}
