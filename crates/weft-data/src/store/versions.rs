//! Chunk versions of ec objects (docs/format.md §17): the `.ver` sidecar beside an object, read and written a row
//! at a time under the object's range lock, so a row's bytes and its version record are always seen together.
//!
//! Invariant: a `WriteRows` writes nothing unless every row's current version equals the one it expected
//! (compare-and-set, under an exclusive lock over the rows); it writes the chunks' bytes first (with their §5
//! checksums), then the records, so a crash in between leaves a record whose `chunk_crc` does not match the bytes:
//! the chunk reads as not intact (missing), never as "old version, new bytes".

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::LazyLock;

use weft_proto::OBJECT_BYTES_MAX;
use weft_proto::chunk_version::{self, RECORD_BYTES, Record};
use weft_proto::layout::{STRIPE_UNIT_BYTES_MAX, STRIPE_UNIT_BYTES_MIN};
use weft_proto::msg::{ChunkVersion, EC_K_MAX, ROWS_PER_REQUEST_MAX, RowWrite};

use super::{B, BLOCK_BYTES, DataError, ObjectStore, ZERO_BLOCK_CRC, io_err, read_up_to};

/// A row's record as found: `None` for none, `Err(())` for a damaged one.
type Found = Result<Option<Record>, ()>;

impl ObjectStore {
    /// The version sidecar of `ino`'s object (§17).
    pub(super) fn versions_path(&self, ino: u64) -> PathBuf {
        self.objects.join(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}.ver"))
    }

    /// Checks a rows request from the wire; returns the byte range `[start, end)` the rows cover.
    fn check_rows(ino: u64, unit: u32, first_row: u64, rows: u64) -> Result<(u64, u64), DataError> {
        let invalid = |reason: String| DataError::Invalid { ino, reason };
        if !(STRIPE_UNIT_BYTES_MIN..=STRIPE_UNIT_BYTES_MAX).contains(&unit) || !unit.is_multiple_of(4096) {
            return Err(invalid(format!("stripe unit {unit} is not a multiple of 4096 in [4 KiB, 64 MiB]")));
        }
        if rows == 0 || rows > u64::from(ROWS_PER_REQUEST_MAX) {
            return Err(invalid(format!("{rows} rows (1 to {ROWS_PER_REQUEST_MAX})")));
        }
        let u = u64::from(unit);
        match (first_row.checked_mul(u), first_row.checked_add(rows).and_then(|r| r.checked_mul(u))) {
            (Some(start), Some(end)) if end <= OBJECT_BYTES_MAX => Ok((start, end)),
            _ => Err(DataError::OutOfRange { ino, offset: first_row.saturating_mul(u), len: rows.saturating_mul(u) }),
        }
    }

