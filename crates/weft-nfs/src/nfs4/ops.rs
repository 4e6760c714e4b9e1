//! The NFSv4.1 file operations (RFC 8881 §18): filehandles, lookups, attributes, opens with share reservations,
//! I/O, directories, and byte-range locks, each running as the caller through the client library (the MDS
//! checks its permissions), with the same semantics as the NFSv3 procedures ([`crate::nfs3`]) where the two
//! overlap: the same open-file cache, write verifier, readdir cookies and exclusive-create verifier.
//!
//! Locks: a lock-owner (clientid, owner bytes) is one MDS lock owner of the gateway's session ([`super::state`]),
//! its id a keyed hash of the client's `co_ownerid` and the owner bytes, so it survives a gateway restart;
//! the MDS decides conflicts with every other holder (FUSE mounts, other gateways, other NFS clients). Blocking
//! lock types (READW/WRITEW) are answered DENIED at once: the client polls, as RFC 8881 §9.6 allows.

use bytes::{Bytes, BytesMut};
use weft_client::ClientError;
use weft_proto::msg::{GetLockReq, LockClass, LockKind, SetLockReq};
use weft_proto::{Attr, FileKind, NAME_BYTES_MAX, SetAttrs, TimeSet};

use super::attrs::{self, Bitmap, FsInfo, Settable};
use super::compound::Ctx;
use super::consts::*;
use super::decode::{Claim, CreateHow, CreateType, Locker, Op, RawAttrs};
use super::state::Stateid;
use crate::fh::FhError;
use crate::nfs3::{COOKIE_VERF, access_bits, name_cookie};
use crate::proto::IO_BYTES_MAX;
use crate::status::status_of;
use crate::xdr::Writer;

type Out = Result<Writer, u32>;

pub(super) fn st(e: &ClientError) -> u32 {
    from_v3(status_of(e))
}

fn check_name(name: &str) -> Result<(), u32> {
    if name.is_empty() {
        return Err(NFS4ERR_INVAL);
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(NFS4ERR_NAMETOOLONG);
    }
    if name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(NFS4ERR_BADNAME);
    }
    Ok(())
}

/// Fresh attributes with the gateway's uncommitted writes; a removed inode is STALE.
pub(super) async fn attr_of(cx: &Ctx<'_>, ino: u64) -> Result<Attr, u32> {
    attr_overlaid(cx, cx.c.getattr(ino).await)
}

/// [`attr_of`] read at the MDS, never from the lease cache: for a layout, whose servers and generation an MDS duty
/// moves (a slot to a spare) without recalling any lease.
pub(super) async fn fresh_attr_of(cx: &Ctx<'_>, ino: u64) -> Result<Attr, u32> {
    attr_overlaid(cx, cx.c.getattr_at_mds(ino).await)
}

fn attr_overlaid(cx: &Ctx<'_>, got: Result<Attr, weft_client::ClientError>) -> Result<Attr, u32> {
    match got {
        Ok(mut a) => {
            cx.gw.files.overlay(&mut a);
            Ok(a)
        }
        Err(e) => Err(match st(&e) {
            NFS4ERR_NOENT => NFS4ERR_STALE,
            s => s,
        }),
    }
}

/// A directory's current attributes, which must be a directory's (NOTDIR).
async fn dir_of(cx: &Ctx<'_>) -> Result<(u64, Attr), u32> {
    let ino = cx.cur()?;
    let a = attr_of(cx, ino).await?;
    if a.kind != FileKind::Dir {
        return Err(NFS4ERR_NOTDIR);
    }
    Ok((ino, a))
}

/// `change_info4` of a directory after a change (not atomic: the client revalidates).
async fn cinfo(cx: &Ctx<'_>, w: &mut Writer, dir: u64, before: u64) {
    let after = cx.c.getattr(dir).await.map_or(before, |a| attrs::change_of(&a));
    w.bool(false).u64(before).u64(after);
}

fn needs_statfs(want: &Bitmap) -> bool {
    [attrs::SPACE_AVAIL, attrs::SPACE_FREE, attrs::SPACE_TOTAL, attrs::FILES_TOTAL].iter().any(|&b| want.has(b))
}

async fn fs_info(cx: &Ctx<'_>, want: &Bitmap) -> FsInfo {
    let mut fs = FsInfo {
        fsid: cx.gw.fsid,
        lease_s: (cx.gw.cfg.nfs4.lease_ms / 1000) as u32,
        pnfs: cx.gw.pnfs,
        ..FsInfo::default()
    };
    if needs_statfs(want)
        && let Ok(s) = cx.c.statfs().await
    {
        fs.bytes_total = s.bytes_total;
        fs.bytes_free = s.bytes_free;
        fs.files = s.files;
    }
    fs
}

fn put_stateid(w: &mut Writer, s: &Stateid) {
    w.u32(s.seqid).fixed(&s.other);
}

