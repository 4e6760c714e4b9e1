//! Versioned stripe rows of ec files on the wire (docs/format.md §17): the write protocol that closes the write
//! hole, and the degraded decode that trusts only chunks whose versions agree ([`crate::ec_version`]).
//!
//! **A write of rows** (one row only partly covered, or a run of whole rows), retried whole when another writer
//! moved a version under it (compare-and-set, `VersionMoved`), at most [`WRITE_ATTEMPTS_MAX`] times:
//! 1. read the parity chunks' records (with their bytes for a partial row);
//! 2. then the data chunks' records (with their bytes for a partial row, decoding missing ones by the version
//!    rule; a torn row whose lost bytes are needed is [`ClientError::TornRow`]);
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

use bytes::Bytes;
use std::time::Duration;
use tokio::task::JoinSet;
use weft_proto::msg::{ChunkVersion, EC_K_MAX, ROWS_PER_REQUEST_MAX, ReadRowsReq, RowWrite, WriteRowsReq};
use weft_proto::{Capability, ErrorCode, Layout, Request, Response};

use crate::ClientError;
use crate::capability::is_expired;
use crate::ec::{Codec, is_chunk_loss};
use crate::ec_version::{Found, next_data_version, plan_row};
use crate::file::{File, Io};

/// How many times a row write is tried when other writers keep moving its versions.
pub(crate) const WRITE_ATTEMPTS_MAX: u32 = 16;

/// Rows per `ReadRows`/`WriteRows` request: a transfer unit's worth (at least one row).
fn rows_per_request(io: &Io, unit: u64) -> u64 {
    (io.unit_max / unit).clamp(1, u64::from(ROWS_PER_REQUEST_MAX))
}

/// One call to the data server of `layout.servers[i]`; an expired capability is renewed and the call sent once
/// more. `dest_len`: the reply's payload length, if it has one.
async fn call(
    io: &Io,
    layout: &Layout,
    i: usize,
    make: impl Fn(Capability) -> Request,
    data: Vec<Bytes>,
    dest_len: Option<usize>,
) -> Result<(Response, Option<bytes::BytesMut>), ClientError> {
    let server = layout.servers[i];
    let ds = io.client.data_server(server).await?;
    let mut cap = io.caps.get().await?;
    let mut renewed = false;
    loop {
        let dest = dest_len.map(|n| vec![bytes::BytesMut::zeroed(n)]).unwrap_or_default();
        match ds.call(make(cap.clone()), data.clone(), dest).await {
            Ok((resp, mut d)) => return Ok((resp, d.pop())),
            Err(source) if !renewed && is_expired(&source) => {
                cap = io.caps.renew_from(&cap).await?;
                renewed = true;
            }
            Err(source) => return Err(ClientError::Data { server, source }),
        }
    }
}

/// The records (and with `with_data` the bytes, `rows × unit`) of rows `[first, first + rows)` of chunk `i`.
pub(crate) async fn read_rows(
    io: &Io,
    layout: &Layout,
    i: usize,
    first: u64,
    rows: u64,
    with_data: bool,
) -> Result<(Vec<ChunkVersion>, Vec<u8>), ClientError> {
    let unit = u64::from(layout.stripe_unit);
    let per = rows_per_request(io, unit);
    let mut versions = Vec::with_capacity(rows as usize);
    let mut bytes = Vec::with_capacity(if with_data { (rows * unit) as usize } else { 0 });
    let mut r = first;
    while r < first + rows {
        let n = per.min(first + rows - r);
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
        let dest = with_data.then_some((n * unit) as usize);
        let (resp, d) = call(io, layout, i, req, Vec::new(), dest).await?;
        let Response::ReadRows(v) = resp else {
            return Err(ClientError::Protocol(format!("ReadRows answered {:?}", resp.op())));
        };
        if v.len() as u64 != n || v.iter().any(|c| c.parity_of.len() > EC_K_MAX) {
            return Err(ClientError::Protocol(format!("ReadRows answered {} records for {n} rows", v.len())));
        }
        versions.extend(v);
        if let Some(d) = d {
            bytes.extend_from_slice(&d);
        }
        r += n;
    }
    Ok((versions, bytes))
}

