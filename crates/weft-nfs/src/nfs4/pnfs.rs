//! The gateway as a pNFS metadata server (RFC 8881 §12, §13, §18.40–§18.44): LAYOUTGET hands a client a whole-file
//! layout of type FILES that is the file's Weft plain layout (the stripe unit, its data servers in stripe order;
//! sparse on the wire: the data servers map file offsets to their dense objects), each data server's filehandle a
//! capability the MDS sealed for the caller's rights (`Client::pnfs_handle`, key id `pnfs`, docs/format.md §23); GETDEVICEINFO names a device's
//! servers' NFS addresses; LAYOUTCOMMIT is Weft's own commit (size and mtime into the MDS); LAYOUTRETURN forgets.
//! The client then reads and writes the data servers directly: the gateway moves none of those bytes.
//!
//! Erasure-coded and mirrored files have no file-layout form (parity, copies): LAYOUTGET answers
//! NFS4ERR_LAYOUTUNAVAILABLE and the client reads and writes them through the gateway. docs/format.md §24.

use std::net::SocketAddr;

use weft_proto::{DataRedundancy, FileKind};

use super::compound::Ctx;
use super::consts::*;
use super::layout::{
    self, DEVICELIST_MAX, DeviceInfoArgs, DeviceListArgs, IOMODE_ANY, IOMODE_RW, LAYOUT4_NFSV4_1_FILES,
    LayoutCommitArgs, LayoutGetArgs, LayoutReturnArgs, ReturnWhat, STRIPE_INDICES_MAX, WHOLE_FILE,
};
use super::ops::{fresh_attr_of, st};
use super::state::Stateid;
use crate::xdr::Writer;

type Out = Result<Writer, u32>;

fn put_stateid(w: &mut Writer, s: &Stateid) {
    w.u32(s.seqid).fixed(&s.other);
}

/// Each data server's NFS addresses, from the MDS (op 138), for `servers` in order; `None` if one has none
/// (it was started without `nfs_listen`), so no client is sent there. A client that called over RPC-over-RDMA
/// gets a server's RDMA addresses where it has some, any other its TCP ones, each only when the server has none
/// of the other kind: Linux adds every further address of a DS's list to the first one's client as a trunked
/// transport (a TCP client skips RDMA ones, an RDMA client would add TCP ones), so one kind per server keeps
/// every byte on the transport the client mounted with.
async fn addresses(cx: &Ctx<'_>, servers: &[u32]) -> Result<Option<Vec<Vec<(SocketAddr, bool)>>>, u32> {
    let devices = cx.gw.client.pnfs_devices().await.map_err(|e| st(&e))?;
    Ok(pick_addresses(&devices, servers, cx.transport == crate::Transport::Rdma))
}

/// [`addresses`] from the devices the MDS listed; `rdma`: the client called over RPC-over-RDMA. Each address
/// comes with whether it is an RDMA one.
pub fn pick_addresses(
    devices: &[weft_client::PnfsDevice],
    servers: &[u32],
    rdma: bool,
) -> Option<Vec<Vec<(SocketAddr, bool)>>> {
    servers
        .iter()
        .map(|id| {
            let d = devices.iter().find(|d| d.server == *id)?;
            let (first, other) = if rdma { (&d.rdma_addrs, &d.addrs) } else { (&d.addrs, &d.rdma_addrs) };
            let (list, on_rdma) = if first.is_empty() { (other, !rdma) } else { (first, rdma) };
            let list: Vec<_> = list.iter().map(|a| (*a, on_rdma)).collect();
            (!list.is_empty()).then_some(list)
        })
        .collect()
}

