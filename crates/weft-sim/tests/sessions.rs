//! Exactly-once per session slot, simulated (issue 30 item 3): the RPC layer's promise, with its real code.
//!
//! Real code: the server's session table (`weft_rpc::session::SessionTable`: sequence checks and the reply cache)
//! and each call's retry machine (`weft_rpc::retry::Retry`: what the client does after a lost reply, a refusal, a
//! dead server). Simulated: clients with two slots each running calls one after another per slot (a change that is
//! not idempotent, or an idempotent read), a network that delays, loses, duplicates and reorders requests and
//! replies, a server that executes slowly (so retransmissions meet a running original) and is killed and restarted
//! (its sessions lost), clients that give up and open new sessions as `RpcClient::call` does.
//!
//! Checked at the end of every call, against a count of executions kept beside the server: a call answered with a
//! reply got the reply of one of its executions, and of its only one unless the server lost its session after the
//! call went out (`SessionLost`: the retry ran in a new session, which cannot know the first); a change that gave
//! up with anything but "may or may not have been applied" never executed; no change executed twice in one session.

use std::collections::HashMap;

use weft_proto::{Op, WireError};
use weft_rpc::RpcError;
use weft_rpc::retry::{Event, Next, Retry, State};
use weft_rpc::session::{Admit, CachedReply, SessionTable};
use weft_sim::seeds::{self, Summary};
use weft_sim::{Queue, Rng};

const MS: u64 = 1000;
const CLIENTS: usize = 3;
const SLOTS: u32 = 2;
const CALLS_PER_SLOT: u64 = 25;
/// A client gives up waiting for an attempt's reply after this.
const CALL_TIMEOUT_US: u64 = 200 * MS;
const ATTEMPTS_MAX: u32 = 3;
const END_US: u64 = 600_000 * MS;
/// Not idempotent (a lost attempt may have run): the op the changes stand for.
const CHANGE: Op = Op::Rename;
/// Idempotent: the op the reads stand for.
const READ: Op = Op::Null;

#[test]
fn every_call_is_executed_once_per_session_or_says_it_may_have_been() {
    let total = seeds::run(
        "every_call_is_executed_once_per_session_or_says_it_may_have_been",
        "-p weft-sim --test sessions",
        400,
        run_one,
    );
    for what in ["replayed from the cache", "waited for the original", "server restarted", "session renewed"] {
        assert!(total.get(what) > 0 || total.seeds < 20, "no '{what}' in {total}");
    }
    for what in ["answered", "gave up: maybe applied"] {
        assert!(total.get(what) > 0 || total.seeds < 20, "no '{what}' in {total}");
    }
}

#[test]
fn one_seed_replays_exactly() {
    let run = |seed| {
        let mut w = World::new(seed);
        w.run().expect("the seed passes");
        (w.summary, w.log)
    };
    assert_eq!(run(11), run(11));
}

fn run_one(seed: u64) -> Result<Summary, String> {
    let mut w = World::new(seed);
    w.run()?;
    Ok(w.summary)
}

/// One attempt of a call, as the network carries it.
#[derive(Debug, Clone)]
struct Request {
    client: usize,
    call: u64,
    sid: u64,
    slot: u32,
    seq: u32,
    op: Op,
}

#[derive(Debug)]
enum Ev {
    Start { client: usize, slot: u32 },
    Send { client: usize, slot: u32, call: u64 },
    Arrive { req: Request },
    Executed { incarnation: u64, req: Request },
    Reply { client: usize, call: u64, sid: u64, seq: u32, answer: Result<u64, WireError> },
    Timeout { client: usize, slot: u32, call: u64, attempt: u32 },
    Kill,
    Restart,
}

/// A call under way on one slot.
struct Call {
    id: u64,
    op: Op,
    retry: Retry,
    sid: u64,
    seq: u32,
}

struct Client {
    /// The session (0: none; the next call opens one).
    sid: u64,
    /// The last sequence taken on each slot, in `sid`.
    seqs: Vec<u32>,
    calls: Vec<Option<Call>>,
    done: Vec<u64>,
}

