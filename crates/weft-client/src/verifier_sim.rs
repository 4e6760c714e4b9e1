//! Lost unsynced writes, simulated (issue 30 item 3; docs/format.md §33): a `mirror 2` file whose data servers'
//! machines lose power, and what a sync may promise afterwards.
//!
//! Real code: what a handle keeps of each server's write verifier and its client's session before its writes
//! ([`Kept`]), what the client learns ([`Verifiers`]: at connect, from every `FsyncVerified`), the sync's judgement
//! ([`lost`]: the same session, else the same verifier) and the verifiers themselves
//! ([`weft_data::verifier::of_boot_id`] of each boot). Sessions are the RPC layer's: one per (client, server
//! process), renewed by the client when its request meets a restarted process. Simulated: each data server's disk as a
//! page cache over durable blocks (a write lands in the cache; `Fsync` makes the object's cache durable; a power
//! loss drops the cache and boots with another boot id; a `kill -9` keeps it and the boot); two handles of one
//! client writing their own blocks to both copies at once, each request and reply an event with its own delay (so
//! a write sent before a power loss can land after the reboot, and a sync race another handle's writes); a write
//! that fails at one copy recorded stale there before its acknowledgement (`stale::record_missed`), a sync whose
//! server failed or whose verifier moved the same (`File::sync_objects`); a healer copying a stale block from the
//! other copy, syncing it with its verifier checked, and clearing the mark only if nothing marked it since; readers
//! that read a copy the stale table does not exclude. One fault at a time, as the layout tolerates one: a power
//! loss or a crash strikes only when every server is up, every handle has synced whole since the last fault (its
//! effects found, its false alarms over: §33), and the stale table names no other server (a heal to the same one
//! may be in flight). The healer copies a block no write is on the way to (the
//! race with a write whose copies land apart is the fences' part, simulated in weft-sim's `mirror.rs`).
//!
//! Checked at every read: the value is at least what the last successful sync promised for that block (no synced
//! write lost). At the end, after the faults stop, every handle's last sync and the healer: the stale table is
//! empty and both copies hold every block's last acknowledged value. Without the verifier check
//! (`the_loss_is_found_without_the_verifiers`) the same worlds read values older than a sync promised: the
//! simulation can fail. `WEFT_SIM_SEED=N` replays a seed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use weft_sim::seeds::{self, Summary};
use weft_sim::{Queue, Rng};

use crate::verifier::{Answer, Before, Kept, Verifiers, lost};

const MS: u64 = 1000;
const COPIES: usize = 2;
const HANDLES: usize = 2;
const BLOCKS_PER_HANDLE: usize = 4;
const BLOCKS: usize = HANDLES * BLOCKS_PER_HANDLE;
const WRITES_PER_HANDLE: u64 = 60;
/// Faults strike before this (simulated µs); then the handles finish, sync, and the healer drains the table.
const BUSY_US: u64 = 3_000 * MS;
const END_US: u64 = 600_000 * MS;

#[test]
fn no_synced_write_is_lost_to_a_reboot() {
    let total = seeds::run("no_synced_write_is_lost_to_a_reboot", "-p weft-client --lib", 2000, |seed| {
        World::new(seed, true).run()
    });
    let seen = [
        "write acknowledged",
        "sync promised",
        "power loss",
        "crash",
        "verifier moved",
        "healed",
        "heal lost to a reboot",
        "read",
    ];
    for what in seen {
        assert!(total.get(what) > 0 || total.seeds < 50, "no '{what}' in {total}");
    }
    assert!(total.checks > total.seeds);
}

#[test]
fn the_loss_is_found_without_the_verifiers() {
    let broken = (1..=300).filter(|&seed| World::new(seed, false).run().is_err()).count();
    assert!(broken > 0, "300 worlds without verifiers and no synced write ever lost: the simulation cannot fail");
    eprintln!("without the verifiers, {broken} of 300 worlds lost a synced write");
}

