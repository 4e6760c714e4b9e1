//! The NFSv4.1 back channel (RFC 8881 §2.10.3.1, §18.33, §18.34, §18.36, §20.3, §20.9): the gateway calls a
//! client back (CB_COMPOUND of CB_SEQUENCE and CB_LAYOUTRECALL) on the client's own TCP connection, the one it
//! bound for callbacks with CREATE_SESSION's `CREATE_SESSION4_FLAG_CONN_BACK_CHAN` or BIND_CONN_TO_SESSION.
//!
//! [`BackConn`] is one TCP connection's side of it: the connection's reader hands every REPLY it reads (message
//! type REPLY) to the callback waiting for that xid. [`Channels`] is the per-session back channel table (pure: the caller
//! holds the lock and the clock): the callback program and credential, the connection, the back channel's one
//! slot's sequence id, whether the channel is down (SEQUENCE then reports `SEQ4_STATUS_CB_PATH_DOWN_SESSION`),
//! and how many callbacks wait for the slot (bounded: past `callbacks_max` a callback is not queued and its
//! layout is revoked, docs/format.md §21 and §24).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::oneshot;

use super::layout::{IOMODE_ANY, LAYOUT4_NFSV4_1_FILES, WHOLE_FILE};
use super::state::Stateid;
use crate::rpc::{self, ReplyHead};
use crate::xdr::{Reader, Writer, XdrError};

/// CB_COMPOUND's version and procedure (RFC 8881 §20: program `csa_cb_program`, version 1, proc 1).
pub const CB_VERSION: u32 = 1;
pub const CB_PROC_COMPOUND: u32 = 1;
pub const OP_CB_LAYOUTRECALL: u32 = 5;
pub const OP_CB_SEQUENCE: u32 = 11;
pub const LAYOUTRECALL4_FILE: u32 = 1;

/// SEQUENCE's `sr_status_flags` (RFC 8881 §18.46.3).
pub const SEQ4_STATUS_CB_PATH_DOWN: u32 = 0x1;
pub const SEQ4_STATUS_CB_PATH_DOWN_SESSION: u32 = 0x200;

/// CREATE_SESSION's flag (RFC 8881 §18.36.3).
pub const CREATE_SESSION4_FLAG_CONN_BACK_CHAN: u32 = 0x2;

/// BIND_CONN_TO_SESSION's directions (RFC 8881 §18.34): asked (`channel_dir_from_client4`) and granted
/// (`channel_dir_from_server4`).
pub const CDFC4_FORE: u32 = 1;
pub const CDFC4_BACK: u32 = 2;
pub const CDFC4_FORE_OR_BOTH: u32 = 3;
pub const CDFC4_BACK_OR_BOTH: u32 = 7;
pub const CDFS4_FORE: u32 = 1;
pub const CDFS4_BACK: u32 = 2;
pub const CDFS4_BOTH: u32 = 3;

/// Ops a CB_COMPOUND reply may list (the gateway sends two).
pub const CB_REPLY_OPS_MAX: usize = 8;

/// The callback credential (`callback_sec_parms4`): AUTH_NONE or AUTH_SYS (RPCSEC_GSS is not served).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CbSec {
    #[default]
    None,
    Sys {
        machine: String,
        uid: u32,
        gid: u32,
    },
}

/// One CB_LAYOUTRECALL of a whole file's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recall {
    /// The file's NFSv4 filehandle.
    pub fh: Vec<u8>,
    /// The layout stateid, its seqid one past the last the client was given.
    pub stateid: Stateid,
}

/// CB_SEQUENCE's arguments: the session, the back channel's slot 0 and its next sequence id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CbSequence {
    pub sessionid: [u8; 16],
    pub seqid: u32,
}

