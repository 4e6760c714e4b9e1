//! The server's buffer zones (the PVFS report's buffer zones): bounded size classes of payload buffers, from small
//! (64 KiB) to the transfer unit (2 MiB by default). Each class is one contiguous anonymous mapping, a zone,
//! allocated and pre-faulted page by page when the pool is created (first touch of memory is slow on this class of
//! machine, so it is paid at server start, never on the data path), then announced with
//! [`weft_fabric::zones::announce`] so a one-sided backend registers it with its device once. Zones live for the
//! rest of the process: they are leaked on purpose, as announced zones must be.
//!
//! [`BufferPool::acquire`] takes a buffer from the smallest class that fits; when that class is out it borrows from
//! a larger class that has one free, and when all of those are out too it waits for its own class: that wait is
//! the server's back-pressure. Memory is bounded by the sum over classes of `buffers × buf_bytes`.
//!
//! No `unsafe` here: a zone is a leaked `&'static mut [u8]`, split into disjoint `&'static mut` buffers with
//! `chunks_exact_mut`, so the borrow checker proves buffers never overlap.

use std::io;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tracing::info;

/// Bytes of the pages touched to pre-fault a zone (touching more often is harmless, less often would miss pages).
const PAGE_BYTES: usize = 4096;

/// One size class: `buffers` buffers of `buf_bytes` each, carved out of one zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolClass {
    pub buf_bytes: usize,
    pub buffers: u32,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    #[error("a buffer pool needs at least one class, and every class a non-zero size and count (got {0:?})")]
    Empty(Vec<PoolClass>),
    #[error("two classes of the buffer pool have the same size {0}")]
    DuplicateClass(usize),
    #[error("buffer pool class of {buffers} × {buf_bytes} bytes overflows the address space")]
    TooLarge { buf_bytes: usize, buffers: u32 },
    #[error("cannot allocate a buffer zone of {bytes} bytes: {source}")]
    Alloc { bytes: usize, source: io::Error },
}

#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    /// Ascending by `buf_bytes`.
    classes: Vec<Class>,
}

struct Class {
    buf_bytes: usize,
    buffers: usize,
    zone_addr: usize,
    free: Mutex<Vec<&'static mut [u8]>>,
    /// As many permits as buffers in `free`; taken before popping, given back after pushing.
    permits: Semaphore,
}

/// A buffer on loan from a [`BufferPool`]; it returns on drop. `len()` is the part in use.
pub struct PoolBuf {
    buf: Option<&'static mut [u8]>,
    len: usize,
    class: usize,
    pool: Arc<PoolInner>,
}

/// Pre-faults and announces one zone of `bytes`; it is never unmapped.
fn allocate_zone(bytes: usize) -> Result<&'static mut [u8], PoolError> {
    let map = memmap2::MmapMut::map_anon(bytes).map_err(|source| PoolError::Alloc { bytes, source })?;
    let zone: &'static mut [u8] = Box::leak(Box::new(map)).as_mut();
    // A write fault on every page now gives each its frame; a read would only map the shared zero page.
    for i in (0..zone.len()).step_by(PAGE_BYTES) {
        zone[i] = 0;
    }
    if !weft_fabric::zones::announce(zone.as_ptr(), zone.len()) {
        // Only past ZONES_MAX: the zone still works, a one-sided backend just bounces through registered memory.
        tracing::warn!(bytes, "too many buffer zones to announce; this one stays unregistered");
    }
    Ok(zone)
}

impl BufferPool {
    /// One class of `buffers` buffers of `buf_bytes`. Panics if the zone cannot be allocated: for servers whose
    /// pool is small and fixed (the MDS, tests); the data server uses [`BufferPool::with_classes`].
    pub fn new(buf_bytes: usize, buffers: u32) -> BufferPool {
        BufferPool::with_classes(&[PoolClass { buf_bytes, buffers }]).expect("buffer pool")
    }

