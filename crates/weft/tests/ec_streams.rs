//! Erasure-coded files under streams of reads and writes while data servers are killed (issue 13 item 8), with
//! real processes: several clients — in this process and in other OS processes (this test binary re-run as a
//! writer worker, and `weft cat`) — read and write one `ec 4+2` file while servers are killed with `kill -9`.
//! Writers keep a model of what they were acknowledged (a write and the `File::flush` that puts it on the data
//! servers, where other clients read it: an ec file holds partial rows until then); every read is checked against it: a byte is the last
//! acknowledged write to it or one of the writes in flight during the read, and within one write's chunk (the
//! part on one data server) the bytes are all old or all new, never a mix. (Not within a row: a healthy read
//! reads a row's data chunks from their servers directly, and a write in flight may have reached some of them
//! — as with any striped file system, a read racing a write spanning servers is not atomic.) Past `m` lost servers a read is a clear error naming file and offset; and
//! two writer processes racing on partial rows through a kill leave data and parity that `weft scrub` finds
//! consistent.

use crate::common;

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use weft_client::{Client, ClientError, ClientTuning, ClusterConfig, OpenMode};
use weft_proto::{DataRedundancy, ROOT_INO};

const UNIT: u32 = 64 << 10;
const U: usize = UNIT as usize;
const ROW: usize = 4 * U;
/// The environment variable that turns [`worker_process`] into a writer (its value: the worker's spec).
const WORKER_ENV: &str = "WEFT_EC_STREAMS_WORKER";
/// A deadline on any one awaited condition (each takes well under a second on a healthy cluster): it fails a
/// hung test, it is not a timing assumption.
const WAIT_MS: u64 = 120_000;

/// A seeded xorshift.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// The next write of a writer owning the whole rows `[a, b)` (byte offsets, row-aligned): one or two full rows,
/// part of one row, a write across one row boundary that is partial on both sides, or a few bytes anywhere.
fn plan(rng: &mut Rng, a: usize, b: usize) -> (usize, usize) {
    let rows = (b - a) / ROW;
    match rng.below(4) {
        0 => {
            let r = rng.below(rows);
            let n = (1 + rng.below(2)).min(rows - r);
            (a + r * ROW, n * ROW)
        }
        1 => {
            let r = rng.below(rows);
            let off = rng.below(ROW);
            (a + r * ROW + off, 1 + rng.below(ROW - off))
        }
        2 if rows >= 2 => {
            let r = rng.below(rows - 1);
            let off = 1 + rng.below(ROW - 1);
            (a + r * ROW + off, ROW - off + 1 + rng.below(ROW - 1))
        }
        _ => {
            let at = a + rng.below(b - a);
            (at, (1 + rng.below(4096)).min(b - at))
        }
    }
}

/// One write of the model: its bytes are `pattern(seed, off, len)`.
#[derive(Clone)]
struct Wr {
    writer: usize,
    off: usize,
    len: usize,
    seed: u64,
    acked: bool,
    failed: bool,
}

impl Wr {
    fn bytes(&self) -> Vec<u8> {
        pattern(self.seed, self.off as u64, self.len)
    }
    fn covers(&self, x: usize) -> bool {
        (self.off..self.off + self.len).contains(&x)
    }
}

/// What the writers were acknowledged (`state`: every acknowledged write applied in order; writers of the read
/// test own disjoint rows, so the order across writers does not matter) and every write started (`log`).
struct Model {
    state: Vec<u8>,
    log: Vec<Wr>,
}

/// A model taken just before a read: the acknowledged bytes of the range and the writes then in flight.
struct Snap {
    off: usize,
    old: Vec<u8>,
    pending: Vec<usize>,
    log_len: usize,
}

