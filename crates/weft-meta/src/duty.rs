//! The duty lease (docs/format.md §28): which one of the metadata services sharing a database runs the duties that
//! must run once (membership and the spare scan, drains, orphan collection, the once-record sweep, the healer and
//! the scrubber beside it).
//!
//! Why a lease and not a lock: a service may die or be cut off holding it. Why no shared clock: every time here is
//! the deciding service's own monotonic clock. A contender takes the lease only after it saw one and the same
//! record, unchanged, for the record's whole `ttl_ms`; the holder acts only until three quarters of `ttl_ms` after
//! its last renewal *began*. The renewal the contender saw began before it was seen, so the holder has stopped a
//! quarter `ttl_ms` before the contender starts. Timing alone is not what makes the store safe: every duty write
//! first reads the record in its own transaction and fails unless it still names (this service, this epoch).
//!
//! [`DutyLease`] is the pure state machine (its tests walk every transition with numbers); `Namespace` runs its
//! steps against the store (`Namespace::duty_step`, `Namespace::duty_write`).
//!
//! ```text
//!            no record / same record seen for ttl_ms: Take          renew every ttl/3
//!  Waiting ─────────────────────────────────────────────▶ Holding ◀──────────────────┐
//!     ▲  (record changed: start watching it anew)           │  └─────────────────────┘
//!     └──────────── record names another / its CAS failed ──┘   (acts until began + ttl*3/4)
//! ```

use crate::error::MetaError;
use crate::store::MetaTxn;

/// The inode whose extended attributes hold the lease and the liveness counters (the once records' inode).
pub const DUTY_INO: u64 = crate::once::ONCE_INO;
/// The lease record's name.
pub const LEASE_NAME: &str = "duty.lease";
/// The start of every service's liveness counter's name at inode 0 (`svc.<instance>`, format §30).
pub(crate) const SERVICE_BEAT_PREFIX: &str = "svc.";
/// Default lease time (ms): a dead holder's duties resume elsewhere within about this long.
pub const DEFAULT_DUTY_LEASE_MS: u64 = 15_000;
/// Shortest lease accepted: below it a renewal every third of it would load the database for nothing.
pub const DUTY_LEASE_MS_MIN: u64 = 300;
const VERSION: u8 = 1;
const RECORD_BYTES: usize = 33;

/// The stored lease (format §28).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub holder: u64,
    pub epoch: u64,
    pub beat: u64,
    pub ttl_ms: u64,
}

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(RECORD_BYTES);
        v.push(VERSION);
        for n in [self.holder, self.epoch, self.beat, self.ttl_ms] {
            v.extend_from_slice(&n.to_le_bytes());
        }
        v
    }

    pub fn decode(v: &[u8]) -> Result<Record, MetaError> {
        let bad = |why: String| MetaError::Corrupt(format!("duty lease record: {why}"));
        if v.len() != RECORD_BYTES {
            return Err(bad(format!("{} bytes, not {RECORD_BYTES}", v.len())));
        }
        if v[0] != VERSION {
            return Err(bad(format!("version {} (this build reads {VERSION})", v[0])));
        }
        let n = |i: usize| u64::from_le_bytes(v[1 + 8 * i..9 + 8 * i].try_into().expect("8 bytes"));
        let r = Record { holder: n(0), epoch: n(1), beat: n(2), ttl_ms: n(3) };
        if r.holder == 0 {
            return Err(bad("holder 0".into()));
        }
        Ok(r)
    }
}

/// Reads the lease record in `t`.
pub fn read(t: &mut dyn MetaTxn) -> Result<Option<Record>, MetaError> {
    t.get_xattr(DUTY_INO, LEASE_NAME)?.map(|v| Record::decode(&v)).transpose()
}

/// Writes `next` in `t` if the record is still `seen`; `false` (nothing written) if it moved meanwhile.
pub fn swap(t: &mut dyn MetaTxn, seen: Option<Record>, next: Record) -> Result<bool, MetaError> {
    if read(t)? != seen {
        return Ok(false);
    }
    t.put_xattr(DUTY_INO, LEASE_NAME, &next.encode())?;
    Ok(true)
}

/// Fails with [`MetaError::Fenced`] unless the record in `t` names `holder` at `epoch`.
pub fn check(t: &mut dyn MetaTxn, holder: u64, epoch: u64) -> Result<(), MetaError> {
    match read(t)? {
        Some(r) if r.holder == holder && r.epoch == epoch => Ok(()),
        r => Err(MetaError::Fenced(format!(
            "this service (instance {holder:016x}, epoch {epoch}) no longer holds the duty lease: the store names {}",
            r.map_or("nobody".to_string(), |r| format!("instance {:016x}, epoch {}", r.holder, r.epoch))
        ))),
    }
}

