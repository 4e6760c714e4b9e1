//! Layout recall (RFC 8881 §12.5.5, §20.3): when a file's layout or access changes through the gateway
//! (truncate, mode/owner/group/ACL, removal, rename over it), every layout of it is recalled with a CB_LAYOUTRECALL
//! on its client's back channel ([`super::callback`]). Each recall is its own task, bounded per session by the
//! back channel's queue; its outcome:
//! - answered NFS4_OK: the client returns the layout (LAYOUTRETURN); until then, or until `recall_ms` passed (then
//!   revoked), LAYOUTGET of the file by that client is NFS4ERR_RECALLCONFLICT;
//! - answered NFS4ERR_NOMATCHING_LAYOUT: the client holds none; forgotten;
//! - no back channel, a full queue, no answer within `recall_ms`, the connection closed, or any other answer:
//!   the layout is revoked (forgotten, logged) and, for no answer, the back channel is down (SEQUENCE says so).
//!
//! Changes made elsewhere (a native client's truncate or chmod, a removal, a rebuild moving a slot, which changes
//! the layout generation) are found by the periodic check ([`Gateway::check_layouts`], `--layout-check-ms`): one
//! getattr per file with layouts out, compared with what was true at LAYOUTGET.
//!
//! docs/format.md §24.

use std::sync::Arc;
use std::time::Duration;

use super::callback::{self, CbReply, OP_CB_LAYOUTRECALL, OP_CB_SEQUENCE, Recall};
use super::consts::*;
use super::state::Stateid;
use crate::Gateway;

/// Why a file's layouts are recalled (for the logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Why {
    Truncate,
    Access,
    Remove,
    Layout,
}

/// What a SETATTR of `set` on a file with attributes `pre` changes that its layouts depend on: a smaller size
/// (the data servers' bytes past it are gone), the mode, owner or group (the access the layout's capability was
/// sealed for). An extension or a time changes nothing a layout holds.
pub(crate) fn changes_of(set: &weft_proto::SetAttrs, pre: &weft_proto::Attr) -> Option<Why> {
    if pre.kind != weft_proto::FileKind::File {
        return None;
    }
    if set.size.is_some_and(|s| s < pre.size) {
        return Some(Why::Truncate);
    }
    let changed = |new: Option<u32>, old: u32| new.is_some_and(|n| n != old);
    if changed(set.mode, pre.mode & 0o7777) || changed(set.uid, pre.uid) || changed(set.gid, pre.gid) {
        return Some(Why::Access);
    }
    None
}

impl Gateway {
    /// The file a RENAME onto `dir`/`name` replaces, when layouts are out (so they can be recalled after it).
    pub(crate) async fn replaced_file(&self, c: &weft_client::Client, dir: u64, name: &str) -> Option<u64> {
        if !self.pnfs || self.nfs4.state().layout_counts().0 == 0 {
            return None;
        }
        c.lookup(dir, name).await.ok().filter(|a| a.kind == weft_proto::FileKind::File).map(|a| a.ino)
    }

    /// The layout or access of `ino` changed: recalls every layout of it (each recall runs as its own task; this
    /// returns at once).
    pub(crate) fn layouts_changed(&self, ino: u64, why: Why) {
        if !self.pnfs {
            return;
        }
        let now = self.nfs4.now_ms();
        let jobs = self.nfs4.state().recall_layouts(ino, now);
        let Some(gw) = self.me.upgrade() else { return };
        for (clientid, stateid) in jobs {
            let gw = gw.clone();
            tokio::spawn(async move { gw.recall_one(clientid, ino, stateid, why).await });
        }
    }

    /// Revokes (forgets) a recalled layout, saying why.
    fn revoke(&self, clientid: u64, ino: u64, stateid: &Stateid, why: &str) {
        if self.nfs4.state().layout_forget(stateid) {
            tracing::warn!(clientid = format_args!("{clientid:#x}"), ino, "pNFS layout revoked: {why}");
        }
    }

