//! ONC RPC v2 (RFC 5531) over TCP: record marking (§11), the call header, AUTH_NONE and AUTH_SYS credentials
//! (Appendix A), and the reply headers the gateway sends.
//!
//! Every record is bounded ([`RecordLimits`]) before a byte of it is buffered; a record over the bound is a
//! [`RecordError`] and the connection is closed, since its remaining bytes cannot be skipped safely.

use std::io::IoSlice;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::xdr::{Reader, Writer, XdrError};

pub const RPC_VERSION: u32 = 2;
pub const MSG_CALL: u32 = 0;
pub const MSG_REPLY: u32 = 1;

pub const AUTH_NONE: u32 = 0;
pub const AUTH_SYS: u32 = 1;

/// accept_stat.
pub const SUCCESS: u32 = 0;
pub const PROG_UNAVAIL: u32 = 1;
pub const PROG_MISMATCH: u32 = 2;
pub const PROC_UNAVAIL: u32 = 3;
pub const GARBAGE_ARGS: u32 = 4;
pub const SYSTEM_ERR: u32 = 5;

/// auth_stat.
pub const AUTH_BADCRED: u32 = 1;
pub const AUTH_TOOWEAK: u32 = 5;

/// An opaque_auth body is at most 400 bytes (RFC 5531 §8.2).
pub const AUTH_BODY_MAX: usize = 400;
/// AUTH_SYS: machine name at most 255 bytes, at most 16 groups (Appendix A).
pub const MACHINE_NAME_MAX: usize = 255;
pub const AUTH_SYS_GROUPS_MAX: usize = 16;

/// Bounds of one record.
#[derive(Debug, Clone, Copy)]
pub struct RecordLimits {
    /// The largest record (all fragments together) accepted: a WRITE of `wtmax` bytes plus its headers fits.
    pub record_bytes_max: usize,
    /// The most fragments one record may have (zero-length fragments cost nothing else, so they are counted).
    pub fragments_max: u32,
}

impl Default for RecordLimits {
    fn default() -> Self {
        RecordLimits { record_bytes_max: (1 << 20) + 4096, fragments_max: 1024 }
    }
}

/// Why a record could not be read; each closes the connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    #[error("record of at least {len} bytes is over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("record has more than {0} fragments")]
    TooManyFragments(u32),
    #[error("connection closed inside a record")]
    Truncated,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The record-marking state: one record's length and fragment count so far, shared by the async reader and the
/// pure [`split_records`] (the fuzz target's way in).
#[derive(Debug, Default)]
struct Assembly {
    len: usize,
    fragments: u32,
}

impl Assembly {
    /// Takes a fragment header; returns (fragment length, last fragment?) or an error if the record would
    /// exceed the limits.
    fn fragment(&mut self, header: u32, limits: &RecordLimits) -> Result<(usize, bool), RecordError> {
        let last = header & 0x8000_0000 != 0;
        let len = (header & 0x7fff_ffff) as usize;
        self.fragments += 1;
        if self.fragments > limits.fragments_max {
            return Err(RecordError::TooManyFragments(limits.fragments_max));
        }
        let total = self.len.saturating_add(len);
        if total > limits.record_bytes_max {
            return Err(RecordError::TooLarge { len: total, max: limits.record_bytes_max });
        }
        self.len = total;
        Ok((len, last))
    }
}

/// Reads one whole record. `Ok(None)`: the peer closed the connection between records.
pub async fn read_record<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: &RecordLimits,
) -> Result<Option<Vec<u8>>, RecordError> {
    let mut asm = Assembly::default();
    let mut out = Vec::new();
    loop {
        let mut h = [0u8; 4];
        match r.read_exact(&mut h).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return if asm.fragments == 0 { Ok(None) } else { Err(RecordError::Truncated) };
            }
            Err(e) => return Err(e.into()),
        }
        let (len, last) = asm.fragment(u32::from_be_bytes(h), limits)?;
        // Read into the vector's spare capacity (bounded by the limits checked above): a 1 MiB WRITE is not
        // zero-filled first, and `take` keeps the next record's bytes in the socket.
        let end = out.len() + len;
        out.reserve_exact(len);
        while out.len() < end {
            let want = (end - out.len()) as u64;
            if (&mut *r).take(want).read_buf(&mut out).await? == 0 {
                return Err(RecordError::Truncated);
            }
        }
        if last {
            return Ok(Some(out));
        }
    }
}

