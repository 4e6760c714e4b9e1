//! NFSv4.1 numbers (RFC 8881 §15, §16, §18 and the XDR of RFC 8881's companion RFC 5662): operation codes,
//! status codes, share and lock flags.

pub const OP_ACCESS: u32 = 3;
pub const OP_CLOSE: u32 = 4;
pub const OP_COMMIT: u32 = 5;
pub const OP_CREATE: u32 = 6;
pub const OP_DELEGRETURN: u32 = 8;
pub const OP_GETATTR: u32 = 9;
pub const OP_GETFH: u32 = 10;
pub const OP_LINK: u32 = 11;
pub const OP_LOCK: u32 = 12;
pub const OP_LOCKT: u32 = 13;
pub const OP_LOCKU: u32 = 14;
pub const OP_LOOKUP: u32 = 15;
pub const OP_LOOKUPP: u32 = 16;
pub const OP_NVERIFY: u32 = 17;
pub const OP_OPEN: u32 = 18;
pub const OP_OPEN_DOWNGRADE: u32 = 21;
pub const OP_PUTFH: u32 = 22;
pub const OP_PUTPUBFH: u32 = 23;
pub const OP_PUTROOTFH: u32 = 24;
pub const OP_READ: u32 = 25;
pub const OP_READDIR: u32 = 26;
pub const OP_READLINK: u32 = 27;
pub const OP_REMOVE: u32 = 28;
pub const OP_RENAME: u32 = 29;
pub const OP_RESTOREFH: u32 = 31;
pub const OP_SAVEFH: u32 = 32;
pub const OP_SECINFO: u32 = 33;
pub const OP_SETATTR: u32 = 34;
pub const OP_VERIFY: u32 = 37;
pub const OP_WRITE: u32 = 38;
pub const OP_BACKCHANNEL_CTL: u32 = 40;
pub const OP_BIND_CONN_TO_SESSION: u32 = 41;
pub const OP_EXCHANGE_ID: u32 = 42;
pub const OP_CREATE_SESSION: u32 = 43;
pub const OP_DESTROY_SESSION: u32 = 44;
pub const OP_FREE_STATEID: u32 = 45;
pub const OP_GETDEVICEINFO: u32 = 47;
pub const OP_GETDEVICELIST: u32 = 48;
pub const OP_LAYOUTCOMMIT: u32 = 49;
pub const OP_LAYOUTGET: u32 = 50;
pub const OP_LAYOUTRETURN: u32 = 51;
pub const OP_SECINFO_NO_NAME: u32 = 52;
pub const OP_SEQUENCE: u32 = 53;
pub const OP_TEST_STATEID: u32 = 55;
pub const OP_DESTROY_CLIENTID: u32 = 57;
pub const OP_RECLAIM_COMPLETE: u32 = 58;
pub const OP_ILLEGAL: u32 = 10044;

