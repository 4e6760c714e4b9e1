//! The namespace: every metadata op's rules, written once against [`MetaTxn`].
//!
//! Why here and not in the store: the rules (name validity, link counts, what may replace what in a rename, how
//! a new file's layout is chosen) are the same whatever engine holds the records, and are the part most worth
//! testing. Each mutating op is exactly one [`MetaStore::write`] transaction, so a crash leaves either all of an
//! op or none of it; reads run on a snapshot with [`MetaStore::read`].
//!
//! Invariants:
//! - a directory's `nlink` is 2 plus its number of subdirectories; its `parent` points at the directory holding it
//!   (the root points at itself), which is how a rename refuses to move a directory under itself;
//! - every directory carries its effective layout policy: mkdir copies the parent's, SetLayout replaces it;
//! - a file's layout is chosen once, at create, and never changes;
//! - the transaction that removes a file's last name records it as an orphan (ino + layout), so the service can
//!   delete its objects from the data servers later without ever losing track of them.
//!
//! Permissions: [`Namespace::execute_as`] checks every op against a [`Cred`] with the rules of [`crate::perm`]
//! (search on the directory a name is looked up in, write and search on a directory whose entries change, the
//! sticky bit, owner-only chmod/chown/utimes, device nodes for root, set-ID bits cleared by a non-root write),
//! inside the op's transaction, on the records the op itself reads. [`Namespace::execute`] runs as root: until
//! sessions carry an authenticated identity, the service trusts what a request says, as before.
//!
//! Choices the wire leaves open: a hard link to a directory is refused with `Permission` (EPERM on Linux); a
//! non-exclusive create over a symlink returns `Exists` (the client resolves symlinks, not the MDS); a readdir
//! `limit` of 0 means "as many as the server allows"; the `Null` probe is answered, other session and data
//! server ops are refused with `BadRequest`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use weft_proto::layout::DEFAULT_STRIPE_UNIT_BYTES;
use weft_proto::msg::{
    CommitReq, CommitWccResp, CreateReq, HeartbeatResp, LinkReq, MkdirReq, MknodReq, PNFS_ADDRS_MAX, PnfsDeviceInfo,
    RENAME_EXCHANGE, RENAME_NOREPLACE, ReaddirPlusResp, ReaddirReq, ReaddirResp, RegisterPnfsReq, RegisterServerReq,
    RenameReq, SetAttrReq, SetLayoutReq, SetSizeOpenReq, SymlinkReq,
};
use weft_proto::space::{DeviceId, HOST_ID_BYTES_MAX};
use weft_proto::{
    Attr, DataRedundancy, DirEntry, ErrorCode, FileKind, Layout, MemberStatus, NAME_BYTES_MAX, Op, READDIR_ENTRIES_MAX,
    READDIRPLUS_ENTRIES_MAX, ROOT_INO, Request, Response, Rights, SYMLINK_BYTES_MAX, ServerInfo, ServerState, SetAttrs,
    SpaceStat, StatFs, TimeSet, WireError,
};

use crate::acl::{Acl, DEFAULT_XATTR};
use crate::clock::Clock;
use crate::error::MetaError;
use crate::membership::{self, DEFAULT_REBUILD_AFTER_MS, Phase, Scan, Timing};
use crate::once::{self, OnceCall};
use crate::perm::{self, Cred, Mask, SizeRight};
use crate::store::{Inode, MetaStore, MetaTxn};

mod check;
mod duties;
mod stale_ops;
mod xattr;

pub use check::{CheckError, TreeCount, TreeFault, check_tree};
pub use stale_ops::StalePage;

pub use xattr::DEFAULT_XATTR_BYTES_MAX_PER_INODE;

/// Locks a mutex whose value is replaced whole or is a plain counter set: a panic elsewhere cannot leave it torn.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A data server unheard of for longer than this is reported `Down` (milliseconds).
pub const DEFAULT_LIVENESS_MS: u64 = 5000;
/// Longest data server address accepted at registration, in bytes.
pub const SERVER_ADDR_BYTES_MAX: usize = 1024;
/// Permission bits kept from a mode.
const MODE_MASK: u32 = 0o7777;
/// Tries of a tagged change whose commit outcome was lost (`MetaError::CommitUnknown`), each settled by its once
/// record first.
const COMMIT_UNKNOWN_TRIES: usize = 3;
/// Bound on the parent-chain walk of a directory rename; deeper means a corrupt parent chain (a cycle).
const DIR_DEPTH_MAX: usize = 1 << 20;

/// What the MDS knows of one registered data server.
#[derive(Debug, Clone)]
struct ServerSlot {
    addr: String,
    /// Space from the last heartbeat since this MDS started.
    space: Option<SpaceStat>,
    /// The file system the server stores on, from its last `RegisterServerDev` (None: an older server's
    /// `RegisterServer`, counted alone).
    device: Option<DeviceId>,
    /// `Clock::mono_ms` of the last heartbeat since this MDS started.
    last_ms: Option<u64>,
    /// Membership phase (docs/format.md §19), in memory: an MDS restart starts every server as a member again, and a
    /// server still silent then fails `rebuild_after_ms` after the start.
    phase: Phase,
    /// The addresses its pNFS data server listens at (op 140, docs/format.md §23); empty: it serves no NFS.
    nfs_addrs: Vec<String>,
    /// On a shared store: its liveness counter (format §28) as this service last read it.
    beat_seen: Option<u64>,
}

/// The metadata namespace over a store `S`, with time from `C`.
pub struct Namespace<S: MetaStore, C: Clock> {
    store: S,
    clock: C,
    liveness_ms: u64,
    /// Mirror of the persisted server registry plus in-memory liveness. Held while a registration is persisted,
    /// so the mirror and the store change in the same order.
    servers: Mutex<BTreeMap<u32, ServerSlot>>,
    /// Most bytes of extended attributes (names and values) one inode may hold.
    xattr_bytes_max: usize,
    /// Silence after which a data server is declared failed (`rebuild_after_ms`).
    rebuild_after_ms: u64,
    /// `Clock::mono_ms` when this namespace opened: the silence of a server not heard since counts from here.
    started_ms: u64,
    /// The membership scan (moving failed servers' slots to spares), advanced by [`Namespace::membership_tick`].
    scan: Mutex<Scan>,
    /// Layout changes made since this MDS started.
    layouts_changed: AtomicU64,
    /// Files the last whole membership pass left naming a failed server (no spare).
    layouts_pending: AtomicU64,
    /// The healer's rebuild progress for `weft status`: (bytes left, bytes per second, ETA in ms), each `None`
    /// when unknown. Set by [`Namespace::set_rebuild_progress`].
    rebuild_progress: Mutex<(Option<u64>, Option<u64>, Option<u64>)>,
    /// Most stale ranges one (file, slot) keeps before collapsing to the whole slot (§18).
    stale_ranges_per_slot_max: usize,
    /// Most (file, slot) entries in the stale-range table.
    stale_entries_max: u64,
    /// Whether other services share the store (PostgreSQL): liveness and phases then live in it (format §28).
    shared: bool,
    /// This service's view of the duty lease (format §28); unused on a store no other service can open.
    duty: Mutex<crate::duty::DutyLease>,
    /// Each lock-holding service's liveness counter as the duty holder last saw it change (format §30): service →
    /// (counter, when first seen so, monotonic ms).
    service_beats: Mutex<std::collections::HashMap<u64, (Option<u64>, u64)>>,
    /// Locks of sessions at a service silent this long are released by the duty holder (format §30).
    locks_orphan_ms: u64,
}

/// How a tagged change's transaction failed: by the namespace's rules or the store (answered as is), with its
/// commit's outcome unknown (settled by the once record), or because the call had run before.
enum ChangeError {
    Rule(WireError),
    Unknown(String),
    /// The call had run: its recorded reply (the transaction rolls back).
    Recorded(Box<Response>),
}

impl From<MetaError> for ChangeError {
    fn from(e: MetaError) -> Self {
        match e {
            MetaError::CommitUnknown(why) => ChangeError::Unknown(why),
            e => ChangeError::Rule(e.into()),
        }
    }
}

/// The layout policy of the root of a new namespace: 1 MiB stripes over every data server.
pub fn default_policy() -> Layout {
    Layout {
        stripe_unit: DEFAULT_STRIPE_UNIT_BYTES,
        stripe_count: 0,
        servers: Vec::new(),
        redundancy: DataRedundancy::Plain,
        generation: 0,
    }
}

fn werr(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError::new(code, message)
}

impl<S: MetaStore, C: Clock> Namespace<S, C> {
    /// Opens the namespace in `store`, creating the root directory if the store is empty. `liveness_ms`: a data
    /// server unheard of for longer is reported down (see [`DEFAULT_LIVENESS_MS`]).
    pub fn new(store: S, clock: C, liveness_ms: u64) -> Result<Self, MetaError> {
        let has_root = store.read(|t| Ok::<_, MetaError>(t.get_inode(ROOT_INO)?.is_some()))?;
        if !has_root {
            let now = clock.now_ns();
            store.write(|t| {
                if t.get_inode(ROOT_INO)?.is_none() {
                    t.put_inode(&Inode {
                        ino: ROOT_INO,
                        kind: FileKind::Dir,
                        mode: 0o755,
                        uid: 0,
                        gid: 0,
                        nlink: 2,
                        size: 0,
                        atime_ns: now,
                        mtime_ns: now,
                        ctime_ns: now,
                        parent: ROOT_INO,
                        layout: Some(default_policy()),
                        target: String::new(),
                        rdev: 0,
                        data_version: 0,
                        sole_name: None,
                    })?;
                }
                Ok::<_, MetaError>(())
            })?;
        }
        let (persisted, phases) = store.read(|t| Ok::<_, MetaError>((t.list_servers()?, t.list_server_phases()?)))?;
        let phases: BTreeMap<u32, u8> = phases.into_iter().collect();
        let mut servers = BTreeMap::new();
        for (id, addr) in persisted {
            // A replaced server must be drained before it serves again, also after this MDS restarts (§19).
            let code = phases.get(&id).copied().unwrap_or(0);
            let phase = Phase::from_code(code).ok_or_else(|| {
                MetaError::Corrupt(format!("data server {id}: unknown membership phase code {code} in the store"))
            })?;
            if phase != Phase::Member {
                tracing::info!(id, addr = %addr, ?phase, "data server membership phase restored");
            }
            servers.insert(
                id,
                ServerSlot {
                    addr,
                    space: None,
                    device: None,
                    last_ms: None,
                    phase,
                    nfs_addrs: Vec::new(),
                    beat_seen: None,
                },
            );
        }
        let started_ms = clock.mono_ms();
        let shared = store.shared();
        let duty = crate::duty::DutyLease::new(crate::duty::instance_id(), crate::duty::DEFAULT_DUTY_LEASE_MS);
        Ok(Namespace {
            store,
            clock,
            liveness_ms,
            servers: Mutex::new(servers),
            xattr_bytes_max: DEFAULT_XATTR_BYTES_MAX_PER_INODE,
            rebuild_after_ms: DEFAULT_REBUILD_AFTER_MS,
            started_ms,
            scan: Mutex::new(Scan::default()),
            layouts_changed: AtomicU64::new(0),
            layouts_pending: AtomicU64::new(0),
            rebuild_progress: Mutex::new((None, None, None)),
            stale_ranges_per_slot_max: crate::stale::DEFAULT_STALE_RANGES_PER_SLOT_MAX,
            stale_entries_max: crate::stale::DEFAULT_STALE_ENTRIES_MAX,
            shared,
            duty: Mutex::new(duty),
            service_beats: Mutex::new(std::collections::HashMap::new()),
            locks_orphan_ms: crate::locks::DEFAULT_LOCKS_ORPHAN_MS,
        })
    }

