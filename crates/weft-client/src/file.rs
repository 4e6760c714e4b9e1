//! An open file and its striped, parallel data path.
//!
//! A read or write of `[offset, offset + len)` is cut by the layout into pieces (one per stripe unit touched);
//! pieces that are adjacent in the same server's object are merged into *transfer units* of at most
//! `transfer_unit_bytes`; every unit is one request, and all units go out at once (each server's session slots
//! bound how many are in flight to it). The caller's buffer is split into owned segments (`BytesMut::split_to`,
//! `Bytes::slice`: no copy), each unit's reply payload lands directly in its segments, and the segments are joined
//! back (`unsplit`, O(1) because they are adjacent) before the buffer is returned. A transfer of a single unit
//! (most small I/O) is sent from the caller's own task rather than a spawned one, saving two thread wake-ups.
//!
//! Every request carries the file's capability (`capability.rs`), renewed before it runs out; a request refused
//! as expired is renewed and sent once more.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::task::JoinSet;
use weft_cache::CacheKey;
use weft_proto::msg::{FillHint, OpenResp};
use weft_proto::{Attr, DataRedundancy, ErrorCode, FileKind, Layout, Rights};
use weft_rpc::RpcError;

use crate::capability::{CapHolder, is_expired};
use crate::{Client, ClientError, transfer};

pub struct File {
    pub(crate) client: Client,
    pub(crate) attr: Attr,
    /// The layout as last fetched: the one at open, replaced by a newer generation when an I/O of a redundant file
    /// fails and the MDS has moved a failed server's slot to a spare since ([`File::refresh_layout`]). Plain
    /// layouts never change.
    layout: RwLock<Arc<Layout>>,
    /// The size as this handle knows it: the size at open, grown by this handle's writes, set by its truncates.
    pub(crate) size: AtomicU64,
    /// The file's mode as this handle last learned it (at open, from another open's attributes, from the MDS's
    /// answer to a size change or a drop of set-ID bits): only a hint of whether a write should ask the MDS to drop
    /// set-ID bits ([`File::drop_set_id_before_write`]); the MDS decides.
    mode: AtomicU32,
    /// Written since the last commit.
    dirty: AtomicBool,
    /// The layout positions whose objects this handle wrote (or truncated) since their last `Fsync`: what close and
    /// fsync make durable before the size commit. Objects nobody wrote are never synced.
    unsynced: Slots,
    /// Rows `[first, end)` (`stale::rows_of`) those writes of a redundant file covered: what a position whose
    /// `Fsync` fails is recorded stale over, as a degraded write's missed rows are.
    unsynced_rows: Mutex<Option<(u64, u64)>>,
    /// The capability every data-server request carries, and its renewal.
    pub(crate) caps: Arc<CapHolder>,
    /// The file's data version at open (raised by a later open of the same file, [`File::observe_open`]): the
    /// version the cache bank's block keys carry.
    data_version: AtomicU64,
    /// Written or truncated through this handle: reads no longer use the bank nor ask for fills, so a client
    /// always reads its own writes.
    wrote: AtomicBool,
    /// Whether this file's reads keep missing the bank, and so pause their lookups (`weft_cache::miss`).
    bank_misses: weft_cache::MissHint,
    /// The file's stale ranges as this handle knows them (redundant layouts, `stale.rs`).
    pub(crate) stale: crate::stale::StaleView,
    /// Orders size commits against truncates: the MDS keeps the largest committed size, so a commit that read the
    /// size before a truncate and reached the MDS after it would bring the cut length back (and, through the
    /// mount, the kernel's pages of the cut bytes: issue 30's exerciser on `mirror 2`). A commit holds it from
    /// reading the size to the MDS's answer, a truncate until its size is stored.
    size_gate: tokio::sync::Mutex<()>,
    /// An ec file's writes held until their rows are whole (`ec_gather.rs`, sent by `ec.rs`); `None` before the
    /// first write.
    pub(crate) gather: Mutex<Option<crate::ec_gather::Gather>>,
    /// Rows decoded by degraded reads, kept for the next ones (`ec_cache.rs`).
    pub(crate) decoded: crate::ec_cache::RowCache,
    /// Woken whenever rows of `gather` finish being sent.
    pub(crate) gather_changed: tokio::sync::Notify,
    /// The first failure to send held bytes since the last commit: `(file offset, error)`, that commit's error.
    gather_failed: Mutex<Option<(u64, String)>>,
}