/// Applies settable attributes (a size change syncs the gateway's cached writes first, so they cannot raise the
/// size back).
async fn apply(cx: &Ctx<'_>, ino: u64, set: SetAttrs) -> Result<(), u32> {
    if set == SetAttrs::default() {
        return Ok(());
    }
    if set.size.is_some()
        && let Err(e) = cx.gw.files.close_inode(ino).await
    {
        tracing::warn!(ino, error = %e, "syncing before a size change");
    }
    let r = cx.c.nfs_setattr(ino, set).await.map(|_| ()).map_err(|e| st(&e));
    cx.gw.files.wrote(ino);
    r
}

pub async fn run(cx: &mut Ctx<'_>, op: Op<'_>) -> (u32, Writer) {
    let r = match op {
        Op::PutFh(fh) => putfh(cx, fh),
        Op::PutRootFh => {
            cx.cur = Some(cx.gw.export_ino);
            Ok(Writer::new())
        }
        Op::GetFh => cx.cur().map(|ino| {
            let mut w = Writer::new();
            w.opaque(&cx.gw.sealer.seal(ino));
            w
        }),
        Op::SaveFh => cx.cur().map(|ino| {
            cx.saved = Some(ino);
            Writer::new()
        }),
        Op::RestoreFh => match cx.saved {
            Some(s) => {
                cx.cur = Some(s);
                Ok(Writer::new())
            }
            None => Err(NFS4ERR_RESTOREFH),
        },
        Op::Lookup(name) => lookup(cx, name).await,
        Op::LookupP => lookupp(cx).await,
        Op::GetAttr(want) => getattr(cx, &want).await,
        Op::SetAttr { stateid, attrs } => return setattr(cx, stateid, attrs).await,
        Op::Access(mask) => access(cx, mask).await,
        Op::Readlink => readlink(cx).await,
        Op::SecInfo(name) => secinfo(cx, Some(name)).await,
        Op::SecInfoNoName(style) => secinfo(cx, (style == SECINFO_STYLE4_PARENT).then_some("..")).await,
        Op::Verify { attrs, negated } => verify(cx, attrs, negated).await,
        Op::Open { access, deny, clientid: _, owner, how, claim } => open(cx, access, deny, owner, how, claim).await,
        Op::OpenDowngrade { stateid, access, deny } => {
            let id = cx.stateid(stateid);
            cx.clientid().and_then(|cid| {
                let s = cx.gw.nfs4.state().downgrade(cid, &id, access & 3, deny)?;
                let mut w = Writer::new();
                put_stateid(&mut w, &s);
                Ok(w)
            })
        }
        Op::Close { stateid } => close(cx, stateid).await,
        Op::Read { stateid, offset, count } => read(cx, stateid, offset, count).await,
        Op::Write { stateid, offset, stable, data } => {
            let data = cx.rec.slice_ref(data);
            write(cx, stateid, offset, stable, data).await
        }
        Op::Commit { .. } => commit(cx).await,
        Op::Readdir { cookie, verf, dircount: _, maxcount, want } => readdir(cx, cookie, verf, maxcount, &want).await,
        Op::Create { kind, name, attrs } => create(cx, kind, name, attrs).await,
        Op::Remove(name) => remove(cx, name).await,
        Op::Rename { from, to } => rename(cx, from, to).await,
        Op::Link(name) => link(cx, name).await,
        Op::Lock { locktype, reclaim, offset, length, locker } => {
            let mut d = None;
            let r = lock(cx, locktype, reclaim, offset, length, locker, &mut d).await;
            return with_denied(r, d);
        }
        Op::LockT { locktype, offset, length, clientid: _, owner } => {
            let mut d = None;
            let r = lockt(cx, locktype, offset, length, owner, &mut d).await;
            return with_denied(r, d);
        }
        Op::LockU { locktype: _, seqid: _, stateid, offset, length } => locku(cx, stateid, offset, length).await,
        Op::TestStateid(ids) => cx.clientid().map(|cid| {
            let st = cx.gw.nfs4.state();
            let mut w = Writer::new();
            w.u32(ids.len() as u32);
            for id in ids {
                w.u32(st.check(cid, &id).map_or_else(|e| e, |_| NFS4_OK));
            }
            w
        }),
        Op::FreeStateid(id) => free_stateid(cx, id).await,
        // rca_one_fs: one file system's reclaims done; optional, so accepted and not acted on (as knfsd), but it
        // names the current filehandle's file system, so one must be set.
        Op::ReclaimComplete(true) => cx.cur().map(|_| Writer::new()),
        Op::ReclaimComplete(false) => cx.clientid().and_then(|cid| {
            cx.gw.nfs4.state().reclaim_complete(cid)?;
            Ok(Writer::new())
        }),
        Op::BackchannelCtl { prog, sec } => match cx.session {
            Some((sid, _)) => {
                cx.gw.nfs4.channels().control(&sid, prog, sec);
                Ok(Writer::new())
            }
            None => Err(NFS4ERR_OP_NOT_IN_SESSION),
        },
        Op::LayoutGet(a) => return super::pnfs::layoutget(cx, a).await,
        Op::LayoutCommit(a) => super::pnfs::layoutcommit(cx, a).await,
        Op::LayoutReturn(a) => super::pnfs::layoutreturn(cx, a).await,
        Op::GetDeviceInfo(a) => return super::pnfs::getdeviceinfo(cx, a).await,
        Op::GetDeviceList(a) => super::pnfs::getdevicelist(cx, a).await,
        Op::NotSupp(_) => Err(NFS4ERR_NOTSUPP),
        // Session ops and SEQUENCE are placed by the compound loop.
        _ => Err(NFS4ERR_SERVERFAULT),
    };
    match r {
        Ok(w) => (NFS4_OK, w),
        Err(s) => (s, Writer::new()),
    }
}

