//! The data path of erasure-coded files (`ec k+m`, docs/format.md §16), encoded and decoded at the client.
//!
//! Why at the client: the bytes are there already, so a full-stripe write costs no server-to-server hop, and a
//! data server stays a plain object store (a parity chunk is just another object write, zero-copy like the rest).
//!
//! - **Healthy reads** read the data chunks only: the data of an `ec k+m` file follows the plain rule over its
//!   first `k` servers ([`Layout::data_view`]), so they go through the plain path ([`read_on`]) unchanged.
//! - **Degraded reads**: when any of those fails (a server that does not answer, a chunk refused as `Corrupt`),
//!   the stripe rows the range touches are read whole from every server of the layout and each row is decoded
//!   from any `k` chunks that came back. A server that answered `Corrupt` gets its chunks rewritten from the
//!   decoded row (repair on read). Fewer than `k` chunks: [`ClientError::Unavailable`], never zeros.
//! - **Writes** are read–modify–write per stripe row: a row only partly covered is read first (healthy or
//!   degraded), the new bytes laid over it, parity computed, and every chunk of the rows written, to all `k + m`
//!   servers at once. A server that cannot be written fails the write ([`ClientError::DegradedWrite`]): what it
//!   missed is not recorded anywhere yet, so letting the write go on would leave a stale chunk behind.
//!
//! The write hole is not closed (ARCHITECTURE.md): two clients writing one row at once, or a crash between the
//! chunk writes of a row, can leave data and parity that disagree, undetected until that row is decoded.

use bytes::{Bytes, BytesMut};
use reed_solomon_erasure::galois_8::ReedSolomon;
use std::sync::atomic::Ordering;
use tokio::task::JoinSet;
use weft_proto::{DataRedundancy, ErrorCode, Layout};

use std::sync::Arc;
use std::time::Instant;
use weft_proto::Rights;

use crate::ClientError;
use crate::capability::CapHolder;
use crate::file::{File, Io, plan, read_units_on, write_units_on};

/// Rows decoded per batch in a degraded read are bounded so that `rows × (k + m) × unit` stays under this (but at
/// least one row): the memory a degraded read holds at once.
const DEGRADED_BATCH_BYTES_MAX: u64 = 64 << 20;

/// A Reed–Solomon code of `k` data and `m` parity shards over GF(2^8) (the `reed-solomon-erasure` crate; see
/// ARCHITECTURE.md for why not ISA-L). Shards of one row all have the same length.
pub(crate) struct Codec {
    rs: ReedSolomon,
    pub(crate) k: usize,
    pub(crate) m: usize,
}

impl Codec {
    pub(crate) fn new(k: usize, m: usize) -> Result<Codec, ClientError> {
        let rs = ReedSolomon::new(k, m).map_err(|e| ClientError::Protocol(format!("ec {k}+{m}: {e:?}")))?;
        Ok(Codec { rs, k, m })
    }

    /// The `m` parity shards of `data` (`k` shards of one length).
    pub(crate) fn encode(&self, data: &[&[u8]]) -> Vec<Vec<u8>> {
        assert_eq!(data.len(), self.k, "k data shards");
        let len = data.first().map_or(0, |d| d.len());
        let mut parity = vec![vec![0u8; len]; self.m];
        self.rs.encode_sep(data, &mut parity).expect("shard counts and lengths are checked above");
        parity
    }

    /// Fills every `None` of `shards` (`k + m` of one length, at least `k` present) from the others.
    pub(crate) fn reconstruct(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), String> {
        assert_eq!(shards.len(), self.k + self.m, "k + m shards");
        self.rs.reconstruct(shards).map_err(|e| format!("{e:?}"))
    }
}

/// `(k, m)` of an ec layout.
pub(crate) fn km(layout: &Layout) -> Option<(usize, usize)> {
    match layout.redundancy {
        DataRedundancy::Ec { k, m } => Some((usize::from(k), usize::from(m))),
        _ => None,
    }
}

/// Whether a failed chunk read means "use the other chunks": a server that is down or unreachable, or a chunk that
/// failed its checksum. Anything else (a refused capability, a protocol error) is the caller's problem.
pub(crate) fn is_chunk_loss(e: &ClientError) -> bool {
    match e {
        ClientError::Corrupt { .. } | ClientError::UnknownServer(_) => true,
        ClientError::Data { source, .. } | ClientError::DataAt { source, .. } => match source.remote() {
            Some(w) => matches!(w.code, ErrorCode::Corrupt | ErrorCode::Io | ErrorCode::Internal),
            None => true,
        },
        _ => false,
    }
}

