//! `fattr4` (RFC 8881 §5): the attribute bitmap, the attributes the gateway answers in GETATTR and READDIR
//! (those the Linux client asks for at mount, `stat`, `statfs` and `ls`), and the settable ones SETATTR, OPEN
//! and CREATE decode.
//!
//! Owners are numeric strings ("1000"), as the Linux client sends and accepts with AUTH_SYS (no id mapping).
//! `change` is the inode's ctime in nanoseconds plus its data version: it moves whenever either does.

use weft_proto::{Attr, FileKind, NAME_BYTES_MAX, SetAttrs, TimeSet};

use super::consts::*;
use crate::proto::IO_BYTES_MAX;
use crate::xdr::{Reader, Writer, XdrError};

pub const SUPPORTED_ATTRS: u32 = 0;
pub const TYPE: u32 = 1;
pub const FH_EXPIRE_TYPE: u32 = 2;
pub const CHANGE: u32 = 3;
pub const SIZE: u32 = 4;
pub const LINK_SUPPORT: u32 = 5;
pub const SYMLINK_SUPPORT: u32 = 6;
pub const NAMED_ATTR: u32 = 7;
pub const FSID: u32 = 8;
pub const UNIQUE_HANDLES: u32 = 9;
pub const LEASE_TIME: u32 = 10;
pub const RDATTR_ERROR: u32 = 11;
pub const ACLSUPPORT: u32 = 13;
pub const CANSETTIME: u32 = 15;
pub const CASE_INSENSITIVE: u32 = 16;
pub const CASE_PRESERVING: u32 = 17;
pub const CHOWN_RESTRICTED: u32 = 18;
pub const FILEHANDLE: u32 = 19;
pub const FILEID: u32 = 20;
pub const FILES_AVAIL: u32 = 21;
pub const FILES_FREE: u32 = 22;
pub const FILES_TOTAL: u32 = 23;
pub const HOMOGENEOUS: u32 = 26;
pub const MAXFILESIZE: u32 = 27;
pub const MAXLINK: u32 = 28;
pub const MAXNAME: u32 = 29;
pub const MAXREAD: u32 = 30;
pub const MAXWRITE: u32 = 31;
pub const MODE: u32 = 33;
pub const NO_TRUNC: u32 = 34;
pub const NUMLINKS: u32 = 35;
pub const OWNER: u32 = 36;
pub const OWNER_GROUP: u32 = 37;
pub const RAWDEV: u32 = 41;
pub const SPACE_AVAIL: u32 = 42;
pub const SPACE_FREE: u32 = 43;
pub const SPACE_TOTAL: u32 = 44;
pub const SPACE_USED: u32 = 45;
pub const TIME_ACCESS: u32 = 47;
pub const TIME_ACCESS_SET: u32 = 48;
pub const TIME_DELTA: u32 = 51;
pub const TIME_METADATA: u32 = 52;
pub const TIME_MODIFY: u32 = 53;
pub const TIME_MODIFY_SET: u32 = 54;
pub const MOUNTED_ON_FILEID: u32 = 55;
/// pNFS (answered only while the gateway serves layouts): the layout types of the file system, and the
/// preferred block size for layout I/O (the file's stripe unit).
pub const FS_LAYOUT_TYPES: u32 = 62;
pub const LAYOUT_BLKSIZE: u32 = 65;
pub const SUPPATTR_EXCLCREAT: u32 = 75;

/// Bitmap words accepted on the wire (attributes go up to 82 today: 3 words; 8 leaves room).
pub const BITMAP_WORDS_MAX: usize = 8;
/// The largest attribute list decoded (a SETATTR's owner strings and times are a few dozen bytes).
pub const ATTRLIST_BYTES_MAX: usize = 4096;

/// A set of attribute numbers, as the wire's `bitmap4`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bitmap(pub Vec<u32>);

impl Bitmap {
    pub fn of(bits: &[u32]) -> Bitmap {
        let mut b = Bitmap::default();
        for &n in bits {
            b.set(n);
        }
        b
    }

    pub fn has(&self, n: u32) -> bool {
        self.0.get((n / 32) as usize).is_some_and(|w| w & (1 << (n % 32)) != 0)
    }

    pub fn set(&mut self, n: u32) {
        let i = (n / 32) as usize;
        if self.0.len() <= i {
            self.0.resize(i + 1, 0);
        }
        self.0[i] |= 1 << (n % 32);
    }

    /// The attribute numbers set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.0.len() as u32 * 32).filter(|&n| self.has(n))
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Bitmap, XdrError> {
        let n = r.u32()? as usize;
        if n > BITMAP_WORDS_MAX {
            return Err(XdrError::TooLong { len: n as u64, max: BITMAP_WORDS_MAX });
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(r.u32()?);
        }
        Ok(Bitmap(v))
    }