/// A set of layout positions (`< STRIPE_COUNT_MAX`), one bit each, updated without a lock on the write path.
#[derive(Default)]
struct Slots([AtomicU64; 4]);

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
async fn fenced_retry<T, F, Fut>(ino: u64, offset: u64, mut attempt: F) -> Result<T, ClientError>
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

const _: () = assert!(weft_proto::layout::STRIPE_COUNT_MAX <= 256, "Slots holds 256 positions");

impl Slots {
    fn add(&self, slot: u32) {
        assert!(slot < weft_proto::layout::STRIPE_COUNT_MAX, "position {slot} past the widest layout");
        self.0[(slot / 64) as usize].fetch_or(1 << (slot % 64), Ordering::SeqCst);
    }

    /// Empties the set; returns what it held, ascending.
    fn take(&self) -> Vec<u32> {
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

/// What a spawned transfer of a file needs (redundant layouts, `ec.rs` and `mirror.rs`).
#[derive(Clone)]
pub(crate) struct Io {
    pub client: Client,
    pub caps: Arc<CapHolder>,
    pub ino: u64,
    pub unit_max: u64,
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
            caps,
            stale: Default::default(),
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

    fn unit_max(&self) -> u64 {
        u64::from(self.client.tuning().transfer_unit_bytes.max(4096))
    }

    pub(crate) fn io(&self) -> Io {
        Io { client: self.client.clone(), caps: self.caps.clone(), ino: self.attr.ino, unit_max: self.unit_max() }
    }

    fn is_plain(&self) -> bool {
        self.layout().redundancy == DataRedundancy::Plain
    }

    /// Keeps the first failure to send bytes held past their write's acknowledgement: the next commit fails.
    pub(crate) fn note_write_behind_failure(&self, file_offset: u64, e: &ClientError) {
        tracing::warn!(ino = self.attr.ino, file_offset, "sending held writes failed: {e}");
        let mut f = self.gather_failed.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert_with(|| (file_offset, e.to_string()));
    }

    /// The failure [`File::note_write_behind_failure`] kept, once.
    fn take_write_behind_failure(&self) -> Option<ClientError> {
        let f = self.gather_failed.lock().unwrap_or_else(|p| p.into_inner()).take();
        f.map(|(file_offset, cause)| ClientError::WriteBehind { ino: self.attr.ino, file_offset, cause })
    }

    /// Into `buf` (its length is the amount read); on an error the buffer is gone with it.
    async fn redundant_read(&self, offset: u64, mut buf: BytesMut) -> Result<BytesMut, ClientError> {
        match self.layout().redundancy {
            DataRedundancy::Mirror { .. } => {
                let got = crate::mirror::read(self, offset, buf.len() as u64).await?;
                buf.copy_from_slice(&got);
                Ok(buf)
            }
            _ => crate::ec::read(self, offset, buf).await,
        }
    }

    /// Writes all of `data` at `offset`, to every server involved in parallel.
    pub async fn write_at(&self, offset: u64, data: Bytes) -> Result<(), ClientError> {
        let len = data.len() as u64;
        if len == 0 {
            return Ok(());
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| ClientError::InvalidPath(format!("write at {offset} of {len} bytes overflows")))?;
        if !self.is_plain() {
            self.note_unsynced(offset, len);
            self.wrote.store(true, Ordering::SeqCst);
            // Invariant: an I/O of a redundant file that fails at a data server is tried once more if the MDS
            // holds a newer layout generation (a failed server's slot moved to a spare), never with the old one.
            if let DataRedundancy::Mirror { .. } = self.layout().redundancy {
                let tried = self.layout().generation;
                if let Err(e) = crate::mirror::write(self, offset, data.clone()).await {
                    if !self.retry_with_fresh_layout(&e, tried).await {
                        return Err(e);
                    }
                    crate::mirror::write(self, offset, data).await?;
                }
            } else {
                // Held until its rows are whole (each job sent is retried on a fresher layout the same way).
                crate::ec::gathered_write(self, offset, data).await?;
            }
            self.size.fetch_max(end, Ordering::SeqCst);
            self.dirty.store(true, Ordering::SeqCst);
            return Ok(());
        }
        // A refused write stored nothing (the lease is checked before the store), so it is sent again whole.
        fenced_retry(self.attr.ino, offset, || self.plain_write(offset, data.clone(), end)).await
    }

    /// [`File::write_at`] of a plain file: one attempt.
    async fn plain_write(&self, offset: u64, data: Bytes, end: u64) -> Result<(), ClientError> {
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
        for u in &units {
            self.unsynced.add(u.server_index);
        }
        self.wrote.store(true, Ordering::SeqCst);
        if let [u] = &units[..] {
            // One unit (every write up to a transfer unit inside one stripe unit): sent from the caller's task. A
            // spawned task would cost a wake-up of another worker to start and another to report back.
            let segs: Vec<Bytes> = u.pieces.iter().map(|&i| seg_of(&data, &pieces[i], offset)).collect();
            write_unit(&self.client, &self.caps, &self.layout(), self.attr.ino, u, segs).await?;
            self.size.fetch_max(end, Ordering::SeqCst);
            self.dirty.store(true, Ordering::SeqCst);
            return Ok(());
        }
        write_units_on(&self.io(), &self.layout(), &pieces, units, &data, offset).await?;
        self.size.fetch_max(end, Ordering::SeqCst);
        self.dirty.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Reads into `buf` (its length is the amount wanted) from `offset`; returns it cut to what lies before the end
    /// of the file. Holes read as zeros. With the cache bank on, blocks found there are copied in and only the
    /// rest is read from the data servers (which then store it in the bank).
    pub async fn read_at(&self, offset: u64, mut buf: BytesMut) -> Result<BytesMut, ClientError> {
        let avail = self.size().saturating_sub(offset).min(buf.len() as u64);
        buf.truncate(avail as usize);
        if avail == 0 {
            return Ok(buf);
        }
        if !self.is_plain() {
            // Held writes of this file go first, so it reads its own writes.
            crate::ec::drain(self).await?;
            let tried = self.layout().generation;
            return match self.redundant_read(offset, buf).await {
                Ok(got) => Ok(got),
                Err(e) if self.retry_with_fresh_layout(&e, tried).await => {
                    self.redundant_read(offset, BytesMut::zeroed(avail as usize)).await
                }
                Err(e) => Err(e),
            };
        }
        let mut first = Some(buf);
        fenced_retry(self.attr.ino, offset, || {
            // A refused read lost its buffer with the error: a later attempt reads into a new one (rare path).
            let b = first.take().unwrap_or_else(|| BytesMut::zeroed(avail as usize));
            self.plain_read(offset, b, avail)
        })
        .await
    }

    /// [`File::read_at`] of a plain file: one attempt into `buf` (`avail` bytes, within the file).
    async fn plain_read(&self, offset: u64, mut buf: BytesMut, avail: u64) -> Result<BytesMut, ClientError> {
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
    async fn read_through_bank(
        &self,
        bank: &weft_cache::Bank,
        mut buf: BytesMut,
        pieces: &[weft_proto::Piece],
    ) -> Result<BytesMut, ClientError> {
        let ino = self.attr.ino;
        let data_version = self.data_version();
        let block_bytes = u64::from(bank.config().block_bytes);
        let layout = self.layout();
        // Blocks are named by the data server that holds them (its id), as that server names its fills.
        let keys: Vec<CacheKey> = pieces
            .iter()
            .flat_map(|p| {
                let server = layout.servers[p.server_index as usize];
                blocks_of(p, block_bytes).map(move |block| CacheKey::Block { ino, data_version, server, block })
            })
            .collect();
        let found = bank.get_many(&keys).await;
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

    /// Truncates (or extends) the objects only; the caller records the size at the metadata service.
    pub(crate) async fn truncate_objects_only(&self, size: u64) -> Result<(), ClientError> {
        let _gate = self.size_gate.lock().await;
        self.note_truncate(size);
        self.wrote.store(true, Ordering::SeqCst);
        self.truncate_layout_objects(size).await?;
        self.size.store(size, Ordering::SeqCst);
        Ok(())
    }

    /// Sets the objects to the lengths a file of `size` bytes has (§5, §16); an ec file's last row is rewritten.
    /// Refused by a fenced server (`StaleLayout`, §19): a redundant file's truncate is tried once more on a newer
    /// layout generation (the slot moved to a spare), a plain file's again with bounded backoff. A truncate is
    /// idempotent, so servers that took the first try take the second alike.
    async fn truncate_layout_objects(&self, size: u64) -> Result<(), ClientError> {
        let tried = self.layout().generation;
        match self.truncate_on_held_layout(size).await {
            Err(e) if !self.is_plain() && self.retry_with_fresh_layout(&e, tried).await => {
                self.truncate_on_held_layout(size).await
            }
            r => r,
        }
    }

    async fn truncate_on_held_layout(&self, size: u64) -> Result<(), ClientError> {
        let layout = self.layout();
        match layout.redundancy {
            DataRedundancy::Ec { .. } => crate::ec::truncate(self, size).await,
            DataRedundancy::Plain => {
                let ino = self.attr.ino;
                fenced_retry(ino, size, || self.client.truncate_objects(ino, &layout, size, &self.caps)).await
            }
            _ => self.client.truncate_objects(self.attr.ino, &layout, size, &self.caps).await,
        }
    }

    /// ftruncate through this handle, as its own user: see [`File::truncate_by`].
    pub async fn truncate(&self, size: u64) -> Result<(), ClientError> {
        self.truncate_by(&self.client, size).await
    }

    /// ftruncate through this handle on behalf of `who` (a client acting as the user who asked: a FUSE mount
    /// shares one `File` among its users). The right is this handle's open for writing, as Linux's
    /// `do_ftruncate` checks only the descriptor: a file created `O_CREAT|O_RDWR` with mode 0 can be cut. The MDS
    /// is shown the open's write capability (`SetSizeOpen`), never a claim; `who`'s identity decides, at the MDS,
    /// whether set-ID bits go.
    pub async fn truncate_by(&self, who: &Client, size: u64) -> Result<(), ClientError> {
        if !self.rights().covers(Rights::WRITE) {
            return Err(ClientError::Access(format!("file inode {} is not open for writing", self.attr.ino)));
        }
        self.set_size(who, size, true).await
    }

    /// truncate(2) of a file this handle holds open, as `who`, who must have write permission by the mode now
    /// (`SetAttr`; the caller checks it first, before the objects change). Through the handle so that its size
    /// and its commits stay ordered with the cut (`size_gate`).
    pub async fn truncate_path_as(&self, who: &Client, size: u64) -> Result<(), ClientError> {
        self.set_size(who, size, false).await
    }

    /// Sets the file's size: objects first, then the metadata service, with the right of the open (`by_open`) or
    /// of the mode.
    async fn set_size(&self, who: &Client, size: u64, by_open: bool) -> Result<(), ClientError> {
        let _gate = self.size_gate.lock().await;
        self.note_truncate(size);
        self.wrote.store(true, Ordering::SeqCst);
        self.truncate_layout_objects(size).await?;
        let attr = if by_open {
            self.record_size_by_open(who, size).await?
        } else {
            let set = weft_proto::SetAttrs { size: Some(size), ..Default::default() };
            who.meta_setattr_only(self.attr.ino, set).await?
        };
        self.mode.store(attr.mode, Ordering::SeqCst);
        self.size.store(size, Ordering::SeqCst);
        Ok(())
    }

    /// `SetSizeOpen` with this handle's write capability, renewed and sent once more if the MDS found it expired.
    async fn record_size_by_open(&self, who: &Client, size: u64) -> Result<Attr, ClientError> {
        let cap = self.caps.get().await?;
        match who.set_size_open(self.attr.ino, size, cap.clone()).await {
            Err(ClientError::Meta(e)) if is_expired(&e) => {
                let fresh = self.caps.renew_from(&cap).await?;
                who.set_size_open(self.attr.ino, size, fresh).await
            }
            r => r,
        }
    }

    /// Whether the file may have a set-ID bit, as this handle last learned its mode: a write need not look further
    /// when it has none.
    pub fn may_be_set_id(&self) -> bool {
        self.mode.load(Ordering::SeqCst) & 0o6000 != 0
    }

    /// Before a write by `writer` (a client acting as the user who writes) that may not keep set-ID bits: asks the
    /// MDS, as `writer`, to drop them now, if the mode this handle knows would lose any for that user
    /// ([`weft_proto::mode_after_unprivileged_write`]). The ask is a `Commit` that raises neither size nor mtime:
    /// the MDS drops the bits at every commit by a caller who is not root (format §2), judged by the identity it
    /// authenticated, so a writer can only lose bits, never keep them. Root is privileged (`CAP_FSETID`) and
    /// keeps them, so it never asks. Linux drops them before the write's bytes land (`file_remove_privs`): a
    /// set-ID program is never run half rewritten; the commit at close alone would leave that window open.
    ///
    /// Callers: the FUSE mount for a write the kernel flags `FUSE_WRITE_KILL_SUIDGID`, and the NFS gateway before
    /// every WRITE (knfsd's VFS does the same). Cheap when there is nothing to drop: no round trip.
    pub async fn drop_set_id_before_write(&self, writer: &Client) -> Result<(), ClientError> {
        let user = writer.user();
        let mode = self.mode.load(Ordering::SeqCst);
        let in_group = user.gid == self.attr.gid || user.groups.contains(&self.attr.gid);
        if user.uid == 0 || weft_proto::mode_after_unprivileged_write(mode, in_group) == mode {
            return Ok(());
        }
        let after = writer.commit(self.attr.ino, 0, 0).await?.mode;
        // The MDS kept the bits (it maps this writer to root, or knows other groups): this handle does not ask
        // again for them; a commit at close, or a fresh open, applies the MDS's rule anyway.
        let hint = if after == mode { mode & !0o6000 } else { after };
        self.mode.store(hint, Ordering::SeqCst);
        Ok(())
    }

    /// Records, before a write of `[offset, offset + len)` of a redundant file is sent, the positions it may change
    /// (ec: the data chunks it covers and every parity chunk; mirror: every copy) and its rows.
    fn note_unsynced(&self, offset: u64, len: u64) {
        let layout = self.layout();
        match layout.redundancy {
            DataRedundancy::Ec { k, .. } => {
                for p in layout.data_view(0).pieces(offset, len) {
                    self.unsynced.add(p.server_index);
                }
                (u32::from(k)..layout.stripe_count).for_each(|i| self.unsynced.add(i));
            }
            _ => (0..layout.stripe_count).for_each(|i| self.unsynced.add(i)),
        }
        if layout.redundancy != DataRedundancy::Plain {
            let (first, end) = crate::stale::rows_of(&layout, offset, len);
            let mut rows = self.unsynced_rows.lock().unwrap_or_else(|p| p.into_inner());
            *rows = Some(rows.map_or((first, end), |(a, b)| (a.min(first), b.max(end))));
        }
    }

    /// Records a truncate to `size`: it changes every object (and, for ec, rewrites the last row).
    fn note_truncate(&self, size: u64) {
        let layout = self.layout();
        (0..layout.stripe_count).for_each(|i| self.unsynced.add(i));
        if layout.redundancy != DataRedundancy::Plain {
            let (lo, hi) = (size.min(self.size()), size.max(self.size()));
            let (first, end) = crate::stale::rows_of(&layout, lo, (hi - lo).max(1));
            let mut rows = self.unsynced_rows.lock().unwrap_or_else(|p| p.into_inner());
            *rows = Some(rows.map_or((first, end), |(a, b)| (a.min(first), b.max(end))));
        }
    }

    /// `Fsync` of every object this handle changed since their last sync, every server at once. A plain file:
    /// any failure fails ([`ClientError::Unsynced`]) and those objects stay to be synced. A redundant file: up to
    /// as many failed servers as the layout tolerates have the rows written recorded stale (`MarkStale`), as a
    /// degraded write's are, and the healer rebuilds them; more fail.
    async fn sync_objects(&self) -> Result<(), ClientError> {
        let slots = self.unsynced.take();
        if slots.is_empty() {
            return Ok(());
        }
        let rows = self.unsynced_rows.lock().unwrap_or_else(|p| p.into_inner()).take();
        let layout = self.layout();
        let failed = match self.client.fsync_slots(self.attr.ino, &layout, &self.caps, &slots).await {
            Ok(f) if f.is_empty() => return Ok(()),
            Ok(f) => f,
            Err(e) => {
                self.keep_unsynced(&slots, rows);
                return Err(e);
            }
        };
        let tolerated = layout.redundancy.tolerates() as usize;
        let in_layout = failed.iter().all(|(slot, _)| *slot < layout.servers.len());
        if let Some((first, end)) = rows
            && failed.len() <= tolerated
            && in_layout
        {
            let offset = first.saturating_mul(u64::from(layout.stripe_unit));
            if let Err(e) = crate::stale::record_missed(self, failed, offset, first, end).await {
                self.keep_unsynced(&slots, rows);
                return Err(e);
            }
            return Ok(());
        }
        self.keep_unsynced(&slots, rows);
        let (slot, e) = failed.into_iter().next().expect("one failure at least");
        Err(match e {
            ClientError::Data { server, source } => ClientError::Unsynced {
                ino: self.attr.ino,
                server,
                addr: self.client.server_addr(server).unwrap_or_else(|| "address unknown".into()),
                source,
            },
            other if slot < layout.servers.len() => {
                let server = layout.servers[slot];
                ClientError::Protocol(format!(
                    "file inode {}: its writes could not be made durable on data server {server}: {other}; the size \
                     was not committed",
                    self.attr.ino
                ))
            }
            other => other,
        })
    }

    /// Puts back what a failed [`File::sync_objects`] took, for the next close or fsync to try again.
    fn keep_unsynced(&self, slots: &[u32], rows: Option<(u64, u64)>) {
        slots.iter().for_each(|&s| self.unsynced.add(s));
        if let Some((first, end)) = rows {
            let mut held = self.unsynced_rows.lock().unwrap_or_else(|p| p.into_inner());
            *held = Some(held.map_or((first, end), |(a, b)| (a.min(first), b.max(end))));
        }
    }

    /// [`File::flush`] without taking a failure kept from earlier sends (this one's is kept too): for a path
    /// that makes another user's writes visible and must leave their errors to that user's fsync or close.
    pub async fn send_held(&self) -> Result<(), ClientError> {
        crate::ec::drain(self).await
    }

    /// Sends the writes this handle holds (an ec file's partial stripe rows, `ec_gather.rs`) to the data servers,
    /// where other clients' reads see them, without making them durable (no `Fsync`) or committing the size: what
    /// a plain file's `write_at` does by itself. A failure to send held writes since the last commit is returned
    /// (once). fsync and close do this first.
    pub async fn flush(&self) -> Result<(), ClientError> {
        let drained = self.send_held().await;
        let behind = self.take_write_behind_failure();
        drained?;
        behind.map_or(Ok(()), Err)
    }

    /// fsync: the same as [`File::commit`], which makes this handle's writes durable before committing them.
    pub async fn sync(&self) -> Result<(), ClientError> {
        self.commit_wcc().await.map(|_| ())
    }

    /// [`File::sync`], returning what [`File::commit_wcc`] returns.
    pub async fn sync_wcc(&self) -> Result<Option<weft_proto::msg::CommitWccResp>, ClientError> {
        self.commit_wcc().await
    }

    /// The commit at close (close-to-open, as the Linux NFS client's flush and COMMIT at close): first every object
    /// this handle wrote since its last sync is made durable on its data server (`Fsync`, all servers at once),
    /// then, if it wrote since the last commit, size and mtime are committed to the metadata service (pNFS
    /// LAYOUTCOMMIT). A failed sync fails the commit and the size stays as it was; a handle that only read sends
    /// nothing.
    pub async fn commit(&self) -> Result<(), ClientError> {
        self.commit_wcc().await.map(|_| ())
    }

    /// [`File::commit`] that returns, when it committed, the file's mtime and size just before and its
    /// attributes after (a cache keyed by (mtime, size) stays valid across the commit iff the "before" matches).
    pub async fn commit_wcc(&self) -> Result<Option<weft_proto::msg::CommitWccResp>, ClientError> {
        // Held until the MDS answered: no truncate slips between the size read below and its commit, and a
        // concurrent fsync waits for this commit's `Fsync` instead of finding the objects already taken.
        let _gate = self.size_gate.lock().await;
        // Held writes (ec) are sent first; a failure to send them, now or since the last commit, fails this one.
        self.flush().await?;
        // Order matters against concurrent writes: a write marks its objects before it sends and raises the size
        // after, so every byte below the size read here is in an object the sync below covers.
        let dirty = self.dirty.swap(false, Ordering::SeqCst);
        let size = self.size();
        if let Err(e) = self.sync_objects().await {
            if dirty {
                self.dirty.store(true, Ordering::SeqCst);
            }
            return Err(e);
        }
        if !dirty {
            return Ok(None);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        match self.client.commit_wcc(self.attr.ino, size, now).await {
            Ok(w) => Ok(Some(w)),
            Err(e) => {
                self.dirty.store(true, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// Makes this handle's writes durable, commits them (see [`File::commit`]) and closes.
    pub async fn close(self) -> Result<(), ClientError> {
        self.commit().await
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

/// Joins segments cut from one buffer, in order, back into it.
fn join(segs: Vec<Option<BytesMut>>) -> BytesMut {
    let mut segs = segs.into_iter().map(|s| s.expect("every segment came back"));
    let mut out = segs.next().expect("at least one segment");
    for s in segs {
        // Adjacent halves of one allocation: unsplit is O(1), no copy.
        out.unsplit(s);
    }
    out
}

/// The bank blocks (object offset / `block_bytes`) piece `p` touches.
fn blocks_of(p: &weft_proto::Piece, block_bytes: u64) -> std::ops::RangeInclusive<u64> {
    debug_assert!(p.len > 0);
    p.object_offset / block_bytes..=(p.object_offset + p.len - 1) / block_bytes
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
        let (client, caps, ino, layout) = (io.client.clone(), io.caps.clone(), io.ino, layout.clone());
        tasks.spawn(async move { write_unit(&client, &caps, &layout, ino, &u, segs).await });
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
fn seg_of(data: &Bytes, p: &weft_proto::Piece, offset: u64) -> Bytes {
    let start = (p.file_offset - offset) as usize;
    data.slice(start..start + p.len as usize)
}

/// Sends one write unit and checks the count the server answers; an expired capability is renewed and the unit
/// sent once more (a refused request wrote nothing).
pub(crate) async fn write_unit(
    client: &Client,
    caps: &CapHolder,
    layout: &Layout,
    ino: u64,
    u: &Unit,
    segs: Vec<Bytes>,
) -> Result<(), ClientError> {
    let server = layout.servers[u.server_index as usize];
    let ds = client.data_server(server).await.map_err(|e| at_offset(client, layout, ino, u, e))?;
    let classes = client.tuning().size_classes();
    let mut cap = caps.get().await?;
    let mut renewed = false;
    loop {
        match transfer::write_object(&ds, classes, ino, u.object_offset, segs.clone(), cap.clone()).await {
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
