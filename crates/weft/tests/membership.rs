//! Membership against a real cluster (docs/format.md §19): a data server silent for `rebuild_after_ms` is declared
//! failed, the ec file that used it names a spare under a new layout generation, a client that opened the file
//! before goes on reading and writing (it refetches the layout), and the server, restarted, is drained of the
//! object it no longer owns while keeping the one a current layout still names, also across an MDS restart.

use crate::common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::members::*;
use common::*;
use weft_client::{Client, OpenMode};
use weft_proto::{DataRedundancy, ROOT_INO};

const UNIT: u32 = 64 << 10;
/// Not a multiple of a stripe row (2 × 64 KiB): the last row is short.
const FILE_BYTES: usize = 5 * (2 * UNIT as usize) + 7_777;
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_server_is_replaced_by_a_spare_and_drained_when_it_returns() {
    let mut c = start_with("membership", 4, |o| {
        o.rebuild_after_ms = Some(4000);
        o.meta_extra_toml = "liveness_ms = 2000\n".into();
        o.data_extra_toml = "heartbeat_ms = 250\n".into();
    })
    .await;
    let client = c.impatient_client().await;
    let dir = client.mkdir(ROOT_INO, "ec", 0o755).await.unwrap();
    client.set_layout_with(dir.ino, UNIT, 0, DataRedundancy::Ec { k: 2, m: 1 }).await.unwrap();

    let model = pattern(5, 0, FILE_BYTES);
    let f = client.create_path("/ec/f", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::copy_from_slice(&model)).await.unwrap();
    let ino = f.ino();
    f.close().await.unwrap();
    // Opened before the failure: it holds generation 0.
    let old = client.open("/ec/f", OpenMode::ReadWrite).await.unwrap();
    let before = old.layout();
    assert_eq!((before.generation, before.servers.len()), (0, 3));
    // The parity slot's server fails: its slot moves to the spare, marked stale whole, and the healer rebuilds it.
    let victim = before.servers[2];
    let spare = (0..4).find(|s| !before.servers.contains(s)).unwrap();

    // A plain file striped over every server: its object on the victim is still named after the failure.
    let plain = client.mkdir(ROOT_INO, "plain", 0o755).await.unwrap();
    client.set_layout_with(plain.ino, UNIT, 0, DataRedundancy::Plain).await.unwrap();
    let g = client.create_path("/plain/g", 0o644, true, false).await.unwrap();
    let plain_model = pattern(6, 0, 4 * UNIT as usize);
    g.write_at(0, Bytes::copy_from_slice(&plain_model)).await.unwrap();
    let g_ino = g.ino();
    assert!(g.layout().servers.contains(&victim));
    g.close().await.unwrap();
    assert!(object_path(&c.data_root(victim), ino).exists());
    assert!(object_path(&c.data_root(victim), g_ino).exists());

    c.stop_data_server(victim).await;
    let cl = &client;
    wait_for("the layout to move to a spare", || async move { generation(cl, ino).await >= 1 }).await;
    let now = client.getattr(ino).await.unwrap().layout.unwrap();
    assert_eq!(now.generation, 1);
    assert_eq!(now.servers, vec![before.servers[0], before.servers[1], spare], "only the failed slot moved");
    let (ok, out, err) = weft(&c, &["stat", "/ec/f"]);
    assert!(ok && out.contains("generation 1"), "weft stat: {out}{err}");
    let lc: &weft_launch::LocalCluster = &c;
    wait_for("the victim to be shown replaced", || async move { status_of(lc, victim) == "replaced" }).await;
    let (ok, out, _) = weft(&c, &["status"]);
    assert!(ok && out.contains("rebuild: "), "weft status shows the rebuild line: {out}");
    // An MDS killed and restarted remembers the phase (format §6 `server_phases`): the victim is still replaced, so
    // when it returns below it is drained and fenced, not taken back as a member serving its old objects.
    c.kill_mds().await;
    c.restart_mds().await.unwrap();
    assert_eq!(status_of(&c, victim), "replaced", "the phase survives an MDS restart");
    // This impatient client (one attempt per call) learns of the restart from one refused call, which drops the
    // lost session; its next call opens a new one and is served.
    let lost = client.getattr(ROOT_INO).await.map(|_| ()).unwrap_err();
    assert_eq!(lost.code(), Some(weft_proto::ErrorCode::StaleSession), "{lost}");
    assert_eq!(client.getattr(ROOT_INO).await.unwrap().ino, ROOT_INO, "the next call runs on a new session");
    // The plain file keeps its layout (its bytes exist once).
    assert_eq!(client.getattr(g_ino).await.unwrap().layout.unwrap().generation, 0);

    // The handle opened before writes on without an error: on its old layout the stopped server's chunk is
    // recorded stale (the slot is stale whole already) and the healer rebuilds it on the spare.
    let patch = pattern(7, 0, 3 * UNIT as usize / 2);
    let at = UNIT as usize / 3;
    old.write_at(at as u64, Bytes::copy_from_slice(&patch)).await.unwrap();
    let mut want = model.clone();
    want[at..at + patch.len()].copy_from_slice(&patch);
    let got = old.read_at(0, BytesMut::zeroed(FILE_BYTES)).await.unwrap();
    assert!(got[..] == want[..], "read through the refetched layout");
    old.close().await.unwrap();
    let fresh = c.impatient_client().await;
    let r = fresh.open("/ec/f", OpenMode::Read).await.unwrap();
    assert!(r.read_at(0, BytesMut::zeroed(FILE_BYTES)).await.unwrap()[..] == want[..], "a new client reads it");

    // The victim returns after its replacement: drained of the ec file's object, not of the plain file's.
    c.restart_data_server(victim).await.unwrap();
    let lc: &weft_launch::LocalCluster = &c;
    let gone = object_path(&lc.data_root(victim), ino);
    let gone = &gone;
    wait_for("the victim to be drained", || async move { !gone.exists() }).await;
    wait_for("the victim to serve as a spare", || async move { status_of(lc, victim) == "spare" }).await;
    assert!(object_path(&c.data_root(victim), g_ino).exists(), "an object a current layout names is kept");
    let g = fresh.open("/plain/g", OpenMode::Read).await.unwrap();
    // The victim serves clients again once its next heartbeat's reply says Spare (format §19, fencing): until then
    // it answers StaleLayout, so the read is retried until it is served, and must then be right.
    let (gr, pm) = (&g, &plain_model);
    wait_for("the victim to serve clients as a spare", || async move {
        match gr.read_at(0, BytesMut::zeroed(pm.len())).await {
            Ok(got) => {
                assert!(got[..] == pm[..], "the plain file reads back equal");
                true
            }
            Err(e) => {
                assert_eq!(e.code(), Some(weft_proto::ErrorCode::StaleLayout), "{e}");
                false
            }
        }
    })
    .await;
    assert!(c.log("meta").contains("data server declared failed"), "the MDS says why");

    // The rebuild onto the spare completes (the stale table empties), then a data slot's server is lost too: the
    // row decodes from the other data chunk and the parity the healer rebuilt on the spare.
    let fc = &fresh;
    wait_for("the rebuild onto the spare", || async move {
        fc.list_stale(None, None, 0).await.is_ok_and(|p| p.entries.is_empty())
    })
    .await;
    assert!(object_path(&c.data_root(spare), ino).exists(), "the rebuild wrote the spare's chunks");
    c.stop_data_server(before.servers[0]).await;
    let again = c.impatient_client().await;
    let r = again.open("/ec/f", OpenMode::Read).await.unwrap();
    assert!(
        r.read_at(0, BytesMut::zeroed(FILE_BYTES)).await.unwrap()[..] == want[..],
        "read back equal from the rebuilt parity with a data server down"
    );
}

