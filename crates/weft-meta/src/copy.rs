//! Copying a whole namespace from one store to another: `weft meta backup` (a running service writes a
//! consistent copy of its store into a new embedded store), `weft meta restore` and `weft meta migrate` (redb to
//! PostgreSQL and back). The copy reads the source in one read transaction (a consistent snapshot, so a backup
//! taken while clients write is a state the namespace was in) and writes the target in bounded batches. What it
//! copied is summed into a [`Digest`] as it goes; the target is then read back and must give the same digest.
//!
//! What is not copied: the duty lease record (docs/format.md §28), the services' liveness counters and the locks
//! (§30): they name services and sessions of the source's cluster, which a target's services would otherwise
//! first have to wait out. Everything else — inodes with
//! their layouts, entries, extended attributes (ACLs among them), stale ranges, orphans, data servers and their
//! phases, once records (§27) and the allocation counters — is. Data-server objects are named by inode, so a
//! copy serves the same files' bytes.

use std::path::Path;

use weft_proto::msg::StaleRange;
use weft_proto::{FileKind, Layout, ROOT_INO};

use crate::error::MetaError;
use crate::store::{Inode, MetaStore, MetaTxn, encode_inode, encode_orphan, kind_to_u8};
use crate::{PgStore, RedbStore, db_locks, duty, stale};

/// Records written per target transaction: bounds the memory a copy holds and the size of one transaction.
const BATCH_RECORDS: usize = 1024;
/// Inodes, entries or stale entries read per page of the source.
const PAGE: usize = 512;
/// Most orphans a copy carries (gc keeps the table short; a longer one means gc is stuck: fix that first).
const ORPHANS_MAX: usize = 1 << 20;

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    #[error("{0}")]
    Store(#[from] MetaError),
    /// The target already holds a namespace: a copy goes only into an empty store.
    #[error("the target is not empty ({0}); a copy goes only into a new store")]
    TargetNotEmpty(String),
    /// The target, read back, differs from what was copied.
    #[error("the copy differs from its source: {0}")]
    Mismatch(String),
    /// A store specification that is neither `redb:PATH` nor `postgres://…`.
    #[error("{0:?} names no store: use redb:DIR (an embedded store's directory) or postgres://user@host/db")]
    BadSpec(String),
}

/// Record counts and a checksum per table of what a copy carried: equal digests mean equal namespaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Digest {
    pub inodes: u64,
    pub dirents: u64,
    pub xattrs: u64,
    pub stale: u64,
    pub orphans: u64,
    pub servers: u64,
    /// CRC-32C over every record in key order, each length-prefixed (a check against a copy's mistakes, not
    /// against an adversary: both stores are the operator's).
    pub crc: u32,
}

/// The wire form of a backup's digest (op 141's reply) carries the same fields.
impl From<Digest> for weft_proto::msg::MetaBackupResp {
    fn from(d: Digest) -> Self {
        let Digest { inodes, dirents, xattrs, stale, orphans, servers, crc } = d;
        weft_proto::msg::MetaBackupResp { inodes, dirents, xattrs, stale, orphans, servers, crc }
    }
}

impl From<weft_proto::msg::MetaBackupResp> for Digest {
    fn from(r: weft_proto::msg::MetaBackupResp) -> Self {
        let weft_proto::msg::MetaBackupResp { inodes, dirents, xattrs, stale, orphans, servers, crc } = r;
        Digest { inodes, dirents, xattrs, stale, orphans, servers, crc }
    }
}

impl Digest {
    fn add(&mut self, bytes: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, &(bytes.len() as u64).to_le_bytes());
        self.crc = crc32c::crc32c_append(self.crc, bytes);
    }
}

/// One record on its way to the target.
enum Record {
    Inode(Inode),
    Dirent(u64, String, u64, FileKind),
    Xattr(u64, String, Vec<u8>),
    Stale(u64, u32, Vec<StaleRange>),
    Orphan(u64, Layout),
    Server(u32, String),
    Phase(u32, u8),
}

/// Where records go: batches written to the target, everything summed into the digest.
struct Sink<'a, T: MetaStore> {
    to: &'a T,
    pending: Vec<Record>,
    digest: Digest,
}

impl<T: MetaStore> Sink<'_, T> {
    fn push(&mut self, r: Record) -> Result<(), MetaError> {
        digest_record(&mut self.digest, &r)?;
        self.pending.push(r);
        if self.pending.len() >= BATCH_RECORDS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), MetaError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.pending);
        self.to.write(|t| batch.iter().try_for_each(|r| apply(t, r)))
    }
}

fn apply(t: &mut dyn MetaTxn, r: &Record) -> Result<(), MetaError> {
    match r {
        Record::Inode(i) => t.put_inode(i),
        Record::Dirent(parent, name, ino, kind) => t.put_dirent(*parent, name, *ino, *kind),
        Record::Xattr(ino, name, value) => t.put_xattr(*ino, name, value),
        Record::Stale(ino, slot, ranges) => t.put_stale(*ino, *slot, ranges),
        Record::Orphan(ino, layout) => t.put_orphan(*ino, layout),
        Record::Server(id, addr) => t.put_server(*id, addr),
        Record::Phase(id, phase) => t.put_server_phase(*id, *phase),
    }
}

