//! Exactly-once changes across metadata service failover, simulated (issue 30 item 3).
//!
//! Real code: two or three metadata services (`weft_meta::Namespace::execute_once`, the code `weft meta` runs for
//! a call with a once block) on one shared store. Simulated: clients that each run a sequence of calls (mkdir,
//! rmdir, rename, on names of their own) one at a time, each call tagged with a once block (client, slot, call
//! number) and sent again, with the same block, to any service until an answer comes; a network that delays,
//! loses and duplicates requests and replies (so stale attempts arrive after later calls ran); services killed and
//! restarted, paused, cut off from the store; a flaky store whose commits may apply and still report failure.
//!
//! Checked: every answer a client takes is the one a single run of its call gives in the client's own sequential
//! model (a retried mkdir is its first reply, not `Exists`; a retried rmdir not `NotFound`), and at the end the
//! directory holds exactly the names and inodes of every client's model: no call ran twice, none was lost. After
//! every answer the store's tree keeps its invariants (`weft_meta::namespace::check_tree`: link counts, parents).

use std::collections::BTreeMap;
use std::sync::Arc;

use weft_meta::once::OnceCall;
use weft_meta::{Cred, ManualClock, MemStore, Namespace};
use weft_proto::msg::{MkdirReq, NameReq, ReaddirReq, RenameReq};
use weft_proto::{ErrorCode, OnceTag, ROOT_INO, Request, Response, WireError};
use weft_sim::seeds::{self, Summary};
use weft_sim::store::SimStore;
use weft_sim::{Queue, Rng};

const MS: u64 = 1000;
const CALLS_PER_CLIENT: u64 = 40;
/// A client sends its call again when no answer came within this.
const RETRY_AFTER_US: u64 = 1_500 * MS;
/// Simulated time by which every call must have been answered.
const END_US: u64 = 600_000 * MS;

type Ns = Namespace<SimStore, Arc<ManualClock>>;

#[test]
fn every_call_runs_once_across_failover_and_lost_commits() {
    let total = seeds::run(
        "every_call_runs_once_across_failover_and_lost_commits",
        "-p weft-sim --test exactly_once",
        300,
        run_one,
    );
    for what in ["answered from the record", "service killed", "store flaky", "retried", "stale attempt arrived"] {
        assert!(total.get(what) > 0 || total.seeds < 20, "no '{what}' in {total}");
    }
}

#[test]
fn one_seed_replays_exactly() {
    let run = || {
        let mut w = World::new(7);
        w.run().expect("seed 7");
        let listing = w.listing();
        (w.summary, listing)
    };
    assert_eq!(run(), run());
}

fn run_one(seed: u64) -> Result<Summary, String> {
    let mut w = World::new(seed);
    w.run()?;
    Ok(w.summary)
}

/// A call a client makes, on names of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Mkdir(String),
    Rmdir(String),
    Rename(String, String),
}

impl Call {
    fn request(&self) -> Request {
        match self {
            Call::Mkdir(n) => Request::Mkdir(MkdirReq { parent: ROOT_INO, name: n.clone(), mode: 0o755 }),
            Call::Rmdir(n) => Request::Rmdir(NameReq { parent: ROOT_INO, name: n.clone() }),
            Call::Rename(a, b) => Request::Rename(RenameReq {
                src_parent: ROOT_INO,
                src_name: a.clone(),
                dst_parent: ROOT_INO,
                dst_name: b.clone(),
                flags: 0,
            }),
        }
    }
}

/// What a single run of a call answers: `Ok(Some(ino))` for a mkdir, `Ok(None)` for the others.
type Outcome = Result<Option<u64>, ErrorCode>;

struct Client {
    id: u64,
    rng: Rng,
    /// Its names and their inodes, as its answers so far say.
    model: BTreeMap<String, u64>,
    call_no: u64,
    call: Option<Call>,
    attempts: u64,
}

struct Service {
    ns: Option<Ns>,
    clock: Arc<ManualClock>,
    store: SimStore,
    incarnation: u64,
    paused_until_us: u64,
}

#[derive(Debug)]
enum Ev {
    Send { client: usize, call_no: u64 },
    Arrive { svc: usize, client: usize, call_no: u64, req: Request },
    Answer { client: usize, call_no: u64, answer: Result<Response, WireError> },
    Fault,
    Restart { svc: usize },
    Heal { svc: usize },
}