fn putfh(cx: &mut Ctx<'_>, fh: &[u8]) -> Out {
    match cx.gw.sealer.open(fh) {
        Ok(h) => {
            cx.cur = Some(h.ino);
            Ok(Writer::new())
        }
        Err(FhError::OtherExport) => Err(NFS4ERR_STALE),
        Err(e) => {
            tracing::info!(error = %e, "refused an NFSv4 filehandle");
            Err(NFS4ERR_BADHANDLE)
        }
    }
}

async fn lookup(cx: &mut Ctx<'_>, name: &str) -> Out {
    check_name(name)?;
    let dir = cx.cur()?;
    // A symbolic link is SYMLINK, any other non-directory NOTDIR (RFC 8881 §18.13.3).
    match attr_of(cx, dir).await?.kind {
        FileKind::Dir => {}
        FileKind::Symlink => return Err(NFS4ERR_SYMLINK),
        _ => return Err(NFS4ERR_NOTDIR),
    }
    let a = cx.c.lookup(dir, name).await.map_err(|e| st(&e))?;
    cx.cur = Some(a.ino);
    Ok(Writer::new())
}

async fn lookupp(cx: &mut Ctx<'_>) -> Out {
    let (dir, _) = dir_of(cx).await?;
    // The export's root has no parent a client may reach.
    if dir == cx.gw.export_ino {
        return Err(NFS4ERR_NOENT);
    }
    let a = cx.c.lookup(dir, "..").await.map_err(|e| st(&e))?;
    cx.cur = Some(a.ino);
    Ok(Writer::new())
}

/// SECINFO_NO_NAME's style naming the current filehandle's parent.
const SECINFO_STYLE4_PARENT: u32 = 1;

/// SECINFO (`name` in the current directory), SECINFO_NO_NAME (the current object, or its parent as `".."`):
/// one flavour, AUTH_SYS, for every object, once the object is found as LOOKUP or LOOKUPP would find it (NOTDIR,
/// NOENT; the export's root has no parent: NOENT). The op consumes the current filehandle (§2.6.3.1.1.8).
async fn secinfo(cx: &mut Ctx<'_>, name: Option<&str>) -> Out {
    match name {
        Some("..") => {
            lookupp(cx).await?;
        }
        Some(name) => {
            check_name(name)?;
            let (dir, _) = dir_of(cx).await?;
            cx.c.lookup(dir, name).await.map_err(|e| st(&e))?;
        }
        None => {
            attr_of(cx, cx.cur()?).await?;
        }
    }
    cx.cur = None;
    let mut w = Writer::new();
    w.u32(1).u32(crate::rpc::AUTH_SYS);
    Ok(w)
}

/// VERIFY and NVERIFY (§18.31, §18.15): the client's attributes against the current object's, encoded as GETATTR
/// encodes them and compared byte for byte (as knfsd compares). VERIFY of different values is NOT_SAME, NVERIFY of
/// equal ones SAME. A write-only attribute or `rdattr_error` is INVAL; one the gateway does not answer ATTRNOTSUPP.
async fn verify(cx: &Ctx<'_>, raw: RawAttrs<'_>, negated: bool) -> Out {
    let ino = cx.cur()?;
    let invalid = [attrs::RDATTR_ERROR, attrs::TIME_ACCESS_SET, attrs::TIME_MODIFY_SET];
    if invalid.iter().any(|&b| raw.bits.has(b)) {
        return Err(NFS4ERR_INVAL);
    }
    let supported = attrs::supported_with(cx.gw.pnfs);
    if raw.bits.iter().any(|b| !supported.has(b)) {
        return Err(NFS4ERR_ATTRNOTSUPP);
    }
    let a = attr_of(cx, ino).await?;
    let fs = fs_info(cx, &raw.bits).await;
    let (got, ours) = attrs::values(&raw.bits, &a, &cx.gw.sealer.seal(ino), &fs);
    debug_assert_eq!(got.iter().collect::<Vec<_>>(), raw.bits.iter().collect::<Vec<_>>(), "every asked bit answered");
    match (ours.buf == raw.list, negated) {
        (true, false) | (false, true) => Ok(Writer::new()),
        (false, false) => Err(NFS4ERR_NOT_SAME),
        (true, true) => Err(NFS4ERR_SAME),
    }
}

async fn getattr(cx: &Ctx<'_>, want: &Bitmap) -> Out {
    let ino = cx.cur()?;
    let a = attr_of(cx, ino).await?;
    let fs = fs_info(cx, want).await;
    let mut w = Writer::new();
    attrs::encode(&mut w, want, &a, &cx.gw.sealer.seal(ino), &fs);
    Ok(w)
}

