//! One COMPOUND at a pNFS data server (docs/format.md §23): the session ops and SEQUENCE shared with the gateway,
//! then PUTFH, READ, WRITE, COMMIT and GETATTR on the object the data-server filehandle's capability names, checked
//! by the data server's capability gate on every op; RECLAIM_COMPLETE; anything else NFS4ERR_NOTSUPP.
//!
//! A READ's bytes are the reply's tail, sent from the verified page-cache mapping (not copied) when the READ is the
//! compound's last op, as the Linux client always sends it; over RPC-over-RDMA from a pool buffer they were read
//! into (a registered zone, which the transport RDMA WRITEs from).

use std::net::SocketAddr;

use bytes::Bytes;
use weft_data::DataError;
use weft_data::store::MappedRead;
use weft_proto::{ErrorCode, Rights};

use super::fh::{self, DsFh};
use super::{ConnStats, DsNfs, EXCHGID4_FLAG_USE_PNFS_DS};
use crate::nfs4::attrs::Bitmap;
use crate::nfs4::compound::{self as shared, HEAD_BYTES, Sequenced};
use crate::nfs4::consts::*;
use crate::nfs4::decode::{self, COMPOUND_OPS_MAX, Op};
use crate::nfs4::session_ops;
use crate::proto::{IO_BYTES_MAX, STABLE_UNSTABLE};
use crate::rpc::{self, Call};
use crate::xdr::{Reader, Writer};

const FATTR4_SUPPORTED_ATTRS: u32 = 0;
const FATTR4_TYPE: u32 = 1;
const FATTR4_CHANGE: u32 = 3;
const FATTR4_SIZE: u32 = 4;
const FATTR4_FILEID: u32 = 20;
/// What GETATTR answers at a data server (of what a client may ask one; others are omitted).
const DS_ATTRS: [u32; 5] = [FATTR4_SUPPORTED_ATTRS, FATTR4_TYPE, FATTR4_CHANGE, FATTR4_SIZE, FATTR4_FILEID];
/// `stable_how4` FILE_SYNC4.
const FILE_SYNC4: u32 = 2;

