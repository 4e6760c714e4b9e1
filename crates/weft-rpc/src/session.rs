//! The server's session table: slots, sequence checks and the reply cache (exactly-once for non-idempotent ops).
//!
//! Invariant: for each slot, a request with sequence `last + 1` is executed at most once; a request with sequence
//! `last` is a retransmission and is answered from the cache (or, for an idempotent op, executed again); any other
//! sequence is refused with `SeqMisordered`.
//!
//! Session ids are random 64-bit numbers (never 0), so they cannot be guessed and a restarted server never meets
//! an id from its previous life. With authentication on, a session is bound to one connection ([`Binding`]):
//! requests naming it on any other connection are refused with `StaleSession` until that connection re-binds it
//! with a proof from the session secret ([`SessionTable::bind`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::watch;
use weft_proto::{ErrorCode, WireError};

/// A reply kept for retransmissions: flags and encoded body (a response or a wire error). Never payload data:
/// reads are idempotent and are executed again instead.
#[derive(Clone, Debug)]
pub struct CachedReply {
    pub flags: u8,
    pub body: Bytes,
}

enum SlotState {
    Fresh,
    Running(watch::Sender<bool>),
    Done(Option<CachedReply>),
}

struct Slot {
    seq: u32,
    state: SlotState,
}

/// Who owns a session, with authentication on: the connection it is bound to, the principal that created it,
/// and the session secret that proves ownership when a new connection re-binds it.
pub struct Binding {
    pub conn: u64,
    pub key_id: std::sync::Arc<str>,
    pub secret: crate::auth::Secret,
}

struct Session {
    /// For logs of evictions.
    client_name: String,
    /// `None` with authentication off: any connection may use the session.
    owner: Option<Binding>,
    slots: Vec<Slot>,
    last_used: Instant,
}

pub enum Admit {
    Execute,
    Replay(CachedReply),
    /// The original is still running: wait for the signal, then admit again.
    Wait(watch::Receiver<bool>),
    /// A retransmitted idempotent op: run it again, without touching the slot.
    Reexecute,
    Reject(WireError),
}

pub struct SessionTable {
    inner: Mutex<Tables>,
    slots_max: u32,
    sessions_max: u32,
    /// Sessions one per-client key may hold (the cluster key is not counted).
    per_key_max: u32,
    idle_ms: u64,
}

struct Tables {
    sessions: HashMap<u64, Session>,
}

fn not_bound(id: u64) -> WireError {
    WireError::new(ErrorCode::StaleSession, format!("session {id:#x} is not bound to this connection"))
}

impl SessionTable {
    pub fn new(slots_max: u32, sessions_max: u32, idle_ms: u64) -> SessionTable {
        let per_key_max = sessions_max;
        SessionTable {
            inner: Mutex::new(Tables { sessions: HashMap::new() }),
            slots_max,
            sessions_max,
            per_key_max,
            idle_ms,
        }
    }

    /// At most `n` sessions per per-client key (default: the whole table).
    pub fn with_per_key_max(mut self, n: u32) -> SessionTable {
        self.per_key_max = n.max(1);
        self
    }

    /// Refuses a session of `owner`'s key when that key already holds its quota (the cluster key has none).
    fn check_key_quota(&self, t: &Tables, owner: &Option<Binding>) -> Result<(), WireError> {
        let Some(key) = owner.as_ref().map(|o| &o.key_id).filter(|k| &***k != crate::auth::CLUSTER_KEY_ID) else {
            return Ok(());
        };
        let held = t.sessions.values().filter(|s| s.owner.as_ref().is_some_and(|o| o.key_id == *key)).count();
        if held >= self.per_key_max as usize {
            tracing::warn!(key = %key, held, "session refused: the key holds its quota (sessions_per_key_max)");
            return Err(WireError::new(
                ErrorCode::Busy,
                format!("key {key:?} holds {held} sessions, its quota (sessions_per_key_max): end some first"),
            ));
        }
        Ok(())
    }

