//! The data path of plain files: every byte once, striped (`striped.rs`), with the cache bank in front of reads
//! (docs/format.md §12) and bounded retries while a fenced data server refuses the I/O.

use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use weft_cache::CacheKey;
use weft_proto::ErrorCode;
use weft_proto::msg::FillHint;

use crate::ClientError;
use crate::handle::File;
use crate::striped::{Unit, group, join, plan, read_unit, read_units_on, seg_of, write_unit, write_units_on};

/// How often a plain file's I/O refused by a fenced data server is tried again, and the backoff between tries
/// (doubling from the first to the cap): about 5 s in all, a few heartbeats, the time a server takes to hear it is
/// Up again after an MDS restart or a lapse of its lease.
const FENCED_RETRIES_MAX: u32 = 8;

const FENCED_BACKOFF_FIRST_MS: u64 = 50;

const FENCED_BACKOFF_CAP_MS: u64 = 1000;

/// Runs one attempt of a plain file's I/O and tries again, a bounded number of times with backoff, while a data
/// server refuses it with `StaleLayout`: the server is fenced (its lease from the MDS lapsed, or the MDS does not
/// report it Up yet), which passes once its next heartbeat is answered. A plain layout never moves to a spare, so
/// a fresh layout would name the same server; after the last try the refusal is the caller's error.
pub(crate) async fn fenced_retry<T, F, Fut>(ino: u64, offset: u64, mut attempt: F) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let mut backoff_ms = FENCED_BACKOFF_FIRST_MS;
    let mut tries = 0;
    loop {
        match attempt().await {
            Err(e) if e.code() == Some(ErrorCode::StaleLayout) && tries < FENCED_RETRIES_MAX => {
                tracing::debug!(
                    ino,
                    offset,
                    tries,
                    backoff_ms,
                    "a fenced data server refused the I/O; trying again: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(backoff_ms)).await;
                backoff_ms = (backoff_ms * 2).min(FENCED_BACKOFF_CAP_MS);
                tries += 1;
            }
            r => return r,
        }
    }
}

/// The bank blocks (object offset / `block_bytes`) piece `p` touches.
fn blocks_of(p: &weft_proto::Piece, block_bytes: u64) -> std::ops::RangeInclusive<u64> {
    debug_assert!(p.len > 0);
    p.object_offset / block_bytes..=(p.object_offset + p.len - 1) / block_bytes
}

impl File {
    /// The bank, when reads of this file may use it: it caches data, this handle has not written, and a bank
    /// block never straddles two objects (its size divides the stripe unit).
    fn read_bank(&self) -> Option<&weft_cache::Bank> {
        // Redundant layouts read through their own path (ec.rs, mirror.rs), never the bank.
        if !self.is_plain() {
            return None;
        }
        let bank = self.client.data_bank()?;
        let fits = self.layout().stripe_unit.is_multiple_of(bank.config().block_bytes);
        (fits && !self.wrote.load(Ordering::SeqCst)).then_some(bank)
    }