/// The liveness counter's name of data server `id` (format §28).
pub fn beat_name(id: u32) -> String {
    format!("beat.{id}")
}

/// What a service should do after reading the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Write `next` if the record is still `seen` (a take or a renewal).
    Swap { seen: Option<Record>, next: Record },
    /// Another service holds it (or may still): read again later.
    Wait,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    epoch: u64,
    until_ms: u64,
}

/// One service's view of the lease. Pure: every input is a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DutyLease {
    me: u64,
    ttl_ms: u64,
    held: Option<Held>,
    /// The other holder's record last read, and when it was first read so.
    watching: Option<(Record, u64)>,
}

impl DutyLease {
    /// The view of service instance `me` (never 0) with lease time `ttl_ms`.
    pub fn new(me: u64, ttl_ms: u64) -> DutyLease {
        assert!(me != 0, "instance id 0 marks no holder");
        DutyLease { me, ttl_ms: ttl_ms.max(DUTY_LEASE_MS_MIN), held: None, watching: None }
    }

    pub fn me(&self) -> u64 {
        self.me
    }

    /// How often to step: a third of the lease, so two renewals can fail before the holder stops acting.
    pub fn step_every_ms(&self) -> u64 {
        self.ttl_ms / 3
    }

    /// What to do with `rec`, read at `now_ms`.
    pub fn decide(&mut self, rec: Option<Record>, now_ms: u64) -> Step {
        let take = |epoch: u64| Record { holder: self.me, epoch, beat: 0, ttl_ms: self.ttl_ms };
        let Some(r) = rec else {
            self.watching = None;
            return Step::Swap { seen: None, next: take(1) };
        };
        if r.holder == self.me {
            // Ours (even if our own time ran out: no one took it, and the swap decides against a racing take).
            self.watching = None;
            let next = Record { beat: r.beat.wrapping_add(1), ttl_ms: self.ttl_ms, ..r };
            return Step::Swap { seen: Some(r), next };
        }
        self.held = None;
        match self.watching {
            Some((w, since)) if w == r => {
                if now_ms.saturating_sub(since) >= r.ttl_ms {
                    Step::Swap { seen: Some(r), next: take(r.epoch.wrapping_add(1)) }
                } else {
                    Step::Wait
                }
            }
            _ => {
                self.watching = Some((r, now_ms));
                Step::Wait
            }
        }
    }

    /// The swap to `next`, whose step began at `began_ms` (before the record was read), committed.
    pub fn swapped(&mut self, next: Record, began_ms: u64) {
        assert_eq!(next.holder, self.me, "a service only ever writes itself as the holder");
        self.watching = None;
        self.held = Some(Held { epoch: next.epoch, until_ms: began_ms.saturating_add(self.ttl_ms / 4 * 3) });
    }

    /// The swap found the record moved (or failed): stop acting at once and watch it anew.
    pub fn lost(&mut self) {
        self.held = None;
        self.watching = None;
    }

    /// The epoch this service may act under at `now_ms`, if it holds the lease.
    pub fn held(&self, now_ms: u64) -> Option<u64> {
        self.held.filter(|h| now_ms < h.until_ms).map(|h| h.epoch)
    }
}

