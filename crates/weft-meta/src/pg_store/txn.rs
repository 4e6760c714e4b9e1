//! [`MetaTxn`] over one PostgreSQL transaction: one prepared statement per operation, values in the §6 and §18
//! record formats (docs/format.md §26 maps each table).
//!
//! The first database error of a transaction is remembered ([`PgTxn::into_failure`]): PostgreSQL has aborted the
//! transaction at that point, so the store never commits it, whatever the closure made of the error, and retries
//! it when the error was a serialization failure or a deadlock.

use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, ToSql};
use weft_proto::msg::StaleRange;
use weft_proto::{FileKind, Layout};

use super::pool::{Begin, Conn, Deferred, Failure, Last};
use crate::error::MetaError;
use crate::stale;
use crate::store::{
    Counters, Inode, MetaTxn, decode_inode, decode_orphan, encode_inode, encode_orphan, kind_from_u8, kind_to_u8,
};

/// One transaction. Its `BEGIN` waits for its first statement and its changes for its next read or its `COMMIT`,
/// each group sent as one pipeline ([`Conn::pipeline`]), and the reads a create announces go in one statement
/// ([`MetaTxn::prefetch_create`]): a create's transaction costs 3 round trips to the database (its directory's
/// lock, its once record, `BEGIN` and its reads; its changes; `COMMIT` and the lock's release) where its 10
/// statements one by one cost 10. A read sees the transaction's earlier changes, since they precede it on the
/// connection.
pub(super) struct PgTxn<'c> {
    conn: &'c mut Conn,
    writable: bool,
    /// The `BEGIN` not yet sent; `None` once it was.
    begin: Option<&'static str>,
    /// The directories whose advisory locks go ahead of the `BEGIN` ([`MetaTxn::serialize_dirs`]), sorted, so
    /// that two changes of the same two directories take them in one order.
    dirs: Vec<i64>,
    deferred: Vec<Deferred>,
    failure: Option<Failure>,
    /// What [`MetaTxn::prefetch_entry`] fetched, answered from here until the transaction's next change.
    prefetched: Prefetched,
    /// The inode number [`MetaTxn::prefetch_create`] took, for the next [`MetaTxn::next_ino`].
    taken_ino: Option<u64>,
    /// The xattr [`MetaTxn::read_xattr_apart`] asked for, and once the first pipeline went, its value.
    apart: Option<(EntryKey, Option<Option<Vec<u8>>>)>,
}

/// A directory entry's key: (directory, name).
type EntryKey = (u64, String);

/// Rows read ahead in this transaction's snapshot, keyed as their tables are; `None`: no such row.
#[derive(Default)]
struct Prefetched {
    inodes: Vec<(u64, Option<Inode>)>,
    dirents: Vec<(EntryKey, Option<(u64, FileKind)>)>,
    /// Keyed (inode, name).
    xattrs: Vec<(EntryKey, Option<Vec<u8>>)>,
    servers: Option<Vec<(u32, String)>>,
}

impl Prefetched {
    fn inode(&self, ino: u64) -> Option<Option<Inode>> {
        self.inodes.iter().find(|(i, _)| *i == ino).map(|(_, v)| v.clone())
    }

    fn dirent(&self, parent: u64, name: &str) -> Option<Option<(u64, FileKind)>> {
        self.dirents.iter().find(|((p, n), _)| *p == parent && n == name).map(|(_, v)| *v)
    }

    fn xattr(&self, ino: u64, name: &str) -> Option<Option<Vec<u8>>> {
        self.xattrs.iter().find(|((i, n), _)| *i == ino && n == name).map(|(_, v)| v.clone())
    }

    fn clear(&mut self) {
        self.inodes.clear();
        self.dirents.clear();
        self.xattrs.clear();
        self.servers = None;
    }
}

impl<'c> PgTxn<'c> {
    /// A transaction that `begin` starts on the server with its first statement.
    pub(super) fn new(conn: &'c mut Conn, writable: bool, begin: &'static str) -> Self {
        let prefetched = Prefetched::default();
        let (dirs, deferred) = (Vec::new(), Vec::new());
        let (failure, taken_ino, apart) = (None, None, None);
        PgTxn { conn, writable, begin: Some(begin), dirs, deferred, failure, prefetched, taken_ino, apart }
    }

