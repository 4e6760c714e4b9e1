//! The object store of one data server: each file's object is a plain file under `ROOT/objects/`, and beside it a
//! checksum sidecar holding a CRC-32C for every 4 KiB block.
//!
//! On-disk format (an on-disk format: change it only with a version bump):
//! - object of inode `ino`: `ROOT/objects/{ino & 0xff:02x}/{ino:016x}` (256 fan-out directories keep each small);
//! - its sidecar: the same path with `.crc`: little-endian `u32` number `b` belongs to block `b`, bytes
//!   `[b·4096, (b+1)·4096)` of the object;
//! - the stored value is `crc32c(block padded with zeros to 4096 bytes) XOR crc32c(4096 zero bytes)`, so a block
//!   that was never written (a hole, or past the sidecar's end) has stored value 0 and reads back as zeros,
//!   sparse sidecars stay sparse, and growing an object never changes the checksum of its old last block.
//!
//! Invariant: a block whose stored checksum does not match its bytes is never returned; the read fails with
//! [`DataError::Corrupt`] naming the object offset of the block.
//! Invariant: no offset or length reaches a system call before `check_range` bounded it by `OBJECT_BYTES_MAX`.
//!
//! Durability: writes go to the page cache (no fsync per write); `fsync` (op `Fsync`) makes an object, its sidecar
//! and its name durable. A crash between the data and the checksum update shows up as `Corrupt` on read, never as
//! wrong bytes.
//!
//! A full file system (ENOSPC, EDQUOT) is [`DataError::NoSpace`]. A write reserves its blocks first, the sidecar's
//! then the object's (`fallocate` with `KEEP_SIZE`), so on a full disk it fails before any byte or checksum
//! changed; if the data write fails anyway, the part it appended past the object's old end is punched out again, so
//! the old checksums (zeros there) still match. The sidecar is written last, into reserved blocks.
//!
//! Invariant: a write refused for lack of space leaves every block's data and checksum as they were (on file
//! systems that can reserve blocks for overwrites: ext4, xfs, tmpfs; on copy-on-write ones such as btrfs an
//! overwrite can still fail after the reservation, and its blocks then read `Corrupt`, never wrong bytes).

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use weft_proto::msg::{FenceAct, FenceResp, WriteFence};
use weft_proto::{DeviceId, ErrorCode, OBJECT_BYTES_MAX, SpaceStat, SpaceStatDev, WireError};

use crate::fences::{FenceRefusal, Fences};
use crate::range_lock::{RangeGuard, RangeLocks};

mod versions;

/// Bytes covered by one checksum.
pub const BLOCK_BYTES: usize = 4096;
const B: u64 = BLOCK_BYTES as u64;
const CRC_BYTES: u64 = 4;

static ZERO_BLOCK: [u8; BLOCK_BYTES] = [0; BLOCK_BYTES];
static ZERO_BLOCK_CRC: LazyLock<u32> = LazyLock::new(|| crc32c::crc32c(&ZERO_BLOCK));

/// The value stored for a block whose (zero-padded) bytes are `block`.
fn stored_crc(block: &[u8]) -> u32 {
    debug_assert!(block.len() <= BLOCK_BYTES);
    let mut crc = crc32c::crc32c(block);
    if block.len() < BLOCK_BYTES {
        crc = crc32c::crc32c_append(crc, &ZERO_BLOCK[block.len()..]);
    }
    crc ^ *ZERO_BLOCK_CRC
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    #[error("{op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: io::Error },
    /// The file system under the root is full (ENOSPC) or over its quota (EDQUOT); nothing of the request was
    /// stored (see the module's invariant).
    #[error("no space left on the data server's disk: {op} {path}: {source}")]
    NoSpace { op: &'static str, path: PathBuf, source: io::Error },
    /// A block's bytes do not match its stored checksum.
    #[error("checksum mismatch in object {ino} in the block at object offset {object_offset} ({path})")]
    Corrupt { ino: u64, object_offset: u64, path: PathBuf },
    /// The sidecar has a checksum for a block past the object's end (or for the partial block at its end that does
    /// not match): bytes that were written are not on disk (lost in a crash before they were synced, or cut). The
    /// read fails instead of returning zeros for them.
    #[error(
        "object {ino} ends at {obj_len}, but the block at object offset {object_offset} was written and its bytes are \
         missing (lost in a data-server crash before they were synced?) ({path})"
    )]
    Lost { ino: u64, object_offset: u64, obj_len: u64, path: PathBuf },
    #[error(
        "range at offset {offset} of {len} bytes of object {ino} lies beyond the object size limit {OBJECT_BYTES_MAX}"
    )]
    OutOfRange { ino: u64, offset: u64, len: u64 },
    /// A chunk-version request broke a rule of docs/format.md §17 (row count, payload length, unit, versions).
    #[error("object {ino}: {reason}")]
    Invalid { ino: u64, reason: String },
    /// A compare-and-set chunk write found another version than it expected: nothing was written.
    #[error("object {ino} row {row}: version {found}, not the {expected} the write expected (another writer moved it)")]
    VersionMoved { ino: u64, row: u64, unit: u32, expected: u64, found: u64 },
    /// The version sidecar's header is damaged: the records cannot be trusted.
    #[error("object {ino}: version sidecar {path}: {reason}")]
    BadVersions { ino: u64, path: PathBuf, reason: String },
    /// A mirror object's write fence refused the write or the fence (docs/format.md §32): nothing was written.
    #[error(transparent)]
    Fence(#[from] FenceRefusal),
}

