//! The data server's side of the cache bank (issue 16): fills after reads, invalidations after writes, both
//! through ONE bounded FIFO queue and one worker, off the reply path.
//!
//! - A read whose request asks for a fill is answered first; then a `Fill`
//!   job is offered to the queue (`try_send`: when the queue is full the fill is dropped and counted). The worker
//!   reads the whole bank blocks the range touched from the store again (the page cache is warm; the reply's
//!   buffer is gone by then) and `set`s each one. A block that reaches the object's end is stored short: a short
//!   item means "the object ends here, zeros follow", true for every reader at that data version.
//! - Fills are named by the server ([`FillName`]): the data version the MDS sealed into the read's capability and
//!   this server's id, never what the reader claims, so a reader cannot plant bytes under another object or
//!   version (docs/format.md §12).
//! - The server remembers, per inode, the last few names its fills went under
//!   ([`RecentVersions`], bounded in versions per inode and in inodes, least recently used first out). After a
//!   write or truncate reached the store, an `Invalidate` job deletes the blocks it changed under each of them.
//!   An invalidation is never dropped: when the queue is full the write's reply waits (`send().await`), so a
//!   fill of old bytes queued before the write is always deleted after it.
//!
//! - The worker remembers the blocks it stored lately ([`RecentFills`], bounded, oldest forgotten first) and skips
//!   storing them again: a block read over and over (a hot file, or readers whose lookups all miss) costs the
//!   server one store, not one per read. An invalidation forgets the blocks it deletes, so the next fill stores
//!   the new bytes, and any daemon failure or recovery ([`Bank::health_changes`]) forgets them all (a daemon may
//!   have restarted empty, or a block been stored on a fallback daemon). Nothing is remembered while a daemon is
//!   failing or ejected: the fills keep storing, which is also what brings an ejected daemon's probe. A block evicted by memcached meanwhile
//!   is refilled once it is forgotten here (speed only).
//!
//! Jobs run one at a time in queue order; the `set`s or `delete`s of one job run concurrently (their keys are
//! distinct, so their order does not matter). What keeps close-to-open is the data version in every key, which
//! the MDS advances at every open for writing and commit: a lost delete (daemon down, timeout) leaves an item no
//! reader that opened after the writer's close will ask for. The deletes narrow the window for readers that had
//! the file open while it was written.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use weft_cache::{Bank, CacheConfig, CacheKey, ConfigError};

use crate::store::ObjectStore;

/// Most deletes one invalidation sends per remembered version: a truncate of a huge object would otherwise queue
/// millions. Past it the remaining items are left to the data version (they are never asked for after the
/// writer's commit) and counted in [`FillStats::invalidations_cut`].
pub const INVALIDATE_BLOCKS_MAX: u64 = 16_384;

/// Bank requests one job has in flight at once.
const JOB_CONCURRENCY: usize = 32;

/// Counters of the fill queue (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FillStats {
    /// Fill jobs queued.
    pub fills_queued: u64,
    /// Fill jobs dropped because the queue was full.
    pub fills_dropped: u64,
    /// Blocks stored in the bank.
    pub blocks_stored: u64,
    /// Blocks a fill did not store again because this server stored them lately ([`RecentFills`]).
    pub blocks_skipped: u64,
    /// Invalidation jobs queued (never dropped).
    pub invalidations_queued: u64,
    /// Deletes sent (one per block and remembered version).
    pub deletes_sent: u64,
    /// Invalidations that covered more than [`INVALIDATE_BLOCKS_MAX`] blocks and were cut short.
    pub invalidations_cut: u64,
}

#[derive(Debug, Default)]
struct Counters {
    fills_queued: AtomicU64,
    fills_dropped: AtomicU64,
    blocks_stored: AtomicU64,
    blocks_skipped: AtomicU64,
    invalidations_queued: AtomicU64,
    deletes_sent: AtomicU64,
    invalidations_cut: AtomicU64,
}

/// What a fill's blocks are named under (with the inode and the block): the file's data version as the MDS
/// sealed it into the read's capability (the reader's hint only with authentication off, when nothing is sealed)
/// and this data server's id, which the reader's key names through the layout (docs/format.md §12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FillName {
    pub data_version: u64,
    pub server: u32,
}

