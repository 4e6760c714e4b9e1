//! `RedbStore`: the embedded, crash-safe default [`MetaStore`], one file `meta.redb` in the service's directory.
//!
//! Why redb: a single-file, pure-Rust, copy-on-write B-tree with ACID transactions and no server to run (see
//! DESIGN.md §8). Writes use group commit (see [`RedbStore::write`] and `GroupCommit`): a transaction is acknowledged
//! only after a durable (`Durability::Immediate`) commit covers it, so an acknowledged op survives `kill -9` and
//! power loss, while concurrent transactions share one fsync.
//!
//! Tables (keys are fixed-width integers, or (integer, name) so one directory is one contiguous key range):
//! - `inodes`:   ino u64 → versioned postcard [`Inode`]
//! - `dirents`:  (parent u64, name str) → (ino u64, kind u8); redb orders tuples field by field and strings by
//!   bytes, so a range scan lists one directory in name order and readdir pages with an `after` cursor.
//! - `servers`:  data server id u32 → address
//! - `orphans`:  ino u64 → versioned postcard [`Layout`] of a removed file whose objects are still to be deleted
//! - `counters`: u32 → u64 (the last allocated inode number, the inode count)

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

use redb::{
    Database, Durability, ReadOnlyTable, ReadableDatabase, ReadableTable, Table, TableDefinition, WriteTransaction,
};
use weft_proto::{FileKind, Layout, ROOT_INO};

use crate::error::MetaError;
use crate::store::{
    Inode, MetaStore, MetaTxn, decode_inode, decode_record, encode_inode, encode_record, kind_from_u8, kind_to_u8,
};

const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
const DIRENTS: TableDefinition<(u64, &str), (u64, u8)> = TableDefinition::new("dirents");
const SERVERS: TableDefinition<u32, &str> = TableDefinition::new("servers");
const ORPHANS: TableDefinition<u64, &[u8]> = TableDefinition::new("orphans");
const COUNTERS: TableDefinition<u32, u64> = TableDefinition::new("counters");

const COUNTER_LAST_INO: u32 = 0;
const COUNTER_INODES: u32 = 1;

/// The store file's name inside the directory given to [`RedbStore::open`].
pub const STORE_FILE: &str = "meta.redb";

/// The embedded [`MetaStore`].
pub struct RedbStore {
    db: Database,
    path: PathBuf,
    group: GroupCommit,
}

/// Group commit: each write transaction commits without an fsync (`Durability::None`), then waits until a
/// durable commit covers it. Whoever finds no flush running runs one: an empty `Durability::Immediate` commit,
/// which makes every earlier non-durable commit durable (redb's documented contract). While one fsync runs, the
/// transactions that commit meanwhile queue up and share the next one, so N concurrent creates cost about one
/// fsync instead of N.
///
/// Trade-off: a mutation is visible to other readers from its in-memory commit, up to one fsync before it is
/// durable; it is acknowledged to its own client only once durable.
#[derive(Default)]
struct GroupCommit {
    state: Mutex<GroupState>,
    flushed: Condvar,
}

#[derive(Default)]
struct GroupState {
    /// Number of non-durable commits so far.
    committed: u64,
    /// Every commit numbered up to this is durable.
    durable: u64,
    flushing: bool,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore").field("path", &self.path).finish()
    }
}

