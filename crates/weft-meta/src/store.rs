//! The `MetaStore` abstraction: the namespace rules in [`crate::namespace`] are written once against
//! [`MetaTxn`], and any transactional engine that can run them atomically can hold the namespace.
//!
//! Why this shape: every metadata op is a handful of point reads and writes plus one ordered scan (readdir), and
//! must be atomic (a rename touches up to five records). A closure-per-transaction API keeps retries, commit and
//! abort inside the store, so the embedded engine ([`crate::RedbStore`]), the in-memory test store
//! ([`crate::MemStore`]) and, later, a distributed transactional engine all fit behind it.
//!
//! Invariants every implementation keeps:
//! - `write` is atomic and durable: when it returns `Ok` the changes survive a crash; when `f` returns `Err` none
//!   of its changes are applied.
//! - `read` sees one consistent snapshot and refuses writes with [`MetaError::ReadOnly`].
//! - directory entries are ordered by the bytes of their name (the order `str` compares in), which makes the
//!   readdir cursor (`after` name) stable.

use serde::{Deserialize, Serialize};
use weft_proto::msg::StaleRange;
use weft_proto::{Attr, FileKind, Layout};

use crate::error::MetaError;

/// One inode as stored. Decoupled from the wire's [`Attr`] so stored fields (parent pointer, symlink target) can
/// differ from what is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    pub ino: u64,
    pub kind: FileKind,
    /// Permission bits only (mask 0o7777).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// Directories: the inode of the directory holding it (the root is its own parent). Used to refuse moving a
    /// directory under itself. Other inodes: 0 while `sole_name` names their directory; once hard-linked, the
    /// directory of their newest name (docs/format.md §6, §9: where a reach check walks up from); 0 if unknown.
    pub parent: u64,
    /// Files: the layout fixed at create. Directories: the effective policy new children inherit.
    pub layout: Option<Layout>,
    /// Symlinks: the target. Empty otherwise.
    pub target: String,
    /// Device nodes: the device number. 0 otherwise.
    pub rdev: u32,
    /// Regular files: the version of the bytes (see [`Attr::data_version`]); starts at 1, advanced by
    /// [`Inode::bump_data_version`]. 0 for other kinds.
    pub data_version: u64,
    /// The inode's name (directory, name) while it has exactly one: set at creation and moved by rename,
    /// cleared when a second link is made (and not found again: `None` also for inodes stored before version 6).
    /// The cache bank's entry of this name carries the inode's attributes, refreshed with them (docs/format.md
    /// §12); `None` means its entries carry none.
    pub sole_name: Option<(u64, String)>,
}

impl Inode {
    /// Whether `parent`/`name` is this inode's sole name.
    pub fn is_sole_name(&self, parent: u64, name: &str) -> bool {
        self.sole_name.as_ref().is_some_and(|(p, n)| *p == parent && n == name)
    }
}

/// A layout as stored before issue 13 (no redundancy: plain), in inode records of versions 1 to 3 and orphan
/// records of version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LayoutV1 {
    pub stripe_unit: u32,
    pub stripe_count: u32,
    pub servers: Vec<u32>,
}

impl From<LayoutV1> for Layout {
    fn from(l: LayoutV1) -> Layout {
        Layout {
            stripe_unit: l.stripe_unit,
            stripe_count: l.stripe_count,
            servers: l.servers,
            redundancy: weft_proto::DataRedundancy::Plain,
            generation: 0,
        }
    }
}

/// A layout as stored in inode records of version 4 and orphan records of version 2: with redundancy, without a
/// generation (reads as generation 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LayoutV2 {
    pub stripe_unit: u32,
    pub stripe_count: u32,
    pub servers: Vec<u32>,
    pub redundancy: weft_proto::DataRedundancy,
}