    pub fn encode(&self, w: &mut Writer) {
        let mut words = self.0.clone();
        while words.last() == Some(&0) {
            words.pop();
        }
        w.u32(words.len() as u32);
        for x in words {
            w.u32(x);
        }
    }
}

/// Every attribute GETATTR answers.
pub fn supported() -> Bitmap {
    Bitmap::of(&[
        SUPPORTED_ATTRS,
        TYPE,
        FH_EXPIRE_TYPE,
        CHANGE,
        SIZE,
        LINK_SUPPORT,
        SYMLINK_SUPPORT,
        NAMED_ATTR,
        FSID,
        UNIQUE_HANDLES,
        LEASE_TIME,
        RDATTR_ERROR,
        ACLSUPPORT,
        CANSETTIME,
        CASE_INSENSITIVE,
        CASE_PRESERVING,
        CHOWN_RESTRICTED,
        FILEHANDLE,
        FILEID,
        FILES_AVAIL,
        FILES_FREE,
        FILES_TOTAL,
        HOMOGENEOUS,
        MAXFILESIZE,
        MAXLINK,
        MAXNAME,
        MAXREAD,
        MAXWRITE,
        MODE,
        NO_TRUNC,
        NUMLINKS,
        OWNER,
        OWNER_GROUP,
        RAWDEV,
        SPACE_AVAIL,
        SPACE_FREE,
        SPACE_TOTAL,
        SPACE_USED,
        TIME_ACCESS,
        TIME_ACCESS_SET,
        TIME_DELTA,
        TIME_METADATA,
        TIME_MODIFY,
        TIME_MODIFY_SET,
        MOUNTED_ON_FILEID,
        SUPPATTR_EXCLCREAT,
    ])
}

/// Every attribute GETATTR answers when the gateway serves pNFS layouts (or not).
pub fn supported_with(pnfs: bool) -> Bitmap {
    let mut b = supported();
    if pnfs {
        b.set(FS_LAYOUT_TYPES);
        b.set(LAYOUT_BLKSIZE);
    }
    b
}

/// What SETATTR and createattrs may carry.
pub fn settable() -> Bitmap {
    Bitmap::of(&[SIZE, MODE, OWNER, OWNER_GROUP, TIME_ACCESS_SET, TIME_MODIFY_SET])
}

/// What EXCLUSIVE4_1's createattrs may carry: the times hold the verifier.
pub fn exclcreat() -> Bitmap {
    Bitmap::of(&[SIZE, MODE, OWNER, OWNER_GROUP])
}

/// The file-system-wide values an answer may need beside the inode's attributes.
#[derive(Debug, Clone, Default)]
pub struct FsInfo {
    pub fsid: u64,
    pub lease_s: u32,
    pub bytes_total: u64,
    pub bytes_free: u64,
    pub files: u64,
    /// The gateway serves pNFS layouts: `fs_layout_type` and `layout_blksize` are answered.
    pub pnfs: bool,
}

fn nfstime4(w: &mut Writer, ns: i64) {
    let s = ns.div_euclid(1_000_000_000);
    w.u64(s as u64).u32(ns.rem_euclid(1_000_000_000) as u32);
}

pub fn ftype4(kind: FileKind) -> u32 {
    match kind {
        FileKind::File => NF4REG,
        FileKind::Dir => NF4DIR,
        FileKind::BlockDev => NF4BLK,
        FileKind::CharDev => NF4CHR,
        FileKind::Symlink => NF4LNK,
        FileKind::Socket => NF4SOCK,
        FileKind::Fifo => NF4FIFO,
    }
}

/// `change`: moves with any change of the inode (ctime) or of its data (data version).
pub fn change_of(a: &Attr) -> u64 {
    (a.ctime_ns as u64).wrapping_add(a.data_version)
}

/// Encodes the `fattr4` of `a` for the requested bits (unsupported ones are left out of the answer's bitmap, as
/// RFC 8881 §5.2 prescribes); `fh` is the handle for `filehandle`.
pub fn encode(w: &mut Writer, want: &Bitmap, a: &Attr, fh: &[u8], fs: &FsInfo) {
    let (got, v) = values(want, a, fh, fs);
    got.encode(w);
    w.opaque(&v.buf);
}