impl Model {
    fn start(&mut self, writer: usize, off: usize, len: usize, seed: u64) -> usize {
        self.log.push(Wr { writer, off, len, seed, acked: false, failed: false });
        self.log.len() - 1
    }
    fn ack(&mut self, i: usize) {
        let w = &mut self.log[i];
        w.acked = true;
        let (off, bytes) = (w.off, w.bytes());
        self.state[off..off + bytes.len()].copy_from_slice(&bytes);
    }
    fn snap(&self, off: usize, len: usize) -> Snap {
        let pending = (0..self.log.len()).filter(|&i| !self.log[i].acked).collect();
        Snap { off, old: self.state[off..off + len].to_vec(), pending, log_len: self.log.len() }
    }
    /// The writes that may have landed during a read that started at `s`: those in flight then and since.
    fn maybe(&self, s: &Snap) -> Vec<Wr> {
        s.pending.iter().copied().chain(s.log_len..self.log.len()).map(|i| self.log[i].clone()).collect()
    }
}

/// Checks `got`, read at `s.off`, against the acknowledged bytes `s.old` and the writes `maybe` that were in
/// flight: each byte is its acknowledged value or one of those writes' bytes, and within one chunk a write that
/// no other in-flight write overlaps is all old or all new.
fn check_read(what: &str, got: &[u8], s: &Snap, maybe: &[Wr]) -> Result<(), String> {
    if got.len() != s.old.len() {
        return Err(format!("{what}: {} bytes read, {} expected", got.len(), s.old.len()));
    }
    let news: Vec<Vec<u8>> = maybe.iter().map(Wr::bytes).collect();
    for (i, &g) in got.iter().enumerate() {
        let x = s.off + i;
        if g == s.old[i] {
            continue;
        }
        if !maybe.iter().zip(&news).any(|(w, b)| w.covers(x) && b[x - w.off] == g) {
            return Err(format!(
                "{what}: file offset {x} read {g:#04x}, acknowledged {:#04x}, no write in flight there wrote it",
                s.old[i]
            ));
        }
    }
    // How many in-flight writes cover each byte read: where only one does, its chunk is all old or all new.
    let mut cover = vec![0u32; got.len()];
    for w in maybe {
        let (a, b) = (w.off.max(s.off), (w.off + w.len).min(s.off + got.len()));
        if a < b {
            cover[a - s.off..b - s.off].iter_mut().for_each(|c| *c += 1);
        }
    }
    for (w, new) in maybe.iter().zip(&news) {
        let lo = w.off.max(s.off);
        let hi = (w.off + w.len).min(s.off + got.len());
        let mut chunk = lo / U;
        while chunk * U < hi {
            let (a, b) = (lo.max(chunk * U), hi.min((chunk + 1) * U));
            let xs: Vec<usize> = (a..b).filter(|&x| cover[x - s.off] == 1).collect();
            let all_new = xs.iter().all(|&x| got[x - s.off] == new[x - w.off]);
            let all_old = xs.iter().all(|&x| got[x - s.off] == s.old[x - s.off]);
            if !all_new && !all_old {
                return Err(format!("{what}: the write at {}+{} is half applied in chunk {chunk}", w.off, w.len));
            }
            chunk += 1;
        }
    }
    Ok(())
}

/// A client that gives up quickly on a dead server (one attempt), as [`TestCluster::impatient_client`].
fn impatient(cfg: ClusterConfig) -> ClusterConfig {
    ClusterConfig { client: ClientTuning { attempts_max: 1, call_timeout_ms: 5_000, ..ClientTuning::default() }, ..cfg }
}

