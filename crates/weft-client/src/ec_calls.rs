//! The chunk calls of ec rows (docs/format.md §17): `ReadRows` and `WriteRows` of one chunk's rows, cut into
//! requests of a transfer unit, several in flight, and the same to every server of a row at once. No decisions:
//! the write protocol (`ec_write.rs`), delta writes (`ec_delta.rs`) and decodes and heals (`ec_rows.rs`) use them.

use bytes::{Bytes, BytesMut};
use tokio::task::JoinSet;
use weft_proto::msg::{ChunkVersion, EC_K_MAX, ROWS_PER_REQUEST_MAX, ReadRowsReq, RowWrite, WriteRowsReq};
use weft_proto::{Capability, ErrorCode, Layout, Request, Response};

use crate::ClientError;
use crate::capability::is_expired;
use crate::striped::Io;

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
pub(crate) async fn read_all(
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
pub(crate) enum Written {
    /// Another writer moved a version: the caller retries the row.
    Moved,
    /// Every write landed, or these servers failed (not with a moved version).
    Failed(Vec<(usize, ClientError)>),
}

/// One server's part of a write: chunk `i`, its rows' compare-and-set records and their bytes (one segment per row).
pub(crate) type ChunkWrite = (usize, Vec<RowWrite>, Vec<Bytes>);

/// Writes to every server at once.
pub(crate) async fn write_all(io: &Io, layout: &Layout, writes: Vec<ChunkWrite>, first: u64) -> Written {
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
}