/// The `fattr4` of `a` for the requested bits, apart: the bits answered and their values (`attrlist4`), which
/// VERIFY compares with a client's.
pub fn values(want: &Bitmap, a: &Attr, fh: &[u8], fs: &FsInfo) -> (Bitmap, Writer) {
    let sup = supported_with(fs.pnfs);
    let mut got = Bitmap::default();
    let mut v = Writer::new();
    for n in want.iter().filter(|&n| sup.has(n)) {
        match n {
            SUPPORTED_ATTRS => sup.encode(&mut v),
            TYPE => {
                v.u32(ftype4(a.kind));
            }
            FH_EXPIRE_TYPE => {
                v.u32(0); // FH4_PERSISTENT
            }
            CHANGE => {
                v.u64(change_of(a));
            }
            SIZE => {
                v.u64(a.size);
            }
            LINK_SUPPORT | SYMLINK_SUPPORT | UNIQUE_HANDLES | CANSETTIME | CASE_PRESERVING | CHOWN_RESTRICTED
            | HOMOGENEOUS | NO_TRUNC => {
                v.bool(true);
            }
            NAMED_ATTR | CASE_INSENSITIVE => {
                v.bool(false);
            }
            FSID => {
                v.u64(fs.fsid).u64(0);
            }
            LEASE_TIME => {
                v.u32(fs.lease_s);
            }
            RDATTR_ERROR => {
                v.u32(NFS4_OK);
            }
            ACLSUPPORT => {
                v.u32(0);
            }
            FILEHANDLE => {
                v.opaque(fh);
            }
            FILEID | MOUNTED_ON_FILEID => {
                v.u64(a.ino);
            }
            FILES_AVAIL | FILES_FREE => {
                v.u64(1 << 32);
            }
            FILES_TOTAL => {
                v.u64(fs.files + (1 << 32));
            }
            MAXFILESIZE => {
                v.u64(i64::MAX as u64);
            }
            MAXLINK => {
                v.u32(u32::MAX);
            }
            MAXNAME => {
                v.u32(NAME_BYTES_MAX as u32);
            }
            MAXREAD | MAXWRITE => {
                v.u64(IO_BYTES_MAX as u64);
            }
            MODE => {
                v.u32(a.mode & 0o7777);
            }
            NUMLINKS => {
                v.u32(a.nlink);
            }
            OWNER => {
                v.opaque(a.uid.to_string().as_bytes());
            }
            OWNER_GROUP => {
                v.opaque(a.gid.to_string().as_bytes());
            }
            RAWDEV => {
                // Weft keeps Linux's 32-bit dev_t encoding (new_encode_dev).
                v.u32((a.rdev & 0xfff00) >> 8).u32((a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00));
            }
            SPACE_AVAIL | SPACE_FREE => {
                v.u64(fs.bytes_free);
            }
            SPACE_TOTAL => {
                v.u64(fs.bytes_total);
            }
            SPACE_USED => {
                v.u64(a.size.div_ceil(4096) * 4096);
            }
            TIME_ACCESS => nfstime4(&mut v, a.atime_ns),
            TIME_DELTA => {
                v.u64(0).u32(1);
            }
            TIME_METADATA => nfstime4(&mut v, a.ctime_ns),
            TIME_MODIFY => nfstime4(&mut v, a.mtime_ns),
            SUPPATTR_EXCLCREAT => exclcreat().encode(&mut v),
            FS_LAYOUT_TYPES => {
                v.u32(1).u32(super::layout::LAYOUT4_NFSV4_1_FILES);
            }
            LAYOUT_BLKSIZE => {
                // A file's (or a directory's policy's) stripe unit: the I/O size that touches one data server.
                v.u32(a.layout.as_ref().map_or(weft_proto::layout::DEFAULT_STRIPE_UNIT_BYTES, |l| l.stripe_unit));
            }
            // Write-only (the *_SET times): answered by nothing, so left out of the bitmap.
            _ => continue,
        }
        got.set(n);
    }
    (got, v)
}

/// Settable attributes as decoded, and the bits they came with (for `attrset`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settable {
    pub set: SetAttrs,
    pub bits: Bitmap,
}

fn owner_id(s: &str) -> Result<u32, u32> {
    // "1000" or "1000@domain": the numeric form only, as with AUTH_SYS and no id mapping.
    let num = s.split('@').next().unwrap_or("");
    num.parse::<u32>().map_err(|_| NFS4ERR_BADOWNER)
}