struct World {
    q: Queue<Ev>,
    rng: Rng,
    /// `None` while the server is down.
    table: Option<SessionTable>,
    incarnation: u64,
    /// Retransmissions parked behind a running original: (session, slot, seq) → requests.
    parked: HashMap<(u64, u32, u32), Vec<Request>>,
    clients: Vec<Client>,
    next_call: u64,
    /// The server's state: the number of changes applied (a change's value is the count after it).
    applied: u64,
    /// Executions per call: (session they ran in, by order of creation, value they answered).
    executions: HashMap<u64, Vec<(usize, u64)>>,
    /// Sessions by id, numbered in order of creation (ids are random: the log names the numbers).
    sessions: HashMap<u64, usize>,
    summary: Summary,
    /// Every call's end, for the replay check.
    log: Vec<String>,
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng::new(seed);
        let mut q = Queue::new(100_000);
        let clients = (0..CLIENTS)
            .map(|_| Client {
                sid: 0,
                seqs: vec![0; SLOTS as usize],
                calls: (0..SLOTS).map(|_| None).collect(),
                done: vec![0; SLOTS as usize],
            })
            .collect();
        for client in 0..CLIENTS {
            for slot in 0..SLOTS {
                q.after(rng.between(0, 5 * MS), Ev::Start { client, slot });
            }
        }
        q.after(rng.between(50 * MS, 2_000 * MS), Ev::Kill);
        World {
            q,
            rng,
            table: Some(new_table()),
            incarnation: 1,
            parked: HashMap::new(),
            clients,
            next_call: 0,
            applied: 0,
            executions: HashMap::new(),
            sessions: HashMap::new(),
            summary: Summary { seeds: 1, ..Summary::default() },
            log: Vec::new(),
        }
    }

    fn run(&mut self) -> Result<(), String> {
        while let Some(ev) = self.q.next_before(END_US) {
            self.summary.events += 1;
            self.on(ev)?;
        }
        for (i, c) in self.clients.iter().enumerate() {
            if c.done.iter().any(|&d| d < CALLS_PER_SLOT) {
                return Err(format!("client {i} did not finish its calls: {:?} of {CALLS_PER_SLOT}", c.done));
            }
        }
        Ok(())
    }

    fn on(&mut self, ev: Ev) -> Result<(), String> {
        match ev {
            Ev::Start { client, slot } => return self.start(client, slot),
            Ev::Send { client, slot, call } => return self.send(client, slot, call),
            Ev::Arrive { req } => self.arrive(req),
            Ev::Executed { incarnation, req } => self.executed(incarnation, req),
            Ev::Reply { client, call, sid, seq, answer } => return self.reply(client, call, (sid, seq), answer),
            Ev::Timeout { client, slot, call, attempt } => {
                let c = &mut self.clients[client];
                let Some(cur) = c.calls[slot as usize].as_mut().filter(|k| k.id == call) else { return Ok(()) };
                if cur.retry.attempt() != attempt {
                    return Ok(());
                }
                let next = cur.retry.on(Event::NoReply("no reply within the call timeout".into()));
                return self.next(client, slot, next);
            }
            Ev::Kill => {
                self.summary.count("server restarted");
                self.table = None;
                self.incarnation += 1;
                self.parked.clear();
                self.q.after(self.rng.between(10 * MS, 400 * MS), Ev::Restart);
            }
            Ev::Restart => {
                self.table = Some(new_table());
                if self.clients.iter().any(|c| c.done.iter().any(|&d| d < CALLS_PER_SLOT)) {
                    self.q.after(self.rng.between(300 * MS, 3_000 * MS), Ev::Kill);
                }
            }
        }
        Ok(())
    }

    fn start(&mut self, client: usize, slot: u32) -> Result<(), String> {
        let c = &mut self.clients[client];
        if c.done[slot as usize] >= CALLS_PER_SLOT {
            return Ok(());
        }
        self.next_call += 1;
        let op = if self.rng.chance(700) { CHANGE } else { READ };
        let mut retry = Retry::new("server", op, ATTEMPTS_MAX);
        let first = retry.start();
        c.calls[slot as usize] = Some(Call { id: self.next_call, op, retry, sid: 0, seq: 0 });
        if c.sid != 0 {
            self.take_seq(client, slot);
        }
        self.next(client, slot, first)
    }

    /// The slot's next sequence in the client's session, for its call.
    fn take_seq(&mut self, client: usize, slot: u32) {
        let c = &mut self.clients[client];
        c.seqs[slot as usize] = c.seqs[slot as usize].wrapping_add(1);
        let (sid, seq) = (c.sid, c.seqs[slot as usize]);
        let call = c.calls[slot as usize].as_mut().expect("a call");
        (call.sid, call.seq) = (sid, seq);
    }

    /// Opens a new session for `client` (as `renew_session`: only if the one its call was refused in is current).
    fn renew(&mut self, client: usize, refused: u64) -> bool {
        let Some(table) = &self.table else { return false };
        let c = &mut self.clients[client];
        if c.sid == refused || c.sid == 0 {
            let Ok((sid, _)) = table.create("sim", SLOTS, |_| Ok(None)) else { return false };
            let n = self.sessions.len();
            self.sessions.insert(sid, n);
            c.sid = sid;
            c.seqs = vec![0; SLOTS as usize];
        }
        true
    }

    fn next(&mut self, client: usize, slot: u32, next: Next) -> Result<(), String> {
        match next {
            Next::Send { backoff } => {
                let call = self.clients[client].calls[slot as usize].as_ref().expect("a call").id;
                self.q.after(backoff.as_micros() as u64, Ev::Send { client, slot, call });
            }
            Next::RenewSession { backoff } => {
                self.summary.count("session renewed");
                let refused = self.clients[client].calls[slot as usize].as_ref().expect("a call").sid;
                if self.renew(client, refused) {
                    self.take_seq(client, slot);
                } else {
                    self.clients[client].sid = 0;
                }
                let id = self.clients[client].calls[slot as usize].as_ref().expect("a call").id;
                self.q.after(backoff.as_micros() as u64, Ev::Send { client, slot, call: id });
            }
            Next::GiveUp { error, forget_session } => {
                let call = self.clients[client].calls[slot as usize].take().expect("a call");
                if forget_session && self.clients[client].sid == call.sid {
                    self.clients[client].sid = 0;
                }
                self.finish(client, slot, call, Err(error))?;
            }
        }
        Ok(())
    }

    /// An attempt goes out: opens a session first if the client has none (nothing ran under none).
    fn send(&mut self, client: usize, slot: u32, call: u64) -> Result<(), String> {
        let cur = self.clients[client].calls[slot as usize].as_ref().filter(|k| k.id == call);
        let Some(cur) = cur else { return Ok(()) };
        let attempt = cur.retry.attempt();
        if self.table.is_none() {
            let cur = self.clients[client].calls[slot as usize].as_mut().expect("a call");
            let next = cur.retry.on(Event::ConnectFailed(std::io::ErrorKind::ConnectionRefused.into()));
            return self.next(client, slot, next);
        }
        if cur.sid == 0 {
            // The session was forgotten (an earlier call gave up on it): the connection opens a new one.
            if self.clients[client].sid == 0 {
                self.renew(client, 0);
            }
            self.take_seq(client, slot);
        }
        let cur = self.clients[client].calls[slot as usize].as_ref().expect("a call");
        let req = Request { client, call, sid: cur.sid, slot, seq: cur.seq, op: cur.op };
        for _ in 0..self.copies() {
            let d = self.delay();
            self.q.after(d, Ev::Arrive { req: req.clone() });
        }
        self.q.after(CALL_TIMEOUT_US, Ev::Timeout { client, slot, call, attempt });
        Ok(())
    }

    /// How many copies of a message arrive: lost, once, or duplicated.
    fn copies(&mut self) -> usize {
        match self.rng.below(100) {
            0..8 => 0,
            8..13 => 2,
            _ => 1,
        }
    }

    fn delay(&mut self) -> u64 {
        if self.rng.chance(100) { self.rng.between(50 * MS, 400 * MS) } else { self.rng.between(100, 5 * MS) }
    }

    fn arrive(&mut self, req: Request) {
        let Some(table) = &self.table else { return };
        match table.admit(req.sid, 0, req.slot, req.seq) {
            Admit::Execute => {
                let d = self.rng.between(100, 80 * MS);
                self.q.after(d, Ev::Executed { incarnation: self.incarnation, req });
            }
            Admit::Replay(c) => {
                self.summary.count("replayed from the cache");
                let value = u64::from_le_bytes(c.body[..8].try_into().expect("8 bytes"));
                self.answer(&req, Ok(value));
            }
            Admit::Wait(_) => {
                self.summary.count("waited for the original");
                self.parked.entry((req.sid, req.slot, req.seq)).or_default().push(req);
            }
            Admit::Reexecute => {
                assert!(req.op.is_idempotent(), "a change was offered to run again: {req:?}");
                let value = self.execute(&req);
                self.answer(&req, Ok(value));
            }
            Admit::Reject(e) => self.answer(&req, Err(e)),
        }
    }

    /// The server runs `req` (its effect and the count of executions).
    fn execute(&mut self, req: &Request) -> u64 {
        if !req.op.is_idempotent() {
            self.applied += 1;
        }
        let session = self.sessions[&req.sid];
        self.executions.entry(req.call).or_default().push((session, self.applied));
        self.applied
    }

    fn executed(&mut self, incarnation: u64, req: Request) {
        if incarnation != self.incarnation {
            return; // the server died before it ran
        }
        let value = self.execute(&req);
        let cached = (!req.op.is_idempotent())
            .then(|| CachedReply { flags: 0, body: bytes::Bytes::copy_from_slice(&value.to_le_bytes()) });
        self.table.as_ref().expect("the server is up").complete(req.sid, req.slot, req.seq, cached);
        self.answer(&req, Ok(value));
        for parked in self.parked.remove(&(req.sid, req.slot, req.seq)).unwrap_or_default() {
            self.arrive(parked);
        }
    }

    fn answer(&mut self, req: &Request, answer: Result<u64, WireError>) {
        for _ in 0..self.copies() {
            let d = self.delay();
            let (client, call, sid, seq) = (req.client, req.call, req.sid, req.seq);
            self.q.after(d, Ev::Reply { client, call, sid, seq, answer: answer.clone() });
        }
    }

    /// A reply is taken only by the call's current (session, sequence), as a connection matches its slot's.
    fn reply(
        &mut self,
        client: usize,
        call: u64,
        at: (u64, u32),
        answer: Result<u64, WireError>,
    ) -> Result<(), String> {
        let slot = (0..SLOTS).find(|s| self.clients[client].calls[*s as usize].as_ref().is_some_and(|k| k.id == call));
        let Some(slot) = slot else { return Ok(()) };
        let cur = self.clients[client].calls[slot as usize].as_mut().expect("a call");
        if (cur.sid, cur.seq) != at {
            return Ok(());
        }
        match answer {
            Ok(value) => {
                let call = self.clients[client].calls[slot as usize].take().expect("a call");
                self.finish(client, slot, call, Ok(value))
            }
            Err(e) => {
                let next = cur.retry.on(Event::ErrorReply(e));
                self.next(client, slot, next)
            }
        }
    }

    /// A call ended: checks what it was told against what ran, then starts the slot's next call.
    fn finish(&mut self, client: usize, slot: u32, call: Call, got: Result<u64, RpcError>) -> Result<(), String> {
        self.summary.checks += 1;
        let ran = self.executions.get(&call.id).cloned().unwrap_or_default();
        let told = match &got {
            Ok(v) => format!("answered {v}"),
            Err(RpcError::Remote(e)) => format!("gave up: {:?}", e.code),
            Err(RpcError::MaybeApplied { .. }) => "gave up: maybe applied".to_string(),
            Err(e) => format!("gave up: {e}"),
        };
        // Sessions by number, not id (ids are random): the log replays exactly.
        let what = format!("client {client} slot {slot} call {} ({:?}): {told}; executions {ran:?}", call.id, call.op);
        self.log.push(what.clone());
        let lost = call.retry.state() == State::SessionLost;
        if !call.op.is_idempotent() {
            let mut sessions: Vec<usize> = ran.iter().map(|(n, _)| *n).collect();
            sessions.sort_unstable();
            if sessions.windows(2).any(|w| w[0] == w[1]) {
                return Err(format!("{what}: a change ran twice in one session"));
            }
        }
        match &got {
            Ok(value) => {
                self.summary.count("answered");
                if !ran.iter().any(|(_, v)| v == value) {
                    return Err(format!("{what}: the reply is no execution's"));
                }
                if !call.op.is_idempotent() && ran.len() != 1 && !lost {
                    return Err(format!("{what}: a change answered once ran {} times", ran.len()));
                }
            }
            Err(RpcError::MaybeApplied { .. }) => self.summary.count("gave up: maybe applied"),
            Err(e) => {
                self.summary.count("gave up: not applied");
                if !call.op.is_idempotent() && !ran.is_empty() {
                    return Err(format!("{what}: gave up with {e}, which says it never ran, after it ran"));
                }
            }
        }
        self.clients[client].done[slot as usize] += 1;
        let d = self.rng.between(0, 20 * MS);
        self.q.after(d, Ev::Start { client, slot });
        Ok(())
    }
}

fn new_table() -> SessionTable {
    SessionTable::new(SLOTS, 64, 3_600_000)
}
