//! Degraded decodes and heals of ec rows (docs/format.md §17–18): the rows decoded by the version rule from
//! whichever chunks are intact and agree ([`crate::ec_version`]), repaired on read, and one slot's rows healed, in
//! batches or row by row, through the write protocol (`ec_write.rs`).

use bytes::{Bytes, BytesMut};
use std::time::Duration;
use weft_proto::msg::{ChunkVersion, RowWrite};

use crate::ClientError;
use crate::ec_calls::{ChunkWrite, Written, read_all, write_all};
use crate::ec_codec::{Codec, is_chunk_loss};
use crate::ec_version::{Found, RowPlan, Undecodable, next_data_version, plan_row};
use crate::ec_write::{
    Attempt, Known, RowBytes, RowJob, WRITE_ATTEMPTS_MAX, encode_parity, found_of, last_nonzero, slot_bytes, torn,
    write_attempt,
};
use crate::handle::File;
use crate::recycle::Recycled;
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
    let (skipped, stale, mut causes) = left_out(file, layout, k, m, first, rows).await?;
    let missing = (0..k).filter(|&j| skipped[j]).count();
    let parity = (k..k + m).filter(|&i| !skipped[i]).take(missing);
    let mut read: Vec<usize> = (0..k).filter(|&j| !skipped[j]).chain(parity).collect();
    let mut found: Vec<Option<(Vec<ChunkVersion>, BytesMut)>> = vec![None; k + m];
    read_into(file, io, layout, &read, first, rows, &mut found, &mut causes).await?;
    let plans = match plan_rows(k, m, rows, &found) {
        Ok(plans) => plans,
        Err(_) => {
            // The rest, servers left out as "did not answer moments ago" among them (one may be back), and chunks
            // healed since this handle learnt them stale.
            let mut stale = stale;
            crate::stale::healed_since(file, &mut stale, first, first + rows).await?;
            let rest: Vec<usize> = (0..k + m).filter(|i| !stale.contains(i) && !read.contains(i)).collect();
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

/// The chunks a decode leaves out at first (`true`), the stale ones among them, and why: those in a stale range
/// (§18), never read, and those whose server did not answer moments ago while `k` others remain (waiting for its
/// retries on every row would make a degraded read as slow as the retries; they are read if the others fail).
async fn left_out(
    file: &File,
    layout: &weft_proto::Layout,
    k: usize,
    m: usize,
    first: u64,
    rows: u64,
) -> Result<(Vec<bool>, Vec<usize>, Vec<String>), ClientError> {
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
    Ok((skipped, stale, causes))
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
    let (k, u) = (codec.k, layout.stripe_unit as usize);
    let row_bytes = (u * k) as u64;
    let base = first * row_bytes;
    assert!(rows > 0 && base + (rows - 1) * row_bytes < size.max(1), "rows below the file's last row");
    // The healed chunk's bytes are never used, but where its stored length is short of a unit (the file's last
    // row) they say how much must be written over (`HealShape::keep`).
    let slot_bytes_read = (first + rows) * row_bytes > size;
    let Some(read) = heal_read(file, io, codec, (first, rows), slot, slot_bytes_read).await? else {
        return Ok(HealAttempt::RowByRow);
    };
    let mut plan = match plan_heal(codec, u, slot, &read) {
        Ok(Some(plan)) => plan,
        Ok(None) => return Ok(HealAttempt::RowByRow),
        Err((row, e)) => return Err(torn(file, base + row as u64 * row_bytes, e)),
    };
    let hook = file.client.test_hooks().heal();
    if let Some(hook) = hook {
        hook(first).await;
    }
    let shape = HealShape { k, u, base, row_bytes, size, slot };
    if let Some(rows) = heals_alone(k, slot, &read, &plan) {
        let (write, written) = match slot < k {
            true => heal_slot_write(&shape, &read, &plan, rows),
            false => heal_parity_write(&shape, codec, file.client.recycled(), &read, &plan),
        };
        return match write_all(io, layout, write.into_iter().collect(), first).await {
            Written::Moved => Ok(HealAttempt::Moved),
            Written::Failed(f) if !f.is_empty() => Err(f.into_iter().next().expect("one failure").1),
            Written::Failed(_) => Ok(HealAttempt::Done(written)),
        };
    }
    bump_healed(k, slot, &read, &mut plan);
    // 3. The healed data chunk, then 4. every parity chunk.
    let (slot_write, mut written) = heal_slot_write(&shape, &read, &plan, read.rows);
    if let Some(w) = slot_write {
        match write_all(io, layout, vec![w], first).await {
            Written::Moved => return Ok(HealAttempt::Moved),
            Written::Failed(f) if !f.is_empty() => return Err(f.into_iter().next().expect("one failure").1),
            Written::Failed(_) => {}
        }
    }
    let (writes, parity_written) = heal_parity_writes(&shape, codec, file.client.recycled(), &read, &plan);
    written += parity_written;
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
            let missed = read.skip.iter().map(|&i| (i, ClientError::Protocol(format!("chunk {i} is stale"))));
            crate::stale::record_missed(file, missed.collect(), base, first, first + rows).await?;
            Ok(HealAttempt::Done(written))
        }
    }
}

