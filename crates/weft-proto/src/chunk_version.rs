//! The on-disk chunk-version sidecar of an ec object (docs/format.md §17): a 512-byte header naming the stripe
//! unit, then one 512-byte record per stripe row, each holding the row's chunk version, the CRC-32C of the chunk's
//! bytes, and for a parity chunk the versions of the data chunks it encodes. Pure encoding and decoding (no I/O),
//! shared by the data server and the fuzz target.
//!
//! Invariant: a decoded record is returned only if its own CRC matches and every field is in range; anything else
//! is [`RecordError`] (a record of all zeros is "no record", not an error).

use crate::msg::EC_K_MAX;

/// Bytes of the header and of each record: one disk sector, so a record is written by one aligned `pwrite` of one
/// sector (see §17 on torn records).
pub const RECORD_BYTES: usize = 512;
/// The header's magic.
pub const MAGIC: [u8; 8] = *b"WEFTVER\0";
/// The only format version so far.
pub const FORMAT_VERSION: u16 = 1;
/// Where the record CRC lives (and what it covers: the bytes before it).
const CRC_AT: usize = RECORD_BYTES - 4;

/// One row's record, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The chunk's version; at least 1 in a stored record.
    pub version: u64,
    /// `crc32c` of the chunk's `unit` bytes (zeros past the object's end).
    pub chunk_crc: u32,
    /// For a parity chunk, the versions of the `k` data chunks it was computed from; empty for a data chunk.
    pub parity_of: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    #[error("version record: its CRC does not match (a torn or damaged record)")]
    Crc,
    #[error("version record: bad field: {0}")]
    Field(&'static str),
}

/// Encodes the header of a sidecar for stripe unit `unit`.
pub fn encode_header(unit: u32) -> [u8; RECORD_BYTES] {
    let mut b = [0u8; RECORD_BYTES];
    b[..8].copy_from_slice(&MAGIC);
    b[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&unit.to_le_bytes());
    seal(&mut b);
    b
}

/// The stripe unit a header names.
pub fn decode_header(b: &[u8]) -> Result<u32, RecordError> {
    if b.len() != RECORD_BYTES {
        return Err(RecordError::Field("header length"));
    }
    check_crc(b)?;
    if b[..8] != MAGIC {
        return Err(RecordError::Field("magic"));
    }
    if u16::from_le_bytes([b[8], b[9]]) != FORMAT_VERSION {
        return Err(RecordError::Field("format version"));
    }
    if b[10..12] != [0, 0] || b[16..CRC_AT].iter().any(|&x| x != 0) {
        return Err(RecordError::Field("reserved header bytes"));
    }
    let unit = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
    if unit == 0 || unit % 4096 != 0 {
        return Err(RecordError::Field("stripe unit"));
    }
    Ok(unit)
}

/// Encodes a record. Programmer errors (checked by the caller against the wire first): version 0, more than
/// [`EC_K_MAX`] parity entries.
pub fn encode_record(r: &Record) -> [u8; RECORD_BYTES] {
    assert!(r.version > 0, "a stored version is at least 1");
    assert!(r.parity_of.len() <= EC_K_MAX, "at most EC_K_MAX parity entries");
    let mut b = [0u8; RECORD_BYTES];
    b[0] = 1;
    b[1] = r.parity_of.len() as u8;
    b[4..8].copy_from_slice(&r.chunk_crc.to_le_bytes());
    b[8..16].copy_from_slice(&r.version.to_le_bytes());
    for (i, v) in r.parity_of.iter().enumerate() {
        b[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    seal(&mut b);
    b
}

/// Decodes a record: `Ok(None)` for all zeros (never written: a hole or past the sidecar's end).
pub fn decode_record(b: &[u8]) -> Result<Option<Record>, RecordError> {
    if b.len() != RECORD_BYTES {
        return Err(RecordError::Field("record length"));
    }
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    check_crc(b)?;
    if b[0] != 1 {
        return Err(RecordError::Field("present flag"));
    }
    let n = usize::from(b[1]);
    if n > EC_K_MAX {
        return Err(RecordError::Field("parity entry count"));
    }
    let vec_end = 16 + 8 * n;
    if b[2..4] != [0, 0] || b[vec_end..CRC_AT].iter().any(|&x| x != 0) {
        return Err(RecordError::Field("reserved record bytes"));
    }
    let version = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    if version == 0 {
        return Err(RecordError::Field("version 0"));
    }
    let chunk_crc = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    let parity_of =
        (0..n).map(|i| u64::from_le_bytes(b[16 + 8 * i..24 + 8 * i].try_into().expect("8 bytes"))).collect();
    Ok(Some(Record { version, chunk_crc, parity_of }))
}

/// Byte offset of row `row`'s record in the sidecar, or `None` if it would overflow.
pub fn record_offset(row: u64) -> Option<u64> {
    row.checked_add(1)?.checked_mul(RECORD_BYTES as u64)
}

fn seal(b: &mut [u8; RECORD_BYTES]) {
    let crc = crc32c::crc32c(&b[..CRC_AT]);
    b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
}

fn check_crc(b: &[u8]) -> Result<(), RecordError> {
    let stored = u32::from_le_bytes(b[CRC_AT..].try_into().expect("4 bytes"));
    if crc32c::crc32c(&b[..CRC_AT]) != stored {
        return Err(RecordError::Crc);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_zeros_are_none() {
        for parity_of in [vec![], vec![1, 2, 3, 4], vec![u64::MAX; EC_K_MAX]] {
            let r = Record { version: 7, chunk_crc: 0xdead_beef, parity_of };
            assert_eq!(decode_record(&encode_record(&r)), Ok(Some(r)));
        }
        assert_eq!(decode_record(&[0u8; RECORD_BYTES]), Ok(None));
        assert_eq!(decode_header(&encode_header(1 << 20)), Ok(1 << 20));
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let good = encode_record(&Record { version: 3, chunk_crc: 9, parity_of: vec![1, 2] });
        for i in 0..RECORD_BYTES {
            let mut b = good;
            b[i] ^= 0x40;
            assert!(decode_record(&b).is_err(), "byte {i}");
        }
        let h = encode_header(4096);
        for i in 0..RECORD_BYTES {
            let mut b = h;
            b[i] ^= 1;
            assert!(decode_header(&b).is_err(), "header byte {i}");
        }
        assert!(decode_record(&good[..100]).is_err());
    }

    #[test]
    fn sealed_but_out_of_range_fields_are_refused() {
        let mut b = [0u8; RECORD_BYTES];
        b[0] = 1;
        b[1] = EC_K_MAX as u8 + 1;
        b[8] = 1;
        seal(&mut b);
        assert_eq!(decode_record(&b), Err(RecordError::Field("parity entry count")));
        let mut b = [0u8; RECORD_BYTES];
        b[0] = 1;
        seal(&mut b);
        assert_eq!(decode_record(&b), Err(RecordError::Field("version 0")));
        assert_eq!(record_offset(u64::MAX), None);
        assert_eq!(record_offset(0), Some(512));
    }
}
