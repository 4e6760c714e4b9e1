//! Who may do what to an inode: the POSIX permission rules as pure functions over an [`Inode`] and a [`Cred`].
//!
//! Why a module of its own, with no I/O: the rules are subtle (root's exceptions, the sticky bit, which bits a
//! chown or a write clears) and are worth testing one by one, apart from the transactions that apply them. The
//! namespace calls them inside each op's transaction, on the records it already loaded, so a check and the change
//! it allows see the same snapshot.
//!
//! The rules follow Linux (`fs/namei.c` `generic_permission`, `may_delete`, `may_create`, `may_linkat`;
//! `fs/attr.c` `setattr_prepare`, `setattr_should_drop_suidgid`; `fs/inode.c` `inode_init_owner`), which knfsd
//! applies too. "Root" is uid 0 and stands for the capabilities Linux gives it (`CAP_DAC_OVERRIDE`,
//! `CAP_FOWNER`, `CAP_CHOWN`, `CAP_FSETID`, `CAP_MKNOD`); a squashed root arrives here as an ordinary uid.
//!
//! Errors: a missing mode bit is `Access` (EACCES); an act reserved to the owner or to root is `NotPermitted`
//! (EPERM), as on Linux.

use std::ops::BitOr;

use weft_proto::{ErrorCode, FileKind, SetAttrs, TimeSet, WireError};

use crate::acl::Acl;
use crate::store::Inode;

/// The user id with every privilege.
pub const ROOT_UID: u32 = 0;
/// Set-user-ID on execution.
pub const SET_UID: u32 = 0o4000;
/// Set-group-ID on execution; on a directory, new entries take the directory's group.
pub const SET_GID: u32 = 0o2000;
/// Sticky: in a directory, only an entry's owner, the directory's owner or root may remove or rename the entry.
pub const STICKY: u32 = 0o1000;
/// Execute (search) permission for the group.
const GROUP_EXEC: u32 = 0o010;
/// Any execute bit (owner, group, other).
const ANY_EXEC: u32 = 0o111;

/// The identity an operation runs as: the file system uid, gid and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary `gid` need not be repeated).
    pub groups: Vec<u32>,
}

impl Cred {
    pub fn new(uid: u32, gid: u32, groups: Vec<u32>) -> Cred {
        Cred { uid, gid, groups }
    }

    /// Root: what every caller is until sessions carry an authenticated identity.
    pub fn root() -> Cred {
        Cred { uid: ROOT_UID, gid: 0, groups: Vec::new() }
    }

    pub fn is_root(&self) -> bool {
        self.uid == ROOT_UID
    }

    /// Whether `gid` is this credential's primary group or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    pub(crate) fn owns(&self, inode: &Inode) -> bool {
        self.uid == inode.uid
    }

    /// Owner or root: Linux's `inode_owner_or_capable`.
    fn owns_or_root(&self, inode: &Inode) -> bool {
        self.is_root() || self.owns(inode)
    }
}

/// The access asked for: a combination of [`Mask::READ`], [`Mask::WRITE`] and [`Mask::EXEC`] (the values of
/// `R_OK`, `W_OK` and `X_OK`). On a directory, `EXEC` is search permission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mask(u32);

impl Mask {
    pub const NONE: Mask = Mask(0);
    pub const READ: Mask = Mask(4);
    pub const WRITE: Mask = Mask(2);
    pub const EXEC: Mask = Mask(1);

    /// The mask from `R_OK | W_OK | X_OK` bits; other bits are ignored.
    pub fn from_bits(bits: u32) -> Mask {
        Mask(bits & 7)
    }

    pub fn bits(self) -> u32 {
        self.0
    }

    fn has(self, other: Mask) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }
}

impl BitOr for Mask {
    type Output = Mask;

    fn bitor(self, rhs: Mask) -> Mask {
        Mask(self.0 | rhs.0)
    }
}

/// A refused operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PermError {
    /// The mode bits do not grant the access (EACCES).
    #[error("permission denied: {0}")]
    Access(String),
    /// The act is reserved to the owner or to root (EPERM).
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
}

impl From<PermError> for WireError {
    fn from(e: PermError) -> Self {
        let code = match e {
            PermError::Access(_) => ErrorCode::Permission,
            PermError::NotPermitted(_) => ErrorCode::NotPermitted,
        };
        WireError::new(code, e.to_string())
    }
}

fn mask_name(mask: Mask) -> String {
    let mut s = String::new();
    for (m, c) in [(Mask::READ, 'r'), (Mask::WRITE, 'w'), (Mask::EXEC, 'x')] {
        if mask.has(m) {
            s.push(c);
        }
    }
    s
}

fn access_denied(cred: &Cred, inode: &Inode, mask: Mask) -> PermError {
    PermError::Access(format!(
        "uid {} has no {} permission on inode {} (mode {:o}, owner {}:{})",
        cred.uid,
        mask_name(mask),
        inode.ino,
        inode.mode,
        inode.uid,
        inode.gid
    ))
}

fn not_permitted(cred: &Cred, inode: &Inode, what: &str) -> PermError {
    PermError::NotPermitted(format!("uid {} may not {what} inode {} (owner {})", cred.uid, inode.ino, inode.uid))
}