/// Writes `data` at `offset` of `layout` (a plain layout, often one server's object seen as a file) through the
/// plain machinery: cut into transfer units, all sent at once; the first failure is returned.
pub(crate) async fn write_on(io: &Io, layout: &Layout, offset: u64, data: Bytes) -> Result<(), ClientError> {
    if data.is_empty() {
        return Ok(());
    }
    let (pieces, units) = plan(layout, offset, data.len() as u64, io.unit_max);
    write_units_on(io, layout, &pieces, units, &data, offset).await
}

/// Reads `len` bytes at `offset` of `layout` (plain) through the plain machinery; holes and bytes past an
/// object's end read as zeros.
pub(crate) async fn read_on(io: &Io, layout: &Layout, offset: u64, len: u64) -> Result<BytesMut, ClientError> {
    let mut buf = BytesMut::zeroed(len as usize);
    if len == 0 {
        return Ok(buf);
    }
    let (pieces, units) = plan(layout, offset, len, io.unit_max);
    let mut segs: Vec<Option<BytesMut>> = Vec::with_capacity(pieces.len());
    for p in &pieces {
        segs.push(Some(buf.split_to(p.len as usize)));
    }
    read_units_on(io, layout, units, &mut segs, None).await?;
    let mut segs = segs.into_iter().map(|s| s.expect("every segment came back"));
    let mut out = segs.next().expect("at least one segment");
    for s in segs {
        out.unsplit(s);
    }
    Ok(out)
}

/// Server `i`'s object of `layout`, seen as a plain one-server file: its file offsets are object offsets.
fn object_of(layout: &Layout, i: usize) -> Layout {
    Layout::plain(layout.stripe_unit, vec![layout.servers[i]])
}

/// Reads `[offset, offset + len)` of an ec file (the caller has cut `len` at the file's size).
pub(crate) async fn read(file: &File, offset: u64, len: u64) -> Result<BytesMut, ClientError> {
    read_via(file, &file.io(), offset, len).await
}

/// [`read`] with the capability of `io`.
async fn read_via(file: &File, io: &Io, offset: u64, len: u64) -> Result<BytesMut, ClientError> {
    let layout = &file.layout;
    match read_on(io, &layout.data_view(0), offset, len).await {
        Ok(b) => Ok(b),
        Err(e) if is_chunk_loss(&e) => {
            tracing::debug!(ino = file.attr.ino, offset, len, "degraded ec read: {e}");
            read_degraded(file, io, offset, len).await
        }
        Err(e) => Err(e),
    }
}

/// [`read`] from whole stripe rows, each decoded from any `k` of its chunks; chunks refused as corrupt are
/// rewritten from the decoded rows.
async fn read_degraded(file: &File, io: &Io, offset: u64, len: u64) -> Result<BytesMut, ClientError> {
    let layout = &file.layout;
    let (k, m) = km(layout).expect("an ec layout");
    let unit = u64::from(layout.stripe_unit);
    let row_bytes = unit * k as u64;
    let first_row = offset / row_bytes;
    let last_row = (offset + len - 1) / row_bytes;
    let batch_rows = (DEGRADED_BATCH_BYTES_MAX / (unit * (k + m) as u64)).max(1);
    let codec = Codec::new(k, m)?;
    let mut out = BytesMut::with_capacity(len as usize);
    let mut r = first_row;
    while r <= last_row {
        let rows = batch_rows.min(last_row - r + 1);
        let decoded = decode_rows(file, io, &codec, r, rows).await?;
        // `decoded` holds file bytes [r * row_bytes, (r + rows) * row_bytes); keep those inside the range.
        let base = r * row_bytes;
        let from = offset.max(base) - base;
        let to = (offset + len).min(base + rows * row_bytes) - base;
        out.extend_from_slice(&decoded[from as usize..to as usize]);
        r += rows;
    }
    Ok(out)
}

