//! An open file's state, below the I/O that uses it: the `File` struct (layout, size, capability, what a
//! redundant layout keeps: stale view, held rows, decoded rows) and the methods every data path shares. The I/O
//! (`file.rs` at the top, calling down into `plain.rs`, `mirror.rs`, `ec.rs`) imports this; this imports none of
//! it, so the data path's files import downward only.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use weft_proto::msg::{OpenResp, StaleRange};
use weft_proto::{Attr, DataRedundancy, ErrorCode, FileKind, Layout, Rights};

use crate::capability::CapHolder;
use crate::striped::Io;
use crate::{Client, ClientError};

pub struct File {
    pub(crate) client: Client,
    pub(crate) attr: Attr,
    /// The layout as last fetched: the one at open, replaced by a newer generation when an I/O of a redundant file
    /// fails and the MDS has moved a failed server's slot to a spare since ([`File::refresh_layout`]). Plain
    /// layouts never change.
    pub(crate) layout: RwLock<Arc<Layout>>,
    /// The size as this handle knows it: the size at open, grown by this handle's writes, set by its truncates.
    pub(crate) size: AtomicU64,
    /// The file's mode as this handle last learned it (at open, from another open's attributes, from the MDS's
    /// answer to a size change or a drop of set-ID bits): only a hint of whether a write should ask the MDS to drop
    /// set-ID bits ([`File::drop_set_id_before_write`]); the MDS decides.
    pub(crate) mode: AtomicU32,
    /// Written since the last commit.
    pub(crate) dirty: AtomicBool,
    /// The layout positions whose objects this handle wrote (or truncated) since their last `Fsync`: what close and
    /// fsync make durable before the size commit. Objects nobody wrote are never synced.
    pub(crate) unsynced: Slots,
    /// Rows `[first, end)` (`stale::rows_of`) those writes of a redundant file covered: what a position whose
    /// `Fsync` fails is recorded stale over, as a degraded write's missed rows are.
    pub(crate) unsynced_rows: Mutex<Option<(u64, u64)>>,
    /// Per data server written since its last sync, its write verifier as known before the first of those writes
    /// (docs/format.md §33): what the sync's answer is compared with.
    pub(crate) kept: crate::verifier::Kept,
    /// The capability every data-server request carries, and its renewal.
    pub(crate) caps: Arc<CapHolder>,
    /// The file's data version at open (raised by a later open of the same file, [`File::observe_open`]): the
    /// version the cache bank's block keys carry.
    pub(crate) data_version: AtomicU64,
    /// Written or truncated through this handle: reads no longer use the bank nor ask for fills, so a client
    /// always reads its own writes.
    pub(crate) wrote: AtomicBool,
    /// Whether this file's reads keep missing the bank, and so pause their lookups (`weft_cache::miss`).
    pub(crate) bank_misses: weft_cache::MissHint,
    /// The file's stale ranges as this handle knows them (redundant layouts, `stale.rs`).
    pub(crate) stale: StaleView,
    /// A mirror file's copies' write-fence epochs as this handle learned them, by data server (`mirror_fence.rs`);
    /// a server not in it is at epoch 1.
    pub(crate) fence_epochs: Mutex<std::collections::HashMap<u32, u64>>,
    /// Orders size commits against truncates: the MDS keeps the largest committed size, so a commit that read the
    /// size before a truncate and reached the MDS after it would bring the cut length back (and, through the
    /// mount, the kernel's pages of the cut bytes: issue 30's exerciser on `mirror 2`). A commit holds it from
    /// reading the size to the MDS's answer, a truncate until its size is stored.
    pub(crate) size_gate: tokio::sync::Mutex<()>,
    /// An ec file's writes held until their rows are whole (`ec_gather.rs`, sent by `ec.rs`); `None` before the
    /// first write.
    pub(crate) gather: Mutex<Option<crate::ec_gather::Gather>>,
    /// Rows decoded by degraded reads, kept for the next ones (`ec_cache.rs`).
    pub(crate) decoded: crate::ec_cache::RowCache,
    /// Woken whenever rows of `gather` finish being sent.
    pub(crate) gather_changed: tokio::sync::Notify,
    /// The first failure to send held bytes since the last commit: `(file offset, error)`, that commit's error.
    pub(crate) gather_failed: Mutex<Option<(u64, String)>>,
}