struct World {
    q: Queue<Ev>,
    rng: Rng,
    store: Arc<MemStore>,
    svcs: Vec<Service>,
    clients: Vec<Client>,
    summary: Summary,
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng::new(seed);
        let store = Arc::new(MemStore::new());
        let mut q = Queue::new(100_000);
        let mut svcs = Vec::new();
        for svc in 0..2 + rng.below(2) as usize {
            let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
            let s = SimStore::new(store.clone(), rng.next_u64());
            svcs.push(Service { ns: None, clock, store: s, incarnation: 0, paused_until_us: 0 });
            q.after(0, Ev::Restart { svc });
        }
        let mut clients = Vec::new();
        for client in 0..2 + rng.below(4) as usize {
            let r = Rng::new(rng.next_u64());
            let id = 0x1000 + client as u64;
            clients.push(Client { id, rng: r, model: BTreeMap::new(), call_no: 0, call: None, attempts: 0 });
            q.after(MS, Ev::Send { client, call_no: 0 });
        }
        q.after(rng.between(MS, 500 * MS), Ev::Fault);
        World { q, rng, store, svcs, clients, summary: Summary { seeds: 1, ..Summary::default() } }
    }

    fn run(&mut self) -> Result<(), String> {
        while let Some(ev) = self.q.next_before(END_US) {
            self.summary.events += 1;
            self.on(ev)?;
        }
        for (i, c) in self.clients.iter().enumerate() {
            if c.call_no < CALLS_PER_CLIENT || c.call.is_some() {
                return Err(format!("client {i} did not finish: call {} of {CALLS_PER_CLIENT}", c.call_no));
            }
        }
        let want: BTreeMap<String, u64> = self.clients.iter().flat_map(|c| c.model.clone()).collect();
        let have = self.listing();
        self.summary.checks += 1;
        if have != want {
            return Err(format!("the directory holds {have:?}, the clients' answers say {want:?}"));
        }
        Ok(())
    }

    /// The directory as the store has it (read past every fault).
    fn listing(&self) -> BTreeMap<String, u64> {
        let ns = Namespace::new(SimStore::new(self.store.clone(), 0), ManualClock::new(0), 1000).expect("a reader");
        let req = Request::Readdir(ReaddirReq { ino: ROOT_INO, after: String::new(), limit: 1000 });
        match ns.execute(&req) {
            Ok(Response::Readdir(r)) => r.entries.into_iter().map(|e| (e.name, e.ino)).collect(),
            other => panic!("listing the directory: {other:?}"),
        }
    }

    fn on(&mut self, ev: Ev) -> Result<(), String> {
        match ev {
            Ev::Send { client, call_no } => self.send(client, call_no),
            Ev::Arrive { svc, client, call_no, req } => self.arrive(svc, client, call_no, &req),
            Ev::Answer { client, call_no, answer } => return self.answer(client, call_no, answer),
            Ev::Fault => self.fault(),
            Ev::Restart { svc } => self.restart(svc),
            Ev::Heal { svc } => self.svcs[svc].store.faults.lock().unwrap().heal(),
        }
        Ok(())
    }

    /// Sends the client's current call (choosing the next one if it has none) to a random service, and schedules
    /// the retry that follows unless an answer comes first.
    fn send(&mut self, client: usize, call_no: u64) {
        let c = &mut self.clients[client];
        if c.call.is_none() {
            if call_no != c.call_no || c.call_no == CALLS_PER_CLIENT {
                return;
            }
            c.call_no += 1;
            c.attempts = 0;
            c.call = Some(next_call(c));
        } else if call_no != c.call_no {
            return; // a retry timer of an answered call
        }
        c.attempts += 1;
        if c.attempts > 1 {
            self.summary.count("retried");
        }
        let (req, call_no) = (c.call.as_ref().expect("a call").request(), c.call_no);
        let svc = self.rng.index(self.svcs.len());
        for delay in self.network() {
            self.q.after(delay, Ev::Arrive { svc, client, call_no, req: req.clone() });
        }
        self.q.after(RETRY_AFTER_US, Ev::Send { client, call_no });
    }

    /// A message's delays: none (lost), one, or two (duplicated); some long enough to arrive after later calls.
    fn network(&mut self) -> Vec<u64> {
        if self.rng.chance(50) {
            return Vec::new();
        }
        let mut delays = vec![delay(&mut self.rng)];
        if self.rng.chance(30) {
            delays.push(delay(&mut self.rng));
        }
        delays
    }

    fn arrive(&mut self, svc: usize, client: usize, call_no: u64, req: &Request) {
        let now = self.q.now_us();
        let s = &self.svcs[svc];
        let Some(ns) = s.ns.as_ref().filter(|_| s.paused_until_us <= now) else { return };
        s.clock.set_ns(1_700_000_000_000_000_000 + (now as i64) * 1000);
        let once = OnceCall {
            tag: OnceTag { client: self.clients[client].id, call: call_no },
            slot: 0,
            key_id: "-".into(),
            uid: 0,
        };
        let answer = ns.execute_once(&Cred::root(), req, Some(&once));
        if call_no < self.clients[client].call_no {
            // An attempt of a call the client finished: it must not have run again (the end listing checks it).
            self.summary.count("stale attempt arrived");
        }
        for delay in self.network() {
            self.q.after(delay, Ev::Answer { client, call_no, answer: answer.clone() });
        }
    }

    fn answer(&mut self, client: usize, call_no: u64, answer: Result<Response, WireError>) -> Result<(), String> {
        let c = &mut self.clients[client];
        if call_no != c.call_no || c.call.is_none() {
            return Ok(()); // late or duplicated: the client took an answer for this call already
        }
        if answer.as_ref().is_err_and(|e| e.code == ErrorCode::Io) {
            // The store failed the call (or lost its commit's answer): send it again, same once block.
            return Ok(());
        }
        let call = c.call.take().expect("a call");
        let got: Outcome = match &answer {
            Ok(Response::Mkdir(attr)) => Ok(Some(attr.ino)),
            Ok(_) => Ok(None),
            Err(e) => Err(e.code),
        };
        let want = predict(&c.model, &call);
        self.summary.checks += 1;
        if c.attempts > 1 {
            self.summary.count("answered from the record");
        }
        match (&want, &got) {
            (Ok(Some(_)), Ok(Some(ino))) => apply(&mut c.model, &call, Some(*ino)),
            (w, g) if w == g => apply(&mut c.model, &call, None),
            _ => {
                return Err(format!(
                    "client {client} call {call_no} {call:?} (attempt {}): answered {answer:?}, a single run answers \
                     {want:?}; its names: {:?}",
                    c.attempts, c.model
                ));
            }
        }
        // The tree's own invariants (link counts, parents, reachability), on the store as every commit left it.
        if let Err(e) = weft_meta::MetaStore::read(&*self.store, |t| weft_meta::namespace::check_tree(t)) {
            return Err(format!("after client {client} call {call_no} {call:?}: {e}"));
        }
        self.q.after(self.rng.between(0, 50 * MS), Ev::Send { client, call_no });
        Ok(())
    }

    fn restart(&mut self, svc: usize) {
        let s = &mut self.svcs[svc];
        s.incarnation += 1;
        s.paused_until_us = 0;
        s.ns = Namespace::new(s.store.clone(), s.clock.clone(), 2000).ok();
        if s.ns.is_none() {
            self.q.after(1_000 * MS, Ev::Restart { svc });
        }
    }

    fn fault(&mut self) {
        let now = self.q.now_us();
        let svc = self.rng.index(self.svcs.len());
        let long = self.rng.between(10 * MS, 5_000 * MS);
        match self.rng.below(4) {
            0 => {
                self.svcs[svc].ns = None;
                self.q.after(long, Ev::Restart { svc });
                self.summary.count("service killed");
            }
            1 => {
                self.svcs[svc].paused_until_us = now + long;
                self.summary.count("service paused");
            }
            2 => {
                self.svcs[svc].store.faults.lock().unwrap().cut = true;
                self.q.after(long, Ev::Heal { svc });
                self.summary.count("service cut from the store");
            }
            _ => {
                self.svcs[svc].store.faults.lock().unwrap().flaky = self.rng.between(50, 400);
                self.q.after(long, Ev::Heal { svc });
                self.summary.count("store flaky");
            }
        }
        if self.clients.iter().any(|c| c.call_no < CALLS_PER_CLIENT) {
            let next = self.rng.between(100 * MS, 3_000 * MS);
            self.q.after(next, Ev::Fault);
        }
    }
}

