//! The write protocol of ec rows (docs/format.md §17): one attempt reads what it must, plans the row (pure:
//! [`plan_partial`], [`plan_whole`]), writes the data chunks, then the parity, all compare-and-set, and records the
//! rows servers missed before it is acknowledged; [`write_batch`] retries attempts another writer moved.
//!
//! **A write of rows** (one row only partly covered, or a run of whole rows), retried whole when another writer
//! moved a version under it (compare-and-set, `VersionMoved`), at most [`WRITE_ATTEMPTS_MAX`] times:
//! 1. read the parity chunks' records (with their bytes for a partial row);
//! 2. then the data chunks' records (with their bytes for a partial row, decoding missing ones by the version
//!    rule; a torn row whose lost bytes are needed is [`ClientError::TornRow`]); whole rows whose parity agrees
//!    take them from the parity's vector instead ([`vector_expect`]), the compare-and-set of 3 checking them;
//! 3. write the data chunks it changes (and damaged ones), each with a new version, compare-and-set;
//! 4. then every parity chunk, with the versions of the `k` data chunks it encodes, compare-and-set.
//!
//! Why this order: a parity chunk's final writer read that parity chunk's version before the data chunks, and every
//! writer writes its data before its parity; so a writer whose parity write lands last saw every earlier writer's
//! data, and when all writers returned success the row's data and parity agree. A writer that gives up (or dies)
//! between 3 and 4 leaves parity whose vector disagrees with the data: detected, never decoded, and rewritten by
//! the next write or the repair of the next degraded read of the row.
//!
//! Why compare-and-set and not a row lease: no lease state to expire or recover on the data servers, and a dead
//! writer blocks nobody; the cost is a retry when two writers hit one row at the same moment.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft_proto::msg::{ChunkVersion, RowWrite};

use crate::ClientError;
use crate::ec_calls::{ChunkWrite, Written, read_all, write_all};
use crate::ec_codec::{Codec, is_chunk_loss};
use crate::ec_version::{
    Found, RowPlan, newest_named, next_data_version, outdated_as_damaged, plan_row_cut, rename_unreached,
    unreachable_version, vector_of,
};
use crate::handle::File;
use crate::recycle::Recycled;
use crate::striped::Io;

/// How many times a row write is tried when other writers keep moving its versions.
pub(crate) const WRITE_ATTEMPTS_MAX: u32 = 16;

pub(crate) fn found_of(c: &ChunkVersion, checked: bool) -> Found {
    if c.intact || !checked {
        Found::Intact { version: c.version, parity_of: c.parity_of.clone() }
    } else {
        Found::Damaged { version: c.version }
    }
}

/// What one attempt of a row write ended with.
pub(crate) enum Attempt {
    Done,
    /// Another writer moved a version: read again and retry.
    Moved,
}

/// The new bytes of a row write.
pub(crate) enum RowBytes {
    /// File bytes from the write's offset on, in one run: a partial row, or whole rows back to back.
    Run(Bytes),
    /// Whole rows as `k` chunks of a stripe unit each, row after row (gathered from several writes, possibly
    /// from several buffers: `ec_gather.rs`).
    Chunks(Vec<Bytes>),
}

impl RowBytes {
    fn len(&self) -> u64 {
        match self {
            RowBytes::Run(b) => b.len() as u64,
            RowBytes::Chunks(c) => c.iter().map(|c| c.len() as u64).sum(),
        }
    }
}

/// Writes a row job ([`RowJob`], no heal), attempt after attempt while other writers move its versions (at most
/// [`WRITE_ATTEMPTS_MAX`]) or its row reads torn (another writer's in flight, [`TORN_RETRIES_MAX`]).
pub(crate) async fn write_batch(job: &RowJob<'_>, mut known: Known) -> Result<(), ClientError> {
    assert!(job.heal.is_none(), "heals go through their own retries");
    let base = job.geom().base;
    let mut attempt = 0;
    let (mut torn_tries, mut torn_backoff_ms) = (0, TORN_BACKOFF_MS_MIN);
    loop {
        attempt += 1;
        match write_attempt(job, &mut known).await {
            // A row torn under this read-modify-write is most often another client's write in flight (its data
            // chunks are new, its parity not yet): read it again, backing off, and fail only if it stays torn.
            Err(ClientError::TornRow { .. }) if torn_tries < TORN_RETRIES_MAX => {
                torn_tries += 1;
                tokio::time::sleep(Duration::from_millis(torn_backoff_ms)).await;
                torn_backoff_ms = (torn_backoff_ms * 2).min(TORN_BACKOFF_MS_MAX);
                continue;
            }
            Err(e) => return Err(e),
            Ok(a) => match a {
                Attempt::Done => return Ok(()),
                Attempt::Moved if attempt >= WRITE_ATTEMPTS_MAX => {
                    return Err(ClientError::WriteConflict {
                        ino: job.file.attr.ino,
                        file_offset: base,
                        attempts: attempt,
                    });
                }
                Attempt::Moved => {
                    // Jittered, growing backoff so two writers of one row stop colliding (not a timing assumption).
                    let jitter = (std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .subsec_nanos()
                        % 1000) as u64;
                    tokio::time::sleep(Duration::from_micros(u64::from(attempt) * 200 + jitter)).await;
                }
            },
        }
    }
}

/// The parity of whole rows given as their data chunks (`k` chunks of `u` bytes per row, row after row), encoded
/// straight into one buffer per parity chunk (rows back to back), ready to be sent in slices.
/// The buffers come from `bufs` (reused: no page faults) and go back to it once sent ([`give_back`]).
pub(crate) fn encode_parity(codec: &Codec, chunks: &[&[u8]], u: usize, bufs: &Recycled) -> Vec<BytesMut> {
    assert!(chunks.len().is_multiple_of(codec.k) && chunks.iter().all(|c| c.len() == u), "whole rows");
    let rows = chunks.len() / codec.k;
    // Every byte is overwritten below (the encoder writes whole parity shards), so recycled contents never leak.
    let mut pbuf: Vec<BytesMut> = (0..codec.m).map(|_| bufs.take(rows * u)).collect();
    for (row, shards) in chunks.chunks_exact(codec.k).enumerate() {
        let mut outs: Vec<&mut [u8]> = pbuf.iter_mut().map(|p| &mut p[row * u..][..u]).collect();
        codec.encode_into(shards, &mut outs);
    }
    pbuf
}

/// Returns sent parity buffers to `bufs` (those no request still holds).
fn give_back(bufs: &Recycled, sent: Vec<Bytes>) {
    sent.into_iter().for_each(|b| bufs.give(b));
}

/// How often a read-modify-write reads a torn row again before reporting it, and the backoff between tries
/// (about a second in all, as a degraded read: far longer than one row write takes).
pub(crate) const TORN_RETRIES_MAX: u32 = 8;

pub(crate) const TORN_BACKOFF_MS_MIN: u64 = 5;

pub(crate) const TORN_BACKOFF_MS_MAX: u64 = 250;