    /// Sets the most bytes of extended attributes (names plus values) one inode may hold (the MDS config's
    /// `xattr_bytes_max_per_inode`); at least one largest value with a longest name must fit.
    pub fn with_xattr_bytes_max(mut self, bytes: usize) -> Self {
        self.xattr_bytes_max = bytes.max(weft_proto::XATTR_VALUE_BYTES_MAX + weft_proto::XATTR_NAME_BYTES_MAX);
        self
    }

    /// Sets the silence after which a data server is declared failed and its slots in redundant layouts move to
    /// spares (the MDS config's `rebuild_after_ms`); at least the liveness window.
    pub fn with_rebuild_after_ms(mut self, ms: u64) -> Self {
        self.rebuild_after_ms = ms.max(self.liveness_ms);
        self
    }

    /// Sets the stale-range table's bounds (the MDS config's `stale_ranges_per_slot_max`, `stale_entries_max`).
    pub fn with_stale_limits(mut self, ranges_per_slot_max: usize, entries_max: u64) -> Self {
        self.stale_ranges_per_slot_max = ranges_per_slot_max.max(1);
        self.stale_entries_max = entries_max;
        self
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// Checks the whole tree's invariants on one snapshot ([`check_tree`]): O(inodes + entries), for tests, the
    /// simulations and offline checks, never a request path.
    pub fn check_tree(&self) -> Result<TreeCount, CheckError> {
        self.store.read(|t| check_tree(t))
    }

    /// The store, the namespace dropped (its background state with it).
    pub fn into_store(self) -> S {
        self.store
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Runs one metadata request as root (see [`Namespace::execute_as`]).
    pub fn execute(&self, req: &Request) -> Result<Response, WireError> {
        self.execute_as(&Cred::root(), req)
    }

    /// Removes the once records older than `once::ONCE_KEEP_MS` (docs/format.md §27); returns how many.
    pub fn sweep_once_records(&self) -> Result<usize, WireError> {
        let now_ms = self.now_ms();
        Ok(self.duty_write(|t| once::sweep(t, now_ms))?)
    }

    /// The clock's wall time in Unix milliseconds (0 before the epoch), as once records keep it.
    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.now_ns() / 1_000_000).unwrap_or(0)
    }

    /// One change as one transaction; with a tagged call, exactly once (see [`Namespace::execute_once`]).
    fn change(
        &self,
        once: Option<(&OnceCall, Op)>,
        mut f: impl FnMut(&mut dyn MetaTxn) -> Result<Response, WireError>,
    ) -> Result<Response, WireError> {
        let Some((call, op)) = once else { return self.store.write(f) };
        // A commit whose outcome was lost with the database connection (a primary failing over) is settled by the
        // once record it would have written: found, it ran; absent, it did not, and runs again (bounded).
        for _ in 0..COMMIT_UNKNOWN_TRIES {
            let at_ms = self.now_ms();
            let done = self.store.write(|t| {
                // The record is read apart from the change's own reads (format §27): on PostgreSQL, reading it
                // inside every change made concurrent changes conflict (SERIALIZABLE's page-level predicate locks
                // on the index) until they gave up. It is read after the directory locks, with the change's first
                // statement, and looked at once the change ran: a call that ran is answered with its reply, and
                // this transaction, which must not commit, rolls back.
                once::ask(t, call);
                let resp = f(t);
                if let Some(recorded) = once::lookup(t, call, op).map_err(ChangeError::Rule)? {
                    return Err(ChangeError::Recorded(Box::new(recorded)));
                }
                let resp = resp.map_err(ChangeError::Rule)?;
                once::record(t, call, op, &resp, at_ms)?;
                Ok::<_, ChangeError>(resp)
            });
            match done {
                Ok(resp) => return Ok(resp),
                Err(ChangeError::Recorded(resp)) => {
                    tracing::info!(
                        client = format_args!("{:#x}", call.tag.client),
                        slot = call.slot,
                        call = call.tag.call,
                        op = op.name(),
                        "a call that had run is answered with its recorded reply (once block)"
                    );
                    return Ok(*resp);
                }
                Err(ChangeError::Rule(e)) => return Err(e),
                Err(ChangeError::Unknown(why)) => {
                    tracing::warn!(op = op.name(), "{why}; asking the once record whether the change ran")
                }
            }
        }
        Err(werr(
            ErrorCode::Io,
            format!("{}: the database lost the commit's outcome {COMMIT_UNKNOWN_TRIES} times", op.name()),
        ))
    }

    /// A store write that may run twice with no harm (an open's new data version, rows marked stale): when its
    /// commit's outcome was lost (`MetaError::CommitUnknown`: the database failing over), it runs again (bounded).
    pub(crate) fn write_rerunnable<R>(
        &self,
        mut f: impl FnMut(&mut dyn MetaTxn) -> Result<R, WireError>,
    ) -> Result<R, WireError> {
        for _ in 1..COMMIT_UNKNOWN_TRIES {
            match self.store.write(|t| f(t).map_err(ChangeError::Rule)) {
                Ok(r) => return Ok(r),
                Err(ChangeError::Rule(e)) => return Err(e),
                Err(ChangeError::Unknown(why)) => tracing::warn!("{why}; running the change again (harmless twice)"),
                Err(ChangeError::Recorded(_)) => unreachable!("only a tagged change looks its record up"),
            }
        }
        self.store.write(f)
    }

    /// Runs one metadata request on behalf of `cred`, checking its permissions (see [`crate::perm`]). Rule
    /// violations come back with their precise [`ErrorCode`] (a refused permission as `Permission` (EACCES) or
    /// `NotPermitted` (EPERM)), and change nothing; store failures as `Io`/`Internal`.
    pub fn execute_as(&self, cred: &Cred, req: &Request) -> Result<Response, WireError> {
        self.execute_once(cred, req, None)
    }

    /// As [`Namespace::execute_as`], for a call with a once block (`once`, docs/format.md §27): each change runs in
    /// a transaction that first looks for the call's recorded outcome (a retry of a call that ran is answered with
    /// its reply and runs nothing) and records the new outcome with the change.
    pub fn execute_once(&self, cred: &Cred, req: &Request, once: Option<&OnceCall>) -> Result<Response, WireError> {
        let now = self.clock.now_ns();
        let once = once.map(|c| (c, req.op()));
        match req {
            Request::Null(()) => Ok(Response::Null(())),
            Request::Lookup(r) => self.store.read(|t| lookup(t, cred, r.parent, &r.name)).map(Response::Lookup),
            Request::GetAttr(r) => self.store.read(|t| Ok(load(t, r.ino)?.attr())).map(Response::GetAttr),
            Request::SetAttr(r) => self.change(once, |t| set_attr(t, cred, r, now).map(Response::SetAttr)),
            Request::NfsSetAttr(r) => {
                self.change(once, |t| set_attr_by(t, cred, r, now, SizeRight::OwnerOverride).map(Response::NfsSetAttr))
            }
            Request::Create(r) => {
                let excluded = self.excluded_servers();
                self.change(once, |t| create(t, cred, r, now, &excluded, false).map(Response::Create))
            }
            Request::Mkdir(r) => self.change(once, |t| mkdir(t, cred, r, now).map(Response::Mkdir)),
            Request::Rmdir(r) => self.change(once, |t| rmdir(t, cred, r.parent, &r.name, now).map(Response::Rmdir)),
            Request::Unlink(r) => self.change(once, |t| unlink(t, cred, r.parent, &r.name, now).map(Response::Unlink)),
            Request::Rename(r) => self.change(once, |t| rename(t, cred, r, now).map(Response::Rename)),
            Request::Symlink(r) => self.change(once, |t| symlink(t, cred, r, now).map(Response::Symlink)),
            Request::Mknod(r) => self.change(once, |t| mknod(t, cred, r, now).map(Response::Mknod)),
            Request::Readlink(r) => self.store.read(|t| readlink(t, r.ino)).map(Response::Readlink),
            Request::Link(r) => self.change(once, |t| link(t, cred, r, now).map(Response::Link)),
            Request::Readdir(r) => self.store.read(|t| readdir(t, cred, r)).map(Response::Readdir),
            Request::ReaddirPlus(r) => self.store.read(|t| readdir_plus(t, cred, r)).map(Response::ReaddirPlus),
            Request::Statfs(()) => self.statfs().map(Response::Statfs),
            Request::SetLayout(r) => self.change(once, |t| set_layout(t, cred, r, now).map(Response::SetLayout)),
            Request::Commit(r) => self.change(once, |t| commit(t, cred, r, now).map(|(_, a)| Response::Commit(a))),
            Request::CommitWcc(r) => self.change(once, |t| {
                commit(t, cred, r, now).map(|((pre_mtime_ns, pre_size), attr)| {
                    Response::CommitWcc(CommitWccResp { pre_mtime_ns, pre_size, attr })
                })
            }),
            Request::ClusterInfo(()) => Ok(Response::ClusterInfo(self.servers())),
            Request::MemberStatus(()) => Ok(Response::MemberStatus(self.member_status())),
            Request::GetXattr(r) => self.store.read(|t| xattr::get(t, cred, r)).map(Response::GetXattr),
            Request::ListXattr(r) => self.store.read(|t| xattr::list(t, cred, r.ino)).map(Response::ListXattr),
            Request::SetXattr(r) => {
                self.change(once, |t| xattr::set(t, cred, r, self.xattr_bytes_max, now).map(Response::SetXattr))
            }
            Request::RemoveXattr(r) => self.change(once, |t| xattr::remove(t, cred, r, now).map(Response::RemoveXattr)),
            Request::RegisterServer(r) => {
                if !cred.is_root() {
                    return Err(werr(
                        ErrorCode::NotPermitted,
                        format!("uid {} may not register data server {}: root only", cred.uid, r.id),
                    ));
                }
                self.register_server(r, None).map(|_| Response::RegisterServer(()))
            }
            Request::RegisterServerDev(r) => {
                if !cred.is_root() {
                    return Err(werr(
                        ErrorCode::NotPermitted,
                        format!("uid {} may not register data server {}: root only", cred.uid, r.id),
                    ));
                }
                if r.space.device.host_id.len() > HOST_ID_BYTES_MAX {
                    return Err(werr(ErrorCode::Invalid, format!("data server {}: host id too long", r.id)));
                }
                let plain = RegisterServerReq { id: r.id, addr: r.addr.clone(), space: r.space.space };
                self.register_server(&plain, Some(r.space.device.clone())).map(Response::RegisterServerDev)
            }
            Request::RegisterPnfs(r) => {
                if !cred.is_root() {
                    return Err(werr(
                        ErrorCode::NotPermitted,
                        format!("uid {} may not register data server {}'s NFS addresses: root only", cred.uid, r.id),
                    ));
                }
                self.register_pnfs(r).map(Response::RegisterPnfs)
            }
            Request::PnfsDevices(()) => Ok(Response::PnfsDevices(self.pnfs_devices())),
            other => {
                Err(werr(ErrorCode::BadRequest, format!("op {:?} is not served by the metadata service", other.op())))
            }
        }
    }