/// Not a test: with [`WORKER_ENV`] set (by [`spawn_writer`]) this is a writer process. It plans a write, says
/// `WKR START i off len` on stderr, waits for `GO` (or `STOP`) on stdin, writes, and says `WKR ACK i` or
/// `WKR FAIL i error`. Without the variable it returns at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process() {
    let Ok(spec) = std::env::var(WORKER_ENV) else { return };
    let parts: Vec<&str> = spec.split('\t').collect();
    let [cluster, path, seed, a, b] = parts[..] else { panic!("bad worker spec {spec:?}") };
    let (seed, a, b): (u64, usize, usize) = (seed.parse().unwrap(), a.parse().unwrap(), b.parse().unwrap());
    let cfg = impatient(ClusterConfig::from_spec(cluster).unwrap());
    let client = Client::connect(&cfg).await.unwrap();
    let f = client.open(path, OpenMode::ReadWrite).await.unwrap();
    let mut rng = Rng(seed);
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    for i in 0u64.. {
        let (off, len) = plan(&mut rng, a, b);
        eprintln!("WKR START {i} {off} {len}");
        match stdin.next_line().await.unwrap().as_deref() {
            Some("GO") => {}
            _ => break,
        }
        let data = Bytes::from(pattern((seed << 20) | i, off as u64, len));
        // Acknowledged once on the data servers (flushed), where the other clients read it.
        match async {
            f.write_at(off as u64, data).await?;
            f.flush().await
        }
        .await
        {
            Ok(()) => eprintln!("WKR ACK {i}"),
            // Which write, where, and why: a failure here is what the scrub test below asserts never happens.
            Err(e) => {
                let debug = format!("{e:?}");
                eprintln!("WKR FAIL {i} write_at offset {off} len {len}: {} ({debug})", e.with_path(path));
            }
        }
    }
    f.close().await.unwrap();
    eprintln!("WKR DONE");
}

/// Counts of acknowledged writes of one writer, to wait on.
type Acks = watch::Sender<u64>;

/// Starts this test binary as a writer process over the rows `[a, b)` of `path`, relaying its writes into
/// `model` as writer `writer` until `stop` is set; returns the task that ends when the process does (with its
/// failed writes' messages).
#[allow(clippy::too_many_arguments)]
fn spawn_writer(
    cluster: &weft_launch::LocalCluster,
    path: &str,
    writer: usize,
    seed: u64,
    (a, b): (usize, usize),
    model: Arc<Mutex<Model>>,
    stop: Arc<AtomicBool>,
    acks: Arc<Acks>,
) -> tokio::task::JoinHandle<Vec<String>> {
    let spec = format!("{}\t{path}\t{seed}\t{a}\t{b}", cluster.cluster_file().display());
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["ec_streams::worker_process", "--exact", "--nocapture", "--test-threads=1"])
        .env(WORKER_ENV, spec)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting a writer process");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        let mut ids = Vec::new();
        let mut failures = Vec::new();
        let mut done = false;
        let mut other = String::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["WKR", "START", i, off, len] => {
                    let i: u64 = i.parse().unwrap();
                    assert_eq!(i as usize, ids.len(), "writes are numbered in order");
                    if stop.load(Ordering::SeqCst) {
                        stdin.write_all(b"STOP\n").await.unwrap();
                        continue;
                    }
                    let id = model.lock().unwrap().start(
                        writer,
                        off.parse().unwrap(),
                        len.parse().unwrap(),
                        (seed << 20) | i,
                    );
                    ids.push(id);
                    stdin.write_all(b"GO\n").await.unwrap();
                }
                ["WKR", "ACK", i] => {
                    model.lock().unwrap().ack(ids[i.parse::<usize>().unwrap()]);
                    acks.send_modify(|n| *n += 1);
                }
                ["WKR", "FAIL", i, ..] => {
                    model.lock().unwrap().log[ids[i.parse::<usize>().unwrap()]].failed = true;
                    failures.push(line.clone());
                }
                ["WKR", "DONE"] => done = true,
                _ => {
                    other.push_str(&line);
                    other.push('\n');
                }
            }
        }
        let status = child.wait().await.unwrap();
        assert!(status.success() && done, "writer process {writer} failed: {status}\n{other}");
        failures
    })
}

/// Waits until `acks` has counted `n`.
async fn at_least(what: &str, acks: &Acks, n: u64) {
    let mut rx = acks.subscribe();
    tokio::time::timeout(Duration::from_millis(WAIT_MS), rx.wait_for(|&v| v >= n))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what} to reach {n}"))
        .unwrap();
}

async fn read_range(c: &Client, path: &str, off: usize, len: usize) -> Result<Vec<u8>, ClientError> {
    let f = c.open(path, OpenMode::Read).await?;
    Ok(f.read_at(off as u64, BytesMut::zeroed(len)).await?.to_vec())
}

