//! The Weft data server: stores the per-file objects of the stripes it owns as files under its root directory,
//! with a CRC-32C per 4 KiB block verified on every read, and serves them over weft-rpc.
//!
//! - [`store`]: the on-disk object format and its checks (no networking, synchronous).
//! - [`pipeline`]: a transfer unit cut into pieces (and its chunk list with it) for double buffering.
//! - [`config`]: `weft data --config F` and its defaults.
//! - [`service`]: the RPC service, one method per data-server op.
//! - [`cache_fill`]: the cache bank's fills after reads and invalidations after writes (issue 16).
//! - [`lease`]: the lease to serve clients that the MDS's heartbeat replies grant (stale-layout fencing).
//! - [`verifier`]: the write verifier a client's fsync compares, to tell a reboot's lost writes (§33).
//! - [`node`]: the process: listeners, the service, and the heartbeat that registers it with the metadata service.

pub mod cache_fill;
pub mod capabilities;
pub mod config;
pub mod fences;
pub mod lease;
pub mod node;
pub mod pipeline;
mod range_lock;
pub mod service;
pub mod store;
mod sys;
pub mod verifier;

pub use config::{
    DEFAULT_PIPELINE_PIECE_BYTES, DEFAULT_POOL_CLASSES, DEFAULT_RDMA_PIPELINE_PIECE_BYTES, DataConfig, PoolClassConfig,
};
pub use node::{DataServerError, NfsBound, NfsParts, NfsStarter, run, run_with_nfs};
pub use service::{DataService, INLINE_IO_BYTES_MAX};
pub use store::{BLOCK_BYTES, DataError, MappedRead, ObjectStore};