    /// Inode `ino`'s attributes, as `GetAttr` answers them (no permission check: the path walk to it made them).
    pub fn attr(&self, ino: u64) -> Result<Attr, WireError> {
        self.store.read(|t| Ok(load(t, ino)?.attr()))
    }

    /// Whether `cred` may access inode `ino` as `mask` asks ([`Mask::READ`], [`Mask::WRITE`], [`Mask::EXEC`];
    /// [`Mask::NONE`] asks only that it exists): the check an ACCESS request or an open makes. Reads only.
    pub fn access(&self, cred: &Cred, ino: u64, mask: Mask) -> Result<(), WireError> {
        self.store.read(|t| {
            let inode = load(t, ino)?;
            may(t, cred, &inode, mask)
        })
    }

    /// The fresh attributes of regular file `ino` once `cred` may access it for `rights` (read needs R, write W):
    /// the check behind `Open`. A directory is `IsDir`, any other non-regular file `Invalid`: only regular files
    /// have objects on the data servers. Reads only, unless `rights` cover writing: then the file's data version
    /// advances (a write transaction).
    pub fn open(&self, cred: &Cred, ino: u64, rights: Rights) -> Result<Attr, WireError> {
        self.open_as(cred, ino, rights, false)
    }

    /// [`Namespace::open`] renewing an open the caller proved (`RenewOpen`): with `owner_keeps`, the file's owner
    /// passes whatever the mode, as knfsd's owner override (the owner could chmod the file back anyway).
    pub fn renew_open(&self, cred: &Cred, ino: u64, rights: Rights, owner_keeps: bool) -> Result<Attr, WireError> {
        self.open_as(cred, ino, rights, owner_keeps)
    }

    fn open_as(&self, cred: &Cred, ino: u64, rights: Rights, owner_keeps: bool) -> Result<Attr, WireError> {
        if !rights.is_valid() {
            return Err(werr(ErrorCode::Invalid, format!("open of inode {ino} asks for no valid rights ({rights:?})")));
        }
        let mut bits = 0;
        if rights.covers(Rights::READ) {
            bits |= Mask::READ.bits();
        }
        if rights.covers(Rights::WRITE) {
            bits |= Mask::WRITE.bits();
        }
        let check = |t: &mut dyn MetaTxn| -> Result<Inode, WireError> {
            let inode = load(t, ino)?;
            match inode.kind {
                FileKind::File => {}
                FileKind::Dir => {
                    return Err(werr(ErrorCode::IsDir, format!("inode {ino} is a directory: it has no data to open")));
                }
                other => {
                    return Err(werr(
                        ErrorCode::Invalid,
                        format!("inode {ino} is a {other:?}, not a regular file: it has no data to open"),
                    ));
                }
            }
            if !(owner_keeps && cred.owns(&inode)) {
                may(t, cred, &inode, Mask::from_bits(bits))?;
            }
            Ok(inode)
        };
        if !rights.covers(Rights::WRITE) {
            return self.store.read(|t| Ok(check(t)?.attr()));
        }
        // An open for writing takes a new data version in the same transaction: whatever this writer writes lives
        // under a version no earlier reader holds, even if it dies without committing (docs/format.md §12). Two
        // new versions are as good as one: a lost commit outcome runs it again.
        self.write_rerunnable(|t| {
            let mut inode = check(t)?;
            inode.bump_data_version();
            t.put_inode(&inode)?;
            Ok(inode.attr())
        })
    }

    /// `CreateOpen` (as `cred`, exactly once with `once`): a create whose reply is also an open for reading and
    /// writing, in the create's one transaction (see [`create`]). Its once record is a `Create`'s.
    pub fn create_open(&self, cred: &Cred, r: &CreateReq, once: Option<&OnceCall>) -> Result<Attr, WireError> {
        let now = self.clock.now_ns();
        let excluded = self.excluded_servers();
        let once = once.map(|c| (c, Op::Create));
        match self.change(once, |t| create(t, cred, r, now, &excluded, true).map(Response::Create))? {
            Response::Create(attr) => Ok(attr),
            other => Err(werr(ErrorCode::Internal, format!("a create was recorded as {:?}", other.op()))),
        }
    }

    /// `SetSizeOpen` (ftruncate): sets regular file `r.ino`'s size as `SetAttr` does, with the right to write taken
    /// from the caller's open instead of the mode. The caller (`MetaService`) has verified `r.cap` (sealed by this
    /// cluster, for this inode, WRITE, the connection's key, unexpired): this function does not look at it, which
    /// is why no `Request` reaches it through [`Namespace::execute_as`].
    pub fn set_size_open(&self, cred: &Cred, r: &SetSizeOpenReq, once: Option<&OnceCall>) -> Result<Attr, WireError> {
        let now = self.clock.now_ns();
        let once = once.map(|c| (c, Op::SetSizeOpen));
        let req = SetAttrReq { ino: r.ino, set: SetAttrs { size: Some(r.size), ..SetAttrs::default() } };
        match self.change(once, |t| set_attr_by(t, cred, &req, now, SizeRight::Open).map(Response::SetSizeOpen))? {
            Response::SetSizeOpen(attr) => Ok(attr),
            other => Err(werr(ErrorCode::Internal, format!("a size change was recorded as {:?}", other.op()))),
        }
    }

    /// Whether `cred` may reach each of `inos` by number (a read transaction): search permission on every directory
    /// above each, as a path walk to it needs. The MDS asks it of confined callers (unprivileged per-client keys)
    /// before any request naming an inode; the walk and the request are two transactions, as the kernel's path
    /// walk and the call after it are.
    pub fn may_reach(&self, cred: &Cred, inos: &[u64]) -> Result<(), WireError> {
        self.store.read(|t| inos.iter().try_for_each(|&ino| reach(t, cred, ino)))
    }

    /// Whether `cred` may access inode `ino` as `mask` says (a read transaction): the check behind a lock, which
    /// needs the file to be open-able by its caller (docs/format.md §14).
    pub fn may_access(&self, cred: &Cred, ino: u64, mask: Mask) -> Result<(), WireError> {
        self.store.read(|t| {
            let inode = load(t, ino)?;
            may(t, cred, &inode, mask)
        })
    }

