//! Mirror copies and the copier between them, simulated (issue 30 item 3; docs/format.md §32).
//!
//! Real code: each copy's write fence, the data server's own table (`weft_data::fences::Fences`: epochs, range
//! holds, the persisted high-water mark reopened after a restart). Simulated, as `mirror_fence.rs` and `mirror.rs`
//! run them: two writers, each rewriting its own half of a file's blocks one write at a time, every write sent to
//! both copies at once, each copy at the epoch the writer knows, done again on every copy after a refusal (an
//! epoch asked after `EpochMoved`, a pause after `Held`); a copier (the healer's catch-up, a read's repair) copying
//! a range from one copy onto the other: hold the target, raise the source, read it, write the target under the
//! hold, release; and dies mid-copy now and then, its hold left to expire (the tables' clock is the simulated
//! one). The network delays every message (sometimes by seconds, so a write's two copies land far apart)
//! and reorders them; the data servers restart (their holds and in-memory epochs lost, the high-water mark read
//! back), with messages still on the way to them.
//!
//! Checked: every copy's write is admitted by the real table (a write under a hold inside its range, else no hold
//! over its bytes and an epoch not below the copy's); and when everything has landed, both copies hold, block by
//! block, the last acknowledged write's value (no acknowledged write undone on either copy). Without the fences
//! (`the_race_is_found_without_the_fences`) the same worlds leave copies that differ: the simulation can fail.

use std::ops::Range;
use std::path::PathBuf;

use weft_data::fences::{FenceRefusal, Fences};
use weft_proto::msg::{FenceAct, FenceResp, WriteFence};
use weft_sim::seeds::{self, Summary};
use weft_sim::{Queue, Rng};

const MS: u64 = 1000;
const INO: u64 = 42;
const BLOCKS: usize = 8;
const BLOCK_BYTES: u64 = 4096;
const WRITERS: usize = 2;
const WRITES_PER_WRITER: u64 = 30;
const COPIES_MAX: u64 = 25;
const END_US: u64 = 3_600_000 * MS;

#[test]
fn no_copy_between_mirror_copies_undoes_an_acknowledged_write() {
    let total = seeds::run(
        "no_copy_between_mirror_copies_undoes_an_acknowledged_write",
        "-p weft-sim --test mirror",
        2000,
        |seed| World::new(seed, true).run(),
    );
    for what in ["write acknowledged", "epoch moved", "held", "copy done", "restart", "hold lost", "copier crash"] {
        assert!(total.get(what) > 0 || total.seeds < 50, "no '{what}' in {total}");
    }
    // Every world ended with a check of every block.
    assert!(total.checks > total.seeds);
}

#[test]
fn the_race_is_found_without_the_fences() {
    let broken = (1..=300).filter(|&seed| World::new(seed, false).run().is_err()).count();
    assert!(broken > 0, "300 worlds without fences and no copy ever differed: the simulation cannot fail");
    eprintln!("without the fences, {broken} of 300 worlds left copies that differ");
}

#[test]
fn one_seed_replays_exactly() {
    let run = |seed| {
        let mut w = World::new(seed, true);
        let s = w.run().expect("the seed passes");
        (s, w.log)
    };
    assert_eq!(run(7), run(7));
}

/// Who a reply goes back to: a writer's attempt, or a copier's round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Writer(usize, u64),
    Copier(u64),
}

#[derive(Debug, Clone)]
enum Req {
    Write { blocks: Range<usize>, data: Vec<u64>, fence: WriteFence },
    Fence(FenceAct),
    Read(Range<usize>),
}

#[derive(Debug, Clone)]
enum Resp {
    Written(Result<(), FenceRefusal>),
    Fenced(Result<FenceResp, FenceRefusal>),
    Read(Vec<u64>),
}

#[derive(Debug)]
enum Event {
    Deliver { copy: usize, req: Req, from: Who },
    Reply { to: Who, copy: usize, resp: Resp },
    WriterNext(usize),
    CopierNext,
    Restart(usize),
}

/// A data server holding one copy: its blocks (durable here: lost writes are not this simulation's subject) and
/// its fence table, reopened from `dir` at each restart.
struct Copy {
    dir: PathBuf,
    fences: Fences,
    blocks: Vec<u64>,
}

/// A writer's write in progress.
struct Pending {
    blocks: Range<usize>,
    value: u64,
    attempt: u64,
    replies: [Option<Result<(), FenceRefusal>>; 2],
    /// Epoch questions still out (after `EpochMoved`), and whether a copy answered `Held`.
    asking: usize,
    held: bool,
}

