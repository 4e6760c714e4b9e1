//! `PgStore`: a [`MetaStore`] in a PostgreSQL database that any number of metadata services may share (schema and
//! rules in docs/format.md §26).
//!
//! Why this shape: every `write` is one `SERIALIZABLE` transaction, so the namespace rules written for one writer
//! (redb's) hold across services with no locking of ours; PostgreSQL aborts one of two transactions whose
//! interleaving no serial order explains (SQLSTATE 40001, or 40P01 for a deadlock), and the store runs the closure
//! again from the start, a bounded number of times ([`WRITE_TRIES`]). That is why [`MetaStore::write`] takes an
//! `FnMut`. So it does, on another connection, when the connection was lost before `COMMIT`; not when it was lost
//! during `COMMIT` (the outcome is unknown, as for any lost reply). The `COMMIT` is the durability point: no
//! journal of ours is involved.
//!
//! Why tokio-postgres driven from the calling thread: the namespace is synchronous and is called both from
//! tokio's blocking pool and in place on async worker threads (`MetaService::execute_in_place`). The sync
//! `postgres` crate drives its connection with its own runtime's `block_on`, which panics on a thread inside a
//! runtime. Here each connection's socket is driven by a task on the store's own one-thread runtime, and a query's
//! future (which only talks to that task through channels) is polled by `block_on` on the calling thread, which
//! works on any thread; on a multi-thread runtime's worker the whole transaction also runs inside
//! `block_in_place`, so the worker's other tasks move elsewhere while it waits for the database.
//!
//! Connections: a bounded pool ([`PgConfig::connections_max`], default [`DEFAULT_CONNECTIONS_MAX`]) opened on
//! demand; a caller finding every connection busy waits for one. A transaction holds one connection throughout.

mod pool;
mod schema;
mod txn;

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio_postgres::error::SqlState;
use weft_rpc::metrics::prometheus_client::metrics::counter::Counter;

use crate::error::MetaError;
use crate::store::{MetaStore, MetaTxn};
use pool::Failure;
use pool::{Conn, Pool};
pub use schema::SCHEMA_VERSION;
use txn::PgTxn;

/// Connections a [`PgStore`] opens at most, unless [`PgConfig`] says otherwise.
pub const DEFAULT_CONNECTIONS_MAX: usize = 8;
/// Tries of one write transaction (the first and its retries) before [`MetaError::Conflict`]. 16 were used up by
/// eight clients creating in their own directories (SERIALIZABLE's page-level predicate locks make small tables
/// conflict more than their rows do); 64, with sleeps of at most 64 ms, bound a write's wait to about two seconds.
pub const WRITE_TRIES: u32 = 64;
/// Longest sleep before a retry: a random 0..=2^min(n, 6) ms before try n + 1, so at most 64 ms.
const BACKOFF_SHIFT_MAX: u32 = 6;

/// How a [`PgStore`] connects.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PgConfig {
    /// Most connections open at once (at least 1): the number of transactions this store runs concurrently.
    pub connections_max: usize,
    /// How long a transaction waits for a writable server once the store has connected (the database failing
    /// over to a standby), in milliseconds.
    pub failover_timeout_ms: u64,
    /// How long one of this store's sessions may sit idle inside a transaction before PostgreSQL ends it
    /// (`idle_in_transaction_session_timeout`), in milliseconds: the bound on how long a stopped or hung service
    /// holds the directory locks it took (docs/format.md §26). Between a transaction's statements a service only
    /// computes in memory, so a healthy one never comes near it.
    pub idle_in_txn_timeout_ms: u64,
}

/// Default [`PgConfig::idle_in_txn_timeout_ms`]: far above any pause between one transaction's statements, far
/// below the clients' `mds_failover_timeout_ms` (60 s).
pub const DEFAULT_IDLE_IN_TXN_TIMEOUT_MS: u64 = 15_000;

/// Default [`PgConfig::failover_timeout_ms`]: time for an operator or pg_auto_failover/Patroni to promote a standby.
pub const DEFAULT_DB_FAILOVER_TIMEOUT_MS: u64 = 30_000;

impl Default for PgConfig {
    fn default() -> Self {
        PgConfig {
            connections_max: DEFAULT_CONNECTIONS_MAX,
            failover_timeout_ms: DEFAULT_DB_FAILOVER_TIMEOUT_MS,
            idle_in_txn_timeout_ms: DEFAULT_IDLE_IN_TXN_TIMEOUT_MS,
        }
    }
}