    /// Opens the version sidecar (`None` when there is none) and checks its header against `unit`.
    fn open_versions(&self, ino: u64, unit: u32, create: bool) -> Result<Option<File>, DataError> {
        let path = self.versions_path(ino);
        if create {
            let dir = path.parent().expect("object paths have a parent");
            std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        }
        let f = match OpenOptions::new().read(true).write(create).create(create).truncate(false).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("opening", &path)(e)),
        };
        let len = f.metadata().map_err(io_err("stat", &path))?.len();
        if len == 0 {
            if create {
                f.write_all_at(&chunk_version::encode_header(unit), 0).map_err(io_err("writing", &path))?;
            }
            return Ok(Some(f));
        }
        let mut h = [0u8; RECORD_BYTES];
        read_up_to(&f, &mut h, 0).map_err(io_err("reading", &path))?;
        let found = chunk_version::decode_header(&h).map_err(|e| DataError::BadVersions {
            ino,
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if found != unit {
            return Err(DataError::Invalid { ino, reason: format!("stripe unit {unit}, but the object's is {found}") });
        }
        Ok(Some(f))
    }

    /// The records of rows `[first_row, first_row + rows)`.
    fn read_records(&self, ino: u64, f: Option<&File>, first_row: u64, rows: u64) -> Result<Vec<Found>, DataError> {
        let mut raw = vec![0u8; rows as usize * RECORD_BYTES];
        if let Some(f) = f {
            let at = chunk_version::record_offset(first_row).expect("rows checked against OBJECT_BYTES_MAX");
            read_up_to(f, &mut raw, at).map_err(io_err("reading", &self.versions_path(ino)))?;
        }
        Ok(raw.chunks_exact(RECORD_BYTES).map(|r| chunk_version::decode_record(r).map_err(|_| ())).collect())
    }

    /// The chunk versions of `rows` rows from `first_row`. With `data` (`rows × unit` bytes), also the rows' bytes
    /// (zeros past the object's end, and for a row whose blocks fail their checksums), and each chunk is checked
    /// against its record (`intact`); without, `intact` says only whether the record itself is sound.
    pub fn read_rows(
        &self,
        ino: u64,
        unit: u32,
        first_row: u64,
        rows: u32,
        mut data: Option<&mut [u8]>,
    ) -> Result<Vec<ChunkVersion>, DataError> {
        let (start, end) = Self::check_rows(ino, unit, first_row, u64::from(rows))?;
        let u = unit as usize;
        if let Some(d) = &data {
            assert_eq!(d.len(), rows as usize * u, "the caller sizes the buffer");
        }
        let _g = self.locks.lock(ino, start / B * B, end.div_ceil(B) * B, false);
        let f = self.open_versions(ino, unit, false)?;
        let found = self.read_records(ino, f.as_ref(), first_row, u64::from(rows))?;
        let mut out = Vec::with_capacity(rows as usize);
        for (i, rec) in found.into_iter().enumerate() {
            let (version, parity_of, want_crc) = match &rec {
                Ok(Some(r)) => (r.version, r.parity_of.clone(), Some(r.chunk_crc)),
                Ok(None) => (0, Vec::new(), None),
                // A damaged record counts as version 0 and its chunk as missing (§17).
                Err(()) => (0, Vec::new(), None),
            };
            let Some(d) = data.as_deref_mut() else {
                out.push(ChunkVersion { version, intact: rec.is_ok(), parity_of });
                continue;
            };
            let chunk = &mut d[i * u..(i + 1) * u];
            let sound = match self.read_locked(ino, start + (i * u) as u64, chunk) {
                Ok(()) => true,
                Err(DataError::Corrupt { .. } | DataError::Lost { .. }) => {
                    chunk.fill(0);
                    false
                }
                Err(e) => return Err(e),
            };
            let intact = sound
                && match (&rec, want_crc) {
                    (Ok(_), Some(c)) => crc32c::crc32c(chunk) == c,
                    // No record: never written with a version, so zeros are expected.
                    (Ok(None), None) => chunk.iter().all(|&b| b == 0),
                    _ => false,
                };
            out.push(ChunkVersion { version, intact, parity_of });
        }
        Ok(out)
    }

    /// Compare-and-set write of whole chunks: `data` holds rows `first_row..` back to back (the last possibly
    /// short), `rows` their expected and new versions. Nothing is written unless every row's current version
    /// (0 for none or a damaged record) equals its `expect`.
    pub fn write_rows(
        &self,
        ino: u64,
        unit: u32,
        first_row: u64,
        rows: &[RowWrite],
        data: &[u8],
    ) -> Result<(), DataError> {
        let n = rows.len() as u64;
        let (start, end) = Self::check_rows(ino, unit, first_row, n)?;
        let u = u64::from(unit);
        let invalid = |reason: String| DataError::Invalid { ino, reason };
        let len = data.len() as u64;
        if len > n * u || len < (n - 1) * u {
            return Err(invalid(format!("{len} bytes of payload for {n} rows of {unit}")));
        }
        for (i, r) in rows.iter().enumerate() {
            if r.version <= r.expect || r.parity_of.len() > EC_K_MAX {
                return Err(invalid(format!(
                    "row {}: version {} after {} with {} parity entries",
                    first_row + i as u64,
                    r.version,
                    r.expect,
                    r.parity_of.len()
                )));
            }
        }
        let _g = self.locks.lock(ino, start / B * B, end.div_ceil(B) * B, true);
        let f = self.open_versions(ino, unit, true)?.expect("created");
        let found = self.read_records(ino, Some(&f), first_row, n)?;
        for (i, (r, rec)) in rows.iter().zip(&found).enumerate() {
            let current = match rec {
                Ok(Some(rec)) => rec.version,
                _ => 0,
            };
            if current != r.expect {
                return Err(DataError::VersionMoved {
                    ino,
                    row: first_row + i as u64,
                    unit,
                    expected: r.expect,
                    found: current,
                });
            }
        }
        let path = self.versions_path(ino);
        let at = chunk_version::record_offset(first_row).expect("rows checked against OBJECT_BYTES_MAX");
        let rec_len = n * RECORD_BYTES as u64;
        // Reserve the records' blocks before the data changes, so a full disk cannot leave new bytes without one.
        crate::sys::reserve(&f, at, rec_len).map_err(io_err("reserving", &path))?;
        self.write_locked(ino, start, data)?;
        let mut records = Vec::with_capacity(rec_len as usize);
        for (i, r) in rows.iter().enumerate() {
            let from = i * u as usize;
            let chunk = &data[from.min(data.len())..(from + u as usize).min(data.len())];
            let mut crc = crc32c::crc32c(chunk);
            if (chunk.len() as u64) < u {
                // A short last chunk: the rest of the unit is what the object holds there (zeros past its end).
                let mut rest = vec![0u8; u as usize - chunk.len()];
                self.read_locked(ino, start + i as u64 * u + chunk.len() as u64, &mut rest)?;
                crc = crc32c::crc32c_append(crc, &rest);
            }
            let rec = Record { version: r.version, chunk_crc: crc, parity_of: r.parity_of.clone() };
            records.extend_from_slice(&chunk_version::encode_record(&rec));
        }
        f.write_all_at(&records, at).map_err(io_err("writing", &path))?;
        Ok(())
    }

    /// Checks a chunk-range request from the wire; returns the row's byte range `[start, end)` in the object.
    fn check_range_of_chunk(ino: u64, unit: u32, row: u64, offset: u32, len: u64) -> Result<(u64, u64), DataError> {
        let rows = Self::check_rows(ino, unit, row, 1)?;
        if len == 0 || u64::from(offset) + len > u64::from(unit) {
            let reason = format!("bytes [{offset}, {offset} + {len}) of a chunk of {unit}");
            return Err(DataError::Invalid { ino, reason });
        }
        Ok(rows)
    }

    /// The §5 stored checksums of the chunk `[start, start + unit)`'s blocks.
    fn chunk_block_crcs(&self, ino: u64, start: u64, unit: u32) -> Result<Vec<u32>, DataError> {
        let sidecar = self.open_sidecar(ino)?;
        self.read_crcs(ino, sidecar.as_ref(), start / B, unit as usize / BLOCK_BYTES)
    }

    /// The record of row `row` and bytes `[offset, offset + buf.len())` of its chunk into `buf`; `intact` as
    /// [`ObjectStore::read_rows`] with data, the chunk's CRC combined from its blocks' checksums.
    pub fn read_chunk_range(
        &self,
        ino: u64,
        unit: u32,
        row: u64,
        offset: u32,
        buf: &mut [u8],
    ) -> Result<ChunkVersion, DataError> {
        let (start, end) = Self::check_range_of_chunk(ino, unit, row, offset, buf.len() as u64)?;
        let _g = self.locks.lock(ino, start, end, false);
        let f = self.open_versions(ino, unit, false)?;
        let rec = self.read_records(ino, f.as_ref(), row, 1)?.pop().expect("one row");
        let sound = match self.read_locked(ino, start + u64::from(offset), buf) {
            Ok(()) => true,
            Err(DataError::Corrupt { .. } | DataError::Lost { .. }) => {
                buf.fill(0);
                false
            }
            Err(e) => return Err(e),
        };
        let crcs = self.chunk_block_crcs(ino, start, unit)?;
        Ok(match rec {
            Ok(Some(r)) => {
                let intact = sound && combine_blocks(&crcs) == r.chunk_crc;
                ChunkVersion { version: r.version, intact, parity_of: r.parity_of }
            }
            // No record: zeros expected, so every block checksum is 0 (a zero block's stored value).
            Ok(None) => ChunkVersion { version: 0, intact: sound && crcs.iter().all(|&c| c == 0), parity_of: vec![] },
            Err(()) => ChunkVersion { version: 0, intact: false, parity_of: Vec::new() },
        })
    }

    /// Compare-and-set write of `data` at `offset` in the chunk of row `row`: as [`ObjectStore::write_rows`] of one
    /// row, the record's CRC combined from the chunk's block checksums after the write.
    pub fn write_chunk_range(
        &self,
        ino: u64,
        unit: u32,
        row: u64,
        offset: u32,
        w: &RowWrite,
        data: &[u8],
    ) -> Result<(), DataError> {
        let (start, end) = Self::check_range_of_chunk(ino, unit, row, offset, data.len() as u64)?;
        if w.version <= w.expect || w.parity_of.len() > EC_K_MAX {
            let reason = format!(
                "row {row}: version {} after {} with {} parity entries",
                w.version,
                w.expect,
                w.parity_of.len()
            );
            return Err(DataError::Invalid { ino, reason });
        }
        let _g = self.locks.lock(ino, start, end, true);
        let f = self.open_versions(ino, unit, true)?.expect("created");
        let current = match self.read_records(ino, Some(&f), row, 1)?.pop().expect("one row") {
            Ok(Some(rec)) => rec.version,
            _ => 0,
        };
        if current != w.expect {
            return Err(DataError::VersionMoved { ino, row, unit, expected: w.expect, found: current });
        }
        let path = self.versions_path(ino);
        let at = chunk_version::record_offset(row).expect("rows checked against OBJECT_BYTES_MAX");
        crate::sys::reserve(&f, at, RECORD_BYTES as u64).map_err(io_err("reserving", &path))?;
        self.write_locked(ino, start + u64::from(offset), data)?;
        let chunk_crc = combine_blocks(&self.chunk_block_crcs(ino, start, unit)?);
        let rec = Record { version: w.version, chunk_crc, parity_of: w.parity_of.clone() };
        f.write_all_at(&chunk_version::encode_record(&rec), at).map_err(io_err("writing", &path))?;
        Ok(())
    }

    /// After the object was cut to `size`: drops the records of rows that start at or past it (a row cut in the
    /// middle keeps its record, which no longer matches: its chunk is missing until the client rewrites the row).
    pub(super) fn truncate_versions(&self, ino: u64, size: u64) -> Result<(), DataError> {
        let path = self.versions_path(ino);
        let f = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("opening", &path)(e)),
        };
        let mut h = [0u8; RECORD_BYTES];
        read_up_to(&f, &mut h, 0).map_err(io_err("reading", &path))?;
        let Ok(unit) = chunk_version::decode_header(&h) else {
            // A header never written (a crash right after creating the file) has no records to drop.
            return Ok(());
        };
        let rows = size.div_ceil(u64::from(unit));
        let keep = chunk_version::record_offset(rows).expect("rows of an object fit");
        let len = f.metadata().map_err(io_err("stat", &path))?.len();
        if len > keep {
            f.set_len(keep).map_err(io_err("truncating", &path))?;
        }
        Ok(())
    }
}