    /// Allocates, pre-faults and announces one zone per class.
    pub fn with_classes(classes: &[PoolClass]) -> Result<BufferPool, PoolError> {
        let mut sorted = classes.to_vec();
        sorted.sort_by_key(|c| c.buf_bytes);
        if sorted.is_empty() || sorted.iter().any(|c| c.buf_bytes == 0 || c.buffers == 0) {
            return Err(PoolError::Empty(sorted));
        }
        if let Some(w) = sorted.windows(2).find(|w| w[0].buf_bytes == w[1].buf_bytes) {
            return Err(PoolError::DuplicateClass(w[0].buf_bytes));
        }
        let mut out = Vec::with_capacity(sorted.len());
        let mut total_bytes = 0usize;
        for c in &sorted {
            let bytes = c
                .buf_bytes
                .checked_mul(c.buffers as usize)
                .filter(|b| total_bytes.checked_add(*b).is_some())
                .ok_or(PoolError::TooLarge { buf_bytes: c.buf_bytes, buffers: c.buffers })?;
            total_bytes += bytes;
            let zone = allocate_zone(bytes)?;
            let zone_addr = zone.as_ptr() as usize;
            let free: Vec<&'static mut [u8]> = zone.chunks_exact_mut(c.buf_bytes).collect();
            out.push(Class {
                buf_bytes: c.buf_bytes,
                buffers: free.len(),
                zone_addr,
                free: Mutex::new(free),
                permits: Semaphore::new(c.buffers as usize),
            });
        }
        info!(
            total_bytes,
            classes = ?sorted.iter().map(|c| format!("{}x{}", c.buffers, c.buf_bytes)).collect::<Vec<_>>(),
            "buffer zones allocated, pre-faulted and announced"
        );
        Ok(BufferPool { inner: Arc::new(PoolInner { classes: out }) })
    }

    /// The largest buffer this pool lends.
    pub fn buf_bytes(&self) -> usize {
        self.inner.classes.last().map_or(0, |c| c.buf_bytes)
    }

    /// The classes, ascending.
    pub fn classes(&self) -> Vec<PoolClass> {
        self.inner.classes.iter().map(|c| PoolClass { buf_bytes: c.buf_bytes, buffers: c.buffers as u32 }).collect()
    }

    /// Bytes of all zones together: the bound on payload memory.
    pub fn total_bytes(&self) -> usize {
        self.inner.classes.iter().map(|c| c.buf_bytes * c.buffers).sum()
    }

    fn class_for(&self, len: usize) -> usize {
        let i = self.inner.classes.iter().position(|c| c.buf_bytes >= len);
        i.unwrap_or_else(|| panic!("request for {len} bytes from a pool of at most {}", self.buf_bytes()))
    }

    fn take(&self, class: usize, n: usize, len: usize) -> Vec<PoolBuf> {
        let mut free = self.inner.classes[class].free.lock().expect("pool lock");
        (0..n)
            .map(|_| PoolBuf {
                buf: Some(free.pop().expect("a permit guarantees a free buffer")),
                len,
                class,
                pool: self.inner.clone(),
            })
            .collect()
    }

    /// Borrows a buffer with `len` bytes in use from the smallest class that fits, or else from a larger class
    /// with one free; waits for the smallest class while all of them are out. Callers bound `len` by
    /// [`BufferPool::buf_bytes`] first (it panics otherwise: a caller bug, not a wire input).
    pub async fn acquire(&self, len: usize) -> PoolBuf {
        self.acquire_n(len, 1).await.expect("every class has a buffer").pop().expect("one buffer")
    }

    /// Borrows two buffers of `len` bytes at once (double buffering), from one class: taking both together means
    /// no caller holds one while waiting for another, so callers cannot deadlock each other. `None` when no class
    /// that fits has two buffers.
    pub async fn acquire_pair(&self, len: usize) -> Option<(PoolBuf, PoolBuf)> {
        let mut v = self.acquire_n(len, 2).await?;
        let b = v.pop()?;
        let a = v.pop()?;
        Some((a, b))
    }

    async fn acquire_n(&self, len: usize, n: usize) -> Option<Vec<PoolBuf>> {
        let own = self.class_for(len);
        let classes = &self.inner.classes;
        let own = (own..classes.len()).find(|&i| classes[i].buffers >= n)?;
        for (i, c) in classes.iter().enumerate().skip(own) {
            if c.buffers < n {
                continue;
            }
            if let Ok(p) = c.permits.try_acquire_many(n as u32) {
                p.forget();
                return Some(self.take(i, n, len));
            }
        }
        let p = classes[own].permits.acquire_many(n as u32).await.expect("pool semaphore is never closed");
        p.forget();
        Some(self.take(own, n, len))
    }

