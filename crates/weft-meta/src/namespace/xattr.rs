//! Extended attributes and POSIX ACLs: the rules of GetXattr, SetXattr, ListXattr and RemoveXattr, ACL
//! inheritance at create, and the ACL side of a chmod (docs/format.md §13).
//!
//! Why the ACL rules live with the attributes: an ACL *is* an attribute (`system.posix_acl_access`,
//! `system.posix_acl_default`, the Linux value format of [`crate::acl`]), stored in the same table, but unlike
//! other attributes it is checked, kept coherent with the mode bits, inherited, and read by every permission check.
//!
//! Limits (Linux's): a name of 1..=255 bytes with a known namespace prefix (others are `NotSupported`), a value of
//! at most 64 KiB (`TooBig`), the list of an inode's names at most 64 KiB (`TooBig`), and at most
//! `xattr_bytes_max_per_inode` bytes of names and values per inode (`NoSpace`, as ext4 when its block is full).

use weft_proto::msg::{SetXattrReq, XATTR_CREATE, XATTR_REPLACE, XattrReq};
use weft_proto::{ErrorCode, FileKind, WireError, XATTR_LIST_BYTES_MAX, XATTR_NAME_BYTES_MAX, XATTR_VALUE_BYTES_MAX};

use super::{load, werr};
use crate::acl::{ACCESS_XATTR, Acl, DEFAULT_XATTR};
use crate::error::MetaError;
use crate::perm::{self, Cred, SET_GID};
use crate::store::{Inode, MetaTxn};

/// Default of the MDS's `xattr_bytes_max_per_inode`: room for several largest values (ext4 allows one 4 KiB
/// block, XFS and btrfs 64 KiB per value; tools such as Samba store a few KiB per file).
pub const DEFAULT_XATTR_BYTES_MAX_PER_INODE: usize = 256 << 10;

/// The namespaces served; anything else is `NotSupported` (EOPNOTSUPP), as Linux answers an unknown prefix.
const PREFIXES: [&str; 3] = ["user.", "trusted.", "security."];

fn is_acl(name: &str) -> bool {
    name == ACCESS_XATTR || name == DEFAULT_XATTR
}

/// Checks a name's length and namespace (Linux: an empty or over-long name is ERANGE, an unknown prefix
/// EOPNOTSUPP, a prefix with nothing after it EINVAL).
fn check_name(name: &str) -> Result<(), WireError> {
    if name.is_empty() || name.len() > XATTR_NAME_BYTES_MAX {
        return Err(werr(
            ErrorCode::Range,
            format!("attribute name of {} bytes is not 1..={XATTR_NAME_BYTES_MAX}", name.len()),
        ));
    }
    if name.contains('\0') {
        return Err(werr(ErrorCode::Invalid, format!("attribute name {name:?} has a NUL")));
    }
    if is_acl(name) {
        return Ok(());
    }
    match PREFIXES.iter().find(|p| name.starts_with(*p)) {
        Some(p) if name.len() == p.len() => {
            Err(werr(ErrorCode::Invalid, format!("attribute name {name:?} is only a namespace prefix")))
        }
        Some(_) => Ok(()),
        None => Err(werr(ErrorCode::NotSupported, format!("attribute namespace of {name:?} is not supported"))),
    }
}

fn decode_stored(ino: u64, name: &str, value: &[u8]) -> Result<Option<Acl>, WireError> {
    Acl::decode(value).map_err(|e| MetaError::Corrupt(format!("stored {name} of inode {ino}: {e}")).into())
}

/// Inode `ino`'s access ACL, if it has one.
pub(super) fn access_acl(t: &mut dyn MetaTxn, ino: u64) -> Result<Option<Acl>, WireError> {
    match t.get_xattr(ino, ACCESS_XATTR)? {
        Some(v) => decode_stored(ino, ACCESS_XATTR, &v),
        None => Ok(None),
    }
}

/// GetXattr: the value, if `cred` may read it.
pub(super) fn get(t: &mut dyn MetaTxn, cred: &Cred, r: &XattrReq) -> Result<Vec<u8>, WireError> {
    check_name(&r.name)?;
    let inode = load(t, r.ino)?;
    let absent = || werr(ErrorCode::NoData, format!("inode {} has no attribute {:?}", r.ino, r.name));
    if is_acl(&r.name) {
        // Anyone who can reach the inode may read its ACLs (Linux checks nothing more).
        if inode.kind == FileKind::Symlink {
            return Err(werr(ErrorCode::NotSupported, "symlinks have no ACLs"));
        }
    } else {
        let acl = super::acl_for(t, cred, &inode)?;
        if !perm::may_xattr(cred, &inode, acl.as_ref(), &r.name, false)? {
            return Err(absent());
        }
    }
    t.get_xattr(r.ino, &r.name)?.ok_or_else(absent)
}

