//! The metadata redo journal: a write-ahead log in front of redb that makes a mutation durable with one
//! `fdatasync` of an appended record instead of a durable redb commit (see ARCHITECTURE.md, "On-disk formats").
//!
//! Why: a durable redb commit rewrites and fsyncs B-tree pages and both commit slots (~3.7 ms here), while an
//! `fdatasync` of a few KiB appended into already-written space costs ~140 µs. So each transaction commits to
//! redb without an fsync and appends its *physical* redo record (keys and values, never logical ops) here;
//! concurrent transactions share one `fdatasync` (group commit). A checkpoint (a durable redb commit that also
//! stores the last applied LSN) runs in the background and lets old segments go; recovery replays the entries
//! after the checkpoint's LSN.
//!
//! Format (little-endian). A segment file `NNNNNNNNNNNNNNNN.wlog` (its sequence number in hex) starts with
//! `magic "WEFTJNL1" | seq u64 | first_lsn u64 | reserved u32 | crc32c u32` (32 bytes) followed by entries:
//! `magic u32 | len u32 | seg u64 | lsn u64 | synced_lsn u64 | crc32c u32 | payload[len]`. The CRC covers the
//! header from `len` on and the payload; `seg` must equal the segment's `seq`, so the stale entries a recycled
//! segment still holds past its new tail are never mistaken for live ones. `synced_lsn` says every entry up to it
//! was durable (acknowledged) before this one was written: recovery uses it to tell a torn, never acknowledged
//! tail (stop there) from a damaged acknowledged entry followed by good ones (refuse to start).
//!
//! Invariants: LSNs are consecutive across segments; entries of one segment are in LSN order; a segment is rolled
//! only after everything written to the previous one is durable; a segment is freed only once a checkpoint covers
//! all its entries.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use weft_rpc::metrics::prometheus_client::metrics::counter::Counter;
use weft_rpc::metrics::prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::error::MetaError;

/// Bytes of a segment file's header.
pub const SEG_HEADER_BYTES: usize = 32;
/// Bytes of an entry's header (before its payload).
pub const ENTRY_HEADER_BYTES: usize = 36;
/// Largest payload of one entry (one transaction's redo records): far above any single metadata op, and a
/// 10,000-create batch is ~2 MiB. A length above this is damage, not data.
pub const ENTRY_PAYLOAD_MAX: usize = 64 << 20;

const SEG_MAGIC: [u8; 8] = *b"WEFTJNL1";
const ENTRY_MAGIC: [u8; 4] = *b"WJE1";
const SEG_SUFFIX: &str = "wlog";
/// Spare (preallocated, or freed and recycled) segments kept for reuse; more freed ones are deleted.
const SPARES_MAX: usize = 2;

/// Limits of the journal, from the MDS config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalConfig {
    /// Size a segment is preallocated to (zero-filled, so an append's `fdatasync` need not update the file size
    /// or convert unwritten extents). An entry that does not fit starts the next segment.
    pub segment_bytes: u64,
    /// Journal bytes not yet covered by a checkpoint above which new transactions wait for a checkpoint.
    pub journal_bytes_max: u64,
    /// Journal bytes since the last checkpoint that trigger the next one.
    pub checkpoint_bytes: u64,
    /// Longest time a journaled change waits for a checkpoint (bounds replay time and redb's non-durable backlog).
    pub checkpoint_interval_ms: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            segment_bytes: 16 << 20,
            journal_bytes_max: 256 << 20,
            checkpoint_bytes: 32 << 20,
            checkpoint_interval_ms: 2000,
        }
    }
}

impl JournalConfig {
    fn validate(&self) -> Result<(), MetaError> {
        let bad = |what: &str| Err(MetaError::Store(format!("journal config: {what}")));
        if self.segment_bytes < 64 << 10 {
            return bad("journal_segment_bytes must be at least 64 KiB");
        }
        if self.checkpoint_bytes == 0 || self.checkpoint_interval_ms == 0 {
            return bad("checkpoint_bytes and checkpoint_interval_ms must be positive");
        }
        if self.journal_bytes_max < self.checkpoint_bytes.saturating_add(self.segment_bytes) {
            return bad("journal_bytes_max must be at least checkpoint_bytes + journal_segment_bytes");
        }
        Ok(())
    }
}