#[test]
fn one_seed_replays_exactly() {
    let run = |seed| {
        let mut w = World::new(seed, true);
        let s = w.run().expect("the seed passes");
        (s, w.log)
    };
    assert_eq!(run(11), run(11));
}

/// One data server's disk: durable blocks under a page cache, and the boot it runs in.
struct Server {
    durable: [u64; BLOCKS],
    cache: BTreeMap<usize, u64>,
    boot: u64,
    /// Process starts (a crash or a power loss each ends one): a session lives in one.
    process: u64,
    up: bool,
}

/// A client's view of the servers: what it learned of their verifiers and the session it holds with each. The
/// handles share one client; the healer is another.
struct Conn {
    verifiers: Verifiers,
    session: [u64; COPIES],
}

const WRITERS: usize = 0;
const HEALER: usize = 1;

/// The id of client `c`'s session with process `process` of server `s` (random in the RPC layer: unique here).
fn session_id(c: usize, s: usize, process: u64) -> u64 {
    1 + c as u64 + 2 * s as u64 + 4 * process
}

impl Server {
    fn verifier(&self) -> u64 {
        weft_data::verifier::of_boot_id(&format!("boot-{}", self.boot))
    }

    fn read(&self, block: usize) -> u64 {
        self.cache.get(&block).copied().unwrap_or(self.durable[block])
    }

    fn sync(&mut self) {
        for (b, v) in std::mem::take(&mut self.cache) {
            self.durable[b] = v;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Handle(usize),
    Healer,
}

impl Who {
    fn client(self) -> usize {
        if self == Who::Healer { HEALER } else { WRITERS }
    }
}

/// A server's answer: its verifier (0 for a write), and the session it came on (`None`: renewed meanwhile).
type Synced = Option<(u64, Option<u64>)>;

#[derive(Debug)]
enum Req {
    Write { block: usize, value: u64 },
    Fsync,
}

#[derive(Debug)]
enum Ev {
    Next(Who),
    /// Stamped with the session the client held when it sent it.
    Deliver {
        server: usize,
        req: Req,
        from: Who,
        round: u64,
        session: u64,
    },
    /// `None`: the server was down (the request failed); `Some(..)`: done (what an `Fsync` answers).
    Reply {
        to: Who,
        round: u64,
        server: usize,
        answer: Synced,
    },
    Fault,
    Up(usize),
    Read,
}

/// How a sync ended: every server synced with its verifier as kept; some marked stale; or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Whole,
    Degraded,
    Failed,
}

/// What a handle is waiting for.
enum Pending {
    Write {
        block: usize,
        value: u64,
        answers: [Option<Synced>; COPIES],
    },
    Sync {
        kept: HashMap<u32, Before>,
        blocks: BTreeSet<usize>,
        promise: BTreeMap<usize, u64>,
        answers: [Option<Synced>; COPIES],
        started_us: u64,
    },
}

struct Handle {
    kept: Kept,
    /// Blocks written since the last sync (the rows a failed server is marked stale over).
    unsynced: BTreeSet<usize>,
    /// Each block's last acknowledged value since the last failed sync: what a successful sync promises.
    promisable: BTreeMap<usize, u64>,
    pending: Option<Pending>,
    writes: u64,
    round: u64,
    done: bool,
    /// A sync begun after the last fault found every server synced and its verifier as kept (or the handle is
    /// done): that fault's effects on its writes are found, and its client knows the verifiers now (until then a
    /// handle's writes may be judged lost when they were not: a false alarm, marking a healthy copy stale).
    clean: bool,
}

/// The healer's copy in flight: the stale mark it heals (and its generation), what it kept before writing.
struct Heal {
    server: usize,
    block: usize,
    generation: u64,
    kept: HashMap<u32, Before>,
    round: u64,
}

struct World {
    q: Queue<Ev>,
    rng: Rng,
    check: bool,
    servers: Vec<Server>,
    conns: [Conn; 2],
    handles: Vec<Handle>,
    /// The stale table: (server, block) → the generation of its last mark.
    stale: BTreeMap<(usize, usize), u64>,
    generation: u64,
    heal: Option<Heal>,
    healer_round: u64,
    /// Write requests on their way to a server, per block.
    inflight: [u32; BLOCKS],
    last_fault_us: u64,
    /// Per block: what the last successful sync promised, and the last acknowledged value.
    promised: [u64; BLOCKS],
    acked: [u64; BLOCKS],
    next_value: u64,
    summary: Summary,
    log: Vec<String>,
    broken: Option<String>,
}

impl World {
    fn new(seed: u64, check: bool) -> World {
        let servers =
            (0..COPIES).map(|_| Server { durable: [0; BLOCKS], cache: BTreeMap::new(), boot: 0, process: 0, up: true });
        let conn = |c| Conn { verifiers: Verifiers::default(), session: std::array::from_fn(|s| session_id(c, s, 0)) };
        let handle = || Handle {
            kept: Kept::default(),
            unsynced: BTreeSet::new(),
            promisable: BTreeMap::new(),
            pending: None,
            writes: 0,
            round: 0,
            done: false,
            clean: true,
        };
        let mut w = World {
            q: Queue::new(10_000),
            rng: Rng::new(seed),
            check,
            servers: servers.collect(),
            conns: [conn(WRITERS), conn(HEALER)],
            handles: (0..HANDLES).map(|_| handle()).collect(),
            stale: BTreeMap::new(),
            generation: 0,
            heal: None,
            healer_round: 0,
            inflight: [0; BLOCKS],
            last_fault_us: 0,
            promised: [0; BLOCKS],
            acked: [0; BLOCKS],
            next_value: 1,
            summary: Summary::default(),
            log: Vec::new(),
            broken: None,
        };
        // The client's connections, each asked its verifier before it carries a write.
        for s in 0..COPIES {
            for c in &w.conns {
                c.verifiers.connected(s as u32, w.servers[s].verifier());
            }
        }
        for h in 0..HANDLES {
            w.q.after(0, Ev::Next(Who::Handle(h)));
        }
        w.q.after(0, Ev::Next(Who::Healer));
        w.q.after(0, Ev::Fault);
        w.q.after(0, Ev::Read);
        w
    }

