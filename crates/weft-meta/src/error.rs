//! Storage failures of the metadata store.
//!
//! Why a separate type: a namespace rule violation (a missing name, a non-empty directory) is the caller's problem
//! and goes back on the wire as a [`WireError`] with a precise [`ErrorCode`]; a storage failure (an I/O error, a
//! record that does not decode) is the server's problem, is logged, and reaches the client only as `Io` or
//! `Internal`. Keeping the two apart lets the store implementations stay ignorant of POSIX rules.

use weft_proto::{ErrorCode, WireError};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    #[error("metadata store I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The embedded database engine failed (open, begin, commit, table access).
    #[error("metadata store: {0}")]
    Store(String),
    /// A stored record does not decode or breaks an invariant (e.g. a directory entry naming a missing inode).
    #[error("corrupt metadata record: {0}")]
    Corrupt(String),
    /// A write was attempted inside a read-only transaction: a bug in the caller.
    #[error("write attempted in a read-only metadata transaction")]
    ReadOnly,
    /// A previous transaction panicked while holding the store's lock; the in-memory state is not trusted.
    #[error("metadata store poisoned by an earlier panic")]
    Poisoned,
    /// A shared store (PostgreSQL) kept failing the transaction with serialization failures or deadlocks against
    /// other services' transactions, past its bounded retries; nothing was applied.
    #[error("metadata transaction conflicted with concurrent ones too often: {0}")]
    Conflict(String),
    /// The database's schema is newer than this build knows (docs/format.md §26): upgrade the service.
    #[error("metadata database schema version {found} is newer than this build's {supported}; upgrade weft")]
    SchemaTooNew { found: i32, supported: i32 },
    /// A duty's write (membership, drain, orphan collection, sweep) by a service that does not hold the duty lease
    /// (docs/format.md §28): nothing was applied; the holder does it.
    #[error("fenced: {0}")]
    Fenced(String),
    /// The connection to a shared store was lost while its `COMMIT` was in flight: the change may or may not have
    /// been applied. A change with a once record finds out from it (`Namespace::execute_once`).
    #[error("metadata commit outcome unknown: {0}")]
    CommitUnknown(String),
}

impl From<MetaError> for WireError {
    fn from(e: MetaError) -> Self {
        let code = match e {
            MetaError::Io(_)
            | MetaError::Store(_)
            | MetaError::Corrupt(_)
            | MetaError::SchemaTooNew { .. }
            | MetaError::CommitUnknown(_) => ErrorCode::Io,
            MetaError::Conflict(_) | MetaError::Fenced(_) => ErrorCode::Busy,
            MetaError::ReadOnly | MetaError::Poisoned => ErrorCode::Internal,
        };
        tracing::error!("metadata store failure: {e}");
        WireError::new(code, e.to_string())
    }
}

macro_rules! store_error {
    ($($t:ty),*) => {$(
        impl From<$t> for MetaError {
            fn from(e: $t) -> Self {
                MetaError::Store(e.to_string())
            }
        }
    )*};
}

store_error!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError,
    tokio_postgres::Error
);
