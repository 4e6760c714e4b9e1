//! The RPC-over-RDMA version 1 listener (docs/format.md §25), for the gateway (`--rdma-listen`) and for a pNFS
//! data server (`nfs_rdma_listen`): RDMA CM on the listen address, one thread per connection driving its queue
//! pair, each call handed to a [`RecordHandler`] (the gateway's [`Gateway::handle_record`], the data server's
//! [`crate::ds::DsNfs::handle`]) on the tokio runtime exactly as a TCP one.
//!
//! Per connection everything is registered once at accept (no registration on the data path): `credits` receive
//! buffers of the inline size, one send buffer, a bounded pool of call-record buffers (a read chunk is RDMA READ
//! straight to its place in one; the record handed to the handler borrows it until dropped, and a connection
//! whose pool is empty waits: back-pressure), and one staging buffer for RDMA WRITEs. Calls of one connection
//! run one at a time, so at most `credits` received messages wait (in the posted receives).
//!
//! A reply's tail (a READ's data) that lies in a server buffer zone ([`weft_fabric::zones`], the data server's
//! buffer pool) is RDMA WRITTEN from the zone, registered once per zone and device ([`zone_region`]); any other
//! tail is copied into the staging buffer first: a bounce, counted.
//!
//! Counted per connection and logged at close: bytes moved by RDMA READ and RDMA WRITE, sent and received inline,
//! and bounce-copied (payload copied into the staging buffer because it came from an unregistered buffer: a
//! gateway READ's data as the weft client returns it).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use weft_fabric::rdma::{CmConn, CmListener, CmRequest, Completion, MemoryRegion, RdmaError, zone_region};

use super::header::{ChunkError, Decoded, HeaderLimits, PrivateData, decode, encode_error_chunk, encode_reply_header};
use super::{INLINE_DEFAULT_BYTES, call_layout, place_reply};
use crate::rpc::Reply;
use crate::{Gateway, Transport};

/// What answers the calls of an RPC-over-RDMA connection: one whole call record in, its reply out (`None`: nothing
/// to send). `Conn` is per-connection state (created at accept, told at close).
pub trait RecordHandler: Send + Sync + 'static {
    type Conn: Send + Sync;
    fn open(&self, peer: SocketAddr) -> Self::Conn;
    fn handle<'a>(
        &'a self,
        rec: &'a Bytes,
        peer: SocketAddr,
        conn: &'a Self::Conn,
    ) -> impl std::future::Future<Output = Option<Reply>> + 'a;
    fn close(&self, _peer: SocketAddr, _conn: Self::Conn) {}
}

impl RecordHandler for Gateway {
    type Conn = ();
    fn open(&self, _peer: SocketAddr) {}
    fn handle<'a>(
        &'a self,
        rec: &'a Bytes,
        peer: SocketAddr,
        _conn: &'a (),
    ) -> impl std::future::Future<Output = Option<Reply>> + 'a {
        self.handle_record(rec, peer, Transport::Rdma)
    }
}

/// How the RDMA listener serves.
#[derive(Debug, Clone, Copy)]
pub struct RdmaConfig {
    pub listen: SocketAddr,
    /// Credits granted to a client (RFC 8166 §3.3.1): receives posted per connection; a client asking for fewer
    /// gets what it asked.
    pub credits: u32,
    /// Size of each receive buffer, the inline size this server accepts (and advertises by RFC 8797).
    pub inline_bytes: usize,
    /// Call-record buffers per connection (each `limits.chunk_bytes_max` bytes).
    pub records_per_conn: usize,
    /// Connections served at once; more are rejected.
    pub connections_max: usize,
    pub limits: HeaderLimits,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], super::NFS_RDMA_PORT)),
            credits: 32,
            inline_bytes: 4096,
            records_per_conn: 2,
            connections_max: 64,
            limits: HeaderLimits::default(),
        }
    }
}

const TICK: Duration = Duration::from_secs(5);
const TAG_READ: u64 = 1 << 40;
const TAG_WRITE: u64 = 2 << 40;
const TAG_SEND: u64 = 3 << 40;

