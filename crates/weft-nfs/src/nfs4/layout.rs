//! pNFS file layouts (RFC 8881 §12, §13; the XDR of RFC 5662): the arguments of LAYOUTGET, LAYOUTCOMMIT,
//! LAYOUTRETURN, GETDEVICEINFO and GETDEVICELIST as decoded, and the bodies the gateway answers:
//! `nfsv4_1_file_layout4` (a Weft plain layout as a file layout: the stripe unit, one data-server filehandle per
//! stripe index, first stripe index 0, pattern offset 0) and `nfsv4_1_file_layout_ds_addr4` (a device: the ordered
//! servers of a layout, each with its multipath list of NFS addresses).
//!
//! Packing: the layout is *sparse* on the wire (no NFL4_UFLG_DENSE), so a client sends each data server the
//! file offset (RFC 8881 §13.4.4; with DENSE it would send the object offset) and the data server maps it to its
//! object, which Weft stores dense (object offset `(s / count)·unit + o % unit`, §23), refusing an offset of
//! another server's stripe.
//!
//! Pure: no I/O. Every count and length from the wire is bounded before use; encoders assert what the caller
//! guarantees (a stripe unit the file layout can carry, at most [`STRIPE_INDICES_MAX`] servers).
//! docs/format.md §24.

use std::net::SocketAddr;

use super::attrs::Bitmap;
use super::decode::stateid;
use super::state::Stateid;
use crate::xdr::{Reader, Writer, XdrError};

/// `layouttype4` LAYOUT4_NFSV4_1_FILES: the only layout type served.
pub const LAYOUT4_NFSV4_1_FILES: u32 = 1;
/// `layoutiomode4`.
pub const IOMODE_READ: u32 = 1;
pub const IOMODE_RW: u32 = 2;
pub const IOMODE_ANY: u32 = 3;
/// `nfl_util4` flags: dense packing (the client would send object offsets). Not set: see the module header.
pub const NFL4_UFLG_DENSE: u32 = 0x1;
/// The bits of `nfl_util4` that carry the stripe unit (a multiple of 64).
pub const NFL4_UFLG_STRIPE_UNIT_SIZE_MASK: u32 = 0xffff_ffc0;
/// `layoutreturn_type4`.
pub const LAYOUTRETURN4_FILE: u32 = 1;
pub const LAYOUTRETURN4_FSID: u32 = 2;
pub const LAYOUTRETURN4_ALL: u32 = 3;
/// `deviceid4` is 16 bytes.
pub const DEVICEID_BYTES: usize = 16;
/// A layout covers the whole file: length all ones (NFS4_UINT64_MAX) from offset 0.
pub const WHOLE_FILE: u64 = u64::MAX;
/// The most stripe indices (servers of one layout): Weft's own bound on a stripe count.
pub const STRIPE_INDICES_MAX: usize = weft_proto::layout::STRIPE_COUNT_MAX as usize;
/// Addresses of one data server in a multipath list (more are left out).
pub const MULTIPATH_ADDRS_MAX: usize = 8;
/// `lou_body` / `lrf_body` / `lrs_body` accepted (a files layout has none; other types' bodies are skipped).
pub const LAYOUT_BODY_BYTES_MAX: usize = 4096;
/// Device ids GETDEVICELIST answers at once at most.
pub const DEVICELIST_MAX: u32 = 256;

pub type DeviceId = [u8; DEVICEID_BYTES];

/// LAYOUTGET4args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutGetArgs {
    pub signal_avail: bool,
    pub layout_type: u32,
    pub iomode: u32,
    pub offset: u64,
    pub length: u64,
    pub minlength: u64,
    pub stateid: Stateid,
    pub maxcount: u32,
}

/// LAYOUTCOMMIT4args (`loca_layoutupdate`'s body is checked for length and ignored: a files layout has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutCommitArgs {
    pub offset: u64,
    pub length: u64,
    pub reclaim: bool,
    pub stateid: Stateid,
    /// `loca_last_write_offset`, if the client gave one.
    pub last_write: Option<u64>,
    /// `loca_time_modify` (seconds, nanoseconds), if the client gave one.
    pub mtime: Option<(i64, u32)>,
    pub layout_type: u32,
}