/// The RPC call record (without the record mark) of CB_COMPOUND { CB_SEQUENCE, CB_LAYOUTRECALL } (RFC 8881
/// §20.9.3, §20.3): LAYOUTRECALL4_FILE of `recall.fh`, iomode ANY, offset 0, length all-ones, clora_changed true.
pub fn encode_cb_layoutrecall(xid: u32, prog: u32, sec: &CbSec, seq: &CbSequence, recall: &Recall) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(xid).u32(rpc::MSG_CALL).u32(rpc::RPC_VERSION).u32(prog).u32(CB_VERSION).u32(CB_PROC_COMPOUND);
    match sec {
        CbSec::None => {
            w.u32(rpc::AUTH_NONE).u32(0);
        }
        CbSec::Sys { machine, uid, gid } => {
            let mut body = Writer::new();
            body.u32(0).opaque(machine.as_bytes()).u32(*uid).u32(*gid).u32(0);
            w.u32(rpc::AUTH_SYS).opaque(&body.buf);
        }
    }
    w.u32(rpc::AUTH_NONE).u32(0); // verifier
    // CB_COMPOUND4args: tag, minorversion 1, callback_ident (unused in 4.1), 2 ops.
    w.opaque(b"").u32(1).u32(0).u32(2);
    w.u32(OP_CB_SEQUENCE).fixed(&seq.sessionid).u32(seq.seqid).u32(0).u32(0).bool(false).u32(0);
    w.u32(OP_CB_LAYOUTRECALL).u32(LAYOUT4_NFSV4_1_FILES).u32(IOMODE_ANY).bool(true).u32(LAYOUTRECALL4_FILE);
    w.opaque(&recall.fh).u64(0).u64(WHOLE_FILE).u32(recall.stateid.seqid).fixed(&recall.stateid.other);
    w.buf
}

/// A CB_COMPOUND reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CbReply {
    /// The RPC was refused or not run (denied, PROG_UNAVAIL, GARBAGE_ARGS, …): the reply's stat.
    Rpc { xid: u32, stat: u32 },
    /// The compound ran: its status and each op's (op code, status), in order.
    Compound { xid: u32, status: u32, ops: Vec<(u32, u32)> },
}

impl CbReply {
    pub fn xid(&self) -> u32 {
        match self {
            CbReply::Rpc { xid, .. } | CbReply::Compound { xid, .. } => *xid,
        }
    }

    /// The status of op `code` in the reply, if it got that far.
    pub fn op_status(&self, code: u32) -> Option<u32> {
        match self {
            CbReply::Compound { ops, .. } => ops.iter().find(|(c, _)| *c == code).map(|(_, s)| *s),
            CbReply::Rpc { .. } => None,
        }
    }
}

/// Decodes a CB_COMPOUND reply record (the fuzz target's way in): the RPC reply header, then CB_COMPOUND4res as
/// far as each op's status (CB_SEQUENCE's result body is skipped; CB_LAYOUTRECALL has none).
pub fn decode_cb_reply(rec: &[u8]) -> Result<CbReply, XdrError> {
    let (xid, stat, rest) = match rpc::parse_reply(rec)? {
        ReplyHead::Accepted { xid, stat, rest } => (xid, stat, rest),
        ReplyHead::Denied { xid, reject, .. } => return Ok(CbReply::Rpc { xid, stat: 0x100 | reject }),
    };
    if stat != rpc::SUCCESS {
        return Ok(CbReply::Rpc { xid, stat });
    }
    let mut r = Reader::new(rest);
    let status = r.u32()?;
    r.opaque(1024)?; // tag
    let n = r.u32()? as usize;
    if n > CB_REPLY_OPS_MAX {
        return Err(XdrError::TooLong { len: n as u64, max: CB_REPLY_OPS_MAX });
    }
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        let code = r.u32()?;
        let st = r.u32()?;
        ops.push((code, st));
        if st != 0 {
            break;
        }
        match code {
            // sessionid, sequenceid, slotid, highest_slotid, target_highest_slotid.
            OP_CB_SEQUENCE => {
                r.fixed(16)?;
                r.u32()?;
                r.u32()?;
                r.u32()?;
                r.u32()?;
            }
            OP_CB_LAYOUTRECALL => {}
            // Nothing else was asked: anything after an unknown result cannot be parsed.
            _ => break,
        }
    }
    Ok(CbReply::Compound { xid, status, ops })
}

