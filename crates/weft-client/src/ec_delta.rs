//! Delta parity: a small write into an ec row moves only the bytes it changes (docs/format.md §17, "Delta
//! parity"; issue 32). A write inside one row whose chunks all lie below the file's size reads, all at once, the
//! ranges it changes of the data chunks it changes and the same span of every parity chunk (`ReadChunkRange`),
//! and the other data chunks' records (`ReadRows` without bytes); then writes the data ranges, then the parity
//! ranges updated by `M[k+p][j] · (new ⊕ old)` (`WriteChunkRange`), all compare-and-set. Anything unexpected (a
//! chunk that does not answer or is damaged, parity chunks that name different vectors, a data chunk at another
//! version than they name, a moved version, a failed write) declines, and the caller writes the row by the
//! whole-row protocol (`ec_write.rs`), which reads everything and repairs what it finds.
//!
//! Invariant: the parity a delta write stores is the encoding of the data at the versions its `parity_of` names:
//! the old parity was intact and every parity chunk named one vector, every data chunk's record held that vector's
//! version when read, and every range is written compare-and-set from the version read (data before parity).

use bytes::{Bytes, BytesMut};
use tokio::task::JoinSet;
use weft_proto::msg::{ChunkVersion, EC_K_MAX, ReadChunkRangeReq, RowWrite, WriteChunkRangeReq};
use weft_proto::{Layout, Request, Response};

use crate::ClientError;
use crate::ec_calls::read_all;
use crate::ec_codec::{Codec, is_chunk_loss};
use crate::ec_version::{Found, next_data_version, vector_of};
use crate::ec_write::Replaced;
use crate::handle::File;
use crate::striped::Io;

/// How a delta write ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Delta {
    /// Every data and parity range landed.
    Done,
    /// Nothing written, or not all of it: the whole-row protocol takes the row (and repairs what this left). Per
    /// data chunk, the range this write replaced in it, if it did: the whole-row protocol needs the chunk as it was
    /// when parity that lost to this write's still names its old version (`Known::replaced`).
    Declined(Vec<Option<Replaced>>),
}

/// One range of one chunk of a row: chunk `i` (data `< k`, parity `≥ k`), chunk offsets `[lo, hi)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    i: usize,
    lo: u64,
    hi: u64,
}

/// The ranges of the data chunks a write of `len` bytes at row offset `at` changes, in chunk order.
fn changed(unit: u64, at: u64, len: u64) -> Vec<Span> {
    assert!(len > 0, "a write changes at least one byte");
    let end = at + len;
    (at / unit..=(end - 1) / unit)
        .map(|j| Span { i: j as usize, lo: at.max(j * unit) - j * unit, hi: end.min((j + 1) * unit) - j * unit })
        .collect()
}

/// Whether a write of `len` bytes at file offset `from` may go by delta parity, before any I/O: it lies in one
/// row, it does not cover the row whole (whole rows need no read at all), and the row ends at or below `size`
/// (every chunk's stored length is a whole unit before and after: no length changes, docs/format.md §16).
pub(crate) fn fits(unit: u64, k: usize, from: u64, len: u64, size: u64) -> bool {
    let row_bytes = unit * k as u64;
    let row = from / row_bytes;
    len > 0 && len < row_bytes && (from + len - 1) / row_bytes == row && (row + 1) * row_bytes <= size
}