/// What LAYOUTRETURN returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReturnWhat {
    File { offset: u64, length: u64, stateid: Stateid },
    Fsid,
    All,
}

/// LAYOUTRETURN4args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutReturnArgs {
    pub reclaim: bool,
    pub layout_type: u32,
    pub iomode: u32,
    pub what: ReturnWhat,
}

/// GETDEVICEINFO4args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfoArgs {
    pub deviceid: DeviceId,
    pub layout_type: u32,
    pub maxcount: u32,
    pub notify: Bitmap,
}

/// GETDEVICELIST4args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceListArgs {
    pub layout_type: u32,
    pub maxdevices: u32,
    pub cookie: u64,
    pub verf: [u8; 8],
}

fn iomode(r: &mut Reader<'_>) -> Result<u32, XdrError> {
    let m = r.u32()?;
    if !(IOMODE_READ..=IOMODE_ANY).contains(&m) {
        return Err(XdrError::BadDiscriminant(m));
    }
    Ok(m)
}

fn deviceid(r: &mut Reader<'_>) -> Result<DeviceId, XdrError> {
    Ok(r.fixed(DEVICEID_BYTES)?.try_into().expect("16 bytes"))
}

pub fn decode_layoutget(r: &mut Reader<'_>) -> Result<LayoutGetArgs, XdrError> {
    Ok(LayoutGetArgs {
        signal_avail: r.bool()?,
        layout_type: r.u32()?,
        iomode: iomode(r)?,
        offset: r.u64()?,
        length: r.u64()?,
        minlength: r.u64()?,
        stateid: stateid(r)?,
        maxcount: r.u32()?,
    })
}

pub fn decode_layoutcommit(r: &mut Reader<'_>) -> Result<LayoutCommitArgs, XdrError> {
    let offset = r.u64()?;
    let length = r.u64()?;
    let reclaim = r.bool()?;
    let stateid = stateid(r)?;
    let last_write = if r.bool()? { Some(r.u64()?) } else { None };
    let mtime = if r.bool()? { Some((r.u64()? as i64, r.u32()?)) } else { None };
    let layout_type = r.u32()?;
    r.opaque(LAYOUT_BODY_BYTES_MAX)?;
    Ok(LayoutCommitArgs { offset, length, reclaim, stateid, last_write, mtime, layout_type })
}

pub fn decode_layoutreturn(r: &mut Reader<'_>) -> Result<LayoutReturnArgs, XdrError> {
    let reclaim = r.bool()?;
    let layout_type = r.u32()?;
    let iomode = iomode(r)?;
    let what = match r.u32()? {
        LAYOUTRETURN4_FILE => {
            let offset = r.u64()?;
            let length = r.u64()?;
            let stateid = stateid(r)?;
            r.opaque(LAYOUT_BODY_BYTES_MAX)?;
            ReturnWhat::File { offset, length, stateid }
        }
        LAYOUTRETURN4_FSID => ReturnWhat::Fsid,
        LAYOUTRETURN4_ALL => ReturnWhat::All,
        d => return Err(XdrError::BadDiscriminant(d)),
    };
    Ok(LayoutReturnArgs { reclaim, layout_type, iomode, what })
}

pub fn decode_getdeviceinfo(r: &mut Reader<'_>) -> Result<DeviceInfoArgs, XdrError> {
    Ok(DeviceInfoArgs { deviceid: deviceid(r)?, layout_type: r.u32()?, maxcount: r.u32()?, notify: Bitmap::decode(r)? })
}

pub fn decode_getdevicelist(r: &mut Reader<'_>) -> Result<DeviceListArgs, XdrError> {
    Ok(DeviceListArgs {
        layout_type: r.u32()?,
        maxdevices: r.u32()?,
        cookie: r.u64()?,
        verf: r.fixed(8)?.try_into().expect("8 bytes"),
    })
}

/// `nfl_util4` of a stripe unit, sparse (file offsets on the wire); `None` if the unit cannot be expressed (0, or
/// not a multiple of 64).
pub fn nfl_util(stripe_unit: u32) -> Option<u32> {
    (stripe_unit != 0 && stripe_unit & !NFL4_UFLG_STRIPE_UNIT_SIZE_MASK == 0).then_some(stripe_unit)
}