/// A page-cache mapping as the bytes of a reply's tail (the mapping and its range lock live until it is sent).
struct Mapped(MappedRead);

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// A buffer of the server's pool as the bytes of a reply's tail (back to the pool when the reply is sent).
struct Pooled(weft_rpc::PoolBuf);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Runs one NFSv4 call at a data server; returns the reply (a READ's data as its tail).
pub async fn call(ds: &DsNfs, call: &Call<'_>, rec: &Bytes, peer: SocketAddr, stats: &ConnStats) -> rpc::Reply {
    match call.proc_ {
        0 => return rpc::accepted(call.xid, rpc::SUCCESS).buf.into(),
        1 => {}
        _ => return rpc::accepted(call.xid, rpc::PROC_UNAVAIL).buf.into(),
    }
    let mut r = Reader::new(call.args);
    let h = match decode::header(&mut r) {
        Ok(h) => h,
        Err(e) => {
            tracing::info!(%peer, error = %e, "pnfs ds: COMPOUND header malformed");
            return rpc::accepted(call.xid, rpc::GARBAGE_ARGS).buf.into();
        }
    };
    let mut out = rpc::accepted(call.xid, rpc::SUCCESS);
    let tag = h.tag.to_vec();
    if h.minor != 1 || h.ops > COMPOUND_OPS_MAX {
        let status = if h.minor != 1 { NFS4ERR_MINOR_VERS_MISMATCH } else { NFS4ERR_TOO_MANY_OPS };
        out.u32(status).opaque(&tag).u32(0);
        return out.buf.into();
    }
    // Leases run out here (bounded tables, bounded work); a data server holds no locks to release.
    {
        let now = ds.nfs4.now_ms();
        ds.nfs4.state().expire(now);
    }
    let head = HEAD_BYTES + tag.len().div_ceil(4) * 4;
    let mut cx = DsCtx { cur: None, clientid: None, session: None, fore_reply_max: None, reply_bytes: head };
    let mut results = Writer::new();
    let mut done = 0u32;
    let mut status = NFS4_OK;
    for i in 0..h.ops {
        let code = match r.u32() {
            Ok(c) => c,
            Err(_) => {
                results.u32(OP_ILLEGAL).u32(NFS4ERR_BADXDR);
                (done, status) = (done + 1, NFS4ERR_BADXDR);
                break;
            }
        };
        let decoded = decode::op(code, &mut r);
        let rcode = shared::code_of(code, &decoded);
        let op = match decoded {
            Ok(op) => op,
            Err(e) => {
                status = if rcode == OP_ILLEGAL { NFS4ERR_OP_ILLEGAL } else { NFS4ERR_BADXDR };
                tracing::info!(%peer, op = code, error = %e, "pnfs ds: op malformed");
                results.u32(rcode).u32(status);
                done += 1;
                break;
            }
        };
        let (st, mut body) = match shared::placement(i, h.ops, &op) {
            Some(s) => (s, Writer::new()),
            None => match op {
                Op::Sequence { sessionid, seqid, slot, .. } => {
                    match shared::sequence(&ds.nfs4, &sessionid, seqid, slot, h.ops, call.args.len()) {
                        Sequenced::Replay(cached) => {
                            out.buf.extend_from_slice(&cached);
                            return out.buf.into();
                        }
                        Sequenced::New { clientid, fore, status, body } => {
                            cx.clientid = Some(clientid);
                            cx.session = Some((sessionid, slot));
                            cx.fore_reply_max = Some(fore.reply_bytes_max as usize);
                            (status, body)
                        }
                        Sequenced::Refused(s) => (s, Writer::new()),
                    }
                }
                op if shared::sessionless(&op) => {
                    let principal = crate::nfs4::state::Principal::of(&call.auth);
                    let role = EXCHGID4_FLAG_USE_PNFS_DS;
                    let (s, w, _) =
                        session_ops::run_on(&ds.nfs4, op, role, (principal, peer.ip()), &mut cx.session, None);
                    (s, w)
                }
                op => run(ds, &mut cx, op, rec, peer, stats).await,
            },
        };
        done += 1;
        status = st;
        shared::inline_tail_unless_last(&mut body, i + 1 == h.ops || st != NFS4_OK);
        let body_len = body.len();
        let room = cx.fore_reply_max.unwrap_or(usize::MAX);
        if head + results.buf.len() + 8 + body_len > room {
            results.u32(rcode).u32(NFS4ERR_REP_TOO_BIG);
            status = NFS4ERR_REP_TOO_BIG;
            break;
        }
        results.u32(rcode).u32(st);
        results.buf.extend_from_slice(&body.buf);
        results.tail = body.tail;
        cx.reply_bytes = head + results.buf.len();
        if st != NFS4_OK {
            tracing::debug!(%peer, op = code, status = st, "pnfs ds: op failed");
            break;
        }
        if results.tail.is_some() {
            break;
        }
    }
    let mut reply_body = Writer::new();
    reply_body.u32(status).opaque(&tag).u32(done);
    reply_body.buf.extend_from_slice(&results.buf);
    if let Some((sid, slot)) = cx.session {
        shared::keep_reply(&mut ds.nfs4.state(), &sid, slot, &reply_body.buf, results.tail.as_ref());
    }
    out.buf.extend_from_slice(&reply_body.buf);
    rpc::Reply { head: out.buf, tail: results.tail }
}

/// What the ops of one compound share.
struct DsCtx {
    cur: Option<DsFh>,
    clientid: Option<u64>,
    session: Option<([u8; 16], u32)>,
    fore_reply_max: Option<usize>,
    reply_bytes: usize,
}

impl DsCtx {
    /// The bytes a READ's data may take of the reply (its op code, status, eof and length word counted).
    fn reply_room(&self) -> usize {
        self.fore_reply_max.unwrap_or(IO_BYTES_MAX as usize + 4096).saturating_sub(self.reply_bytes + 16)
    }
}

/// The current filehandle, admitted by the capability gate for `rights` (empty: either right).
fn admitted<'c>(ds: &DsNfs, cx: &'c DsCtx, rights: Rights, peer: SocketAddr) -> Result<&'c DsFh, u32> {
    let fh = cx.cur.as_ref().ok_or(NFS4ERR_NOFILEHANDLE)?;
    // A fenced server (not Up at the MDS, or its lease lapsed): STALE sends the client back to the MDS, whose
    // fresh layout names the servers that own the file now.
    ds.lease.admit(&peer.to_string()).map_err(|_| NFS4ERR_STALE)?;
    if let Some(gate) = &ds.gate {
        gate.admit(&peer.to_string(), &ds.principal, fh.cap.ino, rights, &fh.cap).map_err(|e| {
            // Expired: STALE sends the Linux client back to the MDS for a fresh layout (RFC 8881 §13.6).
            if e.code == ErrorCode::CapabilityExpired { NFS4ERR_STALE } else { NFS4ERR_ACCESS }
        })?;
    }
    Ok(fh)
}

