//! NFSv4.1 (RFC 8881) beside NFSv3 on the gateway's one port: COMPOUND with sessions (exactly-once through the
//! slot tables' reply caches), opens with share reservations, byte-range locks onto the MDS's locks, leases and
//! a grace period after every start.
//!
//! [`decode`] turns COMPOUND4args into ops, [`compound`] runs them in order until the first error, [`ops`] and
//! [`session_ops`] are the operations, [`state`] the pure state machine (clients, sessions, slots, stateids,
//! leases, grace), [`attrs`] `fattr4`. Filehandles are the sealed handles of NFSv3 ([`crate::fh`]), so they are
//! stable across restarts and gateways; the export's root is the root filehandle (no pseudo-filesystem above it).
//! Delegations are never offered (OPEN answers OPEN_DELEGATE_NONE), and pNFS is not served (the next issue).
//! docs/format.md §21.

pub mod attrs;
pub mod compound;
pub mod consts;
pub mod decode;
pub mod ops;
pub mod session_ops;
pub mod state;

use std::sync::Mutex;
use std::time::Instant;

use state::{State, StateConfig};

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
}

impl Server {
    pub fn new(cfg: StateConfig, epoch: u32, export_id: u32) -> Server {
        Server {
            state: Mutex::new(State::new(cfg, epoch, 0)),
            started: Instant::now(),
            epoch,
            major_id: format!("weft-gw-{epoch:08x}").into_bytes(),
            scope: format!("weft-{export_id:08x}").into_bytes(),
        }
    }

    /// Milliseconds since this server started: the clock the state machine is given.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("nfs4 state")
    }
}