/// ListXattr: the names `cred` may see (`trusted.*` only for root), in byte order. Linux checks no permission.
pub(super) fn list(t: &mut dyn MetaTxn, cred: &Cred, ino: u64) -> Result<Vec<String>, WireError> {
    load(t, ino)?;
    Ok(t.list_xattrs(ino)?
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| cred.is_root() || !name.starts_with("trusted."))
        .collect())
}

/// SetXattr. Checks, in Linux's order: the name, the value's size, the flags, the caller's right, then
/// existence against the flags and the inode's limits.
pub(super) fn set(
    t: &mut dyn MetaTxn,
    cred: &Cred,
    r: &SetXattrReq,
    bytes_max: usize,
    now: i64,
) -> Result<(), WireError> {
    check_name(&r.name)?;
    if r.value.len() > XATTR_VALUE_BYTES_MAX {
        return Err(werr(
            ErrorCode::TooBig,
            format!("attribute value of {} bytes is larger than {XATTR_VALUE_BYTES_MAX}", r.value.len()),
        ));
    }
    if r.flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 || r.flags == XATTR_CREATE | XATTR_REPLACE {
        return Err(werr(ErrorCode::Invalid, format!("unknown or conflicting attribute flags {:#x}", r.flags)));
    }
    let mut inode = load(t, r.ino)?;
    if is_acl(&r.name) {
        // As `posix_acl_xattr_set`: the flags do not apply to ACLs.
        return set_acl(t, cred, inode, &r.name, &r.value, bytes_max, now);
    }
    let acl = super::acl_for(t, cred, &inode)?;
    perm::may_xattr(cred, &inode, acl.as_ref(), &r.name, true)?;
    let exists = t.get_xattr(r.ino, &r.name)?.is_some();
    if r.flags == XATTR_CREATE && exists {
        return Err(werr(ErrorCode::Exists, format!("inode {} has attribute {:?} already", r.ino, r.name)));
    }
    if r.flags == XATTR_REPLACE && !exists {
        return Err(werr(ErrorCode::NoData, format!("inode {} has no attribute {:?} to replace", r.ino, r.name)));
    }
    check_room(t, r.ino, &r.name, r.value.len(), bytes_max)?;
    t.put_xattr(r.ino, &r.name, &r.value)?;
    inode.ctime_ns = now;
    t.put_inode(&inode)?;
    Ok(())
}

/// Whether `name` with a value of `value_len` bytes fits inode `ino`'s limits, counting what it replaces as gone.
fn check_room(t: &mut dyn MetaTxn, ino: u64, name: &str, value_len: usize, bytes_max: usize) -> Result<(), WireError> {
    let others: Vec<(String, usize)> = t.list_xattrs(ino)?.into_iter().filter(|(n, _)| n != name).collect();
    let list_bytes = others.iter().map(|(n, _)| n.len() + 1).sum::<usize>() + name.len() + 1;
    if list_bytes > XATTR_LIST_BYTES_MAX {
        return Err(werr(
            ErrorCode::TooBig,
            format!("inode {ino}'s attribute names would take {list_bytes} bytes, over {XATTR_LIST_BYTES_MAX}"),
        ));
    }
    let total = others.iter().map(|(n, v)| n.len() + v).sum::<usize>() + name.len() + value_len;
    if total > bytes_max {
        return Err(werr(
            ErrorCode::NoSpace,
            format!("inode {ino}'s attributes would take {total} bytes, over xattr_bytes_max_per_inode {bytes_max}"),
        ));
    }
    Ok(())
}

/// Setting an ACL (`set_posix_acl`, `posix_acl_update_mode`): owner or root only; not on symlinks; a default
/// ACL only on directories. An access ACL sets the mode's permission bits (group bits from the mask) and, for a
/// caller outside the file's group, clears set-group-ID; a minimal one is kept as mode bits only. An empty value
/// removes the ACL.
fn set_acl(
    t: &mut dyn MetaTxn,
    cred: &Cred,
    mut inode: Inode,
    name: &str,
    value: &[u8],
    bytes_max: usize,
    now: i64,
) -> Result<(), WireError> {
    if inode.kind == FileKind::Symlink {
        return Err(werr(ErrorCode::NotSupported, "symlinks have no ACLs"));
    }
    perm::may_xattr(cred, &inode, None, name, true)?;
    let acl = Acl::decode(value).map_err(|e| werr(ErrorCode::Invalid, format!("{name}: {e}")))?;
    let ino = inode.ino;
    if name == DEFAULT_XATTR {
        if inode.kind != FileKind::Dir {
            return match acl {
                Some(_) => Err(werr(ErrorCode::Permission, format!("inode {ino} is not a directory: no default ACL"))),
                None => Ok(()),
            };
        }
        match acl {
            Some(acl) => {
                let bytes = acl.encode();
                check_room(t, ino, name, bytes.len(), bytes_max)?;
                t.put_xattr(ino, name, &bytes)?;
            }
            None => t.del_xattr(ino, name)?,
        }
    } else if let Some(acl) = acl {
        let (bits, minimal) = acl.equiv_mode();
        let mut mode = (inode.mode & !0o777) | bits;
        if !perm::keeps_sgid(cred, &inode) {
            mode &= !SET_GID;
        }
        inode.mode = mode;
        if minimal {
            t.del_xattr(ino, name)?;
        } else {
            let bytes = acl.encode();
            check_room(t, ino, name, bytes.len(), bytes_max)?;
            t.put_xattr(ino, name, &bytes)?;
        }
    } else {
        t.del_xattr(ino, name)?;
    }
    inode.ctime_ns = now;
    t.put_inode(&inode)?;
    Ok(())
}