/// The status for a store error; a corrupt block is logged with its file offset.
fn store_status(fh: &DsFh, e: DataError, peer: SocketAddr) -> u32 {
    match e {
        DataError::Corrupt { ino, object_offset, .. } | DataError::Lost { ino, object_offset, .. } => {
            tracing::error!(%peer, ino, file_offset = fh.file_offset(object_offset), object_offset,
                "pnfs ds: a block fails its checksum or was lost; answering NFS4ERR_IO: {e}");
            NFS4ERR_IO
        }
        DataError::NoSpace { .. } => 28, // NFS4ERR_NOSPC
        DataError::OutOfRange { .. } => NFS4ERR_FBIG,
        e => {
            tracing::warn!(%peer, ino = fh.cap.ino, "pnfs ds: store error: {e}");
            NFS4ERR_IO
        }
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DataError> + Send + 'static,
) -> Result<T, DataError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(DataError::Io {
            op: "running",
            path: Default::default(),
            source: std::io::Error::other(format!("store task failed: {e}")),
        }),
    }
}

async fn run(
    ds: &DsNfs,
    cx: &mut DsCtx,
    op: Op<'_>,
    rec: &Bytes,
    peer: SocketAddr,
    stats: &ConnStats,
) -> (u32, Writer) {
    let mut w = Writer::new();
    let st = match op {
        Op::PutFh(bytes) => match fh::decode(bytes) {
            Ok(d) => {
                cx.cur = Some(d);
                NFS4_OK
            }
            Err(e) => {
                tracing::debug!(%peer, error = %e, "pnfs ds: PUTFH of a handle that does not decode");
                NFS4ERR_BADHANDLE
            }
        },
        Op::Read { stateid: _, offset, count } => match read(ds, cx, offset, count, peer, stats, &mut w).await {
            Ok(()) => NFS4_OK,
            Err(s) => s,
        },
        Op::Write { stateid: _, offset, stable, data } => {
            match write(ds, cx, offset, stable, rec.slice_ref(data), peer, stats, &mut w).await {
                Ok(()) => NFS4_OK,
                Err(s) => s,
            }
        }
        Op::Commit { .. } => match admitted(ds, cx, Rights::NONE, peer) {
            Ok(fh) => {
                let (store, ino) = (ds.store.clone(), fh.cap.ino);
                match blocking(move || store.fsync(ino)).await {
                    Ok(()) => {
                        w.fixed(&ds.verifier);
                        NFS4_OK
                    }
                    Err(e) => store_status(fh, e, peer),
                }
            }
            Err(s) => s,
        },
        Op::GetAttr(want) => match admitted(ds, cx, Rights::NONE, peer) {
            Ok(fh) => {
                let (store, ino) = (ds.store.clone(), fh.cap.ino);
                match blocking(move || store.object_len(ino)).await {
                    Ok(len) => {
                        getattr(&mut w, &want, ino, len);
                        NFS4_OK
                    }
                    Err(e) => store_status(fh, e, peer),
                }
            }
            Err(s) => s,
        },
        Op::ReclaimComplete(_) => match cx.clientid {
            Some(id) => ds.nfs4.state().reclaim_complete(id).err().unwrap_or(NFS4_OK),
            None => NFS4ERR_OP_NOT_IN_SESSION,
        },
        _ => NFS4ERR_NOTSUPP,
    };
    (st, w)
}