    /// Up to `limit` removed files whose objects are still to be deleted from the data servers. A store failure is
    /// logged and yields an empty list (the collector retries on its next round).
    pub fn orphans(&self, limit: usize) -> Vec<(u64, Layout)> {
        match self.store.read(|t| t.list_orphans(limit)) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("listing orphans: {e}");
                Vec::new()
            }
        }
    }

    /// Forgets orphan `ino` once every one of its objects was deleted.
    pub fn orphan_done(&self, ino: u64) -> Result<(), MetaError> {
        self.duty_write(|t| t.del_orphan(ino))
    }

    /// Every registered data server, with its membership state and last reported space.
    pub fn servers(&self) -> Vec<ServerInfo> {
        let now = self.clock.mono_ms();
        let timing = self.timing();
        self.lock_servers()
            .iter()
            .map(|(id, s)| {
                let age = s.last_ms.map_or(u64::MAX, |l| now.saturating_sub(l));
                let space = s.space.unwrap_or_default();
                ServerInfo {
                    id: *id,
                    addr: s.addr.clone(),
                    state: membership::state(s.phase, self.silent_ms(s, now), timing),
                    bytes_total: space.bytes_total,
                    bytes_free: space.bytes_free,
                    heartbeat_age_ms: age,
                }
            })
            .collect()
    }

    fn timing(&self) -> Timing {
        Timing { liveness_ms: self.liveness_ms, rebuild_after_ms: self.rebuild_after_ms }
    }

    /// How long `s` has been silent: since its last heartbeat, or, never heard since this MDS started, since the
    /// start (and at least past the liveness window: a server not heard yet is not reported up).
    fn silent_ms(&self, s: &ServerSlot, now: u64) -> u64 {
        match s.last_ms {
            Some(l) => now.saturating_sub(l),
            None => now.saturating_sub(self.started_ms).max(self.liveness_ms.saturating_add(1)),
        }
    }

    /// Servers no new file may be placed on: failed, replaced or draining (a drain must never meet a new layout
    /// naming its server).
    fn excluded_servers(&self) -> BTreeSet<u32> {
        self.lock_servers()
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Failed | Phase::Replaced | Phase::Draining))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Membership and rebuild progress (op 135).
    pub fn member_status(&self) -> MemberStatus {
        let (left, rate, eta) = *lock(&self.rebuild_progress);
        MemberStatus {
            layouts_pending: self.layouts_pending.load(Ordering::Relaxed),
            layouts_changed: self.layouts_changed.load(Ordering::Relaxed),
            rebuild_bytes_left: left,
            rebuild_bytes_per_s: rate,
            rebuild_eta_ms: eta,
        }
    }

    /// Records the healer's rebuild progress for `weft status` (`None`: unknown).
    // Joined to the healer at merge: it reports bytes left, rate and ETA here.
    pub fn set_rebuild_progress(&self, bytes_left: Option<u64>, bytes_per_s: Option<u64>, eta_ms: Option<u64>) {
        *lock(&self.rebuild_progress) = (bytes_left, bytes_per_s, eta_ms);
    }

    /// One membership step (blocking: store transactions): moves phases on by the clock, then, while a server is
    /// failed, examines one batch of inodes and moves each redundant layout's failed slots to spares, one
    /// journaled transaction per file, bumping its layout generation. Call it every `membership_interval_ms`, at
    /// the duty lease's holder (format §28; the others call [`Namespace::refresh_servers`]).
    pub fn membership_tick(&self, batch: usize) -> Result<(), MetaError> {
        self.refresh_servers()?;
        let now = self.clock.mono_ms();
        let timing = self.timing();
        let (failed, up) = {
            let mut servers = self.lock_servers();
            let mut failed = BTreeSet::new();
            let mut up = BTreeSet::new();
            for (id, s) in servers.iter_mut() {
                let silent = self.silent_ms(s, now);
                let next = membership::on_tick(s.phase, silent, timing);
                if next != s.phase {
                    // Recorded before any slot moves: a restarted MDS must not take the server for a member. On a
                    // shared store, only if no service heard it meanwhile (its counter unchanged, format §28).
                    if !self.move_phase(*id, (s.phase, next), s.beat_seen, true)? {
                        continue;
                    }
                    tracing::warn!(id, addr = %s.addr, silent_ms = silent, rebuild_after_ms = self.rebuild_after_ms,
                        "data server declared failed: moving its slots in redundant layouts to spares");
                    s.phase = next;
                }
                if s.phase == Phase::Failed {
                    failed.insert(*id);
                }
                if membership::state(s.phase, silent, timing).is_up() {
                    up.insert(*id);
                }
            }
            (failed, up)
        };
        let mut scan = lock(&self.scan);
        if !scan.running {
            if failed.is_empty() {
                return Ok(());
            }
            scan.begin(&failed);
        }
        let page = self.store.read(|t| t.list_inodes(scan.after, batch.max(1)))?;
        let last = page.last().map(|i| i.ino);
        let whole = page.len() >= batch.max(1);
        for inode in page {
            let Some(layout) = inode.layout.as_ref().filter(|_| inode.kind == FileKind::File) else { continue };
            let r = membership::replace_failed(layout, &failed, &up, &mut scan.load);
            if let Some(new) = &r.layout {
                let ino = inode.ino;
                let entries_max = self.stale_entries_max;
                let changed = self.duty_write(|t| {
                    // The file may have gone or changed since the read: only the layout we decided on is replaced.
                    let Some(mut cur) = t.get_inode(ino)? else { return Ok::<_, MetaError>(false) };
                    if cur.layout.as_ref() != Some(layout) {
                        return Ok(false);
                    }
                    // The stale-range table is bounded as `MarkStale` bounds it: a move whose new (file, slot)
                    // entries do not fit is refused whole (the layout stays degraded, retried next pass), since a
                    // spare slot not recorded stale would be read before the healer rebuilt it.
                    let mut ranges_of = Vec::with_capacity(r.moved.len());
                    for (slot, _, _) in &r.moved {
                        ranges_of.push(t.get_stale(ino, *slot)?.unwrap_or_default());
                    }
                    let new_entries = ranges_of.iter().filter(|r| r.is_empty()).count() as u64;
                    if new_entries > 0 && t.count_stale()?.saturating_add(new_entries) > entries_max {
                        tracing::warn!(
                            ino,
                            entries_max,
                            new_entries,
                            "the stale-range table is full (stale_entries_max): not moving the file's failed slots \
                             to spares yet; retrying"
                        );
                        return Ok(false);
                    }
                    cur.layout = Some(new.clone());
                    t.put_inode(&cur)?;
                    // In the same transaction: the spare holds nothing of this file yet, so its whole slot is stale
                    // (§18) and the healer rebuilds it; no read uses it before then.
                    for ((slot, _, _), mut ranges) in r.moved.iter().zip(ranges_of) {
                        let seq = t.next_stale_seq()?;
                        crate::stale::mark(&mut ranges, 0, crate::stale::WHOLE, seq, self.stale_ranges_per_slot_max);
                        t.put_stale(ino, *slot, &ranges)?;
                    }
                    Ok(true)
                })?;
                if changed {
                    self.layouts_changed.fetch_add(1, Ordering::Relaxed);
                    for (slot, old, spare) in &r.moved {
                        tracing::info!(
                            ino,
                            slot,
                            failed = old,
                            spare,
                            generation = new.generation,
                            "layout slot moved to a spare"
                        );
                    }
                } else {
                    // Seen again next pass.
                    for old in layout.servers.iter().filter(|s| failed.contains(s)) {
                        *scan.left.entry(*old).or_insert(0) += 1;
                    }
                }
                scan.count(new);
            } else {
                scan.count(layout);
            }
            for old in &r.unplaced {
                tracing::warn!(ino = inode.ino, failed = old, redundancy = %layout.redundancy,
                    "no spare data server for a failed server's slot: the file stays degraded; retrying");
                *scan.left.entry(*old).or_insert(0) += 1;
            }
        }
        if let Some(ino) = last {
            scan.after = ino;
        }
        if !whole {
            self.finish_pass(&mut scan);
        }
        Ok(())
    }

    fn finish_pass(&self, scan: &mut Scan) {
        self.layouts_pending.store(scan.pending(), Ordering::Relaxed);
        let mut servers = self.lock_servers();
        let failed_now: BTreeSet<u32> =
            servers.iter().filter(|(_, s)| s.phase == Phase::Failed).map(|(id, _)| *id).collect();
        for id in scan.finish(&failed_now) {
            if let Some(s) = servers.get_mut(&id) {
                let next = membership::on_replaced(s.phase);
                // Failed and Replaced both drain a returning server; a failed write leaves it Failed, rescanned.
                match self.move_phase(id, (s.phase, next), s.beat_seen, false) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        tracing::warn!(id, error = %e, "could not record the server's phase; staying failed");
                        continue;
                    }
                }
                s.phase = next;
                tracing::warn!(id, addr = %s.addr, "data server replaced: no redundant layout names it any more");
            }
        }
    }

    /// Servers being drained, with their addresses.
    pub fn draining_servers(&self) -> Vec<(u32, String)> {
        self.lock_servers()
            .iter()
            .filter(|(_, s)| s.phase == Phase::Draining)
            .map(|(id, s)| (*id, s.addr.clone()))
            .collect()
    }

    /// Whether server `server` may keep its object of inode `ino`: the inode is a file whose current layout names
    /// it, or a removed file whose objects the orphan collector has yet to delete.
    pub fn object_owned(&self, ino: u64, server: u32) -> Result<bool, MetaError> {
        self.store.read(|t| {
            Ok(match t.get_inode(ino)? {
                Some(i) => i.layout.is_some_and(|l| l.servers.contains(&server)),
                // The orphan collector deletes it (the object is gone either way).
                None => false,
            })
        })
    }

    /// Server `id` was drained: a spare from now on.
    pub fn drained(&self, id: u32) {
        if let Some(s) = self.lock_servers().get_mut(&id) {
            let next = membership::on_drained(s.phase);
            if next != s.phase {
                // Unrecorded, the server stays Draining and is drained again (idempotent) next round.
                // Heard meanwhile is fine for a drained server: only its phase must still be Draining.
                let written = self.move_phase(id, (s.phase, next), s.beat_seen, false);
                if let Ok(false) = written {
                    return;
                }
                if let Err(e) = written {
                    tracing::warn!(id, error = %e, "could not record the drained server's phase; draining again");
                    return;
                }
                tracing::info!(id, addr = %s.addr, "data server drained: serving as a spare");
                s.phase = next;
            }
        }
    }

    fn lock_servers(&self) -> MutexGuard<'_, BTreeMap<u32, ServerSlot>> {
        // The map holds plain values that are each replaced whole, so a panic elsewhere cannot leave it torn.
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a heartbeat and answers the server's standing (§19): the state its new phase reports after no
    /// silence, which its lease to serve clients rests on.
    fn register_server(&self, r: &RegisterServerReq, device: Option<DeviceId>) -> Result<HeartbeatResp, WireError> {
        if r.addr.is_empty() || r.addr.len() > SERVER_ADDR_BYTES_MAX || r.addr.contains('\0') {
            return Err(werr(
                ErrorCode::Invalid,
                format!("data server {} address {:?} is empty, too long or has a NUL", r.id, r.addr),
            ));
        }
        let mut servers = self.lock_servers();
        let known = servers.get(&r.id).is_some_and(|s| s.addr == r.addr);
        let (was, phase) = if self.shared {
            // The store's phase, not this service's memory of it: another service may have moved it (format §28).
            self.heartbeat_shared(r)?
        } else {
            if !known {
                self.store.write(|t| t.put_server(r.id, &r.addr))?;
            }
            let was = servers.get(&r.id).map_or(Phase::Member, |s| s.phase);
            let phase = membership::on_heartbeat(was);
            if phase != was {
                // Recorded before the reply: the server learns it is Draining only once a restart would remember it.
                self.store.write(|t| t.put_server_phase(r.id, phase.code()))?;
            }
            (was, phase)
        };
        if !known {
            tracing::info!(id = r.id, addr = %r.addr, "data server registered");
        }
        if phase != was {
            tracing::warn!(id = r.id, addr = %r.addr, from = ?was, "data server returned after it was declared failed: draining the objects it no longer owns");
        }
        // NFS addresses (op 140) survive heartbeats, but not a move to another address.
        let nfs_addrs = servers.get(&r.id).filter(|_| known).map(|s| s.nfs_addrs.clone()).unwrap_or_default();
        let beat_seen = servers.get(&r.id).and_then(|s| s.beat_seen);
        servers.insert(
            r.id,
            ServerSlot {
                addr: r.addr.clone(),
                space: Some(r.space),
                device,
                last_ms: Some(self.clock.mono_ms()),
                phase,
                nfs_addrs,
                beat_seen,
            },
        );
        Ok(HeartbeatResp { state: membership::state(phase, 0, self.timing()), rebuild_after_ms: self.rebuild_after_ms })
    }

    /// Records the NFS addresses data server `r.id` serves pNFS at (op 140, docs/format.md §23), in memory: the
    /// server repeats them with every heartbeat, so an MDS restart learns them again within one. Each address must
    /// be a socket address (`ip:port`, or `rdma:ip:port` over RPC-over-RDMA); at most `PNFS_ADDRS_MAX`; the server
    /// must have registered first.
    fn register_pnfs(&self, r: &RegisterPnfsReq) -> Result<(), WireError> {
        if r.addrs.len() > PNFS_ADDRS_MAX {
            return Err(werr(
                ErrorCode::Invalid,
                format!("data server {} announces {} NFS addresses, at most {PNFS_ADDRS_MAX}", r.id, r.addrs.len()),
            ));
        }
        for a in &r.addrs {
            if a.len() > SERVER_ADDR_BYTES_MAX || weft_proto::msg::parse_pnfs_addr(a).is_none() {
                return Err(werr(
                    ErrorCode::Invalid,
                    format!("data server {} NFS address {a:?} is not ip:port or rdma:ip:port", r.id),
                ));
            }
        }
        let mut servers = self.lock_servers();
        let Some(slot) = servers.get_mut(&r.id) else {
            return Err(werr(
                ErrorCode::NotFound,
                format!("data server {} announced NFS addresses before registering", r.id),
            ));
        };
        if slot.nfs_addrs != r.addrs {
            tracing::info!(id = r.id, addrs = ?r.addrs, "data server serves pNFS");
            slot.nfs_addrs = r.addrs.clone();
        }
        Ok(())
    }

    /// Every data server that announced NFS addresses, with them, in id order (op 138).
    pub fn pnfs_devices(&self) -> Vec<PnfsDeviceInfo> {
        self.lock_servers()
            .iter()
            .filter(|(_, s)| !s.nfs_addrs.is_empty())
            .map(|(id, s)| PnfsDeviceInfo { server: *id, addrs: s.nfs_addrs.clone() })
            .collect()
    }

    /// Every registered server's last space and file system, for counting each file system once.
    pub fn server_devices(&self) -> Vec<(u32, SpaceStat, Option<DeviceId>)> {
        self.lock_servers().iter().map(|(id, s)| (*id, s.space.unwrap_or_default(), s.device.clone())).collect()
    }

    /// Space is counted once per file system (`weft_proto::space::count_once`): four data servers on one disk
    /// are one disk's size, not four.
    fn statfs(&self) -> Result<StatFs, WireError> {
        let files = self.store.read(|t| t.count_inodes())?;
        let mut st = StatFs { files, ..StatFs::default() };
        for s in self.servers() {
            st.servers_total += 1;
            if s.state == ServerState::Up {
                st.servers_up += 1;
            }
        }
        for d in weft_proto::space::count_once(&self.server_devices()) {
            st.bytes_total = st.bytes_total.saturating_add(d.bytes_total);
            st.bytes_free = st.bytes_free.saturating_add(d.bytes_free);
        }
        Ok(st)
    }
}