    fn run(&mut self) -> Result<Summary, String> {
        while let Some(ev) = self.q.next_before(END_US) {
            self.step(ev);
            if let Some(b) = self.broken.take() {
                return Err(format!("{b}\n  last events:\n    {}", self.tail()));
            }
        }
        self.finish()?;
        Ok(self.summary.clone())
    }

    fn tail(&self) -> String {
        let from = self.log.len().saturating_sub(20);
        self.log[from..].join("\n    ")
    }

    fn note(&mut self, what: String) {
        self.log.push(format!("{:>10} µs {what}", self.q.now_us()));
    }

    fn delay(&mut self) -> u64 {
        // Mostly fast, sometimes slow enough that a message outlives a reboot.
        if self.rng.chance(100) { self.rng.between(50 * MS, 400 * MS) } else { self.rng.between(50, 2 * MS) }
    }

    fn send(&mut self, server: usize, req: Req, from: Who, round: u64) {
        let d = self.delay();
        let session = self.conns[from.client()].session[server];
        self.q.after(d, Ev::Deliver { server, req, from, round, session });
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Next(Who::Handle(h)) => self.handle_next(h),
            Ev::Next(Who::Healer) => self.healer_next(),
            Ev::Deliver { server, req, from, round, session } => self.deliver(server, req, from, round, session),
            Ev::Reply { to, round, server, answer } => {
                // The session the answer came on, if the client still holds it (else it changed meanwhile).
                let held = self.conns[to.client()].session[server];
                let answer = answer.map(|(v, on)| (v, on.filter(|&s| s == held)));
                match to {
                    Who::Handle(h) => self.handle_reply(h, round, server, answer),
                    Who::Healer => self.healer_reply(round, server, answer),
                }
            }
            Ev::Fault => self.fault(),
            Ev::Up(s) => {
                self.servers[s].up = true;
                self.note(format!("server {s} up, boot {}", self.servers[s].boot));
            }
            Ev::Read => self.read(),
        }
    }