// ---- Framing ----------------------------------------------------------------------------------------------------

/// One intact entry as decoded from a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    pub lsn: u64,
    pub synced_lsn: u64,
    pub payload: &'a [u8],
}

/// Why the bytes at a position are not an intact entry of the segment (see [`decode_entry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EntryError {
    /// Fewer bytes than a header, or than the header says: a torn tail or the segment's end.
    #[error("fewer bytes than the entry's header or length: a torn tail or the segment's end")]
    Short,
    /// The header is all zeros: the unwritten, preallocated part of a segment.
    #[error("an all-zero header: the unwritten part of the segment")]
    Zeros,
    #[error("no entry magic")]
    BadMagic,
    #[error("the entry's length exceeds the largest payload")]
    TooLong,
    #[error("the entry's checksum does not match")]
    BadCrc,
    /// An intact entry of an earlier use of this (recycled) file.
    #[error("an intact entry of an earlier use of this segment file")]
    OtherSegment,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Appends one framed entry to `out`.
pub fn encode_entry(out: &mut Vec<u8>, seg: u64, lsn: u64, synced_lsn: u64, payload: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&ENTRY_MAGIC);
    // Payloads are bounded by ENTRY_PAYLOAD_MAX (checked by the caller), so the length fits.
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&seg.to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(&synced_lsn.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[start + 4..]), payload);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
}

/// Decodes the entry at the start of `buf` if it is intact and belongs to segment `seg`; returns it and its
/// framed length.
pub fn decode_entry(buf: &[u8], seg: u64) -> Result<(Entry<'_>, usize), EntryError> {
    if buf.len() < ENTRY_HEADER_BYTES {
        return Err(if buf.iter().all(|&b| b == 0) { EntryError::Zeros } else { EntryError::Short });
    }
    let header = &buf[..ENTRY_HEADER_BYTES];
    if header[..4] != ENTRY_MAGIC {
        return Err(if header.iter().all(|&b| b == 0) { EntryError::Zeros } else { EntryError::BadMagic });
    }
    let len = u32_at(header, 4) as usize;
    if len > ENTRY_PAYLOAD_MAX {
        return Err(EntryError::TooLong);
    }
    let total = ENTRY_HEADER_BYTES + len;
    if buf.len() < total {
        return Err(EntryError::Short);
    }
    let payload = &buf[ENTRY_HEADER_BYTES..total];
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[4..32]), payload);
    if crc != u32_at(header, 32) {
        return Err(EntryError::BadCrc);
    }
    if u64_at(header, 8) != seg {
        return Err(EntryError::OtherSegment);
    }
    Ok((Entry { lsn: u64_at(header, 16), synced_lsn: u64_at(header, 24), payload }, total))
}