    /// [`File::write_at`] of a plain file: one attempt.
    pub(crate) async fn plain_write(&self, offset: u64, data: Bytes, end: u64) -> Result<(), ClientError> {
        let len = data.len() as u64;
        let (pieces, units) = plan(&self.layout(), offset, len, self.unit_max());
        if self.client.tuning().short_circuit_network {
            // Benchmark short circuit: everything above the wire happened; nothing is sent.
            std::hint::black_box((pieces, units));
            self.size.fetch_max(end, Ordering::SeqCst);
            self.dirty.store(true, Ordering::SeqCst);
            return Ok(());
        }
        // Before sending: a write that fails half-way may still have changed some objects.
        let layout = self.layout();
        for u in &units {
            self.add_unsynced(&layout, u.server_index);
        }
        self.wrote.store(true, Ordering::SeqCst);
        if let [u] = &units[..] {
            // One unit (every write up to a transfer unit inside one stripe unit): sent from the caller's task. A
            // spawned task would cost a wake-up of another worker to start and another to report back.
            let segs: Vec<Bytes> = u.pieces.iter().map(|&i| seg_of(&data, &pieces[i], offset)).collect();
            write_unit(
                &self.client,
                &self.caps,
                &self.layout(),
                (self.attr.ino, weft_proto::msg::WriteFence::NONE),
                u,
                segs,
            )
            .await?;
            self.size.fetch_max(end, Ordering::SeqCst);
            self.dirty.store(true, Ordering::SeqCst);
            return Ok(());
        }
        write_units_on(&self.io(), &self.layout(), &pieces, units, &data, offset).await?;
        self.size.fetch_max(end, Ordering::SeqCst);
        self.dirty.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// [`File::read_at`] of a plain file: one attempt into `buf` (`avail` bytes, within the file).
    pub(crate) async fn plain_read(&self, offset: u64, mut buf: BytesMut, avail: u64) -> Result<BytesMut, ClientError> {
        let (pieces, units) = plan(&self.layout(), offset, avail, self.unit_max());
        if self.client.tuning().short_circuit_network {
            // Benchmark short circuit: nothing is asked of the servers; the data reads as zeros.
            std::hint::black_box((pieces, units));
            buf.fill(0);
            return Ok(buf);
        }
        // With the bank: the data version fills are asked under, when this read asks for them.
        let mut fill = None;
        if let Some(bank) = self.read_bank() {
            // A large read neither looks up nor fills (cheap misses: a multi-get of many keys and as many fills
            // cost more than they can save); a file whose reads keep missing pauses its lookups but still fills.
            let cfg = bank.config();
            let block_bytes = u64::from(cfg.block_bytes);
            let blocks: u64 = pieces.iter().map(|p| blocks_of(p, block_bytes).count() as u64).sum();
            if blocks <= u64::from(cfg.data_read_blocks_max) {
                if self.bank_misses.ask() {
                    return self.read_through_bank(bank, buf, &pieces).await;
                }
                fill = Some(self.data_version());
            }
        }
        if let [u] = &units[..]
            && u.pieces.len() == 1
        {
            // One unit of one piece (a read inside one stripe unit): read from the caller's task, straight into
            // `buf`, without the two wake-ups of a spawned task.
            let hint = fill.map(|data_version| FillHint { data_version });
            let mut dest =
                read_unit(&self.client, &self.caps, &self.layout(), self.attr.ino, u, vec![buf], hint).await?;
            return Ok(dest.pop().expect("the destination comes back"));
        }
        // Split the buffer into one segment per piece, in file order.
        let mut segs: Vec<Option<BytesMut>> = Vec::with_capacity(pieces.len());
        for p in &pieces {
            segs.push(Some(buf.split_to(p.len as usize)));
        }
        self.read_units(units, &mut segs, fill).await?;
        Ok(join(segs))
    }

    /// [`File::read_at`] through the bank: one multi-get for every block the pieces cover; hits are copied into
    /// the caller's buffer (the one copy a bank hit costs: out of memcached's reply), the misses, merged where
    /// adjacent in an object, are read from the data servers with a fill hint.
    /// The bank keys of the blocks `pieces` cover, in order. Blocks are named by the data server that holds them
    /// (its id), as that server names its fills.
    fn bank_keys(&self, pieces: &[weft_proto::Piece], block_bytes: u64, data_version: u64) -> Vec<CacheKey> {
        let (ino, layout) = (self.attr.ino, self.layout());
        pieces
            .iter()
            .flat_map(|p| {
                let server = layout.servers[p.server_index as usize];
                blocks_of(p, block_bytes).map(move |block| CacheKey::Block { ino, data_version, server, block })
            })
            .collect()
    }

    async fn read_through_bank(
        &self,
        bank: &weft_cache::Bank,
        mut buf: BytesMut,
        pieces: &[weft_proto::Piece],
    ) -> Result<BytesMut, ClientError> {
        let (data_version, block_bytes) = (self.data_version(), u64::from(bank.config().block_bytes));
        let found = bank.get_many(&self.bank_keys(pieces, block_bytes, data_version)).await;
        self.bank_misses.record(found.iter().any(Option::is_some));
        let mut found = found.into_iter();
        // The buffer cut into runs in file order, each filled from the bank or read from a server.
        let mut runs: Vec<Option<BytesMut>> = Vec::new();
        let mut misses: Vec<weft_proto::Piece> = Vec::new();
        let mut miss_runs: Vec<usize> = Vec::new();
        for p in pieces {
            let mut seg = buf.split_to(p.len as usize);
            let end = p.object_offset + p.len;
            let mut at = p.object_offset;
            // The object offset where the current run of missing blocks began.
            let mut miss_from: Option<u64> = None;
            let mut flush = |from: u64, to: u64, seg: &mut BytesMut, runs: &mut Vec<Option<BytesMut>>| {
                runs.push(Some(seg.split_to((to - from) as usize)));
                miss_runs.push(runs.len() - 1);
                let file_offset = p.file_offset + (from - p.object_offset);
                misses.push(weft_proto::Piece {
                    server_index: p.server_index,
                    object_offset: from,
                    file_offset,
                    len: to - from,
                });
            };
            while at < end {
                let block = at / block_bytes;
                let block_end = ((block + 1) * block_bytes).min(end);
                // A value longer than a block is not one this cluster stored: a miss.
                let hit = found.next().flatten().filter(|v| v.len() as u64 <= block_bytes);
                match hit {
                    Some(v) => {
                        if let Some(from) = miss_from.take() {
                            flush(from, at, &mut seg, &mut runs);
                        }
                        let mut part = seg.split_to((block_end - at) as usize);
                        // A short item ends at the object's end: zeros follow.
                        let from = (at - block * block_bytes) as usize;
                        let have = v.len().saturating_sub(from).min(part.len());
                        part[..have].copy_from_slice(&v[from..from + have]);
                        part[have..].fill(0);
                        runs.push(Some(part));
                    }
                    None => {
                        miss_from.get_or_insert(at);
                    }
                }
                at = block_end;
            }
            if let Some(from) = miss_from {
                flush(from, end, &mut seg, &mut runs);
            }
        }
        if misses.is_empty() {
            return Ok(join(runs));
        }
        let units = group(&misses, self.layout().stripe_count, self.unit_max());
        let mut segs: Vec<Option<BytesMut>> = miss_runs.iter().map(|&r| runs[r].take()).collect();
        self.read_units(units, &mut segs, Some(data_version)).await?;
        for (&r, seg) in miss_runs.iter().zip(segs) {
            runs[r] = seg;
        }
        Ok(join(runs))
    }

    /// Reads `units` into `segs` (one segment per piece the units name), every unit at once; a single unit from
    /// the caller's task. With `fill` (a data version) each request asks its server to fill the bank.
    async fn read_units(
        &self,
        units: Vec<Unit>,
        segs: &mut [Option<BytesMut>],
        fill: Option<u64>,
    ) -> Result<(), ClientError> {
        read_units_on(&self.io(), &self.layout(), units, segs, fill).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::Layout;

    fn lay(unit: u32, count: u32) -> Layout {
        Layout {
            stripe_unit: unit,
            stripe_count: count,
            servers: (0..count).collect(),
            redundancy: weft_proto::DataRedundancy::Plain,
            generation: 0,
        }
    }

    /// The bank's block keys are per object: a read across a stripe boundary names blocks of two objects, each
    /// by its position in the layout and its object offset / block size.
    #[test]
    fn bank_blocks_are_named_per_object() {
        let (pieces, _) = plan(&lay(65536, 2), 60 << 10, 10 << 10, 1 << 20);
        let named: Vec<(u32, Vec<u64>)> =
            pieces.iter().map(|p| (p.server_index, blocks_of(p, 8192).collect())).collect();
        // [60 KiB, 64 KiB) is object 0's block 7; [64 KiB, 70 KiB) is object 1's [0, 6 KiB): its block 0.
        assert_eq!(named, vec![(0, vec![7]), (1, vec![0])]);
        // The second stripe row: file offset 128 KiB is object 0 at 64 KiB, block 8.
        let (pieces, _) = plan(&lay(65536, 2), 128 << 10, 20000, 1 << 20);
        assert_eq!((pieces[0].server_index, blocks_of(&pieces[0], 8192).collect::<Vec<_>>()), (0, vec![8, 9, 10]));
        // A one-byte read touches one block.
        let (pieces, _) = plan(&lay(65536, 2), 8191, 1, 1 << 20);
        assert_eq!(blocks_of(&pieces[0], 8192).collect::<Vec<_>>(), vec![0]);
    }
}