// ---- helpers ------------------------------------------------------------------------------------------------

fn check_name(name: &str) -> Result<(), WireError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(werr(ErrorCode::Invalid, format!("invalid name {name:?}")));
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(werr(
            ErrorCode::NameTooLong,
            format!("name of {} bytes is longer than {NAME_BYTES_MAX}", name.len()),
        ));
    }
    Ok(())
}

fn load(t: &mut dyn MetaTxn, ino: u64) -> Result<Inode, WireError> {
    t.get_inode(ino)?.ok_or_else(|| werr(ErrorCode::NotFound, format!("no inode {ino}")))
}

fn load_dir(t: &mut dyn MetaTxn, ino: u64) -> Result<Inode, WireError> {
    let i = load(t, ino)?;
    if i.kind != FileKind::Dir {
        return Err(werr(ErrorCode::NotDir, format!("inode {ino} is not a directory")));
    }
    Ok(i)
}

/// The inode a directory entry names; a dangling entry is corruption, not a user error.
fn load_entry(t: &mut dyn MetaTxn, parent: u64, name: &str, ino: u64) -> Result<Inode, WireError> {
    Ok(t.get_inode(ino)?
        .ok_or_else(|| MetaError::Corrupt(format!("entry {name:?} in directory {parent} names missing inode {ino}")))?)
}

fn entry(t: &mut dyn MetaTxn, parent: u64, name: &str) -> Result<(u64, FileKind), WireError> {
    t.get_dirent(parent, name)?
        .ok_or_else(|| werr(ErrorCode::NotFound, format!("no entry {name:?} in directory {parent}")))
}

/// Changes a directory's link count by `delta` and stamps its mtime and ctime (its entries changed).
fn touch_dir(t: &mut dyn MetaTxn, ino: u64, delta: i32, now: i64) -> Result<(), WireError> {
    let d = load(t, ino)?;
    touch_loaded_dir(t, d, delta, now)
}

/// [`touch_dir`] of the directory `d` as this transaction loaded it and has not changed it since (one read fewer).
fn touch_loaded_dir(t: &mut dyn MetaTxn, mut d: Inode, delta: i32, now: i64) -> Result<(), WireError> {
    let ino = d.ino;
    d.nlink = d
        .nlink
        .checked_add_signed(delta)
        .ok_or_else(|| werr(ErrorCode::Invalid, format!("directory {ino} link count out of range")))?;
    weft_rpc::invariant!(d.kind == FileKind::Dir && d.nlink >= 2, "directory {ino} touched with {} links", d.nlink);
    d.mtime_ns = now;
    d.ctime_ns = now;
    t.put_inode(&d)?;
    Ok(())
}

/// Removes one link of a non-directory; at zero the inode goes and a file's objects become an orphan.
fn drop_link(t: &mut dyn MetaTxn, mut inode: Inode, now: i64) -> Result<(), WireError> {
    weft_rpc::invariant!(inode.kind != FileKind::Dir && inode.nlink > 0, "inode {} dropped a link it lacks", inode.ino);
    inode.nlink = inode.nlink.saturating_sub(1);
    if inode.nlink == 0 {
        free_inode(t, inode.ino)?;
        if let (FileKind::File, Some(layout)) = (inode.kind, &inode.layout) {
            t.put_orphan(inode.ino, layout)?;
        }
    } else {
        inode.ctime_ns = now;
        t.put_inode(&inode)?;
    }
    Ok(())
}

/// A concrete file layout from a directory policy: `count` consecutive registered servers (by id) starting at
/// index `ino % n`, so files spread round robin.
fn assign_layout(policy: &Layout, ino: u64, servers: &[(u32, String)]) -> Result<Layout, WireError> {
    let n = servers.len();
    if n == 0 {
        return Err(werr(ErrorCode::NoServers, "no data server is registered"));
    }
    let want = policy.stripe_count as usize;
    if let Some(w) = policy.redundancy.width()
        && w as usize > n
    {
        // Redundancy needs its servers distinct: a 4+2 file on 5 servers would lose two chunks with one server.
        return Err(werr(
            ErrorCode::NoServers,
            format!("a {} layout needs {w} distinct data servers; {n} are registered", policy.redundancy),
        ));
    }
    let count = if want == 0 || want > n { n } else { want };
    // `n` is nonzero and fits in u64, so the remainder is below `n`.
    let start = (ino % n as u64) as usize;
    let chosen = (0..count).map(|k| servers[(start + k) % n].0).collect();
    Ok(Layout {
        stripe_unit: policy.stripe_unit,
        stripe_count: count as u32,
        servers: chosen,
        redundancy: policy.redundancy,
        generation: 0,
    })
}

fn new_inode(ino: u64, kind: FileKind, mode: u32, uid: u32, gid: u32, now: i64) -> Inode {
    Inode {
        ino,
        kind,
        mode: mode & MODE_MASK,
        uid,
        gid,
        nlink: 1,
        size: 0,
        atime_ns: now,
        mtime_ns: now,
        ctime_ns: now,
        parent: 0,
        layout: None,
        target: String::new(),
        rdev: 0,
        data_version: crate::store::initial_data_version(kind),
        sole_name: None,
    }
}

/// Removes inode `ino` and its extended attributes.
fn free_inode(t: &mut dyn MetaTxn, ino: u64) -> Result<(), WireError> {
    for (name, _) in t.list_xattrs(ino)? {
        t.del_xattr(ino, &name)?;
    }
    t.del_inode(ino)?;
    Ok(())
}

/// The access ACL the permission check of `cred` on `inode` needs: none when it cannot matter (the owner is
/// judged by the owner bits; clear group bits, the ACL's mask, leave it unconsulted, see [`perm::may`]), which
/// spares the lookup on most checks.
fn acl_for(t: &mut dyn MetaTxn, cred: &Cred, inode: &Inode) -> Result<Option<Acl>, WireError> {
    if cred.uid == inode.uid || inode.mode & 0o070 == 0 {
        return Ok(None);
    }
    xattr::access_acl(t, inode.ino)
}

/// [`perm::may`] with the inode's access ACL.
fn may(t: &mut dyn MetaTxn, cred: &Cred, inode: &Inode, mask: Mask) -> Result<(), WireError> {
    let acl = acl_for(t, cred, inode)?;
    Ok(perm::may(cred, inode, acl.as_ref(), mask)?)
}

/// The directory a reach check walks up from: a directory's parent; another inode's sole name's directory, or
/// for a hard-linked one the directory of its newest name (set by `link`, followed by `rename`; a directory
/// that held a name removed since stays recorded, as an open handle keeps its file). `None` when unknown:
/// records written before that was kept (version 5 and older, or links made before it).
fn primary_dir(inode: &Inode) -> Option<u64> {
    match (&inode.kind, &inode.sole_name) {
        (FileKind::Dir, _) => Some(if inode.parent == 0 { ROOT_INO } else { inode.parent }),
        (_, Some((dir, _))) => Some(*dir),
        _ => (inode.parent != 0).then_some(inode.parent),
    }
}