/// The client's next call: mostly ones that change its names, sometimes ones that fail.
fn next_call(c: &mut Client) -> Call {
    let names: Vec<String> = (0..3).map(|i| format!("c{:x}-{i}", c.id)).collect();
    let a = names[c.rng.index(names.len())].clone();
    let mut b = names[c.rng.index(names.len())].clone();
    if b == a {
        b = format!("{a}x");
    }
    match c.rng.below(3) {
        0 => Call::Mkdir(a),
        1 => Call::Rmdir(a),
        _ => Call::Rename(a, b),
    }
}

fn predict(model: &BTreeMap<String, u64>, call: &Call) -> Outcome {
    match call {
        Call::Mkdir(n) if model.contains_key(n) => Err(ErrorCode::Exists),
        Call::Mkdir(_) => Ok(Some(0)),
        Call::Rmdir(n) | Call::Rename(n, _) if !model.contains_key(n) => Err(ErrorCode::NotFound),
        Call::Rmdir(_) | Call::Rename(..) => Ok(None),
    }
}

fn apply(model: &mut BTreeMap<String, u64>, call: &Call, ino: Option<u64>) {
    match call {
        Call::Mkdir(n) => {
            if let Some(ino) = ino {
                model.insert(n.clone(), ino);
            }
        }
        Call::Rmdir(n) => {
            model.remove(n);
        }
        Call::Rename(a, b) => {
            if let Some(ino) = model.remove(a) {
                model.insert(b.clone(), ino);
            }
        }
    }
}

fn delay(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..=89 => rng.between(50, 5 * MS),
        90..=97 => rng.between(5 * MS, 500 * MS),
        _ => rng.between(500 * MS, 4_000 * MS),
    }
}
