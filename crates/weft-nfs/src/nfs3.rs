//! NFSv3 procedures (RFC 1813 §3.3): each decodes its arguments ([`crate::proto`]), runs as the caller through
//! the client library, and answers the status RFC 1813 and POSIX name ([`crate::status`]) with the attributes
//! and WCC data the RFC places in both the success and the failure arm.
//!
//! Directory WCC data is sent empty (no pre- or post-op attributes), which RFC 1813 allows: a client then
//! revalidates the directory, at the cost of a GETATTR, instead of trusting attributes the gateway would have to
//! fetch with an extra MDS round trip on every namespace change.

use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use weft_client::Client;
use weft_proto::{Attr, FileKind, NAME_BYTES_MAX, SetAttrs, TimeSet};

use crate::fh::FhError;
use crate::proto::*;
use crate::readahead::Served;
use crate::rpc::{self, Call};
use crate::status::*;
use crate::xdr::Writer;
use crate::{Gateway, Transport};

/// The cookie verifier of every READDIR: cookies are name hashes, valid whatever changed in between, so the
/// verifier never needs to change; a client echoing another one gets NFS3ERR_BAD_COOKIE.
pub const COOKIE_VERF: Verf = *b"weftnfs1";
const COOKIE_DOT: u64 = 1;
const COOKIE_DOTDOT: u64 = 2;

/// ACCESS3 bits.
pub const ACCESS3_READ: u32 = 0x01;
pub const ACCESS3_LOOKUP: u32 = 0x02;
pub const ACCESS3_MODIFY: u32 = 0x04;
pub const ACCESS3_EXTEND: u32 = 0x08;
pub const ACCESS3_DELETE: u32 = 0x10;
pub const ACCESS3_EXECUTE: u32 = 0x20;

/// A procedure's outcome: the status, then the arm's body (the failure arm's body too).
type Out = (u32, Writer);

/// Runs one NFSv3 call; returns the reply message (a READ's data as its tail, not copied).
pub async fn call(gw: &Gateway, call: &Call<'_>, rec: &Bytes, peer: SocketAddr) -> rpc::Reply {
    let args = match decode_args(call.proc_, call.args) {
        Ok(a) => a,
        Err(ArgsError::NoProc(p)) => {
            tracing::info!(%peer, proc = p, "NFSv3 procedure unavailable");
            return rpc::accepted(call.xid, rpc::PROC_UNAVAIL).buf.into();
        }
        Err(ArgsError::Garbage(e)) => {
            tracing::info!(%peer, proc = call.proc_, error = %e, "NFSv3 arguments malformed");
            return rpc::accepted(call.xid, rpc::GARBAGE_ARGS).buf.into();
        }
    };
    let client = gw.client_for(&call.auth);
    tracing::trace!(%peer, xid = call.xid, proc = call.proc_, "NFSv3 call");
    let (stat, body) = run(gw, &client, args, rec, call.transport).await;
    if stat != NFS3_OK {
        tracing::debug!(%peer, proc = call.proc_, status = status_name(stat), "NFSv3 error");
    }
    let mut w = rpc::accepted(call.xid, rpc::SUCCESS);
    if call.proc_ != 0 {
        w.u32(stat);
    }
    w.buf.extend_from_slice(&body.buf);
    rpc::Reply { head: w.buf, tail: body.tail }
}

async fn run(gw: &Gateway, c: &Client, args: Args<'_>, rec: &Bytes, transport: Transport) -> Out {
    match args {
        Args::Null => (NFS3_OK, Writer::new()),
        Args::GetAttr(fh) => getattr(gw, c, fh).await,
        Args::SetAttr { fh, sattr, guard } => setattr(gw, c, fh, sattr, guard).await,
        Args::Lookup(at) => lookup(gw, c, at).await,
        Args::Access { fh, mask } => access(gw, c, fh, mask).await,
        Args::Readlink(fh) => readlink(gw, c, fh).await,
        Args::Read { fh, offset, count } => read(gw, c, fh, offset, count, transport).await,
        Args::Write { fh, offset, count, stable, data } => {
            write(gw, c, fh, offset, count, stable, rec.slice_ref(data)).await
        }
        Args::Create { at, how } => create(gw, c, at, how).await,
        Args::Mkdir { at, sattr } => make(gw, c, at, Make::Dir(sattr)).await,
        Args::Symlink { at, sattr, target } => make(gw, c, at, Make::Symlink(sattr, target)).await,
        Args::Mknod { at, what } => make(gw, c, at, Make::Node(what)).await,
        Args::Remove(at) => remove(gw, c, at, false).await,
        Args::Rmdir(at) => remove(gw, c, at, true).await,
        Args::Rename { from, to } => rename(gw, c, from, to).await,
        Args::Link { fh, to } => link(gw, c, fh, to).await,
        Args::Readdir { fh, cookie, verf, count } => readdir(gw, c, fh, cookie, verf, count, None).await,
        Args::ReaddirPlus { fh, cookie, verf, dircount, maxcount } => {
            readdir(gw, c, fh, cookie, verf, maxcount, Some(dircount)).await
        }
        Args::Fsstat(fh) => fsstat(gw, c, fh).await,
        Args::Fsinfo(fh) => fsinfo(gw, c, fh).await,
        Args::Pathconf(fh) => pathconf(gw, c, fh).await,
        Args::Commit { fh, .. } => commit(gw, c, fh).await,
    }
}