/// Binds the listener (an error when there is no RDMA device or library) and serves it on a thread.
pub fn serve<H: RecordHandler>(gw: Arc<H>, cfg: RdmaConfig, rt: tokio::runtime::Handle) -> Result<(), RdmaError> {
    let listener = CmListener::bind(cfg.listen, 64)?;
    tracing::info!(listen = %cfg.listen, credits = cfg.credits, "NFS over RDMA (RPC-over-RDMA v1) listening");
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("nfs-rdma-accept".into())
        .spawn(move || {
            loop {
                let req = match listener.next_request() {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = %e, "rdma: connect request failed");
                        continue;
                    }
                };
                if active.load(Ordering::Relaxed) >= cfg.connections_max.max(1) {
                    tracing::warn!(peer = %req.peer, "rdma: connection refused: --rdma connections at the limit");
                    continue; // dropping the request rejects it
                }
                active.fetch_add(1, Ordering::Relaxed);
                let (gw, rt, active) = (gw.clone(), rt.clone(), active.clone());
                let spawned = std::thread::Builder::new().name("nfs-rdma-conn".into()).spawn(move || {
                    let peer = req.peer;
                    let mut stats = Stats::default();
                    let state = gw.open(peer);
                    if let Err(e) = connection(&*gw, &state, &cfg, &rt, req, &mut stats) {
                        tracing::info!(%peer, error = %e, "rdma: connection ends");
                    }
                    gw.close(peer, state);
                    tracing::info!(
                        %peer,
                        calls = stats.calls,
                        refused = stats.refused,
                        rdma_read_bytes = stats.rdma_read_bytes,
                        rdma_write_bytes = stats.rdma_write_bytes,
                        inline_recv_bytes = stats.inline_recv_bytes,
                        inline_sent_bytes = stats.inline_sent_bytes,
                        bounce_copy_bytes = stats.bounce_copy_bytes,
                        "rpc-over-rdma connection closed"
                    );
                    active.fetch_sub(1, Ordering::Relaxed);
                });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "rdma: cannot start a connection thread");
                }
            }
        })
        .map_err(RdmaError::Io)?;
    Ok(())
}

/// What one connection moved.
#[derive(Debug, Default)]
struct Stats {
    calls: u64,
    refused: u64,
    rdma_read_bytes: u64,
    rdma_write_bytes: u64,
    inline_recv_bytes: u64,
    inline_sent_bytes: u64,
    bounce_copy_bytes: u64,
}

/// Registered call-record buffers; a record handed to the gateway holds its buffer until dropped.
struct Pool {
    free: Mutex<Vec<MemoryRegion>>,
    returned: Condvar,
}

struct Slot {
    mr: Option<MemoryRegion>,
    len: usize,
    pool: Arc<Pool>,
}

impl AsRef<[u8]> for Slot {
    fn as_ref(&self) -> &[u8] {
        &self.mr.as_ref().expect("held until drop").as_slice()[..self.len]
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            self.pool.free.lock().expect("pool").push(mr);
            self.pool.returned.notify_one();
        }
    }
}

impl Pool {
    fn take(&self) -> MemoryRegion {
        let mut free = self.free.lock().expect("pool");
        loop {
            if let Some(mr) = free.pop() {
                return mr;
            }
            free = self.returned.wait(free).expect("pool");
        }
    }
}

struct Conn<'a> {
    qp: CmConn,
    cfg: &'a RdmaConfig,
    recv: MemoryRegion,
    send: MemoryRegion,
    stage: MemoryRegion,
    pool: Arc<Pool>,
    /// The largest message the client receives inline.
    send_inline: usize,
    /// Receive completions that came while waiting for sends, in order.
    pending: VecDeque<Completion>,
    /// A zone buffer RDMA WRITEs were posted from, held until they completed; declared after `qp`, so a connection
    /// that fails with writes in flight destroys its queue pair before the buffer goes back to its pool.
    in_flight: Option<Bytes>,
}

