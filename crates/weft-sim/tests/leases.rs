//! Metadata leases, simulated (issue 33 item 1, docs/format.md §31).
//!
//! Real code: the MDS's lease table (`weft_meta::leases::LeaseTable`: polls, grants, changes, deadlines, closed
//! connections) and each mount's view (`weft_fuse::leases::LeaseView`: tickets, epochs, the trust horizon, recalls
//! heard). Simulated: a store of a few inodes' versions; two or three mounts, each with a kernel cache of the
//! versions it was allowed to keep under a lease, reading and changing inodes; each mount's poll loop; a network
//! whose replies overtake each other (a read's reply may arrive after the recall that voids it); mounts that apply
//! recalls slowly, past the lease (then revoked), and connections that close and come back on the same session.
//!
//! Some holders are instead gateways (`weft_client::meta_cache::MetaCache`: the NFS gateway's cache, with no
//! kernel to drop its older replies): they have several changes of one inode in flight at once, and drop their own
//! changes themselves when each reply (or its loss) comes back, caching the reply's version if nothing came
//! between.
//!
//! Checked after every event: no mount that kept up with its recalls holds, in its kernel cache, a version older
//! than the newest version whose change was answered; no gateway answers, from its cache, a version older than
//! that. A change waits for recalls; so a reader elsewhere never sees
//! the old state after the change returned. Mounts revoked for being slow are excused (their bound is the kernel's
//! lease timeout) and counted; revocations happen only to slow mounts.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use weft_client::meta_cache::{MetaCache, Pending};
use weft_fuse::leases::{LeaseView, Ticket};
use weft_meta::leases::{LeaseTable, Limits, Wait};
use weft_proto::msg::{LeaseWaitResp, Recall, SetAttrReq};
use weft_proto::{Attr, Request, Response};
use weft_sim::seeds::{self, Summary};
use weft_sim::{Queue, Rng};

const MS: u64 = 1000;
const LEASE_MS: u64 = 1000;
const HOLD_MS: u64 = LEASE_MS / 3;
const INOS: u64 = 4;
const END_US: u64 = 60_000 * MS;

#[derive(Debug)]
enum Ev {
    /// A mount asks for an inode's attributes.
    Read {
        c: usize,
        ino: u64,
    },
    ReadAtMds {
        c: usize,
        ino: u64,
        t: Ticket,
        kv: u64,
        session: u64,
    },
    ReadReply {
        c: usize,
        ino: u64,
        t: Ticket,
        kv: u64,
        v: u64,
        incarnation: u64,
    },
    /// A mount changes an inode.
    Write {
        c: usize,
        ino: u64,
    },
    WriteAtMds {
        c: usize,
        ino: u64,
        t: Ticket,
        kv: u64,
        session: u64,
        id: u64,
    },
    WriteReply {
        c: usize,
        ino: u64,
        t: Ticket,
        kv: u64,
        v: u64,
        incarnation: u64,
        id: u64,
    },
    PollSend {
        c: usize,
        incarnation: u64,
    },
    PollAtMds {
        c: usize,
        session: u64,
        epoch: u64,
        acked: u64,
        sent_us: u64,
        incarnation: u64,
    },
    PollHoldEnds {
        id: u64,
    },
    PollReply {
        c: usize,
        resp: LeaseWaitResp,
        sent_us: u64,
        incarnation: u64,
    },
    Applied {
        c: usize,
        upto: u64,
        incarnation: u64,
    },
    /// The mount's connection closes and comes back on the same session (a blip).
    Blip {
        c: usize,
    },
    /// Settles changes waiting on deadlines.
    Tick,
}