/// Whether `cred` may reach inode `ino` by its number: search permission on every directory from the inode's
/// primary directory up to the root, as a path walk to it would need (issue 31: inode numbers are sequential, so
/// an unprivileged client must not address what no path it may walk leads to). An inode whose directory is
/// unknown is reachable by its owner only.
fn reach(t: &mut dyn MetaTxn, cred: &Cred, ino: u64) -> Result<(), WireError> {
    if ino == ROOT_INO {
        return Ok(());
    }
    let inode = load(t, ino)?;
    let Some(mut dir) = primary_dir(&inode) else {
        if cred.owns(&inode) {
            return Ok(());
        }
        return Err(werr(
            ErrorCode::Permission,
            format!(
                "uid {} may not reach inode {ino} by number: the directory it is in is not recorded (a hard \
                 link older than the record that keeps it), so only its owner may",
                cred.uid
            ),
        ));
    };
    for _ in 0..DIR_DEPTH_MAX {
        let d = load(t, dir)?;
        if d.kind != FileKind::Dir || (d.parent == dir && dir != ROOT_INO) {
            return Err(MetaError::Corrupt(format!("inode {ino}'s parent chain is broken at {dir}")).into());
        }
        may(t, cred, &d, Mask::EXEC).map_err(|e| {
            werr(e.code, format!("uid {} may not reach inode {ino} by number: {}", cred.uid, e.message))
        })?;
        if dir == ROOT_INO || d.parent == 0 {
            return Ok(());
        }
        dir = d.parent;
    }
    Err(MetaError::Corrupt(format!("inode {ino}'s parent chain is longer than {DIR_DEPTH_MAX}")).into())
}

/// The directory `ino`, which `cred` may search (look names up in).
fn load_searchable_dir(t: &mut dyn MetaTxn, cred: &Cred, ino: u64) -> Result<Inode, WireError> {
    let d = load_dir(t, ino)?;
    may(t, cred, &d, Mask::EXEC)?;
    Ok(d)
}

// ---- ops (each runs inside one transaction) -----------------------------------------------------------------

/// `name` ".." is the directory's parent (the root is its own), as the kernel's lookup of "..": the mount lists it
/// with the right inode. Search permission on the directory is needed, as for any name in it.
fn lookup(t: &mut dyn MetaTxn, cred: &Cred, parent: u64, name: &str) -> Result<Attr, WireError> {
    if name == ".." {
        let d = load_searchable_dir(t, cred, parent)?;
        let up = if d.parent == 0 { ROOT_INO } else { d.parent };
        return Ok(load_dir(t, up)?.attr());
    }
    check_name(name)?;
    t.prefetch_entry(parent, name)?;
    load_searchable_dir(t, cred, parent)?;
    let (ino, _) = entry(t, parent, name)?;
    Ok(load_entry(t, parent, name, ino)?.attr())
}

fn set_attr(t: &mut dyn MetaTxn, cred: &Cred, r: &SetAttrReq, now: i64) -> Result<Attr, WireError> {
    set_attr_by(t, cred, r, now, SizeRight::Mode)
}

/// `SetAttr`, with the right to change the size from `right` (`SetSizeOpen`: the caller's open, see
/// [`perm::SizeRight`]). Everything else is checked alike; a non-root caller's size change drops the set-ID bits.
fn set_attr_by(
    t: &mut dyn MetaTxn,
    cred: &Cred,
    r: &SetAttrReq,
    now: i64,
    right: SizeRight,
) -> Result<Attr, WireError> {
    let mut i = load(t, r.ino)?;
    let s = &r.set;
    let at = |ts: TimeSet| match ts {
        TimeSet::Now => now,
        TimeSet::AtNs(v) => v,
    };
    if s.size.is_some() {
        match i.kind {
            FileKind::Dir => {
                return Err(werr(ErrorCode::IsDir, format!("inode {} is a directory", r.ino)));
            }
            k @ (FileKind::Symlink | FileKind::Fifo | FileKind::Socket | FileKind::CharDev | FileKind::BlockDev) => {
                return Err(werr(ErrorCode::Invalid, format!("inode {} is a {k:?}: it has no size to set", r.ino)));
            }
            FileKind::File => {}
        }
    }
    let mode = perm::check_setattr_by(cred, &i, acl_for(t, cred, &i)?.as_ref(), s, right)?;
    if let Some(size) = s.size
        && size != i.size
    {
        i.size = size;
        i.mtime_ns = now;
        i.bump_data_version();
    }
    if let Some(mode) = mode {
        i.mode = mode & MODE_MASK;
        // The access ACL follows a chmod (`posix_acl_chmod`): owner, mask (or group) and other entries.
        xattr::chmod_acl(t, i.ino, i.mode)?;
    }
    // A truncate or a change of owner drops file capabilities (`do_truncate`, `chown_common`: ATTR_KILL_PRIV).
    let owner_changes = s.uid.is_some_and(|u| u != i.uid) || s.gid.is_some_and(|g| g != i.gid);
    if i.kind == FileKind::File && (s.size.is_some() || owner_changes) {
        xattr::kill_priv(t, i.ino)?;
    }
    if let Some(uid) = s.uid {
        i.uid = uid;
    }
    if let Some(gid) = s.gid {
        i.gid = gid;
    }
    if let Some(ts) = s.atime {
        i.atime_ns = at(ts);
    }
    if let Some(ts) = s.mtime {
        i.mtime_ns = at(ts);
    }
    if *s != Default::default() {
        i.ctime_ns = now;
        t.put_inode(&i)?;
    }
    Ok(i.attr())
}

/// What a create found under its name.
enum CreateTarget {
    /// A regular file of that name (a create that is not exclusive opens it).
    Existing(Inode),
    /// No entry: the file is made in this directory.
    Absent(Inode),
}

/// The directory locked and searched, and the entry a create of `r` finds: an error for an exclusive create of
/// an existing name, or a name that is not a regular file.
fn create_target(t: &mut dyn MetaTxn, cred: &Cred, r: &CreateReq) -> Result<CreateTarget, WireError> {
    t.serialize_dirs(&[r.parent]);
    check_name(&r.name)?;
    t.prefetch_create(r.parent, &r.name, DEFAULT_XATTR)?;
    let parent = load_searchable_dir(t, cred, r.parent)?;
    let Some((ino, kind)) = t.get_dirent(r.parent, &r.name)? else { return Ok(CreateTarget::Absent(parent)) };
    if r.exclusive {
        return Err(werr(ErrorCode::Exists, format!("{:?} exists in directory {}", r.name, r.parent)));
    }
    match kind {
        FileKind::File => Ok(CreateTarget::Existing(load_entry(t, r.parent, &r.name, ino)?)),
        FileKind::Dir => Err(werr(ErrorCode::IsDir, format!("{:?} is a directory", r.name))),
        other => Err(werr(ErrorCode::Exists, format!("{:?} exists and is a {other:?}", r.name))),
    }
}

/// A name that exists answers as Linux's `open(O_CREAT)` does: `Exists` if exclusive, else the file, with only
/// search permission on the directory (the open's own access check is the caller's, see [`Namespace::access`]).
/// With `open` (`CreateOpen`) the create is also an open for reading and writing, in this one transaction: a file
/// it makes needs nothing more (its creator may write it whatever its mode, as open(2) with `O_CREAT`, and its
/// data version is new); a file it finds is opened as [`Namespace::open`] opens it (its mode is checked and it
/// takes a new data version). `excluded`: servers no new layout may name (failed, replaced, draining); they are
/// left out unless that leaves none.
fn create(
    t: &mut dyn MetaTxn,
    cred: &Cred,
    r: &CreateReq,
    now: i64,
    excluded: &BTreeSet<u32>,
    open: bool,
) -> Result<Attr, WireError> {
    match create_target(t, cred, r)? {
        CreateTarget::Existing(mut inode) if open => {
            may(t, cred, &inode, Mask::READ | Mask::WRITE)?;
            inode.bump_data_version();
            t.put_inode(&inode)?;
            Ok(inode.attr())
        }
        CreateTarget::Existing(inode) => Ok(inode.attr()),
        CreateTarget::Absent(parent) => make_file(t, cred, r, parent, now, excluded),
    }
}

/// A new regular file named `r.name` in `parent`, which has no such entry.
fn make_file(
    t: &mut dyn MetaTxn,
    cred: &Cred,
    r: &CreateReq,
    parent: Inode,
    now: i64,
    excluded: &BTreeSet<u32>,
) -> Result<Attr, WireError> {
    perm::may_create(cred, &parent, acl_for(t, cred, &parent)?.as_ref())?;
    let mut servers = t.list_servers()?;
    if servers.iter().any(|(id, _)| !excluded.contains(id)) {
        servers.retain(|(id, _)| !excluded.contains(id));
    }
    if servers.is_empty() {
        return Err(werr(ErrorCode::NoServers, format!("cannot create {:?}: no data server is registered", r.name)));
    }
    let (mode, umask) = weft_proto::split_mode_umask(r.mode);
    let (mode, uid, gid) = perm::new_owner(cred, &parent, FileKind::File, mode);
    let inherited = xattr::inherit(t, &parent, FileKind::File, mode, umask)?;
    let mode = inherited.mode;
    let policy = parent.layout.clone().unwrap_or_else(default_policy);
    let ino = t.next_ino()?;
    let mut inode = new_inode(ino, FileKind::File, mode, uid, gid, now);
    inode.layout = Some(assign_layout(&policy, ino, &servers)?);
    inode.sole_name = Some((r.parent, r.name.clone()));
    t.put_inode(&inode)?;
    inherited.store(t, ino)?;
    t.put_dirent(r.parent, &r.name, ino, FileKind::File)?;
    touch_loaded_dir(t, parent, 0, now)?;
    Ok(inode.attr())
}

fn mkdir(t: &mut dyn MetaTxn, cred: &Cred, r: &MkdirReq, now: i64) -> Result<Attr, WireError> {
    t.serialize_dirs(&[r.parent]);
    check_name(&r.name)?;
    t.prefetch_create(r.parent, &r.name, DEFAULT_XATTR)?;
    let parent = load_searchable_dir(t, cred, r.parent)?;
    if t.get_dirent(r.parent, &r.name)?.is_some() {
        return Err(werr(ErrorCode::Exists, format!("{:?} exists in directory {}", r.name, r.parent)));
    }
    perm::may_create(cred, &parent, acl_for(t, cred, &parent)?.as_ref())?;
    let ino = t.next_ino()?;
    let (mode, umask) = weft_proto::split_mode_umask(r.mode);
    let (mode, uid, gid) = perm::new_owner(cred, &parent, FileKind::Dir, mode);
    let inherited = xattr::inherit(t, &parent, FileKind::Dir, mode, umask)?;
    let mut inode = new_inode(ino, FileKind::Dir, inherited.mode, uid, gid, now);
    inode.nlink = 2;
    inode.parent = r.parent;
    inode.layout = Some(parent.layout.clone().unwrap_or_else(default_policy));
    inode.sole_name = Some((r.parent, r.name.clone()));
    t.put_inode(&inode)?;
    inherited.store(t, ino)?;
    t.put_dirent(r.parent, &r.name, ino, FileKind::Dir)?;
    touch_loaded_dir(t, parent, 1, now)?;
    Ok(inode.attr())
}