/// Bytes of data chunks of a partial row that one row write has learnt (read intact, or decoded by the version rule)
/// in an earlier attempt: `(version, bytes)` per data chunk. A version names one content forever (versions are
/// never reused, [`next_data_version`]), so a later attempt may use them for a chunk it cannot read any more (its
/// server just died). Why: an attempt that lost its parity compare-and-set to another writer has already written
/// its data chunks; with a server down, those and the winner's parity may leave too few agreeing chunks to decode
/// the lost one, and only this writer still knows it: its retry then rewrites the parity from the whole row
/// instead of failing with `TornRow` and leaving the row undecodable.
///
/// `read_data`: a compare-and-set of this write moved, so its next attempt reads the data chunks' records instead of
/// taking them from the parity's vector (whole rows, [`vector_expect`]).
///
/// `replaced`: data chunks a delta write (`ec_delta.rs`) of this write replaced a range of before it fell back to
/// this protocol. Its parity compare-and-set may have lost, leaving parity that still names the chunk's old
/// version; a row that does not decode as found is planned once more with the chunk as it was (its bytes now with
/// the old range back), which that parity encodes: the same rescue `chunks` gives a whole-row attempt.
#[derive(Default)]
pub(crate) struct Known {
    /// Per data chunk: the versions this write learnt it at (read intact, or decoded) or named it at (wrote it, or
    /// encoded it into its parity unable to write it), with their bytes (references to the replies or to the row
    /// written, a copy only when decoded); newest last, at most [`KNOWN_PER_CHUNK_MAX`].
    chunks: Vec<Vec<(u64, Bytes)>>,
    /// (data chunk, version) this write's compare-and-set set (landed), newest last, bounded as `chunks`.
    landed: Vec<(usize, u64)>,
    read_data: bool,
    pub(crate) replaced: Vec<Option<Replaced>>,
}

/// A range of a data chunk a delta write replaced: the version it wrote, the version before, and the old bytes
/// of `[lo, lo + old.len())` in the chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Replaced {
    pub written: u64,
    pub old_version: u64,
    pub lo: usize,
    pub old: Bytes,
}

/// Versions of one data chunk a row write keeps ([`Known`]): enough for the attempts that race another writer.
const KNOWN_PER_CHUNK_MAX: usize = 4;

impl Known {
    /// The bytes of data chunk `j` at `version`, if this write learnt or named them.
    fn learnt(&self, j: usize, version: u64) -> Option<&Bytes> {
        self.chunks.get(j)?.iter().rev().find(|(v, _)| *v == version).map(|(_, b)| b)
    }

    /// The newest version of data chunk `j` this write knows, with its bytes.
    fn newest(&self, j: usize) -> Option<&(u64, Bytes)> {
        self.chunks.get(j)?.last()
    }

    /// Keeps data chunk `j`'s bytes at `version` (a version names one content, docs/format.md §17).
    pub(crate) fn learn(&mut self, j: usize, version: u64, bytes: Bytes) {
        if self.chunks.len() <= j {
            self.chunks.resize(j + 1, Vec::new());
        }
        let c = &mut self.chunks[j];
        c.retain(|(v, _)| *v != version);
        if c.len() >= KNOWN_PER_CHUNK_MAX {
            c.remove(0);
        }
        c.push((version, bytes));
    }

    /// Data chunk `j` written at `version` by this write (its compare-and-set landed): kept, and remembered as
    /// on its server.
    pub(crate) fn landed(&mut self, j: usize, version: u64, bytes: Bytes) {
        self.learn(j, version, bytes);
        if self.landed.len() >= KNOWN_PER_CHUNK_MAX * 4 {
            self.landed.remove(0);
        }
        self.landed.push((j, version));
    }

    /// Whether this write set data chunk `j` to `version` on its server.
    fn landed_at(&self, j: usize, version: u64) -> bool {
        self.landed.contains(&(j, version))
    }

    /// What a delta write that fell back left to know (`ec_delta.rs`).
    pub(crate) fn after_delta(replaced: Vec<Option<Replaced>>) -> Known {
        Known { replaced, ..Known::default() }
    }

    /// Takes one write phase's outcome: `true` if another writer moved a version (the attempt ends, and the next one
    /// reads the data chunks' records); else the servers that failed are marked unreachable and their chunks lost.
    fn moved(&mut self, written: Written, client: &crate::Client, lost: &mut Vec<(usize, ClientError)>) -> bool {
        match written {
            Written::Moved => {
                self.read_data = true;
                true
            }
            Written::Failed(f) => {
                f.iter().for_each(|(_, e)| client.note_unreachable(e));
                lost.extend(f);
                false
            }
        }
    }
}

/// For whole rows: the data chunks' records as the parity chunks that answered name them, when every one of them
/// is sound and all name the same vector in every row (`None` otherwise, or when none answered). A whole-row write
/// uses them as its data chunks' `expect` instead of reading them (docs/format.md §17): its compare-and-set checks
/// each, so a write that lands wrote exactly what it would have after reading the same versions (a data chunk's
/// record is used only for its version when its bytes are not read), and one that finds another version moves and
/// is retried with a read. One round trip less per row.
fn vector_expect(k: usize, found: &[Vec<ChunkVersion>], parity: &[usize], rows: usize) -> Option<Vec<Vec<u64>>> {
    let mut out = Vec::with_capacity(rows);
    for row in 0..rows {
        let mut agreed: Option<Vec<u64>> = None;
        for &i in parity {
            let c = found.get(i)?.get(row)?;
            let v = vector_of(k, c.version, &c.parity_of).filter(|_| c.intact)?;
            if agreed.as_ref().is_some_and(|a| *a != v) {
                return None;
            }
            agreed = Some(v);
        }
        out.push(agreed?);
    }
    Some(out)
}

/// A write of rows: `new` at file offset `from` over rows `[first, first + rows)` of an ec file — either one row
/// that `[from, from + new.len())` covers only partly, or whole rows. `old_size` is the file size the caller knows
/// (bytes of a damaged chunk at or past it need no decoding); `new_end` the size after this write. `read_io` reads
/// the rows (a handle's read capability), `write_io` writes. `heal`: the chunk a heal rewrites (read for its
/// records, its bytes not trusted).
pub(crate) struct RowJob<'a> {
    pub file: &'a File,
    pub read_io: &'a Io,
    pub write_io: &'a Io,
    pub codec: &'a Codec,
    pub first: u64,
    pub rows: u64,
    pub from: u64,
    pub new: &'a RowBytes,
    pub old_size: u64,
    pub new_end: u64,
    pub heal: Option<usize>,
}

/// A row job's geometry.
struct Geom {
    k: usize,
    m: usize,
    u: usize,
    /// The file offset of the first row.
    base: u64,
    /// One row covered only partly (else whole rows).
    partial: bool,
}

impl RowJob<'_> {
    fn geom(&self) -> Geom {
        let (k, m) = (self.codec.k, self.codec.m);
        let unit = u64::from(self.file.layout().stripe_unit);
        let row_bytes = unit * k as u64;
        let base = self.first * row_bytes;
        let to = self.from + self.new.len();
        let partial = self.rows == 1 && (self.from > base || to < base + row_bytes);
        assert!(partial || (self.from == base && to == base + self.rows * row_bytes), "one partial row or whole rows");
        Geom { k, m, u: unit as usize, base, partial }
    }

    fn degraded(&self, g: &Geom, i: usize, cause: &dyn std::fmt::Display) -> ClientError {
        ClientError::DegradedWrite {
            ino: self.file.attr.ino,
            file_offset: g.base,
            server: self.file.layout().servers.get(i).copied().unwrap_or(u32::MAX),
            cause: cause.to_string(),
        }
    }
}

/// What the reads of an attempt found: per chunk (`k + m`), its records per row and (partial rows) its bytes;
/// the chunks left out (stale, or lost in this attempt) and why the lost ones were.
struct Read {
    found: Vec<Vec<ChunkVersion>>,
    bytes: Vec<Bytes>,
    skip: Vec<usize>,
    lost: Vec<(usize, ClientError)>,
}