/// Splits a byte stream into records as [`read_record`] does; a trailing partial record is `Truncated`.
pub fn split_records(mut stream: &[u8], limits: &RecordLimits) -> Result<Vec<Vec<u8>>, RecordError> {
    let mut records = Vec::new();
    let mut asm = Assembly::default();
    let mut cur = Vec::new();
    while !stream.is_empty() {
        if stream.len() < 4 {
            return Err(RecordError::Truncated);
        }
        let header = u32::from_be_bytes([stream[0], stream[1], stream[2], stream[3]]);
        let (len, last) = asm.fragment(header, limits)?;
        stream = &stream[4..];
        if stream.len() < len {
            return Err(RecordError::Truncated);
        }
        cur.extend_from_slice(&stream[..len]);
        stream = &stream[len..];
        if last {
            records.push(std::mem::take(&mut cur));
            asm = Assembly::default();
        }
    }
    if asm.fragments != 0 {
        return Err(RecordError::Truncated);
    }
    Ok(records)
}

/// One record holding `body` (one fragment).
pub fn encode_record(body: &[u8]) -> Vec<u8> {
    assert!(body.len() < 0x8000_0000, "a fragment is under 2 GiB");
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(0x8000_0000u32 | body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A reply message to send: `head`, then the bytes of an XDR opaque that ends the message (a READ's data,
/// sent from the buffer it was read into) and their padding ([`crate::xdr::Writer::tail`]).
#[derive(Debug, Default)]
pub struct Reply {
    pub head: Vec<u8>,
    pub tail: Option<Bytes>,
}

impl From<Vec<u8>> for Reply {
    fn from(head: Vec<u8>) -> Reply {
        Reply { head, tail: None }
    }
}

impl From<Writer> for Reply {
    fn from(w: Writer) -> Reply {
        Reply { head: w.buf, tail: w.tail }
    }
}

/// Sends `reply` as one record of one fragment: record mark, head, tail and padding in vectored writes, so the
/// tail is never copied into another buffer.
pub async fn write_reply<W: AsyncWrite + Unpin>(w: &mut W, reply: &Reply) -> std::io::Result<()> {
    let tail: &[u8] = reply.tail.as_deref().unwrap_or(&[]);
    let pad = crate::xdr::pad_of(tail.len());
    let len = reply.head.len() + tail.len() + pad.len();
    assert!(len < 0x8000_0000, "a fragment is under 2 GiB");
    let mark = (0x8000_0000u32 | len as u32).to_be_bytes();
    let mut slices = [IoSlice::new(&mark), IoSlice::new(&reply.head), IoSlice::new(tail), IoSlice::new(pad)];
    let mut left = &mut slices[..];
    // Counted in bytes, not slices: an empty tail or padding stays in `left` and must not end the loop early
    // (or be written as a zero-length write, which reads as WriteZero).
    let mut bytes_left = mark.len() + len;
    while bytes_left > 0 {
        let n = w.write_vectored(left).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        bytes_left -= n;
        IoSlice::advance_slices(&mut left, n);
    }
    w.flush().await
}

/// The caller's credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    Sys { stamp: u32, machine: String, uid: u32, gid: u32, gids: Vec<u32> },
}

/// A decoded call header; `args` are the procedure's undecoded arguments.
#[derive(Debug)]
pub struct Call<'a> {
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    pub auth: Auth,
    pub args: &'a [u8],
    /// The transport the call came on ([`crate::Gateway::handle_record`] sets it; [`parse_call`] says TCP).
    pub transport: crate::Transport,
}

/// A call header that cannot be served; the variant says what the reply (if any) is.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// Not even a transaction id: nothing can be answered; the connection is closed.
    #[error("record too short for an RPC header")]
    NoXid,
    /// A reply or unknown message type: dropped (RFC 5531 has no answer for it).
    #[error("message type {1} is not a call (xid {0:#x})")]
    NotCall(u32, u32),
    /// MSG_DENIED RPC_MISMATCH (2, 2).
    #[error("RPC version {1}, not 2 (xid {0:#x})")]
    RpcMismatch(u32, u32),
    /// MSG_DENIED AUTH_ERROR with this auth_stat.
    #[error("credential refused (auth_stat {1}, xid {0:#x}): {2}")]
    Auth(u32, u32, String),
    /// MSG_ACCEPTED GARBAGE_ARGS: the header after the credential is malformed.
    #[error("malformed call header (xid {0:#x}): {1}")]
    Garbage(u32, XdrError),
}

