//! The namespace's side of several services on one database (docs/format.md §28): stepping the duty lease
//! ([`crate::duty`]), fencing the duties' writes by it, and liveness and phases shared through the store.
//!
//! On a store no other service can open (redb, memory) there is no lease: the one service holds every duty, and
//! liveness stays in memory.

use weft_proto::msg::RegisterServerReq;

use super::{Namespace, ServerSlot, lock};
use crate::clock::Clock;
use crate::duty::{self, Step};
use crate::error::MetaError;
use crate::membership::{self, Phase};
use crate::store::{MetaStore, MetaTxn};

impl<S: MetaStore, C: Clock> Namespace<S, C> {
    /// Sets how long a service may be silent before the duty holder releases its sessions' locks
    /// (`locks_orphan_ms`, format §30).
    pub fn with_locks_orphan_ms(mut self, ms: u64) -> Self {
        self.locks_orphan_ms = ms;
        self
    }

    /// Every service of a shared store, each duty step: raises its liveness counter (`svc.<instance>`, format
    /// §30), by which the duty holder tells the lock sessions of a dead service.
    pub fn service_beat(&self) -> Result<(), MetaError> {
        if !self.shared {
            return Ok(());
        }
        let name = service_beat_name(self.instance());
        self.store.write(|t| {
            let n = read_counter(t, &name)?.unwrap_or(0);
            t.put_xattr(0, &name, &n.wrapping_add(1).to_le_bytes())
        })
    }

    /// The duty holder, each duty step: releases every lock of the sessions of services whose counter it has
    /// seen unchanged for `locks_orphan_ms` (their clients had that long to come back elsewhere and adopt them),
    /// and forgets those services' counters. Fenced writes (format §28). Answers how many sessions lost locks.
    pub fn reap_orphan_locks(&self) -> Result<usize, MetaError> {
        if !self.shared || !self.duty_held() {
            return Ok(0);
        }
        let now = self.clock.mono_ms();
        let sessions = self.store.read(crate::db_locks::list_sessions)?;
        let mut services: Vec<u64> = sessions.iter().map(|(_, service)| *service).collect();
        services.sort_unstable();
        services.dedup();
        let beats = self.store.read(|t| {
            services
                .iter()
                .map(|&s| Ok((s, read_counter(t, &service_beat_name(s))?)))
                .collect::<Result<Vec<_>, MetaError>>()
        })?;
        let me = self.instance();
        let dead: Vec<u64> = {
            let mut seen = lock(&self.service_beats);
            seen.retain(|s, _| services.contains(s));
            beats
                .into_iter()
                .filter(|&(service, beat)| {
                    let e = seen.entry(service).or_insert((beat, now));
                    if e.0 != beat {
                        *e = (beat, now);
                    }
                    service != me && now.saturating_sub(e.1) >= self.locks_orphan_ms
                })
                .map(|(service, _)| service)
                .collect()
        };
        let mut reaped = 0;
        for (session, service) in sessions.into_iter().filter(|(_, s)| dead.contains(s)) {
            let (n, _) = self.duty_write(|t| crate::db_locks::release_in(t, session, None, None))?;
            reaped += 1;
            tracing::warn!(
                session = format_args!("{session:#x}"),
                service = format_args!("{service:016x}"),
                locks = n,
                orphan_ms = self.locks_orphan_ms,
                "released the locks of a session whose metadata service is gone and whose client did not come back"
            );
        }
        for service in dead {
            self.duty_write(|t| t.del_xattr(0, &service_beat_name(service)))?;
            lock(&self.service_beats).remove(&service);
        }
        Ok(reaped)
    }

    /// Sets the duty lease's time (`duty_lease_ms`, format §28).
    pub fn with_duty_lease_ms(self, ms: u64) -> Self {
        let me = lock(&self.duty).me();
        *lock(&self.duty) = duty::DutyLease::new(me, ms);
        self
    }

    /// How often [`Namespace::duty_step`] should run (ms).
    pub fn duty_step_every_ms(&self) -> u64 {
        lock(&self.duty).step_every_ms()
    }