// ---- helpers ---------------------------------------------------------------------------------------------------

/// The inode a handle names, or BADHANDLE (malformed, forged) / STALE (another export).
fn ino_of(gw: &Gateway, fh: &[u8]) -> Result<u64, u32> {
    match gw.sealer.open(fh) {
        Ok(h) => Ok(h.ino),
        Err(FhError::OtherExport) => Err(NFS3ERR_STALE),
        Err(e) => {
            tracing::info!(error = %e, "refused a filehandle");
            Err(NFS3ERR_BADHANDLE)
        }
    }
}

/// Fresh attributes of a handle's inode (with the gateway's uncommitted writes); a removed inode is STALE.
async fn attr_of(gw: &Gateway, c: &Client, ino: u64) -> Result<Attr, u32> {
    match c.getattr(ino).await {
        Ok(mut a) => {
            gw.files.overlay(&mut a);
            Ok(a)
        }
        Err(e) => Err(stale_if_gone(status_of(&e))),
    }
}

fn stale_if_gone(s: u32) -> u32 {
    if s == NFS3ERR_NOENT { NFS3ERR_STALE } else { s }
}

/// The status of a failed operation on a name in `dir`: NOENT stays NOENT (the name is missing) unless `dir`
/// itself is gone, which is STALE.
async fn name_status(gw: &Gateway, c: &Client, dir: u64, s: u32) -> u32 {
    if s == NFS3ERR_NOENT && attr_of(gw, c, dir).await == Err(NFS3ERR_STALE) { NFS3ERR_STALE } else { s }
}

fn fail(stat: u32, body: impl FnOnce(&mut Writer)) -> Out {
    let mut w = Writer::new();
    body(&mut w);
    (stat, w)
}

fn check_name(name: &str) -> Result<(), u32> {
    if name.len() > NAME_BYTES_MAX {
        return Err(NFS3ERR_NAMETOOLONG);
    }
    if name.is_empty() || name.contains('/') || name.contains('\0') {
        return Err(NFS3ERR_INVAL);
    }
    Ok(())
}

fn time_set(t: TimeHow) -> Option<TimeSet> {
    match t {
        TimeHow::DontChange => None,
        TimeHow::ServerTime => Some(TimeSet::Now),
        TimeHow::ClientTime(s, ns) => Some(TimeSet::AtNs(time_ns(s, ns))),
    }
}

fn set_attrs(s: &Sattr) -> SetAttrs {
    SetAttrs {
        mode: s.mode.map(|m| m & 0o7777),
        uid: s.uid,
        gid: s.gid,
        size: s.size,
        atime: time_set(s.atime),
        mtime: time_set(s.mtime),
    }
}

fn is_empty(s: &SetAttrs) -> bool {
    *s == SetAttrs::default()
}

// ---- procedures ------------------------------------------------------------------------------------------------

async fn getattr(gw: &Gateway, c: &Client, fh: &[u8]) -> Out {
    let ino = match ino_of(gw, fh) {
        Ok(i) => i,
        Err(s) => return fail(s, |_| {}),
    };
    match attr_of(gw, c, ino).await {
        Ok(a) => fail(NFS3_OK, |w| fattr(w, &a, gw.fsid)),
        Err(s) => fail(s, |_| {}),
    }
}

async fn setattr(gw: &Gateway, c: &Client, fh: &[u8], sattr: Sattr, guard: Option<(u32, u32)>) -> Out {
    let ino = match ino_of(gw, fh) {
        Ok(i) => i,
        Err(s) => return fail(s, |w| wcc_data(w, None, None, 0)),
    };
    let pre = match attr_of(gw, c, ino).await {
        Ok(a) => a,
        Err(s) => return fail(s, |w| wcc_data(w, None, None, 0)),
    };
    let fsid = gw.fsid;
    if let Some((sec, nsec)) = guard
        && time_ns(sec, nsec) != pre.ctime_ns
    {
        return fail(NFS3ERR_NOT_SYNC, |w| wcc_data(w, Some(PreOp::of(&pre)), Some(&pre), fsid));
    }
    let set = set_attrs(&sattr);
    if set.size.is_some() {
        if pre.kind == FileKind::Dir {
            return fail(NFS3ERR_ISDIR, |w| wcc_data(w, Some(PreOp::of(&pre)), Some(&pre), fsid));
        }
        // Uncommitted writes first, so the commit cannot raise the size back past the new one.
        if let Err(e) = gw.files.close_inode(ino).await {
            tracing::warn!(ino, error = %e, "syncing before a size change");
        }
    }
    if is_empty(&set) {
        return fail(NFS3_OK, |w| wcc_data(w, Some(PreOp::of(&pre)), Some(&pre), fsid));
    }
    let why = crate::nfs4::recall::changes_of(&set, &pre);
    let res = c.nfs_setattr(ino, set).await;
    gw.files.wrote(ino);
    // pNFS layouts of the file (NFSv4.1 clients) depend on its size and access: recalled.
    if let (Ok(_), Some(why)) = (&res, why) {
        gw.layouts_changed(ino, why);
    }
    match res {
        Ok(post) => fail(NFS3_OK, |w| wcc_data(w, Some(PreOp::of(&pre)), Some(&post), fsid)),
        Err(e) => fail(status_of(&e), |w| wcc_data(w, Some(PreOp::of(&pre)), Some(&pre), fsid)),
    }
}