impl CallError {
    pub fn xid(&self) -> Option<u32> {
        match self {
            CallError::NoXid => None,
            CallError::NotCall(x, _) | CallError::RpcMismatch(x, _) | CallError::Auth(x, ..) => Some(*x),
            CallError::Garbage(x, _) => Some(*x),
        }
    }

    /// The reply this error gets, if any.
    pub fn reply(&self) -> Option<Vec<u8>> {
        match self {
            CallError::NoXid | CallError::NotCall(..) => None,
            CallError::RpcMismatch(x, _) => {
                let mut w = denied(*x, 0);
                w.u32(RPC_VERSION).u32(RPC_VERSION);
                Some(w.buf)
            }
            CallError::Auth(x, stat, _) => {
                let mut w = denied(*x, 1);
                w.u32(*stat);
                Some(w.buf)
            }
            CallError::Garbage(x, _) => Some(accepted(*x, GARBAGE_ARGS).buf),
        }
    }
}

/// Decodes a call header (RFC 5531 §9) and its credential.
pub fn parse_call(rec: &[u8]) -> Result<Call<'_>, CallError> {
    let mut r = Reader::new(rec);
    let xid = r.u32().map_err(|_| CallError::NoXid)?;
    let mtype = r.u32().map_err(|_| CallError::NoXid)?;
    if mtype != MSG_CALL {
        return Err(CallError::NotCall(xid, mtype));
    }
    let garbage = |e| CallError::Garbage(xid, e);
    let rpcvers = r.u32().map_err(garbage)?;
    if rpcvers != RPC_VERSION {
        return Err(CallError::RpcMismatch(xid, rpcvers));
    }
    let prog = r.u32().map_err(garbage)?;
    let vers = r.u32().map_err(garbage)?;
    let proc_ = r.u32().map_err(garbage)?;
    let bad_cred = |e: XdrError| CallError::Auth(xid, AUTH_BADCRED, e.to_string());
    let flavor = r.u32().map_err(bad_cred)?;
    let body = r.opaque(AUTH_BODY_MAX).map_err(bad_cred)?;
    let auth = match flavor {
        AUTH_NONE => Auth::None,
        AUTH_SYS => parse_auth_sys(body).map_err(bad_cred)?,
        other => return Err(CallError::Auth(xid, AUTH_TOOWEAK, format!("auth flavor {other} is not served"))),
    };
    // The verifier: AUTH_NONE or AUTH_SYS callers send AUTH_NONE; its body is skipped, bounded.
    r.u32().map_err(garbage)?;
    r.opaque(AUTH_BODY_MAX).map_err(garbage)?;
    Ok(Call { xid, prog, vers, proc_, auth, args: r.rest(), transport: crate::Transport::Tcp })
}

