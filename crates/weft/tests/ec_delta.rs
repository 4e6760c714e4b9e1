//! ec writes with a hook inside them (docs/format.md §17): a data server lost inside a delta write (issue 32,
//! "Delta parity"), a row read between a degraded write's writes and its stale marks (issue 30). Each hook is
//! its client's (`Client::test_hooks`): the other tests' writes in this process never fire it.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use common::*;
use weft_client::{Client, OpenMode};
use weft_proto::{DataRedundancy, ROOT_INO};

const UNIT: u32 = 64 << 10;

/// `/ec`, whose new files are `ec 4+2` with a stripe unit of [`UNIT`].
async fn ec_dir(c: &Client) {
    let dir = c.mkdir(ROOT_INO, "ec", 0o755).await.unwrap();
    c.set_layout_with(dir.ino, UNIT, 0, DataRedundancy::Ec { k: 4, m: 2 }).await.unwrap();
}

/// Found by `partial_row_writers_in_two_processes_through_a_kill_…` (ec_streams.rs) in CI: a delta write across
/// two data chunks whose second chunk's server is killed between the write's reads and its writes lands the first
/// range only, and its parity names the first chunk's old version. With that server gone the row decodes only
/// from the first chunk as it was before, which only this writer knows (`Known::replaced`): the write must still
/// be acknowledged (degraded), and every byte read back right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_inside_a_delta_write_leaves_the_write_acknowledged_and_the_row_decodable() {
    let c = start_with("ec-delta-kill", 6, |_| {}).await;
    let client = c.impatient_client().await;
    ec_dir(&client).await;
    let (unit, row) = (UNIT as usize, 4 * UNIT as usize);
    let mut model = pattern(41, 0, 3 * row);
    let f = client.create_path("/ec/f", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::copy_from_slice(&model)).await.unwrap();
    f.close().await.unwrap();
    let f = client.open("/ec/f", OpenMode::ReadWrite).await.unwrap();
    let pid = c.data_pid(f.layout().servers[1]).expect("data server 1 runs");
    let fired = Arc::new(AtomicU64::new(0));
    let n = fired.clone();
    client.test_hooks().set_delta(Some(Arc::new(move |_row| {
        let n = n.clone();
        Box::pin(async move {
            if n.fetch_add(1, Ordering::SeqCst) == 0 {
                let ok = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
                assert!(ok.success());
                // Dead once the kernel has closed its sockets: its /proc entry is a zombie or gone.
                while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
                    tokio::task::yield_now().await;
                }
            }
        })
    })));
    // Row 1, the last 100 bytes of chunk 0 and the first 100 of chunk 1.
    let at = row + unit - 100;
    let patch = pattern(42, at as u64, 200);
    let written = f.write_at(at as u64, Bytes::copy_from_slice(&patch)).await;
    let flushed = f.flush().await;
    client.test_hooks().set_delta(None);
    written.unwrap();
    flushed.unwrap_or_else(|e| panic!("the write with a server killed under it: {e}"));
    assert_eq!(fired.load(Ordering::SeqCst), 1, "one delta write, the server killed inside it");
    model[at..at + 200].copy_from_slice(&patch);
    f.close().await.unwrap();
    same(&read_range(&client, "/ec/f", 0, model.len()).await.unwrap(), &model, "decoded with data server 1 dead");
}

/// Issue 30's finding (docs/format.md §17, "A version names one content"): a write that changes bytes of a data
/// chunk whose server it cannot reach stores them only in the parity, and must name a new version for that chunk
/// there. Named at its old version, the chunk's old bytes on its server (back before the write marks it stale)
/// carry the version the parity names for the new ones, and a read that decodes another chunk from the two returns
/// wrong bytes where nothing was written (every byte of the chunk read, before the fix). It must get the bytes
/// last written there, or a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_changed_while_unreachable_never_decodes_with_its_old_bytes() {
    let mut c = start_with("ec-unreachable-version", 3, |o| o.meta_extra_toml = "heal = false\n".into()).await;
    let client = c.impatient_client().await;
    let dir = client.mkdir(ROOT_INO, "ec", 0o755).await.unwrap();
    client.set_layout_with(dir.ino, UNIT, 0, DataRedundancy::Ec { k: 2, m: 1 }).await.unwrap();
    let (unit, row) = (UNIT as usize, 2 * UNIT as usize);
    let model = pattern(51, 0, 3 * row);
    let f = client.create_path("/ec/f", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::copy_from_slice(&model)).await.unwrap();
    let (ino, servers) = (f.attr().ino, f.layout().servers.clone());
    f.close().await.unwrap();
    c.stop_data_server(servers[0]).await;
    // The degraded write stops between its writes and its stale marks until the test has read.
    let (inside_tx, mut inside) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let release = Arc::new(tokio::sync::Notify::new());
    let go = release.clone();
    client.test_hooks().set_degraded(Some(Arc::new(move |hooked, first| {
        let (inside_tx, go) = (inside_tx.clone(), go.clone());
        Box::pin(async move {
            if hooked == ino {
                let _ = inside_tx.send(first);
                go.notified().await;
            }
        })
    })));
    // Bytes of chunk 0 of row 1 change while its server is down.
    let patch = pattern(52, row as u64, 100);
    let writer = client.clone();
    let write = tokio::spawn(async move {
        let w = writer.open("/ec/f", OpenMode::ReadWrite).await?;
        w.write_at(row as u64, Bytes::copy_from_slice(&patch)).await?;
        w.close().await
    });
    assert_eq!(inside.recv().await, Some(1), "the degraded write of row 1");
    // Chunk 0's server is back (not yet marked stale), chunk 1's is gone: chunk 1 of row 1, never written since,
    // is decoded from chunk 0 and the parity.
    c.restart_data_server(servers[0]).await.unwrap();
    c.stop_data_server(servers[1]).await;
    let reader = c.impatient_client().await;
    let at = row + unit;
    let read = read_range(&reader, "/ec/f", at as u64, unit).await;
    release.notify_one();
    write.await.unwrap().unwrap_or_else(|e| panic!("the degraded write: {e}"));
    match read {
        Ok(got) => same(&got, &model[at..at + unit], "chunk 1 of row 1, decoded inside the degraded write"),
        Err(e) => assert!(e.to_string().contains(&format!("inode {ino}")), "a clear error names the file: {e}"),
    }
}