async fn lookup(gw: &Gateway, c: &Client, at: DirOp<'_>) -> Out {
    let dir = match ino_of(gw, at.dir) {
        Ok(i) => i,
        Err(s) => return fail(s, |w| post_op_attr(w, None, 0)),
    };
    if let Err(s) = check_name(at.name) {
        return fail(s, |w| post_op_attr(w, None, 0));
    }
    let found = if at.name == "." || (at.name == ".." && dir == gw.export_ino) {
        // The export's root is its own parent: a client cannot climb out of the export.
        attr_of(gw, c, dir).await
    } else {
        match c.lookup(dir, at.name).await {
            Ok(mut a) => {
                gw.files.overlay(&mut a);
                Ok(a)
            }
            Err(e) => {
                let s = status_of(&e);
                // The directory itself gone is STALE, not NOENT.
                if s == NFS3ERR_NOENT && attr_of(gw, c, dir).await == Err(NFS3ERR_STALE) {
                    Err(NFS3ERR_STALE)
                } else {
                    Err(s)
                }
            }
        }
    };
    match found {
        Ok(a) => fail(NFS3_OK, |w| {
            w.opaque(&gw.sealer.seal(a.ino));
            post_op_attr(w, Some(&a), gw.fsid);
            post_op_attr(w, None, 0);
        }),
        Err(s) => fail(s, |w| post_op_attr(w, None, 0)),
    }
}

/// The ACCESS3 bits `user` has on `a` by its mode bits (the MDS decides every real operation, ACLs included;
/// this answer only guides the client's cache).
pub fn access_bits(a: &Attr, user: &weft_proto::UserCred, mask: u32) -> u32 {
    let (r, wr, x) = if user.uid == 0 {
        (true, true, a.kind == FileKind::Dir || a.mode & 0o111 != 0)
    } else {
        let class = if user.uid == a.uid {
            a.mode >> 6
        } else if user.gid == a.gid || user.groups.contains(&a.gid) {
            a.mode >> 3
        } else {
            a.mode
        };
        (class & 4 != 0, class & 2 != 0, class & 1 != 0)
    };
    let mut bits = 0;
    if r {
        bits |= ACCESS3_READ;
    }
    if wr {
        bits |= ACCESS3_MODIFY | ACCESS3_EXTEND;
        if a.kind == FileKind::Dir {
            bits |= ACCESS3_DELETE;
        }
    }
    if x {
        bits |= if a.kind == FileKind::Dir { ACCESS3_LOOKUP } else { ACCESS3_EXECUTE };
    }
    bits & mask
}

async fn access(gw: &Gateway, c: &Client, fh: &[u8], mask: u32) -> Out {
    let ino = match ino_of(gw, fh) {
        Ok(i) => i,
        Err(s) => return fail(s, |w| post_op_attr(w, None, 0)),
    };
    match attr_of(gw, c, ino).await {
        Ok(a) => fail(NFS3_OK, |w| {
            post_op_attr(w, Some(&a), gw.fsid);
            w.u32(access_bits(&a, c.user(), mask));
        }),
        Err(s) => fail(s, |w| post_op_attr(w, None, 0)),
    }
}

async fn readlink(gw: &Gateway, c: &Client, fh: &[u8]) -> Out {
    let ino = match ino_of(gw, fh) {
        Ok(i) => i,
        Err(s) => return fail(s, |w| post_op_attr(w, None, 0)),
    };
    let a = match attr_of(gw, c, ino).await {
        Ok(a) => a,
        Err(s) => return fail(s, |w| post_op_attr(w, None, 0)),
    };
    if a.kind != FileKind::Symlink {
        return fail(NFS3ERR_INVAL, |w| post_op_attr(w, Some(&a), gw.fsid));
    }
    match c.readlink(ino).await {
        Ok(t) => fail(NFS3_OK, |w| {
            post_op_attr(w, Some(&a), gw.fsid);
            w.opaque(t.as_bytes());
        }),
        Err(e) => fail(stale_if_gone(status_of(&e)), |w| post_op_attr(w, Some(&a), gw.fsid)),
    }
}

/// The status of a failed open: a directory is ISDIR, another non-file INVAL, a removed file STALE.
async fn open_status(gw: &Gateway, c: &Client, ino: u64, e: &weft_client::ClientError) -> u32 {
    match attr_of(gw, c, ino).await {
        Err(s) => s,
        Ok(a) if a.kind == FileKind::Dir => NFS3ERR_ISDIR,
        Ok(a) if a.kind != FileKind::File => NFS3ERR_INVAL,
        Ok(_) => status_of(e),
    }
}

