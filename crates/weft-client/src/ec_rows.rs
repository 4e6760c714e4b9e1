//! Degraded decodes and heals of ec rows (docs/format.md §17–18): the rows decoded by the version rule from
//! whichever chunks are intact and agree ([`crate::ec_version`]), repaired on read, and one slot's rows healed, in
//! batches or row by row, through the write protocol (`ec_write.rs`).

use bytes::{Bytes, BytesMut};
use std::time::Duration;
use weft_proto::msg::{ChunkVersion, RowWrite};

use crate::ClientError;
use crate::ec_calls::{Written, read_all, write_all};
use crate::ec_codec::{Codec, is_chunk_loss};
use crate::ec_version::{Found, RowPlan, Undecodable, next_data_version, plan_row};
use crate::ec_write::{
    Attempt, Known, RowBytes, RowJob, WRITE_ATTEMPTS_MAX, encode_parity, found_of, last_nonzero, torn, write_attempt,
};
use crate::handle::File;
use crate::striped::Io;

/// The file bytes of rows `[first, first + rows)`, each decoded by the version rule from whichever chunks are
/// intact and agree, and the rows with damaged chunks or disagreeing parity, to repair afterwards (best effort, by
/// [`write_batch`] with no new bytes, through `repair_io`). The fewest chunks that can decode are read first: the
/// data chunks not left out and one parity chunk for each data chunk left out (`k` in all); the others only if a
/// row does not decode from those (a chunk that failed, parity that disagrees).
pub(crate) async fn decode_rows(
    file: &File,
    io: &Io,
    codec: &Codec,
    first: u64,
    rows: u64,
) -> Result<(Vec<u8>, Vec<u64>), ClientError> {
    let layout = &file.layout();
    let (k, m) = (codec.k, codec.m);
    let (skipped, mut causes) = left_out(file, layout, k, m, first, rows).await?;
    let missing = (0..k).filter(|&j| skipped[j]).count();
    let parity = (k..k + m).filter(|&i| !skipped[i]).take(missing);
    let mut read: Vec<usize> = (0..k).filter(|&j| !skipped[j]).chain(parity).collect();
    let mut found: Vec<Option<(Vec<ChunkVersion>, BytesMut)>> = vec![None; k + m];
    read_into(file, io, layout, &read, first, rows, &mut found, &mut causes).await?;
    let plans = match plan_rows(k, m, rows, &found) {
        Ok(plans) => plans,
        Err(_) => {
            let rest: Vec<usize> = (0..k + m).filter(|i| !skipped[*i] && !read.contains(i)).collect();
            read_into(file, io, layout, &rest, first, rows, &mut found, &mut causes).await?;
            read.extend(rest);
            causes.sort();
            plan_rows(k, m, rows, &found).map_err(|(row, e)| {
                let file_offset = (first + row as u64) * u64::from(layout.stripe_unit) * k as u64;
                decode_error(file, file_offset, &found, row, k, e, &causes)
            })?
        }
    };
    let data = decode_planned(file, codec, u64::from(layout.stripe_unit), first, &plans, &mut found)?;
    let to_repair = (0..rows).filter(|&r| !plans[r as usize].repair.is_empty()).map(|r| first + r).collect();
    // The chunks' buffers go back for the next reads.
    for (_, b) in found.into_iter().flatten() {
        file.client.recycled().give(b.freeze());
    }
    Ok((data, to_repair))
}

/// The chunks a decode leaves out (`true`), and why: those in a stale range (§18), never read, and those whose
/// server did not answer moments ago while `k` others remain (waiting for its retries on every row would make a
/// degraded read as slow as the retries).
async fn left_out(
    file: &File,
    layout: &weft_proto::Layout,
    k: usize,
    m: usize,
    first: u64,
    rows: u64,
) -> Result<(Vec<bool>, Vec<String>), ClientError> {
    let width = k + m;
    let stale = crate::stale::stale_slots(file, first, first + rows).await?;
    let mut causes: Vec<String> = stale.iter().map(|i| format!("chunk {i}: stale")).collect();
    let client = &file.client;
    let down: Vec<usize> =
        (0..width).filter(|i| !stale.contains(i) && client.recently_unreachable(layout.servers[*i])).collect();
    let skip_down = !down.is_empty() && width - stale.len() - down.len() >= k;
    if skip_down {
        causes.extend(down.iter().map(|i| format!("chunk {i}: data server {} did not answer", layout.servers[*i])));
    }
    let skipped = (0..width).map(|i| stale.contains(&i) || (skip_down && down.contains(&i))).collect();
    Ok((skipped, causes))
}

