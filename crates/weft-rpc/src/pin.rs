//! The pin-down cache: client memory registered with one server connection, so the server can move a call's
//! payload straight from or to the caller's buffers (RPC Read-Write, dissertation ch. 6).
//!
//! [`RegCache`] keeps the registrations of one server connection, at most `registrations_max`, least recently used
//! first out. Registrations cover aligned windows (`registration_window_bytes`) so neighbouring buffers share one.
//! Entries in use by a call in flight are never evicted; evicted ids are deregistered in the next registration
//! batch (one `Regions` op adds and removes). A new connection starts with an empty cache; a call whose
//! registrations belong to a connection that ended registers again and retries. On a fabric whose registration
//! pins pages (`rdma`), an entry covers exactly the pages of a call and is dropped (deregistered locally at once, at
//! the server in the next batch) when its last call ends: a cached registration would outlive the caller's buffer
//! and keep pointing at its old pages.
//!
//! This module is the cache alone (no I/O): [`crate::RpcClient::call_with_chunks`] registers the misses and sends
//! the batch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use weft_proto::{Chunk, Region};

/// Attempts at registering and sending when connections keep changing underneath.
pub(crate) const REGISTER_ATTEMPTS: u32 = 3;

/// Buffers a call hands to the server by registration: the server may read them (and, for a request that asks it
/// to, write them) until the call returns.
///
/// The call takes them by value and gives them back, so their memory stays alive and in place while the server
/// may touch it. Sealed: only owned byte buffers whose memory does not move while they are held qualify. `Bytes`
/// buffers may be shared, so they are for requests whose chunks the server only reads.
pub trait ChunkBuffers: sealed::Sealed + Send {
    /// (address, length) of every buffer, in order: one chunk each.
    fn spans(&self) -> Vec<(u64, u64)>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for Vec<bytes::BytesMut> {}
    impl Sealed for Vec<bytes::Bytes> {}
}

impl ChunkBuffers for Vec<BytesMut> {
    fn spans(&self) -> Vec<(u64, u64)> {
        self.iter().map(|d| (d.as_ptr() as u64, d.len() as u64)).collect()
    }
}

impl ChunkBuffers for Vec<Bytes> {
    fn spans(&self) -> Vec<(u64, u64)> {
        self.iter().map(|d| (d.as_ptr() as u64, d.len() as u64)).collect()
    }
}

struct RegEntry {
    id: u32,
    addr: u64,
    len: u64,
    last_use: u64,
    users: u32,
    /// The server acknowledged it.
    ready: bool,
    /// The fabric's local registration (an `rdma` memory region); deregistered when the entry is dropped.
    _local: Option<weft_fabric::LocalRegistration>,
    /// Dropped as soon as no call uses it (the fabric pins pages: see `Capabilities::pins_pages`).
    transient: bool,
}

/// Registrations held by every cache of this process (the metrics' `weft_rpc_client_registrations`): counted up
/// where an entry is made, down when it is dropped.
static HELD: AtomicUsize = AtomicUsize::new(0);

impl Drop for RegEntry {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Registrations held by all pin-down caches of this process.
pub(crate) fn registrations_held() -> usize {
    HELD.load(Ordering::Relaxed)
}

pub(crate) struct RegCache {
    conn_id: u64,
    entries: Vec<RegEntry>,
    max: usize,
    next_id: u32,
    tick: u64,
    /// Evicted, not yet deregistered.
    remove: Vec<u32>,
}

/// A registration batch to send to the server before the call (`Regions`): new regions and evicted ids.
pub(crate) struct Batch {
    pub add: Vec<Region>,
    pub remove: Vec<u32>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }
}

impl RegCache {
    pub(crate) fn new(max: usize) -> RegCache {
        RegCache { conn_id: 0, entries: Vec::new(), max: max.max(1), next_id: 1, tick: 0, remove: Vec::new() }
    }

    fn reset_for(&mut self, conn_id: u64) {
        if self.conn_id != conn_id {
            self.conn_id = conn_id;
            self.entries.clear();
            self.remove.clear();
        }
    }

    fn find(&mut self, addr: u64, len: u64, ready_only: bool) -> Option<usize> {
        self.entries.iter().position(|e| (e.ready || !ready_only) && e.addr <= addr && addr + len <= e.addr + e.len)
    }

    /// Registrations in the cache (for tests and stats).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Marks entries `idx` in use by one more call; returns (region id, region base) per entry.
    fn hold(&mut self, idx: &[usize]) -> Vec<(u32, u64)> {
        self.tick += 1;
        let tick = self.tick;
        idx.iter()
            .map(|&i| {
                let e = &mut self.entries[i];
                e.users += 1;
                e.last_use = tick;
                (e.id, e.addr)
            })
            .collect()
    }

