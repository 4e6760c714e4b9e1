//! Weft's wire: the fixed frame header, the op codes, the request and response bodies, the wire error, and the
//! striping arithmetic that clients, servers and tests must agree on.
//!
//! This crate does no I/O. Everything that arrives from the network is decoded here and checked against explicit
//! limits before any other crate sees it; the decoders are fuzzed (`fuzz/fuzz_targets/frame.rs`).
//!
//! Encoding: a 40-byte little-endian [`frame::Header`], then `body_len` bytes of postcard-encoded body (whose type
//! is chosen by the op code, never by position), then `data_len` bytes of bulk payload that is never copied into
//! the body.

pub mod capability;
pub mod changes;
pub mod chunk;
pub mod chunk_version;
pub mod error;
pub mod frame;
pub mod layout;
pub mod msg;
pub mod once;
pub mod space;
pub mod types;
pub mod user;

pub use capability::{Capability, Rights};
pub use changes::{Changes, MetaChange};
pub use chunk::{Chunk, ChunkError, Region, RegionTable};
pub use error::{ErrorCode, WireError};
pub use frame::{FrameError, FrameKind, FrameLimits, HEADER_LEN, Header};
pub use layout::{DataRedundancy, Layout, Piece};
pub use msg::{Op, Request, Response};
pub use once::{ONCE_BYTES, OnceTag};
pub use space::{DeviceId, Redundancy, SpaceStatDev};
pub use types::*;
pub use user::{USER_GROUPS_MAX, UserCred, UserCredError};
