//! Lost unsynced writes (docs/format.md §33): what a client knows of each data server's write verifier, what a
//! handle keeps of it before its writes, and the sync's decision of which servers may have lost them.
//!
//! The decision is a pure function ([`lost`]) so its every case is tested without a cluster; the I/O around it (the
//! `WriteVerifier` at connect, `FsyncVerified` at sync) stays in `lib.rs` and `file.rs`.

use std::collections::HashMap;
use std::sync::Mutex;

/// What this client learned of one data server's verifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Learned {
    /// Asked when the connection was opened, before any write went on it.
    pub(crate) at_connect: u64,
    /// The last answer (connect, or a later `FsyncVerified`).
    pub(crate) latest: u64,
}

/// The client's verifiers, by data-server id. One entry per server of the cluster at most.
#[derive(Debug, Default)]
pub(crate) struct Verifiers(Mutex<HashMap<u32, Learned>>);

impl Verifiers {
    /// A connection to `server` opened and told `v`.
    pub(crate) fn connected(&self, server: u32, v: u64) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(server, Learned { at_connect: v, latest: v });
    }

    /// `server`'s `FsyncVerified` answered `v`.
    pub(crate) fn answered(&self, server: u32, v: u64) {
        if let Some(l) = self.0.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&server) {
            l.latest = v;
        }
    }

    pub(crate) fn get(&self, server: u32) -> Option<Learned> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(&server).copied()
    }
}

/// What a handle kept, per data server it wrote since its last sync: the verifier its client knew before the
/// first of those writes went out (`None`: no connection yet, so the one its connect will learn).
#[derive(Debug, Default)]
pub(crate) struct Kept(Mutex<HashMap<u32, Option<u64>>>);

impl Kept {
    /// Before a write to `server` is sent: keeps what `verifiers` knows now, unless something older is kept.
    pub(crate) fn before_write(&self, server: u32, verifiers: &Verifiers) {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.entry(server).or_insert_with(|| verifiers.get(server).map(|l| l.latest));
    }

    /// Empties the record (a sync starts); returns it.
    pub(crate) fn take(&self) -> HashMap<u32, Option<u64>> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Puts back what a failed sync took, keeping the older of two records of one server.
    pub(crate) fn restore(&self, taken: HashMap<u32, Option<u64>>) {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for (server, v) in taken {
            kept.insert(server, v);
        }
    }

    /// After a loss was reported: the handle's writes to `server` from now on are judged against `v`.
    pub(crate) fn reported(&self, server: u32, v: u64) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(server, Some(v));
    }
}

/// A server whose verifier moved under a handle's unsynced writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moved {
    pub(crate) slot: usize,
    pub(crate) server: u32,
    pub(crate) kept: u64,
    pub(crate) now: u64,
}

/// Of the servers that answered a sync (`(slot, server, verifier)`), those whose verifier differs from what the
/// handle kept before writing to them. A server the handle kept nothing for (its writes went to another server
/// of that slot, before a layout change) is not judged; a server kept as "not connected yet" is judged against
/// the verifier its connect learned; an old server that answers 0 (no verifiers) is not judged.
pub(crate) fn lost(
    kept: &HashMap<u32, Option<u64>>,
    learned: impl Fn(u32) -> Option<Learned>,
    answers: &[(usize, u32, u64)],
) -> Vec<Moved> {
    let mut out = Vec::new();
    for &(slot, server, now) in answers {
        let Some(&k) = kept.get(&server) else { continue };
        let Some(kept) = k.or_else(|| learned(server).map(|l| l.at_connect)) else {
            // Kept before the connection, and the connection forgot since: nothing to judge by, so assume lost.
            out.push(Moved { slot, server, kept: 0, now });
            continue;
        };
        if now != 0 && kept != now {
            out.push(Moved { slot, server, kept, now });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learned(at_connect: u64, latest: u64) -> impl Fn(u32) -> Option<Learned> {
        move |s| (s == 9).then_some(Learned { at_connect, latest })
    }

    #[test]
    fn a_server_that_answers_what_was_kept_lost_nothing() {
        let kept = HashMap::from([(9, Some(5))]);
        assert!(lost(&kept, learned(5, 5), &[(0, 9, 5)]).is_empty());
    }

    #[test]
    fn a_server_that_rebooted_after_the_write_may_have_lost_it() {
        let kept = HashMap::from([(9, Some(5))]);
        assert_eq!(lost(&kept, learned(5, 5), &[(2, 9, 6)]), vec![Moved { slot: 2, server: 9, kept: 5, now: 6 }]);
    }

    #[test]
    fn a_write_before_the_connection_is_judged_by_the_connects_answer() {
        let kept = HashMap::from([(9, None)]);
        assert!(lost(&kept, learned(5, 6), &[(0, 9, 5)]).is_empty());
        assert_eq!(lost(&kept, learned(5, 5), &[(0, 9, 6)]).len(), 1);
        // The connection is gone and its answer with it: judged lost rather than guessed.
        assert_eq!(lost(&kept, |_| None, &[(0, 9, 6)]), vec![Moved { slot: 0, server: 9, kept: 0, now: 6 }]);
    }

    #[test]
    fn servers_not_written_and_servers_without_verifiers_are_not_judged() {
        let kept = HashMap::from([(9, Some(5))]);
        assert!(lost(&kept, learned(5, 5), &[(0, 8, 6)]).is_empty());
        assert!(lost(&kept, learned(5, 5), &[(0, 9, 0)]).is_empty());
    }

    #[test]
    fn the_oldest_record_is_kept_until_a_sync_takes_it() {
        let v = Verifiers::default();
        v.connected(9, 5);
        let k = Kept::default();
        k.before_write(9, &v);
        v.answered(9, 6);
        k.before_write(9, &v);
        let taken = k.take();
        assert_eq!(taken, HashMap::from([(9, Some(5))]));
        k.before_write(9, &v);
        k.restore(taken);
        assert_eq!(k.take(), HashMap::from([(9, Some(5))]));
        k.reported(9, 6);
        assert_eq!(k.take(), HashMap::from([(9, Some(6))]));
        k.before_write(3, &v);
        assert_eq!(k.take(), HashMap::from([(3, None)]));
    }
}
