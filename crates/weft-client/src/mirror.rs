//! The data path of mirrored files (`mirror n`, docs/format.md §16): every byte at the same object offset on each
//! of the layout's `n` servers, each copy a plain object.
//!
//! Writes go to every copy at once; copies that cannot be written (at most `n − 1`) have the rows they missed
//! recorded stale at the MDS before the write is acknowledged, and reads skip a copy stale over their range
//! (`stale.rs`); no copy written fails the write ([`ClientError::DegradedWrite`]). Reads ask
//! one copy and fall over to the next when a server does not answer or a block fails its checksum; a copy that
//! answered `Corrupt` is rewritten from the copy that answered (repair on read), over whole checksum blocks.

use bytes::{Bytes, BytesMut};
use tokio::task::JoinSet;
use weft_proto::{DataRedundancy, ErrorCode, Layout};

use crate::ClientError;
use crate::ec_codec::is_chunk_loss;
use crate::handle::File;
use crate::handle::repair_io;
use crate::mirror_fence::{fence_of, is_fenced, until_unfenced};
use crate::striped::{Io, read_on, write_on};

/// Checksum block size of the data servers' sidecars (§5): repairs rewrite whole blocks.
const BLOCK_BYTES: u64 = 4096;

fn copies(layout: &Layout) -> usize {
    match layout.redundancy {
        DataRedundancy::Mirror { n } => usize::from(n),
        _ => 1,
    }
}

/// Reads `[offset, offset + len)` (cut at the file's size by the caller) from the first copy that answers; if none
/// does and some were left out as stale, once more with the stale ranges loaded again (copies healed since).
pub(crate) async fn read(file: &File, offset: u64, len: u64) -> Result<BytesMut, ClientError> {
    match read_copies(file, offset, len).await {
        Err(e @ ClientError::Unavailable { .. }) => {
            let (first, end) = crate::handle::rows_of(&file.layout(), offset, len);
            let mut stale = crate::stale::stale_slots(file, first, end).await?;
            if crate::stale::healed_since(file, &mut stale, first, end).await?.is_empty() {
                return Err(e);
            }
            read_copies(file, offset, len).await
        }
        r => r,
    }
}

async fn read_copies(file: &File, offset: u64, len: u64) -> Result<BytesMut, ClientError> {
    let layout = &file.layout();
    let n = copies(layout);
    // Copies are tried starting at one picked by inode, so that readers of many files spread over the servers.
    let start = (file.attr.ino % n as u64) as usize;
    // Whole checksum blocks, so a copy found corrupt can be rewritten without keeping a bad byte.
    let a = offset - offset % BLOCK_BYTES;
    let b = (offset + len).div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
    let mut corrupt = Vec::new();
    let (first, end) = crate::handle::rows_of(layout, offset, len);
    let stale = crate::stale::stale_slots(file, first, end).await?;
    let mut causes: Vec<String> = stale.iter().map(|c| format!("copy {c}: stale")).collect();
    // Copies whose server did not answer moments ago go last: tried only if every other copy fails.
    let mut order: Vec<usize> = (0..n).map(|i| (start + i) % n).filter(|c| !stale.contains(c)).collect();
    order.sort_by_key(|&c| file.client.recently_unreachable(layout.servers[c]));
    for c in order {
        match read_on(&file.io(), &layout.data_view(c), a, b - a).await {
            Ok(mut got) => {
                if !corrupt.is_empty() {
                    repair(file, &corrupt, c, a, b).await;
                }
                let _ = got.split_to((offset - a) as usize);
                got.truncate(len as usize);
                return Ok(got);
            }
            Err(e) if is_chunk_loss(&e) => {
                file.client.note_unreachable(&e);
                if e.code() == Some(ErrorCode::Corrupt) {
                    corrupt.push(c);
                }
                causes.push(format!("copy {c}: {e}"));
            }
            Err(e) => return Err(e),
        }
    }
    Err(ClientError::Unavailable {
        ino: file.attr.ino,
        file_offset: offset,
        available: 0,
        needed: 1,
        cause: causes.join("; "),
    })
}

/// Rewrites the block-aligned range `[a, b)` of the copies in `bad` from copy `good` (which just answered), each
/// under the copies' write fences (`mirror_fence::copy_range`: `good` is read again once fenced).
async fn repair(file: &File, bad: &[usize], good: usize, a: u64, b: u64) {
    let io = match repair_io(file).await {
        Ok(io) => io,
        Err(e) => {
            tracing::warn!(ino = file.attr.ino, "no write capability to repair a mirror copy: {e}");
            return;
        }
    };
    // Cut at the file's size: bytes past it are not the copy's to store.
    let end = b.min(file.size().max(a));
    if end <= a {
        return;
    }
    for &c in bad {
        match crate::mirror_fence::copy_range(file, &io, (c, &[good]), a, end).await {
            Ok(()) => tracing::info!(ino = file.attr.ino, copy = c, "repaired a corrupt mirror copy"),
            Err(e) => tracing::warn!(ino = file.attr.ino, copy = c, "repairing a mirror copy failed: {e}"),
        }
    }
}

/// Writes `data` at `offset` to every copy at once. A copy whose server did not answer moments ago is not tried
/// while another copy is ([`crate::Client::presumed_down`], as truncates and fsyncs): it missed the write, as after a
/// failed attempt, so a write stream pays a dead server's connect retries once per hold, not once per write. A copy
/// refusing the write for its fence has every copy written again (`mirror_fence::until_unfenced`).
pub(crate) async fn write(file: &File, offset: u64, data: Bytes) -> Result<(), ClientError> {
    let len = data.len() as u64;
    let failed = until_unfenced(file, offset, || write_copies(file, offset, data.clone())).await?;
    let (first, end) = crate::handle::rows_of(&file.layout(), offset, len);
    crate::stale::refetch_if_fenced(file, &failed).await?;
    crate::stale::record_missed(file, failed, offset, first, end).await
}

/// One attempt of [`write`]: every copy tried, each at its fence; the failures.
async fn write_copies(file: &File, offset: u64, data: Bytes) -> Result<Vec<(usize, ClientError)>, ClientError> {
    let layout = &file.layout();
    let all: Vec<u32> = (0..copies(layout) as u32).collect();
    let (mut failed, tried) = file.client.presumed_down(layout, &all);
    let mut tasks = JoinSet::new();
    for c in tried.into_iter().map(|c| c as usize) {
        let io = Io { fence: fence_of(file, c), ..file.io() };
        let (copy, data) = (layout.data_view(c), data.clone());
        tasks.spawn(async move { (c, write_on(&io, &copy, offset, data).await) });
    }
    while let Some(r) = tasks.join_next().await {
        let (c, r) = r.map_err(|e| ClientError::Protocol(format!("write task failed: {e}")))?;
        if let Err(e) = r {
            if !is_fenced(&e) {
                file.client.note_unreachable(&e);
            }
            failed.push((c, e));
        }
    }
    Ok(failed)
}
