//! Two metadata services on one PostgreSQL database (issue 29, docs/format.md §28), as real processes: both answer
//! clients; the one holding the duty lease runs the duties; `kill -9` of either loses nothing acknowledged, the
//! clients go on at the other without an error, and the duties move to the survivor, which keeps a data server
//! the dead holder fenced fenced.

mod common;

use std::future::ready;

use bytes::Bytes;
use common::members::{status_of, wait_for};
use common::storm::{Storm, check};
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
        o.meta_extra_toml = "liveness_ms = 1500\nduty_lease_ms = 1500\ngc_interval_ms = 200\n".into();
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