impl From<DataError> for WireError {
    fn from(e: DataError) -> WireError {
        let message = e.to_string();
        match e {
            // Lost bytes are a block that does not match its checksum: `Corrupt` on the wire, so a client names the
            // file offset and a redundant layout rebuilds it as it would a corrupt one.
            DataError::Corrupt { object_offset, .. } | DataError::Lost { object_offset, .. } => {
                WireError::new(ErrorCode::Corrupt, message).with_offset(object_offset)
            }
            DataError::OutOfRange { offset, .. } => WireError::new(ErrorCode::OutOfRange, message).with_offset(offset),
            DataError::NoSpace { .. } => WireError::new(ErrorCode::NoSpace, message),
            DataError::Invalid { .. } => WireError::new(ErrorCode::BadRequest, message),
            DataError::VersionMoved { row, unit, .. } => {
                WireError::new(ErrorCode::VersionMoved, message).with_offset(row.saturating_mul(u64::from(unit)))
            }
            DataError::BadVersions { .. } => WireError::new(ErrorCode::Corrupt, message),
            DataError::Io { .. } => WireError::new(ErrorCode::Io, message),
            DataError::Fence(r) => match r {
                FenceRefusal::EpochMoved { .. } => WireError::new(ErrorCode::EpochMoved, message),
                FenceRefusal::Held { .. } => WireError::new(ErrorCode::Held, message),
                FenceRefusal::HoldLost { .. } => WireError::new(ErrorCode::HoldLost, message),
                FenceRefusal::Invalid { .. } => WireError::new(ErrorCode::BadRequest, message),
                FenceRefusal::Full => WireError::new(ErrorCode::Busy, message),
                FenceRefusal::Persist { .. } => WireError::new(ErrorCode::Io, message),
            },
        }
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DataError + 'a {
    move |source| match source.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => DataError::NoSpace { op, path: path.to_path_buf(), source },
        _ => DataError::Io { op, path: path.to_path_buf(), source },
    }
}

/// Checks a range from the wire before any arithmetic or I/O uses it; returns its end.
fn check_range(ino: u64, offset: u64, len: u64) -> Result<u64, DataError> {
    match offset.checked_add(len) {
        Some(end) if end <= OBJECT_BYTES_MAX => Ok(end),
        _ => Err(DataError::OutOfRange { ino, offset, len }),
    }
}

pub struct ObjectStore {
    root: PathBuf,
    objects: PathBuf,
    locks: Arc<RangeLocks>,
    object_count: AtomicU64,
    /// Reads may map objects: false on a memory-backed file system, where a mapped hole on a full disk is SIGBUS
    /// (`sys::faults_allocate`).
    maps: bool,
    /// Mirror objects' epochs and holds (docs/format.md §32), checked under the range locks.
    fences: Fences,
}

/// A verified read served straight from the page cache: a read-only mapping of the object's blocks, the part of
/// it that was asked for, and the shared range lock that keeps writers and truncates off those blocks until this
/// is dropped (after the reply is sent). No copy of the payload is made in user space.
pub struct MappedRead {
    map: memmap2::Mmap,
    start: usize,
    len: usize,
    _guard: RangeGuard,
}

impl MappedRead {
    pub fn as_bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

impl ObjectStore {
    /// Opens (creating if needed) the store under `root` and counts its objects once.
    pub fn open(root: &Path) -> Result<ObjectStore, DataError> {
        let objects = root.join("objects");
        std::fs::create_dir_all(&objects).map_err(io_err("creating", &objects))?;
        let mut count = 0u64;
        for dir in std::fs::read_dir(&objects).map_err(io_err("listing", &objects))? {
            let dir = dir.map_err(io_err("listing", &objects))?.path();
            if !dir.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&dir).map_err(io_err("listing", &dir))? {
                let f = f.map_err(io_err("listing", &dir))?.path();
                if f.extension().is_none() {
                    count += 1;
                }
            }
        }
        let maps = !crate::sys::faults_allocate(&objects);
        if !maps {
            tracing::info!(root = %root.display(), "objects on a memory-backed file system: reads copy, never map");
        }
        let fences = Fences::open(root).map_err(io_err("loading the fence epoch in", root))?;
        Ok(ObjectStore {
            root: root.to_path_buf(),
            objects,
            locks: Arc::default(),
            object_count: count.into(),
            maps,
            fences,
        })
    }

    /// Where the object of `ino` lives (the sidecar adds `.crc`).
    pub fn object_path(&self, ino: u64) -> PathBuf {
        self.objects.join(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}"))
    }

    fn sidecar_path(&self, ino: u64) -> PathBuf {
        self.objects.join(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}.crc"))
    }