/// Whether the mode bits alone grant `mask`: the owner class if `cred` owns the inode (and only it: an owner
/// denied by the owner bits is denied even if the group or other bits would allow), else the group class if
/// `cred` is in the inode's group, else the other class.
fn mode_allows(cred: &Cred, inode: &Inode, mask: Mask) -> bool {
    let bits = if cred.owns(inode) {
        inode.mode >> 6
    } else if cred.in_group(inode.gid) {
        inode.mode >> 3
    } else {
        inode.mode
    } & 7;
    mask.0 & !bits == 0
}

/// `generic_permission`: the mode bits or the inode's access ACL, then root's override. Root may read and write
/// anything, and search any directory; it may execute a non-directory only if at least one execute bit is set.
///
/// `acl` is the inode's access ACL, if it has one (`crate::acl::ACCESS_XATTR`). As Linux's
/// `acl_permission_check`: the owner is judged by the owner bits (USER_OBJ mirrors them); anyone else by the ACL
/// when the mode's group bits (the ACL's mask) are not all clear; else by the group or other bits.
pub fn may(cred: &Cred, inode: &Inode, acl: Option<&Acl>, mask: Mask) -> Result<(), PermError> {
    let allowed = match acl {
        Some(acl) if !cred.owns(inode) && inode.mode & 0o070 != 0 => {
            acl.permits(cred.uid, &|g| cred.in_group(g), (inode.uid, inode.gid), mask.0)
        }
        _ => mode_allows(cred, inode, mask),
    };
    if allowed {
        return Ok(());
    }
    if cred.is_root() && (!mask.has(Mask::EXEC) || inode.kind == FileKind::Dir || inode.mode & ANY_EXEC != 0) {
        return Ok(());
    }
    Err(access_denied(cred, inode, mask))
}

/// Adding an entry to `dir` (create, mkdir, mknod, symlink, link, rename's destination): write and search.
pub fn may_create(cred: &Cred, dir: &Inode, dir_acl: Option<&Acl>) -> Result<(), PermError> {
    may(cred, dir, dir_acl, Mask::WRITE | Mask::EXEC)
}

/// The sticky-directory rule: in a sticky `dir`, only the owner of `victim`, the owner of `dir` or root may
/// remove or rename `victim`'s entry.
pub fn check_sticky(cred: &Cred, dir: &Inode, victim: &Inode) -> Result<(), PermError> {
    if dir.mode & STICKY == 0 || cred.owns_or_root(victim) || cred.owns(dir) {
        return Ok(());
    }
    Err(PermError::NotPermitted(format!(
        "uid {} may not remove inode {} (owner {}) from sticky directory {} (owner {})",
        cred.uid, victim.ino, victim.uid, dir.ino, dir.uid
    )))
}

/// Removing `victim`'s entry from `dir` (unlink, rmdir, rename's source and replaced target): write and search on
/// `dir`, then the sticky rule.
pub fn may_delete(cred: &Cred, dir: &Inode, dir_acl: Option<&Acl>, victim: &Inode) -> Result<(), PermError> {
    may(cred, dir, dir_acl, Mask::WRITE | Mask::EXEC)?;
    check_sticky(cred, dir, victim)
}

/// Only root makes character and block device nodes; anyone may make FIFOs and sockets (given [`may_create`]).
pub fn may_mknod(cred: &Cred, kind: FileKind) -> Result<(), PermError> {
    if matches!(kind, FileKind::CharDev | FileKind::BlockDev) && !cred.is_root() {
        return Err(PermError::NotPermitted(format!("uid {} may not make a {kind:?} node: root only", cred.uid)));
    }
    Ok(())
}

/// A new hard link to `source` (Linux's `fs.protected_hardlinks = 1`, the default of most distributions): the
/// owner and root may link anything; others only a regular file that is not set-user-ID, not executable
/// set-group-ID, and that they may both read and write. This stops a user pinning someone else's file (e.g. a
/// set-user-ID binary about to be replaced) in a directory of their own.
pub fn may_link(cred: &Cred, source: &Inode, acl: Option<&Acl>) -> Result<(), PermError> {
    if cred.owns_or_root(source) {
        return Ok(());
    }
    let safe = source.kind == FileKind::File
        && source.mode & SET_UID == 0
        && source.mode & (SET_GID | GROUP_EXEC) != SET_GID | GROUP_EXEC
        && may(cred, source, acl, Mask::READ | Mask::WRITE).is_ok();
    if safe { Ok(()) } else { Err(not_permitted(cred, source, "hard-link (protected_hardlinks)")) }
}

/// Changing a directory's layout policy: the owner or root (no Linux counterpart; it plays the part of a
/// file system attribute only the owner sets).
pub fn may_set_layout(cred: &Cred, inode: &Inode) -> Result<(), PermError> {
    if cred.owns_or_root(inode) { Ok(()) } else { Err(not_permitted(cred, inode, "change the layout policy of")) }
}

