//! NFSv3 (RFC 1813) and MOUNT v3 (RFC 1813 Appendix I) arguments and the result pieces shared by procedures:
//! decoders that bound every length and reject every unknown discriminant, and encoders of `fattr3`, `wcc_data`
//! and friends from Weft's [`Attr`].

use weft_proto::{Attr, FileKind};

use crate::xdr::{Reader, Writer, XdrError};

pub const NFS_PROGRAM: u32 = 100003;
pub const MOUNT_PROGRAM: u32 = 100005;
pub const NFS_V3: u32 = 3;
pub const NFS_V4: u32 = 4;
pub const MOUNT_V3: u32 = 3;

/// NFS3_FHSIZE: a handle is at most 64 bytes on the wire.
pub const FH_WIRE_MAX: usize = 64;
/// Names are bounded here generously; a name over Weft's 255 bytes is answered NFS3ERR_NAMETOOLONG, not
/// GARBAGE_ARGS, so it is decoded first.
pub const NAME_WIRE_MAX: usize = 1024;
/// A symlink target or a mount path (MNTPATHLEN is 1024; PATH_MAX 4096).
pub const PATH_WIRE_MAX: usize = 4096;
/// The largest READ/WRITE the gateway advertises (FSINFO rtmax/wtmax) and accepts.
pub const IO_BYTES_MAX: u32 = 1 << 20;

pub type Verf = [u8; 8];

