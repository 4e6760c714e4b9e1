//! The data path of erasure-coded files (`ec k+m`, docs/format.md §16), encoded and decoded at the client.
//!
//! Why at the client: the bytes are there already, so a full-stripe write costs no server-to-server hop, and a
//! data server stays a plain object store (a parity chunk is just another object write, zero-copy like the rest).
//!
//! - **Healthy reads** read the data chunks only: the data of an `ec k+m` file follows the plain rule over its
//!   first `k` servers ([`Layout::data_view`]), so they go through the plain path ([`crate::striped::read_on`]) unchanged.
//! - **Degraded reads**: when any of those fails (a server that does not answer, a chunk refused as `Corrupt`),
//!   the stripe rows the range touches are read whole, with their chunk versions, from `k` servers first (every
//!   server only if a row does not decode from those), and each row is decoded from `k` chunks whose versions
//!   agree (docs/format.md §17, [`crate::ec_version`]); rows with damaged chunks or stale parity are rewritten
//!   (repair on read). Fewer than `k` chunks answer:
//!   [`ClientError::Unavailable`]; enough answer but too few agree: [`ClientError::TornRow`]; never zeros or a mix.
//! - **Writes** go row by row with chunk versions ([`crate::ec_rows`]): a row only partly covered is read first
//!   (read–modify–write), the changed data chunks written compare-and-set, then every parity chunk with the data
//!   versions it encodes; another writer's moved version restarts the row. A server that cannot be written fails
//!   the write ([`ClientError::DegradedWrite`]) only past `m` of them: up to `m` are recorded stale at the MDS
//!   before the write is acknowledged ([`crate::stale`]), and reads treat those chunks as missing.
//!
//! The write hole is closed by those versions (ARCHITECTURE.md's invariants; docs/format.md §17).

use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use weft_proto::Layout;

use crate::ClientError;
use crate::ec_codec::{Codec, is_chunk_loss, km};
use crate::ec_delta::{self, Delta};
use crate::ec_gather::{Added, Job};
use crate::ec_write::{Known, RowBytes, RowJob, write_batch};
use crate::handle::{File, repair_io, rmw_io};
use crate::striped::{Io, read_on_into};

/// Rows decoded per batch in a degraded read are bounded so that `rows × (k + m) × unit` stays under this (but at
/// least one row): the memory a degraded read holds at once.
const DEGRADED_BATCH_BYTES_MAX: u64 = 64 << 20;

/// An ec layout's rows: `k + m` chunks of `unit` bytes, `row_bytes` of file bytes, and the rows one batch of a
/// write or a degraded read takes ([`DEGRADED_BATCH_BYTES_MAX`], at least one).
struct Shape {
    k: usize,
    m: usize,
    unit: u64,
    row_bytes: u64,
    batch_rows: u64,
}

fn shape(layout: &Layout) -> Shape {
    let (k, m) = km(layout).expect("an ec layout");
    let unit = u64::from(layout.stripe_unit);
    let batch_rows = (DEGRADED_BATCH_BYTES_MAX / (unit * (k + m) as u64)).max(1);
    Shape { k, m, unit, row_bytes: unit * k as u64, batch_rows }
}

/// Reads `[offset, offset + len)` of an ec file (the caller has cut `len` at the file's size).
/// Into `buf`, whose length is the amount read (within the file): a healthy read's replies land in it directly.
pub(crate) async fn read(file: &File, offset: u64, buf: BytesMut) -> Result<BytesMut, ClientError> {
    read_via(file, &file.io(), offset, buf).await
}

/// [`read`] with the capability of `io`.
async fn read_via(file: &File, io: &Io, offset: u64, buf: BytesMut) -> Result<BytesMut, ClientError> {
    let len = buf.len() as u64;
    let layout = &file.layout();
    // A data chunk in a stale range is never read: those rows are decoded from the other chunks.
    let (first, end) = crate::handle::rows_of(layout, offset, len);
    let k = km(layout).expect("an ec layout").0;
    if crate::stale::stale_slots(file, first, end).await?.iter().any(|&s| s < k)
        || touches_unreachable(file, offset, len)
    {
        return read_degraded(file, io, offset, buf).await;
    }
    match read_on_into(io, &layout.data_view(0), offset, buf).await {
        Ok(b) => Ok(b),
        Err(e) if is_chunk_loss(&e) => {
            file.client.note_unreachable(&e);
            tracing::debug!(ino = file.attr.ino, offset, len, "degraded ec read: {e}");
            // The buffer went with the error: a fresh one (once per lost server: later reads go straight here).
            read_degraded(file, io, offset, BytesMut::zeroed(len as usize)).await
        }
        Err(e) => Err(e),
    }
}