/// The body of a `layout_content4` of type FILES (`nfsv4_1_file_layout4`): the device, the stripe unit (sparse),
/// first stripe index 0, pattern offset 0, and one filehandle per stripe index.
pub fn file_layout_body(device: &DeviceId, stripe_unit: u32, fhs: &[Vec<u8>]) -> Vec<u8> {
    let util = nfl_util(stripe_unit).expect("a Weft stripe unit is a multiple of 4096");
    assert!(!fhs.is_empty() && fhs.len() <= STRIPE_INDICES_MAX, "one filehandle per stripe index");
    let mut w = Writer::new();
    w.fixed(device).u32(util).u32(0).u64(0);
    w.u32(fhs.len() as u32);
    for fh in fhs {
        w.opaque(fh);
    }
    w.into_vec()
}

/// LAYOUTGET4resok with one whole-file `layout4` of type FILES.
pub fn encode_layoutget_ok(w: &mut Writer, return_on_close: bool, stateid: &Stateid, iomode: u32, body: &[u8]) {
    w.bool(return_on_close).u32(stateid.seqid).fixed(&stateid.other);
    w.u32(1); // one layout4
    w.u64(0).u64(WHOLE_FILE).u32(iomode);
    w.u32(LAYOUT4_NFSV4_1_FILES).opaque(body);
}

/// `netaddr4` of an address: netid `tcp` and `h1.h2.h3.h4.p1.p2` for IPv4, `tcp6` and `x:…:x.p1.p2` for IPv6
/// (RFC 5665 universal addresses).
pub fn netaddr(addr: &SocketAddr) -> (&'static str, String) {
    netaddr_on(addr, false)
}

/// [`netaddr`], with netid `rdma` / `rdma6` (RFC 5665 §4.2) for an address served over RPC-over-RDMA.
pub fn netaddr_on(addr: &SocketAddr, rdma: bool) -> (&'static str, String) {
    let (hi, lo) = (addr.port() >> 8, addr.port() & 0xff);
    match (addr, rdma) {
        (SocketAddr::V4(a), false) => ("tcp", format!("{}.{hi}.{lo}", a.ip())),
        (SocketAddr::V6(a), false) => ("tcp6", format!("{}.{hi}.{lo}", a.ip())),
        (SocketAddr::V4(a), true) => ("rdma", format!("{}.{hi}.{lo}", a.ip())),
        (SocketAddr::V6(a), true) => ("rdma6", format!("{}.{hi}.{lo}", a.ip())),
    }
}

/// The body of a `device_addr4` of type FILES (`nfsv4_1_file_layout_ds_addr4`): stripe index i uses multipath
/// list i; list i holds server i's addresses (at most [`MULTIPATH_ADDRS_MAX`]), all TCP.
pub fn ds_addr_body(servers: &[Vec<SocketAddr>]) -> Vec<u8> {
    let tcp: Vec<Vec<(SocketAddr, bool)>> = servers.iter().map(|a| a.iter().map(|a| (*a, false)).collect()).collect();
    ds_addr_body_on(&tcp)
}

/// [`ds_addr_body`] with each address's transport: `true` is RPC-over-RDMA (netid `rdma`/`rdma6`).
pub fn ds_addr_body_on(servers: &[Vec<(SocketAddr, bool)>]) -> Vec<u8> {
    assert!(!servers.is_empty() && servers.len() <= STRIPE_INDICES_MAX, "a device has 1..=256 servers");
    let mut w = Writer::new();
    w.u32(servers.len() as u32);
    for i in 0..servers.len() as u32 {
        w.u32(i);
    }
    w.u32(servers.len() as u32);
    for addrs in servers {
        let addrs = &addrs[..addrs.len().min(MULTIPATH_ADDRS_MAX)];
        w.u32(addrs.len() as u32);
        for (a, rdma) in addrs {
            let (netid, uaddr) = netaddr_on(a, *rdma);
            w.opaque(netid.as_bytes()).opaque(uaddr.as_bytes());
        }
    }
    w.into_vec()
}

/// GETDEVICEINFO4resok: the device's address body, no notifications.
pub fn encode_deviceinfo_ok(w: &mut Writer, body: &[u8]) {
    w.u32(LAYOUT4_NFSV4_1_FILES).opaque(body);
    w.u32(0); // gdir_notification: none
}

