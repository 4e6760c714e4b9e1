//! The seam between an open file and its layout's redundancy: plain, mirror and ec behind one set of calls that
//! `file.rs` makes (write, read, truncate, send what is held), each dispatching on the layout to `plain.rs`,
//! `mirror.rs` or `ec.rs`. What the three share lives below (`handle.rs`, `striped.rs`, `stale.rs`).
//!
//! Invariant: an I/O of a redundant file that fails at a data server is tried once more if the MDS holds a newer
//! layout generation (a failed server's slot moved to a spare, docs/format.md §19), never again on the old one.
//! A plain layout never moves: its I/O refused by a fenced server is retried with backoff (`plain.rs`).

use std::future::Future;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use weft_proto::DataRedundancy;

use crate::ClientError;
use crate::handle::File;
use crate::plain::fenced_retry;

/// The three data paths.
enum Scheme {
    Plain,
    Mirror,
    Ec,
}

/// The data path of the layout held now (`File::new` validated it: one of the three).
fn scheme(file: &File) -> Scheme {
    match file.layout().redundancy {
        DataRedundancy::Plain => Scheme::Plain,
        DataRedundancy::Mirror { .. } => Scheme::Mirror,
        _ => Scheme::Ec,
    }
}

/// Runs `op` on the layout held now; once more if it failed at a data server and a newer generation is held since.
async fn on_fresh_layout<T, Fut: Future<Output = Result<T, ClientError>>>(
    file: &File,
    mut op: impl FnMut() -> Fut,
) -> Result<T, ClientError> {
    let tried = file.layout().generation;
    match op().await {
        Err(e) if file.retry_with_fresh_layout(&e, tried).await => op().await,
        r => r,
    }
}

/// Writes all of `data` at `offset` (ending at `end`), as the layout stores it. A redundant write first records
/// the positions and rows it may change (what the next fsync syncs, and records stale if a server fails it).
pub(crate) async fn write(file: &File, offset: u64, data: Bytes, end: u64) -> Result<(), ClientError> {
    match scheme(file) {
        // A refused write stored nothing (the lease is checked before the store), so it is sent again whole.
        Scheme::Plain => {
            return fenced_retry(file.attr.ino, offset, || file.plain_write(offset, data.clone(), end)).await;
        }
        Scheme::Mirror => {
            file.note_unsynced(offset, data.len() as u64);
            file.wrote.store(true, Ordering::SeqCst);
            on_fresh_layout(file, || crate::mirror::write(file, offset, data.clone())).await?;
        }
        Scheme::Ec => {
            file.note_unsynced(offset, data.len() as u64);
            file.wrote.store(true, Ordering::SeqCst);
            // Held until its rows are whole; each job sent is tried on a fresher layout the same way.
            crate::ec::gathered_write(file, offset, data).await?;
        }
    }
    file.size.fetch_max(end, Ordering::SeqCst);
    file.dirty.store(true, Ordering::SeqCst);
    Ok(())
}

/// Reads `avail` bytes (within the file) at `offset` into `buf` (`avail` long).
pub(crate) async fn read(file: &File, offset: u64, buf: BytesMut, avail: u64) -> Result<BytesMut, ClientError> {
    match scheme(file) {
        Scheme::Plain => {
            let mut first = Some(buf);
            fenced_retry(file.attr.ino, offset, || {
                // A refused read lost its buffer with the error: a later attempt reads into a new one (rare path).
                let b = first.take().unwrap_or_else(|| BytesMut::zeroed(avail as usize));
                file.plain_read(offset, b, avail)
            })
            .await
        }
        Scheme::Mirror => {
            let got = on_fresh_layout(file, || crate::mirror::read(file, offset, avail)).await?;
            let mut buf = buf;
            buf.copy_from_slice(&got);
            Ok(buf)
        }
        Scheme::Ec => {
            // Held writes of this file go first, so it reads its own writes.
            crate::ec::drain(file).await?;
            let mut first = Some(buf);
            on_fresh_layout(file, || {
                let b = first.take().unwrap_or_else(|| BytesMut::zeroed(avail as usize));
                crate::ec::read(file, offset, b)
            })
            .await
        }
    }
}

/// Sets the objects to the lengths a file of `size` bytes has (§5, §16); an ec file's last row is rewritten. A
/// truncate is idempotent, so servers that took a first try take a second alike.
pub(crate) async fn truncate(file: &File, size: u64) -> Result<(), ClientError> {
    let (ino, caps) = (file.attr.ino, &file.caps);
    match scheme(file) {
        Scheme::Plain => {
            let layout = file.layout();
            fenced_retry(ino, size, || file.client.truncate_objects(ino, &layout, size, caps)).await
        }
        Scheme::Mirror => on_fresh_layout(file, || crate::stale::truncate_tolerant(file, size, file.size())).await,
        Scheme::Ec => on_fresh_layout(file, || crate::ec::truncate(file, size)).await,
    }
}

/// Sends what the layout holds back (an ec file's partial rows) without a commit; nothing for the others.
pub(crate) async fn send_held(file: &File) -> Result<(), ClientError> {
    match scheme(file) {
        Scheme::Ec => crate::ec::drain(file).await,
        Scheme::Plain | Scheme::Mirror => Ok(()),
    }
}