impl From<LayoutV2> for Layout {
    fn from(l: LayoutV2) -> Layout {
        Layout {
            stripe_unit: l.stripe_unit,
            stripe_count: l.stripe_count,
            servers: l.servers,
            redundancy: l.redundancy,
            generation: 0,
        }
    }
}

/// The fourth and fifth stored forms (no sole name), still read; they differ only in the layout's form: `LayoutV2`
/// (with redundancy, no generation) in version 4, today's `Layout` in version 5.
#[derive(Deserialize)]
struct InodeV4V5<L> {
    ino: u64,
    kind: FileKind,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    size: u64,
    atime_ns: i64,
    mtime_ns: i64,
    ctime_ns: i64,
    parent: u64,
    layout: Option<L>,
    target: String,
    rdev: u32,
    data_version: u64,
}

impl<L> InodeV4V5<L> {
    /// Today's inode, its layout converted by `layout`.
    fn upgrade(self, layout: impl FnOnce(L) -> Layout) -> Inode {
        Inode {
            ino: self.ino,
            kind: self.kind,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            nlink: self.nlink,
            size: self.size,
            atime_ns: self.atime_ns,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
            parent: self.parent,
            data_version: self.data_version,
            layout: self.layout.map(layout),
            target: self.target,
            rdev: self.rdev,
            sole_name: None,
        }
    }
}

/// The third stored form (data version, layouts without redundancy), still read.
#[derive(Deserialize)]
struct InodeV3 {
    ino: u64,
    kind: FileKind,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    size: u64,
    atime_ns: i64,
    mtime_ns: i64,
    ctime_ns: i64,
    parent: u64,
    layout: Option<LayoutV1>,
    target: String,
    rdev: u32,
    data_version: u64,
}

/// The second stored form (special files, no data version), still read.
#[derive(Deserialize)]
struct InodeV2 {
    ino: u64,
    kind: FileKind,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    size: u64,
    atime_ns: i64,
    mtime_ns: i64,
    ctime_ns: i64,
    parent: u64,
    layout: Option<LayoutV1>,
    target: String,
    rdev: u32,
}

/// The first stored form of an inode (before special files), still read from old stores.
#[derive(Deserialize)]
struct InodeV1 {
    ino: u64,
    kind: FileKind,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    size: u64,
    atime_ns: i64,
    mtime_ns: i64,
    ctime_ns: i64,
    parent: u64,
    layout: Option<LayoutV1>,
    target: String,
}

/// An inode as stored: version 6 (with the sole name); version 1 to 5 records are still read (no sole name;
/// their layouts are generation 0 before version 5, and plain before version 4; a file's data version reads as 1
/// before version 3).
pub(crate) fn encode_inode(i: &Inode) -> Result<Vec<u8>, MetaError> {
    let mut out = vec![RECORD_V6];
    let body = postcard::to_stdvec(i).map_err(|e| MetaError::Corrupt(format!("encoding an inode: {e}")))?;
    out.extend_from_slice(&body);
    Ok(out)
}

