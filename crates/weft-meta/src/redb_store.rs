//! `RedbStore`: the embedded, crash-safe default [`MetaStore`]: `meta.redb` plus a redo journal (`journal/`) in
//! the service's directory.
//!
//! Why redb: a single-file, pure-Rust, copy-on-write B-tree with ACID transactions and no server to run.
//! Why the journal: a durable redb commit costs milliseconds, an `fdatasync` of an appended record
//! a tenth of that. So every transaction commits to redb without an fsync (`Durability::None`: visible at once,
//! lost on a crash) and appends its physical redo records to the journal ([`crate::journal`]); it is
//! acknowledged once the journal entry is durable, and concurrent transactions share one `fdatasync`. A
//! background checkpoint (a durable redb commit that also stores the last applied LSN in the same transaction)
//! bounds the journal; at open, redb rolls back to its last durable commit and the entries after its LSN are
//! replayed. So when `write` returns `Ok` the change survives `kill -9` and power loss.
//!
//! Trade-off: a mutation is visible to other transactions from its in-memory commit, up to one `fdatasync` before
//! it is durable. A write transaction that changes nothing still waits until everything it could have seen is
//! durable, so no reply is based on state a crash could take back.
//!
//! Tables (keys are fixed-width integers, or (integer, name) so one directory is one contiguous key range):
//! - `inodes`:   ino u64 → versioned postcard [`Inode`]
//! - `dirents`:  (parent u64, name str) → (ino u64, kind u8); redb orders tuples field by field and strings by
//!   bytes, so a range scan lists one directory in name order and readdir pages with an `after` cursor.
//! - `servers`:  data server id u32 → address
//! - `orphans`:  ino u64 → versioned postcard [`Layout`] of a removed file whose objects are still to be deleted
//! - `counters`: u32 → u64 (the last allocated inode number, the inode count)
//! - `journal`:  u32 → u64 (the LSN of the last journal entry the durable state includes)
//! - `xattrs`:   (ino u64, name str) → value bytes: an inode's extended attributes (POSIX ACLs included), one
//!   contiguous key range per inode, kept apart from the inode record so it stays small
//! - `stale`:    (ino u64, slot u32) → versioned postcard list of the rows that slot's server missed (§18)

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use redb::{
    Database, Durability, Key, ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable, Table, TableDefinition,
    Value, WriteTransaction,
};
use weft_proto::{FileKind, Layout, ROOT_INO};

use crate::error::MetaError;
use crate::journal::{self, Journal, JournalConfig, Redo};
use crate::stale;
use crate::store::{
    Counters, Inode, MetaStore, MetaTxn, decode_inode, decode_orphan, encode_inode, encode_orphan, kind_from_u8,
    kind_to_u8,
};
use weft_proto::msg::StaleRange;

const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
const DIRENTS: TableDefinition<(u64, &str), (u64, u8)> = TableDefinition::new("dirents");
const SERVERS: TableDefinition<u32, &str> = TableDefinition::new("servers");
const PHASES: TableDefinition<u32, u8> = TableDefinition::new("server_phases");
const ORPHANS: TableDefinition<u64, &[u8]> = TableDefinition::new("orphans");
const COUNTERS: TableDefinition<u32, u64> = TableDefinition::new("counters");
const JOURNAL: TableDefinition<u32, u64> = TableDefinition::new("journal");
const XATTRS: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("xattrs");
const STALE: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("stale");

const COUNTER_LAST_INO: u32 = 0;
const COUNTER_INODES: u32 = 1;
// Stale-range counters (§18) take 30–31, apart from the keys other tables of this round may add.
const COUNTER_STALE_SEQ: u32 = 30;
const COUNTER_STALE_ENTRIES: u32 = 31;
const JOURNAL_APPLIED_LSN: u32 = 0;

/// The store file's name inside the directory given to [`RedbStore::open`].
pub const STORE_FILE: &str = "meta.redb";
/// The journal's directory inside it.
pub const JOURNAL_DIR: &str = "journal";

/// Replay applies entries in redb transactions of about this many payload bytes.
const REPLAY_BATCH_BYTES: usize = 8 << 20;

/// The embedded [`MetaStore`].
pub struct RedbStore {
    inner: Arc<Inner>,
    path: PathBuf,
    checkpointer: Option<JoinHandle<()>>,
}

struct Inner {
    db: Database,
    journal: Journal,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore").field("path", &self.path).finish()
    }
}

