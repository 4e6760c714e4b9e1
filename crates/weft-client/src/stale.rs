//! Stale chunks of redundant files (docs/format.md §18): what a degraded write records, what a read must not use,
//! and the catch-up of one slot's rows that the healer (`weft-heal`) runs.
//!
//! - **Degraded writes.** When at most `m` servers of an `ec k+m` layout (at most `n − 1` copies of a `mirror n`)
//!   fail a write, the write goes on: the rows each failed server missed are recorded at the MDS (`MarkStale`)
//!   *before* the write is acknowledged ([`record_missed`]); a failed `MarkStale` fails the write. More failures
//!   than the layout tolerates fail the write, naming the file and offset.
//! - **Reads never use a stale chunk.** A handle loads its file's stale ranges from the MDS on its first read of a
//!   redundant file (one `ListStale` for that inode; healthy files have none) and adds the marks it makes itself.
//!   A chunk inside a stale range is treated as missing (ec: decoded from the others; mirror: another copy).
//!   Why at first read and not on every read: a write's marks are made before it is acknowledged and before its
//!   size is committed, so any handle opened after the writer's commit (close-to-open) sees them.
//! - **Catch-up** (`catch_up.rs`): the healer rebuilds a slot's rows from the other chunks.
//!
//! Rows: `ec k+m` row `r` is object bytes `[r·u, (r+1)·u)` of every server (a stripe row); `mirror n` row `r` is
//! file (and object) bytes `[r·u, (r+1)·u)`.

use weft_proto::msg::{ListStaleReq, MarkStaleReq, StaleRange};
use weft_proto::{ErrorCode, Request, Response};

use crate::ClientError;
use crate::handle::File;

/// The slots of `file` with a stale row in `[first, end)`; loads the file's stale ranges on first use.
pub(crate) async fn stale_slots(file: &File, first: u64, end: u64) -> Result<Vec<usize>, ClientError> {
    let loaded = file.stale.ranges.lock().expect("stale view").is_some();
    if !loaded {
        let entries = file.client.list_stale(Some(file.attr.ino), None, 0).await?.entries;
        let v = entries.into_iter().flat_map(|e| e.ranges.into_iter().map(move |r| (e.slot, r))).collect();
        let mut g = file.stale.ranges.lock().expect("stale view");
        if g.is_none() {
            *g = Some(v);
        }
    }
    let g = file.stale.ranges.lock().expect("stale view");
    let mut slots: Vec<usize> = g
        .as_ref()
        .map(|v| v.iter().filter(|(_, r)| r.start < end && first < r.end).map(|(s, _)| *s as usize).collect())
        .unwrap_or_default();
    slots.sort_unstable();
    slots.dedup();
    Ok(slots)
}

/// Loads `file`'s stale ranges from the MDS again, keeping the marks this handle made meanwhile: the healer clears
/// the ranges it rebuilt, and a handle that loaded them earlier would go on leaving those chunks out, so that a
/// second server lost later looks like more failures than the layout tolerates (the model test, tests/model.rs,
/// found writes and reads failing so). Called only when too few chunks or copies are usable.
pub(crate) async fn reload(file: &File) -> Result<(), ClientError> {
    // Marks are recorded at the MDS before they are added here, so those added before the list was asked for are
    // in it (or healed), and those added since are kept from the view.
    let before = file.stale.ranges.lock().expect("stale view").as_ref().map_or(0, Vec::len);
    let entries = file.client.list_stale(Some(file.attr.ino), None, 0).await?.entries;
    let mut fresh: Vec<(u32, StaleRange)> =
        entries.into_iter().flat_map(|e| e.ranges.into_iter().map(move |r| (e.slot, r))).collect();
    let mut g = file.stale.ranges.lock().expect("stale view");
    if let Some(old) = g.as_ref() {
        fresh.extend(old.iter().skip(before).cloned());
    }
    *g = Some(fresh);
    Ok(())
}

/// The slots of `skip` (stale as this handle knew) that the MDS no longer lists stale in rows `[first, end)`,
/// removed from `skip`: chunks or copies healed since, usable again.
pub(crate) async fn healed_since(
    file: &File,
    skip: &mut Vec<usize>,
    first: u64,
    end: u64,
) -> Result<Vec<usize>, ClientError> {
    if skip.is_empty() {
        return Ok(Vec::new());
    }
    reload(file).await?;
    let still = stale_slots(file, first, end).await?;
    let healed: Vec<usize> = skip.iter().copied().filter(|i| !still.contains(i)).collect();
    skip.retain(|i| still.contains(i));
    Ok(healed)
}

/// Before a write's failures are recorded as missed: if a server refused it as fenced (`StaleLayout`: not up at the
/// MDS, e.g. it came back after its slot moved to a spare, docs/format.md §19) and the MDS now holds a newer layout,
/// the write must go to the new layout's servers instead of being acknowledged degraded: the refetched layout is
/// kept and `StaleLayout` returned, which `File::write_at` answers by trying once more. With no newer layout (the
/// fenced server is still the layout's, e.g. its lease lapsed), the failure is an ordinary missed write.
/// `CapabilityRefused` asks the same question: once the returning server is drained (a spare, serving again), the
/// inodes whose objects the drain removed are refused there (weft-data `capabilities.rs`).
pub(crate) async fn refetch_if_fenced(file: &File, failed: &[(usize, ClientError)]) -> Result<(), ClientError> {
    let fenced = |e: &ClientError| matches!(e.code(), Some(ErrorCode::StaleLayout | ErrorCode::CapabilityRefused));
    if !failed.iter().any(|(_, e)| fenced(e)) {
        return Ok(());
    }
    let held = file.layout().generation;
    if file.refresh_layout().await.unwrap_or(false) {
        return Err(ClientError::StaleLayout { ino: file.attr.ino, held, current: file.layout().generation });
    }
    Ok(())
}

