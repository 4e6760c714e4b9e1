//! Catch-up of one slot's rows (docs/format.md §18), what the healer (`weft-heal`) runs over each stale range:
//! the rows are rebuilt from the other chunks (ec: decoded by the version rule and written compare-and-set with
//! the parity, `ec_rows::heal_batch`; mirror: another copy) and written to that slot's server, cut at the file's
//! size as §16 stores them.

use std::collections::HashMap;

use weft_proto::DataRedundancy;

use crate::ClientError;
use crate::ec_codec::{Codec, km};
use crate::handle::File;
use crate::stale::stale_slots;

/// Rebuilds rows `[first, first + rows)` of `slot` from the other chunks of `file` and writes them to the slot's
/// server, stored as a file of `size` bytes would store them (§16), with a write capability (the handle's, or a
/// fresh one), and makes them durable there (`FsyncVerified`, its write verifier unmoved: §33) before it returns. Returns the bytes written. `size` may exceed the committed size: a degraded write's rows can lie
/// past it until its writer commits, and those bytes are on the other servers already.
pub async fn heal_rows(file: &File, slot: usize, first: u64, rows: u64, size: u64) -> Result<u64, ClientError> {
    let layout = &file.layout();
    let io = &crate::handle::repair_io(file).await?;
    let unit = u64::from(layout.stripe_unit);
    let stale = stale_slots(file, first, first + rows).await?;
    // The slot's server's verifier and session, asked before the heal writes: a reboot before their sync fails the
    // heal (§33). Asked, not remembered: the healer is often the first to reach a server back from a reboot.
    let server = layout.servers[slot];
    let kept = HashMap::from([(server, file.client.verifier_now(server).await?)]);
    let bytes = match layout.redundancy {
        DataRedundancy::Ec { .. } => {
            // Batches of rows through the versioned write path (§17): each row decoded from the others by the
            // version rule and the chunk written compare-and-set with the parity, one request per chunk for the
            // whole batch, so a healed chunk carries a version its row agrees with, and a writer racing the heal
            // is never undone (a batch it moves is retried, then healed row by row).
            let (k, m) = km(layout).expect("an ec layout");
            let row_bytes = unit * k as u64;
            let codec = Codec::new(k, m)?;
            // Rows past the file's last row hold nothing.
            let end = (first + rows).min(size.div_ceil(row_bytes)).max(first);
            crate::ec_rows::heal_batch(file, io, &codec, first, end - first, slot, size).await?
        }
        DataRedundancy::Mirror { n } => {
            heal_copy(file, io, (slot, usize::from(n)), (first, rows), size, &stale).await?
        }
        // Plain files have no other chunk to heal from (and are never marked).
        _ => 0,
    };
    if bytes > 0 {
        // Durable before the healer clears the range: healed bytes lost in a crash of the slot's machine after the
        // clear would leave a copy (or chunk) that missed writes with nothing saying so.
        let synced = file.client.fsync_slots(file.attr.ino, layout, &io.caps, &[slot as u32]).await?;
        if let Some((_, e)) = synced.failed.into_iter().next() {
            return Err(e);
        }
        let moved = crate::verifier::lost(&kept, |s| file.client.verifiers().get(s), &synced.answers);
        if let Some(m) = moved.first() {
            let addr = file.client.server_addr(server).unwrap_or_else(|| "address unknown".into());
            let (ino, kept, now) = (file.attr.ino, m.kept, m.now);
            return Err(ClientError::WritesLost { ino, server, addr, kept, now });
        }
    }
    Ok(bytes)
}

/// A mirror copy's rows `[first, first + rows)` copied from another, fresh copy (zeros past its end) onto copy
/// `slot`, up to `size`, under the copies' write fences (`mirror_fence::copy_range`). Returns the bytes written.
async fn heal_copy(
    file: &File,
    io: &crate::striped::Io,
    (slot, n): (usize, usize),
    (first, rows): (u64, u64),
    size: u64,
    stale: &[usize],
) -> Result<u64, ClientError> {
    let unit = u64::from(file.layout().stripe_unit);
    let a = first * unit;
    let b = ((first + rows) * unit).min(size);
    if a < b {
        let sources: Vec<usize> = (0..n).filter(|c| *c != slot && !stale.contains(c)).collect();
        crate::mirror_fence::copy_range(file, io, (slot, &sources), a, b).await?;
    }
    Ok(b.saturating_sub(a))
}