async fn read(gw: &Gateway, c: &Client, fh: &[u8], offset: u64, count: u32, transport: Transport) -> Out {
    let ino = match ino_of(gw, fh) {
        Ok(i) => i,
        Err(s) => return fail(s, |w| post_op_attr(w, None, 0)),
    };
    let f = match gw.files.get(c, ino, false).await {
        Ok(f) => f,
        Err(e) => return fail(open_status(gw, c, ino, &e).await, |w| post_op_attr(w, None, 0)),
    };
    gw.files.send_held_by_others(ino, &f).await;
    let count = count.min(IO_BYTES_MAX) as u64;
    if offset.saturating_add(count) > f.size() {
        // Near the end of what this handle knows: another path may have written more since it was opened.
        if let Ok(a) = c.getattr(ino).await {
            gw.files.ahead.drop_inode(ino);
            f.observe_open(&a);
        }
    }
    let size = f.size();
    let len = size.saturating_sub(offset).min(count) as usize;
    let data = match gw.files.ahead.read(&f, c.user(), offset, len, count, size).await {
        Served::Ahead(d) => d,
        Served::Miss => match f.read_at(offset, BytesMut::zeroed(len)).await {
            Ok(d) => d.freeze(),
            Err(e) => return fail(status_of(&e), |w| post_op_attr(w, None, 0)),
        },
    };
    let eof = offset + data.len() as u64 >= size;
    // Over RDMA the Linux client places a READ's data (sent by RDMA WRITE) after a reply head of the size it
    // reserved, which assumes attributes: a reply without them shifts the data by their 84 bytes. So over RDMA
    // the reply carries fresh attributes (from the lease cache while the gateway holds leases, else an MDS round
    // trip per READ; see below why not the ones this handle cached).
    let fresh = match transport {
        Transport::Rdma => match c.getattr(ino).await {
            Ok(a) => Some(a),
            Err(e) => return fail(status_of(&e), |w| post_op_attr(w, None, 0)),
        },
        _ => None,
    };
    gw.moved(ino, data.len(), 0);
    fail(NFS3_OK, |w| {
        if let Some(a) = &fresh {
            post_op_attr(w, Some(a), gw.fsid);
            w.u32(data.len() as u32).bool(eof);
            w.opaque_tail(data);
            return;
        }
        // No attributes: the cached handle's are those of its open (mode, times, owner may have changed since
        // by SETATTR), and a client takes what a reply carries as fresh: the Linux client then saw a chmod and
        // a utimes undone by its next READ (tar's "file changed as we read it"). Asking the MDS per READ costs
        // a round trip; without attributes the client asks by GETATTR when it needs them.
        post_op_attr(w, None, 0);
        w.u32(data.len() as u32).bool(eof);
        w.opaque_tail(data);
    })
}

async fn write(gw: &Gateway, c: &Client, fh: &[u8], offset: u64, count: u32, stable: u32, data: Bytes) -> Out {
    let no_wcc = |w: &mut Writer| wcc_data(w, None, None, 0);
    let ino = match ino_of(gw, fh) {
        Ok(i) => i,
        Err(s) => return fail(s, no_wcc),
    };
    if data.len() != count as usize {
        return fail(NFS3ERR_INVAL, no_wcc);
    }
    if offset.checked_add(data.len() as u64).is_none_or(|end| end > i64::MAX as u64) {
        return fail(NFS3ERR_FBIG, no_wcc);
    }
    let f = match gw.files.get(c, ino, true).await {
        Ok(f) => f,
        Err(e) => return fail(open_status(gw, c, ino, &e).await, no_wcc),
    };
    let len = data.len() as u32;
    // Set-ID bits go before the bytes land, as knfsd's VFS drops them at a WRITE (`File::drop_set_id_before_write`).
    if let Err(e) = f.drop_set_id_before_write(c).await {
        return fail(status_of(&e), no_wcc);
    }
    // The cached handle's attributes are those of its open, not the file's now (see READ): WCC data comes only
    // from the MDS's answer to a commit, else none (RFC 1813 lets both halves be absent).
    // Read before the bytes go out: a loss found meanwhile (a new verifier) must not vouch for this write.
    let unstable_verifier = gw.write_verifier();
    let wrote = f.write_at(offset, data).await;
    // Nothing read ahead while the write ran is served after it (readahead.rs).
    gw.files.wrote(ino);
    if let Err(e) = wrote {
        return fail(status_of(&e), no_wcc);
    }
    gw.moved(ino, 0, len as usize);
    let (committed, post, verifier) = if stable == STABLE_UNSTABLE {
        (STABLE_UNSTABLE, None, unstable_verifier)
    } else {
        // DATA_SYNC and FILE_SYNC: durable and visible before the reply.
        match gw.files.verifier.synced(ino, || f.sync_wcc()).await {
            Ok(r) => (STABLE_FILE_SYNC, r.map(|r| r.attr), gw.write_verifier()),
            Err(e) => return fail(status_of(&e), no_wcc),
        }
    };
    let post = post.map(|mut a| {
        gw.files.overlay(&mut a);
        a
    });
    fail(NFS3_OK, |w| {
        wcc_data(w, None, post.as_ref(), gw.fsid);
        w.u32(len).u32(committed).fixed(&verifier);
    })
}