fn connection<H: RecordHandler>(
    gw: &H,
    state: &H::Conn,
    cfg: &RdmaConfig,
    rt: &tokio::runtime::Handle,
    req: CmRequest,
    stats: &mut Stats,
) -> Result<(), RdmaError> {
    let client = PrivateData::decode(&req.private_data);
    // RFC 8797: without the client's private data both directions use the RFC 8166 default.
    let send_inline = client.map_or(INLINE_DEFAULT_BYTES, |p| p.recv_bytes).min(cfg.inline_bytes);
    let dev = req.dev.clone();
    let peer = req.peer;
    let credits = cfg.credits.max(1);
    let record_bytes = cfg.limits.chunk_bytes_max as usize + cfg.inline_bytes;
    let recv = MemoryRegion::new(&dev, credits as usize * cfg.inline_bytes, false, false)?;
    let send = MemoryRegion::new(&dev, cfg.inline_bytes, false, false)?;
    let stage = MemoryRegion::new(&dev, record_bytes, false, false)?;
    let mut free = Vec::new();
    for _ in 0..cfg.records_per_conn.max(1) {
        free.push(MemoryRegion::new(&dev, record_bytes, false, false)?);
    }
    let pool = Arc::new(Pool { free: Mutex::new(free), returned: Condvar::new() });
    let send_wr = (cfg.limits.read_segments_max + 2 * cfg.limits.chunk_segments_max + 2) as u32;
    let qp = req.into_conn(send_wr, credits, 1)?;
    let mut c = Conn { qp, cfg, recv, send, stage, pool, send_inline, pending: VecDeque::new(), in_flight: None };
    for i in 0..credits as usize {
        c.qp.post_recv(&c.recv, i * cfg.inline_bytes, cfg.inline_bytes, i as u64)?;
    }
    let ours = PrivateData { remote_invalidate: false, send_bytes: cfg.inline_bytes, recv_bytes: cfg.inline_bytes };
    c.qp.accept(&ours.encode())?;
    tracing::debug!(%peer, send_inline, credits, "rdma: connection established");
    loop {
        let done = match c.pending.pop_front() {
            Some(d) => d,
            None => match c.qp.next_completion(TICK)? {
                Some(d) => d,
                None => continue,
            },
        };
        if done.wr_id >= credits as u64 {
            continue; // a send-side completion nobody waits for (none are posted unwaited)
        }
        let i = done.wr_id as usize;
        let at = i * cfg.inline_bytes;
        let len = (done.byte_len as usize).min(cfg.inline_bytes);
        // The message is copied out (at most the inline size) so its buffer can be posted again at once.
        let msg = c.recv.as_slice()[at..at + len].to_vec();
        c.qp.post_recv(&c.recv, at, cfg.inline_bytes, i as u64)?;
        stats.inline_recv_bytes += len as u64;
        c.call(gw, state, rt, peer, &msg, stats)?;
    }
}

