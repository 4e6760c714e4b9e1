//! Membership, the data servers' leases and the duty lease, simulated (issue 30 item 3).
//!
//! Real code: two or three metadata services (`weft_meta::Namespace`, the code `weft meta` runs) share one store
//! as services share PostgreSQL, each with its own drifting clock; data servers hold the real lease state machine
//! (`weft_data::lease::Lease`) on drifting clocks of their own. Simulated: the network between them (heartbeats
//! and replies delayed, lost, duplicated, reordered; a data server cut off for a while), the store (a service cut
//! off from it, transactions failing before or after their commit), processes (a data server or a service killed
//! and restarted, a service paused), and the drain's object listing (instant when the server is reachable).
//!
//! Checked after every event:
//! - fencing: a data server that would serve a client now (its lease holds on its own clock) is `Member` or
//!   `Spare` in the store, never `Failed`, `Replaced` or `Draining` (its slots may have moved);
//! - no early failure: a server is declared failed only after `rebuild_after_ms` of real time (less the clocks'
//!   drift) in which no service heard it;
//! - the duty lease never overlaps: at no instant do two live services both believe they hold it.
//!
//! After the faults stop, within a bounded quiet time: every server serves again and one service holds the duties.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use weft_data::lease::Lease;
use weft_meta::membership::Phase;
use weft_meta::{ManualClock, MemStore, MetaStore, Namespace};
use weft_proto::msg::{HeartbeatResp, RegisterServerDevReq};
use weft_proto::{Request, Response};
use weft_sim::seeds::{self, Summary};
use weft_sim::store::{SimStore, StoreFaults};
use weft_sim::{DriftClock, Queue, Rng};

const HEARTBEAT_MS: u64 = 500;
const LIVENESS_MS: u64 = 2_000;
const REBUILD_AFTER_MS: u64 = 8_000;
const DUTY_LEASE_MS: u64 = 3_000;
const MEMBERSHIP_MS: u64 = 500;
/// The data servers' configured lease; the one in force is at most half `REBUILD_AFTER_MS`.
const DS_LEASE_MS: u64 = 150_000;
/// Clocks run within this many millionths of real time.
const DRIFT_PPM_MAX: u64 = 100_000;
const FAULTS_US: u64 = 120_000_000;
/// Quiet time after the faults: every fault has healed and every server beaten well within it.
const QUIET_US: u64 = 4 * REBUILD_AFTER_MS * 1000;
const MS: u64 = 1000;

type Ns = Namespace<SimStore, Arc<ManualClock>>;

#[test]
fn membership_leases_and_fencing_hold_under_faults() {
    let total =
        seeds::run("membership_leases_and_fencing_hold_under_faults", "-p weft-sim --test membership", 300, run_one);
    // The faults must have happened and the checks must have bitten, or the test proves nothing.
    for what in ["declared failed", "drained", "served", "refused", "ds killed", "service killed", "cut off"] {
        assert!(total.get(what) > 0 || total.seeds < 20, "no '{what}' in {total}");
    }
}

#[test]
fn one_seed_replays_exactly() {
    let runs: Vec<(Summary, Vec<String>, BTreeMap<u32, u8>)> = (0..2)
        .map(|_| {
            let mut w = World::new(42);
            w.run().expect("seed 42");
            (w.summary, w.trail.into_iter().collect(), w.phases)
        })
        .collect();
    assert_eq!(runs[0], runs[1]);
}

fn run_one(seed: u64) -> Result<Summary, String> {
    let mut w = World::new(seed);
    w.run()?;
    Ok(w.summary)
}

/// A metadata service process.
struct Service {
    ns: Option<Ns>,
    clock: Arc<ManualClock>,
    drift: DriftClock,
    /// The ms the ManualClock reads now.
    at_ms: u64,
    incarnation: u64,
    paused_until_us: u64,
    faults: Arc<Mutex<StoreFaults>>,
}

