//! Scrub (issue 13 item 6, docs/format.md §20) against real processes: flipped bytes in a data chunk and in a
//! parity chunk on disk are read right and repaired, `weft scrub` then finds nothing; a parity chunk overwritten
//! with wrong bytes that pass their checksum is found and rewritten from the data; more than `m` bad chunks of a
//! row are reported with a non-zero exit and never read as zeros; a crash between a data write and its checksum
//! write (fault injection) is repaired by the read and by scrub; a mirror copy is repaired; the background
//! scrubber of `weft meta` repairs a flipped byte without any client read.

use crate::common;

use std::path::Path;

use bytes::{Bytes, BytesMut};
use common::scrape::{parse, scrape, sum};
use common::*;
use weft_client::{Client, ClientError, OpenMode};
use weft_proto::{DataRedundancy, ROOT_INO};

const UNIT: u32 = 64 << 10;
const U: usize = UNIT as usize;
/// ec 2+1: five full rows and a short sixth.
const FILE_BYTES: usize = 5 * 2 * U + 1000;

async fn read_all(c: &Client, path: &str, len: usize) -> Result<Vec<u8>, ClientError> {
    let f = c.open(path, OpenMode::Read).await?;
    Ok(f.read_at(0, BytesMut::zeroed(len)).await?.to_vec())
}

/// Makes `/d` with `redundancy` and writes `model` to `/d/f` in one write, synced; returns (ino, servers).
async fn write_file(c: &Client, redundancy: DataRedundancy, model: &[u8]) -> (u64, Vec<u32>) {
    let d = c.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    c.set_layout_with(d.ino, UNIT, 0, redundancy).await.unwrap();
    let f = c.create_path("/d/f", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::copy_from_slice(model)).await.unwrap();
    f.sync().await.unwrap();
    let out = (f.ino(), f.layout().servers.clone());
    f.close().await.unwrap();
    out
}

fn flip(path: &Path, at: usize) -> u8 {
    let mut raw = std::fs::read(path).unwrap();
    let was = raw[at];
    raw[at] ^= 0x5a;
    std::fs::write(path, raw).unwrap();
    was
}