    /// Opens an object and its sidecar for writing, creating both (and counting the object) when new.
    fn open_for_write(&self, ino: u64) -> Result<(File, File), DataError> {
        let path = self.object_path(ino);
        let data = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let dir = path.parent().expect("object paths have a parent");
                std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
                match OpenOptions::new().read(true).write(true).create_new(true).open(&path) {
                    Ok(f) => {
                        self.object_count.fetch_add(1, Ordering::Relaxed);
                        f
                    }
                    // Another request created it first.
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                        OpenOptions::new().read(true).write(true).open(&path).map_err(io_err("opening", &path))?
                    }
                    Err(e) => return Err(io_err("creating", &path)(e)),
                }
            }
            Err(e) => return Err(io_err("opening", &path)(e)),
        };
        let side = self.sidecar_path(ino);
        let crc = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&side)
            .map_err(io_err("opening", &side))?;
        Ok((data, crc))
    }

    /// Stored checksums of blocks `first .. first + n`; those past the sidecar's end (or of a missing sidecar) are 0.
    fn read_crcs(&self, ino: u64, sidecar: Option<&File>, first: u64, n: usize) -> Result<Vec<u32>, DataError> {
        let mut raw = vec![0u8; n * CRC_BYTES as usize];
        if let Some(f) = sidecar {
            read_up_to(f, &mut raw, first * CRC_BYTES).map_err(io_err("reading", &self.sidecar_path(ino)))?;
        }
        Ok(raw.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
    }

    /// Reads block `b` of an object `obj_len` bytes long into `scratch` (zero-padded) and verifies it.
    fn read_verified_block(
        &self,
        ino: u64,
        f: &File,
        obj_len: u64,
        b: u64,
        stored: u32,
        scratch: &mut [u8; BLOCK_BYTES],
    ) -> Result<(), DataError> {
        let bs = b * B;
        let have = obj_len.saturating_sub(bs).min(B) as usize;
        scratch.fill(0);
        f.read_exact_at(&mut scratch[..have], bs).map_err(io_err("reading", &self.object_path(ino)))?;
        if stored_crc(scratch) != stored {
            return Err(DataError::Corrupt { ino, object_offset: bs, path: self.object_path(ino) });
        }
        Ok(())
    }

    /// The object's length in bytes (0 for a missing object).
    pub fn object_len(&self, ino: u64) -> Result<u64, DataError> {
        let path = self.object_path(ino);
        match std::fs::metadata(&path) {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(0),
            Err(e) => Err(io_err("stat", &path)(e)),
        }
    }

    /// Fills `buf` with the object's bytes at `offset`; past the object's end (or for a missing object) with
    /// zeros. Every block touched is verified against its checksum first.
    pub fn read(&self, ino: u64, offset: u64, buf: &mut [u8]) -> Result<(), DataError> {
        let len = buf.len() as u64;
        let end = check_range(ino, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let first = offset / B;
        let _g = self.locks.lock(ino, first * B, end.div_ceil(B) * B, false);
        self.read_locked(ino, offset, buf)
    }

    /// [`ObjectStore::read`] by a caller that holds a range lock covering the blocks of `[offset, offset + len)`.
    fn read_locked(&self, ino: u64, offset: u64, buf: &mut [u8]) -> Result<(), DataError> {
        let len = buf.len() as u64;
        let end = check_range(ino, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let first = offset / B;
        let path = self.object_path(ino);
        let f = match File::open(&path) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("opening", &path)(e)),
        };
        let obj_len = match &f {
            Some(f) => f.metadata().map_err(io_err("stat", &path))?.len(),
            None => 0,
        };
        let data_end = end.min(obj_len);
        let sidecar = self.open_sidecar(ino)?;
        if end > obj_len {
            // Zeros past the object's end only where no block was ever checksummed.
            self.check_lost_tail(ino, f.as_ref(), sidecar.as_ref(), obj_len, offset, end)?;
        }
        let Some(f) = f.filter(|_| offset < data_end) else {
            buf.fill(0);
            return Ok(());
        };
        let n = (data_end - offset) as usize;
        // The one read of the payload, straight into the buffer that will be sent.
        f.read_exact_at(&mut buf[..n], offset).map_err(io_err("reading", &path))?;
        buf[n..].fill(0);

        let last = data_end.div_ceil(B);
        let crcs = self.read_crcs(ino, sidecar.as_ref(), first, (last - first) as usize)?;
        let mut scratch = [0u8; BLOCK_BYTES];
        for (b, &stored) in (first..last).zip(&crcs) {
            let bs = b * B;
            if bs >= offset && bs + B <= end {
                // Whole block inside the buffer, zero-padded past the object's end as the checksum expects.
                let i = (bs - offset) as usize;
                if stored_crc(&buf[i..i + BLOCK_BYTES]) != stored {
                    return Err(DataError::Corrupt { ino, object_offset: bs, path });
                }
            } else {
                // An edge block only partly requested: verify all of it (one extra 4 KiB read, no copy).
                self.read_verified_block(ino, &f, obj_len, b, stored, &mut scratch)?;
                let lo = bs.max(offset);
                let hi = (bs + B).min(data_end);
                if buf[(lo - offset) as usize..(hi - offset) as usize]
                    != scratch[(lo - bs) as usize..(hi - bs) as usize]
                {
                    // Cannot happen under the range lock unless the disk changed under us: refuse, do not guess.
                    return Err(DataError::Corrupt { ino, object_offset: bs, path });
                }
            }
        }
        Ok(())
    }

    /// Verifies `[offset, offset + len)` of the object against its sidecar without returning its bytes (scrub,
    /// docs/format.md §20): the object's length and the object offsets of the blocks that fail, ascending, at most
    /// `bad_max` of them (`true` when there were more). A block fails when its bytes do not match its stored
    /// checksum, or when it lies wholly past the object's end with a non-zero stored checksum (written, then lost).
    /// Reads in 1 MiB pieces, each under a shared range lock, so writers wait for one piece at most.
    pub fn verify(&self, ino: u64, offset: u64, len: u64, bad_max: usize) -> Result<(u64, Vec<u64>, bool), DataError> {
        let end = check_range(ino, offset, len)?;
        let path = self.object_path(ino);
        let mut bad = Vec::new();
        let mut more = false;
        const PIECE: u64 = 1 << 20;
        let mut buf = vec![0u8; PIECE as usize];
        let mut obj_len = self.object_len(ino)?;
        let mut at = offset / B * B;
        while at < end {
            let piece_end = (at + PIECE).min(end.div_ceil(B) * B);
            let _g = self.locks.lock(ino, at, piece_end, false);
            let f = match File::open(&path) {
                Ok(f) => Some(f),
                Err(e) if e.kind() == ErrorKind::NotFound => None,
                Err(e) => return Err(io_err("opening", &path)(e)),
            };
            obj_len = match &f {
                Some(f) => f.metadata().map_err(io_err("stat", &path))?.len(),
                None => 0,
            };
            let sidecar = self.open_sidecar(ino)?;
            let n = ((piece_end - at) / B) as usize;
            let crcs = self.read_crcs(ino, sidecar.as_ref(), at / B, n)?;
            let have = piece_end.min(obj_len).saturating_sub(at) as usize;
            let chunk = &mut buf[..(piece_end - at) as usize];
            chunk.fill(0);
            if let Some(f) = &f
                && have > 0
            {
                f.read_exact_at(&mut chunk[..have], at).map_err(io_err("reading", &path))?;
            }
            for (i, &stored) in crcs.iter().enumerate() {
                let bs = at + i as u64 * B;
                let ok = if bs >= obj_len {
                    stored == 0
                } else {
                    stored_crc(&chunk[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES]) == stored
                };
                if !ok {
                    if bad.len() < bad_max {
                        bad.push(bs);
                    } else {
                        more = true;
                    }
                }
            }
            at = piece_end;
        }
        Ok((obj_len, bad, more))
    }

    /// Before zeros are returned for `[offset, end)` past the object's end (`obj_len`, 0 for a missing object):
    /// every block wholly past the end must have stored checksum 0 (never written), and the partly filled block
    /// holding the end, when the read touches it, must verify. A block the sidecar says was written but whose bytes
    /// are not there was lost (the data's pages never reached the disk before a crash, or the file was cut): the
    /// read fails with [`DataError::Lost`] instead of returning zeros.
    fn check_lost_tail(
        &self,
        ino: u64,
        f: Option<&File>,
        sidecar: Option<&File>,
        obj_len: u64,
        offset: u64,
        end: u64,
    ) -> Result<(), DataError> {
        let Some(sidecar) = sidecar else { return Ok(()) };
        let first = offset.max(obj_len) / B;
        let last = end.div_ceil(B);
        let crcs = self.read_crcs(ino, Some(sidecar), first, (last - first) as usize)?;
        let mut scratch = [0u8; BLOCK_BYTES];
        for (b, &stored) in (first..last).zip(&crcs) {
            let bs = b * B;
            let lost = || DataError::Lost { ino, object_offset: bs, obj_len, path: self.object_path(ino) };
            if bs >= obj_len {
                if stored != 0 {
                    return Err(lost());
                }
            } else if let Some(f) = f
                && offset >= obj_len
            {
                // The block holding the end, not verified by the caller (it reads none of its bytes).
                self.read_verified_block(ino, f, obj_len, b, stored, &mut scratch).map_err(|e| match e {
                    DataError::Corrupt { .. } => lost(),
                    other => other,
                })?;
            }
        }
        Ok(())
    }

    /// The sidecar for reading, if there is one (a missing sidecar means every block is expected to be zeros).
    fn open_sidecar(&self, ino: u64) -> Result<Option<File>, DataError> {
        match File::open(self.sidecar_path(ino)) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("opening", &self.sidecar_path(ino))(e)),
        }
    }

    /// Like [`ObjectStore::read`], but without copying: maps the blocks covering the range, verifies them, and
    /// returns the mapping. `Ok(None)` when the range is not entirely inside the object (a hole at the end, a
    /// missing object), or the objects live on a memory-backed file system: the caller then uses `read`, which
    /// fills zeros.
    pub fn read_mapped(&self, ino: u64, offset: u64, len: u64) -> Result<Option<MappedRead>, DataError> {
        let end = check_range(ino, offset, len)?;
        if len == 0 || !self.maps {
            return Ok(None);
        }
        let first = offset / B;
        let last = end.div_ceil(B);
        let guard = self.locks.lock(ino, first * B, last * B, false);
        let path = self.object_path(ino);
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("opening", &path)(e)),
        };
        let obj_len = f.metadata().map_err(io_err("stat", &path))?.len();
        if end > obj_len {
            return Ok(None);
        }
        let map_start = first * B;
        let map_len = ((last * B).min(obj_len) - map_start) as usize;
        let map = crate::sys::map_populated(&f, map_start, map_len).map_err(io_err("mapping", &path))?;
        let sidecar = self.open_sidecar(ino)?;
        let crcs = self.read_crcs(ino, sidecar.as_ref(), first, (last - first) as usize)?;
        for (block, (b, &stored)) in map.chunks(BLOCK_BYTES).zip((first..last).zip(&crcs)) {
            // A short last block is the object's end: stored_crc pads it with zeros, as the format says.
            if stored_crc(block) != stored {
                return Err(DataError::Corrupt { ino, object_offset: b * B, path });
            }
        }
        Ok(Some(MappedRead { map, start: (offset - map_start) as usize, len: len as usize, _guard: guard }))
    }

    /// Writes `data` at `offset` of the object, creating it if needed, and updates the checksums of every block
    /// touched. A partly overwritten block is verified before it is merged, so corruption is never re-blessed.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<(), DataError> {
        self.write_fenced(ino, offset, data, WriteFence::NONE)
    }

    /// [`ObjectStore::write`] admitted by the object's write fence (docs/format.md §32) under the write's lock.
    pub fn write_fenced(&self, ino: u64, offset: u64, data: &[u8], fence: WriteFence) -> Result<(), DataError> {
        let len = data.len() as u64;
        let end = check_range(ino, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let _g = self.locks.lock(ino, offset / B * B, end.div_ceil(B) * B, true);
        self.fences.admit(ino, (offset, end), fence)?;
        self.write_locked(ino, offset, data)
    }

    /// Does `act` on the object's write fence (docs/format.md §32) once the writes in progress on it are done: under
    /// an exclusive lock of the whole object, so the fence falls between two writes, never inside one.
    pub fn fence(&self, ino: u64, act: FenceAct) -> Result<FenceResp, DataError> {
        let _g = self.locks.lock(ino, 0, OBJECT_BYTES_MAX + B, true);
        Ok(self.fences.fence(ino, act)?)
    }

    /// [`ObjectStore::write`] by a caller that holds an exclusive range lock covering its blocks.
    fn write_locked(&self, ino: u64, offset: u64, data: &[u8]) -> Result<(), DataError> {
        let len = data.len() as u64;
        let end = check_range(ino, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let first = offset / B;
        let last = end.div_ceil(B);
        let (f, side) = self.open_for_write(ino)?;
        let path = self.object_path(ino);
        let obj_len = f.metadata().map_err(io_err("stat", &path))?.len();
        let n = (last - first) as usize;
        let old = if !offset.is_multiple_of(B) || end % B != 0 {
            self.read_crcs(ino, Some(&side), first, n)?
        } else {
            Vec::new()
        };
        let mut crcs = Vec::with_capacity(n * CRC_BYTES as usize);
        let mut scratch = [0u8; BLOCK_BYTES];
        for (i, b) in (first..last).enumerate() {
            let bs = b * B;
            let crc = if bs >= offset && bs + B <= end {
                let j = (bs - offset) as usize;
                stored_crc(&data[j..j + BLOCK_BYTES])
            } else {
                if bs < obj_len {
                    self.read_verified_block(ino, &f, obj_len, b, old[i], &mut scratch)?;
                } else if old[i] != 0 {
                    // Written once, gone now: merging zeros in would bless the loss.
                    return Err(DataError::Lost { ino, object_offset: bs, obj_len, path });
                } else {
                    scratch.fill(0);
                }
                let lo = bs.max(offset);
                let hi = (bs + B).min(end);
                // Copies at most two partial blocks per request, to checksum the merged block.
                scratch[(lo - bs) as usize..(hi - bs) as usize]
                    .copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
                stored_crc(&scratch)
            };
            crcs.extend_from_slice(&crc.to_le_bytes());
        }
        // Reserve before changing anything: a full disk fails here, with every block and checksum as it was.
        let side_path = self.sidecar_path(ino);
        crate::sys::reserve(&side, first * CRC_BYTES, crcs.len() as u64).map_err(io_err("reserving", &side_path))?;
        crate::sys::reserve(&f, offset, len).map_err(io_err("reserving", &path))?;
        if let Err(e) = f.write_all_at(data, offset) {
            self.undo_append(&f, ino, obj_len, offset, end);
            return Err(io_err("writing", &path)(e));
        }
        if weft_rpc::fault::skip_sidecar_update() {
            // Tests only (`WEFT_FAULT=skip-sidecar:N`): a crash between the data write and its checksums.
            return Ok(());
        }
        if let Err(e) = side.write_all_at(&crcs, first * CRC_BYTES) {
            // Into reserved blocks, so only a copy-on-write file system gets here: the appended part goes again;
            // overwritten blocks keep their old checksums and read `Corrupt`, never wrong bytes.
            self.undo_append(&f, ino, obj_len, offset, end);
            return Err(io_err("writing", &side_path)(e));
        }
        Ok(())
    }

    /// After a failed write of `[offset, end)` to an object that was `obj_len` bytes long: deallocates what the write
    /// may have put past the old end, so it reads as zeros again, which the untouched checksums there (zero: never
    /// written, or the zero-padded old last block) expect. The object's length may stay longer (a hole).
    fn undo_append(&self, f: &File, ino: u64, obj_len: u64, offset: u64, end: u64) {
        let from = offset.max(obj_len);
        if from >= end {
            return;
        }
        match crate::sys::punch_hole(f, from, end - from) {
            Ok(true) => {}
            Ok(false) => tracing::warn!(ino, from, end, "cannot punch out a failed write's appended bytes here"),
            Err(e) => tracing::warn!(ino, from, end, "punching out a failed write's appended bytes: {e}"),
        }
    }

    /// Sets the object's length to `size`: bytes past it are gone (a later extension reads zeros).
    pub fn truncate(&self, ino: u64, size: u64) -> Result<(), DataError> {
        self.truncate_fenced(ino, size, WriteFence::NONE)
    }

    /// [`ObjectStore::truncate`] admitted by the object's write fence (docs/format.md §32) under the cut's lock.
    pub fn truncate_fenced(&self, ino: u64, size: u64, fence: WriteFence) -> Result<(), DataError> {
        check_range(ino, size, 0)?;
        let b = size / B;
        let _g = self.locks.lock(ino, b * B, OBJECT_BYTES_MAX + B, true);
        self.fences.admit(ino, (size, u64::MAX), fence)?;
        let path = self.object_path(ino);
        if size == 0 && !path.exists() {
            return Ok(());
        }
        let (f, side) = self.open_for_write(ino)?;
        let obj_len = f.metadata().map_err(io_err("stat", &path))?.len();
        if size < obj_len && !size.is_multiple_of(B) {
            // The new last block keeps a prefix of its bytes: checksum it as zero-padded from the cut on.
            let stored = self.read_crcs(ino, Some(&side), b, 1)?[0];
            let mut scratch = [0u8; BLOCK_BYTES];
            self.read_verified_block(ino, &f, obj_len, b, stored, &mut scratch)?;
            scratch[(size - b * B) as usize..].fill(0);
            side.write_all_at(&stored_crc(&scratch).to_le_bytes(), b * CRC_BYTES)
                .map_err(io_err("writing", &self.sidecar_path(ino)))?;
        }
        f.set_len(size).map_err(io_err("truncating", &path))?;
        side.set_len(size.div_ceil(B) * CRC_BYTES).map_err(io_err("truncating", &self.sidecar_path(ino)))?;
        self.truncate_versions(ino, size)
    }

    /// Makes the object's data, its checksums and its directory entry durable. A missing object succeeds.
    pub fn fsync(&self, ino: u64) -> Result<(), DataError> {
        let path = self.object_path(ino);
        let side = self.sidecar_path(ino);
        for p in [&path, &side] {
            match File::open(p) {
                Ok(f) => f.sync_data().map_err(io_err("syncing", p))?,
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(io_err("opening", p)(e)),
            }
        }
        let versions = self.versions_path(ino);
        match File::open(&versions) {
            Ok(f) => f.sync_data().map_err(io_err("syncing", &versions))?,
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("opening", &versions)(e)),
        }
        // A new object's name lives in its fan-out directory: sync that too, or a crash may lose the file.
        let dir = path.parent().expect("object paths have a parent");
        File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("syncing", dir))
    }

    /// Deletes the object and its sidecar; removing a missing object succeeds (the MDS's collector retries).
    pub fn remove(&self, ino: u64) -> Result<(), DataError> {
        let _g = self.locks.lock(ino, 0, OBJECT_BYTES_MAX + B, true);
        let path = self.object_path(ino);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                self.object_count.fetch_sub(1, Ordering::Relaxed);
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("removing", &path)(e)),
        }
        for side in [self.sidecar_path(ino), self.versions_path(ino)] {
            match std::fs::remove_file(&side) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("removing", &side)(e)),
            }
        }
        Ok(())
    }

    /// Up to `limit` inode numbers above `after` that have an object here, ascending, and whether none follow
    /// (`ListObjects`, docs/format.md §19). Walks the object directories, keeping only the `limit + 1` lowest in
    /// memory; names that are not an object's (sidecars, temporary files) are skipped.
    pub fn list_objects(&self, after: u64, limit: usize) -> Result<(Vec<u64>, bool), DataError> {
        let mut lowest = std::collections::BTreeSet::new();
        for dir in std::fs::read_dir(&self.objects).map_err(io_err("listing", &self.objects))? {
            let dir = dir.map_err(io_err("listing", &self.objects))?.path();
            if !dir.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&dir).map_err(io_err("listing", &dir))? {
                let name = f.map_err(io_err("listing", &dir))?.file_name();
                let Some(name) = name.to_str().filter(|n| n.len() == 16) else { continue };
                let Ok(ino) = u64::from_str_radix(name, 16) else { continue };
                if ino > after {
                    lowest.insert(ino);
                    if lowest.len() > limit.saturating_add(1) {
                        lowest.pop_last();
                    }
                }
            }
        }
        let eof = lowest.len() <= limit;
        Ok((lowest.into_iter().take(limit).collect(), eof))
    }

    /// Space of the file system under the root, and the number of objects.
    pub fn space(&self) -> Result<SpaceStat, DataError> {
        let (bytes_total, bytes_free) = crate::sys::space(&self.root).map_err(io_err("statvfs", &self.root))?;
        Ok(SpaceStat { bytes_total, bytes_free, objects: self.object_count.load(Ordering::Relaxed) })
    }

    /// [`ObjectStore::space`] with the identity of the file system under the root, so servers sharing a disk are
    /// counted once (`weft_proto::space`).
    pub fn space_dev(&self) -> Result<SpaceStatDev, DataError> {
        let space = self.space()?;
        let (dev, fsid) = crate::sys::device(&self.root).map_err(io_err("statvfs", &self.root))?;
        Ok(SpaceStatDev { space, device: DeviceId { host_id: weft_fabric::host_id(), dev, fsid } })
    }
}