fn encode_seg_header(seq: u64, first_lsn: u64) -> [u8; SEG_HEADER_BYTES] {
    let mut h = [0u8; SEG_HEADER_BYTES];
    h[..8].copy_from_slice(&SEG_MAGIC);
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..24].copy_from_slice(&first_lsn.to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The segment's `(seq, first_lsn)`; `Ok(None)` for a file whose header was never written (all zeros, or too
/// short), which holds nothing.
pub fn decode_seg_header(buf: &[u8]) -> Result<Option<(u64, u64)>, MetaError> {
    if buf.len() < SEG_HEADER_BYTES {
        return Ok(None);
    }
    let h = &buf[..SEG_HEADER_BYTES];
    if h.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    if h[..8] != SEG_MAGIC {
        return Err(MetaError::Corrupt("journal segment: unknown magic or format version".into()));
    }
    if crc32c::crc32c(&h[..28]) != u32_at(h, 28) {
        return Err(MetaError::Corrupt("journal segment: header checksum mismatch".into()));
    }
    Ok(Some((u64_at(h, 8), u64_at(h, 16))))
}

// ---- Redo records -------------------------------------------------------------------------------------------------

/// One physical change to one table, as recorded in an entry's payload. Replaying these needs no clock, no
/// allocation and no reads, so it is deterministic, and idempotent as a sequence (every value is absolute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redo<'a> {
    PutInode { ino: u64, record: &'a [u8] },
    DelInode { ino: u64 },
    PutDirent { parent: u64, name: &'a str, ino: u64, kind: u8 },
    DelDirent { parent: u64, name: &'a str },
    PutServer { id: u32, addr: &'a str },
    PutServerPhase { id: u32, phase: u8 },
    PutOrphan { ino: u64, record: &'a [u8] },
    DelOrphan { ino: u64 },
    PutCounter { key: u32, value: u64 },
    PutXattr { ino: u64, name: &'a str, value: &'a [u8] },
    DelXattr { ino: u64, name: &'a str },
    PutStale { ino: u64, slot: u32, record: &'a [u8] },
    DelStale { ino: u64, slot: u32 },
}

const OP_PUT_INODE: u8 = 1;
const OP_DEL_INODE: u8 = 2;
const OP_PUT_DIRENT: u8 = 3;
const OP_DEL_DIRENT: u8 = 4;
const OP_PUT_SERVER: u8 = 5;
const OP_PUT_ORPHAN: u8 = 6;
const OP_DEL_ORPHAN: u8 = 7;
const OP_PUT_COUNTER: u8 = 8;
const OP_PUT_XATTR: u8 = 9;
const OP_DEL_XATTR: u8 = 10;
const OP_PUT_SERVER_PHASE: u8 = 11;
// Stale ranges (§18) take 30–31, apart from the codes other tables of this round may add.
const OP_PUT_STALE: u8 = 30;
const OP_DEL_STALE: u8 = 31;

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Values are inode records, names and addresses: far below 4 GiB (entries are capped at 64 MiB).
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Appends one redo record to a transaction's payload.
pub fn encode_redo(out: &mut Vec<u8>, r: &Redo<'_>) {
    match *r {
        Redo::PutInode { ino, record } => {
            out.push(OP_PUT_INODE);
            out.extend_from_slice(&ino.to_le_bytes());
            put_bytes(out, record);
        }
        Redo::DelInode { ino } => {
            out.push(OP_DEL_INODE);
            out.extend_from_slice(&ino.to_le_bytes());
        }
        Redo::PutDirent { parent, name, ino, kind } => {
            out.push(OP_PUT_DIRENT);
            out.extend_from_slice(&parent.to_le_bytes());
            put_bytes(out, name.as_bytes());
            out.extend_from_slice(&ino.to_le_bytes());
            out.push(kind);
        }
        Redo::DelDirent { parent, name } => {
            out.push(OP_DEL_DIRENT);
            out.extend_from_slice(&parent.to_le_bytes());
            put_bytes(out, name.as_bytes());
        }
        Redo::PutServer { id, addr } => {
            out.push(OP_PUT_SERVER);
            out.extend_from_slice(&id.to_le_bytes());
            put_bytes(out, addr.as_bytes());
        }
        Redo::PutServerPhase { id, phase } => {
            out.push(OP_PUT_SERVER_PHASE);
            out.extend_from_slice(&id.to_le_bytes());
            out.push(phase);
        }
        Redo::PutOrphan { ino, record } => {
            out.push(OP_PUT_ORPHAN);
            out.extend_from_slice(&ino.to_le_bytes());
            put_bytes(out, record);
        }
        Redo::DelOrphan { ino } => {
            out.push(OP_DEL_ORPHAN);
            out.extend_from_slice(&ino.to_le_bytes());
        }
        Redo::PutCounter { key, value } => {
            out.push(OP_PUT_COUNTER);
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
        }
        Redo::PutXattr { ino, name, value } => {
            out.push(OP_PUT_XATTR);
            out.extend_from_slice(&ino.to_le_bytes());
            put_bytes(out, name.as_bytes());
            put_bytes(out, value);
        }
        Redo::DelXattr { ino, name } => {
            out.push(OP_DEL_XATTR);
            out.extend_from_slice(&ino.to_le_bytes());
            put_bytes(out, name.as_bytes());
        }
        Redo::PutStale { ino, slot, record } => {
            out.push(OP_PUT_STALE);
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&slot.to_le_bytes());
            put_bytes(out, record);
        }
        Redo::DelStale { ino, slot } => {
            out.push(OP_DEL_STALE);
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&slot.to_le_bytes());
        }
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MetaError> {
        if self.buf.len() < n {
            return Err(MetaError::Corrupt("journal entry: redo record cut short".into()));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, MetaError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, MetaError> {
        Ok(u32_at(self.take(4)?, 0))
    }
    fn u64(&mut self) -> Result<u64, MetaError> {
        Ok(u64_at(self.take(8)?, 0))
    }
    fn bytes(&mut self) -> Result<&'a [u8], MetaError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn str(&mut self) -> Result<&'a str, MetaError> {
        std::str::from_utf8(self.bytes()?).map_err(|_| MetaError::Corrupt("journal entry: name is not UTF-8".into()))
    }
}

/// Decodes every redo record of a payload; any malformed record fails the whole payload.
pub fn decode_redo(payload: &[u8]) -> Result<Vec<Redo<'_>>, MetaError> {
    let mut c = Cursor { buf: payload };
    let mut out = Vec::new();
    while !c.buf.is_empty() {
        let r = match c.u8()? {
            OP_PUT_INODE => Redo::PutInode { ino: c.u64()?, record: c.bytes()? },
            OP_DEL_INODE => Redo::DelInode { ino: c.u64()? },
            OP_PUT_DIRENT => Redo::PutDirent { parent: c.u64()?, name: c.str()?, ino: c.u64()?, kind: c.u8()? },
            OP_DEL_DIRENT => Redo::DelDirent { parent: c.u64()?, name: c.str()? },
            OP_PUT_SERVER => Redo::PutServer { id: c.u32()?, addr: c.str()? },
            OP_PUT_SERVER_PHASE => Redo::PutServerPhase { id: c.u32()?, phase: c.u8()? },
            OP_PUT_ORPHAN => Redo::PutOrphan { ino: c.u64()?, record: c.bytes()? },
            OP_DEL_ORPHAN => Redo::DelOrphan { ino: c.u64()? },
            OP_PUT_COUNTER => Redo::PutCounter { key: c.u32()?, value: c.u64()? },
            OP_PUT_XATTR => Redo::PutXattr { ino: c.u64()?, name: c.str()?, value: c.bytes()? },
            OP_DEL_XATTR => Redo::DelXattr { ino: c.u64()?, name: c.str()? },
            OP_PUT_STALE => Redo::PutStale { ino: c.u64()?, slot: c.u32()?, record: c.bytes()? },
            OP_DEL_STALE => Redo::DelStale { ino: c.u64()?, slot: c.u32()? },
            op => return Err(MetaError::Corrupt(format!("journal entry: unknown redo op {op}"))),
        };
        out.push(r);
    }
    Ok(out)
}

// ---- Recovery scan ------------------------------------------------------------------------------------------------

/// Where an intact entry to replay lies: segment index (in the slice given to [`scan`]) and byte range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub lsn: u64,
    pub seg: usize,
    pub range: std::ops::Range<usize>,
}

/// What [`scan`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanResult {
    /// Entries after `applied_lsn`, consecutive, in order.
    pub replay: Vec<Replay>,
    /// Intact entries found past a torn tail, never acknowledged, that are dropped.
    pub dropped: usize,
}

/// Finds the entries to replay in `segments` (each `(seq, whole file)`, sorted by `seq`) after `applied_lsn`.
///
/// Rules: entries up to `applied_lsn` are skipped; after it LSNs must be consecutive (a gap is corruption). The
/// first unreadable position is the tail, unless an intact entry continuing the chain follows (a segment's
/// unused end before the next segment). Intact entries past the tail were never acknowledged and are dropped —
/// unless one says (by its `synced_lsn`) that the missing entry had been durable: that is corruption.
pub fn scan(segments: &[(u64, &[u8])], applied_lsn: u64) -> Result<ScanResult, MetaError> {
    let mut out = ScanResult::default();
    let mut last = applied_lsn;
    // Some(first missing LSN) once an unreadable position was met and nothing has continued the chain since.
    let mut gap: Option<u64> = None;
    for (index, &(seq, data)) in segments.iter().enumerate() {
        let mut off = SEG_HEADER_BYTES.min(data.len());
        while off < data.len() {
            let (e, n) = match decode_entry(&data[off..], seq) {
                Ok(v) => v,
                Err(_) => {
                    if gap.is_none() {
                        gap = Some(last + 1);
                    }
                    match next_candidate(data, off + 1, seq) {
                        Some(next) => {
                            off = next;
                            continue;
                        }
                        None => break,
                    }
                }
            };
            let range = off + ENTRY_HEADER_BYTES..off + n;
            off += n;
            if e.lsn == last.wrapping_add(1) {
                // The chain continues: whatever was unreadable before lay between entries and held nothing.
                gap = None;
                last = e.lsn;
                out.replay.push(Replay { lsn: e.lsn, seg: index, range });
            } else if e.lsn <= applied_lsn && last == applied_lsn {
                // Already in redb (a segment partly covered by the checkpoint); so was anything unreadable before.
                gap = None;
            } else if let Some(missing) = gap {
                if e.synced_lsn >= missing {
                    return Err(MetaError::Corrupt(format!(
                        "journal: entry {missing} is damaged or missing, yet entry {} written after it says it was \
                         durable; refusing to start rather than lose acknowledged changes",
                        e.lsn
                    )));
                }
                out.dropped += 1;
            } else {
                return Err(MetaError::Corrupt(format!(
                    "journal: LSN {} follows {last}; entries are missing or out of order",
                    e.lsn
                )));
            }
        }
    }
    Ok(out)
}

/// The next offset at or after `from` where an intact entry of segment `seq` starts.
fn next_candidate(data: &[u8], from: usize, seq: u64) -> Option<usize> {
    let mut at = from;
    while at + ENTRY_HEADER_BYTES <= data.len() {
        let rel = data[at..].windows(4).position(|w| w == ENTRY_MAGIC)?;
        at += rel;
        if decode_entry(&data[at..], seq).is_ok() {
            return Some(at);
        }
        at += 1;
    }
    None
}

// ---- Files ---------------------------------------------------------------------------------------------------------

fn seg_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.{SEG_SUFFIX}"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates a segment file zero-filled to `bytes`, durable (file and directory entry).
fn create_zeroed(dir: &Path, path: &Path, bytes: u64) -> io::Result<File> {
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
    let zeros = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < bytes {
        let n = (bytes - off).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], off)?;
        off += n as u64;
    }
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(file)
}

/// Every segment file in `dir` with its bytes, sorted by sequence number; files without a header are listed in
/// `empty`.
pub(crate) struct OnDisk {
    pub segments: Vec<(u64, PathBuf, Vec<u8>)>,
    pub empty: Vec<PathBuf>,
}

pub(crate) fn read_dir(dir: &Path) -> Result<OnDisk, MetaError> {
    let mut segments = Vec::new();
    let mut empty = Vec::new();
    for ent in std::fs::read_dir(dir)? {
        let path = ent?.path();
        if path.extension().and_then(|e| e.to_str()) != Some(SEG_SUFFIX) {
            continue;
        }
        let data = std::fs::read(&path)?;
        match decode_seg_header(&data).map_err(|e| MetaError::Corrupt(format!("{}: {e}", path.display())))? {
            Some((seq, _)) => segments.push((seq, path, data)),
            None => empty.push(path),
        }
    }
    segments.sort_by_key(|s| s.0);
    if segments.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(MetaError::Corrupt("journal: two segments with the same sequence number".into()));
    }
    Ok(OnDisk { segments, empty })
}

// ---- The writer ----------------------------------------------------------------------------------------------------

/// Bytes appended but not yet written, for one segment.
struct Chunk {
    seq: u64,
    first_lsn: u64,
    /// Offset in the segment where `bytes` go.
    off: u64,
    bytes: Vec<u8>,
}

struct SegMeta {
    seq: u64,
    first_lsn: u64,
    path: PathBuf,
    /// Bytes used (header + entries), for the size accounting.
    used: u64,
}

struct State {
    next_lsn: u64,
    /// Every entry up to this is durable in the journal.
    durable_lsn: u64,
    flushing: bool,
    pending: Vec<Chunk>,
    /// Live segments, oldest first; the last is where appends go.
    segments: VecDeque<SegMeta>,
    /// Offset in the last segment where the next entry goes.
    tail_off: u64,
    /// Highest LSN covered by a durable redb commit.
    checkpoint_lsn: u64,
    checkpoint_at: Instant,
    /// Bytes appended since the last checkpoint started.
    since_checkpoint: u64,
    /// A writer waits for room: checkpoint now.
    want_checkpoint: bool,
    stopping: bool,
    /// Set by a failed write or fsync: the journal no longer knows what is on disk, so every write fails.
    failed: Option<String>,
}

/// The file being appended to; only the flushing thread touches it.
struct Active {
    seq: u64,
    file: File,
}

pub(crate) struct Journal {
    dir: PathBuf,
    cfg: JournalConfig,
    state: Mutex<State>,
    /// Durability advanced, a flush ended, or a checkpoint made room.
    changed: Condvar,
    /// Wakes the checkpoint thread.
    wake: Condvar,
    active: Mutex<Active>,
    spares: Mutex<Vec<PathBuf>>,
    /// Counted always (an atomic and a short lock per group commit); exported when the MDS serves metrics.
    pub(crate) stats: JournalStats,
}

/// The journal's metrics handles: group commits (each one `fdatasync`) and how many entries each made durable.
#[derive(Clone)]
pub struct JournalStats {
    pub commits: Counter,
    pub group_entries: Histogram,
}

impl Default for JournalStats {
    fn default() -> Self {
        // 1, 2, 4, ... 1024 entries per group commit.
        JournalStats { commits: Counter::default(), group_entries: Histogram::new(exponential_buckets(1.0, 2.0, 11)) }
    }
}

impl Journal {
    /// Starts a fresh journal in `dir` after recovery: removes every old segment (all covered by the checkpoint
    /// just taken at `applied_lsn`) and creates segment `seq` for LSN `applied_lsn + 1` on.
    pub(crate) fn start(
        dir: &Path,
        cfg: JournalConfig,
        old: Vec<PathBuf>,
        seq: u64,
        applied_lsn: u64,
    ) -> Result<Journal, MetaError> {
        cfg.validate()?;
        for p in &old {
            std::fs::remove_file(p)?;
        }
        let path = seg_path(dir, seq);
        let file = create_zeroed(dir, &path, cfg.segment_bytes)?;
        file.write_all_at(&encode_seg_header(seq, applied_lsn + 1), 0)?;
        file.sync_data()?;
        let state = State {
            next_lsn: applied_lsn + 1,
            durable_lsn: applied_lsn,
            flushing: false,
            pending: Vec::new(),
            segments: VecDeque::from([SegMeta {
                seq,
                first_lsn: applied_lsn + 1,
                path,
                used: SEG_HEADER_BYTES as u64,
            }]),
            tail_off: SEG_HEADER_BYTES as u64,
            checkpoint_lsn: applied_lsn,
            checkpoint_at: Instant::now(),
            since_checkpoint: 0,
            want_checkpoint: false,
            stopping: false,
            failed: None,
        };
        Ok(Journal {
            dir: dir.to_path_buf(),
            cfg,
            state: Mutex::new(state),
            changed: Condvar::new(),
            wake: Condvar::new(),
            active: Mutex::new(Active { seq, file }),
            spares: Mutex::new(Vec::new()),
            stats: JournalStats::default(),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>, MetaError> {
        self.state.lock().map_err(|_| MetaError::Poisoned)
    }

    fn live_bytes(s: &State) -> u64 {
        s.segments.iter().map(|m| m.used).sum::<u64>()
    }

    /// Back-pressure: returns once the journal is below its size limit (called before a transaction starts, so
    /// it never holds redb's write lock, which the checkpoint needs).
    pub(crate) fn wait_for_room(&self) -> Result<(), MetaError> {
        let mut s = self.lock()?;
        loop {
            if let Some(e) = &s.failed {
                return Err(MetaError::Store(format!("journal failed earlier: {e}")));
            }
            // With one segment left a checkpoint cannot free anything more (an entry bigger than the limit).
            if Self::live_bytes(&s) < self.cfg.journal_bytes_max || s.segments.len() <= 1 {
                return Ok(());
            }
            s.want_checkpoint = true;
            self.wake.notify_all();
            s = self.changed.wait(s).map_err(|_| MetaError::Poisoned)?;
        }
    }

    /// The LSN of the last appended entry.
    pub(crate) fn appended_lsn(&self) -> Result<u64, MetaError> {
        Ok(self.lock()?.next_lsn - 1)
    }

    /// Runs `commit` (redb's non-durable commit) and, if it succeeds, appends `payload` as the next entry, all
    /// under the journal lock so LSN order is commit order. Returns the entry's LSN.
    pub(crate) fn append<E>(&self, payload: &[u8], commit: impl FnOnce() -> Result<(), E>) -> Result<u64, E>
    where
        E: From<MetaError>,
    {
        if payload.len() > ENTRY_PAYLOAD_MAX {
            return Err(MetaError::Store(format!(
                "a metadata transaction of {} bytes exceeds the journal's entry limit",
                payload.len()
            ))
            .into());
        }
        let mut s = self.lock()?;
        if let Some(e) = &s.failed {
            return Err(MetaError::Store(format!("journal failed earlier: {e}")).into());
        }
        commit()?;
        let lsn = s.next_lsn;
        s.next_lsn += 1;
        let framed = (ENTRY_HEADER_BYTES + payload.len()) as u64;
        let seg_end = self.cfg.segment_bytes;
        if s.tail_off + framed > seg_end && s.tail_off > SEG_HEADER_BYTES as u64 {
            // Roll: the entry starts the next segment (the flusher opens it).
            let seq = s.segments.back().map_or(0, |m| m.seq) + 1;
            s.segments.push_back(SegMeta {
                seq,
                first_lsn: lsn,
                path: seg_path(&self.dir, seq),
                used: SEG_HEADER_BYTES as u64,
            });
            s.tail_off = SEG_HEADER_BYTES as u64;
        }
        let (seq, off) = (s.segments.back().map_or(0, |m| m.seq), s.tail_off);
        let synced = s.durable_lsn;
        // LSNs are consecutive in commit order and never reach durability before they are appended.
        weft_rpc::invariant!(synced < lsn && s.next_lsn == lsn + 1, "journal LSN {lsn} after durable {synced}");
        weft_rpc::invariant!(s.pending.last().is_none_or(|c| c.first_lsn <= lsn), "pending chunks in LSN order");
        let chunk = match s.pending.last_mut() {
            Some(c) if c.seq == seq => c,
            _ => {
                s.pending.push(Chunk { seq, first_lsn: lsn, off, bytes: Vec::with_capacity(4096) });
                s.pending.last_mut().expect("just pushed")
            }
        };
        encode_entry(&mut chunk.bytes, seq, lsn, synced, payload);
        s.tail_off += framed;
        s.since_checkpoint += framed;
        if let Some(m) = s.segments.back_mut() {
            m.used += framed;
        }
        if s.since_checkpoint >= self.cfg.checkpoint_bytes {
            self.wake.notify_all();
        }
        Ok(lsn)
    }

    /// Returns once entry `lsn` is durable. Whoever finds no flush running writes everything appended so far and
    /// runs one `fdatasync` for all of it; the others wait for that.
    pub(crate) fn wait_durable(&self, lsn: u64) -> Result<(), MetaError> {
        let mut s = self.lock()?;
        loop {
            if s.durable_lsn >= lsn {
                return Ok(());
            }
            if let Some(e) = &s.failed {
                return Err(MetaError::Store(format!("journal failed earlier: {e}")));
            }
            if s.flushing {
                s = self.changed.wait(s).map_err(|_| MetaError::Poisoned)?;
                continue;
            }
            s.flushing = true;
            let chunks = std::mem::take(&mut s.pending);
            let target = s.next_lsn - 1;
            drop(s);
            let result = self.write_out(chunks);
            s = self.lock()?;
            s.flushing = false;
            match &result {
                Ok(()) => {
                    if target > s.durable_lsn {
                        self.stats.commits.inc();
                        self.stats.group_entries.observe((target - s.durable_lsn) as f64);
                    }
                    s.durable_lsn = s.durable_lsn.max(target);
                }
                Err(e) => s.failed = Some(e.to_string()),
            }
            self.changed.notify_all();
            result?;
        }
    }

    fn write_out(&self, chunks: Vec<Chunk>) -> Result<(), MetaError> {
        let mut active = self.active.lock().map_err(|_| MetaError::Poisoned)?;
        for c in chunks {
            if c.seq != active.seq {
                // The old segment is durable before the new one gets entries, so a later segment's entries imply
                // the earlier one's are complete (recovery's "clean roll").
                active.file.sync_data()?;
                let file = self.open_segment(c.seq, c.first_lsn)?;
                *active = Active { seq: c.seq, file };
            }
            active.file.write_all_at(&c.bytes, c.off)?;
        }
        active.file.sync_data()?;
        Ok(())
    }

    /// A segment for `seq`: a recycled or preallocated spare renamed, else a new zero-filled file. Its header is
    /// written now and made durable by the same `fdatasync` as its first entries.
    fn open_segment(&self, seq: u64, first_lsn: u64) -> Result<File, MetaError> {
        let path = seg_path(&self.dir, seq);
        let spare = self.spares.lock().map_err(|_| MetaError::Poisoned)?.pop();
        let file = match spare {
            // No directory fsync needed: recovery goes by the header inside the file, not by its name.
            Some(old) => {
                std::fs::rename(&old, &path)?;
                OpenOptions::new().read(true).write(true).open(&path)?
            }
            None => create_zeroed(&self.dir, &path, self.cfg.segment_bytes)?,
        };
        file.write_all_at(&encode_seg_header(seq, first_lsn), 0)?;
        Ok(file)
    }

    /// For the checkpoint thread: waits until a checkpoint is due (size, age, or a writer waiting for room) or
    /// the journal stops. Returns false when stopping.
    pub(crate) fn wait_checkpoint_due(&self) -> Result<bool, MetaError> {
        let mut s = self.lock()?;
        loop {
            if s.stopping {
                return Ok(false);
            }
            let dirty = s.next_lsn - 1 > s.checkpoint_lsn;
            let age = s.checkpoint_at.elapsed();
            let interval = Duration::from_millis(self.cfg.checkpoint_interval_ms);
            if dirty && (s.want_checkpoint || s.since_checkpoint >= self.cfg.checkpoint_bytes || age >= interval) {
                s.since_checkpoint = 0;
                s.checkpoint_at = Instant::now();
                return Ok(true);
            }
            let timeout = if dirty { interval.saturating_sub(age) } else { interval };
            s = self.wake.wait_timeout(s, timeout.max(Duration::from_millis(1))).map_err(|_| MetaError::Poisoned)?.0;
            if !dirty {
                s.checkpoint_at = Instant::now();
            }
        }
    }

    /// A checkpoint covering every entry up to `lsn` is durable in redb: free the segments it covers entirely
    /// (recycling up to [`SPARES_MAX`]) and wake writers waiting for room.
    pub(crate) fn checkpointed(&self, lsn: u64) -> Result<(), MetaError> {
        let freed = {
            let mut s = self.lock()?;
            s.checkpoint_lsn = s.checkpoint_lsn.max(lsn);
            s.want_checkpoint = false;
            let mut freed = Vec::new();
            // A segment is covered when the next one starts at or below lsn + 1; the last one is never freed.
            while s.segments.len() > 1 && s.segments[1].first_lsn <= lsn + 1 {
                if let Some(m) = s.segments.pop_front() {
                    freed.push(m.path);
                }
            }
            freed
        };
        let mut spares = self.spares.lock().map_err(|_| MetaError::Poisoned)?;
        for path in freed {
            if spares.len() < SPARES_MAX {
                spares.push(path);
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        drop(spares);
        self.changed.notify_all();
        Ok(())
    }

    /// Keeps one spare segment ready so a roll does not zero-fill on the commit path.
    pub(crate) fn prepare_spare(&self) -> Result<(), MetaError> {
        if !self.spares.lock().map_err(|_| MetaError::Poisoned)?.is_empty() {
            return Ok(());
        }
        let path = self.dir.join(format!("spare-{}.{SEG_SUFFIX}", std::process::id()));
        create_zeroed(&self.dir, &path, self.cfg.segment_bytes)?;
        self.spares.lock().map_err(|_| MetaError::Poisoned)?.push(path);
        Ok(())
    }

    /// Bytes in live segments (for tests and logs).
    pub(crate) fn live(&self) -> Result<(u64, usize), MetaError> {
        let s = self.lock()?;
        Ok((Self::live_bytes(&s), s.segments.len()))
    }

    /// A checkpoint failed: redb may not be able to commit durably, so writers must not wait for room forever.
    pub(crate) fn fail(&self, why: String) {
        if let Ok(mut s) = self.state.lock() {
            s.failed.get_or_insert(why);
        }
        self.changed.notify_all();
    }

    pub(crate) fn stop(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.stopping = true;
        }
        self.wake.notify_all();
    }
}

#[cfg(test)]
mod tests;