/// The success arm of CREATE, MKDIR, SYMLINK and MKNOD.
fn created(gw: &Gateway, a: &Attr) -> Out {
    fail(NFS3_OK, |w| {
        post_op_fh(w, Some(&gw.sealer.seal(a.ino)));
        post_op_attr(w, Some(a), gw.fsid);
        wcc_data(w, None, None, 0);
    })
}

fn dir_fail(s: u32) -> Out {
    fail(s, |w| wcc_data(w, None, None, 0))
}

/// The verifier of an EXCLUSIVE create, kept as knfsd does in the new file's times: bytes 0..4 the atime's
/// seconds, 4..8 the mtime's, until the client's SETATTR after the create replaces them.
fn verf_times(v: &Verf) -> (i64, i64) {
    let a = u32::from_be_bytes(v[..4].try_into().expect("4")) as i64;
    let m = u32::from_be_bytes(v[4..].try_into().expect("4")) as i64;
    (a * 1_000_000_000, m * 1_000_000_000)
}

async fn create(gw: &Gateway, c: &Client, at: DirOp<'_>, how: CreateHow) -> Out {
    let dir = match ino_of(gw, at.dir) {
        Ok(i) => i,
        Err(s) => return dir_fail(s),
    };
    if let Err(s) = check_name(at.name) {
        return dir_fail(s);
    }
    let (sattr, exclusive, verf) = match &how {
        CreateHow::Unchecked(s) => (s.clone(), false, None),
        CreateHow::Guarded(s) => (s.clone(), true, None),
        CreateHow::Exclusive(v) => (Sattr::default(), true, Some(*v)),
    };
    let mode = sattr.mode.unwrap_or(0o644) & 0o7777;
    let a = match c.create(dir, at.name, mode, exclusive).await {
        Ok(a) => a,
        Err(e) => {
            let s = status_of(&e);
            if let (NFS3ERR_EXIST, Some(v)) = (s, verf) {
                // A retransmitted EXCLUSIVE create finds its own file by the verifier.
                if let Ok(a) = c.lookup(dir, at.name).await
                    && (a.atime_ns, a.mtime_ns) == verf_times(&v)
                {
                    return created(gw, &a);
                }
            }
            return dir_fail(name_status(gw, c, dir, s).await);
        }
    };
    let mut set = set_attrs(&sattr);
    set.mode = None;
    if let Some(v) = verf {
        let (at_ns, mt_ns) = verf_times(&v);
        set.atime = Some(TimeSet::AtNs(at_ns));
        set.mtime = Some(TimeSet::AtNs(mt_ns));
    }
    if set.size.is_some()
        && let Err(e) = gw.files.close_inode(a.ino).await
    {
        tracing::warn!(ino = a.ino, error = %e, "syncing before a size change");
    }
    if is_empty(&set) {
        return created(gw, &a);
    }
    match c.nfs_setattr(a.ino, set).await {
        Ok(a) => created(gw, &a),
        Err(e) => dir_fail(status_of(&e)),
    }
}

enum Make<'a> {
    Dir(Sattr),
    Symlink(Sattr, &'a str),
    Node(MknodWhat),
}

/// Linux's 32-bit dev_t encoding (new_encode_dev), which Weft's `rdev` holds.
fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

async fn make(gw: &Gateway, c: &Client, at: DirOp<'_>, what: Make<'_>) -> Out {
    let dir = match ino_of(gw, at.dir) {
        Ok(i) => i,
        Err(s) => return dir_fail(s),
    };
    if let Err(s) = check_name(at.name) {
        return dir_fail(s);
    }
    let (res, sattr) = match what {
        Make::Dir(s) => (c.mkdir(dir, at.name, s.mode.unwrap_or(0o755) & 0o7777).await, s),
        Make::Symlink(s, target) => {
            if target.is_empty() {
                return dir_fail(NFS3ERR_INVAL);
            }
            (c.symlink(dir, at.name, target).await, Sattr { mode: None, ..s })
        }
        Make::Node(MknodWhat::Bad(_)) => return dir_fail(NFS3ERR_BADTYPE),
        Make::Node(n) => {
            let (kind, s, rdev) = match n {
                MknodWhat::Chr(s, ma, mi) => (FileKind::CharDev, s, encode_dev(ma, mi)),
                MknodWhat::Blk(s, ma, mi) => (FileKind::BlockDev, s, encode_dev(ma, mi)),
                MknodWhat::Sock(s) => (FileKind::Socket, s, 0),
                MknodWhat::Fifo(s) => (FileKind::Fifo, s, 0),
                MknodWhat::Bad(_) => unreachable!("handled above"),
            };
            (c.mknod(dir, at.name, kind, s.mode.unwrap_or(0o644) & 0o7777, rdev).await, s)
        }
    };
    let a = match res {
        Ok(a) => a,
        Err(e) => return dir_fail(name_status(gw, c, dir, status_of(&e)).await),
    };
    let mut set = set_attrs(&sattr);
    set.mode = None;
    set.size = None;
    if is_empty(&set) {
        return created(gw, &a);
    }
    match c.nfs_setattr(a.ino, set).await {
        Ok(a) => created(gw, &a),
        Err(e) => dir_fail(status_of(&e)),
    }
}