fn settime4(r: &mut Reader<'_>) -> Result<TimeSet, u32> {
    match r.u32().map_err(|_| NFS4ERR_BADXDR)? {
        0 => Ok(TimeSet::Now),
        1 => {
            let s = r.u64().map_err(|_| NFS4ERR_BADXDR)? as i64;
            let ns = r.u32().map_err(|_| NFS4ERR_BADXDR)?;
            if ns >= 1_000_000_000 {
                return Err(NFS4ERR_INVAL);
            }
            let total = s.checked_mul(1_000_000_000).and_then(|x| x.checked_add(ns as i64)).ok_or(NFS4ERR_INVAL)?;
            Ok(TimeSet::AtNs(total))
        }
        _ => Err(NFS4ERR_BADXDR),
    }
}

/// Decodes a `fattr4` whose attributes must all be in `allowed` (ATTRNOTSUPP for an unknown one, INVAL for a
/// known read-only one); the error is an NFSv4 status.
pub fn decode_settable(r: &mut Reader<'_>, allowed: &Bitmap) -> Result<Settable, u32> {
    let bits = Bitmap::decode(r).map_err(|_| NFS4ERR_BADXDR)?;
    let list = r.opaque(ATTRLIST_BYTES_MAX).map_err(|_| NFS4ERR_BADXDR)?;
    settable_from(&bits, list, allowed)
}

pub fn settable_from(bits: &Bitmap, list: &[u8], allowed: &Bitmap) -> Result<Settable, u32> {
    let mut r = Reader::new(list);
    let mut set = SetAttrs::default();
    let sup = supported();
    for n in bits.iter() {
        if !allowed.has(n) {
            return Err(if sup.has(n) { NFS4ERR_INVAL } else { NFS4ERR_ATTRNOTSUPP });
        }
        let bad = |_| NFS4ERR_BADXDR;
        match n {
            SIZE => set.size = Some(r.u64().map_err(bad)?),
            MODE => set.mode = Some(r.u32().map_err(bad)? & 0o7777),
            OWNER => set.uid = Some(owner_id(r.string(1024).map_err(bad)?)?),
            OWNER_GROUP => set.gid = Some(owner_id(r.string(1024).map_err(bad)?)?),
            TIME_ACCESS_SET => set.atime = Some(settime4(&mut r)?),
            TIME_MODIFY_SET => set.mtime = Some(settime4(&mut r)?),
            _ => return Err(NFS4ERR_ATTRNOTSUPP),
        }
    }
    if r.remaining() != 0 {
        return Err(NFS4ERR_BADXDR);
    }
    Ok(Settable { set, bits: bits.clone() })
}

/// Decodes a `fattr4` as sent (VERIFY-style or a reply), for the test client: (bitmap, attribute bytes).
pub fn decode_raw<'a>(r: &mut Reader<'a>) -> Result<(Bitmap, &'a [u8]), XdrError> {
    let b = Bitmap::decode(r)?;
    Ok((b, r.opaque(1 << 20)?))
}