async fn ec_file(client: &Client, bytes: &[u8]) -> Arc<weft_proto::Layout> {
    let dir = client.mkdir(ROOT_INO, "ec", 0o755).await.unwrap();
    client.set_layout_with(dir.ino, UNIT, 0, DataRedundancy::Ec { k: 4, m: 2 }).await.unwrap();
    let f = client.create_path("/ec/f", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::copy_from_slice(bytes)).await.unwrap();
    let layout = f.layout().clone();
    f.close().await.unwrap();
    assert_eq!(layout.redundancy, DataRedundancy::Ec { k: 4, m: 2 });
    layout
}

/// Five rows for each of three writers and a short last row nobody writes.
const ROWS_PER_WRITER: usize = 5;
const STREAM_BYTES: usize = 3 * ROWS_PER_WRITER * ROW + 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ec_4_2_reads_and_writes_from_several_clients_stay_right_through_two_kills_and_a_third_is_a_clear_error() {
    let mut c = start("ec-streams", 7).await;
    let client = c.impatient_client().await;
    let base = pattern(3, 0, STREAM_BYTES);
    let layout = ec_file(&client, &base).await;
    let model = Arc::new(Mutex::new(Model { state: base.clone(), log: Vec::new() }));
    let stop = Arc::new(AtomicBool::new(false));
    let acks: Vec<Arc<Acks>> = (0..3).map(|_| Arc::new(watch::channel(0).0)).collect();
    let region = |w: usize| (w * ROWS_PER_WRITER * ROW, (w + 1) * ROWS_PER_WRITER * ROW);

    // Writers 0 and 1 are clients of this process, writer 2 another process.
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..2 {
        let (wc, model, stop, acks) = (c.impatient_client().await, model.clone(), stop.clone(), acks[w].clone());
        writers.spawn(async move {
            let f = wc.open("/ec/f", OpenMode::ReadWrite).await.unwrap();
            let (a, b) = region(w);
            let mut rng = Rng(100 + w as u64);
            let seed = 100 + w as u64;
            for i in 0u64.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let (off, len) = plan(&mut rng, a, b);
                let id = model.lock().unwrap().start(w, off, len, (seed << 20) | i);
                let bytes = pattern((seed << 20) | i, off as u64, len);
                async {
                    f.write_at(off as u64, Bytes::from(bytes)).await?;
                    f.flush().await
                }
                .await
                .unwrap_or_else(|e| panic!("writer {w}: write {off}+{len} with at most m servers down: {e}"));
                model.lock().unwrap().ack(id);
                acks.send_modify(|n| *n += 1);
            }
            f.close().await.unwrap();
        });
    }
    let process_writer = spawn_writer(&c, "/ec/f", 2, 102, region(2), model.clone(), stop.clone(), acks[2].clone());

    // Three reader clients of this process, reading seeded ranges and checking each against the model.
    let reads = Arc::new(watch::channel(0u64).0);
    let mut readers = tokio::task::JoinSet::new();
    for r in 0..3u64 {
        let (rc, model, stop, reads) = (c.impatient_client().await, model.clone(), stop.clone(), reads.clone());
        readers.spawn(async move {
            let mut rng = Rng(500 + r);
            while !stop.load(Ordering::SeqCst) {
                let off = rng.below(STREAM_BYTES);
                let len = (1 + rng.below(3 * ROW)).min(STREAM_BYTES - off);
                let s = model.lock().unwrap().snap(off, len);
                let got = read_range(&rc, "/ec/f", off, len)
                    .await
                    .unwrap_or_else(|e| panic!("reader {r}: read {off}+{len}: {e}"));
                let maybe = model.lock().unwrap().maybe(&s);
                check_read(&format!("reader {r}: read {off}+{len}"), &got, &s, &maybe).unwrap();
                reads.send_modify(|n| *n += 1);
            }
        });
    }

    // Each phase: every writer and the readers make progress (a bounded number of operations) while a `weft cat`
    // process reads the whole file, checked the same way. Then the next server is killed.
    let victims = [layout.servers[0], layout.servers[5]];
    for phase in 0..=victims.len() {
        let base_acks: Vec<u64> = acks.iter().map(|a| *a.borrow()).collect();
        let base_reads = *reads.borrow();
        let cat = tokio::task::spawn_blocking({
            let s = model.lock().unwrap().snap(0, STREAM_BYTES);
            let file = c.cluster_file();
            let model = model.clone();
            move || {
                let out = std::process::Command::new(WEFT)
                    .args(["cat", "/ec/f"])
                    .env("WEFT_CLUSTER", file)
                    .output()
                    .expect("running weft cat");
                assert!(out.status.success(), "weft cat: {}", String::from_utf8_lossy(&out.stderr));
                let maybe = model.lock().unwrap().maybe(&s);
                check_read("weft cat", &out.stdout, &s, &maybe)
            }
        });
        for (w, a) in acks.iter().enumerate() {
            at_least(&format!("writer {w}'s writes in phase {phase}"), a, base_acks[w] + 12).await;
        }
        at_least(&format!("reads in phase {phase}"), &reads, base_reads + 30).await;
        cat.await.unwrap().unwrap();
        if let Some(&v) = victims.get(phase) {
            c.kill_data_server(v).await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    while let Some(r) = writers.join_next().await {
        r.unwrap();
    }
    let failed = process_writer.await.unwrap();
    assert!(failed.is_empty(), "writes with at most m servers down failed: {failed:?}");
    while let Some(r) = readers.join_next().await {
        r.unwrap();
    }
    let want = {
        let model = model.lock().unwrap();
        assert!(model.log.len() >= 3 * 36 && model.log.iter().all(|w| w.acked), "every write acknowledged");
        model.state.clone()
    };
    let got = read_range(&client, "/ec/f", 0, STREAM_BYTES).await.unwrap();
    assert!(got == want, "the whole file after the stream with two servers down");

    // A third server (a data slot): every row has lost three of its six chunks. A read of any row is a clear
    // error naming the file and the row's offset, from every client; never bytes.
    c.kill_data_server(layout.servers[2]).await;
    let reader = c.impatient_client().await;
    for row in 0..STREAM_BYTES.div_ceil(ROW) {
        let len = ROW.min(STREAM_BYTES - row * ROW);
        let err = match read_range(&reader, "/ec/f", row * ROW, len).await {
            Ok(_) => panic!("row {row}: bytes came back with three of six chunks lost"),
            Err(e) => e.with_path("/ec/f").to_string(),
        };
        assert!(err.contains("/ec/f") && err.contains(&format!("file offset {}", row * ROW)), "row {row}: {err}");
    }
    let (ok, out, err) = weft(&c, &["cat", "/ec/f"]);
    assert!(!ok && out.is_empty(), "weft cat with three servers lost printed {} bytes", out.len());
    assert!(err.contains("/ec/f") && err.contains("file offset 0"), "{err}");
}

/// Checks the file `got` after writers that may have raced on the same bytes have all finished: each byte is the
/// last acknowledged write to it of one of the writers (which one won a race is not known), a later write of that
/// writer that failed, or — where no write was acknowledged — the base; and a failed write is, within each chunk
/// where nothing else wrote, all applied or not at all.
fn check_final(got: &[u8], base: &[u8], log: &[Wr], writers: usize) -> Result<(), String> {
    const NONE: u32 = u32::MAX;
    let mut last = vec![vec![NONE; got.len()]; writers];
    for (i, w) in log.iter().enumerate() {
        if w.acked {
            last[w.writer][w.off..w.off + w.len].fill(i as u32);
        }
    }
    let news: Vec<Vec<u8>> = log.iter().map(Wr::bytes).collect();
    let failed: Vec<usize> = (0..log.len()).filter(|&i| log[i].failed).collect();
    let byte_of = |i: usize, x: usize| news[i][x - log[i].off];
    let candidates = |x: usize, except: Option<usize>| {
        let mut out = Vec::new();
        for l in &last {
            if l[x] != NONE {
                out.push(byte_of(l[x] as usize, x));
            }
        }
        if out.is_empty() {
            out.push(base[x]);
        }
        for &k in &failed {
            let lk = last[log[k].writer][x];
            if Some(k) != except && log[k].covers(x) && (lk == NONE || k > lk as usize) {
                out.push(byte_of(k, x));
            }
        }
        out
    };
    for (x, &g) in got.iter().enumerate() {
        if !candidates(x, None).contains(&g) {
            let by: Vec<usize> = (0..log.len()).filter(|&i| log[i].covers(x)).collect();
            return Err(format!("file offset {x} reads {g:#04x}: no acknowledged write left it (writes {by:?})"));
        }
    }
    for &k in &failed {
        let w = &log[k];
        let alone =
            |x: usize| !log.iter().enumerate().any(|(j, o)| j != k && o.covers(x) && (o.writer != w.writer || j > k));
        let mut chunk = w.off / U;
        while chunk * U < w.off + w.len {
            let span = w.off.max(chunk * U)..(w.off + w.len).min((chunk + 1) * U);
            let telling: Vec<usize> =
                span.filter(|&x| alone(x) && !candidates(x, Some(k)).contains(&byte_of(k, x))).collect();
            let applied = telling.iter().filter(|&&x| got[x] == byte_of(k, x)).count();
            if applied != 0 && applied != telling.len() {
                return Err(format!("the failed write at {}+{} is half applied in chunk {chunk}", w.off, w.len));
            }
            chunk += 1;
        }
    }
    Ok(())
}

/// Nudges the healer and polls the stale table until it is empty (bounded: a deadline on a broken healer).
async fn until_healed(c: &Client) {
    for _ in 0..1200 {
        c.heal_now().await.unwrap();
        if c.list_stale(None, None, 0).await.unwrap().entries.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the healer did not empty the stale table");
}

/// The counts line of `weft scrub`'s output.
fn summary(out: &str) -> String {
    out.lines().find(|l| l.starts_with("scrubbed ")).unwrap_or_else(|| panic!("no summary in {out}")).to_string()
}

/// Nine rows and a short tenth: writer 0 owns rows 0–5, writer 1 rows 3–8, so rows 3–5 are written by both
/// (the same bytes and different chunks of one row at once), rows 0–2 and 6–8 by one.
const RACE_BYTES: usize = 9 * ROW + 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partial_row_writers_in_two_processes_through_a_kill_leave_data_and_parity_that_scrub_finds_consistent() {
    let mut c = start("ec-race", 6).await;
    let client = c.impatient_client().await;
    let base = pattern(9, 0, RACE_BYTES);
    let layout = ec_file(&client, &base).await;
    let model = Arc::new(Mutex::new(Model { state: base.clone(), log: Vec::new() }));
    let stop = Arc::new(AtomicBool::new(false));
    let acks: Vec<Arc<Acks>> = (0..2).map(|_| Arc::new(watch::channel(0).0)).collect();
    let regions = [(0, 6 * ROW), (3 * ROW, 9 * ROW)];
    let procs: Vec<_> = (0..2)
        .map(|w| spawn_writer(&c, "/ec/f", w, 700 + w as u64, regions[w], model.clone(), stop.clone(), acks[w].clone()))
        .collect();

    // Both write for a while; a data server is killed in the middle of their stream; both go on for a bounded
    // number of writes, then stop.
    for (w, a) in acks.iter().enumerate() {
        at_least(&format!("writer {w} before the kill"), a, 15).await;
    }
    let victim = layout.servers[1];
    c.kill_data_server(victim).await;
    let after: Vec<u64> = acks.iter().map(|a| *a.borrow()).collect();
    for (w, a) in acks.iter().enumerate() {
        at_least(&format!("writer {w} after the kill"), a, after[w] + 15).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut failures = Vec::new();
    for p in procs {
        failures.extend(p.await.unwrap());
    }
    // Writes go on with one server down: none fails (a failed one would still be checked as old-or-new below).
    assert!(failures.is_empty(), "{failures:?}");

    // The server returns and is caught up; scrub then checks every chunk and every row's parity.
    c.restart_data_server(victim).await.unwrap();
    until_healed(&client).await;
    let (ok, out, err) = weft(&c, &["scrub", "/"]);
    assert!(ok, "weft scrub: {out}{err}");
    let first = summary(&out);
    assert!(first.contains(" 0 left (dry run), 0 unrepairable"), "{out}");
    let (ok, out, err) = weft(&c, &["scrub", "/"]);
    assert!(ok && summary(&out).contains(" 0 inconsistencies"), "a second scrub after `{first}`: {out}{err}");

    let log = model.lock().unwrap().log.clone();
    // (A fresh client: `client` gives up after one attempt, and a call to the restarted server spends it on
    // the server's StaleSession answer.)
    let fresh = c.client().await;
    let got = read_range(&fresh, "/ec/f", 0, RACE_BYTES).await.unwrap();
    check_final(&got, &base, &log, 2).unwrap();
    // Data and parity agree: with a data server and a parity server gone, every row decodes to the same bytes.
    c.kill_data_server(layout.servers[0]).await;
    c.kill_data_server(layout.servers[5]).await;
    let reader = c.impatient_client().await;
    let degraded = read_range(&reader, "/ec/f", 0, RACE_BYTES).await.unwrap();
    assert!(
        degraded == got,
        "decoded from parity: differs at {:?}",
        degraded.iter().zip(&got).position(|(a, b)| a != b)
    );
}

/// A write stream with one server of an `ec 4+2` layout dead: every write (whole rows, partial rows, rows across
/// a boundary) is acknowledged, each row it wrote is recorded stale for the dead server's slot and for no other
/// (the dead server is left out at once while the client's unreachable mark holds, instead of paying its connect
/// retries on every row: not timed here), and once the server returns and is healed the file reads back as
/// written, also when decoded from parity with two other servers gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_stream_with_a_server_dead_records_its_rows_stale_and_reads_back_after_healing() {
    let mut c = start("ec-degraded-stream", 6).await;
    let client = c.impatient_client().await;
    let size = 12 * ROW + 5_000;
    let base = pattern(21, 0, size);
    let layout = ec_file(&client, &base).await;
    let slot = 2;
    let victim = layout.servers[slot];
    c.kill_data_server(victim).await;

    // A client with the default retries: a call to the dead server costs its full connect retries.
    let writer = c.client().await;
    let f = writer.open("/ec/f", OpenMode::ReadWrite).await.unwrap();
    let mut want = base.clone();
    let mut rows_written = std::collections::BTreeSet::new();
    let mut rng = Rng(33);
    for i in 0..60u64 {
        let (off, len) = plan(&mut rng, 0, 12 * ROW);
        let bytes = pattern(1_000 + i, off as u64, len);
        f.write_at(off as u64, Bytes::from(bytes.clone()))
            .await
            .unwrap_or_else(|e| panic!("write {i} at {off}+{len} with one server dead: {e}"));
        want[off..off + len].copy_from_slice(&bytes);
        rows_written.extend(off / ROW..(off + len).div_ceil(ROW));
    }
    f.close().await.unwrap();

    let stale = client.list_stale(None, None, 0).await.unwrap().entries;
    assert!(stale.iter().all(|e| e.slot == slot as u32), "only the dead server's slot missed rows: {stale:?}");
    for row in &rows_written {
        let covered = stale.iter().flat_map(|e| &e.ranges).any(|r| (r.start..r.end).contains(&(*row as u64)));
        assert!(covered, "row {row} was written with slot {slot} dead but is not recorded stale: {stale:?}");
    }

    c.restart_data_server(victim).await.unwrap();
    until_healed(&client).await;
    let fresh = c.client().await;
    let got = read_range(&fresh, "/ec/f", 0, size).await.unwrap();
    assert!(got == want, "differs at {:?}", got.iter().zip(&want).position(|(a, b)| a != b));
    // The healed chunks agree with the parity: with a data server and a parity server gone, every row decodes.
    c.kill_data_server(layout.servers[0]).await;
    c.kill_data_server(layout.servers[5]).await;
    let reader = c.impatient_client().await;
    let degraded = read_range(&reader, "/ec/f", 0, size).await.unwrap();
    assert!(
        degraded == want,
        "decoded from parity: differs at {:?}",
        degraded.iter().zip(&want).position(|(a, b)| a != b)
    );
}