async fn remove(gw: &Gateway, c: &Client, at: DirOp<'_>, dir_wanted: bool) -> Out {
    let dir = match ino_of(gw, at.dir) {
        Ok(i) => i,
        Err(s) => return dir_fail(s),
    };
    if let Err(s) = check_name(at.name) {
        return dir_fail(s);
    }
    let res = if dir_wanted {
        match at.name {
            "." => return dir_fail(NFS3ERR_INVAL),
            ".." => return dir_fail(NFS3ERR_EXIST),
            _ => c.rmdir(dir, at.name).await,
        }
    } else {
        let gone = gw.replaced_file(c, dir, at.name).await;
        let r = c.unlink(dir, at.name).await;
        if let (Ok(()), Some(ino)) = (&r, gone) {
            gw.layouts_changed(ino, crate::nfs4::recall::Why::Remove);
        }
        r
    };
    match res {
        Ok(()) => dir_fail(NFS3_OK),
        Err(e) => dir_fail(name_status(gw, c, dir, status_of(&e)).await),
    }
}

async fn rename(gw: &Gateway, c: &Client, from: DirOp<'_>, to: DirOp<'_>) -> Out {
    let two = |s| {
        fail(s, |w| {
            wcc_data(w, None, None, 0);
            wcc_data(w, None, None, 0);
        })
    };
    let (src, dst) = match (ino_of(gw, from.dir), ino_of(gw, to.dir)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(s), _) | (_, Err(s)) => return two(s),
    };
    for name in [from.name, to.name] {
        if let Err(s) = check_name(name) {
            return two(s);
        }
        if name == "." || name == ".." {
            return two(NFS3ERR_INVAL);
        }
    }
    let over = gw.replaced_file(c, dst, to.name).await;
    match c.rename(src, from.name, dst, to.name, 0).await {
        Ok(()) => {
            if let Some(ino) = over {
                gw.layouts_changed(ino, crate::nfs4::recall::Why::Remove);
            }
            two(NFS3_OK)
        }
        Err(e) => {
            let s = name_status(gw, c, src, status_of(&e)).await;
            two(if s == NFS3ERR_NOENT { name_status(gw, c, dst, s).await } else { s })
        }
    }
}

async fn link(gw: &Gateway, c: &Client, fh: &[u8], to: DirOp<'_>) -> Out {
    let out = |s, a: Option<&Attr>, fsid| {
        fail(s, |w| {
            post_op_attr(w, a, fsid);
            wcc_data(w, None, None, 0);
        })
    };
    let (ino, dir) = match (ino_of(gw, fh), ino_of(gw, to.dir)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(s), _) | (_, Err(s)) => return out(s, None, 0),
    };
    if let Err(s) = check_name(to.name) {
        return out(s, None, 0);
    }
    match c.link(ino, dir, to.name).await {
        Ok(a) => out(NFS3_OK, Some(&a), gw.fsid),
        Err(e) => {
            let s = name_status(gw, c, ino, status_of(&e)).await;
            out(if s == NFS3ERR_NOENT { name_status(gw, c, dir, s).await } else { s }, None, 0)
        }
    }
}

/// A name's cookie: FNV-1a 64 with the top bit set, so it never collides with 0 (start), 1 (".") or 2 ("..");
/// the same on every gateway and after restarts.
pub fn name_cookie(name: &str) -> u64 {
    weft_client::name_hash(name) | 1 << 63
}

/// One listed entry: name, inode, and its attributes when READDIRPLUS has them.
struct Item {
    name: String,
    ino: u64,
    attr: Option<Attr>,
    cookie: u64,
}

