//! A few large buffers kept for reuse on the ec write path (parity of whole rows): a fresh buffer of a megabyte
//! costs a page fault and a page clearing per 4 KiB the first time it is written, which a profile of ec writes put
//! at 10–15 % of their time (docs/bench.md). Bounded: at most [`RECYCLED_MAX`] buffers of at most
//! [`RECYCLED_BYTES_MAX`] each are kept per client; a buffer still referenced elsewhere is not taken back.

use std::sync::Mutex;

use bytes::{Bytes, BytesMut};

/// Most buffers kept.
const RECYCLED_MAX: usize = 16;
/// Largest buffer kept.
const RECYCLED_BYTES_MAX: usize = 16 << 20;

#[derive(Default)]
pub(crate) struct Recycled {
    free: Mutex<Vec<BytesMut>>,
}

impl Recycled {
    /// A buffer of `len` bytes whose contents the caller overwrites whole: a kept one when one is at least that
    /// long and at most twice it (its old bytes stay until overwritten: initialized memory, never uninit), else a
    /// fresh zeroed one.
    pub(crate) fn take(&self, len: usize) -> BytesMut {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        match free.iter().position(|b| b.len() >= len && b.len() <= len.saturating_mul(2)) {
            Some(i) => {
                let mut b = free.swap_remove(i);
                b.truncate(len);
                b
            }
            None => BytesMut::zeroed(len),
        }
    }

    /// Takes `b` back if nothing else references it and there is room.
    pub(crate) fn give(&self, b: Bytes) {
        if b.len() > RECYCLED_BYTES_MAX || b.is_empty() {
            return;
        }
        let Ok(b) = b.try_into_mut() else { return };
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < RECYCLED_MAX {
            free.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_only_when_unreferenced_and_fit() {
        let r = Recycled::default();
        let a = r.take(1000).freeze();
        let ptr = a.as_ptr();
        let slice = a.slice(0..10);
        r.give(a);
        assert_ne!(r.take(1000).as_ptr(), ptr, "a buffer still sliced elsewhere is not kept");
        drop(slice);
        let b = r.take(1000).freeze();
        let ptr = b.as_ptr();
        r.give(b);
        assert_eq!(r.take(3000).len(), 3000, "too small: a fresh one");
        let c = r.take(600);
        assert_eq!((c.as_ptr(), c.len()), (ptr, 600), "kept and cut to the length asked");
        assert_eq!(r.take(600).len(), 600);
    }
}
