//! Metrics (issue 17): every role of a running cluster serves Prometheus text on its `metrics_listen`, and the
//! counters move with the work done: creates by op at the MDS, journal entries made durable, bytes written at the
//! data servers, errors by op, a mount's FUSE requests by op; `weft top` reads the same endpoints.

use crate::common;

use bytes::Bytes;
use common::mount::Mount;
use common::scrape::{parse, scrape, sum};
use common::{WEFT, start_with, test_dir};
use weft_client::OpenMode;

/// Files created, and bytes written, between the two scrapes.
const CREATES: usize = 20;
const WRITE_BYTES: usize = 3 << 20;

type Samples = Vec<(String, f64)>;

async fn scrape_all(addrs: &[(String, String)]) -> Vec<(String, Samples)> {
    let mut out = Vec::new();
    for (role, addr) in addrs {
        let text = scrape(addr).await.unwrap_or_else(|e| panic!("scraping {role} at {addr}: {e}"));
        out.push((role.clone(), parse(&text)));
    }
    out
}

/// The sum of `name{labels}` over the roles whose name starts with `role`.
fn total(all: &[(String, Samples)], role: &str, name: &str, labels: &[&str]) -> f64 {
    all.iter().filter(|(r, _)| r.starts_with(role)).map(|(_, s)| sum(s, name, labels)).sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_role_serves_metrics_and_the_counters_follow_the_work() {
    let cl = start_with("metrics", 2, |o| o.metrics = true).await;
    let addrs = cl.metrics_addrs();
    let roles: Vec<&str> = addrs.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(roles, ["meta", "data0", "data1"], "one endpoint per role");
    let listed = std::fs::read_to_string(cl.metrics_file()).unwrap();
    for (role, addr) in &addrs {
        assert!(listed.contains(&format!("{role} {addr}\n")), "metrics.txt lists {role}: {listed}");
    }

    let before = scrape_all(&addrs).await;
    assert_eq!(total(&before, "meta", "weft_info", &["role=\"mds\""]), 1.0);
    assert_eq!(total(&before, "data", "weft_info", &["role=\"data\""]), 2.0);

    let c = cl.client().await;
    for i in 0..CREATES {
        c.create(1, &format!("f{i}"), 0o644, true).await.unwrap();
    }
    let missing = c.lookup(1, "no-such-file").await;
    assert!(missing.is_err(), "a lookup of a missing name fails");
    let f = c.create_path("/big", 0o644, true, false).await.unwrap();
    let data: Vec<u8> = (0..WRITE_BYTES).map(|i| (i * 7 + 3) as u8).collect();
    f.write_at(0, Bytes::from(data)).await.unwrap();
    f.close().await.unwrap();
    let back = c.open("/big", OpenMode::Read).await.unwrap();
    let read = back.read_at(0, bytes::BytesMut::zeroed(WRITE_BYTES)).await.unwrap();
    assert_eq!(read.len(), WRITE_BYTES);
    back.close().await.unwrap();

    let after = scrape_all(&addrs).await;
    let grew = |role: &str, name: &str, labels: &[&str]| {
        total(&after, role, name, labels) - total(&before, role, name, labels)
    };
    // The MDS served every create, counted by its op name, and one failed lookup.
    assert!(
        grew("meta", "weft_rpc_server_requests_total", &["op=\"Create\""]) >= CREATES as f64,
        "Create count grew by at least {CREATES}"
    );
    assert!(grew("meta", "weft_rpc_server_requests_errors_total", &["op=\"Lookup\""]) >= 1.0, "the failed lookup");
    assert!(
        grew("meta", "weft_rpc_server_requests_seconds_count", &["op=\"Create\""]) >= CREATES as f64,
        "every create has a latency sample"
    );
    // Each create is a journal entry made durable by some group commit: the groups' sizes add up to at least them.
    assert!(grew("meta", "weft_mds_journal_commits_total", &[]) >= 1.0, "journal commits grew");
    assert!(
        grew("meta", "weft_mds_journal_group_entries_sum", &[]) >= CREATES as f64,
        "the group commits covered every create"
    );
    assert!(total(&after, "meta", "weft_rpc_sessions", &[]) >= 1.0, "our session is held");
    // The data servers took every byte written and sent every byte read, whatever the fabric.
    assert!(
        grew("data", "weft_data_bytes_total", &["direction=\"in\""]) >= WRITE_BYTES as f64,
        "bytes written: {}",
        grew("data", "weft_data_bytes_total", &["direction=\"in\""])
    );
    assert!(grew("data", "weft_data_bytes_total", &["direction=\"out\""]) >= WRITE_BYTES as f64, "bytes read");
    let writes = grew("data", "weft_rpc_server_requests_total", &["op=\"Write\""])
        + grew("data", "weft_rpc_server_requests_total", &["op=\"WriteChunks\""]);
    assert!(writes >= 2.0, "a 3 MiB file over two servers takes at least one write on each: {writes}");
    assert_eq!(grew("data", "weft_data_capability_refusals_total", &[]), 0.0, "no capability was refused");
    assert!(total(&after, "data", "weft_rpc_pool_buffers", &[]) > 0.0, "pool sizes are exported");

    // `weft top` reads the same endpoints and shows every role.
    let out = tokio::process::Command::new(WEFT)
        .args(["top", "--interval-s", "1", "--count", "1", "--from"])
        .arg(cl.dir())
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "weft top: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for role in ["meta", "data0", "data1"] {
        assert!(text.lines().any(|l| l.starts_with(role) && l.contains("req/s")), "top shows {role}: {text}");
    }
    c.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mount_counts_fuse_requests_by_op() {
    let cl = start_with("metrics-mount", 2, |_| {}).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let m = Mount::start(&cl, &test_dir("metrics-mnt"), &["--metrics-listen", &addr]);
    let before = parse(&scrape(&addr).await.unwrap());
    assert_eq!(sum(&before, "weft_info", &["role=\"mount\""]), 1.0);
    let dir = m.path("d");
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("f"), vec![5u8; 200_000]).unwrap();
        assert_eq!(std::fs::read(dir.join("f")).unwrap().len(), 200_000);
        assert!(std::fs::metadata(dir.join("missing")).is_err());
    })
    .await
    .unwrap();
    let after = parse(&scrape(&addr).await.unwrap());
    let grew = |name: &str, op: &str| {
        let l = format!("op=\"{op}\"");
        sum(&after, name, &[&l]) - sum(&before, name, &[&l])
    };
    for op in ["mkdir", "create", "write", "flush"] {
        assert!(grew("weft_fuse_requests_total", op) >= 1.0, "FUSE {op} counted");
        assert!(grew("weft_fuse_requests_seconds_count", op) >= 1.0, "FUSE {op} timed");
    }
    assert!(grew("weft_fuse_requests_errors_total", "lookup") >= 1.0, "the missing name's lookup failed");
    assert_eq!(grew("weft_fuse_requests_errors_total", "write"), 0.0, "no write failed");
    drop(m);
}
