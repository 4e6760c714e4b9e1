//! Mirror copies against the data servers' write fences (docs/format.md §32): what a write or truncate of every
//! copy does when a copy refuses it for its fence, and the copy of a range from one copy onto another (the
//! healer's catch-up, a read's repair of a corrupt copy) that those fences order against every write.
//!
//! Why: a mirror write sends its bytes to every copy at once, so without fences a copier could read the source
//! before a write reached it and write the target after the same write reached it, undoing that write on one copy
//! with nothing left stale. Invariant: a copy is written from another only under a hold on it, after the source's
//! epoch was raised; a write refused by either is written again on every copy.

use std::future::Future;
use std::time::{Duration, Instant};

use weft_proto::msg::{FenceAct, FenceReq, FenceResp, WriteFence};
use weft_proto::{ErrorCode, Request, Response};

use crate::ClientError;
use crate::capability::call_with_capability;
use crate::handle::File;
use crate::striped::{Io, read_on, write_on};

/// How long a copier holds the target copy's writes back: far more than one batch takes (16 MiB), and a crashed
/// copier's hold ends by itself.
pub(crate) const HOLD_TTL_MS: u32 = 10_000;
/// How long a writer waits out holds and moved epochs before it fails: beyond the longest hold, several times.
const FENCED_WAIT_MAX: Duration = Duration::from_secs(60);
/// The longest pause between two tries of a held write.
const HELD_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The fence a write to copy `slot` carries: the epoch this handle knows for that copy's server.
pub(crate) fn fence_of(file: &File, slot: usize) -> WriteFence {
    let server = file.layout().servers[slot];
    let epochs = file.fence_epochs.lock().expect("fence epochs");
    let fence = WriteFence::at(epochs.get(&server).copied().unwrap_or(1));
    weft_rpc::invariant!(fence.epoch >= 1 && fence.hold == 0);
    fence
}

/// Is `e` a refusal by a copy's write fence (the write is to be done again on every copy)?
pub(crate) fn is_fenced(e: &ClientError) -> bool {
    matches!(e.code(), Some(ErrorCode::EpochMoved | ErrorCode::Held))
}

/// Runs `attempt` (one write or truncate of every copy, each carrying [`fence_of`] its copy) until no copy refuses
/// it for its fence: a copy whose epoch moved is asked its epoch, a held copy is waited for, and every copy is
/// written again (the same bytes: a write undone on one copy by a copier is put back there). Returns the last
/// attempt's other failures, for the caller to record as missed. After [`FENCED_WAIT_MAX`] of refusals, fails
/// naming the file, the offset and the copy's server.
pub(crate) async fn until_unfenced<F, Fut>(
    file: &File,
    file_offset: u64,
    mut attempt: F,
) -> Result<Vec<(usize, ClientError)>, ClientError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Vec<(usize, ClientError)>, ClientError>>,
{
    let start = Instant::now();
    let mut backoff = Duration::from_millis(1);
    loop {
        let failed = attempt().await?;
        let (fenced, rest): (Vec<_>, Vec<_>) = failed.into_iter().partition(|(_, e)| is_fenced(e));
        let Some((slot, last)) = fenced.last() else { return Ok(rest) };
        if start.elapsed() > FENCED_WAIT_MAX {
            return Err(ClientError::DegradedWrite {
                ino: file.attr.ino,
                file_offset,
                server: file.layout().servers[*slot],
                cause: format!("still refused by the copy's write fence after {FENCED_WAIT_MAX:?}: {last}"),
            });
        }
        let mut held = false;
        for (slot, e) in &fenced {
            if e.code() != Some(ErrorCode::EpochMoved) {
                held = true;
            } else if let Err(e) = learn_epoch(file, &file.io(), *slot).await {
                // The copy's server went away since it refused: the next attempt finds it gone, and records what
                // it missed as any failed copy's.
                tracing::debug!(ino = file.attr.ino, copy = slot, "asking a copy its epoch failed: {e}");
            }
        }
        if held {
            tracing::debug!(ino = file.attr.ino, "a mirror write waits for a copy between copies: {last}");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(HELD_BACKOFF_MAX);
        }
    }
}

/// Asks copy `slot` its epoch and keeps it for the writes to come.
async fn learn_epoch(file: &File, io: &Io, slot: usize) -> Result<(), ClientError> {
    let resp = fence_call(file, io, slot, FenceAct::Query).await?;
    let server = file.layout().servers[slot];
    let mut epochs = file.fence_epochs.lock().expect("fence epochs");
    let e = epochs.entry(server).or_insert(1);
    *e = (*e).max(resp.epoch);
    Ok(())
}

/// `FenceWrites` to copy `slot`'s server, with `io`'s capability (renewed once if it expired).
async fn fence_call(file: &File, io: &Io, slot: usize, act: FenceAct) -> Result<FenceResp, ClientError> {
    let (ino, server) = (file.attr.ino, file.layout().servers[slot]);
    let make = |cap| Request::FenceWrites(FenceReq { ino, cap, act });
    match call_with_capability(&file.client, server, &io.caps, make).await? {
        Response::FenceWrites(r) => Ok(r),
        other => Err(ClientError::Protocol(format!("FenceWrites answered {:?}", other.op()))),
    }
}

/// Copies bytes `[a, b)` of the file onto copy `target` from the first of `sources` that answers (zeros past its
/// end), under the fences of docs/format.md §32: the target held (its writers wait), the source's epoch raised
/// (writes sent before are refused there and written again on every copy, after the hold), the source read, the
/// target written under the hold, the hold released. A hold lost meanwhile writes nothing: the error is returned
/// and the range stays as it was (the healer tries again).
pub(crate) async fn copy_range(
    file: &File,
    io: &Io,
    (target, sources): (usize, &[usize]),
    a: u64,
    b: u64,
) -> Result<(), ClientError> {
    let hold = fence_call(file, io, target, FenceAct::Hold { start: a, end: b, ttl_ms: HOLD_TTL_MS }).await?;
    weft_rpc::invariant!(hold.hold != 0 && hold.epoch >= 1);
    let copied = copy_held(file, io, (target, hold.hold), sources, a, b).await;
    if let Err(e) = fence_call(file, io, target, FenceAct::Release { hold: hold.hold }).await {
        // It ends by itself within HOLD_TTL_MS; writers wait until then.
        tracing::warn!(ino = file.attr.ino, copy = target, "releasing a copy's hold failed: {e}");
    }
    copied
}

async fn copy_held(
    file: &File,
    io: &Io,
    (target, hold): (usize, u64),
    sources: &[usize],
    a: u64,
    b: u64,
) -> Result<(), ClientError> {
    let layout = file.layout();
    let mut causes = Vec::new();
    for &s in sources {
        // Raised before the read: a write whose bytes reach the source after the read is refused there.
        if let Err(e) = fence_call(file, io, s, FenceAct::Bump).await {
            causes.push(format!("copy {s}: {e}"));
            continue;
        }
        match read_on(io, &layout.data_view(s), a, b - a).await {
            Ok(bytes) => {
                let held = Io { fence: WriteFence { epoch: 0, hold }, ..io.clone() };
                return write_on(&held, &layout.data_view(target), a, bytes.freeze()).await;
            }
            Err(e) => causes.push(format!("copy {s}: {e}")),
        }
    }
    Err(ClientError::Unavailable {
        ino: file.attr.ino,
        file_offset: a,
        available: 0,
        needed: 1,
        cause: format!(
            "copying onto copy {target}: {}",
            if causes.is_empty() { "no fresh copy".into() } else { causes.join("; ") }
        ),
    })
}