/// A data server process.
struct DataServer {
    lease: Lease,
    clock: DriftClock,
    alive: bool,
    incarnation: u64,
    cut_until_us: u64,
}

#[derive(Debug)]
enum Ev {
    Beat { ds: usize, inc: u64 },
    Heard { svc: usize, inc: u64, ds: usize, ds_inc: u64, sent_ms: u64 },
    Answer { ds: usize, inc: u64, sent_ms: u64, reply: HeartbeatResp },
    DutyStep { svc: usize, inc: u64 },
    MembershipTick { svc: usize, inc: u64 },
    ClientIo { ds: usize },
    Fault,
    RestartDs { ds: usize },
    RestartService { svc: usize },
    Heal { svc: usize },
}

struct World {
    q: Queue<Ev>,
    rng: Rng,
    store: Arc<MemStore>,
    svcs: Vec<Service>,
    dss: Vec<DataServer>,
    /// Per data server: real time (µs) a service last answered its heartbeat.
    heard_us: Vec<Option<u64>>,
    phases: BTreeMap<u32, u8>,
    summary: Summary,
    /// The events of this seed, the last few kept for the failure report.
    trail: std::collections::VecDeque<String>,
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng::new(seed);
        let store = Arc::new(MemStore::new());
        let mut q = Queue::new(100_000);
        let services = 2 + rng.below(2) as usize;
        let servers = 3 + rng.below(4) as usize;
        let mut svcs = Vec::new();
        for svc in 0..services {
            let faults = StoreFaults::new(rng.next_u64());
            let drift = DriftClock::new(0, drift_rate(&mut rng));
            let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
            let faults = Arc::new(Mutex::new(faults));
            svcs.push(Service { ns: None, clock, drift, at_ms: 0, incarnation: 0, paused_until_us: 0, faults });
            q.after(rng.below(100 * MS), Ev::RestartService { svc });
        }
        let mut dss = Vec::new();
        for ds in 0..servers {
            let clock = DriftClock::new(0, drift_rate(&mut rng));
            dss.push(DataServer {
                lease: Lease::new(DS_LEASE_MS),
                clock,
                alive: false,
                incarnation: 0,
                cut_until_us: 0,
            });
            q.after(rng.below(1000 * MS), Ev::RestartDs { ds });
            q.after(rng.below(1000 * MS), Ev::ClientIo { ds });
        }
        q.after(5_000 * MS, Ev::Fault);
        let summary = Summary { seeds: 1, ..Summary::default() };
        let heard_us = vec![None; servers];
        let trail = Default::default();
        World { q, rng, store, svcs, dss, heard_us, phases: BTreeMap::new(), summary, trail }
    }

    fn run(&mut self) -> Result<(), String> {
        while let Some(ev) = self.q.next_before(FAULTS_US + QUIET_US) {
            self.summary.events += 1;
            if self.trail.len() == 16 {
                self.trail.pop_front();
            }
            self.trail.push_back(format!("{:>9.3} s {ev:?}", self.q.now_us() as f64 / 1e6));
            self.on(ev);
            self.check().map_err(|why| self.report(why))?;
        }
        self.check_settled().map_err(|why| self.report(why))
    }

    fn report(&self, why: String) -> String {
        let trail: Vec<&str> = self.trail.iter().map(String::as_str).collect();
        format!("at {:.3} s: {why}\n  last events:\n    {}", self.q.now_us() as f64 / 1e6, trail.join("\n    "))
    }

    fn on(&mut self, ev: Ev) {
        match ev {
            Ev::Beat { ds, inc } => self.beat(ds, inc),
            Ev::Heard { svc, inc, ds, ds_inc, sent_ms } => self.heard(svc, inc, ds, ds_inc, sent_ms),
            Ev::Answer { ds, inc, sent_ms, reply } => {
                let d = &mut self.dss[ds];
                if d.alive && d.incarnation == inc && d.cut_until_us <= self.q.now_us() {
                    d.lease.on_reply(sent_ms, reply);
                }
            }
            Ev::DutyStep { svc, inc } => self.duty_step(svc, inc),
            Ev::MembershipTick { svc, inc } => self.membership_tick(svc, inc),
            Ev::ClientIo { ds } => self.client_io(ds),
            Ev::Fault => self.fault(),
            Ev::RestartDs { ds } => self.restart_ds(ds),
            Ev::RestartService { svc } => self.restart_service(svc),
            Ev::Heal { svc } => {
                self.svcs[svc].faults.lock().unwrap().heal();
            }
        }
    }

    /// A message's fate on the network: `None` lost, else its delays (one, or two for a duplicate).
    fn send(&mut self, cut: bool) -> Vec<u64> {
        if cut || (self.faulty() && self.rng.chance(50)) {
            return Vec::new();
        }
        let first = delay(&mut self.rng);
        if self.rng.chance(10) { vec![first, delay(&mut self.rng)] } else { vec![first] }
    }

    fn faulty(&self) -> bool {
        self.q.now_us() < FAULTS_US
    }

    fn beat(&mut self, ds: usize, inc: u64) {
        let now = self.q.now_us();
        let d = &self.dss[ds];
        if !d.alive || d.incarnation != inc {
            return;
        }
        let (sent_ms, cut, next) = (d.clock.ms_at(now), d.cut_until_us > now, d.clock.real_us_for(HEARTBEAT_MS));
        for svc in 0..self.svcs.len() {
            for delay in self.send(cut) {
                let inc = self.svcs[svc].incarnation;
                self.q.after(delay, Ev::Heard { svc, inc, ds, ds_inc: self.dss[ds].incarnation, sent_ms });
            }
        }
        self.q.after(next, Ev::Beat { ds, inc });
    }

    /// The live, running service `svc` of incarnation `inc` with its clock set to now, if it is.
    fn service(&mut self, svc: usize, inc: u64) -> Option<&Ns> {
        let now = self.q.now_us();
        let s = &mut self.svcs[svc];
        if s.incarnation != inc || s.paused_until_us > now {
            return None;
        }
        let ms = s.drift.ms_at(now);
        s.clock.advance_ms(ms - s.at_ms);
        s.at_ms = ms;
        s.ns.as_ref()
    }

    fn heard(&mut self, svc: usize, inc: u64, ds: usize, ds_inc: u64, sent_ms: u64) {
        let Some(ns) = self.service(svc, inc) else { return };
        let req = Request::RegisterServerDev(RegisterServerDevReq {
            id: ds as u32,
            addr: format!("ds{ds}:7000"),
            space: Default::default(),
        });
        let Ok(Response::RegisterServerDev(reply)) = ns.execute(&req) else { return };
        self.heard_us[ds] = Some(self.q.now_us());
        let cut = self.dss[ds].cut_until_us > self.q.now_us();
        for delay in self.send(cut) {
            self.q.after(delay, Ev::Answer { ds, inc: ds_inc, sent_ms, reply });
        }
    }

    fn duty_step(&mut self, svc: usize, inc: u64) {
        if self.svcs[svc].incarnation != inc {
            return;
        }
        if let Some(ns) = self.service(svc, inc) {
            let _ = ns.duty_step();
            let _ = ns.service_beat().and_then(|()| ns.reap_orphan_locks());
        }
        let s = &self.svcs[svc];
        let every = s.ns.as_ref().map_or(DUTY_LEASE_MS / 3, |ns| ns.duty_step_every_ms());
        self.q.after(s.drift.real_us_for(every), Ev::DutyStep { svc, inc });
    }

    /// The membership task (`weft-meta` drain.rs): the holder decides, the others refresh; the holder drains
    /// the draining servers it reaches (the listing and removals themselves are not simulated).
    fn membership_tick(&mut self, svc: usize, inc: u64) {
        if self.svcs[svc].incarnation != inc {
            return;
        }
        let now = self.q.now_us();
        let reachable: Vec<bool> = self.dss.iter().map(|d| d.alive && d.cut_until_us <= now).collect();
        let mut drained = 0;
        if let Some(ns) = self.service(svc, inc) {
            let stepped = if ns.duty_held() {
                ns.membership_tick(64).map(|()| true)
            } else {
                ns.refresh_servers().map(|()| false)
            };
            if matches!(stepped, Ok(true)) {
                for (id, _) in ns.draining_servers() {
                    if reachable[id as usize] {
                        ns.drained(id);
                        drained += 1;
                    }
                }
            }
        }
        for _ in 0..drained {
            self.summary.count("drained");
        }
        let next = self.svcs[svc].drift.real_us_for(MEMBERSHIP_MS);
        self.q.after(next, Ev::MembershipTick { svc, inc });
    }

    fn client_io(&mut self, ds: usize) {
        let now = self.q.now_us();
        let d = &self.dss[ds];
        if d.alive {
            let serves = d.lease.check(d.clock.ms_at(now)).is_ok();
            self.summary.count(if serves { "served" } else { "refused" });
        }
        let next = self.rng.between(10 * MS, 400 * MS);
        self.q.after(next, Ev::ClientIo { ds });
    }

    fn restart_ds(&mut self, ds: usize) {
        let now = self.q.now_us();
        let rate = drift_rate(&mut self.rng);
        let d = &mut self.dss[ds];
        d.alive = true;
        d.incarnation += 1;
        d.lease = Lease::new(DS_LEASE_MS);
        d.clock = DriftClock::new(now, rate);
        let inc = d.incarnation;
        self.q.after(0, Ev::Beat { ds, inc });
    }

    fn restart_service(&mut self, svc: usize) {
        let now = self.q.now_us();
        let rate = drift_rate(&mut self.rng);
        let s = &mut self.svcs[svc];
        s.incarnation += 1;
        s.paused_until_us = 0;
        s.drift = DriftClock::new(now, rate);
        s.clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
        s.at_ms = 0;
        let store = SimStore { inner: self.store.clone(), faults: s.faults.clone() };
        s.ns = match Namespace::new(store, s.clock.clone(), LIVENESS_MS) {
            Ok(ns) => Some(ns.with_rebuild_after_ms(REBUILD_AFTER_MS).with_duty_lease_ms(DUTY_LEASE_MS)),
            Err(_) => None,
        };
        if s.ns.is_none() {
            // It could not start (the store failed it): it exits, and its supervisor starts it again.
            self.q.after(1_000 * MS, Ev::RestartService { svc });
            return;
        }
        let inc = s.incarnation;
        self.q.after(0, Ev::DutyStep { svc, inc });
        self.q.after(0, Ev::MembershipTick { svc, inc });
    }

    fn fault(&mut self) {
        if !self.faulty() {
            return;
        }
        let now = self.q.now_us();
        let long = self.rng.between(100 * MS, 3 * REBUILD_AFTER_MS * MS);
        match self.rng.below(6) {
            0 => {
                let ds = self.rng.index(self.dss.len());
                self.dss[ds].cut_until_us = now + long;
                self.summary.count("cut off");
            }
            1 => {
                let ds = self.rng.index(self.dss.len());
                self.dss[ds].alive = false;
                self.q.after(long, Ev::RestartDs { ds });
                self.summary.count("ds killed");
            }
            2 => {
                let svc = self.rng.index(self.svcs.len());
                self.svcs[svc].incarnation += 1;
                self.svcs[svc].ns = None;
                self.q.after(long.min(10_000 * MS), Ev::RestartService { svc });
                self.summary.count("service killed");
            }
            3 => {
                let svc = self.rng.index(self.svcs.len());
                self.svcs[svc].paused_until_us = now + long.min(2 * DUTY_LEASE_MS * MS);
                self.summary.count("service paused");
            }
            4 => {
                let svc = self.rng.index(self.svcs.len());
                self.svcs[svc].faults.lock().unwrap().cut = true;
                self.q.after(long.min(10_000 * MS), Ev::Heal { svc });
                self.summary.count("service cut from the store");
            }
            _ => {
                let svc = self.rng.index(self.svcs.len());
                self.svcs[svc].faults.lock().unwrap().flaky = self.rng.between(10, 200);
                self.q.after(long, Ev::Heal { svc });
                self.summary.count("store flaky");
            }
        }
        let next = self.rng.between(500 * MS, 6_000 * MS);
        self.q.after(next, Ev::Fault);
    }

    fn check(&mut self) -> Result<(), String> {
        self.summary.checks += 1;
        let now = self.q.now_us();
        let phases: BTreeMap<u32, u8> =
            self.store.read(|t| t.list_server_phases()).map_err(|e| e.to_string())?.into_iter().collect();
        for (ds, d) in self.dss.iter().enumerate() {
            let phase = phase_of(&phases, ds);
            if d.alive && d.lease.check(d.clock.ms_at(now)).is_ok() && !matches!(phase, Phase::Member | Phase::Spare) {
                return Err(format!("data server {ds} would serve clients while {phase:?} in the store"));
            }
            let was = phase_of(&self.phases, ds);
            if phase == Phase::Failed && was != Phase::Failed {
                self.summary.count("declared failed");
                let silent_us = now - self.heard_us[ds].unwrap_or(0);
                let least_us = REBUILD_AFTER_MS * MS * 1_000_000 / (1_000_000 + DRIFT_PPM_MAX);
                if silent_us < least_us {
                    return Err(format!(
                        "data server {ds} declared failed after {} ms of silence, before rebuild_after_ms",
                        silent_us / MS
                    ));
                }
            }
        }
        self.phases = phases;
        self.check_one_holder(now)
    }

    fn check_one_holder(&mut self, now: u64) -> Result<(), String> {
        let mut holders = Vec::new();
        for svc in 0..self.svcs.len() {
            let inc = self.svcs[svc].incarnation;
            // A paused service believes what its clock says when it wakes; asked now, it answers the same.
            let paused = std::mem::take(&mut self.svcs[svc].paused_until_us);
            if self.service(svc, inc).is_some_and(|ns| ns.duty_held()) {
                holders.push(svc);
            }
            self.svcs[svc].paused_until_us = paused;
        }
        if holders.len() > 1 {
            return Err(format!("services {holders:?} all hold the duty lease at {:.3} s", now as f64 / 1e6));
        }
        Ok(())
    }

    /// After the quiet time every server is reachable, alive and drained: all serve; one service holds duties.
    fn check_settled(&mut self) -> Result<(), String> {
        let now = self.q.now_us();
        for (ds, d) in self.dss.iter().enumerate() {
            if let Err(fence) = d.lease.check(d.clock.ms_at(now)) {
                let phase = phase_of(&self.phases, ds);
                return Err(format!("after the quiet time data server {ds} ({phase:?}) still refuses: {fence:?}"));
            }
        }
        let holders = (0..self.svcs.len()).filter(|&s| self.svcs[s].ns.as_ref().is_some_and(|ns| ns.duty_held()));
        if holders.count() != 1 {
            return Err("after the quiet time no service holds the duty lease".into());
        }
        Ok(())
    }
}

fn phase_of(phases: &BTreeMap<u32, u8>, ds: usize) -> Phase {
    phases.get(&(ds as u32)).map_or(Phase::Member, |&c| Phase::from_code(c).expect("a known phase code"))
}

/// A message's delay: mostly short, sometimes long enough to arrive after the ones sent after it.
fn delay(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..=89 => rng.between(50, 5 * MS),
        90..=98 => rng.between(5 * MS, 300 * MS),
        _ => rng.between(300 * MS, 3_000 * MS),
    }
}

fn drift_rate(rng: &mut Rng) -> u64 {
    1_000_000 - DRIFT_PPM_MAX + rng.below(2 * DRIFT_PPM_MAX + 1)
}
