//! The session-less ops (RFC 8881 §18.35, §18.36, §18.37, §18.50, §18.34): EXCHANGE_ID (SP4_NONE only),
//! CREATE_SESSION (the fore channel's sizes; the back channel's attributes echoed, its program and credential
//! recorded, and the call's TCP connection bound for callbacks when the client asks: [`super::callback`]),
//! DESTROY_SESSION, DESTROY_CLIENTID, BIND_CONN_TO_SESSION (binds the connection for callbacks when asked).

use std::sync::Arc;

use super::callback::{self, BackConn};

use super::compound::Ctx;
use super::consts::*;
use super::decode::Op;
use super::state::ChannelAttrs;
use crate::xdr::Writer;

fn channel(w: &mut Writer, a: &ChannelAttrs) {
    w.u32(a.header_pad_bytes)
        .u32(a.request_bytes_max)
        .u32(a.reply_bytes_max)
        .u32(a.cached_reply_bytes_max)
        .u32(a.ops_max)
        .u32(a.slots_max)
        .u32(0);
}

async fn release(cx: &Ctx<'_>, owners: Vec<u64>) {
    for o in owners {
        if let Err(e) = cx.gw.client.release_locks(None, Some(o)).await {
            tracing::warn!(owner = o, error = %e, "releasing an NFSv4 client's locks");
        }
    }
}

pub async fn run(cx: &mut Ctx<'_>, op: Op<'_>) -> (u32, Writer) {
    // A metadata server only while layouts are served (`--pnfs`); never both (RFC 8881 §13.1).
    let role = if cx.gw.pnfs { EXCHGID4_FLAG_USE_PNFS_MDS } else { EXCHGID4_FLAG_USE_NON_PNFS };
    let (st, w, released) = run_on(&cx.gw.nfs4, op, role, (cx.principal, cx.peer), &mut cx.session, cx.conn.clone());
    release(cx, released).await;
    (st, w)
}

/// The session-less ops on `nfs4`'s state, for the gateway and the pNFS data server alike: `role` is the
/// EXCHANGE_ID flag naming what the server is (`EXCHGID4_FLAG_USE_NON_PNFS`, `_USE_PNFS_MDS`, `_USE_PNFS_DS`).
/// `principal`: who the call's credential names, and the IP address it came from; a client's record, sessions and
/// back channels are its maker's.
/// `own_session` is the compound's session, forgotten when the compound destroys it. Returns the status, the
/// result body and the MDS lock owners of the client state it dropped (for the gateway to release). `conn`: the
/// TCP connection the call came on, which can carry callbacks (`None`: RDMA, or a data server, which calls nobody
/// back).
pub(crate) fn run_on(
    nfs4: &super::Server,
    op: Op<'_>,
    role: u32,
    (principal, addr): (super::state::Principal, std::net::IpAddr),
    own_session: &mut Option<([u8; 16], u32)>,
    conn: Option<Arc<BackConn>>,
) -> (u32, Writer, Vec<u64>) {
    let mut w = Writer::new();
    let now = nfs4.now_ms();
    let mut released = Vec::new();
    let st = match op {
        // Flags a client may not send (CONFIRMED_R among them) are NFS4ERR_INVAL (§18.35.3).
        Op::ExchangeId { flags, .. } if flags & !EXCHGID4_FLAG_MASK_A != 0 => NFS4ERR_INVAL,
        Op::ExchangeId { verifier, owner, flags } => {
            let update = flags & EXCHGID4_FLAG_UPD_CONFIRMED_REC_A != 0;
            let r = nfs4.state().exchange_id((owner, verifier, update), principal, addr, now);
            match r {
                Ok((ex, dropped)) => {
                    released = dropped;
                    let mut flags = role;
                    if ex.confirmed {
                        flags |= EXCHGID4_FLAG_CONFIRMED_R;
                    }
                    w.u64(ex.clientid).u32(ex.seq).u32(flags);
                    w.u32(0); // SP4_NONE
                    w.u64(0).opaque(&nfs4.major_id);
                    w.opaque(&nfs4.scope);
                    w.u32(0); // no implementation id
                    NFS4_OK
                }
                Err(s) => s,
            }
        }
        Op::CreateSession { flags, .. } if flags & !CREATE_SESSION4_FLAG_MASK != 0 => NFS4ERR_INVAL,
        Op::CreateSession { clientid, seq, flags, fore, back, cb_program, cb_sec } => {
            let r = nfs4.state().create_session(clientid, seq, (fore, back), principal, now);
            match r {
                Ok((cs, dropped)) => {
                    released = dropped;
                    // The call's connection carries callbacks too when the client asks (and it is TCP).
                    let bound = conn.filter(|_| flags & callback::CREATE_SESSION4_FLAG_CONN_BACK_CHAN != 0);
                    let reply_flags = if bound.is_some() { callback::CREATE_SESSION4_FLAG_CONN_BACK_CHAN } else { 0 };
                    nfs4.channels().created(cs.sessionid, clientid, cb_program, cb_sec, bound);
                    w.fixed(&cs.sessionid).u32(cs.seq).u32(reply_flags);
                    channel(&mut w, &cs.fore);
                    // The back channel: the client's own attributes echoed (Linux refuses any it did not offer);
                    // callbacks use slot 0 only, one at a time.
                    channel(&mut w, &ChannelAttrs { header_pad_bytes: 0, ..back });
                    NFS4_OK
                }
                Err(s) => s,
            }
        }
        Op::DestroySession(sid) => match nfs4.state().destroy_session(&sid, principal) {
            Ok(()) => {
                nfs4.channels().retain(|s| *s != sid);
                // Destroying the compound's own session: its reply is not cached anywhere.
                if own_session.is_some_and(|(s, _)| s == sid) {
                    *own_session = None;
                }
                NFS4_OK
            }
            Err(s) => s,
        },
        Op::DestroyClientid(id) => {
            let r = nfs4.state().destroy_clientid(id, principal);
            match r {
                Ok(owners) => {
                    released = owners;
                    NFS4_OK
                }
                Err(s) => s,
            }
        }
        Op::BindConn { sessionid, dir } => {
            let mine = nfs4.state().session_principal_is(&sessionid, principal);
            if let Err(refused) = mine {
                refused
            } else {
                let back =
                    matches!(dir, callback::CDFC4_BACK | callback::CDFC4_FORE_OR_BOTH | callback::CDFC4_BACK_OR_BOTH);
                let granted =
                    match conn {
                        Some(c) if back && nfs4.channels().bind(&sessionid, c.clone()) => {
                            if dir == callback::CDFC4_BACK { callback::CDFS4_BACK } else { callback::CDFS4_BOTH }
                        }
                        _ => callback::CDFS4_FORE,
                    };
                if dir == callback::CDFC4_BACK && granted != callback::CDFS4_BACK {
                    // Only a TCP connection of the gateway carries callbacks.
                    NFS4ERR_INVAL
                } else {
                    if granted != callback::CDFS4_FORE {
                        tracing::info!(session = %hex(&sessionid), "NFSv4 back channel bound (BIND_CONN_TO_SESSION)");
                    }
                    w.fixed(&sessionid).u32(granted).bool(false); // no RDMA mode
                    NFS4_OK
                }
            }
        }
        _ => NFS4ERR_SERVERFAULT,
    };
    (st, w, released)
}

/// A session id for the logs.
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
