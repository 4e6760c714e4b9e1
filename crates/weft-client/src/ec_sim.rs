//! ec row writes, heals and reads, simulated (issue 30 item 3): the write path's decisions on real data server
//! stores, under every interleaving and fault a seed picks.
//!
//! Real code: each data server is a `weft_data::ObjectStore` (its compare-and-set `write_rows`, its `read_rows`
//! that reports a chunk whose bytes do not match its record); every write's and every heal's plan is
//! [`plan_partial`] (the planner of partial-row writes and of the general heal path, `heal_row`), with what it
//! keeps between attempts ([`Known`]); chunks are judged by [`found_of`] and rows decoded by [`plan_row`] and the
//! real [`Codec`]; parity is [`encode_parity`]'s; the stale-range table is `weft_meta::stale::{mark, clear}`.
//! Simulated: the steps of `write_attempt` and `finish` between those calls (parity read, data read, plan, data
//! writes, parity writes, missed slots marked stale before the acknowledgement), each request to a server an event
//! of its own, so two writers, the healer and a reader interleave request by request; servers that go down and
//! come back; a server that crashes inside a write, after its bytes and before its record (the order
//! `versions.rs` writes them in), so the chunk reads torn.
//!
//! Checked at every landed write and every read: a version names one content (a data chunk's bytes written at a
//! version, and the bytes a parity chunk encodes for each version it names, never differ); every row a reader
//! decodes gives each chunk exactly the bytes its version names, at a version no older than the last write
//! acknowledged before the read began. After the faults stop: the healer empties the stale table and the row
//! decodes, nothing acknowledged lost. `WEFT_SIM_SEED=N` replays a seed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use weft_data::{DataError, ObjectStore};
use weft_proto::msg::{ChunkVersion, RowWrite, StaleRange};
use weft_sim::seeds::{self, Summary};
use weft_sim::{Queue, Rng};

use crate::ec_codec::Codec;
use crate::ec_version::{Found, plan_row, rename_unreached};
use crate::ec_write::{
    Known, PartialPlan, PartialShape, TORN_RETRIES_MAX, WRITE_ATTEMPTS_MAX, encode_parity, found_of, plan_partial,
};
use crate::recycle::Recycled;

const INO: u64 = 7;
const UNIT: usize = 4096;
const MS: u64 = 1000;
/// Writers, readers and faults run this long (simulated µs); then the servers come back and the healer finishes.
const BUSY_US: u64 = 2_000 * MS;
const END_US: u64 = BUSY_US + 60_000 * MS;
const WRITERS: usize = 2;

#[test]
fn ec_rows_decode_to_what_was_written_under_faults() {
    let where_ = "-p weft-client --lib";
    let total = seeds::run("ec_rows_decode_to_what_was_written_under_faults", where_, 150, run_one);
    for what in ["acked", "healed", "read", "torn write", "server down", "moved", "degraded read"] {
        assert!(total.get(what) > 0 || total.seeds < 20, "no '{what}' in {total}");
    }
}

#[test]
fn one_seed_replays_exactly() {
    let run = |dir: &str| {
        let mut w = World::new(3, &scratch(dir));
        let r = w.run();
        let out = (r, w.summary.clone(), w.names.clone());
        drop(w);
        out
    };
    assert_eq!(run("replay-a"), run("replay-b"));
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("weft-ec-sim-{}-{name}", std::process::id()))
}

fn run_one(seed: u64) -> Result<Summary, String> {
    let mut w = World::new(seed, &scratch(&seed.to_string()));
    w.run()?;
    Ok(w.summary.clone())
}

struct Server {
    store: ObjectStore,
    root: PathBuf,
    up: bool,
    /// The next write crashes the server after its bytes and before its record.
    crash_in_next_write: bool,
    /// A crash left its chunk torn, and no write has landed on it since.
    torn: bool,
}

#[derive(Debug, Clone)]
enum Job {
    Write { from: usize, run: Bytes },
    Heal { slot: usize, seq: u64 },
    Read,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    ReadParity,
    ReadData,
    WriteData,
    WriteParity,
}

