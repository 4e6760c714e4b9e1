//! The server's session table: slots, sequence checks and the reply cache (exactly-once for non-idempotent ops).
//!
//! Invariant: for each slot, a request with sequence `last + 1` is executed at most once; a request with sequence
//! `last` is a retransmission and is answered from the cache (or, for an idempotent op, executed again); any other
//! sequence is refused with `SeqMisordered`.

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

struct Session {
    /// For logs of evictions.
    client_name: String,
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
    idle_ms: u64,
}

struct Tables {
    sessions: HashMap<u64, Session>,
    next_id: u64,
}

impl SessionTable {
    pub fn new(slots_max: u32, sessions_max: u32, idle_ms: u64) -> SessionTable {
        // Ids start from the boot time so a restarted server never accepts a session id from its previous life.
        let boot_s =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        SessionTable {
            inner: Mutex::new(Tables { sessions: HashMap::new(), next_id: (boot_s << 24) | 1 }),
            slots_max,
            sessions_max,
            idle_ms,
        }
    }

    /// Creates a session; returns its id and the slots granted.
    pub fn create(&self, client_name: &str, slots: u32) -> Result<(u64, u32), WireError> {
        let slots = slots.clamp(1, self.slots_max);
        let mut t = self.inner.lock().expect("session table");
        if t.sessions.len() >= self.sessions_max as usize {
            let now = Instant::now();
            let idle_ms = self.idle_ms;
            t.sessions.retain(|id, s| {
                let idle = now.duration_since(s.last_used).as_millis() as u64 >= idle_ms;
                let busy = s.slots.iter().any(|sl| matches!(sl.state, SlotState::Running(_)));
                if idle && !busy {
                    tracing::info!(session = format_args!("{id:#x}"), client = %s.client_name, "evicting idle session");
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
        let id = t.next_id;
        t.next_id += 1;
        let slots_v = (0..slots).map(|_| Slot { seq: 0, state: SlotState::Fresh }).collect();
        t.sessions
            .insert(id, Session { client_name: client_name.to_string(), slots: slots_v, last_used: Instant::now() });
        Ok((id, slots))
    }

    pub fn destroy(&self, id: u64) {
        self.inner.lock().expect("session table").sessions.remove(&id);
    }

    pub fn admit(&self, id: u64, slot: u32, seq: u32) -> Admit {
        let mut t = self.inner.lock().expect("session table");
        let Some(s) = t.sessions.get_mut(&id) else {
            return Admit::Reject(WireError::new(ErrorCode::StaleSession, format!("unknown session {id:#x}")));
        };
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
    pub fn len(&self) -> usize {
        self.inner.lock().expect("session table").sessions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_rules() {
        let t = SessionTable::new(4, 8, 1000);
        let (id, n) = t.create("c", 100).unwrap();
        assert_eq!(n, 4);
        assert!(matches!(t.admit(id, 0, 1), Admit::Execute));
        // Retransmission while running waits.
        assert!(matches!(t.admit(id, 0, 1), Admit::Wait(_)));
        // The next sequence while running is a client bug.
        assert!(matches!(t.admit(id, 0, 2), Admit::Reject(_)));
        t.complete(id, 0, 1, Some(CachedReply { flags: 0, body: Bytes::from_static(b"r") }));
        match t.admit(id, 0, 1) {
            Admit::Replay(c) => assert_eq!(&c.body[..], b"r"),
            _ => panic!("expected replay"),
        }
        assert!(matches!(t.admit(id, 0, 5), Admit::Reject(WireError { code: ErrorCode::SeqMisordered, .. })));
        assert!(matches!(t.admit(id, 0, 2), Admit::Execute));
        t.complete(id, 0, 2, None);
        assert!(matches!(t.admit(id, 0, 2), Admit::Reexecute));
        assert!(matches!(t.admit(id, 9, 1), Admit::Reject(WireError { code: ErrorCode::BadRequest, .. })));
        assert!(matches!(t.admit(id + 1, 0, 1), Admit::Reject(WireError { code: ErrorCode::StaleSession, .. })));
    }

    #[test]
    fn table_is_bounded() {
        let t = SessionTable::new(1, 2, 3_600_000);
        t.create("a", 1).unwrap();
        t.create("b", 1).unwrap();
        assert_eq!(t.create("c", 1).unwrap_err().code, ErrorCode::Busy);
        let t = SessionTable::new(1, 1, 0);
        t.create("a", 1).unwrap();
        // With a zero idle limit the idle session is evicted to make room.
        assert!(t.create("b", 1).is_ok());
        assert_eq!(t.len(), 1);
    }
}
