//! Degraded writes and the healer against a real cluster (docs/format.md §18): with a server of a redundant
//! layout killed, writes go on and record what it missed as stale; restarted, the healer beside the MDS catches
//! it up (the stale table empties); then other servers are killed and every file still reads back equal, which
//! only the caught-up chunks can give. Past the layout's tolerance, a write fails clearly and records nothing.

use crate::common;

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
    client.test_hooks().set_heal(Some(Arc::new(move |first| {
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
    client.test_hooks().set_heal(None);
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

/// A `mirror 2` file `/m/f` of `rows` stripe units of `pattern(seed)` on a fresh cluster of two data servers with
/// the healer off (the tests run it by hand): the cluster, the file's inode and layout, and its bytes.
async fn mirror_file(name: &str, seed: u64, rows: usize) -> (TestCluster, u64, Layout, Vec<u8>) {
    let c = start_with(name, 2, |o| o.meta_extra_toml = "heal = false\n".into()).await;
    let client = c.client().await;
    let d = client.mkdir(ROOT_INO, "m", 0o755).await.unwrap();
    client.set_layout_with(d.ino, UNIT, 0, DataRedundancy::Mirror { n: 2 }).await.unwrap();
    let bytes = pattern(seed, 0, rows * UNIT as usize);
    let f = client.create_path("/m/f", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::from(bytes.clone())).await.unwrap();
    f.close().await.unwrap();
    let f = client.open("/m/f", OpenMode::Read).await.unwrap();
    (c, f.ino(), Layout::clone(&f.layout()), bytes)
}

/// Issue 30: a copy between mirror copies racing a write whose two copies land apart (docs/format.md §32). The
/// write's bytes reach the target copy; its bytes for the source copy wait at a gate on that server
/// (`WEFT_FAULT=gate-writes`); the healer then copies the target's rows from the source (still the old bytes);
/// then the gate opens. Without the write fences the heal undid the write on the target while the source took it:
/// two copies that differ with nothing stale, and a read that returns the old bytes after the write was
/// acknowledged. With them the source refuses the late copy (its epoch was raised before the heal read it), and
/// the writer writes both copies again: both hold the write's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_heal_never_undoes_a_write_whose_other_copy_lands_late() {
    let (u, rows) = (UNIT as usize, 4usize);
    let (mut c, ino, layout, old) = mirror_file("heal-mirror-fence", 31, rows).await;
    let (target, source) = (0usize, 1usize);

    let gate = c.dir().join("write-gate");
    c.set_env(vec![("WEFT_FAULT".into(), format!("gate-writes:{}", gate.display()))]);
    c.restart_data_server(layout.servers[source]).await.unwrap();
    c.set_env(vec![]);
    std::fs::write(&gate, b"shut").unwrap();

    let client = c.client().await;
    let at = u as u64;
    let new = pattern(32, at, u);
    let writer = client.open("/m/f", OpenMode::ReadWrite).await.unwrap();
    let bytes = Bytes::from(new.clone());
    let write = tokio::spawn(async move {
        writer.write_at(at, bytes).await?;
        writer.close().await
    });
    // Until the write's target copy is on the target's disk (a condition polled, bounded against a hang).
    let target_object = object_path(&c.data_root(layout.servers[target]), ino);
    let landed = || std::fs::read(&target_object).is_ok_and(|b| b.get(u..2 * u) == Some(&new[..]));
    for _ in 0..3000 {
        if landed() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(landed(), "the write's target copy never landed");
    assert!(!write.is_finished(), "the write waits for its source copy");

    let healer = client.open("/m/f", OpenMode::ReadWrite).await.unwrap();
    let healed = weft_client::heal_rows(&healer, target, 0, rows as u64, (rows * u) as u64).await.unwrap();
    assert_eq!(healed, (rows * u) as u64);
    std::fs::remove_file(&gate).unwrap();
    write.await.unwrap().unwrap();
    let log = c.log(&format!("data{}", layout.servers[source]));
    assert!(log.contains("writes wait while the gate file exists"), "the gate was armed");

    let mut model = old;
    model[u..2 * u].copy_from_slice(&new);
    for slot in [target, source] {
        let disk = std::fs::read(object_path(&c.data_root(layout.servers[slot]), ino)).unwrap();
        same(&disk, &model, &format!("copy {slot} after the heal and the late copy"));
    }
    let got = read_all(&client, "/m/f", rows * u).await.unwrap();
    same(&got, &model, "the file after the heal");
}

/// A hold on a mirror copy (docs/format.md §32), taken by hand as a copier takes it: an unfenced write of its bytes
/// is refused `Held` and writes nothing; a client's write lands on the other copy at once and waits for the held
/// one (not an error, not a stale mark); once the hold is released it lands there too and the close succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_write_waits_out_a_hold_and_lands_on_every_copy() {
    let (u, rows) = (UNIT as usize, 4usize);
    let (c, ino, layout, old) = mirror_file("mirror-hold", 41, rows).await;
    let client = c.client().await;
    let (held, free) = (layout.servers[0], layout.servers[1]);

    let ds =
        weft_rpc::RpcClient::connect(weft_fabric::TcpFabric::default(), &c.data_addrs()[held as usize], c.rpc_config())
            .await
            .unwrap();
    let cap = client.open_capability(ino, weft_proto::Rights::READ_WRITE).await.unwrap().cap;
    let fence = |act| weft_proto::Request::FenceWrites(weft_proto::msg::FenceReq { ino, cap: cap.clone(), act });
    let hold = match ds
        .call_simple(fence(weft_proto::msg::FenceAct::Hold { start: 0, end: (rows * u) as u64, ttl_ms: 30_000 }))
        .await
    {
        Ok(weft_proto::Response::FenceWrites(r)) => r,
        other => panic!("a hold: {other:?}"),
    };
    assert!(hold.hold != 0 && hold.epoch >= 2, "{hold:?}");
    let raw = weft_proto::Request::Write(weft_proto::msg::WriteReq { ino, offset: 0, cap: cap.clone() });
    let e = ds.call(raw, vec![Bytes::from_static(b"not while held")], vec![]).await.expect_err("held");
    assert_eq!(e.remote().map(|w| w.code), Some(weft_proto::ErrorCode::Held), "{e}");

    let at = (2 * u) as u64;
    let new = pattern(42, at, u);
    let writer = client.open("/m/f", OpenMode::ReadWrite).await.unwrap();
    let bytes = Bytes::from(new.clone());
    let write = tokio::spawn(async move {
        writer.write_at(at, bytes).await?;
        writer.close().await
    });
    // Until the free copy has the write (a condition polled, bounded against a hang): the held one was refused.
    let on_disk = |server: u32| std::fs::read(object_path(&c.data_root(server), ino)).unwrap();
    let landed = |server: u32| on_disk(server).get(2 * u..3 * u) == Some(&new[..]);
    for _ in 0..3000 {
        if landed(free) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(landed(free), "the write never reached the free copy");
    same(&on_disk(held), &old, "the held copy, while held");
    assert!(!write.is_finished(), "the write waits for the held copy");

    match ds.call_simple(fence(weft_proto::msg::FenceAct::Release { hold: hold.hold })).await {
        Ok(weft_proto::Response::FenceWrites(r)) => assert_eq!(r.epoch, hold.epoch),
        other => panic!("a release: {other:?}"),
    }
    write.await.unwrap().unwrap();
    let mut model = old;
    model[2 * u..3 * u].copy_from_slice(&new);
    for server in [held, free] {
        same(&on_disk(server), &model, &format!("the copy on server {server}"));
    }
    assert!(client.list_stale(Some(ino), None, 0).await.unwrap().entries.is_empty(), "nothing was marked stale");
}

/// Issue 30 item 3's lost unsynced writes, where they matter most: a heal is durable on the healed server before it
/// returns (and so before the healer clears the range). With that server unable to flush (`fail-fsync`), the heal
/// fails, naming the fsync, instead of leaving healed bytes only in a page cache a crash of that machine would
/// lose after the range was cleared; with the disk flushing again, it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_heal_is_durable_on_the_healed_server_before_it_returns() {
    let (u, rows) = (UNIT as usize, 4usize);
    let (mut c, _, layout, _) = mirror_file("heal-durable", 51, rows).await;
    let target = 0usize;

    c.set_env(vec![("WEFT_FAULT".into(), "fail-fsync:1000000".into())]);
    c.restart_data_server(layout.servers[target]).await.unwrap();
    c.set_env(vec![]);
    let client = c.client().await;
    let healer = client.open("/m/f", OpenMode::ReadWrite).await.unwrap();
    let e = weft_client::heal_rows(&healer, target, 0, rows as u64, (rows * u) as u64).await;
    let e = e.expect_err("a heal the healed server cannot make durable fails").to_string();
    assert!(e.contains("fsync"), "the failure names the flush: {e}");

    c.restart_data_server(layout.servers[target]).await.unwrap();
    let client = c.client().await;
    let healer = client.open("/m/f", OpenMode::ReadWrite).await.unwrap();
    let healed = weft_client::heal_rows(&healer, target, 0, rows as u64, (rows * u) as u64).await.unwrap();
    assert_eq!(healed, (rows * u) as u64);
}

/// Issue 30 item 3, lost unsynced writes (docs/format.md §33): a mirror copy's machine reboots between a write and
/// its fsync and comes back without the write. The fsync must not report the write durable on that copy: it finds
/// the server's write verifier moved, records the rows stale there (the other copy synced them), and succeeds; a
/// read meanwhile never returns the lost copy's old bytes, and the heal brings the copy back. Before write
/// verifiers the fsync succeeded with nothing stale, and the rebooted copy served the old bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reboot_that_loses_a_mirror_copys_unsynced_write_is_healed_from_the_other_copy() {
    let (u, rows) = (UNIT as usize, 4usize);
    let (mut c, ino, layout, old) = mirror_file("reboot-mirror", 61, rows).await;
    let target = 0usize;
    let durable = c.dir().join("durable-root");
    copy_tree(&c.data_root(layout.servers[target]), &durable);

    let client = c.client().await;
    let writer = client.open("/m/f", OpenMode::ReadWrite).await.unwrap();
    let new = pattern(62, u as u64, u);
    writer.write_at(u as u64, Bytes::from(new.clone())).await.unwrap();
    power_loss(&mut c, layout.servers[target], &durable, "rebooted-once").await;
    let on_disk = |slot: usize| std::fs::read(object_path(&c.data_root(layout.servers[slot]), ino)).unwrap();
    same(&on_disk(target), &old, "the rebooted copy lost the unsynced write");

    writer.sync().await.expect("the other copy holds the write: the fsync succeeds");
    let stale = client.list_stale(Some(ino), None, 0).await.unwrap().entries;
    assert!(
        stale.iter().any(|e| e.slot as usize == target && !e.ranges.is_empty()),
        "the rebooted copy's rows are recorded stale: {stale:?}"
    );
    let mut model = old;
    model[u..2 * u].copy_from_slice(&new);
    let reader = c.client().await;
    same(&read_all(&reader, "/m/f", rows * u).await.unwrap(), &model, "a read before the heal");
    drop(writer);

    let healer = client.open("/m/f", OpenMode::ReadWrite).await.unwrap();
    weft_client::heal_rows(&healer, target, 0, rows as u64, (rows * u) as u64).await.unwrap();
    for slot in [0, 1] {
        same(&on_disk(slot), &model, &format!("copy {slot} after the heal"));
    }
}

/// The same reboot under a plain file (docs/format.md §33): no other copy holds the write, so the fsync fails with
/// EIO naming the file, the server and the reboot, once (the next fsync judges by the new verifier). A data server
/// killed and restarted on the same boot lost nothing (the page cache outlives the process): its fsync succeeds and
/// the write reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reboot_that_loses_a_plain_files_unsynced_write_fails_its_fsync_once() {
    let mut c = start_with("reboot-plain", 1, |o| o.meta_extra_toml = "heal = false\n".into()).await;
    let client = c.client().await;
    let f = client.create_path("/f", 0o644, true, false).await.unwrap();
    let ino = f.ino();
    let v1 = pattern(71, 0, UNIT as usize);
    f.write_at(0, Bytes::from(v1.clone())).await.unwrap();
    f.sync().await.unwrap();
    let durable = c.dir().join("durable-root");
    copy_tree(&c.data_root(0), &durable);

    f.write_at(0, Bytes::from(pattern(72, 0, UNIT as usize))).await.unwrap();
    power_loss(&mut c, 0, &durable, "rebooted-once").await;
    let e = f.sync().await.expect_err("the write is gone with the reboot");
    assert!(matches!(e, ClientError::WritesLost { ino: i, server: 0, .. } if i == ino), "{e:?}");
    assert!(e.to_string().contains("may be lost"), "{e}");
    f.sync().await.expect("a loss is reported once");
    same(&read_all(&client, "/f", UNIT as usize).await.unwrap(), &v1, "what the disk kept");

    let v3 = pattern(73, 0, UNIT as usize);
    f.write_at(0, Bytes::from(v3.clone())).await.unwrap();
    c.kill_data_server(0).await;
    c.set_env(vec![("WEFT_FAULT".into(), "boot-id:rebooted-once".into())]);
    c.restart_data_server(0).await.unwrap();
    f.sync().await.expect("a restart on the same boot lost nothing");
    f.close().await.unwrap();
    same(&read_all(&c.client().await, "/f", UNIT as usize).await.unwrap(), &v3, "after the restart");
}

/// The session witness (docs/format.md §33): a data server reboots without losing anything this client wrote, the
/// client reconnects to it (a read: a new session) and only then writes. Its sync answers the new boot's verifier,
/// which the client did not know before the write, on the session the write used: the same process ran both, so
/// nothing can have been lost, and the fsync succeeds (judged by the verifiers alone it would fail, a false alarm).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_made_after_a_reboot_on_the_new_session_are_not_judged_lost() {
    let mut c = start_with("reboot-session", 1, |o| o.meta_extra_toml = "heal = false\n".into()).await;
    let client = c.client().await;
    let f = client.create_path("/f", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::from(pattern(91, 0, UNIT as usize))).await.unwrap();
    f.sync().await.unwrap();

    c.kill_data_server(0).await;
    c.set_env(vec![("WEFT_FAULT".into(), "boot-id:rebooted-clean".into())]);
    c.restart_data_server(0).await.unwrap();
    c.set_env(vec![]);
    // A read reconnects this client to the new process (a new session); no sync has told it the new verifier.
    let v1 = read_all(&client, "/f", UNIT as usize).await.unwrap();
    same(&v1, &pattern(91, 0, UNIT as usize), "before the write");

    let v2 = pattern(92, 0, UNIT as usize);
    f.write_at(0, Bytes::from(v2.clone())).await.unwrap();
    f.sync().await.expect("written and synced on one process: nothing lost");
    f.close().await.unwrap();
    same(&read_all(&c.client().await, "/f", UNIT as usize).await.unwrap(), &v2, "after the sync");
}