/// A process-unique, hard-to-guess instance id (never 0): the duty lease must not mistake a restarted service
/// for the one before it.
pub fn instance_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    h.write_u128(now.as_nanos());
    h.finish().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: u64 = 3000;

    fn rec(holder: u64, epoch: u64, beat: u64) -> Record {
        Record { holder, epoch, beat, ttl_ms: TTL }
    }

    #[test]
    fn records_round_trip_and_malformed_ones_are_corrupt() {
        let r = rec(7, 3, 9);
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        assert_eq!(r.encode().len(), RECORD_BYTES);
        let mut v = r.encode();
        v[0] = 2;
        assert!(matches!(Record::decode(&v), Err(MetaError::Corrupt(_))));
        assert!(matches!(Record::decode(&v[..10]), Err(MetaError::Corrupt(_))));
        assert!(matches!(Record::decode(&rec(0, 1, 0).encode()), Err(MetaError::Corrupt(_))));
    }

    #[test]
    fn no_record_is_taken_at_once_at_epoch_one() {
        let mut d = DutyLease::new(5, TTL);
        assert_eq!(d.decide(None, 0), Step::Swap { seen: None, next: rec(5, 1, 0) });
        assert_eq!(d.held(0), None, "nothing is held before the swap commits");
        d.swapped(rec(5, 1, 0), 0);
        assert_eq!(d.held(0), Some(1));
    }

    #[test]
    fn the_holder_renews_and_acts_until_three_quarters_of_the_lease_after_its_renewal_began() {
        let mut d = DutyLease::new(5, TTL);
        d.swapped(rec(5, 1, 0), 100);
        assert_eq!(d.decide(Some(rec(5, 1, 0)), 1000), Step::Swap { seen: Some(rec(5, 1, 0)), next: rec(5, 1, 1) });
        d.swapped(rec(5, 1, 1), 1000);
        assert_eq!(d.held(1000 + TTL / 4 * 3 - 1), Some(1));
        assert_eq!(d.held(1000 + TTL / 4 * 3), None, "a renewal that never comes ends the acting");
        // Still ours in the store: renewing resumes acting under the same epoch.
        assert!(matches!(d.decide(Some(rec(5, 1, 1)), 9000), Step::Swap { .. }));
    }

    #[test]
    fn a_contender_waits_the_whole_lease_on_one_unchanged_record_then_takes_the_next_epoch() {
        let mut d = DutyLease::new(6, TTL);
        assert_eq!(d.decide(Some(rec(5, 4, 2)), 1000), Step::Wait);
        assert_eq!(d.decide(Some(rec(5, 4, 2)), 1000 + TTL - 1), Step::Wait);
        assert_eq!(
            d.decide(Some(rec(5, 4, 2)), 1000 + TTL),
            Step::Swap { seen: Some(rec(5, 4, 2)), next: rec(6, 5, 0) }
        );
    }

    #[test]
    fn a_renewal_seen_restarts_the_contenders_wait() {
        let mut d = DutyLease::new(6, TTL);
        assert_eq!(d.decide(Some(rec(5, 4, 2)), 0), Step::Wait);
        assert_eq!(d.decide(Some(rec(5, 4, 3)), TTL - 1), Step::Wait);
        assert_eq!(d.decide(Some(rec(5, 4, 3)), TTL + 10), Step::Wait, "the wait counts from the new beat");
        assert!(matches!(d.decide(Some(rec(5, 4, 3)), 2 * TTL - 1), Step::Swap { .. }));
    }

    #[test]
    fn the_contenders_wait_follows_the_holders_ttl_not_its_own() {
        let mut d = DutyLease::new(6, 1000);
        let long = Record { ttl_ms: 10_000, ..rec(5, 1, 0) };
        assert_eq!(d.decide(Some(long), 0), Step::Wait);
        assert_eq!(d.decide(Some(long), 9_999), Step::Wait);
        assert!(matches!(d.decide(Some(long), 10_000), Step::Swap { .. }));
    }

    #[test]
    fn a_holder_that_reads_another_holder_or_loses_its_swap_stops_acting_at_once() {
        let mut d = DutyLease::new(5, TTL);
        d.swapped(rec(5, 1, 0), 0);
        assert_eq!(d.decide(Some(rec(6, 2, 0)), 10), Step::Wait);
        assert_eq!(d.held(10), None);
        let mut d = DutyLease::new(5, TTL);
        d.swapped(rec(5, 1, 0), 0);
        d.lost();
        assert_eq!(d.held(1), None);
    }

    #[test]
    fn the_holder_stops_a_quarter_lease_before_any_contender_may_take() {
        // The holder's renewal begins at `b` and commits; the contender reads it no sooner than `b`.
        for b in [0u64, 17, 1000] {
            let mut holder = DutyLease::new(5, TTL);
            holder.swapped(rec(5, 1, 1), b);
            let mut contender = DutyLease::new(6, TTL);
            let mut t = b;
            while contender.decide(Some(rec(5, 1, 1)), t) == Step::Wait {
                t += 1;
            }
            let last_act = (b..t).rev().find(|&x| holder.held(x).is_some()).unwrap();
            assert!(last_act + TTL / 4 <= t, "holder acted at {last_act}, contender took at {t}");
        }
    }

    #[test]
    fn lease_times_below_the_minimum_are_raised() {
        assert_eq!(DutyLease::new(1, 1).step_every_ms(), DUTY_LEASE_MS_MIN / 3);
    }
}
