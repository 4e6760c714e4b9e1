//! Bulk reads and writes of object ranges, choosing the transfer by size class and fabric (RPC Read-Write,
//! dissertation ch. 6):
//!
//! - two-sided fabric, or at most `inline_bytes_max`: `Read`/`Write` with the data inline in the message;
//! - one-sided, at most `buffered_bytes_max`: an arena buffer is the chunk; the client copies once into or out of
//!   it, the server copies out of or into it;
//! - one-sided, larger: the caller's own buffers are the chunks (registered through the pin-down cache below);
//!   the server `put`s a read's data into them before replying and `get`s a write's data at its own pace.
//!
//! The pin-down cache ([`RegCache`]) keeps the registrations of one server connection, at most
//! `registrations_max`, least recently used first out. Registrations cover aligned windows
//! (`registration_window_bytes`) so neighbouring buffers share one. Entries in use by a call in flight are never
//! evicted; evicted ids are deregistered in the next registration batch (one `Regions` op adds and removes).
//! A new connection starts with an empty cache; a call whose registrations belong to a connection that ended
//! registers again and retries. On a fabric whose registration pins pages (`rdma`), an entry covers exactly the
//! pages of a call and is dropped (deregistered locally at once, at the server in the next batch) when its last
//! call ends: a cached registration would outlive the caller's buffer and keep pointing at its old pages.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use weft_fabric::Fabric;
use weft_proto::msg::{ReadChunksReq, ReadReq, RegionsReq, WriteChunksReq, WriteReq};
use weft_proto::{Chunk, Region, Request, Response};

use crate::client::{RpcClient, control};
use crate::error::RpcError;

/// Attempts at registering and sending when connections keep changing underneath.
const REGISTER_ATTEMPTS: u32 = 3;

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