pub(crate) fn decode_inode(what: &str, bytes: &[u8]) -> Result<Inode, MetaError> {
    match bytes.split_first() {
        Some((&RECORD_V6, body)) => decode_exact(what, body),
        Some((&RECORD_V5, body)) => Ok(decode_exact::<InodeV4V5<Layout>>(what, body)?.upgrade(|l| l)),
        Some((&RECORD_V4, body)) => Ok(decode_exact::<InodeV4V5<LayoutV2>>(what, body)?.upgrade(Layout::from)),
        Some((&RECORD_V3, body)) => {
            let v3: InodeV3 = decode_exact(what, body)?;
            Ok(Inode {
                ino: v3.ino,
                kind: v3.kind,
                mode: v3.mode,
                uid: v3.uid,
                gid: v3.gid,
                nlink: v3.nlink,
                size: v3.size,
                atime_ns: v3.atime_ns,
                mtime_ns: v3.mtime_ns,
                ctime_ns: v3.ctime_ns,
                parent: v3.parent,
                data_version: v3.data_version,
                layout: v3.layout.map(Layout::from),
                target: v3.target,
                rdev: v3.rdev,
                sole_name: None,
            })
        }
        Some((&RECORD_V2, body)) => {
            let v2: InodeV2 = decode_exact(what, body)?;
            Ok(Inode {
                ino: v2.ino,
                kind: v2.kind,
                mode: v2.mode,
                uid: v2.uid,
                gid: v2.gid,
                nlink: v2.nlink,
                size: v2.size,
                atime_ns: v2.atime_ns,
                mtime_ns: v2.mtime_ns,
                ctime_ns: v2.ctime_ns,
                parent: v2.parent,
                data_version: initial_data_version(v2.kind),
                layout: v2.layout.map(Layout::from),
                target: v2.target,
                rdev: v2.rdev,
                sole_name: None,
            })
        }
        Some((&RECORD_V1, _)) => {
            let v1: InodeV1 = decode_record(what, bytes)?;
            Ok(Inode {
                ino: v1.ino,
                kind: v1.kind,
                mode: v1.mode,
                uid: v1.uid,
                gid: v1.gid,
                nlink: v1.nlink,
                size: v1.size,
                atime_ns: v1.atime_ns,
                mtime_ns: v1.mtime_ns,
                ctime_ns: v1.ctime_ns,
                parent: v1.parent,
                layout: v1.layout.map(Layout::from),
                data_version: initial_data_version(v1.kind),
                target: v1.target,
                rdev: 0,
                sole_name: None,
            })
        }
        Some((v, _)) => Err(MetaError::Corrupt(format!("{what}: unknown record version {v}"))),
        None => Err(MetaError::Corrupt(format!("{what}: empty record"))),
    }
}

fn decode_exact<'a, T: Deserialize<'a>>(what: &str, body: &'a [u8]) -> Result<T, MetaError> {
    let (v, rest) = postcard::take_from_bytes(body).map_err(|e| MetaError::Corrupt(format!("{what}: {e}")))?;
    if !rest.is_empty() {
        return Err(MetaError::Corrupt(format!("{what}: {} trailing bytes", rest.len())));
    }
    Ok(v)
}

/// The data version a new inode of `kind` starts at (and an inode stored before versions reads as).
pub fn initial_data_version(kind: FileKind) -> u64 {
    if kind == FileKind::File { 1 } else { 0 }
}

impl Inode {
    /// A new data version for a file whose bytes may change (an open for writing, a commit, a size change): every
    /// block cached under an older version is never asked for again. Saturates (2^64 changes are never reached).
    pub fn bump_data_version(&mut self) {
        if self.kind == FileKind::File {
            self.data_version = self.data_version.saturating_add(1);
        }
    }

    pub fn attr(&self) -> Attr {
        Attr {
            ino: self.ino,
            kind: self.kind,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            nlink: self.nlink,
            size: self.size,
            atime_ns: self.atime_ns,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
            layout: self.layout.clone(),
            rdev: self.rdev,
            data_version: self.data_version,
        }
    }
}

/// Version byte in front of every postcard-encoded stored record, so the format can evolve.
const RECORD_V1: u8 = 1;
/// Inodes with `rdev` (special files).
const RECORD_V2: u8 = 2;
/// Inodes with `data_version` (issue 16).
const RECORD_V3: u8 = 3;
/// Inodes whose layout has `redundancy` (issue 13); orphan records use version 2 for the same layout.
const RECORD_V4: u8 = 4;
/// Inodes whose layout has a `generation` (issue 13 item 5, docs/format.md §19); orphan records use version 3.
const RECORD_V5: u8 = 5;
/// Inodes with their sole name (issue 16: the cache bank's entries carry attributes, docs/format.md §12).
const RECORD_V6: u8 = 6;
const ORPHAN_V2: u8 = 2;
const ORPHAN_V3: u8 = 3;

