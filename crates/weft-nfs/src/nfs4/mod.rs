//! NFSv4.1 (RFC 8881) beside NFSv3 on the gateway's one port: COMPOUND with sessions (exactly-once through the
//! slot tables' reply caches), opens with share reservations, byte-range locks onto the MDS's locks, leases and
//! a grace period after every start.
//!
//! [`decode`] turns COMPOUND4args into ops, [`compound`] runs them in order until the first error, [`ops`] and
//! [`session_ops`] are the operations, [`state`] the pure state machine (clients, sessions, slots, stateids,
//! leases, grace), [`attrs`] `fattr4`. Filehandles are the sealed handles of NFSv3 ([`crate::fh`]), so they are
//! stable across restarts and gateways; the export's root is the root filehandle (no pseudo-filesystem above it).
//! Delegations are never offered (OPEN answers OPEN_DELEGATE_NONE). With `--pnfs` the gateway is a pNFS metadata
//! server ([`pnfs`], [`layout`]): clients get file layouts and move a plain file's bytes with the data servers.
//! docs/format.md §21.

pub mod attrs;
pub mod callback;
pub mod compound;
pub mod consts;
pub mod decode;
pub mod layout;
pub mod ops;
pub mod pnfs;
pub mod recall;
pub mod session_ops;
pub mod state;

use std::sync::Mutex;
use std::time::Instant;

use state::{State, StateConfig};
use weft_proto::msg::{AdoptedLock, LockClass};

use crate::restart::OwnerKey;

/// Most reclaimed ranges remembered in a grace period (past it a reclaim is not remembered, and its adopted
/// range is unlocked when grace ends, as if it had not been reclaimed: the client's next LOCK finds it free or
/// taken; bounded rather than growing).
pub const RECLAIMS_MAX: usize = 65_536;

/// The previous gateway process's locks adopted at start, and the ranges clients reclaimed since (an inclusive
/// range per (inode, owner)); when grace ends, what was adopted and not reclaimed is unlocked.
#[derive(Default)]
struct Adoption {
    adopted: Vec<AdoptedLock>,
    reclaimed: Vec<(u64, u64, u64, u64)>,
}

/// The NFSv4.1 part of a gateway: its state and the identity it tells clients.
pub struct Server {
    state: Mutex<State>,
    started: Instant,
    /// This start's epoch: the high half of clientids, the first 4 bytes of stateids, in session ids.
    pub epoch: u32,
    /// `server_owner4.so_major_id`: this gateway process (state is not shared between gateways, so two gateways
    /// must not look like one server to a client's trunking detection).
    pub major_id: Vec<u8>,
    /// `eir_server_scope`: the export of this cluster; the same across restarts, so clients reclaim after one.
    pub scope: Vec<u8>,
    adoption: Mutex<Adoption>,
    /// Each session's back channel ([`callback`]).
    channels: Mutex<callback::Channels>,
}

/// `state` drawing its client and session ids under a secret of this start ([`State::with_id_secret`]). Without
/// a random source (never seen) the ids are counted, which only makes them guessable, and the log says so.
fn unguessable(state: State) -> State {
    match weft_rpc::auth::random_bytes() {
        Ok(secret) => state.with_id_secret(&secret),
        Err(e) => {
            tracing::error!(error = %e, "no random source: NFSv4.1 client and session ids are counted, not drawn");
            state
        }
    }
}

impl Server {
    pub fn new(cfg: StateConfig, epoch: u32, export_id: u32, owner_key: OwnerKey) -> Server {
        Server {
            adoption: Mutex::new(Adoption::default()),
            channels: Mutex::new(callback::Channels::new(cfg.callbacks_max)),
            state: Mutex::new(unguessable(State::new(cfg, epoch, 0).with_owner_key(owner_key))),
            started: Instant::now(),
            epoch,
            major_id: format!("weft-gw-{epoch:08x}").into_bytes(),
            scope: format!("weft-{export_id:08x}").into_bytes(),
        }
    }