impl RedbStore {
    /// The journal's metrics handles (shared with the journal: clones count together).
    pub fn journal_stats(&self) -> crate::journal::JournalStats {
        self.inner.journal.stats.clone()
    }

    /// Opens (creating if needed) `dir/meta.redb` and its journal with the default limits. See
    /// [`RedbStore::open_with`].
    pub fn open(dir: impl AsRef<Path>) -> Result<RedbStore, MetaError> {
        RedbStore::open_with(dir, JournalConfig::default())
    }

    /// Opens (creating if needed) `dir/meta.redb`, replays the journal entries its durable state lacks, takes a
    /// checkpoint and starts a fresh journal. Fails if another process (or another `RedbStore` in this one) has
    /// the store open, or if the journal is damaged somewhere other than an unacknowledged tail.
    pub fn open_with(dir: impl AsRef<Path>, cfg: JournalConfig) -> Result<RedbStore, MetaError> {
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
            wtx.open_table(PHASES)?;
            wtx.open_table(ORPHANS)?;
            wtx.open_table(COUNTERS)?;
            wtx.open_table(JOURNAL)?;
            wtx.open_table(XATTRS)?;
            wtx.open_table(STALE)?;
        }
        wtx.commit()?;
        let jdir = dir.join(JOURNAL_DIR);
        std::fs::create_dir_all(&jdir)?;
        let applied = {
            let rtx = db.begin_read()?;
            let t = rtx.open_table(JOURNAL)?;
            counter(&t, JOURNAL_APPLIED_LSN)?.unwrap_or(0)
        };
        let disk = journal::read_dir(&jdir)?;
        let segs: Vec<(u64, &[u8])> = disk.segments.iter().map(|(seq, _, data)| (*seq, data.as_slice())).collect();
        let found = journal::scan(&segs, applied)?;
        if found.dropped > 0 {
            tracing::warn!(dir = %jdir.display(), dropped = found.dropped, "journal recovery: dropped never-acknowledged entries past a torn tail");
        }
        for batch in found.replay.chunk_by(|a, b| a.seg == b.seg) {
            replay(&db, batch.iter().map(|r| &segs[r.seg].1[r.range.clone()]))?;
        }
        let last = found.replay.last().map_or(applied, |r| r.lsn);
        if !found.replay.is_empty() {
            tracing::info!(dir = %jdir.display(), entries = found.replay.len(), from = applied + 1, to = last, "journal recovery: replayed");
        }
        checkpoint_at(&db, last)?;
        let next_seq = disk.segments.last().map_or(0, |s| s.0) + 1;
        let old = disk.segments.into_iter().map(|s| s.1).chain(disk.empty).collect();
        let journal = Journal::start(&jdir, cfg, old, next_seq, last)?;
        let inner = Arc::new(Inner { db, journal });
        let checkpointer = {
            let inner = inner.clone();
            std::thread::Builder::new().name("meta-checkpoint".into()).spawn(move || inner.run_checkpoints())?
        };
        Ok(RedbStore { inner, path, checkpointer: Some(checkpointer) })
    }

    /// Path of the store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes a checkpoint now (normally the background thread does, by size and age).
    pub fn checkpoint(&self) -> Result<(), MetaError> {
        self.inner.checkpoint()
    }

    /// Bytes and segments of journal not yet freed by a checkpoint.
    pub fn journal_usage(&self) -> Result<(u64, usize), MetaError> {
        self.inner.journal.live()
    }
}

impl Drop for RedbStore {
    fn drop(&mut self) {
        self.inner.journal.stop();
        if let Some(t) = self.checkpointer.take() {
            let _ = t.join();
        }
        // A clean close leaves nothing to replay.
        if let Err(e) = self.inner.checkpoint() {
            tracing::warn!("final metadata checkpoint: {e}");
        }
    }
}

impl Inner {
    fn run_checkpoints(&self) {
        if let Err(e) = self.journal.prepare_spare() {
            tracing::warn!("journal: preparing a spare segment: {e}");
        }
        loop {
            match self.journal.wait_checkpoint_due() {
                Ok(true) => {}
                Ok(false) | Err(_) => return,
            }
            if let Err(e) = self.checkpoint() {
                tracing::error!("metadata checkpoint failed; refusing further writes: {e}");
                self.journal.fail(e.to_string());
                return;
            }
            if let Err(e) = self.journal.prepare_spare() {
                tracing::warn!("journal: preparing a spare segment: {e}");
            }
        }
    }