    /// One step of the duty lease: reads the record and takes or renews it when due. Answers whether this service
    /// may run the duties now. Blocking (store transactions).
    pub fn duty_step(&self) -> Result<bool, MetaError> {
        if !self.shared {
            return Ok(true);
        }
        let began = self.clock.mono_ms();
        let rec = self.store.read(duty::read)?;
        let step = lock(&self.duty).decide(rec, began);
        let Step::Swap { seen, next } = step else {
            return Ok(false);
        };
        let was_held = lock(&self.duty).held(began).is_some();
        match self.store.write(|t| duty::swap(t, seen, next)) {
            Ok(true) => {
                lock(&self.duty).swapped(next, began);
                if seen.is_none_or(|s| s.holder != next.holder) || !was_held {
                    tracing::info!(
                        instance = format_args!("{:016x}", next.holder),
                        epoch = next.epoch,
                        "holding the duty lease: running membership, drains, orphan collection, healing here"
                    );
                }
                Ok(true)
            }
            Ok(false) => {
                self.duty_lost(was_held, "another service took it");
                Ok(false)
            }
            Err(e) => {
                self.duty_lost(was_held, "its renewal failed");
                Err(e)
            }
        }
    }

    fn duty_lost(&self, was_held: bool, why: &str) {
        lock(&self.duty).lost();
        if was_held {
            tracing::warn!(why, "lost the duty lease: this service's duties stop until it holds it again");
        }
    }

    /// This service's instance id (the duty lease's holder id when it holds it; format §28, §30).
    pub fn instance(&self) -> u64 {
        lock(&self.duty).me()
    }

    /// Whether this service may run the duties now (see [`Namespace::duty_step`]).
    pub fn duty_held(&self) -> bool {
        !self.shared || lock(&self.duty).held(self.clock.mono_ms()).is_some()
    }

    /// A duty's store write, fenced (format §28): on a shared store it applies only if the lease record still
    /// names this service at the epoch it holds (renewed first when its time ran out), else `Fenced`.
    pub(crate) fn duty_write<R>(
        &self,
        mut f: impl FnMut(&mut dyn MetaTxn) -> Result<R, MetaError>,
    ) -> Result<R, MetaError> {
        if !self.shared {
            return self.store.write(f);
        }
        let mut epoch = lock(&self.duty).held(self.clock.mono_ms());
        if epoch.is_none() && self.duty_step()? {
            epoch = lock(&self.duty).held(self.clock.mono_ms());
        }
        let Some(epoch) = epoch else {
            return Err(MetaError::Fenced("this service does not hold the duty lease".into()));
        };
        let me = lock(&self.duty).me();
        self.store.write(|t| {
            duty::check(t, me, epoch)?;
            f(t)
        })
    }

    /// On a shared store: reads every data server's address, phase and liveness counter (format §28) into this
    /// service's view; a counter that moved since the last read means the server was heard (by some service)
    /// now. Call it every membership tick, on every service.
    pub fn refresh_servers(&self) -> Result<(), MetaError> {
        if !self.shared {
            return Ok(());
        }
        let (rows, phases, beats) = self.store.read(|t| {
            let rows = t.list_servers()?;
            let phases = t.list_server_phases()?;
            let mut beats = Vec::with_capacity(rows.len());
            for (id, _) in &rows {
                beats.push(read_beat(t, *id)?);
            }
            Ok::<_, MetaError>((rows, phases, beats))
        })?;
        let now = self.clock.mono_ms();
        let mut servers = self.lock_servers();
        for ((id, addr), beat) in rows.into_iter().zip(beats) {
            let code = phases.iter().find(|(p, _)| *p == id).map_or(0, |(_, c)| *c);
            let Some(phase) = Phase::from_code(code) else {
                tracing::warn!(id, code, "data server: unknown membership phase code in the store; keeping ours");
                continue;
            };
            let slot = servers.entry(id).or_insert_with(|| new_slot(addr.clone(), phase));
            if slot.addr != addr {
                slot.addr = addr;
                slot.nfs_addrs.clear();
            }
            slot.phase = phase;
            if slot.beat_seen.is_some_and(|b| b != beat) {
                slot.last_ms = Some(now);
            }
            slot.beat_seen = Some(beat);
        }
        Ok(())
    }

