//! `weft mount`: a FUSE file system over the native client.
//!
//! Why fuser: a pure-Rust FUSE protocol implementation (no libfuse build), multi-threaded with one cloned
//! `/dev/fuse` descriptor per worker, `&self` handlers (so handlers hand work to tokio and return at once), and
//! the kernel options this mount needs (max_write, readahead, max_pages). Only `fusermount3` (Debian's fuse3) is
//! needed at run time, and only when not running as root.
//!
//! Shape: every kernel request is handled on the tokio runtime (`Inner::spawn`), so one FUSE worker thread keeps
//! many requests in flight; the reply is sent from the task. Inode numbers are Weft's own (the root is 1 in both),
//! so `forget` has nothing to free.
//!
//! Consistency: close-to-open. `open` fetches fresh attributes and the kernel drops cached pages on open (no
//! `FOPEN_KEEP_CACHE`); every `close(2)` (FUSE flush) commits size and mtime to the metadata service. Inside one
//! mount all handles of an inode share one [`weft_client::File`], so their sizes agree. Attribute and entry
//! timeouts are configurable; 0 disables kernel caching of either.
//!
//! Permissions: every request acts as the user who made it (uid and gid from the kernel, supplementary groups
//! from /proc, `users.rs`), so the MDS checks it and owns new entries to it. `default_permissions` stays on as the
//! fast path: the kernel refuses what the mode bits forbid before a request leaves the host. With `FUSE_POSIX_ACL`
//! (asked at init) the kernel enforces POSIX ACLs too, reading `system.posix_acl_access` through getxattr; the
//! MDS, which keeps ACLs and mode bits coherent and applies default ACLs at create, checks them again. An open file's writes
//! are committed as the user who first opened it in this mount (all handles of an inode share one `File`); set-ID
//! bits go as the user who writes (`write`) or truncates (`Inner::truncate`), judged by the MDS. The
//! mount is `nosuid,nodev` unless `suid`/`dev` are set.

mod attr;
mod handles;
pub mod leases;
mod locks;
mod users;
mod write_bufs;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use fuser::{
    AccessFlags, Config, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, Request, SessionACL,
    TimeOrNow, WriteFlags,
};
use tracing::debug;
use weft_client::{Client, ClientError, OpenMode};
use weft_proto::msg::{GetLockReq, SetLockReq};
use weft_proto::{Attr, ErrorCode, FileKind, SetAttrs, TimeSet};
use weft_rpc::{Metrics, OpMetrics};

use crate::attr::file_attr;
use crate::handles::{DirHandle, Handles};
use crate::leases::Ticket;
use crate::users::Users;

pub use handles::HANDLES_MAX;
pub use write_bufs::WriteBufs;

/// Tunables of a mount (`weft mount --help` documents each).
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// How long the kernel may cache attributes.
    pub attr_timeout_ms: u64,
    /// How long the kernel may cache name lookups.
    pub entry_timeout_ms: u64,
    /// How long the kernel may cache attributes and lookups the MDS leased to this mount (docs/format.md §31): a
    /// change elsewhere recalls them first, so this bounds staleness only if recalls cannot be applied. 0: no
    /// leases (the attribute and entry timeouts apply to everything).
    pub lease_timeout_ms: u64,
    /// FUSE worker threads, each with its own cloned `/dev/fuse` descriptor.
    pub threads: usize,
    /// Let other users use the mount (`allow_other`).
    pub allow_other: bool,
    /// Bypass the page cache for every file (as if every open had O_DIRECT).
    pub direct_io: bool,
    /// Largest write the kernel sends in one request.
    pub max_write_bytes: u32,
    /// Kernel readahead window (set through sysfs after the mount, as root).
    pub max_readahead_bytes: u32,
    /// FUSE writeback cache: the kernel buffers writes and flushes them at close (so close-to-open holds for
    /// the data), but trusts its own sizes over the cluster's for cached inodes. Off by default.
    pub writeback_cache: bool,
    /// Honour set-user-ID and set-group-ID bits (`--suid`); off: the mount is `nosuid`.
    pub suid: bool,
    /// Honour device nodes (`--dev`); off: the mount is `nodev`.
    pub dev: bool,
    /// Mount read-only (`--ro`): the kernel refuses every change with EROFS before it reaches Weft.
    pub read_only: bool,
    /// Negotiate FUSE_HANDLE_KILLPRIV_V2 (default): the mount drops set-ID bits at the writes the kernel flags.
    /// Off (`--no-killpriv`, for tests), the kernel drops them itself by a chmod as the writer, as kernels before
    /// 5.11 always do (`Inner::drop_set_id_by_mode`).
    pub kill_priv_v2: bool,
    /// Count FUSE requests (and this process's RPC retries) into this registry; `None`: not counted.
    pub metrics: Option<Arc<Metrics>>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            attr_timeout_ms: 1000,
            entry_timeout_ms: 1000,
            lease_timeout_ms: DEFAULT_LEASE_TIMEOUT_MS,
            threads: 4,
            allow_other: false,
            direct_io: false,
            max_write_bytes: 1 << 20,
            max_readahead_bytes: 4 << 20,
            writeback_cache: false,
            suid: false,
            dev: false,
            read_only: false,
            kill_priv_v2: true,
            metrics: None,
        }
    }
}

/// Default of [`MountOptions::lease_timeout_ms`]: long enough that a stat loop or `ls -l` over a big tree is
/// served by the kernel, short enough to bound a mount that cannot apply recalls.
pub const DEFAULT_LEASE_TIMEOUT_MS: u64 = 30_000;

/// The file system handed to fuser.
pub struct WeftFs {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    rt: tokio::runtime::Handle,
    opts: MountOptions,
    handles: Handles,
    /// The kernel agreed to readdirplus at init.
    readdirplus: AtomicBool,
    /// Page cache validators: for each inode, the (mtime, size) it had when this mount last opened it, which is
    /// the version whose pages the kernel may hold. An open that finds the same pair keeps the cached pages
    /// (`FOPEN_KEEP_CACHE`); any other pair means another writer changed the file, and the kernel drops them
    /// (close-to-open, as NFS does). Bounded by [`VALIDATORS_MAX`]: when full it is cleared, which costs only
    /// re-reads.
    validators: Mutex<HashMap<u64, (i64, u64)>>,
    /// Where each write's data is copied: reused buffers, so one-sided fabrics keep their registrations.
    write_bufs: WriteBufs,
    /// The requesting users' credentials (supplementary groups from /proc), briefly cached.
    users: Users,
    /// FUSE requests, errors and latency by op, when the mount serves metrics.
    metrics: Option<OpMetrics>,
    /// The (inode, lock owner) pairs that took advisory locks here, released at flush/release (`locks.rs`).
    lock_owners: locks::LockOwners,
    /// Metadata leases: what the kernel may cache past its timeouts (`leases.rs`).
    leases: Arc<Mutex<leases::LeaseView>>,
    /// Invalidates the kernel's caches (set once mounted).
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
}