    /// Creates a session; returns its id and the slots granted. `owner` makes the binding from the new id (`None`:
    /// authentication is off; an error refuses the session).
    pub fn create(
        &self,
        client_name: &str,
        slots: u32,
        owner: impl FnOnce(u64) -> Result<Option<Binding>, WireError>,
    ) -> Result<(u64, u32), WireError> {
        let slots = slots.clamp(1, self.slots_max);
        let mut t = self.inner.lock().expect("session table");
        let mut id = crate::auth::random_id();
        while t.sessions.contains_key(&id) {
            id = crate::auth::random_id();
        }
        let owner = owner(id)?;
        // Before any eviction: a key over its quota must not push others' idle sessions out.
        self.check_key_quota(&t, &owner)?;
        if t.sessions.len() >= self.sessions_max as usize {
            let now = Instant::now();
            let idle_ms = self.idle_ms;
            t.sessions.retain(|id, s| {
                let idle = now.duration_since(s.last_used).as_millis() as u64 >= idle_ms;
                let busy = s.slots.iter().any(|sl| matches!(sl.state, SlotState::Running(_)));
                if idle && !busy {
                    let key = s.owner.as_ref().map_or("-", |o| &*o.key_id);
                    tracing::info!(session = format_args!("{id:#x}"), client = %s.client_name, key, idle_ms, "session expired: evicting an idle session to make room");
                }
                !idle || busy
            });
            if t.sessions.len() >= self.sessions_max as usize {
                return Err(WireError::new(
                    ErrorCode::Busy,
                    format!("session table full ({} sessions, none idle)", self.sessions_max),
                ));
            }
        }
        let slots_v = (0..slots).map(|_| Slot { seq: 0, state: SlotState::Fresh }).collect();
        let session =
            Session { client_name: client_name.to_string(), owner, slots: slots_v, last_used: Instant::now() };
        t.sessions.insert(id, session);
        Ok((id, slots))
    }

    /// Ends session `id`, if connection `conn` may (it is bound there, or authentication is off).
    pub fn destroy(&self, id: u64, conn: u64) -> Result<(), WireError> {
        let mut t = self.inner.lock().expect("session table");
        match t.sessions.get(&id) {
            Some(s) if s.owner.as_ref().is_some_and(|o| o.conn != conn) => Err(not_bound(id)),
            _ => {
                t.sessions.remove(&id);
                Ok(())
            }
        }
    }

    /// Binds session `id` to connection `conn`, authenticated as `key_id`, if `proof_ok` accepts the proof made
    /// with the session's secret. Afterwards only `conn` may use it.
    pub fn bind(
        &self,
        id: u64,
        conn: u64,
        key_id: &str,
        proof_ok: impl FnOnce(&crate::auth::Secret) -> bool,
    ) -> Result<(), WireError> {
        let mut t = self.inner.lock().expect("session table");
        let Some(s) = t.sessions.get_mut(&id) else {
            return Err(WireError::new(ErrorCode::StaleSession, format!("unknown session {id:#x}")));
        };
        let Some(owner) = s.owner.as_mut() else {
            return Ok(()); // authentication off: nothing to bind
        };
        if &*owner.key_id != key_id {
            return Err(WireError::new(
                ErrorCode::StaleSession,
                format!("session {id:#x} belongs to another principal than {key_id:?}"),
            ));
        }
        if !proof_ok(&owner.secret) {
            return Err(WireError::new(ErrorCode::StaleSession, format!("wrong proof for session {id:#x}")));
        }
        owner.conn = conn;
        s.last_used = Instant::now();
        Ok(())
    }