/// Reads as much of `buf` as the file has at `offset`; the rest is left as it is.
fn read_up_to(f: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(k) => done += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(name: &str) -> (ObjectStore, PathBuf) {
        let dir = std::env::temp_dir().join(format!("weft-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (ObjectStore::open(&dir).unwrap(), dir)
    }

    fn bytes(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    fn read(s: &ObjectStore, ino: u64, off: u64, len: usize) -> Result<Vec<u8>, DataError> {
        let mut v = vec![0xEE; len];
        s.read(ino, off, &mut v).map(|()| v)
    }

    #[test]
    fn list_objects_pages_in_inode_order_and_skips_sidecars() {
        let (s, dir) = store("list");
        for ino in [0x305u64, 7, 0x107, 9, 0x1ff] {
            s.write(ino, 0, b"x").unwrap();
        }
        // Not objects: a stray file with a short name and one that is not hex.
        std::fs::write(dir.join("objects/07/junk"), b"").unwrap();
        std::fs::write(dir.join("objects/07/zzzzzzzzzzzzzzzz"), b"").unwrap();
        assert_eq!(s.list_objects(0, 2).unwrap(), (vec![7, 9], false));
        assert_eq!(s.list_objects(9, 2).unwrap(), (vec![0x107, 0x1ff], false));
        assert_eq!(s.list_objects(0x1ff, 2).unwrap(), (vec![0x305], true));
        assert_eq!(s.list_objects(0x305, 2).unwrap(), (vec![], true));
        assert!(s.list_objects(0, 5).unwrap().1, "exactly the limit left: eof");
        s.remove(9).unwrap();
        assert_eq!(s.list_objects(7, 1).unwrap(), (vec![0x107], false));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unaligned_writes_merge_and_read_back() {
        let (s, dir) = store("merge");
        let mut model = vec![0u8; 20_000];
        for (off, len, seed) in [(0u64, 10_000usize, 1u8), (5_000, 7_000, 2), (4_095, 2, 3), (15_000, 5_000, 4)] {
            let d = bytes(seed, len);
            s.write(9, off, &d).unwrap();
            model[off as usize..off as usize + len].copy_from_slice(&d);
        }
        assert_eq!(read(&s, 9, 0, 20_000).unwrap(), model);
        assert_eq!(read(&s, 9, 4_000, 300).unwrap(), &model[4_000..4_300]);
        // Past the end: zeros, and a missing object reads as zeros.
        assert_eq!(read(&s, 9, 19_990, 20).unwrap()[10..], [0u8; 10]);
        assert_eq!(read(&s, 10, 0, 5).unwrap(), vec![0; 5]);
        assert_eq!(s.space().unwrap().objects, 1);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_flipped_byte_is_reported_with_its_block_never_returned() {
        let (s, dir) = store("flip");
        s.write(3, 0, &bytes(5, 3 * BLOCK_BYTES)).unwrap();
        let p = s.object_path(3);
        let mut raw = std::fs::read(&p).unwrap();
        raw[BLOCK_BYTES + 17] ^= 1;
        std::fs::write(&p, raw).unwrap();
        assert!(read(&s, 3, 0, BLOCK_BYTES).is_ok(), "other blocks stay readable");
        for (off, len) in [(0, 3 * BLOCK_BYTES), (BLOCK_BYTES as u64 + 100, 10)] {
            match read(&s, 3, off, len) {
                Err(DataError::Corrupt { ino: 3, object_offset, .. }) => assert_eq!(object_offset, B),
                other => panic!("expected Corrupt, got {other:?}"),
            }
        }
        // A partial write into the corrupt block is refused rather than re-checksummed.
        assert!(matches!(s.write(3, B + 1, b"x"), Err(DataError::Corrupt { .. })));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn mapped_reads_verify_and_fall_back_past_the_end() {
        let (s, dir) = store("mapped");
        let d = bytes(3, 10_000);
        s.write(4, 0, &d).unwrap();
        let m = s.read_mapped(4, 100, 9_900).unwrap().expect("inside the object");
        assert_eq!(m.as_bytes(), &d[100..]);
        drop(m);
        assert!(s.read_mapped(4, 9_000, 2_000).unwrap().is_none(), "past the end: the copying path fills zeros");
        assert!(s.read_mapped(5, 0, 10).unwrap().is_none(), "missing object");
        let p = s.object_path(4);
        let mut raw = std::fs::read(&p).unwrap();
        raw[9_999] ^= 0x40;
        std::fs::write(&p, raw).unwrap();
        match s.read_mapped(4, 0, 100) {
            Ok(Some(_)) => {}
            other => panic!("block 0 is intact: {:?}", other.err()),
        }
        assert!(s.read_mapped(4, 8_000, 10).unwrap().is_some(), "block 1 is intact");
        match s.read_mapped(4, 9_000, 10) {
            Err(DataError::Corrupt { object_offset, .. }) => assert_eq!(object_offset, 2 * B),
            other => panic!("expected Corrupt, got {:?}", other.map(|m| m.map(|m| m.as_bytes().len()))),
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn truncate_cuts_and_extension_reads_zeros() {
        let (s, dir) = store("trunc");
        let d = bytes(7, 10_000);
        s.write(1, 0, &d).unwrap();
        s.truncate(1, 5_000).unwrap();
        assert_eq!(std::fs::metadata(s.object_path(1)).unwrap().len(), 5_000);
        s.truncate(1, 9_000).unwrap();
        let back = read(&s, 1, 0, 10_000).unwrap();
        assert_eq!(&back[..5_000], &d[..5_000]);
        assert!(back[5_000..].iter().all(|&b| b == 0));
        // Writing after a gap keeps the old last block's checksum valid.
        s.write(1, 50_000, b"tail").unwrap();
        s.fsync(1).unwrap();
        s.fsync(999).expect("a missing object is trivially durable");
        assert_eq!(&read(&s, 1, 49_998, 6).unwrap(), b"\0\0tail");
        assert_eq!(&read(&s, 1, 0, 5_000).unwrap()[..], &d[..5_000]);
        s.remove(1).unwrap();
        s.remove(1).unwrap();
        assert_eq!(s.space().unwrap().objects, 0);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// An object cut shorter than what its sidecar checksums (its tail lost in a crash) reads as an error for the
    /// lost blocks, never as zeros; what is still there reads; a hole that was never written reads as zeros.
    #[test]
    fn bytes_lost_past_the_end_are_an_error_not_zeros() {
        let (s, dir) = store("lost");
        let d = bytes(9, 3 * BLOCK_BYTES);
        s.write(2, 0, &d).unwrap();
        s.write(2, 20 * B, b"far").unwrap();
        s.truncate(2, 3 * B).unwrap();
        // A hole after a truncate that extends: zeros, as before.
        s.truncate(2, 8 * B).unwrap();
        assert_eq!(read(&s, 2, 4 * B, 100).unwrap(), vec![0; 100]);
        s.truncate(2, 3 * B).unwrap();
        // Lose everything past 5000 bytes, as a crash that lost the data's pages but not the sidecar's would.
        OpenOptions::new().write(true).open(s.object_path(2)).unwrap().set_len(5_000).unwrap();
        assert_eq!(read(&s, 2, 0, 4_096).unwrap(), &d[..4_096], "block 0 is intact");
        for (off, len) in [(0u64, 3 * BLOCK_BYTES), (6_000, 1_000), (2 * B, 10), (4_096, 500)] {
            match read(&s, 2, off, len) {
                Err(e @ DataError::Lost { .. }) | Err(e @ DataError::Corrupt { .. }) => {
                    let w = WireError::from(e);
                    assert_eq!(w.code, ErrorCode::Corrupt, "{off}+{len}");
                    assert!(w.offset.is_some_and(|o| o == B || o == 2 * B), "{off}+{len}: {w:?}");
                }
                other => panic!("{off}+{len}: expected an error for lost bytes, got {:?}", other.map(|v| v.len())),
            }
        }
        // A partial write into a lost block is refused rather than blessing its zeros.
        assert!(matches!(s.write(2, 2 * B + 10, b"x"), Err(DataError::Lost { .. })));
        // Past the sidecar's end: never written, zeros.
        assert_eq!(read(&s, 2, 10 * B, 10).unwrap(), vec![0; 10]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// `verify` names corrupt blocks and blocks lost past the end without returning bytes, and passes holes.
    #[test]
    fn verify_names_corrupt_and_lost_blocks() {
        let (s, dir) = store("verify");
        s.write(6, 0, &bytes(4, 4 * BLOCK_BYTES)).unwrap();
        s.write(6, 10 * B, b"far").unwrap();
        assert_eq!(s.verify(6, 0, 11 * B, 16).unwrap(), (10 * B + 3, vec![], false), "a hole verifies");
        let p = s.object_path(6);
        let mut raw = std::fs::read(&p).unwrap();
        raw[B as usize + 5] ^= 1;
        raw[3 * BLOCK_BYTES] ^= 1;
        std::fs::write(&p, raw).unwrap();
        assert_eq!(s.verify(6, 0, 11 * B, 16).unwrap(), (10 * B + 3, vec![B, 3 * B], false));
        assert_eq!(s.verify(6, 100, 10, 16).unwrap().1, Vec::<u64>::new(), "block 0 alone is intact");
        assert_eq!(s.verify(6, 0, 11 * B, 1).unwrap(), (10 * B + 3, vec![B], true), "bounded list");
        // The tail lost with a crash: the block at 10·4096 was written, its bytes are gone.
        OpenOptions::new().write(true).open(&p).unwrap().set_len(4 * B).unwrap();
        assert_eq!(s.verify(6, 0, 12 * B, 16).unwrap(), (4 * B, vec![B, 3 * B, 10 * B], false));
        assert!(matches!(s.verify(6, OBJECT_BYTES_MAX, 1, 16), Err(DataError::OutOfRange { .. })));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ranges_past_the_object_limit_are_refused_before_io() {
        let (s, dir) = store("range");
        assert!(matches!(s.write(1, OBJECT_BYTES_MAX, b"x"), Err(DataError::OutOfRange { .. })));
        assert!(matches!(read(&s, 1, u64::MAX - 1, 4), Err(DataError::OutOfRange { .. })));
        assert!(matches!(s.truncate(1, u64::MAX), Err(DataError::OutOfRange { .. })));
        assert!(!s.object_path(1).exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
