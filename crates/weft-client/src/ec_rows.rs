//! Versioned stripe rows of ec files on the wire (docs/format.md §17): the write protocol that closes the write
//! hole, and the degraded decode that trusts only chunks whose versions agree ([`crate::ec_version`]).
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

use bytes::{Bytes, BytesMut};
use std::time::Duration;
use tokio::task::JoinSet;
use weft_proto::msg::{ChunkVersion, EC_K_MAX, ROWS_PER_REQUEST_MAX, ReadRowsReq, RowWrite, WriteRowsReq};
use weft_proto::{Capability, ErrorCode, Layout, Request, Response};

use crate::ClientError;
use crate::capability::is_expired;
use crate::ec_codec::{Codec, is_chunk_loss};
use crate::ec_version::{Found, next_data_version, plan_row};
use crate::file::{File, Io};
use crate::recycle::Recycled;

/// How many times a row write is tried when other writers keep moving its versions.
pub(crate) const WRITE_ATTEMPTS_MAX: u32 = 16;

/// Rows per `ReadRows`/`WriteRows` request: a transfer unit's worth (at least one row).
fn rows_per_request(io: &Io, unit: u64) -> u64 {
    (io.unit_max / unit).clamp(1, u64::from(ROWS_PER_REQUEST_MAX))
}

/// One call to the data server of `layout.servers[i]`; an expired capability is renewed and the call sent once
/// more. `dest`: the buffer the reply's payload lands in, if it has one (a fresh one of its length on a resend).
pub(crate) async fn call(
    io: &Io,
    layout: &Layout,
    i: usize,
    make: impl Fn(Capability) -> Request,
    data: Vec<Bytes>,
    mut dest: Option<BytesMut>,
) -> Result<(Response, Option<BytesMut>), ClientError> {
    let server = layout.servers[i];
    let ds = io.client.data_server(server).await?;
    let mut cap = io.caps.get().await?;
    let mut renewed = false;
    let dest_len = dest.as_ref().map(|d| d.len());
    loop {
        let d = match dest.take() {
            Some(d) => vec![d],
            None => dest_len.map(|n| vec![BytesMut::zeroed(n)]).unwrap_or_default(),
        };
        match ds.call(make(cap.clone()), data.clone(), d).await {
            Ok((resp, mut d)) => return Ok((resp, d.pop())),
            Err(source) if !renewed && is_expired(&source) => {
                cap = io.caps.renew_from(&cap).await?;
                renewed = true;
            }
            Err(source) => return Err(ClientError::Data { server, source }),
        }
    }
}

/// Requests of one chunk's rows in flight at once (reads and writes): several, so one server's transfer units
/// follow each other without a round trip between them; bounded, so a batch holds a bounded number of calls.
const REQUESTS_IN_FLIGHT_MAX: usize = 4;

/// Rows `[first, first + rows)` cut into requests of at most `per` rows: `(first_row, rows)` each, in order.
pub(crate) fn request_spans(first: u64, rows: u64, per: u64) -> Vec<(u64, u64)> {
    assert!(per > 0, "at least one row per request");
    let mut out = Vec::with_capacity(rows.div_ceil(per) as usize);
    let mut r = first;
    while r < first + rows {
        let n = per.min(first + rows - r);
        out.push((r, n));
        r += n;
    }
    out
}

/// The records (and with `with_data` the bytes, `rows × unit`) of rows `[first, first + rows)` of chunk `i`.
/// The requests (a transfer unit each) go [`REQUESTS_IN_FLIGHT_MAX`] at a time, each reply landing in its part
/// of one buffer (no copy).
pub(crate) async fn read_rows(
    io: &Io,
    layout: &Layout,
    i: usize,
    first: u64,
    rows: u64,
    with_data: bool,
) -> Result<(Vec<ChunkVersion>, BytesMut), ClientError> {
    let unit = u64::from(layout.stripe_unit);
    let spans = request_spans(first, rows, rows_per_request(io, unit));
    // A reused buffer (no page faults): every byte is overwritten, since a reply must carry exactly its length.
    let mut buf = if with_data { io.client.recycled().take((rows * unit) as usize) } else { BytesMut::new() };
    let mut parts: Vec<Option<(Vec<ChunkVersion>, BytesMut)>> = vec![None; spans.len()];
    let mut tasks = JoinSet::new();
    for (n, &(r, len)) in spans.iter().enumerate() {
        while tasks.len() >= REQUESTS_IN_FLIGHT_MAX {
            let (n, got) = joined(tasks.join_next().await)?;
            parts[n] = Some(got);
        }
        let dest = with_data.then(|| buf.split_to((len * unit) as usize));
        let (io, layout) = (io.clone(), layout.clone());
        tasks.spawn(async move { (n, read_request(&io, &layout, i, r, len, with_data, dest).await) });
    }
    while let Some(j) = tasks.join_next().await {
        let (n, got) = joined(Some(j))?;
        parts[n] = Some(got);
    }
    let mut versions = Vec::with_capacity(rows as usize);
    let mut bytes = BytesMut::new();
    for (v, d) in parts.into_iter().map(|p| p.expect("every request answered")) {
        versions.extend(v);
        // Adjacent parts of one allocation join without a copy.
        bytes.unsplit(d);
    }
    Ok((versions, bytes))
}

/// What `JoinSet::join_next` gives for a request task: `(its index, its outcome)`.
type Joined<T> = Option<Result<(usize, Result<T, ClientError>), tokio::task::JoinError>>;

/// A request task's outcome, its failure (or its task's) as an error.
fn joined<T>(r: Joined<T>) -> Result<(usize, T), ClientError> {
    match r {
        Some(Ok((n, Ok(x)))) => Ok((n, x)),
        Some(Ok((_, Err(e)))) => Err(e),
        Some(Err(e)) => Err(ClientError::Protocol(format!("request task failed: {e}"))),
        None => Err(ClientError::Protocol("no request in flight".into())),
    }
}