/// One unit of work of the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Job {
    /// Store the blocks of object range `[offset, offset + len)` of `ino` under `hint`.
    Fill { ino: u64, hint: FillName, offset: u64, len: u64 },
    /// Delete blocks `first ..= last` of `ino` under each name in `under`.
    Invalidate { ino: u64, under: Vec<FillName>, first: u64, last: u64 },
}

/// The data versions recently seen per inode in fill hints: those whose items a write must delete.
///
/// Bounded: at most `per_inode` hints per inode (the newest kept) and `inodes_max` inodes (the least recently
/// touched forgotten first). Forgetting costs only the narrowing of the window (see the module doc).
#[derive(Debug)]
pub struct RecentVersions {
    per_inode: usize,
    inodes_max: usize,
    map: HashMap<u64, Vec<FillName>>,
    /// Inodes from least to most recently touched; an inode may appear more than once (stale entries are skipped
    /// when evicting, and the queue is compacted when it grows past twice the map).
    order: VecDeque<u64>,
    /// How many times each inode appears in `order`.
    in_order: HashMap<u64, usize>,
}

impl RecentVersions {
    pub fn new(per_inode: usize, inodes_max: usize) -> RecentVersions {
        RecentVersions {
            per_inode: per_inode.max(1),
            inodes_max: inodes_max.max(1),
            map: HashMap::new(),
            order: VecDeque::new(),
            in_order: HashMap::new(),
        }
    }

    /// Records that `hint` was seen for `ino`.
    pub fn saw(&mut self, ino: u64, hint: FillName) {
        let hints = self.map.entry(ino).or_default();
        if let Some(i) = hints.iter().position(|h| *h == hint) {
            hints.remove(i);
        }
        hints.push(hint);
        if hints.len() > self.per_inode {
            hints.remove(0);
        }
        self.touch(ino);
        while self.map.len() > self.inodes_max {
            let Some(old) = self.order.pop_front() else { break };
            if self.untouch(old) == 0 {
                self.map.remove(&old);
            }
        }
        if self.order.len() > 2 * self.inodes_max + 16 {
            self.compact();
        }
    }

    /// The hints remembered for `ino`, oldest first.
    pub fn of(&self, ino: u64) -> Vec<FillName> {
        self.map.get(&ino).cloned().unwrap_or_default()
    }

    /// Inodes remembered.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn touch(&mut self, ino: u64) {
        self.order.push_back(ino);
        *self.in_order.entry(ino).or_insert(0) += 1;
    }

    /// One appearance of `ino` left `order`; returns how many remain.
    fn untouch(&mut self, ino: u64) -> usize {
        let Some(n) = self.in_order.get_mut(&ino) else { return 0 };
        *n -= 1;
        let left = *n;
        if left == 0 {
            self.in_order.remove(&ino);
        }
        left
    }

    /// Keeps only each inode's last appearance.
    fn compact(&mut self) {
        let mut seen = std::collections::HashSet::new();
        let mut kept: VecDeque<u64> = VecDeque::with_capacity(self.map.len());
        for &ino in self.order.iter().rev() {
            if self.map.contains_key(&ino) && seen.insert(ino) {
                kept.push_front(ino);
            }
        }
        self.in_order = kept.iter().map(|&i| (i, 1)).collect();
        self.order = kept;
    }
}

/// The data server's handle on the bank: the queue's sending side, the recent versions and the counters.
pub struct CacheFiller {
    block_bytes: u64,
    /// This data server's id: the server part of every name its fills go under.
    server: u32,
    tx: mpsc::Sender<Job>,
    recent: Mutex<RecentVersions>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for CacheFiller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheFiller").field("block_bytes", &self.block_bytes).finish_non_exhaustive()
    }
}

/// The limits of a [`CacheFiller`] (from the data server's config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillLimits {
    /// Jobs the queue holds (`cache_fill_queue_max`).
    pub queue_max: usize,
    /// Versions remembered per inode (`cache_versions_per_inode`).
    pub versions_per_inode: usize,
    /// Inodes remembered (`cache_recent_inodes_max`).
    pub inodes_max: usize,
    /// Blocks remembered as stored lately (`cache_filled_recent_max`; 0: none, every fill stores).
    pub filled_recent_max: usize,
}