/// Reads rows `[first, first + rows)` of the chunks `which` (all at once) into `found`; a chunk lost adds its cause.
#[allow(clippy::too_many_arguments)]
async fn read_into(
    file: &File,
    io: &Io,
    layout: &weft_proto::Layout,
    which: &[usize],
    first: u64,
    rows: u64,
    found: &mut [Option<(Vec<ChunkVersion>, BytesMut)>],
    causes: &mut Vec<String>,
) -> Result<(), ClientError> {
    for (i, r) in read_all(io, layout, which.iter().copied(), first, rows, true).await {
        match r {
            Ok(x) => found[i] = Some(x),
            Err(e) if is_chunk_loss(&e) => {
                file.client.note_unreachable(&e);
                causes.push(format!("chunk {i}: {e}"))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What each chunk read was found as in row `row` (`Unreachable` for a chunk not read or lost).
fn row_found(found: &[Option<(Vec<ChunkVersion>, BytesMut)>], row: usize) -> Vec<Found> {
    found.iter().map(|f| f.as_ref().map_or(Found::Unreachable, |(v, _)| found_of(&v[row], true))).collect()
}

/// Every row's plan from the chunks read (pure), or the first row that does not decode and why.
fn plan_rows(
    k: usize,
    m: usize,
    rows: u64,
    found: &[Option<(Vec<ChunkVersion>, BytesMut)>],
) -> Result<Vec<RowPlan>, (usize, Undecodable)> {
    (0..rows as usize).map(|row| plan_row(k, m, &row_found(found, row)).map_err(|e| (row, e))).collect()
}

/// Why row `row` does not decode: fewer than `k` chunks intact is a loss ([`ClientError::Unavailable`]: unreachable
/// or failing their checksums), not a disagreement of versions ([`ClientError::TornRow`]).
fn decode_error(
    file: &File,
    file_offset: u64,
    found: &[Option<(Vec<ChunkVersion>, BytesMut)>],
    row: usize,
    k: usize,
    e: Undecodable,
    causes: &[String],
) -> ClientError {
    let fs = row_found(found, row);
    let intact = fs.iter().filter(|f| matches!(f, Found::Intact { .. })).count();
    let reachable = found.iter().filter(|f| f.is_some()).count();
    let damaged = fs.iter().filter(|f| matches!(f, Found::Damaged { .. })).count();
    let unavailable = |available: usize, cause: Vec<String>| ClientError::Unavailable {
        ino: file.attr.ino,
        file_offset,
        available: available as u32,
        needed: k as u32,
        cause: cause.join("; "),
    };
    if intact < k {
        let mut cause = causes.to_vec();
        if damaged > 0 {
            cause.push(format!("{damaged} chunks fail their checksums"));
        }
        unavailable(intact, cause)
    } else if reachable < k {
        unavailable(reachable, causes.to_vec())
    } else {
        torn(file, file_offset, e)
    }
}

/// The rows' file bytes by their plans: the data chunks used are copied into the row; the missing ones are
/// decoded there in place, from them and the parity chunks' reply buffers (no other copy).
fn decode_planned(
    file: &File,
    codec: &Codec,
    unit: u64,
    first: u64,
    plans: &[RowPlan],
    found: &mut [Option<(Vec<ChunkVersion>, BytesMut)>],
) -> Result<Vec<u8>, ClientError> {
    let (k, m, u) = (codec.k, codec.m, unit as usize);
    let mut data = vec![0u8; plans.len() * k * u];
    // Stands in for a parity chunk a decode does not use (the decoder wants k + m slices of one length).
    let mut scratch = vec![0u8; m * u];
    for (row, plan) in plans.iter().enumerate() {
        let file_offset = (first + row as u64) * unit * k as u64;
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
    }
    Ok(data)
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
    let new = &RowBytes::Run(Bytes::new());
    let job = RowJob {
        file,
        read_io: io,
        write_io: io,
        codec,
        first: row,
        rows: 1,
        from: base,
        new,
        old_size: size,
        new_end,
        heal: None,
    };
    match write_attempt(&job, known).await? {
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
        let new = &RowBytes::Run(Bytes::new());
        let (first, from, old_size, heal) = (row, base, size, Some(slot));
        let job = RowJob { file, read_io: io, write_io: io, codec, first, rows: 1, from, new, old_size, new_end, heal };
        match write_attempt(&job, known).await? {
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