/// A file layout as a client reads it (`nfsv4_1_file_layout4`, from LAYOUTGET's `loc_body`): the client side of
/// [`file_layout_body`], for `weft bench nfs --pnfs`'s pNFS client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLayout {
    pub device: DeviceId,
    /// The stripe unit in bytes (`nfl_util4` without its flag bits; never 0).
    pub stripe_unit: u32,
    /// NFL4_UFLG_DENSE: the client sends data servers object offsets instead of file offsets.
    pub dense: bool,
    pub first_stripe_index: u32,
    pub pattern_offset: u64,
    /// One filehandle per stripe index (1..=[`STRIPE_INDICES_MAX`]).
    pub fhs: Vec<Vec<u8>>,
}

/// The most bytes of an NFSv4 filehandle (NFS4_FHSIZE).
pub const FH_BYTES_MAX: usize = 128;

/// Decodes a `nfsv4_1_file_layout4` body; every count is bounded ([`STRIPE_INDICES_MAX`] handles of at most
/// [`FH_BYTES_MAX`] bytes), a stripe unit of 0 and a first stripe index outside the handles are refused.
pub fn decode_file_layout(body: &[u8]) -> Result<FileLayout, XdrError> {
    let mut r = Reader::new(body);
    let device = deviceid(&mut r)?;
    let util = r.u32()?;
    let stripe_unit = util & NFL4_UFLG_STRIPE_UNIT_SIZE_MASK;
    let first_stripe_index = r.u32()?;
    let pattern_offset = r.u64()?;
    let n = r.u32()? as usize;
    if n == 0 || n > STRIPE_INDICES_MAX {
        return Err(XdrError::TooLong { len: n as u64, max: STRIPE_INDICES_MAX });
    }
    let mut fhs = Vec::with_capacity(n);
    for _ in 0..n {
        fhs.push(r.opaque(FH_BYTES_MAX)?.to_vec());
    }
    if stripe_unit == 0 {
        return Err(XdrError::BadDiscriminant(util));
    }
    if first_stripe_index as usize >= n {
        return Err(XdrError::BadDiscriminant(first_stripe_index));
    }
    Ok(FileLayout { device, stripe_unit, dense: util & NFL4_UFLG_DENSE != 0, first_stripe_index, pattern_offset, fhs })
}