impl PgConfig {
    /// Waits at most `ms` for a writable server (see [`PgConfig::failover_timeout_ms`]).
    pub fn with_failover_timeout_ms(mut self, ms: u64) -> Self {
        self.failover_timeout_ms = ms;
        self
    }

    /// Ends a session idle inside a transaction for `ms` (at least 1; see [`PgConfig::idle_in_txn_timeout_ms`]).
    pub fn with_idle_in_txn_timeout_ms(mut self, ms: u64) -> Self {
        self.idle_in_txn_timeout_ms = ms.max(1);
        self
    }

    /// At most `n` connections (at least 1).
    pub fn with_connections_max(mut self, n: usize) -> Self {
        self.connections_max = n.max(1);
        self
    }
}

/// Metrics handles of a [`PgStore`] (clones count together).
#[derive(Debug, Clone, Default)]
pub struct PgStats {
    /// Write transactions run again: after a serialization failure, a deadlock, or a connection lost before
    /// `COMMIT`.
    pub retries: Counter,
    /// Writes that failed with [`MetaError::Conflict`] after [`WRITE_TRIES`] tries.
    pub gave_up: Counter,
}

/// The PostgreSQL [`MetaStore`].
pub struct PgStore {
    pool: Pool,
    stats: PgStats,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("connections_max", &self.pool.max()).finish()
    }
}

impl PgStore {
    /// Connects to the database at `url` (a `postgres://` URL or a `key=value` connection string; no TLS) with
    /// the default limits, creating the schema in an empty database and migrating an older one (docs/format.md
    /// §26). Refuses a schema newer than this build's with [`MetaError::SchemaTooNew`].
    pub fn connect(url: &str) -> Result<PgStore, MetaError> {
        PgStore::connect_with(url, PgConfig::default())
    }

    /// [`PgStore::connect`] with explicit limits.
    pub fn connect_with(url: &str, cfg: PgConfig) -> Result<PgStore, MetaError> {
        let pg_cfg: tokio_postgres::Config =
            url.parse().map_err(|e| MetaError::Store(format!("PostgreSQL connection string: {e}")))?;
        let pool = Pool::new(pg_cfg, cfg.connections_max.max(1), cfg.failover_timeout_ms, cfg.idle_in_txn_timeout_ms)?;
        off_runtime(|| {
            let mut conn = pool.take()?;
            let from = schema::migrate(&mut conn)?;
            if from != SCHEMA_VERSION {
                tracing::info!(from, to = SCHEMA_VERSION, "metadata database schema migrated");
            }
            Ok::<_, MetaError>(())
        })?;
        Ok(PgStore { pool, stats: PgStats::default() })
    }

    /// The store's metrics handles (shared with the store: clones count together).
    pub fn stats(&self) -> PgStats {
        self.stats.clone()
    }

    /// The schema version stored in the database (this build's [`SCHEMA_VERSION`] once connected).
    pub fn schema_version(&self) -> Result<i32, MetaError> {
        off_runtime(|| schema::stored_version(&mut *self.pool.take()?))
    }

    /// One try of a write transaction: `Ok(None)` when it must be retried (the reason in `last`).
    fn try_write<R, E: From<MetaError>>(
        conn: &mut Conn,
        f: &mut impl FnMut(&mut dyn MetaTxn) -> Result<R, E>,
        last: &mut String,
    ) -> Result<Option<R>, E> {
        let mut txn = PgTxn::new(conn, true, "BEGIN ISOLATION LEVEL SERIALIZABLE");
        let result = f(&mut txn);
        let r = match (txn.failed_yet(), result) {
            (false, Ok(r)) => r,
            (_, result) => {
                let failure = txn.into_failure();
                conn.rollback();
                return match (failure.map(|f| f.retry(last)), result) {
                    // The server aborted the transaction at that statement (a BEGIN or a change sent with a later
                    // statement included): nothing is applied, whatever `f` did next.
                    (Some(Ok(())), _) => Ok(None),
                    (Some(Err(_)) | None, Err(e)) => Err(e),
                    (Some(Err(store)), Ok(_)) => Err(store.into()),
                    (None, Ok(_)) => unreachable!("only a failed statement or an error gets here"),
                };
            }
        };
        match txn.commit() {
            Ok(()) => Ok(Some(r)),
            Err(failure) => failure.retry(last).map(|()| None).map_err(E::from),
        }
    }
}

impl Failure {
    /// `Ok` for a serialization failure or deadlock (worth another try; its message into `last`), else the error.
    fn retry(self, last: &mut String) -> Result<(), MetaError> {
        match self {
            Failure::Retry(msg) => {
                *last = msg;
                Ok(())
            }
            Failure::Fatal(e) => Err(e),
        }
    }