struct Mount {
    session: u64,
    view: LeaseView,
    /// The kernel's cache: inode → version, kept under a lease.
    cache: HashMap<u64, u64>,
    acked: u64,
    /// Bumped at a blip: replies to calls of an earlier connection are lost.
    incarnation: u64,
    /// Applying recalls past the lease now: excused from the check until it named a new epoch.
    slow: bool,
    /// The kernel's `attr_version`: a counter taken when a request is sent, and each inode's value when its
    /// attributes last changed in the kernel (a reply installed, an invalidation). A reply sent before the inode's
    /// attributes last changed is dropped (`fuse_change_attributes`): so a mount's own change is never undone by
    /// an older reply of its own, which no recall would catch (the MDS recalls only other holders).
    attr_version: u64,
    inode_version: HashMap<u64, u64>,
    /// Inodes with a change of this mount in flight: the kernel holds the inode's lock through a change, so a
    /// mount never has two of one inode in flight.
    writing: std::collections::HashSet<u64>,
    /// A gateway instead: its cache, its own changes in flight (by id), and how many of each inode.
    gateway: Option<Gateway>,
}

#[derive(Default)]
struct Gateway {
    cache: MetaCache,
    pending: HashMap<u64, Pending>,
    in_flight: HashMap<u64, u32>,
    next_id: u64,
}

/// The attributes of version `v` of inode `ino` (the version is the size).
fn attr(ino: u64, v: u64) -> Attr {
    Attr { size: v, ..Attr::new(ino, weft_proto::FileKind::File, 0o644) }
}

impl Mount {
    fn attributes_changed(&mut self, ino: u64) {
        self.attr_version += 1;
        self.inode_version.insert(ino, self.attr_version);
    }
}

struct Held {
    id: u64,
    c: usize,
    session: u64,
    epoch: u64,
    acked: u64,
    sent_us: u64,
}

/// A reply the MDS holds back: a change until its recalls are acknowledged, then (like a read) until the recalls
/// raced by its grant are.
struct Change {
    read: bool,
    granted: bool,
    c: usize,
    ino: u64,
    v: u64,
    t: Ticket,
    kv: u64,
    session: u64,
    seen: Option<u64>,
    waits: Vec<Wait>,
    incarnation: u64,
    id: u64,
}

