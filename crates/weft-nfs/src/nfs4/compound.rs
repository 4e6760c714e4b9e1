//! COMPOUND (RFC 8881 §16.2, §2.10.6): minor version 1 only; SEQUENCE first (or one session-less op alone:
//! EXCHANGE_ID, CREATE_SESSION, DESTROY_SESSION, DESTROY_CLIENTID, BIND_CONN_TO_SESSION); ops run in order and
//! the first error ends the compound. A compound may hold at most the session's `ca_maxoperations` ops and its
//! reply at most `ca_maxresponsesize` bytes (NFS4ERR_REP_TOO_BIG for the op that would pass it); the reply is
//! kept in the SEQUENCE slot, so a retry gets it again without running anything twice.

use std::net::SocketAddr;

use bytes::Bytes;
use weft_client::Client;

use super::consts::*;
use super::decode::{self, COMPOUND_OPS_MAX, Op};
use super::state::{ChannelAttrs, SeqOutcome, State, Stateid};
use crate::Gateway;
use crate::rpc::{self, Call};
use crate::xdr::{Reader, Writer, XdrError, pad_of};

/// What ops of one compound share: the caller, the current and saved filehandles, the session.
pub struct Ctx<'g> {
    pub gw: &'g Gateway,
    pub c: Client,
    pub rec: &'g Bytes,
    pub cur: Option<u64>,
    pub saved: Option<u64>,
    pub clientid: Option<u64>,
    pub session: Option<([u8; 16], u32)>,
    pub fore: Option<ChannelAttrs>,
    /// The current stateid (§16.2.3.1.2), set by OPEN and LOCK.
    pub cur_stateid: Option<Stateid>,
    /// The TCP connection the call came on (it can carry callbacks); `None` over RDMA.
    pub conn: Option<std::sync::Arc<super::callback::BackConn>>,
    /// SEQUENCE's sa_cachethis: the reply must fit the session's cached reply size (NFS4ERR_REP_TOO_BIG_TO_CACHE
    /// for the op that would pass it, §18.46.3).
    pub cache_this: bool,
    /// Reply bytes encoded so far, RPC header, compound header and tag included (bounds READ and READDIR to the
    /// session's reply size, which counts all of them).
    pub reply_bytes: usize,
    /// The transport the call came on (GETDEVICEINFO answers data-server addresses of the same kind).
    pub transport: crate::Transport,
    /// Who the call's credential names (the client-level ops check it: [`super::state::Principal`]).
    pub principal: super::state::Principal,
    /// The IP address the call came from (clients per address are bounded).
    pub peer: std::net::IpAddr,
}

impl Ctx<'_> {
    pub fn cur(&self) -> Result<u64, u32> {
        self.cur.ok_or(NFS4ERR_NOFILEHANDLE)
    }

    pub fn clientid(&self) -> Result<u64, u32> {
        self.clientid.ok_or(NFS4ERR_OP_NOT_IN_SESSION)
    }

    /// The bytes an op's result body may still take (its op code and status, 8 bytes, and 8 of its own fixed
    /// fields already counted).
    pub fn reply_room(&self) -> usize {
        let max = self.fore.map_or(crate::proto::IO_BYTES_MAX as usize + 4096, |f| f.reply_bytes_max as usize);
        max.saturating_sub(self.reply_bytes + 16)
    }

    /// A stateid as given, or the current stateid if it is the special "current" one.
    pub fn stateid(&self, id: Stateid) -> Stateid {
        if id == Stateid::CURRENT { self.cur_stateid.unwrap_or(Stateid::INVALID) } else { id }
    }
}

/// An accepted RPC reply header with an AUTH_NONE verifier (24 bytes) and the compound's status, tag length and
/// result count (12).
pub(crate) const HEAD_BYTES: usize = 24 + 12;

