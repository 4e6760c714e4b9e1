//! The gateway's bounded cache of open files, so an NFS READ or WRITE (stateless: a handle and an offset) does
//! not cost an MDS `Open` each.
//!
//! Entries are keyed by (inode, user): a capability obtained for one caller's permissions is never used for
//! another's. At most `open_files_max` entries; inserting into a full cache closes the least recently used one.
//! Closing an entry — on eviction, after `open_idle_ms` unused, before a SETATTR of its size, at shutdown — is
//! `File::sync`: the objects are fsynced and size and mtime committed to the MDS, so data the client wrote
//! UNSTABLE is durable once its entry is gone, and NFS COMMIT syncs every entry of the inode.
//!
//! Close-to-open: a client opening a file sends GETATTR, answered from the MDS (raised by the size of this
//! gateway's uncommitted writes) and passed to every cached entry of the inode (`File::observe_open`), so a
//! cached handle then reads what another path (FUSE, another gateway) wrote and closed.
//!
//! The read-ahead windows ([`crate::readahead`]) live here too, so every event that must drop them (attributes
//! answered, a WRITE, a COMMIT, a size change, a handle closed) passes through one place.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weft_client::{Client, ClientError, File, OpenMode};
use weft_proto::{Attr, UserCred};

use crate::readahead::ReadAhead;

type Key = (u64, UserCred);

struct Entry {
    file: Arc<File>,
    writable: bool,
    used: Instant,
}

/// The WRITE/COMMIT verifier an NFS client compares (RFC 1813 §3.3.7, RFC 8881 §18.32): new at every start, and
/// renewed when a data server lost writes the gateway had not synced (docs/format.md §33), so the clients resend
/// every write they have not seen committed instead of losing it.
pub struct WriteVerifier(std::sync::atomic::AtomicU64);

impl WriteVerifier {
    pub fn new(v: u64) -> WriteVerifier {
        WriteVerifier(std::sync::atomic::AtomicU64::new(v))
    }

    pub fn get(&self) -> [u8; 8] {
        self.0.load(std::sync::atomic::Ordering::SeqCst).to_be_bytes()
    }

    /// A sync found writes lost at a data server: the verifier every later WRITE and COMMIT answers with changes.
    fn renew(&self, ino: u64, e: &ClientError) {
        let v = weft_rpc::auth::random_id();
        self.0.store(v, std::sync::atomic::Ordering::SeqCst);
        tracing::warn!(
            ino,
            verifier = format_args!("{v:#018x}"),
            "writes not yet synced were lost at a data server; the write verifier changes so NFS clients resend \
             what they have not seen committed: {e}"
        );
    }

    /// Runs `sync` (a handle's sync or commit); when it reports writes lost at a data server
    /// ([`ClientError::WritesLost`]), renews the verifier (the clients resend) and runs it once more, which then
    /// commits what survived (the size a failed sync left uncommitted). A second loss in a row is answered the
    /// same way, without a third try.
    pub async fn synced<T: Default, Fut: Future<Output = Result<T, ClientError>>>(
        &self,
        ino: u64,
        mut sync: impl FnMut() -> Fut,
    ) -> Result<T, ClientError> {
        match sync().await {
            Err(e @ ClientError::WritesLost { .. }) => self.renew(ino, &e),
            r => return r,
        }
        match sync().await {
            Err(e @ ClientError::WritesLost { .. }) => {
                self.renew(ino, &e);
                Ok(T::default())
            }
            r => r,
        }
    }
}

pub struct OpenFiles {
    /// What WRITE and COMMIT answer with.
    pub verifier: Arc<WriteVerifier>,
    map: Mutex<HashMap<Key, Entry>>,
    open_files_max: usize,
    open_idle: Duration,
    /// Read-ahead windows of the cached files.
    pub ahead: ReadAhead,
}

impl OpenFiles {
    /// `read_ahead_files_max` windows of `read_ahead_depth` ranges (either 0: no read-ahead).
    pub fn new(
        verifier: u64,
        open_files_max: usize,
        open_idle_ms: u64,
        read_ahead_files_max: usize,
        read_ahead_depth: usize,
    ) -> OpenFiles {
        OpenFiles {
            verifier: Arc::new(WriteVerifier::new(verifier)),
            map: Mutex::new(HashMap::new()),
            open_files_max: open_files_max.max(1),
            open_idle: Duration::from_millis(open_idle_ms),
            ahead: ReadAhead::new(read_ahead_files_max, read_ahead_depth),
        }
    }

    /// After a WRITE of `ino` through this gateway (or a size change): what was read ahead may predate it.
    pub fn wrote(&self, ino: u64) {
        self.ahead.drop_inode(ino);
    }

    /// An open file for `client`'s user, for writing (`write`) or reading; opened at the MDS if not cached, as an
    /// NFS server's stateless READ or WRITE (`NfsOpen`: the file's owner passes whatever the mode, as knfsd).
    pub async fn get(&self, client: &Client, ino: u64, write: bool) -> Result<Arc<File>, ClientError> {
        self.get_as(client, ino, write, true).await
    }

    /// [`OpenFiles::get`] for an NFSv4 OPEN of an existing file: opened with `Open`, whose mode check binds the
    /// owner too (knfsd applies its owner override to a file the OPEN created, which the caller handles).
    pub async fn get_for_open(&self, client: &Client, ino: u64, write: bool) -> Result<Arc<File>, ClientError> {
        self.get_as(client, ino, write, false).await
    }