/// Publishing a write's size and mtime (Commit). Linux checks write permission when a file is opened, not when
/// it is closed; the MDS sees only the commit, after the writes. It requires write permission, or ownership, so
/// an owner who opened the file for writing and then made it read-only (as `cp -p` or an installer does) can
/// still commit; a non-owner whose write permission was taken away after the open cannot.
pub fn may_commit(cred: &Cred, inode: &Inode, acl: Option<&Acl>) -> Result<(), PermError> {
    if cred.owns_or_root(inode) {
        return Ok(());
    }
    may(cred, inode, acl, Mask::WRITE)
}

/// The mode a regular file keeps after a non-root caller writes to it, truncates it or changes its owner
/// (`setattr_should_drop_suidgid`, [`weft_proto::mode_after_unprivileged_write`]): set-user-ID goes; set-group-ID
/// goes if group execute is set (without it, the bit marks mandatory locking, not a privilege) or if the caller is
/// not in the file's group. Root (`CAP_FSETID`) keeps both. Directories and special files keep their bits.
///
/// `cred` is always the MDS's authenticated caller (`MetaService::caller_cred`), never a field of the request:
/// the MDS clears the bits itself when it commits a write (Commit, CommitWcc), a size change (SetAttr,
/// SetSizeOpen) or a change of owner, so every path (mount, native client, NFS gateway) is covered here; a FUSE
/// mount only asks earlier, at the write the kernel flags `FUSE_WRITE_KILL_SUIDGID` (docs/format.md §2).
pub fn mode_after_write(cred: &Cred, inode: &Inode) -> u32 {
    if cred.is_root() || inode.kind != FileKind::File {
        return inode.mode;
    }
    weft_proto::mode_after_unprivileged_write(inode.mode, cred.in_group(inode.gid))
}

/// Where the right to change a file's size comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeRight {
    /// A path truncate (`truncate(2)`, NFS SETATTR): write permission by the mode and ACL now.
    Mode,
    /// A truncate through a descriptor open for writing (`ftruncate(2)`, `open(O_TRUNC)`): the right was checked
    /// at the open, as Linux's `do_ftruncate` checks only the descriptor; the caller proved the open with its
    /// write capability, which the service verified.
    Open,
    /// A size change an NFS server sends for its client (`NfsSetAttr`): write permission by the mode now, except
    /// for the file's owner, as knfsd's owner override (NFS clients send ftruncate as SETATTR).
    OwnerOverride,
}

/// The owner, group and mode of a new `kind` entry in `parent` (`inode_init_owner`): the caller's uid and primary
/// gid (requests carry no owner: a FUSE daemon or gateway acts as each user through that user's credential). In a
/// set-group-ID directory the entry takes the directory's group and a new subdirectory keeps the bit; a new
/// executable set-group-ID file there loses the bit if its creator is not in that group (`mode_strip_sgid`).
/// Returns `(mode, uid, gid)`.
pub fn new_owner(cred: &Cred, parent: &Inode, kind: FileKind, mode: u32) -> (u32, u32, u32) {
    let (uid, mut gid) = (cred.uid, cred.gid);
    let mut mode = mode;
    if parent.mode & SET_GID != 0 {
        gid = parent.gid;
        if kind == FileKind::Dir {
            mode |= SET_GID;
        } else if mode & (SET_GID | GROUP_EXEC) == SET_GID | GROUP_EXEC && !cred.is_root() && !cred.in_group(gid) {
            mode &= !SET_GID;
        }
    }
    (mode, uid, gid)
}

/// Both times set to "now" (`utimes(path, NULL)`, `touch`): the one time change that write permission allows.
fn is_touch(set: &SetAttrs) -> bool {
    set.atime == Some(TimeSet::Now) && set.mtime == Some(TimeSet::Now)
}

/// Checks a setattr (`setattr_prepare`, plus `vfs_truncate`'s write check) and returns the mode to store:
/// `Some(mode)` when the mode changes (an explicit chmod, adjusted; or bits a chown or truncate clears), `None`
/// when it stays. Rules, in Linux's order:
/// - size: write permission (EACCES), as `truncate(2)`;
/// - uid: root only, except the owner "changing" it to itself (EPERM);
/// - gid: root, or the owner changing it to the file's own group or to one of theirs (EPERM);
/// - mode: owner or root (EPERM); a non-root caller not in the file's (new) group loses set-group-ID;
/// - times: explicit values (or only one time set) need owner or root (EPERM); both "now" need owner, root or
///   write permission (EACCES);
/// - a non-root chown, chgrp or truncate of a regular file clears bits as [`mode_after_write`], unless the same
///   request sets the mode explicitly (then that mode, checked as above, is what the caller asked for).
///
/// Root's requests pass unchanged (in particular root's chown keeps set-user-ID, unlike Linux, which clears it
/// for everyone: the kernel's FUSE client sends that mode change itself).
pub fn check_setattr(cred: &Cred, inode: &Inode, acl: Option<&Acl>, set: &SetAttrs) -> Result<Option<u32>, PermError> {
    check_setattr_by(cred, inode, acl, set, SizeRight::Mode)
}

