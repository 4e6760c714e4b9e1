//! Lost unsynced writes (docs/format.md §33): what a client knows of each data server's write verifier, what a
//! handle keeps of it before its writes, and the sync's decision of which servers may have lost them.
//!
//! The decision is a pure function ([`lost`]) so its every case is tested without a cluster; the I/O around it (the
//! `WriteVerifier` at connect, `FsyncVerified` at sync) stays in `lib.rs` and `file.rs`.
//!
//! Two witnesses, the session first: a sync answered on the session the client held before the writes ran on the
//! same server process as they did (a process's sessions die with it, their ids random), so nothing was lost even
//! if the client learned a reboot's verifier only meanwhile; otherwise the verifiers decide.

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

/// What a handle kept of one data server before the first of its writes there since its last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Before {
    /// The verifier its client knew (`None`: no connection yet, so the one its connect will learn).
    pub(crate) verifier: Option<u64>,
    /// The session its client held with that server (`None`: no connection yet). Sessions die with the server's
    /// process, and their ids are random: a sync answered on this same session ran on the process every one of
    /// those writes ran on, so nothing of them can have been lost, whatever the verifiers say.
    pub(crate) session: Option<u64>,
}

/// What a handle kept, per data server it wrote since its last sync ([`Before`]).
#[derive(Debug, Default)]
pub(crate) struct Kept(Mutex<HashMap<u32, Before>>);

impl Kept {
    /// Before a write to `server` is sent: keeps what `verifiers` knows now and the session held now (`session`,
    /// asked only then), unless something older is kept.
    pub(crate) fn before_write(&self, server: u32, verifiers: &Verifiers, session: impl FnOnce() -> Option<u64>) {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.entry(server)
            .or_insert_with(|| Before { verifier: verifiers.get(server).map(|l| l.latest), session: session() });
    }

    /// Empties the record (a sync starts); returns it.
    pub(crate) fn take(&self) -> HashMap<u32, Before> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Puts back what a failed sync took, keeping the older of two records of one server.
    pub(crate) fn restore(&self, taken: HashMap<u32, Before>) {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for (server, v) in taken {
            kept.insert(server, v);
        }
    }

    /// After a loss was reported: the handle's writes to `server` from now on are judged against `v`.
    pub(crate) fn reported(&self, server: u32, v: u64) {
        let before = Before { verifier: Some(v), session: None };
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(server, before);
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

/// One server's answer to a sync: its position, id, write verifier, and the session the answer came on (`None`:
/// the session changed while the call ran).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) slot: usize,
    pub(crate) server: u32,
    pub(crate) verifier: u64,
    pub(crate) session: Option<u64>,
}

/// Of the servers that answered a sync, those that may have lost what the handle wrote there since its last sync:
/// answered on another session than the one held before those writes, with another verifier than the one known
/// then. A server the handle kept nothing for (its writes went to another server of that slot, before a layout
/// change) is not judged; a server kept as "not connected yet" is judged against the verifier its connect learned;
/// an old server that answers 0 (no verifiers) is not judged.
pub(crate) fn lost(
    kept: &HashMap<u32, Before>,
    learned: impl Fn(u32) -> Option<Learned>,
    answers: &[Answer],
) -> Vec<Moved> {
    let mut out = Vec::new();
    for a in answers {
        let Some(before) = kept.get(&a.server) else { continue };
        if before.session.is_some() && before.session == a.session {
            continue;
        }
        let (slot, server, now) = (a.slot, a.server, a.verifier);
        let Some(kept) = before.verifier.or_else(|| learned(server).map(|l| l.at_connect)) else {
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

    fn kept(verifier: Option<u64>, session: Option<u64>) -> HashMap<u32, Before> {
        HashMap::from([(9, Before { verifier, session })])
    }

    fn answer(slot: usize, server: u32, verifier: u64, session: Option<u64>) -> Answer {
        Answer { slot, server, verifier, session }
    }

    #[test]
    fn a_server_that_answers_what_was_kept_lost_nothing() {
        assert!(lost(&kept(Some(5), Some(1)), learned(5, 5), &[answer(0, 9, 5, Some(2))]).is_empty());
    }

    #[test]
    fn a_server_that_rebooted_after_the_write_may_have_lost_it() {
        let k = kept(Some(5), Some(1));
        let moved = vec![Moved { slot: 2, server: 9, kept: 5, now: 6 }];
        assert_eq!(lost(&k, learned(5, 5), &[answer(2, 9, 6, Some(2))]), moved);
        // The session changed while the sync ran: judged by the verifiers.
        assert_eq!(lost(&k, learned(5, 5), &[answer(2, 9, 6, None)]), moved);
    }

    #[test]
    fn the_same_session_proves_the_same_process_whatever_the_verifiers() {
        // The client learned the reboot's verifier only after the writes (a false alarm without the session).
        assert!(lost(&kept(Some(5), Some(7)), learned(5, 5), &[answer(0, 9, 6, Some(7))]).is_empty());
        // No session kept (no connection then): the verifiers decide.
        assert_eq!(lost(&kept(Some(5), None), learned(5, 5), &[answer(0, 9, 6, None)]).len(), 1);
    }

    #[test]
    fn a_write_before_the_connection_is_judged_by_the_connects_answer() {
        let k = kept(None, None);
        assert!(lost(&k, learned(5, 6), &[answer(0, 9, 5, Some(3))]).is_empty());
        assert_eq!(lost(&k, learned(5, 5), &[answer(0, 9, 6, Some(3))]).len(), 1);
        // The connection is gone and its answer with it: judged lost rather than guessed.
        let moved = vec![Moved { slot: 0, server: 9, kept: 0, now: 6 }];
        assert_eq!(lost(&k, |_| None, &[answer(0, 9, 6, Some(3))]), moved);
    }

    #[test]
    fn servers_not_written_and_servers_without_verifiers_are_not_judged() {
        let k = kept(Some(5), Some(1));
        assert!(lost(&k, learned(5, 5), &[answer(0, 8, 6, Some(2))]).is_empty());
        assert!(lost(&k, learned(5, 5), &[answer(0, 9, 0, Some(2))]).is_empty());
    }

    #[test]
    fn the_oldest_record_is_kept_until_a_sync_takes_it() {
        let v = Verifiers::default();
        v.connected(9, 5);
        let k = Kept::default();
        let at = |verifier, session| Before { verifier: Some(verifier), session: Some(session) };
        k.before_write(9, &v, || Some(1));
        v.answered(9, 6);
        k.before_write(9, &v, || Some(2));
        let taken = k.take();
        assert_eq!(taken, HashMap::from([(9, at(5, 1))]));
        k.before_write(9, &v, || Some(2));
        k.restore(taken);
        assert_eq!(k.take(), HashMap::from([(9, at(5, 1))]));
        k.reported(9, 6);
        assert_eq!(k.take(), HashMap::from([(9, Before { verifier: Some(6), session: None })]));
        k.before_write(3, &v, || None);
        assert_eq!(k.take(), HashMap::from([(3, Before { verifier: None, session: None })]));
    }
}