    /// A durable redb commit recording the LSN of the last journal entry it includes, then frees the journal
    /// segments it covers.
    fn checkpoint(&self) -> Result<(), MetaError> {
        let mut wtx = self.db.begin_write()?;
        wtx.set_durability(Durability::Immediate)?;
        // Holding redb's write lock, every committed transaction has appended its entry (append runs the commit
        // under the journal lock), so this LSN is exactly what the commit below makes durable.
        let lsn = self.journal.appended_lsn()?;
        {
            let mut t = wtx.open_table(JOURNAL)?;
            t.insert(JOURNAL_APPLIED_LSN, lsn)?;
        }
        wtx.commit()?;
        self.journal.checkpointed(lsn)
    }
}

fn checkpoint_at(db: &Database, lsn: u64) -> Result<(), MetaError> {
    let mut wtx = db.begin_write()?;
    wtx.set_durability(Durability::Immediate)?;
    {
        let mut t = wtx.open_table(JOURNAL)?;
        t.insert(JOURNAL_APPLIED_LSN, lsn)?;
    }
    wtx.commit()?;
    Ok(())
}

/// Applies journal payloads in order, in non-durable transactions of about [`REPLAY_BATCH_BYTES`]; the checkpoint
/// after replay makes them durable.
fn replay<'a>(db: &Database, payloads: impl Iterator<Item = &'a [u8]>) -> Result<(), MetaError> {
    let mut payloads = payloads.peekable();
    while payloads.peek().is_some() {
        let mut wtx = db.begin_write()?;
        wtx.set_durability(Durability::None)?;
        {
            let mut t = WriteTxn::open(&wtx)?;
            let mut bytes = 0;
            while bytes < REPLAY_BATCH_BYTES {
                let Some(p) = payloads.next() else { break };
                bytes += p.len();
                for r in journal::decode_redo(p)? {
                    t.apply(&r)?;
                }
            }
        }
        wtx.commit()?;
    }
    Ok(())
}