/// Writes chunk `i` of rows `first..` (`payload` back to back, the last possibly short) with the given
/// compare-and-set records.
async fn write_rows(
    io: &Io,
    layout: &Layout,
    i: usize,
    first: u64,
    rows: Vec<RowWrite>,
    payload: Vec<u8>,
) -> Result<(), ClientError> {
    let unit = u64::from(layout.stripe_unit);
    let per = rows_per_request(io, unit) as usize;
    let payload = Bytes::from(payload);
    for (n, chunk) in rows.chunks(per).enumerate() {
        let at = (n * per) as u64;
        let from = ((at * unit) as usize).min(payload.len());
        let to = (((at + chunk.len() as u64) * unit) as usize).min(payload.len());
        let req = |cap| {
            Request::WriteRows(WriteRowsReq {
                ino: io.ino,
                unit: layout.stripe_unit,
                first_row: first + at,
                rows: chunk.to_vec(),
                cap,
            })
        };
        call(io, layout, i, req, vec![payload.slice(from..to)], None).await?;
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
) -> Vec<(usize, Result<(Vec<ChunkVersion>, Vec<u8>), ClientError>)> {
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
async fn write_all(io: &Io, layout: &Layout, writes: Vec<(usize, Vec<RowWrite>, Vec<u8>)>, first: u64) -> Written {
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
    new: &[u8],
    old_size: u64,
    new_end: u64,
) -> Result<(), ClientError> {
    let unit = u64::from(file.layout().stripe_unit);
    let row_bytes = unit * codec.k as u64;
    let base = first * row_bytes;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match write_attempt(file, read_io, write_io, codec, first, rows, from, new, old_size, new_end, None).await? {
            Attempt::Done => return Ok(()),
            Attempt::Moved if attempt >= WRITE_ATTEMPTS_MAX => {
                return Err(ClientError::WriteConflict { ino: file.attr.ino, file_offset: base, attempts: attempt });
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
        }
    }
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
    new: &[u8],
    old_size: u64,
    new_end: u64,
    heal: Option<usize>,
) -> Result<Attempt, ClientError> {
    let layout = &file.layout();
    let (k, m) = (codec.k, codec.m);
    let unit = u64::from(layout.stripe_unit);
    let u = unit as usize;
    let row_bytes = unit * k as u64;
    let base = first * row_bytes;
    let to = from + new.len() as u64;
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
    // 1. Parity records first, 2. then the data chunks' (see the module doc for why this order).
    let mut found: Vec<Vec<ChunkVersion>> = vec![Vec::new(); k + m];
    let mut bytes: Vec<Vec<u8>> = vec![Vec::new(); k + m];
    for phase in [k..k + m, 0..k] {
        let which: Vec<usize> = phase.filter(|i| !skip.contains(i)).collect();
        for (i, r) in read_all(read_io, layout, which.into_iter(), first, rows, partial).await {
            match r {
                Ok((v, b)) => {
                    found[i] = v;
                    bytes[i] = b;
                }
                Err(e) if is_chunk_loss(&e) && Some(i) != heal => lost.push((i, e)),
                Err(e) => return Err(e),
            }
        }
    }
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
    let mut buf = vec![0u8; (rows * row_bytes) as usize];
    let mut rewrite = vec![false; k];
    let mut data_versions: Vec<Vec<u64>> = Vec::with_capacity(rows as usize);
    let parity_found = |row: usize| -> Vec<Found> { (k..k + m).map(|i| fnd(i, row, partial)).collect() };
    if partial {
        let fs: Vec<Found> = (0..k + m).map(|i| fnd(i, 0, true)).collect();
        for j in 0..k {
            if matches!(fs[j], Found::Intact { .. }) {
                buf[j * u..(j + 1) * u].copy_from_slice(&bytes[j]);
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
                                .then(|| if i < k { buf[i * u..(i + 1) * u].to_vec() } else { bytes[i].clone() })
                        })
                        .collect();
                    codec.reconstruct(&mut shards).map_err(|e| torn(file, base, e))?;
                    for (j, s) in shards.iter().take(k).enumerate() {
                        buf[j * u..(j + 1) * u].copy_from_slice(s.as_ref().expect("reconstructed"));
                    }
                }
                versions = plan.data_versions;
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
        buf[(from - base) as usize..(to - base) as usize].copy_from_slice(new);
        let pf = parity_found(0);
        for j in 0..k {
            if rewrite[j] {
                versions[j] = next_data_version(j, fs[j].version().unwrap_or(0), &pf);
            }
        }
        data_versions.push(versions);
    } else {
        buf.copy_from_slice(new);
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
    let mut writes = Vec::new();
    for j in (0..k).filter(|&j| rewrite[j]) {
        let mut payload = Vec::with_capacity(rows as usize * u);
        let mut recs = Vec::with_capacity(rows as usize);
        for row in 0..rows {
            let rb = &buf[(row * row_bytes) as usize..][..row_bytes as usize];
            let chunk = &rb[j * u..(j + 1) * u];
            let keep = stored(row).saturating_sub(j * u).min(u).max(on_disk(j, chunk));
            payload.extend_from_slice(&chunk[..keep]);
            let expect = found[j][row as usize].version;
            recs.push(RowWrite { expect, version: data_versions[row as usize][j], parity_of: Vec::new() });
        }
        writes.push((j, recs, payload));
    }
    match write_all(write_io, layout, writes, first).await {
        Written::Moved => return Ok(Attempt::Moved),
        Written::Failed(f) => lost.extend(f),
    }
    let mut parity: Vec<(Vec<RowWrite>, Vec<u8>)> = vec![(Vec::new(), Vec::new()); m];
    for row in 0..rows {
        let rb = &buf[(row * row_bytes) as usize..][..row_bytes as usize];
        let shards: Vec<&[u8]> = (0..k).map(|j| &rb[j * u..(j + 1) * u]).collect();
        for (p, par) in codec.encode(&shards).iter().enumerate() {
            if skip.contains(&(k + p)) {
                continue;
            }
            let keep = stored(row).min(u).max(on_disk(k + p, par));
            let expect = found[k + p][row as usize].version;
            let version = expect.saturating_add(1);
            parity[p].0.push(RowWrite { expect, version, parity_of: data_versions[row as usize].clone() });
            parity[p].1.extend_from_slice(&par[..keep]);
        }
    }
    let writes = parity
        .into_iter()
        .enumerate()
        .filter(|(p, _)| !skip.contains(&(k + p)))
        .map(|(p, (recs, payload))| (k + p, recs, payload))
        .collect();
    match write_all(write_io, layout, writes, first).await {
        Written::Moved => return Ok(Attempt::Moved),
        Written::Failed(f) => lost.extend(f),
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
    let mut found: Vec<Option<(Vec<ChunkVersion>, Vec<u8>)>> = vec![None; k + m];
    // A chunk in a stale range (§18) is never read: it is decoded like a missing one.
    let stale = crate::stale::stale_slots(file, first, first + rows).await?;
    let mut causes: Vec<String> = stale.iter().map(|i| format!("chunk {i}: stale")).collect();
    for (i, r) in read_all(io, layout, (0..k + m).filter(|i| !stale.contains(i)), first, rows, true).await {
        match r {
            Ok(x) => found[i] = Some(x),
            Err(e) if is_chunk_loss(&e) => causes.push(format!("chunk {i}: {e}")),
            Err(e) => return Err(e),
        }
    }
    causes.sort();
    let reachable = found.iter().filter(|f| f.is_some()).count();
    let mut data = vec![0u8; (rows * row_bytes) as usize];
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
        let mut shards: Vec<Option<Vec<u8>>> = (0..k + m)
            .map(|i| {
                plan.use_chunk[i]
                    .then(|| found[i].as_ref().expect("used chunks were read").1[row * u..(row + 1) * u].to_vec())
            })
            .collect();
        codec.reconstruct(&mut shards).map_err(|e| torn(file, file_offset, e))?;
        for (j, s) in shards.iter().take(k).enumerate() {
            let at = (row * k + j) * u;
            data[at..at + u].copy_from_slice(s.as_ref().expect("reconstructed"));
        }
        if !plan.repair.is_empty() {
            to_repair.push(first + row as u64);
        }
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
    match write_attempt(file, io, io, codec, row, 1, base, &[], size, new_end, None).await? {
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
    loop {
        attempt += 1;
        match write_attempt(file, io, io, codec, row, 1, base, &[], size, new_end, Some(slot)).await? {
            Attempt::Done => return Ok(()),
            Attempt::Moved if attempt >= WRITE_ATTEMPTS_MAX => {
                return Err(ClientError::WriteConflict { ino: file.attr.ino, file_offset: base, attempts: attempt });
            }
            Attempt::Moved => tokio::time::sleep(Duration::from_micros(u64::from(attempt) * 200)).await,
        }
    }
}
