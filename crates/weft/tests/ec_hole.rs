//! No write hole in erasure-coded rows (issue 13 item 3, docs/format.md §17), against a real cluster: a row torn
//! by a data server that lost its last write (its files put back as they were before it, while it was stopped) and
//! then more servers killed reads as the old or the new bytes of each chunk, or fails with a clear `TornRow` —
//! never a mix decoded from disagreeing chunks; and two clients writing different chunks of the same rows at once
//! leave rows whose data and parity agree, so that with servers killed afterwards every read is the last
//! acknowledged content.

use crate::common;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use common::*;
use weft_client::{Client, ClientError, OpenMode};
use weft_proto::{DataRedundancy, ROOT_INO};

const UNIT: u32 = 64 << 10;
const U: usize = UNIT as usize;
const ROW: usize = 4 * U;

/// The three files of an object on a data server: the object, its checksums (§5) and its versions (§17).
fn object_files(root: &Path, ino: u64) -> Vec<PathBuf> {
    let obj = object_path(root, ino);
    let mut side = obj.clone().into_os_string();
    side.push(".crc");
    let mut ver = obj.clone().into_os_string();
    ver.push(".ver");
    vec![obj, side.into(), ver.into()]
}

async fn ec_dir(client: &Client, name: &str) {
    let dir = client.mkdir(ROOT_INO, name, 0o755).await.unwrap();
    client.set_layout_with(dir.ino, UNIT, 0, DataRedundancy::Ec { k: 4, m: 2 }).await.unwrap();
}

/// A data server loses its part of a row write (a crash before its page cache reached the disk: here, its
/// files are put back as they were before the write while it is stopped), then servers are killed. Row 1 got a
/// new chunk 0 only, so the stale parity still vouches for the rest and decodes chunk 0 as its old bytes; row 2
/// got new chunks 0 and 1, so the stale parity agrees with nothing and the row is a clear `TornRow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_row_reads_old_or_new_bytes_or_a_clear_error_never_a_mix() {
    let mut c = start("ec-torn", 6).await;
    let client = c.impatient_client().await;
    ec_dir(&client, "ec").await;
    let f = client.create_path("/ec/f", 0o644, true, false).await.unwrap();
    let old = pattern(31, 0, 4 * ROW);
    f.write_at(0, Bytes::from(old.clone())).await.unwrap();
    f.sync().await.unwrap();
    let (ino, layout) = (f.ino(), f.layout().clone());

    // Parity server 0's files before the write.
    let p0 = layout.servers[4];
    let saved: Vec<(PathBuf, Vec<u8>)> =
        object_files(&c.data_root(p0), ino).into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect();

    // The write: chunk 0 of row 1, chunks 0 and 1 of row 2 (partial rows: read-modify-write). Acknowledged.
    let mut new = old.clone();
    for (at, len) in [(ROW, U), (2 * ROW, 2 * U)] {
        new[at..at + len].copy_from_slice(&pattern(99, at as u64, len));
        f.write_at(at as u64, Bytes::copy_from_slice(&new[at..at + len])).await.unwrap();
    }
    f.close().await.unwrap();
    same(&read_range(&client, "/ec/f", 0, 4 * ROW).await.unwrap(), &new, "healthy read after the write");

    // Parity server 0 loses the write.
    c.stop_data_server(p0).await;
    for (p, bytes) in &saved {
        std::fs::write(p, bytes).unwrap();
    }
    c.restart_data_server(p0).await.unwrap();

    // Data server 0 and parity server 1 die: rows 1 and 2 must decode from data chunks 1–3 and the stale parity 0.
    c.kill_data_server(layout.servers[0]).await;
    c.kill_data_server(layout.servers[5]).await;
    let reader = c.impatient_client().await;
    // Rows 0 and 3 were not written: right.
    for r in [0, 3] {
        let got = read_range(&reader, "/ec/f", (r * ROW) as u64, ROW).await.unwrap();
        same(&got, &new[r * ROW..(r + 1) * ROW], &format!("row {r}"));
    }
    // Row 1: chunk 0 is one of its versions (the old one: the only one the surviving parity vouches for), the rest
    // the current bytes. Never a mix of both within the chunk, never garbage.
    let got = read_range(&reader, "/ec/f", ROW as u64, ROW).await.unwrap();
    let chunk0 = &got[..U];
    assert!(chunk0 == &old[ROW..ROW + U] || chunk0 == &new[ROW..ROW + U], "row 1 chunk 0 is neither old nor new");
    same(chunk0, &old[ROW..ROW + U], "row 1 chunk 0 decoded from the parity that vouches for it");
    same(&got[U..], &new[ROW + U..2 * ROW], "row 1 chunks 1-3");
    // Row 2: parity 0 encodes chunk 1's old version, chunk 1 is new: nothing consistent to decode chunk 0 from.
    let err = read_range(&reader, "/ec/f", 2 * ROW as u64, ROW).await.unwrap_err();
    assert!(
        matches!(err, ClientError::TornRow { ino: i, file_offset, .. } if i == ino && file_offset == 2 * ROW as u64),
        "{err}"
    );
    // A read of the live chunks of row 2 alone is healthy and right.
    let got = read_range(&reader, "/ec/f", (2 * ROW + U) as u64, 3 * U).await.unwrap();
    same(&got, &new[2 * ROW + U..3 * ROW], "row 2 chunks 1-3");
}