/// Decodes the `csa_sec_parms` of CREATE_SESSION or BACKCHANNEL_CTL (RFC 8881 §18.36.1): the first AUTH_SYS entry
/// (Linux refuses CB_COMPOUND under AUTH_NONE), else AUTH_NONE; RPCSEC_GSS entries are skipped.
pub fn decode_cb_sec(r: &mut Reader<'_>) -> Result<CbSec, XdrError> {
    let n = r.u32()? as usize;
    if n > CB_SEC_MAX {
        return Err(XdrError::TooLong { len: n as u64, max: CB_SEC_MAX });
    }
    let mut chosen: Option<CbSec> = None;
    for _ in 0..n {
        match r.u32()? {
            0 => {}
            1 => {
                r.u32()?;
                let machine = r.string(rpc::MACHINE_NAME_MAX)?.to_string();
                let uid = r.u32()?;
                let gid = r.u32()?;
                let g = r.u32()? as usize;
                if g > rpc::AUTH_SYS_GROUPS_MAX {
                    return Err(XdrError::TooLong { len: g as u64, max: rpc::AUTH_SYS_GROUPS_MAX });
                }
                for _ in 0..g {
                    r.u32()?;
                }
                if chosen.is_none() {
                    chosen = Some(CbSec::Sys { machine, uid, gid });
                }
            }
            6 => {
                r.u32()?;
                r.opaque(1024)?;
                r.opaque(1024)?;
            }
            d => return Err(XdrError::BadDiscriminant(d)),
        }
    }
    Ok(chosen.unwrap_or_default())
}

/// Entries of a `csa_sec_parms` list read.
pub const CB_SEC_MAX: usize = 16;

/// One TCP connection's back-channel side: its writer (shared with the fore channel's replies) and the callbacks
/// waiting for a reply, by xid (bounded by [`Channels`]' per-session limit times the sessions bound to it).
pub struct BackConn {
    pub wr: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    waiting: Mutex<HashMap<u32, oneshot::Sender<CbReply>>>,
    closed: AtomicBool,
    /// A number for the logs and for telling connections apart in [`Channels`].
    pub id: u64,
}

impl BackConn {
    pub fn new(wr: Arc<tokio::sync::Mutex<OwnedWriteHalf>>, id: u64) -> BackConn {
        BackConn { wr, waiting: Mutex::new(HashMap::new()), closed: AtomicBool::new(false), id }
    }

    /// Registers a callback about to be sent with `xid`; its reply arrives on the receiver.
    pub fn expect(&self, xid: u32) -> oneshot::Receiver<CbReply> {
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("waiting").insert(xid, tx);
        rx
    }

    /// Forgets a callback that timed out.
    pub fn forget(&self, xid: u32) {
        self.waiting.lock().expect("waiting").remove(&xid);
    }

    /// A REPLY record read on the connection: handed to its callback. `false`: nobody waits for it (late, or not a
    /// reply to anything sent), and it is dropped.
    pub fn deliver(&self, rec: &[u8]) -> bool {
        let reply = match decode_cb_reply(rec) {
            Ok(r) => r,
            Err(e) => {
                tracing::info!(conn = self.id, error = %e, "a malformed callback reply: dropped");
                return false;
            }
        };
        let tx = self.waiting.lock().expect("waiting").remove(&reply.xid());
        match tx {
            Some(tx) => tx.send(reply).is_ok(),
            None => false,
        }
    }

    /// The connection ended: no reply will come; waiting callbacks see their senders dropped.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.waiting.lock().expect("waiting").clear();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

/// One session's back channel.
#[derive(Clone)]
pub struct BackChannel {
    pub clientid: u64,
    pub prog: u32,
    pub sec: CbSec,
    /// The connection bound for callbacks; `None` until one is.
    pub conn: Option<Arc<BackConn>>,
    /// The last CB_SEQUENCE sequence id of slot 0 (0: none sent yet).
    pub seqid: u32,
    /// Callbacks queued or in flight.
    pub queued: usize,
    /// A callback went unanswered (or the connection closed): no back channel until the client binds one again.
    pub down: bool,
    /// Held by the callback using slot 0 (the others queue on it, at most `callbacks_max`).
    pub slot: Arc<tokio::sync::Mutex<()>>,
}

impl BackChannel {
    fn usable(&self) -> bool {
        !self.down && self.conn.as_ref().is_some_and(|c| !c.is_closed())
    }
}

/// What [`Channels::start`] gives a callback to send: the connection, its program and credential, CB_SEQUENCE.
pub struct Slot {
    pub conn: Arc<BackConn>,
    pub prog: u32,
    pub sec: CbSec,
    pub seq: CbSequence,
}

/// Why a callback cannot be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NoChannel {
    /// The client has no session with a usable back channel.
    Down,
    /// `callbacks_max` callbacks already wait on it (dropped, not queued).
    Full,
}

/// The back channels of every session (bounded by the state's sessions: one entry per session).
#[derive(Default)]
pub struct Channels {
    by_session: HashMap<[u8; 16], BackChannel>,
    pub callbacks_max: usize,
}

impl Channels {
    pub fn new(callbacks_max: usize) -> Channels {
        Channels { by_session: HashMap::new(), callbacks_max: callbacks_max.max(1) }
    }