impl MetaStore for RedbStore {
    fn write<R, E: From<MetaError>>(&self, mut f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        let journal = &self.inner.journal;
        journal.wait_for_room()?;
        let mut wtx = self.inner.db.begin_write().map_err(MetaError::from)?;
        wtx.set_durability(Durability::None).map_err(MetaError::from)?;
        let (result, redo) = {
            let mut txn = WriteTxn::open(&wtx)?;
            let result = f(&mut txn);
            (result, std::mem::take(&mut txn.redo))
        };
        match result {
            Ok(r) if redo.is_empty() => {
                // Nothing changed: nothing to journal, but what this transaction read must be durable before
                // anyone acts on the reply.
                wtx.abort().map_err(MetaError::from)?;
                let seen = journal.appended_lsn()?;
                journal.wait_durable(seen)?;
                Ok(r)
            }
            Ok(r) => {
                let lsn = journal.append(&redo, || wtx.commit().map_err(MetaError::from))?;
                journal.wait_durable(lsn)?;
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

    fn read<R, E: From<MetaError>>(&self, mut f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        let rtx = self.inner.db.begin_read().map_err(MetaError::from)?;
        let mut txn = ReadTxn {
            rtx,
            inodes: None,
            dirents: None,
            servers: None,
            phases: None,
            orphans: None,
            counters: None,
            xattrs: None,
            stale: None,
        };
        f(&mut txn)
    }
}

type DirentsTableMut<'t> = Table<'t, (u64, &'static str), (u64, u8)>;
type XattrsTableMut<'t> = Table<'t, (u64, &'static str), &'static [u8]>;
type StaleTableMut<'t> = Table<'t, (u64, u32), &'static [u8]>;

/// A write transaction opens only the tables it touches (a create needs three of five).
struct WriteTxn<'t> {
    wtx: &'t WriteTransaction,
    inodes: Option<Table<'t, u64, &'static [u8]>>,
    dirents: Option<DirentsTableMut<'t>>,
    servers: Option<Table<'t, u32, &'static str>>,
    phases: Option<Table<'t, u32, u8>>,
    orphans: Option<Table<'t, u64, &'static [u8]>>,
    counters: Option<Table<'t, u32, u64>>,
    xattrs: Option<XattrsTableMut<'t>>,
    stale: Option<StaleTableMut<'t>>,
    /// Physical redo records of every change so far, the journal entry's payload.
    redo: Vec<u8>,
}

fn lazy_mut<'a, 't, K: Key + 'static, V: Value + 'static>(
    wtx: &'t WriteTransaction,
    slot: &'a mut Option<Table<'t, K, V>>,
    def: TableDefinition<K, V>,
) -> Result<&'a mut Table<'t, K, V>, MetaError> {
    if slot.is_none() {
        *slot = Some(wtx.open_table(def)?);
    }
    slot.as_mut().ok_or_else(|| MetaError::Store("table just opened is missing".into()))
}

impl<'t> WriteTxn<'t> {
    fn open(wtx: &'t WriteTransaction) -> Result<Self, MetaError> {
        Ok(WriteTxn {
            wtx,
            inodes: None,
            dirents: None,
            servers: None,
            phases: None,
            orphans: None,
            counters: None,
            xattrs: None,
            stale: None,
            redo: Vec::new(),
        })
    }

    fn inodes(&mut self) -> Result<&mut Table<'t, u64, &'static [u8]>, MetaError> {
        lazy_mut(self.wtx, &mut self.inodes, INODES)
    }

    fn dirents(&mut self) -> Result<&mut DirentsTableMut<'t>, MetaError> {
        lazy_mut(self.wtx, &mut self.dirents, DIRENTS)
    }

    fn servers(&mut self) -> Result<&mut Table<'t, u32, &'static str>, MetaError> {
        lazy_mut(self.wtx, &mut self.servers, SERVERS)
    }

    fn phases(&mut self) -> Result<&mut Table<'t, u32, u8>, MetaError> {
        lazy_mut(self.wtx, &mut self.phases, PHASES)
    }

    fn orphans(&mut self) -> Result<&mut Table<'t, u64, &'static [u8]>, MetaError> {
        lazy_mut(self.wtx, &mut self.orphans, ORPHANS)
    }

    fn counters(&mut self) -> Result<&mut Table<'t, u32, u64>, MetaError> {
        lazy_mut(self.wtx, &mut self.counters, COUNTERS)
    }

    fn xattrs(&mut self) -> Result<&mut XattrsTableMut<'t>, MetaError> {
        lazy_mut(self.wtx, &mut self.xattrs, XATTRS)
    }

    fn stale(&mut self) -> Result<&mut StaleTableMut<'t>, MetaError> {
        lazy_mut(self.wtx, &mut self.stale, STALE)
    }

    fn add_stale_count(&mut self, delta: i64) -> Result<(), MetaError> {
        let n = counter(&*self.counters()?, COUNTER_STALE_ENTRIES)?.unwrap_or(0);
        let n =
            n.checked_add_signed(delta).ok_or_else(|| MetaError::Corrupt("stale entry count out of range".into()))?;
        self.set_counter(COUNTER_STALE_ENTRIES, n)
    }

    fn set_counter(&mut self, key: u32, value: u64) -> Result<(), MetaError> {
        self.counters()?.insert(key, value)?;
        journal::encode_redo(&mut self.redo, &Redo::PutCounter { key, value });
        Ok(())
    }

    fn add_inode_count(&mut self, delta: i64) -> Result<(), MetaError> {
        let n = counter(&*self.counters()?, COUNTER_INODES)?.unwrap_or(0);
        let n = n.checked_add_signed(delta).ok_or_else(|| MetaError::Corrupt("inode count out of range".into()))?;
        self.set_counter(COUNTER_INODES, n)
    }

    /// Replays one redo record: the table change exactly as recorded, nothing derived.
    fn apply(&mut self, r: &Redo<'_>) -> Result<(), MetaError> {
        match *r {
            Redo::PutInode { ino, record } => {
                self.inodes()?.insert(ino, record)?;
            }
            Redo::DelInode { ino } => {
                self.inodes()?.remove(ino)?;
            }
            Redo::PutDirent { parent, name, ino, kind } => {
                self.dirents()?.insert((parent, name), (ino, kind))?;
            }
            Redo::DelDirent { parent, name } => {
                self.dirents()?.remove((parent, name))?;
            }
            Redo::PutServer { id, addr } => {
                self.servers()?.insert(id, addr)?;
            }
            Redo::PutServerPhase { id, phase } => {
                self.phases()?.insert(id, phase)?;
            }
            Redo::PutOrphan { ino, record } => {
                self.orphans()?.insert(ino, record)?;
            }
            Redo::DelOrphan { ino } => {
                self.orphans()?.remove(ino)?;
            }
            Redo::PutCounter { key, value } => {
                self.counters()?.insert(key, value)?;
            }
            Redo::PutXattr { ino, name, value } => {
                self.xattrs()?.insert((ino, name), value)?;
            }
            Redo::DelXattr { ino, name } => {
                self.xattrs()?.remove((ino, name))?;
            }
            Redo::PutStale { ino, slot, record } => {
                self.stale()?.insert((ino, slot), record)?;
            }
            Redo::DelStale { ino, slot } => {
                self.stale()?.remove((ino, slot))?;
            }
        }
        Ok(())
    }
}