/// The AUTH_SYS body (`authsys_parms`), all of it: trailing bytes are an error.
pub fn parse_auth_sys(body: &[u8]) -> Result<Auth, XdrError> {
    let mut r = Reader::new(body);
    let stamp = r.u32()?;
    let machine = String::from_utf8_lossy(r.opaque(MACHINE_NAME_MAX)?).into_owned();
    let uid = r.u32()?;
    let gid = r.u32()?;
    let n = r.u32()? as usize;
    if n > AUTH_SYS_GROUPS_MAX {
        return Err(XdrError::TooLong { len: n as u64, max: AUTH_SYS_GROUPS_MAX });
    }
    let mut gids = Vec::with_capacity(n);
    for _ in 0..n {
        gids.push(r.u32()?);
    }
    if r.remaining() != 0 {
        return Err(XdrError::TooLong { len: body.len() as u64, max: r.position() });
    }
    Ok(Auth::Sys { stamp, machine, uid, gid, gids })
}

/// Encodes an AUTH_SYS credential (tests and the test client).
pub fn encode_auth_sys(w: &mut Writer, uid: u32, gid: u32, gids: &[u32]) {
    let mut b = Writer::new();
    b.u32(0).opaque(b"weft-test").u32(uid).u32(gid).u32(gids.len() as u32);
    for g in gids {
        b.u32(*g);
    }
    w.u32(AUTH_SYS).opaque(&b.buf);
}

/// Encodes a call header with an AUTH_SYS credential (or AUTH_NONE with `cred` None) and no verifier.
pub fn encode_call(xid: u32, prog: u32, vers: u32, proc_: u32, cred: Option<(u32, u32, &[u32])>) -> Writer {
    let mut w = Writer::new();
    w.u32(xid).u32(MSG_CALL).u32(RPC_VERSION).u32(prog).u32(vers).u32(proc_);
    match cred {
        Some((uid, gid, gids)) => encode_auth_sys(&mut w, uid, gid, gids),
        None => {
            w.u32(AUTH_NONE).u32(0);
        }
    }
    w.u32(AUTH_NONE).u32(0);
    w
}

/// MSG_ACCEPTED with `stat` and an AUTH_NONE verifier; the caller appends the results (or mismatch info).
pub fn accepted(xid: u32, stat: u32) -> Writer {
    let mut w = Writer::new();
    w.u32(xid).u32(MSG_REPLY).u32(0).u32(AUTH_NONE).u32(0).u32(stat);
    w
}

/// MSG_DENIED with reject_stat `reject` (0 RPC_MISMATCH, 1 AUTH_ERROR); the caller appends its body.
pub fn denied(xid: u32, reject: u32) -> Writer {
    let mut w = Writer::new();
    w.u32(xid).u32(MSG_REPLY).u32(1).u32(reject);
    w
}