fn digest_record(d: &mut Digest, r: &Record) -> Result<(), MetaError> {
    match r {
        Record::Inode(i) => {
            d.inodes += 1;
            d.add(&encode_inode(i)?);
        }
        Record::Dirent(parent, name, ino, kind) => {
            d.dirents += 1;
            d.add(&parent.to_le_bytes());
            d.add(name.as_bytes());
            d.add(&ino.to_le_bytes());
            d.add(&[kind_to_u8(*kind)]);
        }
        Record::Xattr(ino, name, value) => {
            d.xattrs += 1;
            d.add(&ino.to_le_bytes());
            d.add(name.as_bytes());
            d.add(value);
        }
        Record::Stale(ino, slot, ranges) => {
            d.stale += 1;
            d.add(&ino.to_le_bytes());
            d.add(&slot.to_le_bytes());
            d.add(&stale::encode(ranges)?);
        }
        Record::Orphan(ino, layout) => {
            d.orphans += 1;
            d.add(&ino.to_le_bytes());
            d.add(&encode_orphan(layout)?);
        }
        Record::Server(id, addr) => {
            d.servers += 1;
            d.add(&id.to_le_bytes());
            d.add(addr.as_bytes());
        }
        Record::Phase(id, phase) => {
            d.add(&id.to_le_bytes());
            d.add(&[*phase]);
        }
    }
    Ok(())
}

/// Every record of the store read through `t`, in a fixed order, to `emit`.
fn walk(t: &mut dyn MetaTxn, emit: &mut dyn FnMut(Record) -> Result<(), MetaError>) -> Result<(), MetaError> {
    walk_xattrs(t, 0, emit)?;
    let mut after = 0;
    loop {
        let page = t.list_inodes(after, PAGE)?;
        let Some(last) = page.last() else { break };
        after = last.ino;
        for inode in page {
            let (ino, dir) = (inode.ino, inode.kind == FileKind::Dir);
            emit(Record::Inode(inode))?;
            if dir {
                walk_dirents(t, ino, emit)?;
            }
            walk_xattrs(t, ino, emit)?;
        }
    }
    let mut after = None;
    loop {
        let page = t.list_stale(after, PAGE)?;
        let Some(&(ino, slot, _)) = page.last() else { break };
        after = Some((ino, slot));
        page.into_iter().try_for_each(|(ino, slot, ranges)| emit(Record::Stale(ino, slot, ranges)))?;
    }
    let orphans = t.list_orphans(ORPHANS_MAX)?;
    if orphans.len() >= ORPHANS_MAX {
        return Err(MetaError::Store(format!("more than {ORPHANS_MAX} orphans: let gc collect them first")));
    }
    orphans.into_iter().try_for_each(|(ino, layout)| emit(Record::Orphan(ino, layout)))?;
    t.list_servers()?.into_iter().try_for_each(|(id, addr)| emit(Record::Server(id, addr)))?;
    t.list_server_phases()?.into_iter().try_for_each(|(id, phase)| emit(Record::Phase(id, phase)))
}

fn walk_dirents(
    t: &mut dyn MetaTxn,
    parent: u64,
    emit: &mut dyn FnMut(Record) -> Result<(), MetaError>,
) -> Result<(), MetaError> {
    let mut after = String::new();
    loop {
        let page = t.list_dirents(parent, &after, PAGE)?;
        let Some((last, _, _)) = page.last() else { return Ok(()) };
        after = last.clone();
        for (name, ino, kind) in page {
            emit(Record::Dirent(parent, name, ino, kind))?;
        }
    }
}

fn walk_xattrs(
    t: &mut dyn MetaTxn,
    ino: u64,
    emit: &mut dyn FnMut(Record) -> Result<(), MetaError>,
) -> Result<(), MetaError> {
    for (name, _) in t.list_xattrs(ino)? {
        if ino == 0 && !copied_at_inode_0(&name) {
            continue;
        }
        // Listed and read in one snapshot: a listed name has a value.
        let value = t.get_xattr(ino, &name)?.ok_or_else(|| MetaError::Corrupt(format!("xattr {name} of {ino}")))?;
        emit(Record::Xattr(ino, name, value))?;
    }
    Ok(())
}

/// Whether a record at inode 0 belongs in a copy: once records and data-server liveness do; the duty lease, the
/// services' liveness and the locks (§28, §30) name services and sessions of the source's cluster, which a
/// target's services would first have to wait out.
fn copied_at_inode_0(name: &str) -> bool {
    let foreign = [db_locks::LOCK_PREFIX, db_locks::SESSION_PREFIX, duty::SERVICE_BEAT_PREFIX];
    name != duty::LEASE_NAME && !foreign.iter().any(|p| name.starts_with(p))
}

/// The digest of everything a copy of `store` would carry.
pub fn digest<S: MetaStore>(store: &S) -> Result<Digest, MetaError> {
    store.read(|t| {
        let mut d = Digest::default();
        walk(t, &mut |r| digest_record(&mut d, &r))?;
        Ok(d)
    })
}