/// READ at file offset `offset`: mapped to the object, the bytes sent from the verified page-cache mapping (the
/// reply's tail), or read with zeros filled past the object's end (a hole of this server's stripes).
async fn read(
    ds: &DsNfs,
    cx: &DsCtx,
    offset: u64,
    count: u32,
    peer: SocketAddr,
    stats: &ConnStats,
    w: &mut Writer,
) -> Result<(), u32> {
    let fh = admitted(ds, cx, Rights::READ, peer)?;
    let len = u64::from(count.min(IO_BYTES_MAX).min(cx.reply_room().min(u32::MAX as usize) as u32));
    let object = fh.object_range(offset, len).map_err(|e| {
        tracing::debug!(%peer, ino = fh.cap.ino, "pnfs ds: READ refused: {e}");
        NFS4ERR_INVAL
    })?;
    let (store, ino) = (ds.store.clone(), fh.cap.ino);
    let data = if stats.into_zone && len > 0 && len as usize <= ds.pool.buf_bytes() {
        // Over RDMA: read (and verified) straight into a registered zone buffer, which the transport RDMA WRITEs
        // from; waiting for a free buffer is the back-pressure, shared with Weft's own data path.
        let mut buf = ds.pool.acquire(len as usize).await;
        blocking(move || {
            store.read(ino, object, buf.as_mut_slice())?;
            Ok(Bytes::from_owner(Pooled(buf)))
        })
        .await
    } else {
        blocking(move || {
            if let Some(m) = store.read_mapped(ino, object, len)? {
                return Ok(Bytes::from_owner(Mapped(m)));
            }
            let mut buf = vec![0u8; len as usize];
            store.read(ino, object, &mut buf)?;
            Ok(Bytes::from(buf))
        })
        .await
    }
    .map_err(|e| store_status(fh, e, peer))?;
    stats.read_bytes.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
    stats.touched(ino);
    // eof is the MDS's to know (the file's size); a data server never says it.
    w.bool(false);
    w.opaque_tail(data);
    Ok(())
}

/// WRITE at file offset `offset`; UNSTABLE4 answered as is, DATA_SYNC4 and FILE_SYNC4 after an fsync of the
/// object (answered FILE_SYNC4).
#[allow(clippy::too_many_arguments)]
async fn write(
    ds: &DsNfs,
    cx: &DsCtx,
    offset: u64,
    stable: u32,
    data: Bytes,
    peer: SocketAddr,
    stats: &ConnStats,
    w: &mut Writer,
) -> Result<(), u32> {
    let len = data.len() as u64;
    let fh = admitted(ds, cx, Rights::WRITE, peer).inspect_err(|&status| {
        // Where a refused WRITE was (the client resends it through the MDS): what a wrong byte is traced with.
        tracing::debug!(%peer, ino = cx.cur.as_ref().map(|f| f.cap.ino), offset, len, status, "pnfs ds: WRITE refused");
    })?;
    let object = fh.object_range(offset, len).map_err(|e| {
        tracing::debug!(%peer, ino = fh.cap.ino, "pnfs ds: WRITE refused: {e}");
        NFS4ERR_INVAL
    })?;
    let (store, ino) = (ds.store.clone(), fh.cap.ino);
    let sync = stable != STABLE_UNSTABLE;
    blocking(move || {
        store.write(ino, object, &data)?;
        if sync { store.fsync(ino) } else { Ok(()) }
    })
    .await
    .map_err(|e| store_status(fh, e, peer))?;
    // Admitted before the object's removal and finished after it: remove what it recreated (as Weft's own WRITE).
    if let Some(gate) = &ds.gate
        && gate.was_removed(ino)
    {
        let store = ds.store.clone();
        let _ = blocking(move || store.remove(ino)).await;
        return Err(NFS4ERR_STALE);
    }
    stats.write_bytes.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
    stats.touched(ino);
    w.u32(len as u32).u32(if sync { FILE_SYNC4 } else { STABLE_UNSTABLE }).fixed(&ds.verifier);
    Ok(())
}

/// GETATTR at a data server: of [`DS_ATTRS`], those asked, in bit order (`fattr4`: bitmap, then the values).
fn getattr(w: &mut Writer, want: &Bitmap, ino: u64, object_len: u64) {
    let mut have = Bitmap::of(&[]);
    let mut vals = Writer::new();
    for bit in DS_ATTRS {
        if !want.has(bit) {
            continue;
        }
        have.set(bit);
        match bit {
            FATTR4_SUPPORTED_ATTRS => Bitmap::of(&DS_ATTRS).encode(&mut vals),
            FATTR4_TYPE => {
                vals.u32(NF4REG);
            }
            // The object's length: it changes with every write that extends the object; a data server knows no
            // better (the file's change attribute is the MDS's).
            FATTR4_CHANGE | FATTR4_SIZE => {
                vals.u64(object_len);
            }
            FATTR4_FILEID => {
                vals.u64(ino);
            }
            _ => unreachable!("only DS_ATTRS"),
        }
    }
    have.encode(w);
    w.opaque(&vals.buf);
}
