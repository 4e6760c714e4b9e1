//! Plain data carried in request and response bodies: inodes, attributes, directory entries, cluster state.
//!
//! Enums here are encoded by postcard as their variant index: variants are only ever appended, never reordered.

use serde::{Deserialize, Serialize};

use crate::layout::Layout;

/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;
/// Longest name of one directory entry, in bytes (as Linux's NAME_MAX).
pub const NAME_BYTES_MAX: usize = 255;
/// Longest symlink target, in bytes (as Linux's PATH_MAX).
pub const SYMLINK_BYTES_MAX: usize = 4096;
/// Longest extended attribute name, prefix included, in bytes (Linux's XATTR_NAME_MAX).
pub const XATTR_NAME_BYTES_MAX: usize = 255;
/// Largest extended attribute value, in bytes (Linux's XATTR_SIZE_MAX).
pub const XATTR_VALUE_BYTES_MAX: usize = 64 << 10;
/// Largest list of an inode's attribute names (each name and its NUL), in bytes (Linux's XATTR_LIST_MAX).
pub const XATTR_LIST_BYTES_MAX: usize = 64 << 10;

/// In the `mode` of `Create`, `CreateOpen`, `Mkdir` and `Mknod`: this bit says bits 16..=24 carry the creator's
/// umask, not yet applied (docs/format.md §13). The MDS applies it unless the parent directory has a default
/// ACL, which then masks the mode instead (as Linux's `posix_acl_create`). Without the bit the mode is final.
pub const MODE_UMASK_FLAG: u32 = 1 << 31;
const MODE_UMASK_SHIFT: u32 = 16;

/// A create mode carrying the creator's umask for the MDS to apply (see [`MODE_UMASK_FLAG`]).
pub fn mode_with_umask(mode: u32, umask: u32) -> u32 {
    (mode & 0o7777) | MODE_UMASK_FLAG | ((umask & 0o777) << MODE_UMASK_SHIFT)
}

/// A create mode's permission bits and the umask it carries, if any.
pub fn split_mode_umask(mode: u32) -> (u32, Option<u32>) {
    let umask = (mode & MODE_UMASK_FLAG != 0).then_some((mode >> MODE_UMASK_SHIFT) & 0o777);
    (mode & 0o7777, umask)
}

/// The mode a regular file keeps after a write or truncate by a caller without `CAP_FSETID` (Linux's
/// `setattr_should_drop_suidgid`, which `file_remove_privs` applies at every write): set-user-ID always goes;
/// set-group-ID goes when group execute is set (without it the bit marks mandatory locking, not a privilege) or
/// when the writer is not in the file's group (`in_file_group`; Linux since 6.2). One rule for the MDS, which
/// applies it (`weft-meta`'s `perm::mode_after_write`), and for clients, which use it only to decide whether to
/// ask the MDS at all.
pub fn mode_after_unprivileged_write(mode: u32, in_file_group: bool) -> u32 {
    const SET_UID: u32 = 0o4000;
    const SET_GID: u32 = 0o2000;
    const GROUP_EXEC: u32 = 0o010;
    let mut mode = mode & !SET_UID;
    if mode & SET_GID != 0 && (mode & GROUP_EXEC != 0 || !in_file_group) {
        mode &= !SET_GID;
    }
    mode
}

/// Largest object a data server holds (16 TiB): offsets and lengths past it are refused before any I/O, so no
/// arithmetic on them can overflow. A file can be `stripe_count` times larger.
pub const OBJECT_BYTES_MAX: u64 = 1 << 44;
/// Most entries one readdir reply may carry.
pub const READDIR_ENTRIES_MAX: u32 = 4096;
/// Most entries in one readdirplus page: each carries a full [`Attr`] (layout included), so pages stay well under
/// the frame's body limit.
pub const READDIRPLUS_ENTRIES_MAX: u32 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// Special files: metadata only (no objects, no layout); their I/O never reaches Weft.
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FileKind {
    /// FIFOs, sockets and device nodes.
    pub fn is_special(self) -> bool {
        matches!(self, FileKind::Fifo | FileKind::Socket | FileKind::CharDev | FileKind::BlockDev)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileKind,
    /// Permission bits only (no file-type bits).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// Files: the layout fixed at create. Directories: the layout new children inherit, if one was set.
    pub layout: Option<Layout>,
    /// Device nodes: the device number (Linux `dev_t` encoding). 0 otherwise.
    pub rdev: u32,
    /// Regular files: the version of the file's bytes, advanced by the MDS at every open for writing, commit and
    /// size change (docs/format.md §8). Cache-bank block keys carry it, so bytes cached under an older version
    /// are never asked for after a newer open (close-to-open through the bank). 0 for other kinds.
    pub data_version: u64,
}

impl Attr {
    /// Inode `ino` of `kind` with permission bits `mode`: owned by root, empty, every time 0, no layout, one link
    /// (a directory two). A starting point where only some fields matter (struct update syntax for the rest).
    pub fn new(ino: u64, kind: FileKind, mode: u32) -> Attr {
        Attr {
            ino,
            kind,
            mode,
            uid: 0,
            gid: 0,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            size: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            layout: None,
            rdev: 0,
            data_version: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSet {
    Now,
    AtNs(i64),
}

/// The fields a setattr changes; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttrs {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub ino: u64,
    pub kind: FileKind,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatFs {
    pub bytes_total: u64,
    pub bytes_free: u64,
    pub files: u64,
    pub servers_up: u32,
    pub servers_total: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerState {
    Up,
    /// No heartbeat within the MDS's liveness window.
    Down,
    /// Silent for longer than the MDS's `rebuild_after_ms`: its slots in redundant layouts are being moved to
    /// spares (docs/format.md §19).
    Failed,
    /// Failed, and every redundant layout that named it now names a spare instead.
    Replaced,
    /// Came back after it was replaced: the MDS is deleting its objects of files whose layouts no longer name it.
    Draining,
    /// Up, drained after a replacement: serves new layouts and spares; holds no slot it held before.
    Spare,
}

impl ServerState {
    /// Whether the server answers and may be given new layouts and spare slots.
    pub fn is_up(self) -> bool {
        matches!(self, ServerState::Up | ServerState::Spare)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    pub id: u32,
    pub addr: String,
    pub state: ServerState,
    pub bytes_total: u64,
    pub bytes_free: u64,
    pub heartbeat_age_ms: u64,
}

/// Membership and rebuild progress (op 135, docs/format.md §19).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// Files whose redundant layout still names a failed server, found by the current scan and not yet moved
    /// (no spare, or not reached yet).
    pub layouts_pending: u64,
    /// Layout changes (slots moved to spares) since the MDS started.
    pub layouts_changed: u64,
    /// Bytes the healer still has to rebuild; `None` when unknown.
    pub rebuild_bytes_left: Option<u64>,
    /// The healer's recent rebuild rate in bytes per second; `None` when unknown.
    pub rebuild_bytes_per_s: Option<u64>,
    /// Estimated milliseconds until the rebuild completes; `None` when unknown.
    pub rebuild_eta_ms: Option<u64>,
}

/// Space a data server reports for its root directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceStat {
    pub bytes_total: u64,
    pub bytes_free: u64,
    pub objects: u64,
}