    /// Keeps a [`GET_ENTRY`] row's first four columns: the directory, its entry `name` and the entry's inode.
    fn keep_entry(&mut self, row: &Row, parent: u64, name: &str) -> Result<(), MetaError> {
        let dir = col::<Option<&[u8]>>(row, 0)?.map(|r| checked_inode(parent, r)).transpose()?;
        let entry = match col::<Option<i64>>(row, 1)? {
            None => None,
            Some(ino) => Some((unsigned(ino, "entry's inode")?, kind_from_u8(small(col(row, 2)?, "kind")?)?)),
        };
        if let Some((ino, _)) = entry {
            let inode = col::<Option<&[u8]>>(row, 3)?.map(|r| checked_inode(ino, r)).transpose()?;
            self.prefetched.inodes.push((ino, inode));
        }
        self.prefetched.inodes.push((parent, dir));
        self.prefetched.dirents.push(((parent, name.to_owned()), entry));
        Ok(())
    }

    /// The value [`MetaTxn::read_xattr_apart`] read for (`ino`, `name`), once its pipeline went.
    fn apart_value(&self, ino: u64, name: &str) -> Option<Option<Vec<u8>>> {
        match &self.apart {
            Some(((i, n), Some(value))) if *i == ino && n == name => Some(value.clone()),
            _ => None,
        }
    }

    /// The first statement failure, if any: the transaction is then aborted on the server.
    pub(super) fn into_failure(self) -> Option<Failure> {
        self.failure
    }

    /// Whether a statement failed (the transaction is then aborted on the server).
    pub(super) fn failed_yet(&self) -> bool {
        self.failure.is_some()
    }

    /// Sends the deferred changes and commits (nothing at all when no statement was issued).
    pub(super) fn commit(self) -> Result<(), Failure> {
        assert!(self.failure.is_none(), "a transaction with a failed statement is never committed");
        let begin = self.begin.map(|sql| Begin { sql, dirs: &self.dirs, apart: None });
        self.conn.commit_with(begin, self.deferred)
    }

    /// Remembers the transaction's first failure and turns it into the error the store's caller sees.
    fn failed(&mut self, e: tokio_postgres::Error) -> MetaError {
        self.record(Failure::of(e))
    }

    /// Remembers `failure` as the transaction's (it is never committed) and turns it into the caller's error.
    fn record(&mut self, failure: Failure) -> MetaError {
        let err = match &failure {
            Failure::Retry(msg) => MetaError::Conflict(msg.clone()),
            Failure::Fatal(e) => MetaError::Store(e.to_string()),
        };
        self.failure = Some(failure);
        err
    }

    fn refuse_after_failure(&self) -> Result<(), MetaError> {
        match self.failure {
            Some(_) => Err(MetaError::Store("statement after a failed one in the same transaction".into())),
            None => Ok(()),
        }
    }

    fn query(&mut self, sql: &'static str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, MetaError> {
        self.refuse_after_failure()?;
        let deferred = std::mem::take(&mut self.deferred);
        let begin = match self.begin.take() {
            None => None,
            Some(sql) => {
                let apart = match &self.apart {
                    Some(((ino, name), None)) => {
                        let k = key(*ino).unwrap_or(-1);
                        Some(self.conn.defer(GET_XATTR, &[&k, &name.as_bytes()]).map_err(|f| self.record(f))?)
                    }
                    _ => None,
                };
                Some(Begin { sql, dirs: &self.dirs, apart })
            }
        };
        let r = self.conn.pipeline(begin, deferred, Last::Rows(sql, params));
        let (rows, apart_rows) = r.map_err(|e| self.failed(e))?;
        if let (Some(rows), Some((_, value))) = (apart_rows, &mut self.apart) {
            *value = Some(rows.first().map(|r| col::<Vec<u8>>(r, 0)).transpose()?);
        }
        Ok(rows)
    }

    /// A statement that changes the database, sent with the next read or the commit: refused in a read
    /// transaction, as other stores do.
    fn change(&mut self, sql: &'static str, params: &[&(dyn ToSql + Sync)]) -> Result<(), MetaError> {
        if !self.writable {
            return Err(MetaError::ReadOnly);
        }
        self.refuse_after_failure()?;
        // Whatever the change touches, nothing read ahead is answered after it.
        self.prefetched.clear();
        let d = self.conn.defer(sql, params).map_err(|f| self.record(f))?;
        self.deferred.push(d);
        Ok(())
    }