pub const NFS4_OK: u32 = 0;
pub const NFS4ERR_PERM: u32 = 1;
/// A client owner in use by a live client of another principal (RFC 8881 §18.35.5).
pub const NFS4ERR_CLID_INUSE: u32 = 10017;
/// A client-level op from a principal other than the client's (RFC 8881 §15.1.1.6).
pub const NFS4ERR_WRONG_CRED: u32 = 10082;
pub const NFS4ERR_NOENT: u32 = 2;
pub const NFS4ERR_IO: u32 = 5;
pub const NFS4ERR_ACCESS: u32 = 13;
pub const NFS4ERR_EXIST: u32 = 17;
pub const NFS4ERR_NOTDIR: u32 = 20;
pub const NFS4ERR_ISDIR: u32 = 21;
pub const NFS4ERR_INVAL: u32 = 22;
pub const NFS4ERR_FBIG: u32 = 27;
pub const NFS4ERR_NAMETOOLONG: u32 = 63;
pub const NFS4ERR_NOTEMPTY: u32 = 66;
pub const NFS4ERR_STALE: u32 = 70;
pub const NFS4ERR_BADHANDLE: u32 = 10001;
pub const NFS4ERR_BAD_COOKIE: u32 = 10003;
pub const NFS4ERR_NOTSUPP: u32 = 10004;
pub const NFS4ERR_TOOSMALL: u32 = 10005;
pub const NFS4ERR_SERVERFAULT: u32 = 10006;
pub const NFS4ERR_BADTYPE: u32 = 10007;
pub const NFS4ERR_DELAY: u32 = 10008;
/// NVERIFY: the attributes are the same.
pub const NFS4ERR_SAME: u32 = 10009;
pub const NFS4ERR_DENIED: u32 = 10010;
pub const NFS4ERR_GRACE: u32 = 10013;
pub const NFS4ERR_SHARE_DENIED: u32 = 10015;
pub const NFS4ERR_RESOURCE: u32 = 10018;
pub const NFS4ERR_NOFILEHANDLE: u32 = 10020;
pub const NFS4ERR_MINOR_VERS_MISMATCH: u32 = 10021;
pub const NFS4ERR_STALE_CLIENTID: u32 = 10022;
pub const NFS4ERR_OLD_STATEID: u32 = 10024;
pub const NFS4ERR_BAD_STATEID: u32 = 10025;
pub const NFS4ERR_NOT_SAME: u32 = 10027;
pub const NFS4ERR_SYMLINK: u32 = 10029;
pub const NFS4ERR_RESTOREFH: u32 = 10030;
pub const NFS4ERR_ATTRNOTSUPP: u32 = 10032;
pub const NFS4ERR_NO_GRACE: u32 = 10033;
pub const NFS4ERR_RECLAIM_BAD: u32 = 10034;
pub const NFS4ERR_BADXDR: u32 = 10036;
pub const NFS4ERR_LOCKS_HELD: u32 = 10037;
pub const NFS4ERR_OPENMODE: u32 = 10038;
pub const NFS4ERR_BADOWNER: u32 = 10039;
pub const NFS4ERR_BADNAME: u32 = 10041;
pub const NFS4ERR_OP_ILLEGAL: u32 = 10044;
pub const NFS4ERR_BADIOMODE: u32 = 10049;
pub const NFS4ERR_BADLAYOUT: u32 = 10050;
pub const NFS4ERR_BADSESSION: u32 = 10052;
pub const NFS4ERR_BADSLOT: u32 = 10053;
pub const NFS4ERR_COMPLETE_ALREADY: u32 = 10054;
pub const NFS4ERR_LAYOUTTRYLATER: u32 = 10058;
pub const NFS4ERR_LAYOUTUNAVAILABLE: u32 = 10059;
pub const NFS4ERR_NOMATCHING_LAYOUT: u32 = 10060;
pub const NFS4ERR_RECALLCONFLICT: u32 = 10061;
pub const NFS4ERR_UNKNOWN_LAYOUTTYPE: u32 = 10062;
pub const NFS4ERR_SEQ_MISORDERED: u32 = 10063;
pub const NFS4ERR_SEQUENCE_POS: u32 = 10064;
pub const NFS4ERR_REQ_TOO_BIG: u32 = 10065;
pub const NFS4ERR_REP_TOO_BIG: u32 = 10066;
pub const NFS4ERR_REP_TOO_BIG_TO_CACHE: u32 = 10067;
pub const NFS4ERR_RETRY_UNCACHED_REP: u32 = 10068;
pub const NFS4ERR_TOO_MANY_OPS: u32 = 10070;
pub const NFS4ERR_OP_NOT_IN_SESSION: u32 = 10071;
pub const NFS4ERR_CLIENTID_BUSY: u32 = 10074;
pub const NFS4ERR_NOT_ONLY_OP: u32 = 10081;
pub const NFS4ERR_WRONG_TYPE: u32 = 10083;

pub const OPEN4_SHARE_ACCESS_READ: u32 = 1;
pub const OPEN4_SHARE_ACCESS_WRITE: u32 = 2;
pub const OPEN4_SHARE_ACCESS_BOTH: u32 = 3;
pub const OPEN4_SHARE_DENY_READ: u32 = 1;
pub const OPEN4_SHARE_DENY_WRITE: u32 = 2;
pub const OPEN4_RESULT_LOCKTYPE_POSIX: u32 = 4;

pub const READ_LT: u32 = 1;
pub const WRITE_LT: u32 = 2;
pub const READW_LT: u32 = 3;
pub const WRITEW_LT: u32 = 4;

pub const EXCHGID4_FLAG_USE_NON_PNFS: u32 = 0x0001_0000;
pub const EXCHGID4_FLAG_USE_PNFS_MDS: u32 = 0x0002_0000;
pub const EXCHGID4_FLAG_CONFIRMED_R: u32 = 0x8000_0000;
/// EXCHANGE_ID: the client means to update the confirmed record it holds (RFC 8881 §18.35.5 cases 6–9).
pub const EXCHGID4_FLAG_UPD_CONFIRMED_REC_A: u32 = 0x4000_0000;
/// The EXCHANGE_ID flags a client may send (`EXCHGID4_FLAG_MASK_A` of Linux's nfsd): SUPP_MOVED_REFER, _MIGR,
/// SUPP_FENCE_OPS, BIND_PRINC_STATEID, the pNFS roles, UPD_CONFIRMED_REC_A. Any other bit is NFS4ERR_INVAL.
pub const EXCHGID4_FLAG_MASK_A: u32 = 0x0000_0007 | 0x0000_0100 | 0x0007_0000 | EXCHGID4_FLAG_UPD_CONFIRMED_REC_A;
/// CREATE_SESSION flags (§18.36): PERSIST, CONN_BACK_CHAN, CONN_RDMA. Any other bit is NFS4ERR_INVAL.
pub const CREATE_SESSION4_FLAG_MASK: u32 = 0x7;

/// nfs_ftype4.
pub const NF4REG: u32 = 1;
pub const NF4DIR: u32 = 2;
pub const NF4BLK: u32 = 3;
pub const NF4CHR: u32 = 4;
pub const NF4LNK: u32 = 5;
pub const NF4SOCK: u32 = 6;
pub const NF4FIFO: u32 = 7;

/// The status of an NFSv4 op from the NFSv3 status the shared helpers compute: the POSIX codes and 10001–10008
/// have the same numbers in both versions.
pub fn from_v3(s: u32) -> u32 {
    match s {
        crate::status::NFS3ERR_NOT_SYNC => NFS4ERR_INVAL,
        crate::status::NFS3ERR_JUKEBOX => NFS4ERR_DELAY,
        s => s,
    }
}