/// The counts line of `weft scrub`'s output.
fn summary(out: &str) -> &str {
    out.lines().find(|l| l.starts_with("scrubbed ")).unwrap_or_else(|| panic!("no summary in {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec_scrub_repairs_data_and_parity_and_reports_what_it_cannot() {
    let c = start("scrub-ec", 3).await;
    let client = c.client().await;
    let model = pattern(21, 0, FILE_BYTES);
    let (ino, servers) = write_file(&client, DataRedundancy::Ec { k: 2, m: 1 }, &model).await;
    let data0 = object_path(&c.data_root(servers[0]), ino);
    let parity = object_path(&c.data_root(servers[2]), ino);
    let parity_good = std::fs::read(&parity).unwrap();

    // A flipped byte in data chunk 0 of row 1: the read decodes around it and repairs it.
    let was = flip(&data0, U + 100);
    same(&read_all(&client, "/d/f", FILE_BYTES).await.unwrap(), &model, "read around the bad data chunk");
    assert_eq!(std::fs::read(&data0).unwrap()[U + 100], was, "the read repaired the data chunk");
    // One in the parity of row 3: a healthy read never looks at parity; scrub finds it.
    flip(&parity, 3 * U + 50);
    same(&read_all(&client, "/d/f", FILE_BYTES).await.unwrap(), &model, "healthy read");
    let (ok, out, err) = weft(&c, &["scrub", "/"]);
    assert!(ok, "{out}{err}");
    assert!(summary(&out).contains("1 inconsistencies, 1 repaired, 0 left (dry run), 0 unrepairable"), "{out}");
    assert!(out.contains("/d/f") && out.contains("parity"), "{out}");
    same(&std::fs::read(&parity).unwrap(), &parity_good, "parity rewritten");
    let (ok, out, err) = weft(&c, &["scrub"]);
    assert!(ok && summary(&out).contains(" 0 inconsistencies"), "{out}{err}");
    assert!(summary(&out).contains("scrubbed 1 files"), "{out}");

    // Parity of row 2 overwritten with wrong bytes whose checksum is right (as a write that skipped parity would
    // leave): the sidecar is rewritten to match, so only the parity check sees it.
    let mut raw = std::fs::read(&parity).unwrap();
    for b in &mut raw[2 * U..2 * U + 4096] {
        *b = b.wrapping_add(1);
    }
    std::fs::write(&parity, &raw).unwrap();
    set_checksum(&parity, 2 * U / 4096, &raw[2 * U..2 * U + 4096]);
    let (ok, out, err) = weft(&c, &["scrub", "--dry-run", "/d"]);
    assert!(ok, "{out}{err}");
    assert!(summary(&out).contains("1 inconsistencies, 0 repaired, 1 left (dry run), 0 unrepairable"), "{out}");
    assert_eq!(std::fs::read(&parity).unwrap()[2 * U], raw[2 * U], "a dry run rewrites nothing");
    let (ok, out, err) = weft(&c, &["scrub", "--rate-mib-s", "50", "/d/f"]);
    assert!(ok && summary(&out).contains("1 repaired"), "{out}{err}");
    same(&std::fs::read(&parity).unwrap(), &parity_good, "wrong parity rewritten from the data");

    // Two chunks of row 4 bad with m = 1: reported with the file and offset, exit non-zero, never zeros.
    flip(&data0, 4 * U + 7);
    flip(&object_path(&c.data_root(servers[1]), ino), 4 * U + 9);
    let (ok, out, err) = weft(&c, &["scrub", "/"]);
    assert!(!ok, "unrepairable findings fail the command: {out}{err}");
    assert!(summary(&out).contains("2 unrepairable"), "{out}");
    assert!(out.contains(&format!("at file offset {}", 4 * 2 * U)), "{out}");
    let err = read_all(&client, "/d/f", FILE_BYTES).await.unwrap_err();
    assert!(err.to_string().contains("unavailable"), "{err}");
}

/// Rewrites the sidecar entry of block `block` of the object at `object` so that `bytes` pass (docs/format.md §5).
fn set_checksum(object: &Path, block: usize, bytes: &[u8]) {
    let zero = crc32c::crc32c(&[0u8; 4096]);
    let stored = crc32c::crc32c(bytes) ^ zero;
    let side = object.with_extension("crc");
    let mut raw = std::fs::read(&side).unwrap();
    raw[block * 4..block * 4 + 4].copy_from_slice(&stored.to_le_bytes());
    std::fs::write(&side, raw).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_data_and_checksum_is_repaired_by_read_and_by_scrub() {
    let mut c = start("scrub-sidecar", 3).await;
    let client = c.client().await;
    let d = client.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    client.set_layout_with(d.ino, UNIT, 0, DataRedundancy::Ec { k: 2, m: 1 }).await.unwrap();
    let f1 = client.create_path("/d/f1", 0o644, true, false).await.unwrap();
    let f2 = client.create_path("/d/f2", 0o644, true, false).await.unwrap();
    // Every ec file of a 3-server cluster uses all three: the victim holds a chunk of both.
    let victim = f1.layout().servers[0];
    c.stop_data_server(victim).await;
    c.set_env(vec![("WEFT_FAULT".into(), "skip-sidecar:1000000".into())]);
    c.restart_data_server(victim).await.unwrap();
    let (m1, m2) = (pattern(1, 0, FILE_BYTES), pattern(2, 0, FILE_BYTES));
    f1.write_at(0, Bytes::from(m1.clone())).await.unwrap();
    f2.write_at(0, Bytes::from(m2.clone())).await.unwrap();
    f1.close().await.unwrap();
    f2.close().await.unwrap();
    // The server restarts without the fault; its objects hold bytes whose checksums were never written.
    c.stop_data_server(victim).await;
    c.set_env(Vec::new());
    c.restart_data_server(victim).await.unwrap();
    assert!(c.log(&format!("data{victim}")).contains("skip the checksum update"), "the fault was armed");

    let reader = c.client().await;
    same(&read_all(&reader, "/d/f1", FILE_BYTES).await.unwrap(), &m1, "f1 decoded around the bad chunks");
    // The victim's writes failed once their reads of unchecksummed bytes did, so the writes went on degraded
    // (its rows recorded stale, §18) and the read decoded around them; the healer or scrub repairs what is left.
    let (ok, out, err) = weft(&c, &["scrub", "/"]);
    assert!(ok, "{out}{err}");
    assert!(summary(&out).contains(" 0 unrepairable"), "{out}");
    let (ok, out, err) = weft(&c, &["scrub", "/"]);
    assert!(ok && summary(&out).contains(" 0 inconsistencies"), "{out}{err}");
    // Every chunk of f2 on the victim passes its checksum again: a read of only that object's bytes is healthy.
    let ino2 = reader.resolve("/d/f2").await.unwrap().ino;
    let obj = std::fs::read(object_path(&c.data_root(victim), ino2)).unwrap();
    assert!(obj.len() >= 5 * U, "the victim's object holds its chunks");
    same(&read_all(&reader, "/d/f2", FILE_BYTES).await.unwrap(), &m2, "f2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_scrub_repairs_a_corrupt_copy() {
    let c = start("scrub-mirror", 2).await;
    let client = c.client().await;
    let model = pattern(3, 0, 300_001);
    let (ino, servers) = write_file(&client, DataRedundancy::Mirror { n: 2 }, &model).await;
    let copy = object_path(&c.data_root(servers[1]), ino);
    let was = flip(&copy, 70_000);
    let (ok, out, err) = weft(&c, &["scrub", "/"]);
    assert!(ok, "{out}{err}");
    assert!(summary(&out).contains("1 inconsistencies, 1 repaired"), "{out}");
    assert_eq!(std::fs::read(&copy).unwrap()[70_000], was, "the copy was rewritten");
    let (ok, out, err) = weft(&c, &["scrub", "/"]);
    assert!(ok && summary(&out).contains(" 0 inconsistencies"), "{out}{err}");
    same(&read_all(&client, "/d/f", model.len()).await.unwrap(), &model, "mirror read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_scrubber_repairs_without_any_client_read() {
    let c = start_with("scrub-background", 3, |o| {
        o.metrics = true;
        o.meta_extra_toml = "scrub_mib_per_s = 200\nscrub_interval_ms = 300\n".into();
    })
    .await;
    let client = c.client().await;
    let model = pattern(4, 0, FILE_BYTES);
    let (ino, servers) = write_file(&client, DataRedundancy::Ec { k: 2, m: 1 }, &model).await;
    let data1 = object_path(&c.data_root(servers[1]), ino);
    let was = flip(&data1, 2 * U + 3);
    let meta = c.metrics_addrs().into_iter().find(|(r, _)| r == "meta").expect("the MDS serves metrics").1;
    // Bounded poll: passes run every 300 ms; a minute is far more than one pass over one file takes.
    let mut repaired = 0.0;
    for _ in 0..600 {
        let text = scrape(&meta).await.unwrap();
        repaired = sum(&parse(&text), "weft_mds_scrub_repaired_total", &[]);
        if repaired >= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(repaired, 1.0, "one repair counted");
    assert_eq!(std::fs::read(&data1).unwrap()[2 * U + 3], was, "repaired on disk");
    assert!(c.log("meta").contains("scrub repaired"), "the repair is logged");
}