/// [`check_setattr`], with the right to change the size taken from `right`: with [`SizeRight::Open`] no write
/// permission is asked (the open had it), but the set-ID bits go all the same.
pub fn check_setattr_by(
    cred: &Cred,
    inode: &Inode,
    acl: Option<&Acl>,
    set: &SetAttrs,
    right: SizeRight,
) -> Result<Option<u32>, PermError> {
    if cred.is_root() {
        return Ok(set.mode);
    }
    let asks_write = match right {
        SizeRight::Mode => true,
        SizeRight::Open => false,
        SizeRight::OwnerOverride => !cred.owns(inode),
    };
    if set.size.is_some() && asks_write {
        may(cred, inode, acl, Mask::WRITE)?;
    }
    if let Some(uid) = set.uid
        && !(cred.owns(inode) && uid == inode.uid)
    {
        return Err(not_permitted(cred, inode, &format!("give uid {uid}")));
    }
    if let Some(gid) = set.gid
        && !(cred.owns(inode) && (gid == inode.gid || cred.in_group(gid)))
    {
        return Err(not_permitted(cred, inode, &format!("give gid {gid}")));
    }
    let mut mode = None;
    if let Some(m) = set.mode {
        if !cred.owns(inode) {
            return Err(not_permitted(cred, inode, "chmod"));
        }
        let group = set.gid.unwrap_or(inode.gid);
        mode = Some(if cred.in_group(group) { m } else { m & !SET_GID });
    }
    if set.atime.is_some() || set.mtime.is_some() {
        if is_touch(set) {
            if !cred.owns(inode) {
                may(cred, inode, acl, Mask::WRITE)?;
            }
        } else if !cred.owns(inode) {
            return Err(not_permitted(cred, inode, "set explicit times on"));
        }
    }
    let kills = set.uid.is_some() || set.gid.is_some() || set.size.is_some();
    if mode.is_none() && kills {
        let after = mode_after_write(cred, inode);
        if after != inode.mode {
            mode = Some(after);
        }
    }
    Ok(mode)
}

/// Who may read or change extended attribute `name` of `inode` (Linux's `xattr_permission` with the rules of
/// its file systems): `user.*` only on regular files and directories (`NotPermitted` on a write, "no such
/// attribute" on a read elsewhere), read needs read permission, write needs write permission, and a sticky
/// directory's only from its owner or root; `trusted.*` is root's alone (CAP_SYS_ADMIN; others read "no such
/// attribute"); `security.*` anyone reads, the owner or root writes (what SELinux-less Linux leaves to the file
/// system; no security module runs here); `system.posix_acl_*` anyone reads, the owner or root writes
/// (`posix_acl_xattr_set`). Returns `Ok(false)` when the attribute must look absent to this caller.
pub fn may_xattr(cred: &Cred, inode: &Inode, acl: Option<&Acl>, name: &str, write: bool) -> Result<bool, PermError> {
    if name.starts_with("user.") {
        if !matches!(inode.kind, FileKind::File | FileKind::Dir) {
            return if write {
                Err(not_permitted(cred, inode, "set user.* attributes on a special file or symlink"))
            } else {
                Ok(false)
            };
        }
        if write && inode.kind == FileKind::Dir && inode.mode & STICKY != 0 && !cred.owns_or_root(inode) {
            return Err(not_permitted(cred, inode, "set user.* attributes of a sticky directory"));
        }
        may(cred, inode, acl, if write { Mask::WRITE } else { Mask::READ })?;
        return Ok(true);
    }
    if name.starts_with("trusted.") {
        return match (cred.is_root(), write) {
            (true, _) => Ok(true),
            (false, true) => Err(not_permitted(cred, inode, "set trusted.* attributes (root only) on")),
            (false, false) => Ok(false),
        };
    }
    if write && !cred.owns_or_root(inode) {
        return Err(not_permitted(cred, inode, &format!("set {name} on")));
    }
    Ok(true)
}