/// Whether `[offset, offset + len)` has bytes on a data chunk whose server did not answer moments ago: such a read
/// goes straight to the other chunks. A range on live servers only is read directly (a torn row elsewhere in its
/// rows does not concern it).
fn touches_unreachable(file: &File, offset: u64, len: u64) -> bool {
    let layout = file.layout();
    let k = km(&layout).expect("an ec layout").0;
    if !layout.servers[..k].iter().any(|&s| file.client.recently_unreachable(s)) {
        return false;
    }
    let view = layout.data_view(0);
    view.pieces(offset, len).iter().any(|p| file.client.recently_unreachable(view.servers[p.server_index as usize]))
}

/// [`read`] from whole stripe rows, each decoded from any `k` of its chunks, kept for the next reads
/// (`ec_cache.rs`); chunks refused as corrupt are rewritten from the decoded rows. A read of more rows than the
/// cache keeps decodes them as it goes ([`read_decoding`]).
async fn read_degraded(file: &File, io: &Io, offset: u64, mut buf: BytesMut) -> Result<BytesMut, ClientError> {
    let len = buf.len() as u64;
    let Shape { k, m, row_bytes, batch_rows, .. } = shape(&file.layout());
    let (first_row, end_row) = (offset / row_bytes, (offset + len - 1) / row_bytes + 1);
    if end_row - first_row > crate::ec_cache::ROWS_MAX as u64 / 2 {
        return read_decoding(file, io, offset, buf).await;
    }
    let codec = Codec::new(k, m)?;
    let cache = &file.decoded;
    let want: Vec<u64> = (first_row..end_row).collect();
    // Twice at most: rows another reader was loading may be dropped by a write meanwhile.
    for _ in 0..2 {
        let claim = cache.claim(first_row, end_row);
        for (a, n) in claim.load {
            for (r, cnt) in crate::ec_calls::request_spans(a, n, batch_rows) {
                match decode_rows(file, io, &codec, r, cnt).await {
                    Ok(d) => cache.put(r, &Bytes::from(d), row_bytes as usize, claim.epoch),
                    Err(e) => {
                        cache.failed(r, a + n - r);
                        return Err(e);
                    }
                }
            }
        }
        if let Some(rows) = cache.wait(&want).await {
            let mut at = 0;
            for (r, b) in (first_row..).zip(&rows) {
                let base = r * row_bytes;
                let (from, to) =
                    ((offset.max(base) - base) as usize, ((offset + len).min(base + row_bytes) - base) as usize);
                buf[at..at + to - from].copy_from_slice(&b[from..to]);
                at += to - from;
            }
            assert_eq!(at as u64, len, "the rows cover the read");
            return Ok(buf);
        }
    }
    read_decoding(file, io, offset, buf).await
}

/// [`read_degraded`] without the cache: rows decoded batch after batch, and dropped.
async fn read_decoding(file: &File, io: &Io, offset: u64, mut buf: BytesMut) -> Result<BytesMut, ClientError> {
    let len = buf.len() as u64;
    let Shape { k, m, row_bytes, batch_rows, .. } = shape(&file.layout());
    let first_row = offset / row_bytes;
    let last_row = (offset + len - 1) / row_bytes;
    let codec = Codec::new(k, m)?;
    let mut at = 0;
    let mut r = first_row;
    while r <= last_row {
        let rows = batch_rows.min(last_row - r + 1);
        let decoded = decode_rows(file, io, &codec, r, rows).await?;
        // `decoded` holds file bytes [r * row_bytes, (r + rows) * row_bytes); keep those inside the range.
        let base = r * row_bytes;
        let from = offset.max(base) - base;
        let to = (offset + len).min(base + rows * row_bytes) - base;
        let n = (to - from) as usize;
        buf[at..at + n].copy_from_slice(&decoded[from as usize..to as usize]);
        at += n;
        r += rows;
    }
    assert_eq!(at as u64, len, "the rows cover the read");
    Ok(buf)
}