/// An orphan record: version 3, a [`Layout`] with redundancy and generation.
pub(crate) fn encode_orphan(l: &Layout) -> Result<Vec<u8>, MetaError> {
    let mut out = vec![ORPHAN_V3];
    let body = postcard::to_stdvec(l).map_err(|e| MetaError::Corrupt(format!("encoding a layout: {e}")))?;
    out.extend_from_slice(&body);
    Ok(out)
}

/// Reads an orphan record of version 3, 2 (generation 0) or 1 (a plain layout).
pub(crate) fn decode_orphan(what: &str, bytes: &[u8]) -> Result<Layout, MetaError> {
    match bytes.split_first() {
        Some((&ORPHAN_V3, body)) => decode_exact(what, body),
        Some((&ORPHAN_V2, body)) => decode_exact::<LayoutV2>(what, body).map(Layout::from),
        Some((&RECORD_V1, _)) => decode_record::<LayoutV1>(what, bytes).map(Layout::from),
        Some((v, _)) => Err(MetaError::Corrupt(format!("{what}: unknown record version {v}"))),
        None => Err(MetaError::Corrupt(format!("{what}: empty record"))),
    }
}

#[cfg(test)]
pub(crate) fn encode_record<T: Serialize>(v: &T) -> Result<Vec<u8>, MetaError> {
    let mut out = vec![RECORD_V1];
    let body = postcard::to_stdvec(v).map_err(|e| MetaError::Corrupt(format!("encoding a record: {e}")))?;
    out.extend_from_slice(&body);
    Ok(out)
}

pub(crate) fn decode_record<'a, T: Deserialize<'a>>(what: &str, bytes: &'a [u8]) -> Result<T, MetaError> {
    match bytes.split_first() {
        Some((&RECORD_V1, body)) => decode_exact(what, body),
        Some((v, _)) => Err(MetaError::Corrupt(format!("{what}: unknown record version {v}"))),
        None => Err(MetaError::Corrupt(format!("{what}: empty record"))),
    }
}

pub(crate) fn kind_to_u8(k: FileKind) -> u8 {
    match k {
        FileKind::File => 0,
        FileKind::Dir => 1,
        FileKind::Symlink => 2,
        FileKind::Fifo => 3,
        FileKind::Socket => 4,
        FileKind::CharDev => 5,
        FileKind::BlockDev => 6,
    }
}

pub(crate) fn kind_from_u8(v: u8) -> Result<FileKind, MetaError> {
    match v {
        0 => Ok(FileKind::File),
        1 => Ok(FileKind::Dir),
        2 => Ok(FileKind::Symlink),
        3 => Ok(FileKind::Fifo),
        4 => Ok(FileKind::Socket),
        5 => Ok(FileKind::CharDev),
        6 => Ok(FileKind::BlockDev),
        _ => Err(MetaError::Corrupt(format!("unknown file kind {v} in a directory entry"))),
    }
}