async fn setattr(cx: &mut Ctx<'_>, stateid: Stateid, raw: RawAttrs<'_>) -> (u32, Writer) {
    let r: Result<Bitmap, u32> = async {
        let ino = cx.cur()?;
        let s = attrs::settable_from(&raw.bits, raw.list, &attrs::settable())?;
        let a = attr_of(cx, ino).await?;
        if s.set.size.is_some() {
            if a.kind == FileKind::Dir {
                return Err(NFS4ERR_ISDIR);
            }
            if a.kind != FileKind::File {
                return Err(NFS4ERR_INVAL);
            }
            let id = cx.stateid(stateid);
            let cid = cx.clientid()?;
            cx.gw.nfs4.state().check_io(cid, &id, ino, true)?;
        }
        let why = super::recall::changes_of(&s.set, &a);
        apply(cx, ino, s.set).await?;
        if let Some(why) = why {
            cx.gw.layouts_changed(ino, why);
        }
        Ok(s.bits)
    }
    .await;
    let mut w = Writer::new();
    match r {
        Ok(bits) => {
            bits.encode(&mut w);
            (NFS4_OK, w)
        }
        Err(s) => {
            w.u32(0);
            (s, w)
        }
    }
}

async fn access(cx: &Ctx<'_>, mask: u32) -> Out {
    let ino = cx.cur()?;
    let a = attr_of(cx, ino).await?;
    let supported = mask & 0x3f;
    let mut w = Writer::new();
    w.u32(supported).u32(access_bits(&a, cx.c.user(), supported));
    Ok(w)
}

async fn readlink(cx: &Ctx<'_>) -> Out {
    let ino = cx.cur()?;
    let a = attr_of(cx, ino).await?;
    if a.kind != FileKind::Symlink {
        return Err(NFS4ERR_INVAL);
    }
    let t = cx.c.readlink(ino).await.map_err(|e| st(&e))?;
    let mut w = Writer::new();
    w.opaque(t.as_bytes());
    Ok(w)
}

/// The verifier of an exclusive create, kept in the new file's times as the NFSv3 CREATE keeps it.
fn verf_times(v: &[u8; 8]) -> (i64, i64) {
    let a = u32::from_be_bytes(v[..4].try_into().expect("4")) as i64;
    let m = u32::from_be_bytes(v[4..].try_into().expect("4")) as i64;
    (a * 1_000_000_000, m * 1_000_000_000)
}

/// OPEN's file: looked up or created in the current directory (CLAIM_NULL) or the current filehandle itself
/// (CLAIM_FH, CLAIM_PREVIOUS). Returns (inode, attributes set, created, directory's change before).
async fn open_target(
    cx: &Ctx<'_>,
    how: &CreateHow<'_>,
    claim: &Claim<'_>,
) -> Result<(u64, Bitmap, bool, Option<(u64, u64)>), u32> {
    let name = match claim {
        Claim::Null(n) => *n,
        Claim::Fh | Claim::Previous(_) => {
            if !matches!(how, CreateHow::NoCreate) {
                return Err(NFS4ERR_INVAL);
            }
            return Ok((cx.cur()?, Bitmap::default(), false, None));
        }
        Claim::Deleg(_) => return Err(NFS4ERR_RECLAIM_BAD),
    };
    check_name(name)?;
    let (dir, da) = dir_of(cx).await?;
    let before = Some((dir, attrs::change_of(&da)));
    let (raw, exclusive, verf) = match how {
        CreateHow::NoCreate => {
            let a = cx.c.lookup(dir, name).await.map_err(|e| st(&e))?;
            return Ok((a.ino, Bitmap::default(), false, before));
        }
        CreateHow::Unchecked(a) => (Some((a, attrs::settable())), false, None),
        CreateHow::Guarded(a) => (Some((a, attrs::settable())), true, None),
        CreateHow::Exclusive(v) => (None, true, Some(*v)),
        CreateHow::Exclusive41(v, a) => (Some((a, attrs::exclcreat())), true, Some(*v)),
    };
    let s = match raw {
        Some((a, allowed)) => attrs::settable_from(&a.bits, a.list, &allowed)?,
        None => Settable::default(),
    };
    let mode = s.set.mode.unwrap_or(0o644);
    // UNCHECKED on an existing file: only a size (truncation) applies.
    if !exclusive && let Ok(a) = cx.c.lookup(dir, name).await {
        let set = SetAttrs { size: s.set.size, ..SetAttrs::default() };
        let mut bits = Bitmap::default();
        if set.size.is_some() {
            bits.set(attrs::SIZE);
        }
        return Ok((a.ino, bits, false, before));
    }
    let a = match cx.c.create(dir, name, mode, true).await {
        Ok(a) => a,
        Err(e) => {
            let s = st(&e);
            if let (NFS4ERR_EXIST, Some(v)) = (s, verf)
                && let Ok(a) = cx.c.lookup(dir, name).await
                && (a.atime_ns, a.mtime_ns) == verf_times(&v)
            {
                // A retried exclusive create finds its own file.
                return Ok((a.ino, Bitmap::default(), false, before));
            }
            if s == NFS4ERR_EXIST && !exclusive {
                let a = cx.c.lookup(dir, name).await.map_err(|e| st(&e))?;
                return Ok((a.ino, Bitmap::default(), false, before));
            }
            return Err(s);
        }
    };
    let mut set = s.set.clone();
    set.mode = None;
    if let Some(v) = verf {
        let (at, mt) = verf_times(&v);
        set.atime = Some(TimeSet::AtNs(at));
        set.mtime = Some(TimeSet::AtNs(mt));
    }
    apply(cx, a.ino, set).await?;
    Ok((a.ino, s.bits, true, before))
}