/// One `ReadRows` of rows `[r, r + n)` of chunk `i`, its bytes into `dest` (`n × unit`) when given.
async fn read_request(
    io: &Io,
    layout: &Layout,
    i: usize,
    r: u64,
    n: u64,
    with_data: bool,
    dest: Option<BytesMut>,
) -> Result<(Vec<ChunkVersion>, BytesMut), ClientError> {
    let req = |cap| {
        Request::ReadRows(ReadRowsReq {
            ino: io.ino,
            unit: layout.stripe_unit,
            first_row: r,
            rows: n as u32,
            data: with_data,
            cap,
        })
    };
    let want = dest.as_ref().map_or(0, |d| d.len());
    let (resp, d) = call(io, layout, i, req, Vec::new(), dest).await?;
    let Response::ReadRows(v) = resp else {
        return Err(ClientError::Protocol(format!("ReadRows answered {:?}", resp.op())));
    };
    if v.len() as u64 != n || v.iter().any(|c| c.parity_of.len() > EC_K_MAX) {
        return Err(ClientError::Protocol(format!("ReadRows answered {} records for {n} rows", v.len())));
    }
    let d = d.unwrap_or_default();
    if d.len() != want {
        return Err(ClientError::Protocol(format!("ReadRows sent {} bytes for {want}", d.len())));
    }
    Ok((v, d))
}

/// Writes chunk `i` of rows `first..` (`payload`: one segment per row, each the row's whole chunk but the last,
/// which may be short) with the given compare-and-set records. The requests (a transfer unit each) go
/// [`REQUESTS_IN_FLIGHT_MAX`] at a time; segments are sent as they are (slices of the caller's buffers, no copy).
async fn write_rows(
    io: &Io,
    layout: &Layout,
    i: usize,
    first: u64,
    rows: Vec<RowWrite>,
    payload: Vec<Bytes>,
) -> Result<(), ClientError> {
    assert_eq!(rows.len(), payload.len(), "one segment per row");
    let unit = u64::from(layout.stripe_unit);
    let spans = request_spans(0, rows.len() as u64, rows_per_request(io, unit));
    let mut tasks = JoinSet::new();
    for (n, (at, len)) in spans.into_iter().enumerate() {
        while tasks.len() >= REQUESTS_IN_FLIGHT_MAX {
            joined(tasks.join_next().await)?;
        }
        let (a, b) = (at as usize, (at + len) as usize);
        let (recs, segs) = (rows[a..b].to_vec(), payload[a..b].to_vec());
        let (io, layout) = (io.clone(), layout.clone());
        tasks.spawn(async move {
            let req = |cap| {
                Request::WriteRows(WriteRowsReq {
                    ino: io.ino,
                    unit: layout.stripe_unit,
                    first_row: first + at,
                    rows: recs.clone(),
                    cap,
                })
            };
            let segs: Vec<Bytes> = segs.into_iter().filter(|s| !s.is_empty()).collect();
            (n, call(&io, &layout, i, req, segs, None).await.map(|_| ()))
        });
    }
    while let Some(j) = tasks.join_next().await {
        joined(Some(j))?;
    }
    Ok(())
}

/// Chunk reads from every server in `which`, all at once: `(i, records, bytes)`, errors per chunk.
async fn read_all(
    io: &Io,
    layout: &Layout,
    which: impl Iterator<Item = usize>,
    first: u64,
    rows: u64,
    with_data: bool,
) -> Vec<(usize, Result<(Vec<ChunkVersion>, BytesMut), ClientError>)> {
    let mut tasks = JoinSet::new();
    for i in which {
        let (io, layout) = (io.clone(), layout.clone());
        tasks.spawn(async move { (i, read_rows(&io, &layout, i, first, rows, with_data).await) });
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(x) => out.push(x),
            Err(e) => out.push((usize::MAX, Err(ClientError::Protocol(format!("read task failed: {e}"))))),
        }
    }
    out
}

/// What writing to every server at once ended with.
enum Written {
    /// Another writer moved a version: the caller retries the row.
    Moved,
    /// Every write landed, or these servers failed (not with a moved version).
    Failed(Vec<(usize, ClientError)>),
}

/// Writes to every server at once.
async fn write_all(io: &Io, layout: &Layout, writes: Vec<(usize, Vec<RowWrite>, Vec<Bytes>)>, first: u64) -> Written {
    let mut tasks = JoinSet::new();
    for (i, rows, payload) in writes {
        let (io, layout) = (io.clone(), layout.clone());
        tasks.spawn(async move { (i, write_rows(&io, &layout, i, first, rows, payload).await) });
    }
    let mut failed = Vec::new();
    let mut moved = false;
    while let Some(r) = tasks.join_next().await {
        let (i, r) = r.unwrap_or_else(|e| (usize::MAX, Err(ClientError::Protocol(format!("write task failed: {e}")))));
        if let Err(e) = r {
            moved |= e.code() == Some(ErrorCode::VersionMoved);
            failed.push((i, e));
        }
    }
    if moved { Written::Moved } else { Written::Failed(failed) }
}

fn found_of(c: &ChunkVersion, checked: bool) -> Found {
    if c.intact || !checked {
        Found::Intact { version: c.version, parity_of: c.parity_of.clone() }
    } else {
        Found::Damaged { version: c.version }
    }
}

