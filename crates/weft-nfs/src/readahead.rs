//! Read-ahead for sequential NFS readers: when a READ starts where the same caller's previous READ of the file
//! ended, the next `read_ahead_depth` ranges of the same size are fetched through the cached open file
//! ([`crate::files`]) in the background, so the client's next READ is answered from memory while the data servers
//! already send the one after. NFS clients with a synchronous reader (libnfs, `dd`) otherwise wait for a data
//! server round trip per READ.
//!
//! Bounded: at most `read_ahead_files_max` windows (one per (inode, user), the least recently used dropped), each
//! of at most `read_ahead_depth` ranges of at most one READ's size (1 MiB), and as many fetches in flight as
//! windows × depth (a fetch that finds no permit is not started: the READ then reads directly).
//!
//! Never a stale byte. Invariant: a range's bytes are read from the data servers after the range was put in
//! its window, and every event after which a READ must see other bytes drops the inode's windows, so a range
//! fetched before such an event is never served after it:
//! - attributes answered for the inode (GETATTR, LOOKUP, ACCESS…: [`crate::files::OpenFiles::overlay`]), which is
//!   how an NFS client revalidates at open (close-to-open: another gateway or a FUSE mount wrote and closed);
//! - before and after every WRITE through this gateway (NFSv3 and NFSv4.1), and a size change or COMMIT;
//! - the open file being closed or replaced (its window is tied to that `File`).
//!
//! A READ is served from a range only if the range is exactly what it would read now (same offset, same length
//! after clipping to the size the handle knows now); otherwise it reads directly, as without read-ahead.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::sync::{OnceCell, Semaphore};
use weft_client::{ClientError, File};
use weft_proto::UserCred;

type Key = (u64, UserCred);

/// One range fetched (or being fetched) ahead: `None` in the cell if the fetch failed.
#[derive(Clone)]
struct Range {
    offset: u64,
    len: usize,
    data: Arc<OnceCell<Option<Bytes>>>,
}

struct Window {
    /// The open file the ranges are read through; a READ through another handle drops the window.
    file: Arc<File>,
    /// Where the caller's last READ ended: a READ starting here is sequential.
    next: u64,
    ranges: VecDeque<Range>,
    used: Instant,
}

/// The read-ahead windows of one gateway.
pub struct ReadAhead {
    windows: Mutex<HashMap<Key, Window>>,
    files_max: usize,
    depth: usize,
    fetches: Arc<Semaphore>,
}

/// What a READ got from [`ReadAhead::read`].
pub enum Served {
    /// The bytes of a range fetched ahead (exactly the length asked for).
    Ahead(Bytes),
    /// Nothing ahead: the caller reads directly.
    Miss,
}

impl ReadAhead {
    /// `files_max` 0 or `depth` 0: no read-ahead.
    pub fn new(files_max: usize, depth: usize) -> ReadAhead {
        ReadAhead {
            windows: Mutex::new(HashMap::new()),
            files_max,
            depth,
            fetches: Arc::new(Semaphore::new(files_max.saturating_mul(depth))),
        }
    }

    fn enabled(&self) -> bool {
        self.files_max > 0 && self.depth > 0
    }

    /// A READ through `file` (the cached open file of `user`) of `len` bytes at `offset` (already clipped to
    /// `size`, the size `file` knows now) asked as `count` bytes: the bytes if a range fetched ahead is exactly
    /// that, and the next ranges started if the caller reads sequentially.
    pub async fn read(
        &self,
        file: &Arc<File>,
        user: &UserCred,
        offset: u64,
        len: usize,
        count: u64,
        size: u64,
    ) -> Served {
        if !self.enabled() || len == 0 {
            return Served::Miss;
        }
        let key = (file.ino(), user.clone());
        let (hit, start) = {
            let mut map = self.windows.lock().expect("read-ahead windows");
            if map.get(&key).is_some_and(|w| !Arc::ptr_eq(&w.file, file)) {
                map.remove(&key);
            }
            if !map.contains_key(&key) {
                while map.len() >= self.files_max {
                    let lru = map.iter().min_by_key(|(_, w)| w.used).map(|(k, _)| k.clone()).expect("non-empty");
                    map.remove(&lru);
                }
                // The first READ only marks where the next one would be sequential.
                let window = Window {
                    file: file.clone(),
                    next: offset + len as u64,
                    ranges: VecDeque::new(),
                    used: Instant::now(),
                };
                map.insert(key, window);
                return Served::Miss;
            }
            let w = map.get_mut(&key).expect("present");
            w.used = Instant::now();
            let sequential = w.next == offset;
            w.next = offset + len as u64;
            // Ranges before this READ were skipped; the front one is this READ's if it is exactly it.
            while w.ranges.front().is_some_and(|r| r.offset < offset) {
                w.ranges.pop_front();
            }
            let hit = match w.ranges.front() {
                Some(r) if r.offset == offset && r.len == len => w.ranges.pop_front(),
                _ => {
                    w.ranges.clear();
                    None
                }
            };
            let mut start = Vec::new();
            if sequential || hit.is_some() {
                let mut at = w.ranges.back().map_or(offset + len as u64, |r| r.offset + r.len as u64);
                while w.ranges.len() < self.depth && at < size {
                    let Ok(permit) = self.fetches.clone().try_acquire_owned() else { break };
                    let r = Range { offset: at, len: (size - at).min(count) as usize, data: Arc::new(OnceCell::new()) };
                    at += r.len as u64;
                    start.push((r.clone(), permit));
                    w.ranges.push_back(r);
                }
            }
            (hit, start)
        };
        for (r, permit) in start {
            let f = file.clone();
            tokio::spawn(async move {
                r.data.get_or_init(|| fetch(f, r.offset, r.len)).await;
                drop(permit);
            });
        }
        let Some(r) = hit else { return Served::Miss };
        // Not started yet (no task ran): fetched here, now; started: awaited.
        match r.data.get_or_init(|| fetch(file.clone(), r.offset, r.len)).await {
            Some(b) if b.len() == len => Served::Ahead(b.clone()),
            _ => Served::Miss,
        }
    }

    /// Drops the windows of `ino` (every user's): its data may have changed, or a client revalidated it.
    pub fn drop_inode(&self, ino: u64) {
        if !self.enabled() {
            return;
        }
        self.windows.lock().expect("read-ahead windows").retain(|k, _| k.0 != ino);
    }

    /// Drops the window of one (inode, user) (its open file closed).
    pub fn drop_key(&self, ino: u64, user: &UserCred) {
        if !self.enabled() {
            return;
        }
        self.windows.lock().expect("read-ahead windows").remove(&(ino, user.clone()));
    }

    pub fn clear(&self) {
        self.windows.lock().expect("read-ahead windows").clear();
    }
}

async fn fetch(f: Arc<File>, offset: u64, len: usize) -> Option<Bytes> {
    let r: Result<BytesMut, ClientError> = f.read_at(offset, BytesMut::zeroed(len)).await;
    r.ok().map(BytesMut::freeze)
}