impl Conn<'_> {
    /// Waits until `n` send-side work requests completed, keeping receive completions for later.
    fn wait_sends(&mut self, mut n: usize) -> Result<(), RdmaError> {
        while n > 0 {
            match self.qp.next_completion(TICK)? {
                None => {}
                Some(d) if d.wr_id < self.cfg.credits.max(1) as u64 => self.pending.push_back(d),
                Some(_) => n -= 1,
            }
        }
        Ok(())
    }

    /// Posts one RDMA WRITE per piece from the staging buffer (each inside a segment the client offered, as
    /// `place_reply` planned); answers how many were posted.
    fn post_writes(&mut self, pieces: &[super::chunks::Piece], stats: &mut Stats) -> Result<usize, RdmaError> {
        for piece in pieces {
            self.qp.post_write(
                &self.stage,
                piece.local_offset,
                piece.len,
                piece.handle,
                piece.remote_offset,
                TAG_WRITE,
            )?;
            stats.rdma_write_bytes += piece.len as u64;
        }
        Ok(pieces.len())
    }

    /// [`Conn::post_writes`] from `mr` (a registered buffer zone) with the pieces' local offsets counted from `at`.
    fn post_writes_from(
        &mut self,
        mr: &MemoryRegion,
        at: usize,
        pieces: &[super::chunks::Piece],
        stats: &mut Stats,
    ) -> Result<usize, RdmaError> {
        for piece in pieces {
            self.qp.post_write(mr, at + piece.local_offset, piece.len, piece.handle, piece.remote_offset, TAG_WRITE)?;
            stats.rdma_write_bytes += piece.len as u64;
        }
        Ok(pieces.len())
    }

    fn send_inline(&mut self, parts: &[&[u8]], stats: &mut Stats) -> Result<(), RdmaError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        assert!(len <= self.send.len(), "inline messages are sized to the send buffer");
        let mut at = 0;
        for p in parts {
            self.send.as_mut_slice()[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        self.qp.post_send(&[(&self.send, 0, len)], TAG_SEND)?;
        self.wait_sends(1)?;
        stats.inline_sent_bytes += len as u64;
        Ok(())
    }

    fn call<H: RecordHandler>(
        &mut self,
        gw: &H,
        state: &H::Conn,
        rt: &tokio::runtime::Handle,
        peer: SocketAddr,
        msg: &[u8],
        stats: &mut Stats,
    ) -> Result<(), RdmaError> {
        let credits = self.cfg.credits.max(1);
        let (h, inline) = match decode(msg, &self.cfg.limits) {
            Ok(Decoded::Call(h, inline)) => (h, inline),
            Ok(Decoded::ClientError { xid }) => {
                tracing::info!(%peer, xid, "rdma: the client sent RDMA_ERROR; dropped");
                return Ok(());
            }
            Err(e) => return self.refuse(peer, &e, credits, stats),
        };
        let grant = h.credits.clamp(1, credits);
        stats.calls += 1;
        let record = match call_layout(&h, inline.len(), self.cfg.limits.chunk_bytes_max as usize) {
            Err(e) => {
                tracing::info!(%peer, xid = h.xid, error = %e, "rdma: call refused");
                stats.refused += 1;
                return self.send_inline(&[&encode_error_chunk(h.xid, grant)], stats);
            }
            Ok(None) => Bytes::copy_from_slice(inline),
            Ok(Some(l)) => {
                let mut mr = self.pool.take();
                for (k, p) in l.reads.iter().enumerate() {
                    self.qp.post_read(&mr, p.local_offset, p.len, p.handle, p.remote_offset, TAG_READ | k as u64)?;
                }
                self.wait_sends(l.reads.len())?;
                stats.rdma_read_bytes += l.chunk_bytes as u64;
                let buf = mr.as_mut_slice();
                buf[..l.position].copy_from_slice(&inline[..l.position]);
                let after = l.position + l.chunk_bytes;
                buf[after..after + l.pad_bytes].fill(0);
                let rest = &inline[l.position..];
                buf[after + l.pad_bytes..l.record_bytes].copy_from_slice(rest);
                Bytes::from_owner(Slot { mr: Some(mr), len: l.record_bytes, pool: self.pool.clone() })
            }
        };
        let Some(reply) = rt.block_on(gw.handle(&record, peer, state)) else { return Ok(()) };
        drop(record);
        let tail = reply.tail.clone().unwrap_or_default();
        let p = match place_reply(&h, reply.head.len(), tail.len(), self.send_inline) {
            Ok(p) => p,
            Err(e) => {
                tracing::info!(%peer, xid = h.xid, error = %e, "rdma: reply does not fit what the client offered");
                stats.refused += 1;
                return self.send_inline(&[&encode_error_chunk(h.xid, grant)], stats);
            }
        };
        let mut posted = 0;
        if !p.data.is_empty() {
            // The READ data straight from the buffer zone it was read into (a data server's pool), registered once;
            // from anywhere else (the weft client's buffer at the gateway) it is staged first (counted).
            match zone_region(self.qp.device(), tail.as_ptr(), tail.len()) {
                Some((mr, at)) => {
                    self.in_flight = Some(tail.clone());
                    posted += self.post_writes_from(&mr, at, &p.data, stats)?;
                }
                None => {
                    self.stage.as_mut_slice()[..tail.len()].copy_from_slice(&tail);
                    stats.bounce_copy_bytes += tail.len() as u64;
                    posted += self.post_writes(&p.data, stats)?;
                }
            }
        }
        let hdr = encode_reply_header(h.xid, grant, p.nomsg, &p.writes, p.reply_chunk.as_deref());
        let pad = crate::xdr::pad_of(tail.len());
        if p.nomsg {
            let s = self.stage.as_mut_slice();
            s[..reply.head.len()].copy_from_slice(&reply.head);
            let mut at = reply.head.len();
            s[at..at + tail.len()].copy_from_slice(&tail);
            at += tail.len();
            s[at..at + pad.len()].copy_from_slice(pad);
            stats.bounce_copy_bytes += tail.len() as u64;
            posted += self.post_writes(&p.reply, stats)?;
            self.wait_sends(posted)?;
            return self.send_inline(&[&hdr], stats);
        }
        // Writes complete before the send that follows them on the same queue pair (RC ordering), but the staging
        // buffer (or the zone buffer) must not be reused before they did: waited for together.
        self.wait_sends(posted)?;
        self.in_flight = None;
        if p.tail_in_message {
            self.send_inline(&[&hdr, &reply.head, &tail, pad], stats)
        } else {
            self.send_inline(&[&hdr, &reply.head], stats)
        }
    }

    fn refuse(&mut self, peer: SocketAddr, e: &ChunkError, credits: u32, stats: &mut Stats) -> Result<(), RdmaError> {
        tracing::info!(%peer, error = %e, "rdma: transport header refused");
        stats.refused += 1;
        match e.reply(credits) {
            Some(r) => self.send_inline(&[&r], stats),
            None => Ok(()),
        }
    }
}