/// Writes `new` at file offset `from` (inside row `row`, [`fits`]) by delta parity.
pub(crate) async fn write(
    file: &File,
    read_io: &Io,
    write_io: &Io,
    codec: &Codec,
    row: u64,
    from: u64,
    new: &Bytes,
) -> Result<Delta, ClientError> {
    let layout = file.layout();
    let (k, m) = (codec.k, codec.m);
    let unit = u64::from(layout.stripe_unit);
    let at = from - row * unit * k as u64;
    let data = changed(unit, at, new.len() as u64);
    let lo = data.iter().map(|s| s.lo).min().expect("a range");
    let hi = data.iter().map(|s| s.hi).max().expect("a range");
    // 1–2. Every chunk at once: the parity span, the changed data ranges, the other data chunks' records. Unlike
    // the whole-row protocol, the order of these reads does not matter: every version read must equal the
    // parity's vector, and every write is compare-and-set, so a writer that moved a chunk between two reads is
    // either seen (a version off the vector: declined) or loses a compare-and-set to this write (or wins one).
    let parity_spans: Vec<Span> = (k..k + m).map(|i| Span { i, lo, hi }).collect();
    let others: Vec<usize> = (0..k).filter(|j| !data.iter().any(|s| s.i == *j)).collect();
    let spans: Vec<Span> = data.iter().chain(&parity_spans).copied().collect();
    let (ranges, records) = tokio::join!(
        read_ranges(file, read_io, &layout, row, &spans),
        read_records(file, read_io, &layout, row, &others)
    );
    let (Some(mut olds), Some(records)) = (ranges, records) else { return Ok(Delta::Declined(Vec::new())) };
    let parity = olds.split_off(data.len());
    let Some(vector) = agreed_vector(k, &parity) else { return Ok(Delta::Declined(Vec::new())) };
    let at_vector = |(j, c): (usize, &ChunkVersion)| c.intact && c.version == vector[j];
    if !data.iter().map(|s| s.i).zip(olds.iter().map(|(c, _)| c)).all(at_vector)
        || !others.iter().copied().zip(records.iter()).all(at_vector)
    {
        return Ok(Delta::Declined(Vec::new()));
    }
    let hook = file.client.test_hooks().delta();
    if let Some(hook) = hook {
        hook(row).await;
    }
    // 3. The data ranges, then 4. every parity span.
    let (writes, parity_of) = data_writes(unit, at, new, &data, &vector, &parity);
    let landed = write_ranges(file, write_io, &layout, row, writes.clone()).await;
    if !landed.iter().all(|&l| l) {
        let old = |n: usize| olds[n].1.clone().freeze();
        return Ok(Delta::Declined(replaced(k, &writes, &landed, &vector, old)));
    }
    let parity_writes = parity_writes(codec, &writes, &mut olds, parity, parity_spans, &parity_of);
    if write_ranges(file, write_io, &layout, row, parity_writes).await.iter().all(|&l| l) {
        return Ok(Delta::Done);
    }
    // The old bytes back from the deltas: (old ⊕ new) ⊕ new.
    let old = |n: usize| {
        let (_, _, new) = &writes[n];
        Bytes::from(olds[n].1.iter().zip(new.iter()).map(|(d, b)| d ^ b).collect::<Vec<u8>>())
    };
    Ok(Delta::Declined(replaced(k, &writes, &vec![true; writes.len()], &vector, old)))
}

/// The data ranges' writes (each at a version above every one named for its chunk, compare-and-set from the
/// vector's), and the vector the parity names after them.
fn data_writes(
    unit: u64,
    at: u64,
    new: &Bytes,
    data: &[Span],
    vector: &[u64],
    parity: &[(ChunkVersion, BytesMut)],
) -> (Vec<(Span, RowWrite, Bytes)>, Vec<u64>) {
    let found_parity: Vec<Found> =
        parity.iter().map(|(c, _)| Found::Intact { version: c.version, parity_of: c.parity_of.clone() }).collect();
    let mut parity_of = vector.to_vec();
    let mut writes = Vec::with_capacity(data.len());
    for s in data {
        let version = next_data_version(s.i, vector[s.i], &found_parity);
        parity_of[s.i] = version;
        let from = (s.i as u64 * unit + s.lo - at) as usize;
        let bytes = new.slice(from..from + (s.hi - s.lo) as usize);
        writes.push((*s, RowWrite { expect: vector[s.i], version, parity_of: Vec::new() }, bytes));
    }
    (writes, parity_of)
}