/// Reads and writes up to this size are served on the FUSE thread that received them (see `read`).
const INLINE_IO_BYTES_MAX: u32 = 64 << 10;

/// Write buffers kept for reuse per FUSE thread: the kernel has a few writes in flight per thread (more with
/// large writes, which are spawned); beyond this they are allocated and freed.
const WRITE_BUFFERS_PER_THREAD: usize = 4;

/// Most page cache validators a mount keeps.
const VALIDATORS_MAX: usize = 65_536;

tokio::task_local! {
    /// Set by [`errno`] while a request runs under [`Inner::timed`]: the request is answered with an error.
    static REPLIED_ERROR: std::cell::Cell<bool>;
}

/// The FUSE requests counted in metrics (the `op` label is the kernel request's name).
#[derive(Clone, Copy, Debug)]
enum FuseOp {
    Access,
    Create,
    Flush,
    Fsync,
    Getattr,
    Getlk,
    Getxattr,
    Link,
    Listxattr,
    Lookup,
    Mkdir,
    Mknod,
    Open,
    Opendir,
    Read,
    Readdir,
    Readdirplus,
    Readlink,
    Release,
    Removexattr,
    Rename,
    Rmdir,
    Setattr,
    Setlk,
    Setxattr,
    Statfs,
    Symlink,
    Unlink,
    Write,
}

impl FuseOp {
    const NAMES: [(FuseOp, &'static str); 29] = [
        (FuseOp::Access, "access"),
        (FuseOp::Create, "create"),
        (FuseOp::Flush, "flush"),
        (FuseOp::Fsync, "fsync"),
        (FuseOp::Getattr, "getattr"),
        (FuseOp::Getlk, "getlk"),
        (FuseOp::Getxattr, "getxattr"),
        (FuseOp::Link, "link"),
        (FuseOp::Listxattr, "listxattr"),
        (FuseOp::Lookup, "lookup"),
        (FuseOp::Mkdir, "mkdir"),
        (FuseOp::Mknod, "mknod"),
        (FuseOp::Open, "open"),
        (FuseOp::Opendir, "opendir"),
        (FuseOp::Read, "read"),
        (FuseOp::Readdir, "readdir"),
        (FuseOp::Readdirplus, "readdirplus"),
        (FuseOp::Readlink, "readlink"),
        (FuseOp::Release, "release"),
        (FuseOp::Removexattr, "removexattr"),
        (FuseOp::Rename, "rename"),
        (FuseOp::Rmdir, "rmdir"),
        (FuseOp::Setattr, "setattr"),
        (FuseOp::Setlk, "setlk"),
        (FuseOp::Setxattr, "setxattr"),
        (FuseOp::Statfs, "statfs"),
        (FuseOp::Symlink, "symlink"),
        (FuseOp::Unlink, "unlink"),
        (FuseOp::Write, "write"),
    ];

    fn all() -> Vec<(usize, &'static str)> {
        FuseOp::NAMES.iter().map(|&(op, name)| (op as usize, name)).collect()
    }
}

/// The errno a failed client call means to POSIX callers.
fn errno(e: &ClientError) -> Errno {
    // Outside a counted request (no metrics) there is no flag to set.
    let _ = REPLIED_ERROR.try_with(|f| f.set(true));
    if matches!(
        e,
        ClientError::DataAt { .. }
            | ClientError::Corrupt { .. }
            | ClientError::Unsynced { .. }
            | ClientError::WritesLost { .. }
    ) {
        // EIO (ENOSPC for a full disk) is all the caller sees: the log says which file, offset and server.
        tracing::warn!("{e}");
    }
    match e.code() {
        Some(code) => Errno::from_i32(code.errno()),
        None => {
            debug!("client error without a code, reported as EIO: {e}");
            Errno::EIO
        }
    }
}

/// Answers an operation that returns nothing: ok, or the errno of the failure.
fn reply_empty(reply: ReplyEmpty, r: Result<(), ClientError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// A name from the kernel as the wire wants it: UTF-8, at most 255 bytes.
fn name_str(name: &OsStr) -> Result<String, Errno> {
    if name.len() > weft_proto::NAME_BYTES_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    name.to_str().map(str::to_owned).ok_or(Errno::EINVAL)
}

/// Answers getxattr/listxattr: the length for a size-0 probe, ERANGE when `data` does not fit `size`.
fn reply_xattr(reply: fuser::ReplyXattr, size: u32, data: &[u8]) {
    // Values and lists are at most 64 KiB (the MDS's limits), so the length fits.
    let len = data.len() as u32;
    if size == 0 {
        reply.size(len)
    } else if len > size {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(data)
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(st) => TimeSet::AtNs(match st.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
        }),
    }
}

impl Inner {
    /// Drops `owner`'s locks on `ino` if it took any through this mount (one MDS call, only then).
    async fn release_locks(&self, ino: u64, owner: u64) {
        if self.lock_owners.take(ino, owner)
            && let Err(e) = self.client.release_locks(Some(ino), Some(owner)).await
        {
            tracing::warn!(ino, owner, "releasing locks at close: {e}");
        }
    }

    fn entry_ttl(&self) -> Duration {
        Duration::from_millis(self.opts.entry_timeout_ms)
    }

    fn attr_ttl(&self) -> Duration {
        Duration::from_millis(self.opts.attr_timeout_ms)
    }

    /// Attributes with this mount's view of the size: an open file may have grown by writes not yet committed.
    fn local_view(&self, mut a: weft_proto::Attr) -> weft_proto::Attr {
        if let Some(f) = self.handles.open_file(a.ino) {
            a.size = a.size.max(f.size());
        }
        a
    }

    /// Records the version of `a` this mount now opens; true if the kernel's cached pages are of that version.
    fn revalidate(&self, a: &weft_proto::Attr) -> bool {
        let mut v = self.validators.lock().expect("validators");
        let now = (a.mtime_ns, a.size);
        let same = v.get(&a.ino) == Some(&now);
        if !same && v.len() >= VALIDATORS_MAX {
            v.clear();
        }
        v.insert(a.ino, now);
        same
    }

