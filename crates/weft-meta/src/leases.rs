//! Metadata leases (docs/format.md §31), as a pure state machine: which sessions hold leases on which inodes, the
//! recalls each must apply, and what a change waits for. Time comes in as milliseconds of one monotonic clock;
//! waking pollers and waiting for acknowledgements is the service's (`lease_service.rs`).
//!
//! A holder's lifecycle: created by its first poll (new epoch) → grants and recalls → acknowledged by later polls →
//! revoked (new epoch, everything dropped) when it misses a deadline or outgrows a bound → closed when its
//! connection closes (still granted, as its client may reconnect on the same session; changes wait for it until its
//! last poll's lease ran out) → gone, or fresh again at its next poll.

use std::collections::{HashMap, HashSet, VecDeque};

use weft_proto::msg::{RECALLS_PER_REPLY_MAX, Recall};

/// How long a client may trust its leases after sending an answered poll, and how long a change waits for a
/// holder that does not acknowledge.
pub const DEFAULT_LEASE_MS: u64 = 4_000;
/// Leased inodes per holder: one more revokes the holder.
pub const LEASES_PER_HOLDER_MAX: usize = 65_536;
/// Leased inodes over all holders: a grant past it revokes the granted holder.
pub const LEASES_MAX: usize = 262_144;
/// Recalls queued for one holder: one more revokes it.
pub const RECALLS_QUEUED_MAX: usize = 4_096;
/// Changes remembered for grants racing them; a grant whose read is older than all of them revokes its holder.
const CHANGES_KEPT: usize = 16_384;

/// The table's bounds and lease length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub lease_ms: u64,
    pub per_holder: usize,
    pub total: usize,
    pub queued: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            lease_ms: DEFAULT_LEASE_MS,
            per_holder: LEASES_PER_HOLDER_MAX,
            total: LEASES_MAX,
            queued: RECALLS_QUEUED_MAX,
        }
    }
}

#[derive(Debug)]
struct Holder {
    epoch: u64,
    inos: HashSet<u64>,
    /// Recalls not yet acknowledged: (number, recall, when queued).
    queue: VecDeque<(u64, Recall, u64)>,
    /// The number the next recall gets (from 1 in each epoch).
    next: u64,
    /// When its last poll arrived: the client trusts its leases no longer than this plus the lease.
    polled_ms: u64,
    /// Its connection closed: it goes once its last poll's lease ran out, or starts a new epoch at its next poll.
    closed: bool,
    /// A poll named the current epoch, so the client dropped what it held under earlier ones. Until then (after a
    /// revocation), every change by another session waits for it, to the end of its last poll's lease.
    confirmed: bool,
}

impl Holder {
    fn new(epoch: u64, polled_ms: u64, confirmed: bool) -> Holder {
        Holder { epoch, inos: HashSet::new(), queue: VecDeque::new(), next: 1, polled_ms, closed: false, confirmed }
    }
}

/// What one poll gets (`LeaseWaitResp` without the lease length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Polled {
    pub epoch: u64,
    pub upto: u64,
    pub recalls: Vec<Recall>,
}

/// What a change waits for: `session` to acknowledge recall `seq` of `epoch`, at most until `deadline_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub session: u64,
    pub epoch: u64,
    pub seq: u64,
    pub deadline_ms: u64,
}

#[derive(Debug)]
pub struct LeaseTable {
    limits: Limits,
    holders: HashMap<u64, Holder>,
    /// Which sessions hold a lease on each inode.
    by_ino: HashMap<u64, Vec<u64>>,
    leased: usize,
    /// Numbers changes; a grant names the last one its read saw.
    change_seq: u64,
    /// The last [`CHANGES_KEPT`] changes' recalls: (change number, recall, session that made it).
    changes: VecDeque<(u64, Recall, u64)>,
    /// Epochs are unique in this table (mixed with `salt`, so a restarted service's are unlike its predecessor's).
    epochs: u64,
    salt: u64,
    /// Holders revoked (a missed deadline or a bound), and recalls queued, since the table was made.
    revocations: u64,
    recalls: u64,
}