/// Copies everything `from` holds (one consistent snapshot) into `to`, which must be empty (a new store, or one
/// holding only the root directory a service made at its first start), then reads `to` back and checks it holds
/// the same. Returns what was copied.
pub fn copy_store<S: MetaStore, T: MetaStore>(from: &S, to: &T) -> Result<Digest, CopyError> {
    check_empty(to)?;
    let (wrote, counters) = from.read(|src| {
        let mut sink = Sink { to, pending: Vec::with_capacity(BATCH_RECORDS), digest: Digest::default() };
        walk(src, &mut |r| sink.push(r))?;
        sink.flush()?;
        Ok::<_, MetaError>((sink.digest, src.counters()?))
    })?;
    to.write(|t| t.raise_counters(counters))?;
    let copied = digest(to)?;
    if copied != wrote {
        return Err(CopyError::Mismatch(format!("wrote {wrote:?}, read back {copied:?}")));
    }
    let now = to.read(|t| t.counters())?;
    assert!(now.last_ino >= counters.last_ino && now.last_stale_seq >= counters.last_stale_seq);
    Ok(wrote)
}

fn check_empty<T: MetaStore>(to: &T) -> Result<(), CopyError> {
    let found = to.read(|t| {
        let inodes = t.list_inodes(0, 2)?;
        if inodes.iter().any(|i| i.ino != ROOT_INO) {
            return Ok(Some(format!("{} inodes", t.count_inodes()?)));
        }
        if !t.dir_is_empty(ROOT_INO)? {
            return Ok(Some("the root directory has entries".into()));
        }
        if !t.list_servers()?.is_empty() {
            return Ok(Some("data servers are registered".into()));
        }
        if t.count_stale()? > 0 || !t.list_orphans(1)?.is_empty() {
            return Ok(Some("stale ranges or orphans are recorded".into()));
        }
        Ok::<_, MetaError>(None)
    })?;
    match found {
        Some(what) => Err(CopyError::TargetNotEmpty(what)),
        None => Ok(()),
    }
}

/// A store named on the command line: `redb:DIR` (an embedded store's directory; a backup is one) or a
/// PostgreSQL connection string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    Redb(std::path::PathBuf),
    Postgres(String),
}

impl std::str::FromStr for StoreSpec {
    type Err = CopyError;

    fn from_str(s: &str) -> Result<StoreSpec, CopyError> {
        if let Some(dir) = s.strip_prefix("redb:").filter(|d| !d.is_empty()) {
            return Ok(StoreSpec::Redb(dir.into()));
        }
        // A URL or libpq's `key=value` form (`host=/run/pg user=weft dbname=weft`), as `db` in meta.toml.
        let pg = s.starts_with("postgres://") || s.starts_with("postgresql://") || s.contains('=');
        match s.parse::<tokio_postgres::Config>() {
            Ok(_) if pg => Ok(StoreSpec::Postgres(s.to_string())),
            _ => Err(CopyError::BadSpec(s.to_string())),
        }
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Redb(dir) => write!(f, "redb:{}", dir.display()),
            // The connection string may hold a password: only the database and its hosts are shown.
            StoreSpec::Postgres(url) => {
                let Ok(c) = url.parse::<tokio_postgres::Config>() else { return write!(f, "postgres") };
                let hosts: Vec<String> = c
                    .get_hosts()
                    .iter()
                    .map(|h| match h {
                        tokio_postgres::config::Host::Tcp(name) => name.clone(),
                        tokio_postgres::config::Host::Unix(dir) => dir.display().to_string(),
                    })
                    .collect();
                write!(f, "postgres database {} on {}", c.get_dbname().unwrap_or("(default)"), hosts.join(","))
            }
        }
    }
}

impl StoreSpec {
    /// Opens the store (a redb directory is created if missing; its lock keeps a running service out).
    pub fn open(&self) -> Result<crate::MdsStore, MetaError> {
        match self {
            StoreSpec::Redb(dir) => Ok(crate::MdsStore::Redb(RedbStore::open(dir)?)),
            StoreSpec::Postgres(url) => Ok(crate::MdsStore::Pg(Box::new(PgStore::connect(url)?))),
        }
    }
}

/// Whether `dir` may receive a backup: absent, or an empty directory.
pub fn check_backup_dir(dir: &Path) -> Result<(), CopyError> {
    let mut entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(CopyError::Store(MetaError::Io(e))),
        Ok(entries) => entries,
    };
    match entries.next() {
        None => Ok(()),
        Some(_) => Err(CopyError::TargetNotEmpty(format!("{} is not empty", dir.display()))),
    }
}

/// Writes a consistent copy of `from` into a new embedded store in `dir` (absent or empty): a backup, which
/// `weft meta restore` (or `weft meta --config` with `data_dir` pointing at it) serves again.
pub fn backup_to<S: MetaStore>(from: &S, dir: &Path) -> Result<Digest, CopyError> {
    check_backup_dir(dir)?;
    let to = RedbStore::open(dir)?;
    let digest = copy_store(from, &to)?;
    to.checkpoint()?;
    Ok(digest)
}

#[cfg(test)]
mod tests;