    /// After this mount committed its writes: if the file was at the version the kernel's pages are of, they
    /// now hold the committed version (the writes went through them); otherwise someone else committed in
    /// between and the next open must drop them.
    ///
    /// The commit changed the file's attributes behind the kernel's back: leased ones are invalidated (the MDS
    /// recalls only other holders; the kernel's attr_version drops a reply that raced this).
    fn after_commit(&self, w: &weft_proto::msg::CommitWccResp) {
        let mut v = self.validators.lock().expect("validators");
        if v.get(&w.attr.ino) == Some(&(w.pre_mtime_ns, w.pre_size)) {
            v.insert(w.attr.ino, (w.attr.mtime_ns, w.attr.size));
        } else {
            v.remove(&w.attr.ino);
        }
        drop(v);
        if self.lease_view().forget_attr(w.attr.ino)
            && let Some(n) = self.notifier.get()
            && let Err(e) = n.inval_inode(INodeNo(w.attr.ino), -1, 0)
        {
            tracing::debug!(ino = w.attr.ino, "invalidating committed attributes: {e}");
        }
    }

    /// Makes `f`'s writes durable and commits them (close-to-open) and keeps the page cache validator in step.
    async fn commit(&self, f: &weft_client::File) -> Result<(), ClientError> {
        if let Some(w) = f.commit_wcc().await? {
            self.after_commit(&w);
        }
        Ok(())
    }

    /// A size change from the kernel, as the user `c` acts for. With a handle opened for writing (`ftruncate`,
    /// `open(O_TRUNC)`: the kernel names it in the setattr) the right is that open's, as on Linux, where a file
    /// created `O_CREAT|O_RDWR` with mode 0 can be cut through its descriptor ([`weft_client::File::truncate_by`]).
    /// Without one (`truncate(2)` of a path) the caller needs write permission by the mode now: checked by an open
    /// for writing as the caller before any object changes, and again by the MDS's `SetAttr`.
    async fn truncate(&self, c: &Client, ino: u64, size: u64, fh: Option<FileHandle>) -> Result<(), ClientError> {
        if let Some(f) = fh.and_then(|fh| self.handles.writable_file(fh.0)) {
            return f.truncate_by(c, size).await;
        }
        let opened = c.open_ino(ino, OpenMode::Write).await?;
        match self.handles.open_file(ino) {
            // Through the open file when there is one, so this mount's handles see the new size.
            Some(f) => f.truncate_path_as(c, size).await,
            None => opened.truncate_path_as(c, size).await,
        }
    }

    /// A setattr other than a size change, as the user `c` acts for.
    async fn setattr(&self, c: &Client, ino: u64, set: SetAttrs) -> Result<Attr, ClientError> {
        match c.setattr(ino, set.clone()).await {
            Err(e) if e.code() == Some(ErrorCode::NotPermitted) && set.mode.is_some() => {
                self.drop_set_id_by_mode(c, ino, set, e).await
            }
            r => r,
        }
    }

    /// Without FUSE_HANDLE_KILLPRIV_V2 (kernels before 5.11, or `--no-killpriv`) the kernel drops set-ID bits at a
    /// write or truncate itself, by a chmod as the writer, which a non-owner may not make (`refused`). A chmod
    /// that only clears set-ID bits of the mode the file has becomes the MDS's own drop as that caller (a `Commit`
    /// that raises nothing, docs/format.md §2), which the MDS makes for any writer it does not know as root and
    /// judges by its rule, with write permission or ownership; anything else stays refused.
    async fn drop_set_id_by_mode(
        &self,
        c: &Client,
        ino: u64,
        set: SetAttrs,
        refused: ClientError,
    ) -> Result<Attr, ClientError> {
        let Some(asked) = set.mode else { return Err(refused) };
        let file = c.getattr(ino).await?;
        if file.kind != FileKind::File || !clears_only_set_id(file.mode, asked) {
            return Err(refused);
        }
        let dropped = c.commit(ino, 0, 0).await?;
        let rest = SetAttrs { mode: None, ..set };
        if rest == SetAttrs::default() { Ok(dropped) } else { c.setattr(ino, rest).await }
    }

    /// `fut` (one request, replying at its end), counted by op: its latency, and as failed when it replied with an
    /// errno (see [`errno`]).
    fn timed<F: std::future::Future<Output = ()>>(
        &self,
        op: FuseOp,
        fut: F,
    ) -> impl std::future::Future<Output = ()> + use<F> {
        let metrics = self.metrics.clone();
        async move {
            let Some(m) = metrics else { return fut.await };
            let began = std::time::Instant::now();
            let failed = REPLIED_ERROR
                .scope(std::cell::Cell::new(false), async {
                    fut.await;
                    REPLIED_ERROR.with(|f| f.get())
                })
                .await;
            m.record(op as usize, !failed, began.elapsed());
        }
    }

    /// One page of a directory from `offset`, every entry with its attributes (so `ls -l` or `find` needs no lookup
    /// per entry), at the same stable offsets as readdir. Timeouts are decided and the page handed to the kernel
    /// under the lease view's lock, so one page per reply (the kernel asks again from the next offset).
    async fn readdirplus(&self, c: &Client, dir: &DirHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let entries = match dir.entries_from(c, offset, Some(self.ticket())).await {
            Ok(e) => e,
            Err(e) => return reply.error(errno(&e)),
        };
        self.learn_listing(dir).await;
        let mut page = Vec::with_capacity(entries.len());
        for (off, e) in entries {
            let attr = match e.attr {
                Some(a) => a,
                // Listed by a plain readdir on this handle before: fetch the attributes now.
                None => match c.getattr(e.ino).await {
                    Ok(a) => a,
                    Err(err) => return reply.error(errno(&err)),
                },
            };
            page.push((off, e.ino, e.name, e.asked, file_attr(&self.local_view(attr))));
        }
        let mut v = self.lease_view();
        for (pos, ino, name, asked, attr) in page {
            let ttl = match asked {
                Some(t) if name != "." && name != ".." => self.entry_ttl_under(&mut v, &t, dir.ino(), &name, ino),
                _ => self.entry_ttl(),
            };
            if reply.add(INodeNo(ino), pos, &name, &ttl, &attr, Generation(0)) {
                break;
            }
        }
        reply.ok();
    }

    /// Replies to a request about entry `parent`/`name` asked under `t`: with the lease timeout if the MDS leased
    /// both to this mount, else the entry timeout.
    fn reply_entry(&self, reply: ReplyEntry, t: Ticket, key: (u64, &str), r: Result<Attr, ClientError>) {
        self.reply_entry_made(reply, t, key, r, false)
    }

