//! pNFS data-server filehandles (docs/format.md §23): a magic/version byte, the stripe geometry of the file's
//! layout as seen by this data server, and the §10 capability the MDS sealed for key id `"pnfs"`
//! (`PnfsHandle`, op 137).
//!
//! The geometry is not under the MAC: it only maps the client's *file* offsets to this server's object offsets
//! for the inode the capability already allows, so a client that edits it can only reach bytes of that same
//! object. It is still checked (unit a multiple of 4 KiB in Weft's bounds, 1 ≤ count ≤ 256, index < count), and
//! [`DsFh::object_range`] refuses a range outside this server's stripes.

use weft_proto::capability::Capability;
use weft_proto::layout::{STRIPE_COUNT_MAX, STRIPE_UNIT_BYTES_MAX, STRIPE_UNIT_BYTES_MIN};
use weft_proto::types::OBJECT_BYTES_MAX;

/// The first byte of every data-server filehandle: "DS handle, version 1". A gateway handle (§15) never starts
/// with it, so the two can never be confused.
pub const DS_FH_MAGIC_V1: u8 = 0xd1;
/// NFS4_FHSIZE (RFC 8881): the longest filehandle NFSv4 carries.
pub const NFS4_FHSIZE: usize = 128;
/// Bytes before the capability: magic, unit, count, index (u32 BE each), generation (u64 BE).
pub const DS_FH_HEADER_BYTES: usize = 1 + 4 + 4 + 4 + 8;

/// A decoded data-server filehandle. The capability is as the client sent it: its MAC is checked by the data
/// server's capability gate before anything in it is believed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DsFh {
    pub cap: Capability,
    /// The layout's stripe unit in bytes.
    pub unit: u32,
    /// How many data servers the layout stripes over.
    pub count: u32,
    /// This server's position in the layout (stripe `s` lives at index `s % count`).
    pub index: u32,
    /// The layout generation the handle was made for (docs/format.md §19).
    pub generation: u64,
}

/// Why a data-server filehandle does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DsFhError {
    #[error("data-server filehandle of {0} bytes (at most {NFS4_FHSIZE}, at least {DS_FH_HEADER_BYTES})")]
    Length(usize),
    #[error("not a data-server filehandle (first byte {0:#04x})")]
    Magic(u8),
    #[error("data-server filehandle geometry out of bounds: unit {unit}, count {count}, index {index}")]
    Geometry { unit: u32, count: u32, index: u32 },
    #[error("data-server filehandle capability does not decode: {0}")]
    Capability(String),
}

/// Why a READ/WRITE range cannot be served by this data server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RangeError {
    #[error("file offset {offset} is in stripe {stripe}, which lives on layout index {owner}, not {index}")]
    OtherServer { offset: u64, stripe: u64, owner: u64, index: u32 },
    #[error("range of {len} bytes at file offset {offset} crosses the end of its stripe unit ({unit} bytes)")]
    CrossesStripe { offset: u64, len: u64, unit: u32 },
    #[error("range of {len} bytes at file offset {offset} is past the largest object")]
    TooFar { offset: u64, len: u64 },
}

/// The filehandle bytes for `cap` at layout position `index` of `count` servers striped by `unit`, layout
/// generation `generation`. At most [`NFS4_FHSIZE`] bytes for a capability with key id `"pnfs"`; a capability
/// whose encoding would not fit (a key id over ~50 bytes) is a programmer error.
pub fn encode(cap: &Capability, unit: u32, count: u32, index: u32, generation: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(NFS4_FHSIZE);
    v.push(DS_FH_MAGIC_V1);
    v.extend_from_slice(&unit.to_be_bytes());
    v.extend_from_slice(&count.to_be_bytes());
    v.extend_from_slice(&index.to_be_bytes());
    v.extend_from_slice(&generation.to_be_bytes());
    v.extend_from_slice(&weft_proto::msg::encode_value(cap));
    assert!(v.len() <= NFS4_FHSIZE, "a data-server filehandle of {} bytes exceeds NFS4_FHSIZE", v.len());
    v
}

/// Decodes and bounds-checks a data-server filehandle (not its MAC: that is the capability gate's).
pub fn decode(bytes: &[u8]) -> Result<DsFh, DsFhError> {
    if bytes.len() > NFS4_FHSIZE || bytes.len() < DS_FH_HEADER_BYTES {
        return Err(DsFhError::Length(bytes.len()));
    }
    if bytes[0] != DS_FH_MAGIC_V1 {
        return Err(DsFhError::Magic(bytes[0]));
    }
    let u32_at = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let (unit, count, index) = (u32_at(1), u32_at(5), u32_at(9));
    let generation = u64::from_be_bytes(bytes[13..21].try_into().expect("8 bytes"));
    let unit_ok =
        (STRIPE_UNIT_BYTES_MIN..=STRIPE_UNIT_BYTES_MAX).contains(&unit) && unit.is_multiple_of(STRIPE_UNIT_BYTES_MIN);
    if !unit_ok || count == 0 || count > STRIPE_COUNT_MAX || index >= count {
        return Err(DsFhError::Geometry { unit, count, index });
    }
    let cap: Capability =
        weft_proto::msg::decode(0, &bytes[DS_FH_HEADER_BYTES..]).map_err(|e| DsFhError::Capability(e.to_string()))?;
    Ok(DsFh { cap, unit, count, index, generation })
}