    /// The fast path: holds the registrations of `spans` on connection `conn_id` if every span lies in one the
    /// server has acknowledged.
    pub(crate) fn hold_registered(cache: &Arc<Mutex<RegCache>>, conn_id: u64, spans: &[(u64, u64)]) -> Option<Pinned> {
        let mut c = cache.lock().expect("registration cache");
        c.reset_for(conn_id);
        // A span in a registration the server has not acknowledged yet goes the slow path.
        let idx: Option<Vec<usize>> = spans.iter().map(|&(a, l)| c.find(a, l, true)).collect();
        let regions = c.hold(&idx?);
        Some(Pinned { cache: cache.clone(), conn_id, regions })
    }

    /// The slow path: holds the registrations of `spans` on connection `conn_id`, adding an entry for every span no
    /// entry covers (a `window`-aligned one, registered locally through `register_local(addr, len)`), and evicts
    /// the least recently used idle entries beyond the bound. Returns the hold and the batch the server must get
    /// before the call; the caller reports the batch's fate with [`RegCache::acknowledge`] or [`RegCache::forget`].
    pub(crate) fn hold_or_add(
        cache: &Arc<Mutex<RegCache>>,
        conn_id: u64,
        spans: &[(u64, u64)],
        window: u64,
        transient: bool,
        mut register_local: impl FnMut(u64, u64) -> std::io::Result<Option<weft_fabric::LocalRegistration>>,
    ) -> std::io::Result<(Pinned, Batch)> {
        let mut c = cache.lock().expect("registration cache");
        c.reset_for(conn_id);
        let mut add = Vec::new();
        let mut idx = Vec::with_capacity(spans.len());
        for &(a, l) in spans {
            let i = match c.find(a, l, false) {
                Some(i) => i,
                None => {
                    let start = a - a % window;
                    let end = (a + l).div_ceil(window).saturating_mul(window).max(a + l);
                    let id = c.next_id;
                    c.next_id = c.next_id.checked_add(1).unwrap_or(1).max(1);
                    let local = match register_local(start, end - start) {
                        Ok(l) => l,
                        Err(e) => {
                            // Forget this batch's new entries: none of them reached the server.
                            let added: Vec<u32> = add.iter().map(|r: &Region| r.id).collect();
                            c.entries.retain(|e| !added.contains(&e.id));
                            return Err(e);
                        }
                    };
                    let rkey = local.as_ref().map_or(0, |l| l.rkey);
                    HELD.fetch_add(1, Ordering::Relaxed);
                    c.entries.push(RegEntry {
                        id,
                        addr: start,
                        len: end - start,
                        last_use: 0,
                        users: 0,
                        ready: false,
                        _local: local,
                        transient,
                    });
                    add.push(Region { id, addr: start, len: end - start, rkey });
                    c.entries.len() - 1
                }
            };
            idx.push(i);
        }
        let regions = c.hold(&idx);
        // Evict the least recently used idle registrations beyond the bound.
        while c.entries.len() > c.max {
            let Some(victim) = c
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.users == 0)
                .min_by_key(|(_, e)| e.last_use)
                .map(|(i, _)| i)
            else {
                break;
            };
            let e = c.entries.swap_remove(victim);
            if e.ready {
                c.remove.push(e.id);
            }
        }
        let remove = std::mem::take(&mut c.remove);
        Ok((Pinned { cache: cache.clone(), conn_id, regions }, Batch { add, remove }))
    }

    /// The server took the batch that added `added`.
    pub(crate) fn acknowledge(&mut self, added: &[u32]) {
        for e in self.entries.iter_mut().filter(|e| added.contains(&e.id)) {
            e.ready = true;
        }
    }

    /// The batch that added `added` failed: those entries never reached the server.
    pub(crate) fn forget(&mut self, added: &[u32]) {
        self.entries.retain(|e| !added.contains(&e.id));
    }
}

/// Registrations held by one call; released (not deregistered) on drop.
pub(crate) struct Pinned {
    cache: Arc<Mutex<RegCache>>,
    /// The connection the registrations belong to: the call may only go out on it.
    pub conn_id: u64,
    /// (region id, region base address) per span, in order.
    regions: Vec<(u32, u64)>,
}