    fn next_val(&mut self, sql: &'static str) -> Result<u64, MetaError> {
        if !self.writable {
            return Err(MetaError::ReadOnly);
        }
        let rows = self.query(sql, &[])?;
        let row = rows.first().ok_or_else(|| MetaError::Store("nextval returned no row".into()))?;
        unsigned(col(row, 0)?, "sequence value")
    }

    fn count(&mut self, sql: &'static str) -> Result<u64, MetaError> {
        let rows = self.query(sql, &[])?;
        let row = rows.first().ok_or_else(|| MetaError::Store("count returned no row".into()))?;
        unsigned(col(row, 0)?, "count")
    }
}

fn col<'r, T: FromSql<'r>>(row: &'r Row, i: usize) -> Result<T, MetaError> {
    row.try_get(i).map_err(|e| MetaError::Corrupt(format!("column {i}: {e}")))
}

/// A stored `bigint` that holds a `u64` or `u32` (ids, numbers): never negative.
fn unsigned<T: TryFrom<i64>>(v: i64, what: &str) -> Result<T, MetaError> {
    T::try_from(v).map_err(|_| MetaError::Corrupt(format!("{what} {v} out of range")))
}

fn small(v: i16, what: &str) -> Result<u8, MetaError> {
    u8::try_from(v).map_err(|_| MetaError::Corrupt(format!("{what} {v} out of range")))
}

/// A `u64` as a key: `None` above 2^63 − 1, which no row can have.
fn key(v: u64) -> Option<i64> {
    i64::try_from(v).ok()
}