impl RedbStore {
    /// Opens (creating if needed) `dir/meta.redb`. The directory is created if missing. Fails if another process
    /// (or another `RedbStore` in this one) has the file open.
    pub fn open(dir: impl AsRef<Path>) -> Result<RedbStore, MetaError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)?;
        let path = dir.join(STORE_FILE);
        let db = Database::create(&path)?;
        // Create every table once, so read transactions never meet a missing table.
        let mut wtx = db.begin_write()?;
        wtx.set_durability(Durability::Immediate)?;
        {
            wtx.open_table(INODES)?;
            wtx.open_table(DIRENTS)?;
            wtx.open_table(SERVERS)?;
            wtx.open_table(ORPHANS)?;
            wtx.open_table(COUNTERS)?;
        }
        wtx.commit()?;
        Ok(RedbStore { db, path, group: GroupCommit::default() })
    }

    /// Path of the store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Numbers a non-durable commit that just returned. A flush that starts after this covers it.
    fn note_commit(&self) -> u64 {
        let mut s = self.group.state.lock().expect("group commit state");
        s.committed += 1;
        s.committed
    }

    /// Returns once commit number `seq` is durable, running the flush itself if none is under way.
    fn wait_durable(&self, seq: u64) -> Result<(), MetaError> {
        let mut s = self.group.state.lock().expect("group commit state");
        loop {
            if s.durable >= seq {
                return Ok(());
            }
            if s.flushing {
                s = self.group.flushed.wait(s).expect("group commit state");
                continue;
            }
            s.flushing = true;
            let target = s.committed;
            drop(s);
            let result = self.flush();
            s = self.group.state.lock().expect("group commit state");
            s.flushing = false;
            if result.is_ok() {
                s.durable = s.durable.max(target);
            }
            self.group.flushed.notify_all();
            // On failure every waiter tries its own flush; a persistent disk error fails them all.
            result?;
        }
    }

    /// An empty durable commit: persists every non-durable commit before it.
    fn flush(&self) -> Result<(), MetaError> {
        let mut wtx = self.db.begin_write()?;
        wtx.set_durability(Durability::Immediate)?;
        wtx.commit()?;
        Ok(())
    }
}

impl MetaStore for RedbStore {
    fn write<R, E: From<MetaError>>(&self, f: impl FnOnce(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        let mut wtx = self.db.begin_write().map_err(MetaError::from)?;
        wtx.set_durability(Durability::None).map_err(MetaError::from)?;
        let result = {
            let mut txn = WriteTxn::open(&wtx)?;
            f(&mut txn)
        };
        match result {
            Ok(r) => {
                wtx.commit().map_err(MetaError::from)?;
                let seq = self.note_commit();
                self.wait_durable(seq)?;
                Ok(r)
            }
            Err(e) => {
                if let Err(abort) = wtx.abort() {
                    tracing::warn!("aborting a metadata transaction: {abort}");
                }
                Err(e)
            }
        }
    }

    fn read<R, E: From<MetaError>>(&self, f: impl FnOnce(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        let rtx = self.db.begin_read().map_err(MetaError::from)?;
        let mut txn = ReadTxn {
            inodes: rtx.open_table(INODES).map_err(MetaError::from)?,
            dirents: rtx.open_table(DIRENTS).map_err(MetaError::from)?,
            servers: rtx.open_table(SERVERS).map_err(MetaError::from)?,
            orphans: rtx.open_table(ORPHANS).map_err(MetaError::from)?,
            counters: rtx.open_table(COUNTERS).map_err(MetaError::from)?,
        };
        f(&mut txn)
    }
}

struct WriteTxn<'t> {
    inodes: Table<'t, u64, &'static [u8]>,
    dirents: Table<'t, (u64, &'static str), (u64, u8)>,
    servers: Table<'t, u32, &'static str>,
    orphans: Table<'t, u64, &'static [u8]>,
    counters: Table<'t, u32, u64>,
}

impl<'t> WriteTxn<'t> {
    fn open(wtx: &'t WriteTransaction) -> Result<Self, MetaError> {
        Ok(WriteTxn {
            inodes: wtx.open_table(INODES)?,
            dirents: wtx.open_table(DIRENTS)?,
            servers: wtx.open_table(SERVERS)?,
            orphans: wtx.open_table(ORPHANS)?,
            counters: wtx.open_table(COUNTERS)?,
        })
    }