/// The address of a `netaddr4` (RFC 5665 universal address: `h1.h2.h3.h4.p1.p2` for netid `tcp`,
/// `x:…:x.p1.p2` for `tcp6`): the inverse of [`netaddr`]; `None` for another netid or a malformed address.
pub fn parse_netaddr(netid: &str, uaddr: &str) -> Option<SocketAddr> {
    let (rest, lo) = uaddr.rsplit_once('.')?;
    let (host, hi) = rest.rsplit_once('.')?;
    let port = (hi.parse::<u8>().ok()? as u16) << 8 | lo.parse::<u8>().ok()? as u16;
    let ip: std::net::IpAddr = match netid {
        "tcp" => std::net::IpAddr::V4(host.parse().ok()?),
        "tcp6" => std::net::IpAddr::V6(host.parse().ok()?),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Decodes a `nfsv4_1_file_layout_ds_addr4` body into, per stripe index, the multipath list of data-server
/// addresses it uses (netids other than `tcp`/`tcp6` left out). Counts bounded: [`STRIPE_INDICES_MAX`] indices
/// and lists, [`MULTIPATH_ADDRS_MAX`] addresses per list; an index naming no list is refused.
pub fn decode_ds_addr(body: &[u8]) -> Result<Vec<Vec<SocketAddr>>, XdrError> {
    let mut r = Reader::new(body);
    let n = r.u32()? as usize;
    if n == 0 || n > STRIPE_INDICES_MAX {
        return Err(XdrError::TooLong { len: n as u64, max: STRIPE_INDICES_MAX });
    }
    let mut indices = Vec::with_capacity(n);
    for _ in 0..n {
        indices.push(r.u32()?);
    }
    let m = r.u32()? as usize;
    if m == 0 || m > STRIPE_INDICES_MAX {
        return Err(XdrError::TooLong { len: m as u64, max: STRIPE_INDICES_MAX });
    }
    let mut lists = Vec::with_capacity(m);
    for _ in 0..m {
        let k = r.u32()? as usize;
        if k > MULTIPATH_ADDRS_MAX {
            return Err(XdrError::TooLong { len: k as u64, max: MULTIPATH_ADDRS_MAX });
        }
        let mut addrs = Vec::with_capacity(k);
        for _ in 0..k {
            let netid = r.string(16)?;
            let uaddr = r.string(64)?;
            addrs.extend(parse_netaddr(netid, uaddr));
        }
        lists.push(addrs);
    }
    indices.iter().map(|&i| lists.get(i as usize).cloned().ok_or(XdrError::BadDiscriminant(i))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_layout_bytes_are_the_rfcs() {
        let dev = [0xab; 16];
        let body = file_layout_body(&dev, 65536, &[vec![1, 2, 3], vec![4; 4]]);
        let mut want = Vec::new();
        want.extend_from_slice(&[0xab; 16]);
        want.extend_from_slice(&[0x00, 0x01, 0x00, 0x00]); // 65536, sparse
        want.extend_from_slice(&[0, 0, 0, 0]); // first stripe index
        want.extend_from_slice(&[0; 8]); // pattern offset
        want.extend_from_slice(&[0, 0, 0, 2]); // two filehandles
        want.extend_from_slice(&[0, 0, 0, 3, 1, 2, 3, 0]); // padded to 4
        want.extend_from_slice(&[0, 0, 0, 4, 4, 4, 4, 4]);
        assert_eq!(body, want);

        let mut w = Writer::new();
        let sid = Stateid { seqid: 2, other: [7; 12] };
        encode_layoutget_ok(&mut w, false, &sid, IOMODE_RW, &[9, 9, 9, 9]);
        let mut want = vec![0, 0, 0, 0, 0, 0, 0, 2];
        want.extend_from_slice(&[7; 12]);
        want.extend_from_slice(&[0, 0, 0, 1]); // one layout
        want.extend_from_slice(&[0; 8]); // offset
        want.extend_from_slice(&[0xff; 8]); // length: whole file
        want.extend_from_slice(&[0, 0, 0, 2]); // RW
        want.extend_from_slice(&[0, 0, 0, 1]); // LAYOUT4_NFSV4_1_FILES
        want.extend_from_slice(&[0, 0, 0, 4, 9, 9, 9, 9]);
        assert_eq!(w.into_vec(), want);
        assert_eq!(nfl_util(4096), Some(0x1000));
        assert_eq!(nfl_util(100), None);
        assert_eq!(nfl_util(0), None);
    }

    #[test]
    fn device_address_bytes_are_the_rfcs() {
        let a: SocketAddr = "10.0.2.2:2050".parse().unwrap();
        let b: SocketAddr = "[::1]:513".parse().unwrap();
        assert_eq!(netaddr(&a), ("tcp", "10.0.2.2.8.2".to_string()));
        assert_eq!(netaddr(&b), ("tcp6", "::1.2.1".to_string()));
        let body = ds_addr_body(&[vec![a], vec![b, a]]);
        let mut want = vec![0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1]; // stripe indices [0, 1]
        want.extend_from_slice(&[0, 0, 0, 2]); // two multipath lists
        want.extend_from_slice(&[0, 0, 0, 1]); // server 0: one address
        want.extend_from_slice(&[0, 0, 0, 3, b't', b'c', b'p', 0]);
        want.extend_from_slice(&[0, 0, 0, 12]);
        want.extend_from_slice(b"10.0.2.2.8.2");
        want.extend_from_slice(&[0, 0, 0, 2]); // server 1: two addresses
        want.extend_from_slice(&[0, 0, 0, 4, b't', b'c', b'p', b'6']);
        want.extend_from_slice(&[0, 0, 0, 7, b':', b':', b'1', b'.', b'2', b'.', b'1', 0]);
        want.extend_from_slice(&[0, 0, 0, 3, b't', b'c', b'p', 0]);
        want.extend_from_slice(&[0, 0, 0, 12]);
        want.extend_from_slice(b"10.0.2.2.8.2");
        assert_eq!(body, want);
        let mut w = Writer::new();
        encode_deviceinfo_ok(&mut w, &[1, 2, 3, 4]);
        assert_eq!(w.into_vec(), vec![0, 0, 0, 1, 0, 0, 0, 4, 1, 2, 3, 4, 0, 0, 0, 0]);

        // RPC-over-RDMA addresses: netid rdma / rdma6 (RFC 5665 §4.2), the same universal address.
        let r: SocketAddr = "10.0.2.15:20050".parse().unwrap();
        assert_eq!(netaddr_on(&r, true), ("rdma", "10.0.2.15.78.82".to_string()));
        assert_eq!(netaddr_on(&b, true), ("rdma6", "::1.2.1".to_string()));
        let body = ds_addr_body_on(&[vec![(r, true)], vec![(a, false)]]);
        let mut want = vec![0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2];
        want.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 4, b'r', b'd', b'm', b'a', 0, 0, 0, 15]);
        want.extend_from_slice(b"10.0.2.15.78.82\0");
        want.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 3, b't', b'c', b'p', 0, 0, 0, 0, 12]);
        want.extend_from_slice(b"10.0.2.2.8.2");
        assert_eq!(body, want);
        assert_eq!(ds_addr_body(&[vec![a]]), ds_addr_body_on(&[vec![(a, false)]]));
    }

    #[test]
    fn decoders_bound_every_field() {
        let mut w = Writer::new();
        w.bool(false).u32(1).u32(IOMODE_RW).u64(0).u64(u64::MAX).u64(0).u32(1).fixed(&[3; 12]).u32(4096);
        let a = decode_layoutget(&mut Reader::new(&w.buf)).unwrap();
        assert_eq!((a.iomode, a.length, a.stateid.seqid, a.maxcount), (IOMODE_RW, u64::MAX, 1, 4096));
        // An iomode outside READ..ANY; every truncation.
        let mut bad = w.buf.clone();
        bad[11] = 4;
        assert_eq!(decode_layoutget(&mut Reader::new(&bad)).unwrap_err(), XdrError::BadDiscriminant(4));
        for n in 0..w.buf.len() {
            assert!(decode_layoutget(&mut Reader::new(&w.buf[..n])).is_err());
        }

        let mut w = Writer::new();
        w.u64(0).u64(8192).bool(false).u32(1).fixed(&[3; 12]);
        w.bool(true).u64(8191).bool(true).u64(1700000000).u32(5).u32(1).opaque(b"");
        let c = decode_layoutcommit(&mut Reader::new(&w.buf)).unwrap();
        assert_eq!((c.last_write, c.mtime, c.layout_type), (Some(8191), Some((1700000000, 5)), 1));
        for n in 0..w.buf.len() {
            assert!(decode_layoutcommit(&mut Reader::new(&w.buf[..n])).is_err());
        }
        // A layout-update body over the bound.
        let mut w = Writer::new();
        w.u64(0).u64(0).bool(false).u32(0).fixed(&[0; 12]).bool(false).bool(false).u32(1).u32(1 << 20);
        assert!(matches!(decode_layoutcommit(&mut Reader::new(&w.buf)), Err(XdrError::TooLong { .. })));

        let mut w = Writer::new();
        w.bool(false).u32(1).u32(IOMODE_ANY).u32(LAYOUTRETURN4_FILE).u64(0).u64(u64::MAX).u32(2).fixed(&[5; 12]);
        w.opaque(b"");
        let r = decode_layoutreturn(&mut Reader::new(&w.buf)).unwrap();
        assert_eq!(
            r.what,
            ReturnWhat::File { offset: 0, length: u64::MAX, stateid: Stateid { seqid: 2, other: [5; 12] } }
        );
        let mut w = Writer::new();
        w.bool(false).u32(1).u32(IOMODE_READ).u32(LAYOUTRETURN4_ALL);
        assert_eq!(decode_layoutreturn(&mut Reader::new(&w.buf)).unwrap().what, ReturnWhat::All);
        let mut w = Writer::new();
        w.bool(false).u32(1).u32(IOMODE_READ).u32(9);
        assert_eq!(decode_layoutreturn(&mut Reader::new(&w.buf)).unwrap_err(), XdrError::BadDiscriminant(9));

        let mut w = Writer::new();
        w.fixed(&[1; 16]).u32(1).u32(65536).u32(1).u32(0);
        let d = decode_getdeviceinfo(&mut Reader::new(&w.buf)).unwrap();
        assert_eq!((d.deviceid, d.maxcount), ([1; 16], 65536));
        let mut w = Writer::new();
        w.fixed(&[1; 16]).u32(1).u32(65536).u32(1000);
        assert!(decode_getdeviceinfo(&mut Reader::new(&w.buf)).is_err(), "a bitmap of 1000 words");
        let mut w = Writer::new();
        w.u32(1).u32(16).u64(0).fixed(&[0; 8]);
        assert_eq!(decode_getdevicelist(&mut Reader::new(&w.buf)).unwrap().maxdevices, 16);
    }
    #[test]
    fn the_client_reads_back_what_the_server_encodes() {
        let fhs = vec![vec![1, 2, 3], vec![4; 128], vec![]];
        let body = file_layout_body(&[5; 16], 1 << 20, &fhs);
        let l = decode_file_layout(&body).unwrap();
        assert_eq!(
            l,
            FileLayout {
                device: [5; 16],
                stripe_unit: 1 << 20,
                dense: false,
                first_stripe_index: 0,
                pattern_offset: 0,
                fhs: fhs.clone()
            }
        );
        for n in 0..body.len() {
            assert!(decode_file_layout(&body[..n]).is_err(), "truncated at {n}");
        }
        // Dense, a first index outside the handles, a zero unit, a handle over NFS4_FHSIZE.
        let mut w = Writer::new();
        w.fixed(&[0; 16]).u32(4096 | NFL4_UFLG_DENSE).u32(1).u64(0).u32(2).opaque(b"a").opaque(b"b");
        let l = decode_file_layout(&w.buf).unwrap();
        assert!(l.dense && l.stripe_unit == 4096 && l.first_stripe_index == 1);
        let mut w = Writer::new();
        w.fixed(&[0; 16]).u32(4096).u32(2).u64(0).u32(2).opaque(b"a").opaque(b"b");
        assert!(decode_file_layout(&w.buf).is_err());
        let mut w = Writer::new();
        w.fixed(&[0; 16]).u32(NFL4_UFLG_DENSE).u32(0).u64(0).u32(1).opaque(b"a");
        assert!(decode_file_layout(&w.buf).is_err());
        let mut w = Writer::new();
        w.fixed(&[0; 16]).u32(4096).u32(0).u64(0).u32(1).opaque(&[0; 129]);
        assert!(decode_file_layout(&w.buf).is_err());
        let mut w = Writer::new();
        w.fixed(&[0; 16]).u32(4096).u32(0).u64(0).u32(100_000);
        assert!(matches!(decode_file_layout(&w.buf), Err(XdrError::TooLong { .. })));

        let a: SocketAddr = "10.0.2.2:2050".parse().unwrap();
        let b: SocketAddr = "[fe80::1]:65535".parse().unwrap();
        for x in [a, b] {
            let (netid, uaddr) = netaddr(&x);
            assert_eq!(parse_netaddr(netid, &uaddr), Some(x));
        }
        assert_eq!(parse_netaddr("rdma", "10.0.2.2.8.2"), None);
        assert_eq!(parse_netaddr("tcp", "10.0.2.2.8.256"), None);
        assert_eq!(parse_netaddr("tcp", "10.0.2.2"), None);
        let body = ds_addr_body(&[vec![a], vec![b, a], vec![]]);
        assert_eq!(decode_ds_addr(&body).unwrap(), vec![vec![a], vec![b, a], vec![]]);
        for n in 0..body.len() {
            assert!(decode_ds_addr(&body[..n]).is_err(), "truncated at {n}");
        }
        // Stripe indices name lists, in any order; one naming no list is refused.
        let mut w = Writer::new();
        w.u32(2).u32(1).u32(0).u32(2).u32(1);
        w.opaque(b"tcp").opaque(b"10.0.2.2.8.2").u32(0);
        assert_eq!(decode_ds_addr(&w.buf).unwrap(), vec![vec![], vec![a]]);
        let mut w = Writer::new();
        w.u32(1).u32(5).u32(1).u32(0);
        assert_eq!(decode_ds_addr(&w.buf).unwrap_err(), XdrError::BadDiscriminant(5));
    }
}