/// `sattr3`: what SETATTR, CREATE, MKDIR, SYMLINK and MKNOD set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sattr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: TimeHow,
    pub mtime: TimeHow,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TimeHow {
    #[default]
    DontChange,
    ServerTime,
    ClientTime(u32, u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirOp<'a> {
    pub dir: &'a [u8],
    pub name: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateHow {
    Unchecked(Sattr),
    Guarded(Sattr),
    Exclusive(Verf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MknodWhat {
    Chr(Sattr, u32, u32),
    Blk(Sattr, u32, u32),
    Sock(Sattr),
    Fifo(Sattr),
    /// Another ftype3 (regular, directory, symlink): NFS3ERR_BADTYPE.
    Bad(u32),
}

/// The arguments of one NFSv3 procedure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Args<'a> {
    Null,
    GetAttr(&'a [u8]),
    SetAttr { fh: &'a [u8], sattr: Sattr, guard: Option<(u32, u32)> },
    Lookup(DirOp<'a>),
    Access { fh: &'a [u8], mask: u32 },
    Readlink(&'a [u8]),
    Read { fh: &'a [u8], offset: u64, count: u32 },
    Write { fh: &'a [u8], offset: u64, count: u32, stable: u32, data: &'a [u8] },
    Create { at: DirOp<'a>, how: CreateHow },
    Mkdir { at: DirOp<'a>, sattr: Sattr },
    Symlink { at: DirOp<'a>, sattr: Sattr, target: &'a str },
    Mknod { at: DirOp<'a>, what: MknodWhat },
    Remove(DirOp<'a>),
    Rmdir(DirOp<'a>),
    Rename { from: DirOp<'a>, to: DirOp<'a> },
    Link { fh: &'a [u8], to: DirOp<'a> },
    Readdir { fh: &'a [u8], cookie: u64, verf: Verf, count: u32 },
    ReaddirPlus { fh: &'a [u8], cookie: u64, verf: Verf, dircount: u32, maxcount: u32 },
    Fsstat(&'a [u8]),
    Fsinfo(&'a [u8]),
    Pathconf(&'a [u8]),
    Commit { fh: &'a [u8], offset: u64, count: u32 },
}

/// A procedure number this version does not have (PROC_UNAVAIL) or malformed arguments (GARBAGE_ARGS).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgsError {
    #[error("procedure {0} is not in this version")]
    NoProc(u32),
    #[error("{0}")]
    Garbage(#[from] XdrError),
}

pub const STABLE_UNSTABLE: u32 = 0;
pub const STABLE_DATA_SYNC: u32 = 1;
pub const STABLE_FILE_SYNC: u32 = 2;

fn fh<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], XdrError> {
    r.opaque(FH_WIRE_MAX)
}

fn dirop<'a>(r: &mut Reader<'a>) -> Result<DirOp<'a>, XdrError> {
    Ok(DirOp { dir: fh(r)?, name: r.string(NAME_WIRE_MAX)? })
}

fn verf(r: &mut Reader<'_>) -> Result<Verf, XdrError> {
    Ok(r.fixed(8)?.try_into().expect("8 bytes"))
}

fn opt_u32(r: &mut Reader<'_>) -> Result<Option<u32>, XdrError> {
    Ok(if r.bool()? { Some(r.u32()?) } else { None })
}

fn time_how(r: &mut Reader<'_>) -> Result<TimeHow, XdrError> {
    match r.u32()? {
        0 => Ok(TimeHow::DontChange),
        1 => Ok(TimeHow::ServerTime),
        2 => Ok(TimeHow::ClientTime(r.u32()?, r.u32()?)),
        d => Err(XdrError::BadDiscriminant(d)),
    }
}

pub fn sattr(r: &mut Reader<'_>) -> Result<Sattr, XdrError> {
    Ok(Sattr {
        mode: opt_u32(r)?,
        uid: opt_u32(r)?,
        gid: opt_u32(r)?,
        size: if r.bool()? { Some(r.u64()?) } else { None },
        atime: time_how(r)?,
        mtime: time_how(r)?,
    })
}

/// Decodes procedure `proc_`'s arguments.
pub fn decode_args(proc_: u32, b: &[u8]) -> Result<Args<'_>, ArgsError> {
    let mut r = Reader::new(b);
    let r = &mut r;
    Ok(match proc_ {
        0 => Args::Null,
        1 => Args::GetAttr(fh(r)?),
        2 => {
            let fh = fh(r)?;
            let sattr = sattr(r)?;
            let guard = if r.bool()? { Some((r.u32()?, r.u32()?)) } else { None };
            Args::SetAttr { fh, sattr, guard }
        }
        3 => Args::Lookup(dirop(r)?),
        4 => Args::Access { fh: fh(r)?, mask: r.u32()? },
        5 => Args::Readlink(fh(r)?),
        6 => Args::Read { fh: fh(r)?, offset: r.u64()?, count: r.u32()? },
        7 => {
            let (fh, offset, count) = (fh(r)?, r.u64()?, r.u32()?);
            let stable = r.u32()?;
            if stable > STABLE_FILE_SYNC {
                return Err(XdrError::BadDiscriminant(stable).into());
            }
            Args::Write { fh, offset, count, stable, data: r.opaque(IO_BYTES_MAX as usize)? }
        }
        8 => {
            let at = dirop(r)?;
            let how = match r.u32()? {
                0 => CreateHow::Unchecked(sattr(r)?),
                1 => CreateHow::Guarded(sattr(r)?),
                2 => CreateHow::Exclusive(verf(r)?),
                d => return Err(XdrError::BadDiscriminant(d).into()),
            };
            Args::Create { at, how }
        }
        9 => Args::Mkdir { at: dirop(r)?, sattr: sattr(r)? },
        10 => Args::Symlink { at: dirop(r)?, sattr: sattr(r)?, target: r.string(PATH_WIRE_MAX)? },
        11 => {
            let at = dirop(r)?;
            let what = match r.u32()? {
                3 => {
                    let s = sattr(r)?;
                    MknodWhat::Blk(s, r.u32()?, r.u32()?)
                }
                4 => {
                    let s = sattr(r)?;
                    MknodWhat::Chr(s, r.u32()?, r.u32()?)
                }
                6 => MknodWhat::Sock(sattr(r)?),
                7 => MknodWhat::Fifo(sattr(r)?),
                t @ (1 | 2 | 5) => MknodWhat::Bad(t),
                d => return Err(XdrError::BadDiscriminant(d).into()),
            };
            Args::Mknod { at, what }
        }
        12 => Args::Remove(dirop(r)?),
        13 => Args::Rmdir(dirop(r)?),
        14 => Args::Rename { from: dirop(r)?, to: dirop(r)? },
        15 => Args::Link { fh: fh(r)?, to: dirop(r)? },
        16 => Args::Readdir { fh: fh(r)?, cookie: r.u64()?, verf: verf(r)?, count: r.u32()? },
        17 => {
            Args::ReaddirPlus { fh: fh(r)?, cookie: r.u64()?, verf: verf(r)?, dircount: r.u32()?, maxcount: r.u32()? }
        }
        18 => Args::Fsstat(fh(r)?),
        19 => Args::Fsinfo(fh(r)?),
        20 => Args::Pathconf(fh(r)?),
        21 => Args::Commit { fh: fh(r)?, offset: r.u64()?, count: r.u32()? },
        p => return Err(ArgsError::NoProc(p)),
    })
}

/// MOUNT v3 procedures' arguments: MNT and UMNT take a path, the others nothing.
pub fn decode_mount_path(b: &[u8]) -> Result<&str, XdrError> {
    Reader::new(b).string(PATH_WIRE_MAX)
}

// ---- results ---------------------------------------------------------------------------------------------------

pub fn ftype(kind: FileKind) -> u32 {
    match kind {
        FileKind::File => 1,
        FileKind::Dir => 2,
        FileKind::BlockDev => 3,
        FileKind::CharDev => 4,
        FileKind::Symlink => 5,
        FileKind::Socket => 6,
        FileKind::Fifo => 7,
    }
}

/// nfstime3 from nanoseconds since the epoch (times before 1970 clamp to 0: the field is unsigned).
pub fn nfstime(w: &mut Writer, ns: i64) {
    let ns = ns.max(0) as u64;
    w.u32((ns / 1_000_000_000).min(u32::MAX as u64) as u32).u32((ns % 1_000_000_000) as u32);
}

pub fn time_ns(sec: u32, nsec: u32) -> i64 {
    sec as i64 * 1_000_000_000 + nsec.min(999_999_999) as i64
}

/// The file system id every attribute carries: one per export, so `fsid` changes only at an export boundary.
pub fn fattr(w: &mut Writer, a: &Attr, fsid: u64) {
    w.u32(ftype(a.kind)).u32(a.mode & 0o7777).u32(a.nlink).u32(a.uid).u32(a.gid);
    w.u64(a.size).u64(a.size.div_ceil(4096) * 4096);
    // rdev as Linux encodes dev_t in 32 bits: major 12 bits, minor 20 (new_encode_dev).
    w.u32((a.rdev & 0xfff00) >> 8).u32((a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00));
    w.u64(fsid).u64(a.ino);
    nfstime(w, a.atime_ns);
    nfstime(w, a.mtime_ns);
    nfstime(w, a.ctime_ns);
}

pub fn post_op_attr(w: &mut Writer, a: Option<&Attr>, fsid: u64) {
    match a {
        Some(a) => {
            w.bool(true);
            fattr(w, a, fsid);
        }
        None => {
            w.bool(false);
        }
    }
}

/// `wcc_attr` before an operation: size, mtime, ctime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreOp {
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl PreOp {
    pub fn of(a: &Attr) -> PreOp {
        PreOp { size: a.size, mtime_ns: a.mtime_ns, ctime_ns: a.ctime_ns }
    }
}

pub fn wcc_data(w: &mut Writer, pre: Option<PreOp>, post: Option<&Attr>, fsid: u64) {
    match pre {
        Some(p) => {
            w.bool(true).u64(p.size);
            nfstime(w, p.mtime_ns);
            nfstime(w, p.ctime_ns);
        }
        None => {
            w.bool(false);
        }
    }
    post_op_attr(w, post, fsid);
}

pub fn post_op_fh(w: &mut Writer, fh: Option<&[u8]>) {
    match fh {
        Some(h) => {
            w.bool(true).opaque(h);
        }
        None => {
            w.bool(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_procedure_decodes_and_bad_discriminants_are_garbage() {
        let mut w = Writer::new();
        w.opaque(&[1; 36]).u64(5).u32(3).u32(STABLE_FILE_SYNC).opaque(b"abc");
        match decode_args(7, &w.buf).unwrap() {
            Args::Write { offset: 5, count: 3, stable: STABLE_FILE_SYNC, data: b"abc", .. } => {}
            other => panic!("{other:?}"),
        }
        let mut w = Writer::new();
        w.opaque(&[1; 36]).u64(5).u32(3).u32(3).opaque(b"abc");
        assert_eq!(decode_args(7, &w.buf), Err(ArgsError::Garbage(XdrError::BadDiscriminant(3))));
        let mut w = Writer::new();
        w.opaque(&[1; 36]).opaque(b"f").u32(9);
        assert_eq!(decode_args(8, &w.buf), Err(ArgsError::Garbage(XdrError::BadDiscriminant(9))));
        let mut w = Writer::new();
        w.opaque(&[1; 36]).opaque(b"f").u32(2).fixed(&[9; 8]);
        assert!(matches!(decode_args(8, &w.buf), Ok(Args::Create { how: CreateHow::Exclusive(v), .. }) if v == [9; 8]));
        let mut w = Writer::new();
        w.opaque(&[1; 65]);
        assert!(matches!(decode_args(1, &w.buf), Err(ArgsError::Garbage(XdrError::TooLong { .. }))));
        assert_eq!(decode_args(22, &[]), Err(ArgsError::NoProc(22)));
        for p in 1..=21 {
            assert!(matches!(decode_args(p, &[]), Err(ArgsError::Garbage(_))), "proc {p} with no arguments");
        }
        assert_eq!(decode_args(0, &[]), Ok(Args::Null));
    }

    #[test]
    fn sattr_decodes_all_fields() {
        let mut w = Writer::new();
        w.bool(true).u32(0o640).bool(false).bool(true).u32(7).bool(true).u64(99).u32(1).u32(2).u32(3).u32(4);
        let s = sattr(&mut Reader::new(&w.buf)).unwrap();
        assert_eq!(
            s,
            Sattr {
                mode: Some(0o640),
                uid: None,
                gid: Some(7),
                size: Some(99),
                atime: TimeHow::ServerTime,
                mtime: TimeHow::ClientTime(3, 4)
            }
        );
    }
}