    /// CREATE_SESSION: the session's callback program and credential; `conn` when the client asked for this
    /// connection to be its back channel too.
    pub fn created(&mut self, sessionid: [u8; 16], clientid: u64, prog: u32, sec: CbSec, conn: Option<Arc<BackConn>>) {
        self.by_session.insert(
            sessionid,
            BackChannel {
                clientid,
                prog,
                sec,
                conn,
                seqid: 0,
                queued: 0,
                down: false,
                slot: Arc::new(tokio::sync::Mutex::new(())),
            },
        );
    }

    /// BACKCHANNEL_CTL: a new program and credential.
    pub fn control(&mut self, sessionid: &[u8; 16], prog: u32, sec: CbSec) -> bool {
        match self.by_session.get_mut(sessionid) {
            Some(c) => {
                c.prog = prog;
                c.sec = sec;
                true
            }
            None => false,
        }
    }

    /// BIND_CONN_TO_SESSION for the back channel: `conn` carries callbacks from now on (the channel is up).
    pub fn bind(&mut self, sessionid: &[u8; 16], conn: Arc<BackConn>) -> bool {
        match self.by_session.get_mut(sessionid) {
            Some(c) => {
                c.conn = Some(conn);
                c.down = false;
                true
            }
            None => false,
        }
    }

    /// Forgets sessions no longer in the state (destroyed, expired).
    pub fn retain(&mut self, alive: impl Fn(&[u8; 16]) -> bool) {
        self.by_session.retain(|s, _| alive(s));
    }

    /// SEQUENCE's status flags for `sessionid`: CB_PATH_DOWN_SESSION (and CB_PATH_DOWN: the client has no other
    /// session) while its back channel was bound and is not usable now.
    pub fn status_flags(&self, sessionid: &[u8; 16]) -> u32 {
        let Some(c) = self.by_session.get(sessionid) else { return 0 };
        if c.conn.is_none() || c.usable() {
            return 0;
        }
        let other_up = self.by_session.iter().any(|(s, o)| s != sessionid && o.clientid == c.clientid && o.usable());
        SEQ4_STATUS_CB_PATH_DOWN_SESSION | if other_up { 0 } else { SEQ4_STATUS_CB_PATH_DOWN }
    }

    /// A callback to `clientid`: takes one of its sessions with a usable back channel, queues on it (bounded) and
    /// returns the session. The caller then waits for the slot ([`Channels::next`]) and ends with
    /// [`Channels::done`].
    pub fn start(&mut self, clientid: u64) -> Result<([u8; 16], Arc<tokio::sync::Mutex<()>>), NoChannel> {
        let limit = self.callbacks_max;
        let (sid, c) =
            self.by_session.iter_mut().find(|(_, c)| c.clientid == clientid && c.usable()).ok_or(NoChannel::Down)?;
        if c.queued >= limit {
            return Err(NoChannel::Full);
        }
        c.queued += 1;
        Ok((*sid, c.slot.clone()))
    }

    /// The number of sessions with a back channel entry.
    pub fn len(&self) -> usize {
        self.by_session.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_session.is_empty()
    }

    /// The slot, once this callback holds it (one at a time per session: the back channel has slot 0 only): the
    /// next sequence id.
    pub fn next(&mut self, sessionid: &[u8; 16]) -> Result<Slot, NoChannel> {
        let c = self.by_session.get_mut(sessionid).ok_or(NoChannel::Down)?;
        if !c.usable() {
            return Err(NoChannel::Down);
        }
        let conn = c.conn.clone().expect("usable");
        let seqid = c.seqid.wrapping_add(1).max(1);
        Ok(Slot { conn, prog: c.prog, sec: c.sec.clone(), seq: CbSequence { sessionid: *sessionid, seqid } })
    }

    /// The callback ended: `answered` (the client replied: its slot's sequence id moves on) or not (the channel is
    /// down until the client binds a connection again).
    pub fn done(&mut self, sessionid: &[u8; 16], seqid: Option<u32>, answered: bool) {
        if let Some(c) = self.by_session.get_mut(sessionid) {
            c.queued = c.queued.saturating_sub(1);
            if answered {
                if let Some(s) = seqid {
                    c.seqid = s;
                }
            } else if seqid.is_some() {
                c.down = true;
            }
        }
    }

