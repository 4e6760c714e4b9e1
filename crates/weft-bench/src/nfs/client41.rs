//! A pNFS client for `weft bench nfs --pnfs`, built from weft-nfs's own protocol code (libnfs does not do pNFS):
//! NFSv4.1 sessions over TCP with several requests in flight on one connection (a reader task matches replies to
//! calls by xid; a slot per request in flight), the metadata ops a pNFS client needs against the gateway
//! (PUTROOTFH/LOOKUP, OPEN/CLOSE, REMOVE, LAYOUTGET, GETDEVICEINFO, LAYOUTCOMMIT, LAYOUTRETURN) and the data ops
//! (READ, WRITE, COMMIT) against the gateway or a data server.
//!
//! Correct before fast: NFS4ERR_DELAY and NFS4ERR_GRACE are retried (at most [`RETRIES_MAX`] times, with a growing
//! pause); any other failure is an error naming the server, the op and the file offset. Bounded: the calls
//! waiting for a reply are at most the session's slots (a semaphore), replies at most one record of
//! [`RECORD_BYTES_MAX`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{Semaphore, oneshot};
use weft_nfs::ds::EXCHGID4_FLAG_USE_PNFS_DS;
use weft_nfs::nfs4::attrs::{self, Bitmap};
use weft_nfs::nfs4::consts::*;
use weft_nfs::nfs4::layout::{self, DeviceId, FileLayout, LAYOUT4_NFSV4_1_FILES, LAYOUTRETURN4_FILE};
use weft_nfs::nfs4::state::Stateid;
use weft_nfs::proto::NFS_PROGRAM;
use weft_nfs::rpc::{self, RecordLimits, ReplyHead};
use weft_nfs::xdr::{Reader, Writer, XdrError};

/// Retries of a compound answered NFS4ERR_DELAY or NFS4ERR_GRACE before it fails.
pub const RETRIES_MAX: u32 = 50;
/// The largest reply record read (a 1 MiB READ and its headers, with room).
pub const RECORD_BYTES_MAX: usize = (1 << 20) + 65536;
/// The request size a session must allow: a 1 MiB WRITE with SEQUENCE, PUTFH and the RPC header.
const REQUEST_BYTES_NEEDED: u32 = (1 << 20) + 1024;
const TAG: &[u8] = b"weft-bench";
/// `stable_how4`.
pub const UNSTABLE4: u32 = 0;

/// A short name for an NFSv4 status, for error messages.
pub fn status_name(s: u32) -> String {
    let name = match s {
        NFS4ERR_PERM => "NFS4ERR_PERM",
        NFS4ERR_NOENT => "NFS4ERR_NOENT",
        NFS4ERR_IO => "NFS4ERR_IO",
        NFS4ERR_ACCESS => "NFS4ERR_ACCESS",
        NFS4ERR_INVAL => "NFS4ERR_INVAL",
        NFS4ERR_STALE => "NFS4ERR_STALE",
        NFS4ERR_BADHANDLE => "NFS4ERR_BADHANDLE",
        NFS4ERR_DELAY => "NFS4ERR_DELAY",
        NFS4ERR_GRACE => "NFS4ERR_GRACE",
        NFS4ERR_BAD_STATEID => "NFS4ERR_BAD_STATEID",
        NFS4ERR_BADSESSION => "NFS4ERR_BADSESSION",
        NFS4ERR_SEQ_MISORDERED => "NFS4ERR_SEQ_MISORDERED",
        NFS4ERR_LAYOUTUNAVAILABLE => "NFS4ERR_LAYOUTUNAVAILABLE",
        NFS4ERR_LAYOUTTRYLATER => "NFS4ERR_LAYOUTTRYLATER",
        NFS4ERR_REQ_TOO_BIG => "NFS4ERR_REQ_TOO_BIG",
        NFS4ERR_REP_TOO_BIG => "NFS4ERR_REP_TOO_BIG",
        _ => return format!("NFS4 status {s}"),
    };
    name.to_string()
}