    fn add_inode_count(&mut self, delta: i64) -> Result<(), MetaError> {
        let n = counter(&self.counters, COUNTER_INODES)?.unwrap_or(0);
        let n = n.checked_add_signed(delta).ok_or_else(|| MetaError::Corrupt("inode count out of range".into()))?;
        self.counters.insert(COUNTER_INODES, n)?;
        Ok(())
    }
}

struct ReadTxn {
    inodes: ReadOnlyTable<u64, &'static [u8]>,
    dirents: ReadOnlyTable<(u64, &'static str), (u64, u8)>,
    servers: ReadOnlyTable<u32, &'static str>,
    orphans: ReadOnlyTable<u64, &'static [u8]>,
    counters: ReadOnlyTable<u32, u64>,
}

// Reads, shared by both transaction kinds through `ReadableTable`.

fn counter(t: &impl ReadableTable<u32, u64>, key: u32) -> Result<Option<u64>, MetaError> {
    Ok(t.get(key)?.map(|g| g.value()))
}

fn get_inode(t: &impl ReadableTable<u64, &'static [u8]>, ino: u64) -> Result<Option<Inode>, MetaError> {
    let Some(g) = t.get(ino)? else {
        return Ok(None);
    };
    let inode = decode_inode(&format!("inode {ino}"), g.value())?;
    if inode.ino != ino {
        return Err(MetaError::Corrupt(format!("inode record {ino} says it is inode {}", inode.ino)));
    }
    Ok(Some(inode))
}

fn get_dirent(
    t: &impl ReadableTable<(u64, &'static str), (u64, u8)>,
    parent: u64,
    name: &str,
) -> Result<Option<(u64, FileKind)>, MetaError> {
    let Some(g) = t.get((parent, name))? else {
        return Ok(None);
    };
    let (ino, kind) = g.value();
    Ok(Some((ino, kind_from_u8(kind)?)))
}

fn list_dirents(
    t: &impl ReadableTable<(u64, &'static str), (u64, u8)>,
    parent: u64,
    after: &str,
    limit: usize,
) -> Result<Vec<(String, u64, FileKind)>, MetaError> {
    let upper = match parent.checked_add(1) {
        Some(next) => Bound::Excluded((next, "")),
        None => Bound::Unbounded,
    };
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    for item in t.range::<(u64, &str)>((Bound::Excluded((parent, after)), upper))? {
        let (k, v) = item?;
        let (p, name) = k.value();
        if p != parent {
            break;
        }
        let (ino, kind) = v.value();
        out.push((name.to_string(), ino, kind_from_u8(kind)?));
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

fn list_servers(t: &impl ReadableTable<u32, &'static str>) -> Result<Vec<(u32, String)>, MetaError> {
    let mut out = Vec::new();
    for item in t.range::<u32>(..)? {
        let (k, v) = item?;
        out.push((k.value(), v.value().to_string()));
    }
    Ok(out)
}

fn list_orphans(t: &impl ReadableTable<u64, &'static [u8]>, limit: usize) -> Result<Vec<(u64, Layout)>, MetaError> {
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    for item in t.range::<u64>(..)? {
        let (k, v) = item?;
        let ino = k.value();
        out.push((ino, decode_record(&format!("orphan {ino}"), v.value())?));
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

impl MetaTxn for WriteTxn<'_> {
    fn get_inode(&mut self, ino: u64) -> Result<Option<Inode>, MetaError> {
        get_inode(&self.inodes, ino)
    }

    fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError> {
        let bytes = encode_inode(inode)?;
        let existed = self.inodes.insert(inode.ino, bytes.as_slice())?.is_some();
        if !existed {
            self.add_inode_count(1)?;
        }
        Ok(())
    }

    fn del_inode(&mut self, ino: u64) -> Result<(), MetaError> {
        let existed = self.inodes.remove(ino)?.is_some();
        if existed {
            self.add_inode_count(-1)?;
        }
        Ok(())
    }

    fn get_dirent(&mut self, parent: u64, name: &str) -> Result<Option<(u64, FileKind)>, MetaError> {
        get_dirent(&self.dirents, parent, name)
    }

    fn put_dirent(&mut self, parent: u64, name: &str, ino: u64, kind: FileKind) -> Result<(), MetaError> {
        self.dirents.insert((parent, name), (ino, kind_to_u8(kind)))?;
        Ok(())
    }

    fn del_dirent(&mut self, parent: u64, name: &str) -> Result<(), MetaError> {
        self.dirents.remove((parent, name))?;
        Ok(())
    }

    fn list_dirents(
        &mut self,
        parent: u64,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, u64, FileKind)>, MetaError> {
        list_dirents(&self.dirents, parent, after, limit)
    }

    fn dir_is_empty(&mut self, parent: u64) -> Result<bool, MetaError> {
        Ok(list_dirents(&self.dirents, parent, "", 1)?.is_empty())
    }

    fn next_ino(&mut self) -> Result<u64, MetaError> {
        let last = counter(&self.counters, COUNTER_LAST_INO)?.unwrap_or(ROOT_INO);
        let next = last.checked_add(1).ok_or_else(|| MetaError::Corrupt("inode numbers exhausted".into()))?;
        self.counters.insert(COUNTER_LAST_INO, next)?;
        Ok(next)
    }

    fn put_server(&mut self, id: u32, addr: &str) -> Result<(), MetaError> {
        self.servers.insert(id, addr)?;
        Ok(())
    }

    fn list_servers(&mut self) -> Result<Vec<(u32, String)>, MetaError> {
        list_servers(&self.servers)
    }

    fn put_orphan(&mut self, ino: u64, layout: &Layout) -> Result<(), MetaError> {
        let bytes = encode_record(layout)?;
        self.orphans.insert(ino, bytes.as_slice())?;
        Ok(())
    }

    fn del_orphan(&mut self, ino: u64) -> Result<(), MetaError> {
        self.orphans.remove(ino)?;
        Ok(())
    }

    fn list_orphans(&mut self, limit: usize) -> Result<Vec<(u64, Layout)>, MetaError> {
        list_orphans(&self.orphans, limit)
    }

    fn count_inodes(&mut self) -> Result<u64, MetaError> {
        Ok(counter(&self.counters, COUNTER_INODES)?.unwrap_or(0))
    }
}

impl MetaTxn for ReadTxn {
    fn get_inode(&mut self, ino: u64) -> Result<Option<Inode>, MetaError> {
        get_inode(&self.inodes, ino)
    }

    fn put_inode(&mut self, _: &Inode) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn del_inode(&mut self, _: u64) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn get_dirent(&mut self, parent: u64, name: &str) -> Result<Option<(u64, FileKind)>, MetaError> {
        get_dirent(&self.dirents, parent, name)
    }

    fn put_dirent(&mut self, _: u64, _: &str, _: u64, _: FileKind) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn del_dirent(&mut self, _: u64, _: &str) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn list_dirents(
        &mut self,
        parent: u64,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, u64, FileKind)>, MetaError> {
        list_dirents(&self.dirents, parent, after, limit)
    }

    fn dir_is_empty(&mut self, parent: u64) -> Result<bool, MetaError> {
        Ok(list_dirents(&self.dirents, parent, "", 1)?.is_empty())
    }

    fn next_ino(&mut self) -> Result<u64, MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn put_server(&mut self, _: u32, _: &str) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn list_servers(&mut self) -> Result<Vec<(u32, String)>, MetaError> {
        list_servers(&self.servers)
    }

    fn put_orphan(&mut self, _: u64, _: &Layout) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn del_orphan(&mut self, _: u64) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn list_orphans(&mut self, limit: usize) -> Result<Vec<(u64, Layout)>, MetaError> {
        list_orphans(&self.orphans, limit)
    }

    fn count_inodes(&mut self) -> Result<u64, MetaError> {
        Ok(counter(&self.counters, COUNTER_INODES)?.unwrap_or(0))
    }
}
