//! `MemStore`: the namespace in `BTreeMap`s behind one mutex, for fast, deterministic unit tests.
//!
//! Why an undo log rather than a copy of the state per transaction: tests create 100,000-entry directories, and
//! cloning maps of that size per op would make them quadratic. Each write records the previous value of every key it
//! touches; when the transaction's closure fails, the log is replayed backwards, so an `Err` applies nothing.
//! Not durable, by design.

use std::collections::BTreeMap;
use std::sync::Mutex;

use weft_proto::msg::StaleRange;
use weft_proto::{FileKind, Layout, ROOT_INO};

use crate::error::MetaError;
use crate::store::{Counters, Inode, MetaStore, MetaTxn};

#[derive(Debug, Default)]
struct State {
    inodes: BTreeMap<u64, Inode>,
    dirents: BTreeMap<(u64, String), (u64, FileKind)>,
    servers: BTreeMap<u32, String>,
    phases: BTreeMap<u32, u8>,
    orphans: BTreeMap<u64, Layout>,
    xattrs: BTreeMap<(u64, String), Vec<u8>>,
    stale: BTreeMap<(u64, u32), Vec<StaleRange>>,
    last_ino: u64,
    last_stale_seq: u64,
}

enum Undo {
    Inode(u64, Option<Inode>),
    Dirent((u64, String), Option<(u64, FileKind)>),
    Server(u32, Option<String>),
    Phase(u32, Option<u8>),
    Orphan(u64, Option<Layout>),
    Xattr((u64, String), Option<Vec<u8>>),
    Stale((u64, u32), Option<Vec<StaleRange>>),
    LastIno(u64),
    LastStaleSeq(u64),
}

/// In-memory [`MetaStore`].
#[derive(Debug, Default)]
pub struct MemStore {
    state: Mutex<State>,
}

impl MemStore {
    pub fn new() -> Self {
        MemStore { state: Mutex::new(State { last_ino: ROOT_INO, ..State::default() }) }
    }
}

struct MemTxn<'a> {
    st: &'a mut State,
    /// `None` in a read transaction: writes are refused.
    undo: Option<Vec<Undo>>,
}

impl MemTxn<'_> {
    fn log(&mut self, u: Undo) -> Result<(), MetaError> {
        match &mut self.undo {
            Some(log) => {
                log.push(u);
                Ok(())
            }
            None => Err(MetaError::ReadOnly),
        }
    }

    fn check_writable(&self) -> Result<(), MetaError> {
        if self.undo.is_none() { Err(MetaError::ReadOnly) } else { Ok(()) }
    }

    fn rollback(self) {
        let MemTxn { st, undo } = self;
        for u in undo.unwrap_or_default().into_iter().rev() {
            match u {
                Undo::Inode(k, v) => restore(&mut st.inodes, k, v),
                Undo::Dirent(k, v) => restore(&mut st.dirents, k, v),
                Undo::Server(k, v) => restore(&mut st.servers, k, v),
                Undo::Phase(k, v) => restore(&mut st.phases, k, v),
                Undo::Orphan(k, v) => restore(&mut st.orphans, k, v),
                Undo::Xattr(k, v) => restore(&mut st.xattrs, k, v),
                Undo::Stale(k, v) => restore(&mut st.stale, k, v),
                Undo::LastIno(v) => st.last_ino = v,
                Undo::LastStaleSeq(v) => st.last_stale_seq = v,
            }
        }
    }
}

fn restore<K: Ord, V>(m: &mut BTreeMap<K, V>, k: K, v: Option<V>) {
    match v {
        Some(v) => {
            m.insert(k, v);
        }
        None => {
            m.remove(&k);
        }
    }
}

impl MetaStore for MemStore {
    fn write<R, E: From<MetaError>>(&self, mut f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        let mut guard = self.state.lock().map_err(|_| MetaError::Poisoned)?;
        let mut txn = MemTxn { st: &mut guard, undo: Some(Vec::new()) };
        match f(&mut txn) {
            Ok(r) => Ok(r),
            Err(e) => {
                txn.rollback();
                Err(e)
            }
        }
    }