impl Read {
    /// What chunk `i` of row `row` was found as (`Unreachable` when left out; the healed chunk `Damaged`).
    fn found(&self, i: usize, row: usize, checked: bool, heal: Option<usize>) -> Found {
        if self.skip.contains(&i) {
            return Found::Unreachable;
        }
        let c = &self.found[i][row];
        if Some(i) == heal { Found::Damaged { version: c.version } } else { found_of(c, checked) }
    }
}

/// What an attempt writes: the rows' data chunks (`k` per row, row after row), which data chunks it writes, and
/// the data versions of each row after it.
struct Planned {
    chunks: Vec<Bytes>,
    rewrite: Vec<bool>,
    data_versions: Vec<Vec<u64>>,
}

/// One attempt of a row write (the module doc's steps 1–4).
pub(crate) async fn write_attempt(job: &RowJob<'_>, known: &mut Known) -> Result<Attempt, ClientError> {
    let g = job.geom();
    let mut read = read_chunks(job, &g, known).await?;
    let mut planned = if g.partial {
        let RowBytes::Run(run) = job.new else { unreachable!("a partial row is one run") };
        let fs: Vec<Found> = (0..g.k + g.m).map(|i| read.found(i, 0, true, job.heal)).collect();
        let random = weft_rpc::auth::random_id();
        let shape = PartialShape { k: g.k, u: g.u, base: g.base, from: job.from, old_size: job.old_size, random };
        let PartialPlan { row: buf, rewrite, versions } =
            plan_partial(&shape, job.codec, fs, &read.bytes, known, job.heal, run)
                .map_err(|e| torn(job.file, g.base, e))?;
        let b = Bytes::from(buf);
        // A chunk this write does not write is what its version names from now on: as found or decoded, or (out
        // of reach) in the parity at a fresh version. A written one, only once its compare-and-set lands.
        for j in (0..g.k).filter(|&j| !rewrite[j]) {
            known.learn(j, versions[j], b.slice(j * g.u..(j + 1) * g.u));
        }
        let chunks = (0..g.k).map(|j| b.slice(j * g.u..(j + 1) * g.u)).collect();
        Planned { chunks, rewrite, data_versions: vec![versions] }
    } else {
        plan_whole(&g, job.rows, &read, job.heal, job.new)
    };
    let client = &job.file.client;
    let layout = job.file.layout();
    let mut lost = std::mem::take(&mut read.lost);
    let writes = data_writes(job, &g, &read.found, &read.bytes, &planned);
    if known.moved(write_all(job.write_io, &layout, writes, job.first).await, client, &mut lost) {
        return Ok(Attempt::Moved);
    }
    learn_written(known, &g, &planned, &lost);
    rename_unlanded(job, &g, &read, &mut planned, &lost, known);
    let (writes, sent) = parity_writes(job, &g, &read.found, &read.bytes, &planned, &read.skip);
    let written = write_all(job.write_io, &layout, writes, job.first).await;
    give_back(client.recycled(), sent);
    if known.moved(written, client, &mut lost) {
        return Ok(Attempt::Moved);
    }
    finish(job, &g, &read.skip, lost).await
}

/// A partial row's data chunks whose compare-and-set landed (none of `lost`), kept at their new versions. One
/// that did not land is not: another writer's compare-and-set may take that version number for other bytes.
fn learn_written(known: &mut Known, g: &Geom, planned: &Planned, lost: &[(usize, ClientError)]) {
    if !g.partial || lost.iter().any(|(i, _)| *i == usize::MAX) {
        return;
    }
    for j in (0..g.k).filter(|&j| planned.rewrite[j] && !lost.iter().any(|(i, _)| *i == j)) {
        known.landed(j, planned.data_versions[0][j], planned.chunks[j].clone());
    }
}

/// Data chunks whose compare-and-set write did not land (their server failed) are named in the parity at a fresh
/// unreachable version, as chunks out of reach are: no compare-and-set took the version the write set, so another
/// writer may set it for other bytes (ec_sim.rs found two writers, each losing its write of one chunk to the same
/// dead server, name one version of it for two contents in their parity). A partial row's is kept at it.
fn rename_unlanded(
    job: &RowJob<'_>,
    g: &Geom,
    read: &Read,
    planned: &mut Planned,
    lost: &[(usize, ClientError)],
    known: &mut Known,
) {
    let unlanded: Vec<usize> = (0..g.k).filter(|&j| planned.rewrite[j] && lost.iter().any(|(i, _)| *i == j)).collect();
    if unlanded.is_empty() {
        return;
    }
    let random = weft_rpc::auth::random_id();
    for (row, versions) in planned.data_versions.iter_mut().enumerate() {
        let parity: Vec<Found> = (g.k..g.k + g.m).map(|i| read.found(i, row, true, job.heal)).collect();
        rename_unreached(versions, &unlanded, &parity, random);
    }
    if g.partial {
        for &j in &unlanded {
            known.learn(j, planned.data_versions[0][j], planned.chunks[j].clone());
        }
    }
}

/// Steps 1 and 2: the chunks left out (stale ones, and servers that did not answer moments ago while at most `m`
/// are), then the parity chunks' records, then the data chunks' (bytes too for a partial row). Too many chunks
/// unavailable fail the write ([`ClientError::DegradedWrite`]).
async fn read_chunks(job: &RowJob<'_>, g: &Geom, known: &Known) -> Result<Read, ClientError> {
    let (file, heal) = (job.file, job.heal);
    let layout = file.layout();
    let client = &file.client;
    // Chunks in a stale range (§18) are neither read nor written: the healer rewrites them. The one being healed
    // is read for its records (compare-and-set) but its bytes are not trusted (`Damaged`), so it is rewritten.
    let mut skip: Vec<usize> = crate::stale::stale_slots(file, job.first, job.first + job.rows)
        .await?
        .into_iter()
        .filter(|&i| Some(i) != heal)
        .collect();
    let presumed = presumed_down(job, g, &skip);
    let mut lost: Vec<(usize, ClientError)> =
        presumed.iter().map(|&i| (i, ClientError::NotTried { server: layout.servers[i] })).collect();
    let mut found: Vec<Vec<ChunkVersion>> = vec![Vec::new(); g.k + g.m];
    // Frozen as they arrive (no copy): a partial row's `Known` keeps the chunks read by reference.
    let mut bytes: Vec<Bytes> = vec![Bytes::new(); g.k + g.m];
    for phase in [g.k..g.k + g.m, 0..g.k] {
        let data_phase = phase.start == 0;
        let which: Vec<usize> = phase.filter(|i| !skip.contains(i) && !lost.iter().any(|(j, _)| j == i)).collect();
        if data_phase && !g.partial && heal.is_none() && !known.read_data {
            // Whole rows: the data chunks' expected versions from the parity's vector, checked by the write itself.
            let parity: Vec<usize> = (g.k..g.k + g.m).filter(|i| !found[*i].is_empty()).collect();
            if let Some(vectors) = vector_expect(g.k, &found, &parity, job.rows as usize) {
                for &j in &which {
                    found[j] = vectors
                        .iter()
                        .map(|v| ChunkVersion { version: v[j], intact: true, parity_of: Vec::new() })
                        .collect();
                }
                continue;
            }
        }
        for (i, r) in read_all(job.read_io, &layout, which.into_iter(), job.first, job.rows, g.partial).await {
            match r {
                Ok((v, b)) => {
                    found[i] = v;
                    bytes[i] = b.freeze();
                }
                Err(e) if is_chunk_loss(&e) && Some(i) != heal => {
                    client.note_unreachable(&e);
                    lost.push((i, e))
                }
                Err(e) => return Err(e),
            }
        }
    }
    if skip.len() + lost.len() > g.m {
        let mut again = presumed;
        let (first, end) = (job.first, job.first + job.rows);
        again.extend(
            crate::stale::healed_since(file, &mut skip, first, end).await?.into_iter().filter(|&i| Some(i) != heal),
        );
        try_again(job, g, &again, (&mut found, &mut bytes), &mut lost).await?;
    }
    // A fenced server under a newer layout: nothing is written under this one (the caller retries on the new).
    crate::stale::refetch_if_fenced(file, &lost).await?;
    if skip.len() + lost.len() > g.m {
        let (i, e) = match lost.pop() {
            Some((i, e)) => (i, e.to_string()),
            None => (skip[0], "stale".to_string()),
        };
        let cause = format!("{e} (more servers of the layout unavailable than its {} tolerated)", g.m);
        return Err(job.degraded(g, i, &cause));
    }
    skip.extend(lost.iter().map(|(i, _)| *i));
    Ok(Read { found, bytes, skip, lost })
}