    /// [`Inner::reply_entry`]; `made_dir`: the reply is of this mount's own mkdir, whose new directory's names the
    /// mount then tracks if the reply is cached under the lease ([`leases::LeaseView::made_dir`]).
    fn reply_entry_made(
        &self,
        reply: ReplyEntry,
        t: Ticket,
        (parent, name): (u64, &str),
        r: Result<Attr, ClientError>,
        made_dir: bool,
    ) {
        match r {
            Ok(a) => {
                let attr = file_attr(&self.local_view(a));
                let mut v = self.lease_view();
                let (ttl, leased) = self.entry_leased_under(&mut v, &t, (parent, name), attr.ino.0);
                if made_dir && leased {
                    v.made_dir(attr.ino.0);
                }
                reply.entry(&ttl, &attr, Generation(0));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn lease_view(&self) -> std::sync::MutexGuard<'_, leases::LeaseView> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ticket a request to the MDS is asked under (taken before it is sent).
    fn ticket(&self) -> Ticket {
        self.lease_view().ticket()
    }

    /// Whether the mount holds leases now: then lookups and attributes are asked of the MDS (which grants), not
    /// of the cache bank.
    fn leasing(&self) -> bool {
        self.opts.lease_timeout_ms > 0 && self.lease_view().epoch() != 0
    }

    /// What a reply is judged by, now: the time and the MDS session it arrived on. `None` with leases off.
    fn lease_now(&self) -> Option<(std::time::Instant, u64)> {
        (self.opts.lease_timeout_ms > 0).then(|| (std::time::Instant::now(), self.client.mds_session()))
    }

    /// The timeout of an entry reply, decided under the view's lock `v` (held until the reply is sent).
    fn entry_ttl_under(&self, v: &mut leases::LeaseView, t: &Ticket, parent: u64, name: &str, ino: u64) -> Duration {
        self.entry_leased_under(v, t, (parent, name), ino).0
    }

    /// [`Inner::entry_ttl_under`], and whether the entry is cached under the lease.
    fn entry_leased_under(
        &self,
        v: &mut leases::LeaseView,
        t: &Ticket,
        (parent, name): (u64, &str),
        ino: u64,
    ) -> (Duration, bool) {
        match self.lease_now() {
            Some(now) if v.entry(t, parent, name, ino, now) => {
                (Duration::from_millis(self.opts.lease_timeout_ms), true)
            }
            _ => (self.entry_ttl(), false),
        }
    }

    /// Answers a `GETATTR` of a directory from what this mount's own last create in it left
    /// ([`leases::LeaseView::after_create`]), on the calling thread: no round trip. Gives the reply back if not.
    fn getattr_after_create(&self, ino: u64, reply: ReplyAttr) -> Option<ReplyAttr> {
        let Some(now) = self.lease_now() else { return Some(reply) };
        let began = std::time::Instant::now();
        let mut v = self.lease_view();
        let Some(a) = v.after_create(ino, self.client.own_changes_sent(), now) else { return Some(reply) };
        reply.attr(&Duration::from_millis(self.opts.lease_timeout_ms), &file_attr(&a));
        drop(v);
        if let Some(m) = &self.metrics {
            m.record(FuseOp::Getattr as usize, true, began.elapsed());
        }
        None
    }

    /// Answers a `LOOKUP` of a name known missing ([`leases::LeaseView::missing`]: a directory this mount made and
    /// holds) with ENOENT on the calling thread: no round trip. Gives the reply back if not known.
    fn lookup_missing(&self, parent: u64, name: &str, reply: ReplyEntry) -> Option<ReplyEntry> {
        let Some(now) = self.lease_now() else { return Some(reply) };
        let began = std::time::Instant::now();
        let v = self.lease_view();
        if !v.missing(parent, name, now) {
            return Some(reply);
        }
        reply.error(Errno::ENOENT);
        drop(v);
        if let Some(m) = &self.metrics {
            m.record(FuseOp::Lookup as usize, false, began.elapsed());
        }
        None
    }

    /// After a page of `dir`: if it took the whole listing, the mount knows the directory's names while its lease
    /// holds ([`leases::LeaseView::listed`]). (The kernel holds the directory's lock across the listing, so none
    /// of the mount's own changes of its names ran meanwhile; another session's recalls it.)
    async fn learn_listing(&self, dir: &DirHandle) {
        if let (Some((t, names)), Some(now)) = (dir.take_listed().await, self.lease_now()) {
            self.lease_view().listed(&t, dir.ino(), names, now);
        }
    }

    /// Before a request of this mount's own that may add `parent`/`name` is sent ([`leases::LeaseView::adding`]).
    fn adding(&self, parent: u64, name: &str) {
        self.lease_view().adding(parent, name);
    }

    /// Replies with attributes `a` of a request asked under `t`: the lease timeout if leased, else the attribute one.
    fn reply_attr(&self, reply: ReplyAttr, t: Ticket, a: &Attr) {
        let mut v = self.lease_view();
        let ttl = match self.lease_now() {
            Some(now) if v.attr(&t, a.ino, now) => Duration::from_millis(self.opts.lease_timeout_ms),
            _ => self.attr_ttl(),
        };
        reply.attr(&ttl, &file_attr(a));
    }
}

impl WeftFs {
    pub fn new(client: Client, rt: tokio::runtime::Handle, opts: MountOptions) -> WeftFs {
        WeftFs {
            inner: Arc::new(Inner {
                client,
                rt,
                handles: Handles::default(),
                readdirplus: AtomicBool::new(false),
                validators: Mutex::new(HashMap::new()),
                lock_owners: locks::LockOwners::default(),
                write_bufs: WriteBufs::new(
                    opts.max_write_bytes as usize,
                    opts.threads.max(1) * WRITE_BUFFERS_PER_THREAD,
                ),
                metrics: opts.metrics.as_ref().map(|m| {
                    weft_rpc::metrics::register_client(m);
                    OpMetrics::new(m, "weft_fuse_requests", "FUSE requests", &FuseOp::all())
                }),
                opts,
                users: Users::default(),
                leases: Arc::default(),
                notifier: Arc::default(),
            }),
        }
    }

    /// Runs `f` on the runtime with a handle on the shared state and a client acting as the user who made the
    /// request; the reply is sent from there.
    fn spawn<Fut>(&self, op: FuseOp, req: &Request, f: impl FnOnce(Arc<Inner>, Client) -> Fut)
    where
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let client = self.inner.users.client_for(&self.inner.client, req.uid(), req.gid(), req.pid());
        let fut = f(self.inner.clone(), client);
        self.inner.rt.spawn(self.inner.timed(op, fut));
    }

    /// fuser's mount configuration for these options.
    pub fn config(opts: &MountOptions) -> Config {
        let mut c = Config::default();
        c.mount_options = vec![
            MountOption::FSName("weft".into()),
            MountOption::Subtype("weft".into()),
            MountOption::DefaultPermissions,
        ];
        // Set-user-ID bits and device nodes on a network file system are only as trustworthy as every client
        // that can write to it: honoured only when asked for.
        if !opts.suid {
            c.mount_options.push(MountOption::NoSuid);
        }
        if !opts.dev {
            c.mount_options.push(MountOption::NoDev);
        }
        if opts.read_only {
            c.mount_options.push(MountOption::RO);
        }
        if opts.allow_other {
            c.acl = SessionACL::All;
        }
        c.n_threads = Some(opts.threads.max(1));
        c.clone_fd = true;
        c
    }
}

impl Filesystem for WeftFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Each setter returns the nearest value the kernel accepts on error; that value is as good.
        let _ = config.set_max_write(self.inner.opts.max_write_bytes);
        // The kernel caps this at its own default; `set_readahead` raises the window after the mount.
        if let Err(nearest) = config.set_max_readahead(self.inner.opts.max_readahead_bytes) {
            let _ = config.set_max_readahead(nearest);
        }
        let _ = config.set_max_background(64);
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // The MDS drops set-ID bits and file capabilities itself when a write is committed, a file truncated or
        // its owner changed (as `file_remove_privs` would), and `write` asks for it before the bytes of a write the
        // kernel flags FUSE_WRITE_KILL_SUIDGID (docs/format.md §2). Saying so lets the kernel mark inodes S_NOSEC,
        // which saves a `getxattr("security.capability")` round trip before every write request (measured: one per
        // write, ~90 µs each, half the cost of a 64 KiB write).
        let killpriv =
            self.inner.opts.kill_priv_v2 && config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2).is_ok();
        // Advisory locks go to the MDS (getlk/setlk, and flock as whole-file setlk), so every mount sees them;
        // without these the kernel would keep them local to this host.
        let locks = config.add_capabilities(InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS).is_ok();
        // POSIX ACLs: the kernel reads `system.posix_acl_access` (through getxattr) and enforces it with
        // `default_permissions`; the mode and umask of a create come unmasked with the umask beside them
        // (DONT_MASK), so the MDS can apply a parent's default ACL instead of the umask, as Linux does.
        let acl = config.add_capabilities(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK).is_ok();
        // Let the kernel choose readdirplus when listings are followed by lookups (`ls -l`, `find`, rsync).
        let plus = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO).is_ok();
        self.inner.readdirplus.store(plus, Ordering::Relaxed);
        let writeback = self.inner.opts.writeback_cache
            && !self.inner.opts.direct_io
            && config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE).is_ok();
        tracing::info!(
            max_pages = config.capabilities().contains(InitFlags::FUSE_MAX_PAGES),
            max_write = self.inner.opts.max_write_bytes,
            readdirplus = plus,
            posix_acl = acl,
            killpriv,
            locks,
            writeback,
            // Requests come by /dev/fuse reads: fuser has no io_uring transport yet, so the ring the kernel may
            // offer (`enable_uring`) is not asked for. `weft bench fuse-transport` measures what it would bring.
            transport = "/dev/fuse",
            uring_offered = config.capabilities().contains(InitFlags::FUSE_OVER_IO_URING),
            "FUSE session negotiated"
        );
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let Some(reply) = self.inner.lookup_missing(parent.0, &name, reply) else { return };
        self.spawn(FuseOp::Lookup, req, move |i, c| async move {
            let t = i.ticket();
            let r = if i.leasing() { c.lookup_at_mds(parent.0, &name).await } else { c.lookup(parent.0, &name).await };
            i.reply_entry(reply, t, (parent.0, &name), r);
        });
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some(reply) = self.inner.getattr_after_create(ino.0, reply) {
            self.spawn(FuseOp::Getattr, req, move |i, c| async move {
                let t = i.ticket();
                let r = if i.leasing() { c.getattr_at_mds(ino.0).await } else { c.getattr(ino.0).await };
                match r {
                    Ok(a) => i.reply_attr(reply, t, &i.local_view(a)),
                    Err(e) => reply.error(errno(&e)),
                }
            });
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.spawn(FuseOp::Setattr, req, move |i, c| async move {
            let t = i.ticket();
            let result = async {
                if let Some(size) = size {
                    i.truncate(&c, ino.0, size, fh).await?;
                }
                let set = SetAttrs {
                    mode: mode.map(|m| m & 0o7777),
                    uid,
                    gid,
                    size: None,
                    atime: atime.map(time_set),
                    mtime: mtime.map(time_set),
                };
                if set == SetAttrs::default() { c.getattr(ino.0).await } else { i.setattr(&c, ino.0, set).await }
            }
            .await;
            match result {
                Ok(a) => {
                    let mut a = i.local_view(a);
                    if let Some(size) = size {
                        // The kernel takes this size as the truncate's result and cuts its page cache only where it
                        // differs from the old one (fuse_do_setattr): never a larger size from elsewhere.
                        a.size = size;
                    }
                    i.reply_attr(reply, t, &a)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.spawn(FuseOp::Readlink, req, move |_i, c| async move {
            match c.readlink(ino.0).await {
                Ok(t) => reply.data(t.as_bytes()),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        // FIFOs, sockets and device nodes are metadata only: their I/O is served by the kernel, never by Weft.
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => None,
            libc::S_IFIFO => Some(FileKind::Fifo),
            libc::S_IFSOCK => Some(FileKind::Socket),
            libc::S_IFCHR => Some(FileKind::CharDev),
            libc::S_IFBLK => Some(FileKind::BlockDev),
            _ => return reply.error(Errno::EINVAL),
        };
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        // The MDS applies the umask, unless the directory has a default ACL (docs/format.md §13).
        let perm = weft_proto::mode_with_umask(mode, umask);
        self.spawn(FuseOp::Mknod, req, move |i, c| async move {
            i.adding(parent.0, &name);
            let t = i.ticket();
            let r = match kind {
                None => c.create(parent.0, &name, perm, true).await,
                Some(k) => c.mknod(parent.0, &name, k, perm, rdev).await,
            };
            i.reply_entry(reply, t, (parent.0, &name), r);
        });
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.spawn(FuseOp::Mkdir, req, move |i, c| async move {
            i.adding(parent.0, &name);
            let t = i.ticket();
            let r = c.mkdir(parent.0, &name, weft_proto::mode_with_umask(mode, umask)).await;
            i.reply_entry_made(reply, t, (parent.0, &name), r, true);
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.spawn(FuseOp::Unlink, req, move |i, c| async move {
            // POSIX keeps an unlinked file readable while it is open, but the metadata service frees a file at its
            // last unlink. So a file still open in this mount is renamed aside instead and removed at its last
            // close (the "silly rename" of NFS clients; opens in other mounts are not covered, as with NFS).
            if i.handles.any_file_open()
                && let Ok(a) = c.lookup(parent.0, &name).await
                && a.kind == FileKind::File
                && a.nlink == 1
                && i.handles.open_file(a.ino).is_some()
            {
                let hidden = format!(".weft-unlinked-{:016x}", a.ino);
                i.adding(parent.0, &hidden);
                if let Err(e) = c.rename(parent.0, &name, parent.0, &hidden, 0).await {
                    return reply.error(errno(&e));
                }
                if !i.handles.hide(a.ino, parent.0, hidden.clone()) {
                    return reply_empty(reply, c.unlink(parent.0, &hidden).await);
                }
                return reply.ok();
            }
            let r = c.unlink(parent.0, &name).await;
            if r.is_ok() {
                i.lease_view().removed(parent.0, &name);
            }
            reply_empty(reply, r)
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.spawn(FuseOp::Rmdir, req, move |i, c| async move {
            let r = c.rmdir(parent.0, &name).await;
            if r.is_ok() {
                i.lease_view().removed(parent.0, &name);
            }
            reply_empty(reply, r)
        });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let name = match name_str(link_name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let Some(target) = target.to_str().map(str::to_owned) else {
            return reply.error(Errno::EINVAL);
        };
        self.spawn(FuseOp::Symlink, req, move |i, c| async move {
            i.adding(parent.0, &name);
            let t = i.ticket();
            let r = c.symlink(parent.0, &name, &target).await;
            i.reply_entry(reply, t, (parent.0, &name), r);
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            // Whiteouts are for overlay file systems' upper layers; Weft is not one.
            return reply.error(Errno::EINVAL);
        }
        let (name, newname) = match (name_str(name), name_str(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let mut wire_flags = 0;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            wire_flags |= weft_proto::msg::RENAME_NOREPLACE;
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            // Atomic at the metadata service: both entries swap in one transaction.
            wire_flags |= weft_proto::msg::RENAME_EXCHANGE;
        }
        self.spawn(FuseOp::Rename, req, move |i, c| async move {
            // The source name stays in its set even when the rename succeeds: a rename between two links of one
            // file removes nothing (POSIX), and a set may hold a gone name.
            i.adding(newparent.0, &newname);
            reply_empty(reply, c.rename(parent.0, &name, newparent.0, &newname, wire_flags).await)
        });
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let name = match name_str(newname) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.spawn(FuseOp::Link, req, move |i, c| async move {
            i.adding(newparent.0, &name);
            let t = i.ticket();
            let r = c.link(ino.0, newparent.0, &name).await;
            i.reply_entry(reply, t, (newparent.0, &name), r);
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(FuseOp::Open, req, move |i, c| async move {
            // Fresh attributes on every open (close-to-open), with the capability for the access mode asked.
            let file = match c.open_ino(ino.0, open_mode(flags)).await {
                Ok(f) => f,
                Err(e) => return reply.error(errno(&e)),
            };
            let keep_cache = i.revalidate(file.attr());
            match i.handles.open(file) {
                Ok(fh) => reply.opened(FileHandle(fh), open_flags(&i.opts, flags, keep_cache)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(f) = self.inner.handles.file(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let read = async move {
            match f.read_at(offset, BytesMut::zeroed(size as usize)).await {
                Ok(buf) => reply.data(&buf),
                Err(e) => reply.error(errno(&e)),
            }
        };
        if size <= INLINE_IO_BYTES_MAX {
            // Small reads (random I/O) run on this FUSE thread: handing them to a runtime worker costs two thread
            // wake-ups per read, more than the read itself. The kernel keeps one such read per FUSE thread.
            self.inner.rt.block_on(self.inner.timed(FuseOp::Read, read));
        } else {
            // Large reads (readahead) are spawned, so one thread keeps many in flight to different servers.
            self.inner.rt.spawn(self.inner.timed(FuseOp::Read, read));
        }
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(f) = self.inner.handles.file(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let Ok(len) = u32::try_from(data.len()) else {
            return reply.error(Errno::EINVAL);
        };
        // fuser lends the kernel's buffer only for this call: the one copy of a FUSE write (see ARCHITECTURE.md),
        // into a reused buffer whose registration a one-sided fabric keeps.
        tracing::trace!(offset, len, "write");
        let data = self.inner.write_bufs.copy_of(data);
        // With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves set-ID bits to the server and flags every write by a
        // caller without CAP_FSETID: the MDS drops them, as that caller, before the bytes land (the commit at close
        // would too, but the file would stay set-ID while it changes, and the kernel reads its mode back now).
        let writer = (write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) && f.may_be_set_id())
            .then(|| self.inner.users.client_for(&self.inner.client, req.uid(), req.gid(), req.pid()));
        let write = async move {
            if let Some(w) = writer
                && let Err(e) = f.drop_set_id_before_write(&w).await
            {
                return reply.error(errno(&e));
            }
            match f.write_at(offset, data).await {
                Ok(()) => reply.written(len),
                Err(e) => reply.error(errno(&e)),
            }
        };
        if len <= INLINE_IO_BYTES_MAX {
            // As small reads: served on this FUSE thread, without two hand-offs to and from a runtime worker.
            self.inner.rt.block_on(self.inner.timed(FuseOp::Write, write));
        } else {
            self.inner.rt.spawn(self.inner.timed(FuseOp::Write, write));
        }
    }

    fn flush(&self, req: &Request, ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        let Some(f) = self.inner.handles.file(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        // Every close(2): make the writes durable on the data servers, then publish size and mtime, so the next
        // open anywhere sees them (a failed sync is close(2)'s EIO); and drop the closing process's POSIX locks on
        // the file, as close(2) does.
        self.spawn(FuseOp::Flush, req, move |i, _c| async move {
            i.release_locks(ino.0, lock_owner.0).await;
            let r = i.commit(&f).await;
            if let Err(e) = &r {
                // close(2) returns the error, but many programs ignore it: say here that the file's writes were
                // not committed (the last close's RELEASE tries again).
                tracing::warn!(ino = ino.0, "close: committing the file's writes failed: {e}");
            }
            reply_empty(reply, r)
        });
    }

    fn release(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let Some((f, hidden)) = self.inner.handles.close(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        // The hidden name is the mount's own doing: the mount's client removes it, whoever closes last.
        self.spawn(FuseOp::Release, req, move |i, _c| async move {
            // The last close of an open file drops its flock locks (the kernel names their owner).
            if let Some(owner) = lock_owner {
                i.release_locks(f.ino(), owner.0).await;
            }
            let r = i.commit(&f).await;
            if let Err(e) = &r {
                // Nobody waits for a RELEASE's answer: the log is the only place this failure shows.
                tracing::warn!(ino = f.ino(), "last close: committing the file's writes failed: {e}");
            }
            if let Some((parent, name)) = hidden
                && let Err(e) = i.client.unlink(parent, &name).await
            {
                tracing::warn!(ino = f.ino(), "removing {name:?}, unlinked while open: {e}");
            }
            reply_empty(reply, r)
        });
    }

    fn fsync(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let Some(f) = self.inner.handles.file(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        self.spawn(FuseOp::Fsync, req, move |i, _c| async move {
            let r = f.sync_wcc().await.map(|w| {
                if let Some(w) = w {
                    i.after_commit(&w);
                }
            });
            reply_empty(reply, r)
        });
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let kind = match locks::kind_of(typ) {
            Ok(Some(k)) => k,
            _ => return reply.error(Errno::EINVAL),
        };
        self.spawn(FuseOp::Getlk, req, move |_i, c| async move {
            let q = GetLockReq { ino: ino.0, class: locks::CLASS, kind, start, end, owner: lock_owner.0 };
            match c.get_lock(q).await {
                Ok(Some(h)) => reply.locked(h.start, h.end, locks::typ_of(&h), h.pid),
                Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let Ok(kind) = locks::kind_of(typ) else {
            return reply.error(Errno::EINVAL);
        };
        if kind.is_some() && !self.inner.lock_owners.note(ino.0, lock_owner.0) {
            return reply.error(Errno::from_i32(libc::ENOLCK));
        }
        self.spawn(FuseOp::Setlk, req, move |_i, c| async move {
            let q = SetLockReq { ino: ino.0, class: locks::CLASS, kind, start, end, owner: lock_owner.0, pid };
            if sleep && kind.is_some() {
                match c.set_lock_wait(q, || locks::process_alive(pid)).await {
                    Ok(true) => reply.ok(),
                    Ok(false) => reply.error(Errno::EINTR),
                    Err(e) => reply.error(errno(&e)),
                }
            } else {
                match c.set_lock(q).await {
                    Ok(None) => reply.ok(),
                    Ok(Some(_)) => reply.error(Errno::EAGAIN),
                    Err(e) => reply.error(errno(&e)),
                }
            }
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(FuseOp::Opendir, req, move |i, c| async move {
            let t = i.ticket();
            let held = i.lease_now().and_then(|now| i.lease_view().held_dir(ino.0, now));
            let r = match held.clone() {
                Some(a) => Ok(a),
                None if i.leasing() => c.getattr_at_mds(ino.0).await,
                None => c.getattr(ino.0).await,
            };
            let attr = match r {
                Ok(a) => a,
                Err(e) => return reply.error(errno(&e)),
            };
            if attr.kind != FileKind::Dir {
                return reply.error(Errno::ENOTDIR);
            }
            let plus = i.readdirplus.load(Ordering::Relaxed);
            // Leased: the kernel keeps the listing it reads (and keeps it across opens) until a recall of the
            // directory's attributes drops it; every change of its names recalls them. Its offsets are then the
            // entries' own (`DirHandle::hashed`).
            let mut v = i.lease_view();
            // Decided under the view's lock, as the reply is sent: a recall in between drops the listing after it.
            let cached = i.lease_now().is_some_and(|now| match held {
                Some(_) => v.held_dir(ino.0, now).is_some(),
                None => v.dir(&t, &attr, now),
            });
            let handle = if cached { DirHandle::hashed(attr, plus) } else { DirHandle::new(attr, plus) };
            let fh = match i.handles.open_dir(handle) {
                Ok(fh) => fh,
                Err(e) => return reply.error(e),
            };
            let flags =
                if cached { FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() };
            reply.opened(FileHandle(fh), flags);
        });
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(dir) = self.inner.handles.dir(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        self.spawn(FuseOp::Readdir, req, move |i, c| async move {
            // Offsets are stable under concurrent changes (see `DirHandle`): an entry listed once keeps its offset.
            let mut pos = offset;
            loop {
                let entries = match dir.entries_from(&c, pos, Some(i.ticket())).await {
                    Ok(e) => e,
                    Err(e) => return reply.error(errno(&e)),
                };
                i.learn_listing(&dir).await;
                if entries.is_empty() {
                    break;
                }
                for (off, e) in entries {
                    pos = off;
                    if reply.add(INodeNo(if e.ino == 0 { ino.0 } else { e.ino }), off, e.kind, e.name) {
                        return reply.ok();
                    }
                }
            }
            reply.ok();
        });
    }

    fn readdirplus(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        let Some(dir) = self.inner.handles.dir(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        self.spawn(FuseOp::Readdirplus, req, move |i, c| async move { i.readdirplus(&c, &dir, offset, reply).await });
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.inner.handles.close_dir(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Every namespace change is durable at the metadata service before it is acknowledged.
        reply.ok();
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(FuseOp::Statfs, req, move |_i, c| async move {
            match c.statfs().await {
                Ok(s) => {
                    const FRAG: u64 = 4096;
                    // Inodes are not a limited resource here: report plenty free.
                    let ffree = u64::from(u32::MAX);
                    reply.statfs(
                        s.bytes_total / FRAG,
                        s.bytes_free / FRAG,
                        s.bytes_free / FRAG,
                        s.files + ffree,
                        ffree,
                        1 << 20,
                        weft_proto::NAME_BYTES_MAX as u32,
                        FRAG as u32,
                    )
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // The kernel checks the mode bits itself (default_permissions); what is left is existence.
        self.spawn(FuseOp::Access, req, move |_i, c| async move {
            match c.getattr(ino.0).await {
                Ok(_) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    // Extended attributes (POSIX ACLs included) live on the MDS; a size-0 request asks for the length.
    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: fuser::ReplyXattr) {
        let Some(name) = name.to_str().map(str::to_owned) else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        self.spawn(FuseOp::Getxattr, req, move |_i, c| async move {
            match c.getxattr(ino.0, &name).await {
                Ok(v) => reply_xattr(reply, size, &v),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        self.spawn(FuseOp::Listxattr, req, move |_i, c| async move {
            match c.listxattr(ino.0).await {
                Ok(names) => {
                    let mut list = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
                    for n in names {
                        list.extend_from_slice(n.as_bytes());
                        list.push(0);
                    }
                    reply_xattr(reply, size, &list)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let Some(name) = name.to_str().map(str::to_owned) else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        // Linux's XATTR_CREATE and XATTR_REPLACE have the wire's values; other bits are refused by the MDS.
        let (value, flags) = (value.to_vec(), flags as u32);
        self.spawn(FuseOp::Setxattr, req, move |_i, c| async move {
            reply_empty(reply, c.setxattr(ino.0, &name, &value, flags).await)
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Some(name) = name.to_str().map(str::to_owned) else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        self.spawn(FuseOp::Removexattr, req, move |_i, c| async move {
            reply_empty(reply, c.removexattr(ino.0, &name).await)
        });
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // Not a terminal, not a device (isatty() asks this of every file).
        reply.error(Errno::ENOTTY);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The kernel falls back to read and write; a server-side copy is future work.
        reply.error(Errno::ENOSYS);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let exclusive = flags & libc::O_EXCL != 0;
        self.spawn(FuseOp::Create, req, move |i, c| async move {
            i.adding(parent.0, &name);
            let t = i.ticket();
            let perm = weft_proto::mode_with_umask(mode, umask);
            let (file, dir) = match c.create_open_dir(parent.0, &name, perm, exclusive).await {
                Ok(f) => f,
                Err(e) => return reply.error(errno(&e)),
            };
            let attr = file.attr().clone();
            let fattr = file_attr(&i.local_view(attr.clone()));
            // A new file has no cached pages (or a previous inode's, if the inode number came back: drop them).
            i.revalidate(&attr);
            match i.handles.open(file) {
                Ok(fh) => {
                    let mut v = i.lease_view();
                    // The kernel drops the directory's attributes after this create and asks for them again.
                    if let (Some(d), Some(now)) = (&dir, i.lease_now()) {
                        v.created_in(&t, d, now);
                    }
                    reply.created(
                        &i.entry_ttl_under(&mut v, &t, parent.0, &name, attr.ino),
                        &fattr,
                        Generation(0),
                        FileHandle(fh),
                        open_flags(&i.opts, OpenFlags(flags), false),
                    )
                }
                Err(e) => reply.error(e),
            }
        });
    }
}

/// Whether a chmod to `asked` keeps `mode`'s permission bits and sticky bit and only clears set-ID bits (any,
/// or none: the kernel may have read the mode before the MDS dropped them at a commit).
fn clears_only_set_id(mode: u32, asked: u32) -> bool {
    const SET_ID: u32 = 0o6000;
    let mode = mode & 0o7777;
    (asked ^ mode) & !SET_ID == 0 && asked & SET_ID & !mode == 0
}

/// O_DIRECT (or `--direct-io`) bypasses the page cache; otherwise cached pages are kept only when the file is
/// unchanged since this mount last opened it (`keep_cache`, see `Inner::validators`).
/// The rights an open asks for, from its access mode (the kernel checked the mode bits already with
/// `default_permissions`; the MDS checks them again when it issues the capability).
fn open_mode(flags: OpenFlags) -> OpenMode {
    match flags.0 & libc::O_ACCMODE {
        libc::O_RDONLY => OpenMode::Read,
        libc::O_WRONLY => OpenMode::Write,
        _ => OpenMode::ReadWrite,
    }
}

fn open_flags(opts: &MountOptions, flags: OpenFlags, keep_cache: bool) -> FopenFlags {
    if opts.direct_io || flags.0 & libc::O_DIRECT != 0 {
        FopenFlags::FOPEN_DIRECT_IO
    } else if keep_cache {
        FopenFlags::FOPEN_KEEP_CACHE
    } else {
        FopenFlags::empty()
    }
}

/// A mounted Weft file system, served by fuser's worker threads until [`Mounted::unmount`] (or drop).
pub struct Mounted {
    session: fuser::BackgroundSession,
    /// The lease channel (`None` with leases off): ended with the mount.
    _leases: Option<AbortOnDrop>,
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Mounted {
    /// False once the kernel ended the session (e.g. someone ran `umount DIR`).
    pub fn is_alive(&self) -> bool {
        !self.session.guard.is_finished()
    }

    /// Unmounts and waits for the workers to finish.
    pub fn unmount(self) -> std::io::Result<()> {
        self.session.umount_and_join()
    }
}

/// Mounts the cluster `client` talks to on `dir`. Blocks for the mount system call only: call it from a blocking
/// context. Requests are served on `rt`.
pub fn mount(client: Client, rt: tokio::runtime::Handle, dir: &Path, opts: &MountOptions) -> std::io::Result<Mounted> {
    let fs = WeftFs::new(client, rt, opts.clone());
    let (view, client, rt) = (fs.inner.leases.clone(), fs.inner.client.clone(), fs.inner.rt.clone());
    let own = fs.inner.notifier.clone();
    if let Some(m) = &opts.metrics {
        leases::register_metrics(m, &view);
    }
    let session = fuser::spawn_mount(fs, dir, &WeftFs::config(opts))?;
    set_readahead(dir, opts.max_readahead_bytes);
    let notifier = Arc::new(session.notifier());
    let _ = own.set(session.notifier());
    let leases = (opts.lease_timeout_ms > 0).then(|| AbortOnDrop(rt.spawn(leases::run(client, view, notifier))));
    Ok(Mounted { session, _leases: leases })
}

/// Raises the kernel's readahead window of the mount. The FUSE handshake caps it at the kernel's default (128 KiB
/// here), which keeps one 128 KiB request in flight; sequential reads doubled with 4 MiB (docs/bench.md). The
/// window is a property of the mount's backing device, writable by root in sysfs; elsewhere this only logs.
fn set_readahead(dir: &Path, bytes: u32) {
    use std::os::unix::fs::MetadataExt;
    let dev = match std::fs::metadata(dir) {
        Ok(m) => m.dev(),
        Err(e) => {
            tracing::warn!("cannot stat the mount {}: {e}", dir.display());
            return;
        }
    };
    // glibc's major()/minor() encoding of dev_t.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    match std::fs::write(&path, (bytes / 1024).max(4).to_string()) {
        Ok(()) => tracing::info!(kib = bytes / 1024, "readahead window set"),
        Err(e) => tracing::warn!("cannot set readahead in {path}: {e}; sequential reads will be slower"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_chmod_that_clears_set_id_bits_is_the_kernels_drop() {
        // What the kernel sends without KILLPRIV_V2: the mode less set-user-ID, less set-group-ID with group exec.
        assert!(clears_only_set_id(0o100_4777, 0o777));
        assert!(clears_only_set_id(0o6777, 0o777));
        assert!(clears_only_set_id(0o6755, 0o2755));
        // Nothing left to clear (the MDS dropped them since the kernel read the mode): still the same request.
        assert!(clears_only_set_id(0o777, 0o777));
        // Anything else is a chmod: adding a set-ID bit, changing a permission bit or the sticky bit.
        assert!(!clears_only_set_id(0o777, 0o4777));
        assert!(!clears_only_set_id(0o4777, 0o775));
        assert!(!clears_only_set_id(0o4777, 0o1777));
        assert!(!clears_only_set_id(0o2767, 0o4767));
    }
}