/// A writer, the healer or a reader: one job at a time, one phase of requests at a time.
struct Actor {
    job: Option<Job>,
    phase: Phase,
    /// Replies to requests of an earlier phase are dropped.
    epoch: u64,
    waiting: usize,
    found: Vec<Option<(ChunkVersion, Bytes)>>,
    /// Slots the stale table listed when the job began (left out, as `stale_slots` leaves them).
    skip: Vec<usize>,
    lost: Vec<usize>,
    moved: bool,
    known: Known,
    attempts: u32,
    torn: u32,
    plan: Option<Planned>,
    /// Readers: the versions acknowledged when the read began.
    acked_at_start: Vec<u64>,
}

/// An attempt's plan ([`PartialPlan`] with its row frozen once, so every write sends slices of it).
struct Planned {
    row: Bytes,
    rewrite: Vec<bool>,
    versions: Vec<u64>,
}

#[derive(Debug)]
enum Req {
    Read,
    /// `row`: for a parity chunk, the data chunks it encodes (to check what its vector names).
    Write {
        rec: RowWrite,
        bytes: Bytes,
        row: Option<Bytes>,
    },
}

#[derive(Debug)]
enum Reply {
    Read(ChunkVersion, Bytes),
    Landed,
    Moved,
    Down,
}

#[derive(Debug)]
enum Ev {
    Start {
        actor: usize,
    },
    /// The job's next attempt, unless the actor moved on.
    Again {
        actor: usize,
        epoch: u64,
    },
    Request {
        actor: usize,
        epoch: u64,
        slot: usize,
        req: Req,
    },
    Reply {
        actor: usize,
        epoch: u64,
        slot: usize,
        reply: Reply,
    },
    Up {
        slot: usize,
    },
    Fault,
}