pub struct RegCache {
    conn_id: u64,
    entries: Vec<RegEntry>,
    max: usize,
    next_id: u32,
    tick: u64,
    /// Evicted, not yet deregistered.
    remove: Vec<u32>,
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
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Registrations held by one call; released (not deregistered) on drop.
struct Pinned {
    cache: Arc<Mutex<RegCache>>,
    conn_id: u64,
    /// (region id, region base address) per span, in order.
    regions: Vec<(u32, u64)>,
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

impl<F: Fabric> RpcClient<F> {
    /// Reads `sum(dest lengths)` bytes of object `ino` at `offset` into `dest`, by the size class's method.
    pub async fn read_object(&self, ino: u64, offset: u64, dest: Vec<BytesMut>) -> Result<Vec<BytesMut>, RpcError> {
        let len: usize = dest.iter().map(|d| d.len()).sum();
        let classes = self.inner.cfg.classes;
        let arena = if len > classes.inline_bytes_max { self.arena() } else { None };
        let Some(arena) = arena else {
            let req = Request::Read(ReadReq { ino, offset, len: len as u32 });
            return self.call(req, Vec::new(), dest).await.map(|(_, d)| d);
        };
        if len <= classes.buffered_bytes_max.min(arena.buf_bytes()) {
            let buf = arena.acquire(len).await;
            let req = Request::ReadChunks(ReadChunksReq { ino, offset, chunks: vec![buf.chunk(0, len)] });
            self.call(req, Vec::new(), Vec::new()).await?;
            let mut dest = dest;
            let mut at = 0;
            for d in dest.iter_mut() {
                let n = d.len();
                buf.copy_out(at, &mut d[..]);
                at += n;
            }
            return Ok(dest);
        }
        let spans: Vec<(u64, u64)> = dest.iter().map(|d| (d.as_ptr() as u64, d.len() as u64)).collect();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let pinned = self.pin(&spans).await?;
            let req = Request::ReadChunks(ReadChunksReq { ino, offset, chunks: chunks_of(&spans, &pinned) });
            // `dest` stays owned here, so its memory stays put while the server writes it.
            match self.call_on(req, Vec::new(), Vec::new(), Some(pinned.conn_id)).await {
                Ok(_) => return Ok(dest),
                Err(RpcError::RegionsLost { .. }) if attempt < REGISTER_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes the concatenation of `data` at `offset` of object `ino`; returns the bytes written.
    pub async fn write_object(&self, ino: u64, offset: u64, data: Vec<Bytes>) -> Result<u32, RpcError> {
        let len: usize = data.iter().map(|d| d.len()).sum();
        let classes = self.inner.cfg.classes;
        let arena = if len > classes.inline_bytes_max { self.arena() } else { None };
        let written = |r: Response| match r {
            Response::Write(n) | Response::WriteChunks(n) => Ok(n),
            other => Err(RpcError::Protocol {
                addr: self.inner.addr.clone(),
                source: weft_proto::FrameError::BadBody { op: other.op() as u16, reason: "not a write reply".into() },
            }),
        };
        let Some(arena) = arena else {
            let req = Request::Write(WriteReq { ino, offset });
            return written(self.call(req, data, Vec::new()).await?.0);
        };
        if len <= classes.buffered_bytes_max.min(arena.buf_bytes()) {
            let mut buf = arena.acquire(len).await;
            let mut at = 0;
            for d in &data {
                buf.copy_in(at, d);
                at += d.len();
            }
            let req = Request::WriteChunks(WriteChunksReq { ino, offset, chunks: vec![buf.chunk(0, len)] });
            return written(self.call(req, Vec::new(), Vec::new()).await?.0);
        }
        let spans: Vec<(u64, u64)> = data.iter().map(|d| (d.as_ptr() as u64, d.len() as u64)).collect();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let pinned = self.pin(&spans).await?;
            let req = Request::WriteChunks(WriteChunksReq { ino, offset, chunks: chunks_of(&spans, &pinned) });
            match self.call_on(req, Vec::new(), Vec::new(), Some(pinned.conn_id)).await {
                Ok((r, _)) => return written(r),
                Err(RpcError::RegionsLost { .. }) if attempt < REGISTER_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Registrations in this client's pin-down cache (current connection).
    pub fn registrations(&self) -> usize {
        self.inner.regs.lock().expect("registration cache").len()
    }

    /// Makes sure every span lies in a region registered on the current connection, and holds those regions.
    async fn pin(&self, spans: &[(u64, u64)]) -> Result<Pinned, RpcError> {
        let inner = &*self.inner;
        let conn = self.conn().await.map_err(|source| RpcError::Connect { addr: inner.addr.clone(), source })?;
        let hold = |c: &mut RegCache, idx: &[usize]| -> Vec<(u32, u64)> {
            c.tick += 1;
            let tick = c.tick;
            idx.iter()
                .map(|&i| {
                    let e = &mut c.entries[i];
                    e.users += 1;
                    e.last_use = tick;
                    (e.id, e.addr)
                })
                .collect()
        };
        // Fast path: everything already registered and acknowledged.
        {
            let mut c = inner.regs.lock().expect("registration cache");
            c.reset_for(conn.id);
            let idx: Option<Vec<usize>> = spans.iter().map(|&(a, l)| c.find(a, l, true)).collect();
            if let Some(idx) = idx {
                let regions = hold(&mut c, &idx);
                return Ok(Pinned { cache: inner.regs.clone(), conn_id: conn.id, regions });
            }
        }
        // Misses are registered one batch at a time.
        let _serial = inner.reg_lock.lock().await;
        // A fabric that pins pages registers exactly the pages of the call, and only for the call.
        let transient = self.capabilities().pins_pages;
        let window = if transient { 4096 } else { inner.cfg.classes.registration_window_bytes.max(4096) };
        let (regions, add, remove) = {
            let mut c = inner.regs.lock().expect("registration cache");
            c.reset_for(conn.id);
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
                        let local = match inner.fabric.register_local(&inner.addr, start, end - start) {
                            Ok(l) => l,
                            Err(source) => {
                                // Forget this batch's new entries: none of them reached the server.
                                let added: Vec<u32> = add.iter().map(|r: &Region| r.id).collect();
                                c.entries.retain(|e| !added.contains(&e.id));
                                return Err(RpcError::Connect { addr: inner.addr.clone(), source });
                            }
                        };
                        let rkey = local.as_ref().map_or(0, |l| l.rkey);
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
            let regions = hold(&mut c, &idx);
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
            (regions, add, remove)
        };
        let pinned = Pinned { cache: inner.regs.clone(), conn_id: conn.id, regions };
        if !add.is_empty() || !remove.is_empty() {
            let sid = self.session_id();
            let added: Vec<u32> = add.iter().map(|r| r.id).collect();
            let r = control(&conn, &inner.addr, &inner.cfg, sid, Request::Regions(RegionsReq { add, remove })).await;
            let mut c = inner.regs.lock().expect("registration cache");
            match r {
                Ok(_) => {
                    for e in c.entries.iter_mut().filter(|e| added.contains(&e.id)) {
                        e.ready = true;
                    }
                }
                Err(e) => {
                    c.entries.retain(|e| !added.contains(&e.id));
                    return Err(e);
                }
            }
        }
        Ok(pinned)
    }
}

fn chunks_of(spans: &[(u64, u64)], pinned: &Pinned) -> Vec<Chunk> {
    spans
        .iter()
        .zip(&pinned.regions)
        .map(|(&(a, l), &(region, base))| Chunk { region, offset: a - base, len: l as u32 })
        .collect()
}