/// Every parity span plus what each changed range adds to it (`olds` become the deltas, old ⊕ new, in place), as
/// compare-and-set writes naming `parity_of`.
fn parity_writes(
    codec: &Codec,
    writes: &[(Span, RowWrite, Bytes)],
    olds: &mut [(ChunkVersion, BytesMut)],
    mut parity: Vec<(ChunkVersion, BytesMut)>,
    spans: Vec<Span>,
    parity_of: &[u64],
) -> Vec<(Span, RowWrite, Bytes)> {
    let lo = spans.first().map_or(0, |s| s.lo);
    for ((s, _, bytes), (_, old)) in writes.iter().zip(olds.iter_mut()) {
        old.iter_mut().zip(bytes.iter()).for_each(|(o, n)| *o ^= n);
        for (p, (_, span)) in parity.iter_mut().enumerate() {
            codec.add_delta(p, s.i, old, &mut span[(s.lo - lo) as usize..(s.hi - lo) as usize]);
        }
    }
    parity
        .into_iter()
        .zip(spans)
        .map(|((c, span), s)| {
            let w = RowWrite { expect: c.version, version: c.version.saturating_add(1), parity_of: parity_of.to_vec() };
            (s, w, span.freeze())
        })
        .collect()
}

/// Per data chunk, the range of it that landed writes replaced: the version written, the one before (`vector`'s),
/// and the old bytes (`old(n)` for write `n`).
fn replaced(
    k: usize,
    writes: &[(Span, RowWrite, Bytes)],
    landed: &[bool],
    vector: &[u64],
    old: impl Fn(usize) -> Bytes,
) -> Vec<Option<Replaced>> {
    let mut out = vec![None; k];
    for (n, (s, w, _)) in writes.iter().enumerate().filter(|(n, _)| landed[*n]) {
        let (written, old_version, lo) = (w.version, vector[s.i], s.lo as usize);
        out[s.i] = Some(Replaced { written, old_version, lo, old: old(n) });
    }
    out
}

/// The data versions every parity chunk names, when all of them read intact and name the same (a never-written
/// parity chunk, version 0 with no vector, names all zeros at version 0).
fn agreed_vector(k: usize, parity: &[(ChunkVersion, BytesMut)]) -> Option<Vec<u64>> {
    let mut agreed: Option<Vec<u64>> = None;
    for (c, _) in parity {
        let v = vector_of(k, c.version, &c.parity_of).filter(|_| c.intact)?;
        if agreed.as_ref().is_some_and(|a| *a != v) {
            return None;
        }
        agreed = Some(v);
    }
    agreed
}

/// Notes a server that did not answer (so the whole-row protocol leaves it out at once) and logs why the delta
/// write declines.
fn declined(file: &File, i: usize, e: &ClientError) {
    if is_chunk_loss(e) {
        file.client.note_unreachable(e);
    }
    tracing::debug!(ino = file.attr.ino, chunk = i, "delta parity declined, writing the whole row: {e}");
}

/// `ReadChunkRange` of every span at once: `(record, bytes)` in the order of `spans`, or `None` if any failed.
async fn read_ranges(
    file: &File,
    io: &Io,
    layout: &std::sync::Arc<Layout>,
    row: u64,
    spans: &[Span],
) -> Option<Vec<(ChunkVersion, BytesMut)>> {
    let mut tasks = JoinSet::new();
    for (n, &s) in spans.iter().enumerate() {
        let (io, layout) = (io.clone(), layout.clone());
        tasks.spawn(async move { (n, s.i, read_range(&io, &layout, row, s).await) });
    }
    let mut out: Vec<Option<(ChunkVersion, BytesMut)>> = vec![None; spans.len()];
    let mut ok = true;
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok((n, _, Ok(got))) => out[n] = Some(got),
            Ok((_, i, Err(e))) => {
                declined(file, i, &e);
                ok = false;
            }
            Err(_) => ok = false,
        }
    }
    ok.then(|| out.into_iter().map(|o| o.expect("every range answered")).collect())
}