    /// On a shared store, a heartbeat's transaction (format §28): registers the address if the store has another,
    /// raises the server's liveness counter and moves its phase from the store's (a failed or replaced server
    /// drains). Answers the phase before and after.
    pub(super) fn heartbeat_shared(&self, r: &RegisterServerReq) -> Result<(Phase, Phase), MetaError> {
        self.store.write(|t| {
            let known = t.get_server(r.id)?.is_some_and(|a| a == r.addr);
            if !known {
                t.put_server(r.id, &r.addr)?;
            }
            let beat = read_beat(t, r.id)?.wrapping_add(1);
            t.put_xattr(duty::DUTY_INO, &duty::beat_name(r.id), &beat.to_le_bytes())?;
            let code = phase_code(t, r.id)?;
            let was = Phase::from_code(code)
                .ok_or_else(|| MetaError::Corrupt(format!("data server {}: unknown phase code {code}", r.id)))?;
            let next = membership::on_heartbeat(was);
            if next != was {
                t.put_server_phase(r.id, next.code())?;
            }
            Ok((was, next))
        })
    }

    /// A duty's phase change of server `id` from `was` to `next`, fenced. On a shared store it applies only if the
    /// store still has the server `was` and, with `silent`, no service heard it since this service read its
    /// counter as `beat_seen` (format §28). Answers whether it applied.
    pub(super) fn move_phase(
        &self,
        id: u32,
        (was, next): (Phase, Phase),
        beat_seen: Option<u64>,
        silent: bool,
    ) -> Result<bool, MetaError> {
        self.duty_write(|t| {
            if self.shared {
                let code = phase_code(t, id)?;
                if code != was.code() {
                    return Ok(false);
                }
                // Never read (no refresh yet): not known to be silent.
                if silent && beat_seen.is_none_or(|b| read_beat(t, id).map_or(true, |now| now != b)) {
                    return Ok(false);
                }
            }
            t.put_server_phase(id, next.code())?;
            Ok(true)
        })
    }
}

/// Server `id`'s phase code in `t` (no row: 0, member).
fn phase_code(t: &mut dyn MetaTxn, id: u32) -> Result<u8, MetaError> {
    Ok(t.list_server_phases()?.into_iter().find(|(p, _)| *p == id).map_or(0, |(_, c)| c))
}

/// Server `id`'s liveness counter in `t` (0 when it never beat at a shared store).
fn read_beat(t: &mut dyn MetaTxn, id: u32) -> Result<u64, MetaError> {
    match t.get_xattr(duty::DUTY_INO, &duty::beat_name(id))? {
        None => Ok(0),
        Some(v) => v
            .try_into()
            .map(u64::from_le_bytes)
            .map_err(|_| MetaError::Corrupt(format!("liveness counter of data server {id}: not 8 bytes"))),
    }
}

fn new_slot(addr: String, phase: Phase) -> ServerSlot {
    ServerSlot { addr, space: None, device: None, last_ms: None, phase, nfs_addrs: Vec::new(), beat_seen: None }
}

/// The name of a service's liveness counter (format §30).
fn service_beat_name(instance: u64) -> String {
    format!("{}{instance:016x}", duty::SERVICE_BEAT_PREFIX)
}

/// A `u64` counter record at inode 0, if present.
fn read_counter(t: &mut dyn MetaTxn, name: &str) -> Result<Option<u64>, MetaError> {
    match t.get_xattr(0, name)? {
        None => Ok(None),
        Some(v) => v
            .try_into()
            .map(|b: [u8; 8]| Some(u64::from_le_bytes(b)))
            .map_err(|_| MetaError::Corrupt(format!("{name} is not 8 bytes"))),
    }
}

#[cfg(test)]
mod tests {
    //! Two services (namespaces) on one PostgreSQL database, each with a clock of its own that only moves when told.

    use std::sync::Arc;

    use weft_proto::msg::{HeartbeatResp, RegisterServerReq};
    use weft_proto::{Request, Response, ServerState, SpaceStat};

    use super::*;
    use crate::{DEFAULT_LIVENESS_MS, ManualClock, PgStore};

    const TTL: u64 = 3000;
    const REBUILD_MS: u64 = 20_000;
    type Ns = Namespace<PgStore, Arc<ManualClock>>;

    fn two_services() -> ((Ns, Arc<ManualClock>), (Ns, Arc<ManualClock>)) {
        let url = crate::pg_testing::fresh_url();
        let open = || {
            let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
            let store = PgStore::connect(&url).expect("the test database");
            let ns = Namespace::new(store, clock.clone(), DEFAULT_LIVENESS_MS)
                .unwrap()
                .with_rebuild_after_ms(REBUILD_MS)
                .with_duty_lease_ms(TTL);
            (ns, clock)
        };
        (open(), open())
    }