fn rmdir(t: &mut dyn MetaTxn, cred: &Cred, parent: u64, name: &str, now: i64) -> Result<(), WireError> {
    t.serialize_dirs(&[parent]);
    check_name(name)?;
    t.prefetch_entry(parent, name)?;
    let parent_dir = load_searchable_dir(t, cred, parent)?;
    let (ino, _) = entry(t, parent, name)?;
    let dir = load_entry(t, parent, name, ino)?;
    perm::may_delete(cred, &parent_dir, acl_for(t, cred, &parent_dir)?.as_ref(), &dir)?;
    if dir.kind != FileKind::Dir {
        return Err(werr(ErrorCode::NotDir, format!("{name:?} in directory {parent} is not a directory")));
    }
    if !t.dir_is_empty(ino)? {
        return Err(werr(ErrorCode::NotEmpty, format!("directory {name:?} is not empty")));
    }
    weft_rpc::invariant!(
        dir.nlink == 2 && (dir.parent == parent || dir.parent == 0),
        "empty directory {ino}: {} links",
        dir.nlink
    );
    t.del_dirent(parent, name)?;
    free_inode(t, ino)?;
    touch_loaded_dir(t, parent_dir, -1, now)
}

fn unlink(t: &mut dyn MetaTxn, cred: &Cred, parent: u64, name: &str, now: i64) -> Result<(), WireError> {
    t.serialize_dirs(&[parent]);
    check_name(name)?;
    t.prefetch_entry(parent, name)?;
    let dir = load_searchable_dir(t, cred, parent)?;
    let (ino, _) = entry(t, parent, name)?;
    let mut inode = load_entry(t, parent, name, ino)?;
    perm::may_delete(cred, &dir, acl_for(t, cred, &dir)?.as_ref(), &inode)?;
    if inode.kind == FileKind::Dir {
        return Err(werr(ErrorCode::IsDir, format!("{name:?} in directory {parent} is a directory")));
    }
    if inode.is_sole_name(parent, name) {
        inode.sole_name = None;
    }
    t.del_dirent(parent, name)?;
    drop_link(t, inode, now)?;
    touch_loaded_dir(t, dir, 0, now)
}

fn link(t: &mut dyn MetaTxn, cred: &Cred, r: &LinkReq, now: i64) -> Result<Attr, WireError> {
    t.serialize_dirs(&[r.new_parent]);
    let mut inode = load(t, r.ino)?;
    if inode.kind == FileKind::Dir {
        return Err(werr(ErrorCode::Permission, format!("inode {} is a directory: no hard links to it", r.ino)));
    }
    check_name(&r.new_name)?;
    let dir = load_searchable_dir(t, cred, r.new_parent)?;
    if t.get_dirent(r.new_parent, &r.new_name)?.is_some() {
        return Err(werr(ErrorCode::Exists, format!("{:?} exists in directory {}", r.new_name, r.new_parent)));
    }
    perm::may_create(cred, &dir, acl_for(t, cred, &dir)?.as_ref())?;
    perm::may_link(cred, &inode, acl_for(t, cred, &inode)?.as_ref())?;
    inode.nlink = inode
        .nlink
        .checked_add(1)
        .ok_or_else(|| werr(ErrorCode::Invalid, format!("inode {} has too many links", r.ino)))?;
    inode.ctime_ns = now;
    // Two names now: the MDS no longer knows every name to refresh, so no entry carries the attributes. The
    // newest name's directory is the one a reach check walks up from (see `primary_dir`).
    inode.sole_name = None;
    inode.parent = r.new_parent;
    t.put_inode(&inode)?;
    t.put_dirent(r.new_parent, &r.new_name, inode.ino, inode.kind)?;
    touch_dir(t, r.new_parent, 0, now)?;
    Ok(inode.attr())
}

/// A FIFO, socket or device node: an inode and an entry, nothing on the data servers.
fn mknod(t: &mut dyn MetaTxn, cred: &Cred, r: &MknodReq, now: i64) -> Result<Attr, WireError> {
    t.serialize_dirs(&[r.parent]);
    check_name(&r.name)?;
    if !r.kind.is_special() {
        return Err(werr(ErrorCode::Invalid, format!("mknod makes special files only, not a {:?}", r.kind)));
    }
    let parent = load_searchable_dir(t, cred, r.parent)?;
    if t.get_dirent(r.parent, &r.name)?.is_some() {
        return Err(werr(ErrorCode::Exists, format!("{:?} exists in directory {}", r.name, r.parent)));
    }
    perm::may_create(cred, &parent, acl_for(t, cred, &parent)?.as_ref())?;
    perm::may_mknod(cred, r.kind)?;
    let ino = t.next_ino()?;
    let (mode, umask) = weft_proto::split_mode_umask(r.mode);
    let (mode, uid, gid) = perm::new_owner(cred, &parent, r.kind, mode);
    let inherited = xattr::inherit(t, &parent, r.kind, mode, umask)?;
    let mut inode = new_inode(ino, r.kind, inherited.mode, uid, gid, now);
    if matches!(r.kind, FileKind::CharDev | FileKind::BlockDev) {
        inode.rdev = r.rdev;
    }
    inode.sole_name = Some((r.parent, r.name.clone()));
    t.put_inode(&inode)?;
    inherited.store(t, ino)?;
    t.put_dirent(r.parent, &r.name, ino, r.kind)?;
    touch_dir(t, r.parent, 0, now)?;
    Ok(inode.attr())
}

fn symlink(t: &mut dyn MetaTxn, cred: &Cred, r: &SymlinkReq, now: i64) -> Result<Attr, WireError> {
    t.serialize_dirs(&[r.parent]);
    check_name(&r.name)?;
    if r.target.is_empty() || r.target.contains('\0') {
        return Err(werr(ErrorCode::Invalid, format!("symlink target {:?} is empty or has a NUL", r.target)));
    }
    if r.target.len() > SYMLINK_BYTES_MAX {
        return Err(werr(
            ErrorCode::NameTooLong,
            format!("symlink target of {} bytes is longer than {SYMLINK_BYTES_MAX}", r.target.len()),
        ));
    }
    let parent = load_searchable_dir(t, cred, r.parent)?;
    if t.get_dirent(r.parent, &r.name)?.is_some() {
        return Err(werr(ErrorCode::Exists, format!("{:?} exists in directory {}", r.name, r.parent)));
    }
    perm::may_create(cred, &parent, acl_for(t, cred, &parent)?.as_ref())?;
    let ino = t.next_ino()?;
    let (_, uid, gid) = perm::new_owner(cred, &parent, FileKind::Symlink, 0o777);
    let mut inode = new_inode(ino, FileKind::Symlink, 0o777, uid, gid, now);
    inode.size = r.target.len() as u64;
    inode.target = r.target.clone();
    inode.sole_name = Some((r.parent, r.name.clone()));
    t.put_inode(&inode)?;
    t.put_dirent(r.parent, &r.name, ino, FileKind::Symlink)?;
    touch_dir(t, r.parent, 0, now)?;
    Ok(inode.attr())
}

fn readlink(t: &mut dyn MetaTxn, ino: u64) -> Result<String, WireError> {
    let i = load(t, ino)?;
    if i.kind != FileKind::Symlink {
        return Err(werr(ErrorCode::NotSymlink, format!("inode {ino} is not a symlink")));
    }
    Ok(i.target)
}

/// Listing names needs read permission on the directory (as `opendir`).
fn readdir(t: &mut dyn MetaTxn, cred: &Cred, r: &ReaddirReq) -> Result<ReaddirResp, WireError> {
    let dir = load_dir(t, r.ino)?;
    may(t, cred, &dir, Mask::READ)?;
    let limit = if r.limit == 0 || r.limit > READDIR_ENTRIES_MAX { READDIR_ENTRIES_MAX } else { r.limit } as usize;
    let mut got = t.list_dirents(r.ino, &r.after, limit + 1)?;
    let eof = got.len() <= limit;
    got.truncate(limit);
    let entries = got.into_iter().map(|(name, ino, kind)| DirEntry { name, ino, kind }).collect();
    Ok(ReaddirResp { entries, eof })
}

/// One page of entries with their attributes, read in one snapshot, so an entry and its attributes agree.
/// Needs read permission (the names) and search permission (the attributes, which Linux gives only through a
/// lookup; knfsd's READDIRPLUS omits them without it): one reply carries both, so both are required.
fn readdir_plus(t: &mut dyn MetaTxn, cred: &Cred, r: &ReaddirReq) -> Result<ReaddirPlusResp, WireError> {
    let dir = load_dir(t, r.ino)?;
    may(t, cred, &dir, Mask::READ | Mask::EXEC)?;
    let limit =
        if r.limit == 0 || r.limit > READDIRPLUS_ENTRIES_MAX { READDIRPLUS_ENTRIES_MAX } else { r.limit } as usize;
    let mut got = t.list_dirents(r.ino, &r.after, limit + 1)?;
    let eof = got.len() <= limit;
    got.truncate(limit);
    let mut entries = Vec::with_capacity(got.len());
    for (name, ino, _) in got {
        // Same snapshot as the entry: a dangling entry is a corrupt store, not a race.
        let attr = load_entry(t, r.ino, &name, ino)?.attr();
        entries.push((name, attr));
    }
    Ok(ReaddirPlusResp { entries, eof })
}

fn set_layout(t: &mut dyn MetaTxn, cred: &Cred, r: &SetLayoutReq, now: i64) -> Result<Attr, WireError> {
    let mut i = load(t, r.ino)?;
    if i.kind != FileKind::Dir {
        return Err(werr(
            ErrorCode::NotDir,
            format!("inode {} is not a directory: a file's layout is fixed at create", r.ino),
        ));
    }
    perm::may_set_layout(cred, &i)?;
    r.layout.validate(true).map_err(|m| werr(ErrorCode::Invalid, format!("layout policy: {m}")))?;
    if !r.layout.servers.is_empty() {
        return Err(werr(ErrorCode::Invalid, "a directory layout policy names no servers"));
    }
    if let Some(w) = r.layout.redundancy.width() {
        let n = t.list_servers()?.len();
        if w as usize > n {
            return Err(werr(
                ErrorCode::Invalid,
                format!("a {} layout needs {w} distinct data servers; {n} are registered", r.layout.redundancy),
            ));
        }
    }
    i.layout = Some(r.layout.clone());
    i.ctime_ns = now;
    t.put_inode(&i)?;
    Ok(i.attr())
}

