//! Degraded writes and the healer against a real cluster (docs/format.md §18): with a server of a redundant
//! layout killed, writes go on and record what it missed as stale; restarted, the healer beside the MDS catches
//! it up (the stale table empties); then other servers are killed and every file still reads back equal, which
//! only the caught-up chunks can give. Past the layout's tolerance, a write fails clearly and records nothing.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::*;
use weft_client::{Client, ClientError, OpenMode};
use weft_proto::{DataRedundancy, Layout, ROOT_INO};

const UNIT: u32 = 64 << 10;
/// Not a multiple of a stripe row: the last row is short.
const FILE_BYTES: usize = (3 << 20) + 12_345;
const WRITERS: u64 = 3;

/// A seeded xorshift for write sizes.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

async fn read_all(c: &Client, path: &str, len: usize) -> Result<Vec<u8>, ClientError> {
    let f = c.open(path, OpenMode::Read).await?;
    Ok(f.read_at(0, BytesMut::zeroed(len)).await?.to_vec())
}

/// Waits (without a clock) until `done` reaches `n`.
async fn until(done: &AtomicU64, n: u64) {
    while done.load(Ordering::SeqCst) < n {
        tokio::task::yield_now().await;
    }
}

/// Nudges the healer and polls the stale table until it is empty; bounded (the healer's own retries are at most
/// `retry_max_ms` apart, so this is a deadline on a broken healer, not a timing assumption).
async fn until_healed(c: &Client) {
    for _ in 0..1200 {
        c.heal_now().await.unwrap();
        let page = c.list_stale(None, None, 0).await.unwrap();
        if page.entries.is_empty() {
            assert_eq!(page.total_entries, 0);
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = c.list_stale(None, None, 0).await.unwrap();
    panic!("the healer did not empty the stale table: {left:?}");
}

/// `WRITERS` clients each write their own file of `dir` in seeded pieces (whole rows, partial rows, single
/// bytes); once `kill_after` pieces are written in all, `victim` is killed, and the writes go on. Every write must
/// succeed. Returns each file's layout.
async fn write_through_a_kill(
    c: &mut TestCluster,
    dir: &str,
    model: &Arc<Vec<u8>>,
    victim_slot: usize,
) -> (Vec<Layout>, u32) {
    let client = c.impatient_client().await;
    let mut layouts = Vec::new();
    for w in 0..WRITERS {
        let f = client.create_path(&format!("{dir}/f{w}"), 0o644, true, false).await.unwrap();
        layouts.push((*f.layout()).clone());
        f.close().await.unwrap();
    }
    let victim = layouts[0].servers[victim_slot];
    let done = Arc::new(AtomicU64::new(0));
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let cw = c.impatient_client().await;
        let (model, done, path) = (model.clone(), done.clone(), format!("{dir}/f{w}"));
        writers.spawn(async move {
            let f = cw.open(&path, OpenMode::ReadWrite).await.unwrap();
            let mut rng = Rng(91 + w);
            let mut at = 0;
            while at < model.len() {
                let n = match rng.below(3) {
                    0 => 1,
                    1 => rng.below(100_000) as usize + 1,
                    _ => rng.below(8 * u64::from(UNIT)) as usize + 1,
                }
                .min(model.len() - at);
                f.write_at(at as u64, Bytes::copy_from_slice(&model[at..at + n]))
                    .await
                    .unwrap_or_else(|e| panic!("{path}: write {at}+{n}: {e}"));
                at += n;
                done.fetch_add(1, Ordering::SeqCst);
            }
            f.close().await.unwrap();
        });
    }
    until(&done, 12).await;
    c.kill_data_server(victim).await;
    while let Some(r) = writers.join_next().await {
        r.unwrap();
    }
    (layouts, victim)
}

/// The redundancy test of issue 13 item 4: kill during writes, stale recorded, restart, heal, then lose others.
async fn degraded_writes_are_healed(
    name: &str,
    servers: u32,
    redundancy: DataRedundancy,
    victim_slot: usize,
    then_kill: &[usize],
) {
    let mut c = start_with(name, servers, |o| o.meta_extra_toml = "heal_interval_ms = 200\n".into()).await;
    let client = c.impatient_client().await;
    let d = client.mkdir(ROOT_INO, "r", 0o755).await.unwrap();
    client.set_layout_with(d.ino, UNIT, 0, redundancy).await.unwrap();
    let model = Arc::new(pattern(7, 0, FILE_BYTES));
    let (layouts, victim) = write_through_a_kill(&mut c, "/r", &model, victim_slot).await;

    // Every acknowledged write is there, read around the dead server.
    let reader = c.impatient_client().await;
    for w in 0..WRITERS {
        same(&read_all(&reader, &format!("/r/f{w}"), FILE_BYTES).await.unwrap(), &model, "degraded read");
    }
    // What the dead server missed is recorded, against its slot only; file 0's layout holds it, so file 0 has some.
    let page = reader.list_stale(None, None, 0).await.unwrap();
    assert!(!page.entries.is_empty(), "no stale ranges recorded");
    assert!(page.progress.running, "a healer runs beside the MDS");
    let f0 = reader.resolve("/r/f0").await.unwrap().ino;
    assert!(page.entries.iter().any(|e| e.ino == f0 && e.slot as usize == victim_slot), "{page:?}");
    for e in &page.entries {
        let attr = reader.getattr(e.ino).await.unwrap();
        let layout = attr.layout.unwrap();
        assert_eq!(layout.servers[e.slot as usize], victim, "only the dead server's slot is stale: {e:?}");
    }
    // `weft heal` lists the pending work.
    let (ok, out, err) = weft(&c, &["heal"]);
    assert!(ok && out.contains(&format!("server {victim}:")), "{out}{err}");

    // Back on its old data directory, it is caught up by the healer.
    c.restart_data_server(victim).await.unwrap();
    until_healed(&reader).await;
    let (ok, out, err) = weft(&c, &["heal", "--json"]);
    assert!(ok && out.contains("\"entries\": []"), "{out}{err}");

    // Now lose others of file 0's layout: only the caught-up chunks make up the difference.
    for &slot in then_kill {
        c.kill_data_server(layouts[0].servers[slot]).await;
    }
    let fresh = c.impatient_client().await;
    for w in 0..WRITERS {
        let path = format!("/r/f{w}");
        match read_all(&fresh, &path, FILE_BYTES).await {
            Ok(got) => same(&got, &model, &format!("{path} after the heal, servers lost")),
            // A file whose layout lost more than it tolerates (not file 0) may not be readable; file 0 must be.
            Err(e) => assert!(w != 0 && e.to_string().contains("unavailable"), "{path}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec_4_2_writes_go_on_with_a_server_down_and_the_healer_catches_it_up() {
    // Slot 1 (data) dies; after the heal, slots 0 and 4 die: rows need slot 1's healed chunks.
    degraded_writes_are_healed("heal-ec", 7, DataRedundancy::Ec { k: 4, m: 2 }, 1, &[0, 4]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mirror_2_writes_go_on_with_a_copy_down_and_the_healer_catches_it_up() {
    // Copy 0 dies; after the heal, copy 1 dies: every read comes from the caught-up copy.
    degraded_writes_are_healed("heal-mirror", 3, DataRedundancy::Mirror { n: 2 }, 0, &[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec_4_2_with_three_servers_down_refuses_writes_and_loses_nothing_acknowledged() {
    let mut c = start_with("heal-three", 7, |o| o.meta_extra_toml = "heal_interval_ms = 200\n".into()).await;
    let client = c.impatient_client().await;
    let d = client.mkdir(ROOT_INO, "r", 0o755).await.unwrap();
    client.set_layout_with(d.ino, UNIT, 0, DataRedundancy::Ec { k: 4, m: 2 }).await.unwrap();
    let model = pattern(11, 0, FILE_BYTES);
    let f = client.create_path("/r/f", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::from(model.clone())).await.unwrap();
    let layout = f.layout().clone();
    f.close().await.unwrap();

    let lost = [layout.servers[0], layout.servers[2], layout.servers[5]];
    for &s in &lost {
        c.kill_data_server(s).await;
    }
    // A whole-row write (no read first): three of six chunks cannot be written, one more than m.
    let row = 4 * UNIT as u64;
    let f = client.open("/r/f", OpenMode::ReadWrite).await.unwrap();
    let fresh = pattern(12, 2 * row, row as usize);
    // Sent by the flush (a lone whole row of a small unit waits for a run of rows, `ec_gather.rs`).
    let sent = async {
        f.write_at(2 * row, Bytes::from(fresh)).await?;
        f.flush().await
    };
    let err = sent.await.unwrap_err().with_path("/r/f");
    let msg = err.to_string();
    assert!(msg.contains("/r/f") && msg.contains(&format!("file offset {}", 2 * row)), "{msg}");
    assert!(msg.contains("tolerated"), "{msg}");
    drop(f);
    // Nothing was recorded for a write that was not acknowledged.
    assert!(client.list_stale(None, None, 0).await.unwrap().entries.is_empty());
    // A read past the tolerance is a clear error too, never zeros.
    let err = read_all(&client, "/r/f", FILE_BYTES).await.unwrap_err();
    assert!(err.to_string().contains("unavailable"), "{err}");

    // Back up: every acknowledged byte is there, except row 2, which the refused write may have reached on some
    // servers (its outcome is unspecified, as for any failed write); each of its bytes is old or new.
    for &s in &lost {
        c.restart_data_server(s).await.unwrap();
    }
    let reader = c.impatient_client().await;
    let got = read_all(&reader, "/r/f", FILE_BYTES).await.unwrap();
    let r2 = 2 * row as usize..3 * row as usize;
    same(&got[..r2.start], &model[..r2.start], "before the refused write");
    same(&got[r2.end..], &model[r2.end..], "after the refused write");
}

/// A batch heal (many rows in one request per chunk) of a data slot, while another writer rewrites a row inside the
/// batch between the heal's reads and its writes, at every batch attempt: the compare-and-set refuses the batch
/// whose versions moved, the heal falls back to row by row, and the slot ends up with the writer's bytes in that
/// row (never the older ones the batch had decoded) and the model's elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_row_moved_inside_a_heal_batch_is_never_overwritten() {
    let c = start_with("heal-moved", 6, |o| o.meta_extra_toml = "heal = false\n".into()).await;
    let client = c.client().await;
    let d = client.mkdir(ROOT_INO, "m", 0o755).await.unwrap();
    client.set_layout_with(d.ino, UNIT, 0, DataRedundancy::Ec { k: 4, m: 2 }).await.unwrap();
    let row = 4 * UNIT as usize;
    const ROWS: usize = 8;
    const MOVED: usize = 3;
    let mut model = pattern(21, 0, ROWS * row);
    let f = client.create_path("/m/f", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::from(model.clone())).await.unwrap();
    let (ino, layout) = (f.ino(), f.layout().clone());
    f.close().await.unwrap();

    // Slot 1 (data) is stale whole: a batch heals it.
    let slot = 1usize;
    let req = weft_proto::msg::MarkStaleReq { ino, slot: slot as u32, start: 0, end: u64::MAX };
    client.mark_stale(req).await.unwrap();
    let writer = Arc::new(client.open("/m/f", OpenMode::ReadWrite).await.unwrap());
    let calls = Arc::new(AtomicU64::new(0));
    let (w, n) = (writer.clone(), calls.clone());
    weft_client::set_heal_hook(Some(Arc::new(move |first| {
        let (w, n) = (w.clone(), n.clone());
        Box::pin(async move {
            assert_eq!(first, 0, "one batch of every row");
            let seed = 100 + n.fetch_add(1, Ordering::SeqCst);
            let at = (MOVED * row) as u64;
            w.write_at(at, Bytes::from(pattern(seed, at, row))).await.unwrap();
            w.flush().await.unwrap();
        })
    })));
    let healer = client.open("/m/f", OpenMode::ReadWrite).await.unwrap();
    let written = weft_client::heal_rows(&healer, slot, 0, ROWS as u64, (ROWS * row) as u64).await;
    weft_client::set_heal_hook(None);
    let written = written.unwrap();
    assert_eq!(written, (ROWS * UNIT as usize) as u64, "the slot's chunk of every row");
    // Every batch attempt was moved under the heal (two), then the rows went one by one (no hook there).
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let last_seed = 101;
    model[MOVED * row..(MOVED + 1) * row].copy_from_slice(&pattern(last_seed, (MOVED * row) as u64, row));

    // The healed chunk on disk: chunk 1 of every row of the model, the moved row with the writer's last bytes.
    let u = UNIT as usize;
    let disk = std::fs::read(object_path(&c.data_root(layout.servers[slot]), ino)).unwrap();
    assert_eq!(disk.len(), ROWS * u);
    for r in 0..ROWS {
        same(&disk[r * u..(r + 1) * u], &model[r * row + slot * u..][..u], &format!("row {r} of slot {slot}"));
    }
    // And the file reads back as the model.
    drop(writer);
    let got = read_all(&client, "/m/f", ROWS * row).await.unwrap();
    same(&got, &model, "after the heal");
}
