//! The connection pool of a [`super::PgStore`]: at most `max` connections, opened on demand, each driven by a task
//! on the pool's own one-thread runtime, kept with their prepared statements.

use std::collections::HashMap;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::task::Poll;

use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{Client, NoTls, Row, Statement};

use super::block_on;
use crate::error::MetaError;

/// Why a transaction's statement failed.
pub(super) enum Failure {
    /// A serialization failure or deadlock: run the transaction again.
    Retry(String),
    /// Anything else.
    Fatal(MetaError),
}

impl Failure {
    /// A failed `BEGIN` or statement: retried when it conflicted, or when the connection was lost (nothing of the
    /// transaction can have been applied before its `COMMIT`; the next try takes another connection).
    pub(super) fn of(e: tokio_postgres::Error) -> Failure {
        let msg = format!("PostgreSQL: {}", super::describe(&e));
        if super::is_retryable(&e) || super::is_connection_lost(&e) {
            Failure::Retry(msg)
        } else {
            Failure::Fatal(MetaError::Store(msg))
        }
    }
}

/// One connection and its prepared statements.
pub(super) struct Conn {
    client: Client,
    statements: HashMap<&'static str, Statement>,
    /// A transaction was begun and not yet ended: such a connection never goes back to the pool (a panic in the
    /// closure, a failed `ROLLBACK`), since its next `BEGIN` would run inside it.
    in_txn: bool,
    /// An error said the connection is gone (the client may notice a moment later): never reused.
    lost: bool,
    /// The session holds advisory locks of directories ([`Conn::pipeline`]'s `dirs`), released when its
    /// transaction ends.
    dirs_locked: bool,
}

/// Waits for a directory's session advisory lock (docs/format.md §26).
const LOCK_DIR: &str = "SELECT pg_advisory_lock($1)";
/// Releases every session advisory lock this session holds (the schema's migration lock is a transaction's).
const UNLOCK_DIRS: &str = "SELECT pg_advisory_unlock_all()";

/// A parameter already in PostgreSQL's binary format for its statement's type (`None`: NULL), so that a deferred
/// statement owns its parameters.
#[derive(Debug)]
struct Encoded(Option<bytes::Bytes>);

impl ToSql for Encoded {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match &self.0 {
            Some(b) => {
                out.extend_from_slice(b);
                Ok(IsNull::No)
            }
            None => Ok(IsNull::Yes),
        }
    }

    /// The type was checked when the parameter was encoded ([`Conn::defer`]).
    fn accepts(_ty: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// A change whose reply the transaction does not wait for: sent in one pipeline with the transaction's next
/// statement that returns rows, or ahead of its `COMMIT` (a transaction's writes cost no round trip of their own).
pub(super) struct Deferred {
    statement: Statement,
    params: Vec<Encoded>,
}

impl Deferred {
    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
    }
}

/// What a transaction's first pipeline sends ahead of its first statement ([`Conn::pipeline`]).
pub(super) struct Begin<'a> {
    /// The `BEGIN …`.
    pub(super) sql: &'static str,
    /// Directories whose advisory locks go first.
    pub(super) dirs: &'a [i64],
    /// A read outside the transaction, after the locks ([`crate::store::MetaTxn::read_xattr_apart`]).
    pub(super) apart: Option<Deferred>,
}