    fn deliver(&mut self, server: usize, req: Req, from: Who, round: u64, stamped: u64) {
        if let Req::Write { block, .. } = req {
            self.inflight[block] -= 1;
        }
        let c = from.client();
        let s = &mut self.servers[server];
        let answer = if !s.up {
            None
        } else {
            // A session of an earlier process is refused, and the client renews it before the request runs.
            let current = session_id(c, server, s.process);
            self.conns[c].session[server] = current;
            let on = (stamped == current).then_some(current);
            match req {
                Req::Write { block, value } => {
                    s.cache.insert(block, value);
                    Some((0, on))
                }
                Req::Fsync => {
                    s.sync();
                    Some((s.verifier(), on))
                }
            }
        };
        let d = self.delay();
        self.q.after(d, Ev::Reply { to: from, round, server, answer });
    }

    fn handle_next(&mut self, h: usize) {
        let hd = &mut self.handles[h];
        if hd.pending.is_some() || hd.done {
            return;
        }
        let last = hd.writes >= WRITES_PER_HANDLE;
        if last || (!hd.unsynced.is_empty() && self.rng.chance(250)) {
            self.start_sync(h, last);
            return;
        }
        let block = h * BLOCKS_PER_HANDLE + self.rng.index(BLOCKS_PER_HANDLE);
        let value = self.next_value;
        self.next_value += 1;
        let hd = &mut self.handles[h];
        hd.writes += 1;
        hd.round += 1;
        // Before sending: the positions it changes, and the verifiers known now (`File::add_unsynced`).
        hd.unsynced.insert(block);
        let conn = &self.conns[WRITERS];
        for s in 0..COPIES {
            hd.kept.before_write(s as u32, &conn.verifiers, || Some(conn.session[s]));
        }
        hd.pending = Some(Pending::Write { block, value, answers: [None; COPIES] });
        let round = hd.round;
        for s in 0..COPIES {
            self.inflight[block] += 1;
            self.send(s, Req::Write { block, value }, Who::Handle(h), round);
        }
    }

    fn start_sync(&mut self, h: usize, last: bool) {
        let hd = &mut self.handles[h];
        if hd.unsynced.is_empty() {
            hd.done = last;
            hd.clean |= last;
            return;
        }
        hd.round += 1;
        let kept = hd.kept.take();
        let blocks = std::mem::take(&mut hd.unsynced);
        let promise = hd.promisable.clone();
        let started_us = self.q.now_us();
        hd.pending = Some(Pending::Sync { kept, blocks, promise, answers: [None; COPIES], started_us });
        let round = hd.round;
        for s in 0..COPIES {
            self.send(s, Req::Fsync, Who::Handle(h), round);
        }
    }

    fn handle_reply(&mut self, h: usize, round: u64, server: usize, answer: Synced) {
        let hd = &mut self.handles[h];
        if round != hd.round {
            return;
        }
        let answers = match hd.pending.as_mut() {
            Some(Pending::Write { answers, .. } | Pending::Sync { answers, .. }) => answers,
            None => return,
        };
        answers[server] = Some(answer);
        if answers.iter().any(Option::is_none) {
            return;
        }
        match hd.pending.take().expect("pending") {
            Pending::Write { block, value, answers } => self.write_done(h, block, value, answers),
            Pending::Sync { kept, blocks, promise, answers, started_us } => {
                if self.sync_done(h, kept, blocks, promise, answers) == Outcome::Whole
                    && started_us > self.last_fault_us
                {
                    self.handles[h].clean = true;
                }
            }
        }
        let d = self.rng.between(10, 3 * MS);
        self.q.after(d, Ev::Next(Who::Handle(h)));
    }