/// The outcome of writing one batch to every server of a redundant layout: `(slot, error)` of each failure.
/// At most `tolerated` failures: their missed rows `[first, end)` are recorded at the MDS and the write goes on
/// (`Ok`); more, or a failed record: the write fails (nothing is acknowledged).
pub(crate) async fn record_missed(
    file: &File,
    failed: Vec<(usize, ClientError)>,
    file_offset: u64,
    first: u64,
    end: u64,
) -> Result<(), ClientError> {
    if failed.is_empty() {
        return Ok(());
    }
    let layout = &file.layout();
    let tolerated = layout.redundancy.tolerates() as usize;
    if failed.len() > tolerated || first >= end {
        let (slot, e) = failed.into_iter().next().expect("one failure at least");
        return Err(ClientError::DegradedWrite {
            ino: file.attr.ino,
            file_offset,
            server: layout.servers[slot],
            cause: format!("{e} (more servers of the layout failed than its {tolerated} tolerated)"),
        });
    }
    // Only a layout's own slots are marked, over rows a write or cut touched (§18).
    weft_rpc::invariant!(failed.iter().all(|(slot, _)| *slot < layout.servers.len()) && first < end);
    for (slot, e) in failed {
        let server = layout.servers[slot];
        tracing::warn!(ino = file.attr.ino, slot, server, first_row = first, end_row = end, "degraded write: {e}");
        let req = MarkStaleReq { ino: file.attr.ino, slot: slot as u32, start: first, end };
        let r = file.client.mark_stale(req).await.map_err(|me| ClientError::DegradedWrite {
            ino: file.attr.ino,
            file_offset,
            server,
            cause: format!("{e}; and recording what it missed failed: {me}"),
        })?;
        file.stale.add(slot as u32, r);
    }
    Ok(())
}

impl crate::Client {
    /// `MarkStale` (docs/format.md §18): the range now covering the mark.
    pub async fn mark_stale(&self, req: MarkStaleReq) -> Result<StaleRange, ClientError> {
        match self.meta(Request::MarkStale(req)).await? {
            Response::MarkStale(r) => Ok(r),
            other => Err(ClientError::Protocol(format!("unexpected response {:?}", other.op()))),
        }
    }

    /// `ListStale`: one page of stale entries (one file's with `ino`) and the healer's progress.
    pub async fn list_stale(
        &self,
        ino: Option<u64>,
        after: Option<(u64, u32)>,
        limit: u32,
    ) -> Result<weft_proto::msg::ListStaleResp, ClientError> {
        match self.meta(Request::ListStale(ListStaleReq { ino, after, limit })).await? {
            Response::ListStale(r) => Ok(r),
            other => Err(ClientError::Protocol(format!("unexpected response {:?}", other.op()))),
        }
    }

    /// `ClearStale` (cluster key only): `false` when the range was marked again since it was listed.
    pub async fn clear_stale(&self, req: weft_proto::msg::ClearStaleReq) -> Result<bool, ClientError> {
        match self.meta(Request::ClearStale(req)).await? {
            Response::ClearStale(r) => Ok(r),
            other => Err(ClientError::Protocol(format!("unexpected response {:?}", other.op()))),
        }
    }

    /// `HealNow`: wakes the healer beside the MDS.
    pub async fn heal_now(&self) -> Result<(), ClientError> {
        match self.meta(Request::HealNow(())).await? {
            Response::HealNow(()) => Ok(()),
            other => Err(ClientError::Protocol(format!("unexpected response {:?}", other.op()))),
        }
    }
}

/// Sets a mirrored or ec file's objects to the lengths of a file of `size` bytes (from `old`), with the servers it
/// can reach: as a write, up to the layout's tolerance a copy or chunk it cannot reach is recorded stale over the
/// rows a cut changes (`[row of size, row of old)`), so no read takes the bytes it still holds past the cut, and a
/// file grown later never shows them; a grow changes no byte, so a server missed there is nothing to record.
/// Before, a truncate with one server of the layout unreachable failed after cutting the other copies or chunks,
/// which then differed with nothing recorded (the model test, tests/model.rs, found it).
/// A mirror file's copies are cut at their write fences, and all cut again when one refuses (`mirror_fence.rs`).
pub(crate) async fn truncate_tolerant(file: &File, size: u64, old: u64) -> Result<(), ClientError> {
    let layout = file.layout();
    let failed = if matches!(layout.redundancy, weft_proto::DataRedundancy::Mirror { .. }) {
        crate::mirror_fence::until_unfenced(file, size, || {
            let fences: Vec<_> = (0..layout.servers.len()).map(|c| crate::mirror_fence::fence_of(file, c)).collect();
            let layout = layout.clone();
            async move { file.client.truncate_each(file.attr.ino, &layout, size, &file.caps, &fences).await }
        })
        .await?
    } else {
        file.client.truncate_each(file.attr.ino, &layout, size, &file.caps, &[]).await?
    };
    if failed.is_empty() {
        return Ok(());
    }
    refetch_if_fenced(file, &failed).await?;
    let (first, end) = crate::handle::rows_of(&layout, size, old.saturating_sub(size));
    if first >= end && failed.len() <= layout.redundancy.tolerates() as usize {
        for (slot, e) in &failed {
            tracing::warn!(ino = file.attr.ino, slot, "degraded truncate (a grow: nothing to record): {e}");
        }
        return Ok(());
    }
    record_missed(file, failed, size, first, end).await
}
