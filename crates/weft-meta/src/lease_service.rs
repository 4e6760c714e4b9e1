//! The metadata service's side of leases (docs/format.md §31): the [`LeaseTable`] behind a mutex, held polls woken
//! when their holder has news, and changes that wait for their recalls' acknowledgements (or deadlines).
//!
//! Why one `Notify` for all pollers and one for all waiting changes: wakes are rare (a recall, an
//! acknowledgement) and each woken task re-checks the table, so a missed target costs a check, never a wrong
//! answer; per-session wakers would be a second table to keep bounded.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use weft_proto::msg::{LeaseWaitReq, LeaseWaitResp, Recall};

use crate::leases::{LeaseTable, Limits, Wait};

pub(crate) struct Leases {
    /// `None`: this service grants no leases (a shared store), and every poll says so.
    table: Option<Mutex<LeaseTable>>,
    start: Instant,
    /// Held polls wait on this; woken when any holder gets news.
    news: Notify,
    /// Changes waiting for acknowledgements wait on this; woken at every acknowledgement.
    acks: Notify,
}

impl Leases {
    pub fn new(limits: Option<Limits>) -> Leases {
        let salt = u64::from(std::process::id())
            ^ (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
                & 0xffff_ffff);
        Leases {
            table: limits.map(|l| Mutex::new(LeaseTable::new(l, salt & 0x7fff_ffff | 1))),
            start: Instant::now(),
            news: Notify::new(),
            acks: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    fn lock(&self) -> Option<std::sync::MutexGuard<'_, LeaseTable>> {
        self.table.as_ref().map(|t| t.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Op 146: applies the acknowledgement, then answers at once if there is news, else after the hold.
    pub async fn wait(&self, session: u64, r: LeaseWaitReq) -> LeaseWaitResp {
        let Some(lease_ms) = self.lock().map(|t| t.limits().lease_ms) else {
            return LeaseWaitResp { epoch: 0, lease_ms: 0, upto: 0, recalls: Vec::new() };
        };
        let hold_ms = u64::from(r.hold_ms).min(lease_ms / 3);
        let deadline = self.at(self.now_ms() + hold_ms);
        let mut polled = self.lock().expect("granting").poll(session, r.epoch, r.acked, self.now_ms());
        self.acks.notify_waiters();
        while polled.recalls.is_empty() && polled.epoch == r.epoch {
            let woken = self.news.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if !self.lock().expect("granting").has_news(session, r.epoch)
                && tokio::time::timeout_at(deadline.into(), woken).await.is_err()
            {
                break;
            }
            let mut t = self.lock().expect("granting");
            if t.is_closed(session) {
                break;
            }
            polled = t.poll(session, r.epoch, r.acked, self.now_ms());
        }
        LeaseWaitResp { epoch: polled.epoch, lease_ms: lease_ms as u32, upto: polled.upto, recalls: polled.recalls }
    }

    /// The last change number, if `session` holds leases (taken before the op reads the store).
    pub fn seen(&self, session: u64) -> Option<u64> {
        let t = self.lock()?;
        t.is_holder(session).then(|| t.change_seq())
    }

    /// Records `session`'s leases on `inos`, read after change `seen`; returns once the client acknowledged the
    /// recalls of attributes changed since (so it does not trust the reply this precedes).
    pub async fn grant(&self, session: u64, inos: &[u64], seen: u64) {
        let waits = {
            let Some(mut t) = self.lock() else { return };
            let (before, now_ms) = (t.queued(session), self.now_ms());
            let waits = t.grant_racing(session, inos, seen, now_ms);
            if t.queued(session) > before || waits.is_none() {
                self.news.notify_waiters();
            }
            waits.unwrap_or_default()
        };
        self.wait_all(waits).await;
    }

    /// Whether this service grants leases (so changes must say what they touched).
    pub fn granting(&self) -> bool {
        self.table.is_some()
    }

    /// A change by `session` committed: recalls what it touched from every other holder and returns once each
    /// acknowledged or was revoked at its deadline.
    pub async fn changed(&self, session: u64, recalls: &[Recall]) {
        let waits: Vec<Wait> = match self.lock() {
            Some(mut t) => t.changed(session, recalls, self.now_ms()),
            None => return,
        };
        if waits.is_empty() {
            return;
        }
        self.news.notify_waiters();
        self.wait_all(waits).await;
    }

    /// Returns once every wait settled (acknowledged, or revoked at its deadline).
    async fn wait_all(&self, mut waits: Vec<Wait>) {
        while !waits.is_empty() {
            let woken = self.acks.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            {
                let mut t = self.lock().expect("granting");
                let now_ms = self.now_ms();
                waits.retain(|w| !t.settle(w, now_ms));
            }
            let Some(next) = waits.iter().map(|w| w.deadline_ms).min() else { return };
            let _ = tokio::time::timeout_at(self.at(next).into(), woken).await;
        }
    }

    /// Serves the table's state: `weft_mds_lease_holders`, `weft_mds_leased_inodes`, and since start
    /// `weft_mds_lease_recalls` and `weft_mds_lease_revocations` (holders that missed a recall's deadline or a bound).
    pub fn register_metrics(self: &std::sync::Arc<Self>, m: &weft_rpc::Metrics) {
        let holders = m.gauge("weft_mds_lease_holders", "Sessions holding metadata leases");
        let leased = m.gauge("weft_mds_leased_inodes", "Metadata leases held, over all holders");
        let recalls = m.gauge("weft_mds_lease_recalls", "Lease recalls queued since the service started");
        let revoked = m.gauge("weft_mds_lease_revocations", "Lease holders revoked since the service started");
        let me = self.clone();
        m.on_scrape(move || {
            let Some(t) = me.lock() else { return };
            let (revocations, queued) = t.counts();
            holders.set(t.holders() as i64);
            leased.set(t.leased() as i64);
            recalls.set(queued as i64);
            revoked.set(revocations as i64);
        });
    }

    /// The connections of `sessions` closed.
    pub fn closed(&self, sessions: &[u64]) {
        let Some(mut t) = self.lock() else { return };
        let now_ms = self.now_ms();
        for &s in sessions {
            t.closed(s, now_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by tests/leases.rs: a poll held when its mount was killed, woken by news for another holder, polled
    /// again and made the dead session a live holder (a reconnect, to the table), kept for good.
    #[tokio::test]
    async fn a_poll_held_past_its_connections_close_leaves_no_live_holder() {
        let leases = std::sync::Arc::new(Leases::new(Some(Limits { lease_ms: 300, ..Limits::default() })));
        let first = leases.wait(7, LeaseWaitReq { epoch: 0, acked: 0, hold_ms: 100 }).await;
        assert_eq!(leases.lock().unwrap().holders(), 1);
        let req = LeaseWaitReq { epoch: first.epoch, acked: first.upto, hold_ms: 100 };
        let held = tokio::spawn({
            let leases = leases.clone();
            async move { leases.wait(7, req).await }
        });
        tokio::task::yield_now().await;
        leases.closed(&[7]);
        // Another holder's news wakes every held poll (a change elsewhere): this one must not poll again.
        leases.news.notify_waiters();
        held.await.unwrap();
        assert_eq!(leases.lock().unwrap().holders(), 0, "the closed holder stays closed");
        assert!(leases.lock().unwrap().is_closed(7));
    }
}