impl DsFh {
    /// The object offset of `len` bytes at file offset `offset` (RFC 8881 §13.4.4 with `NFL4_UFLG_DENSE` clear:
    /// the client sends file offsets, and this server maps them by Weft's rule `(s / count)·unit + o % unit` for
    /// stripe `s = o / unit`). The range must lie in one stripe unit that lives on this server; a zero-length
    /// range only needs its offset to be in such a stripe.
    pub fn object_range(&self, offset: u64, len: u64) -> Result<u64, RangeError> {
        let unit = u64::from(self.unit);
        let count = u64::from(self.count);
        let stripe = offset / unit;
        let owner = stripe % count;
        if owner != u64::from(self.index) {
            return Err(RangeError::OtherServer { offset, stripe, owner, index: self.index });
        }
        let within = offset % unit;
        if within + len > unit {
            return Err(RangeError::CrossesStripe { offset, len, unit: self.unit });
        }
        let object = (stripe / count) * unit + within;
        if object.checked_add(len).is_none_or(|end| end > OBJECT_BYTES_MAX) {
            return Err(RangeError::TooFar { offset, len });
        }
        Ok(object)
    }

    /// The file offset of object offset `object` (for log lines and corrupt-block reports).
    pub fn file_offset(&self, object: u64) -> u64 {
        let unit = u64::from(self.unit);
        let row = object / unit;
        (row * u64::from(self.count) + u64::from(self.index)) * unit + object % unit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::Rights;
    use weft_proto::capability::{CAPABILITY_MAC_BYTES, CAPABILITY_VERSION};
    use weft_proto::layout::Layout;

    fn cap() -> Capability {
        Capability {
            version: CAPABILITY_VERSION,
            ino: u64::MAX,
            rights: Rights::READ_WRITE,
            expiry_ms: u64::MAX,
            key_id: "pnfs".into(),
            session: u64::MAX,
            data_version: u64::MAX,
            mac: [0xa5; CAPABILITY_MAC_BYTES],
        }
    }

    #[test]
    fn round_trips_and_fits_nfs4_fhsize() {
        let fh = encode(&cap(), 1 << 20, 4, 3, 7);
        assert!(fh.len() <= NFS4_FHSIZE, "{} bytes", fh.len());
        assert_eq!(&fh[..DS_FH_HEADER_BYTES], &[0xd1, 0, 0x10, 0, 0, 0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 7]);
        let d = decode(&fh).unwrap();
        assert_eq!(d, DsFh { cap: cap(), unit: 1 << 20, count: 4, index: 3, generation: 7 });
    }

    #[test]
    fn refuses_bad_bytes() {
        let fh = encode(&cap(), 4096, 2, 1, 0);
        assert_eq!(decode(&fh[..20]), Err(DsFhError::Length(20)));
        assert_eq!(decode(&[0; 129]), Err(DsFhError::Length(129)));
        let mut m = fh.clone();
        m[0] = 0xd2;
        assert_eq!(decode(&m), Err(DsFhError::Magic(0xd2)));
        for (unit, count, index) in
            [(0, 2, 1), (4095, 2, 1), (6000, 2, 1), (128 << 20, 2, 1), (4096, 0, 0), (4096, 2, 2), (4096, 257, 1)]
        {
            let e = encode(&cap(), unit, count, index, 0);
            assert_eq!(decode(&e), Err(DsFhError::Geometry { unit, count, index }), "{unit} {count} {index}");
        }
        assert!(matches!(decode(&fh[..fh.len() - 1]), Err(DsFhError::Capability(_))));
        let mut long = fh.clone();
        long.push(0);
        assert!(matches!(decode(&long), Err(DsFhError::Capability(_))), "trailing bytes are refused");
    }

    /// The mapping is the one the client library uses (`Layout::pieces`), for every server of a layout.
    #[test]
    fn object_offsets_match_the_layout_rule() {
        let unit = 8192u32;
        let layout = Layout::plain(unit, vec![10, 11, 12, 13]);
        for offset in (0..20 * u64::from(unit)).step_by(1531) {
            let piece = layout.pieces(offset, 1).remove(0);
            for index in 0..4 {
                let fh = DsFh { cap: cap(), unit, count: 4, index, generation: 0 };
                let r = fh.object_range(offset, 1);
                if index as usize == piece.server_index as usize {
                    assert_eq!(r, Ok(piece.object_offset), "offset {offset}");
                    assert_eq!(fh.file_offset(piece.object_offset), offset);
                } else {
                    assert!(matches!(r, Err(RangeError::OtherServer { .. })), "offset {offset} index {index}");
                }
            }
        }
    }

    #[test]
    fn ranges_stay_inside_one_stripe_unit() {
        let fh = DsFh { cap: cap(), unit: 4096, count: 2, index: 1, generation: 0 };
        assert_eq!(fh.object_range(4096, 4096), Ok(0));
        assert_eq!(fh.object_range(3 * 4096 + 10, 100), Ok(4096 + 10));
        assert!(matches!(fh.object_range(4096, 4097), Err(RangeError::CrossesStripe { .. })));
        assert!(matches!(fh.object_range(8192, 0), Err(RangeError::OtherServer { .. })));
        assert_eq!(fh.object_range(4096 + 4095, 1), Ok(4095));
        assert!(matches!(
            fh.object_range(u64::MAX - 10, 4),
            Err(RangeError::OtherServer { .. } | RangeError::TooFar { .. })
        ));
        let one = DsFh { cap: cap(), unit: 4096, count: 1, index: 0, generation: 0 };
        assert!(matches!(one.object_range(u64::MAX - 4095, 1), Err(RangeError::TooFar { .. })));
    }
}