/// The operator "append 4096 zero bytes" on a CRC32C value, as four tables of 256 (one per input byte, the
/// operator is linear): the CRC combination for blocks of one length, computed once.
static SHIFT_BLOCK: LazyLock<[[u32; 256]; 4]> = LazyLock::new(|| {
    let column: [u32; 32] = std::array::from_fn(|i| crc32c::crc32c_combine(1 << i, 0, BLOCK_BYTES));
    std::array::from_fn(|byte| {
        std::array::from_fn(|v| (0..8).filter(|b| v & (1 << b) != 0).fold(0, |acc, b| acc ^ column[byte * 8 + b]))
    })
});

/// The CRC32C of consecutive whole blocks from their §5 stored checksums (`stored = crc32c(block) XOR
/// crc32c(4096 zeros)`): `crc(AB) = shift_|B|(crc(A)) XOR crc(B)`, linear in `crc(A)`.
fn combine_blocks(stored: &[u32]) -> u32 {
    let t = &*SHIFT_BLOCK;
    stored.iter().fold(0u32, |acc, &s| {
        let [a, b, c, d] = acc.to_le_bytes();
        let shifted = t[0][a as usize] ^ t[1][b as usize] ^ t[2][c as usize] ^ t[3][d as usize];
        shifted ^ s ^ *ZERO_BLOCK_CRC
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: u32 = 8192;

    fn store(name: &str) -> (ObjectStore, PathBuf) {
        let dir = std::env::temp_dir().join(format!("weft-versions-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (ObjectStore::open(&dir).unwrap(), dir)
    }

    fn w(expect: u64, version: u64, parity_of: Vec<u64>) -> RowWrite {
        RowWrite { expect, version, parity_of }
    }

    fn rows(s: &ObjectStore, ino: u64, first: u64, n: u32) -> (Vec<ChunkVersion>, Vec<u8>) {
        let mut buf = vec![0u8; n as usize * U as usize];
        let v = s.read_rows(ino, U, first, n, Some(&mut buf)).unwrap();
        (v, buf)
    }

    #[test]
    fn compare_and_set_writes_and_reads_versions() {
        let (s, dir) = store("cas");
        // Never written: version 0, intact zeros.
        let (v, _) = rows(&s, 1, 0, 2);
        assert!(v.iter().all(|c| c.version == 0 && c.intact && c.parity_of.is_empty()));
        let data: Vec<u8> = (0..U as usize + 100).map(|i| i as u8).collect();
        s.write_rows(1, U, 0, &[w(0, 1, vec![]), w(0, 1, vec![7, 8])], &data).unwrap();
        let (v, buf) = rows(&s, 1, 0, 2);
        assert_eq!(v[0], ChunkVersion { version: 1, intact: true, parity_of: vec![] });
        assert_eq!(v[1], ChunkVersion { version: 1, intact: true, parity_of: vec![7, 8] });
        assert_eq!(&buf[..data.len()], &data[..]);
        assert!(buf[data.len()..].iter().all(|&b| b == 0));
        // A stale expectation writes nothing.
        let e = s.write_rows(1, U, 1, &[w(0, 1, vec![])], &[9u8; 10]).unwrap_err();
        assert!(matches!(e, DataError::VersionMoved { row: 1, expected: 0, found: 1, .. }), "{e}");
        assert_eq!(rows(&s, 1, 1, 1).1[..100], data[U as usize..]);
        // Without data, only the records.
        let v = s.read_rows(1, U, 0, 3, None).unwrap();
        assert_eq!(v.iter().map(|c| c.version).collect::<Vec<_>>(), vec![1, 1, 0]);
        // Refusals before any I/O: bad unit, no rows, versions not increasing, short middle row, wrong unit.
        assert!(matches!(s.read_rows(1, 1000, 0, 1, None), Err(DataError::Invalid { .. })));
        assert!(matches!(s.read_rows(1, U, 0, 0, None), Err(DataError::Invalid { .. })));
        assert!(matches!(s.read_rows(1, U, u64::MAX / 2, 1, None), Err(DataError::OutOfRange { .. })));
        assert!(matches!(s.write_rows(1, U, 0, &[w(1, 1, vec![])], &[1]), Err(DataError::Invalid { .. })));
        assert!(matches!(
            s.write_rows(1, U, 0, &[w(1, 2, vec![]), w(1, 2, vec![])], &[1; 10]),
            Err(DataError::Invalid { .. })
        ));
        assert!(matches!(s.read_rows(1, 2 * U, 0, 1, None), Err(DataError::Invalid { .. })));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bytes_changed_under_a_record_are_not_intact() {
        let (s, dir) = store("torn");
        s.write_rows(2, U, 0, &[w(0, 1, vec![])], &[5u8; U as usize]).unwrap();
        // A write that landed without its record (the crash between the two): the chunk is missing.
        s.write(2, 100, &[6u8; 10]).unwrap();
        let (v, _) = rows(&s, 2, 0, 1);
        assert_eq!((v[0].version, v[0].intact), (1, false));
        // A never-recorded chunk with bytes in it is missing too.
        s.write(2, u64::from(U), &[1]).unwrap();
        assert!(!rows(&s, 2, 1, 1).0[0].intact);
        // Rewriting it with the expected version repairs it.
        s.write_rows(2, U, 0, &[w(1, 2, vec![])], &[7u8; U as usize]).unwrap();
        assert!(rows(&s, 2, 0, 1).0[0].intact);
        // A damaged record: version 0, not intact.
        let path = s.versions_path(2);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xff], RECORD_BYTES as u64 + 9).unwrap();
        assert_eq!(rows(&s, 2, 0, 1).0[0], ChunkVersion { version: 0, intact: false, parity_of: vec![] });
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A range write's record vouches for the whole chunk exactly as a whole-chunk write's does: a full read
    /// (which computes the CRC over the bytes) finds it intact, and a range read (which combines the block
    /// checksums) agrees with it on every case.
    #[test]
    fn chunk_ranges_write_and_read_records_a_full_read_agrees_with() {
        let (s, dir) = store("range");
        let range = |s: &ObjectStore, row: u64, offset: u32, len: usize| {
            let mut buf = vec![0u8; len];
            let v = s.read_chunk_range(4, U, row, offset, &mut buf).unwrap();
            (v, buf)
        };
        // Never written: version 0, intact zeros, for a range read as for a full one.
        assert_eq!(range(&s, 0, 100, 50).0, ChunkVersion { version: 0, intact: true, parity_of: vec![] });
        // A range into a never-written chunk: the rest stays zeros, the record covers the whole chunk.
        s.write_chunk_range(4, U, 1, 5000, &w(0, 3, vec![1, 2]), &[9u8; 300]).unwrap();
        let (v, buf) = rows(&s, 4, 1, 1);
        assert_eq!(v[0], ChunkVersion { version: 3, intact: true, parity_of: vec![1, 2] });
        assert!(buf[..5000].iter().all(|&b| b == 0) && buf[5000..5300].iter().all(|&b| b == 9));
        assert!(buf[5300..].iter().all(|&b| b == 0));
        // Over a whole-chunk write, unaligned and across a block boundary.
        let data: Vec<u8> = (0..U as usize).map(|i| (i * 7) as u8).collect();
        s.write_rows(4, U, 0, &[w(0, 1, vec![])], &data).unwrap();
        s.write_chunk_range(4, U, 0, 4000, &w(1, 2, vec![]), &[1u8; 200]).unwrap();
        let (v, buf) = rows(&s, 4, 0, 1);
        assert_eq!((v[0].version, v[0].intact), (2, true));
        assert_eq!(&buf[3990..4000], &data[3990..4000]);
        assert!(buf[4000..4200].iter().all(|&b| b == 1));
        assert_eq!(&buf[4200..], &data[4200..]);
        let (v, got) = range(&s, 0, 3999, 202);
        assert_eq!((v.version, v.intact), (2, true));
        assert_eq!(got[0], data[3999]);
        assert_eq!(got[201], data[4200]);
        // A stale expectation writes nothing.
        let e = s.write_chunk_range(4, U, 0, 0, &w(1, 5, vec![]), &[2u8; 10]).unwrap_err();
        assert!(matches!(e, DataError::VersionMoved { row: 0, expected: 1, found: 2, .. }), "{e}");
        assert_eq!(range(&s, 0, 0, 10).1, data[..10]);
        // Bytes changed under the record (a write without its record) are found by a range read too, even one
        // that does not cover them; so is a never-recorded chunk holding bytes.
        s.write(4, 8000, &[6u8; 4]).unwrap();
        assert_eq!((range(&s, 0, 0, 10).0.version, range(&s, 0, 0, 10).0.intact), (2, false));
        s.write(4, 2 * u64::from(U) + 10, &[1]).unwrap();
        assert!(!range(&s, 2, 0, 1).0.intact);
        // Refusals before any I/O: an empty range, one past the chunk, a bad unit.
        let mut one = [0u8; 1];
        assert!(matches!(s.read_chunk_range(4, U, 0, U, &mut one), Err(DataError::Invalid { .. })));
        assert!(matches!(s.read_chunk_range(4, U, 0, 0, &mut []), Err(DataError::Invalid { .. })));
        assert!(matches!(
            s.write_chunk_range(4, U, 0, U - 1, &w(2, 3, vec![]), &[0; 2]),
            Err(DataError::Invalid { .. })
        ));
        assert!(matches!(s.read_chunk_range(4, 1000, 0, 0, &mut one), Err(DataError::Invalid { .. })));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn combined_block_checksums_are_the_chunk_crc() {
        let chunk: Vec<u8> = (0..4 * BLOCK_BYTES).map(|i| (i * 31 % 251) as u8).collect();
        let stored: Vec<u32> = chunk.chunks(BLOCK_BYTES).map(super::super::stored_crc).collect();
        assert_eq!(combine_blocks(&stored), crc32c::crc32c(&chunk));
        // Holes (stored 0) stand for zero blocks.
        assert_eq!(combine_blocks(&[0, 0]), crc32c::crc32c(&[0u8; 2 * BLOCK_BYTES]));
    }

    #[test]
    fn truncate_drops_the_records_of_rows_cut_away() {
        let (s, dir) = store("trunc");
        s.write_rows(3, U, 0, &[w(0, 1, vec![]), w(0, 1, vec![]), w(0, 1, vec![])], &[4u8; 3 * U as usize]).unwrap();
        s.truncate(3, u64::from(U) + 10).unwrap();
        let (v, _) = rows(&s, 3, 0, 3);
        // Row 0 whole, row 1 cut in the middle (missing until rewritten), row 2 gone (never written: zeros).
        assert_eq!(v.iter().map(|c| (c.version, c.intact)).collect::<Vec<_>>(), vec![(1, true), (1, false), (0, true)]);
        s.remove(3).unwrap();
        assert!(!s.versions_path(3).exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
