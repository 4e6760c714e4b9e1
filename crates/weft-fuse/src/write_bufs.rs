//! A bounded pool of reusable buffers for FUSE writes.
//!
//! fuser lends the kernel's write data only for the duration of the `write` call, while the striped write
//! outlives it, so the data is copied once (ARCHITECTURE.md's copy table). Copying it into a fresh allocation
//! every time would also give the client a fresh address every time: over a one-sided fabric a write larger than
//! the arena class is sent from the caller's buffer, which must be registered with the data server, and a new
//! address misses the pin-down cache and costs a `Regions` round trip. Buffers from this pool keep their
//! addresses (a `Vec` refilled within its capacity never moves), so after warm-up every write hits the cache.
//!
//! Bounded: at most `idle_max` buffers wait in the pool. When more writes are in flight than that, the extra
//! buffers are plain allocations, freed (not pooled) when their write ends.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Reusable write buffers, each of `buf_bytes` capacity.
#[derive(Clone)]
pub struct WriteBufs {
    inner: Arc<Pool>,
}

struct Pool {
    idle: Mutex<Vec<Vec<u8>>>,
    idle_max: usize,
    buf_bytes: usize,
}

/// The owner behind a pooled [`Bytes`]: goes back to the pool when the last clone of the `Bytes` is dropped.
struct Loan {
    buf: Vec<u8>,
    pool: Arc<Pool>,
}

impl AsRef<[u8]> for Loan {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.capacity() != self.pool.buf_bytes {
            return;
        }
        if let Ok(mut idle) = self.pool.idle.lock()
            && idle.len() < self.pool.idle_max
        {
            idle.push(buf);
        }
    }
}

impl WriteBufs {
    /// A pool keeping up to `idle_max` buffers of `buf_bytes` (the mount's largest write).
    pub fn new(buf_bytes: usize, idle_max: usize) -> WriteBufs {
        WriteBufs { inner: Arc::new(Pool { idle: Mutex::new(Vec::new()), idle_max, buf_bytes: buf_bytes.max(1) }) }
    }

    /// `data` copied into a pooled buffer (into a plain one if it is larger than the pool's buffers).
    pub fn copy_of(&self, data: &[u8]) -> Bytes {
        if data.len() > self.inner.buf_bytes {
            return Bytes::copy_from_slice(data);
        }
        let mut buf = self.inner.idle.lock().expect("write buffers").pop().unwrap_or_default();
        if buf.capacity() != self.inner.buf_bytes {
            buf = Vec::with_capacity(self.inner.buf_bytes);
        }
        buf.clear();
        buf.extend_from_slice(data);
        Bytes::from_owner(Loan { buf, pool: self.inner.clone() })
    }

    /// Buffers waiting in the pool.
    pub fn idle(&self) -> usize {
        self.inner.idle.lock().expect("write buffers").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_buffer_is_reused_at_the_same_address() {
        let pool = WriteBufs::new(1 << 20, 4);
        let a = pool.copy_of(&[1u8; 300_000]);
        let addr = a.as_ptr();
        assert_eq!(&a[..], &[1u8; 300_000][..]);
        drop(a);
        assert_eq!(pool.idle(), 1);
        let b = pool.copy_of(&[2u8; 700_000]);
        // The registration a one-sided fabric made for the first write covers the second.
        assert_eq!(b.as_ptr(), addr);
        assert_eq!(b.len(), 700_000);
        assert!(b.iter().all(|&x| x == 2));
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn clones_keep_the_buffer_until_the_last_is_dropped() {
        let pool = WriteBufs::new(4096, 4);
        let a = pool.copy_of(b"hello");
        let s = a.slice(1..3);
        drop(a);
        assert_eq!(pool.idle(), 0);
        assert_eq!(&s[..], b"el");
        drop(s);
        assert_eq!(pool.idle(), 1);
    }

    #[test]
    fn the_pool_is_bounded_and_oversized_writes_are_not_pooled() {
        let pool = WriteBufs::new(4096, 2);
        let loans: Vec<Bytes> = (0..5).map(|i| pool.copy_of(&[i as u8; 100])).collect();
        drop(loans);
        assert_eq!(pool.idle(), 2);
        let big = pool.copy_of(&[0u8; 8192]);
        assert_eq!(big.len(), 8192);
        drop(big);
        assert_eq!(pool.idle(), 2);
    }
}