/// LAYOUTGET: NFS4ERR_LAYOUTTRYLATER carries `logr_will_signal_layout_avail` (false: nothing is signalled).
pub async fn layoutget(cx: &mut Ctx<'_>, a: LayoutGetArgs) -> (u32, Writer) {
    match layoutget_ok(cx, &a).await {
        Ok(w) => (NFS4_OK, w),
        Err(NFS4ERR_LAYOUTTRYLATER) => {
            let mut w = Writer::new();
            w.bool(false);
            (NFS4ERR_LAYOUTTRYLATER, w)
        }
        Err(s) => {
            tracing::debug!(status = s, iomode = a.iomode, "LAYOUTGET refused");
            (s, Writer::new())
        }
    }
}

async fn layoutget_ok(cx: &mut Ctx<'_>, a: &LayoutGetArgs) -> Out {
    let cid = cx.clientid()?;
    let ino = cx.cur()?;
    if !cx.gw.pnfs {
        return Err(NFS4ERR_LAYOUTUNAVAILABLE);
    }
    if a.layout_type != LAYOUT4_NFSV4_1_FILES {
        return Err(NFS4ERR_UNKNOWN_LAYOUTTYPE);
    }
    if a.iomode == IOMODE_ANY {
        return Err(NFS4ERR_BADIOMODE);
    }
    // §18.43.3: a length under minlength, or a range past 2^64, is INVAL (the layout granted is the whole file).
    if a.length < a.minlength || (a.length != WHOLE_FILE && a.offset.checked_add(a.length).is_none()) {
        return Err(NFS4ERR_INVAL);
    }
    let attr = fresh_attr_of(cx, ino).await?;
    match attr.kind {
        FileKind::File => {}
        FileKind::Dir => return Err(NFS4ERR_ISDIR),
        _ => return Err(NFS4ERR_WRONG_TYPE),
    }
    let watched = super::state::Watched::of(&attr);
    let Some(l) = attr.layout.filter(|l| l.redundancy == DataRedundancy::Plain) else {
        // ec and mirror files: served through the gateway.
        return Err(NFS4ERR_LAYOUTUNAVAILABLE);
    };
    let count = l.servers.len();
    if count == 0 || count > STRIPE_INDICES_MAX || layout::nfl_util(l.stripe_unit).is_none() {
        return Err(NFS4ERR_LAYOUTUNAVAILABLE);
    }
    if addresses(cx, &l.servers).await?.is_none() {
        tracing::debug!(ino, "LAYOUTGET: a data server of the file has no NFS address; served through the gateway");
        return Err(NFS4ERR_LAYOUTUNAVAILABLE);
    }
    // The caller's access, checked by the MDS, which seals the capability the data servers check.
    let write = a.iomode == IOMODE_RW;
    let cap = cx.c.pnfs_handle(ino, write).await.map_err(|e| st(&e))?;
    let fhs: Vec<Vec<u8>> =
        (0..count as u32).map(|i| crate::ds::fh::encode(&cap, l.stripe_unit, count as u32, i, l.generation)).collect();
    // The reply's size does not depend on the device id: checked before anything is recorded.
    let mut probe = Writer::new();
    layout::encode_layoutget_ok(
        &mut probe,
        false,
        &Stateid::INVALID,
        a.iomode,
        &layout::file_layout_body(&[0; 16], l.stripe_unit, &fhs),
    );
    if probe.len() > a.maxcount as usize {
        return Err(NFS4ERR_TOOSMALL);
    }
    let id = cx.stateid(a.stateid);
    let now = cx.gw.nfs4.now_ms();
    let (sid, device) = {
        let mut st = cx.gw.nfs4.state();
        let r = st.layout_get(cid, ino, &id, a.iomode, &l.servers, l.generation, now)?;
        st.watch(ino, watched);
        r
    };
    let mut w = Writer::new();
    layout::encode_layoutget_ok(&mut w, false, &sid, a.iomode, &layout::file_layout_body(&device, l.stripe_unit, &fhs));
    tracing::debug!(ino, iomode = a.iomode, servers = ?l.servers, unit = l.stripe_unit, "LAYOUTGET granted");
    Ok(w)
}

