//! Decoders of COMPOUND4args (RFC 8881 §16.2, §18) into [`Op`]s: every length bounded, every union
//! discriminant checked. An op is decoded only when the loop reaches it, so a malformed op answers
//! NFS4ERR_BADXDR after the ops before it ran, as knfsd does; [`decode_all`] is the fuzz target's way in.

use super::attrs::{ATTRLIST_BYTES_MAX, Bitmap};
use super::consts::*;
use super::layout;
use super::state::{ChannelAttrs, Stateid};
use crate::xdr::{Reader, XdrError};

/// NFS4_FHSIZE.
pub const FH4_WIRE_MAX: usize = 128;
pub const NAME4_WIRE_MAX: usize = 1024;
pub const TAG_WIRE_MAX: usize = 1024;
pub const OWNER_WIRE_MAX: usize = 1024;
pub const LINK_WIRE_MAX: usize = 4096;
/// Ops decoded of one compound at most, whatever a session allows (the session's own bound is lower).
pub const COMPOUND_OPS_MAX: u32 = 128;
/// Stateids TEST_STATEID takes at once.
pub const TEST_STATEIDS_MAX: usize = 1024;
/// The header of a compound: tag, minor version, op count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header<'a> {
    pub tag: &'a [u8],
    pub minor: u32,
    pub ops: u32,
}

pub fn header<'a>(r: &mut Reader<'a>) -> Result<Header<'a>, XdrError> {
    let tag = r.opaque(TAG_WIRE_MAX)?;
    let minor = r.u32()?;
    let ops = r.u32()?;
    Ok(Header { tag, minor, ops })
}