    /// Admits a request of connection `conn` on (session, slot, seq).
    pub fn admit(&self, id: u64, conn: u64, slot: u32, seq: u32) -> Admit {
        let mut t = self.inner.lock().expect("session table");
        let Some(s) = t.sessions.get_mut(&id) else {
            return Admit::Reject(WireError::new(ErrorCode::StaleSession, format!("unknown session {id:#x}")));
        };
        if s.owner.as_ref().is_some_and(|o| o.conn != conn) {
            return Admit::Reject(not_bound(id));
        }
        s.last_used = Instant::now();
        let nslots = s.slots.len();
        let Some(sl) = s.slots.get_mut(slot as usize) else {
            return Admit::Reject(WireError::new(
                ErrorCode::BadRequest,
                format!("slot {slot} out of range (session has {nslots})"),
            ));
        };
        if seq == sl.seq.wrapping_add(1) && seq != 0 {
            if let SlotState::Running(_) = sl.state {
                return Admit::Reject(WireError::new(
                    ErrorCode::BadRequest,
                    format!("slot {slot} still has request {} in flight", sl.seq),
                ));
            }
            let (tx, _) = watch::channel(false);
            // A slot runs each sequence once, in order: the one it ran last is now behind it for good.
            crate::invariant!(sl.seq.wrapping_add(1) == seq && !matches!(sl.state, SlotState::Running(_)));
            sl.seq = seq;
            sl.state = SlotState::Running(tx);
            return Admit::Execute;
        }
        if seq == sl.seq && seq != 0 {
            return match &sl.state {
                SlotState::Running(tx) => Admit::Wait(tx.subscribe()),
                SlotState::Done(Some(c)) => Admit::Replay(c.clone()),
                SlotState::Done(None) => Admit::Reexecute,
                SlotState::Fresh => Admit::Reexecute,
            };
        }
        Admit::Reject(WireError::new(
            ErrorCode::SeqMisordered,
            format!("slot {slot}: sequence {seq}, expected {} or {}", sl.seq, sl.seq.wrapping_add(1)),
        ))
    }