    fn into_error(self) -> MetaError {
        match self {
            Failure::Retry(msg) => MetaError::Conflict(msg),
            Failure::Fatal(e) => e,
        }
    }
}

impl MetaStore for PgStore {
    fn shared(&self) -> bool {
        true
    }

    fn write<R, E: From<MetaError>>(&self, mut f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        off_runtime(|| {
            let mut conn = self.pool.take()?;
            let mut last = String::new();
            // A connection lost before COMMIT (a database failing over: connections to a server on its way down)
            // is not a conflict: those tries count against the failover time, not against WRITE_TRIES.
            let lost_until = std::time::Instant::now() + Duration::from_millis(self.pool.failover_ms());
            let mut try_no = 0;
            while try_no < WRITE_TRIES {
                let lost = conn.is_closed();
                if try_no > 0 || lost {
                    std::thread::sleep(backoff(if lost { BACKOFF_SHIFT_MAX } else { try_no }));
                }
                if lost {
                    drop(conn);
                    conn = self.pool.take()?;
                }
                if let Some(r) = PgStore::try_write(&mut conn, &mut f, &mut last)? {
                    return Ok(r);
                }
                self.stats.retries.inc();
                if !(conn.is_closed() && std::time::Instant::now() < lost_until) {
                    try_no += 1;
                }
                tracing::debug!(try_no, "metadata transaction conflicted or lost its connection; retrying: {last}");
            }
            self.stats.gave_up.inc();
            Err(MetaError::Conflict(format!("gave up after {WRITE_TRIES} tries; last: {last}")).into())
        })
    }

    fn read<R, E: From<MetaError>>(&self, mut f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        off_runtime(|| {
            const BEGIN_READ: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";
            // A connection lost before or during the read (a database failing over) is replaced and the read run
            // again, for as long as a write would wait for the database.
            let lost_until = std::time::Instant::now() + Duration::from_millis(self.pool.failover_ms());
            let may_retry = |conn: &pool::Lease<'_>| conn.is_closed() && std::time::Instant::now() < lost_until;
            let mut conn = self.pool.take()?;
            loop {
                if conn.is_closed() {
                    drop(conn);
                    std::thread::sleep(backoff(BACKOFF_SHIFT_MAX));
                    conn = self.pool.take()?;
                }
                let mut txn = PgTxn::new(&mut conn, false, BEGIN_READ);
                let result = f(&mut txn);
                let failed = txn.into_failure();
                // A read changed nothing: its end is not waited for.
                conn.end_read();
                match (failed, result) {
                    (Some(_), _) if may_retry(&conn) => continue,
                    (Some(failure), Ok(_)) => return Err(failure.into_error().into()),
                    (_, result) => return result,
                }
            }
        })
    }
}

/// Whether a database error is worth running the transaction again: a serialization failure or a deadlock.
fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(e.code(), Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED)
}

/// Whether an error ended the connection: the client saw it close, or the server sent a fatal error (an
/// administrator's termination, a shutdown: SQLSTATE class 57) or a connection exception (class 08).
fn is_connection_lost(e: &tokio_postgres::Error) -> bool {
    e.is_closed()
        || e.as_db_error().is_some_and(|db| {
            let code = db.code().code();
            matches!(db.severity(), "FATAL" | "PANIC") || code.starts_with("57P") || code.starts_with("08")
        })
}

/// A database error with PostgreSQL's own message and SQLSTATE when it has them.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {} (SQLSTATE {})", db.severity(), db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// A random sleep of 0..=2^min(try_no, 6) ms.
fn backoff(try_no: u32) -> Duration {
    let ceiling_ms = 1u64 << try_no.min(BACKOFF_SHIFT_MAX);
    // RandomState is keyed randomly per instance: a cheap random number without a dependency.
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    Duration::from_millis(random % (ceiling_ms + 1))
}

/// Runs `f`, which waits for the database, so that it is safe on any thread: on a multi-thread tokio runtime's
/// worker inside `block_in_place` (the worker's queued tasks move to another thread meanwhile); elsewhere (the
/// blocking pool, plain threads, a current-thread runtime, which `block_in_place` refuses) as is: [`block_on`]
/// never enters a runtime, so it cannot panic there, it only blocks the thread.
fn off_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Wakes the thread that polls in [`block_on`].
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `fut` to completion on this thread, parking between wake-ups. For tokio-postgres's client futures, which
/// need no runtime: they exchange messages with the connection task on the store's own runtime.
fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests;