    /// The state of a pNFS data server (docs/format.md §23): no grace period (it holds no opens or locks to
    /// reclaim), and its own `so_major_id` and scope, so a client never mistakes it for the gateway or for another
    /// data server (it would trunk their sessions together).
    pub fn data_server(cfg: StateConfig, epoch: u32, server_id: u32) -> Server {
        let cfg = StateConfig { grace_ms: 0, ..cfg };
        Server {
            adoption: Mutex::new(Adoption::default()),
            channels: Mutex::new(callback::Channels::new(cfg.callbacks_max)),
            state: Mutex::new(unguessable(State::new(cfg, epoch, 0))),
            started: Instant::now(),
            epoch,
            major_id: format!("weft-ds-{server_id}-{epoch:08x}").into_bytes(),
            scope: format!("weft-ds-{server_id}").into_bytes(),
        }
    }

    /// Milliseconds since this server started: the clock the state machine is given.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("nfs4 state")
    }

    /// The back channels (lock it after [`Server::state`] when both are held, never before).
    pub fn channels(&self) -> std::sync::MutexGuard<'_, callback::Channels> {
        self.channels.lock().expect("nfs4 channels")
    }

    /// The locks adopted from the previous gateway process (held until grace ends unless reclaimed).
    pub fn adopted(&self, locks: Vec<AdoptedLock>) {
        self.adoption.lock().expect("adoption").adopted = locks;
    }

    /// A reclaim LOCK of `[start, end]` by MDS owner `owner` on `ino` was granted.
    pub fn reclaimed(&self, ino: u64, owner: u64, start: u64, end: u64) {
        let mut a = self.adoption.lock().expect("adoption");
        if a.adopted.is_empty() || a.reclaimed.len() >= RECLAIMS_MAX {
            return;
        }
        a.reclaimed.push((ino, owner, start, end));
    }

    /// Grace is over: the adopted ranges nobody reclaimed, as (ino, owner, class, start, end) pieces to unlock;
    /// the adoption is forgotten.
    pub fn unreclaimed(&self) -> Vec<(u64, u64, LockClass, u64, u64)> {
        let a = std::mem::take(&mut *self.adoption.lock().expect("adoption"));
        let mut out = Vec::new();
        for l in &a.adopted {
            let covers: Vec<(u64, u64)> =
                a.reclaimed.iter().filter(|r| r.0 == l.ino && r.1 == l.owner).map(|r| (r.2, r.3)).collect();
            for (start, end) in uncovered(l.start, l.end, &covers) {
                out.push((l.ino, l.owner, l.class, start, end));
            }
        }
        out
    }
}

/// The pieces of `[start, end]` (inclusive) outside every range of `covers`.
fn uncovered(start: u64, end: u64, covers: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut pieces = vec![(start, end)];
    for &(cs, ce) in covers {
        let mut next = Vec::with_capacity(pieces.len() + 1);
        for (s, e) in pieces {
            if ce < s || cs > e {
                next.push((s, e));
                continue;
            }
            if cs > s {
                next.push((s, cs - 1));
            }
            if ce < e {
                next.push((ce + 1, e));
            }
        }
        pieces = next;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use weft_proto::msg::LockKind;

    use super::*;

    #[test]
    fn what_was_adopted_and_not_reclaimed_is_unlocked_piece_by_piece() {
        assert_eq!(uncovered(0, 99, &[]), vec![(0, 99)]);
        assert_eq!(uncovered(0, 99, &[(10, 19), (50, 200)]), vec![(0, 9), (20, 49)]);
        assert_eq!(uncovered(0, u64::MAX, &[(0, u64::MAX)]), vec![]);
        assert_eq!(uncovered(5, u64::MAX, &[(0, 9)]), vec![(10, u64::MAX)]);
        let s = Server::new(StateConfig::default(), 1, 1, OwnerKey::default());
        s.reclaimed(1, 7, 0, 9); // nothing adopted yet: not remembered
        let l = |ino, owner, start, end| AdoptedLock {
            ino,
            owner,
            class: LockClass::Posix,
            kind: LockKind::Exclusive,
            start,
            end,
        };
        s.adopted(vec![l(1, 7, 0, 9), l(1, 7, 20, 29), l(1, 8, 0, 9), l(2, 7, 0, 9)]);
        s.reclaimed(1, 7, 0, 9);
        s.reclaimed(1, 7, 25, 40);
        assert_eq!(
            s.unreclaimed(),
            vec![(1, 7, LockClass::Posix, 20, 24), (1, 8, LockClass::Posix, 0, 9), (2, 7, LockClass::Posix, 0, 9)]
        );
        assert!(s.unreclaimed().is_empty(), "forgotten once handed out");
    }
}
