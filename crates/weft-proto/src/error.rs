//! The error a server sends back in a reply flagged [`crate::frame::FLAG_ERROR`].
//!
//! Codes are stable wire values (never reused); each maps to the errno a POSIX front end reports.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ErrorCode {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    Invalid,
    NameTooLong,
    Permission,
    NoSpace,
    /// A stored block failed its checksum: the bytes are not returned.
    Corrupt,
    /// The request could not be decoded or broke a protocol rule.
    BadRequest,
    /// The server is out of a bounded resource (sessions, buffers); retry later.
    Busy,
    /// The session id is unknown to the server (it restarted or expired the session).
    StaleSession,
    /// The slot's sequence number is neither the next one nor a retransmission of the last one.
    SeqMisordered,
    Io,
    Internal,
    /// No data server is available for a layout.
    NoServers,
    /// Offset or length out of the range the server accepts.
    OutOfRange,
    NotSymlink,
    /// The act is reserved to a file's owner or to root (chown, chmod, a sticky directory's entries, device
    /// nodes), as opposed to `Permission`, which is a missing mode bit.
    NotPermitted,
    /// The connection has not proved it holds a key (or its proof was wrong): nothing but `Null` and the
    /// authentication ops is served on it.
    Unauthenticated,
    /// A data server refused the request's capability (missing, forged, for another inode or key, without the
    /// rights the op needs, or for a removed file): nothing was read or written. The message says which.
    CapabilityRefused,
    /// The request's capability expired: the client renews it at the MDS (`Open`) and retries once.
    CapabilityExpired,
    /// No such extended attribute (ENODATA).
    NoData,
    /// A reply would not fit the caller's buffer (ERANGE).
    Range,
    /// An extended attribute, or an inode's set of them, is over its limit (E2BIG).
    TooBig,
    /// The operation or attribute namespace is not supported (EOPNOTSUPP).
    NotSupported,
    /// The lock table is full (`locks_max`, docs/format.md §14): ENOLCK.
    NoLocks,
    /// A compare-and-set chunk write (`WriteRows`, docs/format.md §17) found another version than it expected:
    /// another writer changed the row first; nothing was written. The client rereads the row and retries.
    VersionMoved,
    /// This session's locks were adopted by another session (`AdoptLocks`, docs/format.md §22): it may lock no
    /// more (ENOLCK).
    LocksAdopted,
    /// `AdoptLocks` named a session whose locks were taken under another principal (EPERM).
    AdoptRefused,
    /// The request was made against an older layout generation than the file's (docs/format.md §19): a failed
    /// server's slot moved to a spare since the client fetched the layout. The client refetches the layout
    /// (`GetAttr`) and retries once (ESTALE).
    StaleLayout,
    /// A fenced mirror write or truncate (docs/format.md §32) carried an epoch below the object's: a copy of the
    /// object was fenced since the writer learned it (a heal or a repair copied onto it or from it), so the writer's
    /// bytes on the other copies may have been undone. Nothing was written. The client asks the epoch
    /// (`FenceWrites` `Query`) and writes every copy again.
    EpochMoved,
    /// The object is held for a copy between mirror copies (docs/format.md §32): nothing was written. The client
    /// waits (a hold lasts at most 30 s) and writes every copy again.
    Held,
    /// A write under a hold found the hold gone (released, expired or lost to a restart, docs/format.md §32):
    /// nothing was written, and the copier starts over.
    HoldLost,
}

impl ErrorCode {
    /// The Linux errno a POSIX front end returns for this code.
    pub fn errno(self) -> i32 {
        match self {
            ErrorCode::NotFound => 2,                         // ENOENT
            ErrorCode::Exists => 17,                          // EEXIST
            ErrorCode::NotDir => 20,                          // ENOTDIR
            ErrorCode::IsDir => 21,                           // EISDIR
            ErrorCode::NotEmpty => 39,                        // ENOTEMPTY
            ErrorCode::Invalid | ErrorCode::NotSymlink => 22, // EINVAL
            ErrorCode::NameTooLong => 36,                     // ENAMETOOLONG
            ErrorCode::Permission
            | ErrorCode::Unauthenticated
            | ErrorCode::CapabilityRefused
            | ErrorCode::CapabilityExpired => 13, // EACCES
            ErrorCode::NoSpace => 28,                         // ENOSPC
            ErrorCode::Corrupt | ErrorCode::Io | ErrorCode::Internal => 5, // EIO
            ErrorCode::OutOfRange => 27,                      // EFBIG
            ErrorCode::Busy => 11,                            // EAGAIN
            ErrorCode::NotPermitted | ErrorCode::AdoptRefused => 1, // EPERM
            ErrorCode::NoData => 61,                          // ENODATA
            ErrorCode::Range => 34,                           // ERANGE
            ErrorCode::TooBig => 7,                           // E2BIG
            ErrorCode::NotSupported => 95,                    // EOPNOTSUPP
            ErrorCode::NoLocks | ErrorCode::LocksAdopted => 37, // ENOLCK
            ErrorCode::VersionMoved => 11,                    // EAGAIN
            ErrorCode::StaleLayout => 116,                    // ESTALE
            ErrorCode::EpochMoved | ErrorCode::Held | ErrorCode::HoldLost => 11, // EAGAIN
            _ => 5,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
    /// The byte offset the error is about, when it is about one (e.g. the object offset of a corrupt block), so
    /// a client can translate it without parsing the message.
    pub offset: Option<u64>,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError { code, message: message.into(), offset: None }
    }

    pub fn with_offset(mut self, offset: u64) -> Self {
        self.offset = Some(offset);
        self
    }
}