    /// Buffers currently free (not on loan), all classes together.
    pub fn available(&self) -> usize {
        self.inner.classes.iter().map(|c| c.permits.available_permits()).sum()
    }

    /// Free buffers of the class of exactly `buf_bytes` (0 for no such class).
    pub fn available_in(&self, buf_bytes: usize) -> usize {
        self.inner.classes.iter().find(|c| c.buf_bytes == buf_bytes).map_or(0, |c| c.permits.available_permits())
    }
}

impl PoolBuf {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The size of the buffer (its class), the most `set_len` accepts.
    pub fn capacity(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }
    /// Changes the part in use (a double buffer reused for pieces of different sizes).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "{len} bytes do not fit a buffer of {}", self.capacity());
        self.len = len;
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.buf.as_ref().expect("present until drop")[..self.len]
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut().expect("present until drop")[..self.len]
    }
    /// Start of the buffer, inside an announced zone.
    pub fn as_ptr(&self) -> *const u8 {
        self.as_slice().as_ptr()
    }
    /// Offset of the buffer inside its class's zone (tests, logs).
    pub fn zone_offset(&self) -> usize {
        self.as_ptr() as usize - self.pool.classes[self.class].zone_addr
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        let class = &self.pool.classes[self.class];
        if let Some(buf) = self.buf.take() {
            class.free.lock().unwrap_or_else(|e| e.into_inner()).push(buf);
            class.permits.add_permits(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = 1024;

    fn classes() -> Vec<PoolClass> {
        vec![
            PoolClass { buf_bytes: 256 * K, buffers: 2 },
            PoolClass { buf_bytes: 64 * K, buffers: 3 },
            PoolClass { buf_bytes: 2048 * K, buffers: 1 },
        ]
    }

    #[tokio::test]
    async fn pool_bounds_and_reuses() {
        let p = BufferPool::new(4096, 2);
        let a = p.acquire(10).await;
        let b = p.acquire(4096).await;
        assert_eq!(p.available(), 0);
        assert_eq!((a.len(), b.len()), (10, 4096));
        // A third acquire must wait until one is returned.
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.acquire(1).await.len() }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(a);
        assert_eq!(waiter.await.unwrap(), 1);
        drop(b);
        assert_eq!(p.available(), 2);
    }

    #[tokio::test]
    async fn the_smallest_class_that_fits_is_picked() {
        let p = BufferPool::with_classes(&classes()).unwrap();
        assert_eq!(p.buf_bytes(), 2048 * K);
        assert_eq!(p.total_bytes(), 3 * 64 * K + 2 * 256 * K + 2048 * K);
        for (len, class) in
            [(1, 64 * K), (64 * K, 64 * K), (64 * K + 1, 256 * K), (256 * K, 256 * K), (1 << 20, 2048 * K)]
        {
            let b = p.acquire(len).await;
            assert_eq!((b.len(), b.capacity()), (len, class), "a request of {len} bytes");
            assert_eq!(
                p.available_in(class),
                p.classes().iter().find(|c| c.buf_bytes == class).unwrap().buffers as usize - 1
            );
        }
        assert_eq!(p.available(), 6, "every buffer came back");
    }

    #[tokio::test]
    async fn an_exhausted_class_borrows_upward_then_waits_for_its_own() {
        let p = BufferPool::with_classes(&classes()).unwrap();
        let small: Vec<_> = acquire_many(&p, 3, 100).await;
        assert_eq!(p.available_in(64 * K), 0);
        // The small class is out: the next small request borrows a 256 KiB buffer, then the 2 MiB one.
        let b1 = p.acquire(100).await;
        let b2 = p.acquire(100).await;
        let b3 = p.acquire(100).await;
        assert_eq!((b1.capacity(), b2.capacity(), b3.capacity()), (256 * K, 256 * K, 2048 * K));
        assert_eq!(p.available(), 0);
        // Everything that fits is out: the request waits (back-pressure) until its own class has a buffer...
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.acquire(100).await.capacity() }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        // ...and a larger class freeing up does not serve a waiter that is already queued on its own class.
        drop(b1);
        drop(small);
        assert_eq!(waiter.await.unwrap(), 64 * K);
        // A large request never takes a smaller class: with the 2 MiB buffer out, it waits.
        let big_waiter = tokio::spawn({
            let p = p.clone();
            async move { p.acquire(300 * K).await.capacity() }
        });
        tokio::task::yield_now().await;
        assert!(!big_waiter.is_finished());
        drop(b3);
        assert_eq!(big_waiter.await.unwrap(), 2048 * K);
        drop(b2);
        assert_eq!(p.available(), 6);
    }

    async fn acquire_many(p: &BufferPool, n: usize, len: usize) -> Vec<PoolBuf> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(p.acquire(len).await);
        }
        v
    }

    #[tokio::test]
    async fn pairs_come_from_one_class_at_once() {
        let p = BufferPool::with_classes(&classes()).unwrap();
        let (a, b) = p.acquire_pair(100 * K).await.unwrap();
        assert_eq!((a.capacity(), b.capacity()), (256 * K, 256 * K));
        // The 256 KiB class is out and the 2 MiB class has a single buffer: a second pair has to wait.
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.acquire_pair(100 * K).await.map(|(a, _)| a.capacity()) }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one buffer is not a pair");
        drop(b);
        assert_eq!(waiter.await.unwrap(), Some(256 * K));
        assert!(p.acquire_pair(300 * K).await.is_none(), "no class that fits has two buffers");
    }

    #[tokio::test]
    async fn buffers_lie_inside_announced_zones_and_never_overlap() {
        let p = BufferPool::with_classes(&classes()).unwrap();
        let mut held = Vec::new();
        for len in [1, 1, 1, 64 * K + 1, 64 * K + 1, 2048 * K] {
            held.push(p.acquire(len).await);
        }
        assert_eq!(p.available(), 0);
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for b in &held {
            let zone = weft_fabric::zones::find(b.as_ptr(), b.capacity()).expect("inside an announced zone");
            assert!(zone.len >= b.capacity());
            assert_eq!(b.zone_offset() % b.capacity(), 0);
            spans.push((b.as_ptr() as usize, b.as_ptr() as usize + b.capacity()));
        }
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].1 <= w[1].0, "buffers {:x?} and {:x?} overlap", w[0], w[1]);
        }
        // Returned buffers come back with their contents intact (no reallocation behind the caller's back).
        let mut b = held.pop().unwrap();
        b.as_mut_slice()[12345] = 7;
        let ptr = b.as_ptr();
        drop(b);
        let b = p.acquire(2048 * K).await;
        assert_eq!((b.as_ptr(), b.as_slice()[12345]), (ptr, 7));
    }

    /// Whether the page holding `addr` is present in memory, from the present bit of /proc/self/pagemap (readable
    /// without privileges; only the frame numbers are hidden).
    fn page_present(addr: usize) -> bool {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open("/proc/self/pagemap").unwrap();
        let mut e = [0u8; 8];
        f.read_exact_at(&mut e, (addr / PAGE_BYTES * 8) as u64).unwrap();
        u64::from_le_bytes(e) >> 63 == 1
    }

    #[tokio::test]
    async fn zones_are_pre_faulted_at_creation() {
        let p = BufferPool::with_classes(&classes()).unwrap();
        // Nothing was acquired yet: every page of every zone must already be present.
        for c in &p.inner.classes {
            for off in (0..c.buf_bytes * c.buffers).step_by(PAGE_BYTES) {
                assert!(page_present(c.zone_addr + off), "page at {off} of the {} zone is not present", c.buf_bytes);
            }
        }
    }

    #[test]
    fn bad_class_lists_are_refused() {
        assert!(matches!(BufferPool::with_classes(&[]), Err(PoolError::Empty(_))));
        assert!(matches!(
            BufferPool::with_classes(&[PoolClass { buf_bytes: 4096, buffers: 0 }]),
            Err(PoolError::Empty(_))
        ));
        assert!(matches!(
            BufferPool::with_classes(&[
                PoolClass { buf_bytes: 4096, buffers: 1 },
                PoolClass { buf_bytes: 4096, buffers: 2 }
            ]),
            Err(PoolError::DuplicateClass(4096))
        ));
        assert!(matches!(
            BufferPool::with_classes(&[PoolClass { buf_bytes: usize::MAX / 2, buffers: 4 }]),
            Err(PoolError::TooLarge { .. })
        ));
    }
}
