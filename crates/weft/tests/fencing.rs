//! Stale-layout fencing against a real cluster (docs/format.md §19, "Fencing"): a data server serves client I/O
//! only under an unexpired `Up` lease from the MDS's heartbeat replies. A server replaced by a spare that comes back
//! refuses a stale client's write with `StaleLayout`, so the client refetches the layout and the write lands on the
//! spare (a truncate as well); a server cut off from the MDS stops serving once its lease lapses and serves again
//! when the MDS answers.

use crate::common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::members::*;
use common::*;
use weft_client::OpenMode;
use weft_proto::{DataRedundancy, ErrorCode, ROOT_INO};

const UNIT: u32 = 64 << 10;
const FILE_BYTES: usize = 4 * (2 * UNIT as usize) + 1_234;
/// A data server declared failed and replaced by a spare is restarted while a client still holds the layout that
/// names it: the client's write is refused there (`StaleLayout`), the client refetches and the write goes to the
/// spare; every byte reads back right, scrub finds the file consistent, and the revived server's object did not
/// take the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replaced_server_that_returns_refuses_a_stale_write_which_goes_to_the_spare() {
    let mut c = start_with("fencing-replaced", 4, |o| {
        o.rebuild_after_ms = Some(3000);
        o.meta_extra_toml = "liveness_ms = 1500\n".into();
        o.data_extra_toml = "heartbeat_ms = 250\n".into();
    })
    .await;
    let client = c.impatient_client().await;
    let dir = client.mkdir(ROOT_INO, "ec", 0o755).await.unwrap();
    client.set_layout_with(dir.ino, UNIT, 0, DataRedundancy::Ec { k: 2, m: 1 }).await.unwrap();
    let model = pattern(31, 0, FILE_BYTES);
    let f = client.create_path("/ec/f", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::copy_from_slice(&model)).await.unwrap();
    let ino = f.ino();
    f.close().await.unwrap();

    // Opened before the failure: this handle holds generation 0, which names the victim (data slot 0).
    let stale = client.open("/ec/f", OpenMode::ReadWrite).await.unwrap();
    let stale_truncate = client.open("/ec/f", OpenMode::ReadWrite).await.unwrap();
    let before = stale.layout();
    assert_eq!(before.generation, 0);
    let victim = before.servers[0];
    let spare = (0..4).find(|s| !before.servers.contains(s)).unwrap();

    // A plain file striped over every server, to see the victim's answer without touching the ec file.
    let plain = client.mkdir(ROOT_INO, "plain", 0o755).await.unwrap();
    client.set_layout_with(plain.ino, UNIT, 0, DataRedundancy::Plain).await.unwrap();
    let p = client.create_path("/plain/p", 0o644, true, false).await.unwrap();
    p.write_at(0, Bytes::copy_from_slice(&model[..4 * UNIT as usize])).await.unwrap();
    assert!(p.layout().servers.contains(&victim));
    p.close().await.unwrap();

    c.stop_data_server(victim).await;
    let victim_object = object_path(&c.data_root(victim), ino);
    let victim_bytes = std::fs::read(&victim_object).expect("the victim's chunk 0 object");
    let cl = &client;
    wait_for("the layout to move to the spare", || async move { generation(cl, ino).await >= 1 }).await;
    let lc: &weft_launch::LocalCluster = &c;
    wait_for("the victim to be shown replaced", || async move { status_of(lc, victim) == "replaced" }).await;
    wait_for("the rebuild onto the spare", || async move {
        cl.heal_now().await.is_ok() && cl.list_stale(None, None, 0).await.is_ok_and(|p| p.entries.is_empty())
    })
    .await;

    // The victim returns: the MDS answers its heartbeat `Draining`, so it serves no client. Every `ListObjects`
    // (224) reply it sends is dropped, so its drain never ends and it stays Draining for the rest of the test.
    c.set_env(vec![("WEFT_FAULT".into(), "drop-after-execute:224:1000000".into())]);
    c.restart_data_server(victim).await.unwrap();
    c.set_env(vec![]);
    assert_eq!(status_of(&c, victim), "draining");
    assert_eq!(stale.layout().generation, 0, "the handle still holds the old layout");
    // The client's session with the old process is gone: reading the plain file (a stripe on every server) is
    // refused by the victim, once the client is connected to the new process, with StaleLayout.
    let p = client.open("/plain/p", OpenMode::Read).await.unwrap();
    let pr = &p;
    let start = tokio::time::Instant::now();
    let refused = loop {
        match pr.read_at(0, BytesMut::zeroed(4 * UNIT as usize)).await {
            Err(e) if e.code() == Some(ErrorCode::StaleLayout) => break e,
            other => assert!(start.elapsed() < Duration::from_millis(WAIT_MS), "the victim served: {:?}", other.err()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(refused.to_string().contains(&format!("data server {victim} not Up at the MDS (Draining)")), "{refused}");

    // The stale handle writes across row 0's two data chunks (chunk 0 on the victim in its layout).
    let patch = pattern(32, 0, 3 * UNIT as usize / 2);
    let at = UNIT as usize / 3;
    stale.write_at(at as u64, Bytes::copy_from_slice(&patch)).await.unwrap();
    // Sent now (an ec file holds a partial row until then).
    stale.flush().await.unwrap();
    let mut want = model.clone();
    want[at..at + patch.len()].copy_from_slice(&patch);
    let now = stale.layout();
    assert_eq!((now.generation, now.servers[0]), (1, spare), "the handle refetched the layout: slot 0 is the spare");
    stale.close().await.unwrap();
    let log = c.log(&format!("data{victim}"));
    assert!(log.contains("refusing client I/O with StaleLayout"), "the victim refused the stale write:\n{log}");

    // Every byte reads back right from the new layout, through a fresh client.
    let fresh = c.impatient_client().await;
    let r = fresh.open("/ec/f", OpenMode::Read).await.unwrap();
    assert!(r.read_at(0, BytesMut::zeroed(FILE_BYTES)).await.unwrap()[..] == want[..], "read back equal");
    // Scrub checks every row's chunks against its parity: had the spare missed the write, row 0 would not agree.
    let (ok, out, err) = weft(&c, &["scrub", "/ec"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains(" 0 inconsistencies"), "scrub finds the file consistent: {out}");
    // The revived server's stale object did not take the write (its drain is held back: it is still there).
    assert_eq!(status_of(&c, victim), "draining");
    assert!(
        std::fs::read(&victim_object).unwrap() == victim_bytes,
        "the victim's object changed after its replacement"
    );
    // A truncate through another handle still on generation 0 (into the last row, so the row is rewritten): the
    // victim refuses it, the handle refetches and truncates on the spare's layout.
    assert_eq!(stale_truncate.layout().generation, 0);
    let cut = FILE_BYTES - UNIT as usize / 2 - 100;
    stale_truncate.truncate(cut as u64).await.unwrap();
    assert_eq!(stale_truncate.layout().generation, 1, "the truncate refetched the layout");
    stale_truncate.close().await.unwrap();
    want.truncate(cut);
    assert!(std::fs::read(&victim_object).unwrap() == victim_bytes, "the victim's object took the truncate");
    let (ok, out, err) = weft(&c, &["scrub", "/ec"]);
    assert!(ok && out.contains(" 0 inconsistencies"), "scrub after the truncate: {out}{err}");
    // With the spare's data chunk lost too, the row decodes from chunk 1 and the parity: they agree with the write.
    c.stop_data_server(spare).await;
    let again = c.impatient_client().await;
    let r = again.open("/ec/f", OpenMode::Read).await.unwrap();
    assert_eq!(r.size(), cut as u64);
    assert!(r.read_at(0, BytesMut::zeroed(cut)).await.unwrap()[..] == want[..], "decoded without the spare");
}

/// A data server whose MDS is stopped refuses client I/O with `StaleLayout` once its lease lapses (half the MDS's
/// `rebuild_after_ms` here), and serves again as soon as the restarted MDS answers its heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_cut_off_from_the_mds_stops_serving_after_its_lease_and_serves_again() {
    let mut c = start_with("fencing-lease", 2, |o| {
        o.rebuild_after_ms = Some(4000);
        o.meta_extra_toml = "liveness_ms = 1500\n".into();
        o.data_extra_toml = "heartbeat_ms = 250\n".into();
    })
    .await;
    // A patient client: its MDS connection must come back after the restart.
    let client = c.client().await;
    let dir = client.mkdir(ROOT_INO, "plain", 0o755).await.unwrap();
    client.set_layout_with(dir.ino, UNIT, 0, DataRedundancy::Plain).await.unwrap();
    let model = pattern(41, 0, 4 * UNIT as usize);
    let f = client.create_path("/plain/p", 0o644, true, false).await.unwrap();
    assert_eq!(f.layout().servers.len(), 2, "striped over both servers");
    f.write_at(0, Bytes::copy_from_slice(&model)).await.unwrap();
    f.sync().await.unwrap();
    assert!(f.read_at(0, BytesMut::zeroed(model.len())).await.unwrap()[..] == model[..]);

    c.stop_mds().await;
    // The handle's capability outlives this test; only the lease stops the servers.
    let fr = &f;
    let start = tokio::time::Instant::now();
    let refused = loop {
        match fr.read_at(0, BytesMut::zeroed(model.len())).await {
            Ok(got) => assert!(got[..] == model[..], "served while the lease holds, and right"),
            Err(e) => break e,
        }
        assert!(start.elapsed() < Duration::from_millis(WAIT_MS), "the servers kept serving without the MDS");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(refused.code(), Some(ErrorCode::StaleLayout), "{refused}");
    assert!(refused.to_string().contains("lease lapsed"), "{refused}");
    // Each server's lease lapses on its own clock: a write to the first stripe is refused once server 0's has.
    let start = tokio::time::Instant::now();
    let w = loop {
        if let Err(e) = f.write_at(0, Bytes::copy_from_slice(&model[..16])).await {
            break e;
        }
        assert!(start.elapsed() < Duration::from_millis(WAIT_MS), "server 0 kept taking writes without the MDS");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(w.code(), Some(ErrorCode::StaleLayout), "{w}");
    assert!(
        (0..2).any(|i| c.log(&format!("data{i}")).contains("refusing client I/O with StaleLayout")),
        "a server logs why it refuses"
    );

    c.restart_mds().await.unwrap();
    wait_for("the servers to serve again", || async move { fr.read_at(0, BytesMut::zeroed(16)).await.is_ok() }).await;
    // Both servers: a whole read touches every stripe.
    let mr = &model;
    wait_for("both servers to serve again", || async move {
        fr.read_at(0, BytesMut::zeroed(mr.len())).await.is_ok_and(|got| got[..] == mr[..])
    })
    .await;
    let patch = pattern(42, 0, 2 * UNIT as usize);
    f.write_at(UNIT as u64, Bytes::copy_from_slice(&patch)).await.unwrap();
    f.close().await.unwrap();
    let mut want = model.clone();
    want[UNIT as usize..3 * UNIT as usize].copy_from_slice(&patch);
    let r = client.open("/plain/p", OpenMode::Read).await.unwrap();
    assert!(r.read_at(0, BytesMut::zeroed(want.len())).await.unwrap()[..] == want[..], "the old bytes were kept");
}