async fn open(cx: &mut Ctx<'_>, access: u32, deny: u32, owner: &[u8], how: CreateHow<'_>, claim: Claim<'_>) -> Out {
    let cid = cx.clientid()?;
    let access = access & OPEN4_SHARE_ACCESS_BOTH;
    if access == 0 || deny > 3 {
        return Err(NFS4ERR_INVAL);
    }
    if let Claim::Previous(deleg) = claim
        && deleg != 0
    {
        // No delegation was ever handed out, so none can be reclaimed.
        return Err(NFS4ERR_RECLAIM_BAD);
    }
    let now = cx.gw.nfs4.now_ms();
    cx.gw.nfs4.state().check_grace(cid, matches!(claim, Claim::Previous(_)), now)?;
    let (ino, bits, created, before) = open_target(cx, &how, &claim).await?;
    let a = attr_of(cx, ino).await?;
    match a.kind {
        FileKind::File => {}
        FileKind::Dir => return Err(NFS4ERR_ISDIR),
        FileKind::Symlink => return Err(NFS4ERR_SYMLINK),
        _ => return Err(NFS4ERR_WRONG_TYPE),
    }
    // The caller's permission, checked by the MDS's open (the file then stays in the open-file cache); the
    // creator of a file may write it whatever mode it was given.
    let write = access & OPEN4_SHARE_ACCESS_WRITE != 0;
    if let Err(e) = cx.gw.files.get_for_open(&cx.c, ino, write).await {
        let s = st(&e);
        if !(created && s == NFS4ERR_ACCESS) {
            return Err(s);
        }
    }
    let stateid = cx.gw.nfs4.state().open(cid, owner, ino, access, deny)?;
    if bits.has(attrs::SIZE) && !created {
        apply(cx, ino, SetAttrs { size: Some(0), ..SetAttrs::default() }).await?;
    }
    cx.cur = Some(ino);
    cx.cur_stateid = Some(stateid);
    let mut w = Writer::new();
    put_stateid(&mut w, &stateid);
    match before {
        Some((dir, b)) => cinfo(cx, &mut w, dir, b).await,
        None => {
            w.bool(false).u64(0).u64(0);
        }
    }
    w.u32(OPEN4_RESULT_LOCKTYPE_POSIX);
    bits.encode(&mut w);
    w.u32(0); // OPEN_DELEGATE_NONE: delegations are not offered
    Ok(w)
}

async fn release_on(cx: &Ctx<'_>, ino: u64, owners: Vec<u64>) {
    for o in owners {
        if let Err(e) = cx.gw.client.release_locks(Some(ino), Some(o)).await {
            tracing::warn!(ino, owner = o, error = %e, "releasing NFSv4 locks");
        }
    }
}

async fn close(cx: &mut Ctx<'_>, stateid: Stateid) -> Out {
    let cid = cx.clientid()?;
    let id = cx.stateid(stateid);
    let (ino, owners) = cx.gw.nfs4.state().close(cid, &id)?;
    release_on(cx, ino, owners).await;
    // Close-to-open for every access path: what this client wrote is committed before CLOSE answers.
    if let Err(e) = cx.gw.files.sync_inode(ino).await {
        return Err(st(&e));
    }
    let mut w = Writer::new();
    put_stateid(&mut w, &Stateid::INVALID);
    Ok(w)
}

async fn open_file(cx: &Ctx<'_>, ino: u64, write: bool) -> Result<std::sync::Arc<weft_client::File>, u32> {
    match cx.gw.files.get(&cx.c, ino, write).await {
        Ok(f) => Ok(f),
        Err(e) => Err(match attr_of(cx, ino).await {
            Err(s) => s,
            Ok(a) if a.kind == FileKind::Dir => NFS4ERR_ISDIR,
            Ok(a) if a.kind == FileKind::Symlink => NFS4ERR_SYMLINK,
            Ok(a) if a.kind != FileKind::File => NFS4ERR_WRONG_TYPE,
            Ok(_) => st(&e),
        }),
    }
}

fn io_check(cx: &Ctx<'_>, stateid: Stateid, ino: u64, write: bool) -> Result<(), u32> {
    let id = cx.stateid(stateid);
    let cid = cx.clientid()?;
    cx.gw.nfs4.state().check_io(cid, &id, ino, write)
}