/// LAYOUTCOMMIT: the size a client's writes to the data servers reached (last write offset + 1) and their mtime
/// go to the MDS as Weft's own commit (the largest size wins); answers the new size when it changed.
pub async fn layoutcommit(cx: &mut Ctx<'_>, a: LayoutCommitArgs) -> Out {
    let cid = cx.clientid()?;
    let ino = cx.cur()?;
    if a.layout_type != LAYOUT4_NFSV4_1_FILES {
        return Err(NFS4ERR_UNKNOWN_LAYOUTTYPE);
    }
    if a.reclaim {
        // Layouts are not reclaimed: a restarted gateway has new device ids, and the clients get new layouts.
        return Err(NFS4ERR_NO_GRACE);
    }
    let id = cx.stateid(a.stateid);
    {
        let state = cx.gw.nfs4.state();
        let l = state.layout_of(cid, ino, &id)?;
        if l.iomodes & IOMODE_RW == 0 {
            return Err(NFS4ERR_BADIOMODE);
        }
    }
    let size = match a.last_write {
        Some(o) => o.checked_add(1).filter(|&s| s <= i64::MAX as u64).ok_or(NFS4ERR_INVAL)?,
        None => 0,
    };
    let mtime_ns = match a.mtime {
        Some((s, ns)) => {
            if ns >= 1_000_000_000 {
                return Err(NFS4ERR_INVAL);
            }
            s.checked_mul(1_000_000_000).and_then(|x| x.checked_add(ns as i64)).ok_or(NFS4ERR_INVAL)?
        }
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos().min(i64::MAX as u128) as i64),
    };
    let r = cx.c.commit_wcc(ino, size, mtime_ns).await.map_err(|e| st(&e))?;
    // The gateway's own cached handles of the file and what it read ahead predate these bytes.
    cx.gw.files.wrote(ino);
    for f in cx.gw.files.of_inode(ino) {
        f.observe_open(&r.attr);
    }
    tracing::debug!(ino, size, new_size = r.attr.size, "LAYOUTCOMMIT");
    let mut w = Writer::new();
    if r.attr.size != r.pre_size {
        w.bool(true).u64(r.attr.size);
    } else {
        w.bool(false);
    }
    Ok(w)
}

/// LAYOUTRETURN: FILE returns the iomode of the file's layout (a range short of the whole file keeps it: only
/// whole-file layouts are handed out); FSID and ALL every layout of the client (one export is one fsid).
pub async fn layoutreturn(cx: &mut Ctx<'_>, a: LayoutReturnArgs) -> Out {
    let cid = cx.clientid()?;
    if a.layout_type != LAYOUT4_NFSV4_1_FILES {
        return Err(NFS4ERR_UNKNOWN_LAYOUTTYPE);
    }
    let now = cx.gw.nfs4.now_ms();
    if a.reclaim {
        return if cx.gw.nfs4.state().in_grace(now) { Ok(bool_writer(false)) } else { Err(NFS4ERR_NO_GRACE) };
    }
    let mut w = Writer::new();
    match a.what {
        ReturnWhat::File { offset, length, stateid } => {
            let ino = cx.cur()?;
            let id = cx.stateid(stateid);
            let iomode = if offset == 0 && length == WHOLE_FILE { a.iomode } else { 0 };
            match cx.gw.nfs4.state().layout_return(cid, ino, &id, iomode)? {
                Some(s) => {
                    w.bool(true);
                    put_stateid(&mut w, &s);
                }
                None => {
                    w.bool(false);
                }
            }
            tracing::debug!(ino, iomode = a.iomode, "LAYOUTRETURN");
        }
        ReturnWhat::Fsid | ReturnWhat::All => {
            if matches!(a.what, ReturnWhat::Fsid) {
                cx.cur()?;
            }
            let n = cx.gw.nfs4.state().layout_return_all(cid);
            tracing::debug!(layouts = n, "LAYOUTRETURN of every layout");
            w.bool(false);
        }
    }
    Ok(w)
}

fn bool_writer(b: bool) -> Writer {
    let mut w = Writer::new();
    w.bool(b);
    w
}