fn xdr(server: &str, what: &str) -> impl FnOnce(XdrError) -> anyhow::Error {
    let m = format!("{server}: malformed {what} reply");
    move |e| anyhow!("{m}: {e}")
}

type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<Vec<u8>>>>>;

/// One TCP connection carrying ONC RPC calls, several at once.
struct Conn {
    server: Arc<str>,
    tx: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    xid: AtomicU32,
    cred: (u32, u32),
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Conn {
    async fn connect(server: Arc<str>, addr: SocketAddr, cred: (u32, u32)) -> Result<Conn> {
        let s = TcpStream::connect(addr).await.with_context(|| format!("{server}: connecting"))?;
        s.set_nodelay(true)?;
        let (mut rx, tx) = s.into_split();
        let pending: Pending = Arc::default();
        let p = pending.clone();
        let name = server.clone();
        let reader = tokio::spawn(async move {
            let limits = RecordLimits { record_bytes_max: RECORD_BYTES_MAX, ..RecordLimits::default() };
            loop {
                match rpc::read_record(&mut rx, &limits).await {
                    Ok(Some(rec)) if rec.len() >= 4 => {
                        let xid = u32::from_be_bytes(rec[..4].try_into().expect("4 bytes"));
                        if let Some(tx) = p.lock().expect("pending").remove(&xid) {
                            let _ = tx.send(rec);
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(server = %name, error = %e, "reading a reply");
                        break;
                    }
                }
            }
            // Every caller still waiting learns the connection is gone (its sender is dropped).
            p.lock().expect("pending").clear();
        });
        // An odd start, so two connections' xids rarely look alike in a capture.
        Ok(Conn { server, tx: tokio::sync::Mutex::new(tx), pending, xid: AtomicU32::new(0x5eed), cred, reader })
    }

    /// One NFSv4 COMPOUND call whose arguments are `parts` in order; the reply record and where its body starts.
    async fn call(&self, parts: &[&[u8]]) -> Result<(Vec<u8>, usize)> {
        let xid = self.xid.fetch_add(1, Ordering::Relaxed);
        let head = rpc::encode_call(xid, NFS_PROGRAM, 4, 1, Some((self.cred.0, self.cred.1, &[]))).into_vec();
        let len = head.len() + parts.iter().map(|p| p.len()).sum::<usize>();
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending").insert(xid, tx);
        {
            let mut w = self.tx.lock().await;
            let mark = (0x8000_0000u32 | len as u32).to_be_bytes();
            let r = async {
                w.write_all(&mark).await?;
                w.write_all(&head).await?;
                for p in parts {
                    w.write_all(p).await?;
                }
                std::io::Result::Ok(())
            }
            .await;
            if let Err(e) = r {
                self.pending.lock().expect("pending").remove(&xid);
                bail!("{}: sending a call: {e}", self.server);
            }
        }
        let rec = rx.await.map_err(|_| anyhow!("{}: the connection closed before the reply", self.server))?;
        match rpc::parse_reply(&rec).map_err(xdr(&self.server, "RPC"))? {
            ReplyHead::Accepted { stat: rpc::SUCCESS, rest, .. } => {
                let at = rec.len() - rest.len();
                Ok((rec, at))
            }
            ReplyHead::Accepted { stat, .. } => bail!("{}: RPC not accepted (accept_stat {stat})", self.server),
            ReplyHead::Denied { reject, .. } => bail!("{}: RPC denied (reject_stat {reject})", self.server),
        }
    }
}

/// The ops of one compound being built (after SEQUENCE, which the session adds).
#[derive(Default)]
pub struct Ops {
    pub w: Writer,
    pub n: u32,
}

impl Ops {
    pub fn op(&mut self, code: u32) -> &mut Writer {
        self.n += 1;
        self.w.u32(code);
        &mut self.w
    }
    pub fn putfh(&mut self, fh: &[u8]) -> &mut Self {
        self.op(OP_PUTFH).opaque(fh);
        self
    }
    pub fn stateid(w: &mut Writer, s: &Stateid) {
        w.u32(s.seqid).fixed(&s.other);
    }
}

/// A compound's reply being read op by op.
pub struct Reply {
    server: Arc<str>,
    buf: Vec<u8>,
    pos: usize,
    /// The compound's status (that of its first failing op, or NFS4_OK).
    pub status: u32,
}

impl Reply {
    fn parse(server: Arc<str>, buf: Vec<u8>, at: usize) -> Result<Reply> {
        let mut r = Reader::new(&buf);
        r.fixed(at).map_err(xdr(&server, "COMPOUND"))?;
        let status = r.u32().map_err(xdr(&server, "COMPOUND"))?;
        r.opaque(1024).map_err(xdr(&server, "COMPOUND"))?;
        r.u32().map_err(xdr(&server, "COMPOUND"))?;
        let pos = r.position();
        Ok(Reply { server, buf, pos, status })
    }

    pub fn with<T>(&mut self, what: &str, f: impl FnOnce(&mut Reader<'_>) -> Result<T, XdrError>) -> Result<T> {
        let mut r = Reader::new(&self.buf);
        r.fixed(self.pos).map_err(xdr(&self.server, what))?;
        let t = f(&mut r).map_err(xdr(&self.server, what))?;
        self.pos = r.position();
        Ok(t)
    }

    /// The next op's status; its op code must be `code`.
    pub fn op(&mut self, code: u32) -> Result<u32> {
        let (c, s) = self.with("op", |r| Ok((r.u32()?, r.u32()?)))?;
        if c != code {
            bail!("{}: reply has op {c} where op {code} was sent", self.server);
        }
        Ok(s)
    }

    /// The next op succeeded; else an error naming the server, `what` (the op and offset) and the status.
    pub fn ok(&mut self, code: u32, what: &dyn std::fmt::Display) -> Result<()> {
        match self.op(code)? {
            NFS4_OK => Ok(()),
            s => bail!("{}: {what} failed: {}", self.server, status_name(s)),
        }
    }

    /// READ4resok: eof and where the data lies in [`Reply::bytes`].
    pub fn read_data(&mut self, data_bytes_max: usize) -> Result<(bool, Range<usize>)> {
        let start = self.pos + 8;
        let (eof, len) = self.with("READ", |r| {
            let eof = r.bool()?;
            let d = r.opaque(data_bytes_max)?;
            Ok((eof, d.len()))
        })?;
        Ok((eof, start..start + len))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// An NFSv4.1 session on one connection: `slots` requests in flight at once.
pub struct Session {
    conn: Conn,
    id: [u8; 16],
    /// The last sequence id used on each slot.
    seqids: Mutex<Vec<u32>>,
    free: Mutex<Vec<u32>>,
    slots: Semaphore,
    pub clientid: u64,
    /// EXCHANGE_ID's `eir_flags`.
    pub flags: u32,
}

impl Session {
    /// EXCHANGE_ID (with EXCHGID4_FLAG_USE_PNFS_DS for a data server), CREATE_SESSION asking for `slots` slots,
    /// RECLAIM_COMPLETE. `server` names it in errors.
    pub async fn open(
        server: &str,
        addr: SocketAddr,
        owner: &[u8],
        data_server: bool,
        slots: u32,
        cred: (u32, u32),
    ) -> Result<Session> {
        let name: Arc<str> = Arc::from(format!("{server} {addr}"));
        let conn = Conn::connect(name.clone(), addr, cred).await?;
        let mut ops = Ops::default();
        let verifier = (u64::from(std::process::id()) << 32 | u64::from(addr.port())).to_be_bytes();
        let flags = if data_server { EXCHGID4_FLAG_USE_PNFS_DS } else { 0 };
        ops.op(OP_EXCHANGE_ID).fixed(&verifier).opaque(owner).u32(flags).u32(0).u32(0);
        let mut res = sessionless(&conn, &ops).await?;
        res.ok(OP_EXCHANGE_ID, &"EXCHANGE_ID")?;
        let (clientid, seq, eir_flags) = res.with("EXCHANGE_ID", |r| Ok((r.u64()?, r.u32()?, r.u32()?)))?;
        let mut ops = Ops::default();
        let w = ops.op(OP_CREATE_SESSION);
        w.u64(clientid).u32(seq).u32(0);
        let big = (1 << 20) + 4096;
        w.u32(0).u32(big).u32(big).u32(8192).u32(16).u32(slots.max(1)).u32(0);
        w.u32(0).u32(4096).u32(4096).u32(0).u32(2).u32(1).u32(0);
        w.u32(0x4000_0000).u32(1).u32(0);
        let mut res = sessionless(&conn, &ops).await?;
        res.ok(OP_CREATE_SESSION, &"CREATE_SESSION")?;
        let (id, req_max, granted) = res.with("CREATE_SESSION", |r| {
            let id: [u8; 16] = r.fixed(16)?.try_into().expect("16 bytes");
            r.u32()?; // csr_sequence
            r.u32()?; // csr_flags
            r.u32()?; // header pad
            let req = r.u32()?;
            r.u32()?; // reply max
            r.u32()?; // cached reply max
            r.u32()?; // ops max
            let slots = r.u32()?;
            Ok((id, req, slots))
        })?;
        if req_max < REQUEST_BYTES_NEEDED {
            bail!("{name}: the session allows requests of {req_max} bytes, a 1 MiB WRITE needs {REQUEST_BYTES_NEEDED}");
        }
        let n = granted.clamp(1, slots.max(1));
        let s = Session {
            conn,
            id,
            seqids: Mutex::new(vec![0; n as usize]),
            free: Mutex::new((0..n).rev().collect()),
            slots: Semaphore::new(n as usize),
            clientid,
            flags: eir_flags,
        };
        let mut ops = Ops::default();
        ops.op(OP_RECLAIM_COMPLETE).bool(false);
        let mut res = s.compound(&ops, &[]).await?;
        match res.op(OP_RECLAIM_COMPLETE)? {
            NFS4_OK | NFS4ERR_COMPLETE_ALREADY => {}
            st => bail!("{name}: RECLAIM_COMPLETE failed: {}", status_name(st)),
        }
        Ok(s)
    }

    pub fn server(&self) -> &str {
        &self.conn.server
    }

    /// SEQUENCE on a free slot, then `ops` (and `tail`, raw bytes that end the last op); retried on
    /// NFS4ERR_DELAY or NFS4ERR_GRACE. The reply is positioned after SEQUENCE's result.
    pub async fn compound(&self, ops: &Ops, tail: &[&[u8]]) -> Result<Reply> {
        let mut pause_ms = 5u64;
        for attempt in 0.. {
            let _permit = self.slots.acquire().await.expect("never closed");
            let slot = self.free.lock().expect("slots").pop().expect("a permit means a free slot");
            let seqid = self.seqids.lock().expect("slots")[slot as usize].wrapping_add(1);
            let highest = self.seqids.lock().expect("slots").len() as u32 - 1;
            let mut head = Writer::new();
            head.opaque(TAG).u32(1).u32(ops.n + 1);
            head.u32(OP_SEQUENCE).fixed(&self.id).u32(seqid).u32(slot).u32(highest).bool(false);
            let mut parts: Vec<&[u8]> = vec![&head.buf, &ops.w.buf];
            parts.extend_from_slice(tail);
            let r = self.conn.call(&parts).await;
            let out = async {
                let (buf, at) = r?;
                let mut res = Reply::parse(self.conn.server.clone(), buf, at)?;
                let st = res.op(OP_SEQUENCE)?;
                if st == NFS4_OK {
                    // The slot's sequence id advanced at the server.
                    self.seqids.lock().expect("slots")[slot as usize] = seqid;
                    res.with("SEQUENCE", |r| r.fixed(16 + 20).map(|_| ()))?;
                }
                Ok::<_, anyhow::Error>((st, res))
            }
            .await;
            self.free.lock().expect("slots").push(slot);
            let (seq_status, res) = out?;
            let retry = matches!(res.status, NFS4ERR_DELAY | NFS4ERR_GRACE);
            if retry && attempt < RETRIES_MAX {
                // The server asked to be called again later: a pause, not a timing assumption.
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                pause_ms = (pause_ms * 2).min(1000);
                continue;
            }
            if seq_status != NFS4_OK {
                bail!("{}: SEQUENCE failed: {}", self.server(), status_name(seq_status));
            }
            return Ok(res);
        }
        unreachable!("the loop returns")
    }

    /// The filehandle of `path` below the export's root.
    pub async fn lookup_path(&self, path: &[&str]) -> Result<Vec<u8>> {
        let mut ops = Ops::default();
        ops.op(OP_PUTROOTFH);
        for p in path {
            ops.op(OP_LOOKUP).opaque(p.as_bytes());
        }
        ops.op(OP_GETFH);
        let mut res = self.compound(&ops, &[]).await?;
        res.ok(OP_PUTROOTFH, &"PUTROOTFH")?;
        for p in path {
            res.ok(OP_LOOKUP, &format_args!("LOOKUP {p}"))?;
        }
        res.ok(OP_GETFH, &"GETFH")?;
        res.with("GETFH", |r| r.opaque(layout::FH_BYTES_MAX).map(<[u8]>::to_vec))
    }

    /// OPEN `name` in directory `dir` for read and write (created, mode 0644, if `create`): its stateid and
    /// filehandle.
    pub async fn open_file(&self, dir: &[u8], name: &str, create: bool) -> Result<(Stateid, Vec<u8>)> {
        let mut ops = Ops::default();
        ops.putfh(dir);
        let w = ops.op(OP_OPEN);
        w.u32(0).u32(OPEN4_SHARE_ACCESS_BOTH).u32(0).u64(self.clientid).opaque(b"weft-bench");
        if create {
            w.u32(1).u32(0); // OPEN4_CREATE, UNCHECKED4
            Bitmap::of(&[attrs::MODE]).encode(w);
            let mut l = Writer::new();
            l.u32(0o644);
            w.opaque(&l.buf);
        } else {
            w.u32(0);
        }
        w.u32(0).opaque(name.as_bytes()); // CLAIM_NULL
        ops.op(OP_GETFH);
        let mut res = self.compound(&ops, &[]).await?;
        res.ok(OP_PUTFH, &"PUTFH")?;
        res.ok(OP_OPEN, &format_args!("OPEN {name}"))?;
        let sid = res.with("OPEN", |r| {
            let sid = Stateid { seqid: r.u32()?, other: r.fixed(12)?.try_into().expect("12 bytes") };
            r.fixed(4 + 16 + 4)?; // change_info4, rflags
            Bitmap::decode(r)?;
            match r.u32()? {
                0 => Ok(sid), // OPEN_DELEGATE_NONE
                d => Err(XdrError::BadDiscriminant(d)),
            }
        })?;
        res.ok(OP_GETFH, &"GETFH")?;
        let fh = res.with("GETFH", |r| r.opaque(layout::FH_BYTES_MAX).map(<[u8]>::to_vec))?;
        Ok((sid, fh))
    }

    pub async fn close(&self, fh: &[u8], sid: &Stateid) -> Result<()> {
        let mut ops = Ops::default();
        ops.putfh(fh);
        let w = ops.op(OP_CLOSE);
        w.u32(0);
        Ops::stateid(w, sid);
        let mut res = self.compound(&ops, &[]).await?;
        res.ok(OP_PUTFH, &"PUTFH")?;
        res.ok(OP_CLOSE, &"CLOSE")
    }

    /// REMOVE `name` from `dir`; a name that is not there is no error.
    pub async fn remove(&self, dir: &[u8], name: &str) -> Result<()> {
        let mut ops = Ops::default();
        ops.putfh(dir).op(OP_REMOVE).opaque(name.as_bytes());
        let mut res = self.compound(&ops, &[]).await?;
        res.ok(OP_PUTFH, &"PUTFH")?;
        match res.op(OP_REMOVE)? {
            NFS4_OK | NFS4ERR_NOENT => Ok(()),
            s => bail!("{}: REMOVE {name} failed: {}", self.server(), status_name(s)),
        }
    }

    /// LAYOUTGET of the whole file, type FILES: the layout's stateid and its decoded body.
    pub async fn layoutget(&self, fh: &[u8], open: &Stateid, iomode: u32) -> Result<(Stateid, FileLayout)> {
        let mut ops = Ops::default();
        let w = ops.putfh(fh).op(OP_LAYOUTGET);
        w.bool(false).u32(LAYOUT4_NFSV4_1_FILES).u32(iomode).u64(0).u64(layout::WHOLE_FILE).u64(0);
        Ops::stateid(w, open);
        w.u32(65536);
        let mut res = self.compound(&ops, &[]).await?;
        res.ok(OP_PUTFH, &"PUTFH")?;
        res.ok(OP_LAYOUTGET, &"LAYOUTGET")?;
        let (sid, body) = res.with("LAYOUTGET", |r| {
            r.bool()?; // return on close
            let sid = Stateid { seqid: r.u32()?, other: r.fixed(12)?.try_into().expect("12 bytes") };
            if r.u32()? == 0 {
                return Err(XdrError::BadDiscriminant(0));
            }
            let (off, len, _iomode) = (r.u64()?, r.u64()?, r.u32()?);
            if off != 0 || len != layout::WHOLE_FILE {
                // Only whole-file layouts are handled; a partial one would need a LAYOUTGET per range.
                return Err(XdrError::BadDiscriminant(0));
            }
            match r.u32()? {
                LAYOUT4_NFSV4_1_FILES => Ok((sid, r.opaque(layout::LAYOUT_BODY_BYTES_MAX * 16)?.to_vec())),
                t => Err(XdrError::BadDiscriminant(t)),
            }
        })?;
        let l = layout::decode_file_layout(&body).map_err(xdr(self.server(), "file layout"))?;
        Ok((sid, l))
    }

    /// GETDEVICEINFO of a files device: per stripe index, its data server's addresses.
    pub async fn getdeviceinfo(&self, device: &DeviceId) -> Result<Vec<Vec<SocketAddr>>> {
        let mut ops = Ops::default();
        ops.op(OP_GETDEVICEINFO).fixed(device).u32(LAYOUT4_NFSV4_1_FILES).u32(1 << 20).u32(0);
        let mut res = self.compound(&ops, &[]).await?;
        res.ok(OP_GETDEVICEINFO, &"GETDEVICEINFO")?;
        let body = res.with("GETDEVICEINFO", |r| match r.u32()? {
            LAYOUT4_NFSV4_1_FILES => Ok(r.opaque(1 << 20)?.to_vec()),
            t => Err(XdrError::BadDiscriminant(t)),
        })?;
        layout::decode_ds_addr(&body).map_err(xdr(self.server(), "device address"))
    }

    /// LAYOUTCOMMIT: the writes reached `last_write` (the size is `last_write + 1`).
    pub async fn layoutcommit(&self, fh: &[u8], sid: &Stateid, last_write: u64) -> Result<()> {
        let mut ops = Ops::default();
        let w = ops.putfh(fh).op(OP_LAYOUTCOMMIT);
        w.u64(0).u64(layout::WHOLE_FILE).bool(false);
        Ops::stateid(w, sid);
        w.bool(true).u64(last_write).bool(false).u32(LAYOUT4_NFSV4_1_FILES).opaque(b"");
        let mut res = self.compound(&ops, &[]).await?;
        res.ok(OP_PUTFH, &"PUTFH")?;
        res.ok(OP_LAYOUTCOMMIT, &format_args!("LAYOUTCOMMIT to offset {last_write}"))
    }

    pub async fn layoutreturn(&self, fh: &[u8], sid: &Stateid) -> Result<()> {
        let mut ops = Ops::default();
        let w = ops.putfh(fh).op(OP_LAYOUTRETURN);
        w.bool(false).u32(LAYOUT4_NFSV4_1_FILES).u32(layout::IOMODE_ANY).u32(LAYOUTRETURN4_FILE);
        w.u64(0).u64(layout::WHOLE_FILE);
        Ops::stateid(w, sid);
        w.opaque(b"");
        let mut res = self.compound(&ops, &[]).await?;
        res.ok(OP_PUTFH, &"PUTFH")?;
        res.ok(OP_LAYOUTRETURN, &"LAYOUTRETURN")
    }

    /// WRITE of `data` (given in pieces, sent as they are) at `offset`: (count, committed, verifier).
    pub async fn write(
        &self,
        fh: &[u8],
        sid: &Stateid,
        offset: u64,
        stable: u32,
        data: &[&[u8]],
    ) -> Result<(u32, u32, [u8; 8])> {
        let len: usize = data.iter().map(|d| d.len()).sum();
        let mut ops = Ops::default();
        let w = ops.putfh(fh).op(OP_WRITE);
        Ops::stateid(w, sid);
        w.u64(offset).u32(stable).u32(len as u32);
        let pad = [0u8; 3];
        let mut tail: Vec<&[u8]> = data.to_vec();
        tail.push(&pad[..(4 - len % 4) % 4]);
        let mut res = self.compound(&ops, &tail).await?;
        res.ok(OP_PUTFH, &"PUTFH")?;
        res.ok(OP_WRITE, &format_args!("WRITE of {len} bytes at offset {offset}"))?;
        res.with("WRITE", |r| Ok((r.u32()?, r.u32()?, r.fixed(8)?.try_into().expect("8 bytes"))))
    }

    /// READ of `count` bytes at `offset`: the reply, eof, and where the data lies in it.
    pub async fn read(&self, fh: &[u8], sid: &Stateid, offset: u64, count: u32) -> Result<(Reply, bool, Range<usize>)> {
        let mut ops = Ops::default();
        let w = ops.putfh(fh).op(OP_READ);
        Ops::stateid(w, sid);
        w.u64(offset).u32(count);
        let mut res = self.compound(&ops, &[]).await?;
        res.ok(OP_PUTFH, &"PUTFH")?;
        res.ok(OP_READ, &format_args!("READ of {count} bytes at offset {offset}"))?;
        let (eof, range) = res.read_data(count as usize)?;
        Ok((res, eof, range))
    }

    /// COMMIT of the whole file: the write verifier.
    pub async fn commit(&self, fh: &[u8]) -> Result<[u8; 8]> {
        let mut ops = Ops::default();
        ops.putfh(fh).op(OP_COMMIT).u64(0).u32(0);
        let mut res = self.compound(&ops, &[]).await?;
        res.ok(OP_PUTFH, &"PUTFH")?;
        res.ok(OP_COMMIT, &"COMMIT")?;
        res.with("COMMIT", |r| Ok(r.fixed(8)?.try_into().expect("8 bytes")))
    }
}

/// A compound without SEQUENCE (EXCHANGE_ID, CREATE_SESSION), retried on NFS4ERR_DELAY.
async fn sessionless(conn: &Conn, ops: &Ops) -> Result<Reply> {
    let mut head = Writer::new();
    head.opaque(TAG).u32(1).u32(ops.n);
    let mut pause_ms = 5u64;
    for attempt in 0.. {
        let (buf, at) = conn.call(&[&head.buf, &ops.w.buf]).await?;
        let res = Reply::parse(conn.server.clone(), buf, at)?;
        if res.status == NFS4ERR_DELAY && attempt < RETRIES_MAX {
            // Asked to call again later.
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            pause_ms = (pause_ms * 2).min(1000);
            continue;
        }
        return Ok(res);
    }
    unreachable!("the loop returns")
}