    fn heartbeat(ns: &Ns, id: u32) -> HeartbeatResp {
        let req = Request::RegisterServerDev(weft_proto::msg::RegisterServerDevReq {
            id,
            addr: format!("ds{id}:7000"),
            space: Default::default(),
        });
        match ns.execute(&req) {
            Ok(Response::RegisterServerDev(r)) => r,
            other => panic!("heartbeat of {id}: {other:?}"),
        }
    }

    fn register(ns: &Ns, id: u32) {
        let space = SpaceStat { bytes_total: 1000, bytes_free: 500, objects: 0 };
        let req = Request::RegisterServer(RegisterServerReq { id, addr: format!("ds{id}:7000"), space });
        assert_eq!(ns.execute(&req), Ok(Response::RegisterServer(())));
    }

    fn phase_in_store(ns: &Ns, id: u32) -> u8 {
        let phases = ns.store.read(|t| t.list_server_phases()).unwrap();
        phases.into_iter().find(|(p, _)| *p == id).map_or(0, |(_, c)| c)
    }

    #[test]
    fn one_service_holds_the_duties_another_takes_them_only_after_a_whole_lease_unrenewed() {
        let ((a, clock_a), (b, clock_b)) = two_services();
        assert!(a.duty_step().unwrap(), "the first service takes the free lease at once");
        assert!(!b.duty_step().unwrap() && !b.duty_held());
        for _ in 0..4 {
            // A renews every third of the lease; B's wait starts over at each renewal it reads.
            clock_a.advance_ms(TTL / 3);
            clock_b.advance_ms(TTL / 3);
            assert!(a.duty_step().unwrap());
            assert!(!b.duty_step().unwrap(), "taken while the holder renews");
        }
        // A stops renewing (dead or paused). B takes the lease one whole lease after the last renewal it read.
        clock_b.advance_ms(TTL - 1);
        assert!(!b.duty_step().unwrap());
        clock_b.advance_ms(1);
        assert!(b.duty_step().unwrap() && b.duty_held());
        // A, paused all along (its clock did not move), still believes it holds the lease: its writes are fenced.
        assert!(a.duty_held(), "by its own clock");
        let fenced = a.duty_write(|t| t.put_server_phase(99, 1));
        assert!(matches!(fenced, Err(MetaError::Fenced(_))), "{fenced:?}");
        assert_eq!(phase_in_store(&a, 99), 0, "nothing of a fenced write applied");
        assert!(b.duty_write(|t| t.put_server_phase(99, 0)).is_ok());
        // At its next step A reads the new holder and stops.
        clock_a.advance_ms(TTL / 3);
        assert!(!a.duty_step().unwrap() && !a.duty_held());
    }

    #[test]
    fn the_holder_releases_the_locks_of_a_silent_services_sessions_only_after_locks_orphan_ms() {
        use crate::db_locks::{self, Caller};
        use crate::locks::LockOp;
        use weft_proto::msg::{LockClass, LockKind};
        const ORPHAN_MS: u64 = 10_000;
        let ((a, clock_a), (b, clock_b)) = two_services();
        let (a, b) = (a.with_locks_orphan_ms(ORPHAN_MS), b.with_locks_orphan_ms(ORPHAN_MS));
        assert!(a.duty_step().unwrap(), "A holds the duties");
        // A session at B holds a lock; B beats while it lives.
        let at_b = Caller { session: 0xb1, principal: "client", service: b.instance(), quota: None };
        let op = LockOp { class: LockClass::Posix, kind: Some(LockKind::Exclusive), start: 0, end: 9, pid: 1 };
        db_locks::set(&b.store, at_b, 42, 1, op).unwrap();
        let held = || a.store.read(db_locks::list_sessions).unwrap();
        for _ in 0..12 {
            b.service_beat().unwrap();
            clock_a.advance_ms(TTL / 3);
            clock_b.advance_ms(TTL / 3);
            assert!(a.duty_step().unwrap());
            assert_eq!(a.reap_orphan_locks().unwrap(), 0, "a live service's sessions keep their locks");
        }
        assert_eq!(held(), vec![(0xb1, b.instance())]);
        // B dies: its counter stops. Its session's locks stay for locks_orphan_ms after A last saw it change ...
        let mut waited = 0;
        while waited + TTL / 3 < ORPHAN_MS {
            clock_a.advance_ms(TTL / 3);
            waited += TTL / 3;
            assert!(a.duty_step().unwrap());
            assert_eq!(a.reap_orphan_locks().unwrap(), 0, "released {waited} ms after the last beat");
        }
        // ... then they go, with B's counter.
        clock_a.advance_ms(TTL / 3);
        assert!(a.duty_step().unwrap());
        assert_eq!(a.reap_orphan_locks().unwrap(), 1);
        assert!(held().is_empty());
        let other = Caller { session: 0xa1, principal: "other", service: a.instance(), quota: None };
        assert!(db_locks::set(&a.store, other, 42, 1, op).unwrap(), "the lock is free again");
        // A service that is not the holder reaps nothing, and the holder never reaps its own sessions.
        assert_eq!(b.reap_orphan_locks().unwrap(), 0);
        clock_a.advance_ms(ORPHAN_MS * 2);
        assert!(a.duty_step().unwrap());
        assert_eq!(a.reap_orphan_locks().unwrap(), 0);
        assert_eq!(held(), vec![(0xa1, a.instance())]);
    }