struct Writer {
    own: Range<usize>,
    written: u64,
    epochs: [u64; 2],
    pending: Option<Pending>,
    backoff_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Holding,
    Bumping,
    Reading,
    Writing,
}

struct Copier {
    round: u64,
    target: usize,
    blocks: Range<usize>,
    hold: u64,
    step: Option<Step>,
}

struct World {
    /// The real instant simulated time 0 stands for.
    epoch: std::time::Instant,
    rng: Rng,
    q: Queue<Event>,
    fenced: bool,
    copies: Vec<Copy>,
    writers: Vec<Writer>,
    copier: Copier,
    /// Block by block, the value of the last acknowledged write.
    acked: Vec<u64>,
    summary: Summary,
    log: Vec<String>,
}

impl World {
    fn new(seed: u64, fenced: bool) -> World {
        let base =
            if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let copies = (0..2)
            .map(|c| {
                let dir = base.join(format!("weft-sim-mirror-{}-{seed}-{fenced}-{c}", std::process::id()));
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).expect("a directory for the copy's fence table");
                Copy { fences: Fences::open(&dir).expect("a fence table"), dir, blocks: vec![0; BLOCKS] }
            })
            .collect();
        let half = BLOCKS / WRITERS;
        let writers = (0..WRITERS)
            .map(|w| Writer {
                own: w * half..(w + 1) * half,
                written: 0,
                epochs: [1; 2],
                pending: None,
                backoff_us: MS,
            })
            .collect();
        let copier = Copier { round: 0, target: 0, blocks: 0..0, hold: 0, step: None };
        World {
            epoch: std::time::Instant::now(),
            rng: Rng::new(seed),
            q: Queue::new(10_000),
            fenced,
            copies,
            writers,
            copier,
            acked: vec![0; BLOCKS],
            summary: Summary { seeds: 1, ..Summary::default() },
            log: Vec::new(),
        }
    }

    fn run(&mut self) -> Result<Summary, String> {
        for w in 0..WRITERS {
            self.q.after(self.rng.below(10 * MS), Event::WriterNext(w));
        }
        self.q.after(self.rng.below(10 * MS), Event::CopierNext);
        self.q.after(self.rng.between(50 * MS, 2000 * MS), Event::Restart(self.rng.index(2)));
        while let Some(e) = self.q.next_before(END_US) {
            self.summary.events += 1;
            self.step(e)?;
        }
        let r = self.check_end();
        for c in &self.copies {
            let _ = std::fs::remove_dir_all(&c.dir);
        }
        r.map(|()| self.summary.clone())
    }

    /// A message's trip: mostly short, sometimes seconds (a write's two copies then land far apart).
    fn delay(&mut self) -> u64 {
        if self.rng.chance(60) { self.rng.between(200 * MS, 3000 * MS) } else { self.rng.between(50, 20 * MS) }
    }

    fn send(&mut self, copy: usize, req: Req, from: Who) {
        let d = self.delay();
        self.q.after(d, Event::Deliver { copy, req, from });
    }

    fn step(&mut self, e: Event) -> Result<(), String> {
        match e {
            Event::Deliver { copy, req, from } => {
                let resp = self.serve(copy, req)?;
                let d = self.delay();
                self.q.after(d, Event::Reply { to: from, copy, resp });
            }
            Event::Reply { to: Who::Writer(w, attempt), copy, resp } => self.writer_reply(w, attempt, copy, resp),
            Event::Reply { to: Who::Copier(round), copy, resp } => self.copier_reply(round, copy, resp),
            Event::WriterNext(w) => self.writer_next(w),
            Event::CopierNext => self.copier_next(),
            Event::Restart(c) => {
                // A restart loses the holds and the epochs in memory; the high-water mark is read back.
                self.copies[c].fences = Fences::open(&self.copies[c].dir).map_err(|e| format!("reopening: {e}"))?;
                self.summary.count("restart");
                self.log.push(format!("{} restart {c}", self.q.now_us()));
                if self.q.now_us() < END_US / 2 && self.rng.chance(700) {
                    let next = self.rng.between(500 * MS, 5000 * MS);
                    let c = self.rng.index(2);
                    self.q.after(next, Event::Restart(c));
                }
            }
        }
        Ok(())
    }

    /// What copy `copy`'s data server does with `req`: the real fence table decides.
    fn serve(&mut self, copy: usize, req: Req) -> Result<Resp, String> {
        // The tables judge holds' expiry by the simulated clock.
        let now = self.epoch + std::time::Duration::from_micros(self.q.now_us());
        let c = &mut self.copies[copy];
        Ok(match req {
            Req::Write { blocks, data, fence } => {
                let bytes = (blocks.start as u64 * BLOCK_BYTES, blocks.end as u64 * BLOCK_BYTES);
                let admitted = if self.fenced { c.fences.admit_at(INO, bytes, fence, now) } else { Ok(()) };
                if admitted.is_ok() {
                    c.blocks[blocks].copy_from_slice(&data);
                }
                self.summary.checks += 1;
                Resp::Written(admitted)
            }
            Req::Fence(act) => Resp::Fenced(c.fences.fence_at(INO, act, now)),
            Req::Read(blocks) => Resp::Read(c.blocks[blocks].to_vec()),
        })
    }

    fn writer_next(&mut self, w: usize) {
        let wr = &mut self.writers[w];
        if wr.pending.is_some() {
            return self.attempt(w);
        }
        if wr.written == WRITES_PER_WRITER {
            return;
        }
        wr.written += 1;
        let (lo, hi) = (wr.own.start, wr.own.end);
        let a = lo + self.rng.index(hi - lo);
        let b = a + 1 + self.rng.index(hi - a);
        let value = (w as u64 + 1) << 32 | self.writers[w].written;
        self.writers[w].pending =
            Some(Pending { blocks: a..b, value, attempt: 0, replies: [None, None], asking: 0, held: false });
        self.attempt(w);
    }

    /// Sends the write in progress to both copies, each at its epoch (a new attempt: late replies are ignored).
    fn attempt(&mut self, w: usize) {
        let wr = &mut self.writers[w];
        let p = wr.pending.as_mut().expect("a write in progress");
        p.attempt += 1;
        p.replies = [None, None];
        p.held = false;
        let (blocks, value, attempt) = (p.blocks.clone(), p.value, p.attempt);
        for copy in 0..2 {
            let fence = if self.fenced { WriteFence::at(self.writers[w].epochs[copy]) } else { WriteFence::NONE };
            let data = vec![value; blocks.len()];
            self.send(copy, Req::Write { blocks: blocks.clone(), data, fence }, Who::Writer(w, attempt));
        }
    }

    fn writer_reply(&mut self, w: usize, attempt: u64, copy: usize, resp: Resp) {
        let Some(p) = self.writers[w].pending.as_mut() else { return };
        if p.attempt != attempt {
            return;
        }
        match resp {
            Resp::Written(r) => p.replies[copy] = Some(r),
            Resp::Fenced(Ok(f)) => {
                p.asking -= 1;
                let asked = p.asking == 0;
                let e = &mut self.writers[w].epochs[copy];
                *e = (*e).max(f.epoch);
                if asked {
                    self.again(w);
                }
                return;
            }
            Resp::Fenced(Err(e)) => panic!("a query is never refused: {e}"),
            Resp::Read(_) => unreachable!("writers do not read"),
        }
        if p.replies.iter().any(Option::is_none) {
            return;
        }
        if p.replies.iter().all(|r| matches!(r, Some(Ok(())))) {
            let p = self.writers[w].pending.take().expect("pending");
            self.acked[p.blocks.clone()].fill(p.value);
            self.summary.count("write acknowledged");
            self.log.push(format!("{} ack w{w} {:?}={:x}", self.q.now_us(), p.blocks, p.value));
            self.writers[w].backoff_us = MS;
            let pause = self.rng.below(30 * MS);
            self.q.after(pause, Event::WriterNext(w));
            return;
        }
        // Refused somewhere: ask the moved epochs, wait out holds, then write every copy again.
        for r in p.replies.iter().flatten() {
            let fenced = matches!(r, Ok(()) | Err(FenceRefusal::Held { .. } | FenceRefusal::EpochMoved { .. }));
            assert!(fenced, "a writer's copy refused otherwise: {r:?}");
        }
        p.held = p.replies.iter().any(|r| matches!(r, Some(Err(FenceRefusal::Held { .. }))));
        let moved: Vec<usize> =
            (0..2).filter(|&c| matches!(p.replies[c], Some(Err(FenceRefusal::EpochMoved { .. })))).collect();
        p.asking = moved.len();
        for c in moved {
            self.summary.count("epoch moved");
            self.send(c, Req::Fence(FenceAct::Query), Who::Writer(w, attempt));
        }
        if self.writers[w].pending.as_ref().is_some_and(|p| p.asking == 0) {
            self.again(w);
        }
    }

    /// The write in progress goes again: at once, or after a pause when a copy was held.
    fn again(&mut self, w: usize) {
        let wr = &mut self.writers[w];
        if wr.pending.as_ref().is_some_and(|p| p.held) {
            self.summary.count("held");
            let wait = wr.backoff_us;
            wr.backoff_us = (wr.backoff_us * 2).min(100 * MS);
            self.q.after(wait, Event::WriterNext(w));
        } else {
            self.attempt(w);
        }
    }

    fn copier_next(&mut self) {
        let writing = self.writers.iter().any(|w| w.written < WRITES_PER_WRITER || w.pending.is_some());
        if self.copier.round == COPIES_MAX || (!writing && self.rng.chance(500)) {
            return;
        }
        self.copier.round += 1;
        self.copier.target = self.rng.index(2);
        let a = self.rng.index(BLOCKS);
        let b = a + 1 + self.rng.index(BLOCKS - a);
        self.copier.blocks = a..b;
        self.copier.hold = 0;
        let (t, round) = (self.copier.target, self.copier.round);
        if self.fenced {
            self.copier.step = Some(Step::Holding);
            let (start, end) = (a as u64 * BLOCK_BYTES, b as u64 * BLOCK_BYTES);
            self.send(t, Req::Fence(FenceAct::Hold { start, end, ttl_ms: 10_000 }), Who::Copier(round));
        } else {
            self.copier.step = Some(Step::Reading);
            self.send(1 - t, Req::Read(a..b), Who::Copier(round));
        }
    }

    fn copier_reply(&mut self, round: u64, _copy: usize, resp: Resp) {
        if round != self.copier.round || self.copier.step.is_none() {
            return;
        }
        if self.rng.chance(30) {
            // The copier dies mid-round: nothing released, its hold ends by expiring (10 s of simulated time);
            // what it already sent still lands. A new one starts later.
            self.summary.count("copier crash");
            self.copier.step = None;
            let pause = self.rng.between(MS, 2000 * MS);
            self.q.after(pause, Event::CopierNext);
            return;
        }
        let (t, s, round) = (self.copier.target, 1 - self.copier.target, self.copier.round);
        let blocks = self.copier.blocks.clone();
        match (self.copier.step, resp) {
            (Some(Step::Holding), Resp::Fenced(Ok(f))) => {
                self.copier.hold = f.hold;
                self.copier.step = Some(Step::Bumping);
                self.send(s, Req::Fence(FenceAct::Bump), Who::Copier(round));
            }
            (Some(Step::Bumping), Resp::Fenced(Ok(_))) => {
                self.copier.step = Some(Step::Reading);
                self.send(s, Req::Read(blocks), Who::Copier(round));
            }
            (Some(Step::Reading), Resp::Read(data)) => {
                self.copier.step = Some(Step::Writing);
                let fence = WriteFence { epoch: 0, hold: self.copier.hold };
                self.send(t, Req::Write { blocks, data, fence }, Who::Copier(round));
            }
            (Some(Step::Writing), Resp::Written(r)) => {
                match r {
                    Ok(()) => self.summary.count("copy done"),
                    Err(FenceRefusal::HoldLost { .. }) => self.summary.count("hold lost"),
                    Err(e) => panic!("a copier's held write refused otherwise: {e}"),
                }
                self.finish_copy();
            }
            (_, Resp::Fenced(Err(_))) => {
                self.summary.count("copy refused");
                self.finish_copy();
            }
            (step, resp) => panic!("copier at {step:?} got {resp:?}"),
        }
    }

    /// Ends the round: its hold released (fire and forget: it would expire), the next round later.
    fn finish_copy(&mut self) {
        if self.copier.hold != 0 {
            let act = FenceAct::Release { hold: self.copier.hold };
            self.send(self.copier.target, Req::Fence(act), Who::Copier(0));
        }
        self.copier.step = None;
        let pause = self.rng.between(MS, 200 * MS);
        self.q.after(pause, Event::CopierNext);
    }

    /// Everything landed: both copies hold the last acknowledged value of every block.
    fn check_end(&mut self) -> Result<(), String> {
        self.summary.checks += 1;
        if let Some((w, _)) = self.writers.iter().enumerate().find(|(_, w)| w.pending.is_some()) {
            return Err(format!("writer {w} never finished its write (a hold never ended?)"));
        }
        for b in 0..BLOCKS {
            let (c0, c1) = (self.copies[0].blocks[b], self.copies[1].blocks[b]);
            if c0 != self.acked[b] || c1 != self.acked[b] {
                return Err(format!(
                    "block {b}: copy 0 holds {c0:x}, copy 1 holds {c1:x}, the last acknowledged write {:x}; last \
                     events: {:?}",
                    self.acked[b],
                    self.log.iter().rev().take(8).collect::<Vec<_>>()
                ));
            }
        }
        Ok(())
    }
}