/// READDIR (`dircount` None) and READDIRPLUS: entries after `cookie`, as many as fit `count` bytes.
async fn readdir(
    gw: &Gateway,
    c: &Client,
    fh: &[u8],
    cookie: u64,
    verf: Verf,
    count: u32,
    dircount: Option<u32>,
) -> Out {
    let plus = dircount.is_some();
    let ino = match ino_of(gw, fh) {
        Ok(i) => i,
        Err(s) => return fail(s, |w| post_op_attr(w, None, 0)),
    };
    let dir = match attr_of(gw, c, ino).await {
        Ok(a) => a,
        Err(s) => return fail(s, |w| post_op_attr(w, None, 0)),
    };
    let fsid = gw.fsid;
    if dir.kind != FileKind::Dir {
        return fail(NFS3ERR_NOTDIR, |w| post_op_attr(w, Some(&dir), fsid));
    }
    if cookie != 0 && verf != COOKIE_VERF && verf != [0; 8] {
        return fail(NFS3ERR_BAD_COOKIE, |w| post_op_attr(w, Some(&dir), fsid));
    }
    // The reply so far: status (4), post_op_attr (4 + 84), verifier (8), list end (4), eof (4).
    let overhead = 4 + 88 + 8 + 8;
    let count = (count as usize).min(IO_BYTES_MAX as usize);
    let dircount = dircount.map_or(usize::MAX, |d| d as usize);
    let mut items: Vec<Item> = Vec::new();
    if cookie == 0 {
        items.push(Item { name: ".".into(), ino, attr: Some(dir.clone()), cookie: COOKIE_DOT });
    }
    if cookie <= COOKIE_DOT {
        let parent = if ino == gw.export_ino { Ok(dir.clone()) } else { c.lookup(ino, "..").await };
        match parent {
            Ok(p) => items.push(Item { name: "..".into(), ino: p.ino, attr: Some(p), cookie: COOKIE_DOTDOT }),
            Err(e) => return fail(status_of(&e), |w| post_op_attr(w, Some(&dir), fsid)),
        }
    }
    let mut after = if cookie <= COOKIE_DOTDOT {
        String::new()
    } else {
        match gw.cursor(ino, cookie) {
            Some(n) => n,
            None => match find_cookie(c, ino, cookie).await {
                Ok(Some(n)) => n,
                Ok(None) => return fail(NFS3ERR_BAD_COOKIE, |w| post_op_attr(w, Some(&dir), fsid)),
                Err(s) => return fail(s, |w| post_op_attr(w, Some(&dir), fsid)),
            },
        }
    };
    // Entries as the budget allows; a page is fetched only when the ones at hand are used up.
    let mut bytes = overhead;
    let mut dirbytes = 0usize;
    let mut out: Vec<Item> = Vec::new();
    let mut eof = false;
    let mut pending = items.into_iter().collect::<std::collections::VecDeque<_>>();
    loop {
        if pending.is_empty() {
            let limit = if plus { weft_proto::READDIRPLUS_ENTRIES_MAX } else { 256 };
            let page = if plus {
                c.readdir_plus_page(ino, &after, limit).await.map(|p| {
                    let v: Vec<Item> = p
                        .entries
                        .into_iter()
                        .map(|(name, a)| Item { cookie: name_cookie(&name), ino: a.ino, attr: Some(a), name })
                        .collect();
                    (v, p.eof)
                })
            } else {
                c.readdir_page(ino, &after, limit).await.map(|p| {
                    let v: Vec<Item> = p
                        .entries
                        .into_iter()
                        .map(|e| Item { cookie: name_cookie(&e.name), ino: e.ino, attr: None, name: e.name })
                        .collect();
                    (v, p.eof)
                })
            };
            match page {
                Ok((v, page_eof)) => {
                    if let Some(last) = v.last() {
                        after = last.name.clone();
                    }
                    let empty = v.is_empty();
                    pending.extend(v);
                    if empty {
                        eof = true;
                        break;
                    }
                    let _ = page_eof;
                }
                Err(e) => return fail(stale_if_gone(status_of(&e)), |w| post_op_attr(w, Some(&dir), fsid)),
            }
        }
        let Some(item) = pending.pop_front() else { break };
        let name_len = item.name.len().div_ceil(4) * 4;
        let dir_cost = 8 + 4 + name_len + 8;
        let cost = 4 + dir_cost + if plus { 4 + 84 + 4 + 4 + 36 } else { 0 };
        if bytes + cost > count || dirbytes + dir_cost > dircount {
            break;
        }
        bytes += cost;
        dirbytes += dir_cost;
        out.push(item);
    }
    if out.is_empty() && !eof {
        return fail(NFS3ERR_TOOSMALL, |w| post_op_attr(w, Some(&dir), fsid));
    }
    if let Some(last) = out.last()
        && last.cookie > COOKIE_DOTDOT
    {
        gw.remember_cursor(ino, last.cookie, &last.name);
    }
    fail(NFS3_OK, |w| {
        post_op_attr(w, Some(&dir), fsid);
        w.fixed(&COOKIE_VERF);
        for it in &out {
            w.bool(true).u64(it.ino).opaque(it.name.as_bytes()).u64(it.cookie);
            if plus {
                post_op_attr(w, it.attr.as_ref(), fsid);
                post_op_fh(w, Some(&gw.sealer.seal(it.ino)));
            }
        }
        w.bool(false).bool(eof);
    })
}

/// The name whose cookie is `cookie`, by listing the directory (a cursor the gateway forgot, or another
/// gateway's); None if no entry has it any more.
pub(crate) async fn find_cookie(c: &Client, ino: u64, cookie: u64) -> Result<Option<String>, u32> {
    let mut after = String::new();
    loop {
        let page = c.readdir_page(ino, &after, weft_proto::READDIR_ENTRIES_MAX).await.map_err(|e| status_of(&e))?;
        if let Some(e) = page.entries.iter().find(|e| name_cookie(&e.name) == cookie) {
            return Ok(Some(e.name.clone()));
        }
        match page.entries.last() {
            Some(last) if !page.eof => after = last.name.clone(),
            _ => return Ok(None),
        }
    }
}