    /// The session's channel (tests, logs).
    pub fn get(&self, sessionid: &[u8; 16]) -> Option<&BackChannel> {
        self.by_session.get(sessionid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Arc<BackConn> {
        // A writer half needs a socket: a connected loopback pair.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let a = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
            let (_r, w) = a.into_split();
            Arc::new(BackConn::new(Arc::new(tokio::sync::Mutex::new(w)), 1))
        })
    }

    #[test]
    fn cb_layoutrecall_bytes_are_the_rfcs() {
        let sid = Stateid { seqid: 3, other: [7; 12] };
        let rec = encode_cb_layoutrecall(
            0x55,
            0x4000_0000,
            &CbSec::Sys { machine: "gw".into(), uid: 0, gid: 0 },
            &CbSequence { sessionid: [9; 16], seqid: 1 },
            &Recall { fh: vec![1, 2, 3], stateid: sid },
        );
        let call = rpc::parse_call(&rec).unwrap();
        assert_eq!((call.xid, call.prog, call.vers, call.proc_), (0x55, 0x4000_0000, 1, 1));
        assert!(matches!(call.auth, rpc::Auth::Sys { uid: 0, gid: 0, .. }));
        let mut r = Reader::new(call.args);
        assert_eq!(r.opaque(64).unwrap(), b"");
        assert_eq!((r.u32().unwrap(), r.u32().unwrap(), r.u32().unwrap()), (1, 0, 2));
        assert_eq!(r.u32().unwrap(), OP_CB_SEQUENCE);
        assert_eq!(r.fixed(16).unwrap(), &[9; 16]);
        assert_eq!((r.u32().unwrap(), r.u32().unwrap(), r.u32().unwrap()), (1, 0, 0));
        assert!(!r.bool().unwrap());
        assert_eq!(r.u32().unwrap(), 0, "no referring call lists");
        assert_eq!(r.u32().unwrap(), OP_CB_LAYOUTRECALL);
        assert_eq!((r.u32().unwrap(), r.u32().unwrap()), (LAYOUT4_NFSV4_1_FILES, IOMODE_ANY));
        assert!(r.bool().unwrap(), "clora_changed");
        assert_eq!(r.u32().unwrap(), LAYOUTRECALL4_FILE);
        assert_eq!(r.opaque(128).unwrap(), &[1, 2, 3]);
        assert_eq!((r.u64().unwrap(), r.u64().unwrap()), (0, u64::MAX));
        assert_eq!(r.u32().unwrap(), 3);
        assert_eq!(r.fixed(12).unwrap(), &[7; 12]);
        assert_eq!(r.remaining(), 0);
        let none = encode_cb_layoutrecall(
            1,
            2,
            &CbSec::None,
            &CbSequence { sessionid: [0; 16], seqid: 2 },
            &Recall { fh: vec![], stateid: sid },
        );
        assert_eq!(rpc::parse_call(&none).unwrap().auth, rpc::Auth::None);
    }

    fn reply(xid: u32, status: u32, ops: &[(u32, u32)]) -> Vec<u8> {
        let mut w = rpc::accepted(xid, rpc::SUCCESS);
        w.u32(status).opaque(b"t").u32(ops.len() as u32);
        for &(op, st) in ops {
            w.u32(op).u32(st);
            if op == OP_CB_SEQUENCE && st == 0 {
                w.fixed(&[9; 16]).u32(1).u32(0).u32(0).u32(0);
            }
        }
        w.buf
    }

    #[test]
    fn cb_replies_decode_and_bound() {
        let ok = reply(7, 0, &[(OP_CB_SEQUENCE, 0), (OP_CB_LAYOUTRECALL, 0)]);
        let r = decode_cb_reply(&ok).unwrap();
        assert_eq!(r, CbReply::Compound { xid: 7, status: 0, ops: vec![(11, 0), (5, 0)] });
        assert_eq!(r.op_status(OP_CB_LAYOUTRECALL), Some(0));
        let nomatch = reply(8, 10060, &[(OP_CB_SEQUENCE, 0), (OP_CB_LAYOUTRECALL, 10060)]);
        assert_eq!(decode_cb_reply(&nomatch).unwrap().op_status(OP_CB_LAYOUTRECALL), Some(10060));
        let misordered = reply(9, 10063, &[(OP_CB_SEQUENCE, 10063)]);
        assert_eq!(decode_cb_reply(&misordered).unwrap().op_status(OP_CB_LAYOUTRECALL), None);
        assert_eq!(
            decode_cb_reply(&rpc::accepted(3, rpc::PROG_UNAVAIL).buf).unwrap(),
            CbReply::Rpc { xid: 3, stat: rpc::PROG_UNAVAIL }
        );
        let mut denied = rpc::denied(4, 1);
        denied.u32(rpc::AUTH_TOOWEAK);
        assert_eq!(decode_cb_reply(&denied.buf).unwrap(), CbReply::Rpc { xid: 4, stat: 0x101 });
        // Truncated anywhere, too many ops, a call instead of a reply: errors, never panics.
        for n in 0..ok.len() {
            assert!(decode_cb_reply(&ok[..n]).is_err(), "{n} bytes");
        }
        let mut many = rpc::accepted(1, 0);
        many.u32(0).opaque(b"").u32(9);
        assert!(decode_cb_reply(&many.buf).is_err());
        assert!(decode_cb_reply(&rpc::encode_record(b"x")).is_err());
    }