/// What a batch heal read: the chunks left out (stale ones, never read), and per chunk its records and bytes.
struct HealRead {
    skip: Vec<usize>,
    found: Vec<Vec<ChunkVersion>>,
    bytes: Vec<BytesMut>,
    rows: usize,
}

/// Steps 1 and 2 of a batch heal: the parity chunks' records and bytes, then the data chunks' (the healed chunk's
/// record only, unless `slot_bytes`). `None` when the batch path does not handle it (more chunks stale than the
/// code tolerates, another server lost).
async fn heal_read(
    file: &File,
    io: &Io,
    codec: &Codec,
    (first, rows): (u64, u64),
    slot: usize,
    slot_bytes: bool,
) -> Result<Option<HealRead>, ClientError> {
    let (k, m) = (codec.k, codec.m);
    let layout = &file.layout();
    let skip: Vec<usize> =
        crate::stale::stale_slots(file, first, first + rows).await?.into_iter().filter(|&i| i != slot).collect();
    if skip.len() > m {
        return Ok(None);
    }
    let mut found: Vec<Vec<ChunkVersion>> = vec![Vec::new(); k + m];
    let mut bytes: Vec<BytesMut> = vec![BytesMut::new(); k + m];
    for phase in [k..k + m, 0..k] {
        let records_only = (phase.contains(&slot) && !slot_bytes).then_some(slot);
        let which: Vec<usize> = phase.filter(|i| !skip.contains(i) && (*i != slot || slot_bytes)).collect();
        let with_data = read_all(io, layout, which.into_iter(), first, rows, true);
        let without = read_all(io, layout, records_only.into_iter(), first, rows, false);
        let (mut got, without) = tokio::join!(with_data, without);
        got.extend(without);
        for (i, r) in got {
            match r {
                Ok((v, b)) => {
                    found[i] = v;
                    bytes[i] = b;
                }
                // Another server lost: the general path records what it misses.
                Err(e) if is_chunk_loss(&e) && i != slot => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(Some(HealRead { skip, found, bytes, rows: rows as usize }))
}

impl HealRead {
    /// What chunk `i` of row `row` was found as: the healed chunk's bytes are never trusted (`Damaged`).
    fn found(&self, i: usize, row: usize, slot: usize) -> Found {
        if self.skip.contains(&i) {
            return Found::Unreachable;
        }
        let c = &self.found[i][row];
        if i == slot { Found::Damaged { version: c.version } } else { found_of(c, true) }
    }

    fn chunk(&self, i: usize, row: usize, u: usize) -> &[u8] {
        &self.bytes[i][row * u..(row + 1) * u]
    }
}

/// A batch heal's plan: the rows' data (`rows × k` units, row after row) and each row's data versions after it.
struct HealPlan {
    data: Bytes,
    data_versions: Vec<Vec<u64>>,
}

/// Decodes every row of a batch heal by the version rule and gives the healed data chunk a new version above
/// every one named for it (pure: no I/O). `Ok(None)`: a row the batch path does not handle (another chunk
/// damaged, a row that does not decode); `Err((row, cause))`: a row the decoder refused.
fn plan_heal(codec: &Codec, u: usize, slot: usize, read: &HealRead) -> Result<Option<HealPlan>, (usize, String)> {
    let (k, m) = (codec.k, codec.m);
    let mut data = vec![0u8; read.rows * k * u];
    let mut data_versions: Vec<Vec<u64>> = Vec::with_capacity(read.rows);
    // The parity chunks a row's decode uses, copied (the reconstruction wants every shard mutable).
    let mut scratch = vec![0u8; m * u];
    for row in 0..read.rows {
        let fs: Vec<Found> = (0..k + m).map(|i| read.found(i, row, slot)).collect();
        if fs.iter().enumerate().any(|(i, f)| i != slot && matches!(f, Found::Damaged { .. })) {
            return Ok(None);
        }
        let Ok(plan) = plan_row(k, m, &fs) else { return Ok(None) };
        let out = &mut data[row * k * u..(row + 1) * k * u];
        for j in (0..k).filter(|&j| plan.use_chunk[j]) {
            out[j * u..(j + 1) * u].copy_from_slice(read.chunk(j, row, u));
        }
        if !plan.use_chunk[..k].iter().all(|&x| x) {
            for (p, spare) in scratch.chunks_exact_mut(u).enumerate().filter(|(p, _)| plan.use_chunk[k + p]) {
                spare.copy_from_slice(read.chunk(k + p, row, u));
            }
            let shards: Vec<&mut [u8]> = out.chunks_exact_mut(u).chain(scratch.chunks_exact_mut(u)).collect();
            codec.reconstruct_data_in_place(shards, &plan.use_chunk).map_err(|e| (row, e))?;
        }
        data_versions.push(plan.data_versions);
    }
    Ok(Some(HealPlan { data: Bytes::from(data), data_versions }))
}

/// Whether a batch heal writes the healed chunk alone (docs/format.md §18), and of how many rows from the first:
/// always a parity chunk (it names the vector it encodes); a data chunk at the version the rows' parity names for
/// it (a version names one content, §17), when that version is above the chunk's record in each row written (a
/// compare-and-set write only moves up), the rows after them never written (version 0 named and found: zeros, as
/// past a file's end).
fn heals_alone(k: usize, slot: usize, read: &HealRead, plan: &HealPlan) -> Option<usize> {
    if slot >= k {
        return Some(read.rows);
    }
    let (named, found) = (|row: usize| plan.data_versions[row][slot], |row: usize| read.found[slot][row].version);
    let n = (0..read.rows).take_while(|&row| named(row) > found(row)).count();
    (n..read.rows).all(|row| named(row) == 0 && found(row) == 0).then_some(n)
}

/// A healed data chunk's new versions: above its record and every version a parity chunk names for it.
fn bump_healed(k: usize, slot: usize, read: &HealRead, plan: &mut HealPlan) {
    if slot >= k {
        return;
    }
    for (row, versions) in plan.data_versions.iter_mut().enumerate() {
        let parity: Vec<Found> = (k..read.found.len()).map(|i| read.found(i, row, slot)).collect();
        versions[slot] = next_data_version(slot, read.found[slot][row].version, &parity);
    }
}

/// A batch heal's geometry.
struct HealShape {
    k: usize,
    u: usize,
    /// The first row's file offset.
    base: u64,
    row_bytes: u64,
    /// The file size the rows are stored for (§16).
    size: u64,
    slot: usize,
}

impl HealShape {
    /// The stored length (§16) of chunk `i` of row `row`, or longer where the chunk on disk or the new one (`fresh`)
    /// has non-zero bytes past it (as in `ec_write.rs`).
    fn keep(&self, read: &HealRead, i: usize, row: usize, fresh: &[u8]) -> usize {
        let want = slot_bytes(self.size, self.base / self.row_bytes + row as u64, self.k, i, self.u as u64) as usize;
        if want == self.u {
            return want;
        }
        let unread = read.bytes[i].len() < (row + 1) * self.u;
        let disk = if read.found[i][row].intact && !unread { last_nonzero(read.chunk(i, row, self.u)) } else { self.u };
        want.max(disk).max(last_nonzero(fresh))
    }
}

/// Step 3: the healed data chunk's write of the batch's first `rows` rows (none for a parity slot or no rows), and
/// the bytes it writes.
fn heal_slot_write(s: &HealShape, read: &HealRead, plan: &HealPlan, rows: usize) -> (Option<ChunkWrite>, u64) {
    if s.slot >= s.k || rows == 0 {
        return (None, 0);
    }
    let (mut payload, mut recs, mut written) = (Vec::with_capacity(rows), Vec::with_capacity(rows), 0);
    for row in 0..rows {
        let at = row * s.row_bytes as usize + s.slot * s.u;
        let n = s.keep(read, s.slot, row, &plan.data[at..at + s.u]);
        written += n as u64;
        payload.push(plan.data.slice(at..at + n));
        let (expect, version) = (read.found[s.slot][row].version, plan.data_versions[row][s.slot]);
        recs.push(RowWrite { expect, version, parity_of: Vec::new() });
    }
    (Some((s.slot, recs, payload)), written)
}

/// A healed parity chunk alone: [`heal_parity_writes`]'s write of it, and its bytes.
fn heal_parity_write(
    s: &HealShape,
    codec: &Codec,
    bufs: &Recycled,
    read: &HealRead,
    plan: &HealPlan,
) -> (Option<ChunkWrite>, u64) {
    let (writes, written) = heal_parity_writes(s, codec, bufs, read, plan);
    (writes.into_iter().find(|(i, _, _)| *i == s.slot), written)
}

/// Step 4: every parity chunk not left out, encoded from the rows' data, compare-and-set from the versions read
/// with the rows' data versions; and the bytes written to the healed slot if it is a parity chunk.
fn heal_parity_writes(
    s: &HealShape,
    codec: &Codec,
    bufs: &Recycled,
    read: &HealRead,
    plan: &HealPlan,
) -> (Vec<ChunkWrite>, u64) {
    let shards: Vec<&[u8]> = plan.data.chunks_exact(s.u).collect();
    let pbuf = encode_parity(codec, &shards, s.u, bufs);
    let (mut writes, mut written) = (Vec::new(), 0);
    for (p, pb) in pbuf.into_iter().enumerate() {
        let i = s.k + p;
        if read.skip.contains(&i) {
            continue;
        }
        let pb = pb.freeze();
        let (mut payload, mut recs) = (Vec::with_capacity(read.rows), Vec::with_capacity(read.rows));
        for row in 0..read.rows {
            let n = s.keep(read, i, row, &pb[row * s.u..(row + 1) * s.u]);
            if i == s.slot {
                written += n as u64;
            }
            let expect = read.found[i][row].version;
            let parity_of = plan.data_versions[row].clone();
            recs.push(RowWrite { expect, version: expect.saturating_add(1), parity_of });
            payload.push(pb.slice(row * s.u..row * s.u + n));
        }
        writes.push((i, recs, payload));
    }
    (writes, written)
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

    /// A batch of one row of `ec 2+1` (units of 8 bytes): data chunks `[1; 8]` and `[2; 8]` at versions 3 and 4,
    /// the parity naming them; chunk `slot` is the one healed (its bytes zeros, not trusted).
    fn healing(slot: usize) -> (Codec, HealRead) {
        let codec = Codec::new(2, 1).unwrap();
        let data = [vec![1u8; 8], vec![2u8; 8]];
        let parity = codec.encode(&[&data[0], &data[1]]).remove(0);
        let mut bytes: Vec<BytesMut> =
            vec![BytesMut::from(&data[0][..]), BytesMut::from(&data[1][..]), BytesMut::from(&parity[..])];
        bytes[slot] = BytesMut::zeroed(8);
        let found = vec![
            vec![ChunkVersion { version: 3, intact: true, parity_of: vec![] }],
            vec![ChunkVersion { version: 4, intact: true, parity_of: vec![] }],
            vec![ChunkVersion { version: 9, intact: true, parity_of: vec![3, 4] }],
        ];
        (codec, HealRead { skip: vec![], found, bytes, rows: 1 })
    }

    #[test]
    fn a_healed_data_chunk_is_decoded_and_written_alone_only_below_the_version_the_parity_names() {
        // Its record at the version the parity names (bytes not trusted): written above it, with every parity.
        let (codec, read) = healing(1);
        let mut plan = plan_heal(&codec, 8, 1, &read).unwrap().unwrap();
        assert_eq!(&plan.data[..], &[[1u8; 8], [2u8; 8]].concat()[..], "chunk 1 decoded, never its bytes read");
        assert_eq!(plan.data_versions, vec![vec![3, 4]], "the versions the parity names");
        assert_eq!(heals_alone(2, 1, &read, &plan), None, "a write at version 4 would not move its record of 4");
        bump_healed(2, 1, &read, &mut plan);
        assert_eq!(plan.data_versions, vec![vec![3, 5]], "above its record and what the parity names");
        // A spare's chunk (no record): written alone at the version the parity names for the decoded bytes.
        let (codec, mut read) = healing(1);
        read.found[1][0] = ChunkVersion { version: 0, intact: true, parity_of: vec![] };
        let plan = plan_heal(&codec, 8, 1, &read).unwrap().unwrap();
        assert_eq!(heals_alone(2, 1, &read, &plan), Some(1));
        assert_eq!(plan.data_versions, vec![vec![3, 4]]);
        // A row whose parity names version 0 for it and no record (never written): nothing to write.
        let (codec, mut read) = healing(1);
        read.found[1][0].version = 0;
        read.found[2][0].parity_of = vec![3, 0];
        read.bytes[2] = BytesMut::from(&codec.encode(&[&[1u8; 8], &[0u8; 8]]).remove(0)[..]);
        let plan = plan_heal(&codec, 8, 1, &read).unwrap().unwrap();
        assert_eq!(heals_alone(2, 1, &read, &plan), Some(0), "zeros never written: nothing to write");
        // Nor can a record above it be moved down to 0: that row goes the general way.
        let (codec, mut read) = healing(1);
        read.found[1][0].version = 2;
        read.found[2][0].parity_of = vec![3, 0];
        read.bytes[2] = BytesMut::from(&codec.encode(&[&[1u8; 8], &[0u8; 8]]).remove(0)[..]);
        let plan = plan_heal(&codec, 8, 1, &read).unwrap().unwrap();
        assert_eq!(heals_alone(2, 1, &read, &plan), None);
        // A healed parity chunk: always alone, the data as read, their versions unchanged.
        let (codec, read) = healing(2);
        let mut plan = plan_heal(&codec, 8, 2, &read).unwrap().unwrap();
        assert_eq!(heals_alone(2, 2, &read, &plan), Some(1));
        bump_healed(2, 2, &read, &mut plan);
        assert_eq!(plan.data_versions, vec![vec![3, 4]]);
    }

    #[test]
    fn a_batch_with_another_damaged_chunk_goes_row_by_row() {
        let (codec, mut read) = healing(1);
        read.found[0][0].intact = false;
        assert!(plan_heal(&codec, 8, 1, &read).unwrap().is_none());
        // Parity naming other versions than the data's: the row does not decode here either.
        let (codec, mut read) = healing(1);
        read.found[2][0].parity_of = vec![7, 4];
        assert!(plan_heal(&codec, 8, 1, &read).unwrap().is_none());
    }
}
