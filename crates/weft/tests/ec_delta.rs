//! A data server lost inside a delta write (issue 32; docs/format.md §17, "Delta parity"). In a test binary of its
//! own: the delta hook is process-wide, and the other ec tests make delta writes of their own.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use common::*;
use weft_client::{Client, ClientError, OpenMode};
use weft_proto::{DataRedundancy, ROOT_INO};

const UNIT: u32 = 64 << 10;

/// `/ec`, whose new files are `ec 4+2` with a stripe unit of [`UNIT`].
async fn ec_dir(c: &Client) {
    let dir = c.mkdir(ROOT_INO, "ec", 0o755).await.unwrap();
    c.set_layout_with(dir.ino, UNIT, 0, DataRedundancy::Ec { k: 4, m: 2 }).await.unwrap();
}

/// Reads `[off, off + len)` of `path` with a fresh open of `c`.
async fn read_range(c: &Client, path: &str, off: u64, len: usize) -> Result<Vec<u8>, ClientError> {
    let f = c.open(path, OpenMode::Read).await?;
    let got = f.read_at(off, BytesMut::zeroed(len)).await?;
    Ok(got.to_vec())
}

/// Asserts `got == want` naming the first differing byte.
#[track_caller]
fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!("{what}: {} bytes read, {} expected, first difference at {at}", got.len(), want.len());
    }
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
    weft_client::set_delta_hook(Some(Arc::new(move |_row| {
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
    weft_client::set_delta_hook(None);
    written.unwrap();
    flushed.unwrap_or_else(|e| panic!("the write with a server killed under it: {e}"));
    assert_eq!(fired.load(Ordering::SeqCst), 1, "one delta write, the server killed inside it");
    model[at..at + 200].copy_from_slice(&patch);
    f.close().await.unwrap();
    same(&read_range(&client, "/ec/f", 0, model.len()).await.unwrap(), &model, "decoded with data server 1 dead");
}