/// A set of layout positions (`< STRIPE_COUNT_MAX`), one bit each, updated without a lock on the write path.
#[derive(Default)]
pub(crate) struct Slots([AtomicU64; 4]);

const _: () = assert!(weft_proto::layout::STRIPE_COUNT_MAX <= 256, "Slots holds 256 positions");

impl Slots {
    pub(crate) fn add(&self, slot: u32) {
        assert!(slot < weft_proto::layout::STRIPE_COUNT_MAX, "position {slot} past the widest layout");
        self.0[(slot / 64) as usize].fetch_or(1 << (slot % 64), Ordering::SeqCst);
    }

    /// Empties the set; returns what it held, ascending.
    pub(crate) fn take(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (w, word) in self.0.iter().enumerate() {
            let mut bits = word.swap(0, Ordering::SeqCst);
            while bits != 0 {
                out.push(w as u32 * 64 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        out
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let g = self.gather.get_mut().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_some_and(|g| !g.holds_nothing()) {
            // Only a handle dropped without its close (or fsync): its size was never committed either.
            tracing::error!(ino = self.attr.ino, "an ec file dropped without a close: writes it held were never sent");
        }
    }
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
pub(crate) async fn rmw_io(file: &File) -> Result<Io, ClientError> {
    if file.rights().covers(Rights::READ) {
        return Ok(file.io());
    }
    let opened = file.client.open_capability(file.attr.ino, Rights::READ_WRITE).await?;
    let caps = CapHolder::new(file.client.clone(), file.attr.ino, Rights::READ_WRITE, &opened, Instant::now());
    Ok(Io { caps: Arc::new(caps), ..file.io() })
}

/// A handle's view of its file's stale ranges: `None` until first needed.
#[derive(Default)]
pub(crate) struct StaleView {
    pub(crate) ranges: Mutex<Option<Vec<(u32, StaleRange)>>>,
}

impl StaleView {
    pub(crate) fn add(&self, slot: u32, r: StaleRange) {
        if let Some(v) = self.ranges.lock().expect("stale view").as_mut() {
            v.push((slot, r));
        }
    }
}

impl File {
    /// The file `Open` (or `CreateOpen`) answered, with the rights asked; `at` is when the answer arrived.
    pub(crate) fn new(client: Client, opened: OpenResp, rights: Rights, at: Instant) -> Result<File, ClientError> {
        let caps = Arc::new(CapHolder::new(client.clone(), opened.attr.ino, rights, &opened, at));
        let attr = opened.attr;
        if attr.kind != FileKind::File {
            return Err(ClientError::NotAFile(format!("inode {} is a {:?}, not a regular file", attr.ino, attr.kind)));
        }
        let layout = attr
            .layout
            .clone()
            .ok_or_else(|| ClientError::Protocol(format!("file inode {} has no layout", attr.ino)))?;
        layout.validate(false).map_err(|e| ClientError::Protocol(format!("file inode {}: {e}", attr.ino)))?;
        let bank_misses = match client.data_bank().map(|b| b.config()) {
            Some(c) => weft_cache::MissHint::new(c.data_miss_streak_max, c.data_miss_skip_reads_max),
            None => weft_cache::MissHint::new(0, 0),
        };
        Ok(File {
            client,
            data_version: AtomicU64::new(attr.data_version),
            wrote: AtomicBool::new(false),
            bank_misses,
            size: AtomicU64::new(attr.size),
            mode: AtomicU32::new(attr.mode),
            attr,
            layout: RwLock::new(Arc::new(layout)),
            dirty: AtomicBool::new(false),
            unsynced: Slots::default(),
            unsynced_rows: Mutex::new(None),
            kept: Default::default(),
            caps,
            stale: Default::default(),
            fence_epochs: Default::default(),
            size_gate: tokio::sync::Mutex::new(()),
            gather: Mutex::new(None),
            decoded: Default::default(),
            gather_changed: tokio::sync::Notify::new(),
            gather_failed: Mutex::new(None),
        })
    }

    /// The rights this file's capability grants on the data servers.
    pub fn rights(&self) -> Rights {
        self.caps.rights()
    }

    /// Shares `other`'s capability if it grants at least this file's rights (the FUSE mount keeps one file per
    /// inode; an open with wider rights widens it).
    pub fn adopt_capability(&self, other: &File) {
        self.caps.adopt(&other.caps);
    }

    pub fn ino(&self) -> u64 {
        self.attr.ino
    }

    /// Attributes as of open.
    pub fn attr(&self) -> &Attr {
        &self.attr
    }

    /// The layout as last fetched (see [`File::refresh_layout`]).
    pub fn layout(&self) -> Arc<Layout> {
        // The lock only guards swapping one Arc for another: a panic cannot leave it torn.
        self.layout.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Asks the MDS for the file's layout; a newer generation (a failed server's slot moved to a spare,
    /// docs/format.md §19) replaces the one held. Returns whether it did.
    pub async fn refresh_layout(&self) -> Result<bool, ClientError> {
        let attr = self.client.getattr(self.attr.ino).await?;
        let Some(fresh) = attr.layout else { return Ok(false) };
        fresh.validate(false).map_err(|e| ClientError::Protocol(format!("file inode {}: {e}", self.attr.ino)))?;
        let mut held = self.layout.write().unwrap_or_else(|p| p.into_inner());
        if fresh.generation <= held.generation {
            return Ok(false);
        }
        tracing::info!(ino = self.attr.ino, held = held.generation, fresh = fresh.generation, servers = ?fresh.servers,
            "stale layout: using the newer generation");
        *held = Arc::new(fresh);
        Ok(true)
    }

    /// After a failed I/O of a redundant file tried with layout generation `tried`: whether the failure may come
    /// from a stale layout (a data server's error, or `StaleLayout`, also a fenced data server's) and a newer
    /// generation is held now (fetched here, or already by the failed I/O), so the I/O is worth one more try.
    pub(crate) async fn retry_with_fresh_layout(&self, e: &ClientError, tried: u64) -> bool {
        let data_side = matches!(
            e,
            ClientError::Data { .. }
                | ClientError::DataAt { .. }
                | ClientError::Unavailable { .. }
                | ClientError::DegradedWrite { .. }
                | ClientError::StaleLayout { .. }
        ) || e.code() == Some(ErrorCode::StaleLayout);
        data_side && (self.refresh_layout().await.unwrap_or(false) || self.layout().generation > tried)
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::SeqCst)
    }

    /// Raises the known size to `size` (e.g. fresh attributes seen at another open of the same file).
    pub fn observe_size(&self, size: u64) {
        self.size.fetch_max(size, Ordering::SeqCst);
    }

    /// Another open of the same file answered `attr` (the FUSE mount shares one `File` per inode): its size and
    /// data version become this file's, so reads through the bank see what that open must see (close-to-open).
    pub fn observe_open(&self, attr: &Attr) {
        self.observe_size(attr.size);
        self.mode.store(attr.mode, Ordering::SeqCst);
        self.data_version.fetch_max(attr.data_version, Ordering::SeqCst);
    }

    /// The data version reads through the bank use.
    pub fn data_version(&self) -> u64 {
        self.data_version.load(Ordering::SeqCst)
    }

    pub(crate) fn unit_max(&self) -> u64 {
        u64::from(self.client.tuning().transfer_unit_bytes.max(4096))
    }

    pub(crate) fn io(&self) -> Io {
        Io {
            client: self.client.clone(),
            caps: self.caps.clone(),
            ino: self.attr.ino,
            unit_max: self.unit_max(),
            fence: weft_proto::msg::WriteFence::NONE,
        }
    }

    pub(crate) fn is_plain(&self) -> bool {
        self.layout().redundancy == DataRedundancy::Plain
    }

    /// Keeps the first failure to send bytes held past their write's acknowledgement: the next commit fails.
    pub(crate) fn note_write_behind_failure(&self, file_offset: u64, e: &ClientError) {
        tracing::warn!(ino = self.attr.ino, file_offset, "sending held writes failed: {e}");
        let mut f = self.gather_failed.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert_with(|| (file_offset, e.to_string()));
    }

    /// The failure [`File::note_write_behind_failure`] kept, once.
    pub(crate) fn take_write_behind_failure(&self) -> Option<ClientError> {
        let f = self.gather_failed.lock().unwrap_or_else(|p| p.into_inner()).take();
        f.map(|(file_offset, cause)| ClientError::WriteBehind { ino: self.attr.ino, file_offset, cause })
    }

    /// Records, before a write of `[offset, offset + len)` of a redundant file is sent, the positions it may change
    /// (ec: the data chunks it covers and every parity chunk; mirror: every copy) and its rows.
    pub(crate) fn note_unsynced(&self, offset: u64, len: u64) {
        let layout = self.layout();
        match layout.redundancy {
            DataRedundancy::Ec { k, .. } => {
                for p in layout.data_view(0).pieces(offset, len) {
                    self.add_unsynced(&layout, p.server_index);
                }
                (u32::from(k)..layout.stripe_count).for_each(|i| self.add_unsynced(&layout, i));
            }
            _ => (0..layout.stripe_count).for_each(|i| self.add_unsynced(&layout, i)),
        }
        if layout.redundancy != DataRedundancy::Plain {
            let (first, end) = rows_of(&layout, offset, len);
            let mut rows = self.unsynced_rows.lock().unwrap_or_else(|p| p.into_inner());
            *rows = Some(rows.map_or((first, end), |(a, b)| (a.min(first), b.max(end))));
        }
    }

    /// Records a truncate to `size`: it changes every object (and, for ec, rewrites the last row).
    pub(crate) fn note_truncate(&self, size: u64) {
        let layout = self.layout();
        (0..layout.stripe_count).for_each(|i| self.add_unsynced(&layout, i));
        if layout.redundancy != DataRedundancy::Plain {
            let (lo, hi) = (size.min(self.size()), size.max(self.size()));
            let (first, end) = rows_of(&layout, lo, (hi - lo).max(1));
            let mut rows = self.unsynced_rows.lock().unwrap_or_else(|p| p.into_inner());
            *rows = Some(rows.map_or((first, end), |(a, b)| (a.min(first), b.max(end))));
        }
    }

    /// Records, before a write or cut is sent to position `slot`, that its object has changes to sync, and what
    /// its server's write verifier and this client's session with it were before them (§33).
    pub(crate) fn add_unsynced(&self, layout: &weft_proto::Layout, slot: u32) {
        self.unsynced.add(slot);
        if let Some(&server) = layout.servers.get(slot as usize) {
            self.kept.before_write(server, self.client.verifiers(), || self.client.session_with(server));
        }
    }
}

/// Rows `[first, end)` of a layout covering file bytes `[offset, offset + len)`.
pub(crate) fn rows_of(layout: &Layout, offset: u64, len: u64) -> (u64, u64) {
    let unit = u64::from(layout.stripe_unit);
    let row_bytes = match layout.redundancy {
        DataRedundancy::Ec { k, .. } => unit * u64::from(k),
        _ => unit,
    };
    (offset / row_bytes, (offset + len).div_ceil(row_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::Layout;

    #[test]
    fn rows_are_stripe_rows_for_ec_and_units_for_mirror() {
        let ec = Layout {
            stripe_unit: 4096,
            stripe_count: 6,
            servers: (0..6).collect(),
            redundancy: DataRedundancy::Ec { k: 4, m: 2 },
            generation: 0,
        };
        assert_eq!(rows_of(&ec, 0, 1), (0, 1));
        assert_eq!(rows_of(&ec, 16383, 2), (0, 2));
        assert_eq!(rows_of(&ec, 16384, 16384), (1, 2));
        let mirror = Layout {
            stripe_unit: 4096,
            stripe_count: 2,
            servers: vec![0, 1],
            redundancy: DataRedundancy::Mirror { n: 2 },
            generation: 0,
        };
        assert_eq!(rows_of(&mirror, 4095, 2), (0, 2));
    }
}
