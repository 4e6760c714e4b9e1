//! The `rdma` backend's verbs layer: RC queue pairs over libibverbs (InfiniBand, RoCE, Soft-RoCE).
//!
//! What it offers, bottom up:
//! - [`Device`]: an opened verbs device with one protection domain and the port/GID it talks on;
//! - [`MemoryRegion`]: a page-aligned, pre-faulted buffer registered once (lkey for local use, rkey to advertise);
//!   [`RemoteRegion`] is what a peer advertised (address, length, rkey) and checks chunks against itself;
//! - [`Endpoint`]: a connected RC queue pair with polled completion queues. Two-sided messages go from a
//!   registered send ring into receives pre-posted by the peer, under credits (one credit = one posted receive
//!   buffer on the peer; credits return piggybacked on the next message). One-sided [`Endpoint::read`] and
//!   [`Endpoint::write`] move bytes between a local registered region and a peer's advertised region without the
//!   peer's CPU: in Weft only servers call them (the Read-Write design).
//! - Connection setup runs over a TCP side channel ([`Endpoint::connect`], [`Endpoint::accept`]): both sides
//!   swap a fixed-size [`ConnInfo`] (QPN, PSN, LID, GID, MTU, receive credits) and move their QPs to RTS.
//!
//! libibverbs is loaded at run time (see `ffi`), so this feature builds on any Linux host; without the library or
//! without a device every entry point returns an [`RdmaError`], never panics. All unsafe code of the backend lives
//! in this module tree (`ffi` for the raw ABI, `verbs` for the owning wrappers).
//!
//! Calls block the calling thread (completions are busy-polled with a deadline); an async fabric drives an endpoint
//! from a dedicated thread per connection or `spawn_blocking`.
#![allow(unsafe_code)]

mod cm;
mod endpoint;
mod fabric;
mod ffi;
mod stream;
mod verbs;
pub mod wire;

use std::fmt;

pub use cm::{CmConn, CmListener, CmRequest, Completion};
pub use endpoint::{Endpoint, EndpointConfig};
pub use fabric::{RDMA_SCHEME, RdmaFabric, RdmaListener, RdmaReader, RdmaServerLimits, available, zone_region};
pub use stream::{StreamKiller, StreamReader, StreamWriter};
pub use verbs::{Device, DeviceConfig, MemoryRegion, RemoteRegion, list_devices};
pub use wire::{CONN_INFO_BYTES, ConnInfo, MSG_HEADER_BYTES, MsgHeader};

/// Errors of the verbs layer and of endpoint setup and traffic.
#[derive(Debug)]
#[non_exhaustive]
pub enum RdmaError {
    /// libibverbs could not be loaded (not installed) or lacks a symbol.
    Library(String),
    /// The library loaded but no RDMA device exists (or the named one does not).
    NoDevice(String),
    /// A verbs call failed; `errno` is the OS error it reported.
    Verbs { op: &'static str, errno: i32 },
    /// A work request completed with an error status (e.g. remote access error for a bad rkey or bounds).
    Completion { op: &'static str, status: u32, text: String },
    /// No completion arrived before the deadline.
    Timeout { op: &'static str, timeout_ms: u64 },
    /// A local buffer range or a remote chunk is outside its region.
    OutOfBounds { what: &'static str, offset: u64, len: u64, region_len: u64 },
    /// A message is larger than the negotiated maximum.
    TooLarge { len: usize, max: usize },
    /// The peer sent something malformed (connection info or message header).
    Protocol(String),
    /// The TCP side channel failed.
    Io(std::io::Error),
}

impl fmt::Display for RdmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Library(m) => write!(f, "rdma: {m}"),
            Self::NoDevice(m) => write!(f, "rdma: no device: {m}"),
            Self::Verbs { op, errno } => {
                write!(f, "rdma: {op} failed: {}", std::io::Error::from_raw_os_error(*errno))
            }
            Self::Completion { op, status, text } => write!(f, "rdma: {op} completed with status {status} ({text})"),
            Self::Timeout { op, timeout_ms } => write!(f, "rdma: {op}: no completion within {timeout_ms} ms"),
            Self::OutOfBounds { what, offset, len, region_len } => {
                write!(f, "rdma: {what}: range {offset}+{len} is outside the region of {region_len} bytes")
            }
            Self::TooLarge { len, max } => write!(f, "rdma: message of {len} bytes exceeds the maximum {max}"),
            Self::Protocol(m) => write!(f, "rdma: protocol: {m}"),
            Self::Io(e) => write!(f, "rdma: side channel: {e}"),
        }
    }
}

impl std::error::Error for RdmaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for RdmaError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

pub type Result<T> = std::result::Result<T, RdmaError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_without_a_device_is_an_error_not_a_panic() {
        // The build host has no RDMA device; with or without libibverbs installed, opening must fail cleanly.
        // (Inside the Soft-RoCE VM a device exists; this test does not run there.)
        match Device::open(&DeviceConfig::default()) {
            Err(RdmaError::Library(m)) | Err(RdmaError::NoDevice(m)) => assert!(!m.is_empty()),
            Err(other) => panic!("unexpected error kind: {other}"),
            Ok(dev) => assert!(!dev.name().is_empty(), "a device exists here: {}", dev.name()),
        }
    }
}