/// The file bytes of stripe rows `[first, first + rows)`, decoded from whichever `k` chunks of each row could be
/// read; servers that answered `Corrupt` are repaired (their chunks rewritten) before returning.
async fn decode_rows(file: &File, io: &Io, codec: &Codec, first: u64, rows: u64) -> Result<Vec<u8>, ClientError> {
    let layout = &file.layout;
    let (k, m) = (codec.k, codec.m);
    let unit = u64::from(layout.stripe_unit);
    let mut tasks = JoinSet::new();
    for i in 0..k + m {
        let obj = object_of(layout, i);
        let io = io.clone();
        tasks.spawn(async move { (i, read_on(&io, &obj, first * unit, rows * unit).await) });
    }
    let mut chunks: Vec<Option<BytesMut>> = vec![None; k + m];
    let mut corrupt = Vec::new();
    let mut causes = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (i, r) = r.map_err(|e| ClientError::Protocol(format!("read task failed: {e}")))?;
        match r {
            Ok(b) => chunks[i] = Some(b),
            Err(e) if is_chunk_loss(&e) => {
                if e.code() == Some(ErrorCode::Corrupt) {
                    corrupt.push(i);
                }
                causes.push(format!("chunk {i}: {e}"));
            }
            Err(e) => return Err(e),
        }
    }
    let available = chunks.iter().filter(|c| c.is_some()).count();
    if available < k {
        causes.sort();
        return Err(ClientError::Unavailable {
            ino: file.attr.ino,
            file_offset: first * unit * k as u64,
            available: available as u32,
            needed: k as u32,
            cause: causes.join("; "),
        });
    }
    let mut data = vec![0u8; (rows * unit * k as u64) as usize];
    let mut repaired: Vec<Vec<u8>> = vec![Vec::new(); corrupt.len()];
    let u = unit as usize;
    for row in 0..rows as usize {
        let mut shards: Vec<Option<Vec<u8>>> =
            chunks.iter().map(|c| c.as_ref().map(|b| b[row * u..(row + 1) * u].to_vec())).collect();
        codec.reconstruct(&mut shards).map_err(|e| ClientError::Unavailable {
            ino: file.attr.ino,
            file_offset: (first + row as u64) * unit * k as u64,
            available: available as u32,
            needed: k as u32,
            cause: format!("decoding failed: {e}"),
        })?;
        for (j, s) in shards.iter().take(k).enumerate() {
            let at = (row * k + j) * u;
            data[at..at + u].copy_from_slice(s.as_ref().expect("reconstructed"));
        }
        for (n, &i) in corrupt.iter().enumerate() {
            repaired[n].extend_from_slice(shards[i].as_ref().expect("reconstructed"));
        }
    }
    // Repair on read: the decoded chunks of every server that answered `Corrupt`, written whole (whole stripe
    // units, so whole checksum blocks: a repair never keeps a bad byte of a partly rewritten block).
    if !corrupt.is_empty() {
        match repair_io(file).await {
            Ok(io) => {
                for (n, &i) in corrupt.iter().enumerate() {
                    let obj = object_of(layout, i);
                    let bytes = Bytes::from(std::mem::take(&mut repaired[n]));
                    match write_on(&io, &obj, first * unit, bytes).await {
                        Ok(()) => tracing::info!(
                            ino = file.attr.ino,
                            chunk = i,
                            first_row = first,
                            rows,
                            "repaired a corrupt chunk"
                        ),
                        Err(e) => {
                            tracing::warn!(ino = file.attr.ino, chunk = i, "repairing a corrupt chunk failed: {e}")
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(ino = file.attr.ino, "no write capability to repair corrupt chunks: {e}"),
        }
    }
    Ok(data)
}

/// What a repair writes with: this handle's capability when it may write, else a fresh read-write one (a reader
/// repairs too, if the file's permissions let it write; otherwise the bad chunk stays for a later pass).
pub(crate) async fn repair_io(file: &File) -> Result<Io, ClientError> {
    if file.rights().covers(Rights::WRITE) {
        return Ok(file.io());
    }
    let opened = file.client.open_capability(file.attr.ino, Rights::READ_WRITE).await?;
    let caps = CapHolder::new(file.client.clone(), file.attr.ino, Rights::READ_WRITE, &opened, Instant::now());
    Ok(Io { caps: Arc::new(caps), ..file.io() })
}

/// What read–modify–write reads old rows with: this handle's capability when it may read, else a fresh
/// read-write one (a file opened write-only still needs its old rows; a writer without read permission on the
/// file cannot write partial rows of an ec file).
async fn rmw_io(file: &File) -> Result<Io, ClientError> {
    if file.rights().covers(Rights::READ) {
        return Ok(file.io());
    }
    let opened = file.client.open_capability(file.attr.ino, Rights::READ_WRITE).await?;
    let caps = CapHolder::new(file.client.clone(), file.attr.ino, Rights::READ_WRITE, &opened, Instant::now());
    Ok(Io { caps: Arc::new(caps), ..file.io() })
}

/// Writes `data` at `offset` of an ec file: read–modify–write of the rows it only partly covers, parity
/// computed, every chunk of the rows written to every server of the layout at once.
pub(crate) async fn write(file: &File, offset: u64, data: Bytes) -> Result<(), ClientError> {
    let layout = &file.layout;
    let (k, m) = km(layout).expect("an ec layout");
    let unit = u64::from(layout.stripe_unit);
    let row_bytes = unit * k as u64;
    let len = data.len() as u64;
    let end = offset + len;
    let old_size = file.size();
    let new_end = old_size.max(end);
    // Rows in batches, so a large write holds a bounded amount of memory (at least one row).
    let batch_rows = (DEGRADED_BATCH_BYTES_MAX / (unit * (k + m) as u64)).max(1);
    let codec = Codec::new(k, m)?;
    let mut rmw: Option<Io> = None;
    let mut r = offset / row_bytes;
    let last_row = (end - 1) / row_bytes;
    while r <= last_row {
        let rows = batch_rows.min(last_row - r + 1);
        let base = r * row_bytes;
        let top = base + rows * row_bytes;
        let mut buf = vec![0u8; (rows * row_bytes) as usize];
        // The old bytes of the rows this write covers only partly (first and last), up to the old size.
        let from = offset.max(base);
        let to = end.min(top);
        for (a, b) in [(base, from), (to, top)] {
            let b = b.min(old_size);
            if a < b {
                // Whole rows keep `read` healthy-first; only bytes before the old size exist.
                let row_a = a - (a - base) % row_bytes;
                if rmw.is_none() {
                    rmw = Some(rmw_io(file).await?);
                }
                let io = rmw.as_ref().expect("set above");
                let old = read_via(file, io, row_a, b - row_a).await?;
                buf[(row_a - base) as usize..(b - base) as usize].copy_from_slice(&old);
            }
        }
        buf[(from - base) as usize..(to - base) as usize]
            .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
        // Per server, the bytes of its chunks for these rows, contiguous in its object from `r * unit`.
        let mut objects: Vec<Vec<u8>> = vec![Vec::with_capacity((rows * unit) as usize); k + m];
        let u = unit as usize;
        for row in 0..rows {
            // Bytes of this row that lie before the new end: the row's stored length (zeros after are not stored).
            let row_start = base + row * row_bytes;
            let row_len = (new_end.saturating_sub(row_start)).min(row_bytes) as usize;
            let rb = &buf[(row * row_bytes) as usize..((row + 1) * row_bytes) as usize];
            let shards: Vec<&[u8]> = (0..k).map(|j| &rb[j * u..(j + 1) * u]).collect();
            let parity = codec.encode(&shards);
            for j in 0..k {
                let keep = row_len.saturating_sub(j * u).min(u);
                objects[j].extend_from_slice(&shards[j][..keep]);
            }
            for (p, par) in parity.iter().enumerate() {
                objects[k + p].extend_from_slice(&par[..row_len.min(u)]);
            }
        }
        let mut tasks = JoinSet::new();
        for (i, bytes) in objects.into_iter().enumerate() {
            let obj = object_of(layout, i);
            let io = file.io();
            let at = r * unit;
            tasks.spawn(async move { (i, write_on(&io, &obj, at, Bytes::from(bytes)).await) });
        }
        let mut first_err = None;
        while let Some(res) = tasks.join_next().await {
            let (i, res) = res.map_err(|e| ClientError::Protocol(format!("write task failed: {e}")))?;
            if let Err(e) = res {
                first_err.get_or_insert(ClientError::DegradedWrite {
                    ino: file.attr.ino,
                    file_offset: base,
                    server: layout.servers[i],
                    cause: e.to_string(),
                });
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        // Rows written so far are visible to this handle's next RMW (it reads up to its size).
        file.size.fetch_max(to, Ordering::SeqCst);
        r += rows;
    }
    Ok(())
}

/// Sets an ec file's objects to size `size`: every object cut to its §16 length, then the last, partial row
/// rewritten, so its parity covers the zeros that now follow `size`.
pub(crate) async fn truncate(file: &File, size: u64) -> Result<(), ClientError> {
    let layout = &file.layout;
    let (k, _) = km(layout).expect("an ec layout");
    let row_bytes = u64::from(layout.stripe_unit) * k as u64;
    let old = file.size();
    // Growing: the new bytes are zeros, and so are the chunks and parity past the old end: nothing to store.
    if size >= old {
        return Ok(());
    }
    let row_start = size - size % row_bytes;
    let tail = if size > row_start {
        Some(read_via(file, &rmw_io(file).await?, row_start, size - row_start).await?)
    } else {
        None
    };
    file.client.truncate_objects(file.attr.ino, layout, size, &file.caps).await?;
    file.size.store(size, Ordering::SeqCst);
    if let Some(tail) = tail {
        write(file, row_start, tail.freeze()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded xorshift, so every run checks the same bytes.
    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Every choice of which chunks survive, for every count of survivors from `k` to `k + m`.
    fn survivor_sets(n: usize) -> impl Iterator<Item = Vec<bool>> {
        (0u32..1 << n).map(move |mask| (0..n).map(|i| mask & (1 << i) != 0).collect())
    }

    fn decodes_from_every_k_survivors(k: usize, m: usize) {
        let codec = Codec::new(k, m).unwrap();
        for (seed, len) in [(1u64, 4096usize), (2, 1), (3, 777)] {
            let data: Vec<Vec<u8>> = (0..k).map(|j| bytes(seed * 100 + j as u64, len)).collect();
            let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            let parity = codec.encode(&refs);
            let all: Vec<Vec<u8>> = data.iter().chain(parity.iter()).cloned().collect();
            let mut tried = 0;
            for alive in survivor_sets(k + m) {
                let n_alive = alive.iter().filter(|a| **a).count();
                let mut shards: Vec<Option<Vec<u8>>> =
                    all.iter().zip(&alive).map(|(s, a)| a.then(|| s.clone())).collect();
                let r = codec.reconstruct(&mut shards);
                if n_alive < k {
                    assert!(r.is_err(), "{k}+{m}: {n_alive} survivors cannot decode");
                    continue;
                }
                tried += 1;
                r.unwrap();
                let got: Vec<Vec<u8>> = shards.into_iter().map(|s| s.unwrap()).collect();
                assert_eq!(got, all, "{k}+{m}, survivors {alive:?}");
            }
            // Every subset of at least k of k+m chunks.
            let expect: usize = (k..=k + m).map(|s| binom(k + m, s)).sum();
            assert_eq!(tried, expect);
        }
    }

    fn binom(n: usize, r: usize) -> usize {
        (0..r).fold(1, |acc, i| acc * (n - i) / (i + 1))
    }

    #[test]
    fn ec_4_2_decodes_from_every_set_of_k_survivors() {
        decodes_from_every_k_survivors(4, 2);
    }

    #[test]
    fn ec_2_1_decodes_from_every_set_of_k_survivors() {
        decodes_from_every_k_survivors(2, 1);
    }

    /// Parity is column-wise: zeros in every data chunk past some length give zeros in parity there, which is why
    /// a short last row stores neither its padding nor its parity's (§16).
    #[test]
    fn parity_of_zero_padding_is_zero() {
        let codec = Codec::new(4, 2).unwrap();
        let mut data: Vec<Vec<u8>> = (0..4).map(|j| bytes(9 + j, 4096)).collect();
        for d in &mut data[1..] {
            d.fill(0);
        }
        data[0][1000..].fill(0);
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        for p in codec.encode(&refs) {
            assert!(p[1000..].iter().all(|&b| b == 0));
            assert!(p[..1000].iter().any(|&b| b != 0));
        }
    }

    #[test]
    fn chunk_loss_is_told_apart_from_other_failures() {
        let corrupt = ClientError::Corrupt { ino: 1, file_offset: 0, server: 2, object_offset: 0 };
        assert!(is_chunk_loss(&corrupt));
        assert!(is_chunk_loss(&ClientError::UnknownServer(3)));
        assert!(!is_chunk_loss(&ClientError::Access("no".into())));
    }
}