struct World {
    rng: Rng,
    q: Queue<Ev>,
    table: LeaseTable,
    store: HashMap<u64, u64>,
    /// The newest version of each inode whose change was answered.
    answered: HashMap<u64, u64>,
    mounts: Vec<Mount>,
    held: Vec<Held>,
    changes: Vec<Change>,
    next_hold: u64,
    start: Instant,
    summary: Summary,
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng::new(seed);
        let n = 2 + rng.below(2) as usize;
        let mounts = (0..n)
            .map(|i| Mount {
                session: 100 + i as u64,
                view: LeaseView::default(),
                cache: HashMap::new(),
                acked: 0,
                incarnation: 0,
                slow: false,
                attr_version: 0,
                inode_version: HashMap::new(),
                writing: Default::default(),
                gateway: None,
            })
            .collect();
        let mut mounts: Vec<Mount> = mounts;
        for m in &mut mounts {
            if rng.chance(500) {
                m.gateway = Some(Gateway::default());
            }
        }
        let limits = Limits { lease_ms: LEASE_MS, per_holder: 1000, total: 3000, queued: 64 };
        let mut w = World {
            table: LeaseTable::new(limits, seed & 0xffff),
            rng,
            q: Queue::new(100_000),
            store: (0..INOS).map(|i| (i, 0)).collect(),
            answered: HashMap::new(),
            mounts,
            held: Vec::new(),
            changes: Vec::new(),
            next_hold: 0,
            start: Instant::now(),
            summary: Summary::default(),
        };
        for c in 0..n {
            w.q.after(w.rng.below(50 * MS), Ev::PollSend { c, incarnation: 0 });
            w.q.after(w.rng.below(200 * MS), Ev::Read { c, ino: 0 });
            w.q.after(w.rng.below(900 * MS), Ev::Write { c, ino: 1 });
        }
        w.q.after(10 * MS, Ev::Tick);
        w
    }

    fn now_ms(&self) -> u64 {
        self.q.now_us() / MS
    }

    fn instant(&self, us: u64) -> Instant {
        self.start + Duration::from_micros(us)
    }

    /// A network delay: mostly short, sometimes long enough for replies to overtake each other.
    fn delay(&mut self) -> u64 {
        if self.rng.chance(100) { self.rng.between(20 * MS, 200 * MS) } else { self.rng.between(50, 3 * MS) }
    }

    fn run(&mut self) -> Result<(), String> {
        let trace = std::env::var_os("WEFT_SIM_TRACE").is_some();
        while let Some(ev) = self.q.next_before(END_US) {
            self.summary.events += 1;
            if trace {
                eprintln!("{:>9} µs {ev:?}", self.q.now_us());
            }
            self.step(ev)?;
            self.settle();
            self.answer_held();
            self.check()?;
        }
        Ok(())
    }

    fn step(&mut self, ev: Ev) -> Result<(), String> {
        match ev {
            Ev::Read { c, ino } => {
                let m = &self.mounts[c];
                let t = m.gateway.as_ref().map_or_else(|| m.view.ticket(), |g| g.cache.ticket());
                let (t, kv) = (t, m.attr_version);
                let d = self.delay();
                self.q.after(d, Ev::ReadAtMds { c, ino, t, kv, session: self.mounts[c].session });
                let (next, ino) = (self.rng.between(5 * MS, 80 * MS), self.rng.below(INOS));
                self.q.after(next, Ev::Read { c, ino });
            }
            Ev::ReadAtMds { c, ino, t, kv, session } => {
                let seen = self.table.is_holder(session).then(|| self.table.change_seq());
                let v = self.store[&ino];
                let incarnation = self.mounts[c].incarnation;
                let waits = match seen {
                    Some(seen) => self.table.grant_racing(session, &[ino], seen, self.now_ms()).unwrap_or_default(),
                    None => Vec::new(),
                };
                if !waits.is_empty() {
                    self.summary.count("read waited for a raced recall");
                }
                let ch =
                    Change { read: true, granted: true, c, ino, v, t, kv, session, seen, waits, incarnation, id: 0 };
                self.changes.push(ch);
            }
            Ev::ReadReply { c, ino, t, kv, v, incarnation } => self.install(c, ino, (t, kv), v, incarnation),
            Ev::Write { c, ino } => {
                let (next, next_ino) = (self.rng.between(20 * MS, 300 * MS), self.rng.below(INOS));
                self.q.after(next, Ev::Write { c, ino: next_ino });
                let m = &mut self.mounts[c];
                let (t, id) = match &mut m.gateway {
                    // A gateway has no inode lock: changes of one inode overlap.
                    Some(g) => {
                        g.next_id += 1;
                        let req = Request::SetAttr(SetAttrReq { ino, set: Default::default() });
                        g.pending.insert(g.next_id, Pending::of(&req, g.cache.ticket()));
                        *g.in_flight.entry(ino).or_default() += 1;
                        (g.cache.ticket(), g.next_id)
                    }
                    None if !m.writing.insert(ino) => return Ok(()),
                    None => (m.view.ticket(), 0),
                };
                let kv = m.attr_version;
                let d = self.delay();
                self.q.after(d, Ev::WriteAtMds { c, ino, t, kv, session: self.mounts[c].session, id });
            }
            Ev::WriteAtMds { c, ino, t, kv, session, id } => {
                let seen = self.table.is_holder(session).then(|| self.table.change_seq());
                let v = self.store[&ino] + 1;
                self.store.insert(ino, v);
                let recalls = [Recall { ino, name: None }];
                let waits = self.table.changed(session, &recalls, self.now_ms());
                if !waits.is_empty() {
                    self.summary.count("change waited for a recall");
                }
                let incarnation = self.mounts[c].incarnation;
                let ch =
                    Change { read: false, granted: false, c, ino, v, t, kv, session, seen, waits, incarnation, id };
                self.changes.push(ch);
            }
            Ev::WriteReply { c, ino, v, incarnation, id, .. } if self.mounts[c].gateway.is_some() => {
                self.gateway_reply(c, (ino, v), incarnation, id);
            }
            Ev::WriteReply { c, ino, t, kv, v, incarnation, .. } => {
                // The writer's kernel takes the reply's attributes (under the lease if its view allows).
                // A change's reply always updates the kernel's attributes (`fuse_do_setattr`), so any older reply of
                // a read in flight is dropped after it.
                self.mounts[c].writing.remove(&ino);
                self.mounts[c].cache.remove(&ino);
                if incarnation == self.mounts[c].incarnation {
                    self.mounts[c].inode_version.remove(&ino);
                }
                self.install(c, ino, (t, kv), v, incarnation);
            }
            Ev::PollSend { c, incarnation } => {
                let m = &self.mounts[c];
                if incarnation != m.incarnation {
                    return Ok(());
                }
                let ev = Ev::PollAtMds {
                    c,
                    session: m.session,
                    epoch: m.gateway.as_ref().map_or_else(|| m.view.epoch(), |g| g.cache.epoch()),
                    acked: m.acked,
                    sent_us: self.q.now_us(),
                    incarnation,
                };
                let d = self.delay();
                self.q.after(d, ev);
            }
            Ev::PollAtMds { c, session, epoch, acked, sent_us, incarnation } => {
                if incarnation != self.mounts[c].incarnation {
                    // Sent on a connection that closed since: lost.
                    return Ok(());
                }
                self.table.poll(session, epoch, acked, self.now_ms());
                self.next_hold += 1;
                let id = self.next_hold;
                self.held.push(Held { id, c, session, epoch, acked, sent_us });
                self.q.after(HOLD_MS * MS, Ev::PollHoldEnds { id });
            }
            Ev::PollHoldEnds { id } => {
                if let Some(i) = self.held.iter().position(|h| h.id == id) {
                    let h = self.held.remove(i);
                    self.reply_poll(h);
                }
            }
            Ev::PollReply { c, resp, sent_us, incarnation } => self.poll_reply(c, resp, sent_us, incarnation),
            Ev::Applied { c, upto, incarnation } => {
                let m = &mut self.mounts[c];
                if incarnation != m.incarnation {
                    return Ok(());
                }
                m.acked = upto;
                self.q.after(0, Ev::PollSend { c, incarnation });
            }
            Ev::Blip { c } => {
                let session = self.mounts[c].session;
                self.table.closed(session, self.now_ms());
                self.held.retain(|h| h.session != session);
                self.mounts[c].incarnation += 1;
                self.summary.count("connection blip");
                // The mount's poll loop calls again at once on the new connection (acked unchanged).
                let incarnation = self.mounts[c].incarnation;
                self.q.after(self.rng.between(MS, 50 * MS), Ev::PollSend { c, incarnation });
            }
            Ev::Tick => {
                self.q.after(10 * MS, Ev::Tick);
                if self.rng.chance(3) {
                    let c = self.rng.index(self.mounts.len());
                    self.q.after(0, Ev::Blip { c });
                }
            }
        }
        Ok(())
    }

    /// A reply's version goes into the kernel cache only if the mount's view trusts the reply.
    fn install(&mut self, c: usize, ino: u64, (t, kv): (Ticket, u64), v: u64, incarnation: u64) {
        let now = self.instant(self.q.now_us());
        let m = &mut self.mounts[c];
        if incarnation != m.incarnation {
            return;
        }
        if let Some(g) = &mut m.gateway {
            let cached = g.cache.put_attr(&t, &attr(ino, v), (now, 1));
            self.summary.count(if cached { "gateway cached a reply" } else { "gateway did not trust a reply" });
            return;
        }
        if m.inode_version.get(&ino).is_some_and(|&at| at > kv) {
            self.summary.count("kernel dropped an older reply");
            return;
        }
        m.attributes_changed(ino);
        if m.view.attr(&t, ino, (now, 1)) {
            m.cache.insert(ino, v);
            self.summary.count("reply cached under a lease");
        } else {
            self.summary.count("reply not trusted");
        }
    }

    /// A gateway's change of `ino` to version `v` returned (or its reply was lost with its connection: the call
    /// fails, and the change may have applied): the cache drops it, and keeps the reply if nothing came between.
    fn gateway_reply(&mut self, c: usize, (ino, v): (u64, u64), incarnation: u64, id: u64) {
        let now = self.instant(self.q.now_us());
        let m = &mut self.mounts[c];
        let g = m.gateway.as_mut().expect("a gateway");
        let p = g.pending.remove(&id).expect("a change in flight");
        let n = g.in_flight.get_mut(&ino).expect("counted");
        *n -= 1;
        let reply = Response::SetAttr(attr(ino, v));
        let lost = incarnation != m.incarnation;
        p.settle(&mut g.cache, (!lost).then_some(&reply), (now, 1));
        self.summary.count(if lost { "gateway's change reply lost" } else { "gateway's change returned" });
    }

    fn reply_poll(&mut self, h: Held) {
        let p = self.table.poll(h.session, h.epoch, h.acked, self.now_ms());
        let resp = LeaseWaitResp { epoch: p.epoch, lease_ms: LEASE_MS as u32, upto: p.upto, recalls: p.recalls };
        let (d, incarnation) = (self.delay(), self.mounts[h.c].incarnation);
        self.q.after(d, Ev::PollReply { c: h.c, resp, sent_us: h.sent_us, incarnation });
    }

    fn poll_reply(&mut self, c: usize, resp: LeaseWaitResp, sent_us: u64, incarnation: u64) {
        let sent = self.instant(sent_us);
        let m = &mut self.mounts[c];
        if incarnation != m.incarnation {
            return;
        }
        if let Some(g) = &mut m.gateway {
            // The cache drops what the recalls name before the next call acknowledges them.
            g.cache.received(&resp, sent, 1);
            g.cache.check();
            m.acked = resp.upto;
            self.q.after(0, Ev::PollSend { c, incarnation });
            return;
        }
        let new_epoch = resp.epoch != m.view.epoch();
        let invals = m.view.received(&resp, sent, 1);
        if new_epoch && m.slow {
            // It dropped everything it held: back under the check.
            m.slow = false;
            m.cache.clear();
        }
        if new_epoch {
            m.acked = 0;
        }
        if invals.is_empty() {
            m.acked = resp.upto;
            self.q.after(0, Ev::PollSend { c, incarnation });
            return;
        }
        // Recalls take effect in the kernel when applied: at once, or (rarely) past the lease.
        let slow = self.rng.chance(20);
        let d = if slow { self.rng.between(LEASE_MS * MS, 3 * LEASE_MS * MS) } else { self.rng.between(10, 2 * MS) };
        let m = &mut self.mounts[c];
        if slow {
            m.slow = true;
            self.summary.count("slow to apply recalls");
        } else {
            for i in invals {
                if let weft_fuse::leases::Inval::Attr(ino) = i {
                    m.cache.remove(&ino);
                    m.attributes_changed(ino);
                }
            }
        }
        self.q.after(d, Ev::Applied { c, upto: resp.upto, incarnation });
    }

    /// Changes whose recalls were acknowledged (or whose holders were revoked) are answered.
    fn settle(&mut self) {
        let now_ms = self.now_ms();
        let mut i = 0;
        while i < self.changes.len() {
            let ch = &mut self.changes[i];
            let before = self.table.counts().0;
            ch.waits.retain(|w| !self.table.settle(w, now_ms));
            if self.table.counts().0 > before {
                self.summary.count("holder revoked");
            }
            if !self.changes[i].waits.is_empty() {
                i += 1;
                continue;
            }
            let ch = &mut self.changes[i];
            if !ch.granted {
                ch.granted = true;
                if let Some(seen) = ch.seen {
                    ch.waits = self.table.grant_racing(ch.session, &[ch.ino], seen, now_ms).unwrap_or_default();
                    if !ch.waits.is_empty() {
                        self.summary.count("change's reply waited for a raced recall");
                        i += 1;
                        continue;
                    }
                }
            }
            let ch = self.changes.remove(i);
            let d = self.delay();
            let (c, ino, t, kv, v, incarnation, id) = (ch.c, ch.ino, ch.t, ch.kv, ch.v, ch.incarnation, ch.id);
            if ch.read {
                self.q.after(d, Ev::ReadReply { c, ino, t, kv, v, incarnation });
            } else {
                // Answered: from now on no other mount may keep an older version.
                self.answered.entry(ino).and_modify(|a| *a = (*a).max(v)).or_insert(v);
                self.q.after(d, Ev::WriteReply { c, ino, t, kv, v, incarnation, id });
            }
        }
    }

    /// Held polls whose holder has news are answered now.
    fn answer_held(&mut self) {
        let mut i = 0;
        while i < self.held.len() {
            let h = &self.held[i];
            if self.table.has_news(h.session, h.epoch) {
                let h = self.held.remove(i);
                self.reply_poll(h);
            } else {
                i += 1;
            }
        }
    }

    fn check(&mut self) -> Result<(), String> {
        self.summary.checks += 1;
        self.table.check()?;
        let now = self.instant(self.q.now_us());
        for (c, m) in self.mounts.iter_mut().enumerate() {
            let Some(g) = &mut m.gateway else { continue };
            // An inode the gateway is changing itself is excused until each change's reply: until then the
            // change is not answered to the gateway's own caller.
            for ino in (0..INOS).filter(|i| g.in_flight.get(i).is_none_or(|&n| n == 0)) {
                let answered = self.answered.get(&ino).copied().unwrap_or(0);
                if let Some(a) = g.cache.attr(ino, (now, 1))
                    && a.size < answered
                {
                    return Err(format!(
                        "at {} ms gateway {c} answers version {} of inode {ino} from its cache, but the change to \
                         version {answered} was answered",
                        self.now_ms(),
                        a.size
                    ));
                }
            }
        }
        for (c, m) in self.mounts.iter().enumerate() {
            if m.slow {
                continue;
            }
            // An inode the mount is changing itself is excused until its reply: the kernel holds the inode's lock.
            for (ino, v) in m.cache.iter().filter(|(ino, _)| !m.writing.contains(ino)) {
                let answered = self.answered.get(ino).copied().unwrap_or(0);
                if *v < answered {
                    return Err(format!(
                        "at {} ms mount {c} caches version {v} of inode {ino} under a lease, but the change to \
                         version {answered} was answered",
                        self.now_ms()
                    ));
                }
            }
        }
        if self.table.counts().0 > 0
            && !self.mounts.iter().any(|m| m.slow)
            && self.summary.get("slow to apply recalls") == 0
        {
            return Err("a holder was revoked though no mount was slow".into());
        }
        Ok(())
    }
}

fn run_one(seed: u64) -> Result<Summary, String> {
    let mut w = World::new(seed);
    w.run()?;
    w.summary.seeds = 1;
    Ok(w.summary)
}

#[test]
fn no_mount_keeps_a_leased_version_older_than_an_answered_change() {
    let total = seeds::run(
        "no_mount_keeps_a_leased_version_older_than_an_answered_change",
        "-p weft-sim --test leases",
        200,
        run_one,
    );
    for what in [
        "reply cached under a lease",
        "gateway cached a reply",
        "gateway did not trust a reply",
        "gateway's change returned",
        "gateway's change reply lost",
        "reply not trusted",
        "change waited for a recall",
        "slow to apply recalls",
        "holder revoked",
        "connection blip",
    ] {
        assert!(total.get(what) > 0 || total.seeds < 20, "no '{what}' in {total}");
    }
}

#[test]
fn one_seed_replays_exactly() {
    let run = || run_one(11).expect("seed 11");
    assert_eq!(run(), run());
}