async fn fsstat(gw: &Gateway, c: &Client, fh: &[u8]) -> Out {
    let ino = match ino_of(gw, fh) {
        Ok(i) => i,
        Err(s) => return fail(s, |w| post_op_attr(w, None, 0)),
    };
    let a = match attr_of(gw, c, ino).await {
        Ok(a) => a,
        Err(s) => return fail(s, |w| post_op_attr(w, None, 0)),
    };
    match c.statfs().await {
        Ok(s) => fail(NFS3_OK, |w| {
            post_op_attr(w, Some(&a), gw.fsid);
            // Weft has no inode limit: report a large constant of free inodes.
            let free_files = 1u64 << 32;
            w.u64(s.bytes_total).u64(s.bytes_free).u64(s.bytes_free);
            w.u64(s.files + free_files).u64(free_files).u64(free_files).u32(0);
        }),
        Err(e) => fail(status_of(&e), |w| post_op_attr(w, Some(&a), gw.fsid)),
    }
}

async fn fsinfo(gw: &Gateway, c: &Client, fh: &[u8]) -> Out {
    let ino = match ino_of(gw, fh) {
        Ok(i) => i,
        Err(s) => return fail(s, |w| post_op_attr(w, None, 0)),
    };
    match attr_of(gw, c, ino).await {
        Ok(a) => fail(NFS3_OK, |w| {
            post_op_attr(w, Some(&a), gw.fsid);
            w.u32(IO_BYTES_MAX).u32(IO_BYTES_MAX).u32(4096); // rtmax rtpref rtmult
            w.u32(IO_BYTES_MAX).u32(IO_BYTES_MAX).u32(4096); // wtmax wtpref wtmult
            w.u32(64 * 1024); // dtpref
            w.u64(i64::MAX as u64); // maxfilesize
            w.u32(0).u32(1); // time_delta: 1 ns
            w.u32(0x1 | 0x2 | 0x8 | 0x10); // FSF3_LINK | SYMLINK | HOMOGENEOUS | CANSETTIME
        }),
        Err(s) => fail(s, |w| post_op_attr(w, None, 0)),
    }
}

async fn pathconf(gw: &Gateway, c: &Client, fh: &[u8]) -> Out {
    let ino = match ino_of(gw, fh) {
        Ok(i) => i,
        Err(s) => return fail(s, |w| post_op_attr(w, None, 0)),
    };
    match attr_of(gw, c, ino).await {
        Ok(a) => fail(NFS3_OK, |w| {
            post_op_attr(w, Some(&a), gw.fsid);
            w.u32(u32::MAX).u32(NAME_BYTES_MAX as u32); // linkmax, name_max
            w.bool(true).bool(true).bool(false).bool(true); // no_trunc chown_restricted case_insensitive case_preserving
        }),
        Err(s) => fail(s, |w| post_op_attr(w, None, 0)),
    }
}

async fn commit(gw: &Gateway, c: &Client, fh: &[u8]) -> Out {
    let ino = match ino_of(gw, fh) {
        Ok(i) => i,
        Err(s) => return fail(s, |w| wcc_data(w, None, None, 0)),
    };
    // Every cached handle of the file, whoever wrote through it: COMMIT is about the file, not the caller.
    if let Err(e) = gw.files.sync_inode(ino).await {
        return fail(stale_if_gone(status_of(&e)), |w| wcc_data(w, None, None, 0));
    }
    match attr_of(gw, c, ino).await {
        Ok(a) => fail(NFS3_OK, |w| {
            wcc_data(w, None, Some(&a), gw.fsid);
            w.fixed(&gw.write_verifier());
        }),
        Err(s) => fail(s, |w| wcc_data(w, None, None, 0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: FileKind, mode: u32) -> Attr {
        Attr { uid: 1000, gid: 100, nlink: 1, ..Attr::new(9, kind, mode) }
    }

    #[test]
    fn access_follows_the_mode_classes() {
        let all = 0x3f;
        let user = |uid, gid, groups: &[u32]| weft_proto::UserCred { uid, gid, groups: groups.to_vec() };
        let f = attr(FileKind::File, 0o640);
        assert_eq!(access_bits(&f, &user(1000, 1, &[]), all), ACCESS3_READ | ACCESS3_MODIFY | ACCESS3_EXTEND);
        assert_eq!(access_bits(&f, &user(1001, 5, &[100]), all), ACCESS3_READ);
        assert_eq!(access_bits(&f, &user(1001, 5, &[]), all), 0);
        assert_eq!(access_bits(&f, &user(0, 0, &[]), all), ACCESS3_READ | ACCESS3_MODIFY | ACCESS3_EXTEND);
        let d = attr(FileKind::Dir, 0o755);
        assert_eq!(access_bits(&d, &user(1001, 5, &[]), all), ACCESS3_READ | ACCESS3_LOOKUP);
        assert_eq!(access_bits(&d, &user(1000, 5, &[]), ACCESS3_DELETE), ACCESS3_DELETE);
    }

    #[test]
    fn cookies_avoid_the_reserved_values_and_devices_encode_as_linux_does() {
        for n in ["", "a", ".", "..", "file.txt"] {
            assert!(name_cookie(n) > COOKIE_DOTDOT);
        }
        assert_ne!(name_cookie("a"), name_cookie("b"));
        // makedev(8, 1) as Linux's new_encode_dev: 0x801.
        assert_eq!(encode_dev(8, 1), 0x801);
        assert_eq!(encode_dev(1, 0x12345), 0x12300145);
    }
}