/// What a pipeline ends with.
pub(super) enum Last<'p> {
    /// A statement whose rows are wanted.
    Rows(&'static str, &'p [&'p (dyn ToSql + Sync)]),
    /// Nothing more: the changes are sent ahead of a `COMMIT` (which goes alone, see [`Conn::commit_with`]).
    Nothing,
}

type Reply<'a> = Pin<Box<dyn Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + 'a>>;

/// Polls every future once in order before waiting for any, then until all are done: tokio-postgres sends a
/// request at its future's first poll, so the requests leave in this order, in one pipeline on the connection.
async fn in_order(mut replies: Vec<Reply<'_>>) -> Vec<Result<Vec<Row>, tokio_postgres::Error>> {
    let mut out: Vec<Option<Result<Vec<Row>, tokio_postgres::Error>>> = replies.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (fut, slot) in replies.iter_mut().zip(out.iter_mut()) {
            if slot.is_none()
                && let Poll::Ready(r) = fut.as_mut().poll(cx)
            {
                *slot = Some(r);
            }
        }
        if out.iter().all(Option::is_some) { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    out.into_iter().map(|r| r.expect("every reply is in")).collect()
}

impl Conn {
    /// Runs `sql` (a `BEGIN …`).
    pub(super) fn begin(&mut self, sql: &str) -> Result<(), Failure> {
        let r = block_on(self.client.batch_execute(sql));
        self.note(r).map_err(Failure::of)?;
        self.in_txn = true;
        Ok(())
    }

    /// The prepared statement of `sql`, prepared on first use on this connection.
    fn statement(&mut self, sql: &'static str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = block_on(self.client.prepare(sql));
        let s = self.note(s)?;
        self.statements.insert(sql, s.clone());
        Ok(s)
    }

    /// `sql` with `params`, encoded now and sent later by [`Conn::pipeline`].
    pub(super) fn defer(&mut self, sql: &'static str, params: &[&(dyn ToSql + Sync)]) -> Result<Deferred, Failure> {
        let statement = self.statement(sql).map_err(Failure::of)?;
        assert_eq!(statement.params().len(), params.len(), "{sql}: one value per parameter");
        let mut encoded = Vec::with_capacity(params.len());
        for (p, ty) in params.iter().zip(statement.params()) {
            let mut buf = bytes::BytesMut::new();
            let value = match p.to_sql_checked(ty, &mut buf) {
                Ok(IsNull::No) => Some(buf.freeze()),
                Ok(IsNull::Yes) => None,
                Err(e) => {
                    let why = format!("{sql}: a value for a parameter of type {ty} did not encode: {e}");
                    return Err(Failure::Fatal(MetaError::Store(why)));
                }
            };
            encoded.push(Encoded(value));
        }
        Ok(Deferred { statement, params: encoded })
    }

    /// Sends, in one pipeline, `begin` (if the transaction has not begun on the server yet) preceded by the
    /// advisory locks of its `dirs` (outside the transaction, so that its snapshot follows the last holder's
    /// commit) and its `apart` read (a statement of its own, after the locks), the `deferred` changes in order,
    /// then `last`, and waits for every reply: one round trip. The answer is `last`'s rows and `apart`'s; the
    /// first error in order is the answer instead (PostgreSQL fails every later statement of the transaction with
    /// it).
    pub(super) fn pipeline(
        &mut self,
        begin: Option<Begin<'_>>,
        deferred: Vec<Deferred>,
        last: Last<'_>,
    ) -> Result<(Vec<Row>, Option<Vec<Row>>), tokio_postgres::Error> {
        let rows_of = match &last {
            Last::Rows(sql, _) => Some(self.statement(sql)?),
            Last::Nothing => None,
        };
        let dirs = begin.as_ref().map_or(&[][..], |b| b.dirs);
        let lock = if dirs.is_empty() { None } else { Some(self.statement(LOCK_DIR)?) };
        if begin.is_some() {
            self.in_txn = true;
            self.dirs_locked |= !dirs.is_empty();
        }
        let client = &self.client;
        let mut replies: Vec<Reply<'_>> = Vec::with_capacity(dirs.len() + deferred.len() + 3);
        for dir in dirs {
            let lock = lock.as_ref().expect("prepared above");
            replies.push(Box::pin(async move { client.execute(lock, &[dir]).await.map(|_| Vec::new()) }));
        }
        let apart = begin.as_ref().and_then(|b| b.apart.as_ref());
        if let Some(d) = apart {
            replies.push(Box::pin(async move { client.query(&d.statement, &d.params()).await }));
        }
        if let Some(b) = &begin {
            let sql = b.sql;
            replies.push(Box::pin(async move { client.batch_execute(sql).await.map(|()| Vec::new()) }));
        }
        for d in &deferred {
            replies.push(Box::pin(async move { client.execute(&d.statement, &d.params()).await.map(|_| Vec::new()) }));
        }
        if let (Last::Rows(_, params), Some(statement)) = (&last, &rows_of) {
            replies.push(Box::pin(async move { client.query(statement, params).await }));
        }
        let mut results = block_on(in_order(replies));
        let last_reply = match last {
            Last::Rows(..) => results.pop().expect("the last reply"),
            Last::Nothing => Ok(Vec::new()),
        };
        let (mut apart_rows, mut first_error) = (None, None);
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Err(e) => first_error = first_error.or(Some(e)),
                Ok(rows) if apart.is_some() && i == dirs.len() => apart_rows = Some(rows),
                Ok(_) => {}
            }
        }
        let r = match first_error {
            Some(e) => Err(e),
            None => last_reply.map(|rows| (rows, apart_rows)),
        };
        self.note(r)
    }

    /// Sends the `deferred` changes (and `begin`, when nothing of the transaction reached the server yet) in one
    /// pipeline, then commits. The `COMMIT` goes alone, after their replies: a connection lost before it is a
    /// failure to retry (nothing was applied), and only a `COMMIT` without a reply leaves the outcome unknown.
    /// (Sending it with the changes saves a round trip, but a connection the server had ended while it sat in the
    /// pool is then noticed only with the pipeline's replies, too late to tell the two apart.)
    pub(super) fn commit_with(&mut self, begin: Option<Begin<'_>>, deferred: Vec<Deferred>) -> Result<(), Failure> {
        if begin.is_some() && deferred.is_empty() {
            return Ok(()); // Nothing of the transaction reached the server: nothing to commit.
        }
        if !deferred.is_empty()
            && let Err(e) = self.pipeline(begin, deferred, Last::Nothing)
        {
            self.rollback();
            return Err(Failure::of(e));
        }
        self.commit()
    }

    /// Commits a transaction whose statements were all answered. An error means nothing was applied, or, when the
    /// connection died meanwhile, that the outcome is unknown.
    pub(super) fn commit(&mut self) -> Result<(), Failure> {
        let r = self.end("COMMIT");
        self.in_txn = r.is_err() && !self.is_closed();
        if self.in_txn {
            self.rollback();
        }
        r.map_err(|e| {
            if super::is_connection_lost(&e) {
                // Not retried: the COMMIT may have been applied before the connection went.
                Failure::Fatal(MetaError::CommitUnknown(format!("PostgreSQL connection lost at COMMIT: {e}")))
            } else {
                Failure::of(e)
            }
        })
    }

    /// The connection ended (the server closed it, or it broke): take another.
    pub(super) fn is_closed(&self) -> bool {
        self.lost || self.client.is_closed()
    }

    /// Remembers an error that ended the connection.
    fn note<T>(&mut self, r: Result<T, tokio_postgres::Error>) -> Result<T, tokio_postgres::Error> {
        if let Err(e) = &r {
            self.lost |= super::is_connection_lost(e);
        }
        r
    }

    /// Rolls back; a connection where that fails is dropped rather than reused.
    pub(super) fn rollback(&mut self) {
        if !self.in_txn {
            return; // Nothing of the transaction reached the server (its BEGIN waits for a first statement).
        }
        match self.end("ROLLBACK") {
            Ok(()) => self.in_txn = false,
            Err(e) => tracing::warn!("PostgreSQL ROLLBACK failed; dropping the connection: {}", super::describe(&e)),
        }
    }

    /// Ends a read-only transaction without waiting for the reply: its `ROLLBACK` leaves now and the connection's
    /// next statement queues behind it on the socket, so a point read costs one round trip, not two. Nothing
    /// depends on the reply: a read changed nothing, and a connection that fails meanwhile fails that next
    /// statement, which is retried as any statement on a lost connection is. A session holding directory locks
    /// ends as [`Conn::rollback`] does, since it may be pooled only once they are released.
    pub(super) fn end_read(&mut self) {
        if !self.in_txn || self.dirs_locked {
            return self.rollback();
        }
        let mut rollback = std::pin::pin!(self.client.batch_execute("ROLLBACK"));
        // tokio-postgres queues a request for its connection at the future's first poll; the connection reads and
        // drops the reply of a future dropped before it (a batch_execute is one request whatever happens).
        let polled = rollback.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        // Ready at once only when the request could not be queued: the connection is gone.
        self.lost |= matches!(polled, Poll::Ready(Err(_)));
        self.in_txn = false;
    }

    /// Ends the transaction with `sql` (`COMMIT` or `ROLLBACK`) and, in the same pipeline after it, releases
    /// the directories' advisory locks whatever its outcome (each a query of its own: one failing does not stop
    /// the other). The answer is the end's.
    fn end(&mut self, sql: &'static str) -> Result<(), tokio_postgres::Error> {
        let client = &self.client;
        let mut replies: Vec<Reply<'_>> =
            vec![Box::pin(async move { client.batch_execute(sql).await.map(|()| Vec::new()) })];
        if self.dirs_locked {
            replies.push(Box::pin(async move { client.batch_execute(UNLOCK_DIRS).await.map(|()| Vec::new()) }));
        }
        let mut results = block_on(in_order(replies)).into_iter();
        let ended = results.next().expect("the end's reply").map(drop);
        if let Some(unlocked) = results.next() {
            match self.note(unlocked) {
                Ok(_) => self.dirs_locked = false,
                // Kept set: a connection holding locks never goes back to the pool.
                Err(e) => tracing::warn!("releasing directory locks failed: {}", super::describe(&e)),
            }
        }
        self.note(ended)
    }

    /// Runs a statement, prepared once per connection.
    pub(super) fn query(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let statement = self.statement(sql)?;
        let r = block_on(self.client.query(&statement, params));
        self.note(r)
    }

    /// Runs statements without parameters (the schema's).
    pub(super) fn batch(&mut self, sql: &str) -> Result<(), tokio_postgres::Error> {
        let r = block_on(self.client.batch_execute(sql));
        self.note(r)
    }
}