type DirentsTable = ReadOnlyTable<(u64, &'static str), (u64, u8)>;
type XattrsTable = ReadOnlyTable<(u64, &'static str), &'static [u8]>;
type StaleTable = ReadOnlyTable<(u64, u32), &'static [u8]>;

/// A read transaction opens only the tables it touches (a getattr needs one, not five).
struct ReadTxn {
    rtx: ReadTransaction,
    inodes: Option<ReadOnlyTable<u64, &'static [u8]>>,
    dirents: Option<DirentsTable>,
    servers: Option<ReadOnlyTable<u32, &'static str>>,
    phases: Option<ReadOnlyTable<u32, u8>>,
    orphans: Option<ReadOnlyTable<u64, &'static [u8]>>,
    counters: Option<ReadOnlyTable<u32, u64>>,
    xattrs: Option<XattrsTable>,
    stale: Option<StaleTable>,
}

fn lazy<'a, K: Key + 'static, V: Value + 'static>(
    rtx: &ReadTransaction,
    slot: &'a mut Option<ReadOnlyTable<K, V>>,
    def: TableDefinition<K, V>,
) -> Result<&'a ReadOnlyTable<K, V>, MetaError> {
    if slot.is_none() {
        *slot = Some(rtx.open_table(def)?);
    }
    slot.as_ref().ok_or_else(|| MetaError::Store("table just opened is missing".into()))
}

// Reads, shared by both transaction kinds through `ReadableTable`.

fn counter(t: &impl ReadableTable<u32, u64>, key: u32) -> Result<Option<u64>, MetaError> {
    Ok(t.get(key)?.map(|g| g.value()))
}