impl CacheFiller {
    /// A filler over the bank `config` names, its worker spawned on the current runtime; `None` when the config
    /// caches no data blocks.
    pub fn start(
        config: &CacheConfig,
        seal: weft_cache::BankKey,
        limits: FillLimits,
        store: Arc<ObjectStore>,
        server: u32,
    ) -> Result<Option<Arc<CacheFiller>>, ConfigError> {
        if !config.enabled() || !config.data {
            return Ok(None);
        }
        let bank = Bank::new(config.clone(), seal)?;
        let (tx, rx) = mpsc::channel(limits.queue_max.max(1));
        let counters = Arc::new(Counters::default());
        let block_bytes = u64::from(config.block_bytes);
        let recent_fills = RecentFills::new(limits.filled_recent_max);
        tokio::spawn(worker(rx, bank, store, block_bytes, recent_fills, counters.clone()));
        Ok(Some(Arc::new(CacheFiller {
            block_bytes,
            server,
            tx,
            recent: Mutex::new(RecentVersions::new(limits.versions_per_inode, limits.inodes_max)),
            counters,
        })))
    }

    /// The name of a fill of a read at `data_version` (the capability's, or with authentication off the hint's).
    pub fn name(&self, data_version: u64) -> FillName {
        FillName { data_version, server: self.server }
    }