struct State {
    idle: Vec<Conn>,
    /// Connections open, idle or lent.
    open: usize,
}

pub(super) struct Pool {
    cfg: tokio_postgres::Config,
    max: usize,
    /// How long a connect keeps trying once the pool has connected before (a database failing over).
    failover_ms: u64,
    /// Each session's `idle_in_transaction_session_timeout`.
    idle_in_txn_ms: u64,
    /// Whether any connect succeeded: before that, a failure is a configuration error, reported at once.
    connected_once: AtomicBool,
    state: Mutex<State>,
    freed: Condvar,
    /// Drives every connection's socket; `None` only while dropping.
    rt: Option<tokio::runtime::Runtime>,
}

impl Pool {
    /// How long work waits for the database to come back (`db_failover_timeout_ms`).
    pub(super) fn failover_ms(&self) -> u64 {
        self.failover_ms
    }

    pub(super) fn new(
        cfg: tokio_postgres::Config,
        max: usize,
        failover_ms: u64,
        idle_in_txn_ms: u64,
    ) -> Result<Pool, MetaError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weft-pg")
            .enable_all()
            .build()?;
        Ok(Pool {
            cfg,
            max,
            failover_ms,
            idle_in_txn_ms,
            connected_once: AtomicBool::new(false),
            state: Mutex::new(State { idle: Vec::new(), open: 0 }),
            freed: Condvar::new(),
            rt: Some(rt),
        })
    }

    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// An idle connection, a new one while fewer than `max` are open, else the next one returned.
    pub(super) fn take(&self) -> Result<Lease<'_>, MetaError> {
        let mut st = self.state.lock().map_err(|_| MetaError::Poisoned)?;
        loop {
            if let Some(conn) = st.idle.pop() {
                if conn.is_closed() {
                    st.open -= 1;
                    continue;
                }
                return Ok(Lease { pool: self, conn: Some(conn) });
            }
            if st.open < self.max {
                st.open += 1;
                drop(st);
                return match self.connect_waiting() {
                    Ok(conn) => Ok(Lease { pool: self, conn: Some(conn) }),
                    Err(e) => {
                        self.forget();
                        Err(e)
                    }
                };
            }
            st = self.freed.wait(st).map_err(|_| MetaError::Poisoned)?;
        }
    }

    fn forget(&self) {
        if let Ok(mut st) = self.state.lock() {
            st.open -= 1;
        }
        self.freed.notify_one();
    }

    /// [`Pool::connect`], and once the pool has connected before, again (backing off up to a second) until a
    /// writable server answers or `failover_ms` passed: with a standby promoted, a multi-host connection string
    /// with `target_session_attrs=read-write` reaches it (docs/format.md §26).
    fn connect_waiting(&self) -> Result<Conn, MetaError> {
        let began = std::time::Instant::now();
        let mut pause_ms = 20u64;
        let mut warned = false;
        loop {
            match self.connect() {
                Ok(conn) => {
                    if warned {
                        tracing::info!(waited_ms = began.elapsed().as_millis() as u64, "PostgreSQL answers again");
                    }
                    self.connected_once.store(true, Ordering::Relaxed);
                    return Ok(conn);
                }
                Err(e) if !self.connected_once.load(Ordering::Relaxed) => return Err(e),
                Err(e) if began.elapsed().as_millis() as u64 >= self.failover_ms => return Err(e),
                Err(e) => {
                    if !warned {
                        tracing::warn!(
                            db_failover_timeout_ms = self.failover_ms,
                            "no writable PostgreSQL server answers; waiting for one (failover): {e}"
                        );
                        warned = true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(pause_ms));
                    pause_ms = (pause_ms * 2).min(1000);
                }
            }
        }
    }

    fn connect(&self) -> Result<Conn, MetaError> {
        let rt = self.rt.as_ref().ok_or_else(|| MetaError::Store("PostgreSQL pool closed".into()))?;
        let cfg = self.cfg.clone();
        let task = rt.spawn(async move {
            let (client, connection) = cfg.connect(NoTls).await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!("PostgreSQL connection ended: {}", super::describe(&e));
                }
            });
            Ok::<_, tokio_postgres::Error>(client)
        });
        let client = block_on(task)
            .map_err(|e| MetaError::Store(format!("PostgreSQL connect task: {e}")))?
            .map_err(|e| MetaError::Store(format!("connecting to PostgreSQL: {}", super::describe(&e))))?;
        // The commit is the durability point (docs/format.md §26): never let a session default make it lossy.
        let setting = block_on(client.query_one("SHOW synchronous_commit", &[]))?;
        if setting.try_get::<_, &str>(0).is_ok_and(|v| v == "off") {
            block_on(client.batch_execute("SET synchronous_commit TO on"))?;
        }
        // A session stopped inside a transaction (its service paused or hung, its socket still open) would hold
        // its directory locks for ever: PostgreSQL ends it after this long, which releases them.
        let bound = format!("SET idle_in_transaction_session_timeout TO {}", self.idle_in_txn_ms);
        block_on(client.batch_execute(&bound))?;
        Ok(Conn { client, statements: HashMap::new(), in_txn: false, lost: false, dirs_locked: false })
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Ok(st) = self.state.get_mut() {
            st.idle.clear();
        }
        // Not `drop`: dropping a runtime blocks, which panics when the store is dropped on an async task.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A connection lent by the pool, given back on drop.
pub(super) struct Lease<'p> {
    pool: &'p Pool,
    conn: Option<Conn>,
}

impl Deref for Lease<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn.as_ref().expect("a lease holds its connection until dropped")
    }
}

impl DerefMut for Lease<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("a lease holds its connection until dropped")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if conn.in_txn || conn.dirs_locked || conn.is_closed() {
            self.pool.forget();
            return;
        }
        if let Ok(mut st) = self.pool.state.lock() {
            st.idle.push(conn);
        }
        self.pool.freed.notify_one();
    }
}