/// Returns the (mtime, size) found before the commit and the attributes after it. A commit follows writes, so a
/// non-root committer clears the set-ID bits a write clears ([`perm::mode_after_write`]), and any committer
/// removes the file's capabilities ([`xattr::kill_priv`]).
fn commit(t: &mut dyn MetaTxn, cred: &Cred, r: &CommitReq, now: i64) -> Result<((i64, u64), Attr), WireError> {
    let mut i = load(t, r.ino)?;
    let pre = (i.mtime_ns, i.size);
    match i.kind {
        FileKind::File => {}
        FileKind::Dir => {
            return Err(werr(ErrorCode::IsDir, format!("inode {} is a directory", r.ino)));
        }
        k => {
            return Err(werr(ErrorCode::Invalid, format!("inode {} is a {k:?}, not a regular file", r.ino)));
        }
    }
    perm::may_commit(cred, &i, acl_for(t, cred, &i)?.as_ref())?;
    let mode = perm::mode_after_write(cred, &i);
    let killed = xattr::kill_priv(t, i.ino)?;
    if mode != i.mode || killed {
        i.mode = mode;
        i.ctime_ns = i.ctime_ns.max(now);
    }
    i.size = i.size.max(r.size);
    i.mtime_ns = i.mtime_ns.max(r.mtime_ns);
    i.ctime_ns = i.ctime_ns.max(i.mtime_ns);
    // The writer's bytes are now what an open sees: a version no reader that opened before holds.
    i.bump_data_version();
    t.put_inode(&i)?;
    Ok((pre, i.attr()))
}

/// Refuses to place directory `dir` (called `name`) under `new_parent` if that is `dir` or one of its descendants.
fn check_not_into_itself(t: &mut dyn MetaTxn, dir: u64, name: &str, new_parent: u64) -> Result<(), WireError> {
    let mut cur = new_parent;
    let mut depth = 0usize;
    loop {
        if cur == dir {
            return Err(werr(
                ErrorCode::Invalid,
                format!("cannot move directory {name:?} into itself or a descendant"),
            ));
        }
        if cur == ROOT_INO {
            return Ok(());
        }
        let d = load(t, cur)?;
        if d.kind != FileKind::Dir || d.parent == cur || depth > DIR_DEPTH_MAX {
            return Err(MetaError::Corrupt(format!("broken parent chain at directory {cur}")).into());
        }
        cur = d.parent;
        depth += 1;
    }
}

/// RENAME_EXCHANGE: both names exist and swap inodes in one transaction; directories change parents (and their
/// parents' link counts) as they move.
fn rename_exchange(
    t: &mut dyn MetaTxn,
    cred: &Cred,
    (src_dir, dst_dir): (&Inode, &Inode),
    r: &RenameReq,
    now: i64,
) -> Result<(), WireError> {
    let (a_ino, _) = entry(t, r.src_parent, &r.src_name)?;
    let (b_ino, _) = entry(t, r.dst_parent, &r.dst_name)?;
    if a_ino == b_ino {
        return Ok(());
    }
    let mut a = load_entry(t, r.src_parent, &r.src_name, a_ino)?;
    let mut b = load_entry(t, r.dst_parent, &r.dst_name, b_ino)?;
    let (a_dir, b_dir) = (a.kind == FileKind::Dir, b.kind == FileKind::Dir);
    perm::may_delete(cred, src_dir, acl_for(t, cred, src_dir)?.as_ref(), &a)?;
    perm::may_delete(cred, dst_dir, acl_for(t, cred, dst_dir)?.as_ref(), &b)?;
    if r.src_parent != r.dst_parent {
        // A directory changing parents has its `..` rewritten: that needs write permission on it.
        for moved in [&a, &b] {
            if moved.kind == FileKind::Dir {
                may(t, cred, moved, Mask::WRITE)?;
            }
        }
    }
    if a_dir {
        check_not_into_itself(t, a_ino, &r.src_name, r.dst_parent)?;
    }
    if b_dir {
        check_not_into_itself(t, b_ino, &r.dst_name, r.src_parent)?;
    }
    t.put_dirent(r.src_parent, &r.src_name, b_ino, b.kind)?;
    t.put_dirent(r.dst_parent, &r.dst_name, a_ino, a.kind)?;
    if r.src_parent == r.dst_parent {
        touch_dir(t, r.src_parent, 0, now)?;
    } else {
        // The source directory loses `a` and gains `b`; the destination the other way round.
        let delta = i32::from(b_dir) - i32::from(a_dir);
        touch_dir(t, r.src_parent, delta, now)?;
        touch_dir(t, r.dst_parent, -delta, now)?;
        if a_dir {
            a.parent = r.dst_parent;
        }
        if b_dir {
            b.parent = r.src_parent;
        }
    }
    a.ctime_ns = now;
    b.ctime_ns = now;
    move_sole_name(&mut a, (r.src_parent, &r.src_name), (r.dst_parent, &r.dst_name));
    move_sole_name(&mut b, (r.dst_parent, &r.dst_name), (r.src_parent, &r.src_name));
    t.put_inode(&a)?;
    t.put_inode(&b)?;
    Ok(())
}

/// An inode renamed from `from` to `to`: its sole name follows (a directory's always: it has no other). A
/// hard-linked inode whose recorded directory was `from`'s takes `to`'s, which certainly holds a name of it.
fn move_sole_name(inode: &mut Inode, from: (u64, &str), to: (u64, &str)) {
    if inode.kind == FileKind::Dir || inode.is_sole_name(from.0, from.1) {
        inode.sole_name = Some((to.0, to.1.to_string()));
    } else if inode.sole_name.is_none() && inode.parent == from.0 {
        inode.parent = to.0;
    }
}

/// Permissions, as Linux's `vfs_rename`: search on both directories; the source's entry may be deleted from its
/// directory (write, search, sticky); the destination's entry may be created, or, if it exists, deleted; a
/// directory moving to another parent needs write permission on itself (its `..` changes).
fn rename(t: &mut dyn MetaTxn, cred: &Cred, r: &RenameReq, now: i64) -> Result<(), WireError> {
    t.serialize_dirs(&[r.src_parent, r.dst_parent]);
    if r.flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 || r.flags == RENAME_NOREPLACE | RENAME_EXCHANGE {
        return Err(werr(ErrorCode::Invalid, format!("unknown or conflicting rename flags {:#x}", r.flags)));
    }
    check_name(&r.src_name)?;
    check_name(&r.dst_name)?;
    let src_dir = load_searchable_dir(t, cred, r.src_parent)?;
    let dst_dir = load_searchable_dir(t, cred, r.dst_parent)?;
    if r.flags & RENAME_EXCHANGE != 0 {
        return rename_exchange(t, cred, (&src_dir, &dst_dir), r, now);
    }
    let (src_ino, _) = entry(t, r.src_parent, &r.src_name)?;
    let dst = t.get_dirent(r.dst_parent, &r.dst_name)?;
    if let Some((dst_ino, _)) = dst {
        if r.flags & RENAME_NOREPLACE != 0 {
            return Err(werr(ErrorCode::Exists, format!("{:?} exists in directory {}", r.dst_name, r.dst_parent)));
        }
        if dst_ino == src_ino {
            // Both names are links to one inode: POSIX says do nothing.
            return Ok(());
        }
    }
    let mut src = load_entry(t, r.src_parent, &r.src_name, src_ino)?;
    let src_is_dir = src.kind == FileKind::Dir;
    perm::may_delete(cred, &src_dir, acl_for(t, cred, &src_dir)?.as_ref(), &src)?;
    let victim = match dst {
        Some((dst_ino, _)) => {
            let victim = load_entry(t, r.dst_parent, &r.dst_name, dst_ino)?;
            perm::may_delete(cred, &dst_dir, acl_for(t, cred, &dst_dir)?.as_ref(), &victim)?;
            Some((dst_ino, victim))
        }
        None => {
            perm::may_create(cred, &dst_dir, acl_for(t, cred, &dst_dir)?.as_ref())?;
            None
        }
    };
    if src_is_dir && r.src_parent != r.dst_parent {
        // Its `..` changes.
        may(t, cred, &src, Mask::WRITE)?;
    }
    if src_is_dir {
        check_not_into_itself(t, src_ino, &r.src_name, r.dst_parent)?;
    }
    if let Some((dst_ino, victim)) = victim {
        match (src_is_dir, victim.kind == FileKind::Dir) {
            (true, true) => {
                if !t.dir_is_empty(dst_ino)? {
                    return Err(werr(ErrorCode::NotEmpty, format!("directory {:?} is not empty", r.dst_name)));
                }
                free_inode(t, dst_ino)?;
                touch_dir(t, r.dst_parent, -1, now)?;
            }
            (true, false) => {
                return Err(werr(ErrorCode::NotDir, format!("{:?} is not a directory", r.dst_name)));
            }
            (false, true) => {
                return Err(werr(ErrorCode::IsDir, format!("{:?} is a directory", r.dst_name)));
            }
            (false, false) => {
                let mut victim = victim;
                if victim.is_sole_name(r.dst_parent, &r.dst_name) {
                    victim.sole_name = None;
                }
                drop_link(t, victim, now)?
            }
        }
    }
    t.del_dirent(r.src_parent, &r.src_name)?;
    t.put_dirent(r.dst_parent, &r.dst_name, src_ino, src.kind)?;
    if src_is_dir && r.src_parent != r.dst_parent {
        src.parent = r.dst_parent;
        touch_dir(t, r.src_parent, -1, now)?;
        touch_dir(t, r.dst_parent, 1, now)?;
    } else {
        touch_dir(t, r.src_parent, 0, now)?;
        if r.dst_parent != r.src_parent {
            touch_dir(t, r.dst_parent, 0, now)?;
        }
    }
    src.ctime_ns = now;
    move_sole_name(&mut src, (r.src_parent, &r.src_name), (r.dst_parent, &r.dst_name));
    t.put_inode(&src)?;
    Ok(())
}

#[cfg(test)]
mod tests;