/// Writes `model` to `path` (a new file) and returns its layout's servers.
async fn put(c: &Client, path: &str, model: &[u8]) -> Vec<u32> {
    let f = c.create_path(path, 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::copy_from_slice(model)).await.unwrap();
    let servers = f.layout().servers.clone();
    f.close().await.unwrap();
    servers
}

/// Each data server's ec rows written (`weft_data_ec_rows_written_total`), by role (`data{id}`), but `victim`'s.
async fn ec_rows_written(addrs: &[(String, String)], victim: u32) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for (role, addr) in addrs.iter().filter(|(r, _)| r.starts_with("data") && *r != format!("data{victim}")) {
        let text = common::scrape::scrape(addr).await.unwrap_or_else(|e| panic!("scraping {role} at {addr}: {e}"));
        let s = common::scrape::parse(&text);
        out.push((role.clone(), common::scrape::sum(&s, "weft_data_ec_rows_written_total", &[])));
    }
    out
}

/// The server is killed with `kill -9` and stays down: the rebuild onto the spare completes without it, writing
/// ec rows to the spares only (a rebuilt chunk is written alone, docs/format.md §18), then two more servers are
/// killed and every file (two ec 4+2, one mirror 2) still reads back equal — which for the rows whose surviving
/// chunks include the spare's needs the rebuilt chunks to be right.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_server_that_stays_down_is_rebuilt_onto_the_spare_and_every_file_survives_two_more_kills() {
    let mut c = start_with("membership-down", 7, |o| {
        o.metrics = true;
        o.rebuild_after_ms = Some(3000);
        o.meta_extra_toml = "liveness_ms = 1500\n".into();
        o.data_extra_toml = "heartbeat_ms = 250\n".into();
    })
    .await;
    let client = c.impatient_client().await;
    let ec = client.mkdir(ROOT_INO, "ec", 0o755).await.unwrap();
    client.set_layout_with(ec.ino, UNIT, 0, DataRedundancy::Ec { k: 4, m: 2 }).await.unwrap();
    let m = client.mkdir(ROOT_INO, "m", 0o755).await.unwrap();
    client.set_layout_with(m.ino, UNIT, 0, DataRedundancy::Mirror { n: 2 }).await.unwrap();
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("/ec/a", pattern(11, 0, 3 * 4 * UNIT as usize + 4_321)),
        ("/ec/b", pattern(12, 0, 5 * 4 * UNIT as usize)),
        ("/m/c", pattern(13, 0, 700_001)),
    ];
    let mut layouts = Vec::new();
    for (path, model) in &files {
        layouts.push(put(&client, path, model).await);
    }
    // The victim: a data slot of /ec/a that the mirror uses too when it can.
    let victim = *layouts[0][..4].iter().find(|s| layouts[2].contains(s)).unwrap_or(&layouts[0][1]);
    let addrs = c.metrics_addrs();
    let written_before = ec_rows_written(&addrs, victim).await;
    c.kill_data_server(victim).await;

    // Every file that used the victim moves to a new generation without it, and the rebuild (the stale table
    // emptying) completes while the victim stays down.
    let cl = &client;
    for ((path, _), before) in files.iter().zip(&layouts) {
        if !before.contains(&victim) {
            continue;
        }
        let ino = client.resolve(path).await.unwrap().ino;
        wait_for(&format!("{path} to move to a spare"), || async move { generation(cl, ino).await >= 1 }).await;
    }
    let healed = || async move {
        cl.heal_now().await.is_ok() && cl.list_stale(None, None, 0).await.is_ok_and(|p| p.entries.is_empty())
    };
    let start = tokio::time::Instant::now();
    while !healed().await {
        if start.elapsed() > Duration::from_millis(WAIT_MS) {
            let left = client.list_stale(None, None, 0).await.map(|p| p.entries);
            let log = c.log("meta");
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!("the rebuild onto the spare did not complete: {left:?}\n{}", tail.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lc: &weft_launch::LocalCluster = &c;
    wait_for("the victim to be shown replaced", || async move { status_of(lc, victim) == "replaced" }).await;
    let mut now = Vec::new();
    for (path, _) in &files {
        let ino = client.resolve(path).await.unwrap().ino;
        let l = client.getattr(ino).await.unwrap().layout.unwrap();
        assert!(!l.servers.contains(&victim), "{path}: {l:?}");
        now.push(l.servers);
    }
    // The ec files' spares (the mirror's copies are not ec rows).
    let moved = now.iter().zip(&layouts).take(2).flat_map(|(n, b)| n.iter().filter(|s| !b.contains(s)));
    let spares: Vec<String> = moved.map(|s| format!("data{s}")).collect();
    let written_after = ec_rows_written(&addrs, victim).await;
    for ((role, before), (_, after)) in written_before.iter().zip(&written_after) {
        match spares.contains(role) {
            false => assert_eq!(after, before, "{role} is no ec file's spare: the rebuild wrote no ec row to it"),
            true => assert!(after > before, "{role}, a spare, was written its rebuilt chunks"),
        }
    }

    // Two more servers die: a data slot of /ec/a other than its spare, and /ec/a's first parity slot (so /ec/a
    // must decode from the spare's chunks); one of them is a copy of the mirror when it can be, never both.
    let spare = *now[0].iter().find(|s| !layouts[0].contains(s)).unwrap();
    let mirror = &now[2];
    let pairs = now[0][..4]
        .iter()
        .flat_map(|&d| now[0][4..].iter().map(move |&p| (d, p)))
        .filter(|&(d, p)| d != spare && p != spare && !(mirror.contains(&d) && mirror.contains(&p)));
    let (first, second) = pairs
        .max_by_key(|(d, p)| mirror.contains(d) || mirror.contains(p))
        .expect("a data slot and a parity slot besides the spare");
    c.kill_data_server(first).await;
    c.kill_data_server(second).await;
    let reader = c.impatient_client().await;
    for (path, model) in &files {
        let f = reader.open(path, OpenMode::Read).await.unwrap();
        let got = f.read_at(0, BytesMut::zeroed(model.len())).await.unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(got[..] == model[..], "{path} reads back equal with {victim}, {first} and {second} down");
    }
}