    #[test]
    fn a_server_heard_only_by_the_other_service_is_never_declared_failed_by_the_holder() {
        let ((a, clock_a), (b, clock_b)) = two_services();
        assert!(a.duty_step().unwrap());
        register(&b, 7);
        a.membership_tick(16).unwrap();
        let mut passed = 0;
        while passed <= 2 * REBUILD_MS {
            clock_a.advance_ms(1000);
            clock_b.advance_ms(1000);
            passed += 1000;
            assert_eq!(heartbeat(&b, 7).state, ServerState::Up);
            assert!(a.duty_step().unwrap());
            a.membership_tick(16).unwrap();
        }
        assert_eq!(phase_in_store(&a, 7), Phase::Member.code());
        let state = a.servers().into_iter().find(|s| s.id == 7).unwrap().state;
        assert_eq!(state, ServerState::Up, "the holder sees the other service's heartbeats");
    }

    #[test]
    fn a_heartbeat_between_the_holders_read_and_its_write_keeps_the_server_a_member() {
        let ((a, clock_a), (b, _)) = two_services();
        assert!(a.duty_step().unwrap());
        register(&b, 7);
        a.refresh_servers().unwrap();
        assert!(a.lock_servers().get(&7).unwrap().beat_seen.is_some());
        clock_a.advance_ms(REBUILD_MS + 1);
        assert!(a.duty_step().unwrap());
        // The holder read the counter (its tick refreshes first); the heartbeat lands before its phase write.
        let seen = a.lock_servers().get(&7).unwrap().beat_seen;
        heartbeat(&b, 7);
        assert!(!a.move_phase(7, (Phase::Member, Phase::Failed), seen, true).unwrap(), "heard meanwhile");
        assert_eq!(phase_in_store(&a, 7), Phase::Member.code());
    }

    #[test]
    fn a_server_the_holder_failed_is_drained_not_served_by_the_other_service_and_after_the_holder_dies() {
        let ((a, clock_a), (b, clock_b)) = two_services();
        assert!(a.duty_step().unwrap());
        assert_eq!(heartbeat(&b, 7).state, ServerState::Up);
        b.refresh_servers().unwrap();
        a.membership_tick(16).unwrap();
        // Silent past rebuild_after_ms: the holder declares it failed.
        clock_a.advance_ms(REBUILD_MS + 1);
        assert!(a.duty_step().unwrap());
        a.membership_tick(16).unwrap();
        let declared = phase_in_store(&a, 7);
        assert!([Phase::Failed.code(), Phase::Replaced.code()].contains(&declared), "phase code {declared}");
        // The holder dies. The server returns and beats at the other service, whose memory still says Member:
        // it is answered from the store's phase, and drains.
        assert_eq!(b.lock_servers().get(&7).unwrap().phase, Phase::Member);
        assert_eq!(heartbeat(&b, 7).state, ServerState::Draining);
        clock_b.advance_ms(TTL);
        assert!(!b.duty_step().unwrap());
        clock_b.advance_ms(TTL);
        assert!(b.duty_step().unwrap(), "the survivor takes the duties");
        assert_eq!(heartbeat(&b, 7).state, ServerState::Draining, "still fenced under the new holder");
        assert_eq!(b.draining_servers().len(), 1, "and the new holder drains it");
    }
}