/// `createattrs` as decoded: bitmap and the undecoded attribute list (decoded against what the op allows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawAttrs<'a> {
    pub bits: Bitmap,
    pub list: &'a [u8],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateHow<'a> {
    NoCreate,
    Unchecked(RawAttrs<'a>),
    Guarded(RawAttrs<'a>),
    Exclusive([u8; 8]),
    Exclusive41([u8; 8], RawAttrs<'a>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim<'a> {
    Null(&'a str),
    Previous(u32),
    Fh,
    /// A delegation claim: never valid here (no delegations are handed out).
    Deleg(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locker<'a> {
    New { open_seqid: u32, open: Stateid, lock_seqid: u32, clientid: u64, owner: &'a [u8] },
    Existing { lock: Stateid, seqid: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateType<'a> {
    Link(&'a str),
    Dev(u32, u32, u32),
    Other(u32),
}

/// One decoded operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<'a> {
    Access(u32),
    Close {
        stateid: Stateid,
    },
    Commit {
        offset: u64,
        count: u32,
    },
    Create {
        kind: CreateType<'a>,
        name: &'a str,
        attrs: RawAttrs<'a>,
    },
    GetAttr(Bitmap),
    GetFh,
    Link(&'a str),
    Lock {
        locktype: u32,
        reclaim: bool,
        offset: u64,
        length: u64,
        locker: Locker<'a>,
    },
    LockT {
        locktype: u32,
        offset: u64,
        length: u64,
        clientid: u64,
        owner: &'a [u8],
    },
    LockU {
        locktype: u32,
        seqid: u32,
        stateid: Stateid,
        offset: u64,
        length: u64,
    },
    Lookup(&'a str),
    LookupP,
    Open {
        access: u32,
        deny: u32,
        clientid: u64,
        owner: &'a [u8],
        how: CreateHow<'a>,
        claim: Claim<'a>,
    },
    OpenDowngrade {
        stateid: Stateid,
        access: u32,
        deny: u32,
    },
    PutFh(&'a [u8]),
    PutRootFh,
    Read {
        stateid: Stateid,
        offset: u64,
        count: u32,
    },
    Readdir {
        cookie: u64,
        verf: [u8; 8],
        dircount: u32,
        maxcount: u32,
        want: Bitmap,
    },
    Readlink,
    Remove(&'a str),
    Rename {
        from: &'a str,
        to: &'a str,
    },
    RestoreFh,
    SaveFh,
    SecInfo(&'a str),
    /// VERIFY, or NVERIFY (`negated`): the attributes to compare with the current object's.
    Verify {
        attrs: RawAttrs<'a>,
        negated: bool,
    },
    SetAttr {
        stateid: Stateid,
        attrs: RawAttrs<'a>,
    },
    Write {
        stateid: Stateid,
        offset: u64,
        stable: u32,
        data: &'a [u8],
    },
    BindConn {
        sessionid: [u8; 16],
        /// `channel_dir_from_client4`.
        dir: u32,
    },
    /// BACKCHANNEL_CTL: the callback program and credential from now on.
    BackchannelCtl {
        prog: u32,
        sec: super::callback::CbSec,
    },
    ExchangeId {
        verifier: [u8; 8],
        owner: &'a [u8],
        flags: u32,
    },
    CreateSession {
        clientid: u64,
        seq: u32,
        flags: u32,
        fore: ChannelAttrs,
        back: ChannelAttrs,
        cb_program: u32,
        cb_sec: super::callback::CbSec,
    },
    DestroySession([u8; 16]),
    FreeStateid(Stateid),
    SecInfoNoName(u32),
    Sequence {
        sessionid: [u8; 16],
        seqid: u32,
        slot: u32,
        highest_slot: u32,
        cache_this: bool,
    },
    TestStateid(Vec<Stateid>),
    DestroyClientid(u64),
    LayoutGet(super::layout::LayoutGetArgs),
    LayoutCommit(super::layout::LayoutCommitArgs),
    LayoutReturn(super::layout::LayoutReturnArgs),
    GetDeviceInfo(super::layout::DeviceInfoArgs),
    GetDeviceList(super::layout::DeviceListArgs),
    ReclaimComplete(bool),
    /// A known op the gateway does not serve (NFS4ERR_NOTSUPP); its arguments were skipped.
    NotSupp(u32),
}

pub fn stateid(r: &mut Reader<'_>) -> Result<Stateid, XdrError> {
    let seqid = r.u32()?;
    let other = r.fixed(12)?.try_into().expect("12 bytes");
    Ok(Stateid { seqid, other })
}

fn verifier(r: &mut Reader<'_>) -> Result<[u8; 8], XdrError> {
    Ok(r.fixed(8)?.try_into().expect("8 bytes"))
}

fn sessionid(r: &mut Reader<'_>) -> Result<[u8; 16], XdrError> {
    Ok(r.fixed(16)?.try_into().expect("16 bytes"))
}

/// A component name; bytes that are not UTF-8 are an error the op answers (BADCHAR would be more precise; the
/// Linux client never sends them).
fn component<'a>(r: &mut Reader<'a>) -> Result<&'a str, XdrError> {
    r.string(NAME4_WIRE_MAX)
}

fn raw_attrs<'a>(r: &mut Reader<'a>) -> Result<RawAttrs<'a>, XdrError> {
    let bits = Bitmap::decode(r)?;
    let list = r.opaque(ATTRLIST_BYTES_MAX)?;
    Ok(RawAttrs { bits, list })
}

fn channel_attrs(r: &mut Reader<'_>) -> Result<ChannelAttrs, XdrError> {
    let a = ChannelAttrs {
        header_pad_bytes: r.u32()?,
        request_bytes_max: r.u32()?,
        reply_bytes_max: r.u32()?,
        cached_reply_bytes_max: r.u32()?,
        ops_max: r.u32()?,
        slots_max: r.u32()?,
    };
    let ird = r.u32()?;
    if ird > 1 {
        return Err(XdrError::TooLong { len: ird as u64, max: 1 });
    }
    for _ in 0..ird {
        r.u32()?;
    }
    Ok(a)
}

fn range(r: &mut Reader<'_>) -> Result<(u64, u64), XdrError> {
    Ok((r.u64()?, r.u64()?))
}

/// Decodes op `code`'s arguments. Unknown codes are `Err(BadDiscriminant)`: the loop answers OP_ILLEGAL.
pub fn op<'a>(code: u32, r: &mut Reader<'a>) -> Result<Op<'a>, XdrError> {
    Ok(match code {
        OP_ACCESS => Op::Access(r.u32()?),
        OP_CLOSE => {
            r.u32()?;
            Op::Close { stateid: stateid(r)? }
        }
        OP_COMMIT => Op::Commit { offset: r.u64()?, count: r.u32()? },
        OP_CREATE => {
            let kind = match r.u32()? {
                NF4LNK => CreateType::Link(r.string(LINK_WIRE_MAX)?),
                t @ (NF4BLK | NF4CHR) => CreateType::Dev(t, r.u32()?, r.u32()?),
                t @ (NF4SOCK | NF4FIFO | NF4DIR) => CreateType::Other(t),
                t @ (NF4REG | 8 | 9) => CreateType::Other(t),
                d => return Err(XdrError::BadDiscriminant(d)),
            };
            Op::Create { kind, name: component(r)?, attrs: raw_attrs(r)? }
        }
        OP_DELEGRETURN => {
            stateid(r)?;
            Op::NotSupp(code)
        }
        OP_GETATTR => Op::GetAttr(Bitmap::decode(r)?),
        OP_GETFH => Op::GetFh,
        OP_LINK => Op::Link(component(r)?),
        OP_LOCK => {
            let locktype = r.u32()?;
            if !(READ_LT..=WRITEW_LT).contains(&locktype) {
                return Err(XdrError::BadDiscriminant(locktype));
            }
            let reclaim = r.bool()?;
            let (offset, length) = range(r)?;
            let locker = if r.bool()? {
                let open_seqid = r.u32()?;
                let open = stateid(r)?;
                let lock_seqid = r.u32()?;
                let clientid = r.u64()?;
                Locker::New { open_seqid, open, lock_seqid, clientid, owner: r.opaque(OWNER_WIRE_MAX)? }
            } else {
                Locker::Existing { lock: stateid(r)?, seqid: r.u32()? }
            };
            Op::Lock { locktype, reclaim, offset, length, locker }
        }
        OP_LOCKT => {
            let locktype = r.u32()?;
            if !(READ_LT..=WRITEW_LT).contains(&locktype) {
                return Err(XdrError::BadDiscriminant(locktype));
            }
            let (offset, length) = range(r)?;
            Op::LockT { locktype, offset, length, clientid: r.u64()?, owner: r.opaque(OWNER_WIRE_MAX)? }
        }
        OP_LOCKU => {
            let locktype = r.u32()?;
            let seqid = r.u32()?;
            let stateid = stateid(r)?;
            let (offset, length) = range(r)?;
            Op::LockU { locktype, seqid, stateid, offset, length }
        }
        OP_LOOKUP => Op::Lookup(component(r)?),
        OP_LOOKUPP => Op::LookupP,
        OP_OPEN => {
            r.u32()?; // seqid: unused in v4.1 (the session orders requests)
            let access = r.u32()?;
            let deny = r.u32()?;
            let clientid = r.u64()?;
            let owner = r.opaque(OWNER_WIRE_MAX)?;
            let how = match r.u32()? {
                0 => CreateHow::NoCreate,
                1 => match r.u32()? {
                    0 => CreateHow::Unchecked(raw_attrs(r)?),
                    1 => CreateHow::Guarded(raw_attrs(r)?),
                    2 => CreateHow::Exclusive(verifier(r)?),
                    3 => CreateHow::Exclusive41(verifier(r)?, raw_attrs(r)?),
                    d => return Err(XdrError::BadDiscriminant(d)),
                },
                d => return Err(XdrError::BadDiscriminant(d)),
            };
            let claim = match r.u32()? {
                0 => Claim::Null(component(r)?),
                1 => Claim::Previous(r.u32()?),
                2 => {
                    stateid(r)?;
                    component(r)?;
                    Claim::Deleg(2)
                }
                3 => {
                    component(r)?;
                    Claim::Deleg(3)
                }
                4 => Claim::Fh,
                5 => Claim::Deleg(5),
                6 => {
                    stateid(r)?;
                    Claim::Deleg(6)
                }
                d => return Err(XdrError::BadDiscriminant(d)),
            };
            Op::Open { access, deny, clientid, owner, how, claim }
        }
        OP_OPEN_DOWNGRADE => {
            let stateid = stateid(r)?;
            r.u32()?;
            Op::OpenDowngrade { stateid, access: r.u32()?, deny: r.u32()? }
        }
        OP_PUTFH => Op::PutFh(r.opaque(FH4_WIRE_MAX)?),
        OP_PUTROOTFH | OP_PUTPUBFH => Op::PutRootFh,
        OP_READ => Op::Read { stateid: stateid(r)?, offset: r.u64()?, count: r.u32()? },
        OP_READDIR => Op::Readdir {
            cookie: r.u64()?,
            verf: verifier(r)?,
            dircount: r.u32()?,
            maxcount: r.u32()?,
            want: Bitmap::decode(r)?,
        },
        OP_READLINK => Op::Readlink,
        OP_REMOVE => Op::Remove(component(r)?),
        OP_RENAME => Op::Rename { from: component(r)?, to: component(r)? },
        OP_RESTOREFH => Op::RestoreFh,
        OP_SAVEFH => Op::SaveFh,
        OP_SECINFO => Op::SecInfo(component(r)?),
        OP_SETATTR => Op::SetAttr { stateid: stateid(r)?, attrs: raw_attrs(r)? },
        OP_WRITE => {
            let stateid = stateid(r)?;
            let offset = r.u64()?;
            let stable = r.u32()?;
            if stable > 2 {
                return Err(XdrError::BadDiscriminant(stable));
            }
            Op::Write { stateid, offset, stable, data: r.opaque(crate::proto::IO_BYTES_MAX as usize)? }
        }
        OP_NVERIFY | OP_VERIFY => Op::Verify { attrs: raw_attrs(r)?, negated: code == OP_NVERIFY },
        OP_BIND_CONN_TO_SESSION => {
            let sessionid = sessionid(r)?;
            let dir = r.u32()?;
            r.bool()?;
            Op::BindConn { sessionid, dir }
        }
        OP_EXCHANGE_ID => {
            let verifier = verifier(r)?;
            let owner = r.opaque(OWNER_WIRE_MAX)?;
            let flags = r.u32()?;
            match r.u32()? {
                0 => {}
                // SP4_MACH_CRED / SP4_SSV: not served; refused after decoding as far as the discriminant.
                d => return Err(XdrError::BadDiscriminant(d)),
            }
            let impl_ids = r.u32()?;
            if impl_ids > 1 {
                return Err(XdrError::TooLong { len: impl_ids as u64, max: 1 });
            }
            if impl_ids == 1 {
                r.opaque(1024)?;
                r.opaque(1024)?;
                r.u64()?;
                r.u32()?;
            }
            Op::ExchangeId { verifier, owner, flags }
        }
        OP_CREATE_SESSION => {
            let clientid = r.u64()?;
            let seq = r.u32()?;
            let flags = r.u32()?;
            let fore = channel_attrs(r)?;
            let back = channel_attrs(r)?;
            let cb_program = r.u32()?;
            let cb_sec = super::callback::decode_cb_sec(r)?;
            Op::CreateSession { clientid, seq, flags, fore, back, cb_program, cb_sec }
        }
        OP_DESTROY_SESSION => Op::DestroySession(sessionid(r)?),
        OP_FREE_STATEID => Op::FreeStateid(stateid(r)?),
        OP_SECINFO_NO_NAME => {
            let style = r.u32()?;
            if style > 1 {
                return Err(XdrError::BadDiscriminant(style));
            }
            Op::SecInfoNoName(style)
        }
        OP_SEQUENCE => Op::Sequence {
            sessionid: sessionid(r)?,
            seqid: r.u32()?,
            slot: r.u32()?,
            highest_slot: r.u32()?,
            cache_this: r.bool()?,
        },
        OP_TEST_STATEID => {
            let n = r.u32()? as usize;
            if n > TEST_STATEIDS_MAX {
                return Err(XdrError::TooLong { len: n as u64, max: TEST_STATEIDS_MAX });
            }
            let mut v = Vec::with_capacity(n.min(r.remaining() / 16));
            for _ in 0..n {
                v.push(stateid(r)?);
            }
            Op::TestStateid(v)
        }
        OP_DESTROY_CLIENTID => Op::DestroyClientid(r.u64()?),
        OP_RECLAIM_COMPLETE => Op::ReclaimComplete(r.bool()?),
        OP_LAYOUTGET => Op::LayoutGet(layout::decode_layoutget(r)?),
        OP_LAYOUTCOMMIT => Op::LayoutCommit(layout::decode_layoutcommit(r)?),
        OP_LAYOUTRETURN => Op::LayoutReturn(layout::decode_layoutreturn(r)?),
        OP_GETDEVICEINFO => Op::GetDeviceInfo(layout::decode_getdeviceinfo(r)?),
        OP_GETDEVICELIST => Op::GetDeviceList(layout::decode_getdevicelist(r)?),
        OP_BACKCHANNEL_CTL => Op::BackchannelCtl { prog: r.u32()?, sec: super::callback::decode_cb_sec(r)? },
        // OPENATTR, DELEGPURGE, GET_DIR_DELEGATION, WANT_DELEGATION, SET_SSV: not served; their
        // arguments cannot be skipped without decoding them, so they end the compound as NOTSUPP. The v4.0-only
        // ops (OPEN_CONFIRM, RENEW, SETCLIENTID(_CONFIRM), RELEASE_LOCKOWNER) likewise.
        7 | 19 | 20 | 30 | 35 | 36 | 39 | 46 | 54 | 56 => Op::NotSupp(code),
        d => return Err(XdrError::BadDiscriminant(d)),
    })
}

/// Decodes a whole COMPOUND4args (the fuzz target): header and every op until the first that fails.
pub fn decode_all(args: &[u8]) -> Result<(Header<'_>, Vec<Op<'_>>), XdrError> {
    let mut r = Reader::new(args);
    let h = header(&mut r)?;
    if h.ops > COMPOUND_OPS_MAX {
        return Err(XdrError::TooLong { len: h.ops as u64, max: COMPOUND_OPS_MAX as usize });
    }
    let mut ops = Vec::new();
    for _ in 0..h.ops {
        let code = r.u32()?;
        ops.push(op(code, &mut r)?);
    }
    Ok((h, ops))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdr::Writer;

    #[test]
    fn ops_decode_and_hostile_counts_are_errors() {
        let mut w = Writer::new();
        w.opaque(b"t").u32(1).u32(3);
        w.u32(OP_SEQUENCE).fixed(&[7; 16]).u32(1).u32(0).u32(0).bool(false);
        w.u32(OP_PUTROOTFH);
        w.u32(OP_GETATTR).u32(1).u32(0x3);
        let (h, ops) = decode_all(&w.buf).unwrap();
        assert_eq!((h.tag, h.minor, h.ops), (&b"t"[..], 1, 3));
        assert_eq!(ops[1], Op::PutRootFh);
        assert_eq!(ops[2], Op::GetAttr(Bitmap(vec![3])));
        let mut w = Writer::new();
        w.opaque(b"").u32(1).u32(u32::MAX);
        assert!(decode_all(&w.buf).is_err());
        let mut w = Writer::new();
        w.opaque(b"").u32(1).u32(1).u32(OP_TEST_STATEID).u32(u32::MAX);
        assert!(decode_all(&w.buf).is_err());
        let mut w = Writer::new();
        w.opaque(b"").u32(1).u32(1).u32(OP_OPEN).u32(0).u32(1).u32(0).u64(1).opaque(b"o").u32(1).u32(9);
        assert_eq!(decode_all(&w.buf).unwrap_err(), XdrError::BadDiscriminant(9));
        let mut w = Writer::new();
        w.opaque(b"").u32(1).u32(1).u32(9999);
        assert_eq!(decode_all(&w.buf).unwrap_err(), XdrError::BadDiscriminant(9999));
    }
}