/// What one attempt of a row write ended with.
enum Attempt {
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

/// Writes file bytes `new` at file offset `from` of rows `[first, first + rows)` of an ec file: either one row
/// that `[from, from + new.len())` covers only partly, or whole rows. `old_size` is the file size the caller
/// knows (bytes of a damaged chunk at or past it need no decoding); `new_end` the size after this write. `read_io`
/// reads the rows (a handle's read capability), `file.io()` writes.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn write_batch(
    file: &File,
    read_io: &Io,
    write_io: &Io,
    codec: &Codec,
    first: u64,
    rows: u64,
    from: u64,
    new: &RowBytes,
    old_size: u64,
    new_end: u64,
) -> Result<(), ClientError> {
    let unit = u64::from(file.layout().stripe_unit);
    let row_bytes = unit * codec.k as u64;
    let base = first * row_bytes;
    let mut attempt = 0;
    let (mut torn_tries, mut torn_backoff_ms) = (0, TORN_BACKOFF_MS_MIN);
    let mut known = Known::default();
    loop {
        attempt += 1;
        let done =
            write_attempt(file, read_io, write_io, codec, first, rows, from, new, old_size, new_end, None, &mut known);
        match done.await {
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
                        ino: file.attr.ino,
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
fn encode_parity(codec: &Codec, chunks: &[&[u8]], u: usize, bufs: &Recycled) -> Vec<BytesMut> {
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
#[derive(Default)]
pub(crate) struct Known {
    /// Per data chunk: its version and bytes (a reference to the reply it was read in, or a copy if decoded).
    chunks: Vec<Option<(u64, Bytes)>>,
    read_data: bool,
}

impl Known {
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
            if !c.intact {
                return None;
            }
            let v = if c.version == 0 && c.parity_of.is_empty() { vec![0; k] } else { c.parity_of.clone() };
            if v.len() != k || agreed.as_ref().is_some_and(|a| *a != v) {
                return None;
            }
            agreed = Some(v);
        }
        out.push(agreed?);
    }
    Some(out)
}

#[allow(clippy::too_many_arguments)]
async fn write_attempt(
    file: &File,
    read_io: &Io,
    write_io: &Io,
    codec: &Codec,
    first: u64,
    rows: u64,
    from: u64,
    new: &RowBytes,
    old_size: u64,
    new_end: u64,
    heal: Option<usize>,
    known: &mut Known,
) -> Result<Attempt, ClientError> {
    let layout = &file.layout();
    let (k, m) = (codec.k, codec.m);
    let unit = u64::from(layout.stripe_unit);
    let u = unit as usize;
    let row_bytes = unit * k as u64;
    let base = first * row_bytes;
    let to = from + new.len();
    let partial = rows == 1 && (from > base || to < base + row_bytes);
    assert!(partial || (from == base && to == base + rows * row_bytes), "one partial row or whole rows");
    let degraded = |i: usize, e: &dyn std::fmt::Display| ClientError::DegradedWrite {
        ino: file.attr.ino,
        file_offset: base,
        server: layout.servers.get(i).copied().unwrap_or(u32::MAX),
        cause: e.to_string(),
    };
    // Chunks in a stale range (§18) are neither read nor written: the healer rewrites them. The one being healed
    // is read for its records (compare-and-set) but its bytes are not trusted (`Damaged`), so it is rewritten.
    let mut skip: Vec<usize> =
        crate::stale::stale_slots(file, first, first + rows).await?.into_iter().filter(|&i| Some(i) != heal).collect();
    // Chunks that could not be read or written in this attempt (a server down): recorded stale before Ok.
    let mut lost: Vec<(usize, ClientError)> = Vec::new();
    // A server that did not answer moments ago is not tried again (while at most m are left out): its chunks are
    // lost for this write at once, as after a failed attempt, so a write stream pays the dead server's connect
    // retries once per hold, not once per row.
    let client = &file.client;
    let down: Vec<usize> = (0..k + m)
        .filter(|&i| !skip.contains(&i) && Some(i) != heal && client.recently_unreachable(layout.servers[i]))
        .collect();
    if !down.is_empty() && skip.len() + down.len() <= m {
        for i in down {
            let server = layout.servers[i];
            lost.push((i, ClientError::Protocol(format!("data server {server} did not answer moments ago"))));
        }
    }
    // 1. Parity records first, 2. then the data chunks' (see the module doc for why this order).
    let mut found: Vec<Vec<ChunkVersion>> = vec![Vec::new(); k + m];
    // Frozen as they arrive (no copy): a partial row's `Known` keeps the chunks read by reference.
    let mut bytes: Vec<Bytes> = vec![Bytes::new(); k + m];
    for phase in [k..k + m, 0..k] {
        let data_phase = phase.start == 0;
        let which: Vec<usize> = phase.filter(|i| !skip.contains(i) && !lost.iter().any(|(j, _)| j == i)).collect();
        if data_phase && !partial && heal.is_none() && !known.read_data {
            // Whole rows: the data chunks' expected versions from the parity's vector, checked by the write itself.
            let parity: Vec<usize> = (k..k + m).filter(|i| !found[*i].is_empty()).collect();
            if let Some(vectors) = vector_expect(k, &found, &parity, rows as usize) {
                for &j in &which {
                    found[j] = vectors
                        .iter()
                        .map(|v| ChunkVersion { version: v[j], intact: true, parity_of: Vec::new() })
                        .collect();
                }
                continue;
            }
        }
        for (i, r) in read_all(read_io, layout, which.into_iter(), first, rows, partial).await {
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
    // A fenced server under a newer layout: nothing is written under this one (the caller retries on the new).
    crate::stale::refetch_if_fenced(file, &lost).await?;
    if skip.len() + lost.len() > m {
        let (i, e) = match lost.pop() {
            Some((i, e)) => (i, e.to_string()),
            None => (skip[0], "stale".to_string()),
        };
        let cause = format!("{e} (more servers of the layout unavailable than its {m} tolerated)");
        return Err(degraded(i, &cause));
    }
    skip.extend(lost.iter().map(|(i, _)| *i));
    let skip = skip;
    // What chunk `i` of row `row` was found as (`Unreachable` when skipped).
    let fnd = |i: usize, row: usize, checked: bool| -> Found {
        if skip.contains(&i) {
            return Found::Unreachable;
        }
        let c = &found[i][row];
        if Some(i) == heal { Found::Damaged { version: c.version } } else { found_of(c, checked) }
    };
    let ver = |i: usize, row: usize| -> u64 { if skip.contains(&i) { 0 } else { found[i][row].version } };
    // The rows' bytes and the data versions they hold after this write.
    // A partial row is assembled in `buf`; whole rows are encoded and sent from the caller's buffer (`new`).
    let mut buf = if partial { vec![0u8; row_bytes as usize] } else { Vec::new() };
    let mut rewrite = vec![false; k];
    let mut data_versions: Vec<Vec<u64>> = Vec::with_capacity(rows as usize);
    let parity_found = |row: usize| -> Vec<Found> { (k..k + m).map(|i| fnd(i, row, partial)).collect() };
    if partial {
        let mut fs: Vec<Found> = (0..k + m).map(|i| fnd(i, 0, true)).collect();
        known.chunks.resize(k, None);
        // The data-version vectors of the parity chunks read intact now: a learnt chunk is used only at the version
        // each of them names for it, so bytes another writer replaced since (an acknowledged write) are never put
        // back into the parity.
        let vectors: Vec<Vec<u64>> = fs[k..]
            .iter()
            .filter_map(|f| match f {
                Found::Intact { parity_of, .. } if parity_of.len() == k => Some(parity_of.clone()),
                _ => None,
            })
            .collect();
        // Where each data chunk's bytes in `buf` came from, so `Known` can keep them without a copy.
        let mut origin: Vec<Option<Bytes>> = vec![None; k];
        for j in 0..k {
            match (&fs[j], &known.chunks[j]) {
                (Found::Intact { .. }, _) => {
                    buf[j * u..(j + 1) * u].copy_from_slice(&bytes[j]);
                    origin[j] = Some(bytes[j].clone());
                }
                // A chunk this write cannot reach now, whose bytes it learnt in an earlier attempt.
                (Found::Unreachable, Some((version, b)))
                    if Some(j) != heal && vectors.iter().all(|v| v[j] == *version) =>
                {
                    buf[j * u..(j + 1) * u].copy_from_slice(b);
                    origin[j] = Some(b.clone());
                    fs[j] = Found::Intact { version: *version, parity_of: Vec::new() };
                }
                _ => {}
            }
            // Chunks it changes, and damaged ones (rewritten whole from the decoded row: their repair).
            let (lo, hi) = (base + j as u64 * unit, base + (j as u64 + 1) * unit);
            rewrite[j] = !skip.contains(&j) && ((lo < to && from < hi) || matches!(fs[j], Found::Damaged { .. }));
        }
        let mut versions: Vec<u64> = fs[..k].iter().map(|f| f.version().unwrap_or(0)).collect();
        match plan_row(k, m, &fs) {
            Ok(plan) => {
                if plan.use_chunk[..k].iter().any(|u| !u) {
                    let mut shards: Vec<Option<Vec<u8>>> = (0..k + m)
                        .map(|i| {
                            plan.use_chunk[i]
                                .then(|| if i < k { buf[i * u..(i + 1) * u].to_vec() } else { bytes[i].to_vec() })
                        })
                        .collect();
                    codec.reconstruct_data(&mut shards).map_err(|e| torn(file, base, e))?;
                    for (j, s) in shards.iter().take(k).enumerate() {
                        buf[j * u..(j + 1) * u].copy_from_slice(s.as_ref().expect("reconstructed"));
                    }
                }
                versions = plan.data_versions;
                // Every data chunk of the row is now known at its version: kept for a retry of this write. Chunks
                // the row used as read (or learnt before) are kept by reference: only a decoded chunk is copied,
                // so a healthy partial-row write copies nothing here.
                for j in 0..k {
                    let kept = match origin[j].take() {
                        Some(b) if plan.use_chunk[j] => b,
                        _ => Bytes::copy_from_slice(&buf[j * u..(j + 1) * u]),
                    };
                    known.chunks[j] = Some((versions[j], kept));
                }
            }
            Err(e) => {
                // Undecodable: fine only if no damaged chunk holds bytes this write keeps (outside the new bytes,
                // below the old size); those chunks are rewritten with zeros there.
                for (j, f) in fs[..k].iter().enumerate() {
                    if matches!(f, Found::Intact { .. }) {
                        continue;
                    }
                    let (lo, hi) = (base + j as u64 * unit, (base + (j as u64 + 1) * unit).min(old_size));
                    let kept = (lo < hi.min(from)) || (to.max(lo) < hi);
                    if kept {
                        return Err(torn(file, base, e.to_string()));
                    }
                }
            }
        }
        let RowBytes::Run(run) = new else { unreachable!("a partial row is one run") };
        buf[(from - base) as usize..(to - base) as usize].copy_from_slice(run);
        let pf = parity_found(0);
        for j in 0..k {
            if rewrite[j] {
                versions[j] = next_data_version(j, fs[j].version().unwrap_or(0), &pf);
            }
        }
        data_versions.push(versions);
    } else {
        rewrite = (0..k).map(|j| !skip.contains(&j)).collect();
        for row in 0..rows as usize {
            let pf = parity_found(row);
            data_versions.push((0..k).map(|j| next_data_version(j, ver(j, row), &pf)).collect());
        }
    }
    // 3. The data chunks, then 4. the parity chunks; each at its §16 stored length, or longer where the chunk on
    // disk or the new one has non-zero bytes past it (a size this handle has not seen yet, a damaged chunk): the
    // bytes a record vouches for are exactly the ones computed here.
    let stored = |row: u64| -> usize { new_end.saturating_sub(base + row * row_bytes).min(row_bytes) as usize };
    let on_disk = |i: usize, fresh: &[u8]| -> usize {
        let ok = partial && found[i][0].intact;
        let disk = if ok {
            last_nonzero(&bytes[i])
        } else if partial {
            u
        } else {
            0
        };
        disk.max(last_nonzero(fresh))
    };
    // The rows' data chunks, `k` per row, row after row: slices of the assembled partial row, or of the caller's
    // whole rows as they are (no copy).
    let chunks: Vec<Bytes> = match new {
        _ if partial => {
            let b = Bytes::from(buf);
            (0..k).map(|j| b.slice(j * u..(j + 1) * u)).collect()
        }
        RowBytes::Run(b) => (0..rows as usize * k).map(|c| b.slice(c * u..(c + 1) * u)).collect(),
        RowBytes::Chunks(c) => c.clone(),
    };
    assert_eq!(chunks.len(), rows as usize * k, "k chunks per row");
    let mut writes = Vec::new();
    for j in (0..k).filter(|&j| rewrite[j]) {
        let mut payload = Vec::with_capacity(rows as usize);
        let mut recs = Vec::with_capacity(rows as usize);
        for row in 0..rows {
            let c = &chunks[row as usize * k + j];
            let keep = stored(row).saturating_sub(j * u).min(u).max(on_disk(j, c));
            payload.push(c.slice(..keep));
            let expect = found[j][row as usize].version;
            recs.push(RowWrite { expect, version: data_versions[row as usize][j], parity_of: Vec::new() });
        }
        writes.push((j, recs, payload));
    }
    if known.moved(write_all(write_io, layout, writes, first).await, client, &mut lost) {
        return Ok(Attempt::Moved);
    }
    // Every parity chunk encoded straight into one buffer per parity server (rows back to back), sent in slices.
    let shards: Vec<&[u8]> = chunks.iter().map(|c| &c[..]).collect();
    let bufs = client.recycled();
    let pbuf = encode_parity(codec, &shards, u, bufs);
    let mut writes = Vec::new();
    let mut sent = Vec::with_capacity(m);
    for (p, pb) in pbuf.into_iter().enumerate() {
        let pb = pb.freeze();
        sent.push(pb.clone());
        if skip.contains(&(k + p)) {
            continue;
        }
        let mut payload = Vec::with_capacity(rows as usize);
        let mut recs = Vec::with_capacity(rows as usize);
        for row in 0..rows {
            let at = row as usize * u;
            let keep = stored(row).min(u).max(on_disk(k + p, &pb[at..at + u]));
            let expect = found[k + p][row as usize].version;
            let version = expect.saturating_add(1);
            recs.push(RowWrite { expect, version, parity_of: data_versions[row as usize].clone() });
            payload.push(pb.slice(at..at + keep));
        }
        writes.push((k + p, recs, payload));
    }
    let written = write_all(write_io, layout, writes, first).await;
    give_back(bufs, sent);
    if known.moved(written, client, &mut lost) {
        return Ok(Attempt::Moved);
    }
    if let Some(pos) = lost.iter().position(|(i, _)| *i == usize::MAX || Some(*i) == heal) {
        // A heal that could not write what it heals fails (the range stays stale), as does a failed task.
        let (i, e) = lost.swap_remove(pos);
        return Err(if i == usize::MAX { e } else { degraded(i, &format!("healing: {e}")) });
    }
    // Up to m unavailable servers: the rows each missed (stale ones too: they were skipped in every row here)
    // are recorded stale before this write is acknowledged; more fail it.
    let mut missed: Vec<(usize, ClientError)> = skip
        .iter()
        .filter(|i| !lost.iter().any(|(j, _)| j == *i))
        .map(|&i| (i, ClientError::Protocol(format!("chunk {i} is stale"))))
        .collect();
    crate::stale::refetch_if_fenced(file, &lost).await?;
    missed.extend(lost);
    crate::stale::record_missed(file, missed, base, first, first + rows).await?;
    Ok(Attempt::Done)
}

/// The length of `b` without its trailing zeros.
fn last_nonzero(b: &[u8]) -> usize {
    b.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1)
}

fn torn(file: &File, file_offset: u64, cause: impl std::fmt::Display) -> ClientError {
    ClientError::TornRow { ino: file.attr.ino, file_offset, cause: cause.to_string() }
}

/// The file bytes of rows `[first, first + rows)`, each decoded by the version rule from whichever chunks are
/// intact and agree; rows with damaged or stale chunks are repaired afterwards (best effort, by [`write_batch`]
/// with no new bytes, through `repair_io`).
pub(crate) async fn decode_rows(
    file: &File,
    io: &Io,
    codec: &Codec,
    first: u64,
    rows: u64,
) -> Result<(Vec<u8>, Vec<u64>), ClientError> {
    let layout = &file.layout();
    let (k, m) = (codec.k, codec.m);
    let unit = u64::from(layout.stripe_unit);
    let u = unit as usize;
    let row_bytes = unit * k as u64;
    let mut found: Vec<Option<(Vec<ChunkVersion>, BytesMut)>> = vec![None; k + m];
    // A chunk in a stale range (§18) is never read: it is decoded like a missing one.
    let stale = crate::stale::stale_slots(file, first, first + rows).await?;
    let mut causes: Vec<String> = stale.iter().map(|i| format!("chunk {i}: stale")).collect();
    // A server that did not answer moments ago is left out while k others remain: waiting for its retries on
    // every row would make a degraded read as slow as the retries.
    let client = &file.client;
    let down: Vec<usize> =
        (0..k + m).filter(|i| !stale.contains(i) && client.recently_unreachable(layout.servers[*i])).collect();
    let skip_down = !down.is_empty() && k + m - stale.len() - down.len() >= k;
    if skip_down {
        causes.extend(down.iter().map(|i| format!("chunk {i}: data server {} did not answer", layout.servers[*i])));
    }
    let skipped = |i: &usize| stale.contains(i) || (skip_down && down.contains(i));
    let which = (0..k + m).filter(|i| !skipped(i));
    for (i, r) in read_all(io, layout, which, first, rows, true).await {
        match r {
            Ok(x) => found[i] = Some(x),
            Err(e) if is_chunk_loss(&e) => {
                client.note_unreachable(&e);
                causes.push(format!("chunk {i}: {e}"))
            }
            Err(e) => return Err(e),
        }
    }
    causes.sort();
    let reachable = found.iter().filter(|f| f.is_some()).count();
    let mut data = vec![0u8; (rows * row_bytes) as usize];
    // Stands in for a parity chunk a decode does not use (the decoder wants k + m slices of one length).
    let mut scratch = vec![0u8; m * u];
    let mut to_repair = Vec::new();
    for row in 0..rows as usize {
        let file_offset = (first + row as u64) * row_bytes;
        let fs: Vec<Found> =
            found.iter().map(|f| f.as_ref().map_or(Found::Unreachable, |(v, _)| found_of(&v[row], true))).collect();
        // Chunks that answered with their bytes intact: fewer than k is a loss (unreachable or failing their
        // checksums), not a disagreement of versions.
        let intact = fs.iter().filter(|f| matches!(f, Found::Intact { .. })).count();
        let plan = plan_row(k, m, &fs).map_err(|e| {
            if intact < k {
                let damaged = fs.iter().filter(|f| matches!(f, Found::Damaged { .. })).count();
                let mut cause = causes.clone();
                if damaged > 0 {
                    cause.push(format!("{damaged} chunks fail their checksums"));
                }
                ClientError::Unavailable {
                    ino: file.attr.ino,
                    file_offset,
                    available: intact as u32,
                    needed: k as u32,
                    cause: cause.join("; "),
                }
            } else if reachable < k {
                ClientError::Unavailable {
                    ino: file.attr.ino,
                    file_offset,
                    available: reachable as u32,
                    needed: k as u32,
                    cause: causes.join("; "),
                }
            } else {
                torn(file, file_offset, e)
            }
        })?;
        // The data chunks used are copied into the row; the missing ones are decoded there in place, from them
        // and the parity chunks' reply buffers (no other copy).
        let (data_found, parity) = found.split_at_mut(k);
        let row_data = &mut data[row * k * u..(row + 1) * k * u];
        for j in (0..k).filter(|&j| plan.use_chunk[j]) {
            let c = &data_found[j].as_ref().expect("used chunks were read").1[row * u..(row + 1) * u];
            row_data[j * u..(j + 1) * u].copy_from_slice(c);
        }
        if !plan.use_chunk[..k].iter().all(|&x| x) {
            let mut shards: Vec<&mut [u8]> = row_data.chunks_exact_mut(u).collect();
            for ((p, f), spare) in parity.iter_mut().enumerate().zip(scratch.chunks_exact_mut(u)) {
                match f {
                    Some((_, b)) if plan.use_chunk[k + p] => shards.push(&mut b[row * u..(row + 1) * u]),
                    _ => shards.push(spare),
                }
            }
            codec.reconstruct_data_in_place(shards, &plan.use_chunk).map_err(|e| torn(file, file_offset, e))?;
        }
        if !plan.repair.is_empty() {
            to_repair.push(first + row as u64);
        }
    }
    // The chunks' buffers go back for the next reads.
    for (_, b) in found.into_iter().flatten() {
        client.recycled().give(b.freeze());
    }
    Ok((data, to_repair))
}

/// Repairs row `row` of an ec file: rewrites its damaged data chunks from the decoded row and every parity chunk
/// from the data, compare-and-set (a row another writer is changing is left to that writer).
pub(crate) async fn repair_row(file: &File, io: &Io, codec: &Codec, row: u64) -> Result<(), ClientError> {
    let row_bytes = u64::from(file.layout().stripe_unit) * codec.k as u64;
    let size = file.size();
    let base = row * row_bytes;
    // No new bytes: a zero-length write at the row's start rewrites the damaged chunks and the parity.
    let new_end = size.max(base);
    let known = &mut Known::default();
    match write_attempt(file, io, io, codec, row, 1, base, &RowBytes::Run(Bytes::new()), size, new_end, None, known)
        .await?
    {
        Attempt::Done => Ok(()),
        Attempt::Moved => Ok(()),
    }
}

/// Heals chunk `slot` of row `row` (it missed writes: a stale range of §18, or a spare that holds nothing yet):
/// the row is decoded from the other chunks by the version rule and that chunk rewritten, with the parity,
/// compare-and-set, retried like a write when another writer moves a version.
/// `size`: the file size to store the row for (§16); it may exceed the committed size while a degraded write's
/// writer has not committed yet.
pub(crate) async fn heal_row(
    file: &File,
    io: &Io,
    codec: &Codec,
    row: u64,
    slot: usize,
    size: u64,
) -> Result<(), ClientError> {
    let row_bytes = u64::from(file.layout().stripe_unit) * codec.k as u64;
    let base = row * row_bytes;
    let new_end = size.max(base);
    let mut attempt = 0;
    let known = &mut Known::default();
    loop {
        attempt += 1;
        match write_attempt(
            file,
            io,
            io,
            codec,
            row,
            1,
            base,
            &RowBytes::Run(Bytes::new()),
            size,
            new_end,
            Some(slot),
            known,
        )
        .await?
        {
            Attempt::Done => return Ok(()),
            Attempt::Moved if attempt >= WRITE_ATTEMPTS_MAX => {
                return Err(ClientError::WriteConflict { ino: file.attr.ino, file_offset: base, attempts: attempt });
            }
            Attempt::Moved => tokio::time::sleep(Duration::from_micros(u64::from(attempt) * 200)).await,
        }
    }
}

/// How many times a batch heal is tried whole when another writer moves a version in it, before its rows are
/// healed one by one ([`heal_row`], each retried on its own): a busy row then costs only itself.
const HEAL_BATCH_ATTEMPTS_MAX: u32 = 2;

/// A test's hook run by every batch heal between its reads and its writes, with the batch's first row: how a test
/// makes another writer move a row inside a batch at exactly that moment (`set_heal_hook`). `None` in production.
pub type HealHook =
    std::sync::Arc<dyn Fn(u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;
static HEAL_HOOK: std::sync::Mutex<Option<HealHook>> = std::sync::Mutex::new(None);

/// Tests only: installs (or with `None` removes) the hook of [`HEAL_HOOK`].
#[doc(hidden)]
pub fn set_heal_hook(hook: Option<HealHook>) {
    *HEAL_HOOK.lock().expect("heal hook") = hook;
}

/// What one attempt of a batch heal ended with.
enum HealAttempt {
    /// Every row's chunk was rewritten, with the parity: the bytes of the healed chunk written.
    Done(u64),
    /// Another writer moved a version in the batch (nothing of that request was written).
    Moved,
    /// A row the batch path does not handle (another chunk damaged, a row that does not decode, a server lost):
    /// the rows go one by one through the general path ([`heal_row`]).
    RowByRow,
}

/// Heals chunk `slot` of rows `[first, first + rows)` (all below `size`'s last row): one read of every chunk's
/// rows and one compare-and-set write per chunk for the whole batch instead of one round trip per row. A batch
/// that keeps moving under other writers, or holds a row the fast path does not handle, is healed row by row.
/// Returns the bytes of chunk `slot` written.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn heal_batch(
    file: &File,
    io: &Io,
    codec: &Codec,
    first: u64,
    rows: u64,
    slot: usize,
    size: u64,
) -> Result<u64, ClientError> {
    if rows == 0 {
        return Ok(0);
    }
    let mut attempt = 0;
    loop {
        attempt += 1;
        match heal_attempt(file, io, codec, first, rows, slot, size).await? {
            HealAttempt::Done(n) => return Ok(n),
            HealAttempt::Moved if attempt < HEAL_BATCH_ATTEMPTS_MAX => {
                tokio::time::sleep(Duration::from_micros(u64::from(attempt) * 200)).await;
            }
            HealAttempt::Moved | HealAttempt::RowByRow => break,
        }
    }
    tracing::debug!(ino = file.attr.ino, slot, first, rows, "batch heal falls back to row by row");
    let (k, u) = (codec.k, u64::from(file.layout().stripe_unit));
    let mut n = 0;
    for row in first..first + rows {
        heal_row(file, io, codec, row, slot, size).await?;
        n += slot_bytes(size, row, k, slot, u);
    }
    Ok(n)
}

/// The stored bytes (§16) of chunk `slot` of row `row` in a file of `size` bytes.
pub(crate) fn slot_bytes(size: u64, row: u64, k: usize, slot: usize, unit: u64) -> u64 {
    let row_bytes = unit * k as u64;
    let row_len = size.saturating_sub(row * row_bytes).min(row_bytes);
    if slot < k { row_len.saturating_sub(slot as u64 * unit).min(unit) } else { row_len.min(unit) }
}

async fn heal_attempt(
    file: &File,
    io: &Io,
    codec: &Codec,
    first: u64,
    rows: u64,
    slot: usize,
    size: u64,
) -> Result<HealAttempt, ClientError> {
    let layout = &file.layout();
    let (k, m) = (codec.k, codec.m);
    let unit = u64::from(layout.stripe_unit);
    let u = unit as usize;
    let row_bytes = unit * k as u64;
    let base = first * row_bytes;
    assert!(rows > 0 && base + (rows - 1) * row_bytes < size.max(1), "rows below the file's last row");
    let skip: Vec<usize> =
        crate::stale::stale_slots(file, first, first + rows).await?.into_iter().filter(|&i| i != slot).collect();
    if skip.len() > m {
        return Ok(HealAttempt::RowByRow);
    }
    // 1. Parity records and bytes first, 2. then the data chunks' (the order of the module doc).
    let mut found: Vec<Vec<ChunkVersion>> = vec![Vec::new(); k + m];
    let mut bytes: Vec<BytesMut> = vec![BytesMut::new(); k + m];
    for phase in [k..k + m, 0..k] {
        let which: Vec<usize> = phase.filter(|i| !skip.contains(i)).collect();
        for (i, r) in read_all(io, layout, which.into_iter(), first, rows, true).await {
            match r {
                Ok((v, b)) => {
                    found[i] = v;
                    bytes[i] = b;
                }
                // Another server lost: the general path records what it misses.
                Err(e) if is_chunk_loss(&e) && i != slot => return Ok(HealAttempt::RowByRow),
                Err(e) => return Err(e),
            }
        }
    }
    let fnd = |i: usize, row: usize| -> Found {
        if skip.contains(&i) {
            return Found::Unreachable;
        }
        let c = &found[i][row];
        if i == slot { Found::Damaged { version: c.version } } else { found_of(c, true) }
    };
    let chunk = |i: usize, row: usize| -> &[u8] { &bytes[i][row * u..(row + 1) * u] };
    // Each row decoded (the version rule) into `data` (rows × k units, row after row), with its data versions.
    let mut data = vec![0u8; rows as usize * row_bytes as usize];
    let mut data_versions: Vec<Vec<u64>> = Vec::with_capacity(rows as usize);
    for row in 0..rows as usize {
        let fs: Vec<Found> = (0..k + m).map(|i| fnd(i, row)).collect();
        if fs.iter().enumerate().any(|(i, f)| i != slot && matches!(f, Found::Damaged { .. })) {
            return Ok(HealAttempt::RowByRow);
        }
        let Ok(plan) = plan_row(k, m, &fs) else { return Ok(HealAttempt::RowByRow) };
        let out = &mut data[row * row_bytes as usize..][..row_bytes as usize];
        if plan.use_chunk[..k].iter().all(|&x| x) {
            for j in 0..k {
                out[j * u..(j + 1) * u].copy_from_slice(chunk(j, row));
            }
        } else {
            let mut shards: Vec<Option<Vec<u8>>> =
                (0..k + m).map(|i| plan.use_chunk[i].then(|| chunk(i, row).to_vec())).collect();
            codec.reconstruct_data(&mut shards).map_err(|e| torn(file, base + row as u64 * row_bytes, e))?;
            for (j, s) in shards.iter().take(k).enumerate() {
                out[j * u..(j + 1) * u].copy_from_slice(s.as_ref().expect("reconstructed"));
            }
        }
        let mut versions = plan.data_versions;
        if slot < k {
            versions[slot] = next_data_version(slot, fs[slot].version().unwrap_or(0), &fs[k..]);
        }
        data_versions.push(versions);
    }
    // The stored length (§16) of each chunk, or longer where the chunk on disk or the new one has non-zero bytes
    // past it (as in `write_attempt`).
    let stored = |row: u64| -> usize { size.saturating_sub(base + row * row_bytes).min(row_bytes) as usize };
    let keep = |i: usize, row: usize, fresh: &[u8]| -> usize {
        let disk = if found[i][row].intact { last_nonzero(chunk(i, row)) } else { u };
        let want = if i < k { stored(row as u64).saturating_sub(i * u).min(u) } else { stored(row as u64).min(u) };
        want.max(disk).max(last_nonzero(fresh))
    };
    let hook = HEAL_HOOK.lock().expect("heal hook").clone();
    if let Some(hook) = hook {
        hook(first).await;
    }
    let data = Bytes::from(data);
    let row_at = |row: usize| row * row_bytes as usize;
    let mut written = 0u64;
    // 3. The healed data chunk, then 4. every parity chunk.
    if slot < k {
        let mut payload = Vec::with_capacity(rows as usize);
        let mut recs = Vec::with_capacity(rows as usize);
        for row in 0..rows as usize {
            let at = row_at(row) + slot * u;
            let n = keep(slot, row, &data[at..at + u]);
            written += n as u64;
            payload.push(data.slice(at..at + n));
            recs.push(RowWrite {
                expect: found[slot][row].version,
                version: data_versions[row][slot],
                parity_of: Vec::new(),
            });
        }
        match write_all(io, layout, vec![(slot, recs, payload)], first).await {
            Written::Moved => return Ok(HealAttempt::Moved),
            Written::Failed(f) if !f.is_empty() => {
                let (_, e) = f.into_iter().next().expect("one failure");
                return Err(e);
            }
            Written::Failed(_) => {}
        }
    }
    let shards: Vec<&[u8]> = data[..rows as usize * row_bytes as usize].chunks_exact(u).collect();
    let pbuf = encode_parity(codec, &shards, u, file.client.recycled());
    let mut writes = Vec::new();
    for (p, pb) in pbuf.into_iter().enumerate() {
        if skip.contains(&(k + p)) {
            continue;
        }
        let pb = pb.freeze();
        let mut payload = Vec::with_capacity(rows as usize);
        let mut recs = Vec::with_capacity(rows as usize);
        for row in 0..rows as usize {
            let n = keep(k + p, row, &pb[row * u..(row + 1) * u]);
            if k + p == slot {
                written += n as u64;
            }
            let expect = found[k + p][row].version;
            recs.push(RowWrite { expect, version: expect.saturating_add(1), parity_of: data_versions[row].clone() });
            payload.push(pb.slice(row * u..row * u + n));
        }
        writes.push((k + p, recs, payload));
    }
    match write_all(io, layout, writes, first).await {
        Written::Moved => Ok(HealAttempt::Moved),
        Written::Failed(f) if f.iter().any(|(i, _)| *i == slot || *i == usize::MAX) => {
            let (_, e) = f.into_iter().find(|(i, _)| *i == slot || *i == usize::MAX).expect("found above");
            Err(e)
        }
        // Another parity server failed mid-batch: the general path records what it missed.
        Written::Failed(f) if !f.is_empty() => Ok(HealAttempt::RowByRow),
        Written::Failed(_) => {
            // Chunks of stale slots were skipped in every row here: recorded stale again (their ranges stay).
            let missed =
                skip.iter().map(|&i| (i, ClientError::Protocol(format!("chunk {i} is stale")))).collect::<Vec<_>>();
            crate::stale::record_missed(file, missed, base, first, first + rows).await?;
            Ok(HealAttempt::Done(written))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_cut_into_requests_at_the_bound() {
        assert_eq!(request_spans(0, 0, 4), vec![]);
        assert_eq!(request_spans(7, 9, 4), vec![(7, 4), (11, 4), (15, 1)]);
        assert_eq!(request_spans(0, 8, 4), vec![(0, 4), (4, 4)]);
        let max = u64::from(ROWS_PER_REQUEST_MAX);
        let spans = request_spans(1, 2 * max + 3, max);
        assert_eq!(spans, vec![(1, max), (1 + max, max), (1 + 2 * max, 3)]);
    }

    #[test]
    fn a_chunk_stores_its_bytes_of_the_row() {
        // ec 4+2, 4 KiB units: a file of 2 rows and 5000 bytes.
        let (k, u) = (4, 4096u64);
        let size = 4 * u + 5000;
        assert_eq!(slot_bytes(size, 0, k, 0, u), u);
        assert_eq!(slot_bytes(size, 0, k, 5, u), u);
        assert_eq!(slot_bytes(size, 1, k, 0, u), 4096);
        assert_eq!(slot_bytes(size, 1, k, 1, u), 904);
        assert_eq!(slot_bytes(size, 1, k, 2, u), 0);
        // Parity is as long as the row's first chunk.
        assert_eq!(slot_bytes(size, 1, k, 4, u), 4096);
        assert_eq!(slot_bytes(size, 2, k, 4, u), 0);
    }
}
