//! RPC over a fabric: every client–server pair talks through a *session* of N *slots* (NFSv4.1
//! sessions, dissertation §6.2.5).
//!
//! - Every request carries (session, slot, sequence). A slot holds at most one request in flight, so the slot
//!   count is the client's credit: it never has more than N requests outstanding to one server.
//! - The server caches the last reply of every slot for non-idempotent ops; a retransmission (same slot, same
//!   sequence) is answered from the cache and never executed twice. A retransmission that arrives while the original
//!   still runs waits for it.
//! - The client times calls out, tears the connection down, reconnects and retries on the same slot and sequence.
//!   When it gives up on a non-idempotent call that may have run, it says so ([`RpcError::MaybeApplied`]).
//! - Bulk payloads are bounded per frame (`FrameLimits::data_bytes_max`); callers split large transfers into
//!   transfer units and keep several in flight, so the server's disk works on one unit while the next crosses the
//!   network. Server buffers come from a bounded [`pool::BufferPool`] of size classes, each one zone pre-faulted
//!   and announced at start: when the class a payload needs is out the server stops reading the socket
//!   (back-pressure, not growth).

pub mod auth;
pub mod capability;
pub mod client;
pub mod config;
mod conn;
pub mod error;
pub mod fault;
pub mod io;
pub mod key;
pub mod keyring;
pub mod metrics;
mod pin;
pub mod pool;
/// Public only as a seam: the session simulation (weft-sim `tests/sessions.rs`) drives the real retry machine.
#[doc(hidden)]
pub mod retry;
pub mod server;
/// Public only as a seam: the session simulation drives the real session table.
#[doc(hidden)]
pub mod session;
pub mod side_auth;

/// Whether [`invariant!`] checks run: in debug builds, and in every build of the tests (`make test` builds with
/// `fault-injection`, release), so hot-path invariants are checked where adversaries run without costing the
/// shipped binary anything.
pub const CHECK_INVARIANTS: bool = cfg!(any(debug_assertions, feature = "fault-injection"));

/// `assert!` on a hot path (ARCHITECTURE.md "Invariant:" lines): checked in debug builds and in the tests' builds
/// ([`CHECK_INVARIANTS`]), compiled out of the shipped release binary. Cheap checks on cold paths use `assert!`.
#[macro_export]
macro_rules! invariant {
    ($($arg:tt)*) => {
        if $crate::CHECK_INVARIANTS {
            assert!($($arg)*);
        }
    };
}

pub use auth::{AuthMode, Credential, Key, KeyError, KeyRing, Principal};
pub use capability::{CapabilityKey, Demand, Refusal};
pub use client::RpcClient;
pub use config::{ClientConfig, ServerConfig};
pub use error::RpcError;
pub use keyring::{ClientKeys, KeyPolicy, KeyringError};
pub use metrics::{Metrics, OpMetrics};
pub use pin::ChunkBuffers;
pub use pool::{BufferPool, PoolBuf, PoolClass, PoolError};
pub use server::{CallCtx, Reply, ReplyData, RpcServer, Service};
pub use side_auth::{SideClient, SideServer};
pub use weft_proto::UserCred;