impl LeaseTable {
    pub fn new(limits: Limits, salt: u64) -> LeaseTable {
        LeaseTable {
            limits,
            holders: HashMap::new(),
            by_ino: HashMap::new(),
            leased: 0,
            change_seq: 0,
            changes: VecDeque::new(),
            epochs: 0,
            salt,
            revocations: 0,
            recalls: 0,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn new_epoch(&mut self) -> u64 {
        self.epochs += 1;
        // Never 0 (which means "no leases"): the low 32 bits count, the high ones are the salt's.
        (self.salt << 32) | (self.epochs & 0xffff_ffff)
    }

    /// A poll from `session`, which holds its leases under `epoch` and applied recalls up to `acked` in it.
    pub fn poll(&mut self, session: u64, epoch: u64, acked: u64, now_ms: u64) -> Polled {
        let fresh = match self.holders.get(&session) {
            None => Some(true),
            // A reconnect: its client may still trust what it held before it hears of the new epoch.
            Some(h) if h.closed => Some(false),
            Some(_) => None,
        };
        if let Some(held_nothing) = fresh {
            self.drop_holder(session);
            let epoch = self.new_epoch();
            self.holders.insert(session, Holder::new(epoch, now_ms, held_nothing));
        }
        let h = self.holders.get_mut(&session).expect("inserted above");
        h.polled_ms = now_ms;
        if epoch == h.epoch {
            h.confirmed = true;
            while h.queue.front().is_some_and(|(seq, _, _)| *seq <= acked) {
                h.queue.pop_front();
            }
        }
        let recalls: Vec<Recall> = h.queue.iter().take(RECALLS_PER_REPLY_MAX).map(|(_, r, _)| r.clone()).collect();
        let sent = h.queue.len().min(RECALLS_PER_REPLY_MAX);
        let upto = if sent == 0 { h.next - 1 } else { h.queue[sent - 1].0 };
        Polled { epoch: h.epoch, upto, recalls }
    }

    /// Whether `session`'s connection closed since it became a holder (or it holds nothing any more): a poll held
    /// past that answers no one, and must not poll again, which would make the holder live (a reconnect).
    pub fn is_closed(&self, session: u64) -> bool {
        self.holders.get(&session).is_none_or(|h| h.closed)
    }

    /// Whether a poll from `session` under `epoch` should be answered now rather than held.
    pub fn has_news(&self, session: u64, epoch: u64) -> bool {
        match self.holders.get(&session) {
            None => true,
            Some(h) => h.closed || h.epoch != epoch || !h.queue.is_empty(),
        }
    }

    /// The number of the last change: taken before an op reads the store, handed to [`LeaseTable::grant`].
    pub fn change_seq(&self) -> u64 {
        self.change_seq
    }

    /// Whether `session` holds leases: a closed holder too, whose client may not know yet that its connection
    /// closed (a reconnect on the same session) and still trusts replies; its grants stand, and are waited for, as
    /// long as its last poll's lease.
    pub fn is_holder(&self, session: u64) -> bool {
        self.holders.contains_key(&session)
    }

    /// Records leases of `session` on `inos`, which an op read after change `seen`. Changes by other sessions
    /// since then are recalled from it at once (its reply may predate them). Returns false if `session` holds
    /// no leases after this (not a holder, or revoked for a bound).
    pub fn grant(&mut self, session: u64, inos: &[u64], seen: u64, now_ms: u64) -> bool {
        self.grant_racing(session, inos, seen, now_ms).is_some()
    }

    /// [`LeaseTable::grant`], returning what the reply must wait for: the raced recalls of attributes, so the
    /// client hears of them before the reply, which it then does not trust. (Raced recalls of names are not
    /// waited for: applying one takes the directory's lock in the client's kernel, which the request being
    /// answered may hold; such a reply's entry is cached until that recall arrives, one round trip.) `None`:
    /// `session` holds no leases after this.
    pub fn grant_racing(&mut self, session: u64, inos: &[u64], seen: u64, now_ms: u64) -> Option<Vec<Wait>> {
        if !self.is_holder(session) {
            return None;
        }
        let floor = self.changes.front().map_or(self.change_seq, |(seq, _, _)| seq - 1);
        if seen < floor {
            self.revoke(session);
            return None;
        }
        for &ino in inos {
            let h = self.holders.get_mut(&session).expect("a holder");
            if h.inos.contains(&ino) {
                continue;
            }
            if h.inos.len() >= self.limits.per_holder || self.leased >= self.limits.total {
                self.revoke(session);
                return None;
            }
            h.inos.insert(ino);
            self.by_ino.entry(ino).or_default().push(session);
            self.leased += 1;
        }
        // Only the changes after `seen`, from the newest back: a grant is on every holder's point read.
        let mut raced: Vec<Recall> = self
            .changes
            .iter()
            .rev()
            .take_while(|(seq, _, _)| *seq > seen)
            .filter(|(_, r, by)| *by != session && inos.contains(&r.ino))
            .map(|(_, r, _)| r.clone())
            .collect();
        raced.reverse();
        let mut waits = Vec::new();
        for r in raced {
            let attrs = r.name.is_none();
            let w = self.enqueue(session, r, now_ms)?;
            if attrs {
                waits.retain(|x: &Wait| x.session != session);
                waits.push(w);
            }
        }
        Some(waits)
    }

    /// A change by `session` committed, touching `recalls`: queues each for every other holder of a lease on its
    /// inode and returns what the change must wait for.
    pub fn changed(&mut self, session: u64, recalls: &[Recall], now_ms: u64) -> Vec<Wait> {
        self.sweep(now_ms);
        if self.holders.keys().all(|&s| s == session) {
            // No one else could have read what this changed: no grant can race it.
            return Vec::new();
        }
        self.change_seq += 1;
        let mut waits: Vec<Wait> = Vec::new();
        for r in recalls {
            self.changes.push_back((self.change_seq, r.clone(), session));
            if self.changes.len() > CHANGES_KEPT {
                self.changes.pop_front();
            }
            let holders: Vec<u64> = self.by_ino.get(&r.ino).into_iter().flatten().copied().collect();
            for s in holders.into_iter().filter(|&s| s != session) {
                if let Some(w) = self.enqueue(s, r.clone(), now_ms) {
                    waits.retain(|x| x.session != s);
                    waits.push(w);
                }
            }
        }
        let lease_ms = self.limits.lease_ms;
        for (&s, h) in &self.holders {
            if s != session && !h.confirmed && !waits.iter().any(|w| w.session == s) {
                waits.push(Wait { session: s, epoch: h.epoch, seq: 0, deadline_ms: h.polled_ms + lease_ms });
            }
        }
        waits
    }

    /// Queues `r` for `session`; `None` if that revoked it (queue full).
    fn enqueue(&mut self, session: u64, r: Recall, now_ms: u64) -> Option<Wait> {
        let lease_ms = self.limits.lease_ms;
        let h = self.holders.get_mut(&session)?;
        if h.queue.len() >= self.limits.queued {
            self.revoke(session);
            return None;
        }
        let seq = h.next;
        h.next += 1;
        self.recalls += 1;
        h.queue.push_back((seq, r, now_ms));
        // A closed holder's client trusts nothing past its last poll's lease.
        let deadline_ms = if h.closed { h.polled_ms + lease_ms } else { now_ms + lease_ms };
        Some(Wait { session, epoch: h.epoch, seq, deadline_ms })
    }

    /// Whether `w` no longer holds its change back: acknowledged, or the holder started a new epoch, or is gone.
    /// Past its deadline, an unacknowledged holder is revoked and `w` is done.
    pub fn settle(&mut self, w: &Wait, now_ms: u64) -> bool {
        let Some(h) = self.holders.get(&w.session) else { return true };
        if w.seq == 0 || h.epoch != w.epoch {
            // A revocation, a bound or a reconnect gave the holder a new epoch: its client dropped what it held
            // once it names the current one (confirmed), and trusts nothing past the deadline anyway.
            return h.confirmed || now_ms >= w.deadline_ms;
        }
        if h.queue.front().is_none_or(|(seq, _, _)| *seq > w.seq) {
            return true;
        }
        if now_ms >= w.deadline_ms {
            tracing::info!(
                session = format_args!("{:#x}", w.session),
                epoch = format_args!("{:#x}", w.epoch),
                "a lease holder did not acknowledge a recall in time: its leases are revoked"
            );
            self.revoke(w.session);
            return true;
        }
        false
    }

    /// `session`'s connection closed: its leases stand until its last poll's lease ran out.
    pub fn closed(&mut self, session: u64, now_ms: u64) {
        if let Some(h) = self.holders.get_mut(&session) {
            h.closed = true;
        }
        self.sweep(now_ms);
    }

    /// Drops closed holders whose last lease ran out.
    fn sweep(&mut self, now_ms: u64) {
        let lease_ms = self.limits.lease_ms;
        let gone: Vec<u64> = self
            .holders
            .iter()
            .filter(|(_, h)| h.closed && now_ms >= h.polled_ms + lease_ms)
            .map(|(s, _)| *s)
            .collect();
        for s in gone {
            self.drop_holder(s);
        }
    }

    /// Drops everything `session` holds and gives it a new epoch, unconfirmed until its client names it (a closed
    /// holder goes instead).
    pub fn revoke(&mut self, session: u64) {
        let Some(old) = self.holders.get(&session) else { return };
        let (closed, polled_ms) = (old.closed, old.polled_ms);
        self.drop_holder(session);
        self.revocations += 1;
        if closed {
            return;
        }
        let epoch = self.new_epoch();
        self.holders.insert(session, Holder::new(epoch, polled_ms, false));
    }

    fn drop_holder(&mut self, session: u64) {
        let Some(h) = self.holders.remove(&session) else { return };
        for ino in h.inos {
            if let Some(v) = self.by_ino.get_mut(&ino) {
                v.retain(|&s| s != session);
                if v.is_empty() {
                    self.by_ino.remove(&ino);
                }
            }
            self.leased -= 1;
        }
        debug_assert_eq!(self.leased, self.holders.values().map(|h| h.inos.len()).sum::<usize>());
    }

    /// Recalls queued for `session`, acknowledged or not.
    pub fn queued(&self, session: u64) -> usize {
        self.holders.get(&session).map_or(0, |h| h.queue.len())
    }

    /// Leases held in all (for metrics and tests).
    pub fn leased(&self) -> usize {
        self.leased
    }

    /// Holders revoked and recalls queued since the table was made (for metrics).
    pub fn counts(&self) -> (u64, u64) {
        (self.revocations, self.recalls)
    }

    /// Live holders (for metrics and tests).
    pub fn holders(&self) -> usize {
        self.holders.values().filter(|h| !h.closed).count()
    }

    /// Checks the table's invariants, in full (a scan of everything: for tests and the simulation, after every
    /// step): the index by inode and the holders' sets agree, the counts and bounds hold, recall numbers rise.
    pub fn check(&self) -> Result<(), String> {
        let held: usize = self.holders.values().map(|h| h.inos.len()).sum();
        let indexed: usize = self.by_ino.values().map(Vec::len).sum();
        if held != self.leased || indexed != self.leased || self.leased > self.limits.total {
            return Err(format!("leases: {held} held, {indexed} indexed, {} counted", self.leased));
        }
        for (ino, sessions) in &self.by_ino {
            if let Some(s) = sessions.iter().find(|s| !self.holders.get(s).is_some_and(|h| h.inos.contains(ino))) {
                return Err(format!("inode {ino} is indexed under session {s:#x}, which does not hold it"));
            }
        }
        for (s, h) in &self.holders {
            let rising = h.queue.iter().zip(h.queue.iter().skip(1)).all(|(a, b)| a.0 < b.0);
            let numbered = h.queue.back().is_none_or(|(seq, _, _)| *seq < h.next);
            if !rising || !numbered || h.queue.len() > self.limits.queued || h.inos.len() > self.limits.per_holder {
                return Err(format!(
                    "holder {s:#x}: queue of {} (next {}), {} inodes",
                    h.queue.len(),
                    h.next,
                    h.inos.len()
                ));
            }
            if h.epoch == 0 {
                return Err(format!("holder {s:#x} has epoch 0, which means no leases"));
            }
        }
        let ordered = self.changes.iter().zip(self.changes.iter().skip(1)).all(|(a, b)| a.0 <= b.0);
        if !ordered || self.changes.len() > CHANGES_KEPT || self.changes.back().is_some_and(|c| c.0 > self.change_seq) {
            return Err(format!(
                "changes: {} kept, up to {:?} of {}",
                self.changes.len(),
                self.changes.back().map(|c| c.0),
                self.change_seq
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(ino: u64) -> Recall {
        Recall { ino, name: None }
    }

    fn entry(ino: u64, name: &str) -> Recall {
        Recall { ino, name: Some(name.into()) }
    }

    fn table() -> LeaseTable {
        LeaseTable::new(Limits { lease_ms: 1000, per_holder: 4, total: 6, queued: 3 }, 7)
    }

    #[test]
    fn the_invariant_check_holds_through_a_walk_and_catches_a_broken_index() {
        let mut t = table();
        let step = |t: &mut LeaseTable, f: &mut dyn FnMut(&mut LeaseTable)| {
            f(t);
            t.check().unwrap();
        };
        step(&mut t, &mut |t| drop(t.poll(1, 0, 0, 0)));
        step(&mut t, &mut |t| drop(t.poll(2, 0, 0, 0)));
        step(&mut t, &mut |t| assert!(t.grant(1, &[10, 11], 0, 0)));
        step(&mut t, &mut |t| assert!(t.grant(2, &[10, 12, 13, 14], 0, 0)));
        step(&mut t, &mut |t| assert!(!t.grant(2, &[15], 0, 0), "past per_holder: revoked"));
        step(&mut t, &mut |t| drop(t.changed(1, &[attrs(10), entry(10, "x")], 5)));
        step(&mut t, &mut |t| t.closed(1, 6));
        step(&mut t, &mut |t| drop(t.changed(2, &[attrs(11)], 2000)));
        step(&mut t, &mut |t| t.revoke(2));
        let mut broken = table();
        broken.poll(1, 0, 0, 0);
        broken.grant(1, &[10], 0, 0);
        broken.by_ino.get_mut(&10).unwrap().push(9);
        assert!(broken.check().unwrap_err().contains("leases"), "an index entry no holder backs");
    }

    #[test]
    fn a_change_recalls_every_other_holder_and_waits_for_its_acknowledgement() {
        let mut t = table();
        let a = t.poll(1, 0, 0, 0);
        assert!(a.epoch != 0 && a.upto == 0 && a.recalls.is_empty(), "{a:?}");
        let b = t.poll(2, 0, 0, 0);
        assert_ne!(a.epoch, b.epoch, "epochs are unique");
        let seen = t.change_seq();
        assert!(t.grant(1, &[10, 11], seen, 0));
        assert!(t.grant(2, &[10], seen, 0));
        assert!(!t.grant(3, &[10], seen, 0), "not a holder: no lease");
        assert_eq!(t.leased(), 3);
        // Session 1 changes inode 10 and entry 10/x: session 2 is recalled, session 1 is not.
        let waits = t.changed(1, &[attrs(10), entry(10, "x")], 5);
        assert_eq!(waits, vec![Wait { session: 2, epoch: b.epoch, seq: 2, deadline_ms: 1005 }]);
        assert!(t.has_news(2, b.epoch) && !t.has_news(1, a.epoch));
        assert!(!t.settle(&waits[0], 10), "not acknowledged yet");
        let p = t.poll(2, b.epoch, 0, 10);
        assert_eq!((p.upto, p.recalls), (2, vec![attrs(10), entry(10, "x")]));
        let p = t.poll(2, b.epoch, 1, 11);
        assert_eq!(p.recalls, vec![entry(10, "x")], "only what is unacknowledged is sent again");
        assert!(!t.settle(&waits[0], 11));
        t.poll(2, b.epoch, 2, 12);
        assert!(t.settle(&waits[0], 12), "acknowledged");
        assert!(!t.has_news(2, b.epoch));
        // An acknowledgement counted in an old epoch acknowledges nothing.
        let w = t.changed(1, &[attrs(10)], 20);
        t.poll(2, b.epoch ^ 1, 99, 21);
        assert!(!t.settle(&w[0], 21));
    }

    #[test]
    fn a_holder_that_misses_its_deadline_is_revoked_and_the_change_goes_on() {
        let mut t = table();
        let b = t.poll(2, 0, 0, 0);
        t.poll(1, 0, 0, 0);
        assert!(t.grant(2, &[10, 12], t.change_seq(), 0));
        let w = t.changed(1, &[attrs(10)], 100);
        assert!(!t.settle(&w[0], 1099));
        assert!(t.settle(&w[0], 1100), "deadline: revoked");
        assert_eq!(t.leased(), 0, "a revoked holder holds nothing");
        let p = t.poll(2, b.epoch, 1, 1200);
        assert_ne!(p.epoch, b.epoch, "a new epoch tells the client to drop everything");
        assert!(p.recalls.is_empty());
        let w = t.changed(1, &[attrs(12)], 1300);
        assert_eq!(w, vec![Wait { session: 2, epoch: p.epoch, seq: 0, deadline_ms: 2200 }], "until it confirms");
        assert!(!t.settle(&w[0], 1301));
        t.poll(2, p.epoch, 0, 1400);
        assert!(t.settle(&w[0], 1401), "it named the new epoch: it dropped everything");
        assert!(t.changed(1, &[attrs(12)], 1500).is_empty(), "its leases are gone");
        // Unconfirmed and silent: its trust runs out with its last poll's lease.
        t.revoke(2);
        let w = t.changed(1, &[attrs(12)], 1600);
        assert!(!t.settle(&w[0], 2399) && t.settle(&w[0], 2400));
    }

    #[test]
    fn a_new_epoch_settles_waits_of_the_old_one() {
        let mut t = table();
        let b = t.poll(2, 0, 0, 0);
        t.poll(1, 0, 0, 0);
        t.grant(2, &[10], 0, 0);
        let w = t.changed(1, &[attrs(10)], 0);
        t.revoke(2);
        assert!(!t.settle(&w[0], 1), "its client may still trust the old epoch");
        let e = t.poll(2, b.epoch, 0, 2).epoch;
        assert_ne!(e, b.epoch);
        assert!(!t.settle(&w[0], 3), "told of the new epoch, not yet confirmed");
        t.poll(2, e, 0, 4);
        assert!(t.settle(&w[0], 5), "it named the new epoch: it dropped everything of the old");
    }

    #[test]
    fn a_grant_racing_a_change_is_recalled_at_once() {
        let mut t = table();
        t.poll(1, 0, 0, 0);
        let b = t.poll(2, 0, 0, 0);
        let seen = t.change_seq();
        // Session 1 changes inode 10 after session 2's op read it, before its grant is recorded.
        assert!(t.changed(1, &[attrs(10), entry(10, "n")], 1).is_empty(), "no lease on 10 yet");
        assert!(t.grant(2, &[10], seen, 2));
        let p = t.poll(2, b.epoch, 0, 3);
        assert_eq!(p.recalls, vec![attrs(10), entry(10, "n")]);
        // A raced recall of attributes holds the reply back until acknowledged; one of a name does not.
        t.poll(2, b.epoch, p.upto, 3);
        let seen = t.change_seq();
        t.changed(1, &[attrs(12), entry(13, "m")], 4);
        let w = t.grant_racing(2, &[12, 13], seen, 4).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(!t.settle(&w[0], 4));
        let p = t.poll(2, b.epoch, 0, 5);
        assert_eq!(p.recalls, [attrs(12), entry(13, "m")]);
        t.poll(2, b.epoch, p.upto, 6);
        assert!(t.settle(&w[0], 6));
        // Its own changes are not recalled from it.
        let seen = t.change_seq();
        t.changed(2, &[attrs(11)], 4);
        assert!(t.grant(2, &[11], seen, 5));
        assert_eq!(t.poll(2, b.epoch, p.upto, 7).recalls, vec![]);
    }

    #[test]
    fn with_no_other_holder_a_change_costs_nothing() {
        let mut t = table();
        assert!(t.changed(1, &[attrs(10)], 0).is_empty());
        t.poll(1, 0, 0, 0);
        assert!(t.changed(1, &[attrs(10)], 0).is_empty());
        assert_eq!(t.change_seq(), 0, "nothing remembered");
    }

    #[test]
    fn bounds_revoke_the_holder_that_outgrows_them() {
        let mut t = table();
        let a = t.poll(1, 0, 0, 0);
        assert!(t.grant(1, &[1, 2, 3, 4], 0, 0));
        assert!(t.grant(1, &[4], 0, 0), "a lease held again costs nothing");
        assert!(!t.grant(1, &[5], 0, 0), "one past the holder's bound");
        assert_eq!(t.leased(), 0);
        let a = t.poll(1, a.epoch, 0, 1);
        t.poll(1, a.epoch, 0, 1);
        // The total bound.
        let b = t.poll(2, 0, 0, 0);
        assert!(t.grant(1, &[1, 2, 3], 0, 1) && t.grant(2, &[1, 2, 3], 0, 1));
        assert!(!t.grant(2, &[9], 0, 1), "past the total");
        assert_eq!(t.leased(), 3);
        let b = t.poll(2, b.epoch, 0, 1);
        t.poll(2, b.epoch, 0, 1);
        t.revoke(1);
        let a = t.poll(1, a.epoch, 0, 1);
        t.poll(1, a.epoch, 0, 1);
        // The queue bound: the fourth recall revokes.
        let b = t.poll(3, 0, 0, 0);
        assert!(t.grant(3, &[20], 0, 2));
        for i in 0..3 {
            assert_eq!(t.changed(9, &[entry(20, &i.to_string())], 3).len(), 1);
        }
        let w = t.changed(9, &[attrs(20)], 3);
        assert_eq!(w.iter().map(|w| (w.session, w.seq)).collect::<Vec<_>>(), vec![(3, 0)], "revoked: unconfirmed");
        assert_ne!(t.poll(3, b.epoch, 0, 4).epoch, b.epoch);
    }

    #[test]
    fn a_grant_older_than_every_remembered_change_revokes() {
        let mut t = table();
        t.poll(1, 0, 0, 0);
        t.poll(2, 0, 0, 0);
        let seen = t.change_seq();
        for i in 0..=CHANGES_KEPT as u64 {
            t.changed(1, &[attrs(1000 + i)], 0);
        }
        assert!(!t.grant(2, &[5], seen, 0), "its read may have missed a forgotten change");
        assert!(t.grant(2, &[5], t.change_seq(), 0));
    }

    #[test]
    fn a_closed_holder_is_waited_for_until_its_last_lease_ran_out_then_goes() {
        let mut t = table();
        t.poll(1, 0, 0, 0);
        t.poll(2, 0, 0, 100);
        t.grant(2, &[10], 0, 100);
        t.closed(2, 200);
        assert!(t.is_holder(2) && t.grant(2, &[11], 0, 200), "its client may still trust replies: still granted");
        let w = t.changed(1, &[attrs(10)], 300);
        assert_eq!(w[0].deadline_ms, 1100, "its client trusts nothing past 100 + the lease");
        assert!(!t.settle(&w[0], 1099) && t.settle(&w[0], 1100));
        assert!(t.changed(1, &[attrs(10)], 1200).is_empty(), "gone");
        assert_eq!(t.holders(), 1);
        assert!(!t.is_holder(2));
        // A closed session that polls again (a reconnect) starts a new epoch.
        t.poll(3, 0, 0, 0);
        t.closed(3, 1);
        let e = t.poll(3, 0, 0, 2).epoch;
        assert!(t.is_holder(3) && e != 0);
    }
}
