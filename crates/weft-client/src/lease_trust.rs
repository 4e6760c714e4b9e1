//! What a holder of metadata leases (docs/format.md §31) may trust, as a pure state machine shared by the FUSE
//! mount (which caches in the kernel) and this client's own cache (`meta_cache.rs`).
//!
//! A reply is trusted only if it was asked for under the current epoch, on the MDS session that granted it,
//! within the trust horizon, and no recall of an inode it names was heard since it was asked ([`Ticket`]): the MDS
//! records a grant after the op read the store, so a recall can overtake the reply it belongs to. A holder's own
//! changes are heard here the same way ([`LeaseTrust::heard_own`]), since the MDS recalls nothing from the session
//! that made the change.

use std::collections::VecDeque;
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use weft_proto::msg::LeaseWaitResp;

/// Recalls remembered for replies in flight; a reply asked for before the oldest is not trusted.
pub const RECENT_MAX: usize = 4_096;

/// The numbers of no hearings (an empty range).
pub fn no_hearings() -> RangeInclusive<u64> {
    RangeInclusive::new(1, 0)
}

/// What a request was asked under: trusted at reply time only if nothing since voids it.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    epoch: u64,
    heard: u64,
}

/// The epoch, the trust horizon and the recalls heard lately.
#[derive(Debug, Default)]
pub struct LeaseTrust {
    /// 0: no leases (none granted yet, or lost).
    epoch: u64,
    /// The MDS session the epoch was granted on: a reply that arrives on another one (the service restarted or
    /// failed over, and knows nothing of these leases) is not trusted.
    session: u64,
    trust_until: Option<Instant>,
    /// Recalls heard, counted (an own change of everything counts one).
    heard: u64,
    /// The last [`RECENT_MAX`] recalls' inodes, with their count.
    recent: VecDeque<(u64, u64)>,
    /// The count of the last own change whose inodes were not all known: no reply asked before it is trusted.
    cleared: u64,
}

impl LeaseTrust {
    pub fn ticket(&self) -> Ticket {
        Ticket { epoch: self.epoch, heard: self.heard }
    }

    /// Whether leases hold now on MDS session `session`.
    pub fn live(&self, (now, session): (Instant, u64)) -> bool {
        self.epoch != 0 && session == self.session && self.trust_until.is_some_and(|u| now < u)
    }

    /// Whether a reply asked for under `t` about `inos`, arriving now on MDS session `session`, may be cached
    /// under a lease.
    pub fn trusted(&self, t: &Ticket, inos: &[u64], now: (Instant, u64)) -> bool {
        self.trusted_except(t, inos, now, no_hearings())
    }

    /// [`LeaseTrust::trusted`] for the reply of this holder's own change, which heard `own` ([`heard_own`]'s
    /// numbers): the change's own hearings do not void its reply, every other one since `t` does (a concurrent
    /// change of this holder's, a recall).
    ///
    /// [`heard_own`]: LeaseTrust::heard_own
    pub fn trusted_except(&self, t: &Ticket, inos: &[u64], now: (Instant, u64), own: RangeInclusive<u64>) -> bool {
        let floor = self.recent.front().map_or(self.heard, |(n, _)| n - 1);
        self.live(now)
            && t.epoch == self.epoch
            && t.heard >= floor
            && t.heard >= self.cleared
            // Newest first, and only those heard since `t` (numbers rise along the queue).
            && !self.recent.iter().rev().take_while(|(n, _)| *n > t.heard).any(|(n, ino)| !own.contains(n) && inos.contains(ino))
    }

    /// Whether a `LeaseWait` reply arriving on `session` ends every lease held (a new epoch, or another session).
    pub fn loses_all(&self, resp: &LeaseWaitResp, session: u64) -> bool {
        resp.epoch != self.epoch || session != self.session
    }

    /// A `LeaseWait` reply to a call sent at `sent`, arrived on MDS session `session`: its epoch, horizon and
    /// recalls. (The caller drops what [`LeaseTrust::loses_all`] and the recalls void.)
    pub fn received(&mut self, resp: &LeaseWaitResp, sent: Instant, session: u64) {
        self.epoch = resp.epoch;
        self.session = session;
        for r in &resp.recalls {
            self.hear(r.ino);
        }
        self.trust_until = (resp.epoch != 0).then(|| sent + Duration::from_millis(u64::from(resp.lease_ms)));
    }

    /// This holder changed `inos` itself (the MDS recalls nothing from the changer): a reply about one of them
    /// asked before now is not trusted. `None`: the change's inodes are not all known, so no reply asked before
    /// now is.
    /// Returns the numbers these hearings got.
    pub fn heard_own(&mut self, inos: Option<&[u64]>) -> RangeInclusive<u64> {
        let first = self.heard + 1;
        match inos {
            Some(inos) => inos.iter().for_each(|&ino| self.hear(ino)),
            None => {
                self.heard += 1;
                self.cleared = self.heard;
            }
        }
        first..=self.heard
    }

    fn hear(&mut self, ino: u64) {
        self.heard += 1;
        self.recent.push_back((self.heard, ino));
        if self.recent.len() > RECENT_MAX {
            self.recent.pop_front();
        }
    }

    /// Every lease is gone (the channel failed, or the trust ran out).
    pub fn lose(&mut self) {
        self.epoch = 0;
        self.trust_until = None;
    }

    pub fn trust_until(&self) -> Option<Instant> {
        self.trust_until
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Recalls heard in all (own changes included).
    pub fn heard(&self) -> u64 {
        self.heard
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::msg::Recall;

    fn resp(epoch: u64, recalls: Vec<Recall>) -> LeaseWaitResp {
        LeaseWaitResp { epoch, lease_ms: 1000, upto: 0, recalls }
    }

    #[test]
    fn own_changes_void_replies_asked_before_them() {
        let t0 = Instant::now();
        let mut v = LeaseTrust::default();
        v.received(&resp(3, vec![]), t0, 1);
        let t = v.ticket();
        v.heard_own(Some(&[5]));
        assert!(!v.trusted(&t, &[5], (t0, 1)), "asked before this holder changed 5");
        assert!(v.trusted(&t, &[6], (t0, 1)), "another inode");
        assert!(v.trusted(&v.ticket(), &[5], (t0, 1)), "asked after");
        let t = v.ticket();
        v.heard_own(None);
        assert!(!v.trusted(&t, &[6], (t0, 1)), "a change of inodes not all known voids every earlier reply");
        assert!(v.trusted(&v.ticket(), &[6], (t0, 1)));
        // The reply of an own change is not voided by that change's hearings, only by others since it was asked.
        let t = v.ticket();
        let own = v.heard_own(Some(&[7, 8]));
        assert!(!v.trusted(&t, &[7], (t0, 1)) && v.trusted_except(&t, &[7, 8], (t0, 1), own.clone()));
        v.heard_own(Some(&[8]));
        assert!(!v.trusted_except(&t, &[7, 8], (t0, 1), own), "another own change of 8 since");
        assert!(
            !v.loses_all(&resp(3, vec![]), 1) && v.loses_all(&resp(4, vec![]), 1) && v.loses_all(&resp(3, vec![]), 2)
        );
    }
}