/// Where op `i` of a compound of `ops` stands (RFC 8881 §2.10.6, §18.46): `None` when it may run there, else the
/// status it gets (SEQUENCE first, or one session-less op alone). Shared by the gateway and the pNFS data server.
pub(crate) fn placement(i: u32, ops: u32, op: &Op<'_>) -> Option<u32> {
    if i == 0 {
        if matches!(op, Op::Sequence { .. }) {
            None
        } else if sessionless(op) {
            (ops != 1).then_some(NFS4ERR_NOT_ONLY_OP)
        } else {
            Some(NFS4ERR_OP_NOT_IN_SESSION)
        }
    } else if matches!(op, Op::Sequence { .. }) {
        Some(NFS4ERR_SEQUENCE_POS)
    } else if matches!(op, Op::BindConn { .. }) {
        // EXCHANGE_ID, CREATE_SESSION, DESTROY_SESSION and DESTROY_CLIENTID may follow a SEQUENCE (§18.35.3,
        // §18.36.3, §18.37.3, §18.50.3); BIND_CONN_TO_SESSION is always alone (§18.34.3).
        Some(NFS4ERR_NOT_ONLY_OP)
    } else {
        None
    }
}

/// What a SEQUENCE decided.
pub(crate) enum Sequenced {
    /// A retry: the whole reply body kept in the slot, to answer as it is.
    Replay(Vec<u8>),
    /// A new request on the slot (its reply is kept by `State::finish`): SEQUENCE's status and result, the
    /// session's client and fore channel.
    New { clientid: u64, fore: ChannelAttrs, status: u32, body: Writer },
    /// Refused (bad session or slot, misordered, in use).
    Refused(u32),
}

/// SEQUENCE (RFC 8881 §18.46) of a compound of `ops` ops whose arguments are `args_len` bytes, on `nfs4`'s slot
/// tables: the gateway's and the pNFS data server's shared step.
pub(crate) fn sequence(
    nfs4: &super::Server,
    sessionid: &[u8; 16],
    seqid: u32,
    slot: u32,
    ops: u32,
    args_len: usize,
) -> Sequenced {
    let now = nfs4.now_ms();
    let (outcome, attrs) = {
        let mut st = nfs4.state();
        let o = st.sequence(sessionid, slot, seqid, now);
        (o, st.session_attrs(sessionid))
    };
    match outcome {
        Ok(SeqOutcome::Replay(cached)) => Sequenced::Replay(cached),
        Ok(SeqOutcome::New { clientid, highest_slot }) => {
            let fore = attrs.expect("a session just found").1;
            let (status, body) = if ops > fore.ops_max {
                (NFS4ERR_TOO_MANY_OPS, Writer::new())
            } else if args_len > fore.request_bytes_max as usize {
                (NFS4ERR_REQ_TOO_BIG, Writer::new())
            } else {
                // sr_status_flags: the back channel's state (RFC 8881 §18.46.3), so a client rebinds one.
                let flags = nfs4.channels().status_flags(sessionid);
                let mut w = Writer::new();
                w.fixed(sessionid).u32(seqid).u32(slot).u32(highest_slot).u32(highest_slot).u32(flags);
                (NFS4_OK, w)
            };
            Sequenced::New { clientid, fore, status, body }
        }
        Err(s) => Sequenced::Refused(s),
    }
}

/// Ops served without a session, each alone in its compound.
pub(crate) fn sessionless(op: &Op<'_>) -> bool {
    matches!(
        op,
        Op::ExchangeId { .. }
            | Op::CreateSession { .. }
            | Op::DestroySession(_)
            | Op::DestroyClientid(_)
            | Op::BindConn { .. }
    )
}

/// The op code of a decoded op's result.
pub(crate) fn code_of(code: u32, decoded: &Result<Op<'_>, XdrError>) -> u32 {
    match decoded {
        Err(XdrError::BadDiscriminant(d)) if *d == code => OP_ILLEGAL,
        _ => code,
    }
}

/// Replies up to this size that carry a READ's data are copied whole into their slot for an exact retry; a larger
/// READ is idempotent and its retry gets NFS4ERR_RETRY_UNCACHED_REP (copying every large READ would undo its
/// zero-copy tail).
pub(crate) const CACHE_COPY_BYTES_MAX: usize = 16 << 10;