    /// Records the outcome of an executed request and wakes retransmissions waiting on it.
    pub fn complete(&self, id: u64, slot: u32, seq: u32, cached: Option<CachedReply>) {
        let mut t = self.inner.lock().expect("session table");
        if let Some(sl) = t.sessions.get_mut(&id).and_then(|s| s.slots.get_mut(slot as usize))
            && sl.seq == seq
        {
            let prev = std::mem::replace(&mut sl.state, SlotState::Done(cached));
            if let SlotState::Running(tx) = prev {
                let _ = tx.send(true);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().expect("session table").sessions.len()
    }

    /// (sessions, slots granted, slots running a request): the table's occupancy, for metrics at scrape time.
    pub fn occupancy(&self) -> (usize, usize, usize) {
        let t = self.inner.lock().expect("session table");
        let slots = t.sessions.values().map(|s| s.slots.len()).sum();
        let running = t
            .sessions
            .values()
            .flat_map(|s| s.slots.iter())
            .filter(|sl| matches!(sl.state, SlotState::Running(_)))
            .count();
        (t.sessions.len(), slots, running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_rules() {
        let t = SessionTable::new(4, 8, 1000);
        let (id, n) = t.create("c", 100, |_| Ok(None)).unwrap();
        assert_eq!(n, 4);
        assert!(matches!(t.admit(id, 1, 0, 1), Admit::Execute));
        // Retransmission while running waits.
        assert!(matches!(t.admit(id, 1, 0, 1), Admit::Wait(_)));
        // The next sequence while running is a client bug.
        assert!(matches!(t.admit(id, 1, 0, 2), Admit::Reject(_)));
        t.complete(id, 0, 1, Some(CachedReply { flags: 0, body: Bytes::from_static(b"r") }));
        match t.admit(id, 1, 0, 1) {
            Admit::Replay(c) => assert_eq!(&c.body[..], b"r"),
            _ => panic!("expected replay"),
        }
        assert!(matches!(t.admit(id, 1, 0, 5), Admit::Reject(WireError { code: ErrorCode::SeqMisordered, .. })));
        assert!(matches!(t.admit(id, 1, 0, 2), Admit::Execute));
        t.complete(id, 0, 2, None);
        assert!(matches!(t.admit(id, 1, 0, 2), Admit::Reexecute));
        assert!(matches!(t.admit(id, 1, 9, 1), Admit::Reject(WireError { code: ErrorCode::BadRequest, .. })));
        assert!(matches!(t.admit(id ^ 1, 1, 0, 1), Admit::Reject(WireError { code: ErrorCode::StaleSession, .. })));
    }

    #[test]
    fn table_is_bounded() {
        let t = SessionTable::new(1, 2, 3_600_000);
        t.create("a", 1, |_| Ok(None)).unwrap();
        t.create("b", 1, |_| Ok(None)).unwrap();
        assert_eq!(t.create("c", 1, |_| Ok(None)).unwrap_err().code, ErrorCode::Busy);
        let t = SessionTable::new(1, 1, 0);
        t.create("a", 1, |_| Ok(None)).unwrap();
        // With a zero idle limit the idle session is evicted to make room.
        assert!(t.create("b", 1, |_| Ok(None)).is_ok());
        assert_eq!(t.len(), 1);
    }

    /// One per-client key cannot fill the table for everyone (issue 31): past its quota it is refused, naming
    /// the key, before any idle session of others is evicted for it; other keys and the cluster key go on.
    #[test]
    fn a_per_client_key_holds_at_most_its_quota() {
        let t = SessionTable::new(1, 8, 0).with_per_key_max(3);
        let as_key = |key: &'static str| move |_| Ok(Some(Binding { conn: 1, key_id: key.into(), secret: [0; 32] }));
        for _ in 0..3 {
            t.create("m", 1, as_key("mallory")).unwrap();
        }
        let e = t.create("m", 1, as_key("mallory")).unwrap_err();
        assert_eq!(e.code, ErrorCode::Busy);
        assert!(e.message.contains("mallory") && e.message.contains("sessions_per_key_max"), "{}", e.message);
        assert_eq!(t.len(), 3, "nothing evicted for the refused one");
        t.create("a", 1, as_key("alice")).unwrap();
        for _ in 0..4 {
            t.create("s", 1, as_key("cluster")).unwrap();
        }
        assert_eq!(t.len(), 8);
    }

    #[test]
    fn a_bound_session_serves_only_its_connection_until_rebound_with_the_proof() {
        let t = SessionTable::new(2, 8, 1000);
        let secret = [7u8; 32];
        let (id, _) = t.create("c", 2, |_| Ok(Some(Binding { conn: 10, key_id: "cluster".into(), secret }))).unwrap();
        assert!(matches!(t.admit(id, 10, 0, 1), Admit::Execute));
        t.complete(id, 0, 1, None);
        // Another connection can neither use nor destroy it.
        assert!(matches!(t.admit(id, 11, 0, 2), Admit::Reject(WireError { code: ErrorCode::StaleSession, .. })));
        assert_eq!(t.destroy(id, 11).unwrap_err().code, ErrorCode::StaleSession);
        // Nor bind it without the proof, or as another principal.
        assert_eq!(t.bind(id, 11, "cluster", |_| false).unwrap_err().code, ErrorCode::StaleSession);
        assert_eq!(t.bind(id, 11, "alice", |_| true).unwrap_err().code, ErrorCode::StaleSession);
        assert_eq!(t.bind(id ^ 1, 11, "cluster", |_| true).unwrap_err().code, ErrorCode::StaleSession);
        // With it, the session moves, slots and all: the old connection is now the stranger.
        t.bind(id, 11, "cluster", |s| *s == secret).unwrap();
        assert!(matches!(t.admit(id, 11, 0, 1), Admit::Reexecute), "the slot's state survives the bind");
        assert!(matches!(t.admit(id, 10, 0, 2), Admit::Reject(_)));
        t.destroy(id, 11).unwrap();
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn session_ids_are_random_and_never_zero() {
        let t = SessionTable::new(1, 64, 1000);
        let ids: std::collections::HashSet<u64> = (0..64).map(|_| t.create("c", 1, |_| Ok(None)).unwrap().0).collect();
        assert_eq!(ids.len(), 64);
        assert!(!ids.contains(&0));
        // Two tables made in the same second (a fast restart) share no ids.
        let u = SessionTable::new(1, 64, 1000);
        assert!((0..64).all(|_| !ids.contains(&u.create("c", 1, |_| Ok(None)).unwrap().0)));
    }
}