    async fn get_as(
        &self,
        client: &Client,
        ino: u64,
        write: bool,
        owner_override: bool,
    ) -> Result<Arc<File>, ClientError> {
        let key = (ino, client.user().clone());
        if write {
            // Before the write too: a range read ahead while it runs is dropped by the `wrote` after it.
            self.ahead.drop_inode(ino);
        }
        {
            let mut map = self.map.lock().expect("open files");
            if let Some(e) = map.get_mut(&key)
                && (e.writable || !write)
            {
                e.used = Instant::now();
                return Ok(e.file.clone());
            }
        }
        // Writers open for writing only if they may not read (a 0200 file): NFS clients read-modify-write pages.
        let open = |mode| async move {
            if owner_override { client.nfs_open_ino(ino, mode).await } else { client.open_ino(ino, mode).await }
        };
        let file = if write {
            match open(OpenMode::ReadWrite).await {
                Ok(f) => f,
                Err(e) if crate::status::status_of(&e) == crate::status::NFS3ERR_ACCES => open(OpenMode::Write).await?,
                Err(e) => return Err(e),
            }
        } else {
            open(OpenMode::Read).await?
        };
        let file = Arc::new(file);
        let evicted = {
            let mut map = self.map.lock().expect("open files");
            let mut evicted = Vec::new();
            if let Some(old) = map.remove(&key) {
                evicted.push(old.file);
            }
            while map.len() >= self.open_files_max {
                let lru = map.iter().min_by_key(|(_, e)| e.used).map(|(k, _)| k.clone()).expect("non-empty");
                evicted.push(map.remove(&lru).expect("present").file);
                self.ahead.drop_key(lru.0, &lru.1);
            }
            map.insert(key, Entry { file: file.clone(), writable: write, used: Instant::now() });
            evicted
        };
        for f in evicted {
            close(&self.verifier, f).await;
        }
        Ok(file)
    }

    /// Every cached file of `ino` (any user).
    pub fn of_inode(&self, ino: u64) -> Vec<Arc<File>> {
        self.map.lock().expect("open files").iter().filter(|(k, _)| k.0 == ino).map(|(_, e)| e.file.clone()).collect()
    }

    /// Before a READ of `ino` through `this`: writes other users' cached handles of an ec file hold (partial stripe
    /// rows gathered until whole) are sent, so the READ sees every WRITE this gateway answered, as knfsd's shared
    /// page cache does. A failure stays with the handle that holds it (its COMMIT or close reports it).
    pub async fn send_held_by_others(&self, ino: u64, this: &Arc<File>) {
        if !matches!(this.layout().redundancy, weft_proto::DataRedundancy::Ec { .. }) {
            return;
        }
        for f in self.of_inode(ino).into_iter().filter(|f| !Arc::ptr_eq(f, this)) {
            if let Err(e) = f.send_held().await {
                tracing::warn!(ino, error = %e, "sending another handle's held writes before a READ failed");
            }
        }
    }

    /// Syncs every cached file of `ino` (COMMIT); the first error is returned after all were tried.
    pub async fn sync_inode(&self, ino: u64) -> Result<(), ClientError> {
        self.ahead.drop_inode(ino);
        let mut first = Ok(());
        for f in self.of_inode(ino) {
            if let Err(e) = self.verifier.synced(ino, || f.sync()).await
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }

    /// Syncs and drops every cached file of `ino` (before its size is set, or after it is removed).
    pub async fn close_inode(&self, ino: u64) -> Result<(), ClientError> {
        self.ahead.drop_inode(ino);
        let files: Vec<Arc<File>> = {
            let mut map = self.map.lock().expect("open files");
            let keys: Vec<Key> = map.keys().filter(|k| k.0 == ino).cloned().collect();
            keys.into_iter().filter_map(|k| map.remove(&k)).map(|e| e.file).collect()
        };
        let mut first = Ok(());
        for f in files {
            if let Err(e) = self.verifier.synced(ino, || f.sync()).await
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }

    /// `attr` as the gateway's clients must see it: the size raised to what cached handles wrote but have not
    /// committed yet, and those handles told about the fresh attributes (close-to-open).
    pub fn overlay(&self, attr: &mut Attr) {
        // A client asking for attributes may be opening the file (close-to-open): nothing read ahead before
        // this is served after it.
        self.ahead.drop_inode(attr.ino);
        for f in self.of_inode(attr.ino) {
            f.observe_open(attr);
            attr.size = attr.size.max(f.size());
        }
    }

    /// Closes the entries unused for `open_idle_ms`; returns how many.
    pub async fn close_idle(&self) -> usize {
        let now = Instant::now();
        let idle: Vec<Arc<File>> = {
            let mut map = self.map.lock().expect("open files");
            let keys: Vec<Key> = map
                .iter()
                .filter(|(_, e)| now.duration_since(e.used) >= self.open_idle)
                .map(|(k, _)| k.clone())
                .collect();
            for k in &keys {
                self.ahead.drop_key(k.0, &k.1);
            }
            keys.into_iter().filter_map(|k| map.remove(&k)).map(|e| e.file).collect()
        };
        let n = idle.len();
        for f in idle {
            close(&self.verifier, f).await;
        }
        n
    }

    /// Closes everything (shutdown).
    pub async fn close_all(&self) {
        self.ahead.clear();
        let all: Vec<Arc<File>> = self.map.lock().expect("open files").drain().map(|(_, e)| e.file).collect();
        for f in all {
            close(&self.verifier, f).await;
        }
    }

    pub fn len(&self) -> usize {
        self.map.lock().expect("open files").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Makes a dropped entry's writes durable and visible; a failure is logged (the client learns of lost writes
/// through COMMIT's verifier only if the gateway restarts or a data server lost them, so this is also why entries
/// are synced, not just committed).
async fn close(verifier: &WriteVerifier, f: Arc<File>) {
    if let Err(e) = verifier.synced(f.ino(), || f.sync()).await {
        tracing::warn!(ino = f.ino(), error = %e, "closing a cached open file failed");
    }
}