/// A READ's data stays its result's tail only when that result is the compound's last (`last`); otherwise it is
/// copied in (never for Linux, which ends a compound with its READ).
pub(crate) fn inline_tail_unless_last(body: &mut Writer, last: bool) {
    if !last && let Some(t) = body.tail.take() {
        body.buf.extend_from_slice(&t);
        body.buf.extend_from_slice(pad_of(t.len()));
    }
}

/// Keeps a finished compound's reply (`body`, then `tail` and its padding) in its slot: whole when it has no tail or
/// a small one, else not at all (see [`CACHE_COPY_BYTES_MAX`]).
pub(crate) fn keep_reply(st: &mut State, sessionid: &[u8; 16], slot: u32, body: &[u8], tail: Option<&Bytes>) {
    match tail {
        None => st.finish(sessionid, slot, body),
        Some(t) if body.len() + t.len() + 3 <= CACHE_COPY_BYTES_MAX => {
            let mut whole = Vec::with_capacity(body.len() + t.len() + 3);
            whole.extend_from_slice(body);
            whole.extend_from_slice(t);
            whole.extend_from_slice(pad_of(t.len()));
            st.finish(sessionid, slot, &whole);
        }
        Some(_) => st.finish_uncached(sessionid, slot),
    }
}

/// Whether a reply of `bytes` (RPC and compound headers included) passes what the session allows: its reply
/// size (NFS4ERR_REP_TOO_BIG), or its cached reply size when SEQUENCE asked for the reply to be cached
/// (NFS4ERR_REP_TOO_BIG_TO_CACHE).
fn reply_too_big(cx: &Ctx<'_>, bytes: usize) -> Option<u32> {
    let fore = cx.fore?;
    if bytes > fore.reply_bytes_max as usize {
        Some(NFS4ERR_REP_TOO_BIG)
    } else if cx.cache_this && bytes > fore.cached_reply_bytes_max as usize {
        Some(NFS4ERR_REP_TOO_BIG_TO_CACHE)
    } else {
        None
    }
}