impl Pinned {
    /// One chunk per span, naming the held region that covers it.
    pub(crate) fn chunks(&self, spans: &[(u64, u64)]) -> Vec<Chunk> {
        spans
            .iter()
            .zip(&self.regions)
            .map(|(&(a, l), &(region, base))| Chunk { region, offset: a - base, len: l as u32 })
            .collect()
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let mut c = self.cache.lock().expect("registration cache");
        if c.conn_id != self.conn_id {
            return;
        }
        for (id, _) in &self.regions {
            if let Some(i) = c.entries.iter().position(|e| e.id == *id) {
                let e = &mut c.entries[i];
                e.users = e.users.saturating_sub(1);
                if e.transient && e.users == 0 {
                    let e = c.entries.swap_remove(i);
                    if e.ready {
                        c.remove.push(e.id);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: u64 = 1 << 20;

    fn cache(max: usize) -> Arc<Mutex<RegCache>> {
        Arc::new(Mutex::new(RegCache::new(max)))
    }

    /// Registers locally without a fabric (the `shm` case: nothing to pin).
    fn no_local(_: u64, _: u64) -> std::io::Result<Option<weft_fabric::LocalRegistration>> {
        Ok(None)
    }

    /// Holds `spans` on `conn` through the slow path and acknowledges the batch; returns the hold and the batch.
    fn pin_acked(c: &Arc<Mutex<RegCache>>, conn: u64, spans: &[(u64, u64)], transient: bool) -> (Pinned, Batch) {
        let (p, batch) = RegCache::hold_or_add(c, conn, spans, WINDOW, transient, no_local).unwrap();
        let added: Vec<u32> = batch.add.iter().map(|r| r.id).collect();
        c.lock().unwrap().acknowledge(&added);
        (p, batch)
    }

    #[test]
    fn neighbouring_spans_share_one_window_and_only_acknowledged_ones_take_the_fast_path() {
        let c = cache(8);
        let spans = [(WINDOW + 100, 300), (WINDOW + 4096, 100)];
        let (p, batch) = RegCache::hold_or_add(&c, 1, &spans, WINDOW, false, no_local).unwrap();
        assert_eq!(batch.add.len(), 1, "one window covers both");
        assert_eq!((batch.add[0].addr, batch.add[0].len), (WINDOW, WINDOW));
        let chunks = p.chunks(&spans);
        assert_eq!((chunks[0].offset, chunks[0].len), (100, 300));
        assert_eq!((chunks[1].offset, chunks[1].len), (4096, 100));
        assert!(RegCache::hold_registered(&c, 1, &spans).is_none(), "not acknowledged yet");
        c.lock().unwrap().acknowledge(&[batch.add[0].id]);
        assert!(RegCache::hold_registered(&c, 1, &spans).is_some());
        assert!(RegCache::hold_registered(&c, 1, &[(3 * WINDOW, 10)]).is_none(), "outside every registration");
    }

    #[test]
    fn a_new_connection_starts_with_an_empty_cache() {
        let c = cache(8);
        let (p, _) = pin_acked(&c, 1, &[(WINDOW, 10)], false);
        drop(p);
        assert!(RegCache::hold_registered(&c, 2, &[(WINDOW, 10)]).is_none());
        assert_eq!(c.lock().unwrap().len(), 0);
        let (_, batch) = RegCache::hold_or_add(&c, 2, &[(WINDOW, 10)], WINDOW, false, no_local).unwrap();
        assert!(batch.remove.is_empty(), "the old connection's ids are not deregistered on the new one");
    }

    #[test]
    fn the_least_recently_used_idle_entry_is_evicted_and_deregistered_in_the_next_batch() {
        let c = cache(2);
        let (a, ba) = pin_acked(&c, 1, &[(WINDOW, 10)], false);
        let (b, _) = pin_acked(&c, 1, &[(2 * WINDOW, 10)], false);
        drop(a);
        // `b` is in use: the third registration evicts `a`, the idle one.
        let (c3, bc) = pin_acked(&c, 1, &[(3 * WINDOW, 10)], false);
        assert_eq!(bc.remove, vec![ba.add[0].id]);
        assert_eq!(c.lock().unwrap().len(), 2);
        // Nothing idle: the bound is exceeded rather than a registration in use evicted.
        let (_, bd) = pin_acked(&c, 1, &[(4 * WINDOW, 10)], false);
        assert!(bd.remove.is_empty());
        assert_eq!(c.lock().unwrap().len(), 3);
        drop((b, c3));
    }

    #[test]
    fn a_transient_entry_goes_when_its_last_call_ends() {
        let c = cache(8);
        let (p1, batch) = pin_acked(&c, 1, &[(WINDOW, 10)], true);
        let p2 = RegCache::hold_registered(&c, 1, &[(WINDOW, 10)]).unwrap();
        drop(p1);
        assert_eq!(c.lock().unwrap().len(), 1, "still used by the second call");
        drop(p2);
        assert_eq!(c.lock().unwrap().len(), 0);
        let (_, next) = RegCache::hold_or_add(&c, 1, &[(5 * WINDOW, 10)], WINDOW, true, no_local).unwrap();
        assert_eq!(next.remove, vec![batch.add[0].id], "deregistered at the server in the next batch");
    }

    #[test]
    fn a_failed_local_registration_forgets_the_whole_batch() {
        let c = cache(8);
        let mut calls = 0;
        let r = RegCache::hold_or_add(&c, 1, &[(WINDOW, 10), (3 * WINDOW, 10)], WINDOW, false, |_, _| {
            calls += 1;
            if calls == 2 { Err(std::io::Error::other("no memory region")) } else { Ok(None) }
        });
        assert!(r.is_err());
        assert_eq!(c.lock().unwrap().len(), 0);
    }

    #[test]
    fn a_batch_the_server_refused_is_forgotten() {
        let c = cache(8);
        let (p, batch) = RegCache::hold_or_add(&c, 1, &[(WINDOW, 10)], WINDOW, false, no_local).unwrap();
        c.lock().unwrap().forget(&[batch.add[0].id]);
        drop(p);
        assert_eq!(c.lock().unwrap().len(), 0);
        assert!(RegCache::hold_registered(&c, 1, &[(WINDOW, 10)]).is_none());
    }
}
