//! Decoded stripe rows of one open ec file, kept for the degraded reads that follow (issue 32): a read with a
//! data chunk lost decodes whole rows (`k × unit`, 4 MiB for `ec 4+2` at the default unit), so without this a
//! sequential reader of 1 MiB records decoded every row four times, and one of 128 KiB records 32 times.
//!
//! - Rows are decoded once however many readers want them at the same moment: the first marks them *loading*;
//!   the others wait for it ([`Claim`]), and load them themselves if it failed.
//! - Bounded: at most [`ROWS_MAX`] rows, the oldest dropped first.
//! - Any write or truncate through the file clears it ([`RowCache::invalidate`]) and moves its epoch, so a decode
//!   that began before is not kept. Rows another client changes are seen at the next open (close-to-open).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;

use bytes::Bytes;

/// Most decoded rows one open file keeps.
pub(crate) const ROWS_MAX: usize = 16;

#[derive(Default)]
struct State {
    rows: BTreeMap<u64, Bytes>,
    order: VecDeque<u64>,
    loading: BTreeSet<u64>,
    epoch: u64,
}

#[derive(Default)]
pub(crate) struct RowCache {
    state: Mutex<State>,
    changed: tokio::sync::Notify,
}

/// What a reader of rows `[first, end)` got from [`RowCache::claim`].
pub(crate) struct Claim {
    /// Runs of rows `(first, count)` this reader decodes (then [`RowCache::put`] or [`RowCache::failed`]).
    pub(crate) load: Vec<(u64, u64)>,
    /// The epoch to hand to [`RowCache::put`].
    pub(crate) epoch: u64,
}

impl RowCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Clears every row: the file's bytes changed through this handle.
    pub(crate) fn invalidate(&self) {
        let mut s = self.lock();
        s.epoch += 1;
        s.rows.clear();
        s.order.clear();
    }

    /// Rows of `[first, end)` neither kept nor loading are marked loading by this reader and returned to decode.
    pub(crate) fn claim(&self, first: u64, end: u64) -> Claim {
        let mut s = self.lock();
        let mut load: Vec<(u64, u64)> = Vec::new();
        for r in first..end {
            if s.rows.contains_key(&r) || s.loading.contains(&r) {
                continue;
            }
            s.loading.insert(r);
            match load.last_mut() {
                Some((a, n)) if *a + *n == r => *n += 1,
                _ => load.push((r, 1)),
            }
        }
        Claim { load, epoch: s.epoch }
    }

    /// Keeps decoded rows `first..` (`row_bytes` each, back to back in `bytes`) unless the file changed since the
    /// claim's `epoch`; they stop loading either way.
    pub(crate) fn put(&self, first: u64, bytes: &Bytes, row_bytes: usize, epoch: u64) {
        assert!(row_bytes > 0 && bytes.len().is_multiple_of(row_bytes), "whole rows");
        let mut s = self.lock();
        for (r, i) in (first..).zip(0..bytes.len() / row_bytes) {
            s.loading.remove(&r);
            if s.epoch == epoch && s.rows.insert(r, bytes.slice(i * row_bytes..(i + 1) * row_bytes)).is_none() {
                s.order.push_back(r);
            }
        }
        while s.order.len() > ROWS_MAX {
            let old = s.order.pop_front().expect("non-empty");
            s.rows.remove(&old);
        }
        drop(s);
        self.changed.notify_waiters();
    }

    /// This reader's decode of rows `first..first + count` failed: others waiting for them load them themselves.
    pub(crate) fn failed(&self, first: u64, count: u64) {
        let mut s = self.lock();
        (first..first + count).for_each(|r| {
            s.loading.remove(&r);
        });
        drop(s);
        self.changed.notify_waiters();
    }

    /// The kept rows `want`, if all are kept; else `None`, once none of the missing ones is loading any more (the
    /// caller claims again).
    pub(crate) async fn wait(&self, want: &[u64]) -> Option<Vec<Bytes>> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let s = self.lock();
                let missing: Vec<u64> = want.iter().copied().filter(|r| !s.rows.contains_key(r)).collect();
                if missing.is_empty() {
                    return Some(want.iter().map(|r| s.rows[r].clone()).collect());
                }
                if !missing.iter().any(|r| s.loading.contains(r)) {
                    return None;
                }
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_reader_waits_for_rows_being_loaded_and_a_write_drops_them() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let c = RowCache::default();
            let a = c.claim(0, 3);
            assert_eq!(a.load, vec![(0, 3)]);
            assert!(c.claim(1, 4).load == vec![(3, 1)], "only row 3 is neither kept nor loading");
            c.failed(3, 1);
            c.put(0, &Bytes::from_static(b"aabbcc"), 2, a.epoch);
            assert_eq!(c.wait(&[0, 1, 2]).await.unwrap(), vec![Bytes::from_static(b"aa"), "bb".into(), "cc".into()]);
            assert!(c.wait(&[2, 3]).await.is_none(), "row 3 failed: claim it again");
            // A write between a claim and its put: the decoded rows are not kept.
            let b = c.claim(3, 4);
            c.invalidate();
            c.put(3, &Bytes::from_static(b"dd"), 2, b.epoch);
            assert!(c.wait(&[0]).await.is_none());
            assert!(c.wait(&[3]).await.is_none());
        });
    }

    #[test]
    fn it_keeps_at_most_its_bound_oldest_first_out() {
        let c = RowCache::default();
        for r in 0..ROWS_MAX as u64 + 3 {
            let cl = c.claim(r, r + 1);
            c.put(r, &Bytes::from_static(b"x"), 1, cl.epoch);
        }
        let s = c.lock();
        assert_eq!(s.rows.len(), ROWS_MAX);
        assert_eq!(*s.rows.keys().next().unwrap(), 3);
    }
}