    fn write_done(&mut self, h: usize, block: usize, value: u64, answers: [Option<Synced>; COPIES]) {
        let failed: Vec<usize> = (0..COPIES).filter(|&s| answers[s] == Some(None)).collect();
        if failed.len() == COPIES {
            self.summary.count("write failed");
            self.note(format!("handle {h}: write {value} of block {block} failed everywhere"));
            return;
        }
        // At most the tolerance failed: recorded stale before the acknowledgement.
        for &s in &failed {
            self.mark(s, block, "degraded write");
        }
        self.acked[block] = value;
        self.handles[h].promisable.insert(block, value);
        self.summary.count("write acknowledged");
        self.note(format!("handle {h}: write {value} of block {block} acknowledged (missed {failed:?})"));
    }

    fn sync_done(
        &mut self,
        h: usize,
        kept: HashMap<u32, Before>,
        blocks: BTreeSet<usize>,
        promise: BTreeMap<usize, u64>,
        answers: [Option<Synced>; COPIES],
    ) -> Outcome {
        let mut failed: Vec<usize> = (0..COPIES).filter(|&s| answers[s] == Some(None)).collect();
        let synced: Vec<Answer> = (0..COPIES)
            .filter_map(|s| {
                let (verifier, session) = answers[s].flatten()?;
                Some(Answer { slot: s, server: s as u32, verifier, session })
            })
            .collect();
        let verifiers = &self.conns[WRITERS].verifiers;
        for a in &synced {
            verifiers.answered(a.server, a.verifier);
        }
        let moved = if self.check { lost(&kept, |s| verifiers.get(s), &synced) } else { Vec::new() };
        for m in &moved {
            self.summary.count("verifier moved");
            failed.push(m.slot);
        }
        let hd = &mut self.handles[h];
        if failed.len() >= COPIES {
            // More than the layout tolerates: the sync fails, its writes stay to be synced, a loss is reported once
            // (`File::sync_objects`); nothing written before it is promised by a later sync.
            hd.kept.restore(kept);
            hd.unsynced.extend(blocks);
            moved.iter().for_each(|m| hd.kept.reported(m.server, m.now));
            hd.promisable.clear();
            self.summary.count("sync failed");
            self.note(format!("handle {h}: sync failed ({failed:?})"));
            return Outcome::Failed;
        }
        for &s in &failed {
            for &b in &blocks {
                self.mark(s, b, "sync");
            }
        }
        for (&b, &v) in &promise {
            self.promised[b] = self.promised[b].max(v);
        }
        self.summary.count("sync promised");
        self.note(format!("handle {h}: sync promised {promise:?} (marked {failed:?})"));
        if failed.is_empty() { Outcome::Whole } else { Outcome::Degraded }
    }

    fn mark(&mut self, server: usize, block: usize, why: &str) {
        self.generation += 1;
        self.stale.insert((server, block), self.generation);
        self.note(format!("stale: server {server} block {block} ({why})"));
    }

    fn healer_next(&mut self) {
        let d = self.rng.between(20 * MS, 200 * MS);
        self.q.after(d, Ev::Next(Who::Healer));
        if self.heal.is_some() {
            return;
        }
        // A mark whose other copy is fresh and both servers up; the copy is one step (the fences' part, §32).
        let Some((&(server, block), &generation)) = self.stale.iter().find(|((s, b), _)| {
            let other = 1 - s;
            !self.stale.contains_key(&(other, *b)) && self.inflight[*b] == 0 && self.servers.iter().all(|x| x.up)
        }) else {
            return;
        };
        // The target's verifier and session asked first (`Client::verifier_now`; renewing the session if the target
        // restarted since), then the copy, in one step here.
        let conn = &mut self.conns[HEALER];
        let target = &mut self.servers[server];
        conn.session[server] = session_id(HEALER, server, target.process);
        conn.verifiers.answered(server as u32, target.verifier());
        let before = Before { verifier: Some(target.verifier()), session: Some(conn.session[server]) };
        let kept = HashMap::from([(server as u32, before)]);
        let value = self.servers[1 - server].read(block);
        self.servers[server].cache.insert(block, value);
        self.healer_round += 1;
        self.heal = Some(Heal { server, block, generation, kept, round: self.healer_round });
        self.send(server, Req::Fsync, Who::Healer, self.healer_round);
    }