/// Two clients write different chunks of the same rows at once (seeded partial-row writes, each acknowledged
/// before the next); then a data server and a parity server are killed: every byte reads as its last write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_of_one_row_leave_data_and_parity_in_agreement() {
    let mut c = start("ec-concurrent", 6).await;
    let client = c.impatient_client().await;
    ec_dir(&client, "ec").await;
    const ROWS: usize = 6;
    let f = client.create_path("/ec/f", 0o644, true, false).await.unwrap();
    let base = pattern(7, 0, ROWS * ROW);
    f.write_at(0, Bytes::from(base.clone())).await.unwrap();
    let layout = f.layout().clone();
    f.close().await.unwrap();

    // Writer w owns chunk `2 * w` of every row (chunks 0 and 2): its model is the whole file with only its bytes.
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..2usize {
        let c2 = c.impatient_client().await;
        let mut model = base.clone();
        writers.spawn(async move {
            let f = c2.open("/ec/f", OpenMode::ReadWrite).await.unwrap();
            let mut x = 0x9e37_79b9_u64 + w as u64;
            let mut next = |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            };
            for i in 0..60u64 {
                let row = next(ROWS as u64) as usize;
                let off = next(U as u64) as usize;
                let len = (next(U as u64) as usize + 1).min(U - off);
                let at = row * ROW + 2 * w * U + off;
                let bytes = pattern(1000 + 100 * w as u64 + i, at as u64, len);
                model[at..at + len].copy_from_slice(&bytes);
                f.write_at(at as u64, Bytes::from(bytes)).await.unwrap();
            }
            f.close().await.unwrap();
            (w, model)
        });
    }
    let mut want = base.clone();
    while let Some(r) = writers.join_next().await {
        let (w, model) = r.unwrap();
        for row in 0..ROWS {
            let at = row * ROW + 2 * w * U;
            want[at..at + U].copy_from_slice(&model[at..at + U]);
        }
    }
    same(&read_range(&client, "/ec/f", 0, ROWS * ROW).await.unwrap(), &want, "healthy read");

    // Chunk 0's server dies: every row decodes chunk 0 from parity, which must encode the last writes.
    c.kill_data_server(layout.servers[0]).await;
    let reader = c.impatient_client().await;
    same(&read_range(&reader, "/ec/f", 0, ROWS * ROW).await.unwrap(), &want, "chunk 0 lost");
    // And a parity server: the other parity alone must agree too.
    c.kill_data_server(layout.servers[4]).await;
    same(&read_range(&reader, "/ec/f", 0, ROWS * ROW).await.unwrap(), &want, "chunk 0 and parity 0 lost");
}