/// The chunks whose server did not answer moments ago, not tried again while at most m are left out: they are
/// lost for this write at once, as after a failed attempt, so a write stream pays the dead server's connect retries
/// once per hold, not once per row (unless too many others fail: [`try_again`]).
fn presumed_down(job: &RowJob<'_>, g: &Geom, skip: &[usize]) -> Vec<usize> {
    let layout = job.file.layout();
    let down: Vec<usize> = (0..g.k + g.m)
        .filter(|&i| {
            !skip.contains(&i) && Some(i) != job.heal && job.file.client.recently_unreachable(layout.servers[i])
        })
        .collect();
    if skip.len() + down.len() <= g.m { down } else { Vec::new() }
}

/// Before a write gives up on too many chunks lost: the chunks `again` are read after all — those of servers left
/// out as "did not answer moments ago" (never tried) and those healed since the handle learnt them stale — as one
/// may be usable now (a restarted server, healed: the model test, tests/model.rs, found writes failing when
/// another server then died).
async fn try_again(
    job: &RowJob<'_>,
    g: &Geom,
    again: &[usize],
    (found, bytes): (&mut [Vec<ChunkVersion>], &mut [Bytes]),
    lost: &mut Vec<(usize, ClientError)>,
) -> Result<(), ClientError> {
    if again.is_empty() {
        return Ok(());
    }
    lost.retain(|(i, _)| !again.contains(i));
    let layout = job.file.layout();
    for (i, r) in read_all(job.read_io, &layout, again.iter().copied(), job.first, job.rows, g.partial).await {
        match r {
            Ok((v, b)) => {
                found[i] = v;
                bytes[i] = b.freeze();
            }
            Err(e) if is_chunk_loss(&e) => {
                job.file.client.note_unreachable(&e);
                lost.push((i, e))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A partial row's geometry, for [`plan_partial`].
pub(crate) struct PartialShape {
    pub k: usize,
    pub u: usize,
    /// The row's first file offset.
    pub base: u64,
    /// Where the new bytes start.
    pub from: u64,
    /// The file size the writer knows: bytes of a damaged chunk at or past it need no decoding.
    pub old_size: u64,
    /// Randomness for the versions of chunks changed out of reach ([`unreachable_version`]): a random id in
    /// service, the seed's generator in the simulation (`ec_sim.rs`), so a seed replays exactly.
    pub random: u64,
}

impl PartialShape {
    /// Whether new bytes `[from, to)` fall in data chunk `j`.
    fn changes(&self, j: usize, to: u64) -> bool {
        let (lo, hi) = (self.base + (j * self.u) as u64, self.base + ((j + 1) * self.u) as u64);
        lo < to && self.from < hi
    }
}

/// A partial row's plan: the row's bytes after the write (`k` chunks), the data chunks written, the data
/// versions after it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PartialPlan {
    pub row: Vec<u8>,
    pub rewrite: Vec<bool>,
    pub versions: Vec<u64>,
}

/// Plans a partial-row write from what was found of each chunk (`fs`, `k + m`; `bytes` their contents): the row
/// assembled with the new bytes `run` laid in at `from`, which data chunks are written (those the run changes, and
/// damaged ones, rewritten from the decoded row) and the row's data versions after the write. Pure: no I/O.
///
/// A chunk this write cannot reach now is used as `known` learnt it in an earlier attempt, but only at the version
/// every intact parity chunk names for it (bytes another writer replaced since are never put back). Every data
/// chunk known after this plan is kept in `known` for a retry. An undecodable row is fine only if no damaged
/// chunk holds bytes this write keeps; else the error says why (the caller's `TornRow`).
pub(crate) fn plan_partial(
    s: &PartialShape,
    codec: &Codec,
    mut fs: Vec<Found>,
    bytes: &[Bytes],
    known: &mut Known,
    heal: Option<usize>,
    run: &Bytes,
) -> Result<PartialPlan, String> {
    let (k, u) = (s.k, s.u);
    let to = s.from + run.len() as u64;
    assert!(fs.len() > k && bytes.len() == fs.len() && s.from >= s.base && to <= s.base + (k * u) as u64);
    // Data chunks from `cut` on lie wholly at or past the size this write knows: zeros (§16).
    let cut = (0..k).find(|&j| s.base + (j * u) as u64 >= s.old_size).unwrap_or(k);
    outdated_as_damaged(k, &mut fs, cut);
    keep_read(k, &fs, bytes, known, heal);
    let (mut buf, mut rewrite, mut origin) = gather(s, to, &mut fs, bytes, known, heal);
    // Data chunks whose bytes change but which this write cannot reach: their new bytes are in the parity only.
    let mut unwritten: Vec<usize> = (0..k).filter(|&j| !rewrite[j] && s.changes(j, to)).collect();
    // Data chunks wholly at or past the size the writer knows are zeros (§16: a truncate cut them), but one out of
    // reach may still hold what a cut it missed left there: it goes into the parity as zeros at a fresh version,
    // as a chunk changed out of reach, never at the version naming its old bytes (the model test, tests/model.rs,
    // read them back after the file grew). Nothing is learnt of it at its old version.
    let past_end: Vec<usize> = (0..k)
        .filter(|&j| !rewrite[j] && !unwritten.contains(&j) && matches!(fs[j], Found::Unreachable))
        .filter(|&j| s.base + (j * u) as u64 >= s.old_size)
        .collect();
    // The chunks' records as found: a new version goes above them (the compare-and-set expects them).
    let records: Vec<u64> = fs[..k].iter().map(|f| f.version().unwrap_or(0)).collect();
    let mut versions = records.clone();
    let mut planned = plan_row_cut(k, fs.len() - k, &fs, cut);
    if planned.is_err()
        && let Some(as_was) = as_before_delta(k, u, &fs, &known.replaced, &mut buf, &mut origin)
    {
        fs = as_was;
        planned = plan_row_cut(k, fs.len() - k, &fs, cut);
    }
    let mut decoded = true;
    if planned.is_err()
        && let Some(v) = decode_with_known(k, u, cut, codec, &fs, bytes, known, &mut buf)
    {
        versions = v;
    } else {
        match planned {
            Ok(plan) => versions = decode_and_keep(k, u, codec, &plan, &mut buf, bytes, origin, known, &past_end)?,
            // Undecodable: fine only if no damaged chunk holds bytes this write keeps (outside the new bytes, below the
            // old size); those chunks are rewritten with zeros there.
            Err(e) if loses_kept_bytes(s, to, &fs) => return Err(e.to_string()),
            Err(_) => decoded = false,
        }
    }
    for &j in &past_end {
        buf[j * u..(j + 1) * u].fill(0);
    }
    unwritten.extend(past_end);
    buf[(s.from - s.base) as usize..(to - s.base) as usize].copy_from_slice(run);
    let same_bytes: Vec<bool> = (0..k).map(|j| decoded && !s.changes(j, to)).collect();
    write_versions(&fs, &records, (&same_bytes, heal), known, &mut rewrite, &mut versions);
    for j in unwritten {
        versions[j] = unreachable_version(j, &fs[k..], s.random.wrapping_add(j as u64));
        weft_rpc::invariant!(!rewrite[j], "chunk {j} both written and out of reach");
    }
    // Every chunk written moves up from the record its compare-and-set expects (§17).
    weft_rpc::invariant!((0..k).filter(|&j| rewrite[j]).all(|j| versions[j] > records[j]), "{versions:?} {records:?}");
    Ok(PartialPlan { row: buf, rewrite, versions })
}

/// Keeps every data chunk read intact at its version before anything is written over it: if this write's parity
/// then loses to another writer's, whose parity names what was overwritten, only this write still has those bytes
/// (ec_sim.rs found a row no one could decode after such a loss). The healed chunk's bytes are not trusted.
fn keep_read(k: usize, fs: &[Found], bytes: &[Bytes], known: &mut Known, heal: Option<usize>) {
    for j in (0..k).filter(|&j| !bytes[j].is_empty() && Some(j) != heal) {
        if let Found::Intact { version, .. } = fs[j] {
            known.learn(j, version, bytes[j].clone());
        }
    }
}

/// The versions the chunks `rewrite` names are written at (`versions` holds the row's decoded ones): above every
/// version named for the chunk (`next_data_version`), except that a chunk rewritten with the bytes it had
/// (`same_bytes`: damaged or outdated, decoded, not changed by this write) keeps the version naming them when the
/// compare-and-set can reach it (above its record): a new number for the same bytes would make a concurrent write's
/// parity naming the old one look outdated for it (ec_sim.rs: a healed chunk's bumped version left a writer's
/// parity undecodable). The chunk healed (`heal`), if this write wrote it there in an earlier attempt, is not
/// written again.
fn write_versions(
    fs: &[Found],
    records: &[u64],
    (same_bytes, heal): (&[bool], Option<usize>),
    known: &Known,
    rewrite: &mut [bool],
    versions: &mut [u64],
) {
    let k = records.len();
    for j in 0..k {
        if !rewrite[j] {
            continue;
        }
        let record = records[j].max(fs[j].version().unwrap_or(0));
        if same_bytes[j] && versions[j] == record && Some(j) == heal && known.landed_at(j, record) {
            rewrite[j] = false;
        } else if !(same_bytes[j] && versions[j] > record) {
            versions[j] = next_data_version(j, record, &fs[k..]);
        }
    }
}

/// The row's data chunks as found into a row buffer (a chunk out of reach from `known`, at the version every
/// intact parity chunk names for it, shown intact in `fs`), which are written (those the run `[s.from, to)`
/// changes and damaged ones, never one left out), and where each chunk's bytes came from (kept without a copy).
fn gather(
    s: &PartialShape,
    to: u64,
    fs: &mut [Found],
    bytes: &[Bytes],
    known: &Known,
    heal: Option<usize>,
) -> (Vec<u8>, Vec<bool>, Vec<Option<Bytes>>) {
    let (k, u) = (s.k, s.u);
    let mut buf = vec![0u8; k * u];
    let mut rewrite = vec![false; k];
    let vectors: Vec<Vec<u64>> = fs[k..]
        .iter()
        .filter_map(|f| match f {
            Found::Intact { parity_of, .. } if parity_of.len() == k => Some(parity_of.clone()),
            _ => None,
        })
        .collect();
    let mut origin: Vec<Option<Bytes>> = vec![None; k];
    for j in 0..k {
        // A chunk left out of this attempt (stale, or its server lost) is not written, even if learnt before.
        let reachable = !matches!(fs[j], Found::Unreachable);
        // Out of reach: the bytes this write knows at the version every intact parity chunk names for it.
        let learnt = match vectors.first() {
            Some(first) if vectors.iter().all(|v| v[j] == first[j]) => known.learnt(j, first[j]).map(|b| (first[j], b)),
            Some(_) => None,
            None => known.newest(j).map(|(v, b)| (*v, b)),
        };
        match (&fs[j], learnt) {
            (Found::Intact { .. }, _) => {
                buf[j * u..(j + 1) * u].copy_from_slice(&bytes[j]);
                origin[j] = Some(bytes[j].clone());
            }
            (Found::Unreachable, Some((version, b))) if Some(j) != heal => {
                buf[j * u..(j + 1) * u].copy_from_slice(b);
                origin[j] = Some(b.clone());
                fs[j] = Found::Intact { version, parity_of: Vec::new() };
            }
            _ => {}
        }
        rewrite[j] = reachable && (s.changes(j, to) || matches!(fs[j], Found::Damaged { .. }));
    }
    (buf, rewrite, origin)
}

/// Decodes the chunks `plan` does not use into `buf` and keeps every data chunk of the row but those in `unknown`
/// in `known` at its version, for a retry: by reference when used as read (or learnt before), a copy only when
/// decoded. Returns the row's data versions.
#[allow(clippy::too_many_arguments)]
fn decode_and_keep(
    k: usize,
    u: usize,
    codec: &Codec,
    plan: &RowPlan,
    buf: &mut [u8],
    bytes: &[Bytes],
    mut origin: Vec<Option<Bytes>>,
    known: &mut Known,
    unknown: &[usize],
) -> Result<Vec<u64>, String> {
    if plan.use_chunk[..k].iter().any(|used| !used) {
        let mut shards: Vec<Option<Vec<u8>>> = (0..plan.use_chunk.len())
            .map(|i| {
                plan.use_chunk[i].then(|| if i < k { buf[i * u..(i + 1) * u].to_vec() } else { bytes[i].to_vec() })
            })
            .collect();
        codec.reconstruct_data(&mut shards)?;
        for (j, sh) in shards.iter().take(k).enumerate() {
            buf[j * u..(j + 1) * u].copy_from_slice(sh.as_ref().expect("reconstructed"));
        }
    }
    for j in (0..k).filter(|j| !unknown.contains(j)) {
        let kept = match origin[j].take() {
            Some(b) if plan.use_chunk[j] => b,
            _ => Bytes::copy_from_slice(&buf[j * u..(j + 1) * u]),
        };
        known.learn(j, plan.data_versions[j], kept);
    }
    Ok(plan.data_versions.clone())
}

/// A row the version rule cannot decode as found, decoded with what this write knows (docs/format.md §17, "A
/// version names one content"). Each data chunk not found intact is taken at its newest version (the highest an
/// intact parity chunk names for it: anything older was replaced by a later write), known to this write at it
/// (learnt or named in an earlier attempt) or decoded from a group of parity chunks naming it, with every other
/// data chunk at the version that group names, found intact at it or known at it. Groups are tried as the rule
/// orders them (the largest, then the greatest vector). This rescues writers whose parity writes split while
/// chunks are out of reach: each knows the versions the other overwrote. The data chunks found intact keep their
/// bytes and versions. Returns the row's data versions, `None` when a chunk cannot be had at its newest version
/// (ec_sim.rs: decoding one at an older version wrote an acknowledged write's bytes over).
#[allow(clippy::too_many_arguments)]
fn decode_with_known(
    k: usize,
    u: usize,
    cut: usize,
    codec: &Codec,
    fs: &[Found],
    bytes: &[Bytes],
    known: &mut Known,
    buf: &mut [u8],
) -> Option<Vec<u64>> {
    let newest = newest_named(k, &fs[k..], cut);
    let groups = parity_groups(k, &fs[k..]);
    let mut versions: Vec<u64> = fs[..k].iter().map(|f| f.version().unwrap_or(0)).collect();
    // Chunks from `cut` on are zeros (past the end, §16): nothing to decode.
    let not_found: Vec<usize> = (0..cut).filter(|&j| !matches!(fs[j], Found::Intact { .. })).collect();
    let mut got: Vec<(usize, Bytes)> = Vec::with_capacity(not_found.len());
    for &j in &not_found {
        let chunk = match known.learnt(j, newest[j]) {
            Some(b) => b.clone(),
            None => groups.iter().filter(|(v, _)| v[j] == newest[j]).find_map(|(vector, members)| {
                decode_group(k, codec, fs, bytes, known, vector, members).map(|mut shards| shards.swap_remove(j))
            })?,
        };
        got.push((j, chunk));
    }
    for (j, chunk) in got {
        buf[j * u..(j + 1) * u].copy_from_slice(&chunk);
        known.learn(j, newest[j], chunk);
        versions[j] = newest[j];
    }
    Some(versions)
}

/// The `k` data chunks at the versions `vector` names, decoded from the parity chunks `members` and every data
/// chunk found intact at its version or known at it; `None` when too few.
fn decode_group(
    k: usize,
    codec: &Codec,
    fs: &[Found],
    bytes: &[Bytes],
    known: &Known,
    vector: &[u64],
    members: &[usize],
) -> Option<Vec<Bytes>> {
    // A chunk `gather` took from `known` (out of reach, shown intact) has no bytes read: its bytes are known.
    let at = |i: usize| match &fs[i] {
        Found::Intact { version, .. } if *version == vector[i] && !bytes[i].is_empty() => Some(bytes[i].clone()),
        _ => known.learnt(i, vector[i]).cloned(),
    };
    let inputs: Vec<Option<Bytes>> = (0..k).map(at).collect();
    if inputs.iter().flatten().count() + members.len() < k {
        return None;
    }
    let mut shards: Vec<Option<Vec<u8>>> = inputs.iter().map(|b| b.as_ref().map(|b| b.to_vec())).collect();
    shards.extend((0..fs.len() - k).map(|p| members.contains(&(k + p)).then(|| bytes[k + p].to_vec())));
    codec.reconstruct_data(&mut shards).ok()?;
    Some(shards.into_iter().take(k).map(|s| Bytes::from(s.expect("reconstructed"))).collect())
}

/// The intact parity chunks' vectors, each with the chunks naming it: the largest group first, then the greatest
/// vector (the version rule's order).
fn parity_groups(k: usize, parity: &[Found]) -> Vec<(Vec<u64>, Vec<usize>)> {
    let mut groups: Vec<(Vec<u64>, Vec<usize>)> = Vec::new();
    for (p, f) in parity.iter().enumerate() {
        let Found::Intact { version, parity_of } = f else { continue };
        let Some(v) = vector_of(k, *version, parity_of) else { continue };
        match groups.iter_mut().find(|(w, _)| *w == v) {
            Some((_, members)) => members.push(k + p),
            None => groups.push((v, vec![k + p])),
        }
    }
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| b.0.cmp(&a.0)));
    groups
}

/// Whether a chunk that is not intact holds bytes a write of `[s.from, to)` keeps (outside the new bytes, below
/// the old size).
fn loses_kept_bytes(s: &PartialShape, to: u64, fs: &[Found]) -> bool {
    let unit = s.u as u64;
    fs[..s.k].iter().enumerate().any(|(j, f)| {
        let (lo, hi) = (s.base + j as u64 * unit, (s.base + (j as u64 + 1) * unit).min(s.old_size));
        !matches!(f, Found::Intact { .. }) && ((lo < hi.min(s.from)) || (to.max(lo) < hi))
    })
}

/// The findings with every chunk a delta write of this write replaced (found intact at the version it wrote)
/// shown as it was before (its old version), and those chunks' bytes in `buf` put back as they were; `None` when
/// no chunk was replaced or none is still as the delta write left it.
fn as_before_delta(
    k: usize,
    u: usize,
    fs: &[Found],
    replaced: &[Option<Replaced>],
    buf: &mut [u8],
    origin: &mut [Option<Bytes>],
) -> Option<Vec<Found>> {
    let mut out = fs.to_vec();
    let mut any = false;
    for (j, r) in replaced.iter().enumerate().take(k) {
        let Some(r) = r else { continue };
        if !matches!(&fs[j], Found::Intact { version, .. } if *version == r.written) || r.lo + r.old.len() > u {
            continue;
        }
        buf[j * u + r.lo..j * u + r.lo + r.old.len()].copy_from_slice(&r.old);
        origin[j] = None;
        out[j] = Found::Intact { version: r.old_version, parity_of: Vec::new() };
        any = true;
    }
    any.then_some(out)
}

/// Plans whole rows: every data chunk not left out is written, each at a version above every one named for it.
fn plan_whole(g: &Geom, rows: u64, read: &Read, heal: Option<usize>, new: &RowBytes) -> Planned {
    let rewrite: Vec<bool> = (0..g.k).map(|j| !read.skip.contains(&j)).collect();
    let ver = |j: usize, row: usize| if read.skip.contains(&j) { 0 } else { read.found[j][row].version };
    let data_versions = (0..rows as usize)
        .map(|row| {
            let pf: Vec<Found> = (g.k..g.k + g.m).map(|i| read.found(i, row, false, heal)).collect();
            // A chunk left out keeps its old bytes on its server: its new ones are in the parity only.
            let version = |j| match read.skip.contains(&j) {
                true => unreachable_version(j, &pf, weft_rpc::auth::random_id()),
                false => next_data_version(j, ver(j, row), &pf),
            };
            (0..g.k).map(version).collect()
        })
        .collect();
    // Slices of the caller's whole rows as they are (no copy).
    let chunks = match new {
        RowBytes::Run(b) => (0..rows as usize * g.k).map(|c| b.slice(c * g.u..(c + 1) * g.u)).collect(),
        RowBytes::Chunks(c) => c.clone(),
    };
    Planned { chunks, rewrite, data_versions }
}

/// How many bytes of chunk `i` of row `row` a write stores: its §16 stored length, or longer where the chunk on
/// disk or the new one (`fresh`) has non-zero bytes past it (a size this handle has not seen yet, a damaged
/// chunk), so the bytes a record vouches for are exactly the ones computed here.
fn keep_len(
    job: &RowJob<'_>,
    g: &Geom,
    read_found: &[Vec<ChunkVersion>],
    bytes: &[Bytes],
    i: usize,
    row: u64,
    fresh: &[u8],
) -> usize {
    let stored = slot_bytes(job.new_end, job.first + row, g.k, i, g.u as u64) as usize;
    let disk = match (g.partial, g.partial && read_found[i][0].intact) {
        (true, true) => last_nonzero(&bytes[i]),
        (true, false) => g.u,
        (false, _) => 0,
    };
    stored.max(disk.max(last_nonzero(fresh)))
}

/// Step 3: the data chunks the plan writes, each row's chunk cut at [`keep_len`], compare-and-set from the version read.
fn data_writes(
    job: &RowJob<'_>,
    g: &Geom,
    found: &[Vec<ChunkVersion>],
    bytes: &[Bytes],
    planned: &Planned,
) -> Vec<ChunkWrite> {
    assert_eq!(planned.chunks.len(), job.rows as usize * g.k, "k chunks per row");
    let mut writes = Vec::new();
    for j in (0..g.k).filter(|&j| planned.rewrite[j]) {
        let mut payload = Vec::with_capacity(job.rows as usize);
        let mut recs = Vec::with_capacity(job.rows as usize);
        for row in 0..job.rows {
            let c = &planned.chunks[row as usize * g.k + j];
            payload.push(c.slice(..keep_len(job, g, found, bytes, j, row, c)));
            let expect = found[j][row as usize].version;
            recs.push(RowWrite { expect, version: planned.data_versions[row as usize][j], parity_of: Vec::new() });
        }
        writes.push((j, recs, payload));
    }
    writes
}

/// Step 4: every parity chunk encoded straight into one buffer per parity server (rows back to back), sent in
/// slices, compare-and-set from the version read with the rows' data versions; and the buffers, to give back.
fn parity_writes(
    job: &RowJob<'_>,
    g: &Geom,
    found: &[Vec<ChunkVersion>],
    bytes: &[Bytes],
    planned: &Planned,
    skip: &[usize],
) -> (Vec<ChunkWrite>, Vec<Bytes>) {
    let shards: Vec<&[u8]> = planned.chunks.iter().map(|c| &c[..]).collect();
    let pbuf = encode_parity(job.codec, &shards, g.u, job.file.client.recycled());
    let mut writes = Vec::new();
    let mut sent = Vec::with_capacity(g.m);
    for (p, pb) in pbuf.into_iter().enumerate() {
        let pb = pb.freeze();
        sent.push(pb.clone());
        if skip.contains(&(g.k + p)) {
            continue;
        }
        let mut payload = Vec::with_capacity(job.rows as usize);
        let mut recs = Vec::with_capacity(job.rows as usize);
        for row in 0..job.rows {
            let at = row as usize * g.u;
            let keep = keep_len(job, g, found, bytes, g.k + p, row, &pb[at..at + g.u]);
            let expect = found[g.k + p][row as usize].version;
            let parity_of = planned.data_versions[row as usize].clone();
            recs.push(RowWrite { expect, version: expect.saturating_add(1), parity_of });
            payload.push(pb.slice(at..at + keep));
        }
        writes.push((g.k + p, recs, payload));
    }
    (writes, sent)
}

/// After the writes: a heal that could not write what it heals fails (the range stays stale), as does a failed
/// task; up to `m` unavailable servers have the rows each missed (stale ones too: they were skipped in every row)
/// recorded stale before this write is acknowledged.
async fn finish(
    job: &RowJob<'_>,
    g: &Geom,
    skip: &[usize],
    mut lost: Vec<(usize, ClientError)>,
) -> Result<Attempt, ClientError> {
    if let Some(pos) = lost.iter().position(|(i, _)| *i == usize::MAX || Some(*i) == job.heal) {
        let (i, e) = lost.swap_remove(pos);
        return Err(if i == usize::MAX { e } else { job.degraded(g, i, &format!("healing: {e}")) });
    }
    let missed_n = skip.len() + lost.iter().filter(|(i, _)| !skip.contains(i)).count();
    if missed_n > g.m && healed_meanwhile(job, skip).await? {
        // Too many missed, but a chunk left out as stale has been healed since: the data chunks written in place
        // need parity naming them there, so the write is tried again with it rather than failed (ec_sim.rs
        // found a write at zero margin, its stale view out of date, overwrite data chunks and fail when one more
        // server went down, leaving the healed parity naming bytes it had destroyed).
        return Ok(Attempt::Moved);
    }
    let mut missed: Vec<(usize, ClientError)> = skip
        .iter()
        .filter(|i| !lost.iter().any(|(j, _)| j == *i))
        .map(|&i| (i, ClientError::Protocol(format!("chunk {i} is stale"))))
        .collect();
    crate::stale::refetch_if_fenced(job.file, &lost).await?;
    missed.extend(lost);
    if !missed.is_empty() {
        let hook = job.file.client.test_hooks().degraded();
        if let Some(hook) = hook {
            hook(job.file.attr.ino, job.first).await;
        }
    }
    crate::stale::record_missed(job.file, missed, g.base, job.first, job.first + job.rows).await?;
    Ok(Attempt::Done)
}

/// Whether a chunk of `skip` left out as stale by this handle's view is no longer stale at the MDS.
async fn healed_meanwhile(job: &RowJob<'_>, skip: &[usize]) -> Result<bool, ClientError> {
    let (first, end) = (job.first, job.first + job.rows);
    let view = crate::stale::stale_slots(job.file, first, end).await?;
    let mut stale: Vec<usize> = view.into_iter().filter(|i| skip.contains(i)).collect();
    Ok(!crate::stale::healed_since(job.file, &mut stale, first, end).await?.is_empty())
}

/// The stored bytes (§16) of chunk `slot` of row `row` in a file of `size` bytes.
pub(crate) fn slot_bytes(size: u64, row: u64, k: usize, slot: usize, unit: u64) -> u64 {
    let row_bytes = unit * k as u64;
    let row_len = size.saturating_sub(row * row_bytes).min(row_bytes);
    if slot < k { row_len.saturating_sub(slot as u64 * unit).min(unit) } else { row_len.min(unit) }
}

/// The length of `b` without its trailing zeros.
pub(crate) fn last_nonzero(b: &[u8]) -> usize {
    b.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1)
}