struct World {
    q: Queue<Ev>,
    rng: Rng,
    k: usize,
    m: usize,
    codec: Codec,
    bufs: Recycled,
    servers: Vec<Server>,
    actors: Vec<Actor>,
    /// The stale-range table's entry of each slot (one row: `[0, 1)`), as the MDS keeps it.
    stale: Vec<Vec<StaleRange>>,
    stale_seq: u64,
    /// (data chunk, version) → the bytes that version names, from every write that landed.
    names: BTreeMap<(usize, u64), Bytes>,
    /// Per data chunk: the version the last acknowledged write named.
    acked: Vec<u64>,
    writes: u64,
    broken: Option<String>,
    summary: Summary,
    dir: PathBuf,
    /// `WEFT_SIM_TRACE` set: every landed write, fault, stale mark, heal and failure on stderr.
    tracing: bool,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl World {
    fn new(seed: u64, dir: &Path) -> World {
        let mut rng = Rng::new(seed);
        let (k, m) = (2 + rng.below(3) as usize, 1 + rng.below(2) as usize);
        let _ = std::fs::remove_dir_all(dir);
        let servers = (0..k + m)
            .map(|i| {
                let root = dir.join(format!("ds{i}"));
                let store = ObjectStore::open(&root).expect("a scratch store");
                Server { store, root, up: true, crash_in_next_write: false, torn: false }
            })
            .collect();
        let mut q = Queue::new(10_000);
        let actors = (0..WRITERS + 2).map(|_| Actor::idle(k + m)).collect();
        for actor in 0..WRITERS + 2 {
            q.after(rng.below(5 * MS), Ev::Start { actor });
        }
        q.after(rng.below(50 * MS), Ev::Fault);
        let mut names = BTreeMap::new();
        for j in 0..k {
            names.insert((j, 0), Bytes::from(vec![0u8; UNIT]));
        }
        World {
            q,
            rng,
            k,
            m,
            codec: Codec::new(k, m).expect("a codec"),
            bufs: Recycled::default(),
            servers,
            actors,
            stale: vec![Vec::new(); k + m],
            stale_seq: 0,
            names,
            acked: vec![0; k],
            writes: 0,
            broken: None,
            summary: Summary { seeds: 1, ..Summary::default() },
            dir: dir.to_path_buf(),
            tracing: std::env::var_os("WEFT_SIM_TRACE").is_some(),
        }
    }

    fn run(&mut self) -> Result<(), String> {
        let shape = format!("ec {}+{}", self.k, self.m);
        while let Some(ev) = self.q.next_before(END_US) {
            self.summary.events += 1;
            self.on(ev);
            if let Some(why) = self.broken.take() {
                return Err(format!("{shape}, at {:.6} s: {why}", self.q.now_us() as f64 / 1e6));
            }
        }
        let summary = self.summary.clone();
        self.settled().map_err(|why| format!("{shape}, after the faults: {why} ({summary})"))
    }

    fn on(&mut self, ev: Ev) {
        match ev {
            Ev::Start { actor } => self.start(actor),
            Ev::Again { actor, epoch } if self.actors[actor].epoch == epoch => self.attempt(actor),
            Ev::Again { .. } => {}
            Ev::Request { actor, epoch, slot, req } => {
                let reply = self.serve(slot, req);
                if !matches!(reply, Reply::Read(..)) {
                    self.trace(|| format!("actor {actor} slot {slot}: {reply:?}"));
                }
                let delay = self.rng.between(20, 2 * MS);
                self.q.after(delay, Ev::Reply { actor, epoch, slot, reply });
            }
            Ev::Reply { actor, epoch, slot, reply } => self.reply(actor, epoch, slot, reply),
            Ev::Up { slot } => {
                self.trace(|| format!("server {slot} up"));
                self.servers[slot].up = true
            }
            Ev::Fault => self.fault(),
        }
    }

    fn trace(&self, line: impl FnOnce() -> String) {
        if self.tracing {
            eprintln!("{:.6} {}", self.q.now_us() as f64 / 1e6, line());
        }
    }

    fn busy(&self) -> bool {
        self.q.now_us() < BUSY_US
    }

    fn fault(&mut self) {
        if !self.busy() {
            return;
        }
        let next = self.rng.between(10 * MS, 150 * MS);
        self.q.after(next, Ev::Fault);
        // The code tolerates m chunks out of a row at once: a server down, a chunk stale (until healed) or torn
        // (until rewritten). More is a loss no code survives, so faults come only while fewer are out.
        let out: Vec<bool> = (0..self.servers.len()).map(|i| self.out(i)).collect();
        if out.iter().filter(|&&o| o).count() >= self.m {
            return;
        }
        let healthy: Vec<usize> = (0..out.len()).filter(|&i| !out[i]).collect();
        let slot = healthy[self.rng.index(healthy.len())];
        if self.rng.chance(500) {
            self.servers[slot].crash_in_next_write = true;
        } else if self.servers[slot].up {
            self.servers[slot].up = false;
            self.trace(|| format!("server {slot} down"));
            self.summary.count("server down");
            let back = self.rng.between(MS, 300 * MS);
            self.q.after(back, Ev::Up { slot });
        }
    }

    /// Whether chunk `slot` is out of its rows now, or about to be: a crash armed, or a job in flight left it out
    /// (its view said stale), so that job marks it stale again even if the healer clears it meanwhile.
    fn out(&self, slot: usize) -> bool {
        let s = &self.servers[slot];
        let skipped = self.actors.iter().any(|a| a.job.is_some() && a.skip.contains(&slot));
        !s.up || s.torn || s.crash_in_next_write || !self.stale[slot].is_empty() || skipped
    }

    /// A data server answers one request, as `weft-data` does.
    fn serve(&mut self, slot: usize, req: Req) -> Reply {
        let s = &mut self.servers[slot];
        if !s.up {
            return Reply::Down;
        }
        match req {
            Req::Read => {
                let mut buf = vec![0u8; UNIT];
                match s.store.read_rows(INO, UNIT as u32, 0, 1, Some(&mut buf)) {
                    Ok(mut v) => Reply::Read(v.remove(0), Bytes::from(buf)),
                    Err(e) => panic!("reading chunk {slot}: {e}"),
                }
            }
            Req::Write { rec, bytes, row } => {
                let crash = std::mem::take(&mut s.crash_in_next_write);
                let record = versions_file(&s.root);
                let before = crash.then(|| std::fs::read(&record).ok());
                match s.store.write_rows(INO, UNIT as u32, 0, std::slice::from_ref(&rec), &bytes) {
                    Ok(()) if crash => {
                        // Killed between the bytes and the record: the record is as it was.
                        match before.flatten() {
                            Some(old) => std::fs::write(&record, old).expect("restoring the record"),
                            None => std::fs::remove_file(&record).expect("removing the record"),
                        }
                        s.up = false;
                        s.torn = true;
                        self.summary.count("torn write");
                        let back = self.rng.between(MS, 300 * MS);
                        self.q.after(back, Ev::Up { slot });
                        Reply::Down
                    }
                    Ok(()) => {
                        s.torn = false;
                        self.trace(|| format!("landed on {slot}: {rec:?}"));
                        self.landed(slot, &rec, &bytes, row.as_ref());
                        Reply::Landed
                    }
                    Err(DataError::VersionMoved { .. }) => Reply::Moved,
                    Err(e) => panic!("writing chunk {slot}: {e}"),
                }
            }
        }
    }

    /// A write landed on `slot`: what its version (data) or vector (parity) names must be what was named before.
    fn landed(&mut self, slot: usize, rec: &RowWrite, bytes: &Bytes, row: Option<&Bytes>) {
        let (k, u) = (self.k, UNIT);
        let named: Vec<(usize, u64, Bytes)> = match row {
            None => vec![(slot, rec.version, bytes.clone())],
            Some(row) => (0..k).map(|j| (j, rec.parity_of[j], row.slice(j * u..(j + 1) * u))).collect(),
        };
        for (j, v, b) in named {
            match self.names.get(&(j, v)) {
                Some(had) if *had != b => {
                    self.broken = Some(format!(
                        "chunk {slot}'s write names data chunk {j} version {v} for bytes other than that version's \
                         (a version names one content, docs/format.md §17)"
                    ));
                }
                Some(_) => {}
                None => {
                    self.names.insert((j, v), b);
                }
            }
        }
    }

    fn start(&mut self, actor: usize) {
        let busy = self.busy();
        let job = match actor {
            a if a < WRITERS && busy => Some(self.new_write()),
            a if a == WRITERS => self.heal_job(),
            a if a == WRITERS + 1 && busy => Some(Job::Read),
            _ => None,
        };
        let Some(job) = job else {
            // The healer looks again while anything is stale, or may become stale (faults, writes in flight).
            let writing = self.actors.iter().any(|a| a.job.is_some());
            if actor == WRITERS && (busy || writing || self.stale.iter().any(|r| !r.is_empty())) {
                self.q.after(20 * MS, Ev::Start { actor });
            }
            return;
        };
        let mut skip: Vec<usize> = (0..self.k + self.m).filter(|&i| !self.stale[i].is_empty()).collect();
        if let Job::Heal { slot, .. } = job {
            skip.retain(|&i| i != slot);
        }
        let a = &mut self.actors[actor];
        *a = Actor::idle(self.k + self.m);
        a.skip = skip;
        a.acked_at_start = self.acked.clone();
        a.attempts = 1;
        a.job = Some(job.clone());
        if !matches!(job, Job::Read) {
            let what = match &job {
                Job::Write { from, run } => format!("write [{from}, {})", from + run.len()),
                other => format!("{other:?}"),
            };
            self.trace(|| format!("actor {actor} starts {what}, skipping {:?}", self.actors[actor].skip));
        }
        self.attempt(actor);
    }

    fn new_write(&mut self) -> Job {
        self.writes += 1;
        let row = self.k * UNIT;
        let aligned = self.rng.chance(300);
        let (from, len) = if aligned {
            let a = self.rng.index(self.k);
            let b = a + 1 + self.rng.index(self.k - a);
            (a * UNIT, (b - a) * UNIT)
        } else {
            let from = self.rng.index(row);
            (from, 1 + self.rng.index((row - from).min(3 * UNIT)))
        };
        let id = self.writes;
        let run: Vec<u8> = (0..len).map(|i| (id.wrapping_mul(131) ^ (from + i) as u64).wrapping_mul(7) as u8).collect();
        Job::Write { from, run: Bytes::from(run) }
    }

    /// The healer's next job: a stale slot whose server is up, with the seq of its range as listed.
    fn heal_job(&mut self) -> Option<Job> {
        let slots: Vec<usize> =
            (0..self.k + self.m).filter(|&i| !self.stale[i].is_empty() && self.servers[i].up).collect();
        let slot = *slots.get(self.rng.index(slots.len().max(1)))?;
        Some(Job::Heal { slot, seq: self.stale[slot][0].seq })
    }

    /// Sends one phase's requests (or, with none to send, goes straight on).
    fn send(&mut self, actor: usize, phase: Phase, reqs: Vec<(usize, Req)>) {
        let a = &mut self.actors[actor];
        a.phase = phase;
        a.epoch += 1;
        a.waiting = reqs.len();
        let epoch = a.epoch;
        if reqs.is_empty() {
            self.phase_done(actor);
            return;
        }
        for (slot, req) in reqs {
            let delay = self.rng.between(20, 2 * MS);
            self.q.after(delay, Ev::Request { actor, epoch, slot, req });
        }
    }

    /// Step 1 of an attempt: the parity chunks' records and bytes (a reader reads every chunk at once).
    fn attempt(&mut self, actor: usize) {
        let (k, m) = (self.k, self.m);
        let a = &mut self.actors[actor];
        a.found = vec![None; k + m];
        a.lost.clear();
        a.moved = false;
        let reading = matches!(a.job, Some(Job::Read));
        let which: Vec<usize> = if reading { (0..k + m).collect() } else { (k..k + m).collect() };
        let reqs = which.into_iter().filter(|i| !a.skip.contains(i)).map(|i| (i, Req::Read)).collect();
        let phase = if reading { Phase::ReadData } else { Phase::ReadParity };
        self.send(actor, phase, reqs);
    }

    fn reply(&mut self, actor: usize, epoch: u64, slot: usize, reply: Reply) {
        let a = &mut self.actors[actor];
        if a.epoch != epoch || a.phase == Phase::Idle {
            return;
        }
        match reply {
            Reply::Read(v, b) => a.found[slot] = Some((v, b)),
            Reply::Down => a.lost.push(slot),
            Reply::Moved => a.moved = true,
            Reply::Landed => {}
        }
        a.waiting -= 1;
        if a.waiting == 0 {
            self.phase_done(actor);
        }
    }

    fn phase_done(&mut self, actor: usize) {
        let k = self.k;
        let a = &self.actors[actor];
        match (a.phase, a.job.clone()) {
            (Phase::ReadParity, _) => {
                let reqs = (0..k).filter(|i| !a.skip.contains(i)).map(|i| (i, Req::Read)).collect();
                self.send(actor, Phase::ReadData, reqs);
            }
            (Phase::ReadData, Some(Job::Read)) => self.decode(actor),
            (Phase::ReadData, Some(job)) => self.plan(actor, &job),
            (Phase::WriteData, _) if a.moved => self.again(actor, "moved"),
            (Phase::WriteData, _) => self.write_parity(actor),
            (Phase::WriteParity, _) if a.moved => self.again(actor, "moved"),
            (Phase::WriteParity, Some(job)) => self.finish(actor, &job),
            (phase, job) => unreachable!("{phase:?} of {job:?}"),
        }
    }

    /// What each chunk was found as this attempt (`heal`: the chunk healed, its bytes not trusted).
    fn findings(&self, actor: usize, heal: Option<usize>) -> (Vec<Found>, Vec<Bytes>) {
        let a = &self.actors[actor];
        let fs = (0..self.k + self.m)
            .map(|i| match &a.found[i] {
                _ if a.skip.contains(&i) || a.lost.contains(&i) => Found::Unreachable,
                Some((v, _)) if Some(i) == heal => Found::Damaged { version: v.version },
                Some((v, _)) => found_of(v, true),
                None => Found::Unreachable,
            })
            .collect();
        let bytes = a.found.iter().map(|f| f.as_ref().map_or_else(Bytes::new, |(_, b)| b.clone())).collect();
        (fs, bytes)
    }

    /// Steps 2 and 3: the plan (`plan_partial`, as `write_attempt` calls it), then the data chunks' writes.
    fn plan(&mut self, actor: usize, job: &Job) {
        let (k, m, u) = (self.k, self.m, UNIT);
        if self.actors[actor].skip.len() + self.actors[actor].lost.len() > m {
            // `read_chunks`: chunks healed since the view was loaded are tried before the write gives up.
            return self.healed_since_or_fail(actor, job);
        }
        let a = &self.actors[actor];
        if let Job::Heal { slot, .. } = job
            && a.lost.contains(slot)
        {
            return self.fail(actor, "heal missed its chunk");
        }
        let (from, run, heal) = match job {
            Job::Write { from, run } => (*from, run.clone(), None),
            Job::Heal { slot, .. } => (0, Bytes::new(), Some(*slot)),
            Job::Read => unreachable!("reads decode"),
        };
        let (fs, bytes) = self.findings(actor, heal);
        let random = self.rng.next_u64();
        let shape = PartialShape { k, u, base: 0, from: from as u64, old_size: (k * u) as u64, random };
        let shown = self.tracing.then(|| format!("{fs:?}"));
        let a = &mut self.actors[actor];
        let plan = match plan_partial(&shape, &self.codec, fs, &bytes, &mut a.known, heal, &run) {
            Ok(plan) => plan,
            Err(e) if a.torn >= TORN_RETRIES_MAX => {
                self.trace(|| format!("actor {actor} {job:?}: {e}: {}", shown.unwrap_or_default()));
                return self.fail(actor, "torn row");
            }
            Err(_) => {
                // `write_batch` retries a torn row apart from its compare-and-set attempts.
                a.torn += 1;
                self.summary.count("torn row retried");
                let delay = self.rng.between(5 * MS, 50 * MS);
                return self.later(actor, delay);
            }
        };
        let PartialPlan { row, rewrite, versions } = plan;
        let plan = Planned { row: Bytes::from(row), rewrite, versions };
        let b = &plan.row;
        for j in (0..k).filter(|&j| !plan.rewrite[j]) {
            a.known.learn(j, plan.versions[j], b.slice(j * u..(j + 1) * u));
        }
        let expect = |i: usize| a.found[i].as_ref().map_or(0, |(v, _)| v.version);
        let reqs = (0..k)
            .filter(|&j| plan.rewrite[j])
            .map(|j| {
                let rec = RowWrite { expect: expect(j), version: plan.versions[j], parity_of: Vec::new() };
                (j, Req::Write { rec, bytes: b.slice(j * u..(j + 1) * u), row: None })
            })
            .collect();
        a.plan = Some(plan);
        self.send(actor, Phase::WriteData, reqs);
    }

    /// Step 4: the data chunks that landed are kept (`learn_written`), then every parity chunk is written.
    fn write_parity(&mut self, actor: usize) {
        let (k, u) = (self.k, UNIT);
        let random = self.rng.next_u64();
        let parity_found = self.findings(actor, None).0.split_off(k);
        let a = &mut self.actors[actor];
        let plan = a.plan.as_mut().expect("planned");
        let row = plan.row.clone();
        for j in (0..k).filter(|&j| plan.rewrite[j] && !a.lost.contains(&j)) {
            a.known.landed(j, plan.versions[j], row.slice(j * u..(j + 1) * u));
        }
        // `rename_unlanded`: a data chunk whose write was lost is named at a fresh unreachable version.
        let unlanded: Vec<usize> = (0..k).filter(|&j| plan.rewrite[j] && a.lost.contains(&j)).collect();
        rename_unreached(&mut plan.versions, &unlanded, &parity_found, random);
        for &j in &unlanded {
            a.known.learn(j, plan.versions[j], row.slice(j * u..(j + 1) * u));
        }
        let shards: Vec<&[u8]> = row.chunks_exact(u).collect();
        let parity = encode_parity(&self.codec, &shards, u, &self.bufs);
        let mut reqs = Vec::new();
        for (p, pb) in parity.into_iter().enumerate() {
            let i = k + p;
            if a.skip.contains(&i) || a.found[i].is_none() {
                continue;
            }
            let expect = a.found[i].as_ref().map_or(0, |(v, _)| v.version);
            let rec = RowWrite { expect, version: expect + 1, parity_of: plan.versions.clone() };
            reqs.push((i, Req::Write { rec, bytes: pb.freeze(), row: Some(row.clone()) }));
        }
        self.send(actor, Phase::WriteParity, reqs);
    }

    /// `finish`: a heal that missed its chunk fails; up to `m` missed slots are marked stale, then the write is
    /// acknowledged (a heal clears what it healed, only if no mark came meanwhile).
    fn finish(&mut self, actor: usize, job: &Job) {
        let a = &self.actors[actor];
        let heal = match job {
            Job::Heal { slot, seq } => Some((*slot, *seq)),
            _ => None,
        };
        if heal.is_some_and(|(slot, _)| a.lost.contains(&slot)) {
            return self.fail(actor, "heal missed its chunk");
        }
        let mut missed: Vec<usize> = a.skip.iter().chain(&a.lost).copied().collect();
        missed.sort_unstable();
        missed.dedup();
        if missed.len() > self.m {
            return self.healed_since_or_fail(actor, job);
        }
        let versions = a.plan.as_ref().expect("planned").versions.clone();
        self.trace(|| format!("actor {actor} marks stale {missed:?}"));
        for slot in missed {
            self.stale_seq += 1;
            weft_meta::stale::mark(&mut self.stale[slot], 0, 1, self.stale_seq, 64);
        }
        match heal {
            Some((slot, seq)) => {
                self.trace(|| format!("actor {actor} healed {slot} (seq {seq})"));
                weft_meta::stale::clear(&mut self.stale[slot], 0, 1, seq);
                self.summary.count("healed");
            }
            None => {
                self.trace(|| format!("actor {actor} acked {versions:?}"));
                self.acked = versions;
                self.summary.count("acked");
            }
        }
        self.done(actor);
    }

    /// A reader's decode, as `decode_rows` does it, and the checks of what it returns.
    fn decode(&mut self, actor: usize) {
        let (k, m, u) = (self.k, self.m, UNIT);
        let (fs, bytes) = self.findings(actor, None);
        let plan = match plan_row(k, m, &fs) {
            Ok(plan) => plan,
            Err(_) => {
                self.summary.count("degraded read");
                return self.done(actor);
            }
        };
        let mut data = vec![0u8; k * u];
        for j in (0..k).filter(|&j| plan.use_chunk[j]) {
            data[j * u..(j + 1) * u].copy_from_slice(&bytes[j]);
        }
        if !plan.use_chunk[..k].iter().all(|&x| x) {
            let mut scratch = vec![0u8; m * u];
            for (p, spare) in scratch.chunks_exact_mut(u).enumerate().filter(|(p, _)| plan.use_chunk[k + p]) {
                spare.copy_from_slice(&bytes[k + p]);
            }
            let shards: Vec<&mut [u8]> = data.chunks_exact_mut(u).chain(scratch.chunks_exact_mut(u)).collect();
            if let Err(e) = self.codec.reconstruct_data_in_place(shards, &plan.use_chunk) {
                self.broken = Some(format!("a planned decode failed: {e}"));
                return;
            }
        }
        self.summary.count("read");
        self.summary.checks += 1;
        let acked = self.actors[actor].acked_at_start.clone();
        if let Err(why) = self.check_row(&plan.data_versions, &data, &acked) {
            self.broken = Some(format!("a read {why} (found {fs:?})"));
        }
        self.done(actor);
    }

    /// Each data chunk has exactly the bytes its version names, at a version no older than `acked`'s.
    fn check_row(&self, versions: &[u64], data: &[u8], acked: &[u64]) -> Result<(), String> {
        for (j, &v) in versions.iter().enumerate() {
            let got = &data[j * UNIT..(j + 1) * UNIT];
            match self.names.get(&(j, v)) {
                None => return Err(format!("gave data chunk {j} at version {v}, which no write named")),
                Some(b) if b[..] != *got => {
                    let at = b.iter().zip(got).position(|(x, y)| x != y).unwrap_or(0);
                    return Err(format!("gave wrong bytes for data chunk {j} version {v} (first at byte {at})"));
                }
                Some(_) if v < acked[j] => {
                    return Err(format!("lost an acknowledged write: data chunk {j} at version {v} < {}", acked[j]));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Too many chunks missed: if the stale table no longer lists one the view left out, the job goes again with
    /// the table as it is now (`read_chunks`' `healed_since`, `finish`'s `healed_meanwhile`); else it fails.
    fn healed_since_or_fail(&mut self, actor: usize, job: &Job) {
        let heal = match job {
            Job::Heal { slot, .. } => Some(*slot),
            _ => None,
        };
        let now: Vec<usize> = (0..self.k + self.m).filter(|&i| !self.stale[i].is_empty() && Some(i) != heal).collect();
        let a = &mut self.actors[actor];
        if a.skip.iter().all(|i| now.contains(i)) {
            return self.fail(actor, "degraded");
        }
        a.skip = now;
        self.again(actor, "healed since")
    }

    fn again(&mut self, actor: usize, why: &'static str) {
        self.trace(|| format!("actor {actor} again: {why}"));
        self.summary.count(why);
        if self.actors[actor].attempts >= WRITE_ATTEMPTS_MAX {
            return self.fail(actor, "conflict");
        }
        self.actors[actor].attempts += 1;
        let delay = self.rng.between(100, 2 * MS);
        self.later(actor, delay);
    }

    /// The next attempt of the job after `delay_us` (a new phase generation, so late replies are dropped).
    fn later(&mut self, actor: usize, delay_us: u64) {
        let a = &mut self.actors[actor];
        a.epoch += 1;
        a.phase = Phase::Idle;
        let epoch = a.epoch;
        self.q.after(delay_us, Ev::Again { actor, epoch });
    }

    fn fail(&mut self, actor: usize, why: &'static str) {
        self.trace(|| format!("actor {actor} failed: {why}"));
        self.summary.count(why);
        self.done(actor);
    }

    fn done(&mut self, actor: usize) {
        let a = &mut self.actors[actor];
        a.phase = Phase::Idle;
        a.job = None;
        a.epoch += 1;
        let pause = self.rng.between(0, 10 * MS);
        self.q.after(pause, Ev::Start { actor });
    }

    /// After the faults: nothing stale, and the row decodes from every chunk to what was acknowledged (or later).
    fn settled(&mut self) -> Result<(), String> {
        if let Some(slot) = (0..self.k + self.m).find(|&i| !self.stale[i].is_empty()) {
            return Err(format!("chunk {slot} is still stale: the healer did not finish"));
        }
        let (k, m, u) = (self.k, self.m, UNIT);
        let mut fs = Vec::new();
        let mut data = vec![0u8; k * u];
        for (i, s) in self.servers.iter().enumerate() {
            let mut buf = vec![0u8; u];
            let v = s.store.read_rows(INO, u as u32, 0, 1, Some(&mut buf)).map_err(|e| e.to_string())?.remove(0);
            if i < k {
                data[i * u..(i + 1) * u].copy_from_slice(&buf);
            }
            fs.push(found_of(&v, true));
        }
        let plan = plan_row(k, m, &fs).map_err(|e| format!("the row does not decode: {e} ({fs:?})"))?;
        if plan.use_chunk[..k].iter().any(|&x| !x) || !plan.repair.is_empty() {
            return Err(format!("the row is not whole after healing: {fs:?}"));
        }
        self.summary.checks += 1;
        self.check_row(&plan.data_versions, &data, &self.acked.clone())
    }
}

impl Actor {
    fn idle(chunks: usize) -> Actor {
        Actor {
            job: None,
            phase: Phase::Idle,
            epoch: 0,
            waiting: 0,
            found: vec![None; chunks],
            skip: Vec::new(),
            lost: Vec::new(),
            moved: false,
            known: Known::default(),
            attempts: 0,
            torn: 0,
            plan: None,
            acked_at_start: Vec::new(),
        }
    }
}

/// The chunk-version sidecar of the object, under a store root (`weft-data` `versions_path`).
fn versions_file(root: &Path) -> PathBuf {
    root.join("objects").join(format!("{:02x}", INO & 0xff)).join(format!("{INO:016x}.ver"))
}
