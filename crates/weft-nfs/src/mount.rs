//! MOUNT v3 (RFC 1813 Appendix I), served on the gateway's one port: MNT gives the root handle of the export
//! (or of a directory below it); EXPORT and DUMP are empty and UMNT/UMNTALL are no-ops, since the
//! gateway keeps no mount list (NFSv3 is stateless and the list is advisory).

use std::net::SocketAddr;

use crate::Gateway;
use crate::proto::decode_mount_path;
use crate::rpc::{self, Call};
use crate::status::status_of;

pub const NULL: u32 = 0;
pub const MNT: u32 = 1;
pub const DUMP: u32 = 2;
pub const UMNT: u32 = 3;
pub const UMNTALL: u32 = 4;
pub const EXPORT: u32 = 5;

pub const MNT3_OK: u32 = 0;
pub const MNT3ERR_NOENT: u32 = 2;
pub const MNT3ERR_ACCES: u32 = 13;
pub const MNT3ERR_NOTDIR: u32 = 20;
pub const MNT3ERR_INVAL: u32 = 22;
pub const MNT3ERR_NAMETOOLONG: u32 = 63;
pub const MNT3ERR_SERVERFAULT: u32 = 10006;

/// The MNT reply to a caller whose address is not allowed.
pub fn refused(xid: u32) -> Vec<u8> {
    let mut w = rpc::accepted(xid, rpc::SUCCESS);
    w.u32(MNT3ERR_ACCES);
    w.buf
}

pub async fn call(gw: &Gateway, call: &Call<'_>, peer: SocketAddr) -> Vec<u8> {
    match call.proc_ {
        NULL | UMNTALL => rpc::accepted(call.xid, rpc::SUCCESS).buf,
        UMNT => match decode_mount_path(call.args) {
            Ok(_) => rpc::accepted(call.xid, rpc::SUCCESS).buf,
            Err(_) => rpc::accepted(call.xid, rpc::GARBAGE_ARGS).buf,
        },
        DUMP => {
            let mut w = rpc::accepted(call.xid, rpc::SUCCESS);
            w.bool(false);
            w.buf
        }
        // An empty list: libnfs treats every listed export below the path it mounts as a nested mount to
        // traverse, and fails on the export root itself when it mounts "" (a URL naming a file in the root).
        // Clients are told the export path (it is on the command line, `--export`).
        EXPORT => {
            let mut w = rpc::accepted(call.xid, rpc::SUCCESS);
            w.bool(false);
            w.buf
        }
        MNT => {
            let Ok(path) = decode_mount_path(call.args) else {
                return rpc::accepted(call.xid, rpc::GARBAGE_ARGS).buf;
            };
            let mut w = rpc::accepted(call.xid, rpc::SUCCESS);
            match mnt(gw, call, path).await {
                Ok(ino) => {
                    tracing::info!(%peer, path, "mounted");
                    w.u32(MNT3_OK).opaque(&gw.sealer.seal(ino));
                    // One flavour: AUTH_SYS (AUTH_NONE callers are served as nobody).
                    w.u32(1).u32(rpc::AUTH_SYS);
                }
                Err(stat) => {
                    tracing::info!(%peer, path, stat, "mount refused");
                    w.u32(stat);
                }
            }
            w.buf
        }
        _ => rpc::accepted(call.xid, rpc::PROC_UNAVAIL).buf,
    }
}

/// The inode a mount path names: the export, or a directory below it looked up as the caller.
async fn mnt(gw: &Gateway, call: &Call<'_>, path: &str) -> Result<u64, u32> {
    if path.len() > 1024 {
        return Err(MNT3ERR_NAMETOOLONG);
    }
    let export = gw.export_path();
    let rest = if export == "/" {
        Some(path)
    } else {
        path.strip_prefix(export).filter(|r| r.is_empty() || r.starts_with('/'))
    };
    let Some(rest) = rest else { return Err(MNT3ERR_NOENT) };
    let client = gw.client_for(&call.auth);
    let mut ino = gw.export_ino;
    for name in rest.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if name == ".." {
            return Err(MNT3ERR_INVAL);
        }
        let attr = client.lookup(ino, name).await.map_err(|e| mnt_status(status_of(&e)))?;
        if attr.kind != weft_proto::FileKind::Dir {
            return Err(MNT3ERR_NOTDIR);
        }
        ino = attr.ino;
    }
    Ok(ino)
}

fn mnt_status(nfs: u32) -> u32 {
    match nfs {
        crate::status::NFS3ERR_NOENT => MNT3ERR_NOENT,
        crate::status::NFS3ERR_ACCES | crate::status::NFS3ERR_PERM => MNT3ERR_ACCES,
        crate::status::NFS3ERR_NOTDIR => MNT3ERR_NOTDIR,
        crate::status::NFS3ERR_NAMETOOLONG => MNT3ERR_NAMETOOLONG,
        crate::status::NFS3ERR_INVAL => MNT3ERR_INVAL,
        _ => MNT3ERR_SERVERFAULT,
    }
}