pub(crate) fn torn(file: &File, file_offset: u64, cause: impl std::fmt::Display) -> ClientError {
    ClientError::TornRow { ino: file.attr.ino, file_offset, cause: cause.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = 4;
    const U: usize = 16;

    /// A row of `K` data chunks (chunk `j` all `10 + j`) and its 2 parity chunks, as stored.
    fn row() -> (Codec, Vec<Bytes>) {
        let codec = Codec::new(K, 2).unwrap();
        let data: Vec<Vec<u8>> = (0..K).map(|j| vec![10 + j as u8; U]).collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let parity = codec.encode(&refs);
        (codec, data.into_iter().chain(parity).map(Bytes::from).collect())
    }

    /// Data chunks at versions `v`, both parity chunks naming `v`.
    fn intact(v: [u64; K]) -> Vec<Found> {
        let data = v.iter().map(|&version| Found::Intact { version, parity_of: vec![] });
        data.chain((0..2).map(|_| Found::Intact { version: 7, parity_of: v.to_vec() })).collect()
    }

    fn shape(from: u64, old_size: u64) -> PartialShape {
        PartialShape { k: K, u: U, base: 0, from, old_size, random: 12345 }
    }

    fn expected(patch: &[(usize, u8, usize)]) -> Vec<u8> {
        let mut r: Vec<u8> = (0..K).flat_map(|j| vec![10 + j as u8; U]).collect();
        for &(at, b, n) in patch {
            r[at..at + n].fill(b);
        }
        r
    }

    #[test]
    fn an_intact_row_takes_the_new_bytes_and_writes_only_the_chunks_they_change() {
        let (codec, bytes) = row();
        let mut known = Known::default();
        let run = Bytes::from(vec![1u8; 20]);
        let p = plan_partial(&shape(20, 64), &codec, intact([3, 4, 5, 6]), &bytes, &mut known, None, &run).unwrap();
        assert_eq!(p.row, expected(&[(20, 1, 20)]));
        assert_eq!(p.rewrite, vec![false, true, true, false]);
        // Above the chunk's version and every version the parity names for it.
        assert_eq!(p.versions, vec![3, 5, 6, 6]);
        assert!(known.chunks.len() == K && known.chunks.iter().all(|c| !c.is_empty()), "every chunk kept for a retry");
    }

    #[test]
    fn an_unreachable_chunk_is_decoded_and_not_written() {
        let (codec, bytes) = row();
        let mut fs = intact([3, 4, 5, 6]);
        fs[2] = Found::Unreachable;
        let run = Bytes::from(vec![1u8; 4]);
        let p = plan_partial(&shape(0, 64), &codec, fs, &bytes, &mut Known::default(), None, &run).unwrap();
        assert_eq!(p.row, expected(&[(0, 1, 4)]), "chunk 2 decoded from the parity");
        assert_eq!(p.rewrite, vec![true, false, false, false]);
        assert_eq!(p.versions, vec![4, 4, 5, 6]);
    }

    #[test]
    fn a_learnt_chunk_is_used_only_at_the_version_the_parity_names() {
        let (codec, bytes) = row();
        let run = Bytes::from(vec![1u8; 4]);
        // Learnt at version 5, the one the parity names: used as it is (here its bytes differ from the stored
        // row's, so the plan shows which one it took).
        let mut known =
            Known { chunks: vec![vec![], vec![], vec![(5, Bytes::from(vec![99u8; U]))], vec![]], ..Known::default() };
        let mut fs = intact([3, 4, 5, 6]);
        fs[2] = Found::Unreachable;
        let p = plan_partial(&shape(0, 64), &codec, fs.clone(), &bytes, &mut known, None, &run).unwrap();
        assert_eq!(p.row, expected(&[(0, 1, 4), (32, 99, 16)]));
        // Learnt at another version: decoded from the parity instead.
        let mut known =
            Known { chunks: vec![vec![], vec![], vec![(4, Bytes::from(vec![99u8; U]))], vec![]], ..Known::default() };
        let p = plan_partial(&shape(0, 64), &codec, fs, &bytes, &mut known, None, &run).unwrap();
        assert_eq!(p.row, expected(&[(0, 1, 4)]));
    }

    #[test]
    fn a_damaged_chunk_is_decoded_and_rewritten() {
        let (codec, mut bytes) = row();
        bytes[0] = Bytes::from(vec![0xeeu8; U]);
        let mut fs = intact([3, 4, 5, 6]);
        fs[0] = Found::Damaged { version: 3 };
        let run = Bytes::from(vec![1u8; 4]);
        let p = plan_partial(&shape(60, 64), &codec, fs, &bytes, &mut Known::default(), None, &run).unwrap();
        assert_eq!(p.row, expected(&[(60, 1, 4)]), "chunk 0's damaged bytes never used");
        assert_eq!(p.rewrite, vec![true, false, false, true]);
        assert_eq!(p.versions, vec![4, 4, 5, 7]);
    }

    #[test]
    fn a_damaged_chunk_rewritten_with_its_bytes_keeps_the_version_naming_them() {
        let (codec, mut bytes) = row();
        bytes[0] = Bytes::from(vec![0xeeu8; U]);
        let mut fs = intact([3, 4, 5, 6]);
        // Its record is below the version the parity names for it: written at that version, not above it.
        fs[0] = Found::Damaged { version: 2 };
        let run = Bytes::from(vec![1u8; 4]);
        let p = plan_partial(&shape(60, 64), &codec, fs.clone(), &bytes, &mut Known::default(), None, &run).unwrap();
        assert_eq!(p.row, expected(&[(60, 1, 4)]));
        assert_eq!(p.versions, vec![3, 4, 5, 7]);
        // A heal of chunk 0 that wrote it there in an earlier attempt does not write it again.
        fs[0] = Found::Damaged { version: 3 };
        let mut known = Known::default();
        known.landed(0, 3, Bytes::from(vec![10u8; U]));
        let p = plan_partial(&shape(0, 64), &codec, fs.clone(), &bytes, &mut known, Some(0), &Bytes::new()).unwrap();
        assert_eq!((p.rewrite, p.versions), (vec![false; K], vec![3, 4, 5, 6]));
        // Damaged on its own (not the chunk healed): rewritten above its record.
        let p = plan_partial(&shape(0, 64), &codec, fs, &bytes, &mut known, None, &Bytes::new()).unwrap();
        assert_eq!((p.rewrite, p.versions), (vec![true, false, false, false], vec![4, 4, 5, 6]));
    }

    #[test]
    fn an_undecodable_row_fails_only_where_it_would_lose_kept_bytes() {
        let (codec, bytes) = row();
        // Three data chunks out of reach and one parity: too few to decode.
        let mut fs = intact([3, 4, 5, 6]);
        for i in [1, 2, 3, 4] {
            fs[i] = Found::Unreachable;
        }
        let run = Bytes::from(vec![1u8; 4]);
        let e = plan_partial(&shape(0, 64), &codec, fs.clone(), &bytes, &mut Known::default(), None, &run);
        assert!(e.is_err(), "chunks 1 to 3 hold bytes below the size");
        // A file whose bytes end inside chunk 0: the unreachable chunks hold nothing it keeps.
        let p = plan_partial(&shape(0, 10), &codec, fs, &bytes, &mut Known::default(), None, &run).unwrap();
        assert_eq!(&p.row[..4], &[1u8; 4]);
        assert_eq!(p.rewrite, vec![true, false, false, false]);
    }

    #[test]
    fn a_healed_chunk_is_rewritten_from_the_others() {
        let (codec, bytes) = row();
        let mut fs = intact([3, 4, 5, 6]);
        fs[3] = Found::Damaged { version: 6 };
        let p = plan_partial(&shape(0, 64), &codec, fs, &bytes, &mut Known::default(), Some(3), &Bytes::new()).unwrap();
        assert_eq!(p.row, expected(&[]));
        assert_eq!(p.rewrite, vec![false, false, false, true]);
        assert_eq!(p.versions, vec![3, 4, 5, 7]);
    }

    /// A delta write of this write replaced bytes [4, 8) of chunk 2 (version 5 → 9, the old bytes `12`) and lost
    /// its parity compare-and-set: both parity chunks still name version 5. With chunk 1's server down the row
    /// decodes with chunk 2 as it was, which the parity encodes, or without chunk 2; the plan then writes chunk 2
    /// above 9.
    #[test]
    fn a_chunk_a_delta_write_replaced_is_planned_as_it_was_when_the_parity_names_that() {
        let (codec, mut bytes) = row();
        let mut now = vec![12u8; U];
        now[4..8].fill(77);
        bytes[2] = Bytes::from(now);
        let mut fs = intact([3, 4, 5, 6]);
        fs[1] = Found::Unreachable;
        fs[2] = Found::Intact { version: 9, parity_of: vec![] };
        let run = Bytes::from(vec![1u8; 4]);
        // Without what the delta write replaced, the version rule finds no parity agreeing with every data chunk
        // found; chunk 1 is still decoded from chunks 0 and 3 and the parity at the versions it names, which leaves
        // chunk 2 out of the decode (decode_with_known), and the same plan results.
        assert!(crate::ec_version::plan_row(K, 2, &fs).is_err());
        let p = plan_partial(&shape(36, 64), &codec, fs.clone(), &bytes, &mut Known::default(), None, &run).unwrap();
        assert_eq!(p.row, expected(&[(36, 1, 4)]), "chunk 1 decoded right; the run laid in");
        assert_eq!(p.versions, vec![3, 4, 10, 6]);
        let replaced = Replaced { written: 9, old_version: 5, lo: 4, old: Bytes::from(vec![12u8; 4]) };
        let mut known = Known::after_delta(vec![None, None, Some(replaced), None]);
        let p = plan_partial(&shape(36, 64), &codec, fs, &bytes, &mut known, None, &run).unwrap();
        assert_eq!(p.row, expected(&[(36, 1, 4)]), "chunk 1 decoded right; the run laid in again");
        assert_eq!(p.rewrite, vec![false, false, true, false]);
        assert_eq!(p.versions, vec![3, 4, 10, 6], "above the version the delta write left on disk");
    }
}
