//! Errors a caller of [`crate::RpcClient::call`] branches on.

use weft_proto::{FrameError, Op, WireError};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("{op:?} to {addr} timed out after {attempts} attempts; it was never executed")]
    Timeout { addr: String, op: Op, attempts: u32 },
    /// A non-idempotent request was sent, and no reply came back: the server may or may not have executed it.
    #[error("{op:?} to {addr} may or may not have been applied: {reason}")]
    MaybeApplied { addr: String, op: Op, reason: String },
    /// The server executed the call and answered with an error.
    #[error("{0}")]
    Remote(WireError),
    #[error("protocol error talking to {addr}: {source}")]
    Protocol { addr: String, source: FrameError },
    /// The connection that held this call's memory registrations ended before the call went out; register again.
    #[error("connection to {addr} changed; its memory registrations are gone")]
    RegionsLost { addr: String },
    /// The handshake failed: the server refused our key, or could not prove it holds it (see the log line).
    #[error("authenticating with {addr}: {reason}")]
    Unauthenticated { addr: String, reason: String },
    #[error("connection to {addr} lost: {reason}")]
    ConnectionLost { addr: String, reason: String },
}

impl RpcError {
    /// The wire error, when the server answered with one.
    pub fn remote(&self) -> Option<&WireError> {
        match self {
            RpcError::Remote(e) => Some(e),
            _ => None,
        }
    }
}
