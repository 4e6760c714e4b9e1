//! The database's own loss (issue 29, must-have 4): the namespace on a PostgreSQL primary with a synchronous
//! standby (streaming replication; a commit returns once the standby has it on disk). Writers storm; the primary
//! is killed (`kill -9`) and the standby promoted (`pg_ctl promote`). The metadata service, whose `db` names both
//! servers with `target_session_attrs=read-write`, waits for the promoted one (`db_failover_timeout_ms`); a change
//! whose commit outcome died with the primary is settled by its once record. The writers go on with no error, and
//! every acknowledged file is there, whole.

use crate::common;

use std::future::ready;

use common::members::wait_for;
use common::storm::{Storm, check};
use common::*;
use weft_launch::postgres;
use weft_proto::ROOT_INO;

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_primary_with_its_synchronous_standby_promoted_loses_nothing_acknowledged() {
    let pg = test_dir("db-failover-pg");
    let (primary_dir, standby_dir) = (pg.join("primary"), pg.join("standby"));
    let mut primary = postgres::start(&primary_dir, &pg.join("primary.log"), 60_000)
        .await
        .unwrap_or_else(|e| panic!("the primary: {e}"));
    let mut standby = postgres::start_standby(&primary_dir, &standby_dir, &pg.join("standby.log"), 60_000)
        .await
        .unwrap_or_else(|e| panic!("the standby: {e}"));
    postgres::require_synchronous_standby(&primary_dir).await.unwrap();
    let db = format!(
        "host={},{} user=weft dbname=weft target_session_attrs=read-write",
        primary_dir.display(),
        standby_dir.display()
    );
    let cl = start_with("db-failover", 2, |o| {
        o.postgres = false;
        o.meta_extra_toml = format!("db = {db:?}\n");
    })
    .await;
    let c = cl.client().await;
    let dir = c.mkdir(ROOT_INO, "d", 0o755).await.unwrap().ino;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(cl.client().await);
    }
    let storm = Storm::start(clients, dir);
    wait_for("writes on the primary", || ready(storm.total() >= 100 || storm.failed())).await;

    primary.kill().await.unwrap();
    let at_kill = storm.total();
    postgres::promote(&standby_dir).await.unwrap_or_else(|e| panic!("promoting the standby: {e}"));
    wait_for("writes on the promoted standby", || ready(storm.total() >= at_kill + 100 || storm.failed())).await;
    let counts = storm.stop().await;
    check(&c, "d", &counts).await;
    drop(cl);
    let _ = standby.kill().await;
    let _ = std::fs::remove_dir_all(&pg);
}
