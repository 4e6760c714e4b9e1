//! Striped, parallel I/O over one layout's objects, below every redundancy: a read or write of
//! `[offset, offset + len)` is cut by the layout into pieces (one per stripe unit touched); pieces that are
//! adjacent in the same server's object are merged into *transfer units* of at most `transfer_unit_bytes`; every
//! unit is one request, and all units go out at once (each server's session slots bound how many are in flight to
//! it). The caller's buffer is split into owned segments (`BytesMut::split_to`, `Bytes::slice`: no copy), each
//! unit's reply payload lands directly in its segments, and the segments are joined back (`unsplit`, O(1) because
//! they are adjacent) before the buffer is returned.
//!
//! Every request carries the file's capability (`capability.rs`), renewed before it runs out; a request refused
//! as expired is renewed and sent once more. Plain files use this directly (`plain.rs`); redundant layouts use it
//! over one server's object seen as a file ([`Layout::data_view`], [`read_on`], [`write_on`]).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::task::JoinSet;
use weft_proto::msg::{FillHint, WriteFence};
use weft_proto::{ErrorCode, Layout};
use weft_rpc::RpcError;

use crate::capability::{CapHolder, is_expired};
use crate::{Client, ClientError, transfer};

/// What a spawned transfer of a file needs (redundant layouts, `ec.rs` and `mirror.rs`).
#[derive(Clone)]
pub(crate) struct Io {
    pub client: Client,
    pub caps: Arc<CapHolder>,
    pub ino: u64,
    pub unit_max: u64,
    /// What writes carry against a mirror copy's write fence (docs/format.md §32); `NONE` for plain and ec objects.
    pub fence: WriteFence,
}

/// One request's worth of a transfer: a contiguous object range on one server, and the file ranges it maps to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Unit {
    pub server_index: u32,
    pub object_offset: u64,
    pub len: u64,
    /// Indices of the pieces (in file order) that make up this unit, in object order.
    pub pieces: Vec<usize>,
}

/// Cuts `[offset, offset+len)` into pieces no longer than `unit_max` and groups them into transfer units.
pub(crate) fn plan(layout: &Layout, offset: u64, len: u64, unit_max: u64) -> (Vec<weft_proto::Piece>, Vec<Unit>) {
    assert!(unit_max > 0);
    let mut pieces = Vec::new();
    for p in layout.pieces(offset, len) {
        let mut done = 0;
        while done < p.len {
            let n = (p.len - done).min(unit_max);
            pieces.push(weft_proto::Piece {
                server_index: p.server_index,
                object_offset: p.object_offset + done,
                file_offset: p.file_offset + done,
                len: n,
            });
            done += n;
        }
    }
    let units = group(&pieces, layout.stripe_count, unit_max);
    (pieces, units)
}

/// Groups `pieces` (in file order) into transfer units: pieces adjacent in one server's object merge while the unit
/// stays within `unit_max`.
pub(crate) fn group(pieces: &[weft_proto::Piece], stripe_count: u32, unit_max: u64) -> Vec<Unit> {
    let mut units: Vec<Unit> = Vec::new();
    // The unit each server is currently filling.
    let mut open: Vec<Option<usize>> = vec![None; stripe_count as usize];
    for (i, p) in pieces.iter().enumerate() {
        let slot = &mut open[p.server_index as usize];
        if let Some(u) = slot.map(|u| &mut units[u])
            && u.object_offset + u.len == p.object_offset
            && u.len + p.len <= unit_max
        {
            u.len += p.len;
            u.pieces.push(i);
            continue;
        }
        units.push(Unit { server_index: p.server_index, object_offset: p.object_offset, len: p.len, pieces: vec![i] });
        *slot = Some(units.len() - 1);
    }
    units
}

/// Joins segments cut from one buffer, in order, back into it.
pub(crate) fn join(segs: Vec<Option<BytesMut>>) -> BytesMut {
    let mut segs = segs.into_iter().map(|s| s.expect("every segment came back"));
    let mut out = segs.next().expect("at least one segment");
    for s in segs {
        // Adjacent halves of one allocation: unsplit is O(1), no copy.
        out.unsplit(s);
    }
    out
}