async fn read(cx: &Ctx<'_>, stateid: Stateid, offset: u64, count: u32) -> Out {
    let ino = cx.cur()?;
    io_check(cx, stateid, ino, false)?;
    let f = open_file(cx, ino, false).await?;
    cx.gw.files.send_held_by_others(ino, &f).await;
    let count = (count.min(IO_BYTES_MAX) as usize).min(cx.reply_room()) as u64;
    if offset.saturating_add(count) > f.size()
        && let Ok(a) = cx.c.getattr(ino).await
    {
        // Near the end of what the cached handle knows: another path may have written more.
        f.observe_open(&a);
    }
    let size = f.size();
    let len = size.saturating_sub(offset).min(count) as usize;
    let data = f.read_at(offset, BytesMut::zeroed(len)).await.map_err(|e| st(&e))?;
    let eof = offset + data.len() as u64 >= size;
    cx.gw.moved(ino, data.len(), 0);
    let mut w = Writer::new();
    // The data goes out as the reply's tail, from the buffer it was read into (compound.rs keeps it a tail when
    // the READ is the compound's last op, as every Linux READ is).
    w.bool(eof).opaque_tail(data.freeze());
    Ok(w)
}

async fn write(cx: &Ctx<'_>, stateid: Stateid, offset: u64, stable: u32, data: Bytes) -> Out {
    let ino = cx.cur()?;
    io_check(cx, stateid, ino, true)?;
    if offset.checked_add(data.len() as u64).is_none_or(|end| end > i64::MAX as u64) {
        return Err(NFS4ERR_FBIG);
    }
    let f = open_file(cx, ino, true).await?;
    let len = data.len() as u32;
    // Set-ID bits go before the bytes land, as knfsd's VFS drops them at a WRITE (`File::drop_set_id_before_write`).
    f.drop_set_id_before_write(&cx.c).await.map_err(|e| st(&e))?;
    // Read before the bytes go out: a loss found meanwhile (a new verifier) must not vouch for this write.
    let mut verifier = cx.gw.write_verifier();
    let wrote = f.write_at(offset, data).await;
    // Nothing read ahead while the write ran is served after it (readahead.rs).
    cx.gw.files.wrote(ino);
    wrote.map_err(|e| st(&e))?;
    cx.gw.moved(ino, 0, len as usize);
    let committed = if stable == 0 {
        0
    } else {
        cx.gw.files.verifier.synced(ino, || f.sync()).await.map_err(|e| st(&e))?;
        verifier = cx.gw.write_verifier();
        2 // FILE_SYNC4
    };
    let mut w = Writer::new();
    w.u32(len).u32(committed).fixed(&verifier);
    Ok(w)
}

async fn commit(cx: &Ctx<'_>) -> Out {
    let ino = cx.cur()?;
    let a = attr_of(cx, ino).await?;
    if a.kind == FileKind::Dir {
        return Err(NFS4ERR_ISDIR);
    }
    cx.gw.files.sync_inode(ino).await.map_err(|e| st(&e))?;
    let mut w = Writer::new();
    w.fixed(&cx.gw.write_verifier());
    Ok(w)
}

async fn readdir(cx: &Ctx<'_>, cookie: u64, verf: [u8; 8], maxcount: u32, want: &Bitmap) -> Out {
    let (ino, _) = dir_of(cx).await?;
    if cookie != 0 && verf != COOKIE_VERF {
        return Err(NFS4ERR_NOT_SAME);
    }
    if (1..=2).contains(&cookie) {
        return Err(NFS4ERR_BAD_COOKIE);
    }
    let budget = (maxcount as usize).min(cx.reply_room()).min(IO_BYTES_MAX as usize);
    let fs = fs_info(cx, want).await;
    let mut after = if cookie == 0 {
        String::new()
    } else {
        match cx.gw.cursor(ino, cookie) {
            Some(n) => n,
            None => match crate::nfs3::find_cookie(&cx.c, ino, cookie).await {
                Ok(Some(n)) => n,
                Ok(None) => return Err(NFS4ERR_BAD_COOKIE),
                Err(s) => return Err(from_v3(s)),
            },
        }
    };
    // verifier (8) + list end (4) + eof (4)
    let mut used = 16usize;
    let mut entries = Writer::new();
    let mut last: Option<(u64, String)> = None;
    let mut eof = false;
    'pages: loop {
        let page =
            cx.c.readdir_plus_page(ino, &after, weft_proto::READDIRPLUS_ENTRIES_MAX).await.map_err(|e| st(&e))?;
        if page.entries.is_empty() {
            eof = true;
            break;
        }
        for (name, mut a) in page.entries {
            cx.gw.files.overlay(&mut a);
            let c = name_cookie(&name);
            let mut e = Writer::new();
            e.bool(true).u64(c).opaque(name.as_bytes());
            attrs::encode(&mut e, want, &a, &cx.gw.sealer.seal(a.ino), &fs);
            if used + e.buf.len() > budget {
                break 'pages;
            }
            used += e.buf.len();
            entries.buf.extend_from_slice(&e.buf);
            after = name.clone();
            last = Some((c, name));
        }
        if page.eof {
            eof = true;
            break;
        }
    }
    if last.is_none() && !eof {
        return Err(NFS4ERR_TOOSMALL);
    }
    if let Some((c, name)) = &last {
        cx.gw.remember_cursor(ino, *c, name);
    }
    let mut w = Writer::new();
    w.fixed(&COOKIE_VERF);
    w.buf.extend_from_slice(&entries.buf);
    w.bool(false).bool(eof);
    Ok(w)
}