/// RemoveXattr: the same right as setting it; `NoData` if absent. Removing an access ACL leaves the mode as is.
pub(super) fn remove(t: &mut dyn MetaTxn, cred: &Cred, r: &XattrReq, now: i64) -> Result<(), WireError> {
    check_name(&r.name)?;
    let mut inode = load(t, r.ino)?;
    if is_acl(&r.name) {
        if inode.kind == FileKind::Symlink {
            return Err(werr(ErrorCode::NotSupported, "symlinks have no ACLs"));
        }
        perm::may_xattr(cred, &inode, None, &r.name, true)?;
    } else {
        let acl = super::acl_for(t, cred, &inode)?;
        perm::may_xattr(cred, &inode, acl.as_ref(), &r.name, true)?;
    }
    if t.get_xattr(r.ino, &r.name)?.is_none() {
        return Err(werr(ErrorCode::NoData, format!("inode {} has no attribute {:?}", r.ino, r.name)));
    }
    t.del_xattr(r.ino, &r.name)?;
    inode.ctime_ns = now;
    t.put_inode(&inode)?;
    Ok(())
}

/// The file-capability attribute Linux removes when a file's data, size or owner changes
/// (`security_inode_killpriv`, `cap_inode_killpriv`).
pub const CAPABILITY_XATTR: &str = "security.capability";

/// Removes `ino`'s file capabilities after a write, a truncate or a change of owner, as Linux does for anyone
/// (root included): a changed program must not keep the privileges granted to the old one. The MDS does it
/// itself because the FUSE mount negotiates `FUSE_HANDLE_KILLPRIV_V2`, so the kernel no longer asks
/// (a `getxattr` of this name before every write). Returns whether anything was removed.
pub(super) fn kill_priv(t: &mut dyn MetaTxn, ino: u64) -> Result<bool, WireError> {
    if t.get_xattr(ino, CAPABILITY_XATTR)?.is_none() {
        return Ok(false);
    }
    t.del_xattr(ino, CAPABILITY_XATTR)?;
    Ok(true)
}

/// After a chmod to `mode`: the access ACL's owner, mask (or group) and other entries take the new bits.
pub(super) fn chmod_acl(t: &mut dyn MetaTxn, ino: u64, mode: u32) -> Result<(), WireError> {
    if let Some(mut acl) = access_acl(t, ino)? {
        acl.chmod(mode);
        t.put_xattr(ino, ACCESS_XATTR, &acl.encode())?;
    }
    Ok(())
}

/// What a new entry gets from its parent (`posix_acl_create`): its mode, and the ACLs to store with it.
pub(super) struct Inherited {
    pub mode: u32,
    access: Option<Vec<u8>>,
    default: Option<Vec<u8>>,
}

impl Inherited {
    /// Stores the inherited ACLs on the new inode `ino`.
    pub fn store(&self, t: &mut dyn MetaTxn, ino: u64) -> Result<(), WireError> {
        if let Some(v) = &self.access {
            t.put_xattr(ino, ACCESS_XATTR, v)?;
        }
        if let Some(v) = &self.default {
            t.put_xattr(ino, DEFAULT_XATTR, v)?;
        }
        Ok(())
    }
}

/// A new `kind` entry created in `parent` with `mode` (its creator's `umask` not yet applied, if given): with a
/// default ACL on the parent, the umask is ignored and the ACL, masked by the mode, becomes the entry's access ACL
/// (unless minimal) and, for a directory, its default ACL too; without one the umask applies. Symlinks take
/// nothing.
pub(super) fn inherit(
    t: &mut dyn MetaTxn,
    parent: &Inode,
    kind: FileKind,
    mode: u32,
    umask: Option<u32>,
) -> Result<Inherited, WireError> {
    let umasked = mode & !umask.unwrap_or(0);
    let none = |mode| Inherited { mode, access: None, default: None };
    if kind == FileKind::Symlink {
        return Ok(none(umasked));
    }
    let Some(stored) = t.get_xattr(parent.ino, DEFAULT_XATTR)? else {
        return Ok(none(umasked));
    };
    let Some(default) = decode_stored(parent.ino, DEFAULT_XATTR, &stored)? else {
        return Ok(none(umasked));
    };
    let mut access = default.clone();
    let (mode, store) = access.create_masq(mode);
    Ok(Inherited {
        mode,
        access: store.then(|| access.encode()),
        default: (kind == FileKind::Dir).then(|| default.encode()),
    })
}

#[cfg(test)]
mod tests;