    fn healer_reply(&mut self, round: u64, server: usize, answer: Synced) {
        let Some(heal) = self.heal.take_if(|h| h.round == round) else { return };
        let Some((verifier, session)) = answer else { return };
        let verifiers = &self.conns[HEALER].verifiers;
        verifiers.answered(server as u32, verifier);
        let answer = Answer { slot: server, server: server as u32, verifier, session };
        if self.check && !lost(&heal.kept, |s| verifiers.get(s), &[answer]).is_empty() {
            self.summary.count("heal lost to a reboot");
            return;
        }
        if self.stale.get(&(heal.server, heal.block)) == Some(&heal.generation) {
            self.stale.remove(&(heal.server, heal.block));
            self.summary.count("healed");
            self.note(format!("healed server {} block {}", heal.server, heal.block));
        }
    }

    fn fault(&mut self) {
        if self.q.now_us() >= BUSY_US {
            return;
        }
        let d = self.rng.between(100 * MS, 600 * MS);
        self.q.after(d, Ev::Fault);
        if self.servers.iter().any(|s| !s.up) || self.handles.iter().any(|h| !h.clean) {
            return;
        }
        // One machine at a time: the one whose marks are not healed yet (a heal to it may be in flight), or any.
        let s = match self.stale.keys().next() {
            Some(&(s, _)) if self.stale.keys().all(|&(x, _)| x == s) => s,
            Some(_) => return,
            None => self.rng.index(COPIES),
        };
        self.last_fault_us = self.q.now_us();
        self.handles.iter_mut().filter(|h| !h.done).for_each(|h| h.clean = false);
        let server = &mut self.servers[s];
        server.up = false;
        server.process += 1;
        if self.rng.chance(600) {
            server.cache.clear();
            server.boot += 1;
            self.summary.count("power loss");
            self.note(format!("server {s} loses power"));
        } else {
            self.summary.count("crash");
            self.note(format!("server {s} killed"));
        }
        let d = self.rng.between(5 * MS, 100 * MS);
        self.q.after(d, Ev::Up(s));
    }

    fn read(&mut self) {
        let d = self.rng.between(MS, 10 * MS);
        if self.q.now_us() < BUSY_US {
            self.q.after(d, Ev::Read);
        }
        let block = self.rng.index(BLOCKS);
        let copies: Vec<usize> =
            (0..COPIES).filter(|&s| self.servers[s].up && !self.stale.contains_key(&(s, block))).collect();
        if copies.is_empty() {
            return;
        }
        let s = copies[self.rng.index(copies.len())];
        let got = self.servers[s].read(block);
        self.summary.checks += 1;
        self.summary.count("read");
        if got < self.promised[block] {
            self.broken = Some(format!(
                "block {block} read {got} from server {s}, older than the {} a sync promised",
                self.promised[block]
            ));
        }
    }

    fn finish(&mut self) -> Result<(), String> {
        if let Some(((s, b), _)) = self.stale.iter().next() {
            return Err(format!("server {s} block {b} still stale at the end\n    {}", self.tail()));
        }
        for b in 0..BLOCKS {
            for s in 0..COPIES {
                let got = self.servers[s].read(b);
                self.summary.checks += 1;
                if got != self.acked[b] {
                    return Err(format!(
                        "server {s} block {b} holds {got} at the end, the last acknowledged write was {}\n    {}",
                        self.acked[b],
                        self.tail()
                    ));
                }
            }
        }
        Ok(())
    }
}