/// Linux's 32-bit dev_t encoding (new_encode_dev), which Weft's `rdev` holds.
fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

async fn create(cx: &mut Ctx<'_>, kind: CreateType<'_>, name: &str, raw: RawAttrs<'_>) -> Out {
    check_name(name)?;
    let (dir, da) = dir_of(cx).await?;
    let s = attrs::settable_from(&raw.bits, raw.list, &attrs::settable())?;
    let mode = s.set.mode;
    let res = match kind {
        CreateType::Link(target) => {
            if target.is_empty() {
                return Err(NFS4ERR_INVAL);
            }
            cx.c.symlink(dir, name, target).await
        }
        CreateType::Dev(t, ma, mi) => {
            let k = if t == NF4BLK { FileKind::BlockDev } else { FileKind::CharDev };
            cx.c.mknod(dir, name, k, mode.unwrap_or(0o644), encode_dev(ma, mi)).await
        }
        CreateType::Other(NF4DIR) => cx.c.mkdir(dir, name, mode.unwrap_or(0o755)).await,
        CreateType::Other(NF4SOCK) => cx.c.mknod(dir, name, FileKind::Socket, mode.unwrap_or(0o644), 0).await,
        CreateType::Other(NF4FIFO) => cx.c.mknod(dir, name, FileKind::Fifo, mode.unwrap_or(0o644), 0).await,
        CreateType::Other(_) => return Err(NFS4ERR_BADTYPE),
    };
    let a = res.map_err(|e| st(&e))?;
    let mut set = s.set.clone();
    set.mode = None;
    set.size = None;
    apply(cx, a.ino, set).await?;
    cx.cur = Some(a.ino);
    let mut w = Writer::new();
    cinfo(cx, &mut w, dir, attrs::change_of(&da)).await;
    let mut bits = s.bits.clone();
    if bits.has(attrs::SIZE) {
        bits.0[0] &= !(1 << attrs::SIZE);
    }
    bits.encode(&mut w);
    Ok(w)
}

async fn remove(cx: &Ctx<'_>, name: &str) -> Out {
    check_name(name)?;
    let (dir, da) = dir_of(cx).await?;
    let a = cx.c.lookup(dir, name).await.map_err(|e| st(&e))?;
    let r = if a.kind == FileKind::Dir { cx.c.rmdir(dir, name).await } else { cx.c.unlink(dir, name).await };
    r.map_err(|e| st(&e))?;
    if a.kind == FileKind::File {
        cx.gw.layouts_changed(a.ino, super::recall::Why::Remove);
    }
    let mut w = Writer::new();
    cinfo(cx, &mut w, dir, attrs::change_of(&da)).await;
    Ok(w)
}

async fn rename(cx: &Ctx<'_>, from: &str, to: &str) -> Out {
    check_name(from)?;
    check_name(to)?;
    let src = cx.saved.ok_or(NFS4ERR_NOFILEHANDLE)?;
    let (dst, dda) = dir_of(cx).await?;
    let sa = attr_of(cx, src).await?;
    if sa.kind != FileKind::Dir {
        return Err(NFS4ERR_NOTDIR);
    }
    let over = cx.gw.replaced_file(&cx.c, dst, to).await;
    cx.c.rename(src, from, dst, to, 0).await.map_err(|e| st(&e))?;
    if let Some(ino) = over {
        cx.gw.layouts_changed(ino, super::recall::Why::Remove);
    }
    let mut w = Writer::new();
    cinfo(cx, &mut w, src, attrs::change_of(&sa)).await;
    cinfo(cx, &mut w, dst, attrs::change_of(&dda)).await;
    Ok(w)
}

async fn link(cx: &Ctx<'_>, name: &str) -> Out {
    check_name(name)?;
    let src = cx.saved.ok_or(NFS4ERR_NOFILEHANDLE)?;
    let (dir, da) = dir_of(cx).await?;
    let sa = attr_of(cx, src).await?;
    if sa.kind == FileKind::Dir {
        return Err(NFS4ERR_ISDIR);
    }
    cx.c.link(src, dir, name).await.map_err(|e| st(&e))?;
    let mut w = Writer::new();
    cinfo(cx, &mut w, dir, attrs::change_of(&da)).await;
    Ok(w)
}

/// An NFSv4 (offset, length) as the MDS's inclusive range; length 0 or past 2^64 is INVAL.
fn lock_range(offset: u64, length: u64) -> Result<(u64, u64), u32> {
    if length == 0 {
        return Err(NFS4ERR_INVAL);
    }
    if length == u64::MAX {
        return Ok((offset, u64::MAX));
    }
    offset.checked_add(length - 1).map(|end| (offset, end)).ok_or(NFS4ERR_INVAL)
}