fn read_counters(t: &impl ReadableTable<u32, u64>) -> Result<Counters, MetaError> {
    Ok(Counters {
        last_ino: counter(t, COUNTER_LAST_INO)?.unwrap_or(ROOT_INO),
        last_stale_seq: counter(t, COUNTER_STALE_SEQ)?.unwrap_or(0),
    })
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

fn get_xattr(
    t: &impl ReadableTable<(u64, &'static str), &'static [u8]>,
    ino: u64,
    name: &str,
) -> Result<Option<Vec<u8>>, MetaError> {
    Ok(t.get((ino, name))?.map(|g| g.value().to_vec()))
}

fn list_xattrs(
    t: &impl ReadableTable<(u64, &'static str), &'static [u8]>,
    ino: u64,
) -> Result<Vec<(String, usize)>, MetaError> {
    let upper = match ino.checked_add(1) {
        Some(next) => Bound::Excluded((next, "")),
        None => Bound::Unbounded,
    };
    let mut out = Vec::new();
    for item in t.range::<(u64, &str)>((Bound::Included((ino, "")), upper))? {
        let (k, v) = item?;
        let (i, name) = k.value();
        if i != ino {
            break;
        }
        out.push((name.to_string(), v.value().len()));
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

fn list_server_phases(t: &impl ReadableTable<u32, u8>) -> Result<Vec<(u32, u8)>, MetaError> {
    let mut out = Vec::new();
    for item in t.range::<u32>(..)? {
        let (k, v) = item?;
        out.push((k.value(), v.value()));
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
        out.push((ino, decode_orphan(&format!("orphan {ino}"), v.value())?));
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

fn list_inodes(t: &impl ReadableTable<u64, &'static [u8]>, after: u64, limit: usize) -> Result<Vec<Inode>, MetaError> {
    let mut out = Vec::new();
    if limit == 0 || after == u64::MAX {
        return Ok(out);
    }
    for item in t.range::<u64>(after + 1..)? {
        let (k, v) = item?;
        let ino = k.value();
        out.push(decode_inode(&format!("inode {ino}"), v.value())?);
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

fn get_stale(
    t: &impl ReadableTable<(u64, u32), &'static [u8]>,
    ino: u64,
    slot: u32,
) -> Result<Option<Vec<StaleRange>>, MetaError> {
    match t.get((ino, slot))? {
        Some(g) => Ok(Some(stale::decode(&format!("stale entry {ino}/{slot}"), g.value())?)),
        None => Ok(None),
    }
}

type StaleRow = (u64, u32, Vec<StaleRange>);

fn list_stale(
    t: &impl ReadableTable<(u64, u32), &'static [u8]>,
    after: Option<(u64, u32)>,
    limit: usize,
) -> Result<Vec<StaleRow>, MetaError> {
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    let lower = match after {
        Some(k) => Bound::Excluded(k),
        None => Bound::Unbounded,
    };
    for item in t.range::<(u64, u32)>((lower, Bound::Unbounded))? {
        let (k, v) = item?;
        let (ino, slot) = k.value();
        out.push((ino, slot, stale::decode(&format!("stale entry {ino}/{slot}"), v.value())?));
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

impl MetaTxn for WriteTxn<'_> {
    fn get_inode(&mut self, ino: u64) -> Result<Option<Inode>, MetaError> {
        get_inode(&*self.inodes()?, ino)
    }

    fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError> {
        let bytes = encode_inode(inode)?;
        let existed = self.inodes()?.insert(inode.ino, bytes.as_slice())?.is_some();
        journal::encode_redo(&mut self.redo, &Redo::PutInode { ino: inode.ino, record: &bytes });
        if !existed {
            self.add_inode_count(1)?;
        }
        Ok(())
    }

    fn del_inode(&mut self, ino: u64) -> Result<(), MetaError> {
        let existed = self.inodes()?.remove(ino)?.is_some();
        if existed {
            journal::encode_redo(&mut self.redo, &Redo::DelInode { ino });
            self.add_inode_count(-1)?;
        }
        Ok(())
    }

    fn get_dirent(&mut self, parent: u64, name: &str) -> Result<Option<(u64, FileKind)>, MetaError> {
        get_dirent(&*self.dirents()?, parent, name)
    }

    fn put_dirent(&mut self, parent: u64, name: &str, ino: u64, kind: FileKind) -> Result<(), MetaError> {
        let kind = kind_to_u8(kind);
        self.dirents()?.insert((parent, name), (ino, kind))?;
        journal::encode_redo(&mut self.redo, &Redo::PutDirent { parent, name, ino, kind });
        Ok(())
    }

    fn del_dirent(&mut self, parent: u64, name: &str) -> Result<(), MetaError> {
        if self.dirents()?.remove((parent, name))?.is_some() {
            journal::encode_redo(&mut self.redo, &Redo::DelDirent { parent, name });
        }
        Ok(())
    }

    fn list_dirents(
        &mut self,
        parent: u64,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, u64, FileKind)>, MetaError> {
        list_dirents(&*self.dirents()?, parent, after, limit)
    }

    fn dir_is_empty(&mut self, parent: u64) -> Result<bool, MetaError> {
        Ok(list_dirents(&*self.dirents()?, parent, "", 1)?.is_empty())
    }

    fn next_ino(&mut self) -> Result<u64, MetaError> {
        let last = counter(&*self.counters()?, COUNTER_LAST_INO)?.unwrap_or(ROOT_INO);
        let next = last.checked_add(1).ok_or_else(|| MetaError::Corrupt("inode numbers exhausted".into()))?;
        self.set_counter(COUNTER_LAST_INO, next)?;
        Ok(next)
    }

    fn put_server(&mut self, id: u32, addr: &str) -> Result<(), MetaError> {
        self.servers()?.insert(id, addr)?;
        journal::encode_redo(&mut self.redo, &Redo::PutServer { id, addr });
        Ok(())
    }

    fn list_servers(&mut self) -> Result<Vec<(u32, String)>, MetaError> {
        list_servers(&*self.servers()?)
    }

    fn put_server_phase(&mut self, id: u32, phase: u8) -> Result<(), MetaError> {
        self.phases()?.insert(id, phase)?;
        journal::encode_redo(&mut self.redo, &Redo::PutServerPhase { id, phase });
        Ok(())
    }

    fn list_server_phases(&mut self) -> Result<Vec<(u32, u8)>, MetaError> {
        list_server_phases(&*self.phases()?)
    }

    fn put_orphan(&mut self, ino: u64, layout: &Layout) -> Result<(), MetaError> {
        let bytes = encode_orphan(layout)?;
        self.orphans()?.insert(ino, bytes.as_slice())?;
        journal::encode_redo(&mut self.redo, &Redo::PutOrphan { ino, record: &bytes });
        Ok(())
    }

    fn del_orphan(&mut self, ino: u64) -> Result<(), MetaError> {
        if self.orphans()?.remove(ino)?.is_some() {
            journal::encode_redo(&mut self.redo, &Redo::DelOrphan { ino });
        }
        Ok(())
    }

    fn list_orphans(&mut self, limit: usize) -> Result<Vec<(u64, Layout)>, MetaError> {
        list_orphans(&*self.orphans()?, limit)
    }

    fn list_inodes(&mut self, after: u64, limit: usize) -> Result<Vec<Inode>, MetaError> {
        list_inodes(&*self.inodes()?, after, limit)
    }

    fn count_inodes(&mut self) -> Result<u64, MetaError> {
        Ok(counter(&*self.counters()?, COUNTER_INODES)?.unwrap_or(0))
    }

    fn get_xattr(&mut self, ino: u64, name: &str) -> Result<Option<Vec<u8>>, MetaError> {
        get_xattr(&*self.xattrs()?, ino, name)
    }

    fn put_xattr(&mut self, ino: u64, name: &str, value: &[u8]) -> Result<(), MetaError> {
        self.xattrs()?.insert((ino, name), value)?;
        journal::encode_redo(&mut self.redo, &Redo::PutXattr { ino, name, value });
        Ok(())
    }

    fn del_xattr(&mut self, ino: u64, name: &str) -> Result<(), MetaError> {
        if self.xattrs()?.remove((ino, name))?.is_some() {
            journal::encode_redo(&mut self.redo, &Redo::DelXattr { ino, name });
        }
        Ok(())
    }

    fn list_xattrs(&mut self, ino: u64) -> Result<Vec<(String, usize)>, MetaError> {
        list_xattrs(&*self.xattrs()?, ino)
    }

    fn get_stale(&mut self, ino: u64, slot: u32) -> Result<Option<Vec<StaleRange>>, MetaError> {
        get_stale(&*self.stale()?, ino, slot)
    }

    fn put_stale(&mut self, ino: u64, slot: u32, ranges: &[StaleRange]) -> Result<(), MetaError> {
        let bytes = stale::encode(ranges)?;
        let existed = self.stale()?.insert((ino, slot), bytes.as_slice())?.is_some();
        journal::encode_redo(&mut self.redo, &Redo::PutStale { ino, slot, record: &bytes });
        if !existed {
            self.add_stale_count(1)?;
        }
        Ok(())
    }

    fn del_stale(&mut self, ino: u64, slot: u32) -> Result<(), MetaError> {
        if self.stale()?.remove((ino, slot))?.is_some() {
            journal::encode_redo(&mut self.redo, &Redo::DelStale { ino, slot });
            self.add_stale_count(-1)?;
        }
        Ok(())
    }

    fn list_stale(&mut self, after: Option<(u64, u32)>, limit: usize) -> Result<Vec<StaleRow>, MetaError> {
        list_stale(&*self.stale()?, after, limit)
    }

    fn count_stale(&mut self) -> Result<u64, MetaError> {
        Ok(counter(&*self.counters()?, COUNTER_STALE_ENTRIES)?.unwrap_or(0))
    }

    fn next_stale_seq(&mut self) -> Result<u64, MetaError> {
        let last = counter(&*self.counters()?, COUNTER_STALE_SEQ)?.unwrap_or(0);
        let next = last.checked_add(1).ok_or_else(|| MetaError::Corrupt("stale sequence numbers exhausted".into()))?;
        self.set_counter(COUNTER_STALE_SEQ, next)?;
        Ok(next)
    }

    fn counters(&mut self) -> Result<Counters, MetaError> {
        read_counters(&*self.counters()?)
    }

    fn raise_counters(&mut self, c: Counters) -> Result<(), MetaError> {
        let now = read_counters(&*self.counters()?)?;
        if c.last_ino > now.last_ino {
            self.set_counter(COUNTER_LAST_INO, c.last_ino)?;
        }
        if c.last_stale_seq > now.last_stale_seq {
            self.set_counter(COUNTER_STALE_SEQ, c.last_stale_seq)?;
        }
        Ok(())
    }
}

impl MetaTxn for ReadTxn {
    fn get_inode(&mut self, ino: u64) -> Result<Option<Inode>, MetaError> {
        get_inode(lazy(&self.rtx, &mut self.inodes, INODES)?, ino)
    }

    fn put_inode(&mut self, _: &Inode) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn del_inode(&mut self, _: u64) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn get_dirent(&mut self, parent: u64, name: &str) -> Result<Option<(u64, FileKind)>, MetaError> {
        get_dirent(lazy(&self.rtx, &mut self.dirents, DIRENTS)?, parent, name)
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
        list_dirents(lazy(&self.rtx, &mut self.dirents, DIRENTS)?, parent, after, limit)
    }

    fn dir_is_empty(&mut self, parent: u64) -> Result<bool, MetaError> {
        Ok(list_dirents(lazy(&self.rtx, &mut self.dirents, DIRENTS)?, parent, "", 1)?.is_empty())
    }

    fn next_ino(&mut self) -> Result<u64, MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn put_server(&mut self, _: u32, _: &str) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn list_servers(&mut self) -> Result<Vec<(u32, String)>, MetaError> {
        list_servers(lazy(&self.rtx, &mut self.servers, SERVERS)?)
    }

    fn put_server_phase(&mut self, _: u32, _: u8) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn list_server_phases(&mut self) -> Result<Vec<(u32, u8)>, MetaError> {
        list_server_phases(lazy(&self.rtx, &mut self.phases, PHASES)?)
    }

    fn put_orphan(&mut self, _: u64, _: &Layout) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn del_orphan(&mut self, _: u64) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn list_orphans(&mut self, limit: usize) -> Result<Vec<(u64, Layout)>, MetaError> {
        list_orphans(lazy(&self.rtx, &mut self.orphans, ORPHANS)?, limit)
    }

    fn list_inodes(&mut self, after: u64, limit: usize) -> Result<Vec<Inode>, MetaError> {
        list_inodes(lazy(&self.rtx, &mut self.inodes, INODES)?, after, limit)
    }

    fn count_inodes(&mut self) -> Result<u64, MetaError> {
        Ok(counter(lazy(&self.rtx, &mut self.counters, COUNTERS)?, COUNTER_INODES)?.unwrap_or(0))
    }

    fn get_xattr(&mut self, ino: u64, name: &str) -> Result<Option<Vec<u8>>, MetaError> {
        get_xattr(lazy(&self.rtx, &mut self.xattrs, XATTRS)?, ino, name)
    }

    fn put_xattr(&mut self, _: u64, _: &str, _: &[u8]) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn del_xattr(&mut self, _: u64, _: &str) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn list_xattrs(&mut self, ino: u64) -> Result<Vec<(String, usize)>, MetaError> {
        list_xattrs(lazy(&self.rtx, &mut self.xattrs, XATTRS)?, ino)
    }

    fn get_stale(&mut self, ino: u64, slot: u32) -> Result<Option<Vec<StaleRange>>, MetaError> {
        get_stale(lazy(&self.rtx, &mut self.stale, STALE)?, ino, slot)
    }

    fn put_stale(&mut self, _: u64, _: u32, _: &[StaleRange]) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn del_stale(&mut self, _: u64, _: u32) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn list_stale(&mut self, after: Option<(u64, u32)>, limit: usize) -> Result<Vec<StaleRow>, MetaError> {
        list_stale(lazy(&self.rtx, &mut self.stale, STALE)?, after, limit)
    }

    fn count_stale(&mut self) -> Result<u64, MetaError> {
        Ok(counter(lazy(&self.rtx, &mut self.counters, COUNTERS)?, COUNTER_STALE_ENTRIES)?.unwrap_or(0))
    }

    fn next_stale_seq(&mut self) -> Result<u64, MetaError> {
        Err(MetaError::ReadOnly)
    }

    fn counters(&mut self) -> Result<Counters, MetaError> {
        read_counters(lazy(&self.rtx, &mut self.counters, COUNTERS)?)
    }

    fn raise_counters(&mut self, _: Counters) -> Result<(), MetaError> {
        Err(MetaError::ReadOnly)
    }
}