/// Whether `cred` keeps the set-group-ID bit of `inode` when it sets its access ACL (`posix_acl_update_mode`):
/// root, or a member of the file's group.
pub fn keeps_sgid(cred: &Cred, inode: &Inode) -> bool {
    cred.is_root() || cred.in_group(inode.gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: u32 = 1000;
    const BOB: u32 = 1001;
    const STAFF: u32 = 50;
    const USERS: u32 = 100;
    const WHEEL: u32 = 10;

    fn alice() -> Cred {
        Cred::new(ALICE, USERS, vec![STAFF])
    }

    fn bob() -> Cred {
        Cred::new(BOB, USERS, vec![])
    }

    fn node(kind: FileKind, mode: u32, uid: u32, gid: u32) -> Inode {
        Inode {
            ino: 42,
            kind,
            mode,
            uid,
            gid,
            nlink: 1,
            size: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            parent: 0,
            layout: None,
            target: String::new(),
            rdev: 0,
            data_version: 1,
            sole_name: None,
        }
    }

    fn file(mode: u32, uid: u32, gid: u32) -> Inode {
        node(FileKind::File, mode, uid, gid)
    }

    fn dir(mode: u32, uid: u32, gid: u32) -> Inode {
        node(FileKind::Dir, mode, uid, gid)
    }

    fn is_access<T: std::fmt::Debug>(r: Result<T, PermError>) -> bool {
        matches!(r, Err(PermError::Access(_)))
    }

    fn is_eperm<T: std::fmt::Debug>(r: Result<T, PermError>) -> bool {
        matches!(r, Err(PermError::NotPermitted(_)))
    }

    const MASKS: [Mask; 3] = [Mask::READ, Mask::WRITE, Mask::EXEC];

    #[test]
    fn each_class_grants_exactly_its_own_bits() {
        // For each single bit of each class: the caller of that class gets exactly that access, the others none.
        let owner = Cred::new(ALICE, 1, vec![]);
        let member = Cred::new(BOB, 2, vec![STAFF]);
        let other = Cred::new(2000, 3, vec![]);
        for (shift, who) in [(6, &owner), (3, &member), (0, &other)] {
            for bit in MASKS {
                let f = file(bit.bits() << shift, ALICE, STAFF);
                for cred in [&owner, &member, &other] {
                    for ask in MASKS {
                        let want = std::ptr::eq(cred, who) && ask == bit;
                        assert_eq!(
                            may(cred, &f, None, ask).is_ok(),
                            want,
                            "mode {:o} uid {} ask {ask:?}",
                            f.mode,
                            cred.uid
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn combined_masks_need_every_bit() {
        let f = file(0o600, ALICE, STAFF);
        assert!(may(&alice(), &f, None, Mask::READ | Mask::WRITE).is_ok());
        assert!(is_access(may(&alice(), &f, None, Mask::READ | Mask::EXEC)));
        assert!(may(&alice(), &f, None, Mask::NONE).is_ok());
        assert!(may(&bob(), &f, None, Mask::NONE).is_ok(), "an empty mask asks for nothing");
        assert_eq!(Mask::from_bits(0o17), Mask::READ | Mask::WRITE | Mask::EXEC);
    }

    #[test]
    fn the_owner_class_is_exclusive() {
        // The owner is denied by the owner bits even if the group and other bits allow; likewise a group member.
        let f = file(0o077, ALICE, STAFF);
        assert!(is_access(may(&alice(), &f, None, Mask::READ)));
        let g = file(0o707, ALICE, USERS);
        assert!(is_access(may(&bob(), &g, None, Mask::READ)));
        assert!(may(&Cred::new(2000, 3, vec![]), &g, None, Mask::READ).is_ok());
    }

    #[test]
    fn supplementary_groups_count() {
        let f = file(0o040, BOB, STAFF);
        assert!(may(&alice(), &f, None, Mask::READ).is_ok(), "alice is in staff through a supplementary group");
        assert!(is_access(may(&bob(), &f, None, Mask::READ)), "bob owns it, and the owner bits are empty");
        assert!(alice().in_group(USERS) && alice().in_group(STAFF) && !alice().in_group(WHEEL));
    }

    #[test]
    fn root_reads_and_writes_anything_but_executes_only_with_an_x_bit() {
        let root = Cred::root();
        let f = file(0o000, ALICE, STAFF);
        assert!(may(&root, &f, None, Mask::READ | Mask::WRITE).is_ok());
        assert!(is_access(may(&root, &f, None, Mask::EXEC)));
        assert!(may(&root, &file(0o001, ALICE, STAFF), None, Mask::EXEC).is_ok());
        assert!(may(&root, &file(0o100, ALICE, STAFF), None, Mask::EXEC).is_ok());
        assert!(may(&root, &dir(0o000, ALICE, STAFF), None, Mask::READ | Mask::WRITE | Mask::EXEC).is_ok());
        assert!(root.is_root() && !alice().is_root());
    }

    #[test]
    fn create_and_delete_need_write_and_search_on_the_directory() {
        for (mode, ok) in [(0o700, true), (0o500, false), (0o300, true), (0o600, false)] {
            let d = dir(mode, ALICE, STAFF);
            assert_eq!(may_create(&alice(), &d, None).is_ok(), ok, "mode {mode:o}");
            assert_eq!(may_delete(&alice(), &d, None, &file(0o644, BOB, USERS)).is_ok(), ok, "mode {mode:o}");
        }
        assert!(is_access(may_create(&bob(), &dir(0o755, ALICE, STAFF), None)));
    }

    #[test]
    fn sticky_directories_protect_other_users_entries() {
        let tmp = dir(0o1777, ROOT_UID, 0);
        let bobs = file(0o666, BOB, USERS);
        let alices = file(0o600, ALICE, USERS);
        assert!(is_eperm(may_delete(&alice(), &tmp, None, &bobs)), "not alice's entry, not alice's directory");
        assert!(may_delete(&alice(), &tmp, None, &alices).is_ok(), "her own entry");
        assert!(may_delete(&Cred::root(), &tmp, None, &bobs).is_ok(), "root");
        let alices_tmp = dir(0o1777, ALICE, USERS);
        assert!(may_delete(&alice(), &alices_tmp, None, &bobs).is_ok(), "the directory's owner");
        assert!(may_delete(&alice(), &dir(0o777, ROOT_UID, 0), None, &bobs).is_ok(), "not sticky");
        // Write permission is checked first: EACCES, not EPERM.
        assert!(is_access(may_delete(&alice(), &dir(0o1755, ROOT_UID, 0), None, &bobs)));
    }

    #[test]
    fn device_nodes_are_for_root_only() {
        for kind in [FileKind::CharDev, FileKind::BlockDev] {
            assert!(is_eperm(may_mknod(&alice(), kind)));
            assert!(may_mknod(&Cred::root(), kind).is_ok());
        }
        for kind in [FileKind::Fifo, FileKind::Socket] {
            assert!(may_mknod(&alice(), kind).is_ok());
        }
    }

    #[test]
    fn protected_hardlinks() {
        let rw = file(0o666, BOB, USERS);
        assert!(may_link(&alice(), &rw, None).is_ok(), "a file she may read and write");
        assert!(is_eperm(may_link(&alice(), &file(0o644, BOB, USERS), None)), "read only");
        assert!(is_eperm(may_link(&alice(), &file(0o4666, BOB, USERS), None)), "set-user-ID");
        assert!(is_eperm(may_link(&alice(), &file(0o2676, BOB, USERS), None)), "executable set-group-ID");
        assert!(may_link(&alice(), &file(0o2666, BOB, USERS), None).is_ok(), "set-group-ID without group exec");
        assert!(is_eperm(may_link(&alice(), &node(FileKind::Fifo, 0o666, BOB, USERS), None)), "not a regular file");
        assert!(may_link(&alice(), &file(0o4000, ALICE, USERS), None).is_ok(), "her own file");
        assert!(may_link(&Cred::root(), &file(0o4000, BOB, USERS), None).is_ok(), "root");
    }

    #[test]
    fn layout_policy_is_for_the_owner_and_root() {
        let d = dir(0o777, BOB, USERS);
        assert!(is_eperm(may_set_layout(&alice(), &d)));
        assert!(may_set_layout(&bob(), &d).is_ok());
        assert!(may_set_layout(&Cred::root(), &d).is_ok());
    }

    #[test]
    fn commit_needs_write_permission_or_ownership() {
        let ro = file(0o444, BOB, USERS);
        assert!(may_commit(&bob(), &ro, None).is_ok(), "the owner, though the file is read-only now");
        assert!(is_access(may_commit(&alice(), &ro, None)));
        assert!(may_commit(&alice(), &file(0o464, BOB, USERS), None).is_ok(), "group write");
        assert!(is_access(may_commit(&alice(), &file(0o646, BOB, USERS), None)), "her group class has no write");
        assert!(may_commit(&Cred::root(), &ro, None).is_ok());
    }

    #[test]
    fn writes_by_non_root_clear_set_id_bits() {
        // Set-user-ID always goes; set-group-ID with group exec, or when the writer is not in the group.
        assert_eq!(mode_after_write(&alice(), &file(0o4755, BOB, USERS)), 0o755);
        assert_eq!(mode_after_write(&alice(), &file(0o6755, BOB, USERS)), 0o755);
        assert_eq!(mode_after_write(&alice(), &file(0o2646, BOB, USERS)), 0o2646, "no group exec, in group");
        assert_eq!(mode_after_write(&alice(), &file(0o2646, BOB, WHEEL)), 0o646, "not in the group");
        assert_eq!(mode_after_write(&bob(), &file(0o4755, BOB, USERS)), 0o755, "the owner too");
        assert_eq!(mode_after_write(&Cred::root(), &file(0o6755, BOB, USERS)), 0o6755, "root keeps them");
        assert_eq!(mode_after_write(&alice(), &dir(0o2775, BOB, WHEEL)), 0o2775, "not a regular file");
        assert_eq!(mode_after_write(&alice(), &file(0o2777, BOB, USERS)), 0o777, "group exec: goes, in group too");
        assert_eq!(mode_after_write(&alice(), &file(0o2767, BOB, USERS)), 0o2767, "02767, in group: stays");
    }

    #[test]
    fn new_entries_belong_to_their_creator() {
        let plain = dir(0o777, ROOT_UID, 0);
        // The creator's uid and primary group, root included: a request names no owner.
        assert_eq!(new_owner(&Cred::root(), &plain, FileKind::File, 0o644), (0o644, ROOT_UID, 0));
        assert_eq!(new_owner(&alice(), &plain, FileKind::File, 0o644), (0o644, ALICE, USERS));
        // A set-group-ID directory passes on its group, and the bit to subdirectories.
        let sgid = dir(0o2777, ROOT_UID, WHEEL);
        assert_eq!(new_owner(&alice(), &sgid, FileKind::Dir, 0o755), (0o2755, ALICE, WHEEL));
        assert_eq!(new_owner(&alice(), &sgid, FileKind::File, 0o644), (0o644, ALICE, WHEEL));
        // An executable set-group-ID file there keeps the bit only if its creator is in the group.
        assert_eq!(new_owner(&alice(), &sgid, FileKind::File, 0o2755), (0o755, ALICE, WHEEL));
        let staff_sgid = dir(0o2777, ROOT_UID, STAFF);
        assert_eq!(new_owner(&alice(), &staff_sgid, FileKind::File, 0o2755), (0o2755, ALICE, STAFF));
        assert_eq!(new_owner(&Cred::root(), &sgid, FileKind::File, 0o2755), (0o2755, ROOT_UID, WHEEL));
    }

    fn set() -> SetAttrs {
        SetAttrs::default()
    }

    #[test]
    fn chmod_is_for_the_owner_and_root() {
        let f = file(0o644, BOB, USERS);
        let chmod = SetAttrs { mode: Some(0o600), ..set() };
        assert!(is_eperm(check_setattr(&alice(), &f, None, &chmod)), "even with write permission on the file");
        assert!(is_eperm(check_setattr(&alice(), &file(0o666, BOB, USERS), None, &chmod)));
        assert_eq!(check_setattr(&bob(), &f, None, &chmod), Ok(Some(0o600)));
        assert_eq!(check_setattr(&Cred::root(), &f, None, &chmod), Ok(Some(0o600)));
        // The owner may set set-user-ID and sticky.
        assert_eq!(check_setattr(&bob(), &f, None, &SetAttrs { mode: Some(0o5755), ..set() }), Ok(Some(0o5755)));
    }

    #[test]
    fn chmod_by_an_owner_outside_the_group_drops_set_group_id() {
        let f = file(0o644, ALICE, WHEEL);
        let sgid = SetAttrs { mode: Some(0o2755), ..set() };
        assert_eq!(check_setattr(&alice(), &f, None, &sgid), Ok(Some(0o755)));
        assert_eq!(check_setattr(&alice(), &file(0o644, ALICE, STAFF), None, &sgid), Ok(Some(0o2755)));
        assert_eq!(check_setattr(&Cred::root(), &f, None, &sgid), Ok(Some(0o2755)));
        // With a chgrp in the same request, the new group is the one that counts.
        let both = SetAttrs { mode: Some(0o2755), gid: Some(STAFF), ..set() };
        assert_eq!(check_setattr(&alice(), &f, None, &both), Ok(Some(0o2755)));
    }

    #[test]
    fn chown_is_for_root_only() {
        let f = file(0o644, ALICE, USERS);
        assert!(is_eperm(check_setattr(&alice(), &f, None, &SetAttrs { uid: Some(BOB), ..set() })), "giving away");
        assert!(is_eperm(check_setattr(&bob(), &f, None, &SetAttrs { uid: Some(BOB), ..set() })), "taking");
        assert!(is_eperm(check_setattr(&bob(), &f, None, &SetAttrs { uid: Some(ALICE), ..set() })), "not the owner");
        assert_eq!(check_setattr(&alice(), &f, None, &SetAttrs { uid: Some(ALICE), ..set() }), Ok(None), "to oneself");
        assert_eq!(check_setattr(&Cred::root(), &f, None, &SetAttrs { uid: Some(BOB), ..set() }), Ok(None));
    }

    #[test]
    fn chgrp_by_the_owner_to_their_own_groups() {
        let f = file(0o644, ALICE, USERS);
        assert_eq!(check_setattr(&alice(), &f, None, &SetAttrs { gid: Some(STAFF), ..set() }), Ok(None));
        assert!(is_eperm(check_setattr(&alice(), &f, None, &SetAttrs { gid: Some(WHEEL), ..set() })), "not her group");
        assert!(is_eperm(check_setattr(&bob(), &f, None, &SetAttrs { gid: Some(USERS), ..set() })), "not the owner");
        // The file's current group is allowed even if the owner left it.
        let g = file(0o644, ALICE, WHEEL);
        assert_eq!(check_setattr(&alice(), &g, None, &SetAttrs { gid: Some(WHEEL), ..set() }), Ok(None));
        assert_eq!(check_setattr(&Cred::root(), &f, None, &SetAttrs { gid: Some(WHEEL), ..set() }), Ok(None));
    }

    #[test]
    fn chown_and_chgrp_by_non_root_clear_set_id_bits() {
        let f = file(0o6755, ALICE, STAFF);
        assert_eq!(check_setattr(&alice(), &f, None, &SetAttrs { gid: Some(USERS), ..set() }), Ok(Some(0o755)));
        assert_eq!(check_setattr(&alice(), &f, None, &SetAttrs { uid: Some(ALICE), ..set() }), Ok(Some(0o755)));
        // Set-group-ID without group exec stays for a group member.
        let g = file(0o2644, ALICE, STAFF);
        assert_eq!(check_setattr(&alice(), &g, None, &SetAttrs { gid: Some(USERS), ..set() }), Ok(None));
        // An explicit mode in the same request is what is stored.
        let both = SetAttrs { gid: Some(USERS), mode: Some(0o4755), ..set() };
        assert_eq!(check_setattr(&alice(), &f, None, &both), Ok(Some(0o4755)));
        // Root's chown keeps them; directories keep them.
        assert_eq!(check_setattr(&Cred::root(), &f, None, &SetAttrs { uid: Some(BOB), ..set() }), Ok(None));
        let d = dir(0o2775, ALICE, STAFF);
        assert_eq!(check_setattr(&alice(), &d, None, &SetAttrs { gid: Some(USERS), ..set() }), Ok(None));
    }

    #[test]
    fn truncate_needs_write_permission_and_clears_set_id_bits() {
        let trunc = SetAttrs { size: Some(0), ..set() };
        assert!(is_access(check_setattr(&alice(), &file(0o644, BOB, USERS), None, &trunc)));
        assert!(is_access(check_setattr(&bob(), &file(0o444, BOB, USERS), None, &trunc)), "even the owner");
        assert_eq!(check_setattr(&alice(), &file(0o666, BOB, USERS), None, &trunc), Ok(None));
        assert_eq!(check_setattr(&alice(), &file(0o4766, BOB, USERS), None, &trunc), Ok(Some(0o766)));
        assert_eq!(check_setattr(&Cred::root(), &file(0o4444, BOB, USERS), None, &trunc), Ok(None));
    }

    #[test]
    fn a_truncate_through_an_open_needs_no_mode_bit_but_still_clears_set_id_bits() {
        let trunc = SetAttrs { size: Some(10), ..set() };
        let by_open = |c: &Cred, f: &Inode| check_setattr_by(c, f, None, &trunc, SizeRight::Open);
        // ftruncate on a descriptor opened O_CREAT|O_RDWR with mode 0: the open granted it.
        assert_eq!(by_open(&alice(), &file(0o000, ALICE, USERS)), Ok(None));
        assert!(is_access(check_setattr(&alice(), &file(0o000, ALICE, USERS), None, &trunc)), "a path truncate");
        assert_eq!(by_open(&alice(), &file(0o4777, BOB, USERS)), Ok(Some(0o777)));
        assert_eq!(by_open(&alice(), &file(0o6777, BOB, USERS)), Ok(Some(0o777)));
        assert_eq!(by_open(&alice(), &file(0o2767, BOB, USERS)), Ok(None), "no group exec, in group: stays");
        assert_eq!(by_open(&Cred::root(), &file(0o6777, BOB, USERS)), Ok(None), "CAP_FSETID keeps them");
        // Only the size comes from the open: a chmod still needs ownership.
        let both = SetAttrs { size: Some(0), mode: Some(0o777), ..set() };
        assert!(is_eperm(check_setattr_by(&alice(), &file(0o666, BOB, USERS), None, &both, SizeRight::Open)));
    }

    #[test]
    fn an_nfs_size_change_lets_the_owner_through_and_no_one_else() {
        let trunc = SetAttrs { size: Some(3), ..set() };
        let nfs = |c: &Cred, f: &Inode| check_setattr_by(c, f, None, &trunc, SizeRight::OwnerOverride);
        assert_eq!(nfs(&bob(), &file(0o444, BOB, USERS)), Ok(None), "the owner, mode 0444");
        assert_eq!(nfs(&bob(), &file(0o4555, BOB, USERS)), Ok(Some(0o555)), "set-ID bits still go");
        assert!(is_access(nfs(&alice(), &file(0o644, BOB, USERS))), "not the owner");
        assert_eq!(nfs(&alice(), &file(0o664, BOB, USERS)), Ok(None), "not the owner, but the group may write");
    }

    #[test]
    fn explicit_times_are_for_the_owner_and_root() {
        let writable = file(0o666, BOB, USERS);
        for (atime, mtime) in [
            (Some(TimeSet::AtNs(5)), None),
            (None, Some(TimeSet::AtNs(5))),
            (Some(TimeSet::AtNs(5)), Some(TimeSet::Now)),
            (Some(TimeSet::Now), None),
            (None, Some(TimeSet::Now)),
        ] {
            let times = SetAttrs { atime, mtime, ..set() };
            assert!(is_eperm(check_setattr(&alice(), &writable, None, &times)), "{times:?}");
            assert_eq!(check_setattr(&bob(), &file(0o444, BOB, USERS), None, &times), Ok(None), "{times:?}");
            assert_eq!(check_setattr(&Cred::root(), &writable, None, &times), Ok(None), "{times:?}");
        }
    }

    #[test]
    fn touching_both_times_to_now_needs_write_permission_or_ownership() {
        let touch = SetAttrs { atime: Some(TimeSet::Now), mtime: Some(TimeSet::Now), ..set() };
        assert_eq!(check_setattr(&alice(), &file(0o666, BOB, USERS), None, &touch), Ok(None));
        assert!(is_access(check_setattr(&alice(), &file(0o644, BOB, USERS), None, &touch)));
        assert_eq!(check_setattr(&bob(), &file(0o444, BOB, USERS), None, &touch), Ok(None));
        assert_eq!(check_setattr(&Cred::root(), &file(0o000, BOB, USERS), None, &touch), Ok(None));
    }

    #[test]
    fn an_empty_setattr_needs_nothing() {
        assert_eq!(check_setattr(&alice(), &file(0o000, BOB, WHEEL), None, &set()), Ok(None));
    }

    #[test]
    fn errors_map_to_eacces_and_eperm() {
        let a: WireError = PermError::Access("x".into()).into();
        let p: WireError = PermError::NotPermitted("x".into()).into();
        assert_eq!((a.code, a.code.errno()), (ErrorCode::Permission, 13));
        assert_eq!((p.code, p.code.errno()), (ErrorCode::NotPermitted, 1));
    }
}
