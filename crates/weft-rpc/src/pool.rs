//! A bounded pool of equal-sized, pre-faulted payload buffers (the PVFS report's buffer zones, minus the
//! registration that a one-sided fabric will add). Buffers are allocated on first use, touched page by page once
//! (first touch of memory is slow on this class of machine, so it is paid outside the data path) and reused.
//! When every buffer is out, [`BufferPool::acquire`] waits: that wait is the server's back-pressure.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    buf_bytes: usize,
    free: Mutex<Vec<Vec<u8>>>,
    permits: Arc<Semaphore>,
}

/// A buffer on loan from a [`BufferPool`]; it returns on drop. `len()` is the part in use.
pub struct PoolBuf {
    buf: Vec<u8>,
    len: usize,
    pool: Arc<PoolInner>,
    _permit: OwnedSemaphorePermit,
}

impl BufferPool {
    pub fn new(buf_bytes: usize, buffers: u32) -> BufferPool {
        assert!(buf_bytes > 0 && buffers > 0, "an empty buffer pool would deadlock its users");
        BufferPool {
            inner: Arc::new(PoolInner {
                buf_bytes,
                free: Mutex::new(Vec::with_capacity(buffers as usize)),
                permits: Arc::new(Semaphore::new(buffers as usize)),
            }),
        }
    }

    pub fn buf_bytes(&self) -> usize {
        self.inner.buf_bytes
    }

    /// Borrows a buffer with `len` bytes in use; waits while all buffers are out.
    pub async fn acquire(&self, len: usize) -> PoolBuf {
        assert!(len <= self.inner.buf_bytes, "request for {len} bytes from a pool of {}", self.inner.buf_bytes);
        let permit = self.inner.permits.clone().acquire_owned().await.expect("pool semaphore is never closed");
        let buf = self.inner.free.lock().expect("pool lock").pop().unwrap_or_else(|| {
            // Pre-fault: write every page now rather than on the data path. `vec![0; n]` would be calloc, whose
            // pages stay unmapped until first touch, which is exactly the cost this avoids.
            #[allow(clippy::slow_vector_initialization)]
            let v = {
                let mut v = Vec::with_capacity(self.inner.buf_bytes);
                v.resize(self.inner.buf_bytes, 0u8);
                v
            };
            v
        });
        PoolBuf { buf, len, pool: self.inner.clone(), _permit: permit }
    }

    /// Buffers currently free (not on loan).
    pub fn available(&self) -> usize {
        self.inner.permits.available_permits()
    }
}

impl PoolBuf {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if let Ok(mut free) = self.pool.free.lock() {
            free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