    #[test]
    fn cb_sec_prefers_auth_sys() {
        let mut w = Writer::new();
        w.u32(3).u32(0).u32(6).u32(1).opaque(b"h").opaque(b"").u32(1).u32(5).opaque(b"m").u32(1).u32(2).u32(1).u32(3);
        assert_eq!(
            decode_cb_sec(&mut Reader::new(&w.buf)).unwrap(),
            CbSec::Sys { machine: "m".into(), uid: 1, gid: 2 }
        );
        let mut w = Writer::new();
        w.u32(1).u32(0);
        assert_eq!(decode_cb_sec(&mut Reader::new(&w.buf)).unwrap(), CbSec::None);
        let mut w = Writer::new();
        w.u32(17);
        assert!(decode_cb_sec(&mut Reader::new(&w.buf)).is_err());
        let mut w = Writer::new();
        w.u32(1).u32(2);
        assert_eq!(decode_cb_sec(&mut Reader::new(&w.buf)), Err(XdrError::BadDiscriminant(2)));
    }

    #[test]
    fn channels_queue_bounded_slot_counts_up_and_path_down_is_reported() {
        let mut ch = Channels::new(2);
        let (s1, s2) = ([1; 16], [2; 16]);
        // A session without a bound connection: nothing to call back on, and nothing reported down.
        ch.created(s1, 10, 0x4000_0000, CbSec::None, None);
        assert_eq!(ch.start(10).map(|x| x.0), Err(NoChannel::Down));
        assert_eq!(ch.status_flags(&s1), 0);
        let c = conn();
        assert!(ch.bind(&s1, c.clone()));
        assert!(!ch.bind(&s2, c.clone()), "unknown session");
        // Bounded queue: two callbacks at most wait on the channel.
        assert_eq!(ch.start(10).map(|x| x.0), Ok(s1));
        assert_eq!(ch.start(10).map(|x| x.0), Ok(s1));
        assert_eq!(ch.start(10).map(|x| x.0), Err(NoChannel::Full));
        // Slot 0's sequence id counts up as replies come.
        let a = ch.next(&s1).unwrap();
        assert_eq!(a.seq.seqid, 1);
        ch.done(&s1, Some(1), true);
        let b = ch.next(&s1).unwrap();
        assert_eq!(b.seq.seqid, 2);
        // Unanswered: the channel is down, SEQUENCE says so, and no callback starts until the client rebinds.
        ch.done(&s1, Some(2), false);
        assert_eq!(ch.status_flags(&s1), SEQ4_STATUS_CB_PATH_DOWN_SESSION | SEQ4_STATUS_CB_PATH_DOWN);
        assert_eq!(ch.start(10).map(|x| x.0), Err(NoChannel::Down));
        // Another session of the client with a live channel: only this session's path is down.
        ch.created(s2, 10, 0x4000_0000, CbSec::None, Some(c.clone()));
        assert_eq!(ch.status_flags(&s1), SEQ4_STATUS_CB_PATH_DOWN_SESSION);
        assert_eq!(ch.start(10).map(|x| x.0), Ok(s2));
        assert!(ch.bind(&s1, c.clone()));
        assert_eq!(ch.status_flags(&s1), 0);
        assert_eq!(ch.next(&s1).unwrap().seq.seqid, 2, "the unanswered sequence id is sent again");
        // The connection closing takes the channel down too.
        c.close();
        assert_ne!(ch.status_flags(&s1), 0);
        ch.retain(|s| *s == s2);
        assert!(ch.get(&s1).is_none());
    }
}