/// A decoded reply header (tests and the fuzz target check what the gateway sends).
#[derive(Debug, PartialEq, Eq)]
pub enum ReplyHead<'a> {
    Accepted { xid: u32, stat: u32, rest: &'a [u8] },
    Denied { xid: u32, reject: u32, rest: &'a [u8] },
}

pub fn parse_reply(rec: &[u8]) -> Result<ReplyHead<'_>, XdrError> {
    let mut r = Reader::new(rec);
    let xid = r.u32()?;
    let mtype = r.u32()?;
    if mtype != MSG_REPLY {
        return Err(XdrError::BadDiscriminant(mtype));
    }
    match r.u32()? {
        0 => {
            r.u32()?;
            r.opaque(AUTH_BODY_MAX)?;
            let stat = r.u32()?;
            Ok(ReplyHead::Accepted { xid, stat, rest: r.rest() })
        }
        1 => {
            let reject = r.u32()?;
            Ok(ReplyHead::Denied { xid, reject, rest: r.rest() })
        }
        d => Err(XdrError::BadDiscriminant(d)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_split_and_bound() {
        let limits = RecordLimits { record_bytes_max: 16, fragments_max: 3 };
        let mut s = Vec::new();
        s.extend_from_slice(&3u32.to_be_bytes());
        s.extend_from_slice(b"abc");
        s.extend_from_slice(&(0x8000_0000u32 | 2).to_be_bytes());
        s.extend_from_slice(b"de");
        s.extend_from_slice(&encode_record(b"xyz"));
        assert_eq!(split_records(&s, &limits).unwrap(), vec![b"abcde".to_vec(), b"xyz".to_vec()]);
        let huge = (0x8000_0000u32 | 0x7fff_ffff).to_be_bytes();
        assert!(matches!(split_records(&huge, &limits), Err(RecordError::TooLarge { .. })));
        let zeros = [0u8; 16];
        assert!(matches!(split_records(&zeros, &limits), Err(RecordError::TooManyFragments(3))));
        assert!(matches!(split_records(&s[..6], &limits), Err(RecordError::Truncated)));
    }

    /// A reply with a tail arrives as one record equal to head ++ tail ++ padding, through a pipe so small that
    /// every write is partial (a slice split anywhere, the empty tail and padding of a small reply included);
    /// and records read back-to-back stay apart.
    #[tokio::test]
    async fn replies_with_tails_are_one_record_and_records_stay_apart() {
        let limits = RecordLimits::default();
        let replies: Vec<Reply> = (0..7usize)
            .map(|n| Reply {
                head: vec![n as u8; 4 + n],
                tail: (n % 2 == 1).then(|| Bytes::from((0..n * 1000 + n).map(|i| i as u8).collect::<Vec<u8>>())),
            })
            .collect();
        let want: Vec<Vec<u8>> = replies
            .iter()
            .map(|r| {
                let mut v = r.head.clone();
                if let Some(t) = &r.tail {
                    v.extend_from_slice(t);
                    v.extend_from_slice(crate::xdr::pad_of(t.len()));
                }
                v
            })
            .collect();
        let (mut a, mut b) = tokio::io::duplex(7);
        let writer = tokio::spawn(async move {
            for r in &replies {
                write_reply(&mut a, r).await.unwrap();
            }
        });
        for w in &want {
            assert_eq!(&read_record(&mut b, &limits).await.unwrap().unwrap(), w);
        }
        writer.await.unwrap();
        assert!(read_record(&mut b, &limits).await.unwrap().is_none(), "the pipe ends between records");
    }

    #[test]
    fn call_headers_decode_and_refuse() {
        let mut w = encode_call(9, 100003, 3, 1, Some((1000, 100, &[4, 5])));
        w.u32(77);
        let c = parse_call(&w.buf).unwrap();
        assert_eq!((c.xid, c.prog, c.vers, c.proc_, c.args), (9, 100003, 3, 1, &77u32.to_be_bytes()[..]));
        assert_eq!(c.auth, Auth::Sys { stamp: 0, machine: "weft-test".into(), uid: 1000, gid: 100, gids: vec![4, 5] });
        let mut bad = w.buf.clone();
        bad[8..12].copy_from_slice(&3u32.to_be_bytes());
        assert_eq!(parse_call(&bad).unwrap_err(), CallError::RpcMismatch(9, 3));
        let mut kerb = w.buf.clone();
        kerb[24..28].copy_from_slice(&6u32.to_be_bytes());
        assert!(matches!(parse_call(&kerb), Err(CallError::Auth(9, AUTH_TOOWEAK, _))));
        // 17 groups is over AUTH_SYS's limit.
        let gids: Vec<u32> = (0..17).collect();
        let w = encode_call(1, 100003, 3, 0, Some((1, 1, &gids)));
        assert!(matches!(parse_call(&w.buf), Err(CallError::Auth(1, AUTH_BADCRED, _))));
        assert_eq!(parse_call(&[0, 0]).unwrap_err(), CallError::NoXid);
        let reply = CallError::Garbage(5, XdrError::BadBool(3)).reply().unwrap();
        assert_eq!(parse_reply(&reply).unwrap(), ReplyHead::Accepted { xid: 5, stat: GARBAGE_ARGS, rest: &[] });
    }
}