fn lock_kind(locktype: u32) -> LockKind {
    if locktype == READ_LT || locktype == READW_LT { LockKind::Shared } else { LockKind::Exclusive }
}

/// LOCK4denied from the MDS's holder (its owner is another session's, so it is named only as "another").
fn denied(h: &weft_proto::msg::LockHolder) -> Writer {
    let mut w = Writer::new();
    let length = if h.end == u64::MAX { u64::MAX } else { h.end - h.start + 1 };
    w.u64(h.start).u64(length).u32(if h.kind == LockKind::Shared { READ_LT } else { WRITE_LT });
    w.u64(0).opaque(b"");
    w
}

/// A LOCK or LOCKT answer: DENIED carries LOCK4denied, other failures nothing.
fn with_denied(r: Out, denied: Option<Writer>) -> (u32, Writer) {
    match r {
        Ok(w) => (NFS4_OK, w),
        Err(NFS4ERR_DENIED) => (NFS4ERR_DENIED, denied.unwrap_or_default()),
        Err(s) => (s, Writer::new()),
    }
}

async fn lock(
    cx: &mut Ctx<'_>,
    locktype: u32,
    reclaim: bool,
    offset: u64,
    length: u64,
    locker: Locker<'_>,
    denied_body: &mut Option<Writer>,
) -> Out {
    let cid = cx.clientid()?;
    let ino = cx.cur()?;
    let (start, end) = lock_range(offset, length)?;
    let now = cx.gw.nfs4.now_ms();
    let (id, lino, mds_owner, new) = {
        let mut st = cx.gw.nfs4.state();
        st.check_grace(cid, reclaim, now)?;
        match locker {
            Locker::New { open, owner, .. } => {
                let open = cx.stateid(open);
                let (id, lino, o) = st.lock_stateid_new(cid, &open, owner)?;
                (id, lino, o, true)
            }
            Locker::Existing { lock, .. } => {
                let id = cx.stateid(lock);
                let (lino, o) = st.lock_stateid(cid, &id)?;
                st.lock_pending(&id.other);
                (id, lino, o, false)
            }
        }
    };
    if lino != ino {
        return Err(NFS4ERR_BAD_STATEID);
    }
    let req = SetLockReq {
        ino,
        class: LockClass::Posix,
        kind: Some(lock_kind(locktype)),
        start,
        end,
        owner: mds_owner,
        pid: 0,
    };
    match cx.c.set_lock(req).await {
        Ok(None) => {
            if reclaim {
                cx.gw.nfs4.reclaimed(ino, mds_owner, start, end);
            }
            cx.gw.session_check();
            let s = cx.gw.nfs4.state().lock_granted(&id);
            cx.cur_stateid = Some(s);
            let mut w = Writer::new();
            put_stateid(&mut w, &s);
            Ok(w)
        }
        Ok(Some(holder)) => {
            if new {
                cx.gw.nfs4.state().lock_refused(&id);
            }
            *denied_body = Some(denied(&holder));
            Err(NFS4ERR_DENIED)
        }
        Err(e) => {
            if new {
                cx.gw.nfs4.state().lock_refused(&id);
            }
            Err(st(&e))
        }
    }
}

async fn lockt(
    cx: &Ctx<'_>,
    locktype: u32,
    offset: u64,
    length: u64,
    owner: &[u8],
    denied_body: &mut Option<Writer>,
) -> Out {
    let cid = cx.clientid()?;
    let ino = cx.cur()?;
    let (start, end) = lock_range(offset, length)?;
    // The owner's own locks (also ones adopted from the previous gateway process) never conflict with it.
    let mds_owner = cx.gw.nfs4.state().lock_owner_id(cid, owner);
    let req = GetLockReq { ino, class: LockClass::Posix, kind: lock_kind(locktype), start, end, owner: mds_owner };
    match cx.c.get_lock(req).await.map_err(|e| st(&e))? {
        None => Ok(Writer::new()),
        Some(h) => {
            *denied_body = Some(denied(&h));
            Err(NFS4ERR_DENIED)
        }
    }
}

async fn locku(cx: &mut Ctx<'_>, stateid: Stateid, offset: u64, length: u64) -> Out {
    let cid = cx.clientid()?;
    let id = cx.stateid(stateid);
    let (ino, mds_owner) = cx.gw.nfs4.state().lock_stateid(cid, &id)?;
    let (start, end) = lock_range(offset, length)?;
    let req = SetLockReq { ino, class: LockClass::Posix, kind: None, start, end, owner: mds_owner, pid: 0 };
    cx.c.set_lock(req).await.map_err(|e| st(&e))?;
    let mut state = cx.gw.nfs4.state();
    if (start, end) == (0, u64::MAX) {
        state.lock_unlocked_all(&id.other);
    }
    let s = state.lock_granted(&id);
    drop(state);
    let mut w = Writer::new();
    put_stateid(&mut w, &s);
    Ok(w)
}

async fn free_stateid(cx: &Ctx<'_>, id: Stateid) -> Out {
    let cid = cx.clientid()?;
    cx.gw.nfs4.state().free(cid, &id)?;
    Ok(Writer::new())
}