use crate::ec_write::{TORN_BACKOFF_MS_MAX, TORN_BACKOFF_MS_MIN, TORN_RETRIES_MAX};

/// The file bytes of stripe rows `[first, first + rows)`, each decoded from `k` chunks whose versions agree
/// (docs/format.md §17); rows with damaged chunks or stale parity are repaired before returning (best effort).
async fn decode_rows(file: &File, io: &Io, codec: &Codec, first: u64, rows: u64) -> Result<Vec<u8>, ClientError> {
    // A row being written by another client is torn for as long as that write takes (its data chunks are new,
    // its parity not yet): it is read again, backing off, and is an error only if it stays torn (a crash).
    let mut backoff_ms = TORN_BACKOFF_MS_MIN;
    let mut tries = 0;
    let (data, to_repair) = loop {
        match crate::ec_rows::decode_rows(file, io, codec, first, rows).await {
            Err(ClientError::TornRow { file_offset, .. }) if tries < TORN_RETRIES_MAX => {
                tracing::debug!(ino = file.attr.ino, file_offset, tries, "torn stripe row: reading it again");
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(backoff_ms)).await;
                backoff_ms = (backoff_ms * 2).min(TORN_BACKOFF_MS_MAX);
            }
            r => break r?,
        }
    };
    if !to_repair.is_empty() {
        match repair_io(file).await {
            Ok(io) => {
                for row in to_repair {
                    match crate::ec_rows::repair_row(file, &io, codec, row).await {
                        Ok(()) => tracing::info!(ino = file.attr.ino, row, "repaired a stripe row"),
                        Err(e) => tracing::warn!(ino = file.attr.ino, row, "repairing a stripe row failed: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!(ino = file.attr.ino, "no write capability to repair stripe rows: {e}"),
        }
    }
    Ok(data)
}

/// Writes `data` at `offset` of an ec file, row by row with chunk versions (docs/format.md §17,
/// [`crate::ec_write::write_batch`]): a row it covers only partly alone (read–modify–write), whole rows in batches.
pub(crate) async fn write(file: &File, offset: u64, data: Bytes) -> Result<(), ClientError> {
    changing(file, write_rows_of(file, offset, data)).await
}

/// Runs `op`, which changes the file's bytes, with the decoded rows of degraded reads dropped before and after it
/// (`ec_cache.rs`): a decode that overlaps it is not kept.
async fn changing<T>(file: &File, op: impl std::future::Future<Output = T>) -> T {
    file.decoded.invalidate();
    let r = op.await;
    file.decoded.invalidate();
    r
}

async fn write_rows_of(file: &File, offset: u64, data: Bytes) -> Result<(), ClientError> {
    // Rows in batches, so a large write holds a bounded amount of memory (at least one row).
    let Shape { k, m, unit, row_bytes, batch_rows } = shape(&file.layout());
    let end = offset + data.len() as u64;
    let old_size = file.size();
    let new_end = old_size.max(end);
    let codec = Codec::new(k, m)?;
    let (mut rmw, write_io): (Option<Io>, Io) = (None, file.io());
    let mut at = offset;
    while at < end {
        let r = at / row_bytes;
        let base = r * row_bytes;
        let (rows, to) = if at > base || end < base + row_bytes {
            (1, end.min(base + row_bytes))
        } else {
            let rows = ((end - base) / row_bytes).min(batch_rows);
            (rows, base + rows * row_bytes)
        };
        if rmw.is_none() {
            rmw = Some(rmw_io(file).await?);
        }
        let read_io = rmw.as_ref().expect("set above");
        let run = data.slice((at - offset) as usize..(to - offset) as usize);
        let fits = rows == 1 && ec_delta::fits(unit, k, at, run.len() as u64, old_size);
        let delta = if fits && delta_allowed(file, r).await? {
            Some(ec_delta::write(file, read_io, &write_io, &codec, r, at, &run).await?)
        } else {
            None
        };
        if delta != Some(Delta::Done) {
            let known = match delta {
                Some(Delta::Declined(replaced)) => Known::after_delta(replaced),
                _ => Known::default(),
            };
            let new = RowBytes::Run(run);
            let (first, from, new) = (r, at, &new);
            let job = RowJob {
                file,
                read_io,
                write_io: &write_io,
                codec: &codec,
                first,
                rows,
                from,
                new,
                old_size,
                new_end,
                heal: None,
            };
            write_batch(&job, known).await?;
        }
        // Rows written so far are visible to this handle's next RMW (it reads up to its size).
        file.size.fetch_max(to, Ordering::SeqCst);
        at = to;
    }
    Ok(())
}

/// Whether row `row` may be written by delta parity (`ec_delta.rs`): none of its chunks is stale, and no server
/// of the layout was unreachable moments ago (the whole-row protocol leaves such a server out at once).
async fn delta_allowed(file: &File, row: u64) -> Result<bool, ClientError> {
    if file.layout().servers.iter().any(|&s| file.client.recently_unreachable(s)) {
        return Ok(false);
    }
    Ok(crate::stale::stale_slots(file, row, row + 1).await?.is_empty())
}

/// Writes whole rows from `first` on (`chunks`: `k` chunks of a stripe unit per row, row after row), in batches
/// as [`write`]: no row is read, only the parity's records (docs/format.md §17).
async fn write_whole_rows(file: &File, first: u64, chunks: &[Bytes]) -> Result<(), ClientError> {
    changing(file, write_whole_rows_once(file, first, chunks)).await
}

async fn write_whole_rows_once(file: &File, first: u64, chunks: &[Bytes]) -> Result<(), ClientError> {
    let Shape { k, m, unit, row_bytes, batch_rows } = shape(&file.layout());
    assert!(chunks.len().is_multiple_of(k) && chunks.iter().all(|c| c.len() as u64 == unit), "whole rows");
    let batch_rows = batch_rows as usize;
    let codec = Codec::new(k, m)?;
    let io = file.io();
    for (n, batch) in chunks.chunks(batch_rows * k).enumerate() {
        let r = first + (n * batch_rows) as u64;
        let rows = (batch.len() / k) as u64;
        let (at, to) = (r * row_bytes, (r + rows) * row_bytes);
        let new_end = file.size().max(to);
        let new = RowBytes::Chunks(batch.to_vec());
        let (io, old_size) = (&io, file.size());
        let job = RowJob {
            file,
            read_io: io,
            write_io: io,
            codec: &codec,
            first: r,
            rows,
            from: at,
            new: &new,
            old_size,
            new_end,
            heal: None,
        };
        write_batch(&job, Known::default()).await?;
        file.size.fetch_max(to, Ordering::SeqCst);
    }
    Ok(())
}

/// Sends one gathered job once, on the layout held now.
async fn send_job_once(file: &File, job: &Job) -> Result<(), ClientError> {
    match job {
        Job::Whole { first, chunks } => write_whole_rows(file, *first, chunks).await,
        Job::Partial { runs, .. } => {
            for (offset, bytes) in runs {
                write(file, *offset, bytes.clone()).await?;
            }
            Ok(())
        }
    }
}

/// Sends one gathered job; tried once more on a newer layout generation if the MDS moved a failed server's slot
/// to a spare since (as every redundant I/O, [`File::write_at`]).
async fn send_job(file: &File, job: &Job) -> Result<(), ClientError> {
    let tried = file.layout().generation;
    match send_job_once(file, job).await {
        Err(e) if file.retry_with_fresh_layout(&e, tried).await => send_job_once(file, job).await,
        r => r,
    }
}

/// Reports a job's rows sent when dropped, so a write cancelled half-way (its future dropped) never leaves rows
/// that every later write would wait for.
struct Sending<'a> {
    file: &'a File,
    rows: std::ops::Range<u64>,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        file_gather(self.file).as_mut().expect("a job came from the gather").sent(self.rows.clone());
        self.file.gather_changed.notify_waiters();
    }
}

fn file_gather(file: &File) -> std::sync::MutexGuard<'_, Option<crate::ec_gather::Gather>> {
    file.gather.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends jobs one after another; a failure is returned and also kept for the next commit (the jobs may hold
/// bytes of writes already acknowledged: a close or fsync must not then succeed).
async fn send_jobs(file: &File, jobs: Vec<Job>, k: u64) -> Result<(), ClientError> {
    let mut failed = None;
    for job in jobs {
        let _sending = Sending { file, rows: job.rows(k) };
        if let Err(e) = send_job(file, &job).await {
            let at = job.rows(k).start * k * u64::from(file.layout().stripe_unit);
            file.note_write_behind_failure(at, &e);
            failed.get_or_insert(e);
        }
    }
    failed.map_or(Ok(()), Err)
}

/// A write to an ec file (issue 32): held until its rows are whole, then encoded once per row with no read
/// (`ec_gather.rs`); rows the write covers whole go at once. What is held is sent at the latest by the next
/// [`drain`] (fsync, close, a read or a truncate through this file).
pub(crate) async fn gathered_write(file: &File, offset: u64, data: Bytes) -> Result<(), ClientError> {
    let layout = file.layout();
    let (k, _) = km(&layout).expect("an ec layout");
    let unit = u64::from(layout.stripe_unit);
    let jobs = loop {
        let changed = file.gather_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let added =
            file_gather(file).get_or_insert_with(|| crate::ec_gather::Gather::new(unit, k as u64)).add(offset, &data);
        match added {
            Added::Send(jobs) => break jobs,
            Added::Wait => changed.await,
        }
    };
    send_jobs(file, jobs, k as u64).await
}

/// Sends everything this file holds and waits until no row of it is being sent (by any task): afterwards every
/// write acknowledged before the call is on the data servers, or its failure is returned.
pub(crate) async fn drain(file: &File) -> Result<(), ClientError> {
    let Some((k, _)) = km(&file.layout()) else { return Ok(()) };
    loop {
        let changed = file.gather_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let jobs = match file_gather(file).as_mut() {
            None => return Ok(()),
            Some(g) if g.is_idle() => return Ok(()),
            Some(g) if g.holds_nothing() => None,
            Some(g) => Some(g.drain()),
        };
        match jobs {
            Some(jobs) => send_jobs(file, jobs, k as u64).await?,
            None => changed.await,
        }
    }
}

/// Sets an ec file's objects to size `size`: the data chunk the cut falls in zeroed from the cut on, every
/// object cut to its §16 length, then the last, partial row rewritten, so its parity covers the zeros that now
/// follow `size`.
///
/// Why zeros before the cut: a chunk's version record vouches for its `unit` bytes with zeros past the object's end
/// (§17). Cutting a chunk that still held bytes past `size` would leave its record not matching it (damaged), and
/// the rewrite of the last row would then decode that chunk from the old parity and store its old bytes again past
/// `size`, to be read back when the file grows (issue 30: fsx seed 7 on `ec 4+2 --unit 64K`). Cutting zeros
/// keeps every record intact.
pub(crate) async fn truncate(file: &File, size: u64) -> Result<(), ClientError> {
    drain(file).await?;
    let layout = &file.layout();
    let (k, _) = km(layout).expect("an ec layout");
    let unit = u64::from(layout.stripe_unit);
    let row_bytes = unit * k as u64;
    let old = file.size();
    // Growing: the new bytes are zeros, and so are the chunks and parity past the old end: nothing to store.
    if size >= old {
        return Ok(());
    }
    if !size.is_multiple_of(unit) {
        let chunk_end = size - size % unit + unit;
        write(file, size, Bytes::from(vec![0u8; (chunk_end - size) as usize])).await?;
    }
    let row_start = size - size % row_bytes;
    let tail = if size > row_start {
        let buf = BytesMut::zeroed((size - row_start) as usize);
        Some(read_via(file, &rmw_io(file).await?, row_start, buf).await?)
    } else {
        None
    };
    file.decoded.invalidate();
    crate::stale::truncate_tolerant(file, size, old).await?;
    file.size.store(size, Ordering::SeqCst);
    file.decoded.invalidate();
    if let Some(tail) = tail {
        write(file, row_start, tail.freeze()).await?;
    }
    Ok(())
}