async fn read_range(io: &Io, layout: &Layout, row: u64, s: Span) -> Result<(ChunkVersion, BytesMut), ClientError> {
    let len = s.hi - s.lo;
    let req = |cap| {
        Request::ReadChunkRange(ReadChunkRangeReq {
            ino: io.ino,
            unit: layout.stripe_unit,
            row,
            offset: s.lo as u32,
            len: len as u32,
            cap,
        })
    };
    let dest = io.client.recycled().take(len as usize);
    let (resp, d) = crate::ec_calls::call(io, layout, s.i, req, Vec::new(), Some(dest)).await?;
    match (resp, d) {
        (Response::ReadChunkRange(c), Some(d)) if d.len() as u64 == len && c.parity_of.len() <= EC_K_MAX => Ok((c, d)),
        (resp, _) => Err(ClientError::Protocol(format!("ReadChunkRange answered {:?}", resp.op()))),
    }
}

/// The records of the data chunks `which` of row `row` (no bytes), in the order of `which`, or `None`.
async fn read_records(file: &File, io: &Io, layout: &Layout, row: u64, which: &[usize]) -> Option<Vec<ChunkVersion>> {
    let mut out: Vec<Option<ChunkVersion>> = vec![None; which.len()];
    let mut ok = true;
    for (i, r) in read_all(io, layout, which.iter().copied(), row, 1, false).await {
        match (r, which.iter().position(|&w| w == i)) {
            (Ok((mut v, _)), Some(n)) if v.len() == 1 => out[n] = v.pop(),
            (Err(e), _) => {
                declined(file, i, &e);
                ok = false;
            }
            _ => ok = false,
        }
    }
    if ok { out.into_iter().collect() } else { None }
}

/// `WriteChunkRange` of every range at once; which landed (in the order of `writes`).
async fn write_ranges(
    file: &File,
    io: &Io,
    layout: &std::sync::Arc<Layout>,
    row: u64,
    writes: Vec<(Span, RowWrite, Bytes)>,
) -> Vec<bool> {
    let mut landed = vec![false; writes.len()];
    let mut tasks = JoinSet::new();
    for (n, (s, w, bytes)) in writes.into_iter().enumerate() {
        let (io, layout) = (io.clone(), layout.clone());
        tasks.spawn(async move {
            let req = |cap| {
                Request::WriteChunkRange(WriteChunkRangeReq {
                    ino: io.ino,
                    unit: layout.stripe_unit,
                    row,
                    offset: s.lo as u32,
                    write: w.clone(),
                    cap,
                })
            };
            (n, s.i, crate::ec_calls::call(&io, &layout, s.i, req, vec![bytes], None).await)
        });
    }
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok((n, _, Ok((Response::WriteChunkRange(()), _)))) => landed[n] = true,
            Ok((_, i, Err(e))) => declined(file, i, &e),
            _ => {}
        }
    }
    landed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_changes_the_ranges_of_the_chunks_it_touches() {
        let s = |i, lo, hi| Span { i, lo, hi };
        assert_eq!(changed(100, 0, 1), vec![s(0, 0, 1)]);
        assert_eq!(changed(100, 150, 10), vec![s(1, 50, 60)]);
        assert_eq!(changed(100, 199, 2), vec![s(1, 99, 100), s(2, 0, 1)]);
        assert_eq!(changed(100, 50, 200), vec![s(0, 50, 100), s(1, 0, 100), s(2, 0, 50)]);
        assert_eq!(changed(100, 300, 100), vec![s(3, 0, 100)]);
    }

    #[test]
    fn only_writes_inside_a_row_below_the_size_fit() {
        // ec 4+?, unit 100: rows of 400 bytes.
        assert!(fits(100, 4, 10, 20, 400));
        assert!(fits(100, 4, 410, 20, 800));
        assert!(!fits(100, 4, 10, 20, 399), "the row is the file's short last row");
        assert!(!fits(100, 4, 390, 20, 1200), "across two rows");
        assert!(!fits(100, 4, 0, 400, 1200), "a whole row needs no read");
        assert!(!fits(100, 4, 10, 0, 1200), "nothing to write");
        assert!(fits(100, 4, 399, 1, 400));
    }
}
