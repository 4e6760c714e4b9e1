//! Errors of the client library. Callers branch on [`ClientError::code`] for namespace outcomes (not found,
//! exists, …) and on the variants for where a failure happened.

use weft_proto::ErrorCode;
use weft_rpc::RpcError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// A call to the metadata service failed (including its answer being an error).
    #[error("metadata service: {0}")]
    Meta(RpcError),
    /// A call to a data server failed.
    #[error("data server {server}: {source}")]
    Data { server: u32, source: RpcError },
    /// Reading or writing a file's bytes failed at one data server, after the RPC layer's bounded retries: it is
    /// down or unreachable (`Connect`, `Timeout`, `ConnectionLost`), full (`NoSpace`), or answered another error.
    /// Nothing is returned in place of the bytes (no zeros); a write that failed was not acknowledged.
    #[error("file inode {ino} at file offset {file_offset}: data server {server} ({addr}): {source}")]
    DataAt { ino: u64, file_offset: u64, server: u32, addr: String, source: RpcError },
    /// A close or fsync could not make this handle's writes durable on one data server (its `Fsync` failed, or it
    /// did not answer): the size and mtime were not committed, and the close or fsync fails (ARCHITECTURE.md, what
    /// is durable at close).
    #[error(
        "file inode {ino}: its writes could not be made durable on data server {server} ({addr}): {source}; the size was not committed"
    )]
    Unsynced { ino: u64, server: u32, addr: String, source: RpcError },
    /// A data server's write verifier changed between this handle's writes and their sync (its machine rebooted:
    /// docs/format.md §33), so what the handle wrote there since its last sync may be lost. Reported once; the
    /// size was not committed by the call that reports it.
    #[error(
        "file inode {ino}: data server {server} ({addr}) restarted after a reboot (write verifier {kept:#x}, now {now:#x}) between this handle's writes and their sync: bytes written since the last sync may be lost; the size was not committed"
    )]
    WritesLost { ino: u64, server: u32, addr: String, kept: u64, now: u64 },
    /// A stored block failed its checksum; no bytes of it were returned.
    #[error(
        "checksum mismatch in file inode {ino} at file offset {file_offset} (data server {server}, object offset {object_offset})"
    )]
    Corrupt { ino: u64, file_offset: u64, server: u32, object_offset: u64 },
    /// Fewer chunks (or copies) of a redundant file could be read than decoding needs: nothing is returned,
    /// never zeros (docs/format.md §16).
    #[error(
        "file inode {ino}: the bytes at file offset {file_offset} are unavailable: {available} chunks of their stripe could be read, {needed} are needed ({cause})"
    )]
    Unavailable { ino: u64, file_offset: u64, available: u32, needed: u32, cause: String },
    /// A write to a redundant file could not reach one of its layout's servers. What it missed is not recorded
    /// (degraded writes are not supported yet), so the write fails instead of leaving a stale chunk behind.
    #[error(
        "file inode {ino}: the write at file offset {file_offset} needs every server of its layout, and data server {server} failed: {cause}"
    )]
    DegradedWrite { ino: u64, file_offset: u64, server: u32, cause: String },
    /// A stripe row of an ec file whose chunks do not agree (a write torn by a crash, or two writers' updates not
    /// both finished) and too few of them are consistent to decode it: nothing is returned, never wrong bytes.
    /// Writing the row again or a scrub repairs it (docs/format.md §17).
    #[error("file inode {ino}: the stripe row at file offset {file_offset} is torn (its chunks disagree): {cause}")]
    TornRow { ino: u64, file_offset: u64, cause: String },
    /// A write of an ec file kept losing its row to other writers' (compare-and-set, §17) and gave up.
    #[error(
        "file inode {ino}: the write of the stripe row at file offset {file_offset} lost to other writers {attempts} times; not written"
    )]
    WriteConflict { ino: u64, file_offset: u64, attempts: u32 },
    /// Bytes an ec file held after acknowledging their write, until their stripe rows were whole (`ec_gather.rs`),
    /// could not be sent: the fsync or close that reports it fails, as a page cache's writeback error does.
    #[error(
        "file inode {ino}: writes held since their acknowledgement could not be stored (first at file offset {file_offset}): {cause}"
    )]
    WriteBehind { ino: u64, file_offset: u64, cause: String },
    /// The file's layout changed (a failed server's slot moved to a spare) since this handle fetched it, and the
    /// I/O failed again with the newer one (docs/format.md §19).
    #[error("file inode {ino}: stale layout (held generation {held}, current {current})")]
    StaleLayout { ino: u64, held: u64, current: u64 },
    #[error("a layout names data server {0}, which the metadata service does not know")]
    UnknownServer(u32),
    /// A redundant write, truncate or fsync left out a chunk or copy whose server did not answer moments ago
    /// (within `UNREACHABLE_HOLD_MS`), as if it had failed: recorded stale, like one that was tried and failed.
    #[error("data server {server} did not answer moments ago: not tried")]
    NotTried { server: u32 },
    #[error("{0}")]
    InvalidPath(String),
    /// `error` is not a `source`: its text is already part of this message, so chains do not repeat it.
    #[error("{path}: {error}")]
    Path { path: String, error: Box<ClientError> },
    #[error("{0}")]
    NotAFile(String),
    #[error("protocol: {0}")]
    Protocol(String),
    /// The cluster config's key could not be loaded (see docs/format.md §9).
    #[error("{0}")]
    Key(String),
    /// The user this client acts for cannot be sent (too many groups) or read from the system.
    #[error("user credential: {0}")]
    User(String),
    /// The caller's credential does not allow this access (checked by the library from the attributes).
    #[error("{0}")]
    Access(String),
    /// The cluster config's TLS files could not be loaded.
    #[error("{0}")]
    Tls(weft_fabric::TlsError),
    /// The cluster config's `[cache]` table cannot work.
    #[error("the [cache] table: {0}")]
    Cache(weft_cache::ConfigError),
}

impl ClientError {
    /// The server's error code, when a server answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Meta(e)
            | ClientError::Data { source: e, .. }
            | ClientError::DataAt { source: e, .. }
            | ClientError::Unsynced { source: e, .. } => e.remote().map(|w| w.code),
            ClientError::Path { error, .. } => error.code(),
            ClientError::Corrupt { .. } => Some(ErrorCode::Corrupt),
            ClientError::StaleLayout { .. } => Some(ErrorCode::StaleLayout),
            ClientError::Access(_) => Some(ErrorCode::Permission),
            _ => None,
        }
    }

    /// Says which path the error is about.
    pub fn with_path(self, path: &str) -> ClientError {
        match self {
            e @ ClientError::Path { .. } => e,
            e => ClientError::Path { path: path.to_string(), error: Box::new(e) },
        }
    }
}
