//! The Weft data server: stores the per-file objects of the stripes it owns as files under its root directory,
//! with a CRC-32C per 4 KiB block verified on every read, and serves them over weft-rpc.
//!
//! - [`store`]: the on-disk object format and its checks (no networking, synchronous).
//! - [`pipeline`]: a transfer unit cut into pieces (and its chunk list with it) for double buffering.
//! - [`server`]: the RPC service, the `weft data` configuration and the heartbeat to the metadata service.

pub mod pipeline;
mod range_lock;
pub mod server;
pub mod store;
mod sys;

pub use server::{DataConfig, DataServerError, DataService, run};
pub use store::{BLOCK_BYTES, DataError, MappedRead, ObjectStore};