/// A transactional store of inodes, directory entries, data servers and orphaned objects.
pub trait MetaStore: Send + Sync + 'static {
    /// Runs `f` in one atomic write transaction, durable (fsynced) before this returns `Ok`. If `f` returns `Err`,
    /// nothing it did is applied. Store failures reach the caller through `E: From<MetaError>`. A shared store
    /// ([`crate::PgStore`]) may run `f` again, from the state before it, when the transaction conflicted with
    /// another service's: `f` must not have effects outside the transaction that a second run would repeat.
    fn write<R, E: From<MetaError>>(&self, f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E>;

    /// Runs `f` against a consistent snapshot. Writes inside it fail with [`MetaError::ReadOnly`]. A shared store
    /// may run `f` again on a fresh snapshot when its connection was lost mid-read.
    fn read<R, E: From<MetaError>>(&self, f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E>;

    /// Whether other metadata services may open the same store at the same time (PostgreSQL): the namespace then
    /// keeps liveness and phases in it and runs its duties under the duty lease (docs/format.md §28).
    fn shared(&self) -> bool {
        false
    }
}

/// The operations of one transaction. Object safe, so the namespace logic is compiled once per store.
pub trait MetaTxn {
    fn get_inode(&mut self, ino: u64) -> Result<Option<Inode>, MetaError>;
    /// Inserts or replaces an inode.
    fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError>;
    fn del_inode(&mut self, ino: u64) -> Result<(), MetaError>;
    fn get_dirent(&mut self, parent: u64, name: &str) -> Result<Option<(u64, FileKind)>, MetaError>;
    /// Inserts or replaces an entry.
    fn put_dirent(&mut self, parent: u64, name: &str, ino: u64, kind: FileKind) -> Result<(), MetaError>;
    fn del_dirent(&mut self, parent: u64, name: &str) -> Result<(), MetaError>;
    /// Entries of `parent` whose name is strictly greater than `after`, in name order, at most `limit`.
    fn list_dirents(
        &mut self,
        parent: u64,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, u64, FileKind)>, MetaError>;
    fn dir_is_empty(&mut self, parent: u64) -> Result<bool, MetaError>;
    /// Allocates a new inode number from a persisted counter; numbers are never reused.
    fn next_ino(&mut self) -> Result<u64, MetaError>;
    /// Records (or re-addresses) a data server. Ids are stable because layouts name them.
    fn put_server(&mut self, id: u32, addr: &str) -> Result<(), MetaError>;
    /// Every recorded data server, sorted by id.
    fn list_servers(&mut self) -> Result<Vec<(u32, String)>, MetaError>;
    /// Data server `id`'s recorded address. A store that can look one up should: a heartbeat asks it, and a list
    /// of every server per heartbeat costs N² a second (docs/bench.md, the metadata service at scale).
    fn get_server(&mut self, id: u32) -> Result<Option<String>, MetaError> {
        Ok(self.list_servers()?.into_iter().find(|(i, _)| *i == id).map(|(_, addr)| addr))
    }
    /// Records data server `id`'s membership phase (format §19's code; 0 = member, the default for an id never
    /// given one), so a restarted MDS still drains a replaced server before it serves.
    fn put_server_phase(&mut self, id: u32, phase: u8) -> Result<(), MetaError>;
    /// Every recorded membership phase, sorted by id.
    fn list_server_phases(&mut self) -> Result<Vec<(u32, u8)>, MetaError>;
    /// Records that the objects of removed file `ino` must be deleted from the servers of `layout`.
    fn put_orphan(&mut self, ino: u64, layout: &Layout) -> Result<(), MetaError>;
    fn del_orphan(&mut self, ino: u64) -> Result<(), MetaError>;
    /// Up to `limit` orphans, lowest inode first.
    fn list_orphans(&mut self, limit: usize) -> Result<Vec<(u64, Layout)>, MetaError>;
    /// Number of inodes stored.
    fn count_inodes(&mut self) -> Result<u64, MetaError>;
    /// Up to `limit` inodes numbered above `after`, lowest first: a bounded page of a whole-namespace scan (the
    /// membership scan of docs/format.md §19).
    fn list_inodes(&mut self, after: u64, limit: usize) -> Result<Vec<Inode>, MetaError>;
    /// The value of extended attribute `name` of inode `ino`.
    fn get_xattr(&mut self, ino: u64, name: &str) -> Result<Option<Vec<u8>>, MetaError>;
    /// Inserts or replaces an extended attribute.
    fn put_xattr(&mut self, ino: u64, name: &str, value: &[u8]) -> Result<(), MetaError>;
    fn del_xattr(&mut self, ino: u64, name: &str) -> Result<(), MetaError>;
    /// Every extended attribute of `ino` as (name, value length), in name order. The caller bounds how many an
    /// inode may have (see `crate::namespace`), so the list is bounded too.
    fn list_xattrs(&mut self, ino: u64) -> Result<Vec<(String, usize)>, MetaError>;
    /// The stale ranges of (ino, slot) (docs/format.md §18), `None` when it has none.
    fn get_stale(&mut self, ino: u64, slot: u32) -> Result<Option<Vec<StaleRange>>, MetaError>;
    /// Inserts or replaces the (non-empty) ranges of (ino, slot), keeping the entry count.
    fn put_stale(&mut self, ino: u64, slot: u32, ranges: &[StaleRange]) -> Result<(), MetaError>;
    /// Removes (ino, slot)'s entry, keeping the entry count.
    fn del_stale(&mut self, ino: u64, slot: u32) -> Result<(), MetaError>;
    /// Entries whose key (ino, slot) is strictly greater than `after` (every entry for `None`), in key order, at
    /// most `limit`.
    fn list_stale(
        &mut self,
        after: Option<(u64, u32)>,
        limit: usize,
    ) -> Result<Vec<(u64, u32, Vec<StaleRange>)>, MetaError>;
    /// Number of (ino, slot) entries stored.
    fn count_stale(&mut self) -> Result<u64, MetaError>;
    /// A new stale-range sequence number from a persisted counter (never reused).
    fn next_stale_seq(&mut self) -> Result<u64, MetaError>;
    /// The last inode number and stale sequence number handed out (a copy of the store carries them on, so the
    /// copy never hands one out twice). A shared store may answer values above its snapshot's: never below.
    fn counters(&mut self) -> Result<Counters, MetaError>;
    /// Raises each counter to at least `c`'s value (never lowers one).
    fn raise_counters(&mut self, c: Counters) -> Result<(), MetaError>;
    /// Asks that this change and every other one naming any of `dirs` run one at a time, across every service:
    /// called first in a change that adds or removes entries of `dirs`, before any read. Concurrent changes of
    /// one directory conflict on a shared store (its row and its entries' index), and one that waits costs less
    /// than one that fails at its commit and runs again. A hint: a store whose writes run one at a time anyway
    /// (redb, memory) ignores it.
    fn serialize_dirs(&mut self, _dirs: &[u64]) {}
    /// Says that the transaction is about to read directory `parent`'s inode, its entry `name` and that entry's
    /// inode, so that a store where each read is a round trip fetches the three in one. A hint: the reads that
    /// follow return what they would have without it, and a store whose reads are local ignores it.
    fn prefetch_entry(&mut self, _parent: u64, _name: &str) -> Result<(), MetaError> {
        Ok(())
    }
    /// [`MetaTxn::prefetch_entry`] for a change that may make an inode named `name` in `parent`: also reads the
    /// directory's extended attribute `xattr` (its default ACL) and the servers, and takes the inode number that
    /// [`MetaTxn::next_ino`] returns next, all in one round trip. A hint, as `prefetch_entry` is; the number it
    /// takes is lost if the change makes nothing (numbers are never reused either way).
    fn prefetch_create(&mut self, parent: u64, name: &str, _xattr: &str) -> Result<(), MetaError> {
        self.prefetch_entry(parent, name)
    }
    /// Asks that the committed value of `ino`'s extended attribute `name` be read apart from the transaction's
    /// own reads: on a shared store, by a statement of its own just before the transaction begins (after its
    /// directory locks), sent with the transaction's first statement, so that it costs no round trip and takes
    /// none of the transaction's read locks. Effective only before the first read. [`MetaTxn::xattr_apart`]
    /// answers; a store whose writes run one at a time reads it in the transaction.
    fn read_xattr_apart(&mut self, _ino: u64, _name: &str) {}
    /// What [`MetaTxn::read_xattr_apart`] read, or, when it could not read it apart, the value in the transaction.
    fn xattr_apart(&mut self, ino: u64, name: &str) -> Result<Option<Vec<u8>>, MetaError> {
        self.get_xattr(ino, name)
    }
}

/// The store's allocation counters (see [`MetaTxn::counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// The last inode number handed out (`ROOT_INO` in a new store).
    pub last_ino: u64,
    /// The last stale-range sequence number handed out (0 in a new store).
    pub last_stale_seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_records_of_version_1_still_decode() {
        // The version 1 layout: every field of today's inode but `rdev`.
        #[derive(Serialize)]
        struct V1<'a> {
            ino: u64,
            kind: FileKind,
            mode: u32,
            uid: u32,
            gid: u32,
            nlink: u32,
            size: u64,
            atime_ns: i64,
            mtime_ns: i64,
            ctime_ns: i64,
            parent: u64,
            layout: Option<LayoutV1>,
            target: &'a str,
        }
        let old = V1 {
            ino: 9,
            kind: FileKind::Symlink,
            mode: 0o777,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 3,
            atime_ns: 4,
            mtime_ns: 5,
            ctime_ns: 6,
            parent: 0,
            layout: None,
            target: "abc",
        };
        let i = decode_inode("old", &encode_record(&old).unwrap()).unwrap();
        assert_eq!(
            (i.ino, i.kind, i.size, i.mtime_ns, i.target.as_str(), i.rdev, i.data_version),
            (9, FileKind::Symlink, 3, 5, "abc", 0, 0)
        );
        // Today's records round-trip, rdev included; garbage is Corrupt, not a panic.
        let new = Inode { rdev: 0x0801, kind: FileKind::BlockDev, target: String::new(), ..i };
        assert_eq!(decode_inode("new", &encode_inode(&new).unwrap()).unwrap(), new);
        for bad in [&[][..], &[2], &[3, 1, 2], &[4, 1, 2], &[5, 1, 2], &[1, 0xff]] {
            assert!(matches!(decode_inode("bad", bad), Err(MetaError::Corrupt(_))), "{bad:?}");
        }
    }

    #[test]
    fn version_4_inodes_and_version_2_orphans_read_as_layout_generation_0() {
        let layout = Layout {
            stripe_unit: 4096,
            stripe_count: 3,
            servers: vec![4, 5, 6],
            redundancy: weft_proto::DataRedundancy::Ec { k: 2, m: 1 },
            generation: 0,
        };
        let v2 = LayoutV2 {
            stripe_unit: 4096,
            stripe_count: 3,
            servers: vec![4, 5, 6],
            redundancy: weft_proto::DataRedundancy::Ec { k: 2, m: 1 },
        };
        // A version 4 record: today's inode with the layout as it was before the generation.
        #[derive(Serialize)]
        struct V4<'a> {
            ino: u64,
            kind: FileKind,
            mode: u32,
            uid: u32,
            gid: u32,
            nlink: u32,
            size: u64,
            atime_ns: i64,
            mtime_ns: i64,
            ctime_ns: i64,
            parent: u64,
            layout: Option<&'a LayoutV2>,
            target: String,
            rdev: u32,
            data_version: u64,
        }
        let old = V4 {
            ino: 7,
            kind: FileKind::File,
            mode: 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 10,
            atime_ns: 4,
            mtime_ns: 5,
            ctime_ns: 6,
            parent: 0,
            layout: Some(&v2),
            target: String::new(),
            rdev: 0,
            data_version: 3,
        };
        let mut bytes = vec![RECORD_V4];
        bytes.extend(postcard::to_stdvec(&old).unwrap());
        let mut i = decode_inode("v4", &bytes).unwrap();
        assert_eq!((i.layout.clone(), i.data_version), (Some(layout.clone()), 3));
        // Written back as version 6 with its generation.
        i.layout.as_mut().unwrap().generation = 9;
        let enc = encode_inode(&i).unwrap();
        assert_eq!(enc[0], RECORD_V6);
        assert_eq!(decode_inode("v6", &enc).unwrap(), i);
        // A later body under the version 4 byte is refused, not misread.
        let mut v6_as_v4 = enc.clone();
        v6_as_v4[0] = RECORD_V4;
        assert!(matches!(decode_inode("mixed", &v6_as_v4), Err(MetaError::Corrupt(_))));
        // Version 5 is version 6 without the sole name (postcard's `None` is the one byte 0 at the end): it
        // reads as no sole name, and a version 6 body under the version 5 byte is refused.
        assert_eq!(enc.last(), Some(&0));
        let mut v5 = enc[..enc.len() - 1].to_vec();
        v5[0] = RECORD_V5;
        assert_eq!(decode_inode("v5", &v5).unwrap(), i);
        let mut v6_as_v5 = enc.clone();
        v6_as_v5[0] = RECORD_V5;
        assert!(matches!(decode_inode("mixed", &v6_as_v5), Err(MetaError::Corrupt(_))));
        let named = Inode { sole_name: Some((1, "f".into())), ..i.clone() };
        assert_eq!(decode_inode("v6", &encode_inode(&named).unwrap()).unwrap(), named);
        // Orphans: version 2 reads as generation 0; version 3 round-trips.
        let mut o = vec![ORPHAN_V2];
        o.extend(postcard::to_stdvec(&v2).unwrap());
        assert_eq!(decode_orphan("o2", &o).unwrap(), layout);
        let l9 = Layout { generation: 9, ..layout };
        assert_eq!(decode_orphan("o3", &encode_orphan(&l9).unwrap()).unwrap(), l9);
    }

    #[test]
    fn inode_records_of_version_2_read_as_data_version_1() {
        // The version 2 layout: version 1 plus `rdev`, no `data_version`.
        #[derive(Serialize)]
        struct V2 {
            ino: u64,
            kind: FileKind,
            mode: u32,
            uid: u32,
            gid: u32,
            nlink: u32,
            size: u64,
            atime_ns: i64,
            mtime_ns: i64,
            ctime_ns: i64,
            parent: u64,
            layout: Option<LayoutV1>,
            target: String,
            rdev: u32,
        }
        let layout = Some(Layout {
            stripe_unit: 65536,
            stripe_count: 1,
            servers: vec![0],
            redundancy: weft_proto::DataRedundancy::Plain,
            generation: 0,
        });
        let old_layout = Some(LayoutV1 { stripe_unit: 65536, stripe_count: 1, servers: vec![0] });
        let old = V2 {
            ino: 7,
            kind: FileKind::File,
            mode: 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 10,
            atime_ns: 4,
            mtime_ns: 5,
            ctime_ns: 6,
            parent: 0,
            layout: old_layout,
            target: String::new(),
            rdev: 0,
        };
        let mut bytes = vec![RECORD_V2];
        bytes.extend(postcard::to_stdvec(&old).unwrap());
        let mut i = decode_inode("v2", &bytes).unwrap();
        assert_eq!((i.ino, i.size, i.layout.clone(), i.data_version), (7, 10, layout, 1));
        i.bump_data_version();
        assert_eq!(i.attr().data_version, 2);
        let back = decode_inode("v3", &encode_inode(&i).unwrap()).unwrap();
        assert_eq!(back, i);
        assert_eq!(encode_inode(&i).unwrap()[0], 6, "written as version 6");
        // The version byte says which layout follows: a v3 body under the v2 byte is refused, not misread.
        let mut v3_as_v2 = encode_inode(&i).unwrap();
        v3_as_v2[0] = RECORD_V2;
        assert!(matches!(decode_inode("mixed", &v3_as_v2), Err(MetaError::Corrupt(_))));
        // Only files have a data version.
        let mut dir = Inode { kind: FileKind::Dir, data_version: 0, ..i };
        dir.bump_data_version();
        assert_eq!(dir.data_version, 0);
    }
}