/// A `u64` to store: refused above 2^63 − 1 (docs/format.md §26).
fn stored(v: u64, what: &str) -> Result<i64, MetaError> {
    key(v).ok_or_else(|| MetaError::Store(format!("{what} {v} is above 2^63 - 1, which PostgreSQL cannot store")))
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn inode_of(row: &Row) -> Result<Inode, MetaError> {
    checked_inode(unsigned(col(row, 0)?, "inode number")?, col(row, 1)?)
}

/// The record stored under inode number `ino`, which must say it is that inode.
fn checked_inode(ino: u64, record: &[u8]) -> Result<Inode, MetaError> {
    let inode = decode_inode(&format!("inode {ino}"), record)?;
    if inode.ino != ino {
        return Err(MetaError::Corrupt(format!("inode record {ino} says it is inode {}", inode.ino)));
    }
    Ok(inode)
}

fn dirent_of(row: &Row) -> Result<(String, u64, FileKind), MetaError> {
    let name = String::from_utf8(col(row, 0)?).map_err(|_| MetaError::Corrupt("a name is not UTF-8".into()))?;
    Ok((name, unsigned(col(row, 1)?, "entry's inode")?, kind_from_u8(small(col(row, 2)?, "kind")?)?))
}

fn stale_of(row: &Row) -> Result<(u64, u32, Vec<StaleRange>), MetaError> {
    let ino: u64 = unsigned(col(row, 0)?, "stale entry's inode")?;
    let slot: u32 = unsigned(col(row, 1)?, "stale entry's slot")?;
    Ok((ino, slot, stale::decode(&format!("stale entry {ino}/{slot}"), col(row, 2)?)?))
}

const GET_INODE: &str = "SELECT ino, record FROM weft_inodes WHERE ino = $1";
/// A directory's inode, its entry of a name and that entry's inode, in one row whatever exists (NULLs for what
/// does not).
const GET_ENTRY: &str = "SELECT (SELECT record FROM weft_inodes WHERE ino = $1), d.ino, d.kind, \
                         (SELECT record FROM weft_inodes WHERE ino = d.ino) \
                         FROM (SELECT 1) AS one LEFT JOIN weft_dirents d ON d.parent = $1 AND d.name = $2";
/// [`GET_ENTRY`], then the directory's xattr `$3`, the servers (ids and addresses in id order) and a new inode
/// number.
const GET_CREATE: &str = "SELECT (SELECT record FROM weft_inodes WHERE ino = $1), d.ino, d.kind, \
                          (SELECT record FROM weft_inodes WHERE ino = d.ino), \
                          (SELECT value FROM weft_xattrs WHERE ino = $1 AND name = $3), \
                          ARRAY(SELECT id FROM weft_servers ORDER BY id), \
                          ARRAY(SELECT addr FROM weft_servers ORDER BY id), nextval('weft_ino_seq') \
                          FROM (SELECT 1) AS one LEFT JOIN weft_dirents d ON d.parent = $1 AND d.name = $2";
const PUT_INODE: &str = "INSERT INTO weft_inodes (ino, record) VALUES ($1, $2) \
                         ON CONFLICT (ino) DO UPDATE SET record = EXCLUDED.record";
const DEL_INODE: &str = "DELETE FROM weft_inodes WHERE ino = $1";
const LIST_INODES: &str = "SELECT ino, record FROM weft_inodes WHERE ino > $1 ORDER BY ino LIMIT $2";
const COUNT_INODES: &str = "SELECT count(*) FROM weft_inodes";
const NEXT_INO: &str = "SELECT nextval('weft_ino_seq')";
const GET_DIRENT: &str = "SELECT name, ino, kind FROM weft_dirents WHERE parent = $1 AND name = $2";
const PUT_DIRENT: &str = "INSERT INTO weft_dirents (parent, name, ino, kind) VALUES ($1, $2, $3, $4) \
                          ON CONFLICT (parent, name) DO UPDATE SET ino = EXCLUDED.ino, kind = EXCLUDED.kind";
const DEL_DIRENT: &str = "DELETE FROM weft_dirents WHERE parent = $1 AND name = $2";
const LIST_DIRENTS: &str =
    "SELECT name, ino, kind FROM weft_dirents WHERE parent = $1 AND name > $2 ORDER BY name LIMIT $3";
const PUT_SERVER: &str = "INSERT INTO weft_servers (id, addr) VALUES ($1, $2) \
                          ON CONFLICT (id) DO UPDATE SET addr = EXCLUDED.addr";
const LIST_SERVERS: &str = "SELECT id, addr FROM weft_servers ORDER BY id";
const GET_SERVER: &str = "SELECT addr FROM weft_servers WHERE id = $1";
const PUT_PHASE: &str = "INSERT INTO weft_server_phases (id, phase) VALUES ($1, $2) \
                         ON CONFLICT (id) DO UPDATE SET phase = EXCLUDED.phase";
const LIST_PHASES: &str = "SELECT id, phase FROM weft_server_phases ORDER BY id";
const PUT_ORPHAN: &str = "INSERT INTO weft_orphans (ino, record) VALUES ($1, $2) \
                          ON CONFLICT (ino) DO UPDATE SET record = EXCLUDED.record";
const DEL_ORPHAN: &str = "DELETE FROM weft_orphans WHERE ino = $1";
const LIST_ORPHANS: &str = "SELECT ino, record FROM weft_orphans ORDER BY ino LIMIT $1";
const GET_XATTR: &str = "SELECT value FROM weft_xattrs WHERE ino = $1 AND name = $2";
const PUT_XATTR: &str = "INSERT INTO weft_xattrs (ino, name, value) VALUES ($1, $2, $3) \
                         ON CONFLICT (ino, name) DO UPDATE SET value = EXCLUDED.value";
const DEL_XATTR: &str = "DELETE FROM weft_xattrs WHERE ino = $1 AND name = $2";
const LIST_XATTRS: &str = "SELECT name, octet_length(value) FROM weft_xattrs WHERE ino = $1 ORDER BY name";
const GET_STALE: &str = "SELECT ino, slot, record FROM weft_stale WHERE ino = $1 AND slot = $2";
const PUT_STALE: &str = "INSERT INTO weft_stale (ino, slot, record) VALUES ($1, $2, $3) \
                         ON CONFLICT (ino, slot) DO UPDATE SET record = EXCLUDED.record";
const DEL_STALE: &str = "DELETE FROM weft_stale WHERE ino = $1 AND slot = $2";
const LIST_STALE_ALL: &str = "SELECT ino, slot, record FROM weft_stale ORDER BY ino, slot LIMIT $1";
const LIST_STALE_AFTER: &str =
    "SELECT ino, slot, record FROM weft_stale WHERE (ino, slot) > ($1, $2) ORDER BY ino, slot LIMIT $3";
const COUNT_STALE: &str = "SELECT count(*) FROM weft_stale";
const NEXT_STALE_SEQ: &str = "SELECT nextval('weft_stale_seq')";
/// A sequence's last value handed out: one below its start while nothing was (`is_called` false).
const COUNTERS: &str = "SELECT (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM weft_ino_seq), \
                        (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM weft_stale_seq)";
const RAISE_INO: &str = "SELECT setval('weft_ino_seq', $1) FROM weft_ino_seq \
                         WHERE $1 > CASE WHEN is_called THEN last_value ELSE last_value - 1 END";
const RAISE_STALE_SEQ: &str = "SELECT setval('weft_stale_seq', $1) FROM weft_stale_seq \
                               WHERE $1 > CASE WHEN is_called THEN last_value ELSE last_value - 1 END";

impl MetaTxn for PgTxn<'_> {
    /// Effective only before the transaction's first statement (the locks must precede its snapshot), and only
    /// in a write.
    fn serialize_dirs(&mut self, dirs: &[u64]) {
        if self.writable && self.begin.is_some() {
            self.dirs.extend(dirs.iter().filter_map(|&d| key(d)));
            self.dirs.sort_unstable();
            self.dirs.dedup();
        }
    }

    fn prefetch_entry(&mut self, parent: u64, name: &str) -> Result<(), MetaError> {
        let Some(p) = key(parent) else { return Ok(()) };
        let rows = self.query(GET_ENTRY, &[&p, &name.as_bytes()])?;
        let row = rows.first().ok_or_else(|| MetaError::Store("the entry query returned no row".into()))?;
        self.keep_entry(row, parent, name)
    }

    /// Only in a write (a read-only transaction takes no sequence number).
    fn prefetch_create(&mut self, parent: u64, name: &str, xattr: &str) -> Result<(), MetaError> {
        let Some(p) = key(parent) else { return Ok(()) };
        if !self.writable {
            return self.prefetch_entry(parent, name);
        }
        let rows = self.query(GET_CREATE, &[&p, &name.as_bytes(), &xattr.as_bytes()])?;
        let row = rows.first().ok_or_else(|| MetaError::Store("the create query returned no row".into()))?;
        self.keep_entry(row, parent, name)?;
        let value: Option<Vec<u8>> = col(row, 4)?;
        let (ids, addrs): (Vec<i64>, Vec<String>) = (col(row, 5)?, col(row, 6)?);
        if ids.len() != addrs.len() {
            return Err(MetaError::Corrupt("the servers' ids and addresses differ in number".into()));
        }
        let servers = ids.into_iter().zip(addrs).map(|(id, addr)| Ok((unsigned(id, "server id")?, addr)));
        self.prefetched.servers = Some(servers.collect::<Result<_, MetaError>>()?);
        self.prefetched.xattrs.push(((parent, xattr.to_owned()), value));
        self.taken_ino = Some(unsigned(col(row, 7)?, "sequence value")?);
        Ok(())
    }

    fn read_xattr_apart(&mut self, ino: u64, name: &str) {
        if self.begin.is_some() {
            self.apart = Some(((ino, name.to_owned()), None));
        }
    }

    fn xattr_apart(&mut self, ino: u64, name: &str) -> Result<Option<Vec<u8>>, MetaError> {
        if let Some(value) = self.apart_value(ino, name) {
            return Ok(value);
        }
        let in_txn = self.get_xattr(ino, name)?;
        // With nothing sent before it, that read carried the read apart: its answer is the one asked for.
        Ok(self.apart_value(ino, name).unwrap_or(in_txn))
    }

    fn get_inode(&mut self, ino: u64) -> Result<Option<Inode>, MetaError> {
        if let Some(inode) = self.prefetched.inode(ino) {
            return Ok(inode);
        }
        let Some(k) = key(ino) else { return Ok(None) };
        self.query(GET_INODE, &[&k])?.first().map(inode_of).transpose()
    }

    fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError> {
        let k = stored(inode.ino, "inode number")?;
        self.change(PUT_INODE, &[&k, &encode_inode(inode)?])
    }

    fn del_inode(&mut self, ino: u64) -> Result<(), MetaError> {
        let k = key(ino).unwrap_or(-1);
        self.change(DEL_INODE, &[&k])
    }

    fn get_dirent(&mut self, parent: u64, name: &str) -> Result<Option<(u64, FileKind)>, MetaError> {
        if let Some(entry) = self.prefetched.dirent(parent, name) {
            return Ok(entry);
        }
        let Some(p) = key(parent) else { return Ok(None) };
        let rows = self.query(GET_DIRENT, &[&p, &name.as_bytes()])?;
        rows.first().map(dirent_of).transpose().map(|d| d.map(|(_, ino, kind)| (ino, kind)))
    }

    fn put_dirent(&mut self, parent: u64, name: &str, ino: u64, kind: FileKind) -> Result<(), MetaError> {
        let (p, i) = (stored(parent, "directory")?, stored(ino, "inode number")?);
        self.change(PUT_DIRENT, &[&p, &name.as_bytes(), &i, &i16::from(kind_to_u8(kind))])
    }

    fn del_dirent(&mut self, parent: u64, name: &str) -> Result<(), MetaError> {
        let p = key(parent).unwrap_or(-1);
        self.change(DEL_DIRENT, &[&p, &name.as_bytes()])
    }

    fn list_dirents(
        &mut self,
        parent: u64,
        after: &str,
        limit_entries: usize,
    ) -> Result<Vec<(String, u64, FileKind)>, MetaError> {
        let Some(p) = key(parent) else { return Ok(Vec::new()) };
        self.query(LIST_DIRENTS, &[&p, &after.as_bytes(), &limit(limit_entries)])?.iter().map(dirent_of).collect()
    }

    fn dir_is_empty(&mut self, parent: u64) -> Result<bool, MetaError> {
        Ok(self.list_dirents(parent, "", 1)?.is_empty())
    }

    fn next_ino(&mut self) -> Result<u64, MetaError> {
        match self.taken_ino.take() {
            Some(ino) => Ok(ino),
            None => self.next_val(NEXT_INO),
        }
    }

    fn put_server(&mut self, id: u32, addr: &str) -> Result<(), MetaError> {
        self.change(PUT_SERVER, &[&i64::from(id), &addr])
    }

    fn list_servers(&mut self) -> Result<Vec<(u32, String)>, MetaError> {
        if let Some(servers) = &self.prefetched.servers {
            return Ok(servers.clone());
        }
        let rows = self.query(LIST_SERVERS, &[])?;
        rows.iter().map(|r| Ok((unsigned(col(r, 0)?, "server id")?, col(r, 1)?))).collect()
    }

    fn get_server(&mut self, id: u32) -> Result<Option<String>, MetaError> {
        if let Some(servers) = &self.prefetched.servers {
            return Ok(servers.iter().find(|(i, _)| *i == id).map(|(_, addr)| addr.clone()));
        }
        let rows = self.query(GET_SERVER, &[&i64::from(id)])?;
        rows.first().map(|r| col(r, 0)).transpose()
    }

    fn put_server_phase(&mut self, id: u32, phase: u8) -> Result<(), MetaError> {
        self.change(PUT_PHASE, &[&i64::from(id), &i16::from(phase)])
    }

    fn list_server_phases(&mut self) -> Result<Vec<(u32, u8)>, MetaError> {
        let rows = self.query(LIST_PHASES, &[])?;
        rows.iter().map(|r| Ok((unsigned(col(r, 0)?, "server id")?, small(col(r, 1)?, "phase")?))).collect()
    }

    fn put_orphan(&mut self, ino: u64, layout: &Layout) -> Result<(), MetaError> {
        let k = stored(ino, "orphan's inode")?;
        self.change(PUT_ORPHAN, &[&k, &encode_orphan(layout)?])
    }

    fn del_orphan(&mut self, ino: u64) -> Result<(), MetaError> {
        let k = key(ino).unwrap_or(-1);
        self.change(DEL_ORPHAN, &[&k])
    }

    fn list_orphans(&mut self, limit_orphans: usize) -> Result<Vec<(u64, Layout)>, MetaError> {
        let rows = self.query(LIST_ORPHANS, &[&limit(limit_orphans)])?;
        rows.iter()
            .map(|r| {
                let ino: u64 = unsigned(col(r, 0)?, "orphan's inode")?;
                Ok((ino, decode_orphan(&format!("orphan {ino}"), col(r, 1)?)?))
            })
            .collect()
    }

    fn count_inodes(&mut self) -> Result<u64, MetaError> {
        self.count(COUNT_INODES)
    }

    fn list_inodes(&mut self, after: u64, limit_inodes: usize) -> Result<Vec<Inode>, MetaError> {
        let Some(a) = key(after) else { return Ok(Vec::new()) };
        self.query(LIST_INODES, &[&a, &limit(limit_inodes)])?.iter().map(inode_of).collect()
    }

    fn get_xattr(&mut self, ino: u64, name: &str) -> Result<Option<Vec<u8>>, MetaError> {
        if let Some(value) = self.prefetched.xattr(ino, name) {
            return Ok(value);
        }
        let Some(k) = key(ino) else { return Ok(None) };
        self.query(GET_XATTR, &[&k, &name.as_bytes()])?.first().map(|r| col(r, 0)).transpose()
    }

    fn put_xattr(&mut self, ino: u64, name: &str, value: &[u8]) -> Result<(), MetaError> {
        let k = stored(ino, "inode number")?;
        self.change(PUT_XATTR, &[&k, &name.as_bytes(), &value])
    }

    fn del_xattr(&mut self, ino: u64, name: &str) -> Result<(), MetaError> {
        let k = key(ino).unwrap_or(-1);
        self.change(DEL_XATTR, &[&k, &name.as_bytes()])
    }

    fn list_xattrs(&mut self, ino: u64) -> Result<Vec<(String, usize)>, MetaError> {
        let Some(k) = key(ino) else { return Ok(Vec::new()) };
        let rows = self.query(LIST_XATTRS, &[&k])?;
        rows.iter()
            .map(|r| {
                let name = String::from_utf8(col(r, 0)?)
                    .map_err(|_| MetaError::Corrupt("an xattr name is not UTF-8".into()))?;
                let len: i32 = col(r, 1)?;
                Ok((name, unsigned(i64::from(len), "xattr length")?))
            })
            .collect()
    }

    fn get_stale(&mut self, ino: u64, slot: u32) -> Result<Option<Vec<StaleRange>>, MetaError> {
        let Some(k) = key(ino) else { return Ok(None) };
        self.query(GET_STALE, &[&k, &i64::from(slot)])?.first().map(|r| Ok(stale_of(r)?.2)).transpose()
    }

    fn put_stale(&mut self, ino: u64, slot: u32, ranges: &[StaleRange]) -> Result<(), MetaError> {
        let k = stored(ino, "inode number")?;
        self.change(PUT_STALE, &[&k, &i64::from(slot), &stale::encode(ranges)?])
    }

    fn del_stale(&mut self, ino: u64, slot: u32) -> Result<(), MetaError> {
        let k = key(ino).unwrap_or(-1);
        self.change(DEL_STALE, &[&k, &i64::from(slot)])
    }

    fn list_stale(
        &mut self,
        after: Option<(u64, u32)>,
        limit_entries: usize,
    ) -> Result<Vec<(u64, u32, Vec<StaleRange>)>, MetaError> {
        let n = limit(limit_entries);
        let rows = match after {
            None => self.query(LIST_STALE_ALL, &[&n])?,
            Some((ino, slot)) => {
                let Some(k) = key(ino) else { return Ok(Vec::new()) };
                self.query(LIST_STALE_AFTER, &[&k, &i64::from(slot), &n])?
            }
        };
        rows.iter().map(stale_of).collect()
    }

    fn count_stale(&mut self) -> Result<u64, MetaError> {
        self.count(COUNT_STALE)
    }

    fn next_stale_seq(&mut self) -> Result<u64, MetaError> {
        self.next_val(NEXT_STALE_SEQ)
    }

    fn counters(&mut self) -> Result<Counters, MetaError> {
        let rows = self.query(COUNTERS, &[])?;
        let row = rows.first().ok_or_else(|| MetaError::Store("the counters query returned no row".into()))?;
        Ok(Counters {
            last_ino: unsigned(col(row, 0)?, "last inode number")?,
            last_stale_seq: unsigned(col(row, 1)?, "last stale sequence number")?,
        })
    }

    fn raise_counters(&mut self, c: Counters) -> Result<(), MetaError> {
        // Sequences are not transactional: a retried transaction raises again, to the same value.
        self.change(RAISE_INO, &[&stored(c.last_ino, "inode number")?])?;
        self.change(RAISE_STALE_SEQ, &[&stored(c.last_stale_seq, "stale sequence number")?])
    }
}