    async fn recall_one(self: Arc<Self>, clientid: u64, ino: u64, stateid: Stateid, why: Why) {
        let started = self.nfs4.channels().start(clientid);
        let (sid, slot_lock) = match started {
            Ok(x) => x,
            Err(callback::NoChannel::Full) => {
                return self.revoke(clientid, ino, &stateid, "its back channel's callback queue is full");
            }
            Err(_) => return self.revoke(clientid, ino, &stateid, "the client has no back channel to recall it on"),
        };
        // One callback at a time on the session's slot 0; the others wait here (at most `callbacks_max`).
        let _slot = slot_lock.lock().await;
        let slot = self.nfs4.channels().next(&sid);
        let slot = match slot {
            Ok(s) => s,
            Err(_) => {
                self.nfs4.channels().done(&sid, None, false);
                return self.revoke(clientid, ino, &stateid, "the back channel went down");
            }
        };
        if !self.nfs4.state().layout_recalled(&stateid) {
            // Returned while it waited for the slot: nothing to recall.
            self.nfs4.channels().done(&sid, None, true);
            return;
        }
        let xid = self.cb_xid.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let recall = Recall { fh: self.sealer.seal(ino).to_vec(), stateid };
        let rec = callback::encode_cb_layoutrecall(xid, slot.prog, &slot.sec, &slot.seq, &recall);
        let rx = slot.conn.expect(xid);
        let wait = Duration::from_millis(self.cfg.nfs4.recall_ms.max(1));
        let sent = async {
            rpc_write(&slot.conn, rec).await?;
            tracing::info!(
                clientid = format_args!("{clientid:#x}"),
                ino,
                ?why,
                xid,
                cb_seqid = slot.seq.seqid,
                conn = slot.conn.id,
                "CB_LAYOUTRECALL sent"
            );
            rx.await.map_err(|_| std::io::Error::from(std::io::ErrorKind::ConnectionAborted))
        };
        let reply = tokio::time::timeout(wait, sent).await;
        let reply = match reply {
            Ok(Ok(r)) => r,
            // Revoked before the channel is marked down: a client told its path is down finds the layout gone.
            Ok(Err(e)) => {
                slot.conn.forget(xid);
                self.revoke(clientid, ino, &stateid, &format!("CB_LAYOUTRECALL not answered ({e})"));
                self.nfs4.channels().done(&sid, Some(slot.seq.seqid), false);
                return;
            }
            Err(_) => {
                slot.conn.forget(xid);
                self.revoke(clientid, ino, &stateid, "CB_LAYOUTRECALL not answered in time");
                self.nfs4.channels().done(&sid, Some(slot.seq.seqid), false);
                return;
            }
        };
        let seq_ok = reply.op_status(OP_CB_SEQUENCE) == Some(NFS4_OK);
        self.nfs4.channels().done(&sid, seq_ok.then_some(slot.seq.seqid), true);
        let status = reply.op_status(OP_CB_LAYOUTRECALL);
        tracing::info!(clientid = format_args!("{clientid:#x}"), ino, xid, ?status, "CB_LAYOUTRECALL answered");
        match (&reply, status) {
            (_, Some(NFS4_OK)) => {} // the client returns it with LAYOUTRETURN (or loses it at the deadline)
            (_, Some(NFS4ERR_NOMATCHING_LAYOUT)) => {
                // The client holds nothing of it: forgotten, as if returned.
                self.nfs4.state().layout_forget(&stateid);
            }
            (CbReply::Rpc { stat, .. }, _) => {
                self.revoke(clientid, ino, &stateid, &format!("CB_COMPOUND refused (RPC status {stat:#x})"))
            }
            (_, s) => self.revoke(clientid, ino, &stateid, &format!("CB_LAYOUTRECALL answered {s:?}")),
        }
    }
}

/// Files the periodic check looks at per pass (a larger table is covered over several passes).
pub const LAYOUT_CHECK_FILES_MAX: usize = 256;

impl Gateway {
    /// One pass of the periodic check: up to [`LAYOUT_CHECK_FILES_MAX`] files with layouts out from `cursor` on,
    /// one getattr each; a file that shrank, changed mode/owner/group or layout generation, or is gone, has its
    /// layouts recalled. Returns the cursor of the next pass.
    pub(crate) async fn check_layouts(&self, cursor: u64) -> u64 {
        let inos = self.nfs4.state().watched_inodes(cursor, LAYOUT_CHECK_FILES_MAX);
        let next = if inos.len() < LAYOUT_CHECK_FILES_MAX { 0 } else { inos.last().copied().unwrap_or(0) };
        for ino in inos {
            // At the MDS, not from the lease cache: a duty moves a layout's slots without recalling a lease.
            let now = match self.client.getattr_at_mds(ino).await {
                Ok(a) => Some(super::state::Watched::of(&a)),
                Err(e) if super::ops::st(&e) == NFS4ERR_NOENT => None,
                Err(e) => {
                    tracing::debug!(ino, error = %e, "layout check: getattr failed; next pass");
                    continue;
                }
            };
            let why = self.nfs4.state().watched_changed(ino, now);
            if let Some(why) = why {
                tracing::info!(ino, ?why, "layout check: the file changed elsewhere; recalling its layouts");
                self.layouts_changed(ino, why);
            }
        }
        next
    }
}

async fn rpc_write(conn: &callback::BackConn, rec: Vec<u8>) -> std::io::Result<()> {
    if conn.is_closed() {
        return Err(std::io::ErrorKind::NotConnected.into());
    }
    crate::rpc::write_reply(&mut *conn.wr.lock().await, &crate::rpc::Reply::from(rec)).await
}