/// GETDEVICEINFO: NFS4ERR_TOOSMALL carries `gdir_mincount`.
pub async fn getdeviceinfo(cx: &mut Ctx<'_>, a: DeviceInfoArgs) -> (u32, Writer) {
    let r: Out = async {
        cx.clientid()?;
        if a.layout_type != LAYOUT4_NFSV4_1_FILES {
            return Err(NFS4ERR_UNKNOWN_LAYOUTTYPE);
        }
        let servers = cx.gw.nfs4.state().device(&a.deviceid).map(<[u32]>::to_vec).ok_or(NFS4ERR_NOENT)?;
        let addrs = addresses(cx, &servers).await?.ok_or(NFS4ERR_NOENT)?;
        let mut w = Writer::new();
        layout::encode_deviceinfo_ok(&mut w, &layout::ds_addr_body_on(&addrs));
        Ok(w)
    }
    .await;
    match r {
        Ok(w) if w.len() > a.maxcount as usize => {
            let mut t = Writer::new();
            t.u32(w.len() as u32);
            (NFS4ERR_TOOSMALL, t)
        }
        Ok(w) => (NFS4_OK, w),
        Err(s) => (s, Writer::new()),
    }
}

/// GETDEVICELIST: the devices of this gateway process's layouts, paged by cookie (the device counter); the cookie
/// verifier is the epoch, so a cookie of another process is NFS4ERR_NOT_SAME.
pub async fn getdevicelist(cx: &mut Ctx<'_>, a: DeviceListArgs) -> Out {
    cx.clientid()?;
    cx.cur()?;
    if a.layout_type != LAYOUT4_NFSV4_1_FILES {
        return Err(NFS4ERR_UNKNOWN_LAYOUTTYPE);
    }
    let mut verf = [0u8; 8];
    verf[4..].copy_from_slice(&cx.gw.nfs4.epoch.to_be_bytes());
    if a.cookie != 0 && a.verf != verf {
        return Err(NFS4ERR_NOT_SAME);
    }
    let max = a.maxdevices.min(DEVICELIST_MAX) as usize;
    if max == 0 {
        return Err(NFS4ERR_INVAL);
    }
    let (ids, cookie, eof) = cx.gw.nfs4.state().device_list(a.cookie, max);
    let mut w = Writer::new();
    w.u64(cookie).fixed(&verf).u32(ids.len() as u32);
    for id in &ids {
        w.fixed(id);
    }
    w.bool(eof);
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_client::PnfsDevice;

    #[test]
    fn a_client_gets_each_servers_addresses_of_its_own_transport_or_else_the_other() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let devices = vec![
            PnfsDevice { server: 1, addrs: vec![a("10.0.0.1:2049")], rdma_addrs: vec![a("10.0.0.1:20049")] },
            PnfsDevice { server: 2, addrs: vec![a("10.0.0.2:2049")], rdma_addrs: vec![] },
            PnfsDevice { server: 3, addrs: vec![], rdma_addrs: vec![a("10.0.0.3:20049")] },
        ];
        let over_rdma = pick_addresses(&devices, &[3, 1, 2], true).unwrap();
        assert_eq!(
            over_rdma,
            vec![
                vec![(a("10.0.0.3:20049"), true)],
                vec![(a("10.0.0.1:20049"), true)],
                vec![(a("10.0.0.2:2049"), false)]
            ]
        );
        let over_tcp = pick_addresses(&devices, &[1, 3], false).unwrap();
        assert_eq!(over_tcp, vec![vec![(a("10.0.0.1:2049"), false)], vec![(a("10.0.0.3:20049"), true)]]);
        assert_eq!(pick_addresses(&devices, &[1, 4], false), None, "server 4 announced nothing");
        let none = vec![PnfsDevice { server: 4, addrs: vec![], rdma_addrs: vec![] }];
        assert_eq!(pick_addresses(&none, &[4], true), None, "a server with no address at all");
    }
}