    pub fn stats(&self) -> FillStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FillStats {
            fills_queued: l(&c.fills_queued),
            fills_dropped: l(&c.fills_dropped),
            blocks_stored: l(&c.blocks_stored),
            blocks_skipped: l(&c.blocks_skipped),
            invalidations_queued: l(&c.invalidations_queued),
            deletes_sent: l(&c.deletes_sent),
            invalidations_cut: l(&c.invalidations_cut),
        }
    }

    /// Notes `hint` for `ino` (a read is about to run under it), so that a write from now on deletes its items.
    /// Called before the read touches the disk: a write that lands after this read and before its fill is queued
    /// then deletes the fill's blocks after storing them (same queue).
    pub fn saw(&self, ino: u64, hint: FillName) {
        lock(&self.recent).saw(ino, hint);
    }

    /// Offers the fill of object range `[offset, offset + len)` after a read answered; dropped if the queue is
    /// full.
    pub fn fill(&self, ino: u64, hint: FillName, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        match self.tx.try_send(Job::Fill { ino, hint, offset, len }) {
            Ok(()) => self.counters.fills_queued.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.counters.fills_dropped.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Queues the deletes of the blocks of object range `[offset, offset + len)` under every remembered version of
    /// `ino`, waiting for room in the queue (never dropped).
    pub async fn invalidate(&self, ino: u64, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let under = lock(&self.recent).of(ino);
        if under.is_empty() {
            return;
        }
        let first = offset / self.block_bytes;
        let last = (offset.saturating_add(len) - 1) / self.block_bytes;
        let job = Job::Invalidate { ino, under, first, last };
        self.counters.invalidations_queued.fetch_add(1, Ordering::Relaxed);
        // The worker never stops while a sender lives; if it did, nothing could be stored after this either.
        let _ = self.tx.send(job).await;
    }
}

/// One bank block: (inode, data version, server, object block).
type BlockId = (u64, u64, u32, u64);

fn block_id(ino: u64, hint: FillName, block: u64) -> BlockId {
    (ino, hint.data_version, hint.server, block)
}

/// The blocks the worker stored lately, so it does not store them again on every read (see the module doc).
/// Bounded: at most `max` blocks, the oldest stored forgotten first.
#[derive(Debug)]
pub struct RecentFills {
    max: usize,
    /// The bank's [`Bank::health_changes`] the remembered blocks were stored under.
    epoch: u64,
    set: HashSet<BlockId>,
    /// Blocks in the order they were stored; one forgotten early (an invalidation) may still appear here, and
    /// is skipped when it comes out.
    order: VecDeque<BlockId>,
}

impl RecentFills {
    pub fn new(max: usize) -> RecentFills {
        RecentFills { max, epoch: 0, set: HashSet::new(), order: VecDeque::new() }
    }

    /// Forgets everything when the bank's health moved since the blocks were stored (`epoch` is its
    /// [`Bank::health_changes`] now).
    pub fn sync(&mut self, epoch: u64) {
        if epoch != self.epoch {
            self.set.clear();
            self.order.clear();
            self.epoch = epoch;
        }
    }

    pub fn contains(&self, id: &BlockId) -> bool {
        self.set.contains(id)
    }

    /// Remembers that `id` was stored.
    pub fn stored(&mut self, id: BlockId) {
        if self.max == 0 || !self.set.insert(id) {
            return;
        }
        self.order.push_back(id);
        while self.order.len() > self.max {
            let Some(old) = self.order.pop_front() else { break };
            self.set.remove(&old);
        }
    }

    /// Forgets `id` (its item was deleted: the next fill must store it).
    pub fn forget(&mut self, id: &BlockId) {
        self.set.remove(id);
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// Runs the jobs in queue order, each to its end before the next.
async fn worker(
    mut rx: mpsc::Receiver<Job>,
    bank: Bank,
    store: Arc<ObjectStore>,
    block_bytes: u64,
    mut recent: RecentFills,
    c: Arc<Counters>,
) {
    while let Some(job) = rx.recv().await {
        match job {
            Job::Fill { ino, hint, offset, len } => {
                recent.sync(bank.health_changes());
                let (first, last) = (offset / block_bytes, (offset.saturating_add(len) - 1) / block_bytes);
                let fresh = (first..=last).filter(|&b| !recent.contains(&block_id(ino, hint, b))).count() as u64;
                c.blocks_skipped.fetch_add(last - first + 1 - fresh, Ordering::Relaxed);
                if fresh == 0 {
                    // Every block was stored lately: nothing to read again.
                    continue;
                }
                let store = store.clone();
                let blocks =
                    tokio::task::spawn_blocking(move || read_blocks(&store, ino, offset, len, block_bytes)).await;
                let Ok(blocks) = blocks else { continue };
                let mut sets = JoinSet::new();
                for (block, bytes) in blocks {
                    if recent.contains(&block_id(ino, hint, block)) {
                        continue;
                    }
                    let bank = bank.clone();
                    let key = CacheKey::Block { ino, data_version: hint.data_version, server: hint.server, block };
                    if sets.len() >= JOB_CONCURRENCY {
                        count_stored(sets.join_next().await, bank.all_up(), ino, hint, &mut recent, &c);
                    }
                    sets.spawn(async move { (block, bank.set(&key, &bytes).await) });
                }
                while let Some(r) = sets.join_next().await {
                    count_stored(Some(r), bank.all_up(), ino, hint, &mut recent, &c);
                }
                // A failure during the job (the one that set failed, or another): remember none of it.
                recent.sync(bank.health_changes());
            }
            Job::Invalidate { ino, under, first, mut last } => {
                if last - first >= INVALIDATE_BLOCKS_MAX {
                    c.invalidations_cut.fetch_add(1, Ordering::Relaxed);
                    last = first + INVALIDATE_BLOCKS_MAX - 1;
                }
                let mut deletes = JoinSet::new();
                for hint in under {
                    for block in first..=last {
                        recent.forget(&block_id(ino, hint, block));
                        let bank = bank.clone();
                        let key = CacheKey::Block { ino, data_version: hint.data_version, server: hint.server, block };
                        if deletes.len() >= JOB_CONCURRENCY {
                            let _ = deletes.join_next().await;
                        }
                        c.deletes_sent.fetch_add(1, Ordering::Relaxed);
                        deletes.spawn(async move { bank.delete(&key).await });
                    }
                }
                while deletes.join_next().await.is_some() {}
            }
        }
    }
}

fn count_stored(
    r: Option<Result<(u64, bool), tokio::task::JoinError>>,
    all_up: bool,
    ino: u64,
    hint: FillName,
    recent: &mut RecentFills,
    c: &Counters,
) {
    if let Some(Ok((block, true))) = r {
        c.blocks_stored.fetch_add(1, Ordering::Relaxed);
        if all_up {
            recent.stored(block_id(ino, hint, block));
        }
    }
}

/// The bank blocks `[offset, offset + len)` touches, each whole, read and verified from the store; a block that
/// reaches the object's end is cut there, and blocks wholly past it are left out. A failed read (a corrupt block,
/// an I/O error) stores nothing: the reader got its answer from the server already.
fn read_blocks(store: &ObjectStore, ino: u64, offset: u64, len: u64, block_bytes: u64) -> Vec<(u64, Vec<u8>)> {
    let Ok(obj_len) = store.object_len(ino) else { return Vec::new() };
    let first = offset / block_bytes;
    let end = offset.saturating_add(len).min(obj_len);
    let start = first * block_bytes;
    if end <= start {
        return Vec::new();
    }
    // One read of the whole blocks (verified by the store), cut at the object's end.
    let stop = end.div_ceil(block_bytes).saturating_mul(block_bytes).min(obj_len);
    let mut buf = vec![0u8; (stop - start) as usize];
    if store.read(ino, start, &mut buf).is_err() {
        return Vec::new();
    }
    buf.chunks(block_bytes as usize).zip(first..).map(|(b, i)| (i, b.to_vec())).collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain data, each change whole: a panic elsewhere cannot leave it torn.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(data_version: u64) -> FillName {
        FillName { data_version, server: 0 }
    }

    #[test]
    fn keeps_the_newest_versions_per_inode() {
        let mut r = RecentVersions::new(3, 100);
        for v in 1..=5 {
            r.saw(7, h(v));
        }
        assert_eq!(r.of(7), vec![h(3), h(4), h(5)]);
        // Seeing one again makes it the newest, without a duplicate.
        r.saw(7, h(3));
        assert_eq!(r.of(7), vec![h(4), h(5), h(3)]);
        // Another server of the same version is another name.
        r.saw(7, FillName { data_version: 5, server: 1 });
        assert_eq!(r.of(7).len(), 3);
        assert!(r.of(8).is_empty());
    }

    #[test]
    fn forgets_the_least_recently_seen_inode() {
        let mut r = RecentVersions::new(2, 3);
        r.saw(1, h(1));
        r.saw(2, h(1));
        r.saw(3, h(1));
        r.saw(1, h(2)); // 1 is now the most recent; 2 the least
        r.saw(4, h(1));
        assert_eq!(r.len(), 3);
        assert!(r.of(2).is_empty(), "the least recently seen inode went");
        assert_eq!(r.of(1), vec![h(1), h(2)]);
        assert_eq!((r.of(3), r.of(4)), (vec![h(1)], vec![h(1)]));
    }

    #[test]
    fn stays_bounded_under_many_inodes_and_repeats() {
        let mut r = RecentVersions::new(4, 50);
        for i in 0..10_000u64 {
            r.saw(i % 200, h(i));
            r.saw(3, h(i)); // one hot inode, touched all along
            assert!(r.len() <= 50);
            assert!(r.order.len() <= 2 * 50 + 16 + 2, "{}", r.order.len());
        }
        assert_eq!(r.of(3).len(), 4, "the hot inode is never the least recent");
        assert!(r.map.values().all(|v| v.len() <= 4));
    }

    #[test]
    fn recent_fills_are_bounded_and_forget_what_was_deleted() {
        let mut r = RecentFills::new(3);
        for b in 0..5 {
            r.stored(block_id(1, h(1), b));
        }
        assert_eq!(r.len(), 3, "bounded");
        assert!(!r.contains(&block_id(1, h(1), 1)), "the oldest went first");
        assert!(r.contains(&block_id(1, h(1), 4)));
        assert!(!r.contains(&block_id(1, h(2), 4)), "another version is another block");
        r.forget(&block_id(1, h(1), 4));
        assert!(!r.contains(&block_id(1, h(1), 4)), "a deleted block is stored again");
        r.stored(block_id(1, h(1), 4));
        r.stored(block_id(1, h(1), 4));
        assert!(r.len() <= 3 && r.order.len() <= 3);
        r.sync(1);
        assert!(r.is_empty(), "a daemon failed or came back: everything forgotten");
        let mut none = RecentFills::new(0);
        none.stored(block_id(1, h(1), 0));
        assert!(none.is_empty(), "0: nothing remembered");
    }

    #[test]
    fn fills_read_whole_blocks_and_cut_the_last_at_the_object_end() {
        let dir = std::env::temp_dir().join(format!("weft-fill-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = ObjectStore::open(&dir).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        store.write(5, 0, &data).unwrap();
        // A read of [5000, 5001) with 4 KiB blocks: block 1, whole.
        let b = read_blocks(&store, 5, 5000, 1, 4096);
        assert_eq!(b, vec![(1, data[4096..8192].to_vec())]);
        // Up to the end: block 2 is the object's last, 10000 - 8192 bytes.
        let b = read_blocks(&store, 5, 4096, 8192, 4096);
        assert_eq!(b, vec![(1, data[4096..8192].to_vec()), (2, data[8192..].to_vec())]);
        // Past the end, or a missing object: nothing.
        assert!(read_blocks(&store, 5, 12_288, 100, 4096).is_empty());
        assert!(read_blocks(&store, 6, 0, 100, 4096).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