/// The values of a GETATTR answer the test client reads: (type, size, fileid, mode, owner uid).
pub fn decode_basic(bits: &Bitmap, list: &[u8]) -> Result<Vec<(u32, u64)>, XdrError> {
    let mut r = Reader::new(list);
    let mut out = Vec::new();
    for n in bits.iter() {
        let v = match n {
            TYPE | MODE | NUMLINKS | LEASE_TIME | RDATTR_ERROR | FH_EXPIRE_TYPE | ACLSUPPORT | MAXLINK | MAXNAME => {
                r.u32()? as u64
            }
            CHANGE | SIZE | FILEID | MOUNTED_ON_FILEID | FILES_AVAIL | FILES_FREE | FILES_TOTAL | MAXFILESIZE
            | MAXREAD | MAXWRITE | SPACE_AVAIL | SPACE_FREE | SPACE_TOTAL | SPACE_USED => r.u64()?,
            LINK_SUPPORT | SYMLINK_SUPPORT | NAMED_ATTR | UNIQUE_HANDLES | CANSETTIME | CASE_INSENSITIVE
            | CASE_PRESERVING | CHOWN_RESTRICTED | HOMOGENEOUS | NO_TRUNC => r.bool()? as u64,
            FSID => {
                let m = r.u64()?;
                r.u64()?;
                m
            }
            OWNER | OWNER_GROUP => {
                let s = r.string(1024)?;
                s.parse::<u64>().unwrap_or(u64::MAX)
            }
            FILEHANDLE => r.opaque(128)?.len() as u64,
            RAWDEV => {
                r.u32()?;
                r.u32()? as u64
            }
            TIME_ACCESS | TIME_METADATA | TIME_MODIFY | TIME_DELTA => {
                let s = r.u64()?;
                r.u32()?;
                s
            }
            SUPPORTED_ATTRS | SUPPATTR_EXCLCREAT => Bitmap::decode(&mut r)?.iter().count() as u64,
            other => return Err(XdrError::BadDiscriminant(other)),
        };
        out.push((n, v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr() -> Attr {
        Attr {
            ino: 77,
            kind: FileKind::File,
            mode: 0o100644,
            uid: 1000,
            gid: 100,
            nlink: 2,
            size: 5000,
            atime_ns: 1_500_000_000,
            mtime_ns: 2_000_000_001,
            ctime_ns: 3_000_000_000,
            layout: None,
            rdev: 0,
            data_version: 4,
        }
    }

    #[test]
    fn bitmaps_round_trip_and_bound() {
        let b = Bitmap::of(&[0, 1, 33, 75]);
        assert!(b.has(75) && b.has(33) && !b.has(2) && !b.has(200));
        let mut w = Writer::new();
        b.encode(&mut w);
        assert_eq!(w.buf.len(), 4 + 3 * 4);
        assert_eq!(Bitmap::decode(&mut Reader::new(&w.buf)).unwrap(), b);
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![0, 1, 33, 75]);
        let mut w = Writer::new();
        w.u32(1 << 30);
        assert!(Bitmap::decode(&mut Reader::new(&w.buf)).is_err());
    }

    #[test]
    fn getattr_answers_the_asked_supported_bits_in_order() {
        let want = Bitmap::of(&[TYPE, SIZE, FILEID, MODE, OWNER, OWNER_GROUP, TIME_MODIFY, 12, TIME_ACCESS_SET]);
        let fs = FsInfo { fsid: 9, lease_s: 90, ..FsInfo::default() };
        let mut w = Writer::new();
        encode(&mut w, &want, &attr(), &[1; 36], &fs);
        let (bits, list) = decode_raw(&mut Reader::new(&w.buf)).unwrap();
        // acl (12) and the write-only time_access_set are left out.
        assert_eq!(bits, Bitmap::of(&[TYPE, SIZE, FILEID, MODE, OWNER, OWNER_GROUP, TIME_MODIFY]));
        let vals = decode_basic(&bits, list).unwrap();
        assert_eq!(
            vals,
            vec![
                (TYPE, 1),
                (SIZE, 5000),
                (FILEID, 77),
                (MODE, 0o644),
                (OWNER, 1000),
                (OWNER_GROUP, 100),
                (TIME_MODIFY, 2)
            ]
        );
        // Every supported attribute encodes and decodes back in step.
        let mut w = Writer::new();
        encode(&mut w, &supported(), &attr(), &[1; 36], &fs);
        let (bits, list) = decode_raw(&mut Reader::new(&w.buf)).unwrap();
        assert_eq!(decode_basic(&bits, list).unwrap().len(), bits.iter().count());
        assert!(!bits.has(TIME_ACCESS_SET) && bits.has(SUPPATTR_EXCLCREAT));
    }

    #[test]
    fn settable_attributes_decode_and_refuse() {
        let mut list = Writer::new();
        list.u64(0).u32(0o100600).opaque(b"1001").u32(1).u64(5).u32(7).u32(0);
        let bits = Bitmap::of(&[SIZE, MODE, OWNER, TIME_ACCESS_SET, TIME_MODIFY_SET]);
        let s = settable_from(&bits, &list.buf, &settable()).unwrap();
        assert_eq!(s.set.size, Some(0));
        assert_eq!(s.set.mode, Some(0o600));
        assert_eq!(s.set.uid, Some(1001));
        assert_eq!(s.set.atime, Some(TimeSet::AtNs(5_000_000_007)));
        assert_eq!(s.set.mtime, Some(TimeSet::Now));
        // Read-only, unknown, non-numeric owners, trailing and missing bytes.
        assert_eq!(settable_from(&Bitmap::of(&[FILEID]), &[0; 8], &settable()), Err(NFS4ERR_INVAL));
        assert_eq!(settable_from(&Bitmap::of(&[12]), &[], &settable()), Err(NFS4ERR_ATTRNOTSUPP));
        let mut o = Writer::new();
        o.opaque(b"alice");
        assert_eq!(settable_from(&Bitmap::of(&[OWNER]), &o.buf, &settable()), Err(NFS4ERR_BADOWNER));
        assert_eq!(settable_from(&Bitmap::of(&[MODE]), &[0; 8], &settable()), Err(NFS4ERR_BADXDR));
        assert_eq!(settable_from(&Bitmap::of(&[SIZE]), &[0; 4], &settable()), Err(NFS4ERR_BADXDR));
        assert_eq!(settable_from(&Bitmap::of(&[TIME_MODIFY_SET]), &[0; 8], &exclcreat()), Err(NFS4ERR_INVAL));
    }
}