/// Sends `units` (planned by [`plan`] over `pieces` of `data`, which starts at file offset `offset`) to their
/// servers, every unit at once; the first failure is returned.
pub(crate) async fn write_units_on(
    io: &Io,
    layout: &Layout,
    pieces: &[weft_proto::Piece],
    units: Vec<Unit>,
    data: &Bytes,
    offset: u64,
) -> Result<(), ClientError> {
    let mut tasks = JoinSet::new();
    for u in units {
        let segs: Vec<Bytes> = u.pieces.iter().map(|&i| seg_of(data, &pieces[i], offset)).collect();
        let (client, caps, ino, layout, fence) = (io.client.clone(), io.caps.clone(), io.ino, layout.clone(), io.fence);
        tasks.spawn(async move { write_unit(&client, &caps, &layout, (ino, fence), &u, segs).await });
    }
    let mut first_err = None;
    while let Some(r) = tasks.join_next().await {
        let r = r.map_err(|e| ClientError::Protocol(format!("write task failed: {e}"))).and_then(|r| r);
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Reads `units` of `layout` into `segs` (one segment per piece the units name), every unit at once; a single
/// unit from the caller's task. With `fill` (a data version) each request asks its server to fill the bank.
pub(crate) async fn read_units_on(
    io: &Io,
    layout: &Layout,
    units: Vec<Unit>,
    segs: &mut [Option<BytesMut>],
    fill: Option<u64>,
) -> Result<(), ClientError> {
    let hint = fill.map(|data_version| FillHint { data_version });
    if let [u] = &units[..] {
        let dest: Vec<BytesMut> = u.pieces.iter().map(|&i| segs[i].take().expect("each piece in one unit")).collect();
        let dest = read_unit(&io.client, &io.caps, layout, io.ino, u, dest, hint).await?;
        for (&i, d) in u.pieces.iter().zip(dest) {
            segs[i] = Some(d);
        }
        return Ok(());
    }
    let mut tasks = JoinSet::new();
    for u in units {
        let dest: Vec<BytesMut> = u.pieces.iter().map(|&i| segs[i].take().expect("each piece in one unit")).collect();
        let client = io.client.clone();
        let ino = io.ino;
        let layout = layout.clone();
        let caps = io.caps.clone();
        tasks.spawn(async move {
            let dest = read_unit(&client, &caps, &layout, ino, &u, dest, hint).await?;
            Ok((u.pieces, dest))
        });
    }
    let mut first_err = None;
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok((idx, dest))) => {
                for (i, d) in idx.into_iter().zip(dest) {
                    segs[i] = Some(d);
                }
            }
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(ClientError::Protocol(format!("read task failed: {e}")));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The part of `data` (which starts at file offset `offset`) that piece `p` covers.
pub(crate) fn seg_of(data: &Bytes, p: &weft_proto::Piece, offset: u64) -> Bytes {
    let start = (p.file_offset - offset) as usize;
    data.slice(start..start + p.len as usize)
}

/// Sends one write unit and checks the count the server answers; an expired capability is renewed and the unit
/// sent once more (a refused request wrote nothing).
pub(crate) async fn write_unit(
    client: &Client,
    caps: &CapHolder,
    layout: &Layout,
    (ino, fence): (u64, WriteFence),
    u: &Unit,
    segs: Vec<Bytes>,
) -> Result<(), ClientError> {
    let server = layout.servers[u.server_index as usize];
    let ds = client.data_server(server).await.map_err(|e| at_offset(client, layout, ino, u, e))?;
    let classes = client.tuning().size_classes();
    let mut cap = caps.get().await?;
    let mut renewed = false;
    loop {
        match transfer::write_object(&ds, classes, (ino, fence), u.object_offset, segs.clone(), cap.clone()).await {
            Ok(n) if u64::from(n) == u.len => return Ok(()),
            Ok(n) => return Err(ClientError::Protocol(format!("write answered {n} bytes, expected {}", u.len))),
            Err(source) if !renewed && is_expired(&source) => {
                cap = caps.renew_from(&cap).await?;
                renewed = true;
            }
            Err(source) => return Err(at_offset(client, layout, ino, u, ClientError::Data { server, source })),
        }
    }
}

/// The file offset of object offset `object_offset` in the object at `server_index` of `layout`.
fn file_offset_of(layout: &Layout, server_index: u32, object_offset: u64) -> u64 {
    let unit = u64::from(layout.stripe_unit);
    let count = u64::from(layout.stripe_count);
    let stripe = (object_offset / unit) * count + u64::from(server_index);
    stripe * unit + object_offset % unit
}

/// Names the file, the unit's first file offset and the server's address in a data server's failure (a dead
/// server, a full disk); other errors pass unchanged.
fn at_offset(client: &Client, layout: &Layout, ino: u64, u: &Unit, e: ClientError) -> ClientError {
    match e {
        ClientError::Data { server, source } => ClientError::DataAt {
            ino,
            file_offset: file_offset_of(layout, u.server_index, u.object_offset),
            server,
            addr: client.server_addr(server).unwrap_or_else(|| "address unknown".into()),
            source,
        },
        other => other,
    }
}

/// Reads one unit into `dest`; an expired capability is renewed and the unit read once more, into fresh buffers
/// of the same lengths (the refused request consumed the first ones and read nothing).
pub(crate) async fn read_unit(
    client: &Client,
    caps: &CapHolder,
    layout: &Layout,
    ino: u64,
    u: &Unit,
    dest: Vec<BytesMut>,
    fill: Option<FillHint>,
) -> Result<Vec<BytesMut>, ClientError> {
    let server = layout.servers[u.server_index as usize];
    let ds = client.data_server(server).await.map_err(|e| at_offset(client, layout, ino, u, e))?;
    let classes = client.tuning().size_classes();
    let lens: Vec<usize> = dest.iter().map(|d| d.len()).collect();
    let cap = caps.get().await?;
    match transfer::read_object(&ds, classes, ino, u.object_offset, dest, cap.clone(), fill).await {
        Ok(dest) => Ok(dest),
        Err(source) if is_expired(&source) => {
            let cap = caps.renew_from(&cap).await?;
            let dest = lens.iter().map(|&n| BytesMut::zeroed(n)).collect();
            transfer::read_object(&ds, classes, ino, u.object_offset, dest, cap, fill)
                .await
                .map_err(|source| data_error(client, layout, ino, u, server, source))
        }
        Err(source) => Err(data_error(client, layout, ino, u, server, source)),
    }
}

/// Names a corrupt block by its file offset; other failures by the file offset of the unit and their server.
fn data_error(client: &Client, layout: &Layout, ino: u64, u: &Unit, server: u32, source: RpcError) -> ClientError {
    if let RpcError::Remote(w) = &source
        && w.code == ErrorCode::Corrupt
        && let Some(object_offset) = w.offset
    {
        let file_offset = file_offset_of(layout, u.server_index, object_offset);
        return ClientError::Corrupt { ino, file_offset, server, object_offset };
    }
    at_offset(client, layout, ino, u, ClientError::Data { server, source })
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
    read_on_into(io, layout, offset, BytesMut::zeroed(len as usize)).await
}

/// [`read_on`] into `buf` (its length is the amount read): the replies land in it, no copy. On an error the
/// buffer is gone with it.
pub(crate) async fn read_on_into(
    io: &Io,
    layout: &Layout,
    offset: u64,
    mut buf: BytesMut,
) -> Result<BytesMut, ClientError> {
    let len = buf.len() as u64;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lay(unit: u32, count: u32) -> Layout {
        Layout {
            stripe_unit: unit,
            stripe_count: count,
            servers: (0..count).collect(),
            redundancy: weft_proto::DataRedundancy::Plain,
            generation: 0,
        }
    }

    #[test]
    fn plan_merges_adjacent_object_ranges() {
        // 4 servers, 4 KiB units, 64 KiB read: each server gets 4 stripes adjacent in its object.
        let (pieces, units) = plan(&lay(4096, 4), 0, 65536, 1 << 20);
        assert_eq!(pieces.len(), 16);
        assert_eq!(units.len(), 4);
        for u in &units {
            assert_eq!(u.len, 16384);
            assert_eq!(u.object_offset, 0);
            assert_eq!(u.pieces.len(), 4);
        }
    }

    #[test]
    fn plan_respects_the_transfer_unit() {
        let (pieces, units) = plan(&lay(1 << 20, 1), 100, 3 << 20, 1 << 20);
        assert!(units.iter().all(|u| u.len <= 1 << 20));
        assert_eq!(units.iter().map(|u| u.len).sum::<u64>(), 3 << 20);
        assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), 3 << 20);
        // File order of pieces is preserved across units.
        assert!(pieces.windows(2).all(|w| w[0].file_offset + w[0].len == w[1].file_offset));
    }
}