    fn read<R, E: From<MetaError>>(&self, mut f: impl FnMut(&mut dyn MetaTxn) -> Result<R, E>) -> Result<R, E> {
        let mut guard = self.state.lock().map_err(|_| MetaError::Poisoned)?;
        let mut txn = MemTxn { st: &mut guard, undo: None };
        f(&mut txn)
    }
}

impl MetaTxn for MemTxn<'_> {
    fn get_inode(&mut self, ino: u64) -> Result<Option<Inode>, MetaError> {
        Ok(self.st.inodes.get(&ino).cloned())
    }

    fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError> {
        self.check_writable()?;
        let old = self.st.inodes.insert(inode.ino, inode.clone());
        self.log(Undo::Inode(inode.ino, old))
    }

    fn del_inode(&mut self, ino: u64) -> Result<(), MetaError> {
        self.check_writable()?;
        let old = self.st.inodes.remove(&ino);
        self.log(Undo::Inode(ino, old))
    }

    fn get_dirent(&mut self, parent: u64, name: &str) -> Result<Option<(u64, FileKind)>, MetaError> {
        Ok(self.st.dirents.get(&(parent, name.to_string())).copied())
    }

    fn put_dirent(&mut self, parent: u64, name: &str, ino: u64, kind: FileKind) -> Result<(), MetaError> {
        self.check_writable()?;
        let key = (parent, name.to_string());
        let old = self.st.dirents.insert(key.clone(), (ino, kind));
        self.log(Undo::Dirent(key, old))
    }

    fn del_dirent(&mut self, parent: u64, name: &str) -> Result<(), MetaError> {
        self.check_writable()?;
        let key = (parent, name.to_string());
        let old = self.st.dirents.remove(&key);
        self.log(Undo::Dirent(key, old))
    }

    fn list_dirents(
        &mut self,
        parent: u64,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, u64, FileKind)>, MetaError> {
        use std::ops::Bound::{Excluded, Unbounded};
        Ok(self
            .st
            .dirents
            .range((Excluded((parent, after.to_string())), Unbounded))
            .take_while(|((p, _), _)| *p == parent)
            .take(limit)
            .map(|((_, name), (ino, kind))| (name.clone(), *ino, *kind))
            .collect())
    }

    fn dir_is_empty(&mut self, parent: u64) -> Result<bool, MetaError> {
        Ok(self.list_dirents(parent, "", 1)?.is_empty())
    }

    fn next_ino(&mut self) -> Result<u64, MetaError> {
        self.check_writable()?;
        let old = self.st.last_ino;
        let next = old.checked_add(1).ok_or_else(|| MetaError::Corrupt("inode numbers exhausted".into()))?;
        self.st.last_ino = next;
        self.log(Undo::LastIno(old))?;
        Ok(next)
    }

    fn put_server(&mut self, id: u32, addr: &str) -> Result<(), MetaError> {
        self.check_writable()?;
        let old = self.st.servers.insert(id, addr.to_string());
        self.log(Undo::Server(id, old))
    }

    fn list_servers(&mut self) -> Result<Vec<(u32, String)>, MetaError> {
        Ok(self.st.servers.iter().map(|(k, v)| (*k, v.clone())).collect())
    }

    fn get_server(&mut self, id: u32) -> Result<Option<String>, MetaError> {
        Ok(self.st.servers.get(&id).cloned())
    }

    fn put_server_phase(&mut self, id: u32, phase: u8) -> Result<(), MetaError> {
        self.check_writable()?;
        let old = self.st.phases.insert(id, phase);
        self.log(Undo::Phase(id, old))
    }

    fn list_server_phases(&mut self) -> Result<Vec<(u32, u8)>, MetaError> {
        Ok(self.st.phases.iter().map(|(k, v)| (*k, *v)).collect())
    }

    fn put_orphan(&mut self, ino: u64, layout: &Layout) -> Result<(), MetaError> {
        self.check_writable()?;
        let old = self.st.orphans.insert(ino, layout.clone());
        self.log(Undo::Orphan(ino, old))
    }

    fn del_orphan(&mut self, ino: u64) -> Result<(), MetaError> {
        self.check_writable()?;
        let old = self.st.orphans.remove(&ino);
        self.log(Undo::Orphan(ino, old))
    }

    fn list_orphans(&mut self, limit: usize) -> Result<Vec<(u64, Layout)>, MetaError> {
        Ok(self.st.orphans.iter().take(limit).map(|(k, v)| (*k, v.clone())).collect())
    }

    fn count_inodes(&mut self) -> Result<u64, MetaError> {
        Ok(self.st.inodes.len() as u64)
    }

    fn list_inodes(&mut self, after: u64, limit: usize) -> Result<Vec<Inode>, MetaError> {
        if after == u64::MAX {
            return Ok(Vec::new());
        }
        Ok(self.st.inodes.range(after + 1..).take(limit).map(|(_, v)| v.clone()).collect())
    }

    fn get_xattr(&mut self, ino: u64, name: &str) -> Result<Option<Vec<u8>>, MetaError> {
        Ok(self.st.xattrs.get(&(ino, name.to_string())).cloned())
    }

    fn put_xattr(&mut self, ino: u64, name: &str, value: &[u8]) -> Result<(), MetaError> {
        self.check_writable()?;
        let key = (ino, name.to_string());
        let old = self.st.xattrs.insert(key.clone(), value.to_vec());
        self.log(Undo::Xattr(key, old))
    }

    fn del_xattr(&mut self, ino: u64, name: &str) -> Result<(), MetaError> {
        self.check_writable()?;
        let key = (ino, name.to_string());
        let old = self.st.xattrs.remove(&key);
        self.log(Undo::Xattr(key, old))
    }

    fn list_xattrs(&mut self, ino: u64) -> Result<Vec<(String, usize)>, MetaError> {
        use std::ops::Bound::{Included, Unbounded};
        Ok(self
            .st
            .xattrs
            .range((Included((ino, String::new())), Unbounded))
            .take_while(|((i, _), _)| *i == ino)
            .map(|((_, name), v)| (name.clone(), v.len()))
            .collect())
    }

    fn get_stale(&mut self, ino: u64, slot: u32) -> Result<Option<Vec<StaleRange>>, MetaError> {
        Ok(self.st.stale.get(&(ino, slot)).cloned())
    }

    fn put_stale(&mut self, ino: u64, slot: u32, ranges: &[StaleRange]) -> Result<(), MetaError> {
        self.check_writable()?;
        let old = self.st.stale.insert((ino, slot), ranges.to_vec());
        self.log(Undo::Stale((ino, slot), old))
    }

    fn del_stale(&mut self, ino: u64, slot: u32) -> Result<(), MetaError> {
        self.check_writable()?;
        let old = self.st.stale.remove(&(ino, slot));
        self.log(Undo::Stale((ino, slot), old))
    }

    fn list_stale(
        &mut self,
        after: Option<(u64, u32)>,
        limit: usize,
    ) -> Result<Vec<(u64, u32, Vec<StaleRange>)>, MetaError> {
        use std::ops::Bound::{Excluded, Unbounded};
        let lower = after.map_or(Unbounded, Excluded);
        Ok(self.st.stale.range((lower, Unbounded)).take(limit).map(|(&(i, s), r)| (i, s, r.clone())).collect())
    }

    fn count_stale(&mut self) -> Result<u64, MetaError> {
        Ok(self.st.stale.len() as u64)
    }

    fn next_stale_seq(&mut self) -> Result<u64, MetaError> {
        self.check_writable()?;
        let old = self.st.last_stale_seq;
        self.st.last_stale_seq = old + 1;
        self.log(Undo::LastStaleSeq(old))?;
        Ok(old + 1)
    }

    fn counters(&mut self) -> Result<Counters, MetaError> {
        Ok(Counters { last_ino: self.st.last_ino, last_stale_seq: self.st.last_stale_seq })
    }

    fn raise_counters(&mut self, c: Counters) -> Result<(), MetaError> {
        self.check_writable()?;
        if c.last_ino > self.st.last_ino {
            self.log(Undo::LastIno(self.st.last_ino))?;
            self.st.last_ino = c.last_ino;
        }
        if c.last_stale_seq > self.st.last_stale_seq {
            self.log(Undo::LastStaleSeq(self.st.last_stale_seq))?;
            self.st.last_stale_seq = c.last_stale_seq;
        }
        Ok(())
    }
}