/// Runs one NFSv4 call; returns the reply message (a READ's data, when the compound's last result, as its tail).
pub async fn call(
    gw: &Gateway,
    call: &Call<'_>,
    rec: &Bytes,
    peer: SocketAddr,
    conn: Option<std::sync::Arc<super::callback::BackConn>>,
) -> rpc::Reply {
    match call.proc_ {
        0 => return rpc::accepted(call.xid, rpc::SUCCESS).buf.into(),
        1 => {}
        _ => return rpc::accepted(call.xid, rpc::PROC_UNAVAIL).buf.into(),
    }
    let mut r = Reader::new(call.args);
    let h = match decode::header(&mut r) {
        Ok(h) => h,
        Err(e) => {
            tracing::info!(%peer, error = %e, "NFSv4 COMPOUND header malformed");
            return rpc::accepted(call.xid, rpc::GARBAGE_ARGS).buf.into();
        }
    };
    let mut out = rpc::accepted(call.xid, rpc::SUCCESS);
    let tag = h.tag.to_vec();
    let empty = |out: &mut Writer, status: u32| {
        out.u32(status).opaque(&tag).u32(0);
    };
    if h.minor != 1 {
        empty(&mut out, NFS4ERR_MINOR_VERS_MISMATCH);
        return out.buf.into();
    }
    if h.ops > COMPOUND_OPS_MAX {
        empty(&mut out, NFS4ERR_TOO_MANY_OPS);
        return out.buf.into();
    }
    // Leases run out here: every compound sweeps (the tables are bounded, so this is bounded work).
    let owners = {
        let now = gw.nfs4.now_ms();
        let mut st = gw.nfs4.state();
        let owners = st.expire(now);
        // Recalled layouts not returned by their deadline are revoked here too.
        for (clientid, ino) in st.recall_expire(now) {
            tracing::warn!(
                clientid = format_args!("{clientid:#x}"),
                ino,
                "pNFS layout recalled and not returned in time: revoked"
            );
        }
        let sessions = st.counts().1;
        let mut ch = gw.nfs4.channels();
        if ch.len() > sessions {
            ch.retain(|s| st.session_alive(s));
        }
        owners
    };
    for o in owners {
        if let Err(e) = gw.client.release_locks(None, Some(o)).await {
            tracing::warn!(owner = o, error = %e, "releasing an expired NFSv4 client's locks");
        }
    }
    let mut cx = Ctx {
        gw,
        c: gw.client_for(&call.auth),
        rec,
        cur: None,
        saved: None,
        clientid: None,
        session: None,
        fore: None,
        cur_stateid: None,
        conn,
        cache_this: false,
        reply_bytes: HEAD_BYTES + tag.len().div_ceil(4) * 4,
        transport: call.transport,
        principal: super::state::Principal::of(&call.auth),
        peer: peer.ip(),
    };
    let head = cx.reply_bytes;
    let mut results = Writer::new();
    let mut done = 0u32;
    let mut status = NFS4_OK;
    for i in 0..h.ops {
        let code = match r.u32() {
            Ok(c) => c,
            Err(_) => {
                results.u32(OP_ILLEGAL).u32(NFS4ERR_BADXDR);
                done += 1;
                status = NFS4ERR_BADXDR;
                break;
            }
        };
        let decoded = decode::op(code, &mut r);
        let rcode = code_of(code, &decoded);
        let op = match decoded {
            Ok(op) => op,
            Err(e) => {
                status = if rcode == OP_ILLEGAL { NFS4ERR_OP_ILLEGAL } else { NFS4ERR_BADXDR };
                tracing::info!(%peer, op = code, error = %e, "NFSv4 op malformed");
                results.u32(rcode).u32(status);
                done += 1;
                break;
            }
        };
        let placement = placement(i, h.ops, &op);
        let (st, mut body) = match placement {
            Some(s) => (s, Writer::new()),
            None => match op {
                Op::Sequence { sessionid, seqid, slot, highest_slot: _, cache_this } => {
                    match sequence(&gw.nfs4, &sessionid, seqid, slot, h.ops, call.args.len()) {
                        Sequenced::Replay(cached) => {
                            tracing::debug!(%peer, slot, seqid, "NFSv4 replay answered from the slot");
                            out.buf.extend_from_slice(&cached);
                            return out.buf.into();
                        }
                        Sequenced::New { clientid, fore, status, body } => {
                            cx.clientid = Some(clientid);
                            cx.session = Some((sessionid, slot));
                            cx.fore = Some(fore);
                            cx.cache_this = cache_this;
                            (status, body)
                        }
                        Sequenced::Refused(s) => (s, Writer::new()),
                    }
                }
                op => {
                    // Every op but the data-carrying ones, at trace level (the lock/state steps of a client).
                    if tracing::enabled!(tracing::Level::TRACE) && !matches!(op, Op::Write { .. }) {
                        tracing::trace!(%peer, ?op, "NFSv4 op");
                    }
                    let (s, w) = if sessionless(&op) {
                        super::session_ops::run(&mut cx, op).await
                    } else {
                        super::ops::run(&mut cx, op).await
                    };
                    (s, w)
                }
            },
        };
        done += 1;
        status = st;
        inline_tail_unless_last(&mut body, i + 1 == h.ops || st != NFS4_OK);
        if let Some(too_big) = reply_too_big(&cx, head + results.buf.len() + 8 + body.len()) {
            results.u32(rcode).u32(too_big);
            status = too_big;
            break;
        }
        results.u32(rcode).u32(st);
        results.buf.extend_from_slice(&body.buf);
        results.tail = body.tail;
        cx.reply_bytes = head + results.len();
        if st != NFS4_OK {
            if st == NFS4ERR_DENIED {
                tracing::trace!(%peer, op = code, "NFSv4 op denied");
            } else {
                tracing::debug!(%peer, op = code, status = st, "NFSv4 op failed");
            }
            break;
        }
    }
    let mut body = Writer::new();
    body.u32(status).opaque(&tag).u32(done);
    body.buf.extend_from_slice(&results.buf);
    if let Some((sid, slot)) = cx.session {
        keep_reply(&mut gw.nfs4.state(), &sid, slot, &body.buf, results.tail.as_ref());
    }
    out.buf.extend_from_slice(&body.buf);
    rpc::Reply { head: out.buf, tail: results.tail }
}
